"""The placement model's sections as frozen dataclasses, each with its JSON: the per-layer rows,
conformance (rules, violations), fallbacks, variables, and a traced program's functions and eager
ops. `placement.model.Placement` holds them; `placement.traffic` has transfers and timing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


def present(pairs) -> dict:
    """A JSON object of the pairs whose value is set (optional keys are absent, not null)."""
    return {k: v for k, v in pairs if v is not None}


def as_json(value):
    """A model value as JSON: a dataclass by its to_json(), a tuple as a list, a mapping as a dict."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [as_json(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


@dataclass(frozen=True)
class LayerRow:
    """One `train.pinning.layers` key: its device, the layers it matched, forward and backward ops
    per device, and the bytes its ops receive from and send to other devices each step."""

    layer: str
    device: str
    forward_ops: Mapping[str, Any]
    backward_ops: Mapping[str, Any]
    bytes_in: int
    bytes_out: int
    layers_matched: int | None = None
    matched: tuple[str, ...] | None = None
    # train.pinning.gradients put the backward ops on its own device: not the layer's to obey.
    backward_pinned: bool = False

    def to_json(self) -> dict:
        return {"layer": self.layer, "layers_matched": self.layers_matched,
                "matched": list(self.matched) if self.matched is not None else None, "device": self.device,
                "forward_ops": dict(self.forward_ops), "backward_ops": dict(self.backward_ops),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out} | (
                    {"backward_pinned": True} if self.backward_pinned else {})

    @classmethod
    def from_json(cls, d: Mapping) -> LayerRow:
        matched = d.get("matched")
        return cls(layer=d["layer"], device=d["device"], forward_ops=d.get("forward_ops") or {},
                   backward_ops=d.get("backward_ops") or {}, bytes_in=d.get("bytes_in") or 0,
                   bytes_out=d.get("bytes_out") or 0, layers_matched=d.get("layers_matched"),
                   matched=tuple(matched) if matched is not None else None,
                   backward_pinned=bool(d.get("backward_pinned")))


class _Flat:
    """A flat record: its JSON is its fields that are set (None left out), read back by name."""

    def to_json(self) -> dict:
        return present((f.name, getattr(self, f.name)) for f in fields(self))

    @classmethod
    def from_json(cls, d: Mapping):
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Violation(_Flat):
    """An op (or variable, or weight) a rule relevant to it found off the planned device. `why`:
    the likely cause when known; `predicted`: a GPU machine's fallback under emulation; a weight
    request's violation also names its layer, variable, request and how it was requested."""

    op: str
    placed: str
    why: str | None = None
    predicted: bool | None = None
    layer: str | None = None
    variable: str | None = None
    requested: str | None = None
    how: str | None = None


@dataclass(frozen=True)
class Rule:
    """One conformance rule: the planned device against the devices its relevant ops ran on.
    `score`: the fraction on the planned device (None: no relevant op); `violations`: the first 50
    of `violations_total`. A layers.<key> rule also scores its `forward` and `backward` ops apart
    ({relevant, score, observed}); a merged cluster's rule names its `task`."""

    rule: str
    planned: str
    observed: Mapping[str, Any]
    relevant: int
    score: float | None
    violations: tuple[Violation, ...] = ()
    violations_total: int = 0
    layers_matched: int | None = None
    forward: Mapping[str, Any] | None = None
    backward: Mapping[str, Any] | None = None
    task: str | None = None

    @property
    def below_plan(self) -> bool:
        return self.score is not None and self.score < 1.0

    def part(self, name: str) -> Mapping[str, Any]:
        """The forward or backward part's {relevant, score, observed} ({} when not split)."""
        return getattr(self, name) or {}

    def to_json(self) -> dict:
        out = {"rule": self.rule, "planned": self.planned, "observed": dict(self.observed),
               "relevant": self.relevant, "score": self.score,
               "violations": [v.to_json() for v in self.violations], "violations_total": self.violations_total}
        return out | present((k, getattr(self, k)) for k in ("layers_matched", "forward", "backward", "task"))

    @classmethod
    def from_json(cls, d: Mapping) -> Rule:
        return cls(rule=d["rule"], planned=d["planned"], observed=d.get("observed") or {},
                   relevant=d.get("relevant", 0), score=d.get("score"),
                   violations=tuple(Violation.from_json(v) for v in d.get("violations") or ()),
                   violations_total=d.get("violations_total", 0), layers_matched=d.get("layers_matched"),
                   forward=d.get("forward"), backward=d.get("backward"), task=d.get("task"))


@dataclass(frozen=True)
class Conformance:
    """Each rule and their mean score."""

    score: float | None = None
    rules: tuple[Rule, ...] = ()
    by_task: Mapping[str, Any] | None = None  # a merged cluster placement: each task's score

    def to_json(self) -> dict:
        out = {"score": self.score, "rules": [r.to_json() for r in self.rules]}
        if self.by_task is not None:
            out["by_task"] = dict(self.by_task)
        return out

    @classmethod
    def from_json(cls, d: Mapping | None) -> Conformance:
        d = d or {}
        return cls(score=d.get("score"), rules=tuple(Rule.from_json(r) for r in d.get("rules") or ()),
                   by_task=d.get("by_task"))


def mean_score(scores) -> float | None:
    """A conformance score: the mean of the rules' scores (rules without relevant ops skipped)."""
    scored = [s for s in scores if s is not None]
    return round(sum(scored) / len(scored), 4) if scored else None


