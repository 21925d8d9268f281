"""placement.json's `memory` section from one profiled call: measured (placement.memory), predicted
(placement.memory_trace reads the call's Replay, placement.memory_predict replays it). The one assembly for a traced program and for Pinpoint's own loop; the
fits verdict (placement.memory_fit) is added where the placement is built, beside its variables."""

from __future__ import annotations

from collections.abc import Mapping

from pinpoint.device_names import DeviceMap

HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def memory_section(partitions: list, xspace, events: list, namer: DeviceMap, *, peak: int | None,
                   read_ps: int | None, gpus: Mapping[str, int] | None, shapes: Mapping[str, list] | None = None,
                   call: str = "sampled steps", among: str | None = None) -> dict:
    """The section for `events` (the allocator's, in `xspace`) over the call whose executed graphs are
    `partitions`; `shapes`: their output shapes when known (else TensorFlow's shape inference); `call`:
    which call it was ('first' makes its constants and copies variables still sharing their initial value).
    `among`: the measured call's worker device when other workers ran the same graphs (an in-process
    parameter_server cluster, placement.memory_calls): theirs are measured on their devices, and the
    prediction is held to the call's own allocations."""
    from pinpoint.placement.graphs.captured import node_devices
    from pinpoint.placement.memory.calls import on_own_devices, one_call, worker_calls
    from pinpoint.placement.memory.from_trace import predict_call, predict_from_trace
    from pinpoint.placement.memory.measured import per_device, summarize

    types = {n.name: n.op for g in partitions for n in g.node}
    devices = node_devices(partitions, namer)
    host = namer.canonical_spec(HOST) or "/CPU:0"
    calls = worker_calls(xspace, devices, namer.canonical_spec(among)) if among else None
    step, why = calls.step_of() if calls else (None, None)
    if why:
        return {"why_not": f"not measured per device: {why}"}
    if calls:
        events = on_own_devices(events, calls, devices, namer.canonical_spec)
    out = summarize(events, devices, types, peak, host=host, read_ps=read_ps, gpus=gpus)
    measured = out["devices"]
    if calls:
        xspace, events = one_call(xspace, events, calls, step)
        measured = {d: m.to_json() for d, m in per_device(events, devices, types, host).items()}
    shared = calls is not None  # (other workers' calls ran at once on the same variables)
    out["predicted"] = (predict_call(partitions, shapes, xspace, events, devices, measured, first_call=call == "first",
                                     shared=shared)
                        if shapes is not None else predict_from_trace(partitions, xspace, events, devices, measured, shared))
    out["call"] = call
    return out
