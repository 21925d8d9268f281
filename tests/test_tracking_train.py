"""A real `pinpoint train` process tracked by a real `mlflow server` that is stopped and restarted
while it trains: training neither stops nor loses anything, every logged step arrives exactly
once; then `--resume-from-run` restores the latest checkpoint logged in that run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement
from pinpoint.tracking.spool import find_spools
from tests.conftest import make_config

PINPOINT = str(Path(sys.executable).parent / "pinpoint")
STEPS, LOG_EVERY, CKPT_EVERY = 3000, 10, 500


def write_config(path: Path, uri: str, experiment: str, steps: int) -> Path:
    return make_config(
        "trk-train",
        cluster={"chief": 1, "workers": 0, "devices_per_worker": 2, "device_type": "GPU", "emulate": True},
        train={"strategy": "mirrored", "model": "mlp", "data": "synthetic", "synthetic_examples": 512,
               "batch_size": 32, "steps": steps, "log_every": LOG_EVERY, "checkpoint_every": CKPT_EVERY,
               "keep_checkpoints": 2, "pinning": {"input": "/CPU:0"}},
        placement={"warmup_steps": 2}, tracking={"uri": uri, "experiment": experiment, "step_metrics_every_s": 0,
                                               "checkpoints_every_s": 0},  # every checkpoint (asserted)
        path=path,
    )


def log_steps(out: Path) -> list[int]:
    f = out / "train_log.jsonl"
    if not f.exists():
        return []
    return [json.loads(line)["step"] for line in f.read_text().splitlines() if line.strip()]


def env():
    e = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="2")
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_real_training_survives_server_restart_and_resumes_from_run(live_mlflow, tmp_path):
    from mlflow.tracking import MlflowClient

    experiment = f"train-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "cfg.yaml", live_mlflow.uri, experiment, steps=STEPS)
    err_log = tmp_path / "train.err"
    with open(err_log, "w") as err, open(tmp_path / "train.out", "w") as stdout:
        proc = subprocess.Popen([PINPOINT, "train", str(cfg), "--out", str(out)], stdout=stdout,
                                stderr=err, text=True, env=env())
    try:
        # Outage in the middle: wait for the first logged steps, then stop the server.
        deadline = time.monotonic() + 600
        while len(log_steps(out)) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, f"training ended before the outage:\n{err_log.read_text()[-3000:]}"
        live_mlflow.stop(hard=True)  # a crash: the port stops answering at once
        at_stop = len(log_steps(out))
        # Down until training has met the outage: on a busy machine (CI runs two test streams at
        # once) a quick restart fell between its calls, and training never saw the server gone.
        deadline = time.monotonic() + 300
        while "unreachable" not in err_log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        live_mlflow.start()
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = err_log.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    steps = log_steps(out)
    assert steps[-1] == STEPS and len(steps) > at_stop  # training went on through the outage
    assert "unreachable" in stderr and "spooling" in stderr

    # If training finished before the server came back, the spool is left: upload it.
    if find_spools(out):
        up = subprocess.run([PINPOINT, "upload-spool", str(out)], check=False, capture_output=True, text=True, env=env())
        assert up.returncode == 0, up.stderr
    assert not find_spools(out)

    c = MlflowClient(live_mlflow.uri)
    exp = c.get_experiment_by_name(experiment)
    (run,) = c.search_runs([exp.experiment_id], filter_string="tags.`pinpoint.step` = 'train'")
    run_id = run.info.run_id
    for key in ("loss", "accuracy", "examples_per_sec", "step_time"):
        got = sorted(m.step for m in c.get_metric_history(run_id, key))
        assert got == sorted(steps), f"{key}: MLflow steps differ from train_log.jsonl"  # exactly once
    assert run.info.status == "FINISHED"
    assert any(k.startswith("placement.") for k in run.data.metrics)
    assert any(k.startswith("system/") for k in run.data.metrics)
    assert run.data.params["train.strategy"] == "mirrored"
    assert run.data.params["config_digest"]
    ckpts = sorted(int(a.path.rsplit("-", 1)[1]) for a in c.list_artifacts(run_id, "checkpoints"))
    assert ckpts == list(range(CKPT_EVERY, STEPS + 1, CKPT_EVERY))  # every checkpoint as written, even rotated ones
    top = {a.path for a in c.list_artifacts(run_id)}
    assert {"placement.json", "metrics.json", "model"} <= top

    # The final model loads back through pyfunc and predicts as the trained model evaluated.
    import mlflow
    import numpy as np

    from pinpoint.training.input.data import synthetic

    mlflow.set_tracking_uri(live_mlflow.uri)
    try:
        model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    data = synthetic(512)
    n = 512  # the same examples the trainer evaluated (EVAL_LIMIT > 512)
    acc = float(np.mean(np.argmax(np.asarray(model.predict(data.x[:n])), -1) == data.y[:n]))
    reported = json.loads((out / "metrics.json").read_text())["final_accuracy"]
    assert acc == pytest.approx(reported, abs=0.01), (acc, reported)

    # Resume in a fresh folder from the MLflow run: continues the step count from STEPS.
    cfg2 = write_config(tmp_path / "cfg2.yaml", live_mlflow.uri, experiment, steps=STEPS + 20)
    out2 = tmp_path / "resumed"
    res = subprocess.run([PINPOINT, "train", str(cfg2), "--out", str(out2), "--resume-from-run", run_id],
                         check=False, capture_output=True, text=True, env=env(), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from checkpoint step {STEPS}" in res.stderr
    assert log_steps(out2)[0] > STEPS and log_steps(out2)[-1] == STEPS + 20
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`pinpoint.resumed_from_run` = '" + run_id + "'")
    assert len(runs) == 1
    assert min(m.step for m in c.get_metric_history(runs[0].info.run_id, "loss")) > STEPS


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_placement_metrics_are_logged_at_the_captured_step(tmp_path):
    """A real `pinpoint train` tracked to a local MLflow store (sqlite): every placement.* metric
    holds one point, at the last step placement.json says was captured (not at step 0), and the run's
    placement.json artifact is the run folder's."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = f"placement-step-{uuid.uuid4().hex[:8]}"
    cfg = {
        "name": "trk-placement-step",
        "cluster": {"chief": 1, "workers": 0, "devices_per_worker": 2, "device_type": "GPU", "emulate": True},
        "train": {"strategy": "mirrored", "model": "mlp", "data": "synthetic", "synthetic_examples": 256,
                  "batch_size": 32, "steps": 8, "log_every": 4, "checkpoint_every": 0},
        "placement": {"warmup_steps": 2, "sample_steps": 2},
        "tracking": {"uri": uri, "experiment": experiment, "log_model": False, "step_metrics_every_s": 0},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    res = subprocess.run([PINPOINT, "train", str(tmp_path / "cfg.yaml"), "--out", str(out)], check=False,
                         capture_output=True, text=True, env=env(), timeout=540)
    assert res.returncode == 0, res.stderr[-3000:]
    placement = read_placement(out / "placement.json")
    assert placement["captured_steps"] == [2, 3]

    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name(experiment).experiment_id],
                           filter_string="tags.`pinpoint.step` = 'train'")
    keys = [k for k in run.data.metrics if k.startswith("placement.")]
    assert "placement.ops.GPU_0" in keys and "placement.transfers_per_step" in keys
    for key in keys:
        history = c.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [3], key  # once, at the last captured step
    logged = json.loads(Path(c.download_artifacts(run.info.run_id, "placement.json", str(tmp_path))).read_text())
    assert logged["captured_steps"] == placement["captured_steps"]
