"""`pinpoint report DIR`: one self-contained report.html (inline CSS, charts embedded as base64,
no script) and PNG charts in DIR/charts/, from DIR's placement files (placement.files) and
metrics.json when present.

The page is rendered from Jinja2 templates (templates/): `report.html.j2` lays out the sections
listed in SECTIONS, each its own template fed by a context function here. A new section is one
template and one `Section` in the list. Large runs stay readable: variables, ops and replica
differences are grouped by layer or name scope (collapsed `<details>`, totals per group) after a
"largest N" view.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pinpoint.errors import ConfigError
from pinpoint.placement.model.files import read_placement
from pinpoint.placement.model.placement import Placement, as_placement
from pinpoint.placement.model.records import ReplicaConsistency
from pinpoint.placement.model.schema import EXPLAIN, EXPLAIN_TRACE
from pinpoint.placement.model.sections import Variable
from pinpoint.placement.report.findings import first_screen
from pinpoint.placement.report.summary import format_summary, human_bytes, peak_range
from pinpoint.runfolder import METRICS, PLACEMENT, REPORT_HTML, atomic_write_text

CHARTS_DIR = "charts"


TEMPLATES = Path(__file__).parent / "templates"


LARGEST = 20  # rows of each "largest N" view


INTERNAL_GROUP = "(internal: TensorFlow's own variables)"


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#243447;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;color:#cfd8e3;font-size:13px}
main{padding:8px 32px 40px;max-width:1250px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 20px;margin:16px 0}
h2{font-size:17px;margin:6px 0 8px;color:#243447}
p.what{color:#555;font-size:13px;margin:4px 0 10px;max-width:950px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f6} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fdecea;color:#a40e0e} span.bad{color:#c62828;font-weight:600}
span.good{color:#2e7d32;font-weight:600} .muted{color:#888}
pre{background:#f4f6f8;padding:10px;font-size:12px;overflow-x:auto}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;background:#fff;min-width:130px}
.card b{display:block;font-size:20px} .card span{font-size:12px;color:#666}
.card.bad{border-color:#e57373;background:#fdecea}
.card.warn{border-color:#f0b429;background:#fff8e1} tr.warn td{background:#fff8e1} span.warn{color:#9a6700;font-weight:600}
code{font-size:12px}
table.groups>tbody>tr>td{vertical-align:top} details>summary{cursor:pointer} details table{margin:4px 0 8px}
.first{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start} .first .findings{flex:1 1 480px;min-width:380px}
ol.findings{margin:4px 0;padding-left:20px;font-size:13px} li.finding{margin:0 0 10px}
span.evidence{font-family:monospace;font-size:12px;color:#555} span.fix{color:#1b5e20} p.nothing{font-size:14px}
.diagram{flex:0 1 auto} .diagram svg{max-width:100%;height:auto;border:1px solid #eee;background:#fff}
"""


@dataclass(frozen=True)
class Section:
    """One section of the report: its anchor and nav label, its title, the template that renders
    it and the function giving the template's context (None: the section is left out)."""

    anchor: str
    nav: str
    title: str
    template: str
    context: Callable[[Placement, dict | None, dict[str, str], dict], dict | None]
    what: Callable[[Placement, dict], str] = lambda placement, ex: ""


def _dev(d: str, phys: dict) -> str:
    p = phys.get(d, d)
    # same job/task as the spec name: the local physical device is enough
    return f"{d} ({p[p.rfind('/') + 1:] if p.startswith('/job:') else p})" if p != d else d


def _tagged(task: str | None, text: str) -> str:
    """A merged cluster's row names its task first."""
    return f"[{task}] {text}" if task else text


def _group_of_var(name: str) -> str:
    """A variable's layer: its path without the last component."""
    return name.rpartition("/")[0] or "(model)"


NO_STRATEGY_GROUP = "(no strategy: TensorFlow's default)"
NOT_RECORDED_GROUP = "(strategy not recorded)"


def _strategy_of_var(v) -> str:
    """The strategy whose scope made a traced program's variable, as the report groups it."""
    if not v.created:
        return NOT_RECORDED_GROUP
    return v.created.get("strategy") or NO_STRATEGY_GROUP


_SCOPE_PREFIX = re.compile(r"^((replica_\d+|gradients|gradient_tape|while|cond|body)(_\d+)?/)+")


