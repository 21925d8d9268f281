"""The model's and optimizer's variables: where each one's components live, where its update ops
(assign/apply) ran, a fingerprint of its value, and how far its mirrored copies drifted apart."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from pinpoint.device_names import DeviceMap, normalize, sort_key
from pinpoint.placement.graphs.ops import UPDATE_RE
from pinpoint.placement.graphs.resources import ResourceTracer, Source


def _read(component, cache: dict | None):
    """The component's value as numpy, read once per analysis (consistency and fingerprints)."""
    import numpy as np

    if cache is None:
        return np.asarray(component.numpy())
    key = id(component)
    if key not in cache:
        cache[key] = np.asarray(component.numpy())
    return cache[key]


# What the strategy promises for each kind of distributed variable (placement.json's
# replica_consistency.classes). "synced" classes must hold identical copies: any drift is a sync
# bug. "state" classes may differ by design; their drift is explained, not alarmed on.
CLASSES = {
    "trainable": ("synced", "trainable, synchronization ON_WRITE: updated from all-reduced gradients, "
                  "so every replica's copy must stay identical"),
    "optimizer": ("synced", "optimizer slot: updated from all-reduced gradients, identical on every replica"),
    "aggregated_state": ("synced", "non-trainable, ON_WRITE with aggregation {aggregation}: an assignment in "
                         "replica context is aggregated first, so the copies stay identical"),
    "replica_state": ("state", "non-trainable state assigned inside each replica (ON_WRITE, aggregation NONE): "
                      "each replica keeps the value computed from its own share of the batch"),
    "sync_on_read": ("state", "ON_READ with aggregation {aggregation}: each replica keeps its own value by "
                     "design; reading it outside a replica returns their {aggregation}"),
}


BATCHNORM_STATS = ("moving_mean", "moving_variance")


# Variables that are TensorFlow's own, not the program's: classed "internal", shown apart and never
# counted as the user's (placement.json's `class`).
INTERNAL = "internal"


def internal_variable_ids() -> set[int]:
    """ids of the live variables TensorFlow makes for itself: the collective-ordering token each
    all-reduce launcher of a tf.distribute strategy keeps per device."""
    from pinpoint.tfcompat.api import collective_ordering_tokens

    return collective_ordering_tokens()


def user_variables(rows: list[dict]) -> list[dict]:
    """placement.json's variables less the internal ones and those freed before the end."""
    return [v for v in rows if v.get("class") != INTERNAL and not v.get("freed")]


def coverage_text(rows: list[dict], unattributed_ops: int = 0) -> str:
    """The one sentence on update attribution the summary, the report and placement.json share."""
    users = user_variables(rows)
    attributed = sum(1 for v in users if v.get("update_devices"))
    text = f"updates attributed for {attributed}/{len(users)} variables"
    if unattributed_ops:
        text += f"; {unattributed_ops} update op(s) attributed to no variable"
    return text


def classify(v, optimizer_ids: set[int] | frozenset = frozenset()) -> tuple[str, str]:
    """(class, aggregation) of a distributed variable by what the strategy promises for it."""
    import tensorflow as tf

    inner = unwrap(v)
    agg = getattr(inner, "aggregation", None)
    agg_name = getattr(agg, "name", str(agg or "NONE")).upper()
    if id(inner) in optimizer_ids:
        return "optimizer", agg_name
    if getattr(inner, "synchronization", None) == tf.VariableSynchronization.ON_READ:
        return "sync_on_read", agg_name
    if bool(getattr(v, "trainable", getattr(inner, "trainable", False))):
        return "trainable", agg_name
    return ("replica_state" if agg_name == "NONE" else "aggregated_state"), agg_name


def explain_state(name: str, cls: str, aggregation: str) -> dict:
    """Why a per-replica state variable differs across replicas, what a checkpoint keeps and the
    fix that applies (one explanation per group of variables sharing it)."""
    short = name.rpartition("/")[2]
    if cls == "sync_on_read":
        return {
            "what": f"ON_READ variables (aggregation {aggregation})",
            "cause": CLASSES[cls][1].format(aggregation=aggregation.lower()),
            "checkpoint_keeps": f"the {aggregation.lower()} of the replicas' values (read in cross-replica context)",
            "fix": "none needed: per-replica by design, aggregated when read",
        }
    bn = short in BATCHNORM_STATS
    return {
        "what": "BatchNormalization moving statistics" if bn else "non-trainable state assigned per replica",
        "cause": CLASSES[cls][1],
        "checkpoint_keeps": "the first replica's value only (a MirroredVariable saves its primary component)",
        # The part before ':' is the short form the terminal summary prints.
        "fix": ("BatchNormalization(synchronized=True): Keras then all-reduces the batch statistics across "
                "replicas every step, so every replica (and the checkpoint) holds the same moving statistics"
                if bn else
                "aggregation=MEAN: create the variable with it (or assign it in cross-replica context) so the "
                "replicas' assignments are combined"),
    }


