"""TensorFlow's own guides, run verbatim in their shapes under `pinpoint trace`: the program ends
as it does under plain `python` (its exit code and its printed lines), and placement.json is
written. Truth is the same program run by python."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import zygote

pytestmark = pytest.mark.integration

# site/en/guide/random_numbers.ipynb, its code cells in order (three logical CPUs, generators made
# outside, inside and per replica of MirroredStrategy, split, reset, in a tf.function).
RANDOM_NUMBERS = '''
import tensorflow as tf

physical_devices = tf.config.list_physical_devices("CPU")
tf.config.experimental.set_virtual_device_configuration(
    physical_devices[0], [tf.config.experimental.VirtualDeviceConfiguration()] * 3)

g1 = tf.random.Generator.from_seed(1)
print(g1.normal(shape=[2, 3]))
g2 = tf.random.get_global_generator()
print(g2.normal(shape=[2, 3]))
print(tf.random.uniform([5], seed=1))
g1 = tf.random.Generator.from_seed(1, alg="philox")
print(g1.normal(shape=[2, 3]))
g = tf.random.Generator.from_non_deterministic_state()
print(g.normal(shape=[2, 3]))
g = tf.random.Generator.from_seed(1)
print(g.normal([]))
print(g.normal([]))
g.reset_from_seed(1)
print(g.normal([]))
g = tf.random.Generator.from_seed(1)
print(g.normal([]))
new_gs = g.split(3)
for new_g in new_gs:
    print(new_g.normal([]))
print(g.normal([]))
with tf.device("cpu"):
    g = tf.random.get_global_generator().split(1)[0]
    print(g.normal([]))

g = tf.random.Generator.from_seed(1)


@tf.function
def foo():
    return g.normal([])


print(foo())

strat = tf.distribute.MirroredStrategy(devices=["cpu:0", "cpu:1"])
with strat.scope():
    g = tf.random.Generator.from_seed(1)
    print(strat.experimental_local_results(g.split(2)))
    print(strat.experimental_local_results(g.split(2)))

strat = tf.distribute.MirroredStrategy(devices=["cpu:0", "cpu:1"])
with strat.scope():
    g = tf.random.Generator.from_seed(1)

    def f():
        return g.normal([])

    results = strat.run(f).values
    print(results)

strat = tf.distribute.MirroredStrategy(devices=["cpu:0", "cpu:1"])
with strat.scope():
    def f():
        g = tf.random.Generator.from_seed(1)
        a = g.normal([])
        b = g.normal([])
        return tf.stack([a, b])

    print(strat.run(f))
    print(strat.run(f))

print(tf.random.stateless_normal(shape=[2, 3], seed=[1, 2]))
'''


def _run(cmd, cwd) -> subprocess.CompletedProcess:
    """`cmd` (python with a script, or Pinpoint's command line) as a process of its own would run it,
    forked from a process that has imported TensorFlow (tests/zygote.py; Pinpoint too for its runs)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    preload = zygote.PINPOINT if "pinpoint.cli" in cmd else zygote.TENSORFLOW
    return zygote.python(cmd, cwd=cwd, env=env, timeout=600, preload=preload)


def _printed(stdout: str) -> list[str]:
    """The program's own lines (Pinpoint's summary and 'Run folder' lines left out)."""
    lines = stdout.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith(("== pinpoint summary", "Run folder:"))), len(lines))
    return lines[:end]


@pytest.mark.parametrize("gpus", [[], ["--gpus", "2"]], ids=["no-gpus", "gpus-2"])
def test_the_random_numbers_guide_ends_as_under_python(tmp_path, gpus):
    (tmp_path / "random_numbers.py").write_text(RANDOM_NUMBERS)
    plain = _run([sys.executable, "random_numbers.py"], tmp_path)
    traced = _run([sys.executable, "-m", "pinpoint.cli", "trace", "--out", "run", "--no-tracking", *gpus,
                   "random_numbers.py"], tmp_path)
    assert (traced.returncode, "Traceback" in traced.stderr) == (plain.returncode, "Traceback" in plain.stderr), \
        traced.stderr[-3000:]
    assert len(_printed(traced.stdout)) == len(plain.stdout.splitlines())
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    assert placement["program"] == "random_numbers.py"


