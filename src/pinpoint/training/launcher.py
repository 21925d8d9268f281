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

Files (atomic): OUT/tasks.json (pids and addresses of the current attempt, rewritten at each
(re)start; fault tests kill pids from it) and OUT/launcher.json (attempts, failures, outcome).
This module never imports TensorFlow.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pinpoint.config import Config, config_to_yaml
from pinpoint.errors import RETRY_EXIT_CODE, TrainingFailed
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV, collective_timeout_env  # as the pods get it
from pinpoint.runfolder import (
    CHECKPOINTS,
    CONFIG_FILE,
    TRAIN_LOG,
    atomic_write_json,
    atomic_write_text,
    ensure_dir,
)

TASKS_FILE = "tasks.json"
LAUNCHER_FILE = "launcher.json"
# Exit code of a PinpointError (bad config, impossible placement): the same inputs fail the same
# way again, so a restart would only waste time.
USER_ERROR_EXIT = 2
_PR_SET_PDEATHSIG = 1


# ---- one process per task --------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """How to start one task: its name ("worker:1"), command line and extra environment."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None

    @property
    def role(self) -> str:
        return self.name.split(":", 1)[0]


@dataclass(frozen=True)
class Exit:
    """A task that ended: its name and return code (negative: killed by that signal)."""

    name: str
    returncode: int

    def describe(self) -> str:
        if self.returncode < 0:
            try:
                sig = signal.Signals(-self.returncode).name
            except ValueError:
                sig = str(-self.returncode)
            return f"{self.name} died (signal {sig})"
        return f"{self.name} exited with code {self.returncode}"


def _die_with_parent_fn():
    """A preexec function that makes the kernel SIGKILL the task when the launcher dies (even
    by SIGKILL), so no orphaned TF server keeps a port or a collective open. libc is resolved
    here, in the parent: after fork the child only makes the prctl call (no dlopen, no locks)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: tasks then rely on the launcher's cleanup
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


class _Emitter:
    """Serialises lines from the reader threads onto the launcher's stdout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, prefix: str, text: str) -> None:
        with self._lock:
            out = sys.stdout
            out.write(f"[{prefix}] {text}\n")
            out.flush()


class ProcessGroup:
    """A set of task processes started together and stopped together.

    Each task's stdout and stderr (merged, so a traceback stays next to the lines before it) are
    read by a thread that prefixes every line with "[name] ". The last lines are kept so a failure
    message can quote the task's last words.
    """

    def __init__(self, specs: Sequence[TaskSpec], *, cwd: str | Path | None = None, emitter: _Emitter | None = None):
        self.specs = list(specs)
        self.cwd = cwd
        self.emitter = emitter or _Emitter()
        self.procs: dict[str, subprocess.Popen] = {}
        self.tails: dict[str, collections.deque] = {}
        self._readers: list[threading.Thread] = []

    def start(self) -> None:
        preexec = _die_with_parent_fn()
        for spec in self.specs:
            env = dict(os.environ)
            env.update(spec.env)
            env.setdefault("PYTHONUNBUFFERED", "1")
            proc = subprocess.Popen(
                list(spec.argv),
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the terminal reaches only the launcher, which then
                # stops the tasks in order instead of every process dying at once.
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - only a prctl syscall runs in the child
            )
            self.procs[spec.name] = proc
            tail: collections.deque = collections.deque(maxlen=20)
            self.tails[spec.name] = tail
            t = threading.Thread(target=self._pump, args=(spec.name, proc, tail), daemon=True)
            t.start()
            self._readers.append(t)

    def _pump(self, name: str, proc: subprocess.Popen, tail: collections.deque) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(text)
            self.emitter.line(name, text)
        proc.stdout.close()

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def poll(self) -> list[Exit]:
        """Tasks that have ended so far (in start order)."""
        return [Exit(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]

    def alive(self, names: Sequence[str] | None = None) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None and (names is None or n in names)]

    def last_words(self, name: str, n: int = 3) -> str:
        lines = [ln.strip() for ln in self.tails.get(name, ()) if ln.strip()]
        return " | ".join(lines[-n:])

    def stop(self, names: Sequence[str] | None = None, grace: float = 10.0) -> list[str]:
        """SIGTERM the (named) live tasks, SIGKILL whatever is still alive after `grace` s, reap.
        Returns the tasks that had to be SIGKILLed."""
        targets = [n for n in self.alive(names)]
        for n in targets:
            _signal(self.procs[n], signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed = []
        for n in targets:
            try:
                self.procs[n].wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(self.procs[n], signal.SIGKILL)
                killed.append(n)
        for n in targets:
            self.procs[n].wait()
        if names is None:
            for t in self._readers:
                t.join(timeout=5)
        return killed


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


# ---- the cluster -----------------------------------------------------------------------------
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


def latest_checkpoint_step(out_dir: Path) -> int | None:
    """The step of the newest checkpoint (files OUT/checkpoints/ckpt-<step>.index), or None."""
    steps = []
    for p in (out_dir / CHECKPOINTS).glob("ckpt-*.index"):
        m = re.fullmatch(r"ckpt-(\d+)\.index", p.name)
        if m:
            steps.append(int(m.group(1)))
    return max(steps) if steps else None


def last_logged_step(out_dir: Path) -> int | None:
    """The highest step in OUT/train_log.jsonl (ignores a torn last line), or None."""
    best = None
    path = out_dir / TRAIN_LOG
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int) and (best is None or step > best):
            best = step
    return best


