"""`pinpoint trace` tells the truth in the common cases (issue 35): an input batch crossing to the
GPU is sized; the tf.device rule counts the fallbacks that break it and no rule appears that the
program did not write; TensorFlow's own variables are apart; counts, function roles and the
replica-drift headline agree. Each test runs a tiny program as users write it, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pinpoint.placement.graphs.shapes import DEAD_BRANCH
from tests.test_trace import F32, placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
I64 = 8


def _summary(proc) -> str:
    return proc.stdout[proc.stdout.index("== pinpoint summary"):]


# ---- 1. model.fit on a tf.data pipeline: the input batch is sized ---------------------------------
BATCH, FEATURES, ROWS = 64, 32, 256


def test_fit_input_batch_with_a_dynamic_batch_dimension_is_sized(tmp_path):
    script = write(tmp_path, "fit_ds.py", f"""
        import numpy as np, tensorflow as tf, keras
        x = np.random.rand({ROWS}, {FEATURES}).astype("float32")
        y = np.random.randint(0, 4, {ROWS}).astype("int64")
        with tf.device("/CPU:0"):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch({BATCH})
        model = keras.Sequential([keras.Input(({FEATURES},)), keras.layers.Dense(16), keras.layers.Dense(4)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(ds, epochs=1, verbose=0)
    """)
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out)
    tr = placement(out)["transfers"]
    items = {it["tensor"]: it for it in tr["largest"]}
    # The batch (x: BATCH x FEATURES float32, y: BATCH int64) moves from the pipeline on /CPU:0.
    assert (items["IteratorGetNext"]["from"], items["IteratorGetNext"]["to"]) == ("/CPU:0", "/GPU:0")
    assert items["IteratorGetNext"]["bytes"] == BATCH * FEATURES * F32
    assert items["IteratorGetNext:1"]["bytes"] == BATCH * I64
    assert (tr["per_step"]["unsized"], tr["unsized_reasons"]) == (0, {})
    assert tr["per_step"]["bytes"] == sum(it["bytes"] for it in tr["largest"])
    assert "unsized" not in _summary(proc)


# MirroredStrategy fit on a tf.data pipeline: each replica's half of the batch reaches the step through
# the lowered tf.cond of Keras' data handler (its output crosses between the replicas' devices).
GLOBAL_BATCH, MIRRORED_FEATURES = 32, 12


def test_mirrored_fit_batch_derived_through_the_data_handlers_cond_is_sized(tmp_path):
    script = write(tmp_path, "mirrored_ds.py", f"""
        import numpy as np, tensorflow as tf, keras
        x = np.random.rand({4 * GLOBAL_BATCH}, {MIRRORED_FEATURES}).astype("float32")
        y = np.random.rand({4 * GLOBAL_BATCH}, 1).astype("float32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch({GLOBAL_BATCH})
        with tf.distribute.MirroredStrategy().scope():
            model = keras.Sequential([keras.Input(({MIRRORED_FEATURES},)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(ds, epochs=1, verbose=0)
    """)
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out)
    tr = placement(out, sized=False)["transfers"]
    replica_batch = GLOBAL_BATCH // 2
    batch_items = sorted((it["from"], it["to"], it["bytes"]) for it in tr["largest"]
                         if it["tensor"].startswith(("cond/output", "cond/then/")))
    # Each replica's x (replica_batch x features float32) and y (replica_batch x 1) cross once each way.
    x_bytes, y_bytes = replica_batch * MIRRORED_FEATURES * F32, replica_batch * F32
    assert batch_items == sorted([("/GPU:0", "/GPU:1", x_bytes), ("/GPU:0", "/GPU:1", y_bytes),
                                  ("/GPU:1", "/GPU:0", x_bytes), ("/GPU:1", "/GPU:0", y_bytes)])
    # Unsized: only what the handler's other branch would have sent; it did not run (a dead tensor).
    unsized = [it for it in tr["largest"] if it["bytes"] is None]
    assert {(it["tensor"].split("/")[1], it["unsized_reason"]) for it in unsized} == {("else", DEAD_BRANCH)}
    assert tr["unsized_reasons"] == {DEAD_BRANCH: len(unsized)}
    assert DEAD_BRANCH in _summary(proc)


# ---- 4 and 5: string ops under tf.device('/GPU:0') with soft placement, a py_function, an assign_add
STRING_OPS = {"StringJoin", "StringLength", "StringUpper", "StringToHashBucketFast", "EagerPyFunc"}


@pytest.fixture(scope="module")
def strings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strings")
    script = write(tmp, "strings.py", """
        import tensorflow as tf
        tf.config.set_soft_device_placement(True)

        @tf.function
        def step(s, v):
            with tf.device("/GPU:0"):
                a = tf.strings.join([s, s])
                n = tf.strings.length(a)
                h = tf.strings.to_hash_bucket_fast(tf.strings.upper(a), 10)
                w = tf.py_function(lambda t: tf.strings.length(t) * 2, [a], tf.int32)
                v.assign_add(tf.reduce_sum(tf.cast(n + tf.cast(h, tf.int32) + w, tf.float32)))
            return v

        v = tf.Variable(0.0)
        for _ in range(3):
            step(tf.constant(["ab", "cde"]), v)
    """)
    out = tmp / "out"
    proc = trace(["--gpus", "2", str(script)], cwd=tmp, out=out)
    return placement(out, sized=False), _summary(proc)


def test_a_string_tensor_crossing_is_the_one_unsized_transfer_and_says_why(strings):
    p, summary = strings
    reason = "a string tensor: its bytes are not fixed by its shape"
    assert (p["transfers"]["per_step"]["unsized"], p["transfers"]["unsized_reasons"]) == (1, {reason: 1})
    assert reason in summary


def test_predicted_fallbacks_count_against_the_gpu_request_they_break(strings):
    p, summary = strings
    predicted = {f["op"] for f in p["fallbacks"] if f.get("predicted") and f["requested"] == "/GPU:0"}
    assert predicted == STRING_OPS  # no GPU kernel: a GPU machine runs them on the host
    (rule,) = [r for r in p["conformance"]["rules"] if r["rule"].startswith("tf.device")]
    assert rule["rule"] == "tf.device /GPU:0"
    assert {v["op"] for v in rule["violations"]} == STRING_OPS
    assert all(v["predicted"] and v["placed"] == "/CPU:0" for v in rule["violations"])
    assert rule["score"] == round(1 - len(STRING_OPS) / rule["relevant"], 4)
    assert f"tf.device /GPU:0 {rule['score']:.2f}" in summary


def test_py_function_body_ops_are_reported_not_made_into_a_cpu_rule(strings):
    p, _ = strings
    assert [r["rule"] for r in p["conformance"]["rules"]] == ["tf.device /GPU:0"]
    (fn,) = p["functions"]
    # The body (`tf.strings.length(t) * 2`) ran eagerly on the runtime's thread, on the host.
    # (_EagerConst: the Python 2 made a tensor.)
    assert {(o["op_type"], o["device"]) for o in fn["runtime_ops"]} == {
        ("StringLength", "/CPU:0"), ("Mul", "/CPU:0"), ("_EagerConst", "/CPU:0")}
    assert "/CPU:0" not in fn["ops_by_device"]
    assert not [f for f in p["fallbacks"] if not f.get("predicted")]


def test_assign_add_in_a_function_is_counted_alike_everywhere(strings):
    p, summary = strings
    vu = p["variable_updates"]
    (fn,) = p["functions"]
    assert (vu["update_ops"], vu["unattributed_ops"], fn["variable_updates"]) == (1, 0, 1)
    assert vu["coverage"] == "updates attributed for 1/1 variables"
    assert "updates attributed for 1/1 variables" in summary


# ---- 3 and 5: MirroredStrategy fit with BatchNormalization, then evaluate --------------------------
SAMPLES, IN, HIDDEN, OUT, FIT_BATCH = 128, 8, 4, 2, 32
MIRRORED = f"""
    import numpy as np, tensorflow as tf, keras
    x = np.random.rand({SAMPLES}, {IN}).astype("float32"); y = np.random.randint(0, {OUT}, {SAMPLES})
    s = tf.distribute.MirroredStrategy()
    with s.scope():
        model = keras.Sequential([keras.Input(({IN},)), keras.layers.Dense({HIDDEN}),
                                  keras.layers.BatchNormalization(), keras.layers.Dense({OUT})])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size={FIT_BATCH}, epochs=1, verbose=0)
    model.evaluate(x, y, batch_size={FIT_BATCH}, verbose=0)
"""
# dense kernel+bias, BatchNormalization gamma, beta, moving mean and variance, dense_1 kernel+bias;
# SGD's iteration and learning rate; the loss and accuracy metrics' total and count.
USER_VARIABLES = 2 + 4 + 2 + 2 + 4


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mirrored")
    script = write(tmp, "mirrored.py", MIRRORED)
    out = tmp / "out"
    proc = trace(["--gpus", "2", str(script)], cwd=tmp, out=out)
    return placement(out), _summary(proc)


def _plain_tf_ordering_tokens() -> int:
    """The collective-ordering tokens plain TensorFlow makes for MirroredStrategy over two devices."""
    code = """
import gc, tensorflow as tf
from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 3)
s = tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"])
s.run(tf.function(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0)))
print(sum(1 for o in gc.get_objects() if isinstance(o, CollectiveReplicaLauncher) and o._ordering_token is not None))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1])


def test_tensorflows_collective_tokens_are_internal_and_apart(mirrored):
    p, summary = mirrored
    internal = [v for v in p["variables"] if v["class"] == "internal"]
    assert sorted(d for v in internal for d in v["devices"]) == ["/GPU:0", "/GPU:1"]
    # Emulation adds none: plain TensorFlow has as many for the same strategy.
    assert len(internal) == _plain_tf_ordering_tokens()
    assert len(p["variables"]) - len(internal) == USER_VARIABLES
    assert (p["variable_updates"]["variables"], p["variable_updates"]["internal_variables"]) == (USER_VARIABLES, 2)
    assert not [n for n in p["notes"] if "outside the strategy" in n]
    assert f"variables  : {USER_VARIABLES} (" in summary and "+2 internal" in summary

    from pinpoint.placement.report.metrics import headline_metrics

    assert headline_metrics(p)["placement.variables"] == USER_VARIABLES


def test_keras_evaluate_function_is_named_for_its_role(mirrored):
    p, summary = mirrored
    steps = SAMPLES // FIT_BATCH
    rows = [(f["name"], f["role"], f["calls"], f["training"]) for f in p["functions"]]
    assert rows == [("multi_step_on_iterator", "train", steps, True),
                    ("multi_step_on_iterator", "evaluate", steps, False)]
    assert f"multi_step_on_iterator x{steps} (evaluate)" in summary


def test_replica_drift_headline_leaves_out_on_read_metric_accumulators(mirrored):
    from pinpoint.placement.report.metrics import headline_metrics

    p, summary = mirrored
    rc = p["replica_consistency"]
    by_class: dict[str, list[float]] = {}
    for name, cls in rc["classes"].items():
        by_class.setdefault(cls, []).append(rc["variables"][name])
    assert rc["state_drift"] == max(by_class["replica_state"])  # BatchNormalization's moving statistics
    assert rc["on_read_drift"] == max(by_class["sync_on_read"])  # Keras' metric accumulators
    assert rc["trainable_drift"] == 0.0
    assert headline_metrics(p)["placement.replica_drift"] == rc["state_drift"]
    assert f"replica drift: trainable 0, state {rc['state_drift']:.3g} over" in summary


# ---- 5: a program that fails in its first step names its own function -----------------------------
def test_a_first_step_that_raises_names_the_users_function(tmp_path):
    script = write(tmp_path, "fail.py", """
        import tensorflow as tf
        v = None

        @tf.function
        def train_step(x):
            global v
            if v is None:
                v = tf.Variable(x * 0.0)  # initial value from the input: TensorFlow wraps it in fn_with_cond
            v.assign_add(tf.debugging.check_numerics(x, "bad input"))
            return v

        train_step(tf.constant([1.0, float("nan"), 0.0]))
    """)
    out = tmp_path / "out"
    trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out, expect=1)
    p = placement(out)
    assert p["training_function"] == "train_step"
    (fn,) = p["functions"]
    assert (fn["name"], fn["captured"]) == ("train_step", False)
    assert fn["error"].startswith("InvalidArgumentError: ") and "bad input" in fn["error"]
    assert any(n.startswith("the training function train_step raised in its first call") for n in p["notes"])
    assert json.loads((out / "metrics.json").read_text())["training_function"] == "train_step"