def _scope_of_op(name: str) -> str:
    """An op's name scope at layer level: the replica/gradient/loop prefixes dropped, then its
    first two components (model/layer) or its first one; ops outside any scope together."""
    rest = _SCOPE_PREFIX.sub("", name)
    parts = rest.split("/")
    if len(parts) == 1:
        return "(no name scope)"
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


# ---- the sections' contexts: rows are mappings by column key (the templates name the columns) -----
def _summary(p: Placement, metrics: dict | None, charts: dict, x: dict) -> dict:
    per = p.transfers.per_step
    score = p.conformance.score
    fallbacks, predicted = p.observed_fallbacks, p.predicted_fallbacks
    cards = [
        ("devices", len(p.devices), ""),
        ("transfers / step", per.count, ""),
        ("bytes / step", human_bytes(per.bytes), ""),
        ("fallbacks", len(fallbacks), "bad" if fallbacks else ""),
        *([("predicted fallbacks", len(predicted), "bad")] if predicted else []),
        ("conformance", "n/a" if score is None else f"{score:.2f}", "bad" if score is not None and score < 1.0 else ""),
        *_drift_cards(p.replica_consistency),
    ]
    return {"cards": [{"label": k, "value": v, "cls": cls} for k, v, cls in cards],
            "notes": list(p.notes), "summary": format_summary(p, metrics)}


def _drift_cards(rc: ReplicaConsistency | None) -> list[tuple[str, str, str]]:
    """Trainable drift red when not 0 (a sync bug), state drift amber (per-replica state,
    explained in its section); one card for a placement.json before the split."""
    if rc is None or rc.max_abs_diff is None:
        return [("replica drift", "n/a", "")]
    if rc.trainable_drift is None:
        return [("replica drift", f"{rc.max_abs_diff:.3g}", "bad" if rc.max_abs_diff else "")]
    return [("trainable drift", f"{rc.trainable_drift:.3g}", "bad" if rc.trainable_drift else ""),
            ("state drift", f"{rc.state_drift:.3g}", "warn" if rc.state_drift else "")]


def _devices(p: Placement, metrics, charts, x) -> dict:
    return {"rows": [{"device": d, "physical": p.physical_devices.get(d, d),
                      "note": "emulated: logical CPU device" if d in p.device_aliases else ""} for d in p.devices]}


def _devices_what(p: Placement, ex: dict) -> str:
    return ex.get("devices", "") + " " + (
        "This run emulated its spec GPUs: each spec device '/GPU:i' ran on logical CPU device "
        "'/CPU:i+1' of the same process; '/CPU:0' is the host. Everything below uses spec names."
        if p.device_aliases else "Devices as the runtime named them.")


def _ops(p: Placement, metrics, charts, x) -> dict:
    phys = p.physical_devices
    grads = p.gradients.ops_by_device or {}
    rows = [{"device": _dev(d, phys), "ops": n, "grads": grads.get(d, 0)} for d, n in p.ops_by_device.items()]
    devices = list(p.ops_by_device)
    scopes: dict[str, Counter] = defaultdict(Counter)
    types: dict[str, Counter] = defaultdict(Counter)
    for o in p.ops:
        scope = _scope_of_op(o.op)
        scopes[scope][o.device] += 1
        types[scope][o.type] += 1
    order = sorted(scopes, key=lambda s: (-sum(scopes[s].values()), s))
    per_device = [(f"on:{d}", d) for d in devices]

    def totals(s):
        return {"ops": sum(scopes[s].values()), **{f"on:{d}": scopes[s].get(d, 0) for d in devices}}

    return {
        "rows": rows, "charts": charts, "scopes": len(scopes),
        "largest_columns": [("scope", "name scope"), ("ops", "ops / step"), *per_device],
        "largest_num": ["ops", *(k for k, _ in per_device)],
        "largest": [{"scope": s, **totals(s)} for s in order[:LARGEST]] if len(scopes) > 1 else [],
        "grouped": {
            "by": "name scope", "total_columns": [("ops", "ops / step"), *per_device],
            "columns": [("type", "op type"), ("ops", "ops / step")], "num": ("ops",),
            "groups": [{"name": s, "totals": totals(s),
                        "rows": [{"type": t, "ops": n} for t, n in types[s].most_common()]} for s in sorted(scopes)],
        },
    }


