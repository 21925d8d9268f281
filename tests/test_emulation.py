"""GPU-faithful emulation, for real on 3 logical CPUs (host, /GPU:0=/CPU:1, /GPU:1=/CPU:2):
unrequested ops go where a GPU machine's placer puts them, ops without a GPU kernel are
predicted to fall back to the host (or fail with soft placement off), and the seed scenario's
transfer matrix is a GPU machine's."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pinpoint.errors import PlacementError
from tests.conftest import mlp_param_bytes
from tests.test_training import _three_logical_cpus  # noqa: F401 (autouse fixture)
from tests.test_training import make_cfg as training_cfg
from tests.test_training import train as train_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# A user model with a layer whose op has no GPU kernel (RandomIndexShuffle: CPU only in the
# kernel registry): a fixed random permutation of the input features.
MODEL = """
    import keras
    import tensorflow as tf


    class FeatureShuffle(keras.layers.Layer):
        def build(self, input_shape):
            # The permutation's seed is state (not a constant), so the op is not folded away.
            self.seed = self.add_weight(shape=(2,), dtype="int64", initializer="ones", trainable=False)

        def call(self, x):
            n = tf.cast(tf.shape(x)[-1], tf.int64)
            idx = tf.random.experimental.index_shuffle(
                tf.range(n), seed=tf.convert_to_tensor(self.seed), max_index=n - 1)
            return tf.gather(x, idx, axis=-1)


    def shuffled_mlp(input_shape, num_classes):
        inp = keras.Input(input_shape)
        x = keras.layers.Flatten(name="flat")(inp)
        x = FeatureShuffle(name="shuffle")(x)
        x = keras.layers.Dense(32, activation="relu", name="hidden")(x)
        return keras.Model(inp, keras.layers.Dense(num_classes, name="head")(x))
