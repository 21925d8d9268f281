"""The controller of a run, handed a trainer already at its restored step (training.loop.engine:
restore, make_trainer). The Trainer (training.loop.trainer) only takes steps; the controller runs
begin -> train until -> capture -> finalize, calling the hooks and the actions (progress bar,
train log, checkpointing: training.loop.actions) after every trainer call, and on the chief
`finish` writes the run's files."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinpoint.config import Config
from pinpoint.hooks import Hook, HookList
from pinpoint.outcome import write_outcome
from pinpoint.runfolder import METRICS, TRAIN_LOG
from pinpoint.training.loop.actions import Action, Checkpointing, ProgressBar, TrainLog
from pinpoint.training.loop.capture import (
    CAPTURE_STEP,
    CAPTURE_STEPS,
    FIRST_LOGGED_STEP,
    PROFILED,
    CapturePlan,
    capture_first_call,
    capture_ps_step,
    clean_refusal,
    memory_section,
    placement_report,
    profiled_steps,
    timing_section,
)
from pinpoint.training.loop.engine import TrainState, evaluate
from pinpoint.training.setup import TaskContext
from pinpoint.training.skeleton import chief_placement, run_info, write_task_placement


@dataclass
class RunState:
    """What the phases of one run share: the trainer, what it trains, what it measured."""

    state: TrainState
    trainer: Any  # training.loop.trainer.Trainer (its `step` is the run's one step counter)
    plan: CapturePlan
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
    trained: bool = True  # False: the checkpoint was already at train.steps


def _serving(cfg: Config) -> tuple[str, ...]:
    """parameter_server's tasks that only serve (workers run the closures, ps hold the variables)."""
    from pinpoint.provision.tfconfig import task_list

    return tuple(f"{role}:{i}" for role, i in task_list(cfg.cluster) if role in ("worker", "ps"))


def is_logged(step: int, log_every: int, total: int) -> bool:
    """train_log.jsonl and the hooks' step metrics hold this step."""
    return step % log_every == 0 or step == total or step == FIRST_LOGGED_STEP


