"""A profiled call's Replay read off its trace: the executed graphs, the kernels' times and the
allocator's events (placement.memory_predict replays it).

The times are the allocator's where the trace's differ: a kernel's outputs are made when it gave the
first (a temp it outlived is one), its scratch when it first held its most, and its inputs are let
go of when the executor freed them; a tensor from another task is made when its bytes arrived and
freed when the RPC layer let go of it (docs/memory.md, "Predicted from the executed graphs").
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace

from pinpoint.placement.graphs.ops import (
    COLLECTIVE_CHUNK,
    DENSE_UPDATE_RE,
    LIST_MAKERS,
    MKL_PREFIX,
    RECVS,
    REDUCING_COLLECTIVE_RE,
    SENDS,
    SPARSE_ACCESS_RE,
    UPDATE_RE,
)
from pinpoint.placement.memory.nodes import Node, bytes_of, other_task
from pinpoint.placement.memory.replay import Replay, compare

# The longest an executor's letting go of a kernel's inputs is taken to lag its end (ps): a longer gap
# is another reader's, not this kernel's (a loaded machine's seen: 179 us).
_LATE_INPUTS = 1_000_000_000


def replay_of(partitions: list, shapes: Mapping[str, list], xspace, events: Iterable, devices: Mapping[str, str],
              first_call: bool = False, shared: bool = False) -> tuple[Replay, dict[str, int]]:
    """(the call's Replay, how many nodes were sized by their shapes and how many by the allocator).
    An output whose shape inference left unknown (a batch dimension that depends on the step) is
    sized by what its op really asked the allocator for (`events`, the call's allocator events).
    `shared`: other calls ran at once on the call's variables (other workers'), so an update whose
    events show a copy made one."""
    from pinpoint.placement.memory.batch import batch_of, scaled_outputs, scaled_scratch
    from pinpoint.placement.profile.xspace import op_events

    received: dict[str, int] = {}  # a remote receive -> the buffer it asked for
    outputs_made: dict[str, list[tuple[int, str]]] = defaultdict(list)  # op -> (bytes, shape) of each output made
    temp_shapes: dict[str, set[str]] = defaultdict(set)  # op -> the shapes of the scratch it asked for
    made: dict[str, list[int]] = defaultdict(list)  # op -> when the allocator gave each of its outputs
    freed: dict[str, list[int]] = defaultdict(list)  # op -> when the allocator took each of them back
    output_at: dict[int, str] = {}  # address -> the op whose output it holds
    for e in events:
        if e.alloc and e.op and e.region == "output":
            outputs_made[e.op].append((e.requested, e.shape))
            made[e.op].append(e.time_ps)
            output_at[e.addr] = e.op
        elif not e.alloc and e.addr in output_at:
            freed[output_at.pop(e.addr)].append(e.time_ps)
        elif e.alloc and e.op and e.region == "temp":
            temp_shapes[e.op].add(e.shape)
        elif e.alloc and not e.op and e.kernel:  # a remote receive's buffer (memory.memory_events)
            received.setdefault(e.kernel, e.requested)
    nodes = tuple(Node.of(n) for g in partitions for n in g.node)
    sizes, asked_shapes, counts = _sizes(nodes, shapes, outputs_made, received)
    op_order, _ = op_events(xspace)
    runs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in op_order:
        runs[e.name].append((e.start_ps, e.start_ps + e.dur_ps))
    spans = _temps(events)
    scratch = _scratch(spans, runs)
    temps = {op: size for op, (size, _) in scratch.items()}
    temp_after = {op: after for op, (_, after) in scratch.items() if after}
    for op, times in _handed_on(spans, runs).items():  # a temp handed on is an output, made then
        made[op] = sorted(made[op] + times)
    begin = min((e.start_ps for e in op_order), default=0)
    arrived = receive_times(xspace, events)
    # (a kernel with scratch keeps its start: its scratch's time is counted from it, `temp_after`, as
    # its outputs' are for a kernel that ran once, `outputs_after`)
    started = [kernel_start(made.get(e.name), e.start_ps, e.start_ps + e.dur_ps) for e in op_order]
    order = tuple((e.name, (e.start_ps if e.name in temps else first) - begin,
                   max(e.start_ps + e.dur_ps, _arrival(arrived.get(e.name), e.start_ps)) - begin)
                  for e, first in zip(op_order, started, strict=True))
    replicas = len({devices[n.name] for n in nodes if REDUCING_COLLECTIVE_RE.match(MKL_PREFIX.sub("", n.op)) and n.name in devices})
    unseen = unseen_collectives(nodes, sizes, events, {e.name for e in op_order}, replicas)
    order += tuple((name, s - begin, e - begin) for name, s, e in unseen)
    once = Counter(e.name for e in op_order)
    outputs_after = {e.name: first - e.start_ps for e, first in zip(op_order, started, strict=True)
                     if e.name in temps and once[e.name] == 1 and first > e.start_ps}
    released = {name: t - begin for name, t in _rpc_released(nodes, devices, events).items()}
    used = {n.name: devices[n.name] for n in nodes if n.name in devices}
    batch = batch_of(nodes, shapes, sizes)
    replay = Replay(nodes, order, sizes, used, replicas, first_call, batch,
                    scaled_outputs(nodes, shapes, sizes, batch, asked_shapes),
                    # (an update's or a gather's copy of its variable is the update rules', not a scratch)
                    {n.name: temps[n.name] for n in nodes if temps.get(n.name) and n.op not in LIST_MAKERS
                     and not (UPDATE_RE.match(op := MKL_PREFIX.sub("", n.op)) or SPARSE_ACCESS_RE.match(op))},
                    released, temp_after,
                    outputs_after=outputs_after, scaled_temps=scaled_scratch(temp_shapes, batch) & set(temps),
                    constants=_constants_made(nodes, events),
                    copied=_copied(nodes, events, once) if shared else frozenset())
    lags = input_lags(replay, {op: sorted(t - begin for t in times) for op, times in freed.items()})
    return replace(replay, inputs_after=lags), counts


def _sizes(nodes, shapes: Mapping[str, list], outputs_made: Mapping[str, list[tuple[int, str]]],
           received: Mapping[str, int]) -> tuple[dict[str, tuple[int, ...]], dict[str, dict[int, str]], dict[str, int]]:
    """(each node's output bytes, {op: {output: the shape the allocator recorded}}, how many nodes
    were sized by their shapes and how many by the allocator): by inferred shapes, an unknown one
    by the op's own allocator records (`_allocator_sized`), a remote receive's by its request."""
    counts = {"shapes": 0, "allocator": 0}
    sizes: dict[str, tuple[int, ...]] = {}
    asked_shapes: dict[str, dict[int, str]] = {}
    for n in nodes:
        out = bytes_of(shapes.get(n.name))
        if n.name in outputs_made:
            asked_shapes[n.name] = {0: outputs_made[n.name][0][1]}
        if out and not all(out) and n.name in outputs_made:
            sized = _allocator_sized(out, outputs_made[n.name])
            asked_shapes[n.name] |= sized
            counts["allocator"] += bool(sized)
            counts["shapes"] += not sized and any(out)
        elif out and not out[0] and n.name in received:
            counts["allocator"] += 1
            out = [received[n.name], *out[1:]]
        else:
            counts["shapes"] += any(out)
        if any(out):
            sizes[n.name] = tuple(out)
    return sizes, asked_shapes, counts


def _allocator_sized(out: list[int], made: list[tuple[int, str]]) -> dict[int, str]:
    """Size, in place, each output of `out` whose shape inference left unknown (0 bytes) by what
    its op asked the allocator for (`made`: (bytes, shape) of each output it made, in order): the
    first record is output 0's; a record of a known output's exact bytes is that output's; the rest
    go to the unknown outputs in order (a oneDNN pooling's workspace, an output of no inferred
    shape). {output: the shape the allocator recorded} of those sized."""
    records = list(made[:len(out)])  # (an op run in a loop makes more: its first run's)
    sized = {}
    for k, size in enumerate(out):
        if size:
            mine = next((i for i, (b, _) in enumerate(records) if b == size), None)
            if mine is not None:
                records.pop(mine)
        elif records:
            out[k], sized[k] = records.pop(0)
    return sized


def unseen_collectives(nodes: Iterable[Node], sizes: Mapping[str, tuple[int, ...]], events: Iterable,
                       ran: set[str], group: int) -> list[tuple[str, int, int]]:
    """(node, start ps, end ps) of each reducing collective whose kernel the trace does not show, as
    its chunk of the ring was held. An asynchronous kernel's event can be missing; placed at once when
    its input was made (as an inline op is), its chunk would be held beside what the input's maker
    still held then, which it never was: it was made when the whole group had joined. Its chunk is a
    `COLLECTIVE_CHUNK` the allocator made on no kernel's thread, of its input's bytes over the group,
    matched in time order; a collective with none stays where its input puts it."""
    missing = [n for n in nodes if REDUCING_COLLECTIVE_RE.match(MKL_PREFIX.sub("", n.op)) and n.name not in ran
               and n.inputs]
    if not missing or group < 1:
        return []
    chunks, held = [], {}  # (made, freed, bytes) of the chunks made outside a kernel
    for e in events:
        if e.alloc and e.op == COLLECTIVE_CHUNK and not e.kernel:
            held[e.addr] = (e.time_ps, e.requested)
        elif not e.alloc and e.addr in held:
            made, size = held.pop(e.addr)
            chunks.append((made, e.time_ps, size))
    chunks.sort()
    out = []
    for n in missing:
        src, k = n.inputs[0]
        size = (sizes.get(src) or ())[k] // group if k < len(sizes.get(src) or ()) else 0
        # (the allocator's request of a chunk differs from the even split by its alignment)
        match = next((c for c in chunks if size and abs(c[2] - size) <= max(_CHUNK_SLACK, size // 100)), None)
        if match is not None:
            chunks.remove(match)
            out.append((n.name, match[0], match[1]))
    return out


# Bytes a chunk's request may differ from its input's even split by (alignment to the group).
_CHUNK_SLACK = 256


def _constants_made(nodes: Iterable[Node], events: Iterable) -> frozenset[str]:
    """The constants the call's allocator events show it made: a constant's kernel makes its tensor
    when it is built, at the first run of the executor's copy of the function (a parameter_server
    worker's first run of its own, though not the function's first call)."""
    constants = {n.name for n in nodes if MKL_PREFIX.sub("", n.op) in ("Const", "HostConst")}
    return frozenset(e.op for e in events if e.alloc and e.op in constants)


def _copied(nodes: Iterable[Node], events: Iterable, once: Mapping[str, int]) -> frozenset[str]:
    """The updates (kernels that ran once) whose allocator events show they wrote a copy of their
    variable: a read still held it. On a parameter server that read can be another worker's call."""
    updates = {n.name for n in nodes if DENSE_UPDATE_RE.match(MKL_PREFIX.sub("", n.op)) and once.get(n.name) == 1}
    return frozenset(e.op for e in events if e.alloc and e.op in updates)


