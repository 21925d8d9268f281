"""`make run`: the training pipeline through kfp.local (SubprocessRunner), real steps, a real
MLflow server; the placement sweep through kfp.local's ParallelFor (slow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pinpoint.placement.model.files import read_placement
from tests.conftest import REPO


def _config(path: Path, name: str, uri: str | None, **train) -> Path:
    text = (REPO / "configs" / "demo.yaml").read_text()
    text = re.sub(r"^name: .*$", f"name: {name}", text, flags=re.M)
    text = re.sub(r"^  steps: .*$", f"  steps: {train.get('steps', 20)}", text, flags=re.M)
    text = re.sub(r"^  checkpoint_every: .*$", "  checkpoint_every: 10", text, flags=re.M)
    if "data" in train:
        text = re.sub(r"^  data: .*$", f"  data: {train['data']}", text, flags=re.M)
    text = re.sub(r"^  uri: .*$", f"  uri: {uri or 'null'}", text, flags=re.M)
    path.write_text(text)
    return path


def _runs(uri: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("pinpoint")
    return client.search_runs([exp.experiment_id]) if exp else []


def _pinpoint(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pinpoint.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=1500)


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_make_run_pipeline_end_to_end(live_mlflow, tmp_path):
    cfg = _config(tmp_path / "c.yaml", "local-run", live_mlflow.uri)
    proc = _pinpoint("run", str(cfg), "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = tmp_path / "runs" / "local-run"
    for name in ("config.yaml", "cluster_spec.json", "placement.json", "metrics.json", "report.html"):
        assert (run_dir / name).is_file(), name
    # The summary comes last, then where to look.
    tail = proc.stdout.rstrip().splitlines()
    assert tail[-1] == "Open the MLflow UI: make mlflow-ui (http://127.0.0.1:5000)"
    assert any("pinpoint summary" in line for line in tail[-20:])
    assert f"Run folder: {run_dir}" in tail
    # One FINISHED parent with a child run per step.
    runs = _runs(live_mlflow.uri)
    (parent,) = [r for r in runs if r.info.run_name == "local-run-pipeline"]
    assert parent.info.status == "FINISHED"
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == {"local-run/provision", "local-run/train", "local-run/report"}
    assert all(r.info.status == "FINISHED" for r in children.values())
    # kfp's own outputs are the small artifacts: the train step's Metrics mirror metrics.json.
    metrics = json.loads((run_dir / "metrics.json").read_text())
    (executor_output,) = (tmp_path / "runs" / ".kfp-outputs").glob("*/train/executor_output.json")
    kfp_metrics = json.loads(executor_output.read_text())["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert kfp_metrics["final_loss"] == pytest.approx(metrics["final_loss"])
    assert kfp_metrics["steps"] == 20


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_make_run_with_your_own_training_code_as_the_train_step(live_mlflow, tmp_path):
    """`make run CONFIG=examples/custom_loop/config.yaml`: train.entrypoint through kfp.local."""
    import shutil

    import yaml

    example = tmp_path / "custom_loop"
    shutil.copytree(REPO / "examples" / "custom_loop", example, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = yaml.safe_load((example / "config.yaml").read_text())
    cfg["name"] = "local-entry"
    cfg["train"]["entrypoint_args"] = {"steps": 30, "batch_size": 32, "save_every": 15}
    cfg["tracking"]["uri"] = live_mlflow.uri
    cfg["tracking"]["step_metrics_every_s"] = 0  # every logged step: the exact steps are asserted
    (example / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = _pinpoint("run", str(example / "config.yaml"), "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = tmp_path / "runs" / "local-entry"
    placement = read_placement(run_dir)
    assert (placement["training_function"], placement["functions"][0]["calls"]) == ("train_step", 30)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index")) == ["ckpt-15.index", "ckpt-30.index"]
    assert "<h2>Functions the program ran</h2>" in (run_dir / "report.html").read_text()
    runs = _runs(live_mlflow.uri)
    (parent,) = [r for r in runs if r.info.run_name == "local-entry-pipeline"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == {"local-entry/provision", "local-entry/train", "local-entry/report"}
    train = children["local-entry/train"]
    assert train.info.status == "FINISHED"
    import mlflow

    client = mlflow.MlflowClient(live_mlflow.uri)
    assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "loss")) == [10, 20, 30]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_failed_step_is_named_and_parent_run_marked_failed(live_mlflow, tmp_path):
    cfg = _config(tmp_path / "c.yaml", "local-fail", live_mlflow.uri, data=str(tmp_path / "missing.npz"))
    proc = _pinpoint("run", str(cfg), "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pinpoint: the pipeline failed in step 'train'"), proc.stderr[-2000:]
    assert "Open the MLflow UI" not in proc.stdout
    # The step's own one-line error is in its log, without a traceback.
    assert "missing.npz" in proc.stdout and "Traceback" not in proc.stdout
    (parent,) = [r for r in _runs(live_mlflow.uri) if r.info.run_name == "local-fail-pipeline"]
    assert parent.info.status == "FAILED"


@pytest.mark.unit
def test_run_with_a_bad_config_fails_before_kfp_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\n")
    proc = _pinpoint("run", str(bad), "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pinpoint: name")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_placement_sweep_picks_the_fastest_run_that_obeyed_its_plan(live_mlflow, tmp_path):
    from kfp import local

    from pinpoint.config import config_to_yaml, load_config
    from pinpoint.tracking import start_parent_run
    from pipelines.placement_sweep import DEFAULT_VARIANTS, build_placement_sweep

    cfg = load_config(_config(tmp_path / "c.yaml", "sweep", live_mlflow.uri, steps=10))
    variants = [v for v in DEFAULT_VARIANTS if v["name"] in ("mirrored", "vars-on-cpu")]
    root = tmp_path / "runs" / "sweep-sweep"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    parent = start_parent_run(cfg, "sweep-pipeline")
    build_placement_sweep(variants=variants)(config_yaml=config_to_yaml(cfg), runs_root=str(root), parent_run_id=parent)

    result = json.loads((root / "comparison.json").read_text())
    assert {r["name"] for r in result["runs"]} == {"mirrored", "vars-on-cpu"}
    assert (root / "comparison.png").stat().st_size > 1000
    eligible = [r for r in result["runs"] if r["obeyed"]]
    assert eligible, result
    assert result["best"] == max(eligible, key=lambda r: r["examples_per_sec"])["run_dir"]
    # Each variant is its own set of child runs under the sweep's parent.
    names = {r.info.run_name for r in _runs(live_mlflow.uri) if r.data.tags.get("mlflow.parentRunId") == parent}
    assert {"sweep-mirrored/train", "sweep-vars-on-cpu/train", "sweep-sweep/compare"} <= names


@pytest.mark.unit
def test_verbose_step_logs_hide_only_the_executor_input_dump():
    import io

    from pipelines.local_run import _HideExecutorInput

    out = io.StringIO()
    quiet = _HideExecutorInput(out, verbose=True)
    dump = json.dumps({"inputs": {"parameterValues": {"config_yaml": "a: {b: 1}\n}"}}}, indent=4)
    print("    [KFP Executor INFO]: Got executor_input:", file=quiet)
    for line in dump.splitlines():
        print("    " + line, file=quiet)
    print("    pinpoint: train.steps: got 0; use >= 1", file=quiet)
    print("    [KFP Executor INFO]: Got executor_input:", file=quiet)
    print("    not json after all", file=quiet)  # never swallow a line that does not open the dump
    quiet.write("no newline yet")
    quiet.flush()
    assert out.getvalue().splitlines() == [
        "    [KFP Executor INFO]: Got executor_input (omitted).",
        "    pinpoint: train.steps: got 0; use >= 1",
        "    [KFP Executor INFO]: Got executor_input (omitted).",
        "    not json after all",
        "no newline yet",
    ]


@pytest.mark.unit
def test_step_logs_drop_the_executors_info_lines_and_keep_the_steps_own_lines_and_errors():
    import io

    from pipelines.local_run import _HideExecutorInput

    out = io.StringIO()
    quiet = _HideExecutorInput(out, verbose=False)
    lines = [
        "    [KFP Executor 2026-11-23 10:11:18,729 INFO]: Looking for component `train` in --component_module_path x",
        "    [KFP Executor 2026-11-23 10:11:18,731 INFO]: Got executor_input:",
        "    {",
        '        "inputs": {}',
        "    }",
        "    [KFP Executor 2026-11-23 10:11:24,808 INFO]: Using MirroredStrategy with devices ('/CPU:1', '/CPU:2')",
        "    pinpoint: resuming from checkpoint step 300",
        "    [KFP Executor 2026-11-23 10:11:25,001 WARNING]: something a library warns about",
        "    [KFP Executor 2026-11-23 10:11:25,002 ERROR]: something that failed",
        "    Traceback (most recent call last):",
        "    ",
        "    [KFP Executor 2026-11-23 10:11:27,962 INFO]: Wrote executor output file to /tmp/executor_output.json.",
        "",
    ]
    for line in lines:
        print(line, file=quiet)
    quiet.flush()
    assert out.getvalue().splitlines() == [
        "    pinpoint: resuming from checkpoint step 300",
        "    [KFP Executor 2026-11-23 10:11:25,001 WARNING]: something a library warns about",
        "    [KFP Executor 2026-11-23 10:11:25,002 ERROR]: something that failed",
        "    Traceback (most recent call last):",
    ]


@pytest.mark.unit
def test_kfp_local_info_filter_drops_only_the_outputs_dump_and_headers():
    import logging

    from pipelines.local_run import _KfpInfoFilter

    def record(level, msg):
        return logging.LogRecord("root", level, __file__, 1, msg, None, None)

    keep = _KfpInfoFilter().filter
    assert keep(record(logging.INFO, "Executing task \x1b[96m'train'\x1b[0m"))
    assert keep(record(logging.INFO, "Task \x1b[96m'train'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m"))
    assert keep(record(logging.INFO, "Task train failed (attempt 1/3); retrying"))
    assert keep(record(logging.ERROR, "Task \x1b[96m'train'\x1b[0m outputs: shown at ERROR"))
    assert not keep(record(logging.INFO, "Streamed logs:\n"))
    assert not keep(record(logging.INFO, "Task \x1b[96m'train'\x1b[0m outputs:\n    Output: '/runs/demo'"))
    assert not keep(record(logging.INFO, "Task \x1b[96m'report'\x1b[0m has no outputs"))
    assert not keep(record(logging.INFO, "Cleaned up workspace: /tmp/ws"))


@pytest.mark.unit
def test_run_and_compile_reach_the_cli_through_the_entry_point_group_only():
    import ast

    from pinpoint.cli import COMMANDS_GROUP, build_parser
    from pipelines.commands import cmd_compile, cmd_run

    assert build_parser().parse_args(["run", "configs/demo.yaml"]).fn is cmd_run
    assert build_parser().parse_args(["compile", "--out", "x.yaml", "-v"]).fn is cmd_compile
    declared = (REPO / "pyproject.toml").read_text()
    assert f'[project.entry-points."{COMMANDS_GROUP}"]' in declared
    # The library never imports the repository's kfp packages (they register themselves).
    for path in (REPO / "src" / "pinpoint").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("pipelines", "components", "kfp") for n in names), path
