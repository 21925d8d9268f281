"""Placement analysis on real TensorFlow runs (logical CPU devices), cases whose answer follows
from TensorFlow's semantics. Each case traces a fresh tf.function and captures its first call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pinpoint.config import PinningConfig

# `tf` (conftest.py): TensorFlow in this process with the host and two emulated GPUs.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Spec GPUs emulated on logical CPUs, as pinpoint.devices does: /GPU:i -> /CPU:{i+1}.
ALIASES = {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}


def _dm(replicas=("/CPU:1", "/CPU:2"), aliases=ALIASES):
    return SimpleNamespace(aliases=dict(aliases), replica_devices=list(replicas), host="/CPU:0")


def _capture(fn, *args, step=5):
    from pinpoint.placement.capture.graphs import capture_call

    return capture_call(fn, *args, step=step)


def _build(caps, variables, plan=None, strategy="none", dm=None, **kw):
    from pinpoint.placement.analysis.build import build_placement

    return build_placement(
        caps, variables=variables, plan=plan or PinningConfig(), strategy=strategy, device_map=dm or _dm(), **kw
    )


def test_pinned_variables_and_gradients(tf):
    """Variables on A (/GPU:0), gradients on B (/GPU:1): every update runs on A and one parameter
    set of bytes crosses B -> A per step (gradients), one crosses A -> B (parameter reads)."""
    with tf.device("/CPU:1"):
        w = tf.Variable(tf.random.normal([32, 16]), name="w")
        b = tf.Variable(tf.zeros([16]), name="b")
    x = tf.random.normal([64, 32])
    param_bytes = (32 * 16 + 16) * 4

    @tf.function
    def step(x):
        with tf.device("/CPU:2"):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b))
            with tf.name_scope("gradients"):
                gw, gb = tape.gradient(loss, [w, b])
                uw, ub = 0.1 * gw, 0.1 * gb
        w.assign_sub(uw)
        b.assign_sub(ub)
        return loss

    caps = []
    for s in (5, 6):  # two sampled steps, each a fresh trace
        _, cap = _capture(tf.function(step.python_function), x, step=s)
        caps.append(cap)
    p = _build(caps, [w, b], plan=PinningConfig(variables="/GPU:0", gradients="/GPU:1"))

    assert p["captured_steps"] == [5, 6]
    assert set(p["devices"]) >= {"/GPU:0", "/GPU:1"}
    assert p["physical_devices"]["/GPU:0"] == "/CPU:1"
    for v in p["variables"]:
        assert v["devices"] == ["/GPU:0"]
        assert v["update_devices"] == ["/GPU:0"], v
    assert p["variable_updates"]["variables_with_updates"] == 2
    assert p["variables"][0]["bytes"] == 32 * 16 * 4 and p["variables"][0]["shape"] == [32, 16]
    m = p["transfers"]["matrix"]
    assert m["/GPU:1"]["/GPU:0"]["bytes"] == param_bytes  # updates copied to the variables' device
    assert m["/GPU:0"]["/GPU:1"]["bytes"] == param_bytes  # parameters read by the forward pass
    per = p["transfers"]["per_step"]
    assert per["unsized"] == 0
    assert [st["count"] for st in p["transfers"]["steps"]] == [per["count"], per["count"]]
    assert param_bytes * 2 <= per["bytes"] <= param_bytes * 2 + 64 * 32 * 4 + 64  # + input x + loss
    assert p["gradients"]["ops_by_device"] and set(p["gradients"]["ops_by_device"]) == {"/GPU:1"}
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["variables"]["score"] == 1.0 and rules["gradients"]["score"] == 1.0
    assert p["conformance"]["score"] == 1.0
    assert p["fallbacks"] == []
    # headline metrics are MLflow-safe keys
    from pinpoint.placement.report.metrics import headline_metrics

    hm = headline_metrics(p)
    assert hm["placement.transfer_bytes_per_step"] == per["bytes"]
    assert hm["placement.ops.GPU_1"] > 0 and hm["placement.conformance"] == 1.0


def test_gradient_rule_violation_is_reported(tf):
    """The plan puts gradients on /GPU:0 but the code computes them on /GPU:1: score 0, violations."""
    with tf.device("/CPU:1"):
        w = tf.Variable(tf.ones([4, 4]), name="wv")

    @tf.function
    def step(x):
        with tf.device("/CPU:2"):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.matmul(x, w)))
            with tf.name_scope("gradients"):
                g = tape.gradient(loss, w)
        w.assign_sub(g)
        return loss

    _, cap = _capture(step, tf.random.normal([2, 4]))
    p = _build([cap], [w], plan=PinningConfig(gradients="/GPU:0"))
    (rule,) = p["conformance"]["rules"]
    assert rule["rule"] == "gradients" and rule["score"] == 0.0
    assert rule["violations_total"] == rule["relevant"] > 0
    assert all(v["placed"] == "/GPU:1" for v in rule["violations"])


def test_fallback_nonexistent_device_soft_placement(tf):
    """With soft placement, an op requested on a device that does not exist runs on the host."""
    x = tf.constant([1.0, 2.0])

    @tf.function
    def step(x):
        with tf.device("/GPU:0"):  # no physical GPU (emulation off here): falls back
            y = tf.strings.as_string(x * 2.0)
        with tf.device("/CPU:1"):
            z = x + 1.0  # honoured: not a fallback
        return y, z

    _, cap = _capture(step, x)
    p = _build([cap], [], dm=_dm(replicas=("/CPU:0",), aliases={}))
    fb = {f["op"]: f for f in p["fallbacks"]}
    assert "AsString" in fb, p["fallbacks"]
    assert fb["AsString"]["requested"] == "/GPU:0" and fb["AsString"]["placed"] == "/CPU:0"
    assert fb["AsString"]["reason"] == "requested device does not exist"
    assert fb["AsString"]["op_type"] == "AsString"
    assert all(f["requested"].startswith("/GPU") for f in p["fallbacks"])
    assert not any(f["op"] == "add" for f in p["fallbacks"])
    # emulation off, no GPU: the device setup redirects /GPU:0 to the host before tracing, so no
    # graph shows it; the device map's record of it is reported as a fallback too.
    dm = _dm(replicas=("/CPU:0",), aliases={})
    dm.fallbacks = {"/GPU:0": "/CPU:0"}
    p2 = _build([cap], [], dm=dm)
    setup = [f for f in p2["fallbacks"] if f["op"] == "(every op pinned to /GPU:0)"]
    assert setup and setup[0]["placed"] == "/CPU:0" and "does not exist" in setup[0]["reason"]


def test_model_split_moves_activations(tf):
    """Layer 'first' on /GPU:0 and 'second' on /GPU:1: the hidden activations cross 0 -> 1."""
    with tf.device("/CPU:1"):
        w1 = tf.Variable(tf.ones([8, 24]), name="w1")
    with tf.device("/CPU:2"):
        w2 = tf.Variable(tf.ones([24, 3]), name="w2")
    x = tf.ones([10, 8])

    @tf.function
    def step(x):
        with tf.device("/CPU:1"), tf.name_scope("first"):
            h = tf.nn.relu(tf.matmul(x, w1))
        with tf.device("/CPU:2"), tf.name_scope("second"):
            return tf.reduce_sum(tf.matmul(h, w2))

    _, cap = _capture(step, x)
    plan = PinningConfig(layers={"first": "/GPU:0", "second": "/GPU:0"})
    p = _build([cap], [w1, w2], plan=plan)
    act = [t for t in p["transfers"]["largest"] if t["from"] == "/GPU:0" and t["to"] == "/GPU:1"]
    assert any(t["bytes"] == 10 * 24 * 4 and t["tensor"].startswith("first/") for t in act), act
    # Exactly two tensors cross: the batch x [10, 8] from the host to layer 'first', and its
    # activations h [10, 24] to layer 'second' (float32: 4 bytes); counted once each.
    assert p["transfers"]["matrix"] == {"/CPU:0": {"/GPU:0": {"count": 1, "bytes": 10 * 8 * 4}},
                                        "/GPU:0": {"/GPU:1": {"count": 1, "bytes": 10 * 24 * 4}}}
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["layers.first"]["score"] == 1.0
    assert rules["layers.second"]["score"] == 0.0  # the plan said /GPU:0, it ran on /GPU:1
    assert {v["placed"] for v in rules["layers.second"]["violations"]} == {"/GPU:1"}
    assert p["conformance"]["score"] == 0.5


def test_layer_pins_resolved_when_the_model_is_built_reach_the_placement(tf):
    """A glob key is resolved once, when the model is built; the placement's layer_pins (spec
    names), its layers row and its layers.<key> rule come from that resolution."""
    from pinpoint.training.loop.models import build_model, layer_pins

    batch, hidden = 4, 64  # the mlp's dense_2 width: the activation head receives
    model = build_model("mlp", (8,), 3, {"dense_*": "/CPU:1", "head": "/CPU:2"})
    pins = layer_pins(model)
    assert pins.by_path() == {"dense_1": "/CPU:1", "dense_2": "/CPU:1", "head": "/CPU:2"}

    @tf.function
    def step(x):
        return model(x)

    _, cap = _capture(step, tf.ones([batch, 8]))
    plan = PinningConfig(layers={"dense_*": "/GPU:0", "head": "/GPU:1"})
    p = _build([cap], list(model.variables), plan=plan, layer_pins=pins)
    assert p["layer_pins"] == {"dense_1": "/GPU:0", "dense_2": "/GPU:0", "head": "/GPU:1"}
    rows = {r["layer"]: r for r in p["layers"]}
    assert (rows["dense_*"]["matched"], rows["dense_*"]["layers_matched"]) == (["dense_1", "dense_2"], 2)
    assert rows["head"]["bytes_in"] == batch * hidden * 4
    assert {r["rule"]: r["score"] for r in p["conformance"]["rules"]} == {"layers.dense_*": 1.0, "layers.head": 1.0}


def test_placement_json_reads_back_into_the_same_model(tf):
    """What the build writes, Placement.from_json reads without loss: every section, typed."""
    from pinpoint.placement.model.placement import Placement
    from pinpoint.training.loop.models import build_model, layer_pins

    model = build_model("mlp", (8,), 3, {"dense_*": "/CPU:1", "head": "/CPU:2"})

    @tf.function
    def step(x):
        return model(x)

    _, cap = _capture(step, tf.ones([4, 8]))
    p = _build([cap], list(model.variables), plan=PinningConfig(layers={"dense_*": "/GPU:0", "head": "/GPU:1"}),
               layer_pins=layer_pins(model))
    assert Placement.from_json(p).to_json() == p


def test_mirrored_components_and_no_drift(tf):
    """MirroredStrategy: one component per replica device, updates on each, no drift after
    synchronous steps; a deliberately perturbed component shows up as drift."""
    from pinpoint.placement.analysis.variables import replica_consistency

    strategy = tf.distribute.MirroredStrategy(["/CPU:1", "/CPU:2"])
    with strategy.scope():
        w = tf.Variable(tf.random.normal([6, 3], seed=1), name="mw")
        b = tf.Variable(tf.zeros([3]), name="mb")
    ds = tf.data.Dataset.from_tensors(tf.random.normal([8, 6], seed=2)).repeat()
    it = iter(strategy.experimental_distribute_dataset(ds))

    def replica_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b))
        with tf.name_scope("gradients"):
            grads = tape.gradient(loss, [w, b])
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce("mean", grads)
        w.assign_sub(0.1 * grads[0])
        b.assign_sub(0.1 * grads[1])
        return loss

    def train(it):
        return strategy.run(replica_step, (next(it),))

    _, cap = _capture(tf.function(train), it)
    fast = tf.function(train)
    for _ in range(3):
        fast(it)
    p = _build([cap], [w, b], strategy="mirrored")
    for v in p["variables"]:
        assert v["kind"] == "mirrored"
        assert [c["device"] for c in v["components"]] == ["/GPU:0", "/GPU:1"]
        assert [c["physical"] for c in v["components"]] == ["/CPU:1", "/CPU:2"]
        assert v["update_devices"] == ["/GPU:0", "/GPU:1"]
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["strategy.variables_mirrored"]["score"] == 1.0
    assert rules["strategy.replica_0_compute"]["score"] == 1.0
    assert rules["strategy.replica_1_compute"]["score"] == 1.0
    assert set(p["gradients"]["ops_by_device"]) == {"/GPU:0", "/GPU:1"}
    rc = replica_consistency([w, b])
    assert rc["checked"] == 2 and rc["max_abs_diff"] == 0.0
    w.values[1].assign_add(tf.fill([6, 3], 0.25))
    rc = replica_consistency([w, b])
    assert rc["max_abs_diff"] == pytest.approx(0.25)
    assert rc["variables"][p["variables"][0]["name"]] == pytest.approx(0.25)
    assert rc["variables"][p["variables"][1]["name"]] == 0.0


def test_central_storage_keeps_variables_on_host(tf):
    """CentralStorageStrategy: variables on the host CPU, compute on the replica devices."""
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=["/CPU:1", "/CPU:2"], parameter_device="/CPU:0"
    )
    with strategy.scope():
        w = tf.Variable(tf.ones([5, 2]), name="cw")
    ds = tf.data.Dataset.from_tensors(tf.ones([4, 5])).repeat()
    it = iter(strategy.experimental_distribute_dataset(ds))

    def replica_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        with tf.name_scope("gradients"):
            g = tape.gradient(loss, w)
        tf.distribute.get_replica_context().merge_call(
            lambda strat, g: strat.extended.update(w, lambda v, g: v.assign_sub(0.01 * g), args=(strat.extended.reduce_to("sum", g, w),)),
            args=(g,),
        )
        return loss

    @tf.function
    def train(it):
        return strategy.run(replica_step, (next(it),))

    _, cap = _capture(train, it)
    p = _build([cap], [w], strategy="central_storage")
    (v,) = p["variables"]
    assert v["devices"] == ["/CPU:0"]
    assert v["update_devices"] == ["/CPU:0"]
    types = p["op_types_by_device"]
    # oneDNN builds rewrite MatMul to _MklMatMul on CPUs that have it (AVX-512): either is the matmul.
    matmuls = lambda d: types.get(d, {}).get("MatMul", 0) + types.get(d, {}).get("_MklMatMul", 0)
    assert matmuls("/GPU:0") >= 1 and matmuls("/GPU:1") >= 1
    assert matmuls("/CPU:0") == 0
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["strategy.variables_on_host"]["score"] == 1.0
    # parameters travel host -> each replica device, gradients back
    m = p["transfers"]["matrix"]
    # Per replica: w [5, 2] float32 read from the host (5 * 2 * 4 bytes) and its gradient back;
    # the replica's loss (a float32 scalar) to the function's output on the host, and back.
    w_bytes, loss_bytes = 5 * 2 * 4, 4
    for gpu in ("/GPU:0", "/GPU:1"):
        assert m["/CPU:0"][gpu] == {"count": 2, "bytes": w_bytes + loss_bytes}
        assert m[gpu]["/CPU:0"] == {"count": 2, "bytes": w_bytes + loss_bytes}
    assert sorted(m) == ["/CPU:0", "/GPU:0", "/GPU:1"] and sorted(m["/CPU:0"]) == ["/GPU:0", "/GPU:1"]


PS_SCRIPT = r'''
import json, socket, sys
import tensorflow as tf, keras
from types import SimpleNamespace
from pinpoint.config import PinningConfig
from pinpoint.placement.analysis.build import build_placement
from pinpoint.placement.capture.graphs import capture_on_device

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

cs = tf.train.ClusterSpec({j: [f"127.0.0.1:{port()}"] for j in ("chief", "worker", "ps")})
servers = [tf.distribute.Server(cs, job_name=j, task_index=0, protocol="grpc", start=True) for j in ("worker", "ps")]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cs, rpc_layer="grpc", task_type="chief", task_id=0)
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="dense"), keras.layers.Dense(2, name="out")])
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)

def step(seed):
    x = tf.random.stateless_normal([16, 8], seed=tf.stack([seed, 1]))
    y = tf.zeros([16], tf.int32)
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    with tf.name_scope("gradients"):
        grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

_, cap = capture_on_device(step, "/job:worker/replica:0/task:0/device:CPU:0", tf.constant(3), step=3)
dm = SimpleNamespace(aliases={}, replica_devices=[], host="/CPU:0")
p = build_placement([cap], variables=list(model.variables) + list(opt.variables), plan=PinningConfig(),
                    strategy="parameter_server", device_map=dm)
p["param_bytes"] = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
print("PLACEMENT=" + json.dumps(p))
'''


@pytest.mark.timeout(300)
def test_parameter_server_step_captured_from_coordinator(tmp_path):
    """parameter_server (real gRPC servers for a worker and a ps task, in a subprocess): compute
    and gradients on the worker, variables and their updates on the ps task, and one parameter
    set crosses ps -> worker (reads) and worker -> ps (updates) per step."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", PS_SCRIPT], check=False, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    p = json.loads(r.stdout.split("PLACEMENT=", 1)[1])
    worker, ps = "/job:worker/task:0/CPU:0", "/job:ps/task:0/CPU:0"
    assert {worker, ps} <= set(p["devices"])
    assert p["ops_by_device"][worker] > 0
    assert set(p["gradients"]["ops_by_device"]) == {worker}
    trainable = [v for v in p["variables"] if v["name"].startswith("sequential/")]
    assert len(trainable) == 4
    for v in trainable:
        assert v["devices"] == [ps] and v["update_devices"] == [ps]
    m = p["transfers"]["matrix"]
    iteration_bytes = 8  # the optimizer's int64 step counter is read and incremented too
    assert m[ps][worker]["bytes"] in (p["param_bytes"], p["param_bytes"] + iteration_bytes)
    assert m[worker][ps]["bytes"] in (p["param_bytes"], p["param_bytes"] + iteration_bytes)
    rules = {r["rule"]: r for r in p["conformance"]["rules"]}
    assert rules["strategy.variables_on_ps"]["score"] == 1.0
    assert any("captured by running one step" in n for n in p["notes"])


