"""Everything the placement model is built from, gathered before the build: the captured graphs,
the variables, the plan and its resolved layer pins, the timing and the input pipeline; for a
traced program also its functions, eager ops and weight requests. `placement.build.build` turns
one `PlacementInputs` into a `Placement` in one pass: no section is edited afterwards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pinpoint.layer_keys import LayerPins


@dataclass(frozen=True)
class TraceInputs:
    """What a traced program adds: its functions (rows, the training one flagged and first), the
    eager section, the devices eager ops updated each variable on, the weights' device requests
    (`trace.requests.RequestLog.rows()`) and the trace's own notes."""

    program: str
    functions: tuple[Mapping[str, Any], ...]
    training_function: str | None
    eager: Mapping[str, Any]
    eager_updates: Mapping[int, tuple[str, ...]] | None = None  # id(variable) -> devices
    weight_rows: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    # Each variable as the program created it (trace.created.creation_rows), live or freed since.
    created: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class PlacementInputs:
    """One task's placement inputs. Input-pipeline ops are dataset/iterator op types plus ops
    under the `input_scope` name scope; `optimizer_variables` (a subset of `variables`) are classed
    as optimizer slots by the replica-consistency check."""

    captures: tuple
    variables: tuple
    plan: Any  # config.PinningConfig, or None (a traced program: its own requests are the plan)
    strategy: str
    device_map: Any
    task: str = "chief:0"
    gradient_scope: str = "gradients"
    input_scope: str = "input"
    optimizer_variables: tuple | None = None
    layer_pins: LayerPins | None = None
    # The model's layers a plan moves as one piece, by path (the keys' form): each op row's `layer`.
    layer_units: tuple[str, ...] = ()
    timing: Mapping[str, Any] | None = None
    memory: Mapping[str, Any] | None = None  # the profiled call's memory (placement.memory), when measured
    input_pipeline: Mapping[str, Any] | None = None
    precision_policy: str | None = None
    device_map_json: Mapping[str, Any] | None = None  # the run's device map, as placement.json shows it
    trace: TraceInputs | None = None
