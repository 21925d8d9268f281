"""`pinpoint plan RUN_DIR --verify --config CONFIG`: plan, train CONFIG with the plan's layers
into a verification run folder, and hold the prediction to that run's measurement
(plan_check.json, pinpoint.plan.verify); with tracking on, the plan and the check go to MLflow
as a "plan" step run of the verification folder, the parent of its train run.
`pinpoint plan RUN_DIR --verify --against RUN2`: hold the plan file to a run made with it
already (a traced program the user changed by the plan's tf_device mapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinpoint.config import load_config
from pinpoint.errors import ConfigError
from pinpoint.plan.command import plan_run, print_plan
from pinpoint.plan.emit import write_plan
from pinpoint.plan.links import load_links
from pinpoint.plan.verify import PLAN_CHECK, PLAN_FILE, check_table, plan_check, verify_config
from pinpoint.runfolder import atomic_write_json


def verify_out_dir(run_dir: Path, verify_out: str | None) -> Path:
    """The verification folder (default: RUN_DIR-verify beside the run); one that already holds
    files is refused, so a check never mixes two runs."""
    out = Path(verify_out) if verify_out else run_dir.parent / f"{run_dir.name}-verify"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--verify-out: got '{out}', which already holds files; pass a new or empty folder")
    return out


def verify_command(run_dir: Path, config_path: str | None, *, devices: int | None = None,
                   objective: str | None = None, out: Path | None = None, links_file: str | None = None,
                   verify_out: str | None = None, gpu_memory: int | None = None) -> int:
    if not config_path:
        raise ConfigError("--config: got nothing; --verify trains a config with the plan: pass the run's config "
                          "(pinpoint plan RUN_DIR --verify --config CONFIG)")
    links = load_links(links_file)
    cfg = load_config(config_path)
    from pinpoint.plan.build import plan_graph

    run_dir = Path(run_dir)
    source = plan_graph(run_dir)
    doc, predictions = plan_run(source, source_run=str(run_dir), devices=devices, objective=objective, links=links,
                                gpu_memory=gpu_memory)
    vcfg = verify_config(cfg, doc, config_path)  # every refusal before anything is written
    vdir = verify_out_dir(run_dir, verify_out)
    path = write_plan(out if out is not None else run_dir / PLAN_FILE, doc)
    print_plan(doc, predictions, path)

    from pinpoint.tracking import open_step_run
    from pinpoint.training.command import train_command

    # The "plan" run (a no-op without tracking) is the parent of the verification's train run:
    # the plan, its check and its figures sit one level above the training they describe.
    with open_step_run(vcfg, "plan", vdir) as run:
        code = train_command(vcfg, vdir, parent_run_id=run.run_id)
        if code != 0:
            raise ConfigError(f"--verify: got exit code {code} from training {config_path} with the plan in {vdir}; "
                              "see its output above, fix the cause and re-run")
        verified = plan_graph(vdir)
        from pinpoint.placement import load_placement

        check = plan_check(doc, source, verified, load_placement(vdir), links, verify_run=str(vdir))
        plan_copy = write_plan(vdir / PLAN_FILE, doc)
        check_path = atomic_write_json(vdir / PLAN_CHECK, check)
        params, metrics = plan_figures(doc, check)
        run.log_params(params)
        run.log_metrics(metrics)
        run.set_tags({"pinpoint.plan.source_run": source_run_link(run_dir)})
        run.log_artifact(plan_copy)
        run.log_artifact(check_path)
    print(check_table(check))
    print(f"pinpoint: plan verified -> {check_path}")
    return 0


def verify_against(run_dir: Path, against: Path, *, plan_file: Path | None = None) -> int:
    """Hold the plan file made from `run_dir` (default RUN_DIR/plan.yaml) to `against`, a run made
    with it already (a traced program with the plan's tf_device mapping applied, or any run), with
    no training: plan_check.json and a copy of the plan go to `against`."""
    import yaml

    from pinpoint.placement import load_placement
    from pinpoint.plan.build import plan_graph
    from pinpoint.plan.emit import read_plan
    from pinpoint.plan.links import LinkModel
    from pinpoint.plan.predict import predict

    run_dir, against = Path(run_dir), Path(against)
    path = plan_file if plan_file is not None else run_dir / PLAN_FILE
    source = plan_graph(run_dir)
    read = read_plan(path, source)  # a missing plan file, or one the runtime would override: one line
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc.get("prediction"), dict) or not isinstance(doc.get("devices"), list):
        raise ConfigError(f"plan: got '{path}', which holds no prediction; write it with `pinpoint plan {run_dir}`")
    links = LinkModel.from_dict(doc.get("links"), field_name=f"links (in {path})")
    # The file's pinning as it is now (a user may have edited a device), predicted again.
    doc["prediction"]["plan"] = predict(source, read.placement, links, tuple(doc["devices"])).to_dict()
    verified = plan_graph(against, field="--against")
    check = plan_check(doc, source, verified, load_placement(against, field="--against"), links,
                       verify_run=str(against))
    write_plan(against / PLAN_FILE, doc)
    check_path = atomic_write_json(against / PLAN_CHECK, check)
    print(check_table(check))
    print(f"pinpoint: plan checked against {against} -> {check_path}")
    return 0


def source_run_link(run_dir: Path) -> str:
    """The source run's MLflow run id when its folder records one (tracking.json, written when
    the run closed; else an unsent spool's meta.json), else the folder's absolute path."""
    import json

    from pinpoint.runfolder import TRACKING_COST
    from pinpoint.tracking.spool import find_spools

    try:
        run_id = json.loads((run_dir / TRACKING_COST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        run_id = None
    if run_id:
        return run_id

    for spool in find_spools(run_dir):
        try:
            meta = json.loads((spool / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("step") == "train" and meta.get("run_id"):
            return meta["run_id"]
    return str(run_dir.resolve())


def plan_figures(doc: dict[str, Any], check: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(params, metrics) of a verified plan for MLflow."""
    params = {"plan.objective": doc["objective"], "plan.algorithm": doc["algorithm"],
              "plan.devices": ",".join(doc["devices"]), "plan.source_run": str(doc.get("source_run"))}
    metrics = {"plan.bytes_exact": float(check["bytes"]["exact"]),
               "plan.bytes_predicted": float(check["bytes"]["predicted_total"]),
               "plan.bytes_measured": float(check["bytes"]["measured_total"])}
    if "all_reduce" in check:  # a mirrored run's train.all_reduce, verified (plan.allreduce)
        params["plan.all_reduce"] = doc["all_reduce"]
        metrics["plan.collective_inputs_exact"] = float(check["all_reduce"]["collective_inputs"]["exact"])
    if "ps_bytes" in check:  # a plan over parameter servers
        metrics["plan.ps_bytes_exact"] = float(check["ps_bytes"]["exact"])
    if (check.get("memory") or {}).get("largest_error") is not None:  # the predicted peaks against the measured
        metrics["plan.memory_largest_error"] = float(check["memory"]["largest_error"])
    if check["conformance"]["score"] is not None:
        metrics["plan.conformance"] = float(check["conformance"]["score"])
    for key in ("predicted_ms", "measured_ms"):
        if check["step"][key] is not None:
            metrics[f"plan.{key.replace('_ms', '_step_ms')}"] = float(check["step"][key])
    return params, metrics

