"""Integration smoke tests of the benchmark harness: one quick Pinpoint-vs-Keras round, for real, and
the tracking comparison's own MLflow server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def _quick_bench(tmp_path: Path, comparison: str) -> tuple[dict, Path]:
    """`benchmarks.run --quick --only COMPARISON` into tmp_path: (results.json, RESULTS.md path)."""
    results = tmp_path / "RESULTS.md"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--only", comparison,
         "--out", str(tmp_path / "out"), "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads((tmp_path / "out" / "results.json").read_text()), results


@pytest.mark.timeout(300)
def test_quick_bench_runs_both_sides_and_writes_results(tmp_path):
    raw, results = _quick_bench(tmp_path, "keras-none")
    runs = raw["results"]["keras-none"]
    pp, keras = runs["pinpoint"][0], runs["keras"][0]
    for rec in (pp, keras):
        assert rec["examples_per_sec"] > 0 and rec["steps_timed"] >= 20
        assert rec["model_layers"] == [[64, 128], [128, 64], [64, 10]]
        assert rec["peak_flops"] > 1e8 and 0 < rec["mfu"] < 1
    assert pp["replica_devices"] == keras["replica_devices"]
    md = results.read_text()
    # One round (--quick) gives one ratio: recorded, a verdict needs 3 values (benchmarks.stats.decide).
    row = re.search(r"^- strategy none, 1 device: pinpoint / Keras examples/sec = ([0-9.]+) .*\*\*(.+)\*\*$", md, re.M)
    assert row, md
    assert row.group(2) == "recorded (1 value: a verdict needs 3; target >= 1)"
    assert raw["machine"]["nproc"] >= 1 and raw["machine"]["tensorflow"] in md
    assert results.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(300)
def test_quick_bench_runs_the_worked_example_against_keras(tmp_path):
    """Issue 13: the user's model (examples/digits_cnn) on TFRecords the bench writes under --out."""
    raw, results = _quick_bench(tmp_path, "keras-user-model")
    assert len(list((tmp_path / "out" / "keras-user-model" / "data").glob("digits-*.tfrecord"))) == 4
    runs = raw["results"]["keras-user-model"]
    pp, keras = runs["pinpoint"][0], runs["keras"][0]
    for rec in (pp, keras):
        assert rec["examples_per_sec"] > 0 and rec["steps_timed"] >= 20 and rec["jit_compile"] is False
        assert rec["model_layers"] == [[512, 64], [64, 10]]  # the user's CNN: dense 8x8 -> pool -> 4*4*32
    assert pp["replica_devices"] == keras["replica_devices"] and pp["num_params"] == 38282
    assert "| worked example: the user's CNN on TFRecord files" in results.read_text()


def test_tracking_arms_get_the_comparisons_own_mlflow_server(monkeypatch, tmp_path):
    """The server arms' tracking.uri placeholder becomes the address of a real `mlflow server` started
    for the comparison (and stopped after it); the local-store arms keep their sqlite URI."""
    import urllib.request

    import benchmarks.run as run
    from benchmarks.plan import SERVER_URI, Settings, build_plan

    comp = next(c for c in build_plan(Settings(repeats=1), tmp_path) if c.key == "tracking")
    seen = {}

    def worker(spec, out):
        uri = spec["config"]["tracking"]["uri"]
        if uri and uri.startswith("http"):
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                seen[out.name] = (uri, r.status)
        else:
            seen[out.name] = (uri, None)
        return {"train_s": 1.0, "process_wall_s": 9.0}

    monkeypatch.setattr(run, "run_worker", worker)
    run.run_comparison(comp, 1, tmp_path, {}, log=lambda m: None)
    assert seen["r0-server"][1] == 200 and seen["r0-server"][0] != SERVER_URI
    assert seen["r0-local"][0].startswith("sqlite:///") and seen["r0-off"][0] is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{seen['r0-server'][0]}/health", timeout=2)  # stopped with the comparison
