"""The shapes a captured call really produced where its traced graph left the batch dimension dynamic.

TensorFlow records no step stats for a tf.function call, but it knows how to derive every
tensor's shape from its inputs' shapes: its own shape inference. The captured partition graphs
(joined into one graph: each _Recv reads its _Send's tensor) are imported with each input
pipeline op that ran given the shape it really handed out (its batch size from the bytes the
profiler saw it hand out), and the graph's shapes are read back.

oneDNN's graph rewrite fuses some ops into ones whose shape function is wrong (the filter gradient
with its bias gradient gets the input's channel count as the bias's size). A wrong shape inside the
import poisons every shape derived from it (a gradient pack split into the wrong sizes fails the
whole import), so such a node is split back into the ops it fused before the import (`unfuse`).

A lowered tf.cond joins its branches in a Merge, whose inferred shape is only what both branches
agree on (the data handler's dummy branch is an empty batch). The profiler tells which kernels
ran: a node ran when a kernel that reads it ran, and a node whose inputs all ran ran too. A Merge
with exactly one input that ran is given that input alone; a branch that did not run sizes
nothing (its transfers keep their reason).
"""

from __future__ import annotations

from typing import Any

from pinpoint.placement.graphs.ops import INPUT_SOURCES, LOOKUPS, LOOP_FRAME, MERGES, RECVS, SENDS, SWITCHES, tensor
from pinpoint.tfcompat.graphs import FUSED_BIAS_GRAD

DEAD_BRANCH = ("sent from a cond branch that did not run in the captured call (a dead tensor: no data moved, "
               "so no shape was produced)")


def row_bytes(outs: list[tuple[int, list[int] | None]]) -> int | None:
    """The bytes of one batch row of an input element of traced shapes `outs` (dtype enum, dims);
    None unless every component's first dimension is the dynamic batch, the rest are known and
    every dtype has a fixed size."""
    import tensorflow as tf

    row = 0
    for dtype, dims in outs:
        dt = tf.dtypes.as_dtype(dtype)
        # A string's bytes are its contents' (the runtime counts each string's length), not a
        # fixed size a row: no batch follows from the element's bytes.
        if not dims or dims[0] is not None or None in dims[1:] or not dt.is_numpy_compatible or not dt.size:
            return None
        n = dt.size
        for d in dims[1:]:
            n *= d
        row += n
    return row or None


