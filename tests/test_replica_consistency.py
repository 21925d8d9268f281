"""Replica consistency on models users train: BatchNormalization's moving statistics are
per-replica state (each replica keeps the statistics of its own share of the batch), reported as
state drift with its cause and fix, apart from trainable drift, which must be 0. Real
`pinpoint train` runs on emulated GPUs (logical CPU devices), user models from the config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement
from tests import zygote

MODELS = '''
import keras
import numpy as np
import tensorflow as tf



def images(n=64, side=32, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, side, side, 3)).astype("float32")
    y = rng.integers(0, classes, size=n).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y))


def _synchronized(model):
    def clone(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            config["synchronized"] = True
        return layer.__class__.from_config(config)
    return keras.models.clone_model(model, clone_function=clone)


def convnet(input_shape, num_classes, synchronized=False):
    """keras-io style: conv, batch norm, relu, pooling, a dense head."""
    inp = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, strides=2, name="conv")(inp)
    x = keras.layers.BatchNormalization(synchronized=synchronized, name="conv_bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inp, keras.layers.Dense(num_classes, name="head")(x), name="convnet")


def mobilenet(input_shape, num_classes, synchronized=False):
    model = keras.applications.MobileNetV2(input_shape=input_shape, alpha=0.35, weights=None,
                                           classes=num_classes, classifier_activation=None)
    return _synchronized(model) if synchronized else model
'''

BN_STATS = {"conv_bn/moving_mean", "conv_bn/moving_variance"}


def train_user_model(tmp_path: Path, model: str, synchronized: bool = False, strategy: str = "mirrored",
                     train: dict | None = None, **cluster) -> dict:
    """`pinpoint train` on bnpkg.models:<model> (32x32 RGB images, 4 classes); the placement."""
    (tmp_path / "bnpkg").mkdir()
    (tmp_path / "bnpkg" / "__init__.py").write_text("")
    (tmp_path / "bnpkg" / "models.py").write_text(MODELS)
    cfg = {
        "name": "bn",
        "cluster": {"devices_per_worker": 2, "device_type": "GPU", "emulate": True, **cluster},
        "train": {"strategy": strategy, "model": f"bnpkg.models:{model}", "model_args": {"synchronized": synchronized},
                  "data": "bnpkg.models:images", "num_classes": 4, "batch_size": 8, "steps": 4,
                  "checkpoint_every": 0, "log_every": 2, "max_restarts": 0, **(train or {})},
        "tracking": {"enabled": False},
        "placement": {"warmup_steps": 2, "sample_steps": 1},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = tmp_path / "run"
    # Forked from a process with TensorFlow and Pinpoint imported (tests/zygote.py): a fresh process but
    # for its start-up (a cluster's tasks are the launcher's own processes, fresh ones).
    r = zygote.python([sys.executable, "-m", "pinpoint.cli", "train", str(tmp_path / "cfg.yaml"), "--out", str(out)],
                      cwd=tmp_path, env=env, timeout=840, preload=zygote.PINPOINT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    placement = read_placement(out / "placement.json")
    placement["_stdout"] = r.stdout
    return placement


def _check(p: dict, synchronized: bool, state_names) -> None:
    from pinpoint.placement.report.metrics import headline_metrics

    rc = p["replica_consistency"]
    hm = headline_metrics(p)
    assert rc["trainable_drift"] == 0.0
    assert hm["placement.replica_drift.trainable"] == 0.0
    if synchronized:
        assert rc["state_drift"] == 0.0 and rc["state"] == []
        assert hm["placement.replica_drift.state"] == 0.0
        return
    assert rc["state_drift"] > 0 and hm["placement.replica_drift.state"] == rc["state_drift"]
    [group] = rc["state"]
    assert group["what"] == "BatchNormalization moving statistics"
    assert group["fix"].startswith("BatchNormalization(synchronized=True)")
    assert "first replica" in group["checkpoint_keeps"]
    assert state_names({v["variable"] for v in group["variables"]})
    assert "fix: BatchNormalization(synchronized=True)" in p["_stdout"]


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("synchronized", [False, True], ids=["bn", "synchronized-bn"])
def test_mirrored_batchnorm_state_drift_is_explained(tmp_path, synchronized):
    p = train_user_model(tmp_path, "convnet", synchronized)
    classes = p["replica_consistency"]["classes"]
    assert {n for n, c in classes.items() if c == "replica_state"} == BN_STATS
    assert classes["conv/kernel"] == "trainable" and classes["sgd/iteration"] == "optimizer"
    _check(p, synchronized, lambda names: names == BN_STATS)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("synchronized", [False, True], ids=["bn", "synchronized-bn"])
def test_multi_worker_batchnorm_state_drift_across_tasks(tmp_path, synchronized):
    """chief + 1 worker, 1 emulated GPU each: every task holds one copy; the merge compares the
    copies across tasks and keeps each variable's class."""
    p = train_user_model(tmp_path, "convnet", synchronized, "multi_worker_mirrored", chief=1, workers=1, devices_per_worker=1)
    assert p["task"] == "cluster"
    _check(p, synchronized, lambda names: names == BN_STATS)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("synchronized", [False, True], ids=["bn", "synchronized-bn"])
def test_mobilenetv2_mirrored_state_drift_is_batchnorm_only(tmp_path, synchronized):
    """keras.applications.MobileNetV2 (alpha 0.35, no weights, 32x32 RGB) on 2 emulated GPUs."""
    p = train_user_model(tmp_path, "mobilenet", synchronized)
    stats = {n for n, c in p["replica_consistency"]["classes"].items() if c == "replica_state"}
    assert len(stats) == 2 * 52 and all(n.endswith(("/moving_mean", "/moving_variance")) for n in stats)
    _check(p, synchronized, lambda names: names <= stats and len(names) > len(stats) // 2)
