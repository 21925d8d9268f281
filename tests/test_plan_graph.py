"""The planner's input: a run folder's training step as a PlanGraph (pinpoint.plan.build), from the
op rows the capture records as a graph (pinpoint.placement.analysis.opgraph).

Unit: a hand-written placement.json and op file give exact groups, edges, order, allowed devices
and colocation; the one-line errors. Integration: a real run of Pinpoint's trainer (an MLP whose
layers are pinned over 2 emulated GPUs, timed) gives the model's layers as groups, the activations
crossing between them as edges of exactly batch x units x 4 bytes, each group where it was pinned."""

from __future__ import annotations

import gzip
import json

import pytest

from pinpoint.errors import ConfigError
from pinpoint.placement.analysis.opgraph import LayerMatcher, colocated_layers
from pinpoint.placement.model.files import ops_path, write_placement
from pinpoint.placement.model.placement import Placement
from pinpoint.plan.build import plan_graph
from pinpoint.plan.graph import Edge

CPU_GPU = ["CPU", "GPU"]


def _row(op, type_, device, inputs=(), layer=None, requested="", colocation=(), kernels=CPU_GPU, us=None):
    row = {"op": op, "type": type_, "device": device, "inputs": [list(i) for i in inputs], "requested": requested,
           "colocation": list(colocation), "layer": layer, "kernel_devices": kernels}
    if us is not None:
        row["us"] = us
    return row


# A two-layer step: the input pipeline on the host, layer enc on /GPU:0, layer dec on /GPU:1, the
# loss and its gradient ("other") beside dec; backward ops carry their layer.
ROWS = [
    _row("IteratorGetNext", "IteratorGetNext", "/CPU:0", requested="/CPU:0", kernels=["CPU"], us=5.0),
    _row("m/enc/ReadVariableOp", "ReadVariableOp", "/GPU:0", layer="enc", us=1.0),
    _row("m/enc/MatMul", "MatMul", "/GPU:0", [("IteratorGetNext", 2048), ("m/enc/ReadVariableOp", 1024)],
         layer="enc", us=10.0),
    _row("m/dec/MatMul", "MatMul", "/GPU:1", [("m/enc/MatMul", 4096)], layer="dec", requested="/GPU:1", us=20.0),
    # The same tensor to a second op of dec: the runtime sends it once, the edge counts it once.
    _row("m/dec/Shape", "Shape", "/GPU:1", [("m/enc/MatMul", 4096)], layer="dec", kernels=None, us=0.5),
    _row("loss/Sum", "Sum", "/GPU:1", [("m/dec/MatMul", 512), ("IteratorGetNext:1", 128)], us=3.0),
    _row("Const", "Const", "/GPU:1", us=0.0),  # no work: left out of groups and edges
    _row("gradients/loss/Sum_grad/Tile", "Tile", "/GPU:1", [("loss/Sum", 4), ("Const", 8)],
         colocation=["m/dec/MatMul"], kernels=["CPU"], us=2.0),
    _row("gradients/m/dec/MatMul_grad/MatMul", "MatMul", "/GPU:1", [("gradients/loss/Sum_grad/Tile", 512)],
         layer="dec", us=15.0),
    _row("gradients/m/enc/MatMul_grad/MatMul", "MatMul", "/GPU:0",
         [("gradients/m/dec/MatMul_grad/MatMul", 4096), ("IteratorGetNext", 2048)], layer="enc", us=12.0),
]
VARIABLES = [{"name": "enc/kernel", "bytes": 1024}, {"name": "dec/kernel", "bytes": 2048},
             {"name": "sgd/iteration", "bytes": 8}]


def _write_run(run, rows=ROWS, log_times=(10.0, 0.002, 0.004, 0.003)):
    run.mkdir(parents=True, exist_ok=True)
    write_placement(run / "placement.json", {
        "schema": 2, "task": "chief:0", "strategy": "none", "devices": ["/CPU:0", "/GPU:0", "/GPU:1"],
        "device_aliases": {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}, "device_map": {"host": "/CPU:0"},
        "variables": VARIABLES, "layer_pins": {"enc": "/GPU:0"}, "ops": rows})
    if log_times:
        (run / "train_log.jsonl").write_text("".join(
            json.dumps({"step": 1 + 10 * i, "step_time": t}) + "\n" for i, t in enumerate(log_times)))
    return run


