"""Capture the placement the runtime really used: graph collection around a tf.function call.

The trainer turns collection on for the first call of its multi-step training function, which
instantiates it anyway (see placement.graphs.steps for the per-step view of that loop); calls that
are not captured pay nothing. A profiled call also sizes what the graphs leave unknown: the input
pipeline's elements and the shapes TensorFlow's inference gives.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from pinpoint.placement.graphs.captured import CapturedGraphs, add_function_graphs, function_of, has_dynamic_dims
from pinpoint.tfcompat.graphs import called_graphs, collect_graphs, output_shapes


@contextlib.contextmanager
def collecting(step: int = 0):
    """Graph collection around the block; yields the CapturedGraphs it fills when the block ends.

    The block must make the first call of a tf.function (which instantiates it), otherwise its
    partition graphs were recorded earlier and are not reported again."""
    captured = CapturedGraphs(step=step)
    # Graph collection alone: the function graphs are recorded at instantiation; per-op step
    # stats are not needed and would slow the captured call.
    with collect_graphs() as collected:
        yield captured
    add_function_graphs(captured, collected.metadata, None)


def run_profiled(call: Callable[[], Any], memory_into: CapturedGraphs | None = None, real_gpus: bool = True
                 ) -> tuple[Any, list[int] | None, set[str] | None, str | None]:
    """call() under TensorFlow's profiler: (result, the bytes of each element the input
    pipeline's iterators handed out, the nodes whose kernels ran; or None, None and why not).
    With `memory_into`, its allocator events and peak over the call are kept there (and each GPU's,
    with `real_gpus`: not under emulation, where a listed GPU is a logical CPU)."""
    import tempfile

    from pinpoint.placement.capture.allocator import gpu_peaks, read_peak, reset_memory_peak
    from pinpoint.placement.capture.profiler import profile_call
    from pinpoint.placement.profile.allocator import memory_events, memory_traced, peak_read_ps
    from pinpoint.placement.profile.xspace import iterator_element_bytes, kernel_nodes, read_xspace

    with tempfile.TemporaryDirectory(prefix="pinpoint-shapes-") as tmp:
        if memory_into is not None:
            inner = call

            def call():  # the peak starts over and is read inside the trace: both cover one window
                reset_memory_peak(real_gpus)
                out = inner()
                memory_into.memory_peak = read_peak()
                memory_into.memory_gpu_peaks = gpu_peaks() if real_gpus else {}
                return out
        result, xplane, why = profile_call(call, tmp)
        if xplane is None:
            if memory_into is not None:
                memory_into.memory_why = why
            return result, None, None, why
        xspace = read_xspace(xplane)
        if memory_into is not None:
            memory_into.memory_events = memory_events(xspace)
            memory_into.memory_read_ps = peak_read_ps(xspace)
            memory_into.memory_trace = xspace
            memory_into.memory_why = memory_traced(memory_into.memory_events, memory_into.memory_peak)
        return result, iterator_element_bytes(xspace), kernel_nodes(xspace), None


def size_iterator_outputs(captured: CapturedGraphs, element_bytes: list[int] | None, why: str | None) -> None:
    """Give the input pipeline's outputs the shape they really had in the captured call. An
    element's components share their dynamic (batch) dimension: the bytes the iterator handed out
    over the bytes per batch row give it, when every traced dimension but that one is known."""
    from pinpoint.placement.graphs.shapes import batch_size, row_bytes

    for name in captured.dynamic_inputs:
        outs = captured.shapes.get(name) or []
        if row_bytes(outs) is None:
            captured.unsized_why[name] = ("an input batch whose dimensions other than the batch are dynamic too: "
                                          "the bytes the step took do not fix each one")
            continue
        batch = batch_size(outs, element_bytes)
        if batch is None:
            captured.unsized_why[name] = (
                f"an input batch with a dynamic batch dimension, and the profiler could not tell its size ({why})"
                if element_bytes is None else
                "an input batch with a dynamic batch dimension; the iterators handed out elements of "
                f"{sorted(set(element_bytes or ()))} bytes, none or several fitting its shape")
            continue
        captured.shapes[name] = [(dtype, [batch, *dims[1:]]) for dtype, dims in outs]


def size_from_inference(captured: CapturedGraphs, element_bytes: list[int] | None, kernels: set[str] | None) -> None:
    """Every tensor derived from the input batch (a cond's output, an identity, a reshape) gets the
    shape it had in the captured call: TensorFlow's shape inference over the partition graphs from
    the input elements' real shapes (placement.runshapes). Only unknown dimensions are filled."""
    from pinpoint.placement.graphs.shapes import DEAD_BRANCH, infer_shapes, merge_shapes

    if kernels is None or not captured.partition_graphs:
        return
    try:
        inferred, dead = infer_shapes(captured.partition_graphs, element_bytes, kernels)
    except Exception as err:  # noqa: BLE001 - reported as a sizing error; the transfers keep their reason
        captured.sizing_errors.append(inference_error(captured, err))
        for name in captured.dynamic_inputs:
            captured.unsized_why.setdefault(name, f"shape inference failed ({captured.sizing_errors[-1]})")
        return
    for name in dead:
        captured.unsized_why[name] = DEAD_BRANCH
    for name, outs in inferred.items():
        known = captured.shapes.get(name)
        conflict = shape_conflict(known, outs)
        if conflict:
            captured.sizing_errors.append(
                f"TensorFlow's shape inference disagrees with the traced graph in {function_of(captured, name)} "
                f"at {name}: {conflict}")
            continue
        # A rewritten op can have more outputs than the traced one (a fused bias gradient).
        if known and not has_dynamic_dims(known) and len(known) >= len(outs):
            continue
        captured.shapes[name] = merge_shapes(known, outs)


_NODE_IN_ERROR = re.compile(r"\{\{node ([^}]+)\}\}")


def inference_error(captured: CapturedGraphs, err: Exception) -> str:
    """One line: the function and the op at which TensorFlow's shape inference raised, and why."""
    text = str(err)
    m = _NODE_IN_ERROR.search(text)
    op = m.group(1) if m else None
    first = (text.splitlines() or [""])[0]
    first = first.split(" for '{{node", 1)[0][:200]
    where = f"in {function_of(captured, op)} at {op}" if op else "in the captured call"
    return f"shape inference failed {where} ({type(err).__name__}: {first})"


def shape_conflict(traced: list | None, inferred: list) -> str | None:
    """How an inferred shape contradicts a dimension the traced graph knew (None: it does not)."""
    for i, (_, dims) in enumerate(traced or ()):
        other = inferred[i][1] if i < len(inferred) else None
        if dims is None or other is None:
            continue
        if len(dims) != len(other) or any(d is not None and o is not None and d != o
                                          for d, o in zip(dims, other, strict=True)):
            return f"output {i} traced {dims}, inferred {other}"
    return None


def capture_call(fn: Callable[..., Any], *args, step: int = 0, **kwargs) -> tuple[Any, CapturedGraphs]:
    """Run `fn(*args, **kwargs)` with graph collection on; return (result, CapturedGraphs).

    `fn` must be a tf.function that has not been called before (see `collecting`)."""
    with collecting(step) as captured:
        result = fn(*args, **kwargs)
    add_trace_info(fn, args, kwargs, captured)
    return result, captured


def add_trace_info(fn, args, kwargs, captured: CapturedGraphs) -> None:
    """Fill shapes and arg_values from the (cached) concrete function; best effort.

    get_concrete_function with the same arguments returns the trace just executed (no retrace).
    """
    try:
        cf = fn.get_concrete_function(*args, **kwargs)
    except Exception:  # noqa: BLE001 - not a tf.function, or arguments it cannot re-specialise on
        return
    for g in [cf.graph, *called_graphs(cf.graph).values()]:
        for op in g.get_operations():
            captured.shapes.setdefault(op.name, output_shapes(op))
    # _Arg index i is the i-th flat input of the function; captured inputs come after the
    # explicit ones and map internal placeholders to the outer tensors (variable handles).
    external = {id(internal): ext for ext, internal in cf.graph.captures}
    map_arg_values(captured, [external.get(id(t)) for t in cf.inputs])


def map_arg_values(captured: CapturedGraphs, values: list) -> None:
    """_Arg node -> values[its index] (None: left out), in every captured function graph with
    exactly len(values) arguments (the function that was called, not the ones it calls)."""
    for _, pre, _ in captured.functions:
        args = [n for n in pre.node if n.op == "_Arg"]
        if len(args) != len(values):
            continue
        for n in args:
            value = values[n.attr["index"].i]
            if value is not None:
                captured.arg_values[n.name] = value


def capture_on_device(py_fn: Callable[..., Any], device: str, *args, step: int = 0, **kwargs):
    """Run one step of `py_fn` (a plain Python step body) with its ops placed on `device`,
    called from this process, with graph collection on; return (result, CapturedGraphs).

    For parameter_server: a closure scheduled by the ClusterCoordinator is instantiated by the
    worker's own runtime, so the coordinator never sees its partition graphs. Called from the
    coordinator with the body under `tf.device("/job:worker/replica:0/task:0/...")`, the step is
    placed and partitioned here and its components run on the worker and the ps tasks: the
    partition graphs show compute on the worker, variables and their updates on the ps tasks and
    every worker<->ps transfer. It is a real training step (updates are applied).

    Use the device the scheduled closures run on ("/job:worker/replica:0/task:0"), e.g. in the
    trainer: `capture_on_device(lambda s: replica_update(*batch(s)), "/job:worker/replica:0/task:0",
    tf.constant(step))`. Tensors the body captures from this process (e.g. an in-memory dataset)
    are sent to the worker and show up as transfers from the coordinator.
    """
    import tensorflow as tf

    def body(*a, **kw):
        with tf.device(device):
            return py_fn(*a, **kw)

    result, captured = capture_call(tf.function(body), *args, step=step, **kwargs)
    captured.notes.append(
        f"captured by running one step from this process with its ops placed on {device} "
        "(the runtime placed and partitioned it here; its parts ran on the devices shown)"
    )
    return result, captured


# A lowered cond inlines its branch functions as '<If op>/then/_<k>/<op>' ('else' for the other).
_LOWERED_BRANCH = re.compile(r"/(then|else)/_\d+/")


def add_branch_shapes(captured: CapturedGraphs) -> int:
    """`captured.branch_shapes` under the names the runtime gives those ops once it lowers each cond
    into the executed graphs ('<cond op>/then/_<k>/<op>'); returns how many."""
    found = captured.branch_shapes
    added = 0
    for g in captured.partition_graphs:
        for n in g.node:
            if n.name in captured.shapes:
                continue
            outs = found.get(_LOWERED_BRANCH.sub(r"/\1/", n.name))
            if outs is not None:
                captured.shapes[n.name] = outs
                added += 1
    return added
