"""Memory per device at another batch size, and the largest batch that fits a GPU.

The measured call's replay (memory_predict.Replay) knows each output's bytes. What grows in
proportion to the batch:
- an output whose shape starts with the step's batch (the input elements' leading dimension;
  where shape inference left the shape unknown, the shape the allocator recorded for it);
- an output that folds the batch into its leading dimension (`[batch x time, features]`): made by
  a Reshape of an output that grows, or by an op reading such a folded output and keeping its
  leading dimension (a Dense layer on a sequence: Tensordot's MatMul and its gradients);
- a kernel's scratch whose shape, as the allocator recorded it, starts with the batch (an Einsum's,
  a pooling gradient's); a convolution's im2col buffer, sized by the host's cache, does not.
Every other output (weight gradients, optimizer updates, constants) and scratch keeps its size.
The same kernels then run in the same order, or in the other orders the executor may run them in
(memory.overlap.variants), whichever needs most.

Assumptions, written beside the figures: the kernels run in the same order at any batch;
variables and slots do not depend on the batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from pinpoint.device_names import is_host
from pinpoint.placement.graphs.ops import DT_RESOURCE, INPUT_SOURCES

ASSUMPTION = ("every output whose shape starts with the step's batch (inferred, else as the allocator recorded it) "
              "or folds it into its leading dimension, and every scratch whose shape starts with it, grows in "
              "proportion to the batch, the others keep their size; the same kernels run in the same order, or with "
              "each convolution's input and filter gradients at once, or with every kernel started when its inputs "
              "were ready and every weight gradient as late as its readers let it, whichever needs most; variables "
              "and slots do not depend on the batch")

# The op that folds the batch into another dimension ([batch, time, features] -> [batch x time, features]).
FOLDS = frozenset({"Reshape"})


FACTORS = (2, 4)  # the other batches shown: these multiples of the measured one
KEPT_SHOWN = 3  # the largest scratch buffers kept at their size, named in the batch section


MAX_BATCH = 1 << 24


def batch_of(nodes, shapes: Mapping[str, list], sizes: Mapping[str, tuple[int, ...]]) -> int | None:
    """The step's batch: the leading dimension of the input elements (an iterator's, or the rows
    Pinpoint's loop gathers under its input scope), from their shapes, or from their bytes over a
    row's when shape inference left it unknown; else the most common leading dimension of the
    step's tensor arguments (a traced step called with its batch); None when none is known."""
    from pinpoint.placement.graphs.ops import dtype_size

    dims = Counter()
    for n in nodes:
        gather = n.op in ("GatherV2", "ResourceGather") and "input/" in n.name and len(n.inputs) > 1
        if gather:  # the rows it gathers: its indices' length
            name, k = n.inputs[1]
            d = (shapes.get(name) or [])[k][1] if k < len(shapes.get(name) or []) else None
            if d and len(d) == 1 and d[0]:
                dims[d[0]] += 1
                continue
        for k, (dtype, d) in enumerate((shapes.get(n.name) or ()) if gather or n.op in INPUT_SOURCES else ()):
            if d and d[0]:
                dims[d[0]] += 1
            elif d and all(d[1:]) and k < len(sizes.get(n.name, ())):
                row = (dtype_size(dtype) or 0) * math.prod(d[1:])
                if row and sizes[n.name][k] % row == 0:
                    dims[sizes[n.name][k] // row] += 1
    if not dims:  # a traced step fed tensors as arguments: their most common leading dimension
        for n in nodes:
            for dtype, d in (shapes.get(n.name) or ()) if n.op in ("_Arg", "_DeviceArg") else ():
                if dtype != DT_RESOURCE and d and d[0]:
                    dims[d[0]] += 1
    return dims.most_common(1)[0][0] if dims else None


def scaled_outputs(nodes, shapes: Mapping[str, list], sizes: Mapping[str, tuple[int, ...]],
                   batch: int | None, asked: Mapping[str, Mapping[int, str]]) -> dict[str, tuple[int, ...]]:
    """Node -> its outputs that grow with the batch (see the module doc): those whose leading
    dimension is the batch, by their inferred shape, else by the shape the allocator recorded for
    it (`asked`: op -> {output: "[32,128]"}). An output of unknown shape recorded flat beside one
    that grows, its bytes a multiple of the batch, grows too: a buffer the kernel sized from its
    outputs (a oneDNN pooling's workspace, a byte per output element)."""
    if batch is None:
        return {}
    out = {}
    for n in nodes:
        outs = shapes.get(n.name) or ()
        idx, flat = [], []
        for k, size in enumerate(sizes.get(n.name, ())):
            dims = outs[k][1] if k < len(outs) else None
            lead = dims[0] if dims else None
            recorded = (asked.get(n.name) or {}).get(k) if lead is None else None
            if recorded is not None:
                lead = _leading(recorded)
            if size and lead == batch:
                idx.append(k)
            elif size and k and recorded is not None and recorded.count(",") == 0 and (lead or 0) > batch \
                    and size % batch == 0:
                flat.append(k)
        if idx:
            out[n.name] = tuple(sorted(idx + flat))
    return _folded(nodes, shapes, sizes, batch, asked, out)


def _folded(nodes, shapes: Mapping[str, list], sizes: Mapping[str, tuple[int, ...]], batch: int,
            asked: Mapping[str, Mapping[int, str]], scaled: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """`scaled` and the outputs that fold the batch into their leading dimension: a Reshape of a
    scaled output to a leading dimension a multiple of the batch, and from there each op that reads
    such an output and keeps its leading dimension (its consumers in the graph, to a fixed point)."""
    consumers: dict[str, list] = {}
    for n in nodes:
        for name, _ in n.inputs:
            consumers.setdefault(name, []).append(n)
    folded: dict[str, dict[int, int]] = {}  # node -> {output index: its leading dimension, folded}
    work = list(scaled)
    out = {k: set(v) for k, v in scaled.items()}
    while work:
        name = work.pop()
        for c in consumers.get(name, ()):
            reads = [k for src, k in c.inputs if src == name and k in out.get(name, ())]
            if not reads:
                continue
            leads = {folded[name][k] for k in reads if k in folded.get(name, {})}
            outs = shapes.get(c.name) or ()
            for k, size in enumerate(sizes.get(c.name, ())):
                dims = outs[k][1] if k < len(outs) else None
                lead = dims[0] if dims else None
                if lead is None and k in (asked.get(c.name) or {}):
                    lead = _leading(asked[c.name][k])
                if not size or not lead or k in out.get(c.name, ()):
                    continue
                if lead in leads or (c.op in FOLDS and lead > batch and lead % batch == 0):
                    out.setdefault(c.name, set()).add(k)
                    folded.setdefault(c.name, {})[k] = lead
                    work.append(c.name)
    return {k: tuple(sorted(v)) for k, v in out.items() if v}


def scaled_scratch(temp_shapes: Mapping[str, Iterable[str]], batch: int | None) -> frozenset[str]:
    """The kernels whose scratch grows with the batch: one of their temps, as the allocator recorded
    its shape ("[32,4,16,16]"), starts with it (an im2col buffer sized by the host's cache does not)."""
    if batch is None:
        return frozenset()
    return frozenset(op for op, shapes in temp_shapes.items() if any(_leading(s) == batch for s in shapes))


def _leading(shape: str) -> int | None:
    """The leading dimension of an allocator's shape string ("[32,128]" -> 32)."""
    head = shape.strip("[] ").split(",")[0].strip()
    return int(head) if head.isdigit() else None


def at_batch(replay, batch: int):
    """The replay with every scaled output sized for `batch` (a Replay)."""
    sizes = dict(replay.sizes)
    for name, idx in replay.scaled.items():
        row = list(sizes[name])
        for k in idx:
            row[k] = row[k] * batch // replay.batch
        sizes[name] = tuple(row)
    temps = {name: size * batch // replay.batch if name in replay.scaled_temps else size
             for name, size in replay.temps.items()}
    return replace(replay, sizes=sizes, batch=batch, temps=temps)


def highest_peaks(replay, others, batch: int, copies: bool = False) -> dict[str, int]:
    """Each device's peak at `batch`: the highest of the call's own order and `others`' (the same
    call in the other orders the executor may run it in, memory.overlap.variants), the replicas'
    the highest among them (`replicas_alike`)."""
    peaks = [at_batch(r, batch).peaks(copies=copies) for r in (replay, *others)]
    return replicas_alike({d: max(p.get(d, 0) for p in peaks) for d in set().union(*peaks)}, replay.replicas)


def replicas_alike(values: Mapping[str, float], replicas: int) -> dict:
    """`values` (device -> a prediction) with, when more than one replica ran, every device but the
    host at the highest among them: replicas run the same kernels, and which temporaries overlap,
    or how the allocator fragments, is a draw any of them may get on the GPU machine."""
    gpus = [d for d in values if not is_host(d)]
    if replicas <= 1 or not gpus:
        return dict(values)
    top = max(values[d] for d in gpus)
    return {d: top if d in gpus else v for d, v in values.items()}


def batch_section(replay) -> dict:
    """placement.json's memory.predicted.batch: the measured batch, the outputs and scratch scaled,
    the largest scratch kept at its size, and each device's predicted peak at FACTORS x the batch."""
    if replay.batch is None:
        return {"why_not": "the step's batch is not known (no input element with a known leading dimension)"}
    from pinpoint.placement.memory.overlap import variants

    others, moved = variants(replay)
    peaks = {str(f * replay.batch): highest_peaks(replay, others, f * replay.batch) for f in FACTORS}
    kept = sorted(((size, name) for name, size in replay.temps.items() if name not in replay.scaled_temps), reverse=True)
    return {"measured": replay.batch, "scaled_outputs": sum(len(v) for v in replay.scaled.values()),
            "scaled_scratch": len(replay.scaled_temps), **moved, "assumption": ASSUMPTION,
            # The largest scratch kept at its size (a convolution's im2col buffer on a CPU): what a
            # reader checks first when the prediction at another batch matters.
            "kept_scratch": [{"op": name, "bytes": size, "device": replay.devices.get(name, "")}
                             for size, name in kept[:KEPT_SHOWN]],
            "devices": {d: {b: p.get(d, 0) for b, p in peaks.items()} for d in sorted(next(iter(peaks.values())))}}


def largest_batch(need: Callable[[int], int], limit: int) -> int:
    """The largest batch b with need(b) <= limit (need grows with b), 0 when not even 1 fits.

    A need is close to affine in the batch (a replay's sizes are), so the search goes where the
    line through its last two points reaches the limit, a bisection step whenever that did not
    halve the bracket: each need is a replay in every order, and a line finds the answer in four
    or five of them where bisection takes twice as many as the answer has bits."""
    lo, f_lo, hi, f_hi = 1, need(1), None, None
    if f_lo > limit:
        return 0
    probe = 2
    while hi is None:  # find a batch that does not fit
        f = need(probe)
        if f > limit:
            hi, f_hi = probe, f
        elif probe >= MAX_BATCH:
            return MAX_BATCH
        else:
            line = _crossing(lo, f_lo, probe, f, limit)
            first = lo == 1
            lo, f_lo = probe, f
            # One step along the line, then doubling: a need that bends down would otherwise creep.
            probe = min(MAX_BATCH, max(line + 1, lo + 1) if first and line is not None else 2 * lo)
    halved = True
    while hi - lo > 1:
        line = _crossing(lo, f_lo, hi, f_hi, limit) if halved else None
        mid = min(hi - 1, max(lo + 1, line)) if line is not None else (lo + hi) // 2
        width = hi - lo
        f = need(mid)
        lo, f_lo, hi, f_hi = (mid, f, hi, f_hi) if f <= limit else (lo, f_lo, mid, f)
        halved = 2 * (hi - lo) <= width
    return lo


def _crossing(a: int, f_a: int, b: int, f_b: int, limit: int) -> int | None:
    """The last batch at or below the limit on the line through (a, f_a) and (b, f_b); None if flat."""
    if f_b <= f_a:
        return None
    return a + (limit - f_a) * (b - a) // (f_b - f_a)
