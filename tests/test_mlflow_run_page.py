"""Issue 51: what a newcomer sees after `make run`. The demo pipeline (configs/demo.yaml as it is:
300 steps) runs into a local store laid out as `make run` lays it out (mlruns/ beside a
pyproject.toml), `mlflow ui` serves it with the Makefile's arguments, and headless Chromium opens
the train run's loss chart and the report in its artifact view. Screenshots in
test-output/mlflow-run-page/ (git-ignored). Slow tier: 106 s here (the 300-step pipeline, the UI's
start-up and three page loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.first_screen import BOX_FILL, chromium, expected_from_placement, read_first_screen, shows

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test-output" / "mlflow-run-page"

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200),
              pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (Debian package "
                                 "'chromium'; the project's setup installs it)")]


def _chromium(profile: Path, budget_ms: int) -> list[str]:
    return [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1800,1100",
            f"--virtual-time-budget={budget_ms}"]


def _timeout(budget_ms: int) -> int:
    return 180 + budget_ms // 1000  # virtual time can pass as slowly as real time


def _screenshot(url: str, png: Path, profile: Path, budget_ms: int = 30000) -> None:
    """A screenshot of `url` after `budget_ms` of the page's virtual time."""
    png.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*_chromium(profile, budget_ms), f"--screenshot={png}", url], check=True, capture_output=True,
                   timeout=_timeout(budget_ms))


def _browse(url: str, png: Path, profile: Path, budget_ms: int = 30000) -> str:
    """The rendered DOM of `url`, and its screenshot."""
    _screenshot(url, png, profile, budget_ms)
    return subprocess.run([*_chromium(profile, budget_ms), "--dump-dom", url], capture_output=True, text=True,
                          timeout=_timeout(budget_ms)).stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`make run` in a fresh checkout's layout; (repo folder, the local store's URI)."""
    repo = tmp_path_factory.mktemp("checkout")
    (repo / "pyproject.toml").write_text('[project]\nname = "pinpoint"\nversion = "0"\n')
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "run", str(REPO / "configs" / "demo.yaml"),
                           "--runs-root", str(repo / "runs")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return repo, f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}"


@pytest.fixture(scope="module")
def ui(demo):
    from conftest import free_port, mlflow_ui

    repo, _ = demo
    with mlflow_ui(repo, free_port()) as base:
        yield base


def _runs(uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pinpoint")
    runs = client.search_runs([exp.experiment_id])
    by = {r.data.tags.get("pinpoint.step", "parent"): r for r in runs}
    assert sorted(by) == ["parent", "provision", "report", "train"]
    return {"client": client, "experiment": exp.experiment_id, **by}


def test_the_demos_loss_has_every_logged_step_and_the_chart_draws_them(demo, ui):
    """300 steps logged every 10 (and the first): 31 points, within the budget of sends that go
    out as logged (tracking.step_metrics_budget), so the chart is a curve, not a line."""
    from pinpoint.config import load_config

    cfg = load_config(REPO / "configs" / "demo.yaml")
    steps, every = cfg.train.steps, cfg.train.log_every
    assert (steps, every) == (300, 10)
    logged = sorted({1, *range(every, steps + 1, every), steps})
    assert len(logged) == 31 <= cfg.tracking.step_metrics_budget
    _, uri = demo
    r = _runs(uri)
    history = r["client"].get_metric_history(r["train"].info.run_id, "loss")
    assert sorted(m.step for m in history) == logged
    query = urllib.parse.urlencode({
        "runs": json.dumps([r["train"].info.run_id]), "metric": json.dumps("loss"),
        "experiments": json.dumps([r["experiment"]]), "plot_metric_keys": json.dumps(["loss"]),
        "plot_layout": "{}", "x_axis": "step", "y_axis_scale": "linear", "line_smoothness": 1,
        "show_point": "true", "deselected_curves": "[]", "last_linear_y_axis_range": "[]"})
    dom = _browse(f"{ui}/#/metric?{query}", OUT / "train-loss.png", OUT / ".profile-loss")
    last = max(history, key=lambda m: m.step)
    assert f"(step={last.step})" in dom and "demo/train" in dom  # the chart's table: the run's latest loss


def test_the_report_is_on_the_train_and_parent_runs_and_renders_in_the_artifact_view(demo, ui):
    repo, uri = demo
    r = _runs(uri)
    report = (repo / "runs" / "demo" / "report.html").read_bytes()
    for step in ("train", "parent", "report"):
        run_id = r[step].info.run_id
        with urllib.request.urlopen(f"{ui}/get-artifact?path=report.html&run_uuid={run_id}", timeout=30) as got:
            assert got.read() == report, step
    train = r["train"].info.run_id
    png = OUT / "train-artifacts-report.png"
    # The artifact view fetches report.html into a frame after the page itself has loaded. On a busy
    # machine (CI runs two test streams at once) the frame was still blank after 30 s of the page's
    # virtual time, and drawn after 120 s (2026-11-29, beside the corpus): the page is opened again
    # with a longer budget, at most three times in all.
    for budget_ms in (30000, 120000, 300000):
        _screenshot(f"{ui}/#/experiments/{r['experiment']}/runs/{train}/artifacts/report.html", png,
                    OUT / ".profile-art", budget_ms)
        if shows(png, BOX_FILL):
            break
    assert shows(png, BOX_FILL)  # the run diagram's GPU boxes, drawn inside MLflow's artifact view


def test_the_demo_report_opens_on_nothing_to_change_and_the_run(demo):
    """The demo as a GPU machine runs it: the host sends each replica its half batch (the arrows:
    placement.json's matrix), the replicas all-reduce every gradient, nothing to change."""
    repo, _ = demo
    run_dir = repo / "runs" / "demo"
    from pinpoint.placement.model.files import read_placement

    p = read_placement(run_dir)
    screen = read_first_screen(run_dir / "report.html", "demo")
    boxes, arrows, reduced = expected_from_placement(p)
    assert (screen.boxes, screen.arrows) == (boxes, arrows)
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    assert cfg["train"]["model"] == "mlp"
    params = 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10  # digits' 64 features, the MLP's 128 and 64, 10 classes
    assert screen.reduced == reduced == 2 * params * 4  # two replicas, float32
    assert (screen.nothing, screen.findings) == (True, [])
    assert shows(screen.screenshot, BOX_FILL)


def test_the_demo_report_shows_each_gpus_busy_time_and_memory(demo):
    """What the README promises the report answers includes how busy each device was and how much
    memory it holds: the demo config times and measures its devices, so the first report shows both."""
    from pinpoint.placement.model.files import read_placement
    from pinpoint.placement.model.placement import as_placement
    from pinpoint.placement.report.rundiagram import boxes

    repo, _ = demo
    p = read_placement(repo / "runs" / "demo")
    busy = {b.device: b.busy is not None for b in boxes(as_placement(p)) if b.device.startswith("/GPU")}
    held = {d: r["measured"] > 0 for d, r in p["memory"]["predicted"]["devices"].items() if d.startswith("/GPU")}
    assert (busy, held) == ({"/GPU:0": True, "/GPU:1": True}, {"/GPU:0": True, "/GPU:1": True})