# ---- the trainer's multi-step loop: captured when it is instantiated ------------------------


def _loop_case(tf, jit=False, compute="/CPU:2"):
    """Variables on A (/GPU:0), gradients on `compute` (B, /GPU:1), n steps per call as the
    trainer runs them."""
    with tf.device("/CPU:1"):
        w = tf.Variable(tf.random.normal([32, 16]), name="lw")
        b = tf.Variable(tf.zeros([16]), name="lb")
    x = tf.random.normal([64, 32])

    def loss_and_grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b))
        with tf.name_scope("gradients"):
            gw, gb = tape.gradient(loss, [w, b])
        return loss, 0.1 * gw, 0.1 * gb

    compute_device = compute
    compute = tf.function(loss_and_grads, jit_compile=True) if jit else loss_and_grads

    def one_step(x):
        with tf.device(compute_device):
            loss, uw, ub = compute(x)
        w.assign_sub(uw)
        b.assign_sub(ub)
        return loss

    def n_steps(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            total += one_step(x)
        return total

    return w, b, one_step, n_steps, x


def test_loop_capture_matches_a_single_step_capture(tf):
    """The per-step view of a captured n-step loop reports what a separately traced single step
    reports: the same transfers, bytes, update devices and gradient placement."""
    from pinpoint.placement.graphs.steps import per_step_view

    w, b, one_step, n_steps, x = _loop_case(tf)
    _, single = _capture(tf.function(one_step), x, step=5)
    _, looped = _capture(tf.function(n_steps), tf.constant(4), step=0)
    raw_names = [n.name for g in looped.partition_graphs for n in g.node]
    assert any("/body/_" in n for n in raw_names)  # the loop really was lowered and inlined
    looped.steps = [3, 4]
    view = per_step_view(looped)
    plan = PinningConfig(variables="/GPU:0", gradients="/GPU:1")
    p1, pl = _build([single], [w, b], plan=plan), _build([view], [w, b], plan=plan)

    assert pl["captured_steps"] == [3, 4]
    assert [st["step"] for st in pl["transfers"]["steps"]] == [3, 4]
    param_bytes = (32 * 16 + 16) * 4
    m, m1 = pl["transfers"]["matrix"], p1["transfers"]["matrix"]
    # gradients/updates B -> A and parameter reads A -> B: exactly what one traced step moves
    assert m["/GPU:1"]["/GPU:0"] == m1["/GPU:1"]["/GPU:0"] and m["/GPU:1"]["/GPU:0"]["bytes"] == param_bytes
    assert m["/GPU:0"]["/GPU:1"] == m1["/GPU:0"]["/GPU:1"] and m["/GPU:0"]["/GPU:1"]["bytes"] == param_bytes
    # the batch x (a loop input living on the host) is sent to B every iteration, and sized
    assert m["/CPU:0"]["/GPU:1"] == {"count": 1, "bytes": 64 * 32 * 4}  # x [64, 32] float32, once a step
    assert pl["transfers"]["per_step"]["unsized"] == 0
    assert [v["update_devices"] for v in pl["variables"]] == [["/GPU:0"], ["/GPU:0"]]
    assert pl["gradients"]["ops_by_device"] == p1["gradients"]["ops_by_device"]
    assert pl["conformance"]["score"] == 1.0
    # the loop's own per-iteration predicate/control to the other devices, reported apart
    assert pl["transfers"]["loop_control"]["count"] >= 1
    assert p1["transfers"]["loop_control"]["count"] == 0
    # names are a step's names, not the lowered loop's
    assert not any("/body/_" in o["op"] or o["op"].startswith(("_cloop", "Func/")) for o in pl["ops"])
    assert any("instantiated" in n for n in pl["notes"])


def test_xla_call_is_expanded_onto_its_device(tf):
    """A jit-compiled forward+backward runs as one XLA program on its device (XLA needs the
    variables there too): its ops, gradients included, are reported on that device."""
    from pinpoint.placement.graphs.steps import per_step_view

    w, b, _one_step, n_steps, _x = _loop_case(tf, jit=True, compute="/CPU:1")
    _, looped = _capture(tf.function(n_steps), tf.constant(2), step=0)
    p = _build([per_step_view(looped)], [w, b], plan=PinningConfig(variables="/GPU:0", gradients="/GPU:0"))
    types = p["op_types_by_device"]["/GPU:0"]
    assert types.get("MatMul", 0) >= 2, types  # forward and backward matmuls inside the XLA program
    assert set(p["gradients"]["ops_by_device"]) == {"/GPU:0"}
    from tests.test_trace_gpu_answers import XLA_NOTE

    assert [n for n in p["notes"] if XLA_NOTE.fullmatch(n)], p["notes"]  # as a traced program's report says it
    xla_ops = [o for o in p["ops"] if o["type"] == "MatMul"]
    assert xla_ops and not any("/body/_" in o["op"] for o in xla_ops)
    assert [v["update_devices"] for v in p["variables"]] == [["/GPU:0"], ["/GPU:0"]]
    assert p["conformance"]["score"] == 1.0


def test_frames_follow_enter_and_exit():
    """Frame propagation on a hand-built lowered loop: Enter opens, Exit closes."""
    from tensorflow.core.framework import graph_pb2

    from pinpoint.placement.graphs.steps import frames

    g = graph_pb2.GraphDef()
    for name, op, inputs in [("x", "Const", []), ("enter", "Enter", ["x"]), ("merge", "Merge", ["enter", "next"]),
                             ("body", "Mul", ["merge"]), ("next", "NextIteration", ["body"]),
                             ("exit", "Exit", ["body"]), ("after", "Identity", ["exit"])]:
        n = g.node.add(name=name, op=op)
        n.input.extend(inputs)
        if op == "Enter":
            n.attr["frame_name"].s = b"loop"
    fr = frames(g)
    assert fr["x"] == () and fr["after"] == ()
    assert fr["enter"] == fr["merge"] == fr["body"] == fr["next"] == fr["exit"] == ("loop",)


def test_fallbacks_inside_the_loop_and_beside_an_xla_call(tf):
    """Requested devices survive the per-step view: inside a lowered loop (names renamed) and in
    a single step that also holds an XLA call (whose ops are added to the graphs)."""
    from pinpoint.placement.graphs.steps import per_step_view

    x = tf.constant([1.0, 2.0])
    double = tf.function(lambda v: v * 2.0, jit_compile=True)

    def body(v):
        with tf.device("/GPU:0"):  # no such device here: soft placement moves it to the host
            s = tf.strings.as_string(v)
        with tf.device("/CPU:1"):
            w = double(v)
        return s, w

    def n_steps(n):
        acc = tf.constant(0.0)
        for _ in tf.range(n):
            s, w = body(x)
            acc += tf.reduce_sum(w) + tf.cast(tf.reduce_sum(tf.strings.length(s)), tf.float32)
        return acc

    dm = _dm(replicas=("/CPU:0",), aliases={})
    for fn, args in ((n_steps, (tf.constant(3),)), (body, (x,))):
        _, cap = _capture(tf.function(fn), *args)
        p = _build([per_step_view(cap)], [], dm=dm)
        fb = {f["op_type"]: f for f in p["fallbacks"]}
        assert "AsString" in fb and fb["AsString"]["requested"] == "/GPU:0", (fn.__name__, p["fallbacks"])
        assert fb["AsString"]["placed"] == "/CPU:0"
        assert p["op_types_by_device"]["/CPU:1"].get("Mul") == 1, p["op_types_by_device"]  # inside XLA


INITIALIZED_EARLY = '''
import tensorflow as tf


def test_an_earlier_test_initializes_tensorflow_with_one_device():
    tf.constant(1.0)  # the runtime starts with the machine's one CPU device


def test_then_one_asks_for_the_emulated_gpus(tf):
    pass
'''


def test_the_tf_fixture_fails_rather_than_skips_when_an_earlier_test_took_the_devices(tmp_path):
    """conftest.py's `tf` after TensorFlow started with too few logical devices: an error in CI,
    never a silent skip."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    test = tmp_path / "test_early.py"
    test.write_text(INITIALIZED_EARLY)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(repo), "-c", str(repo / "pyproject.toml"), "-q", "-rE", str(test)],
                          capture_output=True, text=True, cwd=repo, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 passed, 1 error" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:]
    assert "initialized in this process with 1 logical CPU device(s)" in proc.stdout


# ---- shapes of the captured call: a lowered cond whose then-branch reads the input batch ------------
def _lowered_cond():
    """pred ? relu(iterator.get_next()) : zeros([0, 3]), lowered to Switch/Merge as the runtime runs it."""
    import tensorflow as tf

    g = tf.compat.v1.GraphDef()

    def node(name, op, inputs=(), **attrs):
        n = g.node.add(name=name, op=op, input=list(inputs))
        for k, v in attrs.items():
            n.attr[k].CopyFrom(v)
        return n

    def attr(**kw):
        return tf.compat.v1.AttrValue(**kw)

    f32, boolean, res = tf.float32.as_datatype_enum, tf.bool.as_datatype_enum, tf.resource.as_datatype_enum
    shapes = attr(list=tf.compat.v1.AttrValue.ListValue(shape=[tf.TensorShape([None, 3]).as_proto()]))
    types = attr(list=tf.compat.v1.AttrValue.ListValue(type=[f32]))
    node("pred", "Placeholder", dtype=attr(type=boolean), shape=attr(shape=tf.TensorShape([]).as_proto()))
    node("it", "IteratorV2", shared_name=attr(s=b""), container=attr(s=b""), output_types=types,
         output_shapes=shapes)
    node("sw_it", "Switch", ["it", "pred"], T=attr(type=res))
    node("sw_pred", "Switch", ["pred", "pred"], T=attr(type=boolean))
    node("pivot_t", "Identity", ["sw_pred:1"], T=attr(type=boolean))
    node("pivot_f", "Identity", ["sw_pred"], T=attr(type=boolean))
    node("get", "IteratorGetNext", ["sw_it:1", "^pivot_t"], output_types=types, output_shapes=shapes)
    node("relu", "Relu", ["get"], T=attr(type=f32))
    node("zeros", "Const", ["^pivot_f"], dtype=attr(type=f32),
         value=attr(tensor=tf.make_tensor_proto(tf.zeros([0, 3]).numpy())))
    node("merge", "Merge", ["relu", "zeros"], T=attr(type=f32), N=attr(i=2))
    node("out", "Identity", ["merge"], T=attr(type=f32))
    return g


BATCH_ROWS, ROW_FLOATS = 4, 3


def test_shape_inference_sizes_a_tensor_derived_from_the_batch_through_the_branch_that_ran():
    from pinpoint.placement.graphs.shapes import infer_shapes

    element = BATCH_ROWS * ROW_FLOATS * 4
    shapes, dead = infer_shapes([_lowered_cond()], [element], {"get", "relu"})
    assert (shapes["out"][0][1], sorted(dead)) == ([BATCH_ROWS, ROW_FLOATS], ["pivot_f", "zeros"])


def test_shape_inference_leaves_a_merge_unresolved_when_no_branch_is_known_to_have_run():
    from pinpoint.placement.graphs.shapes import infer_shapes

    shapes, dead = infer_shapes([_lowered_cond()], [BATCH_ROWS * ROW_FLOATS * 4], set())
    assert (shapes["out"][0][1], dead) == ([None, ROW_FLOATS], set())


def test_a_fused_filter_gradients_bias_output_is_one_value_per_filter_not_the_inputs_channels():
    """oneDNN's _MklNativeConv2DBackpropFilterWithBias: TensorFlow's own shape function gives its bias
    gradient the input's channel count (5 here); the kernel returns one value per filter (16)."""
    import tensorflow as tf

    from pinpoint.placement.graphs.shapes import infer_shapes, merge_shapes

    f32, i32 = tf.float32.as_datatype_enum, tf.int32.as_datatype_enum
    g = tf.compat.v1.GraphDef()
    for name, dims in (("x", [8, 32, 32, 5]), ("dy", [8, 32, 32, 16])):
        g.node.add(name=name, op="Placeholder").attr["dtype"].type = f32
        g.node[-1].attr["shape"].shape.CopyFrom(tf.TensorShape(dims).as_proto())
    sizes = g.node.add(name="sizes", op="Const")
    sizes.attr["dtype"].type = i32
    sizes.attr["value"].tensor.CopyFrom(tf.make_tensor_proto([3, 3, 5, 16], tf.int32))
    grad = g.node.add(name="grad", op="_MklNativeConv2DBackpropFilterWithBias", input=["x", "sizes", "dy"])
    grad.attr["T"].type = f32
    grad.attr["strides"].list.i.extend([1, 1, 1, 1])
    grad.attr["dilations"].list.i.extend([1, 1, 1, 1])
    grad.attr["padding"].s = b"SAME"
    grad.attr["data_format"].s = b"NHWC"
    shapes, _ = infer_shapes([g], None, {"grad"})
    assert shapes["grad"] == [(f32, [3, 3, 5, 16]), (f32, [16])]
    # The traced op (Conv2DBackpropFilter, before the rewrite) had one output: the second is added.
    assert merge_shapes([(f32, [3, 3, 5, 16])], shapes["grad"]) == [(f32, [3, 3, 5, 16]), (f32, [16])]


def _fused_gradient_pack(split_sizes: list[int]):
    """A fused filter gradient (x [8, 32, 32, 5], dy [8, 32, 32, 16], 3x3 filters) whose bias gradient
    is packed with a 10-value tensor and split again, as a mirrored optimizer packs its gradients."""
    import tensorflow as tf

    f32, i32 = tf.float32.as_datatype_enum, tf.int32.as_datatype_enum
    g = tf.compat.v1.GraphDef()

    def const(name, value):
        n = g.node.add(name=name, op="Const")
        n.attr["dtype"].type = i32
        n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, tf.int32))

    for name, dims in (("x", [8, 32, 32, 5]), ("dy", [8, 32, 32, 16]), ("other", [10])):
        g.node.add(name=name, op="Placeholder").attr["dtype"].type = f32
        g.node[-1].attr["shape"].shape.CopyFrom(tf.TensorShape(dims).as_proto())
    const("sizes", [3, 3, 5, 16])
    const("axis", 0)
    const("splits", split_sizes)
    grad = g.node.add(name="grad", op="_MklNativeConv2DBackpropFilterWithBias", input=["x", "sizes", "dy"])
    grad.attr["T"].type = f32
    grad.attr["strides"].list.i.extend([1, 1, 1, 1])
    grad.attr["dilations"].list.i.extend([1, 1, 1, 1])
    grad.attr["padding"].s = b"SAME"
    grad.attr["data_format"].s = b"NHWC"
    pack = g.node.add(name="adam/concat", op="ConcatV2", input=["grad:1", "other", "axis"])
    pack.attr["T"].type, pack.attr["Tidx"].type, pack.attr["N"].i = f32, i32, 2
    split = g.node.add(name="adam/split", op="SplitV", input=["adam/concat", "splits", "axis"])
    split.attr["T"].type, split.attr["Tlen"].type, split.attr["num_split"].i = f32, i32, 2
    return g


