"""Transfers and timing of the placement model as frozen dataclasses, each with its JSON:
placement.json's `transfers` (per step, source -> destination, collectives, the largest items, the
loop's control signals) and `timing` (each device's time over the timed steps)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pinpoint.placement.model.sections import present


@dataclass(frozen=True)
class Traffic:
    """Transfers per step between two devices (or the loop's own control signals): count, bytes."""

    count: float = 0
    bytes: float = 0

    def to_json(self) -> dict:
        return {"count": self.count, "bytes": self.bytes}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Traffic:
        return cls(count=(d or {}).get("count", 0), bytes=(d or {}).get("bytes", 0))


@dataclass(frozen=True)
class PerStep:
    """Cross-device _Sends per step, their bytes, and how many were sized."""

    count: float = 0
    bytes: float = 0
    sized: float = 0
    unsized: float = 0

    def to_json(self) -> dict:
        return {"count": self.count, "bytes": self.bytes, "sized": self.sized, "unsized": self.unsized}

    @classmethod
    def from_json(cls, d: Mapping | None) -> PerStep:
        return cls(**{f.name: (d or {}).get(f.name, 0) for f in fields(cls)})


@dataclass(frozen=True)
class TransferItem:
    """One transfer of a captured step: the tensor sent (the op whose output it is), its source and
    destination devices, its bytes (None: unsized, with the reason) and the ops that consume it."""

    tensor: str
    source: str  # "from" in placement.json
    to: str
    bytes: int | None
    consumers: tuple[str, ...] | None = None
    unsized_reason: str | None = None
    task: str | None = None  # a merged cluster's: the task that sent it

    def to_json(self) -> dict:
        out = {"tensor": self.tensor, "from": self.source, "to": self.to, "bytes": self.bytes}
        if self.consumers is not None:
            out["consumers"] = list(self.consumers)
        return out | present((("unsized_reason", self.unsized_reason), ("task", self.task)))

    @classmethod
    def from_json(cls, d: Mapping) -> TransferItem:
        consumers = d.get("consumers")
        return cls(tensor=d["tensor"], source=d["from"], to=d["to"], bytes=d.get("bytes"),
                   consumers=tuple(consumers) if consumers is not None else None,
                   unsized_reason=d.get("unsized_reason"), task=d.get("task"))


@dataclass(frozen=True)
class Collective:
    """Collective ops per step on one device and the bytes they reduce."""

    count: float = 0
    input_bytes: float = 0

    def to_json(self) -> dict:
        return {"count": self.count, "input_bytes": self.input_bytes}


@dataclass(frozen=True)
class InputCopy:
    """An input element a step read on a device other than the host: the source op, the device, its
    bytes (None: unsized, with the reason) and where the copy from the host ran."""

    op: str
    to: str
    bytes: int | None
    via: str = ""
    unsized_reason: str | None = None
    components: tuple[int | None, ...] = ()  # each component's bytes (features, labels, ...)

    def to_json(self) -> dict:
        out = {"op": self.op, "to": self.to, "bytes": self.bytes, "components": list(self.components), "via": self.via}
        return out | present((("unsized_reason", self.unsized_reason),))

    @classmethod
    def from_json(cls, d: Mapping) -> InputCopy:
        return cls(op=d["op"], to=d["to"], bytes=d.get("bytes"), via=d.get("via", ""),
                   unsized_reason=d.get("unsized_reason"), components=tuple(d.get("components") or ()))


@dataclass(frozen=True)
class InputCopies:
    """Per step, the bytes the input pipeline copied from the host to each device outside the step
    (the iterator's prefetch), how many elements are unsized, and one step's items."""

    per_step: Mapping[str, float] = field(default_factory=dict)
    unsized: float = 0
    items: tuple[InputCopy, ...] = ()

    @property
    def bytes(self) -> float:
        return sum(self.per_step.values())

    def to_json(self) -> dict:
        return {"per_step": dict(self.per_step), "unsized": self.unsized, "items": [i.to_json() for i in self.items]}

    @classmethod
    def from_json(cls, d: Mapping | None) -> InputCopies:
        d = d or {}
        return cls(per_step=dict(d.get("per_step") or {}), unsized=d.get("unsized", 0),
                   items=tuple(InputCopy.from_json(i) for i in d.get("items") or ()))


@dataclass(frozen=True)
class RoundTrip:
    """A tensor sent from its device (home) to another (via) and straight back within one step: the
    op on `via` that forced it, the placement rule behind that op's device, the bytes each way, and
    what would avoid it. `input`: the tensor is an input element (a replica's batch)."""

    tensor: str
    home: str
    via: str
    op: str
    op_type: str
    bytes: int | None
    rule: str
    fix: str
    input: bool = False

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping) -> RoundTrip:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class Transfers:
    """placement.json's `transfers`: per step, why some are unsized, source -> destination traffic,
    collectives per device, the largest transfers of one step, the loop's own control signals and
    (one task's file) each captured step's figures."""

    per_step: PerStep = field(default_factory=PerStep)
    unsized_reasons: Mapping[str, float] = field(default_factory=dict)
    matrix: Mapping[str, Mapping[str, Traffic]] = field(default_factory=dict)
    collectives: Mapping[str, Collective] = field(default_factory=dict)
    steps: tuple[Mapping[str, Any], ...] | None = None
    loop_control: Traffic = field(default_factory=Traffic)
    largest: tuple[TransferItem, ...] = ()
    # Where sizing failed: TensorFlow's shape inference raised or contradicted the traced graph.
    sizing_errors: tuple[str, ...] = ()
    # What the iterator copied from the host to each device outside the step (its prefetch).
    input: InputCopies = field(default_factory=InputCopies)
    # Tensors that left their device and came straight back within the step (one captured step's).
    round_trips: tuple[RoundTrip, ...] = ()

    def to_json(self) -> dict:
        out = {"per_step": self.per_step.to_json(), "unsized_reasons": dict(self.unsized_reasons),
               "matrix": {s: {d: c.to_json() for d, c in row.items()} for s, row in self.matrix.items()},
               "collectives": {d: c.to_json() for d, c in self.collectives.items()}}
        if self.steps is not None:
            out["steps"] = [dict(s) for s in self.steps]
        out |= {"loop_control": self.loop_control.to_json(), "largest": [t.to_json() for t in self.largest]}
        out |= {"sizing_errors": list(self.sizing_errors)} if self.sizing_errors else {}
        out |= {"input": self.input.to_json()} if self.input.items else {}
        return out | ({"round_trips": [r.to_json() for r in self.round_trips]} if self.round_trips else {})

    @classmethod
    def from_json(cls, d: Mapping | None) -> Transfers:
        d = d or {}
        return cls(per_step=PerStep.from_json(d.get("per_step")), unsized_reasons=d.get("unsized_reasons") or {},
                   matrix={s: {t: Traffic.from_json(c) for t, c in row.items()} for s, row in (d.get("matrix") or {}).items()},
                   collectives={k: Collective(c.get("count", 0), c.get("input_bytes", 0))
                                for k, c in (d.get("collectives") or {}).items()},
                   steps=tuple(d["steps"]) if d.get("steps") is not None else None,
                   loop_control=Traffic.from_json(d.get("loop_control")),
                   largest=tuple(TransferItem.from_json(t) for t in d.get("largest") or ()),
                   sizing_errors=tuple(d.get("sizing_errors") or ()),
                   input=InputCopies.from_json(d.get("input")),
                   round_trips=tuple(RoundTrip.from_json(r) for r in d.get("round_trips") or ()))