def input_lags(replay: Replay, freed_at: Mapping[str, list[int]]) -> dict[str, int]:
    """Kernel -> how long after its end the executor let go of its inputs (ps), for a kernel that ran
    once: the allocator's first free after that end of a buffer the replay frees there (`freed_at`:
    maker -> its outputs' frees, as `order`'s times), the earliest of them (the executor lets go of a
    kernel's inputs together). A free later than `_LATE_INPUTS` is another reader's."""
    frees: dict[str, set] = defaultdict(set)
    replay.peaks(record=frees)
    ends: dict[str, list[int]] = defaultdict(list)
    for name, _, end in replay.order:
        ends[name].append(end)
    out = {}
    for name, makers in frees.items():
        if len(ends.get(name, ())) == 1:
            end = ends[name][0]
            lag = min((times[i] - end for m in makers if (times := freed_at.get(m))
                       and (i := bisect.bisect_left(times, end)) < len(times)), default=0)
            if 0 < lag <= _LATE_INPUTS:
                out[name] = lag
    return out


def scratch_peaks(events: Iterable, runs: Mapping[str, list[tuple[int, int]]]) -> dict[str, int]:
    """op -> the most scratch (the allocator's `temp` region) its kernels held at once, as measured:
    MaxPoolGrad's oneDNN kernel holds two buffers together in some runs, and then their sum. A temp
    still live when its kernel ended (`runs`: op -> its kernels' (start, end), as the events' times)
    is not scratch: Einsum hands one on as its output, which the replay counts as the output."""
    return {op: size for op, (size, _) in _scratch(_temps(events), runs).items()}


