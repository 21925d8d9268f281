"""Time per device: how long each device was busy over the sampled steps, and with what.

With `placement.timing: true` the trainer runs the sampled steps as one call of its training
function (never its first, captured call, so no tracing is in it) under TensorFlow's
own profiler (`tf.profiler.experimental`). The profiler writes an XSpace trace
(`<run>/profile/plugins/profile/<time>/<host>.xplane.pb`, which TensorBoard's profile plugin
opens); this module reads it back.

What the trace holds, checked on TensorFlow 2.21 with logical CPU devices: one `/host:CPU`
plane whose lines are threads (the inter-op pool, the collective executor, Python). Logical
devices share those threads, so a line is not a device. Every kernel the executor runs is an
event named "<node name>:<op type>", and node names are unique within the captured partition
graphs, which say each node's device: that is how an event is attributed to a device.
Receives (`_Recv`/`_HostRecv`) are asynchronous: only their start is an event (the wait for the
producer is not work and is not counted). A collective (CollectiveReduceV2...) is one event
from its start to its completion, which includes waiting for its peers, as a GPU's NCCL kernel
time does. (`context.enable_run_metadata()` step stats would be cheaper to read, but TF 2.x
records none for a tf.function call: checked, `step_stats.dev_stats` stays empty.)

Busy = the union of a device's op intervals (not their sum: ops of one device overlap on the
inter-op threads). transfer = the union of its _Send/_Recv and collective intervals;
compute = busy - transfer; idle share = 1 - busy / wall, wall being the traced window from the
first op's start to the last op's end.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.device_names import DeviceMap, sort_key

TOP_OPS = 5
RECVS = {"_Recv", "_HostRecv"}
TRANSFER_TYPES = RECVS | {"_Send", "_HostSend"}
_COLLECTIVE_RE = re.compile(r"^(Collective\w+|Nccl\w+|_Nccl\w+)$")
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
    return op_type in TRANSFER_TYPES or bool(_COLLECTIVE_RE.match(op_type))


# ----------------------------------------------------------------------------------------------
# taking the trace


# Why the profiler is not run in a task of a multi-process cluster (see profile_call).
CLUSTER_TASK = ("not run in a task of a multi-process TensorFlow cluster: TensorFlow's profiler "
                "crashes such a task when it stops about one time in five (a double free in its merge "
                "of events that began on one thread and ended on another; reproduced with plain "
                "TensorFlow 2.21 and MultiWorkerMirroredStrategy)")


def profile_call(fn: Callable[[], Any], logdir: Path) -> tuple[Any, Path | None, str | None]:
    """Run fn() under tf.profiler.experimental writing to logdir; return (result, the
    .xplane.pb it wrote or None, why not or None).

    Not in a task of a multi-process cluster (a coordination service is configured: multi-worker
    and parameter-server strategies set one up). There the profiler's stop aborts the process
    (SIGABRT "double free", SIGSEGV or SIGBUS; gdb: in SplitEventTracker::FindStartAndMerge under
    TraceMeRecorder::Consume, which pairs events begun on one thread with their end on another) in
    3 of 20 runs of a two-task MultiWorkerMirroredStrategy program with plain TensorFlow 2.21, also
    after a barrier that waits for both tasks to finish the profiled call; with placement.memory in
    Pinpoint's loop on a local chief + worker cluster, 4 of 6 runs (and 3 of 6 with host tracer level
    1, which still records the allocator's events) lost the worker to it. A lost training run is a
    worse price than an unmeasured figure, which the caller reports with this reason."""
    import tensorflow as tf

    from pinpoint.tfcompat.api import in_cluster_task

    if in_cluster_task():
        return fn(), None, CLUSTER_TASK
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.glob("plugins/profile/*/*.xplane.pb"))
    try:
        # Default options: host tracer level 2 (every kernel), device tracer on, Python tracer off.
        # (Passing ProfilerOptions makes TF 2.21 log "... expects an i value" per option.)
        tf.profiler.experimental.start(str(logdir))
    except Exception as err:  # noqa: BLE001 - e.g. a profiler session the user's code started
        return fn(), None, f"the profiler did not start ({_first_line(err)})"
    try:
        result = fn()
    finally:
        try:
            tf.profiler.experimental.stop()
        except Exception:  # noqa: BLE001, S110 - the call's own error (if any) is the one to raise
            pass
    new = sorted(set(logdir.glob("plugins/profile/*/*.xplane.pb")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        return result, None, f"the profiler wrote no .xplane.pb under {logdir}"
    return result, new[-1], None


STEP_MARKER = "train"


def step_marker(step: int):
    """The profiler's step marker around one training step, as Keras writes it (a TraceMe named
    'train' with step_num and _r=1): TensorBoard's profile plugin (xprof) groups the trace into
    steps by it; without it the overview says 'No step marker observed'."""
    import tensorflow as tf

    return tf.profiler.experimental.Trace(STEP_MARKER, step_num=int(step), _r=1)


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


def _first_line(err: BaseException) -> str:
    return ((str(err).strip().splitlines() or [""])[0])[:200] or type(err).__name__


# ----------------------------------------------------------------------------------------------
# reading it


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
            if kind not in TRANSFER_TYPES:
                out.add(meta.name[: -len(kind) - 1])
        elif meta.name == ASYNC_START:
            stats = {stat_names.get(s.metadata_id): stat_value(s, stat_names) for s in e.stats}
            if stats.get("name") and stats.get("kernel_type") not in TRANSFER_TYPES:
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


def node_devices(partition_graphs: Iterable, namer: DeviceMap) -> dict[str, str]:
    """Node name -> spec device from the partition graphs the runtime ran (a name seen on two
    devices, in two functions, is left out: its events cannot be attributed)."""
    out: dict[str, str] = {}
    clash: set[str] = set()
    for g in partition_graphs:
        for n in g.node:
            dev = namer.canonical_spec(n.device)
            if not dev:
                continue
            if out.setdefault(n.name, dev) != dev:
                clash.add(n.name)
    for name in clash:
        out.pop(name, None)
    return out


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