def _transfers(p: Placement, metrics, charts, x) -> dict:
    phys, tr = p.physical_devices, p.transfers
    return {
        "charts": charts,
        "matrix": [{"from": _dev(s, phys), "to": _dev(d, phys), "count": cell.count, "bytes": human_bytes(cell.bytes)}
                   for s, row in tr.matrix.items() for d, cell in row.items()],
        "largest": [{"tensor": _tagged(t.task, t.tensor), "from": t.source, "to": t.to,
                     "bytes": human_bytes(t.bytes) if t.bytes is not None else "unknown"} for t in tr.largest[:15]],
        "input": [{"to": _dev(d, phys), "bytes": human_bytes(b)} for d, b in tr.input.per_step.items()],
        "input_what": tr.input.items[0].via if tr.input.items else "",
        "round_trips": [{"tensor": r.tensor, "path": f"{r.home} -> {r.via} -> {r.home}", "op": f"{r.op} ({r.op_type})",
                         "bytes": human_bytes(r.bytes) if r.bytes is not None else "unknown", "rule": r.rule,
                         "fix": r.fix} for r in sorted(tr.round_trips, key=lambda r: -(r.bytes or 0))],
        "collectives_what": x["ex"].get("collectives", ""),
        "collectives": [{"device": _dev(d, phys), "count": c.count, "bytes": human_bytes(c.input_bytes)}
                        for d, c in tr.collectives.items()],
    }


def _transfers_what(p: Placement, ex: dict) -> str:
    tr = p.transfers
    per = tr.per_step
    sized = f"{per.sized} of {per.count} transfers per step were sized" + (
        f"; {per.unsized} could not be (" + ("; ".join(tr.unsized_reasons) or "shape unknown")
        + "), their bytes are not counted" if per.unsized else "")
    if tr.loop_control.count:
        sized += (f"; not in the table: {tr.loop_control.count} transfer(s) per step of the training loop's own "
                  "predicate and control signal to each device")
    return ex.get("transfers", "") + " " + sized + "."


def _timing(p: Placement, metrics, charts, x) -> dict | None:
    timing = p.timing
    if timing is None:
        return None
    phys, devs = p.physical_devices, timing.devices
    return {
        "charts": charts, "notes": list(timing.notes), "steps": list(timing.steps),
        "wall_ms": timing.wall_ms, "step_ms": timing.step_ms, "trace": timing.trace,
        "rows": [{"device": _dev(d, phys), "busy": t.busy_ms, "compute": t.compute_ms, "transfer": t.transfer_ms,
                  "share": f"{100 * t.transfer_share:.1f}%",
                  "idle": "n/a" if t.idle_share is None else f"{100 * t.idle_share:.1f}%", "ops": t.ops}
                 for d, t in devs.items()],
        "top": [{"device": _dev(d, phys), "op": o.op, "type": o.type, "ms": o.ms, "count": o.count}
                for d, t in devs.items() for o in t.top_ops],
    }


def _memory(p: Placement, metrics, charts, x) -> dict | None:
    memory = p.memory
    if memory is None:
        return None
    devs = dict(memory.devices or {})
    check = memory.self_check or {}
    return {
        "charts": charts, "why_not": memory.why_not, "check": check, "trace": memory.trace,
        "findings": list(memory.findings or ()),
        "rows": [{"device": _dev(d, p.physical_devices) if d.startswith("/") else d,
                  "requested": human_bytes(m["peak_requested"]), "allocated": human_bytes(m["peak_allocated"]),
                  "at": f"{m['peak_time_us']:.1f}"} for d, m in devs.items()],
        "live": [{"device": d, "op": a["op"], "kind": a["kind"], "bytes": human_bytes(a["requested"]),
                  "shape": a["shape"], "region": a["region"]} for d, m in devs.items() if d.startswith("/")
                 for a in m["at_peak"]],
        "tasks": _task_totals(memory),
        "calls": _calls(memory),
        "batch": _at_batch(memory),
    }


def _at_batch(memory) -> dict | None:
    """The peaks predicted at other batches (memory.predicted.batch), and what was not scaled."""
    batch = (memory.predicted or {}).get("batch") or {}
    devices = batch.get("devices") or {}
    if not devices:
        return None
    sizes = list(next(iter(devices.values())))
    kept = "; ".join(f"{k['op']} on {k['device']}, {human_bytes(k['bytes'])}" for k in batch.get("kept_scratch") or ())
    text = (f"Predicted at other batches, from the measured call at batch {batch['measured']} (a device's step): "
            f"{batch['scaled_outputs']} outputs and {batch.get('scaled_scratch', 0)} kernels' scratch grow in "
            "proportion (their shape starts with the batch or folds it in). Weight gradients, updates, constants and "
            "the other scratch keep their size" + (f"; the largest scratch kept: {kept}" if kept else "") + ".")
    return {"text": text, "columns": [("device", "device")] + [(b, f"batch {b}") for b in sizes],
            "rows": [{"device": d, **{b: human_bytes(v[b]) for b in sizes}} for d, v in devices.items()],
            "num": tuple(sizes)}


