"""Issue 34.1: what Pinpoint adds per call, measured where it arises, in one process.

Each microbenchmark times blocks of many calls of one thing on the plain path and on Pinpoint's
path, in pairs (plain then Pinpoint) within one process. Every call is timed on its own (wall
clock, ~0.1 µs of timer in both paths) and a block's figure is the median of its calls: a call
preempted on the shared machine, or one that meets TensorFlow's thread pool waking up, is an
outlier the median ignores. The log call and the checkpoint save do work now and then (a
journal flush, a snapshot), which a median would hide: their figure is the mean of their calls.
(Best-of-sub-blocks in process CPU time, used before, counted
TensorFlow's spinning pool threads: an A/A test of a 220 µs tf.function call spread ±8 µs
between blocks, against ±0.8 µs for block medians.) Per path: the best block in µs per call.
Added: each pair's Pinpoint block - its plain block, so a slow spell of the machine hits both;
the list is kept (`<name>_added_blocks`) and the report takes its median and a bootstrap 95%
interval over the pairs of every round.
Pinpoint's path is the real one, installed as `pinpoint trace` installs it
(`pinpoint.trace.session.Capture` on the devices plain python sees, its recorder, request log,
fit patch and `pinpoint.log` sink), entered before and left after each Pinpoint block:

- tf_function_wrapper (the target): inside the Capture, past that window, the recorder's call
  counter (its subclass of `InterpolateRuntimeError`, the only Pinpoint code left on a known
  tf.function call's path: pinpoint.tfcompat.counting) against TensorFlow's own class, switched
  call by call (`alternating_added_us`): pairs of calls a few hundred µs apart meet the same
  machine, pairs of blocks do not;
- tf_function: a small tf.function called after its first (captured) call, once every signature
  is recorded (the recorder's quiet window has passed: its op callback is switched off), in
  blocks with the Capture entered against not: the cross-check for the rest of its state;
  tf_function_recording: the same before that (the first calls of a program), recorded, no target.
- eager_op: `tf.add` of two 4-element tensors once its (op, devices) signature is recorded (the
  quiet window has passed); eager_recording: the same op while the recorder still counts every
  eager op (the first ops of a program), recorded, no target.
- train_on_batch: a Keras `train_on_batch` of a 64-32-10 MLP on a batch of 32, after the window.
- log: `pinpoint.log(step, loss=..., accuracy=...)`: plain, no Pinpoint run (a no-op); Pinpoint,
  the trace session's sink into a real MLflow step run (`open_step_run`: journal in memory,
  its sender process and a local sqlite store).
- checkpoint: a CheckpointManager save of that MLP and its optimizer; Pinpoint, the
  `train.entrypoint` path (`training.checkpoints.Checkpoints.save`, then the tracking hook's
  `on_checkpoint`: hard-link snapshots and a journal record) under the Capture.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (name, calls per block, pairs of blocks).
BENCHES = (("tf_function", 100, 150), ("tf_function_wrapper", 100, 150), ("tf_function_recording", 100, 10),
           ("eager_op", 1000, 24),
           ("eager_recording", 500, 10), ("train_on_batch", 30, 10), ("log", 250, 12), ("checkpoint", 5, 6))


# Paths that do work now and then: a block's figure is the mean of its calls.
MEAN = {"log", "checkpoint"}


def block_us(call: Callable[[], Any], calls: int, *, mean: bool = False) -> float:
    """µs per call: the median (or mean) of `calls` calls, each timed on its own."""
    clock = time.perf_counter_ns
    times = [0] * calls
    for i in range(calls):
        t0 = clock()
        call()
        times[i] = clock() - t0
    return (statistics.fmean(times) if mean else statistics.median(times)) / 1000


def alternating_added_us(call: Callable[[], Any], calls: int, plain: Callable[[], None],
                         ours: Callable[[], None]) -> float:
    """µs added per call, pair by pair: `calls` pairs of calls, one on each path, switched
    between the two calls of a pair (the first of a pair alternates), each call timed on its own;
    the block's figure is the median of the pairs' differences. Two calls a few hundred µs apart
    meet the same machine; blocks of 100 calls on one path, then 100 on the other, do not (pairs
    of such blocks spread ±100 µs on this machine)."""
    clock = time.perf_counter_ns
    diffs = [0] * calls
    for i in range(calls):
        t = {}
        for path, switch in (("plain", plain), ("ours", ours)) if i % 2 == 0 else (("ours", ours), ("plain", plain)):
            switch()
            t0 = clock()
            call()
            t[path] = clock() - t0
        diffs[i] = t["ours"] - t["plain"]
    return statistics.median(diffs) / 1000


def measure(spec: dict) -> dict[str, Any]:
    """The worker kind `overheads`: every microbenchmark, plain and Pinpoint's path."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from pinpoint.quiet import import_tensorflow

    import_tensorflow()
    import tensorflow as tf

    from pinpoint.trace.gpus import device_map_for
    from pinpoint.trace.session import Capture

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    scale = float(spec.get("scale", 1.0))  # --quick: fewer calls
    dm = device_map_for(None)  # the devices plain python sees
    record: dict[str, Any] = {}
    step = {"n": 0}

    @tf.function
    def small(x):
        return x * 2.0 + 1.0

    x, y = tf.ones([4]), tf.ones([4])
    small(x)
    model, batch = _mlp(tf)
    model.train_on_batch(*batch)

    def pinpoint_log():
        import pinpoint

        step["n"] += 1
        pinpoint.log(step["n"], loss=0.25, accuracy=0.75)

    def bench(name: str, call: Callable[[], Any], *, warm: Callable[[Capture], None] | None = None,
              send=None, plain_call: Callable[[], Any] | None = None) -> None:
        calls, repeats = next((c, r) for n, c, r in BENCHES if n == name)
        calls = max(1, int(calls * scale))
        plain, ours = [], []
        for _ in range(repeats):
            plain.append(block_us(plain_call or call, calls, mean=name in MEAN))
            with Capture(dm, send=send) as cap:
                (warm or (lambda c: call()))(cap)
                ours.append(block_us(call, calls, mean=name in MEAN))
        record[f"{name}_plain_us"] = min(plain)
        record[f"{name}_pinpoint_us"] = min(ours)
        record[f"{name}_plain_blocks"], record[f"{name}_pinpoint_blocks"] = plain, ours
        record[f"{name}_added_blocks"] = [b - a for a, b in zip(plain, ours)]
        record[f"{name}_added_us"] = statistics.median(record[f"{name}_added_blocks"])
        record[f"{name}_calls"] = calls
        record[f"{name}_repeats"] = repeats

    def past_window(call: Callable[[], Any]) -> Callable[[Capture], None]:
        """Warm-up: calls until the recorder's quiet window has passed (its op callback switched
        off: every signature recorded), at most 10 windows' worth."""

        def warm(cap: Capture) -> None:
            for _ in range(10 * cap.recorder.quiet_ops):
                if cap.recorder.eager.stopped is not None:
                    return
                call()
            raise RuntimeError(f"the recorder's op callback was not switched off after {10 * cap.recorder.quiet_ops} calls")

        return warm

    def wrapper_pairs(call: Callable[[], Any], warm: Callable[[Capture], None]) -> None:
        """tf_function_wrapper: inside the Capture, after its warm-up, the recorder's call counter
        against TensorFlow's own InterpolateRuntimeError, switched call by call
        (`alternating_added_us`). The rest of the Capture's state is what tf_function's blocks add
        on top."""
        from pinpoint.tfcompat.patches import Patches
        from pinpoint.tfcompat.targets import TARGETS

        owner, attr = TARGETS["InterpolateRuntimeError"].owner()
        tf_own = owner.__dict__[attr]
        calls, repeats = next((c, r) for n, c, r in BENCHES if n == "tf_function_wrapper")
        calls = max(1, int(calls * scale))
        added = []
        with Capture(dm) as cap:
            warm(cap)
            assert owner.__dict__[attr] is not tf_own, "the Capture did not install its call counter"
            # A module global: call_flat looks it up at each call. Closing puts the recorder's
            # counter back before the Capture undoes its own patch.
            with Patches() as patches:
                plain, ours = patches.switch("InterpolateRuntimeError", tf_own)
                for _ in range(repeats):
                    added.append(alternating_added_us(call, calls, plain, ours))
        record["tf_function_wrapper_added_blocks"] = added
        record["tf_function_wrapper_added_us"] = statistics.median(added)
        record["tf_function_wrapper_calls"], record["tf_function_wrapper_repeats"] = calls, repeats

    fn = lambda: small(x)  # noqa: E731
    add = lambda: tf.add(x, y)  # noqa: E731
    step_fn = lambda: model.train_on_batch(*batch)  # noqa: E731
    record["eager_quiet_ops"] = _quiet_ops()
    record["eager_resample_s"] = list(_resample_s())  # the waits before sampling windows: first, longest

    def fn_past_window(cap: Capture) -> None:
        # The first call (captured), then the window passed on eager ops already recorded (each
        # op callback counts; ~20 µs each instead of a function call's ~170): more pairs, same state.
        fn()
        past_window(add)(cap)

    bench("tf_function", fn, warm=fn_past_window)
    wrapper_pairs(fn, fn_past_window)
    bench("tf_function_recording", fn)  # the first call captured, the op callback still there
    bench("eager_op", add, warm=past_window(add))
    bench("eager_recording", add)  # every op counted (a block is shorter than the window)
    bench("train_on_batch", step_fn, warm=past_window(step_fn))

    # Tracking: one real step run (sender process, local sqlite store) for the log and checkpoint.
    from pinpoint.trace.session import trace_config
    from pinpoint.tracking import open_step_run
    from pinpoint.tracking.hook import TrackingHook
    from pinpoint.training.checkpoints import Checkpoints

    cfg = trace_config("bench-overheads", tracking=True, experiment="pinpoint-bench")
    uri = f"sqlite:///{out.resolve() / 'mlflow.db'}"
    with open_step_run(cfg, "trace", out / "run", uri=uri) as run:
        bench("log", pinpoint_log, send=run.log_step_metrics)
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        plain_mgr = tf.train.CheckpointManager(ckpt, str(out / "plain-ckpt"), max_to_keep=3)
        ours = Checkpoints(ckpt, out / "run" / "checkpoints", keep=3)
        hook = TrackingHook(run)
        n = {"plain": 0, "ours": 0}

        def plain_save():
            n["plain"] += 1
            plain_mgr.save(checkpoint_number=n["plain"])

        def our_save():
            n["ours"] += 1
            path = ours.save(n["ours"])
            hook.on_checkpoint(n["ours"], path)

        # Warm-up: two saves (the save counter's variable is looked up at its second update).
        bench("checkpoint", our_save, plain_call=plain_save, send=run.log_metrics,
              warm=lambda cap: (our_save(), our_save()))
        record["unsent_at_end"] = run.unsent()
        closing = time.perf_counter()
    # The sender's work after the last call (sending what was logged), not a per-call cost.
    record["tracking_close_s"] = time.perf_counter() - closing
    return record


def _quiet_ops() -> int:
    from pinpoint.trace.recorder import EAGER_QUIET_OPS

    return EAGER_QUIET_OPS


def _resample_s() -> tuple[float, float]:
    from pinpoint.trace.sampling import EAGER_RESAMPLE_S

    return EAGER_RESAMPLE_S


def _mlp(tf):
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((32, 64)).astype("float32"), rng.integers(0, 10, 32).astype("int32"))
    return model, batch
