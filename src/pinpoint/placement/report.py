"""`pinpoint report DIR`: one self-contained report.html (inline CSS, charts embedded as base64)
and PNG charts in DIR/charts/, from DIR/placement.json (and metrics.json when present)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.placement.conformance import split_fallbacks
from pinpoint.placement.files import read_placement
from pinpoint.placement.schema import EXPLAIN
from pinpoint.placement.summary import format_summary, human_bytes
from pinpoint.runfolder import (
    METRICS,
    PLACEMENT,
    REPORT_HTML,
    atomic_write_text,
)

CHARTS_DIR = "charts"

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
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(headers: list[str], rows: list[list[Any]], bad_rows: set[int] | None = None, num_cols=(),
           warn_rows: set[int] | None = None) -> str:
    bad_rows, warn_rows = bad_rows or set(), warn_rows or set()
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="bad"' if i in bad_rows else ' class="warn"' if i in warn_rows else ""
        cells = "".join(
            f'<td class="num">{_e(c)}</td>' if j in num_cols else f"<td>{_e(c)}</td>" for j, c in enumerate(row)
        )
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "".join(out)


def _img(path: Path | None, alt: str) -> str:
    if not path or not Path(path).is_file():
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _section(title: str, what: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2><p class="what">{_e(what)}</p>{body}</section>'


def _dev(d: str, phys: dict) -> str:
    p = phys.get(d, d)
    # same job/task as the spec name: the local physical device is enough
    return f"{d} ({p[p.rfind('/') + 1:] if p.startswith('/job:') else p})" if p != d else d


def render_html(placement: dict, metrics: dict | None, charts: dict[str, Path], title: str) -> str:
    """The whole report as one HTML string (no external resources)."""
    ex = placement.get("explain") or {}
    phys = placement.get("physical_devices") or {}
    per = (placement.get("transfers") or {}).get("per_step") or {}
    fallbacks, predicted = split_fallbacks(placement)
    conf = placement.get("conformance") or {}
    rc = placement.get("replica_consistency") or None
    parts = []

    # --- headline cards
    score = conf.get("score")
    cards = [
        ("devices", len(placement.get("devices") or []), False),
        ("transfers / step", per.get("count", 0), False),
        ("bytes / step", human_bytes(per.get("bytes", 0)), False),
        ("fallbacks", len(fallbacks), bool(fallbacks)),
        *([("predicted fallbacks", len(predicted), True)] if predicted else []),
        ("conformance", "n/a" if score is None else f"{score:.2f}", score is not None and score < 1.0),
        *_drift_cards(rc),
    ]
    card_html = "".join(
        f'<div class="card{" " + bad if isinstance(bad, str) else " bad" if bad else ""}"><b>{_e(v)}</b>'
        f'<span>{_e(k)}</span></div>' for k, v, bad in cards
    )
    parts.append(
        _section(
            "Summary",
            "Read from the partition graphs the TensorFlow runtime actually executed on the sampled "
            f"step(s) {placement.get('captured_steps')}; op.device is only a request, this is what ran.",
            f'<div class="cards">{card_html}</div>'
            + "".join(f"<p><b>Note:</b> {_e(n)}</p>" for n in placement.get("notes") or [])
            + f'<pre>{_e(format_summary(placement, metrics))}</pre>',
            "summary",
        )
    )

    # --- devices and aliases
    aliases = placement.get("device_aliases") or {}
    rows = [[d, phys.get(d, d), "emulated: logical CPU device" if d in aliases else ""] for d in placement.get("devices") or []]
    alias_note = (
        "This run emulated its spec GPUs: each spec device '/GPU:i' ran on logical CPU device "
        "'/CPU:i+1' of the same process; '/CPU:0' is the host. Everything below uses spec names."
        if aliases
        else "Devices as the runtime named them."
    )
    parts.append(
        _section(
            "Devices",
            ex.get("devices", "") + " " + alias_note,
            _table(["device (spec name)", "physical device", "note"], rows),
            "devices",
        )
    )

    # --- ops
    ops = placement.get("ops_by_device") or {}
    grads = (placement.get("gradients") or {}).get("ops_by_device") or {}
    rows = [[_dev(d, phys), n, grads.get(d, 0)] for d, n in ops.items()]
    parts.append(
        _section(
            "Ops by device",
            ex.get("ops_by_device", ""),
            _table(["device", "ops / step", "of which backward pass"], rows, num_cols=(1, 2))
            + _img(charts.get("ops_per_device.png"), "ops per device")
            + "<p class='what'>Device x op-type heatmap (ops per step; the most frequent types, the rest as '(other)'):</p>"
            + _img(charts.get("ops_heatmap.png"), "device x op-type heatmap"),
            "ops",
        )
    )

    # --- transfers
    tr = placement.get("transfers") or {}
    mrows = []
    for s, row in (tr.get("matrix") or {}).items():
        for d, cell in row.items():
            mrows.append([_dev(s, phys), _dev(d, phys), cell.get("count", 0), human_bytes(cell.get("bytes", 0))])
    largest = [
        [(f"[{t['task']}] " if t.get("task") else "") + t["tensor"], t["from"], t["to"],
         human_bytes(t["bytes"]) if t.get("bytes") is not None else "unknown"]
        for t in (tr.get("largest") or [])[:15]
    ]
    sized = f"{per.get('sized', 0)} of {per.get('count', 0)} transfers per step were sized" + (
        f"; {per.get('unsized')} could not be (shape unknown), their bytes are not counted" if per.get("unsized") else ""
    )
    loop = tr.get("loop_control") or {}
    if loop.get("count"):
        sized += (f"; not in the table: {loop['count']} transfer(s) per step of the training loop's own "
                  "predicate and control signal to each device")
    coll = tr.get("collectives") or {}
    coll_html = ""
    if coll:
        coll_html = "<p class='what'>" + _e(ex.get("collectives", "")) + "</p>" + _table(
            ["device", "collective ops / step", "bytes reduced / step"],
            [[_dev(d, phys), c.get("count", 0), human_bytes(c.get("input_bytes", 0))] for d, c in coll.items()],
            num_cols=(1, 2),
        )
    parts.append(
        _section(
            "Transfers between devices",
            ex.get("transfers", "") + " " + sized + ".",
            _img(charts.get("transfer_matrix.png"), "transfer matrix")
            + _table(["from", "to", "transfers / step", "bytes / step"], mrows, num_cols=(2, 3))
            + "<p class='what'>Largest transfers of one step (tensor = the op whose output was sent):</p>"
            + _table(["tensor", "from", "to", "bytes"], largest, num_cols=(3,))
            + coll_html,
            "transfers",
        )
    )

    # --- time per device (placement.timing)
    if placement.get("timing"):
        parts.append(_timing_section(placement["timing"], ex.get("timing") or EXPLAIN["timing"], phys, charts))

    # --- fallbacks
    if fallbacks:
        rows = [
            [(f"[{f['task']}] " if f.get("task") else "") + f["op"], f["op_type"],
             _dev(f["requested"], {f["requested"]: f.get("requested_physical", f["requested"])}),
             _dev(f["placed"], phys), f.get("reason", "")]
            for f in fallbacks
        ]
        body = f'<p><span class="bad">{len(fallbacks)} op(s) did not run where they were requested.</span></p>' + _table(
            ["op", "type", "requested", "ran on", "why"], rows, bad_rows=set(range(len(rows)))
        )
    else:
        body = '<p><span class="good">None: every op that requested a device ran on it.</span></p>'
    if predicted:
        rows = [
            [(f"[{f['task']}] " if f.get("task") else "") + f["op"], f["op_type"], _dev(f["placed"], phys),
             f.get("would_run_on", ""), f.get("reason", "")]
            for f in predicted
        ]
        body += (
            f'<p class="what"><span class="bad">Predicted for a GPU machine: {len(predicted)} op(s) ran on an '
            "emulated GPU here but have no GPU kernel for their dtypes (TensorFlow's kernel registry), so a "
            "GPU machine runs them on the host and copies their inputs and outputs across.</span></p>"
            + _table(["op", "type", "ran on (emulated)", "GPU machine: runs on", "why"], rows,
                     bad_rows=set(range(len(rows))))
        )
    parts.append(_section("Fallbacks", ex.get("fallbacks", ""), body, "fallbacks"))

    # --- variables
    vars_ = placement.get("variables") or []
    rows, bad = [], set()
    for i, v in enumerate(vars_):
        devs = ", ".join(_dev(d, phys) for d in v.get("devices", []))
        upd = ", ".join(_dev(d, phys) for d in v.get("update_devices", [])) or "-"
        if v.get("update_devices") and not set(v["update_devices"]) <= set(v.get("devices", [])):
            bad.add(i)
        rows.append([v["name"], v.get("kind", ""), "x".join(map(str, v.get("shape") or [])) or "scalar",
                     human_bytes(v.get("bytes")), len(v.get("components") or []), devs, upd])
    vu = placement.get("variable_updates") or {}
    parts.append(
        _section(
            "Variables",
            ex.get("variables", "") + f" Attribution of update ops: {vu.get('coverage', 'n/a')}"
            + (f" ({vu['method']})." if vu.get("method") else "."),
            _table(["variable", "kind", "shape", "bytes", "components", "lives on", "updated on"], rows, bad_rows=bad,
                   num_cols=(3, 4))
            + _img(charts.get("variable_bytes.png"), "variable bytes by device"),
            "variables",
        )
    )

    # --- gradients
    g = placement.get("gradients") or {}
    parts.append(
        _section(
            "Gradients (backward pass)",
            ex.get("gradients", ""),
            _table(["device", "backward-pass ops / step"], [[_dev(d, phys), n] for d, n in (g.get("ops_by_device") or {}).items()], num_cols=(1,)),
            "gradients",
        )
    )

    # --- conformance
    rules = conf.get("rules") or []
    rows, bad = [], set()
    for i, r in enumerate(rules):
        s = r.get("score")
        if s is not None and s < 1.0:
            bad.add(i)
        observed = ", ".join(f"{d}: {n}" for d, n in (r.get("observed") or {}).items())
        # layers.<name>: the forward and backward passes scored apart (a layer's backward ops
        # may ignore its pin while its forward ops obey it).
        parts_ = [f"{part} {r[part]['score']:.2f} ({r[part]['relevant']})" for part in ("forward", "backward")
                  if (r.get(part) or {}).get("score") is not None]
        rows.append([(f"[{r['task']}] " if r.get("task") else "") + r["rule"], r["planned"], observed or "-",
                     r["relevant"], "n/a (no relevant ops)" if s is None else f"{s:.2f}", ", ".join(parts_) or "-"])
    vrows = [
        [(f"[{r['task']}] " if r.get("task") else "") + r["rule"], v["op"], v["placed"], r["planned"], v.get("why", "")]
        for r in rules for v in (r.get("violations") or [])[:20]
    ]
    body = _img(charts.get("conformance.png"), "conformance") + (
        _table(["rule", "planned", "observed", "relevant ops", "score", "forward / backward (ops)"], rows,
               bad_rows=bad, num_cols=(3, 4))
        if rules else "<p class='muted'>No pinning rules configured and no strategy rules apply.</p>"
    )
    if vrows:
        body += "<p><span class='bad'>Violations</span> (up to 20 per rule):</p>" + _table(
            ["rule", "op / variable", "ran on", "planned", "likely cause"], vrows, bad_rows=set(range(len(vrows)))
        )
    what = ex.get("conformance", "") + (
        " Strategy rules: mirrored strategies keep one component of every variable on every replica device "
        "and run replica i's compute on device i; central storage keeps variables on the host; "
        "parameter servers hold variables on ps tasks."
    )
    parts.append(_section("Conformance with the plan", what, body, "conformance"))

    # --- model parallelism: one row per pinned layer
    layer_rows = placement.get("layers") or []
    if layer_rows:
        def per_dev(counts: dict) -> str:
            return ", ".join(f"{d}: {n:g}" for d, n in counts.items()) or "-"

        rows, bad = [], set()
        for i, r in enumerate(layer_rows):
            off = set(r["forward_ops"]) | set(r["backward_ops"])
            if off - {r["device"]}:
                bad.add(i)
            rows.append([r["layer"], r["device"], per_dev(r["forward_ops"]), per_dev(r["backward_ops"]),
                         human_bytes(r["bytes_in"]), human_bytes(r["bytes_out"])])
        parts.append(_section(
            "Layers split across devices",
            "Model parallelism at a glance: each pinned layer's device, where its forward and backward ops "
            "ran per step, and the bytes its ops receive from and send to other devices per step (the "
            "boundary activation out, its gradient back in). A row is red when some of its ops ran elsewhere.",
            _table(["layer", "planned", "forward ops", "backward ops", "bytes in", "bytes out"], rows,
                   bad_rows=bad), "layers"))

    # --- replica consistency
    parts.append(_section("Replica consistency", ex.get("replica_consistency", ""), _replicas_body(rc), "replicas"))

    # --- input pipeline and precision (user data through tf.data; mixed precision casts)
    pipe = placement.get("input_pipeline")
    prec = placement.get("precision") or {}
    if pipe or prec.get("policy", "float32") != "float32":
        rows = []
        if pipe:
            shard = pipe.get("sharding") or {}
            rows.append(["input pipeline", f"{pipe.get('kind')} from {pipe.get('source')}", _dev(pipe.get("device", ""), phys)])
            if shard.get("by") == "none":
                rows.append(["sharding", "none (one worker reads everything)", ""])
            else:
                rows.append(["sharding", f"by {shard.get('by')}: worker {shard.get('worker')} of "
                             f"{shard.get('workers')}, {shard.get('files')} file(s)", ""])
            ops_ = {k: v for k, v in (pipe.get("ops") or {}).items() if not k.startswith("_")}
            rows.append(["dataset ops", ", ".join(f"{k} x{v}" for k, v in ops_.items()), ""])
        if prec:
            casts = prec.get("casts_by_device") or {}
            rows.append(["precision", prec.get("policy"), ", ".join(f"{d}: {n} Cast" for d, n in casts.items())])
        parts.append(_section(
            "Input pipeline and precision",
            "A tf.data pipeline runs its dataset ops inside the iterator, on the iterator's device; each "
            "replica's batch is then copied to the replica (a transfer above). Under a mixed policy, float32 "
            "variables are cast to the compute dtype where each layer runs: the Cast ops per device.",
            _table(["what", "value", "device"], rows), "input"))

    # --- multi-worker
    tasks = placement.get("tasks") or {}
    if tasks:
        rows = []
        for t, tp in tasks.items():
            tper = (tp.get("transfers") or {}).get("per_step") or {}
            rows.append([t, ", ".join(tp.get("devices") or []), sum((tp.get("ops_by_device") or {}).values()),
                         tper.get("count", 0), human_bytes(tper.get("bytes", 0)), len(tp.get("fallbacks") or []),
                         (tp.get("conformance") or {}).get("score")])
        parts.append(
            _section(
                "Tasks of the cluster",
                "Each task captured and analysed its own partition graphs; the chief merged them "
                "(devices united, counts summed, conformance averaged).",
                _table(["task", "devices", "ops / step", "transfers / step", "bytes / step", "fallbacks", "conformance"],
                       rows, num_cols=(2, 3, 4, 5)),
                "tasks",
            )
        )

    nav = " | ".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in [("summary", "summary"), ("devices", "devices"), ("ops", "ops"), ("transfers", "transfers"),
                     ("fallbacks", "fallbacks"), ("variables", "variables"), ("gradients", "gradients"),
                     ("conformance", "conformance"), ("layers", "layers"), ("replicas", "replicas")]
        + ([("timing", "time")] if placement.get("timing") else [])
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{_e(title)}</h1><p>strategy {_e(placement.get('strategy'))} &middot; task "
        f"{_e(placement.get('task'))} &middot; where every op, variable and gradient actually ran</p></header>"
        f"<main><p>{nav}</p>{''.join(parts)}</main></body></html>\n"
    )


def _drift_cards(rc: dict | None) -> list[tuple[str, str, bool | str]]:
    """The summary's drift cards: trainable drift red when not 0 (a sync bug), state drift amber
    (per-replica state, explained in the section); one card for a placement.json before the split."""
    if not rc or rc.get("max_abs_diff") is None:
        return [("replica drift", "n/a", False)]
    if rc.get("trainable_drift") is None:
        return [("replica drift", f"{rc['max_abs_diff']:.3g}", bool(rc["max_abs_diff"]))]
    return [("trainable drift", f"{rc['trainable_drift']:.3g}", bool(rc["trainable_drift"])),
            ("state drift", f"{rc['state_drift']:.3g}", "warn" if rc["state_drift"] else False)]


def _replicas_body(rc: dict | None) -> str:
    if not rc:
        return "<p class='muted'>Not applicable: no variable has more than one component in this run.</p>"
    drift = rc.get("max_abs_diff")
    classes = rc.get("classes") or {}
    if rc.get("trainable_drift") is None:
        head = (f"<p>max |component_i - component_0| = <span class='{'bad' if drift else 'good'}'>{drift}</span> "
                f"over {rc.get('checked', 0)} variable(s).</p>")
    else:
        t, st = rc["trainable_drift"], rc["state_drift"]
        head = (f"<p>Trainable drift (must be 0): <span class='{'bad' if t else 'good'}'>{t:.3g}</span>"
                + (" &mdash; copies that the strategy keeps identical differ: an all-reduce is broken."
                   if t else "") + "</p>"
                f"<p>State drift (per-replica by design): <span class='{'warn' if st else 'good'}'>{st:.3g}</span> "
                f"over {rc.get('checked', 0)} variable(s).</p>")
    if rc.get("method"):
        head += f"<p class='what'>{_e(rc['method'])}</p>"
    for group in rc.get("state") or []:
        names = group["variables"]
        head += (f"<p><span class='warn'>{len(names)} {_e(group['what'])} differ by design</span> (largest "
                 f"{group['drift']:.3g}). <b>Why:</b> {_e(group['cause'])}. <b>A checkpoint or export keeps:</b> "
                 f"{_e(group['checkpoint_keeps'])}. <b>Fix:</b> {_e(group['fix'])}.</p>"
                 + _table(["variable", "layer", "drift"],
                          [[v["variable"], v["layer"], f"{v['drift']:.3g}"] for v in names], num_cols=(2,)))
    rows, bad, warn = [], set(), set()
    for i, (n, d) in enumerate(sorted((rc.get("variables") or {}).items(), key=lambda kv: -kv[1])):
        cls = classes.get(n, "")
        rows.append([n, cls, f"{d:.3g}"])
        if d > 0:
            (warn if cls in ("replica_state", "sync_on_read") else bad).add(i)
    return head + _table(["variable", "class", "max abs diff"], rows, bad_rows=bad, warn_rows=warn, num_cols=(2,))


def _timing_section(timing: dict, what: str, phys: dict, charts: dict[str, Path]) -> str:
    devs = timing.get("devices") or {}
    notes = "".join(f"<p><b>Note:</b> {_e(n)}</p>" for n in timing.get("notes") or [])
    if not devs:
        return _section("Time per device", what, notes or "<p class='muted'>Not measured.</p>", "timing")
    steps = timing.get("steps") or []
    head = (f"<p>Timed steps {_e(steps)}: {timing.get('wall_ms')} ms wall"
            + (f" ({timing['step_ms']} ms per step)" if timing.get("step_ms") is not None else "")
            + (f"; the trace is in <code>{_e(timing['trace'])}/</code>: open it with "
               f"<code>tensorboard --logdir {_e(timing['trace'])}</code> (Profile tab)" if timing.get("trace") else "")
            + ".</p>")
    rows = [[_dev(d, phys), t.get("busy_ms"), t.get("compute_ms"), t.get("transfer_ms"),
             f"{100 * t.get('transfer_share', 0):.1f}%",
             "n/a" if t.get("idle_share") is None else f"{100 * t['idle_share']:.1f}%", t.get("ops")]
            for d, t in devs.items()]
    top = [[_dev(d, phys), o["op"], o["type"], o["ms"], o["count"]] for d, t in devs.items() for o in t.get("top_ops") or []]
    return _section(
        "Time per device", what,
        head + _img(charts.get("time_per_device.png"), "time per device")
        + _table(["device", "busy ms", "compute ms", "transfer ms", "transfers / busy", "idle", "op runs"], rows,
                 num_cols=(1, 2, 3, 4, 5, 6))
        + "<p class='what'>Top ops by time on each device (their own time, summed over the timed steps):</p>"
        + _table(["device", "op", "type", "ms", "runs"], top, num_cols=(3, 4)) + notes,
        "timing")


def write_report(run_dir: Path) -> tuple[Path, dict[str, Path], dict]:
    """Write DIR/report.html and DIR/charts/*.png; return (html path, charts, placement)."""
    from pinpoint.placement.charts import write_charts

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir: got '{run_dir}', which is not a folder; pass a trained run folder such as runs/demo")
    placement = read_placement(run_dir / PLACEMENT)
    if not isinstance(placement, dict) or "ops_by_device" not in placement:
        raise ConfigError(
            f"run_dir: got '{run_dir}', whose {PLACEMENT} is not a placement file; re-run `pinpoint train` with "
            "placement.enabled: true"
        )
    metrics_path = run_dir / METRICS
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else None
    charts = write_charts(placement, run_dir / CHARTS_DIR)
    title = f"Pinpoint placement report: {run_dir.resolve().name}"
    out = atomic_write_text(run_dir / REPORT_HTML, render_html(placement, metrics, charts, title))
    return out, charts, placement