@pytest.mark.unit
def test_groups_edges_order_and_constraints_from_a_hand_written_run(tmp_path):
    g = plan_graph(_write_run(tmp_path / "run"))
    assert [x.key for x in g.groups] == ["input", "enc", "dec", "other"]
    assert [x.order for x in g.groups] == [0, 1, 2, 3]
    assert g.edges == (Edge("dec", "enc", 4096), Edge("dec", "other", 512), Edge("enc", "dec", 4096),
                       Edge("input", "enc", 2048), Edge("input", "other", 128), Edge("other", "dec", 512))
    inp, enc, dec, other = (g.group(k) for k in ("input", "enc", "dec", "other"))
    assert (inp.ops, inp.compute_us, inp.device, inp.requested, inp.allowed, inp.movable) == (
        1, 5.0, "/CPU:0", "/CPU:0", frozenset({"CPU"}), False)
    # enc's pin comes from layer_pins; dec's from its ops' one requested device; other has none.
    assert (enc.ops, enc.compute_us, enc.device, enc.requested, enc.variable_bytes) == (3, 23.0, "/GPU:0", "/GPU:0", 1024)
    assert (dec.ops, dec.compute_us, dec.device, dec.requested, dec.variable_bytes) == (3, 35.5, "/GPU:1", "/GPU:1", 2048)
    # An op of unknown kernels (Shape: None) does not narrow dec; other's host-only Tile pins it.
    assert (enc.allowed, dec.allowed, enc.movable, dec.movable) == (frozenset(CPU_GPU), frozenset(CPU_GPU), True, True)
    assert (other.ops, other.compute_us, other.requested, other.allowed, other.movable, other.variable_bytes) == (
        2, 5.0, None, frozenset({"CPU"}), False, 8)
    assert g.colocated == (frozenset({"dec", "other"}),)
    assert (g.devices, g.host, g.strategy, g.timed) == (("/CPU:0", "/GPU:0", "/GPU:1"), "/CPU:0", "none", True)
    assert g.measured_step_us == 3000.0  # the median of the logged steps after the first (tracing) one


@pytest.mark.unit
def test_an_untimed_run_has_no_compute_and_takes_its_step_time_from_metrics(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "us"} for r in ROWS]
    run = _write_run(tmp_path / "run", rows, log_times=())
    (run / "metrics.json").write_text(json.dumps({"examples_per_sec": 16000.0, "global_batch": 32}))
    g = plan_graph(run)
    assert g.timed is False and {x.compute_us for x in g.groups} == {0.0}
    assert g.measured_step_us == 2000.0


@pytest.mark.unit
def test_a_folder_without_placement_is_one_line_naming_run_dir(tmp_path):
    with pytest.raises(ConfigError) as err:
        plan_graph(tmp_path)
    assert str(err.value) == (f"run_dir: got '{tmp_path}', which has no placement.json; plan from the folder of a "
                              "run trained with placement.enabled: true (the default)")


@pytest.mark.unit
def test_a_placement_of_an_older_pinpoint_says_to_re_run(tmp_path):
    old = [{"op": r["op"], "type": r["type"], "device": r["device"]} for r in ROWS]
    run = _write_run(tmp_path / "run", old)
    with pytest.raises(ConfigError) as err:
        plan_graph(run)
    assert str(err.value) == (f"run_dir: got '{run}', whose placement was captured by an older Pinpoint (its op "
                              "rows have no inputs); re-run with placement.enabled (this version records the graph)")
    assert "\n" not in str(err.value)


@pytest.mark.unit
def test_a_placement_without_op_rows_says_where_they_are(tmp_path):
    run = _write_run(tmp_path / "run", [])
    with pytest.raises(ConfigError, match=r"^run_dir: got '.*run', whose placement.json holds no op of a captured "
                                          r"step .*; plan from a run folder whose placement captured a step$"):
        plan_graph(run)


