"""Cross-device transfers of a captured step: every _Send/_Recv pair between devices (sized from
dtype x static shape), the trainer loop's own control signals, and the collectives; then the
mean over the captured steps."""

from __future__ import annotations

from collections import Counter, defaultdict

from pinpoint.device_names import DeviceMap, is_pipeline_host, normalize, sort_key
from pinpoint.placement.analysis.roundtrips import round_trips
from pinpoint.placement.graphs.ops import (
    BOOKKEEPING,
    BROADCAST,
    COLLECTIVE_TRAFFIC_RE,
    INPUT_SOURCES,
    LOOP_ATTR,
    SAME_SHAPE,
    SENDS,
    SWITCHES,
    TRANSPORT,
    dtype_size,
    shape_bytes,
)
from pinpoint.placement.graphs.shapes import DEAD_BRANCH
from pinpoint.placement.model.schema import json_number
from pinpoint.tfcompat.graphs import FUSED_BIAS_GRAD


def _shape_of(name: str, index: int, cap, nodes: dict, depth: int = 0) -> list[int] | None:
    outs = cap.shapes.get(name)
    if outs and index < len(outs) and outs[index][1] is not None:
        return outs[index][1]
    ext = cap.arg_values.get(name)  # a function argument: the captured tensor it was fed
    if ext is not None and getattr(ext, "dtype", None) is not None and ext.dtype.name not in ("resource", "variant"):
        try:
            return [int(d) for d in ext.shape]
        except (TypeError, ValueError):
            pass
    n = nodes.get(name)
    if n is not None:
        if n.op in FUSED_BIAS_GRAD and index == 1 and depth < 8:
            kernel = _shape_of(name, 0, cap, nodes, depth + 1)
            return [kernel[-1]] if kernel else None
        if n.op == "Const" and "value" in n.attr:
            return [d.size for d in n.attr["value"].tensor.tensor_shape.dim]
        if "_output_shapes" in n.attr and index < len(n.attr["_output_shapes"].list.shape):
            shp = n.attr["_output_shapes"].list.shape[index]
            if not shp.unknown_rank:
                return [d.size for d in shp.dim]
        if n.op in SAME_SHAPE and index == 0 and depth < 8:
            for inp in n.input:
                if not inp.startswith("^"):
                    iname, _, idx = inp.partition(":")
                    shape = _shape_of(iname, int(idx or 0), cap, nodes, depth + 1)
                    if shape is not None:
                        return shape
        if n.op in SWITCHES and index in (0, 1) and depth < 8:
            # A lowered cond's Switch forwards its data input to the branch taken, either output.
            data = next((i for i in n.input if not i.startswith("^")), None)
            if data is not None:
                iname, _, idx = data.partition(":")
                return _shape_of(iname, int(idx or 0), cap, nodes, depth + 1)
        if n.op in BROADCAST and index == 0 and depth < 8:
            shapes = []
            for inp in (i for i in n.input if not i.startswith("^")):
                iname, _, idx = inp.partition(":")
                shapes.append(_shape_of(iname, int(idx or 0), cap, nodes, depth + 1))
            if len(shapes) == 2 and all(sh is not None and None not in sh and min(sh, default=0) >= 0 for sh in shapes):
                import numpy as np

                try:
                    return [int(d) for d in np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[1]))]
                except ValueError:
                    return None
    return None


def graph_nodes(cap) -> dict:
    """Node name -> NodeDef over a capture's partition graphs (and, for names only they have, its
    pre-placement graphs): what `tensor_bytes` looks shapes up in."""
    nodes = {}
    for pre in cap.requested_graphs:
        for n in pre.node:
            nodes.setdefault(n.name, n)
    for g in cap.partition_graphs:
        for n in g.node:
            nodes[n.name] = n
    return nodes


def tensor_bytes(tensor: str, cap, nodes: dict, dtype: int | None = None) -> int | None:
    """The bytes of tensor "op" / "op:k" of a captured step (dtype x static shape, as a transfer
    is sized); `dtype` (an enum) when the caller knows it, else the traced graph's or the node's."""
    name, _, idx = tensor.partition(":")
    index = int(idx or 0)
    if dtype is None:
        outs = cap.shapes.get(name)
        if outs and index < len(outs):
            dtype = outs[index][0]
        else:
            n = nodes.get(name)
            attr = next((n.attr[k] for k in ("T", "dtype") if n is not None and k in n.attr), None)
            dtype = attr.type if attr is not None and attr.WhichOneof("value") == "type" else None
    if dtype is None:
        return None
    return shape_bytes(dtype_size(dtype), _shape_of(name, index, cap, nodes))


