"""Browser check: headless Chromium opens the MLflow UI page of a run served by a real
`mlflow server`; the placement metrics and the report artifact are visible. The screenshots are
kept under test-output/mlflow-ui/ (git-ignored)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pinpoint.config import config_from_dict
from pinpoint.tracking import open_step_run

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test-output" / "mlflow-ui"
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


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (Debian package 'chromium'; "
                    "the project's setup installs it)")
def test_mlflow_ui_shows_placement_metrics_and_report(live_mlflow, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = config_from_dict({
        "name": "ui", "cluster": {"devices_per_worker": 1}, "train": {"strategy": "none"},
        "tracking": {"uri": live_mlflow.uri, "experiment": f"ui-{uuid.uuid4().hex[:8]}"},
    })
    report = tmp_path / "report.html"
    report.write_text("<html><body><h1>placement report</h1></body></html>")
    with open_step_run(cfg, "report", tmp_path, system_metrics=False) as run:
        run.log_metrics(PLACEMENT_METRICS)
        run.log_artifact(report)
        run_id = run.run_id
    exp_id = MlflowClient(live_mlflow.uri).get_run(run_id).info.experiment_id

    page = f"{live_mlflow.uri}/#/experiments/{exp_id}/runs/{run_id}"
    dom = browse(page, tmp_path, screenshot=OUT / "run-overview.png")
    missing = [k for k in PLACEMENT_METRICS if k not in dom]
    assert not missing, f"metrics not rendered on {page}: {missing} (DOM {len(dom)} chars)"
    dom = browse(page + "/artifacts", tmp_path, screenshot=OUT / "run-artifacts.png")
    assert "report.html" in dom, f"report.html not listed on {page}/artifacts"
    assert (OUT / "run-overview.png").stat().st_size > 10_000
    assert (OUT / "run-artifacts.png").stat().st_size > 10_000


def _makefile_ui_args() -> list[str]:
    """The `mlflow ui` arguments of the Makefile's mlflow-ui target (store layout + host)."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "mlflow ui" in line)
    args = line.split("mlflow ui", 1)[1].split()
    return [a.replace("$(MLFLOW_PORT)", "0") for a in args]


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_make_mlflow_ui_serves_the_embedded_store(tmp_path, monkeypatch):
    """A run logged to the default local store (no URI configured) is served, artifacts included,
    by `mlflow ui` started with the Makefile's arguments from the repo root."""
    import json
    import os
    import sys
    import time
    import urllib.request

    from conftest import free_port

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
        run_id = run.run_id
    assert (repo / "mlruns" / "mlflow.db").is_file()

    port = free_port()
    args = _makefile_ui_args()
    assert args[args.index("--host") + 1] == "127.0.0.1"
    args[args.index("--port") + 1] = str(port)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", *args], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/runs/get?run_id={run_id}", timeout=30) as r:
            data = json.load(r)
        metrics = {m["key"] for m in data["run"]["data"]["metrics"]}
        assert set(PLACEMENT_METRICS) <= metrics
        with urllib.request.urlopen(f"{base}/get-artifact?path=report.html&run_uuid={run_id}", timeout=30) as r:
            assert r.read() == b"<html>r</html>"
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
