"""Every update attributed, every variable as it was created (issue 48, point 5), run for real as
`pinpoint` processes. TensorFlow's answer is printed by the program itself (each component's
`.device`, read in the program); counts are derived in the test from what the program does."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from tests.test_trace import placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPLICAS = 2
TRUTH = re.compile(r"^TRUTH (.*)$", re.M)


def truth(proc) -> dict:
    """The program's own 'TRUTH {json}' lines, merged."""
    out = {}
    for line in TRUTH.findall(proc.stdout):
        out.update(json.loads(line))
    return out


def short(device: str) -> str:
    """A device as the program reads it under `--gpus` ('/job:localhost/replica:0/task:0/device:GPU:1',
    as a GPU machine names it) as the report spells it ('/GPU:1')."""
    return "/" + device.rsplit("device:", 1)[-1]


MIXED_CNN = """
    import json
    import numpy as np
    import tensorflow as tf
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 8, 8, 3)).astype("float32")
    y = rng.randint(0, 4, size=(64,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    val = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(16)

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4),
            keras.layers.Activation("softmax", dtype="float32"),
        ])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(ds, epochs=2, validation_data=val, verbose=0)
    print("TRUTH", json.dumps({v.path: [c.device for c in v.value.values] for v in model.trainable_variables}))
"""


def test_mixed_precision_mirrored_fit_attributes_every_update_inside_the_loss_scale_cond(tmp_path):
    """The loss-scale optimizer applies the gradients inside a cond (only when they are finite):
    each apply is followed through the lowered cond's Switch to its variable's component."""
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(write(tmp_path, "mixed.py", MIXED_CNN))], cwd=tmp_path, out=out)
    p = placement(out, sized=False)
    tf_devices = {name: sorted(short(d) for d in devs) for name, devs in truth(proc).items()}
    assert len(tf_devices) == 6  # conv kernel/bias, gamma/beta, dense kernel/bias
    vu = p["variable_updates"]
    assert vu["unattributed_ops"] == 0, vu
    assert "attributed to no variable" not in proc.stdout
    rows = {v["name"]: v for v in p["variables"]}
    for name, devices in tf_devices.items():
        # One apply per replica's component in the training function, each on its component's device.
        assert rows[name]["update_ops"] == REPLICAS, name
        assert rows[name]["update_devices"] == devices == [f"/GPU:{i}" for i in range(REPLICAS)], name


COND_LOOP = """
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        a = tf.Variable(1.0, name="a")
        b = tf.Variable(2.0, name="b")
        c = tf.Variable(3.0, name="c")

    @tf.function(experimental_attributes={"_noinline": True})
    def bump(v, x):
        v.assign_add(x)
        return x

    @tf.function
    def step(x):
        tf.cond(x > 0.0, lambda: a.assign_add(x), lambda: a.assign_sub(x))
        i = tf.constant(0)
        while i < 3:
            b.assign_add(1.0)
            i += 1
        bump(c, x)
        return x

    for _ in range(3):
        step(tf.constant(1.0))
    print("TRUTH", "{" + ", ".join(f'"{v.name[:-2]}": {[c.device for c in v.values]}'.replace("'", '"')
                                     for v in (a, b, c)) + "}")
"""


def test_an_update_in_a_cond_branch_a_loop_body_or_a_call_not_inlined_is_traced_to_its_variable(tmp_path):
    """c's update is inside a function the runtime runs without inlining it (its graphs are not
    recorded): read off its FunctionDef, counted at the call, on the resource's device."""
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(write(tmp_path, "cond_loop.py", COND_LOOP))], cwd=tmp_path, out=out)
    p = placement(out, sized=False)
    tf_devices = {name: sorted(short(d) for d in devs) for name, devs in truth(proc).items()}
    rows = {v["name"]: v for v in p["variables"]}
    assert p["variable_updates"]["unattributed_ops"] == 0
    # a: both branches (assign_add, assign_sub) per mirrored component; b: the loop body's one per
    # component; c: the callee's one per component.
    assert [rows[n]["update_ops"] for n in "abc"] == [2 * REPLICAS, REPLICAS, REPLICAS]
    assert p["variable_updates"]["update_ops"] == 4 * REPLICAS
    for name in "abc":
        assert rows[name]["update_devices"] == tf_devices[name] == ["/GPU:0", "/GPU:1"]


