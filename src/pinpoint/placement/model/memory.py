"""placement.json's `memory` section as a typed value (Placement.memory).

Its parts are made by placement.memory (measured: `devices`, `findings`, `self_check`,
`gpu_allocator_peaks`), placement.memory_predict (`predicted`), placement.memory_fit (`fit`),
Pinpoint's loop (`steps`, `trace`), `pinpoint trace` (`trace`), a merged cluster (`tasks`), and
`why_not` when nothing was measured. What no reader needs by name (a device's timeline, the
prediction's rows) stays a mapping inside them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Memory:
    """Memory per device over the profiled call (docs/memory.md)."""

    devices: Mapping[str, Mapping[str, Any]] | None = None  # per device: peak, timeline, at_peak
    findings: tuple[Mapping[str, Any], ...] | None = None
    self_check: Mapping[str, Any] | None = None  # mismatched, unpartitioned, replayed and allocator peaks
    gpu_allocator_peaks: Mapping[str, int] | None = None
    predicted: Mapping[str, Any] | None = None  # per device, the batch, the replay
    call: str | None = None  # which call: "first", "second", "third", "fourth" or "sampled steps"
    # Several calls measured (pinpoint trace): which, the one these figures are from, and each
    # device's least and most measured peak over them (placement.memory.spread).
    calls: Mapping[str, Any] | None = None
    steps: tuple[int, ...] | None = None
    trace: str | None = None  # the profile folder TensorBoard's memory profile opens on
    fit: Mapping[str, Any] | None = None  # the verdict per device for a GPU size
    tasks: Mapping[str, Any] | None = None  # a merged cluster: each task's own checks
    # Not split per device (no allocator events: a cluster task does not run the profiler): the
    # allocator's own peak over the same steps, every device of the process together.
    task_peak: int | None = None
    why_not: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) \
                    else value
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | Memory | None) -> Memory | None:
        if d is None or isinstance(d, Memory):
            return d
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for name in ("findings", "steps"):
            if kw.get(name) is not None:
                kw[name] = tuple(kw[name])
        return cls(**kw)
