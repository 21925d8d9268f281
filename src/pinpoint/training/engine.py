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
from pinpoint.runfolder import (
    CHECKPOINTS,
    METRICS,
    PLACEMENT,
    TRAIN_LOG,
    atomic_write_json,
    atomic_write_text,
)
from pinpoint.training.hooks import Hook, HookList

EVAL_LIMIT = 4096  # examples used for the final accuracy (cheap even for large synthetic sets)


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


def build_state(cfg: Config, ctx: TaskContext):
    """Data pipeline, model, optimizer and step counter, each on its configured device."""
    import keras
    import tensorflow as tf

    from pinpoint.training.data import InputPipeline, load_arrays
    from pinpoint.training.models import build_model

    t, pin, dm = cfg.train, cfg.train.pinning, ctx.device_map
    keras.utils.set_random_seed(t.seed)
    arrays = load_arrays(cfg)
    # parameter_server: every step is one replica's step on one worker, with the whole batch.
    replicas = 1 if ctx.coordinator is not None else ctx.strategy.num_replicas_in_sync
    input_device = dm.physical(pin.input) if pin.input else dm.host
    pipeline = InputPipeline(arrays, t.batch_size, replicas, input_device, t.seed)
    layer_devices = {name: dm.physical(dev) for name, dev in pin.layers.items()}
    with ctx.strategy.scope():
        # Variables pinned: every variable (model and optimizer slots) is created here.
        with _device_scope(dm.physical(pin.variables) if pin.variables else None):
            model = build_model(t.model, (arrays.features,), arrays.num_classes, layer_devices, seed=t.seed)
            if t.optimizer == "adam":
                optimizer = keras.optimizers.Adam(t.learning_rate)
            else:
                optimizer = keras.optimizers.SGD(t.learning_rate)
            optimizer.build(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    return arrays, pipeline, model, optimizer, step_var


def use_jit(cfg: Config) -> bool:
    """XLA on the fast path: as configured, else auto (single-device strategies without
    variables/gradients/layers pinning, since XLA fuses a function onto one device)."""
    t, pin = cfg.train, cfg.train.pinning
    if t.jit_compile is not None:
        return t.jit_compile  # config load rejects it for central_storage / parameter_server
    return t.strategy in ("none", "one_device") and not (pin.variables or pin.gradients or pin.layers)


def _next_stop(step: int, total: int, every: tuple[int, ...], capture_at: int | None) -> int:
    stops = [total]
    for e in every:
        if e > 0:
            stops.append((step // e + 1) * e)
    if capture_at is not None and capture_at > step:
        stops.append(capture_at)
    return min(stops)


def evaluate(model, arrays, limit: int = EVAL_LIMIT) -> dict[str, float]:
    """Loss and accuracy of the model on (the first `limit` examples of) the data."""
    import keras
    import numpy as np
    import tensorflow as tf

    x, y = arrays.x[:limit], arrays.y[:limit]
    logits = model(tf.constant(x), training=False)
    loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    acc = float(np.mean(np.argmax(np.asarray(logits), -1) == y))
    return {"loss": float(loss), "accuracy": acc}


def train(
    cfg: Config,
    out_dir: Path,
    ctx: TaskContext,
    *,
    hooks: list[Hook] | None = None,
    resume_prefix: str | None = None,
    resumed_from_run: str | None = None,
) -> dict:
    """Train to cfg.train.steps (resuming from the latest good checkpoint); return the metrics."""
    import tensorflow as tf

    from pinpoint.placement.capture import capture_call
    from pinpoint.training.checkpoints import Checkpoints, restore_prefix
    from pinpoint.training.loop import Trainer

    t, pin, dm = cfg.train, cfg.train.pinning, ctx.device_map
    hook = HookList(hooks or []) if ctx.is_chief else HookList([])
    arrays, pipeline, model, optimizer, step_var = build_state(cfg, ctx)

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    ckpts = Checkpoints(ckpt, out_dir / CHECKPOINTS, keep=t.keep_checkpoints, is_chief=ctx.is_chief, task=ctx.task)
    if resume_prefix:
        restore_prefix(ckpt, resume_prefix)
    else:
        ckpts.restore_latest()
    start = int(step_var.numpy())
    trainer = Trainer(ctx.strategy, model, optimizer, pipeline,
                      gradient_device=dm.physical(pin.gradients) if pin.gradients else None,
                      coordinator=ctx.coordinator, start_step=start, jit_compile=use_jit(cfg))

    num_params = int(sum(v.numpy().size for v in model.trainable_variables))
    info = {
        "config": cfg.model_dump(mode="json"), "strategy": t.strategy, "task": ctx.task,
        "start_step": start, "num_params": num_params, "num_replicas": ctx.strategy.num_replicas_in_sync,
        "devices": list(dm.local_devices), "replica_devices": list(dm.spec_replica_devices),
        "device_aliases": dict(dm.aliases), "pinning": pin.model_dump(mode="json"),
        "out_dir": str(out_dir), "resumed_from_run": resumed_from_run, **ctx.extra_info,
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
                ps_stop = capture_at if not loop_capture else None
                stop = _next_stop(step, t.steps, (t.log_every, t.checkpoint_every), ps_stop)
                n = stop - step
                if loop_capture and trainer.calls == 0:
                    loop_captured, m = trainer.capture_steps(n, capture_call)
                else:
                    m = trainer.train_steps(n)
                if trainer.calls > 1:  # the first call includes tracing
                    steady_examples += n * pipeline.global_batch
                    steady_time += m["step_time"] * n
            last = m
            bar.update(n)
            step = trainer.step
            if step % t.log_every == 0 or step == t.steps:
                record = {"step": step, **{k: round(v, 6) for k, v in m.items()}, "time": time.time()}
                if log_file:
                    log_file.write(json.dumps(record) + "\n")
                    log_file.flush()
                bar.set_postfix(loss=f"{m['loss']:.4f}", acc=f"{m['accuracy']:.3f}")
                if plain:
                    print(f"step {step}/{t.steps} loss={m['loss']:.4f} acc={m['accuracy']:.3f} "
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
        name = PLACEMENT if not ctx.multi_worker else f"placement-{ctx.role}-{ctx.index}.json"
        if ctx.is_chief or ctx.multi_worker:
            atomic_write_json(out_dir / name, placement)
        if not ctx.multi_worker:
            hook.on_placement(placement)

    final = evaluate(model, arrays)
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
        "data": arrays.source,
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


def _placement(cfg: Config, ctx: TaskContext, trainer, captures) -> dict:
    from pinpoint.placement.analyze import build_placement

    placement = build_placement(
        captures, variables=trainer.variables(), plan=cfg.train.pinning, strategy=cfg.train.strategy,
        device_map=ctx.device_map, task=ctx.task, gradient_scope="gradients",
    )
    placement.setdefault("device_aliases", dict(ctx.device_map.aliases))
    placement.setdefault("device_map", ctx.device_map.to_json())
    return placement


def finish(cfg: Config, out_dir: Path, result: dict, *, placement: dict | None = None) -> dict:
    """Chief only: write metrics.json (and a merged placement.json), tell the hooks, print a summary."""
    metrics = result["metrics"]
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

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(is_chief: bool, start: int, total: int):
    if not is_chief:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=start, file=sys.stderr, desc="train", unit="step",
                dynamic_ncols=True, mininterval=0.5, disable=None)  # None: off when not a TTY