@pytest.mark.unit
def test_ops_belong_to_the_deepest_layer_exact_names_before_uniquified_ones():
    from pinpoint.layer_keys import resolve_pins

    pins = resolve_pins({"backbone/block_1": "/GPU:1", "dense_*": "/GPU:0"},
                        ["backbone", "backbone/block_1", "backbone/block_1/conv", "backbone/block_2",
                         "dense", "dense_1", "head"], "m")
    match = LayerMatcher(["backbone/block_1", "backbone/block_2", "head"], pins)
    # Keras' uniquified scopes ("dense_1_1" is layer dense_1, "head_1" is head); a pattern key
    # groups the layers it selects; backward ops belong to their layer.
    assert match("m_1/dense_1_1/MatMul") == "dense_*"
    assert match("gradient_tape/m_1/head_1/MatMul_grad/MatMul") == "head"
    assert match("m_1/backbone_1/block_1/conv/Conv2D") == "backbone/block_1"
    assert match("m_1/backbone_1/block_2_1/Add") == "backbone/block_2"
    assert match("loss/Sum") is None
    assert match("head") is None  # an op named like a layer, outside its scope



@pytest.mark.unit
def test_an_op_colocated_with_a_rewritten_op_takes_the_layer_its_name_says():
    """A gradient sum colocated with a residual block's Add that grappler rewrote away (no row of
    that name ran) belongs to the Add's layer, not to the step's rest; one colocated with an op
    that ran takes that op's layer, and one colocated with nothing of a layer stays outside."""
    match = LayerMatcher(["block_1_expand", "block_1_add"], None)
    rows = [_row("m_1/block_1_expand_1/Conv2D", "Conv2D", "/GPU:1", layer="block_1_expand"),
            _row("m_1/block_1_add_1/ArithmeticOptimizer/AddOpsRewrite_Leaf_1_Add", "AddN", "/GPU:0",
                 layer="block_1_add"),
            _row("gradients/AddN_61", "AddN", "/GPU:0", colocation=["m_1/block_1_add_1/Add"]),
            _row("gradients/AddN_62", "AddN", "/GPU:1", colocation=["m_1/block_1_expand_1/Conv2D"]),
            _row("gradients/loss_grad/mul", "Mul", "/GPU:0", colocation=["loss/SparseSoftmaxCrossEntropyWithLogits"])]
    colocated_layers(rows, match)
    assert [r["layer"] for r in rows[2:]] == ["block_1_add", "block_1_expand", None]

