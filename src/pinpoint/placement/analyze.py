"""Turn captured partition graphs into placement.json: where every op, variable and gradient ran.

Runs once, after training (never on the hot path). Input: the CapturedGraphs of the sampled
steps (each capture is one executed step), the model's and optimizer's variables, the pinning
plan and the device map. Every device is reported by its spec name ("/GPU:0") and the
physical name it ran on is kept in `physical_devices` / `device_aliases`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from pinpoint.placement.naming import (
    EMULATED_ATTR,
    LOOP_ATTR,
    XLA_ATTR,
    Namer,
    matches,
    metric_key,
    normalize,
    sort_key,
    split_prefix,
)

SCHEMA_VERSION = 1

# Bookkeeping nodes: how data moves between partitions and in/out of a function. Not "ops that
# ran" for counting purposes (transfers are counted separately, from the _Send side).
SENDS = {"_Send", "_HostSend"}
TRANSPORT = SENDS | {"_Recv", "_HostRecv"}
BOOKKEEPING = TRANSPORT | {"_Arg", "_Retval", "_DeviceArg", "_DeviceRetval"}
# Ops that say nothing about where the work ran (constants, control grouping).
NOT_COMPUTE = BOOKKEEPING | {"Const", "NoOp"}
UPDATE_RE = re.compile(
    r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|ResourceSparseApply\w+|ResourceScatter\w+)$"
)
INPUT_RE = re.compile(r"(IteratorGetNext\w*|MultiDeviceIterator\w*|OptionalGetValue|OptionalHasValue|\w*Dataset(V\d)?)$")
# Ops that pass a resource handle through unchanged (followed when attributing an update).
COLLECTIVE_RE = re.compile(r"^(Collective\w+|NcclAllReduce|_NcclReduceSend|_NcclBroadcastSend)$")
_PASS_THROUGH = {"Identity", "IdentityN", "_Recv", "_HostRecv"}

EXPLAIN = {
    "devices": "Devices that executed at least one op (spec names; with emulation each spec GPU "
    "is a logical CPU device, shown alongside).",
    "ops_by_device": "Ops executed per step on each device, read from the partition graphs the runtime "
    "ran (not from op.device, which is only the request). _Send/_Recv/_Arg/_Retval are not counted.",
    "transfers": "Every edge between ops on different devices becomes a _Send/_Recv pair; each pair "
    "is one transfer. Bytes = dtype size x static shape; transfers whose shape could not be resolved "
    "(grappler-renamed nodes, dynamic shapes) are counted but not sized. The trainer's multi-step loop "
    "also sends its predicate and a control signal to each device every step: counted apart as "
    "loop_control.",
    "collectives": "Collective ops (all-reduce, all-gather) exchange data between replicas through "
    "their own channels (rings, NCCL, gRPC), not through _Send/_Recv; counted per device with the size of "
    "the tensor each one reduces.",
    "fallbacks": "An op whose requested device differs from the device it ran on: with soft placement "
    "the placer moves an op when the requested device does not exist, has no kernel for the op, or the op "
    "must be colocated with a resource (variable) on another device. Under GPU emulation an op that ran on "
    "an emulated GPU but has no GPU kernel for its dtypes (TensorFlow's kernel registry) is listed as "
    "predicted: a GPU machine would run it on the host.",
    "variables": "Where each variable lives (every mirrored component; central storage on the host; "
    "parameter-server tasks) and where its update ops (assign/apply) ran. An update always runs on the "
    "variable's device; its input is copied there first.",
    "gradients": "Backward-pass ops (name scopes 'gradients/' and 'gradient_tape/') per device.",
    "replica_consistency": "Largest absolute difference between the components of each mirrored "
    "variable at the end of training; synchronous training keeps it at 0.",
    "conformance": "Each pinning rule: planned device versus the devices the relevant ops really ran "
    "on. Score = fraction of relevant ops on the planned device.",
    "timing": "placement.timing: the sampled steps ran as one call under TensorFlow's profiler; each "
    "kernel event of the trace is attributed to its device through the partition graphs. busy = union of "
    "the device's op intervals (ops overlap on the inter-op threads; work nested inside an op's event, "
    "such as a receiving device's kernels run by a _Send's callback, is not the op's); transfer = union "
    "of its _Send/_Recv and collective intervals (a collective includes waiting for its peers; a receive's "
    "wait for its producer is not counted); compute = busy - transfer; idle_share = 1 - busy / wall, wall "
    "= first op start to last op end of the call. Wall-clock times: with emulation the devices share the "
    "host's cores.",
}


# ----------------------------------------------------------------------------------------------
# public API


def build_placement(
    captures: list,
    *,
    variables: list,
    plan: Any,
    strategy: str,
    device_map: Any,
    task: str = "chief:0",
    gradient_scope: str = "gradients",
    layer_scopes: dict[str, str] | None = None,
    input_scope: str = "input",
) -> dict:
    """placement.json content from the captured steps (see EXPLAIN for each field).

    Input-pipeline ops are dataset/iterator op types plus ops under the `input_scope` name scope
    (an in-graph input pipeline)."""
    namer = Namer(device_map)
    captures = [c for c in captures if c is not None]
    grad_re = gradient_re(gradient_scope)

    per_step_ops: list[Counter] = []
    per_step_types: list[dict[str, Counter]] = []
    per_step_grads: list[Counter] = []
    transfer_steps: list[dict] = []
    seen_devices: set[str] = set()
    seen_physical: set[str] = set()
    fallbacks: dict[str, dict] = {}
    predicted: dict[str, dict] = {}
    ops_detail: list[dict] = []
    emulated_gpus = {normalize(p) for p in namer.aliases.values()} if getattr(device_map, "emulated", False) else set()

    for ci, cap in enumerate(captures):
        ops = Counter()
        types: dict[str, Counter] = defaultdict(Counter)
        grads = Counter()
        requested = requested_devices(cap)
        defs = requested_defs(cap) if emulated_gpus else {}
        for g in cap.partition_graphs:
            for n in g.node:
                dev = namer.spec(n.device)
                if dev:
                    seen_devices.add(dev)
                    seen_physical.add(normalize(n.device))
                if n.op in BOOKKEEPING:
                    continue
                ops[dev] += 1
                types[dev][n.op] += 1
                if grad_re.search(n.name):
                    grads[dev] += 1
                if ci == 0:
                    ops_detail.append({"op": n.name, "type": n.op, "device": dev})
                req = requested.get(n.name)
                if req and not _same_place(req, n.device):
                    fallbacks.setdefault(
                        n.name,
                        {
                            "op": n.name,
                            "op_type": n.op,
                            "requested": namer.spec(req),
                            "requested_physical": normalize(req),
                            "placed": dev,
                            "placed_physical": normalize(n.device),
                        },
                    )
                if emulated_gpus and n.name not in predicted:
                    fb = _predicted_fallback(n, defs.get(n.name), req, namer, emulated_gpus)
                    if fb is not None:
                        predicted[n.name] = fb
        per_step_ops.append(ops)
        per_step_types.append(types)
        per_step_grads.append(grads)
        transfer_steps.append(_transfers(cap, namer))

    known = seen_physical | {normalize(p) for p in namer.aliases.values()}
    for fb in fallbacks.values():
        fb["reason"] = (
            "requested device does not exist"
            if not any(matches(fb["requested_physical"], d) for d in known)
            else "moved by the placer (no kernel for this op there, or colocated with a resource "
            "or input on another device)"
        )

    # Devices the setup already resolved elsewhere (no such device here, soft placement on): every
    # op pinned there was redirected before tracing, so the graphs cannot show it; report it.
    for spec, instead in (getattr(device_map, "fallbacks", None) or {}).items():
        fallbacks.setdefault(
            f"(every op pinned to {spec})",
            {
                "op": f"(every op pinned to {spec})",
                "op_type": "*",
                "requested": spec,
                "requested_physical": spec,
                "placed": namer.spec(instead),
                "placed_physical": normalize(instead),
                "reason": "requested device does not exist on this machine; redirected at device setup "
                "(soft placement)",
            },
        )

    values: dict = {}  # component values, read once for fingerprints and replica consistency
    var_info = _variables(variables, captures, namer, values)
    for v in var_info["variables"]:
        seen_devices.update(v["devices"])
        seen_devices.update(v["update_devices"])
    devices = sorted((d for d in seen_devices if d), key=sort_key)

    conformance = _conformance(
        _as_predicted(ops_detail, predicted), var_info["variables"], plan, strategy, device_map, namer,
        grad_re, layer_scopes, re.compile(rf"(^|/){re.escape(input_scope)}(_\d+)?/"),
    )
    _mark_predicted(conformance, predicted)
    placement = {
        "schema": SCHEMA_VERSION,
        "task": task,
        "strategy": strategy,
        "captured_steps": [s for c in captures for s in (getattr(c, "steps", None) or [c.step])],
        "devices": devices,
        "physical_devices": {d: namer.physical(d) for d in devices},
        "device_aliases": dict(namer.aliases),
        "ops_by_device": _mean_counter(per_step_ops),
        "op_types_by_device": {
            d: _mean_counter([t.get(d, Counter()) for t in per_step_types])
            for d in sorted({d for t in per_step_types for d in t}, key=sort_key)
        },
        "transfers": _merge_transfer_steps(
            transfer_steps, [getattr(c, "steps", None) or [c.step] for c in captures]),
        "fallbacks": sorted(fallbacks.values(), key=lambda f: f["op"])
        + sorted(predicted.values(), key=lambda f: f["op"]),
        "variables": var_info["variables"],
        "variable_updates": var_info["updates"],
        "gradients": {
            "scope": f"{gradient_scope}/ and gradient_tape/",
            "ops_by_device": _mean_counter(per_step_grads),
            "total": _num(sum(sum(c.values()) for c in per_step_grads) / max(len(per_step_grads), 1)),
        },
        # The trainer builds the placement after its last step, so this is the end-of-training check.
        "replica_consistency": _safe_consistency(variables, values),
        "conformance": conformance,
        "layers": _layer_table(conformance, transfer_steps[0]["items"] if transfer_steps else [], plan, layer_scopes),
        "ops": ops_detail,
        "notes": _notes(captures, ops_detail, strategy),
        "explain": EXPLAIN,
    }
    return placement


def _notes(captures: list, ops_detail: list, strategy: str) -> list[str]:
    notes = []
    for cap in captures:
        for note in getattr(cap, "notes", None) or []:
            if note not in notes:
                notes.append(note)
    if not captures:
        notes.append("no step was captured (placement sampling off or training ended before warm-up)")
    elif not ops_detail:
        if strategy == "parameter_server":
            notes.append(
                "no partition graphs on this task: under parameter_server the coordinator schedules each "
                "step as a closure that the worker's own runtime instantiates, so ops, transfers and "
                "gradients are not visible here; variables (on the ps tasks) are"
            )
        else:
            notes.append("the captured call executed no function graphs (was the step function already called?)")
    return notes


def _read(component, cache: dict | None):
    """The component's value as numpy, read once per analysis (consistency and fingerprints)."""
    import numpy as np

    if cache is None:
        return np.asarray(component.numpy())
    key = id(component)
    if key not in cache:
        cache[key] = np.asarray(component.numpy())
    return cache[key]


