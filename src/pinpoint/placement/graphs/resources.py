"""Follow a resource input in a capture's partition graphs back to the variable handle it carries.

A variable's handle reaches the op that updates it through ops that pass it on unchanged: an
identity, a lowered cond's Switch and Merge, a lowered loop's Enter, Exit and NextIteration, a
_Recv from another device's _Send, and a function argument (the handle the call was given, or,
in a function the runtime instantiated on its own, the call op's input: an If's branch, a
While's body, a PartitionedCall's callee). A loss-scale optimizer applies its gradients inside a
cond, so its updates reach their variables only through these.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from pinpoint.placement.graphs.ops import DT_RESOURCE, HANDLE_FORWARD, MERGES, RECVS, SENDS

# A functional op's function attrs, and how many of its inputs come before the callee's arguments.
_CALLS = {
    "PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0),
    "If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
    "While": (("cond", "body"), 0), "StatelessWhile": (("cond", "body"), 0),
    "Case": (("branches",), 1), "StatelessCase": (("branches",), 1),
}


MAX_STEPS = 200  # a bound on one walk (a loop's Merge leads back to itself through NextIteration)


@dataclass(frozen=True)
class Source:
    """Where a resource came from: a function argument (its node's name) or a VarHandleOp, and
    the device that node is on (the resource's: an op using it runs there)."""

    arg: str | None = None
    shared_name: str | None = None
    device: str = ""


def split_input(inp: str) -> tuple[str, int]:
    """'node:2' -> ('node', 2); 'node' -> ('node', 0)."""
    name, _, port = inp.lstrip("^").partition(":")
    return name, int(port) if port.isdigit() else 0


class ResourceTracer:
    """The partition graphs of one capture, indexed to follow resources across them."""

    def __init__(self, functions, arg_values):
        # functions: [(function name, pre-optimization graph, [partition graphs])] (CapturedGraphs)
        self.arg_values = arg_values
        # The FunctionDefs the captured functions call, for a call whose callee's graphs the
        # runtime did not record (a function it runs without inlining: `_noinline`).
        self.library = {f.signature.name: f for _, pre, _ in functions for f in pre.library.function}
        self.captured = {fname for fname, _, _ in functions}
        self.graphs: list[dict] = []
        self.function_of: list[str] = []
        self.sends: dict[tuple, tuple[int, object]] = {}
        self.callers: dict[str, list[tuple[int, object, int]]] = defaultdict(list)
        for fname, _, parts in functions:
            for g in parts:
                self._index(fname, g)

    def _index(self, fname: str, g) -> None:
        gi = len(self.graphs)
        self.graphs.append({n.name: n for n in g.node})
        self.function_of.append(fname)
        for n in g.node:
            if n.op in SENDS:
                self.sends[_edge_key(n)] = (gi, n)
            for attr in _CALLS.get(n.op, ((), 0))[0]:
                for f in _function_names(n, attr):
                    for name in {f, _unspecialized(f)}:
                        self.callers[name].append((gi, n, _CALLS[n.op][1]))

    def source(self, inp: str, gi: int) -> Source | None:
        """The argument or VarHandleOp the resource input `inp` of graph `gi` comes from."""
        todo, seen = [(gi, *split_input(inp))], set()
        while todo and len(seen) < MAX_STEPS:
            gi, name, port = todo.pop()
            if (gi, name, port) in seen:
                continue
            seen.add((gi, name, port))
            n = self.graphs[gi].get(name)
            if n is None:
                continue
            found = self._step(gi, n, port, todo)
            if found is not None:
                return found
        return None

    def _step(self, gi: int, n, port: int, todo: list) -> Source | None:
        """A source when `n` is one; else pushes onto `todo` where `n`'s output `port` came from."""
        data = [i for i in n.input if not i.startswith("^")]
        if not _may_carry_resource(n, port):
            return None
        if n.op == "VarHandleOp":
            return Source(shared_name=n.attr["shared_name"].s.decode(), device=n.device)
        if n.op == "_Arg":
            if n.name in self.arg_values:
                return Source(arg=n.name, device=n.device)
            todo.extend(self._call_inputs(gi, n.attr["index"].i))
            return None
        if n.op in HANDLE_FORWARD and data:
            todo.append((gi, *split_input(data[0])))
        elif n.op == "IdentityN" and port < len(data):
            todo.append((gi, *split_input(data[port])))
        elif n.op in MERGES:
            # Either branch's value: the first input pushed last, so it is followed first.
            todo.extend((gi, *split_input(i)) for i in reversed(data))
        elif n.op in RECVS:
            sent = self.sends.get(_edge_key(n))
            if sent is not None and sent[1].input:
                todo.append((sent[0], *split_input(sent[1].input[0])))
        return None

    def call_updates(self, n, update_re) -> list[tuple[str, int]]:
        """(resource input, update ops) for the updates a functional op `n` makes inside a callee
        whose graphs were not recorded, read off the callee's FunctionDef ([] for other nodes)."""
        attrs, offset = _CALLS.get(n.op, ((), 0))
        data = [i for i in n.input if not i.startswith("^")]
        out = []
        for attr in attrs:
            for f in _function_names(n, attr):
                if f in self.captured or _unspecialized(f) in self.captured:
                    continue  # its own graphs were recorded: their update ops count there
                f = self._defined_as(f, len(data) - offset)
                if f is None:
                    continue
                for index, count in _updated_args(self.library, f, update_re, 0).items():
                    if offset + index < len(data):
                        out.append((data[offset + index], count))
        return out

    def _defined_as(self, fname: str, args: int) -> str | None:
        """The library's name for a called function: grappler renames the copy it specializes for
        one call ('<f>_specialized_for_<call>'), which keeps the arguments when their count does."""
        if fname in self.library:
            return fname
        base = _unspecialized(fname)
        fdef = self.library.get(base)
        return base if fdef is not None and len(fdef.signature.input_arg) == args else None

    def _call_inputs(self, gi: int, index: int) -> list[tuple[int, str, int]]:
        """The inputs the functional ops calling graph `gi`'s function passed as argument `index`."""
        out = []
        for cgi, call, offset in self.callers.get(self.function_of[gi], ()):
            data = [i for i in call.input if not i.startswith("^")]
            if offset + index < len(data):
                out.append((cgi, *split_input(data[offset + index])))
        return out


def _may_carry_resource(n, port: int) -> bool:
    """False when the node's type attrs say its output `port` is not a resource (so a walk from
    any tensor input, as the op graph's, stops at once on a float tensor's Identity or Switch)."""
    for key in ("T", "tensor_type"):
        if key in n.attr:
            value = n.attr[key]
            if value.HasField("list"):
                types = list(value.list.type)
                return port >= len(types) or types[port] == DT_RESOURCE
            return value.type == DT_RESOURCE
    return True


def _unspecialized(fname: str) -> str:
    """'<f>_specialized_for_<call>' (grappler's copy of <f> for one call) -> '<f>'."""
    return fname.split("_specialized_for_", 1)[0]


def _updated_args(library: dict, fname: str, update_re, depth: int) -> Counter:
    """Argument index -> update ops on it in FunctionDef `fname` (and the functions it calls)."""
    fdef = library.get(fname)
    if fdef is None or depth > 8:
        return Counter()
    args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
    nodes = {n.name: n for n in fdef.node_def}
    out: Counter = Counter()
    for n in fdef.node_def:
        data = [i for i in n.input if not i.startswith("^")]
        if update_re.match(n.op) and data:
            index = _arg_index(data[0], args, nodes)
            if index is not None:
                out[index] += 1
        attrs, offset = _CALLS.get(n.op, ((), 0))
        for attr in attrs:
            for f in _function_names(n, attr):
                for i, count in _updated_args(library, f, update_re, depth + 1).items():
                    index = _arg_index(data[offset + i], args, nodes) if offset + i < len(data) else None
                    if index is not None:
                        out[index] += count
    return out


def _arg_index(inp: str, args: dict, nodes: dict) -> int | None:
    """The argument a FunctionDef input ('x', 'node:output:0') comes from through pass-through ops."""
    for _ in range(MAX_STEPS):
        parts = inp.lstrip("^").split(":")
        if parts[0] in args:
            return args[parts[0]]
        n = nodes.get(parts[0])
        data = [i for i in n.input if not i.startswith("^")] if n is not None else []
        if n is None or not data:
            return None
        port = int(parts[-1]) if len(parts) == 3 and parts[-1].isdigit() else 0
        if n.op == "IdentityN" and port < len(data):
            inp = data[port]
        elif n.op in HANDLE_FORWARD:
            inp = data[0]
        else:
            return None
    return None


def _edge_key(n) -> tuple:
    """What pairs a _Recv with its _Send: the edge's tensor name and its two ends."""
    a = n.attr
    return (a["tensor_name"].s, a["send_device"].s, a["recv_device"].s, a["send_device_incarnation"].i)


def _function_names(n, attr: str) -> list[str]:
    if attr not in n.attr:
        return []
    value = n.attr[attr]
    if value.HasField("func"):
        return [value.func.name]
    return [f.name for f in value.list.func]
