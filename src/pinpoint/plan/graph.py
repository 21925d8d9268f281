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
from dataclasses import dataclass, field, replace
from typing import Any

INPUT, OTHER = "input", "other"  # the groups that are not layers
# Suffix of a layer's backward pass when it ran apart from the layer (build._split_backward).
BACKWARD = " (backward)"


def is_backward(key: str) -> bool:
    return key.endswith(BACKWARD)


# The step function's arguments that live on a device other than the host (a traced program's
# captured eager tensors, e.g. a batch made on /GPU:0): a group per device that stays there, the
# source of those tensors wherever their readers go.
HELD = "arguments on "


def held_on(device: str) -> str:
    return HELD + device


def is_held(key: str) -> bool:
    return key.startswith(HELD)


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
    # The tensor's name, so a gradient sum sending the same tensor to the same device counts it once.
    name: str = field(default="", compare=False)


@dataclass(frozen=True)
class GradSum:
    """The gradient of a tensor read by several ops, summed from their contributions as
    `tf.gradients` does (`_MultiDeviceAddN`): the contributions on each device summed there (one
    alone is itself), then, when they are on several devices, one sum colocated with the op that
    made the tensor (in group `home`), each other device's part crossing to it; on one device the
    sum stays there. Where it runs follows the placement, so it is kept as what it sums.

    `contributions`: (tensor, group or None, sum index or None) each: a tensor a group's op made, or
    another sum's result passed through (an Add's gradient is its output's)."""

    home: str
    bytes: int
    contributions: tuple[tuple[str, str | None, int | None], ...]
    readers: frozenset[str]  # groups whose ops read the sum (not as a contribution to another)


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
    sums: tuple[GradSum, ...] = ()  # gradient sums, in the order they are built (a sum after those it reads)
    # Where the program put the whole backward pass (train.pinning.gradients, or a tf.device around
    # tape.gradient): every layer's backward ops are then a group `<layer> (backward)` there, and a
    # plan may move them together to another device. None: the backward pass follows the layers.
    gradient_device: str | None = None
    memory: Any = None  # plan.memory.MemoryModel: the measured call's replay (placement.memory), else None

    def with_gradients(self, device: str) -> PlanGraph:
        """This graph as if the program had put its backward pass on `device` (the groups' costs
        and tensors are the same; only where the backward groups ran changes)."""
        groups = tuple(replace(g, device=device) if is_backward(g.key) else g for g in self.groups)
        return replace(self, groups=groups, gradient_device=device)

    def crossings(self, assign: Mapping[str, str]) -> Iterator[tuple[str, str, int, int]]:
        """(from device, to device, bytes, tensors) per step of each transfer `assign` (group
        key -> device) makes: each tensor once per other device that reads it (the runtime's one
        _Send/_Recv pair per tensor and receiving device); per edge for a graph built by hand."""
        if self.tensors or self.sums:
            sent: set[tuple[str, str]] = set()  # (tensor, receiving device): the runtime sends it once
            for t in self.tensors:
                a = assign[t.src]
                for b in {assign[d] for d in t.dsts} - {a}:
                    if t.name:
                        sent.add((t.name, b))
                    yield a, b, t.bytes, 1
            yield from self._sum_crossings(assign, sent)
            return
        for e in self.edges:
            a, b = assign[e.src], assign[e.dst]
            if a != b:
                yield a, b, e.bytes, e.tensors

    def _sum_crossings(self, assign: Mapping[str, str], sent: set[tuple[str, str]]):
        where: list[str] = []  # each sum's device, in order (a sum reads only earlier ones)
        for i, s in enumerate(self.sums):
            on: dict[str, list[str]] = {}  # device -> the contributions there (tensor ids)
            for tensor, group, j in s.contributions:
                device = assign[group] if group is not None else where[j]
                on.setdefault(device, []).append(tensor if group is not None else f"sum:{j}")
            home = assign[s.home] if len(on) > 1 else next(iter(on))
            where.append(home)
            for device, tensors in on.items():
                if device != home:
                    # One contribution is sent as it is; several are summed on their device first.
                    yield from _once(sent, tensors[0] if len(tensors) == 1 else f"sum:{i}@{device}",
                                     device, home, s.bytes)
            for b in {assign[r] for r in s.readers} - {home}:
                yield from _once(sent, f"sum:{i}", home, b, s.bytes)

    def group(self, key: str) -> Group:
        for g in self.groups:
            if g.key == key:
                return g
        raise KeyError(key)


def _once(sent: set[tuple[str, str]], tensor: str, a: str, b: str, nbytes: int):
    if (tensor, b) not in sent:
        sent.add((tensor, b))
        yield a, b, nbytes, 1