class Controller:
    """One task's run of a trainer that is handed in (already at its restored step). Only the
    chief's hooks are called; every task checkpoints."""

    def __init__(self, cfg: Config, out_dir: Path, ctx: TaskContext, trainer, state: TrainState, *,
                 checkpoints=None, hooks: list[Hook] | tuple = ()):
        self.cfg, self.out, self.ctx = cfg, Path(out_dir), ctx
        self.trainer, self.state, self.checkpoints = trainer, state, checkpoints
        self.hooks = HookList(hooks if ctx.is_chief else [])
        self.actions: list[Action] = []

    def train(self, *, resumed_from_run: str | None = None) -> TrainResult:
        """Train to cfg.train.steps from the trainer's step."""
        run = self.begin(resumed_from_run)
        self.train_until(run, self.cfg.train.steps)
        return self.finalize(run, self.capture(run))

    def begin(self, resumed_from_run: str | None = None) -> RunState:
        """Tell the hooks what trains; the actions: on the chief the progress bar and the train
        log, on every task checkpointing (saving reads the variables collectively)."""
        t, trainer = self.cfg.train, self.trainer
        start = trainer.step
        num_params = int(sum(v.numpy().size for v in self.state.model.trainable_variables))
        run = RunState(self.state, trainer, CapturePlan.for_run(self.cfg, start, self.ctx.coordinator), num_params)
        self.hooks.on_train_begin(self._info(run, resumed_from_run))
        if self.ctx.is_chief:
            if start:
                print(f"pinpoint: resuming from checkpoint step {start}", file=sys.stderr, flush=True)
            shown = [ProgressBar(start, t.steps), TrainLog(self.out / TRAIN_LOG, start, t.steps)]
            self.actions = shown
            self.hooks = HookList([*shown, *self.hooks.hooks])  # they show a step before the others hear of it
        if self.checkpoints is not None:
            self.actions.append(Checkpointing(self.checkpoints, self.state.step_var, t.checkpoint_every, t.steps,
                                              self.hooks))
        return run

    def _info(self, run: RunState, resumed_from_run: str | None) -> dict:
        return run_info(self.cfg, self.ctx, self.out, resumed_from_run, start_step=run.trainer.start_step,
                        num_params=run.num_params, data=run.state.data.source, precision=self.cfg.train.precision,
                        **self.ctx.extra_info)

    def train_until(self, run: RunState, total: int) -> None:
        """Trainer calls until step `total`, each up to the plan's next stop, captured or profiled
        as it says; after each: the hooks (logged steps), then the actions (progress, a
        checkpoint: after the step's log record, so a resumed run's log holds every step up to
        its checkpoint)."""
        t, trainer, plan = self.cfg.train, run.trainer, run.plan
        try:
            while trainer.step < total:
                kind, n = plan.next_call(trainer.step, trainer.calls, total, (t.log_every, t.checkpoint_every))
                with clean_refusal(trainer):
                    if kind == CAPTURE_STEP:
                        captured, m = capture_ps_step(trainer)
                        plan.add_capture(captured)
                    elif kind == CAPTURE_STEPS:
                        plan.loop_captured, m = capture_first_call(trainer, n)
                    elif kind == PROFILED:
                        m, timed = profiled_steps(trainer, n, self.out, self.ctx, memory=plan.memory)
                        plan.add_profile(timed)
                    else:
                        m = trainer.train_steps(n)
                run.last = self._measured(run, kind, n, m)
                step = trainer.step
                if is_logged(step, t.log_every, total):
                    self.hooks.on_step_end(step, run.last)
                for action in self.actions:
                    action.after_steps(step, n, run.last)
        finally:
            for action in self.actions:
                action.close()

    def _measured(self, run: RunState, kind: str, n: int, m: dict) -> dict:
        """A call's metrics as logged; the steady-state window grows by the calls that count."""
        if not run.state.objective.has_accuracy:
            m.pop("accuracy", None)
        # The first call includes tracing; the profiled call the profiler's own cost; a captured
        # parameter_server step is run from the coordinator.
        if run.trainer.calls > 1 and kind not in (PROFILED, CAPTURE_STEP):
            run.steady_examples += n * run.trainer.pipeline.global_batch
            run.steady_time += m["step_time"] * n
        return m

    def capture(self, run: RunState) -> dict | None:
        """This task's placement from the sampled steps (None: none were captured)."""
        ctx, plan = self.ctx, run.plan
        captures = plan.sampled(run.trainer.step)
        if not captures:
            return None
        timing = timing_section(ctx, plan.loop_captured, plan.timed) if plan.timing else None
        memory = memory_section(ctx, plan.loop_captured, plan.timed, self.out, _serving(self.cfg)) if plan.memory else None
        placement = placement_report(self.cfg, ctx, run.trainer, captures, timing=timing, memory=memory)
        write_task_placement(self.out, ctx, placement)  # multi_worker: the chief merges them in finish()
        return placement

    def finalize(self, run: RunState, placement: dict | None) -> TrainResult:
        """Evaluate the trained model; metrics.json's content. A run that trained nothing (its
        checkpoint was already at train.steps) keeps the completed run's metrics.json."""
        t, ctx, state, trainer, last = self.cfg.train, self.ctx, run.state, run.trainer, run.last
        previous = self.out / METRICS
        if trainer.step == trainer.start_step and previous.is_file():
            return TrainResult(json.loads(previous.read_text()), placement, state.model, trained=False)
        final = evaluate(state.model, state.data, state.objective)
        metrics = {
            "final_loss": last.get("loss"),
            "final_accuracy": final["accuracy"],
            "final_train_accuracy": last.get("accuracy"),
            "eval_loss": final["loss"],
            "examples_per_sec": (run.steady_examples / run.steady_time) if run.steady_time
            else last.get("examples_per_sec"),
            "steps": trainer.step,
            "start_step": trainer.start_step,
            "global_batch": trainer.pipeline.global_batch,
            "num_replicas": ctx.strategy.num_replicas_in_sync,
            "strategy": t.strategy,
            "model": t.model,
            "data": state.data.source,
            "loss_fn": t.loss,  # the loss function's name; final_loss is its value
            "precision": t.precision,
            "num_params": run.num_params,
            "jit_compile": trainer.jit_compile,
            "device_map": ctx.device_map.to_json(),
            "task": ctx.task,
        }
        return TrainResult(metrics, placement, state.model, trained=trainer.step > trainer.start_step)

    def finish(self, result: TrainResult) -> dict:
        """Chief only: placement.json (the cluster's merged view under multi_worker_mirrored, else
        this process's own) and metrics.json, the hooks told, a summary printed."""
        placement = chief_placement(self.cfg, self.out, self.ctx, result.placement)
        write_outcome(self.out, placement, result.metrics, self.hooks, model=result.model,
                      summary=summary(placement, result.metrics, trained=result.trained))
        return result.metrics


def summary(placement, metrics, *, trained: bool = True) -> str:
    """The line (or table) `pinpoint train` ends with."""
    from pinpoint.placement import format_summary

    if not trained:  # resumed from a checkpoint already at train.steps
        return (f"nothing to train: the checkpoint is already at step {metrics['steps']} (train.steps); "
                "metrics.json and placement.json are the completed run's. Use a new --out or raise "
                "train.steps to train more.")
    if placement is not None:
        return format_summary(placement, metrics)
    return (f"trained {metrics['steps']} steps with {metrics['strategy']}: final loss "
            f"{metrics['final_loss']:.4f}, accuracy {metrics['final_accuracy']:.3f}, "
            f"{metrics['examples_per_sec']:.0f} examples/s")