def replica_consistency(variables: list, cache: dict | None = None) -> dict:
    """Max |component_i - component_0| for every variable with more than one local component."""
    import numpy as np

    per_var: dict[str, float] = {}
    for v in _dedupe(variables):
        comps = _components(_unwrap(v))
        if len(comps) < 2:
            continue
        base = _read(comps[0], cache)
        diff = 0.0
        for c in comps[1:]:
            arr = _read(c, cache)
            if arr.size:
                diff = max(diff, float(np.max(np.abs(arr.astype(np.float64) - base.astype(np.float64)))))
        per_var[_var_name(v)] = diff
    return {
        "checked": len(per_var),
        "max_abs_diff": max(per_var.values()) if per_var else 0.0,
        "variables": per_var,
    }


def _safe_consistency(variables: list, cache: dict | None = None) -> dict | None:
    try:
        rc = replica_consistency(variables, cache)
    except Exception as err:  # noqa: BLE001 - e.g. remote components that cannot be read here
        return {"checked": 0, "max_abs_diff": None, "variables": {}, "error": str(err).splitlines()[0][:200]}
    return rc if rc["checked"] else None


def headline_metrics(placement: dict) -> dict[str, float]:
    """MLflow-safe headline numbers: placement.ops.GPU_0, placement.transfers_per_step, ..."""
    out: dict[str, float] = {}
    for dev, n in (placement.get("ops_by_device") or {}).items():
        out[f"placement.ops.{metric_key(dev)}"] = float(n)
    for dev, n in ((placement.get("gradients") or {}).get("ops_by_device") or {}).items():
        out[f"placement.gradient_ops.{metric_key(dev)}"] = float(n)
    per_step = (placement.get("transfers") or {}).get("per_step") or {}
    out["placement.transfers_per_step"] = float(per_step.get("count", 0))
    out["placement.transfer_bytes_per_step"] = float(per_step.get("bytes", 0))
    coll = (placement.get("transfers") or {}).get("collectives") or {}
    out["placement.collectives_per_step"] = float(sum(c.get("count", 0) for c in coll.values()))
    out["placement.collective_bytes_per_step"] = float(sum(c.get("input_bytes", 0) for c in coll.values()))
    observed, predicted = split_fallbacks(placement)
    out["placement.fallbacks"] = float(len(observed))
    out["placement.predicted_fallbacks"] = float(len(predicted))
    out["placement.devices"] = float(len(placement.get("devices") or []))
    out["placement.variables"] = float(len(placement.get("variables") or []))
    score = (placement.get("conformance") or {}).get("score")
    if score is not None:
        out["placement.conformance"] = float(score)
    rc = placement.get("replica_consistency") or {}
    if rc.get("max_abs_diff") is not None:
        out["placement.replica_drift"] = float(rc["max_abs_diff"])
    timing = placement.get("timing") or {}
    if timing.get("wall_ms") is not None:
        out["placement.timing.wall_ms"] = float(timing["wall_ms"])
    for dev, t in (timing.get("devices") or {}).items():
        for field in ("busy_ms", "compute_ms", "transfer_ms", "idle_share"):
            if t.get(field) is not None:
                out[f"placement.timing.{metric_key(dev)}.{field}"] = float(t[field])
    return out