def _calls(memory) -> str | None:
    """Several calls measured: which, each device's least and most peak, whose figures are shown."""
    calls = memory.calls or {}
    if len(calls.get("measured") or ()) < 2:
        return None
    spread = ", ".join(f"{d} {peak_range(v, ' to ')}" for d, v in calls["devices"].items())
    return (f"Calls {', '.join(map(str, calls['measured']))} were measured; the figures above are call "
            f"{calls['kept']}'s, whose busiest device needs the most (the fits verdict and the largest batch "
            f"come from it). Each device's peak over those calls: {spread}.")


def _task_totals(memory) -> list[dict]:
    """No per-device split (a cluster's tasks): each task's allocator totals, all its devices together."""
    out = []
    for task, t in (memory.tasks or {}).items():
        if t.get("task_peak") is not None:
            out.append({"task": task, "what": "peak over the sampled steps", "bytes": human_bytes(t["task_peak"])})
        if t.get("held") is not None:
            out.append({"task": task, "what": "held when training ended", "bytes": human_bytes(t["held"])})
            if t.get("variables") is not None:
                out.append({"task": task, "what": f"of it, its {t['variables']} variables (as its allocator sizes them)",
                            "bytes": human_bytes(t["variables_bytes"])})
            out.append({"task": task, "what": "peak since the task started", "bytes": human_bytes(t["peak"])})
    return out


def _fallbacks(p: Placement, metrics, charts, x) -> dict:
    phys = p.physical_devices
    return {
        "rows": [{"op": _tagged(f.task, f.op), "op_type": f.op_type,
                  "requested": _dev(f.requested, {f.requested: f.requested_physical or f.requested}),
                  "placed": _dev(f.placed, phys), "reason": f.reason or ""} for f in p.observed_fallbacks],
        "predicted": [{"op": _tagged(f.task, f.op), "op_type": f.op_type, "placed": _dev(f.placed, phys),
                       "would_run_on": f.would_run_on or "", "reason": f.reason or ""} for f in p.predicted_fallbacks],
    }


def _freed(v: Variable) -> str:
    """' (freed)', with where and when the program let go of it when known: ' (freed at train.py:12, 1.5 s in)'."""
    at = v.freed_at or {}
    where = (at.get("source") or "").replace("\\", "/").rpartition("/")[2]
    when = f"{at['s']:.1f} s in" if at.get("s") is not None else ""
    return f" (freed at {', '.join(filter(None, (where, when)))})" if where or when else " (freed)"


VARIABLE_COLUMNS = [("name", "variable"), ("kind", "kind"), ("shape", "shape"), ("bytes", "bytes"),
                    ("components", "components"), ("devices", "lives on"), ("update_devices", "updated on")]


def _variables(p: Placement, metrics, charts, x) -> dict:
    phys, vars_ = p.physical_devices, p.variables

    def row(v: Variable):
        return {"name": v.name, "kind": v.kind + (" (internal)" if v.internal else "") + (_freed(v) if v.freed else ""),
                "shape": "x".join(map(str, v.shape or [])) or "scalar", "bytes": human_bytes(v.bytes),
                "components": len(v.components), "devices": ", ".join(_dev(d, phys) for d in v.devices),
                "update_devices": ", ".join(_dev(d, phys) for d in v.update_devices) or "-"}

    largest = sorted(vars_, key=lambda v: -(v.bytes or 0))[:LARGEST] if len(vars_) > LARGEST else []
    # A traced program's variables by the strategy whose scope made them (its variables made under
    # one strategy after another, some dropped); a placement without creations by layer.
    by = "strategy" if any(v.created for v in vars_) else "layer"
    by_layer: dict[str, list[Variable]] = defaultdict(list)
    for v in vars_:
        # TensorFlow's own variables (collective-ordering tokens) apart from the program's.
        by_layer[INTERNAL_GROUP if v.internal else _strategy_of_var(v) if by == "strategy"
                 else _group_of_var(v.name)].append(v)
    return {
        "charts": charts, "count": len(p.user_variables), "largest": [row(v) for v in largest],
        "largest_bad": {i for i, v in enumerate(largest) if v.updated_elsewhere}, "columns": VARIABLE_COLUMNS,
        "grouped": {
            "by": by, "total_columns": [("count", "variables"), ("bytes", "bytes"), ("devices", "devices")],
            "columns": VARIABLE_COLUMNS, "num": ("bytes", "components"),
            "groups": [{"name": layer, "rows": [row(v) for v in vs], "bad": any(v.updated_elsewhere for v in vs),
                        "bad_rows": {i for i, v in enumerate(vs) if v.updated_elsewhere},
                        "totals": {"count": len(vs), "bytes": human_bytes(sum(v.bytes or 0 for v in vs)),
                                   "devices": ", ".join(sorted({d for v in vs for d in v.devices}))}}
                       for layer, vs in by_layer.items()],
        },
    }


