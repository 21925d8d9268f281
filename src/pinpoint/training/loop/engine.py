"""What Pinpoint's own loop trains, for the single-process path and every cluster task: the
data, model, optimizer and step counter (`build_state`), the input pipeline, XLA's choice and
the final evaluation. The run itself: training.loop.controller; who the task is:
training.setup.TaskContext."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pinpoint.config import Config
from pinpoint.devices import device_scope
from pinpoint.errors import ConfigError
from pinpoint.training.setup import TaskContext
from pinpoint.training.skeleton import input_pipelines, open_checkpoints

EVAL_LIMIT = 4096  # examples used for the final accuracy (cheap even for large synthetic sets)


@dataclass
class TrainState:
    """Everything a run trains: built before the run folder exists, so bad user code or data
    fails with nothing written. The input pipeline comes later (it starts at the resumed step)."""

    data: Any  # training.input.data.Data
    model: Any
    optimizer: Any
    step_var: Any
    objective: Any  # training.objectives.Objective
    replicas: int  # replicas the global batch is split over (1 for parameter_server's steps)


def build_state(cfg: Config, ctx: TaskContext) -> TrainState:
    """Data (probed), model, optimizer and step counter, each on its configured device."""
    import keras
    import tensorflow as tf

    from pinpoint.distribute.emulation import eager_default
    from pinpoint.training.input.batch import check_divisible
    from pinpoint.training.input.data import load_data
    from pinpoint.training.loop.models import make_model, ps_variable_pins, remember_ps_pins
    from pinpoint.training.objectives import get_objective

    t, pin, dm = cfg.train, cfg.train.pinning, ctx.device_map
    keras.utils.set_random_seed(t.seed)
    # Global in Keras: set on every run (a float32 run after a mixed one must not inherit it).
    keras.mixed_precision.set_global_policy(t.precision)
    objective = get_objective(cfg)
    data = load_data(cfg)
    # parameter_server: every step is one replica's step on one worker, with the whole batch.
    replicas = 1 if ctx.coordinator is not None else ctx.strategy.num_replicas_in_sync
    check_divisible(t.batch_size, replicas)
    layer_devices = {name: dm.physical(dev) for name, dev in pin.layers.items()}
    # parameter_server: pinning.layers names a ps task per layer; only the variables go there
    # (the layer still computes on the worker), so the model is built unpinned under ps_variable_pins.
    ps_pins = layer_devices if t.strategy == "parameter_server" else {}
    if ps_pins:
        layer_devices = {}
    # Under GPU emulation with strategy `none`, state goes where a GPU machine's eager runtime
    # creates it (/GPU:0), not on the host.
    with ps_variable_pins(ps_pins), eager_default(dm, t.strategy), ctx.strategy.scope():
        # Variables pinned: every variable (model and optimizer slots) is created here.
        with device_scope(dm.physical(pin.variables) if pin.variables else None):
            model = make_model(cfg, data, layer_devices)
            if ps_pins:
                remember_ps_pins(model, ps_pins, t.model)
            if t.optimizer == "adam":
                optimizer = keras.optimizers.Adam(t.learning_rate)
            else:
                optimizer = keras.optimizers.SGD(t.learning_rate)
            if t.precision == "mixed_float16":
                # float16 gradients underflow: scale the loss up, unscale before the update.
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    if not (t.builtin_model and data.arrays is not None):
        check_forward(cfg, model, data, objective)
    return TrainState(data, model, optimizer, step_var, objective, replicas)


def restore(cfg: Config, out, ctx: TaskContext, state: TrainState, resume_prefix: str | None = None):
    """The run's checkpoints (training.checkpoints.Checkpoints) with the latest good one restored
    into `state` (or `resume_prefix`, fetched from an MLflow run); state.step_var holds its step."""
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(model=state.model, optimizer=state.optimizer, step=state.step_var)
    return open_checkpoints(cfg, out, ctx, ckpt, resume_prefix)[0]


def make_trainer(cfg: Config, ctx: TaskContext, state: TrainState):
    """The Trainer for `state`, starting at state.step_var (the restored step), its input
    pipeline positioned there."""
    from pinpoint.distribute.emulation import GpuPlacement
    from pinpoint.training.loop.trainer import Trainer

    pin, dm = cfg.train.pinning, ctx.device_map
    start = int(state.step_var.numpy())
    return Trainer(ctx.strategy, state.model, state.optimizer, make_pipeline(cfg, ctx, state, start), state.objective,
                   gradient_device=dm.physical(pin.gradients) if pin.gradients else None,
                   backward_follows_layers=bool(pin.layers) and pin.layers_backward == "follow",
                   coordinator=ctx.coordinator, start_step=start, jit_compile=use_jit(cfg),
                   trace_scope=GpuPlacement(dm, pin, soft_placement=pin.soft_placement))


def check_forward(cfg: Config, model, data, objective) -> None:
    """One forward pass and loss on two real examples: a model whose output does not fit the
    labels, or a loss that is not per-example, fails here in one line instead of mid-run."""
    x, y = next(iter(data.eval_batches(2)))
    try:
        per_example = objective.loss(y, model(x, training=False))
    except Exception as err:  # noqa: BLE001 - user model/loss on user data: one line
        from pinpoint.usercode import last_line

        raise ConfigError(
            f"train.model: got {cfg.train.model!r}; its output does not fit the labels "
            f"of train.data under loss '{cfg.train.loss}' ({last_line(err)}); "
            "make the model's output match the labels (e.g. num_classes units for class ids)"
        ) from None
    if per_example.shape.rank != 1:
        raise ConfigError(
            f"train.loss: got {cfg.train.loss!r}; it returned shape {list(per_example.shape)} "
            "for a batch of 2; return one loss per example (shape [batch]), not a reduced value"
        )


def make_pipeline(cfg: Config, ctx: TaskContext, state: TrainState, start_step: int = 0):
    """This task's input pipeline on the input device, positioned at `start_step`."""
    pin, dm = cfg.train.pinning, ctx.device_map
    input_device = dm.physical(pin.input) if pin.input else dm.host
    worker, workers = input_pipelines(cfg, ctx)
    local = len(dm.replica_devices) if ctx.multi_worker else None
    return state.data.pipeline(cfg, cfg.train.batch_size, state.replicas, input_device, worker=worker,
                               num_workers=workers, local_replicas=local, start_step=start_step)


