"""The allocator's events in an XSpace trace: every allocation and deallocation of a profiled call.

With `TF_CPU_ALLOCATOR_USE_BFC=true` set before TensorFlow starts (ALLOCATOR_ENV), the profiler
records one MemoryAllocation / MemoryDeallocation event per allocation (`tf_op`, `requested_bytes`,
`allocation_bytes`, `addr`, `region_type`, `shape`, and the allocator's own running total
`bytes_allocated`). A deallocation names no op: it is matched to its allocation by address.
`self_check` replays every event against the allocator's own running total (a mismatch is
reported, never smoothed over).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from pinpoint.placement.profile.xspace import ASYNC_DONE, ASYNC_START, RECVS, host_events, stat_value

ALLOCATOR_ENV = "TF_CPU_ALLOCATOR_USE_BFC"


# The trace event around Pinpoint's read of get_memory_info: the replay is held to the events before it.
PEAK_READ = "pinpoint_memory_peak_read"


@dataclass(frozen=True)
class MemEvent:
    """One allocator event, in the order the allocator made them."""

    time_ps: int
    alloc: bool
    addr: int
    requested: int
    allocated: int
    total_after: int  # the allocator's bytes_allocated after this event
    op: str = ""
    region: str = ""
    shape: str = ""
    kernel: str = ""  # the node whose kernel was running on the allocating thread (a collective's chunk)
    allocator: str = ""  # one per GPU on a GPU machine; every logical CPU shares one
    rpc: bool = False  # made on a thread of the RPC layer
    step: int = 0  # the executor's step id (one call's, on every task it ran on); 0: none recorded
    device: str = ""  # set where the op's name alone does not tell (memory_calls: another worker's call)
    thread: int = 0  # the trace's line (thread) it was recorded on


def memory_events(xspace) -> list[MemEvent]:
    """The allocator's events of a profiler trace, in time order."""
    out = []
    dones: list[tuple[int, str]] = []  # (time, _Recv) of a receive's Done with no allocation on its thread
    for plane in xspace.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            kernels = []  # (start, end, node) of the kernels this thread ran
            for e in line.events:
                meta = plane.event_metadata.get(e.metadata_id)
                if meta is not None and meta.display_name and meta.name.endswith(":" + meta.display_name):
                    kernels.append((e.offset_ps, e.offset_ps + e.duration_ps, meta.name[: -len(meta.display_name) - 1]))
            kernels.sort()
            received, lone = _received(line, plane, names)
            rpc = line.name.startswith(RPC_THREAD)
            dones += [(base + t, *done) for t, done in lone] if rpc else []
            for e in line.events:
                meta = plane.event_metadata.get(e.metadata_id)
                if meta is None or meta.name not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                s = {names.get(x.metadata_id): stat_value(x, names) for x in e.stats}
                if s.get("tf_op") == NO_OP:
                    s["tf_op"] = ""
                recv, recv_step = received.get(e.offset_ps, ("", 0))
                out.append(MemEvent(time_ps=base + e.offset_ps, alloc=meta.name == "MemoryAllocation",
                                    addr=int(s.get("addr") or 0), requested=int(s.get("requested_bytes") or 0),
                                    allocated=int(s.get("allocation_bytes") or 0),
                                    total_after=int(s.get("bytes_allocated") or 0), op=str(s.get("tf_op") or ""),
                                    region=str(s.get("region_type") or ""), shape=str(s.get("shape") or ""),
                                    kernel=_enclosing(kernels, e.offset_ps) or recv,
                                    allocator=str(s.get("allocator_name") or ""), rpc=rpc,
                                    step=int(s.get("id") or 0) or recv_step, thread=line.id))
    return _without_done(_across_threads(sorted(out, key=lambda e: e.time_ps), sorted(dones)), _undone(xspace))


# The threads the RPC layer serves another task's requests and responses on.
RPC_THREAD = "tf_GrpcWorkerEnvQueues"


def _across_threads(events: list[MemEvent], dones: list[tuple[int, str, int]]) -> list[MemEvent]:
    """A receive's buffer whose Done ran on another RPC thread than its allocation (neither matched on
    its own thread, `_received`): the latest such allocation before each such Done is that receive's."""
    for t, name, step in dones:
        i = next((k for k in range(len(events) - 1, -1, -1) if events[k].time_ps <= t and events[k].rpc
                  and events[k].alloc and not events[k].op and not events[k].kernel), None)
        if i is not None:
            events[i] = replace(events[i], kernel=name, step=step)
    return events


