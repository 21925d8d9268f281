"""One TensorFlow import for many oracle runs: a server process imports TensorFlow and Keras once,
then forks a child for each run it is asked for. A child is the process `python SCRIPT ARGS...`
would be, minus the import (most of a short program's run; a child's exec of `python -c CODE`, as
`pinpoint trace` makes, runs CODE in the child), so the oracle's
runs of the corpus and the differential programs (tests/differential.py) pay TensorFlow's start-up
once per session instead of once per program.

    python tests/zygote.py        # the server: requests on stdin, answers on stdout, a JSON line each

What a fork carries over, and why it is safe here: the server only imports (no TensorFlow context,
device, thread pool or session exists before the fork: the child makes its own, as a fresh process
does); its one Python thread forks; the import's two native threads (OpenBLAS, jemalloc) register
their own fork handlers. The environment TensorFlow reads at import (TF_CPP_MIN_LOG_LEVEL,
PYTHONHASHSEED) is the server's: a server serves one environment (`Zygote.get`), and a child gets
the request's whole environment for what is read later.

Only a child's exit status reaches its caller, with its CPU seconds (`cpu_seconds()`, which
tests/conftest.py charges to the running test, as it does a waited-for subprocess's).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading

# Environment entries a server is not chosen by: pytest's current test, and what importing
# TensorFlow sets in the importing process (the caller's, once it has imported it; every child's).
_NOT_KEYED = ("PYTEST_CURRENT_TEST", "TF2_BEHAVIOR", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION",
              "ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH")


def _keyed(name: str) -> bool:
    """Whether a server is chosen by the environment entry `name`. MLflow's are read by MLflow,
    which no preload imports: a test's own tracking server does not start (and evict) a server."""
    return name not in _NOT_KEYED and not name.startswith("MLFLOW_")


# What a zygote imports before it forks a run: the oracle's, TensorFlow and Keras; `pinpoint
# trace`'s, Pinpoint's command line too (tests/differential.py, tests/test_trace.py).
TENSORFLOW = ("tensorflow", "keras")
PINPOINT = (*TENSORFLOW, "pinpoint.cli", "pinpoint.trace.session")

_cpu = 0.0  # CPU seconds of every child that has ended, in this process' zygotes
_cpu_lock = threading.Lock()


def cpu_seconds() -> float:
    """CPU seconds of the children the zygotes of this process ran that have ended."""
    return _cpu


# ---- the client ------------------------------------------------------------------------------
class Process:
    """A child of a zygote, as its caller sees it: subprocess.Popen's `wait` and `kill`."""

    def __init__(self, argv: list[str], log):
        self.args = argv
        self.log = log
        self.pid: int | None = None
        self.returncode: int | None = None
        self._started = threading.Event()
        self._ended = threading.Event()

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def kill(self) -> None:
        if self.pid is not None and not self._ended.is_set():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _end(self, status: int, cpu: float) -> None:
        global _cpu
        with _cpu_lock:
            _cpu += cpu
        self.returncode = status
        self._ended.set()


class Zygote:
    """A server process with TensorFlow imported, for one Python and one environment."""

    _servers: dict[tuple, Zygote] = {}  # the most recently used last
    _lock = threading.Lock()
    # Servers kept at once: each holds an imported TensorFlow (some 400 MB). A test that gives its
    # runs an environment of its own (an MLflow server's address) starts one.
    KEPT = 3

    @classmethod
    def get(cls, python: str, env: dict, preload: tuple[str, ...]) -> Zygote:
        """The server of `python` and `env` with the modules `preload` imported (one is started;
        beyond KEPT, the least recently used idle one is stopped)."""
        key = (python, preload, tuple(sorted((k, v) for k, v in env.items() if _keyed(k))))
        with cls._lock:
            z = cls._servers.pop(key, None)
            if z is None or not z.alive:
                z = cls(python, env, preload)
            cls._servers[key] = z
            z._reserved += 1  # until the caller's spawn: not idle
            idle = [k for k, s in cls._servers.items() if not (s._reserved or s._asked or s._running)]
            for k in idle[:max(0, len(cls._servers) - cls.KEPT)]:
                cls._servers.pop(k)._stop()
            return z

    def __init__(self, python: str, env: dict, preload: tuple[str, ...]):
        import tempfile

        # The server's own stderr (its imports' logs, a crash): named in its children's logs if it dies.
        fd, self._log = tempfile.mkstemp(prefix="zygote-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            self._proc = subprocess.Popen([python, __file__, *preload], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log, env=env,
                                          cwd=os.path.dirname(__file__))
        self._lock = threading.Lock()  # one request written at a time
        self._next = 0
        self._asked: dict[int, Process] = {}  # request id -> its process, until its pid is known
        self._running: dict[int, Process] = {}  # pid -> process, until it ends
        self.alive = True
        self._reserved = 0  # callers of `get` yet to spawn (Zygote._lock)
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self._stop)

    def spawn(self, argv: list[str], cwd, env: dict, log, mode: str = "w", stdout=None) -> Process:
        """`argv` ([python, script, args...] or [python, -m, module, args...]) run by a fork, stderr
        into `log` and stdout into `stdout` (or nowhere), each opened in `mode`."""
        p = Process(argv, log)
        with self._lock:
            self._next += 1
            self._asked[self._next] = p
            with Zygote._lock:
                self._reserved = max(0, self._reserved - 1)
            line = json.dumps({"id": self._next, "argv": list(argv), "cwd": str(cwd), "env": env,
                               "log": str(log), "mode": mode, "stdout": stdout and str(stdout)})
            try:
                self._proc.stdin.write((line + "\n").encode())
                self._proc.stdin.flush()
            except OSError:  # the server is gone: `p` ends as a run killed at its start
                self._asked.pop(self._next, None)
                p._started.set()
                p._end(-signal.SIGKILL, 0.0)
        p._started.wait()
        return p

    def _read(self) -> None:
        for raw in self._proc.stdout:
            msg = json.loads(raw)
            if "id" in msg:
                p = self._asked.pop(msg["id"])
                p.pid = msg["pid"]
                self._running[p.pid] = p
                p._started.set()
            else:
                self._running.pop(msg["pid"])._end(msg["status"], msg["cpu"])
        # The server ended: what it ran or was asked for ends as killed (a caller retries a signal).
        self.alive = False
        status = self._proc.wait()
        for p in [*self._asked.values(), *self._running.values()]:
            with open(p.log, "a") as f:
                f.write(f"\ntests/zygote.py: the server that forked this run ended with exit status {status}; "
                        f"its log: {self._log}\n")
            p._started.set()
            p._end(-signal.SIGKILL, 0.0)

    def _stop(self) -> None:
        for p in list(self._running.values()):
            p.kill()
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        if self.alive:  # a server that died keeps its log: its runs' logs name it
            with contextlib.suppress(FileNotFoundError):  # stopped once already (Zygote.get, then atexit)
                os.unlink(self._log)


