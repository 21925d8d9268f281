"""Round trips: a tensor that leaves its device and comes back within one step.

A tensor made on device A is sent to B, where only ops that pass it on (a cond's Merge or
Switch, an Identity) touch it, and what they pass on is sent back to A. The bytes cross twice
and nothing on B needed them. Each round trip names the op on B that forced it, the placement
rule that put that op there, and what would avoid it.
"""

from __future__ import annotations

from pinpoint.device_names import DeviceMap
from pinpoint.placement.graphs.ops import INPUT_SOURCES, PASS_ON, RECVS, SENDS, tensor

RULES = {
    "Merge": ("a lowered tf.cond joins its branches in a Merge that has no device request of its own, so the "
              "placer puts it on the default device (the first GPU), not on the device of the branch that ran"),
    "Switch": ("a lowered tf.cond forks its inputs in a Switch that follows the predicate's device, not the "
               "device of the tensor it forwards"),
    "Identity": "an Identity with no device request runs on the default device (the first GPU)",
}


FIX_INPUT = ("batch the dataset with drop_remainder=True (or repeat it): with static batch shapes the "
             "distributed iterator hands each replica its element without the cond over 'has a value' "
             "whose Merge runs on the first GPU")


FIX_OTHER = "put the op that forced it under the device of the tensor's producer and consumers (tf.device)"


def round_trips(partitions: list, namer: DeviceMap, size_of, dead: set[str] = frozenset()) -> list[dict]:
    """The round trips of one step's partition graphs; `size_of(send)` gives a _Send's bytes. A
    tensor of a cond branch that did not run (`dead`) moved no data: not a round trip."""
    nodes = {n.name: n for g in partitions for n in g.node}
    recv_of = {(n.attr["tensor_name"].s, n.attr["send_device"].s, n.attr["recv_device"].s): n.name
               for n in nodes.values() if n.op in RECVS}
    consumers: dict[str, list[str]] = {}
    for n in nodes.values():
        for i in n.input:
            if not i.startswith("^"):
                consumers.setdefault(tensor(i)[0], []).append(n.name)
    sends_from: dict[str, list] = {}
    for n in nodes.values():
        if n.op in SENDS and n.input:
            sends_from.setdefault(tensor(n.input[0])[0], []).append(n)
    out = []
    for out_send in (n for n in nodes.values() if n.op in SENDS and n.input):
        home, away = out_send.attr["send_device"].s, out_send.attr["recv_device"].s
        if home == away or tensor(out_send.input[0])[0] in dead:
            continue
        recv = recv_of.get((out_send.attr["tensor_name"].s, home, away))
        if recv is None:
            continue
        forced, back = _passed_back(recv, home, nodes, consumers, sends_from)
        if back is None:
            continue
        source = _source(tensor(out_send.input[0])[0], nodes)
        op = nodes[forced]
        rule = RULES.get(op.op.removeprefix("Ref"), f"a {op.op} with no device request of its own runs on the default device")
        out.append({"tensor": out_send.input[0], "home": namer.canonical_spec(home.decode()),
                    "via": namer.canonical_spec(away.decode()), "op": forced, "op_type": op.op,
                    "bytes": size_of(out_send), "input": source is not None, "rule": rule,
                    "fix": FIX_INPUT if source is not None and op.op in ("Merge", "RefMerge") else FIX_OTHER})
    return out


def _passed_back(recv: str, home: bytes, nodes: dict, consumers: dict, sends_from: dict):
    """(the first op on the far device that passed the received tensor on, the _Send taking it back
    home), following only ops that pass it on unchanged; (None, None) when it is used there."""
    seen, stack = set(), [(recv, None)]
    while stack:
        name, first = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for send in sends_from.get(name, ()):
            if first is not None and send.attr["recv_device"].s == home:
                return first, send
        for c in consumers.get(name, ()):
            if nodes[c].op in PASS_ON:
                stack.append((c, first or c))
    return None, None


def _source(name: str, nodes: dict, depth: int = 0) -> str | None:
    """The input element op a tensor passes on unchanged (through forwarding ops), or None."""
    n = nodes.get(name)
    if n is None or depth > 32:
        return None
    if n.op in INPUT_SOURCES:
        return name
    if n.op in PASS_ON | RECVS:
        if n.op in RECVS:
            return None
        data = [i for i in n.input if not i.startswith("^")]
        for i in data[:1] if n.op not in ("Merge", "RefMerge") else data:
            found = _source(tensor(i)[0], nodes, depth + 1)
            if found:
                return found
    return None
