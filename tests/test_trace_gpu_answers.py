"""Under `pinpoint trace --gpus N` a program gets the GPU machine's answers (issue 48, point 4):
what tf.config, tf.test and Keras ask about devices, the device settings a GPU machine takes or
refuses, a GPU index the machine lacks, and Keras' own XLA choice, which the report then shows
as one XLA cluster. Each program runs for real under `pinpoint trace`; the expected answers come
from TensorFlow (a plain-`python` run, its source, Keras' rule) or from arithmetic."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from tests import zygote
from tests.test_trace import placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FIT = """
    import json, sys

    import numpy as np
    import keras

    x = np.linspace(0, 1, 64 * 8, dtype="float32").reshape(64, 8)
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")  # jit_compile="auto": Keras asks which devices exist
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    json.dump({"jit_compile": model.jit_compile}, open(sys.argv[1], "w"))
"""


# How a report states an XLA cluster, for a traced program and a config run alike (the config
# path's test, tests/test_placement.py, checks its notes against the same pattern).
XLA_NOTE = re.compile(r"1 call\(s\) compiled by XLA \(\S+ on /GPU:0\): each runs as one XLA cluster, one program on "
                      r"its device; ops inside an XLA cluster have no per-op placement, so its ops are listed on the "
                      r"cluster's device .*")


def _plain(script, *args, allocator_stats: bool = False) -> subprocess.CompletedProcess:
    """The program under plain `python` on this CPU-only machine (TensorFlow's own answers).
    `allocator_stats`: with the host's BFC allocator, which keeps stats as a GPU's does (the default
    host allocator keeps none on a CPU without oneDNN's)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **({"TF_CPU_ALLOCATOR_USE_BFC": "true"} if allocator_stats else {})}
    proc = zygote.python([sys.executable, str(script), *map(str, args)], cwd=os.getcwd(), env=env, timeout=300,
                         preload=zygote.TENSORFLOW)  # forked from a process with TensorFlow imported
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fit")
    script = write(folder, "fit.py", FIT)
    proc = trace(["--gpus", "1", str(script), str(folder / "traced.json")], cwd=folder, out=folder / "out")
    _plain(script, folder / "plain.json")
    return (json.loads((folder / "traced.json").read_text()), json.loads((folder / "plain.json").read_text()),
            placement(folder / "out"), proc.stdout)


def test_keras_compiles_fit_with_xla_on_the_emulated_gpu_as_on_a_gpu_machine(fit):
    traced, plain, _, _ = fit
    # Keras' rule (Trainer._resolve_auto_jit_compile): XLA when a device other than a CPU exists and
    # no tf.distribute strategy is used. The CPU-only machine itself answers False.
    assert plain == {"jit_compile": False}
    assert traced == {"jit_compile": True}


def test_the_xla_cluster_is_reported_with_its_device_and_no_per_op_placement(fit):
    _, _, p, summary = fit
    train = next(f for f in p["functions"] if f["training"])
    assert train["name"] == "multi_step_on_iterator"
    assert list(train["ops_by_device"]) == ["/GPU:0"]  # the cluster's ops, all on its one device
    # Dense(16) and Dense(1): two forward MatMuls; backward, each kernel's gradient, and the input
    # gradient of the second layer only (the model's input needs none): 2 + 2 + 1.
    assert p["op_types_by_device"]["/GPU:0"]["MatMul"] == 5
    xla = [n for n in p["notes"] if "compiled by XLA" in n]
    assert len(xla) == 1 and XLA_NOTE.fullmatch(xla[0]), xla
    assert "(__inference_one_step_on_data_" in xla[0]  # Keras' compiled train step
    assert f"note       : {xla[0]}" in summary
    # Every weight and the optimizer's state is updated inside the cluster: each update still leads
    # back to its variable (2 layers x kernel and bias, each with Adam's two moments: 4 + 8).
    assert "updates attributed for 16/16 variables" in summary


JIT = """
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def dense(x):
        return tf.reduce_sum(tf.square(x) * 2.0)

    @tf.function
    def step():
        with tf.device("/CPU:0"):
            x = tf.random.uniform((256,), seed=1)  # made on the host
        return dense(x)  # its XLA cluster runs on the default device, /GPU:0

    for _ in range(3):
        step()
"""


def test_an_xla_cluster_is_reported_with_its_device_and_its_transfers(tmp_path):
    script = write(tmp_path, "jit.py", JIT)
    proc = trace(["--gpus", "1", str(script)], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out")
    (note,) = [n for n in p["notes"] if "compiled by XLA" in n]
    assert XLA_NOTE.fullmatch(note) and "(__inference_dense_" in note
    assert {"Square", "Mul", "Sum"} <= set(p["op_types_by_device"]["/GPU:0"])  # the cluster's ops, on its device
    # Its one input crosses from the host each step: 256 float32.
    assert p["transfers"]["matrix"] == {"/CPU:0": {"/GPU:0": {"count": 1, "bytes": 256 * 4}}}
    assert "transfers  : 1 per step, 1.0 KiB per step" in proc.stdout


LISTINGS = """
    import json, sys

    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    details = tf.config.experimental.get_device_details(gpus[0])
    cc = details["compute_capability"]
    out = {
        "physical": [d.name for d in tf.config.list_physical_devices()],
        "physical_gpu": [d.name for d in gpus],
        "physical_cpu": [d.name for d in tf.config.list_physical_devices("CPU")],
        "logical": [d.name for d in tf.config.list_logical_devices()],
        "logical_gpu": [d.name for d in tf.config.list_logical_devices("GPU")],
        "logical_cpu": [d.name for d in tf.config.list_logical_devices("CPU")],
        "visible_gpu": [d.name for d in tf.config.get_visible_devices("GPU")],
        "capability": list(cc),
        "available": tf.test.is_gpu_available(),
        "available_at_its_capability": tf.test.is_gpu_available(min_cuda_compute_capability=tuple(cc)),
        "available_above_it": tf.test.is_gpu_available(min_cuda_compute_capability=(cc[0] + 1, 0)),
        "gpu_device_name": tf.test.gpu_device_name(),
        "built_with_cuda": tf.test.is_built_with_cuda(),
        "built_with_gpu_support": tf.test.is_built_with_gpu_support(),
        "memory_keys": sorted(tf.config.experimental.get_memory_info("GPU:1")),
    }
    json.dump(out, open(sys.argv[1], "w"))
"""

BUILD = """
    import json, sys

    import tensorflow as tf

    json.dump({"built_with_cuda": tf.test.is_built_with_cuda(),
               "built_with_gpu_support": tf.test.is_built_with_gpu_support(),
               "capabilities": tf.sysconfig.get_build_info().get("cuda_compute_capabilities", []),
               "memory_keys": sorted(tf.config.experimental.get_memory_info("CPU:0"))},
              open(sys.argv[1], "w"))
"""


def test_device_listings_and_gpu_queries_answer_as_the_two_gpu_machine(tmp_path):
    script = write(tmp_path, "listings.py", LISTINGS)
    # The host's BFC allocator in both runs: it keeps the stats get_memory_info returns, as a GPU's
    # does (TensorFlow's default host allocator keeps none on a CPU without AVX-512; docs/trace.md).
    trace(["--gpus", "2", str(script), str(tmp_path / "answers.json")], cwd=tmp_path, out=tmp_path / "out",
          env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})
    got = json.loads((tmp_path / "answers.json").read_text())
    build = write(tmp_path, "build.py", BUILD)
    _plain(build, tmp_path / "build.json", allocator_stats=True)
    tf_build = json.loads((tmp_path / "build.json").read_text())

    gpus = [f"/physical_device:GPU:{i}" for i in range(2)]
    assert got["physical"] == ["/physical_device:CPU:0", *gpus]
    assert (got["physical_gpu"], got["physical_cpu"], got["visible_gpu"]) == (gpus, ["/physical_device:CPU:0"], gpus)
    assert got["logical"] == ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1"]
    assert (got["logical_gpu"], got["logical_cpu"]) == (["/device:GPU:0", "/device:GPU:1"], ["/device:CPU:0"])
    # The capability is one this TensorFlow was built for (sm_80 -> (8, 0)), and is_gpu_available
    # compares against it as TensorFlow does.
    built = {tuple(int(c) for c in re.findall(r"\d", s)[:2]) for s in tf_build["capabilities"]}
    assert tuple(got["capability"]) in built
    assert (got["available"], got["available_at_its_capability"], got["available_above_it"]) == (True, True, False)
    assert got["gpu_device_name"] == "/device:GPU:0"
    assert (got["built_with_cuda"], got["built_with_gpu_support"]) == (tf_build["built_with_cuda"],
                                                                      tf_build["built_with_gpu_support"])
    assert got["memory_keys"] == tf_build["memory_keys"]  # a device's memory info, as TensorFlow gives one


SETTINGS = """
    import json, sys

    import tensorflow as tf

    out = {}
    gpus = tf.config.list_physical_devices("GPU")
    out["growth_at_start"] = tf.config.experimental.get_memory_growth(gpus[0])
    tf.config.experimental.set_memory_growth(gpus[0], True)  # before any use: taken
    out["growth_set"] = tf.config.experimental.get_memory_growth(gpus[0])
    limit = [tf.config.LogicalDeviceConfiguration(memory_limit=1024)]
    tf.config.set_logical_device_configuration(gpus[1], limit)  # before any use: taken
    out["virtual_set"] = [c.memory_limit for c in tf.config.get_logical_device_configuration(gpus[1])]
    tf.config.set_visible_devices(gpus[:1], "GPU")  # before any use: taken
    out["visible_set"] = [d.name for d in tf.config.get_visible_devices()]

    x = tf.constant([1.0, 2.0]) * 2.0  # the program uses the devices

    def refused(call):
        try:
            call()
        except RuntimeError as err:
            return str(err)
        return None

    out["growth_after_use"] = refused(lambda: tf.config.experimental.set_memory_growth(gpus[0], False))
    out["virtual_after_use"] = refused(lambda: tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=512)]))
    out["visible_after_use"] = refused(lambda: tf.config.set_visible_devices(gpus, "GPU"))
    out["same_growth_after_use"] = refused(lambda: tf.config.experimental.set_memory_growth(gpus[0], True))
    json.dump(out, open(sys.argv[1], "w"))
"""

# TensorFlow's own refusal on this CPU-only machine, for the setting it can make here.
PLAIN_REFUSAL = """
    import sys

    import tensorflow as tf

    tf.constant(1.0)
    try:
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError as err:
        print(err)
"""


def _refusal(method) -> str:
    """The RuntimeError text of a TensorFlow Context setter, read from its source."""
    return re.search(r'RuntimeError\(\s*"([^"]+)"', inspect.getsource(method)).group(1)


def test_device_settings_are_taken_before_use_and_refused_after_with_tensorflows_error(tmp_path):
    from tensorflow.python.eager.context import Context

    script = write(tmp_path, "settings.py", SETTINGS)
    trace(["--gpus", "2", str(script), str(tmp_path / "answers.json")], cwd=tmp_path, out=tmp_path / "out")
    got = json.loads((tmp_path / "answers.json").read_text())
    virtual = _plain(write(tmp_path, "plain.py", PLAIN_REFUSAL)).stdout.strip().splitlines()[-1]

    assert (got["growth_at_start"], got["growth_set"], got["virtual_set"]) == (None, True, [1024])
    assert got["visible_set"] == ["/physical_device:CPU:0", "/physical_device:GPU:0"]
    assert got["virtual_after_use"] == virtual == _refusal(Context.set_logical_device_configuration)
    assert got["growth_after_use"] == _refusal(Context.set_memory_growth)
    assert got["visible_after_use"] == _refusal(Context.set_visible_devices)
    assert got["same_growth_after_use"] is None  # unchanged: TensorFlow returns without a check
    notes = placement(tmp_path / "out")["notes"]
    assert [n.split(":")[1].strip() for n in notes if n.startswith("emulation: set_")] == [
        "set_memory_growth", "set_logical_device_configuration", "set_visible_devices"]  # taken; the refusals raised


MISSING_INDEX = """
    import json, sys

    import tensorflow as tf

    with tf.device("/device:GPU:2"):  # a machine with two GPUs has /GPU:0 and /GPU:1
        x = tf.constant([1.0, 2.0, 3.0])
        y = x * 2.0

    @tf.function
    def step(v):
        with tf.device("/GPU:2"):
            return tf.square(v)

    step(y)
    json.dump({"y": y.numpy().tolist()}, open(sys.argv[1], "w"))
"""


def test_a_missing_gpu_index_runs_where_soft_placement_puts_it_and_is_shown_as_written(tmp_path):
    script = write(tmp_path, "missing.py", MISSING_INDEX)
    proc = trace(["--gpus", "2", str(script), str(tmp_path / "y.json")], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out")
    assert json.loads((tmp_path / "y.json").read_text()) == {"y": [2.0, 4.0, 6.0]}
    # Eagerly, TensorFlow's soft placement takes the best device by type priority: /GPU:0.
    assert p["eager"]["op_types_by_device"]["/GPU:0"].get("Mul") == 1
    assert all("Mul" not in t for d, t in p["eager"]["op_types_by_device"].items() if d != "/GPU:0")
    # In a function its placer takes the function's own device first: step runs on /GPU:0.
    step = next(f for f in p["functions"] if f["name"] == "step")
    assert list(step["ops_by_device"]) == ["/GPU:0"]
    assert [(f["op"], f["requested"], f["requested_physical"], f["placed"], f["reason"]) for f in p["fallbacks"]] == [
        ("Square", "/GPU:2", "/GPU:2", "/GPU:0", "requested device does not exist")]
    assert {r["rule"]: r["observed"] for r in p["conformance"]["rules"]} == {"tf.device /GPU:2": {"/GPU:0": 1}}
    shown = (tmp_path / "out" / "report.html").read_text() + json.dumps(p) + proc.stdout
    assert "/CPU:3" not in shown  # never the emulation's internal name for the missing GPU
    assert "fallbacks  : 1: Square /GPU:2->/GPU:0" in proc.stdout
    assert [n for n in p["notes"] if "/GPU:2" in n] == [
        "emulation: the program requested /GPU:2, which a machine with 2 GPU(s) does not have: soft placement runs "
        "it where a GPU machine's placer does (the request's type and index dropped): an eager op on /GPU:0, an op "
        "in a tf.function on the function's own device; those ops are fallbacks from /GPU:2"]


OWN_CPUS = """
    import json, sys

    import tensorflow as tf

    # As TensorFlow's distributed-input guide does: split the host CPU before using it.
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(2)])
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    with tf.device("/CPU:1"):
        v = tf.Variable([1.0, 2.0])
        x = tf.constant([1.0, 2.0]) * 2.0
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable(3.0)


    @tf.function
    def step(a):
        with tf.device("/CPU:1"):
            b = tf.square(a)
        with tf.device("/CPU:2"):  # a CPU the program did not configure: soft-placed
            total = tf.reduce_sum(a)
        v.assign_add(b)
        return strategy.run(lambda: w * 2.0), total


    if len(sys.argv) > 2:  # plain TensorFlow: where its runtime placed step's ops (the partition graphs it ran)
        from tensorflow.python.eager import context

        context.context().enable_graph_collection()
    step(x)
    placed = {}
    if len(sys.argv) > 2:
        for fg in context.context().export_run_metadata().function_graphs:
            for graph in fg.partition_graphs:
                for node in graph.node:
                    if node.op not in ("_Send", "_Recv", "_Arg", "_Retval"):
                        kinds = placed.setdefault("/CPU:" + node.device.rsplit(":", 1)[1], {})
                        kinds[node.op] = kinds.get(node.op, 0) + 1
    json.dump({"cpus": names, "v": v.device, "x": x.device, "w": [c.device for c in w.values],
               "replicas": strategy.extended.worker_devices, "value": v.numpy().tolist()}, open(sys.argv[1], "w"))
    if placed:
        json.dump(placed, open(sys.argv[1] + ".placed", "w"))
"""


def test_a_programs_own_logical_cpus_are_its_own_devices_as_on_a_gpu_machine(tmp_path):
    script = write(tmp_path, "own_cpus.py", OWN_CPUS)
    proc = trace(["--gpus", "2", str(script), str(tmp_path / "traced.json")], cwd=tmp_path, out=tmp_path / "out")
    _plain(script, tmp_path / "plain.json", "plain")
    # The program lists, runs on and reads back the devices plain TensorFlow gives it: its /CPU:1
    # is a logical CPU of its own (runtime name and all), not an emulated GPU.
    assert json.loads((tmp_path / "traced.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    plain = json.loads((tmp_path / "plain.json.placed").read_text())
    p = placement(tmp_path / "out")
    # step's ops on /CPU:1, as TensorFlow's runtime placed them (the request, the variable's update
    # and replica 1 of the strategy).
    assert p["op_types_by_device"]["/CPU:1"] == plain["/CPU:1"]
    assert p["eager"]["op_types_by_device"]["/CPU:1"]["Mul"] == 1
    assert sorted((v["name"], [c["device"] for c in v["components"]]) for v in p["variables"]
                  if v["name"] == "Variable") == [
        ("Variable", ["/CPU:0"]), ("Variable", ["/CPU:0", "/CPU:1"]), ("Variable", ["/CPU:1"]), ("Variable", ["/CPU:1"])]
    rules = {r["rule"]: r["observed"] for r in p["conformance"]["rules"]}
    assert rules["strategy.replica_1_compute"] == {"/CPU:1": 2} and rules["tf.device /CPU:1"] == {"/CPU:1": 2}
    # /CPU:2 exists nowhere: TensorFlow's placer drops its type and index and takes the function's
    # own device, /CPU:0 under plain TensorFlow, /GPU:0 on the GPU machine (colocation_graph.cc).
    assert plain["/CPU:0"]["Sum"] == 1
    assert [(f["op"], f["requested"], f["placed"]) for f in p["fallbacks"]] == [
        ("Const", "/CPU:2", "/GPU:0"), ("Sum", "/CPU:2", "/GPU:0")]
    shown = (tmp_path / "out" / "report.html").read_text() + json.dumps(p) + proc.stdout
    assert "/CPU:1002" not in shown  # never the emulation's internal name for the missing CPU
    assert [n for n in p["notes"] if "CPU" in n and n.startswith("emulation:")] == [
        "emulation: the program requested /CPU:2, but it has 2 logical CPU(s): soft placement runs it where a GPU "
        "machine's placer does (the request's type and index dropped): an eager op on /GPU:0, an op in a tf.function "
        "on the function's own device; those ops are fallbacks from /CPU:2"]


LSTM_FIT = """
import numpy as np, tensorflow as tf, keras
x = np.random.rand(64, 8, 4).astype("float32")
y = np.random.randint(0, 3, 64)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
with tf.distribute.MirroredStrategy().scope():
    model = keras.Sequential([keras.Input((8, 4)), keras.layers.LSTM(8, return_sequences=True),
                              keras.layers.GRU(4), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, epochs=1, verbose=0)
print("trained")
"""


def test_an_lstm_runs_on_emulated_gpus_with_keras_generic_kernels_and_says_so(tmp_path):
    """Keras picks cuDNN's fused kernel when a GPU exists; it has no CPU kernel, so on emulated GPUs the
    program would fail where a GPU machine runs it. It trains, the generic kernels on the replicas,
    and the report says what the GPU machine would run instead."""
    proc = trace(["--gpus", "2", str(write(tmp_path, "lstm.py", LSTM_FIT))], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out", sized=False)
    types = {t for dev in ("/GPU:0", "/GPU:1") for t in p["op_types_by_device"].get(dev, {})}
    assert ("trained" in proc.stdout, "CudnnRNNV3" in types, "While" in types or "Enter" in types) == (True, False, True)
    assert any("a GPU machine runs each as one cuDNN kernel (CudnnRNNV3)" in n for n in p["notes"])
