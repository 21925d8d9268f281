"""Merge the placements of the tasks of a multi-worker cluster into one cluster-wide report.

Each task analyses its own partition graphs (device names keep their job/task, e.g.
"/job:worker/task:1/GPU:0"); the chief merges, section by section (SECTIONS: one function per
placement.json section, each given every task's placement, the chief's first): devices are
united, counts summed, variables united by name (a mirrored variable has components on every
worker), conformance averaged with the per-task detail kept under `tasks`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from pinpoint.device_names import sort_key
from pinpoint.placement.schema import EXPLAIN, SCHEMA_VERSION, json_number
from pinpoint.placement.variables import (
    FINGERPRINT_SAMPLES,
    INTERNAL,
    coverage_text,
    summarize_consistency,
    user_variables,
)


def _sum_into(dst: dict, src: dict) -> None:
    for k, v in (src or {}).items():
        dst[k] = dst.get(k, 0) + v


def _sorted(d: dict) -> dict:
    return {k: json_number(d[k]) for k in sorted(d, key=sort_key)}


def _by_device(d: dict) -> list:
    return sorted(d.items(), key=lambda kv: sort_key(kv[0]))


def _task(p: dict) -> str:
    return p.get("task", "?")


# ---- one function per section ------------------------------------------------------------------
def _devices(ps: list[dict]) -> list[str]:
    return sorted({d for p in ps for d in p.get("devices") or []}, key=sort_key)


def _physical_devices(ps: list[dict]) -> dict:
    physical: dict[str, str] = {}
    for p in ps:
        physical.update(p.get("physical_devices") or {})
    return {d: physical.get(d, d) for d in _devices(ps)}


def _device_aliases(ps: list[dict]) -> dict:
    aliases: dict[str, str] = {}
    for p in ps:
        aliases.update(p.get("device_aliases") or {})
    return aliases


def _ops_by_device(ps: list[dict]) -> dict:
    ops: dict[str, float] = {}
    for p in ps:
        _sum_into(ops, p.get("ops_by_device"))
    return _sorted(ops)


def _op_types_by_device(ps: list[dict]) -> dict:
    types: dict[str, dict[str, float]] = defaultdict(dict)
    for p in ps:
        for d, t in (p.get("op_types_by_device") or {}).items():
            _sum_into(types[d], t)
    return {d: dict(sorted(types[d].items())) for d in sorted(types, key=sort_key)}


def _transfers(ps: list[dict]) -> dict:
    matrix: dict = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes": 0}))
    per_step = {"count": 0, "bytes": 0, "sized": 0, "unsized": 0}
    loop_control = {"count": 0, "bytes": 0}
    collectives: dict[str, dict] = {}
    largest = []
    reasons: dict[str, float] = {}
    errors: list[str] = []
    for p in ps:
        tr = p.get("transfers") or {}
        errors += [f"[{_task(p)}] {e}" for e in tr.get("sizing_errors") or ()]
        for why, n in (tr.get("unsized_reasons") or {}).items():
            reasons[why] = reasons.get(why, 0) + n
        for k in per_step:
            per_step[k] += (tr.get("per_step") or {}).get(k, 0)
        for k in loop_control:
            loop_control[k] += (tr.get("loop_control") or {}).get(k, 0)
        for s, row in (tr.get("matrix") or {}).items():
            for d, cell in row.items():
                matrix[s][d]["count"] += cell.get("count", 0)
                matrix[s][d]["bytes"] += cell.get("bytes", 0)
        largest.extend(dict(t, task=_task(p)) for t in tr.get("largest") or [])
        for d, c in (tr.get("collectives") or {}).items():
            cur = collectives.setdefault(d, {"count": 0, "input_bytes": 0})
            cur["count"] += c.get("count", 0)
            cur["input_bytes"] += c.get("input_bytes", 0)
    return {
        "per_step": {k: json_number(v) for k, v in per_step.items()},
        "unsized_reasons": {k: json_number(v) for k, v in reasons.items()},
        "matrix": {s: {d: dict(c) for d, c in _by_device(row)} for s, row in _by_device(matrix)},
        "collectives": {d: collectives[d] for d in sorted(collectives, key=sort_key)},
        "largest": sorted(largest, key=lambda t: -(t.get("bytes") or 0))[:25],
        "loop_control": {k: json_number(v) for k, v in loop_control.items()},
    } | ({"sizing_errors": errors} if errors else {})


def _fallbacks(ps: list[dict]) -> list:
    return [dict(f, task=_task(p)) for p in ps for f in p.get("fallbacks") or []]


def _united_variables(ps: list[dict]) -> dict[tuple[str, bool], dict]:
    variables: dict[tuple[str, bool], dict] = {}
    for p in ps:
        for v in p.get("variables") or []:
            key = (v["name"], bool(v.get("freed")))  # one freed before its task ended stays apart
            cur = variables.get(key)
            if cur is None:
                variables[key] = cur = dict(v, components=[], devices=[], update_devices=[], update_ops=0)
            cur["components"] = cur["components"] + [dict(c, task=_task(p)) for c in v.get("components", [])]
            cur["devices"] = sorted(set(cur["devices"]) | set(v.get("devices", [])), key=sort_key)
            cur["update_devices"] = sorted(set(cur["update_devices"]) | set(v.get("update_devices", [])), key=sort_key)
            cur["update_ops"] += v.get("update_ops", 0)
    return variables


def _variables(ps: list[dict]) -> list:
    return list(_united_variables(ps).values())


def _variable_updates(ps: list[dict]) -> dict:
    updates = {"update_ops": 0, "unattributed_ops": 0}
    for p in ps:
        vu = p.get("variable_updates") or {}
        for k in updates:
            updates[k] += vu.get(k, 0)
    rows = list(_united_variables(ps).values())
    users = user_variables(rows)
    return dict(
        updates,
        method=(ps[0].get("variable_updates") or {}).get("method", ""),
        variables_with_updates=sum(1 for v in users if v["update_devices"]),
        variables=len(users),
        internal_variables=len(rows) - len(users),
        coverage=coverage_text(rows, updates["unattributed_ops"]),
    )


def _gradients(ps: list[dict]) -> dict:
    grads: dict[str, float] = {}
    for p in ps:
        _sum_into(grads, (p.get("gradients") or {}).get("ops_by_device"))
    return {
        "scope": (ps[0].get("gradients") or {}).get("scope", ""),
        "ops_by_device": _sorted(grads),
        "total": json_number(sum(grads.values())),
    }


def _cross_task_drift(ps: list[dict]) -> dict[str, float]:
    """Every task holds its own copy of a mirrored variable: the sampled values each task recorded
    compared with the chief's (a lower bound on the true max |difference|)."""
    prints: dict[str, list] = defaultdict(list)
    for p in ps:
        for v in p.get("variables") or []:
            # TensorFlow's own variables (collective-ordering tokens) are each task's own by design.
            if v.get("class") == INTERNAL:
                continue
            if v.get("fingerprint") and v["fingerprint"].get("sample") is not None:
                prints[v["name"]].append(v["fingerprint"]["sample"])
    return {name: max((abs(a - b) for other in samples[1:] for a, b in zip(samples[0], other)), default=0.0)
            for name, samples in prints.items() if len(samples) > 1}


