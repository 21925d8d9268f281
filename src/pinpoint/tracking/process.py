"""The MLflow sender in its own process, so tracking takes nothing from the training process.

Importing MLflow and opening its store is ~2 s of pure Python; run as a thread, it competes
with the training loop for the interpreter lock (tracing, the step loop). The training process
only appends to the spool's journal (see spool.py); this child process reads the journal, sends
it (sender.Sender) and writes the acks. It is started early (`SenderProcess.start`, before
TensorFlow is imported) so MLflow is ready when training begins, and talks over two pipes:

  parent -> child (stdin, one JSON line each)   open {spool, interval}, flush, adopt {folders}, close {timeout}
  child -> parent (stdout, one JSON line each)  ready, tried, run {run_id}, acked {n}, failure, closed {done}

The tracking URI (which may hold credentials) reaches the child in its environment, never on
its command line. The child ignores SIGINT (Ctrl-C ends the run KILLED through the parent) and
finishes (a last pass, then exit) when its stdin closes: the parent exited or was killed. A child
that finds its parent gone (a write to the closed pipe) stops writing and exits quietly: an error
found after start-up ends the parent with its one `pinpoint:` line and nothing after it. A warm
child that no run took is stopped when the parent exits (`discard_warm`, at exit).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

URI_ENV = "PINPOINT_SENDER_URI"
BACKGROUND_ENV = "PINPOINT_SENDER_BACKGROUND"
NICENESS = 10


class SenderProcess:
    """Parent side: the child's state as its events report it (same surface as a Sender)."""

    def __init__(self, uri: str, background: bool = False):
        self.uri = uri
        # Beside a training (the train and trace steps) the child sends at a lower priority once
        # it has tried to create the run; a step with nothing else to do (provision, report)
        # sends at the normal one throughout (see main).
        self.background = background
        self.run_id: str | None = None
        self.failures = 0
        self.acked = 0
        self.tried_create = threading.Event()
        self.closed = threading.Event()
        self.done = False
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._on_run_created = None
        # (monotonic, CPU s) when the run was created: from then on the sender only sends.
        self.run_created_at: tuple[float, float | None] | None = None

    def start(self) -> SenderProcess:
        # MLflow's INFO lines (the sqlite store's table checks on every open) stay out of the
        # training's output; its warnings still show.
        env = dict(os.environ, **{URI_ENV: self.uri, BACKGROUND_ENV: "1" if self.background else ""})
        env.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        # Same process group: a launcher that kills the task's group takes the sender with it
        # (the spool keeps everything for the next process or `pinpoint upload-spool`).
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from pinpoint.tracking.process import main; sys.exit(main())"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
        )
        threading.Thread(target=self._read_events, name="pinpoint-mlflow-events", daemon=True).start()
        return self

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _read_events(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "run":
                self.run_created_at = (time.monotonic(), self.cpu_s())
                self.run_id = event["run_id"]
                if self._on_run_created:
                    self._on_run_created(self.run_id)
            elif kind == "tried":
                self.tried_create.set()
            elif kind == "acked":
                self.acked += int(event["n"])
            elif kind == "failure":
                self.failures += 1
            elif kind == "closed":
                self.done = bool(event.get("done"))
                self.closed.set()
        # The child is gone (closed, or died): nobody waits on it any more.
        self.tried_create.set()
        self.closed.set()

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the sender process has used so far (None where neither
        clock can be read, or once the process is gone). Linux' process CPU clock counts in
        nanoseconds; /proc's ticks (10 ms) would make a 1% share over a second 0 or 2%."""
        if self._proc is None:
            return None
        try:
            # clock_getcpuclockid(pid) as Linux encodes it: ~pid << 3 | CPUCLOCK_SCHED (2), the whole process.
            return time.clock_gettime((~self._proc.pid << 3) | 2)
        except (OSError, OverflowError, AttributeError):
            pass
        try:
            fields = Path(f"/proc/{self._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def send(self, cmd: str, **fields: Any) -> bool:
        with self._lock:
            if not self.alive or self._proc.stdin is None:
                return False
            try:
                self._proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
                self._proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def open(self, spool_folder: Path, interval: float, on_run_created=None) -> None:
        self._on_run_created = on_run_created
        self.send("open", spool=str(spool_folder), interval=interval)

    def wake(self, force: bool = False) -> None:
        self.send("flush")

    def close(self, timeout: float) -> bool:
        """Ask for a last pass and wait up to `timeout` s; True when everything was sent."""
        if self.send("close", timeout=timeout):
            self.closed.wait(timeout + 5)
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        return self.done

    def discard(self) -> None:
        """End a sender that was never opened: it holds nothing to send."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)


_WARM: dict[str, SenderProcess] = {}


def warm(uri: str, background: bool = False) -> None:
    """Start a sender process for `uri` now (it imports MLflow and opens the store while this
    process starts TensorFlow); the next `take(uri, background)` gets it."""
    known = _WARM.get(uri)
    if known is None or not known.alive or known.background != background:
        if not _WARM:
            atexit.register(discard_warm)
        if known is not None:
            known.discard()
        _WARM[uri] = SenderProcess(uri, background).start()


def discard_warm() -> None:
    """Stop the warm sender processes no run took (an error came before the step run opened):
    they hold nothing to send, so they end now rather than outlive this process."""
    while _WARM:
        _, proc = _WARM.popitem()
        proc.discard()


def take(uri: str, background: bool = False) -> SenderProcess:
    """A started sender process for `uri` at that priority: the warm one if any, else a new one."""
    proc = _WARM.pop(uri, None)
    if proc is not None and proc.alive and proc.background == background:
        return proc
    if proc is not None:
        proc.discard()
    return SenderProcess(uri, background).start()


# ---- the child ------------------------------------------------------------------------------
_PARENT_GONE = threading.Event()


def _emit(event: str, **fields: Any) -> None:
    """One event line to the parent; once the parent is gone (its end of the pipe closed), the
    events go nowhere: stdout is pointed at /dev/null so neither this write nor the interpreter's
    last flush raises, and main() ends at the end of stdin."""
    if _PARENT_GONE.is_set():
        return
    try:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        _PARENT_GONE.set()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main() -> int:
    from pinpoint.tracking.sender import Sender, mlflow_client, remember_absent_modules
    from pinpoint.tracking.spool import Spool

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Beside a training, sending is background work: the training's threads come first when both
    # want a core. The start-up (MLflow's import, a new sqlite store's tables) and the first try to
    # create the run are not: starved on a busy node, they outlast the step's wait at its end and
    # leave the whole run in the spool (or a store half made, if the wait ends in a kill).
    background = bool(os.environ.pop(BACKGROUND_ENV, ""))
    uri = os.environ.pop(URI_ENV)
    remember_absent_modules()  # this process only: MLflow's per-request imports stay cheap
    try:
        mlflow_client(uri)  # MLflow's import and the store, before the parent needs them
    except Exception:  # noqa: BLE001, S110 - the sender reports an unreachable server itself
        pass
    try:
        _emit("ready")
    except BrokenPipeError:
        # The parent is gone before it needed us (e.g. it refused its input): nothing to send,
        # and no traceback in the step's log. stdout goes to devnull so exit's flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    sender: Sender | None = None
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "open":
            sender = Sender(Spool(msg["spool"]), uri=uri, interval=float(msg["interval"]),
                            on_event=_relay(background))
            sender.start(on_run_created=lambda run_id: _emit("run", run_id=run_id))
        elif cmd == "flush" and sender is not None:
            sender.wake(force=True)
        elif cmd == "adopt":
            threading.Thread(target=_adopt, args=(msg["folders"],), daemon=True).start()
        elif cmd == "close":
            # The training is over: the last pass is all the step still waits for.
            _PRIORITY.restore()
            done = sender.close(float(msg["timeout"])) if sender is not None else True
            _emit("closed", done=done)
            return 0
    # stdin closed without a close: the parent is gone. One last pass; the spool keeps the rest.
    _PRIORITY.restore()
    if sender is not None:
        sender.close(30.0)
    return 0


def _relay(background: bool):
    """The sender's events to the parent; with `background`, this process lowers its priority
    (NICENESS) at the first try to create the run, before the parent hears of it."""

    def relay(kind: str, **fields: Any) -> None:
        if kind == "tried" and background:
            _PRIORITY.lower()
        _emit(kind, **fields)

    return relay


class _Priority:
    """The sender's priority beside a training: NICENESS levels lower from its first try to create
    the run until the training has ended, then back where it started (never above it). A first try
    that ends after the training did (a slow store's start on a busy node) lowers nothing: the last
    pass is all the step still waits for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # (the sender's thread lowers, the main thread restores)
        self._lowered = False
        self._ended = False

    def lower(self) -> None:
        with self._lock:
            if not (self._lowered or self._ended):
                self._lowered = True
                _shift_priority(NICENESS)

    def restore(self) -> None:
        with self._lock:
            self._ended = True
            if self._lowered:
                self._lowered = False
                _shift_priority(-NICENESS)


_PRIORITY = _Priority()


def _shift_priority(levels: int) -> None:
    """Every thread of this process `levels` nice levels lower (negative: higher, back to where it
    started, where the OS lets it: raising a priority needs CAP_SYS_NICE, and without it the
    sender stays where it is). Linux keeps a nice value per thread (`os.nice` from the sender's
    thread would leave the others, and the threads they start, as they were); elsewhere it is the
    process's."""
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = None
    try:
        if tasks is None:
            os.nice(levels)
        for tid in tasks or ():
            try:
                now = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, now + levels)))
            except ProcessLookupError:  # a thread that has just ended
                pass
    except PermissionError:  # no right to raise it: the last pass runs at the lower priority
        pass


def _adopt(folders: list[str]) -> None:
    """Send what earlier processes of this run folder journaled but could not send; their runs
    end KILLED (see run.open_step_run and replay.adopt_spool)."""
    from pinpoint.tracking.replay import adopt_spool

    for folder in folders:
        adopt_spool(Path(folder))


if __name__ == "__main__":
    sys.exit(main())
