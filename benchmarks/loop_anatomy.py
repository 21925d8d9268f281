"""Issue 34.4: what Keras' `fit` loop does that Pinpoint's does not, measured in one process.

Pinpoint's training function for the strategy-none row (the keras-none config: the demo MLP on
one emulated GPU, 10 steps per call, XLA on) against the same function with one choice changed:

- shuffle_in_step: the examples of each step chosen inside the step by TensorFlow's per-example
  RandomIndexShuffle (the in-memory input's order before `EpochOrder`, 24 µs a step of 64 in a
  profile); Pinpoint now draws a call's indices on the host from a seeded permutation per epoch,
  and Keras shuffles in tf.data on a background thread. Below 1: what choosing on the host saves.
- update_in_xla: Keras compiles its whole train step (forward, backward and the optimizer's
  update) with XLA; Pinpoint compiles forward and backward (`Trainer._compute_jit`) and applies
  the gradients outside, where its capture reports the update ops and their devices.
- input_on_device: Keras' distributed dataset prefetches each batch onto the device on a
  background thread; Pinpoint gathers the batch on the input device (the host) inside the step,
  so the input placement is part of the step's graphs, and every iteration of its 10-step loop
  copies the batch host -> device (the loop runs in two partitions, host and device).
- keras: Keras' own multi-step train function (the one `fit` runs, XLA on, steps_per_execution
  10) on the Keras peer's model and tf.data input, in the same process on the same devices: do
  the training functions differ at all, once both processes' noise is out of the comparison?

Each variant but keras is the trainer's own training function (`Trainer.make_train_n`) on a copy of the
trainer with that one part swapped, over the same model, optimizer and data. Calls in pairs,
back to back (Pinpoint's function and the variant's, the order alternating): a round's figure is
the median over its pairs of the variant's speed over Pinpoint's; the report takes the median and
a bootstrap interval over the rounds."""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

VARIANTS = ("shuffle_in_step", "update_in_xla", "input_on_device", "keras")
CALLS, ROUNDS, STEPS = 130, 10, 10


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
    dm = setup_devices(cfg)
    ctx = task_context(cfg, dm)
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

    def variant(**parts):
        v = copy.copy(tr)  # the same model, optimizer, strategy and data; one part swapped
        for name, part in parts.items():
            setattr(v, name, part)
        v.train_n = v.make_train_n()
        return v

    fns = {"pinpoint": pinpoint_call(tr),
           "shuffle_in_step": pinpoint_call(variant(pipeline=InGraphShuffle(p))),
           "update_in_xla": pinpoint_call(variant(replica_update=tf.function(whole_step, jit_compile=True))),
           "input_on_device": pinpoint_call(variant(pipeline=on_device)),
           "keras": keras_call(cfg, dm, tr.strategy)}
    for fn in fns.values():  # trace, compile, warm up
        for _ in range(20):
            fn()
    rec: dict[str, Any] = {f"{v}_speedup_blocks": [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS:
            rec[f"{v}_speedup_blocks"].append(paired_speedup(fns["pinpoint"], fns[v], calls, first=r % 2))
    for v in VARIANTS:
        rec[f"{v}_speedup"] = statistics.median(rec[f"{v}_speedup_blocks"])
    rec.update(calls=calls, rounds=rounds, steps_per_call=STEPS, device=device, input_device=p.device)
    Path(spec["out"]).mkdir(parents=True, exist_ok=True)
    return rec


def paired_speedup(base: Callable[[], None], other: Callable[[], None], calls: int, *, first: int) -> float:
    """`other`'s speed over `base`'s: the median of `calls` call-by-call ratios, the two calls of
    a pair back to back (order alternating), so both see the same moment of a noisy machine."""
    ratios = []
    for k in range(calls):
        times = {}
        for name, fn in ((("base", base), ("other", other)) if (k + first) % 2 == 0 else
                         (("other", other), ("base", base))):
            t0 = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - t0
        ratios.append(times["base"] / times["other"])
    return statistics.median(ratios)


def pinpoint_call(trainer) -> Callable[[], None]:
    """One call of `trainer`'s training function (STEPS steps), its host sync included."""
    def call():
        loss, _acc = trainer.train_n(*trainer.call_args(STEPS))
        float(loss)  # the host sync Pinpoint's loop makes once per call
        trainer.step += STEPS
    return call


def keras_call(cfg, dm, strategy) -> Callable[[], None]:
    """One execution of Keras' own multi-step train function (steps_per_execution = STEPS), as
    `fit` makes it, on the Keras peer's model and input (benchmarks/keras_peer.py), built under
    the same strategy on the same devices as the trainer."""
    from benchmarks.keras_peer import compiled_model, keras_input
    from pinpoint.distribute.emulation import eager_default

    ds, input_shape, num_classes = keras_input(cfg)
    default = eager_default(dm, cfg.train.strategy)
    with default, strategy.scope():
        model = compiled_model(cfg, input_shape, num_classes)
    if model.steps_per_execution != STEPS:
        raise RuntimeError(f"loop anatomy: Keras runs {model.steps_per_execution} steps an execution, not {STEPS}")
    with default:
        model.fit(ds, epochs=1, steps_per_epoch=2 * STEPS, verbose=0)  # makes fit's train function
    fn, it = model.train_function, iter(strategy.experimental_distribute_dataset(ds))

    def call():
        with default:
            logs = fn(it)
        float(logs["loss"])  # fit turns the logs into Python floats after every execution
    return call


class InGraphShuffle:
    """The in-memory input choosing each step's examples inside the step (RandomIndexShuffle per
    example, `batch_indices`), as it did before the host-side order: no call inputs."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.global_batch = pipeline.global_batch

    def call_specs(self) -> tuple:
        return ()

    def call_inputs(self, start: int, n: int) -> tuple:
        return ()

    def replica_batch(self, step, replica_id, i=None):
        return self.pipeline.replica_batch(step, replica_id)
