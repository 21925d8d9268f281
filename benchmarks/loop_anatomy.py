"""Issue 34.4: what Keras' `fit` loop does that Pinpoint's does not, measured in one process.

Pinpoint's training function for the strategy-none row (the keras-none config: the demo MLP on
one emulated GPU, 10 steps per call, XLA on) against the same function with one of the two
differences from Keras' loop removed:

- update_in_xla: Keras compiles its whole train step (forward, backward and the optimizer's
  update) with XLA; Pinpoint compiles forward and backward (`Trainer._compute_jit`) and applies
  the gradients outside, where its capture reports the update ops and their devices.
- input_on_device: Keras' distributed dataset prefetches each batch onto the device on a
  background thread; Pinpoint gathers the batch on the input device (the host) inside the step,
  so the input placement is part of the step's graphs, and every iteration of its 10-step loop
  copies the batch host -> device (the loop runs in two partitions, host and device).
- both.

Each variant is a tf.function over the trainer's own model, optimizer and input pipeline, in the
trainer's own device scope. Blocks of calls in pairs (Pinpoint's function, then the variant's;
the order alternates between rounds); a pair's figure is the variant's speed over Pinpoint's
(examples/s), the report takes the median and a bootstrap interval over the pairs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

VARIANTS = ("update_in_xla", "input_on_device", "both")
CALLS, ROUNDS, STEPS = 200, 10, 10


def measure(spec: dict) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from pinpoint.quiet import import_tensorflow

    import_tensorflow()
    import tensorflow as tf

    from pinpoint.config import config_from_dict
    from pinpoint.devices import setup_devices
    from pinpoint.training.input.data import InputPipeline
    from pinpoint.training.loop import engine
    from pinpoint.training.setup import task_context

    cfg = config_from_dict(spec["config"])
    scale = float(spec.get("scale", 1.0))
    calls, rounds = max(2, int(CALLS * scale)), max(2, int(ROUNDS * scale))
    ctx = task_context(cfg, setup_devices(cfg))
    tr = engine.make_trainer(cfg, ctx, engine.build_state(cfg, ctx))
    if not (tr.jit_compile and isinstance(tr.pipeline, InputPipeline)):
        raise RuntimeError("loop anatomy: needs the in-memory input and XLA on (the keras-none config)")
    device = tr.model.trainable_variables[0].value.device  # where the replica's variables live
    p = tr.pipeline
    on_device = InputPipeline(p.arrays, p.global_batch, 1, device, p.seed)

    def whole_step(x, y):
        loss, correct, grads = tr._loss_and_grads(x, y)
        tr.optimizer.apply_gradients(zip(grads, tr.model.trainable_variables))
        return loss, correct

    step_xla = tf.function(whole_step, jit_compile=True)
    sig = [tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32)]

    def loop(pipeline, update):
        @tf.function(input_signature=sig)
        def train_n(start, n):
            with tr.trace_scope():
                sums = (tf.constant(0.0), tf.constant(0.0))
                for i in tf.range(n):
                    x, y = pipeline.replica_batch(start + tf.cast(i, tf.int64), 0)
                    loss, correct = update(x, y)
                    sums = (sums[0] + loss, sums[1] + correct)
                return sums[0] / tf.cast(n, tf.float32), sums[1]
        return train_n

    fns = {"pinpoint": tr.train_n, "update_in_xla": loop(p, step_xla),
           "input_on_device": loop(on_device, tr.replica_update), "both": loop(on_device, step_xla)}
    step = {"n": 0}

    def block(fn, calls: int = calls) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            loss, _acc = fn(tf.constant(step["n"], tf.int64), tf.constant(STEPS, tf.int32))
            float(loss)  # the host sync Pinpoint's loop makes once per call
            step["n"] += STEPS
        return calls * STEPS * p.global_batch / (time.perf_counter() - t0)

    for fn in fns.values():  # trace, compile, warm up
        block(fn, 20)
    rec: dict[str, Any] = {f"{v}_speedup_blocks": [] for v in VARIANTS}
    rec["pinpoint_ex_s_blocks"] = []
    for r in range(rounds):
        for v in VARIANTS:
            pair = [("pinpoint", fns["pinpoint"]), (v, fns[v])]
            speed = {name: block(fn) for name, fn in (pair if r % 2 == 0 else pair[::-1])}
            rec[f"{v}_speedup_blocks"].append(speed[v] / speed["pinpoint"])
            rec["pinpoint_ex_s_blocks"].append(speed["pinpoint"])
    import statistics

    for v in VARIANTS:
        rec[f"{v}_speedup"] = statistics.median(rec[f"{v}_speedup_blocks"])
    rec.update(calls=calls, rounds=rounds, steps_per_call=STEPS, device=device, input_device=p.device)
    Path(spec["out"]).mkdir(parents=True, exist_ok=True)
    return rec