def batch_size(outs: list[tuple[int, list[int] | None]], element_bytes: list[int] | None) -> int | None:
    """The batch an input element of traced shapes `outs` had, from the bytes the iterators handed
    out: the one size that is a whole number of batch rows; None when the dims other than the batch
    are unknown too, or no single size fits."""
    row = row_bytes(outs)
    if row is None:
        return None
    batches = {b // row for b in element_bytes or () if b % row == 0}
    return batches.pop() if len(batches) == 1 else None




def joined_graph(partitions: list) -> Any:
    """One GraphDef of every partition's nodes, each _Recv an Identity of the tensor its _Send sent."""
    from tensorflow.core.framework import graph_pb2

    sent = {}
    for g in partitions:
        for n in g.node:
            if n.op in SENDS and n.input:
                key = (n.attr["tensor_name"].s, n.attr["send_device"].s, n.attr["recv_device"].s)
                sent[key] = n.input[0]
    dropped = {n.name for g in partitions for n in g.node if n.op in SENDS}
    out = graph_pb2.GraphDef()
    functions = {}
    for g in partitions:
        for f in g.library.function:
            functions.setdefault(f.signature.name, f)
        for n in g.node:
            if n.op in SENDS:
                continue
            node = out.node.add()
            node.CopyFrom(n)
            node.attr.pop("_class", None)  # colocation with nodes of other partitions: not needed here
            del node.input[:]
            node.input.extend(i for i in n.input if i.lstrip("^").split(":")[0] not in dropped)
            if n.op in RECVS:
                key = (n.attr["tensor_name"].s, n.attr["send_device"].s, n.attr["recv_device"].s)
                src = sent.get(key)
                dtype = n.attr["tensor_type"].type
                node.ClearField("attr")
                node.attr["T"].type = dtype
                if src is None:
                    node.op = "Placeholder"
                    node.attr["dtype"].type = dtype
                    del node.attr["T"]
                    del node.input[:]
                else:
                    node.op = "Identity"
                    node.input.insert(0, src)
    out.library.function.extend(functions.values())
    return out


def ran_tensors(graph, kernels: set[str]) -> tuple[set[str], set[tuple[str, int]]]:
    """(nodes that ran, Switch outputs that were taken), from the kernels the profiler saw run."""
    nodes = {n.name: n for n in graph.node}
    ran: set[str] = set()
    taken: set[tuple[str, int]] = set()
    # Backwards: a kernel ran only when every input it reads was produced (a Merge: one of them).
    stack = [k for k in kernels if k in nodes and nodes[k].op not in MERGES | SWITCHES | LOOP_FRAME]
    stack += [n.name for n in graph.node if not n.input and n.op not in LOOP_FRAME | {"Placeholder"}]
    while stack:
        name = stack.pop()
        if name in ran:
            continue
        ran.add(name)
        if nodes[name].op in MERGES:
            continue
        for inp in nodes[name].input:
            src, idx = tensor(inp.lstrip("^"))
            if src not in nodes:
                continue
            if nodes[src].op in SWITCHES and not inp.startswith("^"):
                taken.add((src, idx))
            if nodes[src].op in MERGES:
                ran.add(src)
            else:
                stack.append(src)

    def produced(inp: str) -> bool:
        src, idx = tensor(inp.lstrip("^"))
        if src not in nodes or src not in ran:
            return False
        return nodes[src].op not in SWITCHES or inp.startswith("^") or (src, idx) in taken

    # Forwards: a node whose inputs were all produced ran (a Merge: any of them). A node is looked at
    # again only when one of its inputs turned out to have run.
    consumers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(tensor(i.lstrip("^"))[0], []).append(n.name)
    work = [n.name for n in graph.node]
    while work:
        n = nodes[work.pop()]
        if n.name in ran or not n.input or n.op in SWITCHES | LOOP_FRAME:
            continue
        data = [i for i in n.input if not i.startswith("^")]
        if (n.op in MERGES and any(produced(i) for i in data)) or all(produced(i) for i in n.input):
            ran.add(n.name)
            work.extend(consumers.get(n.name, ()))
    return ran, taken


def dead_nodes(graph, taken: set[tuple[str, int]]) -> set[str]:
    """The nodes of a cond branch that did not run: every Switch on a predicate whose taken output is
    known (any Switch on the same predicate, through identities and copies, took it) sent a dead
    tensor out of its other output, and a node reading a dead tensor is dead (a Merge: when all are)."""
    nodes = {n.name: n for n in graph.node}

    def root(inp: str) -> str:
        name, idx = tensor(inp)
        seen = set()
        while name in nodes and nodes[name].op in ("Identity", "Snapshot") and name not in seen:
            seen.add(name)
            data = [i for i in nodes[name].input if not i.startswith("^")]
            if not data:
                break
            name, idx = tensor(data[0])
        return f"{name}:{idx}"

    pred_port: dict[str, set[int]] = {}
    for sw, port in taken:
        if nodes[sw].op in SWITCHES and len(nodes[sw].input) > 1:
            pred = root(nodes[sw].input[1])
            if nodes.get(tensor(pred)[0]) is not None and nodes[tensor(pred)[0]].op == "LoopCond":
                continue  # a while loop's Switch takes both outputs over its iterations
            pred_port.setdefault(pred, set()).add(port)
    dead_ports = set()
    for n in graph.node:
        if n.op in SWITCHES and len(n.input) > 1:
            ports = pred_port.get(root(n.input[1]))
            if ports is not None and len(ports) == 1:
                dead_ports.add((n.name, 1 - next(iter(ports))))
    consumers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(tensor(i.lstrip("^"))[0], []).append(n.name)

    dead: set[str] = set()

    def is_dead(inp: str) -> bool:
        src, idx = tensor(inp.lstrip("^"))
        # A control edge from a Switch that ran is live: only its outputs are dead or not.
        return src in dead or (not inp.startswith("^") and (src, idx) in dead_ports)

    work = [c for sw, _ in dead_ports for c in consumers.get(sw, ())]
    while work:
        n = nodes[work.pop()]
        if n.name in dead or n.op in LOOP_FRAME:
            continue
        data = [i for i in n.input if not i.startswith("^")]
        if n.op in MERGES:
            if not data or not all(is_dead(i) for i in data):
                continue
        elif not any(is_dead(i) for i in n.input):
            continue
        dead.add(n.name)
        work.extend(consumers.get(n.name, ()))
    return dead


def resolve_merges(graph, kernels: set[str], dead: set[str] = frozenset()) -> int:
    """Give each conditional Merge with exactly one input that ran (or exactly one not in a branch
    that did not run) that input alone (in place); returns how many were resolved. A loop's Merge
    (fed by NextIteration) is left as it is."""
    nodes = {n.name: n for n in graph.node}
    ran, taken = ran_tensors(graph, kernels)

    def produced(inp: str) -> bool:
        src, idx = tensor(inp)
        return src in ran and (nodes[src].op not in SWITCHES or (src, idx) in taken)

    resolved = 0
    for n in graph.node:
        if n.op not in MERGES:
            continue
        data = [i for i in n.input if not i.startswith("^")]
        if len(data) < 2 or any(tensor(i)[0] in nodes and nodes[tensor(i)[0]].op in LOOP_FRAME for i in data):
            continue
        live = [i for i in data if produced(i)]
        if not live:
            live = [i for i in data if tensor(i)[0] not in dead]
        if len(live) != 1:
            continue
        control = [i for i in n.input if i.startswith("^")]
        del n.input[:]
        n.input.extend([live[0], *control])
        n.attr["N"].i = 1
        resolved += 1
    return resolved


def first_iteration(graph) -> int:
    """Give each loop's Merge (in place) its Enter input alone, dropping the NextIteration back edge:
    the loop body then has the shapes of its first iteration (a training loop's do not change from one
    step to the next). Returns how many Merges were cut."""
    nodes = {n.name: n for n in graph.node}
    cut = 0
    for n in graph.node:
        if n.op not in MERGES:
            continue
        data = [i for i in n.input if not i.startswith("^")]
        entry = [i for i in data if nodes.get(tensor(i)[0]) is not None and nodes[tensor(i)[0]].op in ("Enter", "RefEnter")]
        if len(entry) == 1 and len(data) == 2:
            control = [i for i in n.input if i.startswith("^")]
            del n.input[:]
            n.input.extend([entry[0], *control])
            n.attr["N"].i = 1
            cut += 1
    for n in graph.node:
        # TensorFlow's shape function of an Enter knows its input's shape only for a loop constant;
        # with the back edges cut, every Enter's output is its input (the first iteration's).
        if n.op in ("Enter", "RefEnter"):
            n.attr["is_constant"].b = True
    return cut


def infer_shapes(partitions: list, element_bytes: list[int] | None,
                 kernels: set[str], loops: bool = False) -> tuple[dict[str, list], set[str]]:
    """(node name -> [(dtype enum, dims or None), ...], the nodes of branches that did not run):
    TensorFlow's shape inference over the captured partition graphs, the input elements that ran
    given their real batch, conditional Merges resolved to the branch that ran (with `loops`, each
    loop's body sized as its first iteration). Raises ValueError when TensorFlow cannot import the graph."""
    import tensorflow as tf

    from pinpoint.tfcompat.graphs import output_shapes

    graph = joined_graph(partitions)
    for n in graph.node:
        if n.op not in INPUT_SOURCES or n.name not in kernels or "output_shapes" not in n.attr:
            continue
        shapes = [None if s.unknown_rank else [d.size if d.size >= 0 else None for d in s.dim]
                  for s in n.attr["output_shapes"].list.shape]
        types = list(n.attr["output_types"].list.type)
        batch = batch_size(list(zip(types, shapes, strict=False)), element_bytes)
        if batch is None:
            continue
        n.attr["output_shapes"].list.ClearField("shape")
        for dims in shapes:
            n.attr["output_shapes"].list.shape.add().CopyFrom(tf.TensorShape([batch, *dims[1:]]).as_proto())
    _, taken = ran_tensors(graph, kernels)
    dead = dead_nodes(graph, taken)
    resolve_merges(graph, kernels, dead)
    unfuse(graph)
    lookups_as_fill(graph)
    if loops:
        first_iteration(graph)
    renamed = importable_names(graph)
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph, name="")
        shapes = {renamed.get(op.name, op.name): output_shapes(op) for op in g.get_operations()}
    return {name: outs for name, outs in shapes.items() if _UNFUSED not in name}, dead