# site/en/guide/variable.ipynb, its code cells in order (the GPU request spelled '/GPU:0', as the
# oracle's rewrite reads it). Its variables reach ops every way: .numpy(), convert_to_tensor,
# passed straight to argmax and ==, reshape, arithmetic.
VARIABLES = '''
import tensorflow as tf

my_tensor = tf.constant([[1.0, 2.0], [3.0, 4.0]])
my_variable = tf.Variable(my_tensor)
bool_variable = tf.Variable([False, False, False, True])
complex_variable = tf.Variable([5 + 4j, 6 + 1j])
print("Shape: ", my_variable.shape)
print("DType: ", my_variable.dtype)
print("As NumPy: ", my_variable.numpy())
print("A variable:", my_variable)
print("\\nViewed as a tensor:", tf.convert_to_tensor(my_variable))
print("\\nIndex of highest value:", tf.math.argmax(my_variable))
print("\\nCopying and reshaping: ", tf.reshape(my_variable, [1, 4]))
a = tf.Variable([2.0, 3.0])
a.assign([1, 2])
try:
    a.assign([1.0, 2.0, 3.0])
except Exception as e:
    print(f"{type(e).__name__}: {e}")
a = tf.Variable([2.0, 3.0])
b = tf.Variable(a)
a.assign([5, 6])
print(a.numpy())
print(b.numpy())
print(a.assign_add([2, 3]).numpy())
print(a.assign_sub([7, 9]).numpy())
a = tf.Variable(my_tensor, name="Mark")
b = tf.Variable(my_tensor + 1, name="Mark")
print(a == b)
step_counter = tf.Variable(1, trainable=False)
with tf.device("CPU:0"):
    a = tf.Variable([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    c = tf.matmul(a, b)
print(c)
with tf.device("CPU:0"):
    a = tf.Variable([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = tf.Variable([[1.0, 2.0, 3.0]])
with tf.device("/GPU:0"):
    k = a * b
print(k)
'''


def _oracle_reads(program, cwd) -> dict:
    """ReadVariableOps per device as TensorFlow logs them on the GPU machine the oracle stands in
    for (tests/oracle.py: /CPU:1 and /CPU:2 for /GPU:0 and /GPU:1, the body under /GPU:0)."""
    import re

    oracle = os.path.join(os.path.dirname(__file__), "oracle.py")
    proc = zygote.python([sys.executable, oracle, "placement", str(program), str(cwd / "oracle.json")], cwd=cwd,
                         timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}, preload=zygote.TENSORFLOW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    inside = proc.stderr.split("ORACLE-BEGIN", 1)[1].split("ORACLE-END", 1)[0]
    names = {"CPU:0": "/CPU:0", "CPU:1": "/GPU:0", "CPU:2": "/GPU:1"}
    found: dict = {}
    for device in re.findall(r"Executing op ReadVariableOp in device \S+device:(\S+)", inside):
        found[names[device]] = found.get(names[device], 0) + 1
    return found


def test_the_variables_guide_ends_as_under_python_and_counts_every_read_as_tensorflow(tmp_path):
    (tmp_path / "variables.py").write_text(VARIABLES)
    plain = _run([sys.executable, "variables.py"], tmp_path)
    traced = _run([sys.executable, "-m", "pinpoint.cli", "trace", "--out", "run", "--no-tracking", "--gpus", "2",
                   "variables.py"], tmp_path)
    assert (traced.returncode, plain.returncode) == (0, 0), traced.stderr[-3000:]
    assert len(_printed(traced.stdout)) == len(plain.stdout.splitlines())
    eager = json.loads((tmp_path / "run" / "placement.json").read_text())["eager"]
    ours = {d: types["ReadVariableOp"] for d, types in eager["op_types_by_device"].items() if "ReadVariableOp" in types}
    assert ours == _oracle_reads(tmp_path / "variables.py", tmp_path)