# ----------------------------------------------------------------------------------------------
# ops, requests, transfers


def _num(x: float):
    return int(x) if float(x).is_integer() else round(float(x), 2)


def _mean_counter(counters: list[Counter]) -> dict:
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    n = max(len(counters), 1)
    keys = sorted(total, key=sort_key) if all(k.startswith("/") or not k for k in total) else sorted(total)
    return {k: _num(total[k] / n) for k in keys}


def requested_devices(cap) -> dict[str, str]:
    """Node name -> requested device (pre-optimization NodeDef.device), when the user's code (or
    a strategy) requested one: GPU emulation's own default requests are not counted."""
    if getattr(cap, "requested", None) is not None:
        return cap.requested
    return {name: n.device for name, n in requested_defs(cap).items() if n.device and EMULATED_ATTR not in n.attr}


def requested_defs(cap) -> dict:
    """Node name -> pre-optimization NodeDef (the op type and attrs the code asked for)."""
    if getattr(cap, "defs", None) is not None:
        return cap.defs
    out = {}
    for pre in cap.requested_graphs:
        for n in pre.node:
            out[n.name] = n
        for f in pre.library.function:
            for n in f.node_def:
                out.setdefault(n.name, n)
    return out


def split_fallbacks(placement) -> tuple[list[dict], list[dict]]:
    """(observed, predicted): what the runtime moved, and what a GPU machine would (emulation)."""
    fallbacks = placement.get("fallbacks") or []
    return [f for f in fallbacks if not f.get("predicted")], [f for f in fallbacks if f.get("predicted")]