def use_jit(cfg: Config) -> bool:
    """XLA on the fast path: as configured, else auto (built-in models under single-device
    strategies without variables/gradients/layers pinning, since XLA fuses a function onto one
    device). A user model is not compiled unless asked (train.jit_compile: true): an op XLA
    cannot compile would otherwise fail mid-run."""
    t, pin = cfg.train, cfg.train.pinning
    if t.jit_compile is not None:
        return t.jit_compile  # config load rejects it for central_storage / parameter_server
    return (t.builtin_model and t.strategy in ("none", "one_device")
            and not (pin.variables or pin.gradients or pin.layers))


def evaluate(model, data, objective, limit: int = EVAL_LIMIT) -> dict[str, float | None]:
    """Loss (and accuracy where the objective has one) on the first `limit` examples."""
    import tensorflow as tf

    loss = correct = 0.0
    n = 0
    for x, y in data.eval_batches(limit):
        x, y = tf.nest.map_structure(tf.convert_to_tensor, x), tf.convert_to_tensor(y)
        pred = model(x, training=False)
        loss += float(tf.reduce_sum(objective.loss(y, pred)))
        if objective.has_accuracy:
            correct += float(tf.reduce_sum(objective.correct(y, pred)))
        n += int(y.shape[0])
    return {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1) if objective.has_accuracy else None}
