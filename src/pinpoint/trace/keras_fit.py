"""Keras `model.fit` under Pinpoint: a callback that sends Keras' own logs (every `log_every`
batches and every epoch) and fit's parameters to the run, added to every `fit` call of the
program without editing it (as MLflow's autolog does)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import keras

from pinpoint.tfcompat.patches import Patches


class KerasLogger(keras.callbacks.Callback):
    """Keras logs -> `send(metrics, step=)`; params -> `params(dict)`; the last logs kept in `final`."""

    def __init__(self, send: Callable[..., None], params: Callable[[dict], None] | None = None,
                 *, log_every: int = 10, batch_size: int | None = None,
                 quiet: Callable[[], Any] = contextlib.nullcontext):
        super().__init__()
        self.send, self.send_params = send, params
        # Reading fit's parameters runs eager ops (the learning rate's read): not the program's.
        self.quiet = quiet
        self.log_every = max(1, int(log_every))
        self.batch_size = batch_size
        self.step = 0  # batches trained over every fit call of the program
        self.final: dict[str, float] = {}
        self.epochs_done = 0

    def on_train_begin(self, logs=None):
        if self.send_params is not None:
            with self.quiet():
                params = fit_params(self.model, self.params, self.batch_size)
            self.send_params(params)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if logs and self.step % self.log_every == 0:
            self.send(_floats(logs), step=self.step)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done += 1
        if logs:
            values = _floats(logs)
            self.final = values
            self.send({f"epoch_{k}": v for k, v in values.items()}, step=self.step)

    def summary(self) -> dict:
        """metrics.json's Keras part: final_* from the last epoch's logs."""
        out: dict[str, Any] = {f"final_{k}": v for k, v in self.final.items()}
        out["epochs"] = self.epochs_done
        out["batches"] = self.step
        return out


def _floats(logs) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def fit_params(model, params: dict, batch_size: int | None) -> dict:
    """What fit trains with: optimizer, learning rate, batch size, epochs, strategy, devices."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    opt = getattr(model, "optimizer", None)
    lr = getattr(opt, "learning_rate", None)
    try:
        lr = float(lr.numpy() if hasattr(lr, "numpy") else lr)
    except (TypeError, ValueError):
        lr = None
    try:
        devices = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):  # the default strategy has none
        devices = []
    out = {
        "fit.optimizer": type(opt).__name__ if opt is not None else None,
        "fit.learning_rate": lr,
        "fit.batch_size": batch_size,
        "fit.epochs": (params or {}).get("epochs"),
        "fit.steps_per_epoch": (params or {}).get("steps"),
        "fit.strategy": type(strategy).__name__,
        "fit.num_replicas": strategy.num_replicas_in_sync,
        "fit.device_count": len(devices) or 1,
        "fit.model": getattr(model, "name", None),
        # From the shapes: tf.size would read every variable (eager ops the program did not run).
        "fit.params": sum(math.prod(v.shape) for v in model.trainable_variables) if model.built else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def batch_size_of(args, kwargs) -> int | None:
    """fit's batch size: its argument, else the (batched) dataset's first dimension."""
    if kwargs.get("batch_size"):
        return int(kwargs["batch_size"])
    x = kwargs.get("x", args[0] if args else None)
    spec = getattr(x, "element_spec", None)
    if spec is None:
        return 32 if x is not None and hasattr(x, "shape") else None  # Keras' default for arrays
    import tensorflow as tf

    first = tf.nest.flatten(spec)[0]
    dim = first.shape[0] if first.shape.rank else None
    return int(dim) if dim is not None else None


class FitPatch:
    """Adds a KerasLogger (from `make_logger(batch_size)`) to every `fit` call that has none."""

    def __init__(self, make_logger: Callable[[int | None], KerasLogger]):
        self.make_logger = make_logger
        self.loggers: list[KerasLogger] = []
        self._patches = Patches()

    def install(self) -> FitPatch:
        original = Patches.current("Model.fit")
        patch = self

        def fit(model, *args, **kwargs):
            callbacks = list(kwargs.get("callbacks") or [])
            if any(isinstance(c, KerasLogger) for c in callbacks):
                return original(model, *args, **kwargs)
            logger = patch.make_logger(batch_size_of(args, kwargs))
            patch.loggers.append(logger)
            callbacks.append(logger)
            kwargs["callbacks"] = callbacks
            try:
                return original(model, *args, **kwargs)
            finally:
                # The logger outlives the call (its summary): it must not keep a model the program
                # drops alive (that model's variables are then reported freed, trace.created).
                logger.set_model(None)

        fit.__wrapped__ = original
        self._patches.replace("Model.fit", fit)
        return self

    def uninstall(self) -> None:
        self._patches.close()

    def summary(self) -> dict:
        """The last fit call's summary (none: {})."""
        return self.loggers[-1].summary() if self.loggers else {}