# ---- a real run -----------------------------------------------------------------------------------
LAYERS = {"dense_1": "/GPU:0", "dense_2": "/GPU:1", "head": "/GPU:1"}
BATCH = 32


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory, tf):
    from pinpoint.training.command import train_command
    from tests.conftest import NO_TRACKING, make_config

    cfg = make_config(
        "plan", cluster={"devices_per_worker": 2, "emulate": True},
        train={"strategy": "none", "model": "mlp", "steps": 8, "batch_size": BATCH, "learning_rate": 0.05,
               "log_every": 2, "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": LAYERS}},
        tracking=NO_TRACKING, placement={"warmup_steps": 2, "sample_steps": 2, "timing": True})
    out = tmp_path_factory.mktemp("mlp")
    assert train_command(cfg, out) == 0
    return out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_pinned_mlp_run_is_its_layers_with_exact_activation_edges(mlp_run):
    from pinpoint.placement.model.files import read_placement
    from pinpoint.training.loop.models import build_model, layer_names

    g = plan_graph(mlp_run)
    placement = read_placement(mlp_run)
    layers = layer_names("mlp")
    assert [x.key for x in g.groups if x.key in layers] == layers  # forward order
    assert {x.key for x in g.groups} == {*layers, "input", "other"}
    # Each layer's width from the model's definition: its activation crosses to the next layer
    # forward (and its gradient back), batch x units x float32, exactly.
    units = {layer.name: layer.units for layer in build_model("mlp", (8,), 10).stack}
    edges = {(e.src, e.dst): e.bytes for e in g.edges}
    for a, b in zip(layers, layers[1:], strict=False):
        assert edges[(a, b)] == BATCH * units[a] * 4, (a, b, edges)
        assert edges[(b, a)] == BATCH * units[a] * 4, (b, a, edges)
    own = {layer: sum(v["bytes"] for v in placement["variables"] if v["name"].startswith(layer + "/"))
           for layer in layers}
    for layer in layers:
        grp = g.group(layer)
        assert (grp.device, grp.requested, grp.variable_bytes) == (LAYERS[layer], LAYERS[layer], own[layer])
        assert grp.compute_us > 0 and grp.allowed == frozenset(CPU_GPU) and grp.movable
    assert g.timed and g.measured_step_us > 0
    assert g.group("input").movable is False and g.host == "/CPU:0"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_op_rows_name_real_producers_across_devices_and_the_report_does_not_change(mlp_run):
    from pinpoint.placement.model.files import read_placement
    from pinpoint.placement.report.html import render_html

    placement = read_placement(mlp_run)
    rows = {r["op"]: r for r in placement["ops"]}
    # dense_2's forward op (on /GPU:1) takes dense_1's output (on /GPU:0): the producer, not a _Recv.
    (consumer,) = [r for r in rows.values() if r["layer"] == "dense_2" and r["device"] == "/GPU:1"
                   and any(rows[t.partition(":")[0]]["layer"] == "dense_1" for t, _ in r["inputs"])
                   and not r["op"].startswith("gradients/")]
    (edge,) = [(t, b) for t, b in consumer["inputs"] if rows[t.partition(":")[0]]["layer"] == "dense_1"]
    assert rows[edge[0]]["device"] == "/GPU:0" and rows[edge[0]]["type"] not in ("_Recv", "_HostRecv")
    assert consumer["requested"] == "/GPU:1" and consumer["kernel_devices"] == CPU_GPU
    assert all(r["us"] >= 0 for r in rows.values()) and consumer["us"] > 0
    assert not any(r["type"] in ("_Send", "_Recv") for r in rows.values())
    # Gradients are colocated with their forward op (TensorFlow's colocate_gradients_with_ops),
    # named as one step's op.
    assert any(c in rows and rows[c]["layer"] == r["layer"] for r in rows.values() for c in r["colocation"])
    # The report reads the rows it always read: the same HTML with or without the new fields.
    old = dict(placement, ops=[{k: r[k] for k in ("op", "type", "device")} for r in placement["ops"]])
    assert render_html(placement, None, {}, "t") == render_html(old, None, {}, "t")
    with gzip.open(ops_path(mlp_run / "placement.json"), "rb") as f:
        assert "inputs" in json.loads(f.read())["ops"][0]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_plain_capture_records_the_real_producer_its_bytes_and_the_request(tf):
    """One tf.function call split over two emulated GPUs (no training loop): the second layer's
    MatMul reads the first layer's Relu from the other device, batch x width x float32 bytes."""
    from types import SimpleNamespace

    from pinpoint.config import PinningConfig
    from pinpoint.placement.analysis.build import build_placement
    from pinpoint.placement.capture.graphs import capture_call

    batch, width = 10, 24
    with tf.device("/CPU:1"):
        w1 = tf.Variable(tf.ones([8, width]), name="first/w")
    with tf.device("/CPU:2"):
        w2 = tf.Variable(tf.ones([width, 3]), name="second/w")

    @tf.function
    def step(x):
        with tf.device("/CPU:1"), tf.name_scope("first"):
            h = tf.nn.relu(tf.matmul(x, w1))
        with tf.device("/CPU:2"), tf.name_scope("second"):
            return tf.reduce_sum(tf.matmul(h, w2))

    _, cap = capture_call(step, tf.ones([batch, 8]))
    dm = SimpleNamespace(aliases={"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}, replica_devices=["/CPU:1", "/CPU:2"],
                         host="/CPU:0")
    p = build_placement([cap], variables=[w1, w2], plan=PinningConfig(), strategy="none", device_map=dm,
                        layer_units=("first", "second"))
    rows = {r["op"]: r for r in p["ops"]}
    mm = rows["second/MatMul"]
    assert (mm["device"], mm["requested"], mm["layer"], mm["kernel_devices"]) == ("/GPU:1", "/GPU:1", "second", CPU_GPU)
    assert ["first/Relu", batch * width * 4] in mm["inputs"]
    assert rows["first/Relu"]["device"] == "/GPU:0" and rows["first/Relu"]["layer"] == "first"
    assert not any("us" in r for r in rows.values())  # not timed: no `us`


@pytest.mark.integration
def test_the_pieces_a_plan_moves_are_the_layers_and_a_nested_models_layers(tf):
    import keras

    from pinpoint.training.loop.models import build_model, layer_units

    i = keras.Input((4,))
    inner = keras.Model(i, keras.layers.Dense(3, name="b")(keras.layers.Dense(3, name="a")(i)), name="backbone")
    outer = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2, name="head")], name="outer")
    assert layer_units(outer) == ("backbone/a", "backbone/b", "head")
    # A layer with sublayers of its own (the transformer's attention blocks) is one piece.
    assert layer_units(build_model("transformer", (64,), 10)) == ("embed", "block_0", "block_1", "pool", "head")