def run(argv: list[str], *, cwd, env: dict, timeout: float, preload: tuple[str, ...]) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...) for `python ...` argv, forked from
    a zygote with `preload` imported."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zygote-run-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        p = Zygote.get(argv[0], env, preload).spawn(argv, cwd, env, err, stdout=out)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            return subprocess.CompletedProcess(argv, code, o.read(), e.read())


def python(argv: list[str], *, cwd, env: dict, timeout: float, preload: tuple[str, ...]) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...) for `python ...` argv: forked from a
    zygote with `preload` imported, or with TEST_ZYGOTE=0 a process of its own."""
    if enabled():
        return run(argv, cwd=cwd, env=env, timeout=timeout, preload=preload)
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def enabled() -> bool:
    """Whether runs are forked from zygotes (TEST_ZYGOTE=0: each a process of its own)."""
    return os.environ.get("TEST_ZYGOTE", "1") == "1"


# ---- the server ------------------------------------------------------------------------------
def _child(req: dict) -> int:
    """In the forked child: `python SCRIPT ARGS...` run; its exit status."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the server's requests are not the child's
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if req["mode"] == "a" else os.O_TRUNC)
        # stdout: its own file, or nowhere (the server's answers are not the child's)
        os.dup2(os.open(req["stdout"], flags, 0o644) if req.get("stdout") else null, 1)
        os.dup2(os.open(req["log"], flags, 0o644), 2)
        os.chdir(req["cwd"])
        imported = {k: os.environ[k] for k in _NOT_KEYED if k in os.environ}  # what the import set
        os.environ.clear()
        os.environ.update({**imported, **req["env"]})
        import runpy

        os.execv = _exec_python_c
        if req["argv"][1] == "-m":  # python -m MODULE ARGS...
            sys.argv = [req["argv"][2], *req["argv"][3:]]  # run_module puts the module's file first
            sys.path[0] = os.getcwd()
            # Not imported yet, as in a fresh `python -m` (its imports are: the preload's point).
            sys.modules.pop(req["argv"][2], None)
            runpy.run_module(req["argv"][2], run_name="__main__", alter_sys=True)
        else:
            script = req["argv"][1]
            sys.argv = req["argv"][1:]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)  # as Python does with sys.exit("message")
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


def _exec_python_c(path: str, argv: list[str]) -> None:
    """os.execv in a child: `python [FLAGS] -c CODE ARGS...` (what `pinpoint trace` replaces its
    process with, pinpoint.trace.launch) run in the child, as the new process would run it, but
    for the import (the interpreter's flags are the child's)."""
    import types

    if path != sys.executable or "-c" not in argv:
        raise OSError(f"tests/zygote.py: a child cannot exec {argv[:3]}")
    i = argv.index("-c")
    sys.argv = ["-c", *argv[i + 2:]]
    sys.path[0] = ""  # as `python -c` has it
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    exec(compile(argv[i + 1], "<string>", "exec"), main.__dict__)
    raise SystemExit(0)


def serve(preload: list[str]) -> None:
    import importlib

    for name in preload:  # the imports every child shares
        importlib.import_module(name)
    if "tensorflow" in sys.modules:
        from tensorflow.python.eager import context

        # A context made before the fork would be every child's (its devices fixed before the
        # program could configure them): the imports must not have made one.
        assert context.context_safe() is None or context.context()._context_handle is None, preload

    def answer(msg: dict) -> None:
        os.write(1, (json.dumps(msg) + "\n").encode())

    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        if ready:
            data = os.read(0, 1 << 16)
            if not data:
                return  # the client is gone
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    # The child leaves the server's loop and ends as a Python process does: threads
                    # joined, atexit handlers run, streams flushed.
                    raise SystemExit(_child(req))
                answer({"id": req["id"], "pid": pid})
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            answer({"pid": pid, "status": os.waitstatus_to_exitcode(status),
                    "cpu": usage.ru_utime + usage.ru_stime})


if __name__ == "__main__":
    serve(sys.argv[1:])