def _predicted_fallback(node, pre, requested: str | None, namer: Namer, emulated_gpus: set) -> dict | None:
    """A GPU machine's fallback for an op that ran on an emulated GPU, from the kernel registry."""
    if node.op in BOOKKEEPING or pre is None or XLA_ATTR in node.attr:
        return None
    if node.op != pre.op and not node.op.startswith("_"):
        return None  # grappler replaced it (e.g. constant-folded to a Const): not the op that ran
    norm = normalize(node.device)
    prefix, local = split_prefix(norm)
    if local not in emulated_gpus:
        return None
    from pinpoint.kernels import missing_gpu_kernel

    reason = missing_gpu_kernel(pre.op, pre.attr)
    if reason is None:
        return None
    placed = namer.spec(node.device)
    host = f"{prefix}/CPU:0"
    return {
        "op": node.name,
        "op_type": pre.op,
        "requested": namer.spec(requested) if requested else placed,
        "requested_physical": normalize(requested) if requested else norm,
        "placed": placed,
        "placed_physical": norm,
        "predicted": True,
        "would_run_on": host,
        "reason": reason,  # a GPU machine runs it on `would_run_on` (soft placement)
    }


def _as_predicted(ops: list[dict], predicted: dict) -> list[dict]:
    """Ops as a GPU machine would place them: a predicted fallback on the host."""
    if not predicted:
        return ops
    return [dict(o, device=predicted[o["op"]]["would_run_on"]) if o["op"] in predicted else o for o in ops]


def _mark_predicted(conformance: dict, predicted: dict) -> None:
    for rule in conformance.get("rules") or []:
        for viol in rule.get("violations") or []:
            fb = predicted.get(viol["op"])
            if fb is not None:
                viol["predicted"] = True
                viol["why"] = fb["reason"] + " (predicted fallback)"


def _same_place(requested: str, placed: str) -> bool:
    return matches(requested, placed)


def _dtype_size(enum: int) -> int | None:
    from tensorflow.python.framework import dtypes

    try:
        dt = dtypes.as_dtype(enum)
    except (TypeError, ValueError):
        return None
    if dt in (dtypes.string, dtypes.resource, dtypes.variant):
        return None
    return dt.size


