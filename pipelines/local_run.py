"""`make run`: the training pipeline, locally, through kfp.local (one subprocess per step).

The MLflow parent run is opened here (the pipeline's steps log child runs under it) and closed
with the pipeline's status; at the end the placement summary is printed.

kfp's own INFO logging is trimmed unless verbose (`pinpoint run --verbose`, PINPOINT_VERBOSE=1):
the steps' executor lines ("[KFP Executor ... INFO]: ..."), the "Streamed logs:" headers and
each task's dump of its outputs go; each step's start and status, whatever a step prints itself,
warnings and errors stay.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path

UI_HINT = "Open the MLflow UI: make mlflow-ui (http://127.0.0.1:5000)"


def run_local(config_path: str | Path, runs_root: str | Path = Path("runs"), *, verbose: bool | None = None) -> int:
    """Run provision -> train -> report for `config_path` into `<runs_root>/<name>/`; return an exit code.
    verbose (default: PINPOINT_VERBOSE=1, which `pinpoint --verbose` sets) keeps all of kfp's logging."""
    from pinpoint.config import config_to_yaml, load_config
    from pinpoint.quiet import VERBOSE_ENV
    from pinpoint.runfolder import ensure_dir

    if verbose is None:
        verbose = os.environ.get(VERBOSE_ENV) == "1"

    cfg = load_config(config_path)
    root = ensure_dir(Path(runs_root).absolute(), field="--runs-root")
    run_dir = root / cfg.name
    pipeline = _build_pipeline()  # before opening the MLflow parent run: fail early, log nothing
    parent_run_id = _start_parent(cfg)
    status, ok = "FAILED", False
    try:
        failed_step = _run_pipeline(
            pipeline,
            config_yaml=config_to_yaml(cfg),
            run_dir=run_dir,
            parent_run_id=parent_run_id,
            pipeline_root=root / ".kfp-outputs",
            verbose=verbose,
        )
        ok = not failed_step
        status = "FINISHED" if ok else "FAILED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        _end_parent(cfg, parent_run_id, status)
    if not ok:
        print(
            f"pinpoint: the pipeline failed in step '{failed_step}' (its log is above); "
            f"partial outputs are in {run_dir}",
            file=sys.stderr,
        )
        return 1
    print(_summary(run_dir))
    print(f"Run folder: {run_dir}")
    print(UI_HINT)
    return 0


def _build_pipeline():
    try:
        from pipelines.training_pipeline import build_training_pipeline
    except ImportError as err:
        from pinpoint.errors import ConfigError

        raise ConfigError(
            f"run: the pipeline needs kfp ({err.name or err} is missing); run `make setup` "
            "(or pip install 'pinpoint[pipelines]')"
        ) from None
    return build_training_pipeline()


def _run_pipeline(pipeline, *, config_yaml: str, run_dir: Path, parent_run_id: str, pipeline_root: Path,
                  verbose: bool = False) -> str:
    """Run the pipeline with kfp.local's SubprocessRunner in this interpreter; return the failed
    step's name, or '' on success."""
    from kfp import local

    # use_venv=False: the steps run with this interpreter, which has pinpoint installed; the
    # components never `pip install` anything (install_kfp_package=False).
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        raise_on_error=True,
    )
    with warnings.catch_warnings():
        # The components name the container image they use on Kubernetes; the subprocess runner
        # warns that it is not a python image, which is irrelevant here (same interpreter).
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        # Retries and resource limits are for Kubernetes; kfp.local ignores them (and says so).
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        quiet = _HideExecutorInput(sys.stdout, verbose=verbose)
        sys.stdout = quiet
        # kfp.local logs through the root logger (its level reset to INFO for every message).
        kfp_filter = None if verbose else _KfpInfoFilter()
        if kfp_filter is not None:
            logging.getLogger().addFilter(kfp_filter)
        try:
            pipeline(config_yaml=config_yaml, run_dir=str(run_dir), parent_run_id=parent_run_id)
        except RuntimeError as err:
            # kfp.local raises a RuntimeError naming the failed task; the step already printed why.
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
            if "finished with status" not in text:
                raise
            failed = re.search(r"Inner task failed: (.*?)\.?$", text)
            return failed.group(1).strip("'") if failed else "unknown"
        finally:
            if kfp_filter is not None:
                logging.getLogger().removeFilter(kfp_filter)
            quiet.flush()
            sys.stdout = quiet.target
    return ""


class _KfpInfoFilter(logging.Filter):
    """Drops kfp.local's INFO records that repeat what the run folder holds: the "Streamed logs:"
    header, each task's outputs (artifact URIs and metadata) and the workspace clean-up. Every
    other record (a task's start and status, retries, skips, warnings, errors) passes."""

    HIDDEN = re.compile(r"^(Streamed logs:|Task \S+ (outputs:|has no outputs)|Cleaned up workspace:)")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        return not self.HIDDEN.match(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))


class _HideExecutorInput:
    """A stdout filter for the steps' logs: kfp's executor dumps its whole input as JSON (~80
    lines per step, the config included); keep one line instead (verbose) or none. Unless
    verbose, the executor's INFO lines ("[KFP Executor <time> INFO]: ...": which module it loads,
    where it wrote its output, and the INFO records of the libraries a step uses) and blank lines
    go too. Everything else passes: what the step prints, warnings, errors, tracebacks."""

    MARKER = "Got executor_input:"
    EXECUTOR_INFO = re.compile(r"^\s*\[KFP Executor (?:[^\]]* )?INFO\]: ")

    def __init__(self, target, *, verbose: bool):
        self.target = target
        self.verbose = verbose
        self._buffer = ""
        self._skip_indent: int | None = None  # indent of the JSON's opening brace while skipping
        self._expect_open = False

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line + "\n")
        return len(text)

    def _line(self, line: str) -> None:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if self._expect_open:
            self._expect_open = False
            if stripped == "{":
                self._skip_indent = indent
                return
        if self._skip_indent is not None:
            if stripped == "}" and indent == self._skip_indent:
                self._skip_indent = None
            return
        if self.MARKER in line:
            self._expect_open = True
            line = line.replace(self.MARKER, "Got executor_input (omitted).")
        if not self.verbose and (not stripped or self.EXECUTOR_INFO.match(line)):
            return
        self.target.write(line)

    def flush(self) -> None:
        if self._buffer:
            self.target.write(self._buffer)
            self._buffer = ""
        self.target.flush()

    def __getattr__(self, name):
        return getattr(self.target, name)


def _start_parent(cfg) -> str:
    if not cfg.tracking.enabled:
        return ""
    from pinpoint.tracking import start_parent_run

    return start_parent_run(cfg, f"{cfg.name}-pipeline") or ""


def _end_parent(cfg, run_id: str, status: str) -> None:
    if not run_id:
        return
    from pinpoint.tracking import end_parent_run

    end_parent_run(run_id, status, cfg=cfg)


def _summary(run_dir: Path) -> str:
    from pinpoint.placement import format_summary
    from pinpoint.runfolder import METRICS, PLACEMENT, read_json

    placement = read_json(run_dir / PLACEMENT, field="run folder")
    metrics = read_json(run_dir / METRICS, field="run folder")
    return format_summary(placement, metrics)