# site/en/tutorials/customization/basics.ipynb, its code cells in order: it asks whether a tensor is
# on GPU #0 and asserts that tensors made under tf.device("GPU:0") are, by their device's name.
EAGER_BASICS = '''
import tempfile
import time

import numpy as np
import tensorflow as tf

print(tf.math.add(1, 2))
print(tf.math.add([1, 2], [3, 4]))
print(tf.math.square(5))
print(tf.math.reduce_sum([1, 2, 3]))
print(tf.math.square(2) + tf.math.square(3))
x = tf.linalg.matmul([[1]], [[2, 3]])
print(x)
print(x.shape)
print(x.dtype)
ndarray = np.ones([3, 3])
print("TensorFlow operations convert numpy arrays to Tensors automatically")
tensor = tf.math.multiply(ndarray, 42)
print(tensor)
print("And NumPy operations convert Tensors to NumPy arrays automatically")
print(np.add(tensor, 1))
print("The .numpy() method explicitly converts a Tensor to a numpy array")
print(tensor.numpy())
x = tf.random.uniform([3, 3])
print("Is there a GPU available: "),
print(tf.config.list_physical_devices("GPU"))
print("Is the Tensor on GPU #0:  "),
print(x.device.endswith("GPU:0"))


def time_matmul(x):
    start = time.time()
    for loop in range(10):
        tf.linalg.matmul(x, x)
    result = time.time() - start
    print("10 loops: {:0.2f}ms".format(1000 * result))


print("On CPU:")
with tf.device("CPU:0"):
    x = tf.random.uniform([1000, 1000])
    assert x.device.endswith("CPU:0")
    time_matmul(x)
if tf.config.list_physical_devices("GPU"):
    print("On GPU:")
    with tf.device("GPU:0"):
        x = tf.random.uniform([1000, 1000])
        assert x.device.endswith("GPU:0")
        time_matmul(x)
ds_tensors = tf.data.Dataset.from_tensor_slices([1, 2, 3, 4, 5, 6])
_, filename = tempfile.mkstemp()
with open(filename, "w") as f:
    f.write("Line 1\\nLine 2\\nLine 3\\n  ")
ds_file = tf.data.TextLineDataset(filename)
ds_tensors = ds_tensors.map(tf.math.square).shuffle(2).batch(2)
ds_file = ds_file.batch(2)
print("Elements of ds_tensors:")
for x in ds_tensors:
    print(x)
print("\\nElements in ds_file:")
for x in ds_file:
    print(x)
'''

# What a machine with two GPUs prints from "Is there a GPU available" to the GPU's timing.
EAGER_BASICS_ON_GPUS = [
    "Is there a GPU available: ",
    "[PhysicalDevice(name='/physical_device:GPU:0', device_type='GPU'), "
    "PhysicalDevice(name='/physical_device:GPU:1', device_type='GPU')]",
    "Is the Tensor on GPU #0:  ", "True", "On CPU:", "10 loops: ms", "On GPU:", "10 loops: ms"]


def test_the_eager_basics_tutorial_finds_its_tensors_on_gpu_0_as_on_a_gpu_machine(tmp_path):
    """Under `--gpus 2` the tutorial's tensors say `.../device:GPU:0`, so its question prints True
    and its `assert x.device.endswith("GPU:0")` holds: exit 0, as on the GPU machine."""
    import re

    (tmp_path / "basics.py").write_text(EAGER_BASICS)
    traced = _run([sys.executable, "-m", "pinpoint.cli", "trace", "--out", "run", "--no-tracking", "--gpus", "2",
                   "basics.py"], tmp_path)
    assert traced.returncode == 0, traced.stderr[-3000:]
    lines = [re.sub(r"[\d.]+ms$", "ms", line) for line in _printed(traced.stdout)]
    start = lines.index("Is there a GPU available: ")
    assert lines[start:start + len(EAGER_BASICS_ON_GPUS)] == EAGER_BASICS_ON_GPUS


