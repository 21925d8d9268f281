"""Memory per device, predicted from the executed graphs: each tensor's bytes from its shape, its
buffer's life from the order the kernels ran, and TensorFlow's own buffer rules.

The parts: `nodes` (what the replay reads), `simulation` (one call replayed, a rule a method),
`schedule` (the kernels' order, loops and lists), and here `Replay`, the call as kept in the run
folder, and `compare`, the prediction beside the measurement. docs/memory.md lists each rule by the
name of the function that implements it, and what the rules leave out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pinpoint.placement.memory.nodes import Measured, Node
from pinpoint.placement.memory.schedule import Schedule


def compare(predicted: Mapping[str, int], measured: Mapping[str, dict]) -> dict[str, dict]:
    """Per device: predicted and measured peak (requested) and the error of the prediction."""
    out = {}
    for d, m in measured.items():
        if not d.startswith("/") or d not in predicted:
            continue
        meas = m["peak_requested"]
        out[d] = {"predicted": predicted[d], "measured": meas,
                  "error": round((predicted[d] - meas) / meas, 4) if meas else None}
    return out


@dataclass(frozen=True)
class Replay:
    """One profiled call as the prediction replays it, kept in the run folder (placement_ops.json.gz,
    `memory_replay`) so `pinpoint plan` can replay it under another placement: the executed nodes,
    the kernels as they ran (node, start ps, end ps), each node's output bytes and device."""

    nodes: tuple[Node, ...]
    order: tuple[tuple[str, int, int], ...]
    sizes: Mapping[str, tuple[int, ...]]
    devices: Mapping[str, str]
    replicas: int = 0
    first_call: bool = False
    batch: int | None = None  # the step's batch (memory_batch.batch_of)
    scaled: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> outputs that grow with it
    # node -> the most scratch its kernel asked for at once (the allocator's `temp` region, as measured):
    # oneDNN's convolution and pooling workspaces; kept at any batch and placement.
    temps: Mapping[str, int] = field(default_factory=dict)
    # node -> when the RPC layer let go of its output sent to another task (as `order`'s times): the
    # allocator's own event, for no kernel does it (its time depends on gRPC, not on the graph).
    released: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's start it held that scratch (ps, as measured): two kernels that
    # run at once each hold their most at another time.
    temp_after: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's end the executor let go of its inputs (ps, as measured): on a
    # loaded machine that can be well after the end.
    inputs_after: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's start it got its first output (ps, as measured), for a kernel
    # with scratch (the others start then): a kernel may make the temp it hands on as its output late
    # in its run (Einsum).
    outputs_after: Mapping[str, int] = field(default_factory=dict)
    # the kernels whose scratch grows with the batch (memory.batch.scaled_scratch)
    scaled_temps: frozenset = frozenset()
    # the constants the call made though it was not the function's first call (the allocator's events:
    # a parameter_server worker's first run of its own copy of the function)
    constants: frozenset = frozenset()
    # the updates that wrote a copy of their variable though no read of this call held it (the
    # allocator's events: another worker's call read the parameter_server's variable meanwhile)
    copied: frozenset = frozenset()

    @cached_property
    def schedule(self) -> Schedule:
        return Schedule.of(self.nodes, self.order)

    def size_of(self, name: str) -> list[int]:
        return list(self.sizes.get(name, ()))

    def peaks(self, device_of: Callable[[str], str] | None = None, copies: bool = False,
              record: dict | None = None) -> dict[str, int]:
        """Each device's peak over the call, every node on device_of(node) (default: where it ran)."""
        measured = Measured(self.temps, self.released, self.temp_after, self.inputs_after, self.outputs_after,
                            self.constants, self.copied)
        return self.schedule.peaks(self.size_of, device_of or (lambda name: self.devices.get(name, "")),
                                   self.replicas or 1, self.first_call, copies, measured, record)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [[n.name, n.op, [list(t) for t in n.inputs], n.tensor_name] for n in self.nodes],
                "order": [list(x) for x in self.order], "sizes": {k: list(v) for k, v in self.sizes.items()},
                "devices": dict(self.devices), "replicas": self.replicas, "first_call": self.first_call,
                "batch": self.batch, "scaled": {k: list(v) for k, v in self.scaled.items()}, "temps": dict(self.temps),
                "released": dict(self.released), "temp_after": dict(self.temp_after),
                "inputs_after": dict(self.inputs_after), "outputs_after": dict(self.outputs_after),
                "constants": sorted(self.constants), "copied": sorted(self.copied),
                "scaled_temps": sorted(self.scaled_temps)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Replay:
        nodes = tuple(Node(name, op, tuple((a, int(b)) for a, b in inputs), key) for name, op, inputs, key in d["nodes"])
        return cls(nodes, tuple((a, int(b), int(c)) for a, b, c in d["order"]),
                   {k: tuple(v) for k, v in d["sizes"].items()}, dict(d["devices"]), int(d.get("replicas") or 0),
                   bool(d.get("first_call")), d.get("batch"), {k: tuple(v) for k, v in (d.get("scaled") or {}).items()},
                   dict(d.get("temps") or {}), dict(d.get("released") or {}), dict(d.get("temp_after") or {}),
                   dict(d.get("inputs_after") or {}), dict(d.get("outputs_after") or {}),
                   frozenset(d.get("scaled_temps") or ()), frozenset(d.get("constants") or ()),
                   frozenset(d.get("copied") or ()))