@pytest.mark.integration
def test_a_traced_programs_pieces_are_its_models_layers_and_its_bare_layers(tf):
    """Every layer a traced program created, in any order: a model's layers (held by it) count
    once, through the model; a bare layer of a custom loop is its own piece; a block's sublayers
    are the block's."""
    import keras

    from pinpoint.placement.analysis.units import program_units
    from pinpoint.tfcompat.api import child_layers
    from pinpoint.training.loop.models import build_model

    i = keras.Input((4,))
    a, b = keras.layers.Dense(3, name="a"), keras.layers.Dense(3, name="b")
    inner = keras.Model(i, b(a(i)), name="backbone")
    head = keras.layers.Dense(2, name="head")
    outer = keras.Sequential([keras.Input((4,)), inner, head], name="outer")
    bare = keras.layers.Dense(5, name="bare")
    blocks = build_model("transformer", (64,), 10)
    assert program_units([bare, head, a, outer, b, inner]) == ("bare", "backbone/a", "backbone/b", "head")
    block = blocks.get_layer("block_0")
    assert child_layers(block)  # the attention block holds layers of its own: they are its piece
    assert program_units([*child_layers(block), *blocks.layers, blocks]) == (
        "embed", "block_0", "block_1", "pool", "head")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_transformers_gradient_sums_and_grappler_kernels_stay_with_their_layer(tmp_path, tf):
    """The transformer's blocks: the gradient sums outside the layers' scopes ("gradients/AddN_3",
    colocated with a block's forward op) belong to that block, so no colocation spans groups; a
    node grappler made for the CPU (_UnaryOpsComposition) does not make a block host-only."""
    from pinpoint.training.command import train_command
    from pinpoint.training.loop.models import layer_names
    from tests.conftest import NO_TRACKING, make_config

    layers = {"embed": "/GPU:0", "block_0": "/GPU:0", "block_1": "/GPU:1", "pool": "/GPU:1", "head": "/GPU:1"}
    cfg = make_config(
        "plan", cluster={"devices_per_worker": 2, "emulate": True},
        train={"strategy": "none", "model": "transformer", "steps": 4, "batch_size": BATCH, "log_every": 2,
               "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": layers}},
        tracking=NO_TRACKING, placement={"warmup_steps": 2, "sample_steps": 1})
    assert train_command(cfg, tmp_path) == 0
    g = plan_graph(tmp_path)
    assert [x.key for x in g.groups if x.key in layers] == layer_names("transformer")
    assert g.colocated == ()
    for key in layers:
        assert (g.group(key).allowed, g.group(key).movable, g.group(key).device) == (frozenset(CPU_GPU), True, layers[key])
    assert g.timed is False and g.group("block_0").compute_us == 0.0


