"""train.pinning.layers keys as names, nested paths, globs and `re:` patterns: the pure matching
(pinpoint.layer_keys), and keras.applications.MobileNetV2 split at a block boundary over two
emulated GPUs by three pattern keys."""

from __future__ import annotations

import math
import re

import pytest

from pinpoint.errors import ConfigError
from pinpoint.layer_keys import key_matches, resolve, scope_regex
from tests.test_replica_consistency import train_user_model

PATHS = ["Conv1", "block_1_expand", "block_1_expand_BN", "block_8_add", "block_10_expand",
         "backbone", "backbone/block_3", "backbone/block_3/conv", "backbone/block_4", "head"]


@pytest.mark.unit
@pytest.mark.parametrize(("key", "selected"), [
    ("head", ["head"]),
    ("block_3", ["backbone/block_3"]),
    ("backbone/block_3", ["backbone/block_3", "backbone/block_3/conv"]),
    ("block_[1-8]_*", ["block_1_expand", "block_1_expand_BN", "block_8_add"]),
    ("re:block_1\\d_.*", ["block_10_expand"]),
    ("re:backbone/block_\\d", ["backbone/block_3", "backbone/block_4"]),
])
def test_a_key_selects_layers_by_name_path_glob_or_regex(key, selected):
    assert [p for p in PATHS if key_matches(key, p)] == selected


@pytest.mark.unit
def test_a_layer_selected_by_two_keys_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"^train\.pinning\.layers: got 're:block_1_.*' and 'block_\[1-8\]_\*', "
                                          r"which both match layer 'block_1_expand'; make the keys select disjoint"):
        resolve({"block_[1-8]_*": "/GPU:0", "re:block_1_.*": "/GPU:1"}, PATHS, "m")


@pytest.mark.unit
def test_a_key_that_selects_nothing_is_refused_with_the_closest_names():
    with pytest.raises(ConfigError, match=r"^train\.pinning\.layers\.block_1_expnd: got 'block_1_expnd', which "
                                          r"matches no layer of model 'm'; .*\(closest: block_1_expand, "):
        resolve({"block_1_expnd": "/GPU:0"}, PATHS, "m")


@pytest.mark.unit
def test_a_glob_stays_inside_one_name_scope():
    rx = re.compile(rf"(^|/)(?:{scope_regex('block_[1-8]_*')})(_\d+)?/")
    assert rx.search("model/block_8_add_1/add") and not rx.search("model/block_10_expand/Conv2D")
    assert not rx.search("model/block_1x/y")


SPLIT = {
    "block_[6-9]_*": "/GPU:1",
    "re:block_1[0-6]_.*": "/GPU:1",
    "re:Conv_1|Conv_1_bn|out_relu|global_average_pooling2d.*|predictions": "/GPU:1",
}
BATCH = 8


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_mobilenetv2_split_at_a_block_boundary_by_patterns(tmp_path):
    """Blocks 1-5 on /GPU:0 (unpinned: a GPU machine's default), blocks 6-16 and the classifier on
    /GPU:1. block_6 has no residual input, so the boundary is one tensor: block_5_add's output
    crosses forward once per step and its gradient crosses back once, each batch x 4 x 4 x 16
    float32 (alpha 0.35 at 32x32)."""
    import keras

    p = train_user_model(tmp_path, "mobilenet", strategy="none", train={
        "pinning": {"input": "/CPU:0", "layers": SPLIT}, "jit_compile": False, "batch_size": BATCH})
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=4)
    names = [layer.name for layer in model.layers if layer.name != model.layers[0].name]
    matched = {key: [n for n in names if key_matches(key, n)] for key in SPLIT}
    on_gpu1 = {n for ns in matched.values() for n in ns}
    assert on_gpu1 == {n for n in names if names.index(n) >= names.index("block_6_expand")}

    # one conformance rule per key, with the number of layers it matched; forward and backward obeyed
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    for key, layers in matched.items():
        rule = rules[f"layers.{key}"]
        assert rule["layers_matched"] == len(layers)
        assert rule["score"] == 1.0 and rule["forward"]["observed"] == {"/GPU:1": rule["forward"]["relevant"]}
        assert rule["forward"]["relevant"] > 0
    rows = {r["layer"]: r for r in p["layers"]}
    assert {k: sorted(r["matched"]) for k, r in rows.items()} == {k: sorted(v) for k, v in matched.items()}
    # every matched layer's variables on /GPU:1, every other layer's on /GPU:0
    for v in p["variables"]:
        layer = v["name"].split("/")[0]
        if layer in names:
            assert v["devices"] == (["/GPU:1"] if layer in on_gpu1 else ["/GPU:0"]), v["name"]

    boundary = BATCH * math.prod(model.get_layer("block_5_add").output.shape[1:]) * 4
    assert boundary == BATCH * 4 * 4 * 16 * 4
    items = [t for t in p["transfer_items"] if t["bytes"] and not t["tensor"].startswith("sgd/")]
    gpu1_scope = re.compile(rf"(^|/)(?:{'|'.join(sorted(on_gpu1, key=len, reverse=True))})(_\d+)?/")
    forward = [t for t in items if (t["from"], t["to"]) == ("/GPU:0", "/GPU:1") and not t["tensor"].startswith("gradients/")]
    assert [(t["tensor"].split("/")[1], t["bytes"]) for t in forward] == [("block_5_add_1", boundary)]
    back = [t for t in items if (t["from"], t["to"]) == ("/GPU:1", "/GPU:0") and t["tensor"].startswith("gradients/")
            and any(not gpu1_scope.search(c) and not c.startswith("sgd/") for c in t["consumers"])]
    assert [(t["tensor"].split("/")[3], t["bytes"]) for t in back] == [("block_6_expand_1", boundary)]
