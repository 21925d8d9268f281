"""The training driver shared by the single-process path and every cluster task:
data -> model -> Trainer -> steps with logging, checkpoints and one placement capture."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinpoint.config import Config
from pinpoint.devices import DeviceMap
from pinpoint.errors import ConfigError
from pinpoint.runfolder import (
    CHECKPOINTS,
    METRICS,
    PLACEMENT,
    PROFILE,
    TRAIN_LOG,
    atomic_write_json,
    atomic_write_text,
)
from pinpoint.training.hooks import Hook, HookList

EVAL_LIMIT = 4096  # examples used for the final accuracy (cheap even for large synthetic sets)
# train_log.jsonl (and the step metrics) hold this step, then every train.log_every steps: a run
# that starts from step 0 runs its first step as a call of its own, so its record's `time` is
# when the first training step completed (tracing included), not when step log_every did.
FIRST_LOGGED_STEP = 1


@dataclass
class TaskContext:
    """Who this process is in the cluster and what it trains with."""

    strategy: Any
    device_map: DeviceMap
    role: str = "chief"
    index: int = 0
    is_chief: bool = True
    multi_worker: bool = False
    coordinator: Any = None
    extra_info: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return f"{self.role}:{self.index}"


def _device_scope(device: str | None):
    import tensorflow as tf

    return tf.device(device) if device else contextlib.nullcontext()


@dataclass
class TrainState:
    """Everything a run trains: built before the run folder exists, so bad user code or data
    fails with nothing written. The input pipeline comes later (it starts at the resumed step)."""

    data: Any  # training.data.Data
    model: Any
    optimizer: Any
    step_var: Any
    objective: Any  # training.objectives.Objective
    replicas: int  # replicas the global batch is split over (1 for parameter_server's steps)


def build_state(cfg: Config, ctx: TaskContext) -> TrainState:
    """Data (probed), model, optimizer and step counter, each on its configured device."""
    import keras
    import tensorflow as tf

    from pinpoint.training.data import check_divisible, load_data
    from pinpoint.training.emulation import eager_default
    from pinpoint.training.models import make_model
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
    # Under GPU emulation with strategy `none`, state goes where a GPU machine's eager runtime
    # creates it (/GPU:0), not on the host.
    with eager_default(dm, t.strategy), ctx.strategy.scope():
        # Variables pinned: every variable (model and optimizer slots) is created here.
        with _device_scope(dm.physical(pin.variables) if pin.variables else None):
            model = make_model(cfg, data, layer_devices)
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


def check_forward(cfg: Config, model, data, objective) -> None:
    """One forward pass and loss on two real examples: a model whose output does not fit the
    labels, or a loss that is not per-example, fails here in one line instead of mid-run."""
    x, y = next(iter(data.eval_batches(2)))
    try:
        per_example = objective.loss(y, model(x, training=False))
    except Exception as err:  # noqa: BLE001 - user model/loss on user data: one line
        from pinpoint.usercode import last_line

        raise ConfigError(
            f"config error: train.model: got {cfg.train.model!r}; its output does not fit the labels "
            f"of train.data under loss '{cfg.train.loss}' ({last_line(err)}); "
            "make the model's output match the labels (e.g. num_classes units for class ids)"
        ) from None
    if per_example.shape.rank != 1:
        raise ConfigError(
            f"config error: train.loss: got {cfg.train.loss!r}; it returned shape {list(per_example.shape)} "
            "for a batch of 2; return one loss per example (shape [batch]), not a reduced value"
        )


def make_pipeline(cfg: Config, ctx: TaskContext, state: TrainState, start_step: int = 0):
    """This task's input pipeline on the input device, positioned at `start_step`."""
    pin, dm = cfg.train.pinning, ctx.device_map
    input_device = dm.physical(pin.input) if pin.input else dm.host
    worker, workers = 0, 1
    if ctx.multi_worker:
        # Input pipeline ids follow TF's id_in_cluster: the chief first, then the workers.
        worker = ctx.index + (cfg.cluster.chief if ctx.role == "worker" else 0)
        workers = cfg.cluster.replicas
    elif ctx.coordinator is not None:
        workers = cfg.cluster.workers
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


