"""Local multi-process clusters: one `pinpoint train --task role:index` process per task.

For `multi_worker_mirrored` and `parameter_server` the launcher starts every task of the cluster
(chief, workers, ps, evaluator) on free localhost ports, each with its TF_CONFIG in the env (so it
is set before the strategy exists), forwards each task's output prefixed "[worker:1] ", and
propagates exit codes.

When any task dies, the WHOLE group is restarted: a multi-worker collective cannot continue
with a replacement peer (the group membership and the collective instance keys are fixed when the
strategy is created), and a parameter-server cluster loses its variables with a ps. Every
restarted task resumes from the latest checkpoint in OUT/checkpoints (the training core restores it
on start). After `train.max_restarts` restarts the launcher gives up with TrainingFailed.

The launcher never waits forever: a task killed or cut off from its peers either exits (TF's
coordination service notices the missing heartbeats and aborts the collectives, in ~15 s here;
the collective timeout is a second bound) or stops making progress, which the watchdog notices
(OUT/train_log.jsonl not growing) and treats like a death. A partition that exists before the
tasks have connected is only caught by the watchdog's start-up limit: TF keeps waiting for every
task to register.

Starting, watching (the watchdog) and stopping the processes of one attempt is supervise.py's
job; this module builds the tasks' commands and decides what follows an attempt (done, restart,
give up) and records it.

Files (atomic): OUT/tasks.json (pids and addresses of the current attempt, rewritten at each
(re)start; fault tests kill pids from it) and OUT/launcher.json (attempts, failures, outcome).
This module never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinpoint.config import Config, config_to_yaml
from pinpoint.errors import TrainingFailed
from pinpoint.provision.podenv import (  # as the pods get them
    COLLECTIVE_TIMEOUT_ENV,
    allocator_env,
    collective_timeout_env,
)
from pinpoint.runfolder import (
    CHECKPOINTS,
    CONFIG_FILE,
    atomic_write_json,
    atomic_write_text,
    checkpoint_indexes,
    ensure_dir,
    last_logged_step,
    latest_checkpoint_step,
)
from pinpoint.signals import Terminated, sigterm_raises
from pinpoint.training.cluster.supervise import Emitter, ProcessGroup, TaskSpec, watch_attempt

TASKS_FILE = "tasks.json"
LAUNCHER_FILE = "launcher.json"
# Exit code of a PinpointError (bad config, impossible placement): the same inputs fail the same
# way again, so a restart would only waste time.
USER_ERROR_EXIT = 2


# ---- the cluster ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskOptions:
    """How each task is started: task_specs' and run_local_cluster's keywords.

    `task_hosts` gives some tasks another address than `host` (e.g. a task in its own network
    namespace); `task_prefix` runs a task's command under a wrapper (e.g. `ip netns exec NS`);
    `collective_timeout` overrides train.collective_timeout_s.
    """

    parent_run_id: str | None = None
    resume_from_run: str | None = None
    extra_env: Mapping[str, str] | None = None
    host: str = "127.0.0.1"
    task_hosts: Mapping[str, str] | None = None
    task_prefix: Mapping[str, Sequence[str]] | None = None
    collective_timeout: int | None = None


def task_specs(cfg: Config, out_dir: Path, *, attempt: int = 1, **options) -> list[TaskSpec]:
    """One TaskSpec per task of cfg.cluster, on fresh free ports (`options`: TaskOptions)."""
    return _specs(cfg, out_dir, TaskOptions(**options))


def _specs(cfg: Config, out_dir: Path, o: TaskOptions) -> list[TaskSpec]:
    from pinpoint.provision.local import local_tasks

    task_hosts = dict(o.task_hosts or {})
    task_prefix = dict(o.task_prefix or {})
    # Ports are chosen free on every interface (a TF server listens on all of them); the
    # addresses in TF_CONFIG are then rewritten per task.
    tasks = local_tasks(cfg, host="0.0.0.0")
    known = {t.name for t in tasks}
    for name in list(task_hosts) + list(task_prefix):
        if name not in known:
            raise TrainingFailed(f"launcher: no task '{name}' in this cluster; tasks are {', '.join(sorted(known))}")
    address = {t.name: f"{task_hosts.get(t.name, o.host)}:{t.port}" for t in tasks}
    config_file = out_dir / CONFIG_FILE
    specs = []
    for t in tasks:
        tf_config = json.loads(json.dumps(t.tf_config))
        # Rewrite every address of the cluster dict from the task's host (ports are unique).
        for role, addrs in tf_config.get("cluster", {}).items():
            tf_config["cluster"][role] = [address[f"{role}:{i}"] for i in range(len(addrs))]
        argv = [*task_prefix.get(t.name, ()), sys.executable, "-m", "pinpoint.cli", "train",
                str(config_file), "--out", str(out_dir), "--task", t.name]
        if o.parent_run_id:
            argv += ["--parent-run-id", o.parent_run_id]
        if o.resume_from_run:
            argv += ["--resume-from-run", o.resume_from_run]
        env = {
            **(o.extra_env or {}),
            "TF_CONFIG": json.dumps(tf_config),
            **allocator_env(cfg),
            **(collective_timeout_env(cfg) if o.collective_timeout is None
               else {COLLECTIVE_TIMEOUT_ENV: str(int(o.collective_timeout))}),
        }
        specs.append(TaskSpec(t.name, tuple(argv), env, task_hosts.get(t.name, o.host), t.port))
    return specs


def _checkpointed_since(out_dir: Path, since: float) -> bool:
    """True if a checkpoint was written into OUT/checkpoints at or after `since` (epoch s)."""
    for _, p in checkpoint_indexes(out_dir / CHECKPOINTS):
        try:
            if p.stat().st_mtime >= since:
                return True
        except FileNotFoundError:  # rotated away meanwhile
            continue
    return False


@dataclass(frozen=True)
class Limits:
    """How long the launcher waits (seconds): see watch_attempt and ProcessGroup.stop."""

    startup_timeout: float = 300.0
    stall_timeout: float = 300.0
    grace: float = 10.0
    finish_timeout: float = 120.0


def run_local_cluster(cfg: Config, out_dir: str | Path, *, startup_timeout: float = 300.0,
                      stall_timeout: float = 300.0, grace: float = 10.0, finish_timeout: float = 120.0,
                      **options) -> int:
    """Run every task of cfg.cluster as a local process and supervise the group; return 0.
    `options`: how each task is started (TaskOptions).

    A task that exits with code 2 (a PinpointError: bad config or placement) ends the run with
    that code; any other death, or no progress for `stall_timeout` s (`startup_timeout` s before
    the first logged step), restarts the whole group, at most `cfg.train.max_restarts` times,
    then raises TrainingFailed.
    """
    opts = TaskOptions(**options)
    out = ensure_dir(out_dir).resolve()
    atomic_write_text(out / CONFIG_FILE, config_to_yaml(cfg))
    launch = _Launch(cfg, out, opts, Limits(startup_timeout, stall_timeout, grace, finish_timeout))
    # SIGTERM (the run or the pod stopped): every task is stopped by the attempt's finally.
    with sigterm_raises():
        try:
            while True:
                failure = launch.attempt()
                if failure is None:
                    launch.save("succeeded")
                    launch.say(f"done after {launch.attempts} attempt(s)")
                    return 0
                code = launch.after_failure(*failure)
                if code is not None:
                    return code
        except KeyboardInterrupt:
            # Every task is already stopped (the attempt's finally); the CLI reports the interrupt.
            launch.save("interrupted")
            raise
        except Terminated:
            launch.save("interrupted")
            raise TrainingFailed("local cluster stopped by SIGTERM; every task was stopped") from None


class _Launch:
    """The attempts of one run_local_cluster call and their record, OUT/launcher.json."""

    def __init__(self, cfg: Config, out: Path, opts: TaskOptions, limits: Limits):
        self.cfg, self.out, self.opts, self.limits = cfg, out, opts, limits
        self.record: dict = {"max_restarts": cfg.train.max_restarts, "attempts": [], "failures": [],
                             "status": "running"}
        self.emitter = Emitter()
        self.attempts = 0
        self.launched = time.time()

    def say(self, msg: str) -> None:
        self.emitter.line("launcher", msg)

    def save(self, status: str | None = None) -> None:
        if status is not None:
            self.record["status"] = status
        atomic_write_json(self.out / LAUNCHER_FILE, self.record)

    def attempt(self):
        """Start the group, watch it until it ends or fails, stop it; None, or (reason, exit, the
        group, when the failure was detected)."""
        self.attempts += 1
        out, lim = self.out, self.limits
        # Restore from the MLflow run until this launch has written a checkpoint of its own
        # (a group that died before its first checkpoint must not start from scratch).
        from_run = None if _checkpointed_since(out, self.launched) else self.opts.resume_from_run
        specs = _specs(self.cfg, out, dataclasses.replace(self.opts, resume_from_run=from_run))
        resume_step = latest_checkpoint_step(out)
        group = ProcessGroup(specs, cwd=os.getcwd(), emitter=self.emitter)
        failure = None
        try:
            group.start()
            self._started(specs, group, resume_step)
            failure = watch_attempt(group, out, lim.startup_timeout, lim.stall_timeout, lim.finish_timeout, self.say,
                                    servers_only=self.cfg.train.strategy == "parameter_server")
        finally:
            detected = time.time()
            # A broken group is killed at once: the checkpoint holds everything worth keeping,
            # and an MWMS task ignores SIGTERM anyway (TF's coordination service takes it as a
            # preemption notice and keeps waiting in the collective).
            killed = group.stop(grace=0.0 if failure is not None else lim.grace)
            stopped = time.time()
        self.record["attempts"][-1].update(ended=stopped, stop_s=round(stopped - detected, 2), sigkilled=killed)
        return None if failure is None else (*failure, group, detected)

    def _started(self, specs: list[TaskSpec], group: ProcessGroup, resume_step: int | None) -> None:
        """OUT/tasks.json and the attempt's record, and the line that says who runs where."""
        started, n = time.time(), self.attempts
        tasks = {s.name: {"pid": group.pids[s.name], "host": s.host, "port": s.port} for s in specs}
        atomic_write_json(self.out / TASKS_FILE, {"attempt": n, "started": started, "tasks": tasks})
        self.record["attempts"].append({"attempt": n, "started": started, "resume_step": resume_step})
        self.save()
        self.say(
            f"attempt {n}: started {', '.join(f'{s.name} (pid {group.pids[s.name]}, {s.host}:{s.port})' for s in specs)}"
            + (f"; resuming from checkpoint step {resume_step}" if resume_step is not None else "")
        )

    def after_failure(self, reason: str, exit_, group: ProcessGroup, detected: float) -> int | None:
        """Record a failed attempt; the exit code to end with, None to restart, or TrainingFailed."""
        out, n, max_restarts = self.out, self.attempts, self.cfg.train.max_restarts
        self.record["failures"].append({
            "attempt": n,
            "task": exit_.name if exit_ else None,
            "returncode": exit_.returncode if exit_ else None,
            "reason": reason,
            "last_logged_step": last_logged_step(out),
            "checkpoint_step": latest_checkpoint_step(out),
            "time": detected,
        })
        last_words = group.last_words(exit_.name) if exit_ else ""
        if exit_ is not None and exit_.returncode == USER_ERROR_EXIT:
            self.save("failed")
            self.say(f"{reason}: not restarting (the same inputs would fail the same way)")
            return USER_ERROR_EXIT
        restarts = n - 1
        if restarts >= max_restarts:
            self.save("failed")
            raise TrainingFailed(
                f"local cluster failed: {reason} on attempt {n} "
                f"(train.max_restarts={max_restarts} restart(s) used)"
                + (f"; its last output: {last_words}" if last_words else "")
                + "; see the [task] lines above, or raise train.max_restarts"
            )
        self.save()
        ckpt = latest_checkpoint_step(out)
        self.say(
            f"restart {restarts + 1}/{max_restarts} after {reason}; "
            + (f"resuming from checkpoint step {ckpt}" if ckpt is not None else "no checkpoint yet, starting over")
        )
        return None


__all__ = [
    "LAUNCHER_FILE",
    "Limits",
    "TaskOptions",
    "TASKS_FILE",
    "USER_ERROR_EXIT",
    "run_local_cluster",
    "task_specs",
]