@dataclass(frozen=True)
class TopOp:
    """An op with the most own time on a device over the timed steps."""

    op: str
    type: str
    ms: float
    count: int

    def to_json(self) -> dict:
        return {"op": self.op, "type": self.type, "ms": self.ms, "count": self.count}


@dataclass(frozen=True)
class DeviceTime:
    """One device's time over the timed window (see schema.EXPLAIN["timing"])."""

    busy_ms: float
    compute_ms: float
    transfer_ms: float
    transfer_share: float = 0.0
    idle_share: float | None = None
    ops: int = 0
    top_ops: tuple[TopOp, ...] = ()

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"top_ops": [t.to_json() for t in self.top_ops]}

    @classmethod
    def from_json(cls, d: Mapping) -> DeviceTime:
        return cls(busy_ms=d.get("busy_ms", 0), compute_ms=d.get("compute_ms", 0), transfer_ms=d.get("transfer_ms", 0),
                   transfer_share=d.get("transfer_share", 0.0), idle_share=d.get("idle_share"), ops=d.get("ops", 0),
                   top_ops=tuple(TopOp(t["op"], t["type"], t["ms"], t["count"]) for t in d.get("top_ops") or ()))


@dataclass(frozen=True)
class Timing:
    """placement.json's `timing`: the timed steps, the window, each device's time, what no
    captured graph explains, the profiler trace's folder, notes; merged: each task's window."""

    steps: tuple[int, ...] = ()
    wall_ms: float | None = None
    step_ms: float | None = None
    devices: Mapping[str, DeviceTime] = field(default_factory=dict)
    unattributed: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    trace: str | None = None
    tasks: Mapping[str, Any] | None = None

    def to_json(self) -> dict:
        out = {"steps": list(self.steps), "wall_ms": self.wall_ms, "step_ms": self.step_ms,
               "devices": {d: t.to_json() for d, t in self.devices.items()}}
        if self.unattributed is not None:
            out["unattributed"] = dict(self.unattributed)
        out["notes"] = list(self.notes)
        return out | present((("trace", self.trace), ("tasks", self.tasks)))

    @classmethod
    def from_json(cls, d: Mapping | None) -> Timing | None:
        if not d:
            return None
        return cls(steps=tuple(d.get("steps") or ()), wall_ms=d.get("wall_ms"), step_ms=d.get("step_ms"),
                   devices={k: DeviceTime.from_json(t) for k, t in (d.get("devices") or {}).items()},
                   unattributed=d.get("unattributed"), notes=tuple(d.get("notes") or ()), trace=d.get("trace"),
                   tasks=d.get("tasks"))
