"""`pinpoint trace` from the command line: the program in a process of its own, one frame above it.

TensorFlow captures the Python stack (up to 30 frames) at every eager op and tf.function call and
works out each frame's line number, so every frame under a program costs it at each op. Run in
the `pinpoint` process, a program has the console script's module, `cli.main` and the frame that
execs it below it. So the command line replaces its process (`os.execv`, the same PID, signals
and file descriptors) with `python -c BOOT trace ARGS...`, whose BOOT, a module-level `try`,
execs the program's code in the interpreter's own `__main__`: its only frame under the program.

    BOOT:  try: exec(launched_start())  except BaseException as e: launched_end(e)  else: launched_end(None)

`cli.launched_start()` does what the `pinpoint trace` process did before the program (the
arguments, capture on) and returns the program's code; `cli.launched_end()` reads what was
captured, writes the run folder and exits with the program's exit code. While the program runs,
`__main__`'s namespace holds nothing of the launch.
"""

from __future__ import annotations

import os
import subprocess
import sys

# A module-level try: no function frame of Pinpoint's under the program's <module>.
BOOT = """try:
    exec(__import__("pinpoint.cli", fromlist=["launched_start"]).launched_start())
except BaseException as _pinpoint_ended:
    __import__("pinpoint.cli", fromlist=["launched_end"]).launched_end(_pinpoint_ended)
else:
    __import__("pinpoint.cli", fromlist=["launched_end"]).launched_end(None)
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