def _replica_consistency(ps: list[dict]) -> dict | None:
    drift: dict[str, float] = {}
    classes: dict[str, str] = {}
    aggregations: dict[str, str] = {}
    checked, seen = 0, False
    for p in ps:
        for v in p.get("variables") or []:
            if v.get("class"):
                classes.setdefault(v["name"], v["class"])
        rc = p.get("replica_consistency")
        if rc:
            seen = True
            checked = max(checked, rc.get("checked", 0))
            for name, diff in (rc.get("variables") or {}).items():
                drift[name] = max(drift.get(name, 0.0), diff)
            classes.update(rc.get("classes") or {})
            aggregations.update(rc.get("aggregations") or {})
    cross = _cross_task_drift(ps)
    if cross:
        seen = True
        checked = max(checked, len(cross))
        for name, diff in cross.items():
            drift[name] = max(drift.get(name, 0.0), diff)
    if not seen:
        return None
    return dict(summarize_consistency(drift, {n: classes.get(n, "trainable") for n in drift}, aggregations),
                checked=checked,
                method="within each task: every component compared in full; across tasks: "
                f"up to {FINGERPRINT_SAMPLES} evenly spaced values of each copy compared with the first task's")


def _conformance(ps: list[dict]) -> dict:
    scores = [(p.get("conformance") or {}).get("score") for p in ps]
    scores = [s for s in scores if s is not None]
    return {
        "score": round(sum(scores) / len(scores), 4) if scores else None,
        "rules": [dict(r, task=_task(p)) for p in ps for r in (p.get("conformance") or {}).get("rules") or []],
        "by_task": {_task(p): (p.get("conformance") or {}).get("score") for p in ps},
    }


def _tasks(ps: list[dict]) -> dict:
    return {_task(p): {k: v for k, v in p.items() if k not in ("ops", "transfer_items", "explain")} for p in ps}


def _transfer_items(ps: list[dict]) -> list:
    return [dict(t, task=_task(p)) for p in ps for t in p.get("transfer_items") or []]


