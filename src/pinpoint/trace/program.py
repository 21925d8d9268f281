"""Run a program the way `python SCRIPT ARGS` / `python -m MODULE ARGS` would, in this process:
`sys.argv`, `__main__`, `sys.path[0]`, its exit code; an exception is shown as Python shows it
with Pinpoint's own frames left out."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import runpy
import sys
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.quiet import program_warnings
from pinpoint.trace.launch import BOOT_FILENAME

# Pinpoint's and runpy's frames (runpy's are "<frozen runpy>" when Python runs it frozen, as 3.11 does).
_OWN = (str(Path(__file__).resolve().parents[1]), os.path.dirname(runpy.__file__) + os.sep + "runpy.py",
        "<frozen runpy>")

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


@dataclass
class Program:
    """A script path or a module name, and its arguments."""

    target: str
    args: list[str]
    module: bool = False

    @property
    def name(self) -> str:
        return self.target.rsplit(".", 1)[-1] if self.module else Path(self.target).stem

    def check(self) -> None:
        """The script exists / the module can be found: one line otherwise (nothing has run)."""
        if self.module:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
            try:
                found = importlib.util.find_spec(self.target)
            except (ImportError, ValueError) as err:
                found = None
                why = f" ({type(err).__name__}: {err})"
            else:
                why = ""
            finally:
                sys.path.pop(0)
            if found is None:
                raise ConfigError(f"-m: got {self.target!r}, which does not import{why}; check the module "
                                  "name and that its package is on sys.path (run from its folder or install it)")
            return
        path = Path(self.target)
        if path.is_dir() and not (path / "__main__.py").is_file():
            # `python DIR` runs DIR/__main__.py; a folder without one is not a program.
            raise ConfigError(f"SCRIPT: got {self.target!r}, a folder without __main__.py; pass the path of a "
                              "Python file in it (or -m MODULE)")
        if not path.is_file() and not path.is_dir():
            raise ConfigError(f"SCRIPT: got {self.target!r}, which does not exist; pass the path of a Python "
                              "file (or -m MODULE)")


@dataclass
class Outcome:
    exit_code: int
    status: str  # FINISHED, FAILED or KILLED
    error: BaseException | None = None


def run(program: Program, on_end=None) -> Outcome:
    """Run `program` as __main__; its exit code and how it ended. `on_end()` is called when the
    program ended, while its module's objects are still alive. The caller's sys.argv and
    sys.path are restored afterwards.

    The program runs a few bytecodes into this function: TensorFlow captures
    the Python stack (up to 30 frames) at every eager op and tf.function call and works out each
    frame's line number, at a cost that grows with how far into its function a frame is (the
    command line's launch keeps one frame under a program: trace.launch)."""
    try:
        with _as_program(program) as (target, kind):
            # runpy's work, the exec in this frame (runpy takes three or four frames more)
            found = _code_of(target, kind)
            if found is not None:
                code, module = found
                with _as_main(module, module.__file__):
                    exec(code, module.__dict__)
                namespace = module.__dict__.copy()
            else:
                namespace = _run_other(target, kind)
        if on_end is not None:
            on_end()
        del namespace
        return Outcome(0, FINISHED)
    except BaseException as err:  # noqa: BLE001 - every way a program ends is an outcome
        if on_end is not None:
            on_end()  # the traceback keeps the program's frames alive
        return outcome_of(err)


@contextlib.contextmanager
def as_main_program(program: Program, main: types.ModuleType) -> Iterator[Any]:
    """The program's code to exec in `main`, the interpreter's own `__main__` (trace.launch): its
    sys.argv, sys.path and warning filters as in `run`, and `main`'s namespace as `run` gives the
    program's (a module or folder that runpy runs: code that calls runpy, as `run` does)."""
    with _as_program(program) as (target, kind):
        found = _code_of(target, kind)
        if found is not None:
            code, module = found
            sys.argv[0] = module.__file__
        else:
            call = (f"run_module({target!r}, run_name='__main__', alter_sys=True)" if kind == "module"
                    else f"run_path({target!r}, run_name='__main__')")
            code = compile(f"__import__('runpy').{call}", BOOT_FILENAME, "exec", dont_inherit=True)
            module = types.ModuleType("__main__")
        namespace = main.__dict__
        builtins = namespace.get("__builtins__")
        namespace.clear()
        namespace.update(module.__dict__, __name__="__main__")
        if builtins is not None:
            namespace["__builtins__"] = builtins
        yield code