@pytest.mark.unit
def test_a_step_argument_fed_on_the_host_is_sent_from_the_input_group(tmp_path):
    """The trainer's step counter is an argument of the step function on the host: the op rows
    record it as `args`, and the 8 bytes it sends to the loop's device count as input's output
    (an argument on another device, a variable's handle, is not a tensor a plan moves)."""
    rows = [*ROWS, _row("loop/add", "AddV2", "/GPU:1", us=0.5),
            _row("m/enc/Read", "ReadVariableOp", "/GPU:0", layer="enc", us=0.5)]
    rows[-2]["args"] = [["start", 8, "/CPU:0"]]
    rows[-1]["args"] = [["enc_kernel_handle", 0, "/GPU:0"]]
    g = plan_graph(_write_run(tmp_path / "run", rows))
    edges = {(e.src, e.dst): e.bytes for e in g.edges}
    base = {(e.src, e.dst): e.bytes for e in plan_graph(_write_run(tmp_path / "base")).edges}
    assert edges == {**base, ("input", "other"): base[("input", "other")] + 8}


@pytest.mark.unit
def test_a_step_argument_living_on_a_device_is_sent_from_there_wherever_its_readers_go(tmp_path):
    """A traced program's captured tensor made on /GPU:0 (its batch) is an argument of the step
    living there: a group of its own that stays on /GPU:0, so a reader moved to /GPU:1 receives
    it from /GPU:0 and one moved onto /GPU:0 does not."""
    from pinpoint.plan.predict import bytes_crossing

    rows = [*ROWS, _row("m/dec/Scale", "Mul", "/GPU:1", layer="dec", us=0.5)]
    rows[-1]["args"] = [["x", 4096, "/GPU:0"]]
    g = plan_graph(_write_run(tmp_path / "run", rows))
    held = g.group("arguments on /GPU:0")
    assert (held.device, held.movable, held.compute_us, held.ops) == ("/GPU:0", False, 0.0, 0)
    assert {(e.src, e.dst): e.bytes for e in g.edges if e.src == held.key} == {(held.key, "dec"): 4096}
    base = plan_graph(_write_run(tmp_path / "base"))
    ran = {x.key: x.device for x in g.groups}
    moved = {**ran, "dec": "/GPU:0"}
    assert bytes_crossing(g, ran) == {**bytes_crossing(base, ran),
                                      ("/GPU:0", "/GPU:1"): bytes_crossing(base, ran)[("/GPU:0", "/GPU:1")] + 4096}
    assert bytes_crossing(g, moved) == bytes_crossing(base, moved)


@pytest.mark.unit
def test_a_tensor_two_groups_read_on_one_device_crosses_once():
    """enc's activation read by dec and by the loss, both on /GPU:1: two edges for the search, one
    _Send/_Recv pair for the runtime, so the predicted bytes count it once per receiving device."""
    from pinpoint.plan.build import build
    from pinpoint.plan.predict import bytes_crossing

    rows = [*ROWS, _row("loss/Mean", "Mean", "/GPU:1", [("m/enc/MatMul", 4096)], us=1.0)]
    g = build(Placement.from_json({"strategy": "none", "devices": ["/CPU:0", "/GPU:0", "/GPU:1"],
                                   "device_map": {"host": "/CPU:0"}, "variables": VARIABLES, "ops": rows}))
    edges = {(e.src, e.dst): e.bytes for e in g.edges}
    assert (edges[("enc", "dec")], edges[("enc", "other")]) == (4096, 4096)
    ran = {x.key: x.device for x in g.groups}
    assert bytes_crossing(g, ran)[("/GPU:0", "/GPU:1")] == 4096
    # other on the host: the activation now goes to two devices, once each.
    crossing = bytes_crossing(g, {**ran, "other": "/CPU:0"})
    assert (crossing[("/GPU:0", "/GPU:1")], crossing[("/GPU:0", "/CPU:0")]) == (4096, 4096)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_an_emulated_timed_run_gives_the_emulated_host_its_time_per_transfer(mlp_run):
    """The emulated host model's constant from the run's own placement.json: its profiled
    _Send/_Recv time per step over the tensors its transfers matrix counts per step."""
    from pinpoint.placement.model.files import read_placement

    placement = read_placement(mlp_run)
    sent_ms = sum(d["transfer_ms"] for d in placement["timing"]["devices"].values())
    count = sum(c["count"] for row in placement["transfers"]["matrix"].values() for c in row.values())
    g = plan_graph(mlp_run)
    assert (g.emulated, g.us_per_transfer) == (True, round(sent_ms * 1e3 / count, 3))


