"""The one copy of graph collection and output-shape extraction (trainer capture and trace).

The runtime records a function's pre-optimization and partition graphs when it instantiates the
function with graph collection on (the eager context's private switch); output shapes come from
the traced Python graph and the graphs of the functions it calls (`Graph._functions`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

# oneDNN's graph rewrite fuses Conv2DBackpropFilter and BiasAddGrad into one op (named as the
# filter gradient, so its traced shapes list one output) whose second output is the bias gradient:
# one value per output channel, the filter's last dimension (HWIO whatever the data format).
# TensorFlow's shape function gives it the *input's* channel count instead (x [8, 32, 32, 5],
# out_backprop [8, 32, 32, 16] -> [5]).
FUSED_BIAS_GRAD = {"_MklNativeConv2DBackpropFilterWithBias", "_MklConv2DBackpropFilterWithBias"}


@dataclass
class Collected:
    """The block's RunMetadata (function_graphs, step_stats), set when the block ended normally."""

    metadata: Any = None


@contextlib.contextmanager
def collect_graphs(step_stats: bool = False):
    """Graph collection around the block (with `step_stats`, the step stats of every node too:
    the shapes really produced, at a cost per op); yields a Collected filled when it ends.

    Only what the block instantiates is recorded: run a function's first call in it."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_graph_collection()
    if step_stats:
        ctx.enable_run_metadata()
    # Exporting clears the context's run metadata: drop whatever earlier work left there
    # (other functions, eager ops), so the result holds only this block's graphs.
    ctx.export_run_metadata()
    collected = Collected()
    try:
        yield collected
        context.async_wait()  # async eager work: every instantiation is recorded
        collected.metadata = ctx.export_run_metadata()
    finally:
        if step_stats:
            ctx.disable_run_metadata()
        ctx.disable_graph_collection()


def output_shapes(op) -> list[tuple[int, list[int] | None]]:
    """[(dtype enum, dims or None for an unknown rank), ...] per output of a graph op."""
    return [(t.dtype.as_datatype_enum, t.shape.as_list() if t.shape.rank is not None else None)
            for t in op.outputs]


def called_graphs(graph) -> dict[str, Any]:
    """The Python graphs of the functions in `graph`'s library, by function name."""
    library = {}
    for name, f in getattr(graph, "_functions", {}).items():
        g = getattr(f, "graph", None)
        if g is not None:
            library[name if isinstance(name, str) else name.decode()] = g
    return library