def scratch_delays(events: Iterable, runs: Mapping[str, list[tuple[int, int]]]) -> dict[str, int]:
    """op -> how long after its kernel's start it first held that most scratch (ps; see `scratch_peaks`)."""
    return {op: after for op, (_, after) in _scratch(_temps(events), runs).items() if after}


def _temps(events: Iterable) -> dict[str, list[tuple[int, int, int]]]:
    """op -> each temp (the allocator's `temp` region) its kernels asked for: (allocated, freed, bytes)."""
    allocs: dict[int, tuple[str, int, int]] = {}  # address -> (op, bytes, when)
    spans: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for e in events:
        if e.alloc and e.op and e.region == "temp":
            allocs[e.addr] = (e.op, e.requested, e.time_ps)
        elif not e.alloc and e.addr in allocs:
            op, size, t = allocs.pop(e.addr)
            spans[op].append((t, e.time_ps, size))
    return spans


def _outlived(t: int, freed: int, kernels: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether a temp made at t and freed then outlived the kernel that made it (`kernels` sorted)."""
    i = bisect.bisect_right(starts, t) - 1
    return bool(kernels) and (i < 0 or freed > kernels[i][1])  # (no kernel event: as it was freed)


def handed_on(events: Iterable, runs: Mapping[str, list[tuple[int, int]]]) -> dict[str, list[int]]:
    """op -> when its kernels (`runs`, as in `scratch_peaks`) made each temp they handed on as an output."""
    return _handed_on(_temps(events), runs)


def _handed_on(temps: Mapping[str, list[tuple[int, int, int]]], runs: Mapping[str, list[tuple[int, int]]]
               ) -> dict[str, list[int]]:
    """op -> when its kernels made each temp (`_temps`) they handed on as an output (one that outlived
    its kernel: Einsum's, a reduction's), in order."""
    out: dict[str, list[int]] = {}
    for op, lives in temps.items():
        kernels = sorted(runs.get(op, ()))
        starts = [s for s, _ in kernels]
        made = sorted(t for t, freed, _ in lives if _outlived(t, freed, kernels, starts))
        if made:
            out[op] = made
    return out


def _scratch(temps: Mapping[str, list[tuple[int, int, int]]], runs: Mapping[str, list[tuple[int, int]]]
             ) -> dict[str, tuple[int, int]]:
    """op -> (the most scratch its kernels held at once (`_temps`), ps from its kernel's start until it did)."""
    out: dict[str, tuple[int, int]] = {}
    for op, lives in temps.items():
        kernels = sorted(runs.get(op, ()))
        starts = [s for s, _ in kernels]
        changes = []
        for t, freed, size in lives:
            if not _outlived(t, freed, kernels, starts):
                changes += [(t, size), (freed, -size)]
        now = 0
        for t, size in sorted(changes):  # (a free before an allocation at the same instant)
            now += size
            if now > out.get(op, (0, 0))[0]:
                i = bisect.bisect_right(starts, t) - 1
                out[op] = (now, t - kernels[i][0] if i >= 0 else 0)
    return out


def kernel_start(made: list[int] | None, start: int, end: int) -> int:
    """A kernel's start as the replay makes its outputs: when it got its first output buffer (`made`:
    the allocator's times, in order), if that was inside its run. On a loaded machine a kernel can
    wait long between its start and its allocation, while buffers it outlives are let go: holding them
    together would count a peak that never was."""
    first = _arrival(made, start)
    return first if first <= end else start


def receive_times(xspace, events: Iterable) -> dict[str, list[int]]:
    """A receive from another task -> when each of its buffers was made (ps): the allocator's event, as
    for the RPC layer's letting go (its bytes start to arrive then, before its ProcessAsync::Done),
    else that Done."""
    from pinpoint.placement.profile.xspace import receive_arrivals

    made: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.alloc and not e.op and e.kernel:  # (memory.memory_events: the receive the RPC thread served)
            made[e.kernel].append(e.time_ps)
    return {**receive_arrivals(xspace), **{k: sorted(v) for k, v in made.items()}}


def _rpc_released(nodes: Iterable[Node], devices: Mapping[str, str], events: Iterable) -> dict[str, int]:
    """node -> when its output sent to another task, or a receive's buffer from one, was freed (ps):
    the allocator's event."""
    nodes = list(nodes)
    recv_device = {n.tensor_name: devices.get(n.name, "") for n in nodes if n.op in RECVS}
    away = [n for n in nodes if n.op in SENDS and n.inputs and n.tensor_name in recv_device
            and other_task(devices.get(n.inputs[0][0], ""), recv_device[n.tensor_name])]
    sources = {n.inputs[0][0] for n in away}
    receives = {n.name for n in nodes if n.op in RECVS and n.tensor_name in {s.tensor_name for s in away}}
    made: dict[int, str] = {}
    out: dict[str, int] = {}
    for e in events:
        if e.alloc and e.op in sources and e.region == "output":
            made[e.addr] = e.op
        elif e.alloc and not e.op and e.kernel in receives:
            made[e.addr] = e.kernel
        elif not e.alloc and e.addr in made:
            out.setdefault(made.pop(e.addr), e.time_ps)
    return out


def _arrival(times: list[int] | None, posted: int) -> int:
    """A receive's end: when its tensor arrived after it was posted (else when it was posted)."""
    i = bisect.bisect_left(times or [], posted)
    return times[i] if times and i < len(times) else posted


def predict_call(partitions: list, shapes: Mapping[str, list], xspace, events: Iterable, devices: Mapping[str, str],
                 measured: Mapping[str, dict], first_call: bool = False, shared: bool = False) -> dict:
    """The prediction for the profiled call as it ran (its kernels' order from the trace), per device
    beside the measured peak, and on a GPU machine (every tensor read on another device a copy
    there). `replay`: what `pinpoint plan` replays under another placement. `shared`: replay_of's."""
    from pinpoint.placement.memory.batch import batch_section

    replay, counts = replay_of(partitions, shapes, xspace, events, devices, first_call, shared)
    rows = compare(replay.peaks(), measured)
    gpu = replay.peaks(copies=True)
    for d, row in rows.items():
        row["gpu_machine"] = gpu.get(d, 0)
    return {"devices": rows, "sized": counts, "replicas": replay.replicas, "batch": batch_section(replay),
            "replay": replay.to_json()}


def predict_from_trace(partitions: list, xspace, events: Iterable, devices: Mapping[str, str],
                       measured: Mapping[str, dict], shared: bool = False) -> dict:
    """predict_call for a call whose shapes are not known yet: TensorFlow's shape inference over its
    partition graphs (placement.runshapes), the kernels that ran read off the trace."""
    from pinpoint.placement.graphs.shapes import infer_shapes
    from pinpoint.placement.profile.xspace import iterator_element_bytes, kernel_nodes

    try:
        # (the elements the iterators handed out give the input's batch: a dataset's is unknown to the graph)
        shapes, _ = infer_shapes(partitions, iterator_element_bytes(xspace) or None, kernel_nodes(xspace), loops=True)
    except Exception as err:  # noqa: BLE001 - a sizing error: said, not raised after training
        return {"error": f"shape inference failed ({type(err).__name__}: {str(err).splitlines()[0][:160]})"}
    return predict_call(partitions, shapes, xspace, events, devices, measured, shared=shared)