STRATEGIES = """
    import json
    import tensorflow as tf
    import keras


    def truth(name, v, dropped):
        comps = getattr(v, "values", None) or (v,)
        print("TRUTH", json.dumps({name: {"devices": [c.device for c in comps], "dropped": dropped}}))


    # No strategy: the default device, a tf.device request, and one dropped at once.
    plain = tf.Variable(1.0, name="plain")
    truth("plain", plain, False)
    with tf.device("/GPU:1"):
        pinned = tf.Variable(2.0, name="pinned")
    truth("pinned", pinned, False)
    temp = tf.Variable(3.0, name="temp")
    truth("temp", temp, True)
    del temp

    # OneDeviceStrategy: a model built, trained and dropped (its variables were a captured
    # function's), and a variable dropped.
    one = tf.distribute.OneDeviceStrategy("/GPU:1")
    with one.scope():
        m1 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d1")], name="one")
        m1.compile(optimizer="sgd", loss="mse")
        once = tf.Variable(5.0, name="once")
    truth("once", once, True)
    del once
    for w in m1.weights:
        truth(w.path, w.value, True)
    m1.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), epochs=1, verbose=0)
    del m1

    # MirroredStrategy: one variable dropped, a model kept.
    mirrored = tf.distribute.MirroredStrategy()
    with mirrored.scope():
        scratch = tf.Variable(4.0, name="scratch")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d2")], name="two")
        model.compile(optimizer="sgd", loss="mse")
    truth("scratch", scratch, True)
    del scratch
    for w in model.weights:
        truth(w.path, w.value, False)
    model.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), epochs=1, verbose=0)
"""


def test_variables_made_under_several_strategies_in_turn_are_all_reported_live_or_freed(tmp_path):
    """Every variable, each on the devices TensorFlow gave it (read in the program), also the ones
    the program dropped before its end (reported from their creation, marked freed)."""
    out = tmp_path / "out"
    proc = trace(["--gpus", "2", str(write(tmp_path, "strategies.py", STRATEGIES))], cwd=tmp_path, out=out)
    p = placement(out, sized=False)
    told = truth(proc)
    # 3 plain, 1 one-device variable and 2 weights, 1 mirrored scratch and 2 weights.
    assert len(told) == 3 + 3 + 3
    rows = {}
    for v in p["variables"]:
        rows.setdefault(v["name"], []).append(v)
    for name, t in told.items():
        (row,) = rows[name]
        devices = [c["device"] for c in row["components"]]
        assert (devices, bool(row.get("freed"))) == ([short(d) for d in t["devices"]], t["dropped"]), name
    strategies = {name: rows[name][0]["created"]["strategy"] for name in told}
    assert strategies == {"plain": None, "pinned": None, "temp": None, "once": "OneDeviceStrategy",
                          "one/d1/kernel": "OneDeviceStrategy",
                          "one/d1/bias": "OneDeviceStrategy", "scratch": "MirroredStrategy",
                          "two/d2/kernel": "MirroredStrategy", "two/d2/bias": "MirroredStrategy"}
    # The request as the program wrote it; the creating layer, or the program's line.
    assert rows["pinned"][0]["created"]["requested"] == "/GPU:1"
    assert rows["plain"][0]["created"]["requested"] == ""
    assert rows["one/d1/kernel"][0]["created"]["layer"] == "one/d1"
    line = textwrap.dedent(STRATEGIES).splitlines().index('temp = tf.Variable(3.0, name="temp")') + 1
    assert rows["temp"][0]["created"]["source"] == f"{tmp_path / 'strategies.py'}:{line}"
    # Every update ran on its own variable's devices: two models' same-named variables ('loss/total')
    # are told apart.
    assert [v["name"] for v in p["variables"] if not set(v["update_devices"]) <= set(v["devices"])] == []
    # A freed variable's initializer (an eager assign) ran on its own devices.
    assert rows["scratch"][0]["update_devices"] == ["/GPU:0", "/GPU:1"]
    # Under each strategy, the model's optimizer and loss tracker too: 2 weights, 2 sgd, 2 loss variables.
    for strategy, n in (("OneDeviceStrategy", 1 + 6), ("MirroredStrategy", 1 + 6)):
        made = [v for v in p["variables"] if (v.get("created") or {}).get("strategy") == strategy]
        assert len(made) == n, strategy
    # Freed: temp, once, scratch, and the dropped model's 2 weights, 2 sgd and 2 loss variables.
    freed = [v["name"] for v in p["variables"] if v.get("freed")]
    assert p["variable_updates"]["freed_variables"] == len(freed) == 3 + 6
    assert sorted(v["name"] for v in p["variables"] if v.get("freed") and v["created"]["strategy"] == "OneDeviceStrategy"
                  ) == ["loss/count", "loss/total", "once", "one/d1/bias", "one/d1/kernel", "sgd/iteration",
                        "sgd/learning_rate"]
    # temp on /GPU:0, once and the dropped model's six on /GPU:1, scratch on both.
    assert "+9 created and freed before the end: /GPU:0: 2, /GPU:1: 8" in proc.stdout
    # Where and when each went: its `del` line, in the program's order.
    lines = textwrap.dedent(STRATEGIES).splitlines()
    dels = {name: f"{tmp_path / 'strategies.py'}:{lines.index(f'del {name}') + 1}" for name in ("temp", "once", "scratch")}
    assert {name: rows[name][0]["freed_at"]["source"] for name in dels} == dels
    seconds = [rows[name][0]["freed_at"]["s"] for name in ("temp", "once", "scratch")]
    assert seconds == sorted(seconds)


