"""Model parallelism by hand: `dense_1` on /GPU:0, `head` on /GPU:1, the gradients computed
under `tf.device('/GPU:0')`, one `tf.function` per training step.

Plain TensorFlow: `pinpoint.log` is the only Pinpoint call, and it does nothing when the program
runs without Pinpoint; the digits are Pinpoint's copy (scikit-learn's without Pinpoint). Run it
as a script, under `pinpoint trace --gpus 2`, or as the pipeline's train step through
`entrypoint(ctx)` (config.yaml).
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import tensorflow as tf

try:
    from pinpoint import log
    from pinpoint.training.input.digits import load_digits
except ImportError:  # running without Pinpoint installed
    from sklearn.datasets import load_digits as _load_digits

    def log(step, **metrics):
        pass

    def load_digits():
        return _load_digits(return_X_y=True)


def dataset(batch_size: int) -> tf.data.Dataset:
    x, y = load_digits()
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=0).repeat()
            .batch(batch_size, drop_remainder=True).prefetch(2))


class SplitModel:
    """Two Dense layers, each built (its variables created) on its own GPU."""

    def __init__(self, hidden: int = 128, classes: int = 10, seed: int = 0):
        keras.utils.set_random_seed(seed)
        with tf.device("/GPU:0"):
            self.dense_1 = keras.layers.Dense(hidden, activation="relu", name="dense_1")
            self.dense_1.build((None, 64))
        with tf.device("/GPU:1"):
            self.head = keras.layers.Dense(classes, name="head")
            self.head.build((None, hidden))
        self.variables = self.dense_1.trainable_variables + self.head.trainable_variables

    def __call__(self, x):
        with tf.device("/GPU:0"):
            h = self.dense_1(x)
        with tf.device("/GPU:1"):  # h crosses GPU:0 -> GPU:1 here
            return self.head(h)


def make_train_step(model: SplitModel, optimizer):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        with tf.device("/GPU:0"):  # every gradient op on GPU:0
            grads = tape.gradient(loss, model.variables)
        optimizer.apply_gradients(zip(grads, model.variables))
        return loss

    return train_step


def train(steps: int, batch_size: int, learning_rate: float, *, ctx=None, log_every: int = 10,
          save_every: int = 50, timing_out: str | None = None, warmup: int = 20, block: int = 200) -> float:
    """Train `steps` steps; with Pinpoint's `ctx` (train.entrypoint), resume from the latest
    checkpoint and save one every `save_every` steps. `timing_out` gets the steady examples/s after
    `warmup` steps, and the clock (time.monotonic, one clock for every process) at that step and
    every `block` steps after it, so two processes' rates can be compared over the same seconds."""
    model = SplitModel()
    optimizer = keras.optimizers.SGD(learning_rate)
    optimizer.build(model.variables)
    step_fn = make_train_step(model, optimizer)
    start = 0
    if ctx is not None:
        start = ctx.checkpoint(dense_1=model.dense_1, head=model.head, optimizer=optimizer)
    loss = float("nan")
    it = iter(dataset(batch_size))
    t0 = first = None
    stamps = []
    for step in range(start + 1, steps + 1):
        if step == start + 1 + warmup:
            t0, first = time.perf_counter(), step
        if first is not None and (step - first) % block == 0:
            stamps.append(time.monotonic())
        x, y = next(it)
        loss = float(step_fn(x, y)) if step % log_every == 0 or step == steps else step_fn(x, y)
        if step % log_every == 0 or step == steps:
            log(step, loss=loss)
            print(f"step {step}/{steps}: loss {loss:.4f}", flush=True)
        if ctx is not None and (step % save_every == 0 or step == steps):
            ctx.save(step)
    if timing_out:
        secs = time.perf_counter() - t0 if t0 is not None else None
        timed = steps - first + 1 if first is not None else 0
        with open(timing_out, "w") as f:  # steady state: after `warmup` steps, the last loss read back
            json.dump({"examples_per_sec": timed * batch_size / secs if secs else None, "batches": steps - start,
                       "batches_timed": timed, "batch_size": batch_size, "block": block, "stamps": stamps}, f)
    return float(loss)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--timing-out", help="write the steady-state examples/s to this JSON file")
    p.add_argument("--warmup-steps", type=int, default=20, help="steps before the steady state (--timing-out)")
    args = p.parse_args(argv)
    train(args.steps, args.batch_size, args.learning_rate, timing_out=args.timing_out, warmup=args.warmup_steps)


def entrypoint(ctx) -> None:
    """The Pinpoint train step: checkpoints in the run folder, resumed after a restart."""
    args = ctx.args or {}
    train(int(args.get("steps", 200)), int(args.get("batch_size", 32)), float(args.get("learning_rate", 0.1)),
          ctx=ctx, save_every=int(args.get("save_every", 50)), timing_out=args.get("timing_out"))


if __name__ == "__main__":
    main()