# Ops whose one output has the shape of each of their data inputs. A node the graph optimizer made
# has no traced shape (ArithmeticOptimizer's AddOpsRewrite_AddN merges hierarchical_copy's
# AddN(AddN(a, b), c) into one), but its inputs have one.
_SAME_SHAPE = {"AddN", "Identity", "Snapshot"}


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
        if n.op == "Const" and "value" in n.attr:
            return [d.size for d in n.attr["value"].tensor.tensor_shape.dim]
        if "_output_shapes" in n.attr and index < len(n.attr["_output_shapes"].list.shape):
            shp = n.attr["_output_shapes"].list.shape[index]
            if not shp.unknown_rank:
                return [d.size for d in shp.dim]
        if n.op in _SAME_SHAPE and index == 0 and depth < 8:
            for inp in n.input:
                if not inp.startswith("^"):
                    iname, _, idx = inp.partition(":")
                    shape = _shape_of(iname, int(idx or 0), cap, nodes, depth + 1)
                    if shape is not None:
                        return shape
    return None


def _transfers(cap, namer: Namer) -> dict:
    """One step's cross-device transfers, counted on the sending side."""
    nodes = {}
    for pre in cap.requested_graphs:
        for n in pre.node:
            nodes.setdefault(n.name, n)
    for g in cap.partition_graphs:
        for n in g.node:
            nodes[n.name] = n
    # Which ops consume each transferred tensor: the nodes reading the matching _Recv.
    consumers: dict[str, list[str]] = defaultdict(list)
    for g in cap.partition_graphs:
        recvs = {n.name: n.attr["tensor_name"].s.decode() for n in g.node if n.op in TRANSPORT - SENDS}
        for n in g.node:
            for i in n.input:
                key = recvs.get(i.lstrip("^").split(":")[0])
                if key and n.op not in BOOKKEEPING:
                    consumers[key].append(n.name)
    count = nbytes = sized = 0
    matrix: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes": 0}))
    items = []
    loop = {"count": 0, "bytes": 0}
    for g in cap.partition_graphs:
        for n in g.node:
            if n.op not in SENDS:
                continue
            src = normalize(n.attr["send_device"].s.decode())
            dst = normalize(n.attr["recv_device"].s.decode())
            if src == dst:
                continue
            if n.attr[LOOP_ATTR].b:
                # The multi-step loop's own predicate/control signal to each device: a real
                # per-step transfer, but the trainer's, not the model's; reported apart.
                loop["count"] += 1
                dsize = _dtype_size(n.attr["T"].type) if "T" in n.attr else None
                loop["bytes"] += dsize or 0
                continue
            count += 1
            s, d = namer.spec(src), namer.spec(dst)
            cell = matrix[s][d]
            cell["count"] += 1
            inp = n.input[0].lstrip("^") if n.input else ""
            name, _, idx = inp.partition(":")
            size = None
            dsize = _dtype_size(n.attr["T"].type) if "T" in n.attr else None
            shape = _shape_of(name, int(idx or 0), cap, nodes) if name else None
            if dsize is not None and shape is not None and all(x is not None and x >= 0 for x in shape):
                size = dsize
                for x in shape:
                    size *= x
                sized += 1
                nbytes += size
                cell["bytes"] += size
            items.append({"tensor": inp, "from": s, "to": d, "bytes": size,
                          "consumers": consumers.get(n.attr["tensor_name"].s.decode(), [])})
    # Collective ops (all-reduce, all-gather, broadcast) move data between replicas outside the
    # _Send/_Recv pairs (ring/NCCL/gRPC); counted separately with the size of their input.
    coll: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    for g in cap.partition_graphs:
        for n in g.node:
            if not COLLECTIVE_RE.match(n.op) or not n.input:
                continue
            dev = namer.spec(n.device)
            coll[dev]["count"] += 1
            name, _, idx = n.input[0].lstrip("^").partition(":")
            shape = _shape_of(name, int(idx or 0), cap, nodes)
            dsize = _dtype_size(n.attr["T"].type) if "T" in n.attr else None
            if shape is not None and dsize is not None and all(x is not None and x >= 0 for x in shape):
                size = dsize
                for x in shape:
                    size *= x
                coll[dev]["bytes"] += size
    return {
        "count": count,
        "bytes": nbytes,
        "sized": sized,
        "matrix": {s: dict(row) for s, row in matrix.items()},
        "items": items,
        "collectives": {d: dict(c) for d, c in coll.items()},
        "loop_control": loop,
    }


