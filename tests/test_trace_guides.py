"""TensorFlow's own guides, run verbatim in their shapes under `pinpoint trace`: the program ends
as it does under plain `python` (its exit code and its printed lines), and placement.json is
written. Truth is the same program run by python."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


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
    proc = subprocess.run([sys.executable, oracle, "placement", str(program), str(cwd / "oracle.json")],
                          capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
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
