"""Process supervision for the local launcher (launcher.py): start a group of task processes,
forward their output, watch one attempt of the group until it ends, stop it.

A task is a `TaskSpec` (name, command line, environment). A `ProcessGroup` starts them in their
own sessions (a Ctrl-C reaches only the launcher) and with a parent-death signal (a killed
launcher leaves no orphan TF server), prefixes every output line with "[name] ", keeps each
task's last lines (`last_words`) and stops them: SIGTERM, then SIGKILL after a grace period.

`watch_attempt` is the watch of one attempt: it returns when the chief has finished (cleanly) or
when a task died, a ps ended, or the run folder shows no progress for too long (the watchdog: a
task killed or cut off from its peers may hang instead of exiting). What to do next (restart,
give up) is the launcher's policy, not this module's.
This module never imports TensorFlow.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pinpoint.errors import RETRY_EXIT_CODE
from pinpoint.runfolder import CHECKPOINTS, TRAIN_LOG, last_logged_step

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


class Emitter:
    """Serialises lines onto the launcher's stdout, each prefixed "[name] ": the tasks' output
    (from the reader threads) and the launcher's own messages ("[launcher] ...")."""

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

    def __init__(self, specs: Sequence[TaskSpec], *, cwd: str | Path | None = None, emitter: Emitter | None = None):
        self.specs = list(specs)
        self.cwd = cwd
        self.emitter = emitter or Emitter()
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


# ---- the watch of one attempt -----------------------------------------------------------------
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


def watch_attempt(group: ProcessGroup, out: Path, startup_timeout: float, stall_timeout: float,
                  finish_timeout: float, say, *, servers_only: bool = False) -> tuple[str, Exit | None] | None:
    """Watch one started attempt of run folder `out` until it ends; the caller stops the group.
    None when the chief finished cleanly, else (reason, the task that died, or None for a stall).

    A task that dies (any nonzero code) fails the attempt; so does a ps, or under
    `servers_only` a worker, that ends before the chief. No progress (OUT/train_log.jsonl or
    OUT/checkpoints not changing) for `stall_timeout` s, or `startup_timeout` s before the first
    change, is a stall. After the chief is done the other trainers get `finish_timeout` s to end
    by themselves. `say(msg)` prints a launcher message.

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


__all__ = ["Emitter", "Exit", "ProcessGroup", "TaskSpec", "watch_attempt"]