def _layer_table(conformance: dict, items, plan, layer_scopes) -> list[dict]:
    """Model parallelism at a glance: per pinned layer, its device, forward and backward ops per
    device (its `layers.<name>` rule's counts), and the bytes its ops receive from and send to
    other devices each step."""
    rules = {r["rule"]: r for r in conformance["rules"]}
    rows = []
    for layer in getattr(plan, "layers", None) or {}:
        rule = rules[f"layers.{layer}"]
        lre = layer_re((layer_scopes or {}).get(layer, layer))
        out_b = sum(t["bytes"] or 0 for t in items if lre.search(t["tensor"]))
        in_b = sum(t["bytes"] or 0 for t in items
                   if not lre.search(t["tensor"]) and any(lre.search(c) for c in t.get("consumers", ())))
        rows.append({"layer": layer, "device": rule["planned"], "forward_ops": rule["forward"]["observed"],
                     "backward_ops": rule["backward"]["observed"], "bytes_in": in_b, "bytes_out": out_b})
    return rows


def _merge_transfer_steps(steps: list[dict], step_ids: list[list[int]] | None = None) -> dict:
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
        s: {d: {"count": _num(c["count"] / n), "bytes": _num(c["bytes"] / n)} for d, c in sorted(row.items(), key=lambda kv: sort_key(kv[0]))}
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
            "count": _num(count / n),
            "bytes": _num(sum(st["bytes"] for st in steps) / n),
            "sized": _num(sum(st["sized"] for st in steps) / n),
            "unsized": _num((count - sum(st["sized"] for st in steps)) / n),
        },
        "matrix": matrix_out,
        "collectives": {
            d: {"count": _num(c["count"] / n), "input_bytes": _num(c["bytes"] / n)}
            for d, c in sorted(coll.items(), key=lambda kv: sort_key(kv[0]))
        },
        "steps": [{"step": sid, "count": st["count"], "bytes": st["bytes"], "sized": st["sized"]}
                  for st, ids in zip(steps, step_ids or [[None]] * len(steps), strict=True) for sid in ids],
        "loop_control": {
            "count": _num(sum(st.get("loop_control", {}).get("count", 0) for st in steps) / n),
            "bytes": _num(sum(st.get("loop_control", {}).get("bytes", 0) for st in steps) / n),
        },
        "largest": largest,
    }


# ----------------------------------------------------------------------------------------------
# variables


def _unwrap(v):
    """Keras 3 variables wrap a tf.Variable (or a distributed one) in `_value`."""
    import tensorflow as tf

    if not isinstance(v, tf.Variable) and getattr(v, "_value", None) is not None:
        return v._value
    return v


def _var_name(v) -> str:
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(v, "name", "") or ""
    return name.removesuffix(":0")


def _components(v) -> list:
    """The per-device tf.Variables behind v (mirrored/sharded/aggregating), or [v]."""
    vals = getattr(v, "values", None)
    if isinstance(vals, (tuple, list)) and vals:
        return list(vals)
    shards = getattr(v, "variables", None)
    if type(v).__name__ == "ShardedVariable" and shards:
        return list(shards)
    inner = getattr(v, "_v", None)  # AggregatingVariable (central storage)
    if inner is not None:
        return [inner]
    return [v]


def _kind(v) -> str:
    t = type(v).__name__
    return {
        "MirroredVariable": "mirrored",
        "SyncOnReadVariable": "sync_on_read",
        "AggregatingVariable": "central_storage",
        "ShardedVariable": "sharded",
    }.get(t, "variable")


def _dedupe(variables: Iterable) -> list:
    seen, out = set(), []
    for v in variables or []:
        key = id(_unwrap(v))
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


FINGERPRINT_SAMPLES = 32


def _fingerprint(component, cache: dict | None = None) -> dict | None:
    """A few evenly spaced values and the sum of a variable, so the chief can compare the copies
    that different tasks hold (cross-task replica drift) without shipping whole tensors."""
    import numpy as np

    try:
        arr = np.asarray(_read(component, cache), dtype=np.float64).ravel()
    except Exception:  # noqa: BLE001 - non-numeric or unreadable here
        return None
    if arr.size == 0:
        return {"sum": 0.0, "sample": []}
    idx = np.unique(np.linspace(0, arr.size - 1, min(FINGERPRINT_SAMPLES, arr.size)).astype(int))
    return {"sum": float(arr.sum()), "sample": [float(x) for x in arr[idx]]}


def _resource_source(name: str, nodes: dict) -> str | None:
    """Follow a resource input back through pass-through ops to its _Arg (or VarHandleOp)."""
    for _ in range(20):
        n = nodes.get(name)
        if n is None:
            return None
        if n.op in ("_Arg", "VarHandleOp"):
            return n.name
        if n.op in _PASS_THROUGH and n.input:
            name = n.input[0].lstrip("^").split(":")[0]
            continue
        return None
    return None


