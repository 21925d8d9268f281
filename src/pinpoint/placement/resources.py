"""Follow a resource input in a capture's partition graphs back to the variable handle it carries.

A variable's handle reaches the op that updates it through ops that pass it on unchanged: an
identity, a lowered cond's Switch and Merge, a lowered loop's Enter, Exit and NextIteration, a
_Recv from another device's _Send, and a function argument (the handle the call was given, or,
in a function the runtime instantiated on its own, the call op's input: an If's branch, a
While's body, a PartitionedCall's callee). A loss-scale optimizer applies its gradients inside a
cond, so its updates reach their variables only through these.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

# Ops whose every output is their first input (a Switch's two outputs, a lowered loop's frames).
_FORWARD_FIRST = {"Identity", "Switch", "RefSwitch", "Enter", "RefEnter", "Exit", "RefExit",
                  "NextIteration", "RefNextIteration", "_SwitchN"}
_MERGES = {"Merge", "RefMerge"}
_RECVS = {"_Recv", "_HostRecv"}
_SENDS = {"_Send", "_HostSend"}
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
    """Where a resource came from: a function argument (its node's name) or a VarHandleOp."""

    arg: str | None = None
    shared_name: str | None = None


def split_input(inp: str) -> tuple[str, int]:
    """'node:2' -> ('node', 2); 'node' -> ('node', 0)."""
    name, _, port = inp.lstrip("^").partition(":")
    return name, int(port) if port.isdigit() else 0


class ResourceTracer:
    """The partition graphs of one capture, indexed to follow resources across them."""

    def __init__(self, functions, arg_values):
        # functions: [(function name, pre-optimization graph, [partition graphs])] (CapturedGraphs)
        self.arg_values = arg_values
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
            if n.op in _SENDS:
                self.sends[_edge_key(n)] = (gi, n)
            for attr in _CALLS.get(n.op, ((), 0))[0]:
                for f in _function_names(n, attr):
                    self.callers[f].append((gi, n, _CALLS[n.op][1]))

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
            return Source(shared_name=n.attr["shared_name"].s.decode())
        if n.op == "_Arg":
            if n.name in self.arg_values:
                return Source(arg=n.name)
            todo.extend(self._call_inputs(gi, n.attr["index"].i))
            return None
        if n.op in _FORWARD_FIRST and data:
            todo.append((gi, *split_input(data[0])))
        elif n.op == "IdentityN" and port < len(data):
            todo.append((gi, *split_input(data[port])))
        elif n.op in _MERGES:
            # Either branch's value: the first input pushed last, so it is followed first.
            todo.extend((gi, *split_input(i)) for i in reversed(data))
        elif n.op in _RECVS:
            sent = self.sends.get(_edge_key(n))
            if sent is not None and sent[1].input:
                todo.append((sent[0], *split_input(sent[1].input[0])))
        return None

    def _call_inputs(self, gi: int, index: int) -> list[tuple[int, str, int]]:
        """The inputs the functional ops calling graph `gi`'s function passed as argument `index`."""
        out = []
        for cgi, call, offset in self.callers.get(self.function_of[gi], ()):
            data = [i for i in call.input if not i.startswith("^")]
            if offset + index < len(data):
                out.append((cgi, *split_input(data[offset + index])))
        return out


DT_RESOURCE = 20  # types_pb2.DT_RESOURCE


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