def _variables_what(p: Placement, ex: dict) -> str:
    vu = p.variable_updates
    return (ex.get("variables", "") + f" Attribution of update ops: {'n/a' if vu.coverage is None else vu.coverage}"
            + (f" ({vu.method})." if vu.method else "."))


def _gradients(p: Placement, metrics, charts, x) -> dict:
    return {"rows": [{"device": _dev(d, p.physical_devices), "ops": n}
                     for d, n in (p.gradients.ops_by_device or {}).items()]}


def _conformance(p: Placement, metrics, charts, x) -> dict:
    rules = p.conformance.rules
    rows = []
    for r in rules:
        # layers.<key>: the forward and backward passes scored apart (a layer's backward ops
        # may ignore its pin while its forward ops obey it).
        parts = [f"{part} {r.part(part)['score']:.2f} ({r.part(part)['relevant']})" for part in ("forward", "backward")
                 if r.part(part).get("score") is not None]
        rows.append({"rule": _tagged(r.task, r.rule), "planned": r.planned,
                     "observed": ", ".join(f"{d}: {n}" for d, n in r.observed.items()) or "-",
                     "relevant": r.relevant, "score": "n/a (no relevant ops)" if r.score is None else f"{r.score:.2f}",
                     "parts": ", ".join(parts) or "-", "layers_matched": "" if r.layers_matched is None else r.layers_matched})
    return {"charts": charts, "rows": rows, "bad": {i for i, r in enumerate(rules) if r.below_plan},
            "violations": [{"rule": _tagged(r.task, r.rule), "op": v.op, "placed": v.placed, "planned": r.planned,
                            "why": v.why or ""} for r in rules for v in r.violations[:20]]}


def _conformance_what(p: Placement, ex: dict) -> str:
    return ex.get("conformance", "") + (
        " Strategy rules: mirrored strategies keep one component of every variable on every replica device "
        "and run replica i's compute on device i; central storage keeps variables on the host; "
        "parameter servers hold variables on ps tasks.")


def _layers(p: Placement, metrics, charts, x) -> dict | None:
    if not p.layers:
        return None

    def per_dev(counts) -> str:
        return ", ".join(f"{d}: {n:g}" for d, n in counts.items()) or "-"

    return {"rows": [{"layer": r.layer, "matched": list(r.matched or ()), "layers_matched": r.layers_matched or "",
                      "device": r.device, "forward": per_dev(r.forward_ops), "backward": per_dev(r.backward_ops),
                      "bytes_in": human_bytes(r.bytes_in), "bytes_out": human_bytes(r.bytes_out),
                      "bad": bool((set(r.forward_ops) | (set() if r.backward_pinned else set(r.backward_ops)))
                                  - {r.device})} for r in p.layers]}


STATE_CLASSES = ("replica_state", "sync_on_read")