def _variables(variables: list, captures: list, namer: Namer, cache: dict | None = None) -> dict:
    import numpy as np

    out = []
    handle_to_var: dict[int, int] = {}
    shared_to_var: dict[str, int] = {}
    for i, v in enumerate(_dedupe(variables)):
        inner = _unwrap(v)
        comps = _components(inner)
        shape = [int(d) if d is not None else None for d in inner.shape.as_list()] if inner.shape.rank is not None else None
        dsize = inner.dtype.size if inner.dtype.is_numpy_compatible else 0
        nbytes = int(dsize * int(np.prod(shape))) if shape is not None and None not in shape else None
        comp_info = []
        for c in comps:
            dev = namer.spec(getattr(c, "device", "") or "")
            comp_info.append({"device": dev, "physical": normalize(getattr(c, "device", "") or "")})
            handle = getattr(c, "handle", None)
            if handle is not None:
                handle_to_var[id(handle)] = i
                try:
                    shared_to_var[c._shared_name] = i
                except AttributeError:
                    pass
        out.append(
            {
                "name": _var_name(v),
                "kind": _kind(inner),
                "shape": shape,
                "dtype": inner.dtype.name,
                "bytes": nbytes,
                "components": comp_info,
                "devices": sorted({c["device"] for c in comp_info if c["device"]}, key=sort_key),
                "update_devices": [],
                "update_ops": 0,
                "fingerprint": _fingerprint(comps[0], cache),
            }
        )

    update_devs: dict[int, set] = defaultdict(set)
    update_ops: Counter = Counter()
    total_updates = unattributed = 0
    for ci, cap in enumerate(captures):
        for g in cap.partition_graphs:
            nodes = {n.name: n for n in g.node}
            for n in g.node:
                if not UPDATE_RE.match(n.op) or not n.input:
                    continue
                src = _resource_source(n.input[0].lstrip("^").split(":")[0], nodes)
                idx = None
                if src is not None:
                    ext = cap.arg_values.get(src)
                    if ext is not None:
                        idx = handle_to_var.get(id(ext))
                    elif nodes[src].op == "VarHandleOp":
                        idx = shared_to_var.get(nodes[src].attr["shared_name"].s.decode())
                if ci == 0:
                    total_updates += 1
                    if idx is None:
                        unattributed += 1
                    else:
                        update_ops[idx] += 1
                if idx is not None:
                    update_devs[idx].add(namer.spec(n.device))
    for i, info in enumerate(out):
        info["update_devices"] = sorted(update_devs.get(i, ()), key=sort_key)
        info["update_ops"] = update_ops.get(i, 0)
    attributed = sum(1 for info in out if info["update_devices"])
    return {
        "variables": out,
        "updates": {
            "method": "each assign/apply op's resource input is followed to its function argument, "
            "whose captured value is the handle of one variable component",
            "update_ops": total_updates,
            "unattributed_ops": unattributed,
            "variables_with_updates": attributed,
            "variables": len(out),
            "coverage": f"updates attributed for {attributed}/{len(out)} variables",
        },
    }


# ----------------------------------------------------------------------------------------------
# conformance


def _rule(name: str, planned: str, relevant: list[tuple[str, str]]) -> dict:
    """relevant: (op or variable, placed device) pairs."""
    observed = Counter(dev for _, dev in relevant)
    ok = sum(1 for _, dev in relevant if matches(planned, dev))
    violations = [{"op": op, "placed": dev} for op, dev in relevant if not matches(planned, dev)]
    return {
        "rule": name,
        "planned": planned,
        "observed": {d: observed[d] for d in sorted(observed, key=sort_key)},
        "relevant": len(relevant),
        "score": round(ok / len(relevant), 4) if relevant else None,
        "violations": violations[:50],
        "violations_total": len(violations),
    }


def gradient_re(scope: str = "gradients"):
    """Backward-pass op names: the trainer's gradient scope (Keras may number it) or gradient_tape."""
    return re.compile(rf"(^|/)({re.escape(scope)}(_\d+)?|gradient_tape)/")


def layer_re(layer: str):
    # Keras 3 uniquifies scopes inside tf.function ("dense" -> "dense_1"), so accept a suffix.
    return re.compile(rf"(^|/){re.escape(layer)}(_\d+)?/")


