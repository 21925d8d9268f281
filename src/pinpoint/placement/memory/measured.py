"""Memory per device, measured: what each device held over one profiled call, and at its peak.

Every logical device of a process shares one allocator, so TensorFlow has no per-device figure
on emulated GPUs (`get_memory_info("CPU:k")` is the same process-wide number for every k). An
allocation event's `tf_op` is a node of the executed partition graphs, whose device is known:
replayed in order, the events (placement.profile.allocator) give each device's live bytes over the
call. Allocations without a node, the collective's ring buffers (`CollectiveAdapterImpl::TempChunk`)
and tf.data's (no `tf_op`, host threads), are kept apart.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pinpoint.device_names import parse_name
from pinpoint.placement.graphs.ops import COLLECTIVE_CHUNK, COLLECTIVE_RE, INPUT_ALLOCATORS, UPDATE_RE
from pinpoint.placement.profile.allocator import MemEvent, self_check
from pinpoint.placement.profile.xspace import RECVS

UNATTRIBUTED = "(outside the step's graphs)"


TOP_LIVE = 10


TIMELINE_POINTS = 200


_GRADIENT = re.compile(r"(^|/)(gradient_tape|gradients)(/|$)")


_OPTIMIZER = re.compile(r"(^|/)(adam|adamw|sgd|rmsprop|adagrad|adadelta|adamax|nadam|ftrl|lion|lamb|"
                        r"loss_scale_optimizer|optimizer)(_\d+)?/", re.I)


_RECV_SUFFIX = re.compile(r"/_\d+$")


_PACK = re.compile(r"/(concat|split)(_\d+)?$")


@dataclass
class Live:
    """An allocation live on a device: its op, bytes, shape, region and kind."""

    op: str
    requested: int
    allocated: int
    shape: str
    region: str
    kind: str

    def to_json(self) -> dict:
        return {"op": self.op, "requested": self.requested, "allocated": self.allocated, "shape": self.shape,
                "region": self.region, "kind": self.kind}


@dataclass
class DeviceMemory:
    """One device over the call: its peak (requested, allocated) and when, the timeline, the
    allocations live at the peak (largest first)."""

    peak_requested: int = 0
    peak_allocated: int = 0
    peak_time_us: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (µs from the first event, requested)
    at_peak: list[Live] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"peak_requested": self.peak_requested, "peak_allocated": self.peak_allocated,
                "peak_time_us": round(self.peak_time_us, 1), "timeline": [[round(t, 1), b] for t, b in self.timeline],
                "at_peak": [x.to_json() for x in self.at_peak]}


def kind_of(op: str, op_type: str, region: str) -> str:
    """What an allocation holds, from its op (type and name) and the allocator's region."""
    if op == COLLECTIVE_CHUNK or COLLECTIVE_RE.match(op_type):
        return "collective buffer"
    if op_type in INPUT_ALLOCATORS:
        return "input"
    if region == "persist" or op_type in ("VarHandleOp", "ReadVariableOp"):
        return "variable"
    if UPDATE_RE.match(op_type):
        return "optimizer update"  # a copy of a variable (or slot) that another op still reads
    if _GRADIENT.search(op) or (_OPTIMIZER.search(op) and _PACK.search(op)):
        return "gradient"  # an optimizer's concat/split: the gradients packed for one all-reduce
    if _OPTIMIZER.search(op):
        return "optimizer"
    if region == "temp":
        return "temporary"
    return "activation"


def _holder(op: str, types: Mapping[str, str]) -> tuple[str, str]:
    """(op, type) whose tensor an allocation of `op` holds: a receive's is its sender's (the
    partitioner names a receive `<sender>/_<n>`), e.g. a variable's value received from a ps."""
    if types.get(op) in RECVS and (sender := _RECV_SUFFIX.sub("", op)) in types:
        return sender, types[sender]
    return op, types.get(op, "")


