"""The placement model: what placement.json holds, as frozen dataclasses with named fields.

`placement.build.build` makes one from its inputs in one pass; `Placement.to_json()` is
placement.json's content and `Placement.from_json()` reads it back, older schema versions
included (`upgrade`). The report and the summary read these fields by name. The sections whose
shape the merge and MLflow share as JSON (transfers, variables, timing, ...) stay mappings inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.placement.schema import SCHEMA_VERSION


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

    def to_json(self) -> dict:
        return {"layer": self.layer, "layers_matched": self.layers_matched,
                "matched": list(self.matched) if self.matched is not None else None, "device": self.device,
                "forward_ops": dict(self.forward_ops), "backward_ops": dict(self.backward_ops),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}

    @classmethod
    def from_json(cls, d: Mapping) -> LayerRow:
        matched = d.get("matched")
        return cls(layer=d["layer"], device=d["device"], forward_ops=d.get("forward_ops") or {},
                   backward_ops=d.get("backward_ops") or {}, bytes_in=d.get("bytes_in") or 0,
                   bytes_out=d.get("bytes_out") or 0, layers_matched=d.get("layers_matched"),
                   matched=tuple(matched) if matched is not None else None)


def _present(pairs) -> dict:
    """A JSON object of the pairs whose value is set (optional keys are absent, not null)."""
    return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class Violation:
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

    def to_json(self) -> dict:
        return _present((f.name, getattr(self, f.name)) for f in fields(self))

    @classmethod
    def from_json(cls, d: Mapping) -> Violation:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


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
        return out | _present((k, getattr(self, k)) for k in ("layers_matched", "forward", "backward", "task"))

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


def mean_score(scores) -> float | None:
    """A conformance score: the mean of the rules' scores (rules without relevant ops skipped)."""
    scored = [s for s in scores if s is not None]
    return round(sum(scored) / len(scored), 4) if scored else None


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
        return out | _present((("unsized_reason", self.unsized_reason), ("task", self.task)))

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

    def to_json(self) -> dict:
        out = {"per_step": self.per_step.to_json(), "unsized_reasons": dict(self.unsized_reasons),
               "matrix": {s: {d: c.to_json() for d, c in row.items()} for s, row in self.matrix.items()},
               "collectives": {d: c.to_json() for d, c in self.collectives.items()}}
        if self.steps is not None:
            out["steps"] = [dict(s) for s in self.steps]
        return out | {"loop_control": self.loop_control.to_json(), "largest": [t.to_json() for t in self.largest]}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Transfers:
        d = d or {}
        return cls(per_step=PerStep.from_json(d.get("per_step")), unsized_reasons=d.get("unsized_reasons") or {},
                   matrix={s: {t: Traffic.from_json(c) for t, c in row.items()} for s, row in (d.get("matrix") or {}).items()},
                   collectives={k: Collective(c.get("count", 0), c.get("input_bytes", 0))
                                for k, c in (d.get("collectives") or {}).items()},
                   steps=tuple(d["steps"]) if d.get("steps") is not None else None,
                   loop_control=Traffic.from_json(d.get("loop_control")),
                   largest=tuple(TransferItem.from_json(t) for t in d.get("largest") or ()))


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
        return out | _present((("trace", self.trace), ("tasks", self.tasks)))

    @classmethod
    def from_json(cls, d: Mapping | None) -> Timing | None:
        if not d:
            return None
        return cls(steps=tuple(d.get("steps") or ()), wall_ms=d.get("wall_ms"), step_ms=d.get("step_ms"),
                   devices={k: DeviceTime.from_json(t) for k, t in (d.get("devices") or {}).items()},
                   unattributed=d.get("unattributed"), notes=tuple(d.get("notes") or ()), trace=d.get("trace"),
                   tasks=d.get("tasks"))


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

    @property
    def internal(self) -> bool:
        """TensorFlow's own variable (a strategy's collective-ordering token), not the program's."""
        return self.cls == "internal"

    @property
    def updated_elsewhere(self) -> bool:
        """An update ran off the variable's devices."""
        return bool(self.update_devices) and not set(self.update_devices) <= set(self.devices)

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind} | _present((("class", self.cls),)) | {
               "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
               "bytes": self.bytes, "components": [dict(c) for c in self.components], "devices": list(self.devices),
               "update_devices": list(self.update_devices), "update_ops": self.update_ops}
        if self.fingerprint is not None:
            out["fingerprint"] = dict(self.fingerprint)
        if self.eager_update_devices is not None:
            out["eager_update_devices"] = list(self.eager_update_devices)
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> Variable:
        shape, eager = d.get("shape"), d.get("eager_update_devices")
        return cls(name=d["name"], kind=d.get("kind", ""), cls=d.get("class"),
                   shape=tuple(shape) if shape is not None else None, dtype=d.get("dtype"), bytes=d.get("bytes"),
                   components=tuple(d.get("components") or ()), devices=tuple(d.get("devices") or ()),
                   update_devices=tuple(d.get("update_devices") or ()), update_ops=d.get("update_ops", 0),
                   fingerprint=d.get("fingerprint"), eager_update_devices=tuple(eager) if eager is not None else None)