"""


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fidelitycode")
    (root / "gpufidelity").mkdir()
    (root / "gpufidelity" / "__init__.py").write_text("")
    (root / "gpufidelity" / "models.py").write_text(textwrap.dedent(MODEL))
    return root


def make_cfg(pinning=None, code_dir=None, **train):
    """A few steps of strategy none (the user's model when `code_dir` is given), XLA off."""
    if code_dir is not None:
        train.update(model="gpufidelity.models:shuffled_mlp", code_dir=str(code_dir))
    return training_cfg("none", pinning, steps=12, log_every=6, checkpoint_every=0, jit_compile=False, **train)


def train(cfg, out: Path) -> dict:
    return train_run(cfg, out)[1]  # the placement


def ops_of(placement, op_type) -> list[dict]:
    return [o for o in placement["ops"] if o["type"] == op_type]


def host_items(placement) -> list[dict]:
    return [it for it in placement["transfers"]["largest"] if "/CPU:0" in (it["from"], it["to"])]


def test_unrequested_ops_go_to_the_emulated_gpu0_unless_they_have_no_gpu_kernel(code_dir, tmp_path):
    placement = train(make_cfg(code_dir=code_dir), tmp_path)
    # Forward, backward and the optimizer's arithmetic: on /GPU:0, as a GPU machine's placer does.
    matmuls = [o for o in placement["ops"] if o["type"] in ("MatMul", "_MklMatMul")]
    assert matmuls and {o["device"] for o in matmuls} == {"/GPU:0"}
    assert {d for v in placement["variables"] for d in v["devices"]} == {"/GPU:0"}
    assert {d for v in placement["variables"] for d in v["update_devices"]} == {"/GPU:0"}
    # The model's RandomIndexShuffle has no GPU kernel: the host, like on a GPU machine, and no
    # fallback of any kind (nothing requested a GPU for it).
    shuffles = [o for o in ops_of(placement, "RandomIndexShuffle") if re.search(r"(^|/)shuffle(_\d+)?/", o["op"])]
    assert [o["device"] for o in shuffles] == ["/CPU:0"]
    assert placement["fallbacks"] == []


def test_a_pinned_op_without_a_gpu_kernel_is_a_predicted_fallback_and_a_violation(code_dir, tmp_path):
    from pinpoint.placement.report.metrics import headline_metrics
    from pinpoint.placement.report.summary import format_summary

    placement = train(make_cfg({"layers": {"shuffle": "/GPU:1"}}, code_dir=code_dir), tmp_path)
    predicted = {f["op_type"]: f for f in placement["fallbacks"] if f.get("predicted")}
    # index_shuffle pads its int64 seed first: PadV2 has GPU kernels, but none for T=int64.
    assert sorted(predicted) == ["PadV2", "RandomIndexShuffle"]
    assert {(f["placed"], f["would_run_on"]) for f in predicted.values()} == {("/GPU:1", "/CPU:0")}
    assert predicted["RandomIndexShuffle"]["reason"].startswith("no GPU kernel for RandomIndexShuffle (Tseed=int64, dtype=int64)")
    assert predicted["PadV2"]["reason"].startswith("no GPU kernel for PadV2 (T=int64, Tpaddings=int32)")
    assert [f for f in placement["fallbacks"] if not f.get("predicted")] == []
    # It ran on the emulated /GPU:1 (observed) ...
    assert [o["device"] for o in ops_of(placement, "RandomIndexShuffle") if re.search(r"(^|/)shuffle(_\d+)?/", o["op"])] == ["/GPU:1"]
    # ... and the layer's rule counts it where a GPU machine runs it.
    rules = {r["rule"]: r for r in placement["conformance"]["rules"]}
    viol = rules["layers.shuffle"]["violations"]
    assert [(v["placed"], v["predicted"]) for v in viol] == [("/CPU:0", True)] * 2
    assert rules["layers.shuffle"]["score"] < 1.0
    metrics = headline_metrics(placement)
    assert (metrics["placement.fallbacks"], metrics["placement.predicted_fallbacks"]) == (0.0, 2.0)
    text = format_summary(placement, {"steps": 12, "final_loss": 1.0, "final_accuracy": 0.5,
                                      "examples_per_sec": 1.0, "strategy": "none", "task": "chief:0"})
    assert "fallbacks  : 0" in text
    assert "predicted: 2 on a GPU machine" in text and "(PadV2) /GPU:1->/CPU:0" in text


def test_soft_placement_off_fails_like_a_gpu_machine_naming_op_rule_and_fix(code_dir, tmp_path):
    cfg = make_cfg({"layers": {"shuffle": "/GPU:1"}, "soft_placement": False}, code_dir=code_dir)
    from pinpoint.training.command import train_command

    with pytest.raises(PlacementError) as err:
        train_command(cfg, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    # The first op of the layer with no GPU kernel for its dtypes (index_shuffle's int64 PadV2
    # comes before the shuffle itself).
    assert re.match(r"train\.pinning\.layers\.shuffle: op '\S*shuffle\S*' is pinned to /GPU:1 but a GPU "
                    r"machine has no GPU kernel for \w+ \(", msg), msg
    assert "enable soft_placement" in msg
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_seed_scenario_moves_one_parameter_set_gpu1_to_gpu0_and_only_the_batch_through_the_host(tmp_path):
    placement = train(make_cfg({"variables": "/GPU:0", "gradients": "/GPU:1"}), tmp_path)
    params = mlp_param_bytes()  # the mlp's kernels and biases, from its shapes
    matrix = placement["transfers"]["matrix"]
    # The gradients (computed on /GPU:1) cross once to the variables' device; nothing else does.
    assert matrix["/GPU:1"] == {"/GPU:0": {"count": 6, "bytes": params}}, [i for i in placement["transfers"]["largest"] if i["from"] == "/GPU:1"]
    # Through the host: the input batch out (to both GPUs: the forward pass and the first
    # layer's weight gradient), scalars (the step counter) in; nothing of the model's weights.
    for it in host_items(placement):
        if it["from"] == "/CPU:0" and it["bytes"]:
            assert it["tensor"].startswith("input/") or it["bytes"] <= 8, it
        if it["to"] == "/CPU:0":
            assert (it["bytes"] or 0) <= 8, it
    batch = 32 * 64 * 4
    assert matrix["/CPU:0"]["/GPU:1"]["bytes"] == batch
    # All the model's and the optimizer's compute is on the GPUs.
    ops = placement["ops_by_device"]
    assert {o["device"] for o in placement["ops"] if o["type"] in ("MatMul", "_MklMatMul", "BiasAddGrad")} <= {"/GPU:0", "/GPU:1"}
    assert ops["/GPU:0"] > ops["/CPU:0"]


@pytest.mark.parametrize("op_type, attrs, reason", [
    ("MatMul", {"T": "float32"}, None),
    ("PadV2", {"T": "float32", "Tpaddings": "int32"}, None),
    ("PadV2", {"T": "int64", "Tpaddings": "int32"}, "no GPU kernel for PadV2 (T=int64, Tpaddings=int32)"),
    ("RandomIndexShuffle", {"dtype": "int64", "Tseed": "int64"},
     "no GPU kernel for RandomIndexShuffle (Tseed=int64, dtype=int64)"),
    ("Unique", {"T": "float32", "out_idx": "int32"}, None),
    ("UniqueV2", {"T": "int64", "Taxis": "int64", "out_idx": "int32"},
     "no GPU kernel for UniqueV2 (T=int64, Taxis=int64, out_idx=int32)"),
    ("VarHandleOp", {"dtype": "float32"}, None),  # a DEFAULT kernel: any device type
    ("__inference_some_function_42", {}, None),  # not a kernel op: the runtime places its body
])
def test_the_kernel_registry_decides_which_ops_a_gpu_can_run(op_type, attrs, reason):
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    from pinpoint.kernels import missing_gpu_kernel

    values = {k: attr_value_pb2.AttrValue(type=tf.as_dtype(v).as_datatype_enum) for k, v in attrs.items()}
    assert missing_gpu_kernel(op_type, values) == reason