def replica_consistency(variables: list, cache: dict | None = None, optimizer_variables: list | None = None) -> dict:
    """Max |component_i - component_0| for every variable with more than one local component,
    split by what the strategy promises: `trainable_drift` over the classes that must stay
    identical (trainable weights, optimizer slots, aggregated state: anything but 0 is a sync bug)
    and `state_drift` over per-replica state (e.g. BatchNormalization's moving statistics)."""
    import numpy as np

    optimizer_ids = {id(unwrap(v)) for v in optimizer_variables or []}
    per_var: dict[str, float] = {}
    classes: dict[str, str] = {}
    aggregations: dict[str, str] = {}
    for v in _dedupe(variables):
        comps = components(unwrap(v))
        if len(comps) < 2:
            continue
        base = _read(comps[0], cache)
        diff = 0.0
        for c in comps[1:]:
            arr = _read(c, cache)
            if arr.size:
                diff = max(diff, float(np.max(np.abs(arr.astype(np.float64) - base.astype(np.float64)))))
        name = var_name(v)
        per_var[name] = diff
        classes[name], aggregations[name] = classify(v, optimizer_ids)
    return summarize_consistency(per_var, classes, aggregations)


def summarize_consistency(per_var: dict[str, float], classes: dict[str, str],
                          aggregations: dict[str, str] | None = None) -> dict:
    """placement.json's replica_consistency from per-variable drift and classes (also used by
    merge, across tasks)."""
    aggregations = aggregations or {}

    def worst(group: str, on_read: bool = False) -> float:
        return max((d for n, d in per_var.items() if CLASSES[classes.get(n, "trainable")][0] == group
                    and (classes.get(n) == "sync_on_read") == on_read), default=0.0)

    groups: dict[str, dict] = {}
    for n, d in sorted(per_var.items(), key=lambda kv: (-kv[1], kv[0])):
        if d <= 0 or CLASSES[classes.get(n, "trainable")][0] != "state":
            continue
        why = explain_state(n, classes[n], aggregations.get(n, "NONE"))
        group = groups.setdefault(why["what"], dict(why, drift=d, variables=[]))
        group["variables"].append({"variable": n, "layer": n.rpartition("/")[0] or "(model)", "drift": d})
    return {
        "checked": len(per_var),
        "max_abs_diff": max(per_var.values()) if per_var else 0.0,
        "trainable_drift": worst("synced"),
        # Per-replica state that a checkpoint keeps one replica's copy of (BatchNormalization's
        # moving statistics): not the ON_READ accumulators (Keras' metrics), which are summed or
        # averaged when read and differ on each replica by design (`on_read_drift`).
        "state_drift": worst("state"),
        "on_read_drift": worst("state", on_read=True),
        "variables": per_var,
        "classes": classes,
        "aggregations": aggregations,
        # Per-replica state that differs, grouped by explanation (largest drift first).
        "state": list(groups.values()),
    }


def safe_consistency(variables: list, cache: dict | None = None, optimizer_variables: list | None = None) -> dict | None:
    """placement.json's replica_consistency: None without mirrored variables, the error if unreadable."""
    try:
        rc = replica_consistency(variables, cache, optimizer_variables)
    except Exception as err:  # noqa: BLE001 - e.g. remote components that cannot be read here
        return {"checked": 0, "max_abs_diff": None, "variables": {}, "error": str(err).splitlines()[0][:200]}
    return rc if rc["checked"] else None


def unwrap(v):
    """Keras 3 variables wrap a tf.Variable (or a distributed one) in `_value`."""
    import tensorflow as tf

    from pinpoint.tfcompat.api import keras_wrapped

    if not isinstance(v, tf.Variable) and keras_wrapped(v) is not None:
        return keras_wrapped(v)
    return v


def var_name(v) -> str:
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(v, "name", "") or ""
    return name.removesuffix(":0")


def components(v) -> list:
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


def variable_kind(v) -> str:
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
        key = id(unwrap(v))
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


