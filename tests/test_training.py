"""The training engine in-process, for real, on 3 logical CPUs (host + 2 emulated GPUs).

TensorFlow configures logical devices once per process, so every test here uses the same
layout: cluster.devices_per_worker=2 with emulation -> /CPU:0 host, /GPU:0=/CPU:1, /GPU:1=/CPU:2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pinpoint.config import config_from_dict
from pinpoint.errors import ConfigError, PlacementError
from pinpoint.placement.model.files import read_placement
from tests.conftest import NO_TRACKING, make_config, mlp_param_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def make_cfg(strategy="mirrored", pinning=None, **train):
    base = {
        "strategy": strategy, "steps": 40, "batch_size": 32, "learning_rate": 0.1,
        "log_every": 10, "checkpoint_every": 20, "pinning": pinning or {},
    }
    base.update(train)
    return make_config("t", cluster={"devices_per_worker": 2, "emulate": True}, train=base, tracking=NO_TRACKING,
                       placement={"warmup_steps": 2})


@pytest.fixture(autouse=True, scope="module")
def _three_logical_cpus(tf):
    """The tf fixture's layout first, whichever test runs first (-k, reordering)."""


def train(cfg, out: Path):
    from pinpoint.training.command import train_command

    assert train_command(cfg, out) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    placement = read_placement(out / "placement.json")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return metrics, placement, log


def var_devices(placement) -> dict[str, set]:
    return {v["name"]: set(v["devices"]) for v in placement["variables"]}


def rule(placement, name):
    rules = {r["rule"]: r for r in placement["conformance"]["rules"]}
    assert name in rules, f"no conformance rule {name}: {sorted(rules)}"
    return rules[name]


def test_the_first_training_step_is_logged_when_it_completes(tmp_path):
    """train_log.jsonl's first record is step 1, written as soon as the run's first call (one
    step, tracing included) returned: `make run`'s time to the first training step is its `time`."""
    metrics, placement, log = train(make_cfg("mirrored", steps=20, checkpoint_every=0), tmp_path)
    first, tenth = log[0], log[1]
    assert (first["step"], tenth["step"]) == (1, 10)
    assert first["time"] <= tenth["time"]
    # The first call ran exactly one step: its time per step is the whole call's (the tracing),
    # far more than a step of the next call (steps 2..10, no tracing).
    assert first["examples_per_sec"] == pytest.approx(32 / first["step_time"], rel=1e-3)
    assert first["step_time"] > 5 * tenth["step_time"]
    assert metrics["steps"] == 20 and placement["captured_steps"] == [2]


def compute_ops(placement, pattern):
    import re

    rx = re.compile(pattern)
    return [o for o in placement["ops"] if rx.search(o["op"]) and o["type"] not in ("Const", "NoOp", "_Send", "_Recv")]