def per_device(events: list[MemEvent], devices: Mapping[str, str], types: Mapping[str, str],
               host: str = "/CPU:0", check: dict | None = None) -> dict[str, DeviceMemory]:
    """Each device's live bytes over the events: an allocation goes to its op's device (a node of the
    executed graphs); the collective's chunks to the device whose collective ran when they were
    allocated; allocations with no op to the host (tf.data's threads); an op outside the graphs to
    UNATTRIBUTED. A deallocation is matched to its allocation by address. With `check`, its
    "unpartitioned" counts the events after which the devices' allocated bytes (plus what was live
    before the first event) do not add up to the allocator's own total."""
    live: dict[str, dict[int, tuple[Live, str]]] = defaultdict(dict)
    by_addr: dict[int, tuple[str, Live]] = {}
    now_req: dict[str, int] = defaultdict(int)
    now_alloc: dict[str, int] = defaultdict(int)
    out: dict[str, DeviceMemory] = defaultdict(DeviceMemory)
    t0 = events[0].time_ps if events else 0
    # Bytes live before the first event (allocated before the call), less those freed during it.
    before = (events[0].total_after - (events[0].allocated if events[0].alloc else -events[0].allocated)
              if events else 0)
    off = 0
    for e in events:
        if e.alloc:
            dev = _device_of(e, devices, host)
            kind = ("input" if not e.op and dev == host else "outside the step" if dev == UNATTRIBUTED
                    else kind_of(*_holder(e.op or e.kernel, types), e.region))
            item = Live(op=e.op or (f"(in {e.kernel})" if e.kernel else "(tf.data, no op)"), requested=e.requested,
                        allocated=e.allocated, shape=e.shape, region=e.region, kind=kind)
            by_addr[e.addr] = (dev, item)
            live[dev][e.addr] = (item, dev)
            now_req[dev] += e.requested
            now_alloc[dev] += e.allocated
        else:
            found = by_addr.pop(e.addr, None)
            if found is None:
                before -= e.allocated  # allocated before the call began: not part of the call's own memory
                off += before + sum(now_alloc.values()) != e.total_after
                continue
            dev, item = found
            live[dev].pop(e.addr, None)
            now_req[dev] -= item.requested
            now_alloc[dev] -= item.allocated
        off += before + sum(now_alloc.values()) != e.total_after
        d = out[dev]
        d.timeline.append(((e.time_ps - t0) / 1e6, now_req[dev]))
        d.peak_allocated = max(d.peak_allocated, now_alloc[dev])
        if now_req[dev] > d.peak_requested:
            d.peak_requested = now_req[dev]
            d.peak_time_us = (e.time_ps - t0) / 1e6
            d.at_peak = sorted((x for x, _ in live[dev].values()), key=lambda x: -x.requested)[:TOP_LIVE]
    for d in out.values():
        d.timeline = thin(d.timeline, TIMELINE_POINTS)
    if check is not None:
        check["unpartitioned"] = off
    return dict(out)


def _device_of(e: MemEvent, devices: Mapping[str, str], host: str) -> str:
    """An allocation's device: its op's, else the device of the kernel that made it (a collective's
    chunk); one with neither is tf.data's (its threads run no kernel of the step): the host."""
    if e.device:
        return e.device
    if e.op in devices:
        return devices[e.op]
    if e.kernel in devices:
        return devices[e.kernel]
    if not e.op:
        return host
    return UNATTRIBUTED


def thin(points: list[tuple[float, int]], n: int) -> list[tuple[float, int]]:
    """At most about n points, every local maximum of the kept windows kept (a peak never thinned away)."""
    if len(points) <= n:
        return points
    step = len(points) / n
    out = []
    for i in range(n):
        window = points[int(i * step): int((i + 1) * step)] or points[-1:]
        out.append(max(window, key=lambda p: p[1]))
    return out


