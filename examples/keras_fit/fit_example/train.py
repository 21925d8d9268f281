"""Digits classifier trained with `model.fit` under `tf.distribute.MirroredStrategy()`.

Plain TensorFlow: nothing here imports Pinpoint but its copy of the digits (scikit-learn's, when
Pinpoint is not installed). Run it as a script, under `pinpoint trace`,
or as the pipeline's train step through `entrypoint(ctx)` (config.yaml).
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import tensorflow as tf

try:
    from pinpoint.training.input.digits import load_digits
except ImportError:  # running without Pinpoint installed
    from sklearn.datasets import load_digits as _load_digits

    def load_digits():
        return _load_digits(return_X_y=True)


def dataset(batch_size: int, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The digits as a repeated, shuffled, batched tf.data pipeline."""
    x, y = load_digits()
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.shuffle(2048, seed=0).repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu", name="hidden"),
        keras.layers.Dense(10, name="logits"),
    ], name="digits_mlp")


def compile_model(model: keras.Model, learning_rate: float) -> keras.Model:
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class TimeHistory(keras.callbacks.Callback):
    """Steady-state throughput (as TF's official models measure it): examples per second from
    the end of batch `warmup` to the end of training; and the clock (time.monotonic, one clock
    for every process) at that batch and every `block` batches after it, as TimeHistory's
    `log_steps`, so two processes' rates can be compared over the same seconds."""

    def __init__(self, batch_size: int, warmup: int, block: int = 100):
        super().__init__()
        self.batch_size, self.warmup, self.block = batch_size, warmup, block
        self.batches, self.t0, self.t1 = 0, None, None
        self.stamps: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == self.warmup:
            self.t0 = time.perf_counter()
        self.t1 = time.perf_counter()
        if self.batches >= self.warmup and (self.batches - self.warmup) % self.block == 0:
            self.stamps.append(time.monotonic())

    def result(self) -> dict:
        timed = self.batches - self.warmup
        secs = (self.t1 - self.t0) if self.t0 is not None else None
        return {"examples_per_sec": timed * self.batch_size / secs if secs else None, "batches": self.batches,
                "batches_timed": timed, "batch_size": self.batch_size, "block": self.block, "stamps": self.stamps}


def fit(strategy, *, epochs: int, steps_per_epoch: int, batch_size: int, learning_rate: float,
        callbacks=(), input_context=None, timing_out: str | None = None, warmup: int = 20):
    with strategy.scope():
        model = compile_model(build_model(), learning_rate)
    timer = TimeHistory(batch_size, warmup=min(epochs * steps_per_epoch, warmup))
    history = model.fit(dataset(batch_size, input_context), epochs=epochs, steps_per_epoch=steps_per_epoch,
                        callbacks=[*callbacks, timer], verbose=2)
    if timing_out:
        with open(timing_out, "w") as f:
            json.dump(timer.result(), f)
    return model, history


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--timing-out", help="write the steady-state examples/s to this JSON file")
    p.add_argument("--warmup-batches", type=int, default=20, help="batches before the steady state (--timing-out)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    strategy = tf.distribute.MirroredStrategy()  # every GPU this machine has
    print(f"training on {strategy.num_replicas_in_sync} replica(s)")
    _, history = fit(strategy, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                     batch_size=args.batch_size, learning_rate=args.learning_rate, timing_out=args.timing_out,
                     warmup=args.warmup_batches)
    print(f"final loss {history.history['loss'][-1]:.4f}, accuracy {history.history['accuracy'][-1]:.3f}")


def entrypoint(ctx) -> None:
    """The Pinpoint train step: the platform builds the strategy, owns checkpoints and MLflow."""
    args = parse_args(ctx.args)
    fit(ctx.strategy, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, batch_size=args.batch_size,
        learning_rate=args.learning_rate, callbacks=ctx.callbacks(), input_context=ctx.input_context,
        timing_out=args.timing_out, warmup=args.warmup_batches)


if __name__ == "__main__":
    main()