def test_a_fused_bias_gradient_packed_and_split_again_is_sized_through_the_pack():
    """Issue 48: the wrong bias shape inside the import poisoned the gradient pack (concat -> split)
    and the whole import failed; split back into its unfused ops, every shape after it is right."""
    from pinpoint.placement.graphs.shapes import infer_shapes

    shapes, _ = infer_shapes([_fused_gradient_pack([16, 10])], None, {"adam/split"})
    # 16 bias values (one per filter) + 10 others, split into 16 and 10.
    assert (shapes["adam/concat"][0][1], [d for _, d in shapes["adam/split"]]) == ([26], [[16], [10]])


def test_a_failed_shape_inference_is_a_sizing_error_naming_the_function_and_the_op():
    from pinpoint.placement.analysis.transfers import merge_transfer_steps
    from pinpoint.placement.capture.graphs import size_from_inference
    from pinpoint.placement.graphs.captured import CapturedGraphs

    graph = _fused_gradient_pack([20, 10])  # 26 values cannot split into 20 and 10
    cap = CapturedGraphs(step=0, functions=[("train_step", graph, [graph])])
    size_from_inference(cap, None, {"adam/split"})
    # TensorFlow's own words after the op differ between versions: the function, the op and the error type.
    assert [e.split(": ", 1)[0] for e in cap.sizing_errors] == [
        "shape inference failed in train_step at adam/split (ValueError"]
    merged = merge_transfer_steps([{"count": 0, "bytes": 0, "sized": 0, "matrix": {}, "items": [],
                                    "sizing_errors": cap.sizing_errors}] * 2)
    assert merged["sizing_errors"] == cap.sizing_errors
