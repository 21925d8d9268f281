"""Run a script as `python SCRIPT ARGS` does, but three frames below the process's first, as
`pinpoint trace` runs a program (the console script, `cli.main`, `trace.program.run`), with nothing of
Pinpoint imported: benchmarks/user_calls.py's `frames` arm, which measures what those frames alone
cost each eager op and tf.function call (TensorFlow captures the Python stack at each).

    python benchmarks/three_frames.py SCRIPT ARGS...
"""

from __future__ import annotations

import os
import sys
import types


def run(path: str) -> None:
    """Exec the script as __main__ in this frame, the third from the process's first."""
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(path)
    exec(code, module.__dict__)


def main() -> int:
    run(os.path.abspath(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