@dataclass(frozen=True)
class Fallback:
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

    def to_json(self) -> dict:
        return _present((f.name, getattr(self, f.name)) for f in fields(self))

    @classmethod
    def from_json(cls, d: Mapping) -> Fallback:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


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

    def to_json(self) -> dict:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Eager | None:
        if d is None:
            return None
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for name in ("predicted_fallbacks", "copies", "not_where_requested"):
            kw[name] = tuple(kw.get(name) or ())
        return cls(**kw)


# Sections written only when present (absent rather than null), in placement.json's order.
OPTIONAL = ("device_map", "input_pipeline", "timing", "precision", "layer_pins", "tasks",
            "functions", "training_function", "eager", "program")


@dataclass(frozen=True)
class Placement:
    """placement.json: see schema.EXPLAIN for each field."""

    task: str = "chief:0"
    strategy: str | None = None
    captured_steps: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    physical_devices: Mapping[str, str] = field(default_factory=dict)
    device_aliases: Mapping[str, str] = field(default_factory=dict)
    ops_by_device: Mapping[str, Any] = field(default_factory=dict)
    op_types_by_device: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    transfers: Transfers = field(default_factory=Transfers)
    fallbacks: tuple[Fallback, ...] = ()
    variables: tuple[Variable, ...] = ()
    variable_updates: Mapping[str, Any] = field(default_factory=dict)
    gradients: Mapping[str, Any] = field(default_factory=dict)
    replica_consistency: Mapping[str, Any] | None = None
    conformance: Conformance = field(default_factory=Conformance)
    layers: tuple[LayerRow, ...] = ()
    ops: tuple[Mapping[str, Any], ...] = ()
    transfer_items: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    explain: Mapping[str, str] = field(default_factory=dict)
    # Written when known: the run's device map, input pipeline, timing, precision, the resolved
    # train.pinning.layers ({layer path: device}), a merged cluster's tasks.
    device_map: Mapping[str, Any] | None = None
    input_pipeline: Mapping[str, Any] | None = None
    timing: Timing | None = None
    precision: Mapping[str, Any] | None = None
    layer_pins: Mapping[str, str] | None = None
    tasks: Mapping[str, Any] | None = None
    # A traced program (pinpoint trace, train.entrypoint): every function, the training one, eager ops.
    functions: tuple[FunctionRow, ...] | None = None
    training_function: str | None = None
    eager: Eager | None = None
    program: str | None = None
    schema: int = SCHEMA_VERSION

    @property
    def traced(self) -> bool:
        return self.functions is not None

    @property
    def user_variables(self) -> list[Variable]:
        """The program's variables (TensorFlow's own left out)."""
        return [v for v in self.variables if not v.internal]

    @property
    def observed_fallbacks(self) -> list[Fallback]:
        return [f for f in self.fallbacks if not f.predicted]

    @property
    def predicted_fallbacks(self) -> list[Fallback]:
        return [f for f in self.fallbacks if f.predicted]

    @property
    def training(self) -> FunctionRow | None:
        """The training function's row of a traced program."""
        return next((f for f in self.functions or () if f.training), None)

    def to_json(self) -> dict[str, Any]:
        """placement.json's content (schema, then each field in declaration order)."""
        out: dict[str, Any] = {"schema": self.schema}
        for f in fields(self):
            if f.name == "schema":
                continue
            value = getattr(self, f.name)
            if f.name in OPTIONAL and value is None:
                continue
            out[f.name] = _json(value)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Placement:
        """A placement from placement.json's content, any schema version (see `upgrade`)."""
        d = upgrade(d)
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["conformance"] = Conformance.from_json(d.get("conformance"))
        kw["transfers"] = Transfers.from_json(d.get("transfers"))
        kw["timing"] = Timing.from_json(d.get("timing"))
        kw["layers"] = tuple(LayerRow.from_json(r) for r in d.get("layers") or ())
        kw["variables"] = tuple(Variable.from_json(v) for v in d.get("variables") or ())
        kw["fallbacks"] = tuple(Fallback.from_json(f) for f in d.get("fallbacks") or ())
        kw["eager"] = Eager.from_json(d.get("eager"))
        for name in ("captured_steps", "devices", "ops", "transfer_items", "notes"):
            kw[name] = tuple(d.get(name) or ())
        if d.get("functions") is not None:
            kw["functions"] = tuple(FunctionRow.from_json(f) for f in d["functions"])
        for name in ("physical_devices", "device_aliases", "ops_by_device", "op_types_by_device",
                     "variable_updates", "gradients", "explain"):
            kw[name] = d.get(name) or {}
        return cls(**kw)


def as_placement(p: Placement | Mapping[str, Any] | None) -> Placement | None:
    """A Placement from a model or placement.json's content (None or {}: nothing captured)."""
    if isinstance(p, Placement) or p is None:
        return p
    return Placement.from_json(p) if p else None


def upgrade(d: Mapping[str, Any]) -> dict[str, Any]:
    """placement.json's content in the current schema. Version 1 (before the typed model) had no
    `layer_pins`: it is read off the `layers` rows (each matched layer name -> its key's device)."""
    out = dict(d)
    version = out.get("schema", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ConfigError(f"placement.json schema: got {version!r}; this pinpoint reads versions 1 to "
                          f"{SCHEMA_VERSION}; read it with the pinpoint version that wrote it, or upgrade pinpoint")
    if version == 1:
        pins = {name: r["device"] for r in out.get("layers") or () for name in r.get("matched") or ()}
        if pins:
            out["layer_pins"] = pins
        out["schema"] = SCHEMA_VERSION
    return out


def _json(value):
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value
