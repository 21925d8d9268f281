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

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pinpoint.config import Config, config_to_yaml
from pinpoint.errors import TrainingFailed
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV, collective_timeout_env  # as the pods get it
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
def task_specs(
    cfg: Config,
    out_dir: Path,
    *,
    attempt: int = 1,
    parent_run_id: str | None = None,
    resume_from_run: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    task_hosts: Mapping[str, str] | None = None,
    task_prefix: Mapping[str, Sequence[str]] | None = None,
    collective_timeout: int | None = None,
) -> list[TaskSpec]:
    """One TaskSpec per task of cfg.cluster, on fresh free ports.

    `task_hosts` gives some tasks another address than `host` (e.g. a task in its own network
    namespace); `task_prefix` runs a task's command under a wrapper (e.g. `ip netns exec NS`);
    `collective_timeout` overrides train.collective_timeout_s.
    """
    from pinpoint.provision.local import local_tasks

    task_hosts = dict(task_hosts or {})
    task_prefix = dict(task_prefix or {})
    # Ports are chosen free on every interface (a TF server listens on all of them); the
    # addresses in TF_CONFIG are then rewritten per task.
    tasks = local_tasks(cfg, host="0.0.0.0")
    known = {t.name for t in tasks}
    for name in list(task_hosts) + list(task_prefix):
        if name not in known:
            raise TrainingFailed(f"launcher: no task '{name}' in this cluster; tasks are {', '.join(sorted(known))}")
    address = {t.name: f"{task_hosts.get(t.name, host)}:{t.port}" for t in tasks}
    config_file = out_dir / CONFIG_FILE
    specs = []
    for t in tasks:
        tf_config = json.loads(json.dumps(t.tf_config))
        # Rewrite every address of the cluster dict from the task's host (ports are unique).
        for role, addrs in tf_config.get("cluster", {}).items():
            tf_config["cluster"][role] = [address[f"{role}:{i}"] for i in range(len(addrs))]
        argv = [*task_prefix.get(t.name, ()), sys.executable, "-m", "pinpoint.cli", "train",
                str(config_file), "--out", str(out_dir), "--task", t.name]
        if parent_run_id:
            argv += ["--parent-run-id", parent_run_id]
        if resume_from_run:
            argv += ["--resume-from-run", resume_from_run]
        env = {
            **(extra_env or {}),
            "TF_CONFIG": json.dumps(tf_config),
            **(collective_timeout_env(cfg) if collective_timeout is None
               else {COLLECTIVE_TIMEOUT_ENV: str(int(collective_timeout))}),
        }
        specs.append(TaskSpec(t.name, tuple(argv), env, task_hosts.get(t.name, host), t.port))
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


