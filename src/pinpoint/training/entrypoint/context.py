"""`train.entrypoint`: the user's own training function as the train step.

The platform owns what it owns everywhere else: the task's devices and strategy (the same
set-up as Pinpoint's own loop, training.setup), the run folder, checkpoints, the MLflow step
run (the run skeleton, training.run and training.skeleton), placement capture (trace.session.Capture: nothing for the user to call). The function is
called as `function(ctx)` with an `EntrypointContext`; see docs/trace.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pinpoint.config import Config
from pinpoint.errors import PinpointError
from pinpoint.hooks import HookList
from pinpoint.outcome import write_outcome
from pinpoint.placement import as_placement
from pinpoint.training.peers import peer_lost
from pinpoint.training.setup import TaskContext
from pinpoint.training.skeleton import (
    chief_placement,
    input_pipelines,
    open_checkpoints,
    run_info,
    write_task_placement,
)


class UserCodeFailed(PinpointError):
    """The user's entrypoint raised (its traceback was shown first)."""

    exit_code = 1


class EntrypointContext:
    """What the platform hands the user's function: the strategy and who this task is, the run
    folder, the config's entrypoint_args, Keras callbacks, and checkpoints that resume."""

    def __init__(self, cfg: Config, task: TaskContext, run_dir: Path, *, hooks: HookList, capture,
                 resume_prefix: str | None = None):
        self._cfg, self._task, self._hooks, self._capture = cfg, task, hooks, capture
        self._resume_prefix = resume_prefix
        self._checkpoints = None
        self.strategy = task.strategy
        self.task = task.task
        self.is_chief = task.is_chief
        self.run_dir = Path(run_dir)
        self.args = cfg.train.entrypoint_args
        self.start_step = 0
        self.last_saved: int | None = None
        self.model = None  # the fit model (set by the checkpoint callback), logged at the end

    @property
    def input_context(self):
        """This task's tf.distribute.InputContext (input pipelines and replicas of the cluster)."""
        import tensorflow as tf

        pipeline_id, pipelines = input_pipelines(self._cfg, self._task)
        return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
                                          num_replicas_in_sync=self.strategy.num_replicas_in_sync)

    def device(self, spec: str) -> str:
        """The device string to use for spec device `spec` ('/GPU:1'): emulated or real."""
        return self._task.device_map.physical(spec)

    def callbacks(self) -> list:
        """For model.fit: Keras' logs to MLflow, and checkpoints in run_dir/checkpoints that
        resume (a whole-group restart or --resume-from-run continues at the saved epoch)."""
        from pinpoint.trace.keras_fit import KerasLogger
        from pinpoint.training.entrypoint.fit_checkpoint import FitCheckpoint

        cap = self._capture
        logger = KerasLogger(cap.send_metrics, cap.params, log_every=self._cfg.train.log_every)
        cap.fit.loggers.append(logger)
        return [logger, FitCheckpoint(self)]

    def checkpoint(self, **trackables) -> int:
        """A checkpoint of `trackables` in run_dir/checkpoints; restores the latest one (or the
        --resume-from-run one) and returns its step (0: start from scratch). Save with ctx.save(step)."""
        import tensorflow as tf

        self._checkpoints, self.start_step = open_checkpoints(self._cfg, self.run_dir, self._task,
                                                              tf.train.Checkpoint(**trackables), self._resume_prefix)
        if self.start_step and self.is_chief:
            print(f"pinpoint: resuming from checkpoint step {self.start_step}", file=sys.stderr, flush=True)
        return self.start_step

    def save(self, step: int) -> str | None:
        """Save the ctx.checkpoint trackables at `step` (every task calls it; the chief's copy is
        kept and sent to MLflow)."""
        if self._checkpoints is None:
            raise PinpointError("ctx.save: got a save before ctx.checkpoint(...); call "
                                "ctx.checkpoint(model=..., optimizer=...) first")
        path = self._checkpoints.save(int(step))
        self.last_saved = int(step)
        if path is not None:
            self._hooks.on_checkpoint(int(step), path)
        return path


def run_entrypoint(cfg: Config, out: Path, task: TaskContext, run, fn, *, resume_prefix: str | None = None,
                   resumed_from_run: str | None = None) -> int:
    """Call the user's function `fn` as this task's train step inside the MLflow step run `run`
    (training.run); the chief writes placement.json and metrics.json from what was captured."""
    from pinpoint.trace.session import Capture

    t = cfg.train
    hooks = HookList([run.hook()] if task.is_chief else [])
    hooks.on_train_begin(run_info(cfg, task, out, resumed_from_run, start_step=0, entrypoint=t.entrypoint))
    # The coordinator of parameter_server keeps TensorFlow's own default device: its steps
    # run on the workers.
    cap = Capture(task.device_map, log_every=t.log_every, send=run.log_step_metrics, params=run.log_params,
                  default_scope=task.coordinator is None)
    ctx = EntrypointContext(cfg, task, out, hooks=hooks, capture=cap, resume_prefix=resume_prefix)
    failure = None
    with cap:
        try:
            fn(ctx)
        except (PinpointError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - the user's code failed: shown as Python shows it
            if peer_lost(err):
                raise  # the task exits 138 and the group restarts (training.cluster.task)
            from pinpoint.trace.program import print_user_traceback

            print_user_traceback(err)
            failure = err
    placement = _placement(cfg, out, task, cap)
    if task.is_chief:
        # The merge unites the tasks' ops, transfers and variables; the program's own sections
        # (its functions and eager ops) are the chief's (placement.analysis.merge keeps them).
        placement = chief_placement(cfg, out, task, placement, merge=failure is None)
        metrics = _metrics(cfg, task, ctx, cap, placement, failed=failure is not None)
        write_outcome(out, placement, metrics, hooks, model=ctx.model if failure is None else None)
    if failure is not None:
        raise UserCodeFailed(
            f"train.entrypoint: got {t.entrypoint!r}; it raised {type(failure).__name__} (traceback above); "
            f"what it ran until then and its checkpoints are in {out}/; fix the code and rerun (it resumes "
            "from the latest checkpoint)")
    return 0


def _placement(cfg: Config, out: Path, task: TaskContext, cap) -> dict | None:
    if not cfg.placement.enabled:
        return None
    placement = cap.placement(cfg.train.entrypoint, task=task.task)
    write_task_placement(out, task, placement)  # multi_worker: the chief merges them
    return placement


def _metrics(cfg: Config, task: TaskContext, ctx: EntrypointContext, cap, placement: dict | None,
             *, failed: bool) -> dict[str, Any]:
    """metrics.json: the entrypoint's outcome, fit's final logs or the last pinpoint.log values."""
    keras = cap.fit.summary()
    out: dict[str, Any] = {
        "entrypoint": cfg.train.entrypoint,
        "status": "FAILED" if failed else "FINISHED",
        "strategy": cfg.train.strategy,
        "num_replicas": task.strategy.num_replicas_in_sync,
        "task": task.task,
        "start_step": ctx.start_step,
        "last_checkpoint_step": ctx.last_saved,
        "seconds": round(time.monotonic() - cap.started, 3),
        "device_map": task.device_map.to_json(),
    }
    train_fn = as_placement(placement).training if placement else None
    out["steps"] = keras.get("batches") or (train_fn.calls if train_fn else None) or ctx.last_saved or 0
    out.update(keras)
    if "final_loss" not in out:
        out.update({f"final_{k}": v for k, v in cap.last_logged.items()})
    return out
