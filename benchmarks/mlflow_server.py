"""A real `mlflow server` (sqlite store, proxied artifacts) for the tracking comparison."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(root: Path, timeout: float = 180.0) -> Iterator[str]:
    """Start a server with its store under `root`; yield its URI; stop it (the whole group)."""
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    # The full `mlflow` package's server, from its own venv (the Makefile's .venv-mlflow).
    cmd = [str(Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"), "server",
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no genai job runners
    env.pop("MLFLOW_TRACKING_URI", None)
    # Niced: a tracking server runs on its own machine; on this one it shares the cores with the
    # training it measures, and its work should not pass for the training process's cost.
    with open(root / "server.log", "a") as log:
        proc = subprocess.Popen(["nice", "-n", "10", *cmd], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=root)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}; see {root / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy after {timeout:.0f} s; see {root / 'server.log'}")
            time.sleep(0.3)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