_IMPORTABLE = "pinpoint_renamed/"


def importable_names(graph) -> dict[str, str]:
    """Rename (in place) the nodes whose names a graph import refuses: the partitioner's own, which
    start with '_' ('_cloop...' of a while loop's control edges); returns {new name: old name}."""
    bad = {n.name for n in graph.node if n.name.startswith("_")}
    if not bad:
        return {}

    def fix(inp: str) -> str:
        ctrl = inp.startswith("^")
        name, sep, idx = inp.lstrip("^").partition(":")
        return ("^" if ctrl else "") + (_IMPORTABLE + name if name in bad else name) + sep + idx

    for n in graph.node:
        if n.name in bad:
            n.name = _IMPORTABLE + n.name
        inputs = [fix(i) for i in n.input]
        del n.input[:]
        n.input.extend(inputs)
    return {_IMPORTABLE + name: name for name in bad}


# The suffix of the nodes `unfuse` adds (left out of the shapes it returns).
_UNFUSED = "/_pinpoint_unfused_"


# Attributes a fused filter gradient shares with Conv2DBackpropFilter and BiasAddGrad.
_FILTER_ATTRS = ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations", "use_cudnn_on_gpu")


def unfuse(graph) -> int:
    """Split each fused filter-and-bias gradient (in place) into the Conv2DBackpropFilter and
    BiasAddGrad it fused, joined by an IdentityN of the fused node's name, so each output gets the
    shape TensorFlow's own shape functions give the unfused ops; returns how many were split."""
    added = []
    for n in graph.node:
        if n.op not in FUSED_BIAS_GRAD:
            continue
        data = [i for i in n.input if not i.startswith("^")][:3]
        control = [i for i in n.input if i.startswith("^")]
        if len(data) != 3:
            continue
        filt = _node(f"{n.name}{_UNFUSED}filter", "Conv2DBackpropFilter", data, n.device)
        bias = _node(f"{n.name}{_UNFUSED}bias", "BiasAddGrad", data[2:], n.device)
        for a in _FILTER_ATTRS:
            if a in n.attr:
                filt.attr[a].CopyFrom(n.attr[a])
        for a in ("T", "data_format"):
            if a in n.attr:
                bias.attr[a].CopyFrom(n.attr[a])
        dtype = n.attr["T"].type
        n.op = "IdentityN"
        n.ClearField("attr")
        n.attr["T"].list.type.extend([dtype, dtype])
        del n.input[:]
        n.input.extend([filt.name, bias.name, *control])
        added += [filt, bias]
    graph.node.extend(added)
    return len(added) // 2


