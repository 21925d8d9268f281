"""Run folders (`runs/<name>/`): paths, and writes that never leave a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError

# File names shared by the steps; each step reads its inputs from the previous step's outputs.
CONFIG_FILE = "config.yaml"
CLUSTER_SPEC = "cluster_spec.json"
MANIFESTS_DIR = "manifests"
PLACEMENT = "placement.json"
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
REPORT_HTML = "report.html"
TRAIN_LOG = "train_log.jsonl"
# Where the run folders' volume is mounted in every pipeline step and training pod on Kubernetes.
RUNS_MOUNT = "/runs"
PROFILE = "profile"  # placement.timing: the TensorFlow profiler trace (TensorBoard logdir)


def ensure_dir(path: str | Path, field: str = "--out") -> Path:
    """Create `path` (and parents) and check it is writable; one-line error otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{field}: cannot create '{p}' ({err.strerror}); choose a writable folder") from None
    if not os.access(p, os.W_OK):
        raise ConfigError(f"{field}: '{p}' is not writable; choose a writable folder")
    return p


def inside(root: str | Path, relative: str | Path) -> Path:
    """Join `relative` under `root`, refusing anything that escapes it (.., absolute paths, links)."""
    base = Path(root).resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise ConfigError(f"path '{relative}' escapes the run folder '{root}'; use a path inside it")
    return target


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write via a temp file in the same folder and rename, so readers never see half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask),
        # so other users in the pod (and the MLflow UI) can read run outputs.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | Path, field: str = "DIR") -> Any:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{field}: '{p}' not found; run the previous step first (see `make help`)")
    return json.loads(p.read_text())
