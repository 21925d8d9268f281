"""User code: import `package.module:callable` from train.code_dir and call it.

Every failure is one ConfigError line naming the field, the value, what went wrong (the
import error's or the callable's own last line) and the fix. Nothing is imported until asked.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pinpoint.config import Config, is_import_path
from pinpoint.errors import ConfigError, PinpointError

# Set in a user image (docker/Dockerfile.user): where the user's code was copied. It wins over
# train.code_dir, which names a folder on the machine that wrote the config.
CODE_DIR_ENV = "PINPOINT_CODE_DIR"


def code_dir(cfg: Config) -> str | None:
    return os.environ.get(CODE_DIR_ENV) or cfg.train.code_dir


def add_code_dir(cfg: Config) -> str | None:
    """Put the user's code folder first on sys.path (idempotent); return it."""
    folder = code_dir(cfg)
    if folder:
        if not Path(folder).is_dir():
            raise ConfigError(
                f"train.code_dir: got '{folder}', which is not a folder; "
                "point it at the folder that holds your package (default: the config file's folder)"
            )
        if sys.path[:1] != [folder]:
            if folder in sys.path:
                sys.path.remove(folder)
            sys.path.insert(0, folder)
    return folder


def last_line(err: BaseException) -> str:
    """'TypeName: last line of the message': what a one-line error quotes of an exception."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1]}" if text else type(err).__name__


def _check_findable(cfg: Config, field: str, path: str) -> None:
    """A module that is not there at all, found without importing anything."""
    module_name = path.partition(":")[0]
    folder = add_code_dir(cfg)
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError) as err:  # a parent package that is missing or broken
        found = not isinstance(err, ModuleNotFoundError)
    if not found:
        raise ConfigError(
            f"{field}: got {path!r}; no module '{module_name}' in train.code_dir ({folder}) or the "
            "installed packages; check the module path and train.code_dir"
        )


def load_callable(cfg: Config, field: str, path: str) -> Callable:
    """The callable named by `path` ('package.module:name'), imported from the code folder."""
    if not is_import_path(path):
        raise ConfigError(f"{field}: got {path!r}; write it as 'package.module:callable'")
    module_name, _, attr = path.partition(":")
    folder = add_code_dir(cfg)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure of user code is one line
        raise ConfigError(
            f"{field}: got {path!r}; module '{module_name}' does not import "
            f"({last_line(err)}); check the module path and train.code_dir ({folder})"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(
            f"{field}: got {path!r}; module '{module_name}' has no attribute '{attr}'; "
            f"fix the name (callables defined there: {', '.join(names) or 'none'})"
        )
    if not callable(fn):
        raise ConfigError(f"{field}: got {path!r}; '{attr}' is a {type(fn).__name__}, not a callable")
    return fn


def call(fn: Callable, field: str, path: str, kwargs: Mapping[str, Any], offered: Mapping[str, Any],
         args_field: str) -> Any:
    """fn(**kwargs, **those `offered` values whose names fn's signature lists)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    extra = {k: v for k, v in offered.items() if k in params and k not in kwargs}
    try:
        return fn(**dict(kwargs), **extra)
    except PinpointError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's callable failed: one line, its message
        raise ConfigError(
            f"{field}: got {path!r}; the callable raised {last_line(err)}; "
            f"fix it or its arguments ({args_field}: {dict(kwargs)}; also passed: {sorted(extra)})"
        ) from None


def no_files(data: str) -> ConfigError:
    return ConfigError(
        f"train.data: got {data!r}; no file matches that pattern; check the path "
        "(a relative path is resolved against the config file's folder)"
    )


def uses_user_code(cfg: Config) -> bool:
    t = cfg.train
    if t.entrypoint:
        return True
    return any(is_import_path(v) for v in (t.model, t.data, t.loss))


def preflight(cfg: Config) -> None:
    """What can be checked without building anything: file sources match files, user modules
    exist (both before anything imports TensorFlow), then import and name their callables.
    Run before a local cluster starts its processes."""
    import glob

    from pinpoint.config import file_source

    t = cfg.train
    if uses_user_code(cfg):
        from pinpoint.quiet import import_tensorflow

        import_tensorflow()  # the user's modules import it: quietly, before they do
    if t.entrypoint:  # the user's code owns model, data and loss
        _check_findable(cfg, "train.entrypoint", t.entrypoint)
        load_callable(cfg, "train.entrypoint", t.entrypoint)
        return
    paths = [(f, v) for f, v in (("train.model", t.model), ("train.data", t.data), ("train.loss", t.loss))
             if is_import_path(v)]
    for field, value in paths:
        _check_findable(cfg, field, value)
    for field, value in paths:
        load_callable(cfg, field, value)
    src = file_source(t.data)
    if src:
        kind, where = src
        found = Path(where).is_dir() if kind == "images" else bool(glob.glob(where))
        if not found:
            raise no_files(t.data)
        if kind == "parquet" and t.strategy == "parameter_server":
            raise ConfigError(
                f"train.data: got {t.data!r}; parquet is read in Python (pyarrow), which "
                "parameter_server's workers cannot run; convert it to tfrecord or csv, or use multi_worker_mirrored"
            )
