"""The Keras peer: the same model, data, batch size, strategy and devices, trained by `model.fit`.

Settings (kept equal to Pinpoint's so the ratio measures the training loops, not the setups):
- model: `pinpoint.training.loop.models.build_model` (same layers, seeds, initializers), built under
  the same strategy's scope on the same devices (`pinpoint.devices.setup_devices` + `get_strategy`).
  A user's model (`train.model: package.module:callable`) is built by the user's callable, with
  the arguments Pinpoint passes it (`user_model`);
- data: the same arrays (`load_arrays`), global batches of `train.batch_size` from a
  `tf.data` pipeline (shuffle, repeat, batch, prefetch): the idiomatic Keras input, which
  `fit` splits across replicas (and across workers, DATA auto-sharding) itself; streamed data
  (`tfrecord:GLOB` ...): the examples Pinpoint's own reader yields, in the same pipeline (`keras_input`);
- loss: sparse categorical cross-entropy from logits (`train.from_logits`), averaged over the
  global batch (the same objective as Pinpoint's per-replica sum / global batch), metric: accuracy;
- optimizer: the same class and learning rate; `jit_compile` as Pinpoint decides for the config
  (`pinpoint.training.loop.engine.use_jit`), so both sides use XLA or neither does;
- `steps_per_execution = train.log_every`: Pinpoint runs `log_every` steps per tf.function call,
  so Keras gets the same number of steps per host round trip (except under
  MultiWorkerMirroredStrategy, where Keras 3.15 only works with 1; see `steps_per_execution`).
- MultiWorkerMirroredStrategy: Keras 3.15 `fit` does not run under it with 2+ workers
  (tensorflow/tensorflow#72388); the peer applies the two smallest workarounds it needs
  (build the compiled metrics from a plain batch; reduce scalar logs with axis=None).
Steady state: a callback starts the clock at the first execution that begins at or after
`warmup_steps` and stops it at the end of the last one; both callbacks see Python floats of
the logs (Keras converts them), so both ends are host sync points.
"""

from __future__ import annotations

import time
from typing import Any


def _optimizer(keras, cfg):
    lr = cfg.train.learning_rate
    return keras.optimizers.Adam(lr) if cfg.train.optimizer == "adam" else keras.optimizers.SGD(lr)


def _timer_callback(keras, warmup_steps: int):
    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.t0: float | None = None
            self.first_step: int | None = None
            self.t1: float | None = None
            self.last_step: int | None = None
            self.t_first_end: float | None = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.t0 is None and batch >= warmup_steps:
                self.t0, self.first_step = time.perf_counter(), batch

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.t_first_end is None:
                self.t_first_end = now
            if self.t0 is not None:
                self.t1, self.last_step = now, batch

    return StepTimer()


def measure(spec: dict) -> dict[str, Any]:
    """A worker spec's Keras run (kind keras, or keras_task: one task of a multi-worker run):
    the timing record, with its wall time and MFU fields."""
    from benchmarks.worker import _mfu_fields
    from pinpoint.config import config_from_dict

    cfg = config_from_dict(spec["config"])
    t0 = time.perf_counter()
    rec = keras_fit(cfg, warmup_steps=spec["warmup_steps"], multi_worker=spec["kind"] == "keras_task")
    rec["wall_s"] = time.perf_counter() - t0
    rec.update(_mfu_fields(cfg, rec, peak=spec.get("peak", False)))
    return rec


def keras_fit(cfg, *, warmup_steps: int, multi_worker: bool = False) -> dict[str, Any]:
    """Train cfg's model with Keras `fit` in this process; return the timing record."""
    from pinpoint.devices import setup_devices

    t_start = time.perf_counter()
    dm = setup_devices(cfg)
    import keras
    import tensorflow as tf

    keras.config.disable_traceback_filtering()  # a failure in fit shows where it happened
    from pinpoint.distribute.emulation import eager_default
    from pinpoint.distribute.strategies import get_strategy
    from pinpoint.training.input.data import load_arrays

    if multi_worker:
        # Exactly how `pinpoint train --task` builds it: emulated GPUs (logical CPUs 1..n) are
        # handed to the strategy as this task's local devices.
        from pinpoint.distribute.strategies import emulated_local_devices as _emulated_local_devices

        with _emulated_local_devices(dm):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver()
            )
        replica_devices = list(strategy.extended.worker_devices)
    else:
        # Not emulated=dm.emulated: Keras' multi-step loop puts each step in a tf.cond, and the
        # collective all-reduce Pinpoint uses among emulated GPUs fails there ("You must feed a
        # value for placeholder ... while/cond/Placeholder_1"). The peer keeps MirroredStrategy's
        # reduction to the host, the strategy Keras can run on these devices.
        strategy = get_strategy(cfg.train.strategy, dm.replica_devices, host=dm.host)
        replica_devices = list(dm.replica_devices)
    gb = cfg.train.batch_size
    ds, input_shape, num_classes = keras_input(cfg)
    # Strategy none under emulation: Pinpoint places the model and its unrequested ops on the
    # emulated /GPU:0 (where a GPU machine puts them); so does the peer, state and fit alike.
    default = eager_default(dm, cfg.train.strategy)
    with default, strategy.scope():
        model = compiled_model(cfg, input_shape, num_classes, multi_worker=multi_worker)
        if multi_worker:
            # Keras 3.15 `fit` under MultiWorkerMirroredStrategy with 2+ workers fails before the
            # first step: to build the compiled loss/metrics it calls strategy.reduce on the
            # first (x, y) batch, a tuple, which the collective reduce cannot take. Build them
            # from a plain batch instead (shapes only, no training step) and skip that reduce.
            arrays = load_arrays(cfg)
            model._symbolic_build(data_batch=(arrays.x[:gb], arrays.y[:gb]))
            model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
            _patch_multi_worker_log_reduction()
    timer = _timer_callback(keras, warmup_steps)
    t_fit = time.perf_counter()
    with eager_default(dm, cfg.train.strategy):
        hist = model.fit(ds, epochs=1, steps_per_epoch=cfg.train.steps, verbose=0, callbacks=[timer])
    t_end = time.perf_counter()
    steps_timed = None if timer.t0 is None else timer.last_step - timer.first_step + 1
    secs = None if timer.t0 is None else timer.t1 - timer.t0
    eps = gb * steps_timed / secs if secs else None
    return {
        "examples_per_sec": eps,
        "step_time_s": secs / steps_timed if secs else None,
        "steps_timed": steps_timed,
        "train_s": t_end - t_fit,
        "first_step_s": (timer.t_first_end - t_start) if timer.t_first_end else None,
        "final_loss": float(hist.history["loss"][-1]),
        "final_accuracy": float(hist.history["accuracy"][-1]),
        "replica_devices": replica_devices,
        "model_layers": dense_shapes(model),
        "num_replicas_in_sync": int(strategy.num_replicas_in_sync),
        "global_batch": gb,
        "steps_per_execution": steps_per_execution(cfg, multi_worker),
        "jit_compile": jit_setting(cfg),
    }