def _replicas(p: Placement, metrics, charts, x) -> dict:
    rc = p.replica_consistency
    if rc is None:
        return {"present": False}
    classes = rc.classes or {}
    per_var = sorted(rc.variables.items(), key=lambda kv: (-kv[1], kv[0]))

    def row(n, d):
        return {"name": n, "class": classes.get(n, ""), "diff": f"{d:.3g}"}

    def flags(items):
        bad = {i for i, (n, d) in enumerate(items) if d > 0 and classes.get(n) not in STATE_CLASSES}
        warn = {i for i, (n, d) in enumerate(items) if d > 0 and classes.get(n) in STATE_CLASSES}
        return bad, warn

    largest = per_var[:LARGEST]
    lb, lw = flags(largest)
    by_layer: dict[str, list] = defaultdict(list)
    for n, d in per_var:
        by_layer[_group_of_var(n)].append((n, d))
    groups = []
    for layer in sorted(by_layer):
        items = by_layer[layer]
        b, w = flags(items)
        groups.append({"name": layer, "rows": [row(n, d) for n, d in items], "bad": bool(b), "warn": bool(w),
                       "bad_rows": b, "warn_rows": w,
                       "totals": {"count": len(items), "diff": f"{max(d for _, d in items):.3g}"}})
    split = rc.split
    columns = [("name", "variable"), ("class", "class"), ("diff", "max abs diff")]
    return {
        "present": True, "split": split, "checked": rc.checked, "method": rc.method, "drift": rc.max_abs_diff,
        "trainable": rc.trainable_drift, "state": rc.state_drift,
        "trainable_text": f"{rc.trainable_drift:.3g}" if split else "",
        "state_text": f"{rc.state_drift:.3g}" if split else "",
        "state_groups": [dict(g, count=len(g["variables"]), drift=f"{g['drift']:.3g}") for g in rc.state or []],
        "largest": [row(n, d) for n, d in largest], "largest_bad": lb, "largest_warn": lw, "columns": columns,
        "grouped": {"by": "layer", "total_columns": [("count", "variables"), ("diff", "max abs diff")],
                    "columns": columns, "num": ("diff",), "groups": groups},
    }


def _input(p: Placement, metrics, charts, x) -> dict | None:
    pipe, prec = p.input_pipeline, p.precision
    if not pipe and (prec is None or prec.policy == "float32"):
        return None
    rows = []
    if pipe:
        shard = pipe.sharding or {}
        rows.append({"what": "input pipeline", "value": f"{pipe.kind} from {pipe.source}",
                     "device": _dev(pipe.device if pipe.device is not None else "", p.physical_devices)})
        if shard.get("by") == "none":
            rows.append({"what": "sharding", "value": "none (one worker reads everything)", "device": ""})
        else:
            rows.append({"what": "sharding", "value": f"by {shard.get('by')}: worker {shard.get('worker')} of "
                         f"{shard.get('workers')}, {shard.get('files')} file(s)", "device": ""})
        ops = {k: v for k, v in pipe.ops.items() if not k.startswith("_")}
        rows.append({"what": "dataset ops", "value": ", ".join(f"{k} x{v}" for k, v in ops.items()), "device": ""})
    if prec:
        casts = prec.casts_by_device
        rows.append({"what": "precision", "value": prec.policy,
                     "device": ", ".join(f"{d}: {n} Cast" for d, n in casts.items())})
    return {"rows": rows}


def _tasks(p: Placement, metrics, charts, x) -> dict | None:
    if not p.tasks:
        return None
    rows = []
    for t, tp in p.tasks.items():
        per = tp.transfers.per_step
        rows.append({"task": t, "devices": ", ".join(tp.devices), "ops": sum(tp.ops_by_device.values()),
                     "transfers": per.count, "bytes": human_bytes(per.bytes), "fallbacks": len(tp.fallbacks),
                     "conformance": tp.conformance.score})
    return {"rows": rows}


def _functions(p: Placement, metrics, charts, x) -> dict | None:
    """`pinpoint trace` / train.entrypoint: every captured function of the program."""
    if not p.traced:
        return None
    return {"rows": [{"name": ("training: " if f.training else "") + f.name, "kind": f.kind, "calls": f.calls,
                      "ops": f.ops_per_call if f.captured else "not captured",
                      "by_device": ", ".join(f"{d} {n}" for d, n in f.ops_by_device.items()),
                      "transfers": f.transfers_per_call, "bytes": human_bytes(f.transfer_bytes_per_call),
                      "collectives": f.collectives_per_call} for f in p.functions]}


def _functions_what(p: Placement, ex: dict) -> str:
    train = p.training_function
    return (ex.get("functions", "") or EXPLAIN_TRACE["functions"]) + (
        f" Training function: {train}." if train else " No training function found.")


def _eager(p: Placement, metrics, charts, x) -> dict | None:
    """`pinpoint trace` / train.entrypoint: the program's eager ops, copies and predicted fallbacks."""
    if p.eager is None:
        return None
    e = p.eager
    return {
        "ops": e.ops,
        "by_device": [{"device": d, "ops": n,
                       "types": ", ".join(f"{t} {c}" for t, c in list(e.op_types_by_device.get(d, {}).items())[:6])}
                      for d, n in e.ops_by_device.items()],
        "copies": [dict(c, bytes=human_bytes(c["bytes"]), ops=", ".join(f"{t} {n}" for t, n in c["ops"].items()))
                   for c in e.copies],
        "moved": list(e.not_where_requested),
        "predicted": list(e.predicted_fallbacks),
    }


