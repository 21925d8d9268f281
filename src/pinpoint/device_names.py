"""Device names: parsing, canonical forms, comparison and the spec <-> physical mapping.

The one place that knows TensorFlow's device-string syntax (no TensorFlow import).

- Parsing. `parse_device` is the strict check of a configured device ('/GPU:0', '/device:CPU:1',
  '/job:ps/task:0/CPU:0'; ValueError otherwise); `parse_name` reads any runtime string
  ('/job:localhost/replica:0/task:0/device:CPU:1'), missing parts None.
- Canonical form (`normalize`). '/CPU:1' within the local job ('/device:CPU:1' and
  '/job:localhost/replica:0/task:0/device:CPU:1' are the same), '/job:worker/task:1/GPU:0' for a
  named job (the replica is dropped). `matches` compares a planned device with an observed one on
  the parts the plan gives; `sort_key` orders names.
- The emulation mapping (`DeviceMap`). A spec is written for the target cluster ('/GPU:0',
  '/GPU:1'). On a CPU-only machine with ``cluster.emulate: true`` each '/GPU:i' becomes logical
  CPU device '/CPU:{i+1}' (`emulation_aliases`); '/CPU:0' stays the host. `DeviceMap.physical` /
  `DeviceMap.spec` translate keeping the caller's format (for tf.device() and the run's
  metrics); `canonical_physical` / `canonical_spec` translate to canonical names (placement
  reports).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

HOST = "/CPU:0"

# A configured TensorFlow device string: optional job/replica/task prefix, then TYPE:index.
DEVICE_RE = re.compile(
    r"^(/job:[a-z][a-z0-9_]*(/replica:\d+)?(/task:\d+)?)?(/device:|/)(CPU|GPU|TPU):(\d+)$"
)
# Any runtime device string, every part optional (index may be '*').
_NAME_RE = re.compile(
    r"^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"(?:/device:|/)?(?:(?P<type>[A-Za-z_]+):(?P<index>\d+|\*))?$"
)
# prefix (job/replica/task), separator ("/device:" or "/"), type, index
_SPLIT_RE = re.compile(r"^(.*?)(/device:|/)(CPU|GPU|TPU):(\d+)$")


def parse_device(value: str) -> tuple[str | None, int | None, str, int]:
    """Split a device string into (job, task, type, index); raise ValueError if malformed."""
    m = DEVICE_RE.match(value)
    if not m:
        raise ValueError(
            f"'{value}' is not a TensorFlow device string; write it like '/GPU:0', '/CPU:0' "
            "or '/job:ps/task:0/CPU:0'"
        )
    job = task = None
    if m.group(1):
        jm = re.match(r"/job:([a-z0-9_]+)", m.group(1))
        job = jm.group(1) if jm else None
        tm = re.search(r"/task:(\d+)", m.group(1))
        task = int(tm.group(1)) if tm else None
    return job, task, m.group(5), int(m.group(6))


def is_host(device: str) -> bool:
    """A CPU device (the host's memory), in any spelling: '/CPU:0', '/job:worker/task:1/CPU:0'."""
    return parse_name(device)[2] == "CPU"


def is_pipeline_host(device: str) -> bool:
    """A task's first CPU, where its tf.data pipelines run ('/CPU:0', '/job:worker/task:1/CPU:0'):
    an input element on any other device (a GPU, or a logical CPU the program made) was copied there."""
    _, _, dtype, index = parse_name(device)
    return dtype == "CPU" and not index


@lru_cache(maxsize=4096)  # a capture repeats a handful of device strings thousands of times
def parse_name(device: str) -> tuple[str | None, int | None, str | None, int | None]:
    """(job, task, TYPE, index) of any runtime string; missing parts are None; job 'localhost'
    counts as None (and so does its task)."""
    m = _NAME_RE.match(device or "")
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
    """Canonical name: "/CPU:1" (local job) or "/job:worker/task:1/GPU:0"; "" if unset."""
    if not device:
        return ""
    job, task, dtype, index = parse_name(device)
    prefix = ""
    if job is not None:
        prefix = f"/job:{job}" + (f"/task:{task}" if task is not None else "")
    if dtype is None:
        return prefix
    return f"{prefix}/{dtype}:{index if index is not None else '*'}"


def split_prefix(device: str) -> tuple[str, str]:
    """("/job:worker/task:1", "/GPU:0") from a canonical name."""
    i = device.rfind("/")
    return device[:i], device[i:]


def local_name(device: str) -> str:
    """The device within its task: '/job:worker/replica:0/task:1/device:CPU:1' -> '/CPU:1'."""
    return split_prefix(normalize(device))[1]


def matches(planned: str, observed: str) -> bool:
    """True if every part the plan specifies (job, task, type, index) equals the observed one."""
    pj, pt, ptype, pi = parse_name(planned)
    oj, ot, otype, oi = parse_name(observed)
    for want, got in ((pj, oj), (pt, ot), (ptype, otype), (pi, oi)):
        if want is not None and want != got:
            return False
    return True


def sort_key(device: str):
    """Order of device names: by job, task, type, index."""
    job, task, dtype, index = parse_name(device)
    return (job or "", task if task is not None else -1, dtype or "", index if index is not None else -1)


def emulation_aliases(gpu_indices, first: int = 1) -> dict[str, str]:
    """Spec '/GPU:i' -> the logical CPU that emulates it, '/CPU:{first+i}' ('/CPU:0' is the host;
    `pinpoint trace --gpus` keeps the CPUs before `first` for the program's own)."""
    return {f"/GPU:{i}": f"/CPU:{first + i}" for i in gpu_indices}


@dataclass(frozen=True)
class DeviceMap:
    """How spec device names map onto the devices this process really has."""

    aliases: dict[str, str]  # spec "/GPU:i" -> physical "/CPU:i+1" (emulation only)
    replica_devices: tuple[str, ...]  # physical devices the strategy trains on
    spec_replica_devices: tuple[str, ...]  # the same, in spec names
    host: str = HOST
    emulated: bool = False
    fallbacks: dict[str, str] = field(default_factory=dict)  # spec device -> where it ran instead
    visible: dict[str, str] = field(default_factory=dict)  # visible_devices renumbering
    local_devices: tuple[str, ...] = ()  # every logical device of this process
    # Emulation: a GPU the emulated machine lacks, as a graph requested it ("/GPU:2") -> the logical
    # CPU that names it and does not exist ("/CPU:3"; TensorFlow's placer soft-places the op):
    # shown as the program wrote it.
    missing: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, device_map: Any = None) -> DeviceMap:
        """`device_map` itself, or a DeviceMap from any object with the same attributes (only
        `aliases` is needed; None: no aliases)."""
        if isinstance(device_map, DeviceMap):
            return device_map
        aliases = dict(getattr(device_map, "aliases", None) or {})
        return cls(
            aliases={str(k): str(v) for k, v in aliases.items()},
            replica_devices=tuple(getattr(device_map, "replica_devices", None) or ()),
            spec_replica_devices=tuple(getattr(device_map, "spec_replica_devices", None) or ()),
            host=getattr(device_map, "host", None) or HOST,
            emulated=bool(getattr(device_map, "emulated", False)),
            fallbacks=dict(getattr(device_map, "fallbacks", None) or {}),
            missing=dict(getattr(device_map, "missing", None) or {}),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeviceMap:
        """A DeviceMap from its to_json() (placement.json's device_map; `missing` is not written)."""
        return cls(aliases=dict(d.get("device_aliases") or {}), replica_devices=tuple(d.get("replica_devices") or ()),
                   spec_replica_devices=tuple(d.get("spec_replica_devices") or ()), host=d.get("host") or HOST,
                   emulated=bool(d.get("emulated", False)), fallbacks=dict(d.get("fallbacks") or {}),
                   visible=dict(d.get("visible_devices") or {}), local_devices=tuple(d.get("local_devices") or ()))

    def physical(self, spec_device: str) -> str:
        """The device to put in tf.device() for a spec device (job prefixes kept)."""
        m = _SPLIT_RE.match(spec_device)
        if not m:
            return spec_device
        prefix, _sep, dtype, idx = m.groups()
        short = self.aliases.get(f"/{dtype}:{idx}") or self.fallbacks.get(f"/{dtype}:{idx}")
        return prefix + short if short else spec_device

    def spec(self, physical_device: str) -> str:
        """The spec name of a physical device; accepts full names ('/job:.../device:CPU:1') and
        keeps their format."""
        m = _SPLIT_RE.match(physical_device or "")
        if not m:
            return physical_device
        prefix, sep, dtype, idx = m.groups()
        short = self._reverse.get(f"/{dtype}:{idx}")
        if not short:
            return physical_device
        _, _, sdtype, sidx = parse_device(short)
        return f"{prefix}{sep}{sdtype}:{sidx}"

    def canonical_spec(self, physical_device: str) -> str:
        """The canonical spec name of any runtime device string ('' if unset)."""
        norm = normalize(physical_device)
        if not norm:
            return ""
        prefix, local = split_prefix(norm)
        return prefix + self._canonical_to_spec.get(local, local)

    def canonical_physical(self, spec_device: str) -> str:
        """The canonical physical name of a spec device (aliases only, not fallbacks)."""
        prefix, local = split_prefix(normalize(spec_device))
        return prefix + self._canonical_to_physical.get(local, local)

    @cached_property
    def _reverse(self) -> dict[str, str]:
        return {v: k for k, v in {**self.missing, **self.aliases}.items()}

    @cached_property
    def _canonical_to_spec(self) -> dict[str, str]:
        return {normalize(phys): normalize(spec) for spec, phys in {**self.missing, **self.aliases}.items()}

    @cached_property
    def _canonical_to_physical(self) -> dict[str, str]:
        return {v: k for k, v in self._canonical_to_spec.items()}

    def to_json(self) -> dict:
        return {
            "device_aliases": dict(self.aliases),
            "replica_devices": list(self.replica_devices),
            "spec_replica_devices": list(self.spec_replica_devices),
            "host": self.host,
            "emulated": self.emulated,
            "fallbacks": dict(self.fallbacks),
            "visible_devices": dict(self.visible),
            "local_devices": list(self.local_devices),
        }
