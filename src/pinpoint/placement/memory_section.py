"""placement.json's `memory` section from one profiled call: measured (placement.memory), predicted
(placement.memory_trace reads the call's Replay, placement.memory_predict replays it). The one assembly for a traced program and for Pinpoint's own loop; the
fits verdict (placement.memory_fit) is added where the placement is built, beside its variables."""

from __future__ import annotations

from collections.abc import Mapping

from pinpoint.device_names import DeviceMap

HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def memory_section(partitions: list, xspace, events: list, namer: DeviceMap, *, peak: int | None,
                   read_ps: int | None, gpus: Mapping[str, int] | None, shapes: Mapping[str, list] | None = None,
                   call: str = "sampled steps") -> dict:
    """The section for `events` (the allocator's, in `xspace`) over the call whose executed graphs are
    `partitions`; `shapes`: their output shapes when known (else TensorFlow's shape inference); `call`:
    which call it was ('first' makes its constants and copies variables still sharing their initial value)."""
    from pinpoint.placement.memory import summarize
    from pinpoint.placement.memory_trace import predict_call, predict_from_trace
    from pinpoint.placement.timing import node_devices

    types = {n.name: n.op for g in partitions for n in g.node}
    devices = node_devices(partitions, namer)
    out = summarize(events, devices, types, peak, host=namer.canonical_spec(HOST) or "/CPU:0", read_ps=read_ps,
                    gpus=gpus)
    out["predicted"] = (predict_call(partitions, shapes, xspace, events, devices, out["devices"],
                                     first_call=call == "first")
                        if shapes is not None else predict_from_trace(partitions, xspace, events, devices, out["devices"]))
    out["call"] = call
    return out