def _plan(p: Placement, metrics, charts, x) -> dict | None:
    """The run folder's plan (plan_check.json from `pinpoint plan --verify`, else plan.yaml): each
    placement's predicted figures, the verification run's measured ones beside them."""
    check = x.get("plan")
    if not check:
        return None
    rows = []
    for name, f in (check.get("placements") or {}).items():
        measured = name == "verified"
        rows.append({"placement": "verified (measured)" if measured else name,
                     "step": "-" if f.get("step_ms") is None else f"{f['step_ms']:.3f}",
                     "kind": "measured median" if measured else "predicted",
                     "ratio": "-" if f.get("busiest_over_mean") is None else f"{f['busiest_over_mean']:.2f}x",
                     "bytes": human_bytes(f.get("bytes_crossing_per_step") or 0),
                     "memory": human_bytes(f.get("peak_variable_bytes") or 0)})
    b, c, step = check.get("bytes"), check.get("conformance"), check.get("step")
    ps = check.get("ps_bytes")
    return {"charts": charts, "rows": rows, "pinning": (check.get("pinning") or {}).get("layers") or {},
            "objective": check.get("objective"), "algorithm": check.get("algorithm"),
            "source": check.get("source_run"), "bytes": b, "conformance": c, "step": step,
            "bad_pairs": [i for i, r in enumerate((b or {}).get("pairs") or []) if not r["exact"]],
            "ps": ps, "bad_servers": [i for i, r in enumerate((ps or {}).get("servers") or []) if not r["exact"]]}


def _explained(key: str) -> Callable[[Placement, dict], str]:
    return lambda p, ex: ex.get(key, "") or EXPLAIN.get(key, "") or EXPLAIN_TRACE.get(key, "")


SECTIONS: list[Section] = [
    Section("change", "what to change", "What to change", "findings.html.j2", first_screen,
            lambda p, ex: "Most costly first (bytes crossing devices per step, then time, then memory): what "
            "happens, its evidence (op, device, cost) and the fix; each links to its section below. Beside it, "
            "the run: devices with their ops, variables and busy share, arrows sized by the bytes crossing."),
    Section("summary", "summary", "Summary", "summary.html.j2", _summary,
            lambda p, ex: "Read from the partition graphs the TensorFlow runtime actually executed on the sampled "
            f"step(s) {list(p.captured_steps)}; op.device is only a request, this is what ran."),
    Section("functions", "functions", "Functions the program ran", "functions.html.j2", _functions, _functions_what),
    Section("eager", "eager ops", "Eager ops", "eager.html.j2", _eager, _explained("eager")),
    Section("devices", "devices", "Devices", "devices.html.j2", _devices, _devices_what),
    Section("ops", "ops", "Ops by device", "ops.html.j2", _ops, _explained("ops_by_device")),
    Section("transfers", "transfers", "Transfers between devices", "transfers.html.j2", _transfers, _transfers_what),
    Section("timing", "time", "Time per device", "timing.html.j2", _timing, _explained("timing")),
    Section("memory", "memory", "Memory per device", "memory.html.j2", _memory, _explained("memory")),
    Section("fallbacks", "fallbacks", "Fallbacks", "fallbacks.html.j2", _fallbacks, _explained("fallbacks")),
    Section("variables", "variables", "Variables", "variables.html.j2", _variables, _variables_what),
    Section("gradients", "gradients", "Gradients (backward pass)", "gradients.html.j2", _gradients,
            _explained("gradients")),
    Section("conformance", "conformance", "Conformance with the plan", "conformance.html.j2", _conformance,
            _conformance_what),
    Section("layers", "layers", "Layers split across devices", "layers.html.j2", _layers,
            lambda p, ex: "Model parallelism at a glance: each pinning key's device and the number of layers it "
            "matched, where their forward and backward ops ran per step, and the bytes their ops receive from and "
            "send to other devices per step (the boundary activation out, its gradient back in). A row is red when "
            "some of its ops ran elsewhere."),
    Section("replicas", "replicas", "Replica consistency", "replicas.html.j2", _replicas,
            _explained("replica_consistency")),
    Section("input", "input", "Input pipeline and precision", "input.html.j2", _input,
            lambda p, ex: "A tf.data pipeline runs its dataset ops inside the iterator, on the iterator's device; "
            "each replica's batch is then copied to the replica (a transfer above). Under a mixed policy, float32 "
            "variables are cast to the compute dtype where each layer runs: the Cast ops per device."),
    Section("plan", "plan", "Plan: prediction against measurement", "plan.html.j2", _plan,
            lambda p, ex: "The placement `pinpoint plan` proposed from the source run, each candidate's predicted "
            "step (critical path with the link model), busiest/mean compute, bytes crossing devices and peak "
            "variable memory per device; with --verify, this run trained the plan and its measured figures stand "
            "beside the prediction. The timelines are the simulated steps of the source run's placement and of "
            "the plan (each group's forward and backward pass on its device)."),
    Section("tasks", "tasks", "Tasks of the cluster", "tasks.html.j2", _tasks,
            lambda p, ex: "Each task captured and analysed its own partition graphs; the chief merged them "
            "(devices united, counts summed, conformance averaged)."),
]


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True)