def _input_pipeline(ps: list[dict]) -> dict | None:
    return ps[0].get("input_pipeline") or None  # the chief's; each task's own is under tasks.<task>


def _timing(ps: list[dict]) -> dict | None:
    """Each task timed its own devices (names keep job/task); idle is against its own wall."""
    timed = [p for p in ps if p.get("timing")]
    if not timed:
        return None
    walls = [p["timing"]["wall_ms"] for p in timed if p["timing"].get("wall_ms") is not None]
    devs = {d: t for p in timed for d, t in (p["timing"].get("devices") or {}).items()}
    timing = {
        "steps": timed[0]["timing"].get("steps", []),
        "wall_ms": max(walls) if walls else None,
        "step_ms": None,
        "devices": {d: devs[d] for d in sorted(devs, key=sort_key)},
        "notes": [f"[{p.get('task', '?')}] {n}" for p in timed for n in p["timing"].get("notes") or []],
        "tasks": {p.get("task", "?"): {k: p["timing"].get(k) for k in ("steps", "wall_ms", "step_ms", "trace")}
                  for p in timed},
    }
    traces = [p["timing"]["trace"] for p in timed if p["timing"].get("trace")]
    if traces:
        timing["trace"] = traces[0].split("/")[0]  # profile/ holds every task's folder
    return timing


def _memory(ps: list[dict]) -> dict | None:
    """Each task measured its own devices (names keep job/task) with its own self-check; a task that
    could not measure says why under its name."""
    measured = [p for p in ps if p.get("memory")]
    if not measured:
        return None
    devices = {d: m for p in measured for d, m in (p["memory"].get("devices") or {}).items() if d.startswith("/")}
    out: dict = {"devices": {d: devices[d] for d in sorted(devices, key=sort_key)},
                 "tasks": {_task(p): {k: v for k, v in p["memory"].items() if k != "devices"} for p in measured}}
    why = [f"[{_task(p)}] {p['memory']['why_not']}" for p in measured if p["memory"].get("why_not")]
    if why:
        out["why_not"] = "; ".join(why)
    return out


def _precision(ps: list[dict]) -> dict | None:
    if not ps[0].get("precision"):
        return None
    return {
        "policy": ps[0]["precision"].get("policy"),
        "casts_by_device": {d: t["Cast"] for d, t in _op_types_by_device(ps).items() if t.get("Cast")},
    }


# (section, how it is merged) in placement.json's order; a function returning None leaves the
# section out.
SECTIONS: list[tuple[str, Callable[[list[dict]], object]]] = [
    ("devices", _devices),
    ("physical_devices", _physical_devices),
    ("device_aliases", _device_aliases),
    ("ops_by_device", _ops_by_device),
    ("op_types_by_device", _op_types_by_device),
    ("transfers", _transfers),
    ("fallbacks", _fallbacks),
    ("variables", _variables),
    ("variable_updates", _variable_updates),
    ("gradients", _gradients),
    ("replica_consistency", _replica_consistency),
    ("conformance", _conformance),
    ("tasks", _tasks),
    ("transfer_items", _transfer_items),
    ("input_pipeline", _input_pipeline),
    ("timing", _timing),
    ("precision", _precision),
    ("memory", _memory),
]
PROGRAM_SECTIONS = ("functions", "training_function", "eager", "program")
_OPTIONAL = {"input_pipeline", "timing", "precision", "memory"}  # absent rather than null when no task has them


def merge_placements(placements: list[dict]) -> dict:
    """One cluster-wide placement from each task's placement dict (the first is the chief's)."""
    placements = [p for p in placements if p]
    if not placements:
        return {}
    if len(placements) == 1:
        return placements[0]
    merged = {
        "schema": SCHEMA_VERSION,
        "task": "cluster",
        "strategy": placements[0].get("strategy"),
        "captured_steps": placements[0].get("captured_steps", []),
    }
    for key, merge in SECTIONS:
        value = merge(placements)
        if value is not None or key not in _OPTIONAL:
            merged[key] = value
    merged["explain"] = EXPLAIN
    # A traced program (train.entrypoint): the merge unites the tasks' ops, transfers and
    # variables; the program's own sections (its functions and eager ops) are the chief's.
    merged.update({k: placements[0][k] for k in PROGRAM_SECTIONS if k in placements[0]})
    return _in_file_order(merged)


def _in_file_order(merged: dict) -> dict:
    """explain before the optional sections, as placement.json has always listed them."""
    tail = {k: merged.pop(k) for k in ("input_pipeline", "timing", "precision", "memory") if k in merged}
    return {**merged, **tail}