@pytest.mark.unit
def test_a_residual_gradient_is_summed_per_device_then_beside_the_op_that_made_it():
    """The stem's output is read by conv and (through the Add, whose gradient is its output's) by
    head's gradient. The run summed both on one device (one AddN colocated with conv); under
    another placement TensorFlow sums per device of the contributions, then beside the stem: each
    other device's part crosses to the stem's device, not to where the run summed them."""
    from pinpoint.plan.build import build
    from pinpoint.plan.predict import bytes_crossing

    rows = [
        _row("m/stem/Conv2D", "Conv2D", "/GPU:0", layer="stem"),
        _row("m/conv/Conv2D", "Conv2D", "/GPU:0", [("m/stem/Conv2D", 400)], layer="conv"),
        _row("m/add/Add", "AddV2", "/GPU:0", [("m/stem/Conv2D", 400), ("m/conv/Conv2D", 400)], layer="add"),
        _row("m/head/MatMul", "MatMul", "/GPU:0", [("m/add/Add", 400)], layer="head"),
        _row("gradients/m/head/MatMul_grad/MatMul", "MatMul", "/GPU:0", layer="head", colocation=["m/head/MatMul"]),
        _row("gradients/m/conv/Conv2D_grad/Conv2DBackpropInput", "Conv2DBackpropInput", "/GPU:0",
             [("gradients/m/head/MatMul_grad/MatMul", 400)], layer="conv", colocation=["m/conv/Conv2D"]),
        _row("gradients/AddN", "AddN", "/GPU:0", [("gradients/m/conv/Conv2D_grad/Conv2DBackpropInput", 400),
                                                 ("gradients/m/head/MatMul_grad/MatMul", 400)],
             layer="conv", colocation=["m/conv/Conv2D"]),
        _row("gradients/m/stem/Conv2D_grad/Conv2DBackpropFilter", "Conv2DBackpropFilter", "/GPU:0",
             [("gradients/AddN", 400)], layer="stem", colocation=["m/stem/Conv2D"]),
    ]
    g = build(Placement.from_json({"strategy": "none", "devices": ["/CPU:0", "/GPU:0", "/GPU:1", "/GPU:2"],
                                   "device_map": {"host": "/CPU:0"}, "ops": rows}))
    assert [(s.home, len(s.contributions), s.readers) for s in g.sums] == [("stem", 2, frozenset({"stem"}))]
    at = {"stem": "/GPU:0", "conv": "/GPU:1", "add": "/GPU:0", "head": "/GPU:2", "other": "/GPU:0"}
    assert {k: v for k, v in bytes_crossing(g, at).items() if v} == {
        ("/GPU:0", "/GPU:1"): 400,  # the stem's output to conv
        ("/GPU:1", "/GPU:0"): 400 + 400,  # conv's output to the Add; conv's contribution to the sum
        ("/GPU:0", "/GPU:2"): 400,  # the Add's output to head
        ("/GPU:2", "/GPU:1"): 400,  # head's gradient to conv's backward op
        ("/GPU:2", "/GPU:0"): 400,  # head's contribution to the sum
    }
    # Both contributions on one device: summed there, the sum crosses once to the stem's backward op.
    both = {**at, "head": "/GPU:1"}
    assert {k: v for k, v in bytes_crossing(g, both).items() if v} == {
        ("/GPU:0", "/GPU:1"): 400 + 400,  # the stem's output to conv; the Add's output to head
        ("/GPU:1", "/GPU:0"): 400 + 400,  # conv's output to the Add; the sum to the stem
    }