def analyze_variables(variables: list, captures: list, namer: DeviceMap, cache: dict | None = None,
                      optimizer_variables: list | None = None, eager_updates: Mapping | None = None,
                      created: Sequence[Mapping] = ()) -> dict:
    """placement.json's `variables` (components, devices, update devices, fingerprint, the
    consistency class) and `variable_updates` (how the update ops were attributed), as
    {"variables", "freed", "updates"}. `eager_updates` (a traced program): id(variable) -> the
    devices eager ops updated it on. `created` (a traced program): each variable as it was created
    (trace.created): a live one's row gets its creation, a freed one a row of its own (`freed`)."""
    out, handle_to_var, shared_to_var = _variable_rows(variables, namer, cache, optimizer_variables)
    freed = _creations(created, out, handle_to_var, namer)
    rows = out + freed
    update_devs, update_ops, total_updates, unattributed = _attribute_updates(
        captures, namer, handle_to_var, shared_to_var)
    for i, info in enumerate(rows):
        info["update_devices"] = sorted(update_devs.get(i, ()), key=sort_key)
        info["update_ops"] = update_ops.get(i, 0)
    method = ("each assign/apply op's resource input is followed to its function argument, "
              "whose captured value is the handle of one variable component (through identities, "
              "a cond's Switch/Merge, a loop's Enter/Exit, a _Recv to its _Send and a functional "
              "op's call into its branch or body)")
    if eager_updates is not None:
        for info, v in zip(out, _dedupe(variables)):
            devs = set(eager_updates.get(id(v), ()))
            if devs:
                info["eager_update_devices"] = sorted(devs, key=sort_key)
                info["update_devices"] = sorted(set(info["update_devices"]) | devs, key=sort_key)
        method += "; an eager update runs on the device of the variable whose handle it takes"
    for info in freed:  # their eager updates, by the handles recorded at their creation
        info["update_devices"] = sorted(set(info["update_devices"]) | set(info.get("eager_update_devices", ())),
                                        key=sort_key)
    attributed = sum(1 for info in user_variables(out) if info["update_devices"])
    return {
        "variables": out,
        "freed": freed,
        "updates": {
            "method": method,
            "update_ops": total_updates,
            "unattributed_ops": unattributed,
            "variables_with_updates": attributed,
            "variables": len(user_variables(out)),
            "internal_variables": len(out) - len(user_variables(out)),
            **({"freed_variables": len(freed)} if freed else {}),
            "coverage": coverage_text(out, unattributed),
        },
    }


def _creations(created: Sequence[Mapping], rows: list[dict], handle_to_var: dict, namer: DeviceMap) -> list[dict]:
    """Each creation record onto its live row (matched by a component's handle), or a row of its
    own for a variable freed before the end (its handles, where still held, indexed after `rows`)."""
    freed: list[dict] = []
    for rec in created:
        info = {"strategy": rec.get("strategy"), "requested": namer.canonical_spec(rec.get("requested") or ""),
                "layer": rec.get("layer"), "source": rec.get("source"), **({"by": rec["by"]} if rec.get("by") else {})}
        live = next((handle_to_var[h] for h in rec.get("handle_ids") or () if h in handle_to_var), None)
        if live is not None and live >= len(rows):
            # A freed variable recorded again with its handles (each replica thread of strategy.run
            # records the variable it made there): one variable, its copies' devices joined.
            _join_copies(freed[live - len(rows)], rec, namer)
            continue
        if live is not None:
            rows[live].setdefault("created", info)
            continue
        if rec.get("alive"):
            continue  # alive, yet not among the program's variables (a component of one)
        comps = [{"device": namer.canonical_spec(d), "physical": normalize(d)} for d in rec.get("components") or ()]
        for h in rec.get("handle_ids") or ():
            handle_to_var[h] = len(rows) + len(freed)
        freed.append({
            "name": rec["name"], "kind": rec.get("kind", "variable"), "class": rec.get("class"),
            "shape": rec.get("shape"), "dtype": rec.get("dtype"), "bytes": rec.get("bytes"), "components": comps,
            "devices": sorted({c["device"] for c in comps if c["device"]}, key=sort_key),
            "update_devices": [], "update_ops": 0, "freed": True, "created": info,
            **({"freed_at": dict(rec["freed_at"])} if rec.get("freed_at") else {}), **_eager_devices(rec, namer),
        })
    return freed


