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