def _next_stop(step: int, total: int, every: tuple[int, ...], capture_at: int | None) -> int:
    stops = [total]
    for e in every:
        if e > 0:
            stops.append((step // e + 1) * e)
    if capture_at is not None and capture_at > step:
        stops.append(capture_at)
    return min(stops)


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


def train(
    cfg: Config,
    out_dir: Path,
    ctx: TaskContext,
    *,
    hooks: list[Hook] | None = None,
    resume_prefix: str | None = None,
    resumed_from_run: str | None = None,
    state: TrainState | None = None,
) -> dict:
    """Train to cfg.train.steps (resuming from the latest good checkpoint); return the metrics."""
    import tensorflow as tf

    from pinpoint.placement.capture import capture_call
    from pinpoint.training.checkpoints import Checkpoints, restore_prefix
    from pinpoint.training.emulation import GpuPlacement
    from pinpoint.training.loop import Trainer

    t, pin, dm = cfg.train, cfg.train.pinning, ctx.device_map
    hook = HookList(hooks or []) if ctx.is_chief else HookList([])
    state = state or build_state(cfg, ctx)
    model, optimizer, step_var = state.model, state.optimizer, state.step_var

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    ckpts = Checkpoints(ckpt, out_dir / CHECKPOINTS, keep=t.keep_checkpoints, is_chief=ctx.is_chief, task=ctx.task)
    if resume_prefix:
        restore_prefix(ckpt, resume_prefix)
    else:
        ckpts.restore_latest()
    start = int(step_var.numpy())
    pipeline = make_pipeline(cfg, ctx, state, start)
    trainer = Trainer(ctx.strategy, model, optimizer, pipeline, state.objective,
                      gradient_device=dm.physical(pin.gradients) if pin.gradients else None,
                      backward_follows_layers=bool(pin.layers) and pin.layers_backward == "follow",
                      coordinator=ctx.coordinator, start_step=start, jit_compile=use_jit(cfg),
                      placement_scope=GpuPlacement(dm, pin, soft_placement=pin.soft_placement))

    num_params = int(sum(v.numpy().size for v in model.trainable_variables))
    info = {
        "config": cfg.model_dump(mode="json"), "strategy": t.strategy, "task": ctx.task,
        "start_step": start, "num_params": num_params, "num_replicas": ctx.strategy.num_replicas_in_sync,
        "devices": list(dm.local_devices), "replica_devices": list(dm.spec_replica_devices),
        "device_aliases": dict(dm.aliases), "pinning": pin.model_dump(mode="json"),
        "out_dir": str(out_dir), "resumed_from_run": resumed_from_run, "data": state.data.source,
        "precision": t.precision, **ctx.extra_info,
    }
    hook.on_train_begin(info)
    if ctx.is_chief and start:
        print(f"pinpoint: resuming from checkpoint step {start}", file=sys.stderr, flush=True)

    pc = cfg.placement
    capture_at = start + pc.warmup_steps if pc.enabled else None
    # Single-client strategies: the first call of the multi-step function is run with graph
    # collection on (it instantiates the function anyway; every later step runs the same
    # graphs), and the graphs are reported for the sampled steps capture_at.. once they ran.
    # parameter_server: one sampled step is run from the coordinator (see Trainer.capture_step).
    loop_capture = pc.enabled and ctx.coordinator is None
    loop_captured = None
    # placement.timing: the sampled steps capture_at.. run as their own call (a later one than
    # the first: no tracing in it) under TensorFlow's profiler (see placement.timing).
    timing_pending = loop_capture and pc.timing
    timed: dict | None = None
    captures: list = []
    log_path = out_dir / TRAIN_LOG
    bar = _progress(ctx.is_chief, start, t.steps)
    last: dict[str, float] = {}
    steady_examples, steady_time = 0, 0.0
    if ctx.is_chief:
        _truncate_log(log_path, start)
    log_file = log_path.open("a") if ctx.is_chief else None
    plain = ctx.is_chief and not sys.stderr.isatty()  # no progress bar: print a line per log step
    try:
        while trainer.step < t.steps:
            step = trainer.step
            if (not loop_capture and capture_at is not None and step == capture_at
                    and len(captures) < pc.sample_steps):
                captured, m = trainer.capture_step(capture_call)
                captures.append(captured)
                capture_at += 1
                n = 1
            else:
                ps_stop = capture_at if not loop_capture or timing_pending else None
                stop = _next_stop(step, t.steps, (t.log_every, t.checkpoint_every), ps_stop)
                if step == 0:
                    # The run's first step is a call of its own and is logged (FIRST_LOGGED_STEP):
                    # train_log.jsonl then says when training really started (after the tracing).
                    stop = FIRST_LOGGED_STEP
                profiled = timing_pending and trainer.calls > 0 and step >= capture_at
                if profiled:
                    stop = min(stop, step + pc.sample_steps)
                n = stop - step
                if loop_capture and trainer.calls == 0:
                    loop_captured, m = trainer.capture_steps(n, capture_call)
                elif profiled:
                    m, timed = _profiled_steps(trainer, n, out_dir, ctx)
                    timing_pending = False
                else:
                    m = trainer.train_steps(n)
                if not state.objective.has_accuracy:
                    m.pop("accuracy", None)
                # The first call includes tracing; the profiled call the profiler's own cost.
                if trainer.calls > 1 and not profiled:
                    steady_examples += n * pipeline.global_batch
                    steady_time += m["step_time"] * n
            last = m
            bar.update(n)
            step = trainer.step
            if step % t.log_every == 0 or step == t.steps or step == FIRST_LOGGED_STEP:
                record = {"step": step, **{k: round(v, 6) for k, v in m.items()}, "time": time.time()}
                if log_file:
                    log_file.write(json.dumps(record) + "\n")
                    log_file.flush()
                acc = f" acc={m['accuracy']:.3f}" if "accuracy" in m else ""
                bar.set_postfix_str(f"loss={m['loss']:.4f}{acc}")
                if plain:
                    print(f"step {step}/{t.steps} loss={m['loss']:.4f}{acc} "
                          f"{m['examples_per_sec']:.0f} ex/s", flush=True)
                hook.on_step_end(step, m)
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == t.steps):
                step_var.assign(step)
                path = ckpts.save(step)
                if path:
                    hook.on_checkpoint(step, path)
    finally:
        bar.close()
        if log_file:
            log_file.close()

    if loop_captured is not None and trainer.step > capture_at:
        from pinpoint.placement.steps import per_step_view

        loop_captured.steps = list(range(capture_at, min(capture_at + pc.sample_steps, trainer.step)))
        captures = [per_step_view(loop_captured)]
    placement = None
    if captures:
        placement = _placement(cfg, ctx, trainer, captures)
        if pc.timing:
            placement["timing"] = _timing(ctx, loop_captured, timed)
        if ctx.multi_worker:  # this task's view; the chief merges them, finish() writes placement.json
            atomic_write_json(out_dir / f"placement-{ctx.role}-{ctx.index}.json", placement)

    final = evaluate(model, state.data, state.objective)
    metrics = {
        "final_loss": last.get("loss"),
        "final_accuracy": final["accuracy"],
        "final_train_accuracy": last.get("accuracy"),
        "eval_loss": final["loss"],
        "examples_per_sec": (steady_examples / steady_time) if steady_time else last.get("examples_per_sec"),
        "steps": trainer.step,
        "start_step": start,
        "global_batch": pipeline.global_batch,
        "num_replicas": ctx.strategy.num_replicas_in_sync,
        "strategy": t.strategy,
        "model": t.model,
        "data": state.data.source,
        "loss": t.loss,
        "precision": t.precision,
        "num_params": num_params,
        "jit_compile": trainer.jit_compile,
        "device_map": dm.to_json(),
        "task": ctx.task,
    }
    return {"metrics": metrics, "placement": placement, "model": model, "hook": hook, "trainer": trainer}


def _truncate_log(path: Path, start: int) -> None:
    """Keep only records up to the resumed step, so every logged step appears exactly once
    after any number of restarts (steps after the checkpoint are redone and logged again)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= start:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a killed writer
    atomic_write_text(path, "".join(k + "\n" for k in kept))


def _profiled_steps(trainer, n: int, out_dir: Path, ctx: TaskContext) -> tuple[dict, dict]:
    """Run n steps under TensorFlow's profiler, the trace in the run folder's profile/ folder."""
    from pinpoint.placement.timing import profile_call

    rel = PROFILE if not ctx.multi_worker else f"{PROFILE}/{ctx.role}-{ctx.index}"
    first = trainer.step
    m, xplane, why = profile_call(lambda: trainer.train_steps(n), out_dir / rel)
    return m, {"steps": list(range(first, first + n)), "xplane": xplane, "why": why, "trace": rel}


def _timing(ctx: TaskContext, loop_captured, timed: dict | None) -> dict:
    """placement.json's `timing` section from the profiled call's trace (see placement.timing)."""
    from pinpoint.placement.naming import Namer
    from pinpoint.placement.steps import display_names
    from pinpoint.placement.timing import not_measured, timing_from_trace

    if loop_captured is None:
        return not_measured("not measured under parameter_server: its steps run as closures in the "
                            "workers' runtimes, out of this process's profiler")
    if timed is None:
        return not_measured("not measured: training ended before the sampled steps ran as their own call")
    if timed["xplane"] is None:
        return dict(not_measured(f"not measured: {timed['why']}"), steps=timed["steps"])
    try:
        timing = timing_from_trace(timed["xplane"], loop_captured.partition_graphs, Namer(ctx.device_map),
                                   display=display_names(loop_captured), steps=timed["steps"])
    except Exception as err:  # noqa: BLE001 - an unreadable trace must not fail a finished run
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return dict(not_measured(f"not measured: the trace could not be read ({type(err).__name__}: {first})"),
                    steps=timed["steps"], trace=timed["trace"])
    timing["trace"] = timed["trace"]
    return timing


def _placement(cfg: Config, ctx: TaskContext, trainer, captures) -> dict:
    from pinpoint.placement.analyze import build_placement

    placement = build_placement(
        captures, variables=trainer.variables(), plan=cfg.train.pinning, strategy=cfg.train.strategy,
        device_map=ctx.device_map, task=ctx.task, gradient_scope="gradients",
    )
    placement.setdefault("device_aliases", dict(ctx.device_map.aliases))
    placement.setdefault("device_map", ctx.device_map.to_json())
    describe = getattr(trainer.pipeline, "describe", None)
    if describe is not None:  # a tf.data pipeline: its ops run inside the iterator, on its device
        placement["input_pipeline"] = {**describe(), "device": ctx.device_map.spec(trainer.pipeline.device)}
    placement["precision"] = {
        "policy": cfg.train.precision,
        # Casts between float32 variables and float16/bfloat16 compute, per device.
        "casts_by_device": {d: types["Cast"] for d, types in (placement.get("op_types_by_device") or {}).items()
                            if types.get("Cast")},
    }
    return placement


def finish(cfg: Config, out_dir: Path, result: dict, *, placement: dict | None = None) -> dict:
    """Chief only: write placement.json (the cluster's merged `placement`, else this process's own)
    and metrics.json, tell the hooks, print a summary. placement.json's only writer."""
    metrics = result["metrics"]
    placement = placement if placement is not None else result.get("placement")
    if placement is not None:
        atomic_write_json(out_dir / PLACEMENT, placement)
        result["hook"].on_placement(placement)
    atomic_write_json(out_dir / METRICS, metrics)
    result["hook"].on_train_end(metrics, result["model"])
    print(_summary(placement or result.get("placement"), metrics), flush=True)
    return metrics


def _summary(placement, metrics) -> str:
    try:
        from pinpoint.placement.summary import format_summary

        if placement is not None:
            return format_summary(placement, metrics)
    except ImportError:
        pass
    if metrics.get("final_loss") is None:  # resumed from a checkpoint already at train.steps
        return (f"nothing to train: the checkpoint is already at step {metrics['steps']} (train.steps); "
                f"accuracy {metrics['final_accuracy']:.3f}. Use a new --out or raise train.steps to train more.")
    return (f"trained {metrics['steps']} steps with {metrics['strategy']}: final loss "
            f"{metrics['final_loss']:.4f}, accuracy {metrics['final_accuracy']:.3f}, "
            f"{metrics['examples_per_sec']:.0f} examples/s")


class _NoBar:
    def update(self, n):
        pass

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass


def _progress(is_chief: bool, start: int, total: int):
    if not is_chief:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=start, file=sys.stderr, desc="train", unit="step",
                dynamic_ncols=True, mininterval=0.5, disable=None)  # None: off when not a TTY