# ---- a parameter-server coordinator: the default /GPU:0 scope ends where it connects -----------
ROWS_PS, COLS_PS = 4, 2


def test_a_coordinator_connecting_to_its_cluster_leaves_the_default_gpu_scope(tmp_path):
    script = write(tmp_path, "coordinator.py", f"""
        import socket
        import tensorflow as tf

        def port():
            with socket.socket() as s:
                s.bind(("localhost", 0))
                return s.getsockname()[1]

        before = tf.zeros([3])  # not yet connected: on the emulated /GPU:0
        spec = tf.train.ClusterSpec({{"worker": [f"localhost:{{port()}}"], "ps": [f"localhost:{{port()}}"]}})
        tf.distribute.Server(spec, job_name="worker", task_index=0, protocol="grpc")
        tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
        with strategy.scope():
            v = tf.Variable(tf.zeros([{ROWS_PS}, {COLS_PS}]), name="v")
    """)
    out = tmp_path / "out"
    trace(["--gpus", "2", str(script)], cwd=tmp_path, out=out)
    p = placement(out)
    chief, ps = "/job:chief/task:0/CPU:0", "/job:ps/task:0/CPU:0"
    # Each tf.zeros is one Fill: the first under the default scope, the second the coordinator's
    # own (its job's CPU, as plain TensorFlow puts it); the variable is made and set on the ps.
    assert p["eager"]["op_types_by_device"] == {
        "/GPU:0": {"Fill": 1}, chief: {"Fill": 1}, ps: {"VarHandleOp": 1, "AssignVariableOp": 1}}
    assert [(c["from"], c["to"], c["bytes"]) for c in p["eager"]["copies"]] == [(chief, ps, ROWS_PS * COLS_PS * F32)]
    assert [(v["name"], [c["device"] for c in v["components"]]) for v in p["variables"]] == [("v", [ps])]
    assert [n for n in p["notes"] if "set_server_def" in n] == [
        "emulation: set_server_def: the program connected to a cluster as /job:chief; from then on its ops with "
        "no device request ran where TensorFlow puts them, not on the emulated /GPU:0"]


