"""The objective: a per-example loss and, where it applies, a per-example accuracy.

The trainer sums per-example losses and divides by the GLOBAL batch, so the cross-replica sum
of gradients is the gradient of the mean loss, whatever the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pinpoint.config import Config
from pinpoint.errors import ConfigError

CLASSIFICATION = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


@dataclass(frozen=True)
class Objective:
    name: str
    loss: Callable  # (y_true, y_pred) -> [batch] float32
    correct: Callable | None  # (y_true, y_pred) -> [batch] float32 (1 = right), None: loss only

    @property
    def has_accuracy(self) -> bool:
        return self.correct is not None


def get_objective(cfg: Config) -> Objective:
    import keras
    import tensorflow as tf

    t = cfg.train
    logits = t.from_logits

    def f32(y):
        # Mixed precision: the model may output float16/bfloat16; losses are taken in float32.
        return tf.cast(y, tf.float32)

    if t.loss == "sparse_categorical_crossentropy":
        loss = lambda y, p: keras.losses.sparse_categorical_crossentropy(y, f32(p), from_logits=logits)
        def correct(y, p):
            y = tf.reshape(y, [-1]) if y.shape.rank != 1 else y
            kind = y.dtype if y.dtype in (tf.int32, tf.int64) else tf.int64
            return tf.cast(tf.equal(tf.argmax(p, -1, output_type=kind), tf.cast(y, kind)), tf.float32)
    elif t.loss == "categorical_crossentropy":
        loss = lambda y, p: keras.losses.categorical_crossentropy(f32(y), f32(p), from_logits=logits)
        correct = lambda y, p: tf.cast(tf.equal(tf.argmax(p, -1), tf.argmax(y, -1)), tf.float32)
    elif t.loss == "binary_crossentropy":
        threshold = 0.0 if logits else 0.5
        loss = lambda y, p: keras.losses.binary_crossentropy(f32(y), f32(p), from_logits=logits)

        def correct(y, p):
            p = tf.reshape(f32(p), [tf.shape(p)[0], -1])
            y = tf.reshape(f32(y), tf.shape(p))
            return tf.reduce_mean(tf.cast(tf.equal(tf.cast(p > threshold, tf.float32), y), tf.float32), -1)
    elif t.loss == "mse":
        loss = lambda y, p: keras.losses.mean_squared_error(f32(y), f32(p))
        correct = None
    elif t.loss == "mae":
        loss = lambda y, p: keras.losses.mean_absolute_error(f32(y), f32(p))
        correct = None
    else:
        from pinpoint.usercode import load_callable

        user = load_callable(cfg, "train.loss", t.loss)
        loss = lambda y, p: f32(user(y, p))
        correct = None
    if t.metrics == ():
        correct = None  # metrics: [] -> the loss only
    return Objective(t.loss, loss, correct)


def check_labels(cfg: Config, label_spec) -> None:
    """Refuse a label dtype/shape the loss cannot take (one line, before any training)."""
    t = cfg.train
    dtype, shape = label_spec.dtype, label_spec.shape
    source = f"the labels of train.data ({t.data}) are {dtype.name}{list(shape) if shape.rank else ''}"
    if t.loss == "sparse_categorical_crossentropy" and not dtype.is_integer:
        raise ConfigError(
            f"train.loss: got '{t.loss}' but {source}; it needs integer class ids: "
            "cast the labels to int, or use loss 'mse'/'mae' for a regression, or 'categorical_crossentropy' for one-hot labels"
        )
    if t.loss == "categorical_crossentropy" and (shape.rank != 1 or not (dtype.is_floating or dtype.is_integer)):
        raise ConfigError(
            f"train.loss: got '{t.loss}' but {source}; it needs one-hot label vectors "
            "(shape [num_classes]); use 'sparse_categorical_crossentropy' for class ids"
        )
    if t.loss in ("binary_crossentropy", "mse", "mae") and not (dtype.is_floating or dtype.is_integer):
        raise ConfigError(f"train.loss: got '{t.loss}' but {source}; it needs numeric labels")
