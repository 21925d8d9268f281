"""`pinpoint trace` from the command line: the program in a process of its own, one frame above it.

TensorFlow captures the Python stack (up to 30 frames) at every eager op and tf.function call and
works out each frame's line number, so every frame under a program costs it at each op. Run in
the `pinpoint` process, a program has the console script's module, `cli.main` and the frame that
execs it below it. So the command line replaces its process (`os.execv`, the same PID, signals
and file descriptors) with `python -c BOOT trace ARGS...`, whose BOOT, a module-level `try`,
execs the program's code in the interpreter's own `__main__`: its only frame under the program.

    BOOT:  try: exec(start())  except BaseException as e: end(e)  else: end(None)

`start()` does what the `pinpoint trace` process did before the program (the arguments, capture
on) and returns the program's code; `end()` reads what was captured, writes the run folder and
exits with the program's exit code. While the program runs, `__main__`'s namespace holds nothing
of the launch.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

# A module-level try: no function frame of Pinpoint's under the program's <module>.
BOOT = """try:
    exec(__import__("pinpoint.trace.launch", fromlist=["start"]).start())
except BaseException as _pinpoint_ended:
    __import__("pinpoint.trace.launch", fromlist=["end"]).end(_pinpoint_ended)
else:
    __import__("pinpoint.trace.launch", fromlist=["end"]).end(None)
"""
# The name `python -c` gives BOOT's code: its frame is the outermost of a program's traceback.
BOOT_FILENAME = "<string>"  # (trace.program.print_user_traceback leaves it out)


def relaunch(argv: list[str]) -> None:
    """Replace this process with `python -c BOOT ARGV...` (the same interpreter and its flags, the
    same environment). Returns only where the interpreter cannot be exec'd (the caller then runs
    the program in this process)."""
    if not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # The interpreter's own flags (-X, -W, -O ...), as multiprocessing passes them to its children.
    flags = subprocess._args_from_interpreter_flags()
    try:
        os.execv(sys.executable, [sys.executable, *flags, "-c", BOOT, *argv])
    except OSError:
        return


@dataclass
class _Launched:
    steps: Any  # trace.session.trace_steps' generator, suspended at its yield
    on_end: Any
    program: contextlib.ExitStack  # the program's argv, sys.path and warning filters


_launched: _Launched | None = None


def start():
    """In BOOT: `pinpoint trace ARGS` (sys.argv[1:]) up to the program, capture on; the program's
    code, for BOOT to exec in `__main__`. A bad argument: its one line, and SystemExit."""
    global _launched
    if sys.path and sys.path[0] == "":
        sys.path.pop(0)  # `-c`'s working directory: the program's own folder goes first instead
    from pinpoint import cli
    from pinpoint.trace.program import as_main_program
    from pinpoint.trace.session import first_program

    steps = cli._guarded(cli._command, sys.argv[1:], True)
    if isinstance(steps, int):
        raise SystemExit(steps)
    first = cli._guarded(first_program, steps)
    if isinstance(first, int):
        raise SystemExit(first)
    program, on_end = first
    stack = contextlib.ExitStack()
    code = stack.enter_context(as_main_program(program, sys.modules["__main__"]))
    _launched = _Launched(steps, on_end, stack)
    return code


def end(err: BaseException | None) -> None:
    """In BOOT, the program ended (`err`: how, None when it ran to its end): read what was captured,
    write the run folder and exit with the program's exit code."""
    launched = _launched
    if launched is None:  # start() ended before the program: its SystemExit (or a bug's traceback)
        raise err if err is not None else SystemExit(0)
    from pinpoint import cli
    from pinpoint.trace.program import FINISHED, Outcome, outcome_of
    from pinpoint.trace.session import send_outcome

    launched.program.close()
    launched.on_end()  # the program's objects are alive (the traceback holds its frames)
    outcome = Outcome(0, FINISHED) if err is None else outcome_of(err)
    del err
    code = cli._guarded(send_outcome, launched.steps, outcome)
    # The process exits next: the objects alive leave the cyclic collector (cli.main says why).
    gc.freeze()
    raise SystemExit(code)
