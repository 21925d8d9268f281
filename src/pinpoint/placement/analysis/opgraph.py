"""The captured step as a graph: what each per-op row of placement_ops.json.gz records beyond
{op, type, device}, for `pinpoint plan` (pinpoint.plan.build reads it).

Per op of the first captured step: `inputs` (its data inputs as [producer tensor, bytes], the
producer found across the _Send/_Recv pairs the partitioner inserted, so an edge crossing devices
names the op that made the tensor), `requested` (the device the graph asked for, "" for none),
`colocation` (its `_class` colocation groups), `layer` (the train.pinning.layers key it belongs
to), `kernel_devices` (device types with a kernel for it) and, when the steps were timed, `us`
(its own time per step). An op fed by an argument of the step function (the trainer's step counter,
fed on the host) also has `args`: [[argument, bytes, device]], the runtime sends those like any
tensor, so the planner counts them (on the host, with the input pipeline). Built once, after
training, from the CapturedGraphs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pinpoint.device_names import DeviceMap
from pinpoint.layer_keys import LayerPins
from pinpoint.placement.analysis.transfers import graph_nodes, tensor_bytes
from pinpoint.placement.graphs.captured import requested_defs, requested_devices
from pinpoint.placement.graphs.ops import BOOKKEEPING, IDENTITIES, REASSOCIATED, SENDS, TRANSPORT, XLA_ATTR

DEVICE_TYPES = ("CPU", "GPU")


# Keras makes a scope unique inside a tf.function by a numeric suffix ("dense_1" -> "dense_1_1").
_SUFFIX = re.compile(r"_\d+$")


def add_graph_fields(rows: list[dict], cap, namer: DeviceMap, *, layer_of: Callable[[str], str | None],
                     op_us: Mapping[str, float] | None = None,
                     resource_layers: Mapping[str, str] | None = None) -> None:
    """Add the graph fields to `rows` (the capture's op rows, in place). `layer_of`: op name -> its
    layer key (a LayerMatcher); `op_us`: each op's µs per step (None: not timed, no `us`);
    `resource_layers`: op -> the layer of the variable it reads or updates, for ops outside every
    layer's scope (an optimizer's updates go with their variable's layer)."""
    nodes = graph_nodes(cap)
    defs = requested_defs(cap)
    requested = requested_devices(cap)
    producers = _producers(cap)
    names = {r["op"] for r in rows}
    for row in rows:
        name = row["op"]
        node = nodes.get(name)
        pre = defs.get(name)
        row["inputs"] = _inputs(node, producers, names, cap, nodes) if node is not None else []
        if node is not None and pre is not None and node.op == pre.op and node.op in REASSOCIATED:
            requested_inputs = _requested_inputs(pre, defs, getattr(cap, "def_names", None) or {}, names, cap, nodes)
            if requested_inputs is not None and {t for t, _ in requested_inputs} != {t for t, _ in row["inputs"]}:
                row["inputs"] = requested_inputs
        args = _arg_inputs(node, producers, cap, nodes, namer) if node is not None else []
        if args:
            row["args"] = args
        row["requested"] = namer.canonical_spec(requested.get(name, ""))
        row["colocation"] = _colocation(pre if pre is not None and "_class" in pre.attr else node)
        row["layer"] = layer_of(name) or (resource_layers or {}).get(name)
        row["kernel_devices"] = kernel_devices(node, pre)
        if op_us is not None:
            row["us"] = op_us.get(name, 0.0)
    colocated_layers(rows, layer_of)


def colocated_layers(rows: list[dict], layer_of: Callable[[str], str | None]) -> None:
    """Give an op outside every layer's scope the layer of the op TensorFlow keeps it with (its
    colocation group), in place. The gradient aggregation "gradients/AddN_3", colocated with the
    forward op whose uses it sums, goes where that op goes: it belongs to its layer. That op may
    not have run under its own name (grappler rewrote a residual block's Add into AddOpsRewrite
    nodes): its name still says whose it is."""
    layer = {r["op"]: r["layer"] for r in rows}

    def owner(op: str) -> str | None:
        return layer[op] if op in layer else layer_of(op)

    for row in rows:
        if row["layer"] is None:
            row["layer"] = next((owner(c) for c in row["colocation"] if owner(c)), None)


def _producers(cap) -> dict[tuple[str, str, str], tuple[str, int | None]]:
    """(tensor_name, send device, recv device) of each _Send -> (the tensor it sends, its dtype)."""
    out = {}
    for g in cap.partition_graphs:
        for n in g.node:
            if n.op in SENDS and n.input:
                out[_edge_key(n)] = (n.input[0].lstrip("^"), n.attr["T"].type if "T" in n.attr else None)
    return out


def _edge_key(n) -> tuple[str, str, str]:
    return (n.attr["tensor_name"].s.decode(), n.attr["send_device"].s.decode(), n.attr["recv_device"].s.decode())


def _inputs(node, producers: dict, names: set, cap, nodes: dict) -> list[list]:
    """[[producer tensor, bytes or None], ...] over the node's data inputs; a _Recv is followed to
    the tensor its _Send sent; inputs from no op row (function arguments, the loop's own
    machinery) are left out."""
    out = []
    for tensor, dtype in _sources(node, producers, nodes):
        if tensor.partition(":")[0] in names:
            out.append([tensor, tensor_bytes(tensor, cap, nodes, dtype)])
    return out


def _requested_inputs(pre, defs: dict, def_names: Mapping[str, str], names: set, cap, nodes: dict) -> list[list] | None:
    """The data inputs the graph asked for, as _inputs gives them, each followed through the
    identities grappler removed; None when one is not a tensor of an op that ran."""
    out = []
    for inp in pre.input:
        if inp.startswith("^"):
            continue
        tensor = _tensor_name(inp, defs, def_names)
        for _ in range(8):
            if tensor is None:
                return None
            op, _, index = tensor.partition(":")
            if op in names:
                break
            src = defs.get(op)
            if src is None or src.op not in IDENTITIES:
                return None
            data = [i for i in src.input if not i.startswith("^")]
            k = int(index or 0) if src.op == "IdentityN" else 0
            if k >= len(data):
                return None
            tensor = _tensor_name(data[k], defs, def_names)
        else:
            return None
        nbytes = tensor_bytes(tensor, cap, nodes, None)
        if nbytes is None:
            return None
        out.append([tensor, nbytes])
    return out


def _tensor_name(inp: str, defs: dict, def_names: Mapping[str, str]) -> str | None:
    """A NodeDef input as a tensor name of the step's rows: "op" for output 0, else "op:k". A
    function body names "op:out_arg:k" by its own node names, k counted in that output argument:
    taken when it is the op's first (its outputs start there), else None."""
    parts = inp.split(":")
    op = def_names.get(parts[0], parts[0])
    k = int(parts[-1]) if len(parts) > 1 else 0
    if len(parts) == 3 and parts[1] != _first_output_arg(defs.get(op)):
        return None
    return op if k == 0 else f"{op}:{k}"


def _first_output_arg(node) -> str | None:
    if node is None:
        return None
    from pinpoint.tfcompat.api import op_def as registered  # the capture runs where TF is loaded

    op_def = registered(node.op)
    return op_def.output_arg[0].name if op_def is not None and op_def.output_arg else None


def _sources(node, producers: dict, nodes: dict) -> list[tuple[str, int | None]]:
    """(producer tensor, dtype or None) of each data input, a _Recv followed to what its _Send sent."""
    out = []
    for inp in node.input:
        if inp.startswith("^"):
            continue
        tensor, dtype = inp, None
        for _ in range(8):  # a received tensor may itself have been received
            src = nodes.get(tensor.partition(":")[0])
            if src is None or src.op not in TRANSPORT - SENDS:
                break
            tensor, dtype = producers.get(_edge_key(src), (None, None))
            if tensor is None:
                break
        if tensor is not None:
            out.append((tensor, dtype))
    return out


def _arg_inputs(node, producers: dict, cap, nodes: dict, namer: DeviceMap) -> list[list]:
    """[[argument, bytes, device], ...]: the node's data inputs that are arguments of the step
    function (an _Arg, followed across _Send/_Recv), with the device the argument lives on."""
    out = []
    for tensor, dtype in _sources(node, producers, nodes):
        src = nodes.get(tensor.partition(":")[0])
        if src is not None and src.op == "_Arg":
            out.append([tensor, tensor_bytes(tensor, cap, nodes, dtype), namer.canonical_spec(src.device)])
    return out


def _colocation(node) -> list[str]:
    """The ops this op must share a device with: its `_class` attr's "loc:@name" entries."""
    if node is None or "_class" not in node.attr:
        return []
    return [s.decode().removeprefix("loc:@") for s in node.attr["_class"].list.s if s.startswith(b"loc:@")]


def kernel_devices(node, pre) -> list[str] | None:
    """Device types with a registered kernel for the op the graph asked for (its pre-placement type
    and attrs: a grappler-fused or oneDNN-rewritten node is its original op on a GPU machine);
    None for a node the graph did not ask for (grappler made it for the device it found, e.g. a
    CPU-only _UnaryOpsComposition), and when the registry knows no kernel for it anywhere (a
    function call, an op a graph pass rewrites, XLA's)."""
    from pinpoint.kernels import has_kernel
    from pinpoint.tfcompat.api import op_def

    if pre is None or (node is not None and XLA_ATTR in node.attr) or op_def(pre.op) is None:
        return None
    found = [d for d in DEVICE_TYPES if has_kernel(pre.op, pre.attr, d)]
    return found or None


class LayerMatcher:
    """Op (or variable) name -> the train.pinning.layers key of the layer it belongs to.

    An op belongs to the deepest layer whose path appears as consecutive name-scope components of
    its name, each one the layer's name or that name with Keras' uniquifying suffix ("dense_1" as
    "dense_1_1"); backward ops carry their layer's scopes ("gradient_tape/mlp/dense_1/..."), so
    they belong to it too (and so does an op colocated with one of its ops: add_graph_fields).
    A pinned layer's key is its pin's key (a pattern key groups its layers);
    another layer's key is its path (`units`). Names are matched exactly before a suffix is
    stripped, so "dense_1_1" is layer dense_1 when the model has one."""

    def __init__(self, units: Iterable[str], pins: LayerPins | None):
        self.paths: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        owned = dict(pins.owner) if pins is not None else {}
        for path in [*units, *owned]:
            parts = tuple(path.split("/"))
            key = owned.get(path) or next((owned[p] for p in _ancestors(path) if p in owned), path)
            entry = (parts, key)
            bucket = self.paths.setdefault(parts[0], [])
            if entry not in bucket:
                bucket.append(entry)

    def __call__(self, name: str) -> str | None:
        if not self.paths:
            return None
        comps = name.split("/")[:-1]  # the last component is the op's own name
        best: tuple[int, int, str] | None = None
        for i, comp in enumerate(comps):
            for cand in _candidates(comp):
                for parts, key in self.paths.get(cand, ()):
                    end = i + len(parts)
                    if end <= len(comps) and all(p in _candidates(c) for p, c in zip(parts[1:], comps[i + 1:end])):
                        if best is None or (end, len(parts)) > best[:2]:
                            best = (end, len(parts), key)
                if self.paths.get(cand):
                    break  # an exact name wins over the same name less a suffix
        return best[2] if best else None


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _candidates(comp: str) -> list[str]:
    """A scope component and the layer names it may stand for: itself, less one or two suffixes."""
    out = [comp]
    for _ in range(2):
        stripped = _SUFFIX.sub("", out[-1])
        if stripped == out[-1] or not stripped:
            break
        out.append(stripped)
    return out


def resource_variables(cap, variables: Iterable[Any]) -> dict[str, str]:
    """Op name -> the variable (placement.json's name) whose handle it takes, over the capture's
    resource ops: each resource input followed back to its function argument, whose captured value
    is one variable component's handle (as update ops are attributed, placement.variables)."""
    from pinpoint.placement.analysis.variables import components, unwrap, var_name, variable_of
    from pinpoint.placement.graphs.resources import ResourceTracer

    handles = {}
    for v in variables:
        for c in components(unwrap(v)):
            handle = getattr(c, "handle", None)
            if handle is not None:
                handles[id(handle)] = var_name(v)
    out = {}
    tracer = ResourceTracer(cap.functions, cap.arg_values)
    for gi, nodes in enumerate(tracer.graphs):
        for n in nodes.values():
            if n.op in BOOKKEEPING:
                continue
            for inp in n.input:
                if inp.startswith("^"):
                    continue
                name = variable_of(tracer.source(inp, gi), cap.arg_values, handles, {})
                if name is not None:
                    out[n.name] = name
                    break
    return out
