"""The step time on the machine that ran the source run when its GPUs were emulated.

Emulated GPUs are logical CPU devices of one process: they share the host's cores (no device
runs in parallel with another beyond what the inter-op/intra-op threads already did in the
source run) and hand tensors to each other by reference (no bytes move). A placement there
does not change the work (the same ops on the same cores); it changes the tensors that cross
devices, each a _Send/_Recv pair through the rendezvous (host CPU time, whatever its bytes).

The model (`emulated_host`), every constant from the source run:
    step = source's measured median step + us_per_transfer x (tensors crossing devices in the
           placement - tensors crossing in the source run's own placement)
us_per_transfer is the source run's profiled _Send/_Recv time per step (placement.json
timing, summed over its devices) over its transfers per step (the transfers matrix's count).
Tensors crossing are counted as the runtime sends them: each tensor once per other device that
reads it (PlanGraph.tensors).

Measured on a 2-core machine to choose the model: the profiled compute of a
placement's ops does not change with the placement, the sum of the ops' own times is not the
step (ops overlap on the inter-op threads, and per-call overhead outside the ops is 0.7 ms of
a 1.1 ms step on a 13-layer MLP), and an extra device's partition adds ~4 us a call (a chain
of 64 ops cut over 1 and 4 devices); transfers are what a placement changes: ten trainings of
that MLP over five placements (3 to 63 tensors crossing, 2 to 5 devices) fit 12.4 us per tensor
crossing and 1.7 us per device used, and their profiles gave 6.5-16 us per transfer
(docs/plan.md, Limits on emulated devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pinpoint.plan.check import Placement
from pinpoint.plan.graph import PlanGraph

KIND = "emulated_host"


def tensors_crossing(graph: PlanGraph, placement: Placement) -> int:
    """Tensors per step that cross devices: each tensor once per other device that reads it (the
    runtime's _Send/_Recv pairs); from the edges (once per consuming group) for a graph built by
    hand."""
    return sum(n for _, _, _, n in graph.crossings(placement))


@dataclass(frozen=True)
class EmulatedHost:
    """The emulated machine's step model, its constants read from the source run."""

    source_step_us: float  # the source run's measured median step
    us_per_transfer: float  # its profiled _Send/_Recv time per tensor crossing devices
    source_tensors: int  # tensors crossing devices in its own placement (the PlanGraph's count)

    @classmethod
    def of(cls, graph: PlanGraph) -> EmulatedHost | None:
        """The model of `graph`'s source run; None when its GPUs were real, it has no measured
        step or no profiled transfer time (an untimed run), or it ran parameter_server."""
        if not graph.emulated or graph.measured_step_us is None or graph.us_per_transfer is None:
            return None
        if graph.strategy == "parameter_server":  # tasks in other processes: not one host's step
            return None
        ran = {g.key: g.device for g in graph.groups}
        return cls(graph.measured_step_us, graph.us_per_transfer, tensors_crossing(graph, ran))

    def step_us(self, graph: PlanGraph, placement: Placement) -> float:
        extra = tensors_crossing(graph, placement) - self.source_tensors
        return max(self.source_step_us + self.us_per_transfer * extra, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "source_step_ms": round(self.source_step_us / 1e3, 4),
                "us_per_transfer": round(self.us_per_transfer, 3), "source_tensors_crossing": self.source_tensors}