def lookups_as_fill(graph) -> int:
    """Rewrite (in place) each table lookup with a scalar default value as `Fill(Shape(keys),
    default)`, under the lookup's name: a scalar-valued table returns one value per key, the keys'
    shape in the default's dtype, which is what Fill's shape function gives; returns how many."""
    nodes = {n.name: n for n in graph.node}
    added = []
    for n in graph.node:
        if n.op not in LOOKUPS:
            continue
        data = [i for i in n.input if not i.startswith("^")]
        control = [i for i in n.input if i.startswith("^")]
        if len(data) != 3 or not _scalar(nodes, data[2]):
            continue  # a table of tensors (or a default of unknown shape): left to TensorFlow
        shape = _node(f"{n.name}{_UNFUSED}keys_shape", "Shape", [data[1]], n.device)
        shape.attr["T"].type = n.attr["Tin"].type
        shape.attr["out_type"].type = 3  # int32
        dtype = n.attr["Tout"].type
        n.op = "Fill"
        n.ClearField("attr")
        n.attr["T"].type = dtype
        n.attr["index_type"].type = 3
        del n.input[:]
        n.input.extend([shape.name, data[2], *control])
        added.append(shape)
    graph.node.extend(added)
    return len(added)


def _scalar(nodes: dict, inp: str) -> bool:
    """Whether the tensor `inp` is a scalar by its producer's graph: a constant's value, or the
    shape a function argument was traced with."""
    name, idx = tensor(inp)
    n = nodes.get(name)
    if n is None:
        return False
    if n.op == "Const":
        return not n.attr["value"].tensor.tensor_shape.dim
    shapes = n.attr["_output_shapes"].list.shape if "_output_shapes" in n.attr else []
    return idx < len(shapes) and not shapes[idx].unknown_rank and not shapes[idx].dim


def _node(name: str, op: str, inputs: list[str], device: str):
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op=op, device=device)
    node.input.extend(inputs)
    return node


def merge_shapes(traced: list | None, inferred: list) -> list:
    """The traced shapes, each unknown dimension taken from the inferred shape where it knows it;
    outputs the traced op did not have (a grappler or oneDNN rewrite fused it into an op with more
    outputs, e.g. a filter gradient that also returns the bias gradient) as inferred."""
    if not traced:
        return inferred
    out = []
    for i, (dtype, dims) in enumerate(traced):
        other = inferred[i][1] if i < len(inferred) else None
        if dims is None:
            out.append((dtype, other))
        elif other is None or len(other) != len(dims):
            out.append((dtype, dims))
        else:
            out.append((dtype, [d if d is not None else o for d, o in zip(dims, other, strict=True)]))
    return out + list(inferred[len(traced):])