STRATEGY_TOKENS = """
    import gc
    import json
    import weakref

    import tensorflow as tf
    from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher


    def tokens():  # TensorFlow's own variables: each live all-reduce launcher's ordering token
        return [o._ordering_token for o in gc.get_objects()
                if isinstance(o, CollectiveReplicaLauncher) and o._ordering_token is not None]


    # As the distributed training guide does: a strategy made, then its name taken by the next
    # one (its tokens dropped before any function used them); the last one runs nothing either.
    mirrored_strategy = tf.distribute.MirroredStrategy()
    first = tokens()
    refs = [weakref.ref(t) for t in first]
    print("TRUTH", json.dumps({"first": [t.device for t in first]}))
    del first
    mirrored_strategy = tf.distribute.MirroredStrategy()
    gc.collect()
    second = [t for t in tokens() if not any(t is r() for r in refs)]
    print("TRUTH", json.dumps({"dropped": [r() is None for r in refs], "second": [t.device for t in second]}))
    del second
"""


def test_a_dropped_strategys_collective_tokens_are_reported_freed_and_a_live_ones_unused_ones_too(tmp_path):
    """TensorFlow's own variables (made past tf.Variable, by the strategy's all-reduce launchers)
    from their creation: the first strategy's freed with it, the second's live though no function
    used them; each from the program's line that made its strategy, under no strategy's scope."""
    out = tmp_path / "out"
    program = write(tmp_path, "tokens.py", STRATEGY_TOKENS)
    proc = trace(["--gpus", "2", str(program)], cwd=tmp_path, out=out)
    p = placement(out, sized=False)
    told = truth(proc)
    assert told["dropped"] == [True] * len(told["first"]) and len(told["first"]) == len(told["second"]) == REPLICAS
    internal = [v for v in p["variables"] if v["class"] == "internal"]
    assert len(p["variables"]) == len(internal) == 2 * REPLICAS
    lines = textwrap.dedent(STRATEGY_TOKENS).splitlines()
    made = [i + 1 for i, line in enumerate(lines) if line == "mirrored_strategy = tf.distribute.MirroredStrategy()"]
    for key, line, freed in (("first", made[0], True), ("second", made[1], False)):
        rows = [v for v in internal if v["created"]["source"] == f"{program}:{line}"]
        assert sorted(d for v in rows for d in v["devices"]) == sorted(short(d) for d in told[key]), key
        assert [bool(v.get("freed")) for v in rows] == [freed] * REPLICAS, key
        assert {v["created"]["strategy"] for v in rows} == {None}
        assert {v["created"]["requested"] for v in rows} == {""}
    assert p["variable_updates"]["freed_variables"] == REPLICAS
    assert "variables  : 0 (none; +2 internal, TensorFlow's own (and 2 freed before the end)); " in proc.stdout


