"""The planner's input: a run's training step as a graph of groups with measured costs.

A group is what a plan can move as one piece: a layer (keyed as `pinning.layers` takes it), the
input pipeline, or what is left of the step (loss, optimizer bookkeeping). Its cost is the time
the profiler measured for its ops per step; an edge is the bytes one group's ops hand to another's
per step, forward and backward alike (directed: producer group -> consumer group).

What the runtime enforces is part of the input, not the search's business to rediscover:
`allowed` is the device types with a kernel for every op of the group (the kernel registry),
`colocated` the groups TensorFlow keeps together (colocation groups, resource ops with their
variables), `movable` False for a group that must stay where it is (host-only ops).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

INPUT, OTHER = "input", "other"  # the groups that are not layers
# Suffix of a layer's backward pass when it ran apart from the layer (build._split_backward).
BACKWARD = " (backward)"


@dataclass(frozen=True)
class Group:
    """One movable piece of the step."""

    key: str  # a pinning.layers key ("dense_1"), or "input", or "other"
    order: int  # position in a topological order of the step (forward first)
    compute_us: float  # measured own time of its ops per step (0.0 when the run was not timed)
    ops: int  # ops per step
    variable_bytes: int  # bytes of the variables it owns (one copy)
    device: str  # where it ran in the measured run (spec name, e.g. "/GPU:0")
    requested: str | None = None  # the user's own request for it (pinning.layers / tf.device)
    allowed: frozenset[str] | None = None  # device types with kernels for all its ops; None: any
    movable: bool = True


@dataclass(frozen=True)
class Edge:
    """Bytes per step from the ops of group `src` to the ops of group `dst`."""

    src: str
    dst: str
    bytes: int
    # Tensors per step (each once per consuming group), for the emulated step model; not part of
    # an edge's identity (an edge is its groups and bytes, as before the count was kept).
    tensors: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Tensor:
    """One tensor a step hands between groups: the group producing it, its bytes per step, and
    the groups reading it. The runtime sends it once to each other device that reads it, however
    many of the groups there read it: what makes the predicted bytes per device pair exact."""

    src: str
    bytes: int
    dsts: frozenset[str]


@dataclass(frozen=True)
class PsVariable:
    """One variable of a parameter_server run, as the prediction of bytes per server needs it."""

    name: str
    group: str  # the group owning it (a layer key, or "other")
    bytes: int
    index: int  # its turn in TensorFlow's round-robin: on server index mod servers (-1: a slot)
    server: str  # the ps device it was measured on
    per_step: bool  # the step pulls it to the worker and pushes its update back
    follows: str | None = None  # an optimizer slot: the variable it is colocated with


@dataclass(frozen=True)
class PlanGraph:
    """Everything the search and the prediction read; built once from a run folder."""

    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    devices: tuple[str, ...]  # the devices a plan may use (spec names)
    host: str  # the host CPU ("/CPU:0"), where host-only groups stay
    strategy: str
    timed: bool  # compute_us came from the profiler (placement.timing: true)
    measured_step_us: float | None = None  # the run's median step time, for calibration
    colocated: tuple[frozenset[str], ...] = ()  # groups TensorFlow keeps on one device
    memory_cap_bytes: dict[str, int] = field(default_factory=dict)  # stated per device
    ps_variables: tuple[PsVariable, ...] = ()  # parameter_server: every variable, in creation order
    tensors: tuple[Tensor, ...] = ()  # the edges tensor by tensor (empty: a graph built by hand)
    emulated: bool = False  # the run's GPUs were logical CPU devices (placement.json device_aliases)
    us_per_transfer: float | None = None  # its profiled _Send/_Recv time per tensor crossing devices
    all_reduce: Any = None  # mirrored: its plan.allreduce.AllReduceCase (the train.all_reduce a plan moves)

    def crossings(self, placement: Mapping[str, str]) -> Iterator[tuple[str, str, int, int]]:
        """(from device, to device, bytes, tensors) per step of each transfer `placement` (group
        key -> device) makes: each tensor once per other device that reads it (the runtime's one
        _Send/_Recv pair per tensor and receiving device); per edge for a graph built by hand."""
        if self.tensors:
            for t in self.tensors:
                a = placement[t.src]
                for b in {placement[d] for d in t.dsts} - {a}:
                    yield a, b, t.bytes, 1
            return
        for e in self.edges:
            a, b = placement[e.src], placement[e.dst]
            if a != b:
                yield a, b, e.bytes, e.tensors

    def group(self, key: str) -> Group:
        for g in self.groups:
            if g.key == key:
                return g
        raise KeyError(key)
