"""The placement model's smaller sections as frozen dataclasses, each with its JSON: the backward
pass's ops (`gradients`), the attribution of update ops (`variable_updates`), the copies' drift
(`replica_consistency`), the precision policy and the input pipeline. `placement.model.Placement`
holds them (see schema.EXPLAIN for each)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pinpoint.placement.model.sections import present


@dataclass(frozen=True)
class Gradients:
    """The backward pass's ops per device per step (the ops under `scope`) and their total (each
    None when placement.json does not say: its JSON leaves it out)."""

    scope: str | None = None
    ops_by_device: Mapping[str, float] | None = None
    total: float | None = None

    def to_json(self) -> dict:
        ops = dict(self.ops_by_device) if self.ops_by_device is not None else None
        return present((("scope", self.scope), ("ops_by_device", ops), ("total", self.total)))

    @classmethod
    def from_json(cls, d: Mapping | None) -> Gradients:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in (d or {})})


@dataclass(frozen=True)
class VariableUpdates:
    """How update ops were attributed to variables: the method, update ops (attributed to none),
    variables with updates of the program's variables (TensorFlow's own apart) and the sentence
    (each None when placement.json does not say: its JSON leaves it out)."""

    method: str | None = None
    update_ops: int | None = None
    unattributed_ops: int | None = None
    variables_with_updates: int | None = None
    variables: int | None = None
    internal_variables: int | None = None
    freed_variables: int | None = None  # variables the program created and freed before the end
    coverage: str | None = None

    def to_json(self) -> dict:
        return present((f.name, getattr(self, f.name)) for f in fields(self))

    @classmethod
    def from_json(cls, d: Mapping | None) -> VariableUpdates:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in (d or {})})


@dataclass(frozen=True)
class ReplicaConsistency:
    """The copies of each mirrored variable compared (see schema.EXPLAIN["replica_consistency"]):
    the largest difference, split into trainable variables (must be 0), per-replica state and
    ON_READ accumulators; per variable its drift and class; the state that differs by design,
    grouped by explanation; a merged cluster's method; the error when the copies were unreadable."""

    checked: int = 0
    max_abs_diff: float | None = None
    trainable_drift: float | None = None  # None: a placement.json from before the split
    state_drift: float | None = None
    on_read_drift: float | None = None
    variables: Mapping[str, float] = field(default_factory=dict)
    classes: Mapping[str, str] | None = None
    aggregations: Mapping[str, str] | None = None
    state: tuple[Mapping[str, Any], ...] | None = None
    method: str | None = None
    error: str | None = None

    @property
    def split(self) -> bool:
        return self.trainable_drift is not None

    def to_json(self) -> dict:
        out = {"checked": self.checked, "max_abs_diff": self.max_abs_diff}
        out |= present((k, getattr(self, k)) for k in ("trainable_drift", "state_drift", "on_read_drift"))
        out["variables"] = dict(self.variables)
        state = [dict(g) for g in self.state] if self.state is not None else None
        return out | present((("classes", self.classes), ("aggregations", self.aggregations), ("state", state),
                              ("method", self.method), ("error", self.error)))

    @classmethod
    def from_json(cls, d: Mapping | None) -> ReplicaConsistency | None:
        if not d:
            return None
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["variables"] = d.get("variables") or {}
        if d.get("state") is not None:
            kw["state"] = tuple(d["state"])
        return cls(**kw)


@dataclass(frozen=True)
class Precision:
    """The Keras precision policy and the Cast ops per device per step."""

    policy: str | None = "float32"
    casts_by_device: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"policy": self.policy, "casts_by_device": dict(self.casts_by_device)}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Precision | None:
        if not d:
            return None
        return cls(policy=d.get("policy", "float32"), casts_by_device=d.get("casts_by_device") or {})


@dataclass(frozen=True)
class InputPipeline:
    """Pinpoint's input pipeline: its kind, source, the device it runs on, how it is sharded
    across workers ({by, worker, workers, files}) and its dataset ops by type."""

    kind: str | None = None
    source: str | None = None
    device: str | None = None
    sharding: Mapping[str, Any] | None = None
    ops: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        sharding = dict(self.sharding) if self.sharding is not None else None
        return {"kind": self.kind, "source": self.source, "device": self.device, "sharding": sharding,
                "ops": dict(self.ops)}

    @classmethod
    def from_json(cls, d: Mapping | None) -> InputPipeline | None:
        if not d:
            return None
        return cls(kind=d.get("kind"), source=d.get("source"), device=d.get("device"), sharding=d.get("sharding"),
                   ops=d.get("ops") or {})


@dataclass(frozen=True)
class OpRow:
    """One op of a captured step (placement_ops.json.gz's `ops`): its name, type and device; with
    the step's graph (placement.opgraph; None in a placement.json from before it): its inputs
    (tensor, bytes), the step's arguments it reads (name, bytes, device), the device it requested,
    the ops it is colocated with, its layer, the device types with a kernel for it; its own time in
    µs when the run was timed."""

    op: str
    type: str
    device: str
    inputs: tuple[tuple[str, int | None], ...] | None = None
    args: tuple[tuple[str, int | None, str], ...] | None = None
    requested: str | None = None
    colocation: tuple[str, ...] = ()
    layer: str | None = None
    kernel_devices: tuple[str, ...] | None = None
    us: float | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"op": self.op, "type": self.type, "device": self.device}
        if self.inputs is not None:
            out["inputs"] = [list(i) for i in self.inputs]
            if self.args is not None:
                out["args"] = [list(a) for a in self.args]
            out |= {"requested": self.requested, "colocation": list(self.colocation), "layer": self.layer,
                    "kernel_devices": list(self.kernel_devices) if self.kernel_devices is not None else None}
        return out | present((("us", self.us),))

    @classmethod
    def from_json(cls, d: Mapping) -> OpRow:
        inputs, args, kernels = d.get("inputs"), d.get("args"), d.get("kernel_devices")
        return cls(op=d["op"], type=d["type"], device=d["device"],
                   inputs=tuple(tuple(i) for i in inputs) if inputs is not None else None,
                   args=tuple(tuple(a) for a in args) if args is not None else None, requested=d.get("requested"),
                   colocation=tuple(d.get("colocation") or ()), layer=d.get("layer"),
                   kernel_devices=tuple(kernels) if kernels is not None else None, us=d.get("us"))