def _conformance(ops, variables, plan, strategy, device_map, namer, grad_re, layer_scopes, input_re) -> dict:
    rules = []
    compute = [o for o in ops if o["type"] not in NOT_COMPUTE]
    is_input = lambda o: bool(INPUT_RE.match(o["type"]) or input_re.search(o["op"]))
    if plan is not None:
        if getattr(plan, "variables", None):
            rel = [(v["name"], c["device"]) for v in variables for c in v["components"]]
            rule = _rule("variables", namer.spec(plan.variables), rel)
            # A layer's variables are created inside the layer's device scope, so a layers.<name>
            # rule wins over the variables rule for that layer: say so next to the violation.
            for viol in rule["violations"]:
                for layer, dev in (getattr(plan, "layers", None) or {}).items():
                    if layer_re(layer).search(viol["op"] + "/") and matches(namer.spec(dev), viol["placed"]):
                        viol["why"] = f"created inside layers.{layer}'s device scope ({dev})"
            rules.append(rule)
        if getattr(plan, "gradients", None):
            rel = [(o["op"], o["device"]) for o in compute if grad_re.search(o["op"])]
            rules.append(_rule("gradients", namer.spec(plan.gradients), rel))
        for layer, dev in (getattr(plan, "layers", None) or {}).items():
            lre = layer_re((layer_scopes or {}).get(layer, layer))
            fwd = [(o["op"], o["device"]) for o in compute if lre.search(o["op"]) and not grad_re.search(o["op"])]
            # The layer's backward ops (gradients/.../<layer>/..._grad): a plan whose backward pass
            # ignores the pins cannot score 1.
            bwd = [(o["op"], o["device"]) for o in compute if lre.search(o["op"]) and grad_re.search(o["op"])]
            rule = _rule(f"layers.{layer}", namer.spec(dev), fwd + bwd)
            for part, rel in (("forward", fwd), ("backward", bwd)):
                sub = _rule(part, namer.spec(dev), rel)
                rule[part] = {"relevant": sub["relevant"], "score": sub["score"], "observed": sub["observed"]}
            rules.append(rule)
        if getattr(plan, "input", None):
            # An Identity the partitioner adds where a replica receives its batch (".../_27" on
            # the replica's device) forwards the copy; it does no input work.
            rel = [(o["op"], o["device"]) for o in compute if is_input(o) and o["type"] != "Identity"]
            rules.append(_rule("input", namer.spec(plan.input), rel))
    replicas = [namer.spec(d) for d in (getattr(device_map, "replica_devices", None) or [])]
    if strategy in ("mirrored", "multi_worker_mirrored") and replicas:
        # One component of every variable on every replica device.
        missing, present = [], []
        for v in variables:
            devs = set(v["devices"])
            for r in replicas:
                (present if any(matches(r, d) for d in devs) else missing).append((v["name"], r))
        rule = {
            "rule": "strategy.variables_mirrored",
            "planned": ", ".join(replicas),
            "observed": {},
            "relevant": len(missing) + len(present),
            "score": round(len(present) / (len(missing) + len(present)), 4) if (missing or present) else None,
            "violations": [{"op": n, "placed": f"no component on {r}"} for n, r in missing][:50],
            "violations_total": len(missing),
        }
        rules.append(rule)
        # Replica i's compute on replica device i: MirroredStrategy names replica i>0 ops
        # "replica_i/..." and replica 0's the same without prefix. The input pipeline is excluded:
        # where it runs is the `input` rule's business (usually the host).
        names = {o["op"] for o in compute}
        rel_by_replica: dict[int, list] = defaultdict(list)
        for o in compute:
            if is_input(o):
                continue
            m = re.match(r"^replica_(\d+)/(.*)$", o["op"])
            if m:
                rel_by_replica[int(m.group(1))].append((o["op"], o["device"]))
            elif f"replica_1/{o['op']}" in names:
                rel_by_replica[0].append((o["op"], o["device"]))
        for i, dev in enumerate(replicas):
            if rel_by_replica.get(i):
                rules.append(_rule(f"strategy.replica_{i}_compute", dev, rel_by_replica[i]))
    elif strategy == "central_storage":
        host = namer.spec(getattr(device_map, "host", None) or "/CPU:0")
        rel = [(v["name"], c["device"]) for v in variables for c in v["components"]]
        rules.append(_rule("strategy.variables_on_host", host, rel))
    elif strategy == "one_device" and replicas:
        rel = [(v["name"], c["device"]) for v in variables for c in v["components"]]
        rules.append(_rule("strategy.variables_on_device", replicas[0], rel))
    elif strategy == "parameter_server":
        rel = [(v["name"], c["device"]) for v in variables for c in v["components"]]
        rules.append(_rule("strategy.variables_on_ps", "/job:ps", rel))
    scored = [r["score"] for r in rules if r["score"] is not None]
    return {"score": round(sum(scored) / len(scored), 4) if scored else None, "rules": rules}