def _checkpointed_since(out_dir: Path, since: float) -> bool:
    """True if a checkpoint was written into OUT/checkpoints at or after `since` (epoch s)."""
    for p in (out_dir / CHECKPOINTS).glob("ckpt-*.index"):
        try:
            if p.stat().st_mtime >= since:
                return True
        except FileNotFoundError:  # rotated away meanwhile
            continue
    return False


def _progress_mark(out_dir: Path) -> tuple:
    """Changes whenever the chief logs a step or writes a checkpoint (the watchdog's heartbeat)."""
    marks = []
    for p in (out_dir / TRAIN_LOG, out_dir / CHECKPOINTS):
        try:
            st = p.stat()
            marks.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            marks.append(None)
    return tuple(marks)


class _Stop(Exception):
    """SIGTERM received by the launcher."""


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
    emitter = _Emitter()

    def say(msg: str) -> None:
        emitter.line("launcher", msg)

    in_main = threading.current_thread() is threading.main_thread()
    previous = None
    if in_main:
        def _on_term(signum, frame):
            raise _Stop()
        previous = signal.signal(signal.SIGTERM, _on_term)

    attempt = 0
    launched = time.time()
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
                failure = _supervise(group, out, startup_timeout, stall_timeout, finish_timeout, say,
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
    except _Stop:
        record["status"] = "interrupted"
        atomic_write_json(out / LAUNCHER_FILE, record)
        raise TrainingFailed("local cluster stopped by SIGTERM; every task was stopped") from None
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _supervise(group: ProcessGroup, out: Path, startup_timeout: float, stall_timeout: float,
               finish_timeout: float, say, *, servers_only: bool = False) -> tuple[str, Exit | None] | None:
    """Watch one attempt. None when the chief finished cleanly, else (reason, the task that died).

    `servers_only`: the workers only serve the chief's closures (parameter_server), so like the
    ps they never end by themselves and are not waited for.
    """
    names = [s.name for s in group.specs]
    chief = "chief:0" if "chief:0" in names else next(n for n in names if n.startswith("worker:"))
    trainer_roles = ("chief",) if servers_only else ("chief", "worker")
    trainers = [n for n in names if n.split(":")[0] in trainer_roles]
    mark = _progress_mark(out)
    last_change = time.monotonic()
    seen_progress = False
    chief_done_at = None
    while True:
        time.sleep(0.2)
        exits = {e.name: e for e in group.poll()}
        # A task that exited with the retry code only lost a peer: charge the failure to the peer
        # (killed, crashed) when both ended within this poll.
        bad = sorted((e for e in exits.values() if e.returncode != 0), key=lambda e: e.returncode == RETRY_EXIT_CODE)
        if bad and chief_done_at is None:
            return bad[0].describe(), bad[0]
        if chief_done_at is None:
            # A ps (or a parameter_server worker) never ends on its own; one that does is broken.
            for e in exits.values():
                if e.name.startswith("ps:") or (servers_only and e.name.startswith("worker:")):
                    return f"{e.name} exited unexpectedly (code {e.returncode})", e
        if chief in exits and chief_done_at is None:
            chief_done_at = time.monotonic()
        if chief_done_at is not None:
            # The chief is done: MWMS workers finish the same last step and exit by themselves;
            # ps and evaluator tasks are stopped (they serve until told otherwise).
            waiting = group.alive([n for n in trainers if n != chief])
            if not waiting:
                late = [e for e in exits.values() if e.returncode != 0 and e.name in trainers and e.name != chief]
                for e in late:
                    say(f"warning: {e.describe()} after the chief finished; the run's outputs are complete")
                return None
            if time.monotonic() - chief_done_at > finish_timeout:
                say(f"warning: {', '.join(waiting)} still running {finish_timeout:.0f} s after the chief finished; stopping")
                return None
            continue
        now_mark = _progress_mark(out)
        if now_mark != mark:
            mark, last_change, seen_progress = now_mark, time.monotonic(), True
            continue
        limit = stall_timeout if seen_progress else startup_timeout
        if time.monotonic() - last_change > limit:
            what = "no training progress" if seen_progress else "no first logged step"
            step = last_logged_step(out)
            return (f"{what} for {limit:.0f} s" + (f" (last logged step {step})" if step is not None else "")
                    + " (a task is hung or cut off from its peers)"), None
