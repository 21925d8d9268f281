"""A quiet start: third-party start-up noise stays off the terminal unless `--verbose`.

On a machine without a GPU, importing TensorFlow prints CPU-feature, oneDNN and CUDA-probe lines
(one of them at ERROR level: the failed cuInit), and logging a model with MLflow prints warnings
and a download progress bar; none of it is about the user's run. Set in the process environment
before TensorFlow or MLflow is imported, so the task and sender processes a run starts inherit it.
A variable the user set themselves is left alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings

# Set by `--verbose` (and inherited by the processes a run starts): show everything.
VERBOSE_ENV = "PINPOINT_VERBOSE"

QUIET_ENV = {
    # 3: TensorFlow's C++ log shows FATAL only; TensorFlow's real failures reach Python as
    # exceptions, which Pinpoint reports in one line.
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "MLFLOW_LOGGING_LEVEL": "ERROR",  # model-signature and pickling advice, migration INFO lines
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # Python warnings from the libraries (e.g. MLflow's "Add type hints" UserWarning), in this
    # process and the ones it starts.
    "PYTHONWARNINGS": "ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning",
}


# The warning filters and PYTHONWARNINGS as the process started (the user's -W / PYTHONWARNINGS
# included), before quiet_start silenced the libraries: a traced program's own warnings use them.
_STARTED_WITH: tuple[list, str | None] | None = None


def quiet_start(verbose: bool) -> None:
    """Keep start-up noise off (the default), or show everything with verbose=True (or when the
    process that started this one was verbose: the tasks of a `pinpoint train --verbose` cluster)."""
    global _STARTED_WITH
    if _STARTED_WITH is None:
        _STARTED_WITH = (list(warnings.filters), os.environ.get("PYTHONWARNINGS"))
    if verbose or os.environ.get(VERBOSE_ENV) == "1":
        os.environ[VERBOSE_ENV] = "1"
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def import_tensorflow() -> None:
    """Import TensorFlow once for this process. Unless verbose, what its C++ libraries print while
    they load (before TF_CPP_MIN_LOG_LEVEL applies: the absl, oneDNN and CUDA-driver lines) is
    captured from file descriptor 2 and shown only if the import fails."""
    if "tensorflow" in sys.modules or os.environ.get(VERBOSE_ENV) == "1":
        import tensorflow  # noqa: F401
        return
    sys.stderr.flush()
    saved = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401

            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))


@contextlib.contextmanager
def program_warnings():
    """While a user's program runs (`pinpoint trace`): its warnings (its own `warnings.warn`,
    Keras' UserWarnings) are shown as `python` shows them, with the filters the process started
    with; Pinpoint's start-up noise before and after stays quiet."""
    if _STARTED_WITH is None:
        yield
        return
    filters, env = _STARTED_WITH
    saved_env = os.environ.get("PYTHONWARNINGS")
    with warnings.catch_warnings():
        warnings.resetwarnings()  # also invalidates the modules' once-per-location registries
        warnings.filters[:] = filters
        _set_env("PYTHONWARNINGS", env)  # the program's own child processes, as under python
        try:
            yield
        finally:
            _set_env("PYTHONWARNINGS", saved_env)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