@dataclass(frozen=True)
class Variable:
    """One variable: where each of its components lives and where its update ops ran (see
    schema.EXPLAIN["variables"]). `cls` is placement.json's `class`."""

    name: str
    kind: str = ""
    cls: str | None = None
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None
    bytes: int | None = None
    components: tuple[Mapping[str, Any], ...] = ()
    devices: tuple[str, ...] = ()
    update_devices: tuple[str, ...] = ()
    update_ops: int = 0
    fingerprint: Mapping[str, Any] | None = None
    eager_update_devices: tuple[str, ...] | None = None
    # A traced program's variable as it was created: strategy, requested device, layer or source line.
    created: Mapping[str, Any] | None = None
    # Created by the program and freed before it ended: known from its creation only.
    freed: bool = False
    # When: {"source": the program's line running as it let go ('file:line'), "s": seconds since the trace started}.
    freed_at: Mapping[str, Any] | None = None

    @property
    def internal(self) -> bool:
        """TensorFlow's own variable (a strategy's collective-ordering token), not the program's."""
        return self.cls == "internal"

    @property
    def updated_elsewhere(self) -> bool:
        """An update ran off the variable's devices."""
        return bool(self.update_devices) and not set(self.update_devices) <= set(self.devices)

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind} | present((("class", self.cls),)) | {
               "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
               "bytes": self.bytes, "components": [dict(c) for c in self.components], "devices": list(self.devices),
               "update_devices": list(self.update_devices), "update_ops": self.update_ops}
        if self.fingerprint is not None:
            out["fingerprint"] = dict(self.fingerprint)
        if self.eager_update_devices is not None:
            out["eager_update_devices"] = list(self.eager_update_devices)
        if self.created is not None:
            out["created"] = dict(self.created)
        if self.freed:
            out["freed"] = True
        if self.freed_at is not None:
            out["freed_at"] = dict(self.freed_at)
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> Variable:
        shape, eager = d.get("shape"), d.get("eager_update_devices")
        return cls(name=d["name"], kind=d.get("kind", ""), cls=d.get("class"),
                   shape=tuple(shape) if shape is not None else None, dtype=d.get("dtype"), bytes=d.get("bytes"),
                   components=tuple(d.get("components") or ()), devices=tuple(d.get("devices") or ()),
                   update_devices=tuple(d.get("update_devices") or ()), update_ops=d.get("update_ops", 0),
                   fingerprint=d.get("fingerprint"), eager_update_devices=tuple(eager) if eager is not None else None,
                   created=d.get("created"), freed=bool(d.get("freed", False)), freed_at=d.get("freed_at"))


@dataclass(frozen=True)
class Fallback(_Flat):
    """An op that did not run on the device it requested (observed), or (`predicted`, under GPU
    emulation) one a GPU machine would run on `would_run_on` for want of a GPU kernel."""

    op: str
    op_type: str
    requested: str
    placed: str
    requested_physical: str | None = None
    placed_physical: str | None = None
    predicted: bool | None = None
    would_run_on: str | None = None
    reason: str | None = None
    task: str | None = None  # a merged cluster's: the task it ran on


@dataclass(frozen=True)
class Eager:
    """A traced program's eager ops: per device and op type, the copies between devices the eager
    runtime made, requests it did not meet, predicted fallbacks, the program's default device."""

    ops: int = 0
    predicted_fallbacks: tuple[Mapping[str, Any], ...] = ()
    ops_by_device: Mapping[str, int] = field(default_factory=dict)
    op_types_by_device: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    copies: tuple[Mapping[str, Any], ...] = ()
    copy_bytes: int = 0
    not_where_requested: tuple[Mapping[str, Any], ...] = ()
    default_device: str | None = None
    # None: every eager op counted; N: every op up to the Nth, then the recorder's op callback was
    # switched off after `quiet_ops` quiet callbacks and on again for `sampling_windows` windows.
    counted_until: int | None = None
    quiet_ops: int | None = None
    sampling_windows: int | None = None

    def to_json(self) -> dict:
        return {f.name: as_json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Eager | None:
        if d is None:
            return None
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for name in ("predicted_fallbacks", "copies", "not_where_requested"):
            kw[name] = tuple(kw.get(name) or ())
        return cls(**kw)


@dataclass(frozen=True)
class FunctionRow:
    """One function a traced program ran: its calls and, per call, ops (per device), transfers
    and bytes, collectives, variable and optimizer updates, from the partition graphs of its first
    call; its role (train, evaluate, predict, other), whether it is the training function, the
    error of a first call that raised, and the eager ops the runtime ran during the captured call."""

    name: str
    concrete: str
    kind: str
    calls: int
    captured: bool
    ops_per_call: int
    ops_by_device: Mapping[str, int]
    transfers_per_call: int
    transfer_bytes_per_call: int
    collectives_per_call: int
    variable_updates: int
    optimizer_updates: int
    role: str
    error: str | None = None
    runtime_ops: tuple[Mapping[str, Any], ...] = ()
    training: bool = False

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ops_by_device"] = dict(self.ops_by_device)
        out["runtime_ops"] = [dict(o) for o in self.runtime_ops]
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> FunctionRow:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["runtime_ops"] = tuple(d.get("runtime_ops") or ())
        kw.setdefault("captured", True)
        return cls(**kw)