def test_the_default_scope_stays_under_a_scope_of_the_programs_and_ends_once(tf):
    """The connection ends the default scope only when it is the innermost one: a program's own
    scope inside it is the program's to leave (exiting the default under it would break nesting)."""
    from pinpoint.device_names import DeviceMap, emulation_aliases
    from pinpoint.tfcompat.api import current_device
    from pinpoint.trace.gpus import GpuNames

    aliases = emulation_aliases(range(2))
    names = GpuNames(DeviceMap(aliases=aliases, replica_devices=tuple(aliases.values()),
                               spec_replica_devices=tuple(aliases), emulated=True))
    gpu0 = "/job:localhost/replica:0/task:0/device:CPU:1"
    with names.default_scope():
        assert current_device() == gpu0
        with tf.device("/CPU:0"):
            names._leave_default_scope("chief")
            assert (current_device(), names.ignored) == ("/job:localhost/replica:0/task:0/device:CPU:0", [])
        names._leave_default_scope("chief")
        assert current_device() == ""
        names._leave_default_scope("chief")  # already ended: the `with` exit below does nothing either
        assert names.ignored == [
            "set_server_def: the program connected to a cluster as /job:chief; from then on its ops with no device "
            "request ran where TensorFlow puts them, not on the emulated /GPU:0"]
    assert current_device() == ""