def _join_copies(row: dict, rec: Mapping, namer: DeviceMap) -> None:
    """`rec`'s components and eager update devices added to the freed `row` of the same variable."""
    comps = row["components"]
    for d in rec.get("components") or ():
        comp = {"device": namer.canonical_spec(d), "physical": normalize(d)}
        if comp not in comps:
            comps.append(comp)
    row["devices"] = sorted({c["device"] for c in comps if c["device"]}, key=sort_key)
    eager = set(row.get("eager_update_devices", ())) | set(_eager_devices(rec, namer).get("eager_update_devices", ()))
    if eager:
        row["eager_update_devices"] = sorted(eager, key=sort_key)


def _eager_devices(rec: Mapping, namer: DeviceMap) -> dict:
    """{"eager_update_devices": [...]} of a creation record, or {} when no eager op updated it."""
    devs = sorted({namer.canonical_spec(d) for d in rec.get("eager_update_devices") or ()}, key=sort_key)
    return {"eager_update_devices": devs} if devs else {}


def _variable_rows(variables: list, namer: DeviceMap, cache: dict | None, optimizer_variables: list | None):
    """(one row per variable, {id(component handle): row index}, {resource shared name: row index})."""
    import numpy as np

    from pinpoint.tfcompat.api import device_of, resource_shared_name

    optimizer_ids = {id(unwrap(v)) for v in optimizer_variables or []}
    internal_ids = internal_variable_ids()
    out = []
    handle_to_var: dict[int, int] = {}
    shared_to_var: dict[str, int] = {}
    for i, v in enumerate(_dedupe(variables)):
        inner = unwrap(v)
        comps = components(inner)
        shape = [int(d) if d is not None else None for d in inner.shape.as_list()] if inner.shape.rank is not None else None
        dsize = inner.dtype.size if inner.dtype.is_numpy_compatible else 0
        nbytes = int(dsize * int(np.prod(shape))) if shape is not None and None not in shape else None
        comp_info = []
        for c in comps:
            dev = namer.canonical_spec(device_of(c))
            comp_info.append({"device": dev, "physical": normalize(device_of(c))})
            handle = getattr(c, "handle", None)
            if handle is not None:
                handle_to_var[id(handle)] = i
                shared = resource_shared_name(c)
                if shared is not None:
                    shared_to_var[shared] = i
        out.append({
            "name": var_name(v),
            "kind": variable_kind(inner),
            "class": INTERNAL if id(inner) in internal_ids else classify(v, optimizer_ids)[0],
            "shape": shape,
            "dtype": inner.dtype.name,
            "bytes": nbytes,
            "components": comp_info,
            "devices": sorted({c["device"] for c in comp_info if c["device"]}, key=sort_key),
            "update_devices": [],
            "update_ops": 0,
            "fingerprint": _fingerprint(comps[0], cache),
        })
    return out, handle_to_var, shared_to_var


def _attribute_updates(captures: list, namer: DeviceMap, handle_to_var: dict, shared_to_var: dict):
    """Each update op's variable, through its resource input: (row index -> update devices over all
    captures, row index -> update ops of the first capture, update ops of the first, unattributed).
    An update inside a callee the runtime ran without inlining (its graphs not recorded) counts
    at its call, on its resource's device (where TensorFlow runs an op on a resource)."""
    update_devs: dict[int, set] = defaultdict(set)
    update_ops: Counter = Counter()
    total_updates = unattributed = 0
    for ci, cap in enumerate(captures):
        tracer = ResourceTracer(cap.functions, cap.arg_values)
        for gi, nodes in enumerate(tracer.graphs):
            for n in nodes.values():
                if UPDATE_RE.match(n.op) and n.input:
                    found = [(n.input[0], 1, n.device)]
                else:
                    found = [(inp, count, None) for inp, count in tracer.call_updates(n, UPDATE_RE)]
                for inp, count, device in found:
                    src = tracer.source(inp, gi)
                    idx = variable_of(src, cap.arg_values, handle_to_var, shared_to_var)
                    if ci == 0:
                        total_updates += count
                        if idx is None:
                            unattributed += count
                        else:
                            update_ops[idx] += count
                    if idx is not None:
                        update_devs[idx].add(namer.canonical_spec(device if device is not None else src.device))
    return update_devs, update_ops, total_updates, unattributed


def variable_of(src: Source | None, arg_values: Mapping, handle_to_var: Mapping, shared_to_var: Mapping):
    """The row (value of `handle_to_var`/`shared_to_var`) of the variable a resource source holds."""
    if src is None:
        return None
    if src.arg is not None:
        ext = arg_values.get(src.arg)
        return handle_to_var.get(id(ext)) if ext is not None else None
    return shared_to_var.get(src.shared_name)