PS_SLOTS = """
    import json
    import socket
    import sys

    import keras
    import tensorflow as tf


    TAKEN = set()  # a port the kernel frees may come back from the next bind: never one twice


    def free_port():
        while True:
            with socket.socket() as s:
                s.bind(("localhost", 0))
                port = s.getsockname()[1]
            if port not in TAKEN:
                TAKEN.add(port)
                return port


    # The "Parameter server training" guide's in-process cluster, one worker and one ps.
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{free_port()}"], "ps": [f"localhost:{free_port()}"]})
    tf.distribute.Server(spec, job_name="worker", task_index=0, protocol="grpc",
                         config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2))
    tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        opt = keras.optimizers.Adam()
        if sys.argv[1] == "build":
            opt.build(model.trainable_variables)


    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.ones([2, 4])))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        strategy.run(replica)


    for _ in range(2):
        coordinator.schedule(step)
    coordinator.join()
    print("TRUTH", json.dumps({v.path: v.value.device for v in opt.variables
                               if v.path.endswith(("_momentum", "_velocity"))}))
"""


@pytest.mark.parametrize("build", ["lazy", "build"])
def test_keras_slots_made_inside_a_parameter_server_step_stay_on_the_coordinator_until_built_in_scope(build, tmp_path):
    """Keras 3 makes Adam's slots at the first apply_gradients, inside the step; under the guide's
    ParameterServerStrategy they land where TensorFlow says (the program prints each slot's device):
    the coordinator's. The report says so and how to fix it: `optimizer.build` in the strategy's
    scope, after which TensorFlow puts every slot on the ps and nothing is left to change."""
    from pinpoint.placement.analysis.conformance import LAZY_SLOT_FIX
    from pinpoint.placement.model.placement import Placement
    from pinpoint.placement.report.findings import findings
    from pinpoint.trace.created import OPTIMIZER_APPLY

    proc = trace([str(write(tmp_path, "ps.py", textwrap.dedent(PS_SLOTS))), build], cwd=tmp_path,
                 out=tmp_path / "out")
    slots = truth(proc)
    p = placement(tmp_path / "out")
    task = {dev: re.sub(r"/replica:0|device:", "", dev) for dev in slots.values()}  # the report's spelling
    ours = {v["name"]: (v["devices"], (v.get("created") or {}).get("by")) for v in p["variables"] if v["name"] in slots}
    fixes = [f.fix for f in findings(Placement.from_json(p)) if f.kind == "plan not obeyed"]
    assert ({dev.split("/")[1] for dev in slots.values()}, len(slots), ours, fixes) == (
        {"job:chief" if build == "lazy" else "job:ps"}, 4,
        {name: ([task[dev]], OPTIMIZER_APPLY if build == "lazy" else None) for name, dev in slots.items()},
        [LAZY_SLOT_FIX] if build == "lazy" else [])


