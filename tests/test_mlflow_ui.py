"""Browser check: headless Chromium opens the MLflow UI pages of a run `pinpoint train` made and
`pinpoint report` reported, served by a real `mlflow server`; Pinpoint's figures are on them. The screenshots are
kept under test-output/mlflow-ui/ (git-ignored)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pinpoint.config import config_from_dict
from pinpoint.tracking import open_step_run
from tests.conftest import make_config

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test-output" / "mlflow-ui"
# What the second test (the Makefile's `mlflow ui` on the local store) logs: literal figures, as it
# checks the store's serving, not Pinpoint's output.
PLACEMENT_METRICS = {
    "placement.ops.GPU_0": 41.0,
    "placement.ops.GPU_1": 41.0,
    "placement.transfers_per_step": 6.0,
    "placement.conformance": 1.0,
}


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def browse(url: str, tmp: Path, *, screenshot: Path | None = None) -> str:
    """Load `url` in headless Chromium; return the rendered DOM (and save a screenshot)."""
    base = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", "--window-size=1400,1000",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run(base + ["--dump-dom", url], check=False, capture_output=True, text=True, timeout=180)
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(base + [f"--screenshot={screenshot}", url], check=True, capture_output=True, text=True, timeout=180)
    return dom.stdout


def _train_and_report(uri: str, experiment: str, tmp: Path) -> Path:
    """`pinpoint provision`, `train` (the built-in mlp split over two emulated GPUs, 6 steps) and
    `report` on its run folder, as a user runs them, tracked by the real server: about 30 s."""
    import os
    import sys

    cfg = make_config("ui", cluster={"devices_per_worker": 2},
                      train={"strategy": "none", "steps": 6, "batch_size": 32, "log_every": 2, "checkpoint_every": 0,
                             "pinning": {"layers": {"dense_1": "/GPU:0", "dense_2": "/GPU:1", "head": "/GPU:1"}}},
                      placement={"warmup_steps": 2},
                      tracking={"uri": uri, "experiment": experiment, "step_metrics_every_s": 0, "log_model": False},
                      path=tmp / "ui.yaml")
    run_dir = tmp / "run"
    pinpoint = str(Path(sys.executable).parent / "pinpoint")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("MLFLOW_TRACKING_URI", None)
    for args in (["provision", str(cfg), "--out", str(run_dir)], ["train", str(cfg), "--out", str(run_dir)],
                 ["report", str(run_dir)]):  # what `make run` does, step by step
        proc = subprocess.run([pinpoint, *args], capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return run_dir


def _text(dom: str) -> str:
    """The page's text, tags dropped and spaces collapsed."""
    import html
    import re

    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (Debian package 'chromium'; "
                    "the project's setup installs it)")
def test_mlflow_ui_shows_what_pinpoint_train_and_report_logged(live_mlflow, tmp_path):
    """A run `pinpoint train` made and `pinpoint report` reported, opened in the MLflow UI: the
    train run's page shows its loss, the report run's page its placement figures, and its
    report.html (served by MLflow) shows the run's own figures and charts."""
    import json

    from mlflow.tracking import MlflowClient

    experiment = f"ui-{uuid.uuid4().hex[:8]}"
    run_dir = _train_and_report(live_mlflow.uri, experiment, tmp_path)
    placement = json.loads((run_dir / "placement.json").read_text())
    client = MlflowClient(live_mlflow.uri)
    exp_id = client.get_experiment_by_name(experiment).experiment_id
    runs = {r.data.tags["pinpoint.step"]: r for r in client.search_runs([exp_id])}
    assert {"train", "report"} <= set(runs), {k: r.data.tags for k, r in runs.items()}
    train, report = runs["train"], runs["report"]

    page = f"{live_mlflow.uri}/#/experiments/{exp_id}/runs/{train.info.run_id}"
    text = _text(browse(page, tmp_path, screenshot=OUT / "train-run.png"))
    assert "loss" in text and f"{train.data.metrics['loss']:.4g}"[:4] in text, text[:2000]

    page = f"{live_mlflow.uri}/#/experiments/{exp_id}/runs/{report.info.run_id}"
    text = _text(browse(page, tmp_path, screenshot=OUT / "run-overview.png"))
    ops = placement["ops_by_device"]  # what the run's placement.json says ran where
    per_step = placement["transfers"]["per_step"]
    shown = {"placement.ops.GPU_0": ops["/GPU:0"], "placement.ops.GPU_1": ops["/GPU:1"],
             "placement.transfers_per_step": per_step["count"], "placement.conformance": 1}
    for key, value in shown.items():
        assert f"{key} {value}" in text, f"{key} {value} not on {page}"
    assert placement["conformance"]["score"] == 1.0  # every layer ran where it was pinned

    dom = browse(page + "/artifacts", tmp_path, screenshot=OUT / "run-artifacts.png")
    assert "report.html" in dom, f"report.html not listed on {page}/artifacts"
    # The server sends report.html as an attachment (and its UI shows it in an iframe, which a
    # dumped DOM leaves out): the file as the server holds it, opened in the browser.
    served = Path(client.download_artifacts(report.info.run_id, "report.html", str(tmp_path / "served")))
    dom = browse(served.as_uri(), tmp_path, screenshot=OUT / "report.png")
    text = _text(dom)
    assert f"{per_step['count']} transfers / step" in text, text[:2000]
    for device in ("/GPU:0", "/GPU:1"):
        assert f"{device}=/CPU:{int(device[-1]) + 1} {ops[device]} (" in text  # the ops/step line
    assert dom.count('src="data:image/png;base64,') >= 3  # the charts, embedded


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_make_mlflow_ui_serves_the_embedded_store(tmp_path, monkeypatch):
    """A run logged to the default local store (no URI configured) is served, artifacts included,
    by `mlflow ui` started with the Makefile's arguments from the repo root."""
    import json
    import urllib.request

    from conftest import free_port, makefile_ui_args, mlflow_ui

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "pinpoint"\nversion = "0"\n')
    monkeypatch.chdir(repo)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = config_from_dict({"name": "local", "train": {"strategy": "none"}, "cluster": {"devices_per_worker": 1}})
    (tmp_path / "report.html").write_text("<html>r</html>")
    with open_step_run(cfg, "report", tmp_path / "rd", system_metrics=False) as run:
        run.log_metrics(PLACEMENT_METRICS)
        run.log_artifact(tmp_path / "report.html")
    # Read once the run is closed (all sent): inside, a loaded machine's sender may not have
    # created the run in the store yet, and the id is then the local one (CI read a 404 for it).
    run_id = run.run_id
    assert (repo / "mlruns" / "mlflow.db").is_file()

    port = free_port()
    args = makefile_ui_args(port)
    assert args[args.index("--host") + 1] == "127.0.0.1"
    with mlflow_ui(repo, port) as base:
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/runs/get?run_id={run_id}", timeout=30) as r:
            data = json.load(r)
        metrics = {m["key"] for m in data["run"]["data"]["metrics"]}
        assert set(PLACEMENT_METRICS) <= metrics
        with urllib.request.urlopen(f"{base}/get-artifact?path=report.html&run_uuid={run_id}", timeout=30) as r:
            assert r.read() == b"<html>r</html>"
