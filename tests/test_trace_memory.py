"""Issue 49: memory per device, measured under `pinpoint trace --memory --gpus 2`, held to the
allocator's own totals (every event replayed, its peak TensorFlow's get_memory_info) and to the
arithmetic of a tensor placed by tf.device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_trace import F32, placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROWS, INNER, COLS = 256, 512, 1024

SPLIT = f"""
import tensorflow as tf

with tf.device("/GPU:1"):
    w = tf.Variable(tf.ones([{INNER}, {COLS}]))


@tf.function
def step(x):
    with tf.device("/GPU:1"):
        y = tf.matmul(x, w)
    with tf.device("/GPU:0"):
        return tf.reduce_sum(y * 2.0)


x = tf.ones([{ROWS}, {INNER}])
for _ in range(5):
    step(x)
"""


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> tuple[dict, str, Path]:
    """One traced run for this module's tests: --memory and a GPU size, which only adds the fits
    verdict to the same measurement (one TensorFlow start, not two)."""
    folder = tmp_path_factory.mktemp("memory")
    proc = trace(["--memory", "--gpu-memory", "16GiB", "--gpus", "2", str(write(folder, "split.py", SPLIT))],
                 cwd=folder, out=folder / "out")
    return placement(folder / "out")["memory"], proc.stdout, folder / "out"


def test_every_allocator_event_replays_and_every_byte_has_a_device(split):
    memory, _, _ = split
    check = memory["self_check"]
    assert (check["mismatched"], check["unpartitioned"], check["replayed_peak"]) == (0, 0, check["allocator_peak"])


def test_the_matmul_on_gpu_1_is_that_devices_peak(split):
    """(/GPU:0's `y * 2.0` may reuse y's buffer in place: logical CPUs share a received tensor's
    buffer, so whether it allocates depends on the order the two devices' ops ran.)"""
    memory, stdout, _ = split
    gpu1 = memory["devices"]["/GPU:1"]
    product = ROWS * COLS * F32  # y = x @ w, float32
    assert (gpu1["peak_requested"], [(x["op"], x["requested"]) for x in gpu1["at_peak"]]) == (product, [("MatMul", product)])
    assert "memory     : step peak per device:" in stdout
    # Predicted from the executed graphs: the product is the only tensor /GPU:1 makes.
    assert memory["predicted"]["devices"]["/GPU:1"]["predicted"] == product


def test_calls_two_to_four_are_measured_and_each_devices_least_and_most_peak_reported(split):
    """The step runs 5 times: calls 2, 3 and 4 are measured (the first makes the constants), all 5
    counted. /GPU:1 holds the product in every call; the figures kept are one measured call's."""
    memory, stdout, out = split
    calls = memory["calls"]
    product = ROWS * COLS * F32
    assert (calls["measured"], calls["devices"]["/GPU:1"]) == ([2, 3, 4], {"least": product, "most": product})
    assert calls["kept"] in (2, 3, 4)
    assert all(v["least"] <= memory["devices"][d]["peak_requested"] <= v["most"] for d, v in calls["devices"].items())
    assert [f["calls"] for f in placement(out)["functions"] if f["training"]] == [5]
    assert "over calls 2, 3, 4: " in stdout and f"the figures are call {calls['kept']}'s" in stdout


def test_the_measured_calls_trace_is_kept_for_tensorboards_memory_profile(split):
    from pinpoint.placement.profile.allocator import memory_events
    from pinpoint.placement.profile.xspace import read_xspace

    memory, _, out = split
    (kept,) = (out / memory["trace"]).glob("plugins/profile/*/*.xplane.pb")
    assert len(memory_events(read_xspace(kept))) == memory["self_check"]["events"]


def test_without_the_flag_nothing_is_measured(tmp_path):
    trace(["--gpus", "2", str(write(tmp_path, "split.py", SPLIT))], cwd=tmp_path, out=tmp_path / "out")
    assert "memory" not in placement(tmp_path / "out")


def test_a_gpu_size_gives_a_verdict_per_device_and_a_bad_one_writes_nothing(split, tmp_path):
    prog = write(tmp_path, "split.py", SPLIT)
    bad = trace(["--gpu-memory", "16GBB", "--gpus", "2", str(prog)], cwd=tmp_path, out=tmp_path / "bad", expect=2)
    assert (bad.stderr.strip().splitlines(), (tmp_path / "bad").exists()) == (
        ["pinpoint: --gpu-memory: got '16GBB'; pass a size with a unit, e.g. 16GiB or 80GB "
         "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"], False)
    memory, stdout, _ = split  # traced with --gpu-memory 16GiB
    assert {d: v["verdict"] for d, v in memory["fit"]["devices"].items()} == {"/GPU:0": "fits", "/GPU:1": "fits"}
    assert "memory fit : on 16.0 GiB GPUs: /GPU:0 fits" in stdout


LSTM_DEVICES = {"mirrored": ["/GPU:0", "/GPU:1"], "split": ["/GPU:0", "/GPU:1"],
                "parameter_server": ["/job:chief/task:0/CPU:0", "/job:ps/task:0/CPU:0", "/job:worker/task:0/CPU:0"]}


@pytest.mark.parametrize("strategy", list(LSTM_DEVICES))
def test_an_lstms_predicted_peak_is_at_most_5_percent_low_and_10_percent_high(strategy, tmp_path):
    """Issue 49's target on Keras' generic LSTM loop (the bench's: 32 units, 16 steps of 8, batch 32;
    about 7 s a strategy): each device's predicted peak never more than 5% below the allocator's and
    at most 10% above it (a prediction errs high, never low; which of the loop's iterations overlap
    changes from run to run, docs/memory.md, and on a loaded machine the replay of the measured order
    has come out 5.7% high). What the loops hold beyond their tensor lists is modelled: the input's elements
    (TensorListFromTensor's copies, pushed for the gradient) until popped, the zeros the gradient loop
    starts its sums from until the loop exits, and the iterations that ran ahead of the sums. Under
    parameter_server (the guide's in-process cluster) the worker's body is sized from graphs with no
    traced shapes, and the weights it receives in each iteration are pushed too."""
    from benchmarks.memory_bench import PROGRAM

    trace(["--memory", "--gpus", "2", str(write(tmp_path, "lstm.py", PROGRAM)), "lstm", strategy], cwd=tmp_path,
          out=tmp_path / "out")
    memory = placement(tmp_path / "out")["memory"]
    rows = memory["predicted"]["devices"]
    off = {d: r for d, r in rows.items() if not -0.05 * r["measured"] <= r["predicted"] - r["measured"] <= 0.10 * r["measured"]}
    # (a miss names what the allocator held at that device's peak: the run's folder is gone by then)
    held = {d: [(a["op"], a["requested"]) for a in memory["devices"].get(d, {}).get("at_peak", ())] for d in off}
    assert (sorted(rows), off) == (LSTM_DEVICES[strategy], {}), held


PARAMETER_SERVER = f"""
import socket
import sys

import tensorflow as tf

WORKERS = int(sys.argv[1])


TAKEN = set()  # a port the kernel frees may come back from the next bind: never one twice


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        if port not in TAKEN:
            TAKEN.add(port)
            return port


# The "Parameter server training" guide's in-process cluster (its threads: enough for every worker).
spec = tf.train.ClusterSpec({{"worker": [f"localhost:{{free_port()}}" for _ in range(WORKERS)],
                             "ps": [f"localhost:{{free_port()}}"]}})
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=WORKERS + 1)
for i in range(WORKERS):
    tf.distribute.Server(spec, job_name="worker", task_index=i, config=config, protocol="grpc")
tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc")
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = tf.Variable(tf.ones([{INNER}, {COLS}]))


@tf.function
def step():
    return tf.reduce_sum(tf.matmul(tf.ones([{ROWS}, {INNER}]), w))


for _ in range(3 * WORKERS):
    coordinator.schedule(step)
coordinator.join()
"""


def _parameter_server(folder: Path, workers: int) -> dict:
    proc = trace(["--memory", str(write(folder, "ps.py", PARAMETER_SERVER)), str(workers)], cwd=folder,
                 out=folder / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return placement(folder / "out")["memory"]


def test_a_parameter_server_closure_is_measured_on_its_worker_with_the_variable_it_received(tmp_path):
    """One worker: w lives on the ps; the worker's runtime receives it over the RPC layer (a copy of
    its own, 2 MiB) and makes the product (1 MiB) while it is held. The allocator's totals replay
    exactly; the prediction from the graphs TensorFlow wrote gives the same bytes. (The sum's scalar
    joins them when gRPC lets go of w after the Sum began, as it did once in a loaded CI run: the peak
    is then 4 B more, and the prediction may or may not see it.)"""
    memory = _parameter_server(tmp_path, 1)
    worker = memory["devices"]["/job:worker/task:0/CPU:0"]
    received, product = INNER * COLS * F32, ROWS * COLS * F32
    check = memory["self_check"]
    scalar = sum(x["requested"] for x in worker["at_peak"] if x["requested"] == F32)
    predicted = memory["predicted"]["devices"]["/job:worker/task:0/CPU:0"]["predicted"]
    assert ((check["mismatched"], check["replayed_peak"]), worker["peak_requested"] - scalar,
            sorted(x["requested"] for x in worker["at_peak"] if x["requested"] != F32),
            predicted in (received + product, received + product + scalar)) == (
        (0, check["allocator_peak"]), received + product, [product, received], True)


def test_two_workers_calls_are_each_measured_on_their_own_device_and_the_measured_one_predicted(tmp_path):
    """Six closures on two idle workers: both run the step's graphs at once, with the same node names.
    The measured call holds what one call holds (the 2 MiB copy of w it received and the 1 MiB product;
    a worker's first run of the step also makes its 512 KiB `ones` and an 8 B constant), and its
    prediction is held to it. Every other buffer of the step's nodes is one of those, on the other
    worker's device or held apart as a call begun before the trace, never on the measured worker's.
    (The sum's scalar may join them, as in the one-worker test.)"""
    from pinpoint.placement.memory.calls import OTHER_CALL

    memory = _parameter_server(tmp_path, 2)
    received, product, ones = INNER * COLS * F32, ROWS * COLS * F32, ROWS * INNER * F32
    ((caller, row),) = memory["predicted"]["devices"].items()
    held = {d: {x["requested"] for x in m["at_peak"]} - {F32} for d, m in memory["devices"].items()
            if d.startswith("/job:worker") or d == OTHER_CALL}
    check = memory["self_check"]
    assert ((check["mismatched"], check["unpartitioned"]),
            row["measured"] - received - product in (0, F32, ones + 8, ones + 8 + F32),
            row["predicted"] - row["measured"] in (0, -F32, F32),
            {d: b <= {8, ones, product, received} for d, b in held.items()}) == (
        (0, 0), True, True, dict.fromkeys(held, True))


EMBEDDING = """
import numpy as np
import keras
import tensorflow as tf

with tf.distribute.MirroredStrategy().scope():
    model = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(20000, 64),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
rng = np.random.default_rng(0)
x, y = rng.integers(0, 20000, (256, 8)).astype("int32"), rng.random((256, 1)).astype("float32")
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
"""


def test_an_embedding_updated_by_a_scatter_is_predicted_with_the_table_each_read_copies(tmp_path):
    """Issue 65.2's program where the sparse updates matter: Keras 3's SGD updates an Embedding by
    `scatter_sub` (its gradient is an IndexedSlices), which puts the table in copy-on-read mode, and
    from then on each step's ReadVariableOp of it copies the whole table (5.12 MB here, most of the
    step's peak). Each replica's predicted peak is within 5% of the allocator's; a replay that took
    those reads as views of the variable would miss the table."""
    trace(["--memory", "--gpus", "2", str(write(tmp_path, "embedding.py", EMBEDDING))], cwd=tmp_path,
          out=tmp_path / "out")
    # (unsized transfers allowed: the step sends from a cond branch that did not run, no bytes moved)
    rows = placement(tmp_path / "out", sized=False)["memory"]["predicted"]["devices"]
    off = {d: r for d, r in rows.items() if abs(r["predicted"] - r["measured"]) > 0.05 * r["measured"]}
    assert (sorted(rows), off) == (["/GPU:0", "/GPU:1"], {})


FIT_ON_ONE_GPU = """
import numpy as np
import keras

x = np.linspace(0, 1, 64 * 8, dtype="float32").reshape(64, 8)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")  # jit_compile="auto": XLA, as on a GPU machine
model.fit(x, x.sum(axis=1, keepdims=True), batch_size=16, epochs=2, verbose=0)
"""


def test_a_call_compiled_by_xla_on_emulated_gpus_says_why_it_is_not_measured(tmp_path):
    """Keras compiles a strategy-free fit with XLA when it sees a GPU; on emulated GPUs XLA's CPU
    runtime holds the cluster's buffers where the allocator's events name neither an op nor an
    emulated GPU, so the emulated /GPU:0 would show next to nothing. The section says why instead
    of a per-device peak."""
    from pinpoint.placement.analysis.build import XLA_ON_EMULATED_GPUS

    trace(["--memory", "--gpus", "1", str(write(tmp_path, "fit.py", FIT_ON_ONE_GPU))], cwd=tmp_path,
          out=tmp_path / "out")
    assert placement(tmp_path / "out")["memory"] == {"why_not": XLA_ON_EMULATED_GPUS.format(n=1)}