# ---- every read counted, however the variable reaches the op (issue 67, point 2) ---------------
READS = """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    with tf.device("/CPU:1"):
        v = tf.Variable([1.0, 5.0, 2.0])
    w = tf.Variable([[1.0], [2.0], [3.0]])
    i = tf.Variable(3)
    # Passed straight to ops: TensorFlow's C fast path reads them, unseen by an op callback.
    print(tf.math.argmax(v).numpy(), (v == v).numpy(), tf.math.reduce_sum(v).numpy())
    print(tf.concat([v, v], 0).numpy(), tf.add_n([v, v]).numpy(), tf.matmul(tf.reshape(v, [1, 3]), w).numpy())
    print(tf.math.maximum(v, 0.0).numpy(), tf.cast(v, tf.int32).numpy(), tf.range(i).numpy(), tf.one_hot(i, 4).numpy())
    with tf.device("/CPU:0"):  # a read runs on its variable's device, whatever the scope asks
        print(tf.math.square(v).numpy(), (v * 2.0).numpy(), tf.convert_to_tensor(v).numpy())
    v.assign_add([1.0, 1.0, 1.0])
    print(v.numpy(), w.numpy())
"""


def _logged_reads(script, cwd) -> dict:
    """ReadVariableOps per device as TensorFlow's placement log gives them, the program run by python."""
    import os
    import subprocess
    import sys

    code = f"import tensorflow as tf; tf.debugging.set_log_device_placement(True); exec(open({str(script)!r}).read())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict = {}
    for device in re.findall(r"Executing op ReadVariableOp in device \S+device:(\S+)", proc.stderr):
        found[f"/{device}"] = found.get(f"/{device}", 0) + 1
    return found


def test_every_read_is_counted_however_the_variable_reaches_the_op(tmp_path):
    script = write(tmp_path, "reads.py", READS)
    trace([str(script)], cwd=tmp_path, out=tmp_path / "out")
    by_device = placement(tmp_path / "out")["eager"]["op_types_by_device"]
    ours = {d: types["ReadVariableOp"] for d, types in by_device.items() if "ReadVariableOp" in types}
    assert ours == _logged_reads(script, tmp_path)


# TensorFlow's distributed save-and-load tutorial (site/en/tutorials/distribute/save_and_load.ipynb),
# in its shape: a Keras model under MirroredStrategy saved and loaded the Keras way, then saved with
# tf.saved_model.save and loaded for inference, also under another strategy; synthetic digits.
SAVE_AND_LOAD = """
    import numpy as np
    import tensorflow as tf

    mirrored_strategy = tf.distribute.MirroredStrategy()


    def get_data():
        rng = np.random.default_rng(0)
        ds = tf.data.Dataset.from_tensor_slices((rng.random((128, 28, 28, 1)).astype("float32"),
                                                 rng.integers(0, 10, 128).astype("int64")))
        return ds.batch(64), ds.batch(64)


    def get_model():
        with mirrored_strategy.scope():
            model = tf.keras.Sequential([
                tf.keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
                tf.keras.layers.MaxPooling2D(), tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
            model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          optimizer="adam", metrics=["accuracy"])
            return model


    model = get_model()
    train_dataset, eval_dataset = get_data()
    model.fit(train_dataset, epochs=1, verbose=0)
    model.save("keras_save.keras")
    tf.keras.models.load_model("keras_save.keras").fit(train_dataset, epochs=1, verbose=0)
    model = get_model()
    tf.saved_model.save(model, "tf_save")
    loaded = tf.saved_model.load("tf_save")
    for batch in eval_dataset.map(lambda image, label: image).take(1):
        loaded.signatures["serving_default"](batch)
    with tf.distribute.MirroredStrategy().scope():
        loaded = tf.saved_model.load("tf_save")
"""


def test_the_save_and_load_tutorial_reports_no_variable_without_a_device(tmp_path):
    """tf.saved_model.save copies the model's variables into the graph it exports; nothing runs that
    graph, so those copies were never made on a device and are not reported (they were, as
    `Variable`, `Variable_1` ... with no device). Every variable reported has a device."""
    out = tmp_path / "out"
    trace(["--gpus", "2", str(write(tmp_path, "save_load.py", SAVE_AND_LOAD))], cwd=tmp_path, out=out)
    p = placement(out, sized=False)
    assert [v["name"] for v in p["variables"] if not v["devices"]] == []
