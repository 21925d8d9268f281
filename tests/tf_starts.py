"""Counts TensorFlow start-ups per test: every Python process of the test venv that imports
`tensorflow` appends one line, `<test id>\t<pid>\t<program>`, to the file named by
PINPOINT_TF_STARTS. The test id is pytest's PYTEST_CURRENT_TEST, which the test's subprocesses
inherit, so a start is charged to the test (or the fixture set-up) that caused it.

The venv's `pinpoint_tf_starts.pth` (written by the Makefile) runs this file at interpreter
start when PINPOINT_TF_STARTS is set; without it, nothing is installed. scripts/ci_times.py
reads the lines. A process started with an environment of its own (no PINPOINT_TF_STARTS) is
not counted, nor a forked child (TensorFlow is already imported there).
"""

import os
import sys


class _TensorFlowStarts:
    """A meta-path finder that finds nothing: it only notes the first import of `tensorflow`."""

    pinpoint_tf_starts = True  # one such finder a process, however often this file runs

    def __init__(self, log: str):
        self.log = log

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "tensorflow":
            sys.meta_path.remove(self)  # one line a process: the first import is the start-up
            test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
            program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            try:
                with open(self.log, "a") as f:
                    f.write(f"{test}\t{os.getpid()}\t{program}\n")
            except OSError:
                pass  # counting is never worth failing a program
        return None


_log = os.environ.get("PINPOINT_TF_STARTS")
if _log and not any(getattr(f, "pinpoint_tf_starts", False) for f in sys.meta_path):
    sys.meta_path.insert(0, _TensorFlowStarts(_log))