def run_local_cluster(
    cfg: Config,
    out_dir: str | Path,
    *,
    parent_run_id: str | None = None,
    resume_from_run: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    task_hosts: Mapping[str, str] | None = None,
    task_prefix: Mapping[str, Sequence[str]] | None = None,
    startup_timeout: float = 300.0,
    stall_timeout: float = 300.0,
    collective_timeout: int | None = None,
    grace: float = 10.0,
    finish_timeout: float = 120.0,
) -> int:
    """Run every task of cfg.cluster as a local process and supervise the group; return 0.

    A task that exits with code 2 (a PinpointError: bad config or placement) ends the run with
    that code; any other death, or no progress for `stall_timeout` s (`startup_timeout` s before
    the first logged step), restarts the whole group, at most `cfg.train.max_restarts` times,
    then raises TrainingFailed.
    """
    out = ensure_dir(out_dir).resolve()
    atomic_write_text(out / CONFIG_FILE, config_to_yaml(cfg))
    max_restarts = cfg.train.max_restarts
    record: dict = {"max_restarts": max_restarts, "attempts": [], "failures": [], "status": "running"}
    emitter = Emitter()

    def say(msg: str) -> None:
        emitter.line("launcher", msg)

    attempt = 0
    launched = time.time()
    # SIGTERM (the run or the pod stopped): every task is stopped by the attempt's finally.
    with sigterm_raises():
        try:
            while True:
                attempt += 1
                # Restore from the MLflow run until this launch has written a checkpoint of its own
                # (a group that died before its first checkpoint must not start from scratch).
                from_run = None if _checkpointed_since(out, launched) else resume_from_run
                specs = task_specs(
                    cfg, out, parent_run_id=parent_run_id, resume_from_run=from_run,
                    extra_env=extra_env, host=host, task_hosts=task_hosts, task_prefix=task_prefix,
                    collective_timeout=collective_timeout,
                )
                resume_step = latest_checkpoint_step(out)
                group = ProcessGroup(specs, cwd=os.getcwd(), emitter=emitter)
                started = time.time()
                failure = None
                try:
                    group.start()
                    tasks_doc = {
                        "attempt": attempt,
                        "started": started,
                        "tasks": {s.name: {"pid": group.pids[s.name], "host": s.host, "port": s.port} for s in specs},
                    }
                    atomic_write_json(out / TASKS_FILE, tasks_doc)
                    record["attempts"].append({"attempt": attempt, "started": started, "resume_step": resume_step})
                    atomic_write_json(out / LAUNCHER_FILE, record)
                    say(
                        f"attempt {attempt}: started {', '.join(f'{s.name} (pid {group.pids[s.name]}, {s.host}:{s.port})' for s in specs)}"
                        + (f"; resuming from checkpoint step {resume_step}" if resume_step is not None else "")
                    )
                    failure = watch_attempt(group, out, startup_timeout, stall_timeout, finish_timeout, say,
                                            servers_only=cfg.train.strategy == "parameter_server")
                finally:
                    detected = time.time()
                    # A broken group is killed at once: the checkpoint holds everything worth keeping,
                    # and an MWMS task ignores SIGTERM anyway (TF's coordination service takes it as a
                    # preemption notice and keeps waiting in the collective).
                    killed = group.stop(grace=0.0 if failure is not None else grace)
                    stopped = time.time()
                record["attempts"][-1].update(ended=stopped, stop_s=round(stopped - detected, 2), sigkilled=killed)
                if failure is None:
                    record["status"] = "succeeded"
                    atomic_write_json(out / LAUNCHER_FILE, record)
                    say(f"done after {attempt} attempt(s)")
                    return 0
                reason, exit_ = failure
                record["failures"].append({
                    "attempt": attempt,
                    "task": exit_.name if exit_ else None,
                    "returncode": exit_.returncode if exit_ else None,
                    "reason": reason,
                    "last_logged_step": last_logged_step(out),
                    "checkpoint_step": latest_checkpoint_step(out),
                    "time": detected,
                })
                last_words = group.last_words(exit_.name) if exit_ else ""
                if exit_ is not None and exit_.returncode == USER_ERROR_EXIT:
                    record["status"] = "failed"
                    atomic_write_json(out / LAUNCHER_FILE, record)
                    say(f"{reason}: not restarting (the same inputs would fail the same way)")
                    return USER_ERROR_EXIT
                restarts = attempt - 1
                if restarts >= max_restarts:
                    record["status"] = "failed"
                    atomic_write_json(out / LAUNCHER_FILE, record)
                    raise TrainingFailed(
                        f"local cluster failed: {reason} on attempt {attempt} "
                        f"(train.max_restarts={max_restarts} restart(s) used)"
                        + (f"; its last output: {last_words}" if last_words else "")
                        + "; see the [task] lines above, or raise train.max_restarts"
                    )
                atomic_write_json(out / LAUNCHER_FILE, record)
                ckpt = latest_checkpoint_step(out)
                say(
                    f"restart {restarts + 1}/{max_restarts} after {reason}; "
                    + (f"resuming from checkpoint step {ckpt}" if ckpt is not None else "no checkpoint yet, starting over")
                )
        except KeyboardInterrupt:
            # Every task is already stopped (the attempt's finally); the CLI reports the interrupt.
            record["status"] = "interrupted"
            atomic_write_json(out / LAUNCHER_FILE, record)
            raise
        except Terminated:
            record["status"] = "interrupted"
            atomic_write_json(out / LAUNCHER_FILE, record)
            raise TrainingFailed("local cluster stopped by SIGTERM; every task was stopped") from None


__all__ = [
    "LAUNCHER_FILE",
    "TASKS_FILE",
    "USER_ERROR_EXIT",
    "run_local_cluster",
    "task_specs",
]
