"""The worked example (examples/digits_cnn) as a newcomer runs it, in a copy outside the source
tree: write its TFRecords with the package's own writer, then the whole pipeline through kfp.local
(provision -> train -> report) against a real MLflow server; the user's model comes back from
MLflow and predicts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from pinpoint.placement.model.files import read_placement
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]
BATCH = 64
PREDICT = """
import json, sys
import mlflow, numpy as np
from pinpoint.training.input.digits import load_digits
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(f"runs:/{sys.argv[2]}/model")
x, y = load_digits()
logits = np.asarray(model.predict((x[:256].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., None]))
print(json.dumps([list(logits.shape), float(np.mean(np.argmax(logits, -1) == y[:256]))]))
"""


def test_worked_example_through_the_local_pipeline(live_mlflow, tmp_path):
    example = tmp_path / "digits_cnn"
    shutil.copytree(REPO / "examples" / "digits_cnn", example, ignore=shutil.ignore_patterns("data", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(example), "TF_CPP_MIN_LOG_LEVEL": "2"}
    wrote = subprocess.run([sys.executable, "-m", "digits_cnn.data", str(example / "data")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    assert len(list((example / "data").glob("digits-*.tfrecord"))) == 4

    config = example / "config.yaml"
    text = config.read_text()
    # The example's own steps (300) and checkpoints: the accuracy its README states is checked below.
    text = re.sub(r"^  uri: .*$", f"  uri: {live_mlflow.uri}", text, flags=re.M)
    config.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "run", str(config), "--runs-root", str(tmp_path / "runs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1100,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run = tmp_path / "runs" / "digits-cnn"
    assert (run / "report.html").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["model"] == "digits_cnn.model:build_model" and metrics["data"] == "tfrecord (4 files)"
    placement = read_placement(run / "placement.json")
    # The split as configured: the conv block on /GPU:0, the classifier on /GPU:1; flatten's
    # 4x4x32 output crosses forward and its gradient crosses back, each step. So do the logits
    # (to the loss, unpinned: /GPU:0) and the classifier's parameter set (weight gradients to the
    # optimizer's unpinned arithmetic on /GPU:0, updates back), as on a GPU machine.
    boundary = BATCH * 4 * 4 * 32 * 4
    logits = BATCH * 10 * 4
    classifier = sum(v["bytes"] for v in placement["variables"] if v["devices"] == ["/GPU:1"])
    assert classifier == (512 * 64 + 64 + 64 * 10 + 10) * 4  # dense 512->64 and head 64->10
    assert placement["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["bytes"] == boundary + logits + classifier
    assert placement["transfers"]["matrix"]["/GPU:1"]["/GPU:0"]["bytes"] == boundary + logits + classifier
    rows = {r["layer"]: r for r in placement["layers"]}
    assert set(rows["conv_1"]["backward_ops"]) == {"/GPU:0"} and set(rows["head"]["backward_ops"]) == {"/GPU:1"}
    assert placement["input_pipeline"]["device"] == "/CPU:0"

    import mlflow

    client = mlflow.MlflowClient(live_mlflow.uri)
    exp = client.get_experiment_by_name("pinpoint")
    (train_run,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == "digits-cnn/train"]
    assert train_run.data.params["train.model"] == "digits_cnn.model:build_model"
    # Load and predict in a fresh process: TensorFlow must not initialize in this one (the
    # in-process tests configure logical devices before TF's first use).
    predict = subprocess.run([sys.executable, "-c", PREDICT, live_mlflow.uri, train_run.info.run_id],
                             capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert predict.returncode == 0, predict.stderr[-2000:]
    shape, acc = json.loads(predict.stdout.strip().splitlines()[-1])
    assert shape == [256, 10]
    # What examples/digits_cnn/README.md states for its 300 steps (on the first 256 training digits).
    stated = float(re.search(r"reaches about (0\.\d+) accuracy in 300 steps",
                             (REPO / "examples" / "digits_cnn" / "README.md").read_text()).group(1))
    assert abs(acc - stated) <= 0.02, (acc, stated)
