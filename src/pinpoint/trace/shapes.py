"""Static and run-time output shapes of a captured function or Session.run (they size the
transfers): the traced graph's shapes, the called functions' (inlined as '<call op>/<op>'), and
the step stats' real shapes where the graph's are unknown."""

from __future__ import annotations

from pinpoint.placement import ITERATOR_GET_NEXT, CapturedGraphs, has_dynamic_dims
from pinpoint.tfcompat.graphs import called_graphs, output_shapes


def function_shapes(fn, cap: CapturedGraphs) -> bool:
    """Static output shapes by op name (sizes the transfers), from the function's graph and the
    graphs of the functions it calls: the runtime inlines a call, naming the callee's ops
    '<call op>/<op>' (Keras' train function calls its step function this way). True when an input
    element (in the function or any function it calls, a cond's branch too) has a dynamic shape."""
    try:
        graph = fn.graph
    except Exception:  # noqa: BLE001 - a function loaded without its Python graph
        return False
    graph_shapes(graph, "", cap, depth=0)
    return bool(cap.dynamic_inputs) or _dynamic_source(graph, set())


def _dynamic_source(graph, seen: set) -> bool:
    """An op handing out input elements of a dynamic shape, in `graph` or the functions it calls."""
    from pinpoint.placement import INPUT_SOURCES

    for op in graph.get_operations():
        if op.type in INPUT_SOURCES and has_dynamic_dims(output_shapes(op)):
            return True
    for name, inner in called_graphs(graph).items():
        if name not in seen:
            seen.add(name)
            if _dynamic_source(inner, seen):
                return True
    return False


# The functions an op runs, each with the prefix the runtime inlines its body under: a call's
# '<call op>/<op>', a cond's branches '<If op>/then/<op>' and '<If op>/else/<op>' (the lowering
# adds a '_<k>/' after the branch: capture.add_branch_shapes).
_CALLEES = {"StatefulPartitionedCall": (("f", "/"),), "PartitionedCall": (("f", "/"),),
            "If": (("then_branch", "/then/"), ("else_branch", "/else/")),
            "StatelessIf": (("then_branch", "/then/"), ("else_branch", "/else/"))}


def graph_shapes(graph, prefix: str, cap: CapturedGraphs, depth: int, branch: bool = False) -> None:
    """The static shapes of `graph`'s ops and of the functions they call, into `cap.shapes`; those
    inside a cond's branch into `cap.branch_shapes` (their executed names are not known yet)."""
    library = called_graphs(graph)
    store = cap.branch_shapes if branch else cap.shapes
    for op in graph.get_operations():
        outs = store.setdefault(prefix + op.name, output_shapes(op))
        if not branch and op.type in ITERATOR_GET_NEXT and has_dynamic_dims(outs):
            cap.dynamic_inputs.append(prefix + op.name)
        if depth >= 8:
            continue
        for attr, sep in _CALLEES.get(op.type, ()):
            try:
                callee = op.get_attr(attr).name
            except (ValueError, AttributeError):
                continue
            inner = library.get(callee)
            if inner is not None:
                graph_shapes(inner, f"{prefix}{op.name}{sep}", cap, depth + 1, branch or sep != "/")


def run_shapes(step_stats, cap: CapturedGraphs) -> None:
    """The shapes the nodes really produced (step stats of the captured call), where the traced
    graph's static shape is unknown or partly unknown."""
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            outs = []
            for o in ns.output:
                td = o.tensor_description
                if td.shape.unknown_rank:
                    break
                outs.append((o.slot, td.dtype, [int(d.size) for d in td.shape.dim]))
            if not outs:
                continue
            known = cap.shapes.get(ns.node_name)
            if known and all(dims is not None and None not in dims for _, dims in known):
                continue
            slots = max(slot for slot, _, _ in outs) + 1
            row = [(0, None)] * slots
            for slot, dtype, dims in outs:
                row[slot] = (dtype, dims)
            cap.shapes[ns.node_name] = row