def _inline(charts: dict[str, Path]) -> dict[str, str]:
    """{chart name without .png: base64 PNG} for the charts that exist (a missing one renders as
    nothing)."""
    out = {}
    for name, path in (charts or {}).items():
        if path and Path(path).is_file():
            out[Path(name).stem] = base64.b64encode(Path(path).read_bytes()).decode()
    return out


def render_html(placement: Placement | dict, metrics: dict | None, charts: dict[str, Path], title: str,
                sections: list[Section] | None = None, plan: dict | None = None) -> str:
    """The whole report as one HTML string (no external resources, no script); `plan`: the run
    folder's plan_check.json (or its plan.yaml's predictions), for the plan section."""
    p = as_placement(placement) or Placement()
    shared = {"ex": p.explain, "plan": plan}
    inline = _inline(charts)
    rendered = []
    for s in sections or SECTIONS:
        context = s.context(p, metrics, inline, shared)
        if context is not None:
            rendered.append({"anchor": s.anchor, "nav": s.nav, "title": s.title, "template": s.template,
                             "what": s.what(p, p.explain), "context": context})
    return _environment().get_template("report.html.j2").render(
        title=title, css=CSS, strategy=p.strategy, task=p.task, sections=rendered)


def write_report(run_dir: Path) -> tuple[Path, dict[str, Path], Placement]:
    """Write DIR/report.html and DIR/charts/*.png; return (html path, charts, placement)."""
    from pinpoint.placement.report.charts import write_charts

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir: got '{run_dir}', which is not a folder; pass a trained run folder such as runs/demo")
    content = read_placement(run_dir / PLACEMENT)
    if not isinstance(content, dict) or "ops_by_device" not in content:
        raise ConfigError(
            f"run_dir: got '{run_dir}', whose {PLACEMENT} is not a placement file; re-run `pinpoint train` with "
            "placement.enabled: true"
        )
    placement = Placement.from_json(content)
    metrics_path = run_dir / METRICS
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else None
    charts = write_charts(placement, run_dir / CHARTS_DIR)
    plan = read_plan_check(run_dir)
    if plan is not None:
        from pinpoint.placement.report.charts import plan_timeline

        tmp = run_dir / CHARTS_DIR / ".plan_timeline.tmp.png"
        if plan_timeline(plan, tmp) is not None:
            charts["plan_timeline.png"] = tmp.replace(run_dir / CHARTS_DIR / "plan_timeline.png")
    title = f"Pinpoint placement report: {run_dir.resolve().name}"
    out = atomic_write_text(run_dir / REPORT_HTML, render_html(placement, metrics, charts, title, plan=plan))
    return out, charts, placement


def read_plan_check(run_dir: Path) -> dict | None:
    """The folder's plan_check.json (`pinpoint plan --verify`), else its plan.yaml's predictions
    (`pinpoint plan`, nothing measured), else None."""
    check = run_dir / "plan_check.json"
    if check.is_file():
        return json.loads(check.read_text())
    plan = run_dir / "plan.yaml"
    if plan.is_file():
        import yaml

        doc = yaml.safe_load(plan.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("prediction"), dict):
            return {"placements": doc["prediction"], "pinning": doc.get("pinning"), "objective": doc.get("objective"),
                    "algorithm": doc.get("algorithm"), "source_run": doc.get("source_run")}
    return None
