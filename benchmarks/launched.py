"""Run a script as `pinpoint trace` now runs a program, with nothing of Pinpoint: `python -c BOOT
SCRIPT ARGS`, whose module-level `try` execs the script's code in the interpreter's own `__main__`,
one frame above the program (pinpoint.trace.launch). benchmarks/user_calls.py's `frames` arm
measures what that frame alone costs each eager op and tf.function call (TensorFlow captures the
Python stack at each).

    python -c "$(python -c 'import benchmarks.launched as l; print(l.BOOT)')" SCRIPT ARGS...
"""

from __future__ import annotations

import os
import sys

# As pinpoint.trace.launch.BOOT: the program's code exec'd by a module-level try.
BOOT = """try:
    exec(__import__("benchmarks.launched", fromlist=["start"]).start())
except SystemExit:
    raise
"""


def start():
    """The script's code, with sys.argv, sys.path and `__main__`'s namespace as `python SCRIPT ARGS`
    has them."""
    path = os.path.abspath(sys.argv[1])
    if sys.path and sys.path[0] == "":
        sys.path.pop(0)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(path))
    namespace = sys.modules["__main__"].__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    namespace.update(__name__="__main__", __file__=path, __builtins__=builtins, __doc__=None)
    with open(path) as f:
        return compile(f.read(), path, "exec", dont_inherit=True)  # the script's own __future__ flags
