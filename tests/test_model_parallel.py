"""Model parallelism for real, on 3 logical CPUs (host, /GPU:0=/CPU:1, /GPU:1=/CPU:2): with
pinning.layers each layer's forward AND backward ops run on its device, the boundary activation
crosses A->B and its gradient B->A every step (bytes = the boundary tensor), and the split run
computes what an unsplit run computes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_training import _three_logical_cpus, make_cfg, rule, train  # noqa: F401 (autouse fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BATCH = 32
SPLITS = {
    # model: (pinning.layers, boundary tensor bytes per step: batch x width x float32)
    "mlp": ({"dense_1": "/GPU:0", "dense_2": "/GPU:1", "head": "/GPU:1"}, BATCH * 128 * 4),
    "cnn": ({"reshape": "/GPU:0", "conv_1": "/GPU:0", "conv_2": "/GPU:0", "pool": "/GPU:0", "flatten": "/GPU:0",
             "dense_1": "/GPU:1", "head": "/GPU:1"}, BATCH * 4 * 4 * 32 * 4),
    "transformer": ({"embed": "/GPU:0", "block_0": "/GPU:0", "block_1": "/GPU:1", "pool": "/GPU:1",
                     "head": "/GPU:1"}, BATCH * 8 * 32 * 4),
}


def _final_weights(out):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(out / "checkpoints" / "ckpt-20"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "_trainable_variables" in k}


@pytest.mark.parametrize("model", sorted(SPLITS))
def test_each_layers_backward_runs_where_the_layer_is_pinned(model, tmp_path):
    layers, boundary = SPLITS[model]
    common = dict(model=model, steps=20, checkpoint_every=20, batch_size=BATCH, learning_rate=0.05, jit_compile=False)
    split_metrics, placement, split_log = train(make_cfg("none", {"layers": layers}, **common), tmp_path / "split")
    # Activations cross forward, their gradients cross back: the boundary tensor each way. The
    # rest between the two GPUs is what a GPU machine moves too: the logits to the loss and its
    # gradient back (the loss has no device request: /GPU:0), and the optimizer's arithmetic
    # (unrequested, /GPU:0) taking /GPU:1's weight gradients and sending the updates back.
    matrix = placement["transfers"]["matrix"]
    gpu1_params = sum(v["bytes"] for v in placement["variables"] if v["devices"] == ["/GPU:1"])
    logits = BATCH * 10 * 4
    assert matrix["/GPU:0"]["/GPU:1"]["bytes"] == boundary + logits + gpu1_params
    assert matrix["/GPU:1"]["/GPU:0"]["bytes"] == boundary + logits + gpu1_params
    items = placement["transfers"]["largest"]
    assert any(i["from"] == "/GPU:0" and i["to"] == "/GPU:1" and i["bytes"] == boundary
               and not i["tensor"].startswith(("gradients/", "sgd/")) for i in items), items
    assert any(i["from"] == "/GPU:1" and i["to"] == "/GPU:0" and i["bytes"] == boundary
               and i["tensor"].startswith("gradients/") for i in items), items
    # Backward ops per device are those of the layers pinned there; every layer rule scores its
    # backward pass too, and all of it ran where the plan said.
    grads = placement["gradients"]["ops_by_device"]
    assert grads["/GPU:0"] > 0 and grads["/GPU:1"] > 0
    for name, device in layers.items():
        r = rule(placement, f"layers.{name}")
        assert r["score"] == 1.0 and r["forward"]["score"] == 1.0, r
        if r["backward"]["relevant"]:
            assert set(r["backward"]["observed"]) == {device}, r
    row = {r["layer"]: r for r in placement["layers"]}
    first = next(name for name in layers if row[name]["backward_ops"])  # the first layer with weights
    assert layers[first] == "/GPU:0" and set(row[first]["backward_ops"]) == {"/GPU:0"}
    last = row[list(layers)[-1]]
    assert set(last["backward_ops"]) == {"/GPU:1"} and last["bytes_out"] > 0
    # Same seed, no split: the same losses and final weights (float tolerance).
    plain_metrics, _, plain_log = train(make_cfg("none", **common), tmp_path / "plain")
    np.testing.assert_allclose([r["loss"] for r in split_log], [r["loss"] for r in plain_log], rtol=1e-5)
    a, b = _final_weights(tmp_path / "split"), _final_weights(tmp_path / "plain")
    assert a.keys() == b.keys() and a
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_layers_backward_default_keeps_the_gradient_calls_placement_and_scores_it(tmp_path):
    layers, _ = SPLITS["mlp"]
    _, placement, _ = train(make_cfg("none", {"layers": layers, "layers_backward": "default"}, steps=20,
                                     jit_compile=False), tmp_path)
    grads = placement["gradients"]["ops_by_device"]
    # tape.gradient has no device scope: its ops go where a GPU machine's placer puts them.
    assert set(grads) == {"/GPU:0"}, grads
    # dense_2 is pinned to /GPU:1 but its backward pass ran on /GPU:0: scored as violations.
    r = rule(placement, "layers.dense_2")
    assert r["forward"]["score"] == 1.0 and r["backward"]["score"] == 0.0
    assert r["score"] < 1.0
    assert rule(placement, "layers.dense_1")["backward"]["score"] == 1.0  # pinned where it ran
    # No activation gradient crosses back from /GPU:1: the whole backward pass is on /GPU:0, so
    # only forward values (activations, logits) leave /GPU:1.
    back = [i for i in placement["transfers"]["largest"] if i["from"] == "/GPU:1" and i["bytes"]]
    assert back and not any(i["tensor"].startswith("gradient") for i in back), back


def test_pinning_gradients_overrides_following_the_layers(tmp_path):
    layers, _ = SPLITS["mlp"]
    _, placement, _ = train(make_cfg("none", {"layers": layers, "gradients": "/GPU:1"}, steps=20,
                                     jit_compile=False), tmp_path)
    grads = placement["gradients"]["ops_by_device"]
    assert grads.get("/GPU:1", 0) > 0 and grads.get("/GPU:0", 0) == 0, grads
