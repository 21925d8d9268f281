"""Run folders (`runs/<name>/`): paths, and writes that never leave a half-written file."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError

# File names shared by the steps; each step reads its inputs from the previous step's outputs.
CONFIG_FILE = "config.yaml"
CLUSTER_SPEC = "cluster_spec.json"
MANIFESTS_DIR = "manifests"
PLACEMENT = "placement.json"
PLACEMENT_OPS = "placement_ops.json.gz"  # its per-op detail (placement.model.files)
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
REPORT_HTML = "report.html"
TRAIN_LOG = "train_log.jsonl"
TRACKING_COST = "tracking.json"  # what MLflow tracking cost the run (tracking.run)
# Where the run folders' volume is mounted in every pipeline step and training pod on Kubernetes.
RUNS_MOUNT = "/runs"
PROFILE = "profile"  # placement.timing: the TensorFlow profiler trace (TensorBoard logdir)
# A checkpoint in OUT/checkpoints is the files ckpt-<step>.index and ckpt-<step>.data-*; its
# prefix (and its MLflow artifact folder) is ckpt-<step>.
CHECKPOINT_BASENAME = "ckpt"
_CHECKPOINT_RE = re.compile(rf"{CHECKPOINT_BASENAME}-(\d+)(?:\.index)?")


def ensure_dir(path: str | Path, field: str = "--out") -> Path:
    """Create `path` (and parents) and check it is writable; one-line error otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{field}: got '{p}', which cannot be created ({err.strerror}); choose a writable folder") from None
    if not os.access(p, os.W_OK):
        raise ConfigError(f"{field}: got '{p}', which is not writable; choose a writable folder")
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
    return atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """atomic_write_text for bytes (e.g. a gzipped file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask),
        # so other users in the pod (and the MLflow UI) can read run outputs.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | Path, field: str = "run_dir") -> Any:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{field}: got '{p}', which does not exist; run the previous step first (see `make help`)")
    return json.loads(p.read_text())


# ---- checkpoints (the one place that knows their file names; never imports TensorFlow) ------
def checkpoint_name(step: int) -> str:
    """The name of the checkpoint of `step`: its prefix's last component, `ckpt-<step>`."""
    return f"{CHECKPOINT_BASENAME}-{int(step)}"


def checkpoint_step(name: str | Path) -> int | None:
    """The step of a checkpoint from its name: a prefix or MLflow artifact folder (`.../ckpt-40`)
    or its index file (`.../ckpt-40.index`); only the last path component counts. None for any
    other name (a data shard, the `checkpoint` state file, `ckpt-x.index`)."""
    m = _CHECKPOINT_RE.fullmatch(Path(name).name)
    return int(m.group(1)) if m else None


def checkpoint_indexes(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, index file) of every checkpoint in `directory` (e.g. OUT/checkpoints), newest first;
    read from the file names, not from TF's `checkpoint` state file (which may be stale)."""
    found = []
    for p in Path(directory).glob(f"{CHECKPOINT_BASENAME}-*.index"):
        step = checkpoint_step(p.name)
        if step is not None:
            found.append((step, p))
    return sorted(found, reverse=True)


def latest_checkpoint_step(run_dir: str | Path) -> int | None:
    """The step of the newest checkpoint of a run folder (OUT/checkpoints/ckpt-<step>.index), or None."""
    found = checkpoint_indexes(Path(run_dir) / CHECKPOINTS)
    return found[0][0] if found else None


def last_logged_step(run_dir: str | Path) -> int | None:
    """The highest step in OUT/train_log.jsonl (ignores a torn last line), or None."""
    best = None
    path = Path(run_dir) / TRAIN_LOG
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int) and (best is None or step > best):
            best = step
    return best
