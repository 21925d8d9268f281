"""The controller of a run. The Trainer (training.loop) only takes steps; the controller runs
restore -> begin -> train until -> capture -> finalize, calling the actions (progress bar,
train log, checkpointing: training.actions) and the hooks after every trainer call, and on the
chief `finish` writes the run's files."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinpoint.config import Config
from pinpoint.hooks import Hook, HookList
from pinpoint.placement.files import write_placement
from pinpoint.runfolder import CHECKPOINTS, METRICS, PLACEMENT, TRAIN_LOG, atomic_write_json
from pinpoint.training.actions import Action, Checkpointing, ProgressBar, TrainLog
from pinpoint.training.capture import (
    CAPTURE_STEP,
    CAPTURE_STEPS,
    FIRST_LOGGED_STEP,
    PROFILED,
    CapturePlan,
    placement_report,
    profiled_steps,
    timing_section,
)
from pinpoint.training.engine import TaskContext, TrainState, build_state, evaluate, make_pipeline, use_jit


@dataclass
class RunState:
    """What the phases of one run share: the trainer, where it started, what it measured."""

    state: TrainState
    trainer: Any  # training.loop.Trainer
    checkpointing: Checkpointing
    plan: CapturePlan
    start: int
    num_params: int
    last: dict = field(default_factory=dict)  # the last trainer call's metrics
    steady_examples: int = 0  # examples and seconds of the calls without tracing or profiler
    steady_time: float = 0.0


@dataclass
class TrainResult:
    """A trained run: metrics.json's content, this task's placement (None: not captured), the model."""

    metrics: dict
    placement: dict | None
    model: Any


def is_logged(step: int, log_every: int, total: int) -> bool:
    """train_log.jsonl and the hooks' step metrics hold this step."""
    return step % log_every == 0 or step == total or step == FIRST_LOGGED_STEP


