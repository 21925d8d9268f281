"""The kernel events of an XSpace trace: which node ran, when, for how long.

What the trace holds with logical CPU devices: one `/host:CPU` plane whose lines are threads (the
inter-op pool, the collective executor, Python). Logical devices share those threads, so a line is
not a device. Every kernel the executor runs is an event named "<node name>:<op type>", and node
names are unique within the captured partition graphs, which say each node's device: that is how an
event is attributed to a device. Receives (`_Recv`/`_HostRecv`) are asynchronous: only their start
is an event (the wait for the producer is not work and is not counted). A collective
(CollectiveReduceV2...) is one event from its start to its completion, which includes waiting for
its peers, as a GPU's NCCL kernel time does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.placement.graphs.ops import COLLECTIVE_RE, RECVS, TRANSPORT

ASYNC_START = "ExecutorState::ProcessAsync::Start"


_EXECUTOR = ("ExecutorState::", "ExecutorDoneCallback")


@dataclass(frozen=True)
class OpEvent:
    """One kernel execution from the trace: the node name the executor ran, its op type, and
    its interval in picoseconds (the trace's unit)."""

    name: str
    type: str
    start_ps: int
    dur_ps: int
    # The op's own time when other work ran nested inside its event (see _exclusive); None: all of it.
    spans: tuple[tuple[int, int], ...] | None = None

    def own(self) -> tuple[tuple[int, int], ...]:
        return self.spans if self.spans is not None else ((self.start_ps, self.start_ps + self.dur_ps),)


def is_transfer(op_type: str) -> bool:
    return op_type in TRANSPORT or bool(COLLECTIVE_RE.match(op_type))


STEP_MARKER = "train"


def step_markers(xspace) -> list[int]:
    """The step numbers of the step markers in a trace (host plane), in order."""
    steps = []
    for plane in xspace.planes:
        if plane.name != "/host:CPU":
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                if names.get(e.metadata_id) != STEP_MARKER:
                    continue
                for st in e.stats:
                    if stat_names.get(st.metadata_id) == "step_num":
                        steps.append(int(st.int64_value or st.uint64_value))
    return sorted(steps)


def read_xspace(path: Path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xs = xplane_pb2.XSpace()
    xs.ParseFromString(Path(path).read_bytes())
    return xs


def op_events(xspace) -> tuple[list[OpEvent], list[str]]:
    """Kernel executions on the host plane's threads, and notes on what the trace held."""
    events: list[OpEvent] = []
    notes: list[str] = []
    for plane in xspace.planes:
        if plane.name.startswith("/device:GPU"):
            note = ("the trace has GPU device planes: the times here are the runtime's op events on the "
                    "host threads (for a GPU op, its launch); GPU kernel time is in the trace (TensorBoard)")
            if note not in notes:
                notes.append(note)
        if plane.name != "/host:CPU":
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            ops: list[OpEvent] = []
            foreign: list[tuple[int, int]] = []  # executor work: other nodes' kernels and callbacks
            for e in line.events:
                meta = plane.event_metadata.get(e.metadata_id)
                if meta is None:
                    continue
                start = base + e.offset_ps
                kind = meta.display_name
                if kind and meta.name.endswith(":" + kind):  # "<node>:<type>": a kernel's Compute
                    ops.append(OpEvent(meta.name[: -len(kind) - 1], kind, start, e.duration_ps))
                    foreign.append((start, start + e.duration_ps))
                elif meta.name.startswith(_EXECUTOR):
                    foreign.append((start, start + e.duration_ps))
                    if meta.name == ASYNC_START:  # an asynchronous kernel: only receives lack a kernel event
                        stats = {stat_names.get(s.metadata_id): stat_value(s, stat_names) for s in e.stats}
                        if stats.get("kernel_type") in RECVS and stats.get("name"):
                            ops.append(OpEvent(stats["name"], stats["kernel_type"], start, e.duration_ps))
            events.extend(_exclusive(ops, foreign))
    return events, notes


ASYNC_DONE = "ExecutorState::ProcessAsync::Done"


def receive_arrivals(xspace) -> dict[str, list[int]]:
    """receive node -> the times (ps) its tensor arrived (its `ProcessAsync::Done`): for a receive
    from another task, when the RPC layer handed over the bytes, later than the send."""
    out: dict[str, list[int]] = defaultdict(list)
    for e, meta, stat_names, line_ps in host_events(xspace):
        if meta.name != ASYNC_DONE:
            continue
        stats = {stat_names.get(s.metadata_id): stat_value(s, stat_names) for s in e.stats}
        if stats.get("kernel_type") in RECVS and stats.get("name"):
            out[stats["name"]].append(line_ps + e.offset_ps)
    return {k: sorted(v) for k, v in out.items()}


# The iterator kernels' own events, with the bytes of the element each handed out.
_GET_NEXT_EVENTS = {"IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"}


def host_events(xspace):
    """(event, its metadata, the plane's stat names, its line's start in ps) of every event on the
    host plane."""
    for plane in xspace.planes:
        if plane.name != "/host:CPU":
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                meta = plane.event_metadata.get(e.metadata_id)
                if meta is not None:
                    yield e, meta, stat_names, line.timestamp_ns * 1000


def iterator_element_bytes(xspace) -> list[int]:
    """The bytes of every element the tf.data iterators handed out in the trace (one event per
    IteratorGetNext: the runtime's own count of what the step took from its input pipeline)."""
    out = []
    for e, meta, stat_names, _ in host_events(xspace):
        if meta.name not in _GET_NEXT_EVENTS:
            continue
        for s in e.stats:
            if stat_names.get(s.metadata_id) == "element_size":
                out.append(int(stat_value(s, stat_names)))
    return out


def kernel_nodes(xspace) -> set[str]:
    """The nodes whose kernels ran in the trace (a transfer's kernel runs for a tensor that was
    never produced too, so transfers are left out)."""
    out = set()
    for e, meta, stat_names, _ in host_events(xspace):
        kind = meta.display_name
        if kind and meta.name.endswith(":" + kind):
            if kind not in TRANSPORT:
                out.add(meta.name[: -len(kind) - 1])
        elif meta.name == ASYNC_START:
            stats = {stat_names.get(s.metadata_id): stat_value(s, stat_names) for s in e.stats}
            if stats.get("name") and stats.get("kernel_type") not in TRANSPORT:
                out.add(stats["name"])
    return out


def _exclusive(ops: list[OpEvent], foreign: list[tuple[int, int]]) -> list[OpEvent]:
    """Each op's own time on its thread: its interval minus the executor work nested in it. A
    local _Send hands its tensor to a waiting receive, whose callback goes on to run the
    receiving device's next kernels inline, inside the _Send's event; that time is theirs."""
    import bisect

    foreign = sorted(foreign)
    starts = [s for s, _ in foreign]
    out = []
    for op in ops:
        s, e = op.start_ps, op.start_ps + op.dur_ps
        i = bisect.bisect_right(starts, s)
        inner = []
        while i < len(foreign) and foreign[i][0] < e:
            fs, fe = foreign[i]
            if fe <= e and (fs, fe) != (s, e):
                inner.append((fs, fe))
            i += 1
        # also events starting exactly at s but shorter (nested at the very start)
        j = bisect.bisect_left(starts, s)
        while j < len(foreign) and foreign[j][0] == s:
            if foreign[j][1] < e:
                inner.append(foreign[j])
            j += 1
        if not inner:
            out.append(op)
            continue
        spans, cur = [], s
        for fs, fe in sorted(inner):
            if fs > cur:
                spans.append((cur, fs))
            cur = max(cur, fe)
        if cur < e:
            spans.append((cur, e))
        out.append(OpEvent(op.name, op.type, s, op.dur_ps, tuple(spans)))
    return out


def stat_value(s, names: dict) -> Any:
    kind = s.WhichOneof("value")
    value = getattr(s, kind) if kind else None
    return names.get(value) if kind == "ref_value" else value
