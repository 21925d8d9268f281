"""The placement model: what placement.json holds, as frozen dataclasses with named fields.

`placement.analyze.build` makes one from its inputs in one pass; `Placement.to_json()` is
placement.json's content and `Placement.from_json()` reads it back, older schema versions
included (`upgrade`). The report and the summary read these fields by name. The sections are in
placement.sections, placement.traffic and placement.records; what no reader needs by name (matrices of counts, a
variable's components) stays a mapping inside them; the per-op rows are `records.OpRow`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pinpoint.device_names import DeviceMap
from pinpoint.errors import ConfigError
from pinpoint.placement.model.memory import Memory
from pinpoint.placement.model.records import (
    Gradients,
    InputPipeline,
    OpRow,
    Precision,
    ReplicaConsistency,
    VariableUpdates,
)
from pinpoint.placement.model.schema import SCHEMA_VERSION
from pinpoint.placement.model.sections import Conformance, Eager, Fallback, FunctionRow, LayerRow, Variable, as_json
from pinpoint.placement.model.traffic import Timing, TransferItem, Transfers

# Sections written only when present (absent rather than null), in placement.json's order.
OPTIONAL = ("device_map", "input_pipeline", "timing", "precision", "layer_pins", "tasks",
            "functions", "training_function", "eager", "program", "memory")


@dataclass(frozen=True)
class Placement:
    """placement.json: see schema.EXPLAIN for each field."""

    task: str = "chief:0"
    strategy: str | None = None
    captured_steps: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    physical_devices: Mapping[str, str] = field(default_factory=dict)
    device_aliases: Mapping[str, str] = field(default_factory=dict)
    ops_by_device: Mapping[str, float] = field(default_factory=dict)
    op_types_by_device: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    transfers: Transfers = field(default_factory=Transfers)
    fallbacks: tuple[Fallback, ...] = ()
    variables: tuple[Variable, ...] = ()
    variable_updates: VariableUpdates = field(default_factory=VariableUpdates)
    gradients: Gradients = field(default_factory=Gradients)
    replica_consistency: ReplicaConsistency | None = None
    conformance: Conformance = field(default_factory=Conformance)
    layers: tuple[LayerRow, ...] = ()
    ops: tuple[OpRow, ...] = ()
    transfer_items: tuple[TransferItem, ...] = ()
    notes: tuple[str, ...] = ()
    explain: Mapping[str, str] = field(default_factory=dict)
    # Written when known: the run's device map, input pipeline, timing, precision, the resolved
    # train.pinning.layers ({layer path: device}), a merged cluster's tasks.
    device_map: DeviceMap | None = None
    input_pipeline: InputPipeline | None = None
    timing: Timing | None = None
    precision: Precision | None = None
    layer_pins: Mapping[str, str] | None = None
    # A merged cluster's: each task's own placement (less its per-op detail and explain).
    tasks: Mapping[str, Placement] | None = None
    # A traced program (pinpoint trace, train.entrypoint): every function, the training one, eager ops.
    functions: tuple[FunctionRow, ...] | None = None
    training_function: str | None = None
    eager: Eager | None = None
    program: str | None = None
    # Memory per device over the profiled call (placement.memory_model), when asked.
    memory: Memory | None = None
    schema: int = SCHEMA_VERSION

    @property
    def traced(self) -> bool:
        return self.functions is not None

    @property
    def user_variables(self) -> list[Variable]:
        """The program's variables at its end (TensorFlow's own and those freed before left out)."""
        return [v for v in self.variables if not v.internal and not v.freed]

    @property
    def freed_variables(self) -> list[Variable]:
        """The program's variables freed before it ended (a traced program's, known from their creation)."""
        return [v for v in self.variables if v.freed]

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
            out[f.name] = _tasks_json(value) if f.name == "tasks" else as_json(value)
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
        kw["memory"] = Memory.from_json(d.get("memory"))
        kw["variable_updates"] = VariableUpdates.from_json(d.get("variable_updates"))
        kw["gradients"] = Gradients.from_json(d.get("gradients"))
        kw["replica_consistency"] = ReplicaConsistency.from_json(d.get("replica_consistency"))
        kw["device_map"] = DeviceMap.from_json(d["device_map"]) if d.get("device_map") else None
        kw["input_pipeline"] = InputPipeline.from_json(d.get("input_pipeline"))
        kw["precision"] = Precision.from_json(d.get("precision"))
        for name in ("captured_steps", "devices", "notes"):
            kw[name] = tuple(d.get(name) or ())
        kw["ops"] = tuple(OpRow.from_json(r) for r in d.get("ops") or ())
        kw["transfer_items"] = tuple(TransferItem.from_json(t) for t in d.get("transfer_items") or ())
        if d.get("tasks") is not None:
            kw["tasks"] = {t: Placement.from_json(tp) for t, tp in d["tasks"].items()}
        if d.get("functions") is not None:
            kw["functions"] = tuple(FunctionRow.from_json(f) for f in d["functions"])
        for name in ("physical_devices", "device_aliases", "ops_by_device", "op_types_by_device", "explain"):
            kw[name] = d.get(name) or {}
        return cls(**kw)


TASK_LEFT_OUT = ("ops", "transfer_items", "explain")  # a merged cluster's view of each task has none


def _tasks_json(tasks: Mapping[str, Placement]) -> dict[str, Any]:
    return {t: {k: v for k, v in p.to_json().items() if k not in TASK_LEFT_OUT} for t, p in tasks.items()}


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