# site/en/guide/tf_numpy.ipynb, its device cells (with the guide's model, which they run): a
# tensor's device and backing device, on the first GPU TensorFlow lists and copied to the host.
NUMPY_DEVICES = '''
import tensorflow as tf
import tensorflow.experimental.numpy as tnp

tnp.experimental_enable_numpy_behavior()


class Model(object):
    def __init__(self):
        self.weights = None

    def predict(self, inputs):
        if not self.weights:
            size = inputs.shape[1]
            stddev = tnp.sqrt(size).astype(tnp.float32)
            w1 = tnp.random.randn(size, 64).astype(tnp.float32) / stddev
            bias = tnp.random.randn(64).astype(tnp.float32)
            w2 = tnp.random.randn(64, 2).astype(tnp.float32) / 8
            self.weights = (w1, bias, w2)
        else:
            w1, bias, w2 = self.weights
        y = tnp.matmul(inputs, w1) + bias
        y = tnp.maximum(y, 0)
        return tnp.matmul(y, w2)


model = Model()
print(model.predict(tnp.ones([2, 32], dtype=tnp.float32)).shape)
print("All logical devices:", tf.config.list_logical_devices())
print("All physical devices:", tf.config.list_physical_devices())
try:
    device = tf.config.list_logical_devices(device_type="GPU")[0]
except IndexError:
    device = "/device:CPU:0"
print("Using device: %s" % str(device))
with tf.device(device):
    prediction = model.predict(tnp.ones([2, 32], dtype=tnp.float32))
print(prediction.device)
print(prediction.backing_device)
with tf.device("/device:CPU:0"):
    prediction_cpu = tnp.copy(prediction)
print(prediction.backing_device)
print(prediction_cpu.backing_device)
'''

_LOCAL = "/job:localhost/replica:0/task:0/device:"
NUMPY_DEVICES_ON_GPUS = [
    "(2, 2)",
    "All logical devices: [LogicalDevice(name='/device:CPU:0', device_type='CPU'), "
    "LogicalDevice(name='/device:GPU:0', device_type='GPU'), LogicalDevice(name='/device:GPU:1', device_type='GPU')]",
    "All physical devices: [PhysicalDevice(name='/physical_device:CPU:0', device_type='CPU'), "
    "PhysicalDevice(name='/physical_device:GPU:0', device_type='GPU'), "
    "PhysicalDevice(name='/physical_device:GPU:1', device_type='GPU')]",
    "Using device: LogicalDevice(name='/device:GPU:0', device_type='GPU')",
    _LOCAL + "GPU:0", _LOCAL + "GPU:0", _LOCAL + "GPU:0", _LOCAL + "CPU:0"]


def test_the_numpy_guides_device_cells_print_what_a_gpu_machine_prints(tmp_path):
    (tmp_path / "tf_numpy.py").write_text(NUMPY_DEVICES)
    traced = _run([sys.executable, "-m", "pinpoint.cli", "trace", "--out", "run", "--no-tracking", "--gpus", "2",
                   "tf_numpy.py"], tmp_path)
    assert (traced.returncode, _printed(traced.stdout)) == (0, NUMPY_DEVICES_ON_GPUS), traced.stderr[-3000:]


# site/en/guide/gpu.ipynb, "Using a single GPU on a multi-GPU system": a GPU index the machine lacks,
# with soft placement on. The guide's log on its GPU machine: "Executing op MatMul in device
# /job:localhost/replica:0/task:0/device:GPU:0".
GPU_GUIDE_MISSING_GPU = '''
import tensorflow as tf

tf.config.set_soft_device_placement(True)
tf.debugging.set_log_device_placement(True)

with tf.device("/device:GPU:2"):
    a = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    c = tf.matmul(a, b)

print(c.device)
'''


def test_the_gpu_guides_request_for_a_missing_gpu_is_named_with_where_it_ran(tmp_path):
    """On two GPUs the guide's /device:GPU:2 does not exist: soft placement runs its MatMul on the
    first GPU. The report lists the request as the program wrote it and where it ran."""
    (tmp_path / "gpu.py").write_text(GPU_GUIDE_MISSING_GPU)
    traced = _run([sys.executable, "-m", "pinpoint.cli", "trace", "--out", "run", "--no-tracking", "--gpus", "2",
                   "gpu.py"], tmp_path)
    assert (traced.returncode, _printed(traced.stdout)) == (0, [_LOCAL + "GPU:0"]), traced.stderr[-3000:]
    eager = json.loads((tmp_path / "run" / "placement.json").read_text())["eager"]
    assert eager["not_where_requested"] == [{"op_type": "MatMul", "requested": "/GPU:2", "ran": "/GPU:0", "count": 1}]