class Controller:
    """One task's run. Only the chief's hooks are called; every task checkpoints."""

    def __init__(self, cfg: Config, out_dir: Path, ctx: TaskContext, hooks: list[Hook] | tuple = ()):
        self.cfg, self.out, self.ctx = cfg, Path(out_dir), ctx
        self.hooks = HookList(hooks if ctx.is_chief else [])
        self.actions: list[Action] = []

    def train(self, *, resume_prefix: str | None = None, resumed_from_run: str | None = None,
              state: TrainState | None = None) -> TrainResult:
        """Train to cfg.train.steps (resuming from the latest good checkpoint, or `resume_prefix`)."""
        run = self.restore(state or build_state(self.cfg, self.ctx), resume_prefix)
        self.begin(run, resumed_from_run)
        self.train_until(run, self.cfg.train.steps)
        return self.finalize(run, self.capture(run))

    def restore(self, state: TrainState, resume_prefix: str | None) -> RunState:
        """Restore the checkpoint; the input pipeline and the trainer start at its step."""
        import tensorflow as tf

        from pinpoint.training.checkpoints import Checkpoints, restore_prefix
        from pinpoint.training.emulation import GpuPlacement
        from pinpoint.training.loop import Trainer

        cfg, ctx = self.cfg, self.ctx
        t, pin, dm = cfg.train, cfg.train.pinning, ctx.device_map
        ckpt = tf.train.Checkpoint(model=state.model, optimizer=state.optimizer, step=state.step_var)
        ckpts = Checkpoints(ckpt, self.out / CHECKPOINTS, keep=t.keep_checkpoints, is_chief=ctx.is_chief,
                            task=ctx.task)
        if resume_prefix:
            restore_prefix(ckpt, resume_prefix)
        else:
            ckpts.restore_latest()
        start = int(state.step_var.numpy())
        trainer = Trainer(ctx.strategy, state.model, state.optimizer, make_pipeline(cfg, ctx, state, start),
                          state.objective,
                          gradient_device=dm.physical(pin.gradients) if pin.gradients else None,
                          backward_follows_layers=bool(pin.layers) and pin.layers_backward == "follow",
                          coordinator=ctx.coordinator, start_step=start, jit_compile=use_jit(cfg),
                          placement_scope=GpuPlacement(dm, pin, soft_placement=pin.soft_placement))
        num_params = int(sum(v.numpy().size for v in state.model.trainable_variables))
        checkpointing = Checkpointing(ckpts, state.step_var, t.checkpoint_every, t.steps, self.hooks)
        return RunState(state, trainer, checkpointing, CapturePlan.for_run(cfg, start, ctx.coordinator),
                        start, num_params)

    def begin(self, run: RunState, resumed_from_run: str | None) -> None:
        """Tell the hooks what trains; on the chief, open the progress bar and the train log."""
        self.hooks.on_train_begin(self._info(run, resumed_from_run))
        if not self.ctx.is_chief:
            return
        if run.start:
            print(f"pinpoint: resuming from checkpoint step {run.start}", file=sys.stderr, flush=True)
        total = self.cfg.train.steps
        self.actions = [ProgressBar(run.start, total), TrainLog(self.out / TRAIN_LOG, run.start, total)]
        self.hooks = HookList([*self.actions, *self.hooks.hooks])  # they show a step before the others hear of it

    def _info(self, run: RunState, resumed_from_run: str | None) -> dict:
        cfg, ctx, t, dm = self.cfg, self.ctx, self.cfg.train, self.ctx.device_map
        return {
            "config": cfg.model_dump(mode="json"), "strategy": t.strategy, "task": ctx.task,
            "start_step": run.start, "num_params": run.num_params,
            "num_replicas": ctx.strategy.num_replicas_in_sync,
            "devices": list(dm.local_devices), "replica_devices": list(dm.spec_replica_devices),
            "device_aliases": dict(dm.aliases), "pinning": t.pinning.model_dump(mode="json"),
            "out_dir": str(self.out), "resumed_from_run": resumed_from_run, "data": run.state.data.source,
            "precision": t.precision, **ctx.extra_info,
        }

    def train_until(self, run: RunState, total: int) -> None:
        """Trainer calls until step `total`; after each: the actions, the hooks (logged steps), a checkpoint."""
        try:
            while run.trainer.step < total:
                n, run.last = self._call(run, total)
                step = run.trainer.step
                for action in self.actions:
                    action.after_steps(step, n, run.last)
                if is_logged(step, self.cfg.train.log_every, total):
                    self.hooks.on_step_end(step, run.last)
                run.checkpointing.after_steps(step, n, run.last)
        finally:
            for action in self.actions:
                action.close()

    def _call(self, run: RunState, total: int) -> tuple[int, dict]:
        """One trainer call: the steps up to the plan's next stop, captured or profiled as it says."""
        from pinpoint.placement.capture import capture_call

        t, trainer, plan = self.cfg.train, run.trainer, run.plan
        kind, n = plan.next_call(trainer.step, trainer.calls, total, (t.log_every, t.checkpoint_every))
        if kind == CAPTURE_STEP:
            captured, m = trainer.capture_step()
            plan.add_capture(captured)
            return n, m
        if kind == CAPTURE_STEPS:
            plan.loop_captured, m = trainer.capture_steps(n, capture_call)
        elif kind == PROFILED:
            m, timed = profiled_steps(trainer, n, self.out, self.ctx)
            plan.add_profile(timed)
        else:
            m = trainer.train_steps(n)
        if not run.state.objective.has_accuracy:
            m.pop("accuracy", None)
        # The first call includes tracing; the profiled call the profiler's own cost.
        if trainer.calls > 1 and kind != PROFILED:
            run.steady_examples += n * trainer.pipeline.global_batch
            run.steady_time += m["step_time"] * n
        return n, m

    def capture(self, run: RunState) -> dict | None:
        """This task's placement from the sampled steps (None: none were captured)."""
        ctx, plan = self.ctx, run.plan
        captures = plan.sampled(run.trainer.step)
        if not captures:
            return None
        placement = placement_report(self.cfg, ctx, run.trainer, captures)
        if plan.timing:
            placement["timing"] = timing_section(ctx, plan.loop_captured, plan.timed)
        if ctx.multi_worker:  # this task's view; the chief merges them, finish() writes placement.json
            write_placement(self.out / f"placement-{ctx.role}-{ctx.index}.json", placement)
        return placement

    def finalize(self, run: RunState, placement: dict | None) -> TrainResult:
        """Evaluate the trained model; metrics.json's content."""
        t, ctx, state, trainer, last = self.cfg.train, self.ctx, run.state, run.trainer, run.last
        final = evaluate(state.model, state.data, state.objective)
        metrics = {
            "final_loss": last.get("loss"),
            "final_accuracy": final["accuracy"],
            "final_train_accuracy": last.get("accuracy"),
            "eval_loss": final["loss"],
            "examples_per_sec": (run.steady_examples / run.steady_time) if run.steady_time
            else last.get("examples_per_sec"),
            "steps": trainer.step,
            "start_step": run.start,
            "global_batch": trainer.pipeline.global_batch,
            "num_replicas": ctx.strategy.num_replicas_in_sync,
            "strategy": t.strategy,
            "model": t.model,
            "data": state.data.source,
            "loss": t.loss,
            "precision": t.precision,
            "num_params": run.num_params,
            "jit_compile": trainer.jit_compile,
            "device_map": ctx.device_map.to_json(),
            "task": ctx.task,
        }
        return TrainResult(metrics, placement, state.model)

    def finish(self, result: TrainResult, *, placement: dict | None = None) -> dict:
        """Chief only: write placement.json (the cluster's merged `placement`, else this process's
        own) and metrics.json, tell the hooks, print a summary. placement.json's only writer."""
        metrics = result.metrics
        placement = placement if placement is not None else result.placement
        if placement is not None:
            write_placement(self.out / PLACEMENT, placement)
            self.hooks.on_placement(placement)
        atomic_write_json(self.out / METRICS, metrics)
        self.hooks.on_train_end(metrics, result.model)
        print(summary(placement or result.placement, metrics), flush=True)
        return metrics


def summary(placement, metrics) -> str:
    """The line (or table) `pinpoint train` ends with."""
    from pinpoint.placement.summary import format_summary

    if placement is not None:
        return format_summary(placement, metrics)
    if metrics.get("final_loss") is None:  # resumed from a checkpoint already at train.steps
        return (f"nothing to train: the checkpoint is already at step {metrics['steps']} (train.steps); "
                f"accuracy {metrics['final_accuracy']:.3f}. Use a new --out or raise train.steps to train more.")
    return (f"trained {metrics['steps']} steps with {metrics['strategy']}: final loss "
            f"{metrics['final_loss']:.4f}, accuracy {metrics['final_accuracy']:.3f}, "
            f"{metrics['examples_per_sec']:.0f} examples/s")