def keras_input(cfg):
    """The peer's input as a Keras user writes it: the examples shuffled with the config's seed
    (in memory: over all of them; streamed, e.g. `tfrecord:GLOB`: the examples Pinpoint's own
    reader yields, the same files parsed with the same feature spec, over `train.shuffle_buffer`),
    repeated, in global batches, prefetched. Returns the dataset, one example's input shape and
    the number of classes."""
    import tensorflow as tf

    from pinpoint.training.input.data import load_arrays, load_data

    t = cfg.train
    if t.streamed:
        data = load_data(cfg)
        examples, buffer = data.stream.examples(), t.shuffle_buffer
        input_shape, num_classes = data.input_shape, data.num_classes
    else:
        arrays = load_arrays(cfg)
        examples, buffer = tf.data.Dataset.from_tensor_slices((arrays.x, arrays.y)), len(arrays.x)
        input_shape, num_classes = (arrays.features,), arrays.num_classes
    ds = (
        examples.shuffle(buffer, seed=t.seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(t.batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return ds, input_shape, num_classes


def compiled_model(cfg, input_shape, num_classes, *, multi_worker: bool = False):
    """The peer's model, compiled as `fit` runs it (call under the strategy's scope)."""
    import keras

    from pinpoint.training.loop.models import build_model

    keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.builtin_model:
        model = build_model(cfg.train.model, input_shape, num_classes, seed=cfg.train.seed)
    else:
        model = user_model(cfg, input_shape, num_classes)
    model.compile(
        optimizer=_optimizer(keras, cfg),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.train.from_logits),
        metrics=["accuracy"],
        jit_compile=jit_setting(cfg),
        steps_per_execution=steps_per_execution(cfg, multi_worker),
    )
    return model


def user_model(cfg, input_shape, num_classes):
    """The user's `package.module:callable`, imported from `train.code_dir` and called as its
    signature asks, through the same code Pinpoint uses (`pinpoint.usercode`): `train.model_args`
    plus input_shape, num_classes and seed where it names them, so both sides build one model."""
    from pinpoint import usercode

    t = cfg.train
    fn = usercode.load_callable(cfg, "train.model", t.model)
    offered = {"input_shape": input_shape, "num_classes": num_classes, "seed": t.seed}
    return usercode.call(fn, "train.model", t.model, t.model_args, offered, "train.model_args")


def jit_setting(cfg) -> bool:
    """The XLA choice Pinpoint makes for this config, so both sides compile alike (Keras's own
    "auto" turns XLA off on CPU-only machines and on for GPUs)."""
    try:
        from pinpoint.training.loop.engine import use_jit
    except ImportError:  # a trainer without XLA support
        return False
    return bool(use_jit(cfg))


def steps_per_execution(cfg, multi_worker: bool) -> int:
    """Pinpoint's steps per tf.function call, except under MultiWorkerMirroredStrategy: there
    Keras 3.15's multi-step loop (a tf.while_loop with the step in a tf.cond) fails with "You
    must feed a value for placeholder tensor 'while/cond/Placeholder'", so Keras gets 1."""
    return 1 if multi_worker else cfg.train.log_every


def _patch_multi_worker_log_reduction() -> None:
    """Keras 3.15 averages each step's logs across workers with strategy.reduce(MEAN, v, axis=0),
    which fails for the scalar loss/accuracy ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388). Reduce scalars with axis=None (the same mean across
    replicas, one collective per log as before); everything else goes to Keras unchanged."""
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_pinpoint_bench_patch", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(strategy):
            def _reduce(v):
                if not tf_trainer._is_per_replica_instance(v):
                    return v
                rank = strategy.experimental_local_results(v)[0].shape.rank
                return strategy.reduce("MEAN", v, axis=None if rank == 0 else 0)

            return tree.map_structure(_reduce, values)
        return original(values, strategy, reduction)

    reduce_per_replica._pinpoint_bench_patch = True
    tf_trainer.reduce_per_replica = reduce_per_replica


def dense_shapes(model) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of every rank-2 kernel, in layer order (for the FLOPs count)."""
    shapes = []
    for v in model.trainable_variables:
        shape = tuple(int(d) for d in v.shape)
        if len(shape) == 2 and "kernel" in v.path:
            shapes.append(shape)
    return shapes
