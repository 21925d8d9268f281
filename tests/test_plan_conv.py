"""`pinpoint plan --verify` on a convolutional model split over two emulated GPUs.

On CPU TensorFlow's oneDNN rewrite fuses a convolution's filter gradient with its bias gradient
into one op whose second output is the bias gradient: its transfer must be sized (one float per
filter), and the graph partitioner's own nodes for a cross-device edge must not count against the
layer whose name they carry. Both held the towers and MobileNetV2 plans of the bench below exact
bytes and full conformance."""

from __future__ import annotations

import gzip
import json

import pytest

from pinpoint.cli import main
from tests.conftest import NO_TRACKING, make_config

SPLIT = {"reshape": "/GPU:1", "conv_1": "/GPU:1", "conv_2": "/GPU:0", "pool": "/GPU:0", "flatten": "/GPU:0",
         "dense_1": "/GPU:0", "head": "/GPU:0"}
TRAIN = {"strategy": "none", "model": "cnn", "steps": 6, "batch_size": 16, "learning_rate": 0.05, "log_every": 2,
         "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": SPLIT}}
CLUSTER = {"devices_per_worker": 2, "emulate": True}
PLACEMENT = {"warmup_steps": 2, "sample_steps": 2, "timing": True}


def _transfers(run) -> list[dict]:
    with gzip.open(run / "placement_ops.json.gz", "rt") as f:
        return json.load(f)["transfer_items"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_split_conv_model_verifies_with_every_transfer_sized_exact_bytes_and_full_conformance(tmp_path, tf, capsys):
    from pinpoint.training.command import train_command
    from pinpoint.training.loop.models import build_model

    source = tmp_path / "source"
    path = make_config("conv-src", cluster=CLUSTER, train=TRAIN, tracking=NO_TRACKING, placement=PLACEMENT,
                       path=tmp_path / "conv.yaml")
    assert train_command(make_config("conv-src", cluster=CLUSTER, train=TRAIN, tracking=NO_TRACKING,
                                     placement=PLACEMENT), source) == 0
    filters = {layer.name: layer.filters for layer in build_model("cnn", (64,), 10).stack if hasattr(layer, "filters")}

    # conv_1 computes on /GPU:1 and the optimizer (not pinned: beside the loss, on /GPU:0) takes its
    # gradients: the bias gradient crosses as one float32 per filter. With oneDNN (a CPU with
    # AVX-512) it is the fused filter gradient's second output, else BiasAddGrad's.
    sent = {t["tensor"]: t for t in _transfers(source)}
    bias = [t for name, t in sent.items() if "conv_1" in name
            and (name.endswith("Conv2DBackpropFilter:1") or name.endswith("BiasAddGrad"))]
    assert [(t["from"], t["to"], t["bytes"]) for t in bias] == [("/GPU:1", "/GPU:0", filters["conv_1"] * 4)]
    assert json.loads((source / "placement.json").read_text())["transfers"]["per_step"]["unsized"] == 0

    vdir = tmp_path / "verify"
    capsys.readouterr()
    assert main(["plan", str(source), "--objective", "balance", "--verify", "--config", str(path),
                 "--verify-out", str(vdir)]) == 0
    check = json.loads((vdir / "plan_check.json").read_text())
    assert json.loads((vdir / "placement.json").read_text())["transfers"]["per_step"]["unsized"] == 0
    assert check["bytes"]["exact"] is True
    assert check["bytes"]["predicted_total"] == check["bytes"]["measured_total"]
    assert check["conformance"]["score"] == 1.0
    assert check["conformance"]["deviations"] == []
