"""Merge the placements of the tasks of a multi-worker cluster into one cluster-wide report.

Each task analyses its own partition graphs (device names keep their job/task, e.g.
"/job:worker/task:1/GPU:0"); the chief merges: devices are united, counts summed, variables
united by name (a mirrored variable has components on every worker), conformance averaged
with the per-task detail kept under `tasks`.
"""

from __future__ import annotations

from collections import defaultdict

from pinpoint.device_names import sort_key
from pinpoint.placement.schema import EXPLAIN, SCHEMA_VERSION, json_number
from pinpoint.placement.variables import FINGERPRINT_SAMPLES, summarize_consistency


def _sum_into(dst: dict, src: dict) -> None:
    for k, v in (src or {}).items():
        dst[k] = dst.get(k, 0) + v


def _sorted(d: dict) -> dict:
    return {k: json_number(d[k]) for k in sorted(d, key=sort_key)}


def merge_placements(placements: list[dict]) -> dict:
    """One cluster-wide placement from each task's placement dict (the first is the chief's)."""
    placements = [p for p in placements if p]
    if not placements:
        return {}
    if len(placements) == 1:
        return placements[0]

    devices: set[str] = set()
    ops: dict[str, float] = {}
    types: dict[str, dict[str, float]] = defaultdict(dict)
    grads: dict[str, float] = {}
    matrix: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes": 0}))
    per_step = {"count": 0, "bytes": 0, "sized": 0, "unsized": 0}
    loop_control = {"count": 0, "bytes": 0}
    fallbacks, rules, largest, transfer_items = [], [], [], []
    collectives: dict[str, dict] = {}
    variables: dict[str, dict] = {}
    aliases: dict[str, str] = {}
    physical: dict[str, str] = {}
    tasks: dict[str, dict] = {}
    scores = []
    rc_vars: dict[str, float] = {}
    rc_classes: dict[str, str] = {}
    rc_aggs: dict[str, str] = {}
    rc_checked = 0
    rc_seen = False
    updates = {"update_ops": 0, "unattributed_ops": 0}

    for p in placements:
        task = p.get("task", "?")
        devices.update(p.get("devices") or [])
        _sum_into(ops, p.get("ops_by_device"))
        for d, t in (p.get("op_types_by_device") or {}).items():
            _sum_into(types[d], t)
        _sum_into(grads, (p.get("gradients") or {}).get("ops_by_device"))
        tr = p.get("transfers") or {}
        for k in per_step:
            per_step[k] += (tr.get("per_step") or {}).get(k, 0)
        for k in loop_control:
            loop_control[k] += (tr.get("loop_control") or {}).get(k, 0)
        for s, row in (tr.get("matrix") or {}).items():
            for d, cell in row.items():
                matrix[s][d]["count"] += cell.get("count", 0)
                matrix[s][d]["bytes"] += cell.get("bytes", 0)
        largest.extend(dict(t, task=task) for t in tr.get("largest") or [])
        for d, c in (tr.get("collectives") or {}).items():
            cur = collectives.setdefault(d, {"count": 0, "input_bytes": 0})
            cur["count"] += c.get("count", 0)
            cur["input_bytes"] += c.get("input_bytes", 0)
        fallbacks.extend(dict(f, task=task) for f in p.get("fallbacks") or [])
        for v in p.get("variables") or []:
            if v.get("class"):
                rc_classes.setdefault(v["name"], v["class"])
            cur = variables.get(v["name"])
            if cur is None:
                variables[v["name"]] = cur = dict(v, components=[], devices=[], update_devices=[], update_ops=0)
            cur["components"] = cur["components"] + [dict(c, task=task) for c in v.get("components", [])]
            cur["devices"] = sorted(set(cur["devices"]) | set(v.get("devices", [])), key=sort_key)
            cur["update_devices"] = sorted(set(cur["update_devices"]) | set(v.get("update_devices", [])), key=sort_key)
            cur["update_ops"] += v.get("update_ops", 0)
        vu = p.get("variable_updates") or {}
        for k in updates:
            updates[k] += vu.get(k, 0)
        conf = p.get("conformance") or {}
        if conf.get("score") is not None:
            scores.append(conf["score"])
        rules.extend(dict(r, task=task) for r in conf.get("rules") or [])
        rc = p.get("replica_consistency")
        if rc:
            rc_seen = True
            rc_checked = max(rc_checked, rc.get("checked", 0))
            for name, diff in (rc.get("variables") or {}).items():
                rc_vars[name] = max(rc_vars.get(name, 0.0), diff)
            rc_classes.update(rc.get("classes") or {})
            rc_aggs.update(rc.get("aggregations") or {})
        aliases.update(p.get("device_aliases") or {})
        physical.update(p.get("physical_devices") or {})
        tasks[task] = {k: v for k, v in p.items() if k not in ("ops", "transfer_items", "explain")}
        transfer_items.extend(dict(t, task=task) for t in p.get("transfer_items") or [])

    # Cross-task drift: every task holds its own copy of a mirrored variable; compare the sampled
    # values each task recorded with the chief's (a lower bound on the true max |difference|).
    prints: dict[str, list] = defaultdict(list)
    for p in placements:
        for v in p.get("variables") or []:
            if v.get("fingerprint") and v["fingerprint"].get("sample") is not None:
                prints[v["name"]].append(v["fingerprint"]["sample"])
    cross = {}
    for name, samples in prints.items():
        if len(samples) > 1:
            base = samples[0]
            cross[name] = max(
                (abs(a - b) for other in samples[1:] for a, b in zip(base, other)), default=0.0
            )
    if cross:
        rc_seen = True
        rc_checked = max(rc_checked, len(cross))
        for name, diff in cross.items():
            rc_vars[name] = max(rc_vars.get(name, 0.0), diff)

    attributed = sum(1 for v in variables.values() if v["update_devices"])
    merged = {
        "schema": SCHEMA_VERSION,
        "task": "cluster",
        "strategy": placements[0].get("strategy"),
        "captured_steps": placements[0].get("captured_steps", []),
        "devices": sorted(devices, key=sort_key),
        "physical_devices": {d: physical.get(d, d) for d in sorted(devices, key=sort_key)},
        "device_aliases": aliases,
        "ops_by_device": _sorted(ops),
        "op_types_by_device": {d: dict(sorted(types[d].items())) for d in sorted(types, key=sort_key)},
        "transfers": {
            "per_step": {k: json_number(v) for k, v in per_step.items()},
            "matrix": {
                s: {d: dict(c) for d, c in sorted(row.items(), key=lambda kv: sort_key(kv[0]))}
                for s, row in sorted(matrix.items(), key=lambda kv: sort_key(kv[0]))
            },
            "collectives": {d: collectives[d] for d in sorted(collectives, key=sort_key)},
            "largest": sorted(largest, key=lambda t: -(t.get("bytes") or 0))[:25],
            "loop_control": {k: json_number(v) for k, v in loop_control.items()},
        },
        "fallbacks": fallbacks,
        "variables": list(variables.values()),
        "variable_updates": dict(
            updates,
            method=(placements[0].get("variable_updates") or {}).get("method", ""),
            variables_with_updates=attributed,
            variables=len(variables),
            coverage=f"updates attributed for {attributed}/{len(variables)} variables",
        ),
        "gradients": {
            "scope": (placements[0].get("gradients") or {}).get("scope", ""),
            "ops_by_device": _sorted(grads),
            "total": json_number(sum(grads.values())),
        },
        "replica_consistency": (
            dict(summarize_consistency(rc_vars, {n: rc_classes.get(n, "trainable") for n in rc_vars}, rc_aggs),
                 checked=rc_checked,
                 method="within each task: every component compared in full; across tasks: "
                 f"up to {FINGERPRINT_SAMPLES} evenly spaced values of each copy compared with the first task's")
            if rc_seen
            else None
        ),
        "conformance": {
            "score": round(sum(scores) / len(scores), 4) if scores else None,
            "rules": rules,
            "by_task": {t: (tp.get("conformance") or {}).get("score") for t, tp in tasks.items()},
        },
        "tasks": tasks,
        "transfer_items": transfer_items,
        "explain": EXPLAIN,
    }
    if placements[0].get("input_pipeline"):  # the chief's; each task's own is under tasks.<task>
        merged["input_pipeline"] = placements[0]["input_pipeline"]
    timed = [p for p in placements if p.get("timing")]
    if timed:  # each task timed its own devices (names keep job/task); idle is against its own wall
        walls = [p["timing"]["wall_ms"] for p in timed if p["timing"].get("wall_ms") is not None]
        devs = {d: t for p in timed for d, t in (p["timing"].get("devices") or {}).items()}
        merged["timing"] = {
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
            merged["timing"]["trace"] = traces[0].split("/")[0]  # profile/ holds every task's folder
    if placements[0].get("precision"):
        merged["precision"] = {
            "policy": placements[0]["precision"].get("policy"),
            "casts_by_device": {d: t["Cast"] for d, t in merged["op_types_by_device"].items() if t.get("Cast")},
        }
    return merged
