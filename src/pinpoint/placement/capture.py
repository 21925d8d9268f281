"""Capture the placement the runtime really used.

`op.device` is only the request. The runtime's placer (with soft placement and kernel
availability) decides, then the graph is partitioned per device with _Send/_Recv pairs on
every cross-device edge. Those *partition graphs* are recorded when a function is
instantiated with graph collection on. The trainer turns collection on for the first call of
its multi-step training function, which instantiates it anyway (see placement.steps for the
per-step view of that loop); calls that are not captured pay nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import graph_pb2

from pinpoint.tfcompat.graphs import called_graphs, collect_graphs, output_shapes


@dataclass
class CapturedGraphs:
    """What one captured call executed: per function, its pre-placement and partition graphs."""

    step: int
    # One entry per instantiated function: (function name, pre-optimization GraphDef,
    # list of partition GraphDefs, each holding one device's nodes with assigned devices).
    functions: list[tuple[str, graph_pb2.GraphDef, list[graph_pb2.GraphDef]]] = field(default_factory=list)
    # Static output shapes from the traced Python graph, by op name: [(dtype enum, dims or
    # None), ...] per output. _Send nodes carry a dtype but no shape; this sizes transfers.
    shapes: dict[str, list[tuple[int, list[int] | None]]] = field(default_factory=dict)
    # _Arg node name -> the captured eager tensor fed to it (variable handles), so update
    # ops can be attributed to the variable whose resource they write.
    arg_values: dict[str, Any] = field(default_factory=dict)
    # How this capture was taken when it differs from a plain call (shown in placement notes).
    notes: list[str] = field(default_factory=list)
    # The steps these graphs stand for when more than `step` (every step a captured
    # multi-step function ran inside the sample window executes the same graphs).
    steps: list[int] = field(default_factory=list)
    # Node name -> requested device, when a view renamed the nodes (else read from the graphs).
    requested: dict[str, str] | None = None
    # Node name -> pre-optimization NodeDef (op type and attrs), when a view renamed the nodes.
    defs: dict[str, Any] | None = None

    @property
    def partition_graphs(self) -> list[graph_pb2.GraphDef]:
        return [g for _, _, parts in self.functions for g in parts]

    @property
    def requested_graphs(self) -> list[graph_pb2.GraphDef]:
        return [pre for _, pre, _ in self.functions]


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
    md = collected.metadata
    for fg in md.function_graphs if md is not None else []:
        pre = fg.pre_optimization_graph
        name = pre.library.function[0].signature.name if pre.library.function else ""
        captured.functions.append((name, pre, list(fg.partition_graphs)))


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