def _undone(xspace) -> list[tuple[int, str, int]]:
    """(time, _Recv, step) of each remote receive's start whose Done the trace does not hold (2.16
    lost one in one of eight two-worker runs: its bytes arrived, its reader ran, no Done was recorded)."""
    starts: dict[tuple[str, int], list[int]] = defaultdict(list)
    done: dict[tuple[str, int], int] = defaultdict(int)
    for e, meta, names, line_ps in host_events(xspace):
        if meta.name not in (ASYNC_START, ASYNC_DONE):
            continue
        s = {names.get(x.metadata_id): stat_value(x, names) for x in e.stats}
        if str(s.get("kernel_type")) in RECVS:
            key = (str(s.get("name") or ""), int(s.get("step_id") or 0))
            if meta.name == ASYNC_DONE:
                done[key] += 1
            else:
                starts[key].append(line_ps + e.offset_ps)
    return sorted((t, *key) for key, times in starts.items() for t in sorted(times)[done[key]:])


def _without_done(events: list[MemEvent], undone: list[tuple[int, str, int]]) -> list[MemEvent]:
    """An RPC thread's allocation no receive's Done claimed is the earliest receive started before it
    whose Done the trace does not hold."""
    for i, e in enumerate(events):
        if not undone:
            break
        if e.rpc and e.alloc and not e.op and not e.kernel and undone[0][0] <= e.time_ps:
            _, name, step = undone.pop(0)
            events[i] = replace(e, kernel=name, step=step)
    return events


# TensorFlow 2.16's `tf_op` of an allocation no op made (2.21 leaves it empty): an RPC thread's.
NO_OP = "(null)"


def _received(line, plane, names: dict) -> tuple[dict[int, tuple[str, int]], list[tuple[int, tuple[str, int]]]]:
    """(offset -> (the _Recv node, its step) of each allocation a remote receive made on this thread
    (an RPC thread: the tensor's bytes arrived from another task; the allocation has no op, and the
    receive's `ExecutorState::ProcessAsync::Done` follows it in the same threadpool region), and the
    (offset, (_Recv, step)) of each receive's Done that followed no allocation here)."""
    out: dict[int, tuple[str, int]] = {}
    lone: list[tuple[int, tuple[str, int]]] = []
    pending: list[int] = []
    for e in sorted(line.events, key=lambda e: e.offset_ps):
        meta = plane.event_metadata.get(e.metadata_id)
        name = meta.name if meta is not None else ""
        if name == "MemoryAllocation":
            pending.append(e.offset_ps)
        elif name == ASYNC_DONE:
            s = {names.get(x.metadata_id): stat_value(x, names) for x in e.stats}
            if str(s.get("kernel_type")) in RECVS:
                done = (str(s.get("name") or ""), int(s.get("step_id") or 0))
                out.update(dict.fromkeys(pending, done))
                lone += [] if pending else [(e.offset_ps, done)]
            pending = []
        elif name.startswith("ThreadpoolListener::StartRegion") or name.startswith("ThreadpoolListener::StopRegion"):
            pending = []
    return out, lone


def _enclosing(kernels: list[tuple[int, int, str]], t: int) -> str:
    """The innermost kernel running at time t on the thread (the latest to start that has not ended)."""
    import bisect

    i = bisect.bisect_right(kernels, (t, float("inf"), ""))
    for start, end, node in reversed(kernels[max(0, i - 8):i]):
        if start <= t <= end:
            return node
    return ""


def enabled() -> bool:
    """Memory measurement is on: the process was started with the allocator that traces events."""
    import os

    return os.environ.get(ALLOCATOR_ENV, "").lower() == "true"


def peak_read_ps(xspace) -> int | None:
    """When the PEAK_READ event began, in the trace's clock (picoseconds), or None."""
    for plane in xspace.planes:
        for line in plane.lines:
            for e in line.events:
                meta = plane.event_metadata.get(e.metadata_id)
                if meta is not None and meta.name == PEAK_READ:
                    return line.timestamp_ns * 1000 + e.offset_ps
    return None


def memory_traced(events: list[MemEvent], peak: int | None) -> str | None:
    """Why no allocation could be measured, or None."""
    why = None if peak is not None else "the host allocator keeps no statistics"
    if not events:
        why = why or (f"the profiler recorded no allocation event: start the process with {ALLOCATOR_ENV}=true "
                      "(pinpoint trace --memory and placement.memory: true do)")
    return why


def self_check(events: list[MemEvent]) -> tuple[int, int]:
    """(events whose replayed running total differs from their allocator's own, events replayed):
    each allocator's total starts from its first event's and moves by each event's allocated bytes."""
    totals: dict[str, int] = {}
    bad = 0
    for e in events:
        delta = e.allocated if e.alloc else -e.allocated
        total = totals.get(e.allocator, e.total_after - delta) + delta
        if total != e.total_after:
            bad += 1  # counted once: the replay goes on from the allocator's own total
        totals[e.allocator] = e.total_after
    return bad, len(events)
