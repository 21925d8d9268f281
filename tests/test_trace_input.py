"""Issue 48: the input path and round trips, on the keras-io guide "Multi-GPU distributed training
with TensorFlow" as written there (its data generated: nothing is downloaded), traced under
`pinpoint trace --gpus 2`. Figures are arithmetic on the guide's batch, never copied from a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_trace import F32, placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GLOBAL_BATCH, FEATURES, REPLICAS = 32, 784, 2
PER_REPLICA = GLOBAL_BATCH // REPLICAS

GUIDE = """
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np
import tensorflow as tf
import keras


def get_compiled_model():
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 64
    rng = np.random.RandomState(0)
    x_train = rng.rand(256, 784).astype("float32")
    y_train = rng.randint(0, 10, 256).astype("float32")
    x_test, y_test = x_train[:64], y_train[:64]
    x_val, y_val = x_train[-num_val_samples:], y_train[-num_val_samples:]
    x_train, y_train = x_train[:-num_val_samples], y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size{drop}),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size{drop}),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size{drop}),
    )


strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = get_compiled_model()
    train_dataset, val_dataset, test_dataset = get_dataset()
    model.fit(train_dataset, epochs=2, validation_data=val_dataset)
    model.evaluate(test_dataset)
"""


@pytest.fixture(scope="module")
def guide(tmp_path_factory) -> tuple[dict, str]:
    folder = tmp_path_factory.mktemp("guide")
    prog = write(folder, "guide.py", GUIDE.format(drop=""))
    proc = trace(["--gpus", "2", str(prog)], cwd=folder, out=folder / "out")
    # The branch of the iterator's cond that did not run sends nothing: its transfers stay unsized.
    return placement(folder / "out", sized=False), proc.stdout


def test_each_replica_receives_its_half_of_the_batch_from_the_host_every_step(guide):
    p, _ = guide
    features, labels = PER_REPLICA * FEATURES * F32, PER_REPLICA * F32  # 50,176 B and 64 B
    inp = p["transfers"]["input"]
    assert (inp["per_step"], inp["unsized"]) == ({"/GPU:0": features + labels, "/GPU:1": features + labels}, 0)
    assert sorted((i["to"], i["components"]) for i in inp["items"]) == [
        ("/GPU:0", [features, labels]), ("/GPU:1", [features, labels])]


def test_replica_ones_batch_round_trip_through_the_first_gpu_is_found_and_explained(guide):
    p, stdout = guide
    trips = sorted((r["home"], r["via"], r["op_type"], r["bytes"], r["input"]) for r in p["transfers"]["round_trips"])
    # The features and the labels of replica 1 each go /GPU:1 -> /GPU:0 (the cond's Merge) -> /GPU:1.
    assert trips == [("/GPU:1", "/GPU:0", "Merge", PER_REPLICA * F32, True),
                     ("/GPU:1", "/GPU:0", "Merge", PER_REPLICA * FEATURES * F32, True)]
    assert "fix: batch the dataset with drop_remainder=True" in stdout


def test_drop_remainder_removes_the_round_trip(tmp_path):
    prog = write(tmp_path, "guide.py", GUIDE.format(drop=", drop_remainder=True"))
    trace(["--gpus", "2", str(prog)], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out")
    features, labels = PER_REPLICA * FEATURES * F32, PER_REPLICA * F32
    assert (p["transfers"].get("round_trips", []), p["transfers"]["input"]["per_step"]) == (
        [], {"/GPU:0": features + labels, "/GPU:1": features + labels})


def test_a_single_device_fit_counts_its_batch_from_the_host_once(tmp_path):
    """No strategy: the whole batch crosses from the host to /GPU:0 once a step, either by the
    iterator before the step or by the step's own _Send: counted once, never twice."""
    prog = write(tmp_path, "single.py", GUIDE.format(drop="").replace(
        "strategy = tf.distribute.MirroredStrategy()\nwith strategy.scope():", "if True:"))
    trace(["--gpus", "1", str(prog)], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out", sized=False)
    tr = p["transfers"]
    sent = tr["matrix"].get("/CPU:0", {}).get("/GPU:0", {}).get("bytes", 0)
    assert sent + tr.get("input", {}).get("per_step", {}).get("/GPU:0", 0) == GLOBAL_BATCH * (FEATURES + 1) * F32


def test_a_custom_loop_over_a_distributed_dataset_counts_each_replicas_element(tmp_path):
    """The guide's custom loop: `distributed_train_step(next(iterator))` reads each replica's element
    eagerly, outside the step; the step's arguments on each GPU are that element."""
    program = Path(__file__).parent / "programs" / "custom_loop_mirrored.py"
    trace(["--gpus", "2", str(program)], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out")
    per_replica = 16 // REPLICAS * (8 + 1) * F32  # 8 rows of 8 features and 1 label
    assert p["transfers"]["input"]["per_step"] == {"/GPU:0": per_replica, "/GPU:1": per_replica}


OWN_CPUS = """
import numpy as np
import tensorflow as tf

# As the distributed-input guide does on a machine without GPUs: two logical CPUs, a replica each.
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(2)])
strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
x = np.random.RandomState(0).normal(size=(128, 8)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(16)
iterator = iter(strategy.experimental_distribute_dataset(dataset))
with strategy.scope():
    w = tf.Variable(tf.zeros([8, 1]))


@tf.function
def train_step(inputs):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(features, w) - labels)) / 16
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(inputs,)), axis=None)


for _ in range(10):
    train_step(next(iterator))
"""


def test_a_replica_on_the_programs_own_second_cpu_gets_its_element_from_the_host(tmp_path):
    """tf.data runs on the host's /CPU:0; the distributed iterator fetches the second replica's
    element onto /CPU:1 (TensorFlow's placer log: a RemoteCall there every step), as onto a GPU."""
    trace([str(write(tmp_path, "own_cpus.py", OWN_CPUS))], cwd=tmp_path, out=tmp_path / "out")
    p = placement(tmp_path / "out")
    assert p["transfers"]["input"]["per_step"] == {"/CPU:1": 16 // 2 * (8 + 1) * F32}