@contextlib.contextmanager
def _as_program(program: Program) -> Iterator[tuple[str, str]]:
    """sys.argv and sys.path as `python SCRIPT ARGS` / `python -m MODULE ARGS` has them, and the
    program's warning filters; (the script's path or the module's name, "script", "folder" or
    "module")."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        sys.argv = [program.target, *program.args]
        if program.module:
            sys.path.insert(0, os.getcwd())
            target = program.target
        else:
            target = str(Path(program.target).resolve())
            # A folder runs its __main__.py with the folder itself first on sys.path, as `python DIR`.
            sys.path.insert(0, target if os.path.isdir(target) else os.path.dirname(target))
        kind = "module" if program.module else "script" if os.path.isfile(target) else "folder"
        with program_warnings():
            yield target, kind
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _run_other(target: str, kind: str) -> dict:
    """A module (`-m`) or a folder with a __main__.py, as runpy runs them."""
    if kind == "module":
        return runpy.run_module(target, run_name="__main__", alter_sys=True)
    return runpy.run_path(target, run_name="__main__")


def _code_of(target: str, kind: str) -> tuple[Any, types.ModuleType] | None:
    """A script's or module's code and the __main__ it runs in; None for what runpy runs (a folder,
    a module whose code cannot be read)."""
    return _compiled(target) if kind == "script" else _module_code(target) if kind == "module" else None


def _compiled(script: str) -> tuple[Any, types.ModuleType]:
    with io.open_code(script) as f:
        # Not this module's `from __future__ import annotations`: the script's own flags, as python's.
        code = compile(f.read(), script, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __cached__=None, __doc__=None, __loader__=None, __package__="",
                           __spec__=None)
    return code, module


def _module_code(name: str) -> tuple[Any, types.ModuleType] | None:
    """A module's code and the __main__ it runs in, as `python -m NAME` has them (a package: its
    __main__); None when it cannot be found or read, for runpy to say why as Python does."""
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{name}.__main__")
        code = spec.loader.get_code(spec.name) if spec is not None and spec.loader is not None else None
    except Exception:  # noqa: BLE001 - runpy raises it again, with Python's own message
        return None
    if code is None or not spec.origin:
        return None
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __doc__=None, __loader__=spec.loader,
                           __package__=spec.parent, __spec__=spec)
    return code, module


@contextlib.contextmanager
def _as_main(module: types.ModuleType, script: str) -> Iterator[None]:
    saved_main, saved_argv0 = sys.modules.get("__main__"), sys.argv[0]
    sys.modules["__main__"], sys.argv[0] = module, script
    try:
        yield
    finally:
        sys.argv[0] = saved_argv0
        if saved_main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = saved_main


def outcome_of(err: BaseException) -> Outcome:
    """How a program that raised `err` ended (its traceback shown as Python shows it)."""
    try:
        raise err
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)  # as Python does with sys.exit("message")
            code = 1
        return Outcome(code, FINISHED if code == 0 else FAILED)
    except KeyboardInterrupt as err:
        return Outcome(130, KILLED, err)
    except BaseException as err:  # noqa: BLE001 - the program's own failure: shown as Python would
        print_user_traceback(err)
        return Outcome(1, FAILED, err)


def print_user_traceback(err: BaseException) -> None:
    """The traceback Python would print, without Pinpoint's and runpy's frames."""
    tb = err.__traceback__
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_OWN)]
    while frames and frames[0].filename == BOOT_FILENAME:  # trace.launch's BOOT (and its call of runpy)
        frames = frames[1:]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames),
             *traceback.format_exception_only(type(err), err)]
    sys.stderr.write("".join(lines))
    sys.stderr.flush()