@pytest.mark.parametrize("strategy", ["none", "one_device", "mirrored", "central_storage"])
def test_every_single_process_strategy_trains(strategy, tmp_path):
    metrics, placement, log = train(make_cfg(strategy), tmp_path)
    assert [r["step"] for r in log] == [1, 10, 20, 30, 40]
    assert log[-1]["loss"] < 0.92 * log[0]["loss"], log
    assert metrics["steps"] == 40 and metrics["strategy"] == strategy
    assert metrics["examples_per_sec"] > 0
    assert metrics["device_map"]["device_aliases"] == {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.index")) == ["ckpt-20.index", "ckpt-40.index"]
    devices = var_devices(placement)
    assert "dense_1/kernel" in devices
    expected = {
        "none": {"/GPU:0"},  # default strategy: where a GPU machine's runtime creates them
        "one_device": {"/GPU:0"},
        "mirrored": {"/GPU:0", "/GPU:1"},  # one component per replica
        "central_storage": {"/CPU:0"},  # parameters on the host, compute on the replicas
    }[strategy]
    for name in ("dense_1/kernel", "head/bias"):
        assert devices[name] == expected, (name, devices[name])
    if strategy in ("mirrored", "central_storage"):
        # Both emulated GPUs did forward/backward work.
        assert placement["gradients"]["ops_by_device"].get("/GPU:0", 0) > 0
        assert placement["gradients"]["ops_by_device"].get("/GPU:1", 0) > 0


def test_variables_gradients_layers_and_input_pins_are_visible_in_runtime_placement(tmp_path):
    pinning = {"variables": "/GPU:0", "gradients": "/GPU:1", "layers": {"head": "/GPU:1"}, "input": "/GPU:0"}
    _metrics, placement, log = train(make_cfg("none", pinning), tmp_path)
    assert log[-1]["loss"] < log[0]["loss"]
    devices = var_devices(placement)
    # variables: everything on /GPU:0 except the head's, whose layer rule is more specific
    assert devices["dense_1/kernel"] == {"/GPU:0"} and devices["dense_2/bias"] == {"/GPU:0"}
    assert devices["head/kernel"] == {"/GPU:1"}
    # gradients: the backward pass ran on /GPU:1
    grads = placement["gradients"]["ops_by_device"]
    assert grads.get("/GPU:1", 0) > grads.get("/GPU:0", 0) + grads.get("/CPU:0", 0), grads
    # layers: the head's forward ops ran on /GPU:1, dense_1's did not
    head = [o for o in compute_ops(placement, r"(^|/)head(_\d+)?/") if "gradient" not in o["op"]]
    assert head and all(o["device"] == "/GPU:1" for o in head), head
    # input: the batch gather ran on /GPU:0 and was sent on from there
    gathers = [o for o in placement["ops"] if o["op"].startswith("input/") and o["type"] == "GatherV2"]
    assert gathers and all(o["device"] == "/GPU:0" for o in gathers), gathers
    assert placement["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["count"] > 0  # activations cross devices
    # Each pin holds exactly; the only ops off a rule's device are the ones another rule sends
    # elsewhere: the head's variables (layers.head wins, 6/8). The input's examples are chosen on
    # the host (an index argument), so every input op has a GPU kernel and stays on /GPU:0.
    scores = {name: rule(placement, name)["score"] for name in ("variables", "gradients", "layers.head", "input")}
    assert scores == {"variables": 0.75, "gradients": 1.0, "layers.head": 1.0, "input": 1.0}
    assert [(v["op"], v["placed"]) for v in rule(placement, "variables")["violations"]] == [
        ("head/kernel", "/GPU:1"), ("head/bias", "/GPU:1")]
    assert placement["transfers"]["per_step"]["unsized"] == 0


def test_gradient_pin_seen_directly_in_partition_graphs():
    """Without the analyzer: the backward ops in the runtime's partition graphs sit on /CPU:2."""
    import tensorflow as tf

    from pinpoint.devices import setup_devices
    from pinpoint.training.loop import engine
    from pinpoint.training.loop.capture import capture_first_call
    from pinpoint.training.setup import task_context

    cfg = make_cfg("none", {"gradients": "/GPU:1"})
    ctx = task_context(cfg, setup_devices(cfg))
    state = engine.build_state(cfg, ctx)
    captured, _ = capture_first_call(engine.make_trainer(cfg, ctx, state), 2)
    placed = {}
    for g in captured.partition_graphs:
        for n in g.node:
            # Raw lowered names: "while/body/_1/gradient_tape/while/mlp_1/...".
            if re.search(r"(^|/)(gradients|gradient_tape)/", n.name) and n.op in ("MatMul", "BiasAddGrad", "ReluGrad"):
                placed[n.name] = tf.DeviceSpec.from_string(n.device).device_index
    assert placed and set(placed.values()) == {2}, placed


def test_transformer_blocks_split_across_devices(tmp_path):
    pinning = {"layers": {"embed": "/GPU:0", "block_0": "/GPU:0", "block_1": "/GPU:1", "head": "/GPU:1"}}
    _metrics, placement, log = train(make_cfg("none", pinning, model="transformer", steps=30, learning_rate=0.05), tmp_path)
    assert log[-1]["loss"] < log[0]["loss"]
    devices = var_devices(placement)
    b0 = set().union(*[d for n, d in devices.items() if n.startswith("block_0/")])
    b1 = set().union(*[d for n, d in devices.items() if n.startswith("block_1/")])
    assert b0 == {"/GPU:0"} and b1 == {"/GPU:1"}, sorted(devices)
    # block_0 -> block_1 activations cross from /GPU:0 to /GPU:1 in the forward pass
    assert placement["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["count"] > 0
    assert rule(placement, "layers.block_1")["score"] == 1.0, rule(placement, "layers.block_1")


def test_cnn_trains(tmp_path):
    _metrics, placement, log = train(make_cfg("mirrored", model="cnn", steps=30), tmp_path)
    assert log[-1]["loss"] < log[0]["loss"]
    assert var_devices(placement)["conv_1/kernel"] == {"/GPU:0", "/GPU:1"}


def test_unknown_layer_name_lists_the_valid_ones():
    from pinpoint.training.loop.models import build_model

    with pytest.raises(ConfigError) as err:  # at config load, before anything runs
        make_cfg("none", {"layers": {"dense_9": "/GPU:0"}})
    assert "train.pinning.layers.dense_9" in str(err.value) and "dense_1, dense_2, head" in str(err.value)
    with pytest.raises(ConfigError, match=r"train.pinning.layers.block_7: got .block_7., which matches no layer .* "
                                          r"its layers: embed, block_0"):
        build_model("transformer", (64,), 10, {"block_7": "/CPU:1"})


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_config_knows_the_real_layer_names(model):
    from pinpoint.config import MODEL_LAYERS
    from pinpoint.training.loop.models import build_model

    built = build_model(model, (64,), 10, {})
    assert tuple(layer.name for layer in built.stack) == MODEL_LAYERS[model]


def test_missing_device_with_soft_placement_off_fails_in_one_line(tmp_path):
    from pinpoint.training.command import train_command

    cfg = make_cfg("none", {"gradients": "/CPU:7", "soft_placement": False})
    with pytest.raises(PlacementError) as err:
        train_command(cfg, tmp_path)
    msg = str(err.value)
    assert msg.startswith("train.pinning.gradients: got /CPU:7, which does not exist on this machine")
    assert "enable train.pinning.soft_placement" in msg and "\n" not in msg
    assert not (tmp_path / "metrics.json").exists()


def test_missing_device_with_soft_placement_on_falls_back_and_is_reported(tmp_path):
    import tensorflow as tf

    try:
        _metrics, placement, _ = train(make_cfg("none", {"gradients": "/CPU:7"}, steps=10), tmp_path)
    finally:
        tf.config.set_soft_device_placement(True)
    # The runtime moved the backward pass elsewhere and the report says so.
    grads = placement["gradients"]["ops_by_device"]
    assert grads and "/CPU:7" not in grads
    assert rule(placement, "gradients")["score"] == 0.0


def test_batch_not_divisible_by_replicas(tmp_path):
    from pinpoint.training.command import train_command

    with pytest.raises(ConfigError, match="train.batch_size: got 33; it must be divisible by the 2 replicas"):
        train_command(make_cfg("mirrored", batch_size=33), tmp_path)


def test_visible_devices_limit_the_emulated_gpus(tmp_path):
    # The spec has 2 GPUs but only /GPU:1 is visible: like CUDA_VISIBLE_DEVICES, the process
    # sees one GPU (renumbered /GPU:0) and mirrored trains on it alone.
    metrics, placement, log = train(make_cfg("mirrored", {"visible_devices": ["/CPU:0", "/GPU:1"]}, steps=20), tmp_path)
    dmap = metrics["device_map"]
    assert dmap["visible_devices"] == {"/GPU:1": "/GPU:0"}
    assert dmap["spec_replica_devices"] == ["/GPU:0"] and metrics["num_replicas"] == 1
    assert var_devices(placement)["dense_1/kernel"] == {"/GPU:0"}
    assert log[-1]["loss"] < log[0]["loss"]


def test_gpu_spec_without_emulation_follows_soft_placement(tmp_path):
    from pinpoint.devices import setup_devices
    from pinpoint.training.command import train_command

    def cfg(soft):
        return make_config("t", cluster={"devices_per_worker": 2, "emulate": False},
                           train={"strategy": "mirrored", "steps": 10, "batch_size": 32, "log_every": 5,
                                  "checkpoint_every": 0, "pinning": {"soft_placement": soft}},
                           tracking=NO_TRACKING, placement={"warmup_steps": 2})

    with pytest.raises(PlacementError, match="cluster.device_type: got GPU, but this machine has no GPU"):
        setup_devices(cfg(False))
    assert train_command(cfg(True), tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["device_map"]["fallbacks"] == {"/GPU:0": "/CPU:0", "/GPU:1": "/CPU:0"}
    assert metrics["device_map"]["replica_devices"] == ["/CPU:0"]


def test_xla_fast_path_under_mirrored_trains_and_is_recorded(tmp_path):
    metrics, placement, log = train(make_cfg("mirrored", jit_compile=True, steps=30), tmp_path)
    assert metrics["jit_compile"] is True
    assert log[-1]["loss"] < log[0]["loss"]
    # The captured step is the plain graph, so per-op placement is still reported.
    assert var_devices(placement)["dense_1/kernel"] == {"/GPU:0", "/GPU:1"}
    with pytest.raises(ConfigError, match="train.jit_compile: got True; 'central_storage' keeps variables"):
        make_cfg("central_storage", jit_compile=True)


# ---- train.all_reduce on 2 emulated GPUs ------------------------------------------------------


@pytest.fixture(scope="module")
def all_reduce_runs(tmp_path_factory):
    """Each runnable choice trained once (mirrored, 2 emulated GPUs, 20 steps): placement, log."""
    cache: dict[str, tuple] = {}

    def get(choice: str):
        if choice not in cache:
            cfg = make_cfg("mirrored", all_reduce=choice, steps=20, checkpoint_every=0)
            _metrics, placement, log = train(cfg, tmp_path_factory.mktemp(choice))
            cache[choice] = placement, log
        return cache[choice]

    return get


def _sent(placement, src, dst) -> int:
    return placement["transfers"]["matrix"].get(src, {}).get(dst, {}).get("bytes", 0)


def test_all_reduce_ring_is_a_collective_among_the_replicas_with_no_gradient_to_the_host(all_reduce_runs):
    p, _ = all_reduce_runs("ring")
    coll = {d: c["input_bytes"] for d, c in p["transfers"]["collectives"].items()}
    assert coll == {"/GPU:0": mlp_param_bytes(), "/GPU:1": mlp_param_bytes()}
    for d in ("/GPU:0", "/GPU:1"):
        assert _sent(p, d, "/CPU:0") <= 16, p["transfers"]["matrix"][d]  # scalars (loss, metric) only


def test_all_reduce_reduce_to_host_sends_every_replicas_gradients_to_the_host_and_back(all_reduce_runs):
    p, _ = all_reduce_runs("reduce_to_host")
    pb = mlp_param_bytes()
    assert p["transfers"]["collectives"] == {}
    for d in ("/GPU:0", "/GPU:1"):
        assert pb <= _sent(p, d, "/CPU:0") <= pb + 32, p["transfers"]["matrix"][d]  # gradients + scalars
        assert _sent(p, "/CPU:0", d) >= pb  # the reduced gradients (and the input batch) come back


def test_all_reduce_hierarchical_copy_copies_between_the_replicas_not_through_the_host(all_reduce_runs):
    p, _ = all_reduce_runs("hierarchical_copy")
    pb = mlp_param_bytes()
    assert p["transfers"]["collectives"] == {}
    # 2 devices: /GPU:1's gradients to /GPU:0, which sums and copies the result back.
    assert _sent(p, "/GPU:1", "/GPU:0") == pb
    assert pb <= _sent(p, "/GPU:0", "/GPU:1") <= pb + 16
    for d in ("/GPU:0", "/GPU:1"):
        assert _sent(p, d, "/CPU:0") <= 16


def test_every_all_reduce_choice_trains_the_same_model(all_reduce_runs):
    losses = {c: [r["loss"] for r in all_reduce_runs(c)[1]] for c in ("ring", "reduce_to_host", "hierarchical_copy")}
    assert losses["ring"] == pytest.approx(losses["reduce_to_host"], rel=1e-4) == losses["hierarchical_copy"], losses


def test_all_reduce_nccl_without_a_gpu_fails_in_one_line_before_training(tmp_path):
    from pinpoint.training.command import train_command

    cfg = config_from_dict({
        "name": "t", "cluster": {"devices_per_worker": 2, "emulate": False},
        "train": {"strategy": "mirrored", "all_reduce": "nccl", "steps": 4}, "tracking": {"enabled": False},
    })
    with pytest.raises(ConfigError, match=r"^train.all_reduce: got 'nccl' but the replicas are /CPU:0 "
                                          r"\(no GPU here\); NCCL needs real GPUs: use ring or auto$"):
        train_command(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_calls_index_rows_are_the_steps_global_batches_split_by_replica(tf):
    """call_inputs: row i holds step start+i's global batch; replica r takes its slice of it."""
    from pinpoint.training.input.data import Arrays, InputPipeline

    n = 10
    arrays = Arrays(np.arange(n, dtype=np.float32).reshape(n, 1), np.arange(n, dtype=np.int32), n, "range")
    pipe = InputPipeline(arrays, global_batch=4, num_replicas=2, input_device="/CPU:0", seed=0)
    (idx,) = pipe.call_inputs(start=3, n=2)
    assert idx.shape == (2, 4)
    assert idx.numpy().ravel().tolist() == pipe.order.indices(3 * 4, 8).tolist()
    x, y = pipe.replica_batch(step=4, replica_id=1, i=1, indices=idx)
    assert y.numpy().tolist() == idx.numpy()[1, 2:].tolist() and x.shape == (2, 1)