def step_transfers(cap, namer: DeviceMap) -> dict:
    """One step's cross-device transfers, counted on the sending side."""
    nodes = graph_nodes(cap)
    consumers = _consumers(cap)
    count = nbytes = sized = 0
    why: Counter = Counter()
    matrix: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes": 0}))
    items = []
    loop = {"count": 0, "bytes": 0}
    dead = _dead(cap)
    for g in cap.partition_graphs:
        for n in g.node:
            if n.op not in SENDS:
                continue
            src = normalize(n.attr["send_device"].s.decode())
            dst = normalize(n.attr["recv_device"].s.decode())
            if src == dst:
                continue
            dsize = dtype_size(n.attr["T"].type) if "T" in n.attr else None
            if n.attr[LOOP_ATTR].b:
                # The multi-step loop's own predicate/control signal to each device: a real
                # per-step transfer, but the trainer's, not the model's; reported apart.
                loop["count"] += 1
                loop["bytes"] += dsize or 0
                continue
            count += 1
            s, d = namer.canonical_spec(src), namer.canonical_spec(dst)
            cell = matrix[s][d]
            cell["count"] += 1
            inp = n.input[0].lstrip("^") if n.input else ""
            name, _, idx = inp.partition(":")
            size = shape_bytes(dsize, _shape_of(name, int(idx or 0), cap, nodes) if name else None)
            if size and name in dead:
                # A tensor of a branch that did not run is never produced: no data moved (its reason
                # says so); a control signal (0 B) is sent either way.
                size = None
            if size is not None:
                sized += 1
                nbytes += size
                cell["bytes"] += size
            item = {"tensor": inp, "from": s, "to": d, "bytes": size,
                    "consumers": consumers.get(n.attr["tensor_name"].s.decode(), [])}
            if size is None:
                item["unsized_reason"] = unsized_reason(name, dsize, n, cap)
                why[item["unsized_reason"]] += 1
            items.append(item)
    return {
        "count": count,
        "bytes": nbytes,
        "sized": sized,
        "matrix": {s: dict(row) for s, row in matrix.items()},
        "items": items,
        "collectives": _collectives(cap, namer, nodes),
        "loop_control": loop,
        "unsized_reasons": dict(why),
        "sizing_errors": list(getattr(cap, "sizing_errors", None) or ()),
        "input": input_copies(cap, namer, nodes),
        "round_trips": round_trips(cap.partition_graphs, namer, lambda send: _send_bytes(send, cap, nodes), dead),
    }


def _send_bytes(send, cap, nodes: dict) -> int | None:
    name, _, idx = send.input[0].lstrip("^").partition(":")
    return shape_bytes(dtype_size(send.attr["T"].type) if "T" in send.attr else None, _shape_of(name, int(idx or 0), cap, nodes))


INPUT_VIA = ("the input pipeline runs on the host; its iterator on this device (a distributed iterator's "
             "prefetch: RemoteCall from the host, prefetch_to_device or copy_to_device) copied the element "
             "here before the step read it")


def input_copies(cap, namer: DeviceMap, nodes: dict) -> list[dict]:
    """The input elements a step read on a device other than the host: tf.data runs on the host, so
    each was copied there by the iterator outside the step (no _Send in the step shows it). One item
    per source op that ran: its device, bytes (None: unsized, with the reason) and where the copy ran."""
    out = []
    dead = _dead(cap)
    for g in cap.partition_graphs:
        for n in g.node:
            if n.op not in INPUT_SOURCES or n.name in dead:  # the iterator resource is where they run
                continue
            dev = namer.canonical_spec(n.device)
            if is_pipeline_host(dev):
                continue
            types = list(n.attr["output_types"].list.type) if "output_types" in n.attr else []
            sizes = [tensor_bytes(f"{n.name}:{i}", cap, nodes, t) for i, t in enumerate(types)]
            item = {"op": n.name, "to": dev, "bytes": None if None in sizes else sum(sizes), "components": sizes,
                    "via": INPUT_VIA}
            if item["bytes"] is None:
                item["unsized_reason"] = unsized_reason(n.name, 0, n, cap)
            out.append(item)
    return out + _input_args(cap, namer)


def _input_args(cap, namer: DeviceMap) -> list[dict]:
    """The step's arguments that an eager iterator op handed out on a device (placement.capture)."""
    from pinpoint.tfcompat.api import device_of

    ids = getattr(cap, "input_arg_ids", None) or set()
    out = []
    for name, value in (cap.arg_values.items() if ids else ()):
        dev = namer.canonical_spec(device_of(value))
        if id(value) not in ids or is_pipeline_host(dev):
            continue
        size = int(value.dtype.size) * int(value.shape.num_elements() or 0)
        out.append({"op": name, "to": dev, "bytes": size, "components": [size],
                    "via": INPUT_VIA})
    return out


def _dead(cap) -> set[str]:
    """The nodes of cond branches that did not run in the captured call (placement.runshapes)."""
    return {name for name, why in (getattr(cap, "unsized_why", None) or {}).items() if why == DEAD_BRANCH}


def _consumers(cap) -> dict[str, list[str]]:
    """Which ops consume each transferred tensor: the nodes reading the matching _Recv."""
    consumers: dict[str, list[str]] = defaultdict(list)
    for g in cap.partition_graphs:
        recvs = {n.name: n.attr["tensor_name"].s.decode() for n in g.node if n.op in TRANSPORT - SENDS}
        for n in g.node:
            for i in n.input:
                key = recvs.get(i.lstrip("^").split(":")[0])
                if key and n.op not in BOOKKEEPING:
                    consumers[key].append(n.name)
    return consumers


