"""Device names: normalize runtime strings and show them in spec names.

The runtime writes "/job:localhost/replica:0/task:0/device:CPU:1"; reports use "/CPU:1"
for the local job and "/job:worker/task:1/GPU:0" for named jobs. With emulation the physical
logical CPU ("/CPU:1") is shown by its spec name ("/GPU:0") with the physical name alongside.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

# NodeDef attr pinpoint.placement.steps sets on the per-step view (no TensorFlow import here):
# a _Send of the training loop's own predicate/control signal.
LOOP_ATTR = "_pinpoint_loop_control"
# NodeDef attr on ops that GPU emulation placed on the emulated /GPU:0 (no device request of the
# user's: a GPU machine's placer would have put them there), see pinpoint.training.emulation.
EMULATED_ATTR = "_pinpoint_emulated"
# NodeDef attr on ops expanded from an XLA-compiled call (XLA, not the kernel registry, runs them).
XLA_ATTR = "_pinpoint_xla"

_DEV_RE = re.compile(
    r"^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"(?:/device:|/)?(?:(?P<type>[A-Za-z_]+):(?P<index>\d+|\*))?$"
)


@lru_cache(maxsize=4096)  # a capture repeats a handful of device strings thousands of times
def parse(device: str) -> tuple[str | None, int | None, str | None, int | None]:
    """(job, task, TYPE, index); missing parts are None; job 'localhost' counts as None."""
    m = _DEV_RE.match(device or "")
    if not m:
        return None, None, None, None
    job = m.group("job")
    if job == "localhost":
        job = None
    task = int(m.group("task")) if m.group("task") and job is not None else None
    dtype = m.group("type").upper() if m.group("type") else None
    idx = m.group("index")
    index = int(idx) if idx and idx != "*" else None
    return job, task, dtype, index


@lru_cache(maxsize=4096)
def normalize(device: str) -> str:
    """Runtime device string -> "/CPU:1" (local job) or "/job:worker/task:1/GPU:0"; "" if unset."""
    if not device:
        return ""
    job, task, dtype, index = parse(device)
    prefix = ""
    if job is not None:
        prefix = f"/job:{job}" + (f"/task:{task}" if task is not None else "")
    if dtype is None:
        return prefix
    return f"{prefix}/{dtype}:{index if index is not None else '*'}"


def split_prefix(device: str) -> tuple[str, str]:
    """("/job:worker/task:1", "/GPU:0") from a normalized name."""
    i = device.rfind("/")
    return device[:i], device[i:]


class Namer:
    """Maps normalized physical names to spec names using the device map's aliases."""

    def __init__(self, device_map: Any = None):
        aliases: Mapping[str, str] = dict(getattr(device_map, "aliases", None) or {})
        self.aliases = {str(k): str(v) for k, v in aliases.items()}
        self._to_spec = {normalize(phys): normalize(spec) for spec, phys in self.aliases.items()}
        self._to_phys = {v: k for k, v in self._to_spec.items()}

    def spec(self, physical: str) -> str:
        norm = normalize(physical)
        if not norm:
            return ""
        prefix, local = split_prefix(norm)
        return prefix + self._to_spec.get(local, local)

    def physical(self, spec: str) -> str:
        norm = normalize(spec)
        prefix, local = split_prefix(norm)
        return prefix + self._to_phys.get(local, local)


def matches(planned: str, observed: str) -> bool:
    """True if every part the plan specifies (job, task, type, index) equals the observed one."""
    pj, pt, ptype, pi = parse(planned)
    oj, ot, otype, oi = parse(observed)
    for want, got in ((pj, oj), (pt, ot), (ptype, otype), (pi, oi)):
        if want is not None and want != got:
            return False
    return True


def sort_key(device: str):
    job, task, dtype, index = parse(device)
    return (job or "", task if task is not None else -1, dtype or "", index if index is not None else -1)


def metric_key(device: str) -> str:
    """MLflow-safe key part: "/job:worker/task:1/GPU:0" -> "worker_1_GPU_0", "/GPU:0" -> "GPU_0"."""
    job, task, dtype, index = parse(device)
    parts = []
    if job:
        parts.append(job + (f"_{task}" if task is not None else ""))
    parts.append(f"{dtype}_{index}" if dtype else "unknown")
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))
