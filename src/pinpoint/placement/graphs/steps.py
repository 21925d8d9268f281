"""One training step's graphs out of a captured multi-step function.

The trainer runs n steps per tf.function call (a `tf.range` loop), and placement is captured
when that function is instantiated, the call that happens anyway, so sampling costs no extra
trace. The runtime lowers the loop to a dataflow frame (Enter/Merge/Switch/NextIteration/Exit)
and inlines its body, whose nodes are named "<loop>/body/_<k>/<loop>/<op name>". Every node of
the body frame runs once per step; nodes outside it run once per call.

`per_step_view` keeps the body (renamed to the op names a single step would have: "mlp/dense/
MatMul", "replica_1/...", "gradient_tape/..."), drops the loop's own machinery, and tags the
transfers the loop itself adds (its predicate and a control signal sent to each device every
iteration) so they are reported apart from the model's. A call compiled by XLA
(`_XlaMustCompile`) runs as one program on its device: it is expanded into the ops it was
compiled from, each reported on that device. A capture without a lowered loop is returned
as is (it already is one step).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict, deque

from tensorflow.core.framework import graph_pb2, node_def_pb2

from pinpoint.placement.graphs.captured import CapturedGraphs, requested_devices
from pinpoint.placement.graphs.ops import (
    CALLS,
    CONTROL_FLOW,
    EMULATED_ATTR,
    LOOP_ATTR,
    SENDS,
    STEP_FORWARD,
    TRANSPORT,
    XLA_ATTR,
)


def _src(inp: str) -> str:
    return inp.lstrip("^").split(":")[0]


def frames(graph: graph_pb2.GraphDef) -> dict[str, tuple[str, ...]]:
    """Node name -> its frame stack (outermost first); () for nodes outside every loop.

    Propagated along data and control edges from the sources: an Enter opens its frame_name,
    whatever an Exit feeds is back in the parent frame (TensorFlow's control-flow info rule)."""
    nodes = {n.name: n for n in graph.node}
    outs: dict[str, list[str]] = defaultdict(list)
    for n in graph.node:
        for inp in n.input:
            outs[_src(inp)].append(n.name)
    frame: dict[str, tuple[str, ...]] = {}
    queue: deque[str] = deque()
    for n in graph.node:
        if not n.input:
            frame[n.name] = (n.attr["frame_name"].s.decode(),) if n.op in ("Enter", "RefEnter") else ()
            queue.append(n.name)
    while queue:
        src = queue.popleft()
        f_src = frame[src]
        leaving = nodes[src].op in ("Exit", "RefExit")
        for dst in outs.get(src, ()):
            if dst in frame:
                continue
            d = nodes[dst]
            if d.op in ("Enter", "RefEnter"):
                f = f_src + (d.attr["frame_name"].s.decode(),)
            elif leaving:
                f = f_src[:-1]
            else:
                f = f_src
            frame[dst] = f
            queue.append(dst)
    return frame


def _training_loop(partitions: list[graph_pb2.GraphDef], fmap: list[dict]) -> str | None:
    """The outermost loop frame holding the most nodes: the trainer's multi-step loop."""
    sizes: Counter = Counter()
    for fr in fmap:
        for stack in fr.values():
            if stack:
                sizes[stack[0]] += 1
    return sizes.most_common(1)[0][0] if sizes else None


class _Names:
    """Raw lowered names -> the names one step's ops would have."""

    def __init__(self, loop: str):
        lp = re.escape(loop)
        self.body = re.compile(rf"^(?P<pre>(?:[^/]+/)*?){lp}/body/_\d+/(?P<rest>.*)$")
        self.scope = re.compile(rf"(^|/){lp}/")
        self.head, self.inner = f"{loop}/", f"/{loop}/"
        # Tensors of the loop itself: its predicate, the per-iteration control signal, its condition.
        self.machinery = re.compile(rf"(^|/){lp}/(LoopCond|loop_body_control|cond/_\d+/)")

    def is_body(self, name: str) -> bool:
        return not name.startswith(("_cloop", "Func/")) and self.body.match(name) is not None

    def display(self, name: str) -> str:
        m = self.body.match(name)
        if m is None:
            return name
        # "<loop>/body/_1/<loop>/mlp/dense/MatMul" -> "mlp/dense/MatMul"; the body graph's own
        # name scope is the loop's name, once ("gradient_tape/<loop>/mlp/..." too).
        return m.group("pre") + self.scope.sub(r"\1", m.group("rest"), count=1)

    def function_node(self, name: str) -> str:
        """A body function's node name ("<loop>/mlp/dense/MatMul") -> display name."""
        if name.startswith(self.head):
            return name[len(self.head):]
        i = name.find(self.inner)
        return name if i < 0 else name[: i + 1] + name[i + len(self.inner):]


def display_names(captured: CapturedGraphs):
    """Raw node name (as the executor ran it) -> the name one step's op has ("mlp/dense/MatMul")."""
    partitions = captured.partition_graphs
    loop = _training_loop(partitions, [frames(g) for g in partitions])
    return _Names(loop).display if loop is not None else (lambda name: name)


def per_step_view(captured: CapturedGraphs) -> CapturedGraphs:
    """The captured graphs of one step: the training loop's body, with XLA calls expanded."""
    partitions = captured.partition_graphs
    fmap = [frames(g) for g in partitions]
    loop = _training_loop(partitions, fmap)
    library = {f.signature.name: f for pre in captured.requested_graphs for f in pre.library.function}
    if loop is None:
        return _expand_xla(captured, library)
    names = _Names(loop)

    out = CapturedGraphs(step=captured.step, steps=list(captured.steps), notes=list(captured.notes),
                         arg_values=dict(captured.arg_values), sizing_errors=list(captured.sizing_errors),
                         input_arg_ids=set(captured.input_arg_ids))
    per_call = 0
    new_parts: list[graph_pb2.GraphDef] = []
    for g, fr in zip(partitions, fmap, strict=True):
        part, n_call = _step_partition(g, fr, loop, names)
        new_parts.append(part)
        per_call += n_call

    requested, defs = {}, {}
    for pre in captured.requested_graphs:
        for f in pre.library.function:
            for nd in f.node_def:
                name = names.function_node(nd.name)
                out.def_names.setdefault(nd.name, name)
                defs.setdefault(name, _renamed_colocation(nd, names) if "_class" in nd.attr else nd)
                # GPU emulation's default requests are not the user's (see distribute.emulation).
                if nd.device and EMULATED_ATTR not in nd.attr:
                    requested.setdefault(name, nd.device)
    out.requested = requested
    out.defs = defs
    out.shapes = {names.function_node(k): v for k, v in captured.shapes.items()}
    for k, v in captured.shapes.items():
        out.shapes.setdefault(k, v)
    out.functions = [(name, pre, new_parts if i == _main_index(captured) else [])
                     for i, (name, pre, _) in enumerate(captured.functions)]
    out.notes.append(
        "captured as the multi-step training function was instantiated (no extra trace); every "
        "step it runs executes these graphs; counts are one step of its loop body"
        + (f" ({per_call} op(s) outside the loop run once per call, not counted)" if per_call else "")
    )
    return _expand_xla(out, library)


def _renamed_colocation(nd, names: _Names):
    """A copy of `nd` whose colocation groups ("loc:@<loop>/mlp/dense/MatMul") name the ops as
    one step has them ("loc:@mlp/dense/MatMul")."""
    out = node_def_pb2.NodeDef()
    out.CopyFrom(nd)
    groups = [s.decode() for s in nd.attr["_class"].list.s]
    del out.attr["_class"].list.s[:]
    out.attr["_class"].list.s.extend(
        ("loc:@" + names.function_node(g.removeprefix("loc:@"))).encode() if g.startswith("loc:@") else g.encode()
        for g in groups)
    return out


def _step_partition(g: graph_pb2.GraphDef, fr: dict, loop: str, names: _Names) -> tuple[graph_pb2.GraphDef, int]:
    """One partition's per-step nodes, renamed, with inputs rewired past the loop's machinery;
    and how many ops of it run once per call (outside the loop)."""
    nodes = {n.name: n for n in g.node}
    keep: dict[str, node_def_pb2.NodeDef] = {}
    per_call = 0
    for n in g.node:
        stack = fr.get(n.name, ())
        in_loop = bool(stack) and stack[0] == loop
        if n.op == "_Arg":
            keep[n.name] = n  # bookkeeping, never counted: kept so updates find their variable
        elif in_loop and (n.op in TRANSPORT or names.is_body(n.name) and n.op not in CONTROL_FLOW):
            keep[n.name] = n  # the step's ops, and every per-step transfer (machinery's too)
        elif not in_loop and n.op not in CONTROL_FLOW | TRANSPORT | {"_Retval", "NoOp", "Const"}:
            per_call += 1

    def resolve(inp: str) -> str | None:
        ctrl = inp.startswith("^")
        name, _, idx = inp.lstrip("^").partition(":")
        for _ in range(50):
            if name in keep:
                break
            n = nodes.get(name)
            if n is None or n.op not in STEP_FORWARD or not n.input or n.input[0].startswith("^"):
                return None if ctrl else inp.lstrip("^")
            name, _, idx = n.input[0].partition(":")
        else:
            return None if ctrl else inp.lstrip("^")
        new = names.display(name) if keep[name].op != "_Arg" else name
        return ("^" + new) if ctrl else (new + (f":{idx}" if idx else ""))

    out = graph_pb2.GraphDef()
    for n in keep.values():
        m = out.node.add()
        m.CopyFrom(n)
        if n.op != "_Arg":
            m.name = names.display(n.name)
        del m.input[:]
        for inp in n.input:
            r = resolve(inp)
            if r is not None:
                m.input.append(r)
        if n.op in SENDS and n.input:
            tensor = _src(n.input[0])
            if not names.is_body(tensor) and _is_machinery(tensor, nodes.get(tensor), names):
                m.attr[LOOP_ATTR].b = True
    return out, per_call


def _is_machinery(tensor: str, src, names: _Names) -> bool:
    """A tensor of the loop itself: its condition, predicate and per-iteration control signal, its
    Switch/Merge outputs, or a control edge's trigger (a Const the partitioner adds, ".../ctrl/_k")
    leaving the loop's frame nodes. Loop-invariant inputs entering the body carry data: not these."""
    if names.machinery.search(tensor):
        return True
    if src is None:
        return False
    return src.op in CONTROL_FLOW or (src.op == "Const" and "/ctrl/" in tensor)


def _main_index(captured: CapturedGraphs) -> int:
    """The function entry holding the partitions (the traced training function)."""
    best, size = 0, -1
    for i, (_, _, parts) in enumerate(captured.functions):
        n = sum(len(p.node) for p in parts)
        if n > size:
            best, size = i, n
    return best


def expand_xla(captured: CapturedGraphs) -> CapturedGraphs:
    """A capture taken as is (a traced program's function) with its XLA-compiled calls expanded,
    as `per_step_view` expands them for Pinpoint's own loop: both report XLA alike. Once."""
    if captured.xla_calls:
        return captured
    library = {f.signature.name: f for pre in captured.requested_graphs for f in pre.library.function}
    return _expand_xla(captured, library)


def _expand_xla(captured: CapturedGraphs, library: dict) -> CapturedGraphs:
    """Replace each XLA-compiled call by the ops of its function, on the call's device (the
    call's own node stays: it is the cluster's launch, and its transfers are the cluster's)."""
    calls = [(g, n) for g in captured.partition_graphs for n in g.node
             if n.op in CALLS and n.attr["_XlaMustCompile"].b]
    if not calls:
        return captured
    requested = dict(captured.requested) if captured.requested is not None else requested_devices(captured)
    for g, call in calls:
        fname = call.attr["f"].func.name
        f = library.get(fname)
        if f is None:
            continue
        captured.xla_calls.append((fname, call.device))
        # Named as TensorFlow names a function body it inlines (under the call's name), so an op
        # has the same name whether or not XLA compiled its function.
        prefix = f"{call.name}/"
        args = _call_arguments(call, f)
        for nd in f.node_def:
            m = g.node.add()
            m.CopyFrom(nd)
            m.name = prefix + nd.name
            m.device = call.device  # XLA compiles the whole function into one program for this device
            m.attr[XLA_ATTR].b = True  # XLA's own kernels run it, not the kernel registry's
            del m.input[:]
            for inp in nd.input:
                ctrl = inp.startswith("^")
                base = inp.lstrip("^").split(":")[0]
                m.input.append(("^" if ctrl else "") + (args.get(base) or prefix + base))
            if nd.device and EMULATED_ATTR not in nd.attr:
                requested[m.name] = nd.device
    captured.requested = requested
    return captured


def _call_arguments(call, f) -> dict[str, str]:
    """The function's argument names -> the tensors the call passes them (so an update inside
    the cluster leads back to the _Arg holding its variable)."""
    data = [i for i in call.input if not i.startswith("^")]
    return {a.name: data[k] for k, a in enumerate(f.signature.input_arg) if k < len(data)}