def summarize(events: Iterable[MemEvent], devices: Mapping[str, str], types: Mapping[str, str],
              process_peak: int | None = None, host: str = "/CPU:0", read_ps: int | None = None,
              gpus: Mapping[str, int] | None = None) -> dict:
    """placement.json's `memory`: per device (peak, timeline, live at the peak), the self-check
    and the allocator's own process-wide peak over the call (get_memory_info, read at `read_ps`:
    the replayed peak is taken over the events before it)."""
    events = list(events)
    bad, n = self_check(events)
    check: dict = {}
    devs = per_device(events, devices, types, host, check)
    if len({e.allocator for e in events}) > 1:
        check["unpartitioned"] = None  # one total per allocator (a GPU machine's): the devices are theirs
    # The allocator's peak starts at what was in use when it was reset, just before the first event.
    first = events[0] if events else None
    start = first.total_after - (first.allocated if first.alloc else -first.allocated) if first else 0
    replayed_peak = max([start, *(e.total_after for e in events if read_ps is None or e.time_ps < read_ps)])
    out_devices = {d: m.to_json() for d, m in sorted(devs.items())}
    return {
        "devices": out_devices,
        "findings": findings(out_devices),
        # mismatched: events the replay puts at another total than the allocator's; unpartitioned:
        # events after which the devices' bytes do not add up to that total.
        "self_check": {"events": n, "mismatched": bad, "unpartitioned": check["unpartitioned"],
                       "replayed_peak": replayed_peak, "allocator_peak": process_peak},
    } | ({"gpu_allocator_peaks": dict(gpus)} if gpus else {})


def _held(device: dict, kinds: tuple[str, ...]) -> int:
    return sum(a["requested"] for a in device["at_peak"] if a["kind"] in kinds)


def findings(devices: Mapping[str, dict]) -> list[dict]:
    """What the peaks show, each with its evidence and what to change: the gradients packed into one
    buffer for the all-reduce; the backward pass and optimizer math on one device while the layers
    are elsewhere; one device holding most of the activations."""
    devs = {d: m for d, m in devices.items() if d.startswith("/") and m["peak_requested"]}
    out = []
    for d, m in devs.items():
        packed = [a for a in m["at_peak"] if a["kind"] == "gradient" and _PACK.search(a["op"])]
        if packed:
            a = max(packed, key=lambda a: a["requested"])
            out.append({"device": d, "what": "every gradient packed into one buffer for the all-reduce is live at the "
                        "peak, beside the gradients themselves: the gradients are held twice",
                        "evidence": f"{a['op']} {a['requested']:,} B ({100 * a['requested'] / m['peak_requested']:.0f}% "
                        "of the peak)",
                        "fix": "nothing while the device has room: it is one all-reduce per step, the size of the "
                        "trainable weights, whatever the batch; near the limit, split the model or shard it",
                        # a change to make only when the fits verdict (a GPU size) says the device is short
                        "near_limit_only": True})
            break  # one replica says it for all
    if out:
        return out  # data parallel: every replica holds the same, so no device is out of line
    if any(parse_name(d)[0] == "ps" for d in devs):
        # Parameter servers: the update runs beside its variables on the ps and each worker runs the
        # whole model, by the strategy's design: neither is a split gone wrong.
        return out
    backward = {d: _held(m, ("gradient", "optimizer", "optimizer update")) for d, m in devs.items()}
    forward = {d: _held(m, ("activation",)) for d, m in devs.items()}
    if len(devs) > 1 and sum(forward.values()):
        heavy = max(backward, key=backward.get)
        others = max((v for d, v in forward.items() if d != heavy), default=0)
        if backward[heavy] > 0.5 * devs[heavy]["peak_requested"] and others > 2 * forward[heavy]:
            out.append({"device": heavy, "what": "the backward pass and the optimizer's math ran here, not beside "
                        "the layers they belong to (a GradientTape's gradients go to the default device)",
                        "evidence": f"{backward[heavy]:,} B of gradients and optimizer tensors live at its peak, "
                        f"{forward[heavy]:,} B of activations",
                        "fix": "compute each layer's gradients under the layer's tf.device, or pin the backward pass "
                        "on a device with room (train.pinning.gradients)"})
        top = max(forward, key=forward.get)
        rest = [v for d, v in forward.items() if d != top]
        if rest and forward[top] > 2 * max(rest) and forward[top] > 0.5 * devs[top]["peak_requested"]:
            out.append({"device": top, "what": "one device holds most of the activations",
                        "evidence": f"{forward[top]:,} B of activations at its peak, at most {max(rest):,} B elsewhere",
                        "fix": "move layers off it (tf.device or train.pinning.layers), or a smaller batch"})
    return out
