"""Exact bytes for a residual model placed otherwise than the run the prediction is made from.

Three things a residual block meets change with the placement, and the plan graph models each:
- a block's input is read by its first convolution and by its Add, so its gradient is a sum of
  contributions, which `tf.gradients` sums per device, then beside the op that made the input
  (plan.build._grad_sums, PlanGraph.sums);
- on one device grappler merges the Add with the last add of the BatchNormalization before it
  (AddOpsRewrite): the Add reads that layer's operands instead of its output (plan.build._unabsorb);
- on one device grappler reorders `(gamma's gradient * rsqrt) * learning rate` across the layer and
  the optimizer (MinimizeBroadcasts): the chain keeps the inputs the graph asked for
  (placement.analysis.opgraph).
The prediction from a run on one device, and from one split for another and back, equals what
the other run measured, pair by pair; each model alone makes it fail."""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import NO_TRACKING, make_config

MODEL = """
    import keras


    def block(x, name, filters):
        y = keras.layers.Conv2D(filters, 3, padding="same", name=f"{name}_conv")(x)
        y = keras.layers.BatchNormalization(name=f"{name}_bn")(y)
        y = keras.layers.Add(name=f"{name}_add")([x, y])
        return keras.layers.ReLU(name=f"{name}_relu")(y)


    def tiny_resnet(input_shape, num_classes):
        inp = keras.Input(input_shape)
        x = keras.layers.Reshape((8, 8, 1), name="image")(inp)
        x = keras.layers.Conv2D(8, 3, padding="same", name="stem")(x)
        x = block(block(x, "b1", 8), "b2", 8)
        x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
        return keras.Model(inp, keras.layers.Dense(num_classes, name="head")(x), name="tiny_resnet")
"""
LAYERS = ("image", "stem", "b1_conv", "b1_bn", "b1_add", "b1_relu", "b2_conv", "b2_bn", "b2_add", "b2_relu", "pool",
          "head")
# Each block's convolution and BatchNormalization on /GPU:1, apart from the Add that reads them and
# from the stem or block whose output both the convolution and the Add read.
SPLIT = {k: "/GPU:1" if k.endswith(("_conv", "_bn")) else "/GPU:0" for k in LAYERS}
# Another split: the stem and block 1's Add on /GPU:1, block 1's convolution and block 2's Add on
# /GPU:0, so each residual gradient's contributions come from other devices than in SPLIT.
OTHER = {**dict.fromkeys(LAYERS, "/GPU:0"), "stem": "/GPU:1", "b1_add": "/GPU:1", "b2_conv": "/GPU:1",
         "b2_bn": "/GPU:1"}
CLUSTER = {"devices_per_worker": 2, "emulate": True}
PLACEMENT = {"warmup_steps": 1, "sample_steps": 1, "timing": False}


def _train(tmp_path: Path, code: Path, name: str, layers: dict[str, str]) -> Path:
    from pinpoint.training.command import train_command

    train = {"strategy": "none", "model": "respkg.models:tiny_resnet", "code_dir": str(code), "steps": 4,
             "batch_size": 16, "learning_rate": 0.05, "log_every": 2, "checkpoint_every": 0, "jit_compile": False,
             "pinning": {"layers": layers}}
    out = tmp_path / name
    assert train_command(make_config(name, cluster=CLUSTER, train=train, tracking=NO_TRACKING,
                                     placement=PLACEMENT), out) == 0
    return out


def _sent(run: Path) -> set[str]:
    with gzip.open(run / "placement_ops.json.gz", "rt") as f:
        return {t["tensor"] for t in json.load(f)["transfer_items"] if t["bytes"]}


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_residual_model_placed_otherwise_than_its_source_run_gets_exact_bytes_per_pair(tmp_path, tf):
    from pinpoint.placement.model.files import load_placement
    from pinpoint.plan.build import plan_graph
    from pinpoint.plan.links import LinkModel
    from pinpoint.plan.predict import predict
    from pinpoint.plan.verify import pair_bytes

    code = tmp_path / "code"
    (code / "respkg").mkdir(parents=True)
    (code / "respkg" / "__init__.py").write_text("")
    (code / "respkg" / "models.py").write_text(textwrap.dedent(MODEL))
    source = _train(tmp_path, code, "one-device", dict.fromkeys(LAYERS, "/GPU:0"))
    split = _train(tmp_path, code, "split", SPLIT)
    other = _train(tmp_path, code, "other", OTHER)

    def predicted(run: Path, layers: dict[str, str]) -> dict[str, int]:
        graph = plan_graph(run)
        placement = {g.key: layers.get(g.key, g.device) for g in graph.groups}
        pairs = predict(graph, placement, LinkModel(), ("/GPU:0", "/GPU:1")).bytes_crossing
        return {f"{a} -> {b}": n for (a, b), n in pairs.items() if n}

    def measured(run: Path) -> dict[str, int]:
        return {pair: b for pair, b in pair_bytes(load_placement(run, field="run_dir")).items() if b}

    assert predicted(source, SPLIT) == measured(split)
    assert predicted(split, OTHER) == measured(other)
    assert predicted(other, SPLIT) == measured(split)

    # The split run sent each BatchNormalization's output to its Add (on one device grappler
    # merged the two: the run the prediction is made from has no such tensor).
    assert {s for s in _sent(split) if s.endswith("/batchnorm/add_1")} == {
        f"tiny_resnet_1/{b}_bn_1/batchnorm/add_1" for b in ("b1", "b2")}
    assert not {s for s in _sent(source) if s.endswith("/batchnorm/add_1")}
