"""SIGTERM as an exception, for the long-running commands that must clean up when stopped (a
pipeline run terminated, a pod evicted): the local cluster launcher and the Kubernetes launch step."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, so no `except Exception` on the way swallows it."""


class SigtermGuard:
    """While active, the first SIGTERM raises Terminated in the main thread; later ones (and any
    after `disarm()`) are ignored, so the cleanup that follows is not interrupted in turn."""

    def __init__(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def _handler(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[SigtermGuard]:
    """Install the guard's handler for the block (main thread only: signal handlers can only be set
    there, and only it receives them); the previous handler is restored after."""
    guard = SigtermGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = signal.signal(signal.SIGTERM, guard._handler)
    try:
        yield guard
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
