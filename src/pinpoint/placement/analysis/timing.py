"""Time per device: how long each device was busy over the sampled steps, and with what.

With `placement.timing: true` the trainer runs the sampled steps as one call of its training
function (never its first, captured call, so no tracing is in it) under TensorFlow's own profiler
(placement.capture.profiler); placement.profile.xspace reads the kernel events back.

Busy = the union of a device's op intervals (not their sum: ops of one device overlap on the
inter-op threads). transfer = the union of its _Send/_Recv and collective intervals;
compute = busy - transfer; idle share = 1 - busy / wall, wall being the traced window from the
first op's start to the last op's end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from pinpoint.device_names import DeviceMap, sort_key
from pinpoint.placement.graphs.captured import node_devices
from pinpoint.placement.profile.xspace import OpEvent, is_transfer, op_events, read_xspace

TOP_OPS = 5


def union_ps(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _ms(ps: float) -> float:
    return round(ps / 1e9, 3)


def device_timing(
    events: list[OpEvent],
    devices: dict[str, str],
    *,
    display: Callable[[str], str] | None = None,
    steps: list[int] | None = None,
    top: int = TOP_OPS,
) -> dict:
    """The `timing` section from kernel events and the node -> device map (see module doc)."""
    display = display or (lambda s: s)
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    transfer: dict[str, list[tuple[int, int]]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    per_op: dict[str, dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    unattributed = [0, 0]
    t0, t1 = None, None
    for ev in events:
        dev = devices.get(ev.name)
        if dev is None:
            unattributed[0] += 1
            unattributed[1] += ev.dur_ps
            continue
        own = ev.own()
        t0 = ev.start_ps if t0 is None else min(t0, ev.start_ps)
        t1 = ev.start_ps + ev.dur_ps if t1 is None else max(t1, ev.start_ps + ev.dur_ps)
        spans[dev].extend(own)
        if is_transfer(ev.type):
            transfer[dev].extend(own)
        counts[dev] += 1
        cell = per_op[dev][(display(ev.name), ev.type)]
        cell[0] += sum(e - s for s, e in own)
        cell[1] += 1
    wall = (t1 - t0) if t0 is not None else 0
    out_devices = {}
    for dev in sorted(spans, key=sort_key):
        busy = union_ps(spans[dev])
        moved = union_ps(transfer[dev])
        ranked = sorted(per_op[dev].items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
        out_devices[dev] = {
            "busy_ms": _ms(busy),
            "compute_ms": _ms(busy - moved),
            "transfer_ms": _ms(moved),
            "transfer_share": round(moved / busy, 4) if busy else 0.0,
            "idle_share": round(max(0.0, 1 - busy / wall), 4) if wall else None,
            "ops": counts[dev],
            "top_ops": [{"op": op, "type": kind, "ms": _ms(ps), "count": n} for (op, kind), (ps, n) in ranked],
        }
    n_steps = len(steps) if steps else 0
    return {
        "steps": list(steps or []),
        "wall_ms": _ms(wall),
        "step_ms": _ms(wall / n_steps) if n_steps else None,
        "devices": out_devices,
        "unattributed": {"events": unattributed[0], "ms": _ms(unattributed[1])},
    }


def op_times(events: list[OpEvent], *, display: Callable[[str], str] | None = None,
               steps: int = 1) -> dict[str, float]:
    """Each op's own time per step in µs (node name as one step's op has it): the own time of its
    fastest execution times its executions per timed step. The fastest, not the mean or the
    median: the logical devices of an emulated run share the host's cores and one intra-op thread
    pool, so one op's executions differ 20x (0.5 to 10 ms for a depthwise filter gradient, in one
    run) by what the other devices run at that moment; the rest of an execution is waiting for
    threads, which the op's work, and what a placement moves, is not."""
    display = display or (lambda s: s)
    runs: dict[str, list[int]] = defaultdict(list)
    for ev in events:
        runs[display(ev.name)].append(sum(e - s for s, e in ev.own()))
    n = max(steps, 1)
    return {name: round(min(ps) * len(ps) / n / 1e6, 3) for name, ps in runs.items()}


def timing_from_trace(
    xplane: Path,
    partition_graphs: Iterable,
    namer: DeviceMap,
    *,
    display: Callable[[str], str] | None = None,
    steps: list[int] | None = None,
) -> dict:
    """Read the trace and build the `timing` section (without `trace`, set by the caller), with
    `op_us` (op_times: each op's µs per step) for the per-op rows; placement.json leaves it out."""
    events, notes = op_events(read_xspace(xplane))
    timing = device_timing(events, node_devices(partition_graphs, namer), display=display, steps=steps)
    timing["op_us"] = op_times(events, display=display, steps=len(steps or ()))
    if not timing["devices"]:
        notes.append("no op of the captured training function was found in the trace")
    timing["notes"] = notes
    return timing


def not_measured(reason: str) -> dict:
    """The `timing` section when nothing was timed."""
    return {"steps": [], "wall_ms": None, "step_ms": None, "devices": {}, "notes": [reason]}