def _collectives(cap, namer: DeviceMap, nodes: dict) -> dict[str, dict[str, int]]:
    """Collective ops (all-reduce, all-gather, broadcast) move data between replicas outside the
    _Send/_Recv pairs (ring/NCCL/gRPC): counted per device with the size of their input."""
    coll: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    for g in cap.partition_graphs:
        for n in g.node:
            if not COLLECTIVE_TRAFFIC_RE.match(n.op) or not n.input:
                continue
            dev = namer.canonical_spec(n.device)
            coll[dev]["count"] += 1
            name, _, idx = n.input[0].lstrip("^").partition(":")
            size = shape_bytes(dtype_size(n.attr["T"].type) if "T" in n.attr else None,
                          _shape_of(name, int(idx or 0), cap, nodes))
            coll[dev]["bytes"] += size or 0
    return {d: dict(c) for d, c in coll.items()}


def unsized_reason(name: str, dsize: int | None, send, cap) -> str:
    """Why a transfer has no size: what the summary prints beside the figure."""
    import tensorflow as tf

    dtypes = tf.dtypes

    if dsize is None:
        dtype = dtypes.as_dtype(send.attr["T"].type).name if "T" in send.attr else "unknown"
        return f"a {dtype} tensor: its bytes are not fixed by its shape"
    known = (getattr(cap, "unsized_why", None) or {}).get(name)
    if known:
        return known
    return ("a dynamic shape (data-dependent, or derived from one) that the runtime does not report for a "
            "tf.function call")


def _reasons(steps: list[dict], n: int) -> dict:
    total: Counter = Counter()
    for st in steps:
        total.update(st.get("unsized_reasons") or {})
    return {r: json_number(c / n) for r, c in total.most_common()}


def merge_transfer_steps(steps: list[dict], step_ids: list[list[int]] | None = None) -> dict:
    """Mean over the captures; `steps` lists every captured step (a capture of a multi-step
    function stands for each step it ran in the sample window: they executed the same graphs)."""
    n = max(len(steps), 1)
    matrix: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes": 0}))
    for st in steps:
        for s, row in st["matrix"].items():
            for d, cell in row.items():
                matrix[s][d]["count"] += cell["count"]
                matrix[s][d]["bytes"] += cell["bytes"]
    matrix_out = {
        s: {d: {"count": json_number(c["count"] / n), "bytes": json_number(c["bytes"] / n)} for d, c in sorted(row.items(), key=lambda kv: sort_key(kv[0]))}
        for s, row in sorted(matrix.items(), key=lambda kv: sort_key(kv[0]))
    }
    count = sum(st["count"] for st in steps)
    coll: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    for st in steps:
        for d, c in st.get("collectives", {}).items():
            coll[d]["count"] += c["count"]
            coll[d]["bytes"] += c["bytes"]
    largest = sorted(
        (it for it in (steps[0]["items"] if steps else [])), key=lambda it: -(it["bytes"] or 0)
    )[:25]
    return {
        "per_step": {
            "count": json_number(count / n),
            "bytes": json_number(sum(st["bytes"] for st in steps) / n),
            "sized": json_number(sum(st["sized"] for st in steps) / n),
            "unsized": json_number((count - sum(st["sized"] for st in steps)) / n),
        },
        # Why the unsized transfers have no size (reason -> transfers per step).
        "unsized_reasons": _reasons(steps, n),
        "matrix": matrix_out,
        "collectives": {
            d: {"count": json_number(c["count"] / n), "input_bytes": json_number(c["bytes"] / n)}
            for d, c in sorted(coll.items(), key=lambda kv: sort_key(kv[0]))
        },
        "steps": [{"step": sid, "count": st["count"], "bytes": st["bytes"], "sized": st["sized"]}
                  for st, ids in zip(steps, step_ids or [[None]] * len(steps), strict=True) for sid in ids],
        "loop_control": {
            "count": json_number(sum(st.get("loop_control", {}).get("count", 0) for st in steps) / n),
            "bytes": json_number(sum(st.get("loop_control", {}).get("bytes", 0) for st in steps) / n),
        },
        "largest": largest,
        # Where sizing failed, once each over the captures.
        "sizing_errors": list(dict.fromkeys(e for st in steps for e in st.get("sizing_errors") or ())),
        "input": _merge_input(steps, n),
        "round_trips": list(steps[0].get("round_trips") or ()) if steps else [],
    }


def _merge_input(steps: list[dict], n: int) -> dict:
    """Input copies per step: bytes per device (mean over the captures) and the first step's items."""
    per: dict[str, float] = defaultdict(float)
    unsized = 0
    for st in steps:
        for it in st.get("input") or ():
            per[it["to"]] += it["bytes"] or 0
            unsized += it["bytes"] is None
    return {"per_step": {d: json_number(b / n) for d, b in sorted(per.items(), key=lambda kv: sort_key(kv[0]))},
            "unsized": json_number(unsized / n), "items": list(steps[0].get("input") or ()) if steps else []}
