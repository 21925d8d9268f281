"""RESULTS.md and the PNG chart from the raw records (the markdown part is pure)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.flops import ring_allreduce_min_bytes
from benchmarks.plan import Comparison
from benchmarks.stats import (
    MIN_VALUES,
    RESAMPLES,
    TOLERANCE,
    Summary,
    decide,
    fmt,
    fmt_summary,
    paired_ratios,
    summarize,
)
from benchmarks.table import markdown_table

Results = dict[str, dict[str, list[dict]]]


def values(recs: Sequence[dict], key: str) -> list[float | None]:
    """One value per round (None for a failed run or a missing field)."""
    return [None if ("error" in r or r.get(key) is None) else float(r[key]) for r in recs]


def summ(recs: Sequence[dict], key: str, scale: float = 1.0, *, interval: bool = False) -> Summary | None:
    vals = [None if v is None else v * scale for v in values(recs, key)]
    return summarize(vals, interval=interval)


def ratio_summary(results: Results, comp: str, num: str, den: str, metric: str) -> Summary | None:
    """The same-round ratios num / den: median, range and the median's 95% interval."""
    runs = results.get(comp) or {}
    if num not in runs or den not in runs:
        return None
    a, b = values(runs[num], metric), values(runs[den], metric)
    n = min(len(a), len(b))
    return summarize(paired_ratios(a[:n], b[:n]), interval=True)


def pooled(recs: Sequence[dict], key: str) -> list[float]:
    """The list field `key` of every good record, one list (e.g. the pairs of blocks of every round)."""
    return [float(v) for r in recs if "error" not in r for v in (r.get(key) or [])]


def compare_summary(results: Results, comp: str, rt) -> Summary | None:
    """A Ratio's same-round values with their interval: num / den, num - den for a difference,
    num's own for den "" (or, with `pooled`, num's list field pooled over the rounds)."""
    if getattr(rt, "pooled", None):
        return summarize(pooled((results.get(comp) or {}).get(rt.num, []), rt.pooled), interval=True)
    if not rt.den:
        return summ((results.get(comp) or {}).get(rt.num, []), rt.metric, interval=True)
    if not rt.difference:
        return ratio_summary(results, comp, rt.num, rt.den, rt.metric)
    runs = results.get(comp) or {}
    a, b = values(runs.get(rt.num, []), rt.metric), values(runs.get(rt.den, []), rt.metric)
    return summarize([None if x is None or y is None else x - y for x, y in zip(a, b)], interval=True)


def target_met(s: Summary | None, target: str | None) -> str:
    """The verdict by the interval (stats.decide); "" without a target."""
    return decide(s, target) if target else ""


def _pct(s: Summary | None) -> str:
    return fmt_summary(s, 3, "%")


def _n(comp_runs: dict) -> int:
    return max((len(v) for v in comp_runs.values()), default=0)


def section_keras(plan: list[Comparison], results: Results) -> str:
    rows = []
    for c in plan:
        if not c.key.startswith("keras-"):
            continue
        if c.key not in results:
            rows.append([c.title, "skipped" if c.skipped else "not run", "", "", "", "", "", ""])
            continue
        runs, ratio = results[c.key], c.ratios[0]
        r = ratio_summary(results, c.key, "pinpoint", "keras", "examples_per_sec")
        rows.append([
            c.title,
            fmt_summary(summ(runs["pinpoint"], "examples_per_sec"), 4),
            fmt_summary(summ(runs["keras"], "examples_per_sec"), 4),
            fmt_summary(r),
            target_met(r, ratio.target) or "recorded",
            _pct(summ(runs["pinpoint"], "mfu", 100)) + " / " + _pct(summ(runs["keras"], "mfu", 100)),
            _settings(c, runs),
            str(_n(runs)),
        ])
    notes = [f"- {c.title}: {c.note}" for c in plan if c.key.startswith("keras-") and c.note]
    # A pair's further ratios (issue 34.2: MobileNetV2 tracked against untracked), one line each.
    notes += [f"- {c.title}: {rt.label} = {fmt_summary(compare_summary(results, c.key, rt), 4)}"
              + (f": **{target_met(compare_summary(results, c.key, rt), rt.target)}**" if rt.target else "")
              for c in plan if c.key.startswith("keras-") and c.key in results for rt in c.ratios[1:]]
    return markdown_table(
        ["setup", "pinpoint train ex/s", "Keras fit ex/s", "ratio pinpoint/Keras", "issue 3.8",
         "MFU pinpoint / Keras", "XLA, steps per call (pinpoint / Keras)", "runs"],
        rows,
    ) + ("\n" + "\n".join(notes) + "\n" if notes else "") + _anatomy(plan, results)


def _anatomy(plan: list[Comparison], results: Results) -> str:
    """Issue 34.4: what separates strategy none from Keras, from the loop-anatomy comparison."""
    from benchmarks.plan import ANATOMY

    c = next((c for c in plan if c.key == "loop-anatomy"), None)
    if c is None or c.key not in results:
        return ""
    good = [r for r in results[c.key].get(c.arms[0].name, []) if "error" not in r]
    if not good:
        return "\nWhat Keras' loop does that Pinpoint's does not: every run failed (see Skipped and failed runs).\n"
    lines, saved, gap, peer, keras_faster = [], [], [], None, False
    for (_key, what, kind), rt in zip(ANATOMY, c.ratios, strict=True):  # the plan's ratios, in ANATOMY's order
        r = compare_summary(results, c.key, rt)
        decided = r is not None and r.low is not None
        # Decided by the interval: a former choice cost speed if putting it back is slower; a
        # Keras choice is part of the gap if taking it is faster.
        if kind == "former":
            slower = decided and r.high < 1
            verdict = ("slower with it: what choosing on the host saves" if slower else
                       "not slower with it by its interval")
            if slower:
                saved.append(f"{fmt_summary(r, 3)} with the examples chosen in the step")
        elif kind == "peer":
            keras_faster = decided and r.low > 1
            peer = ("Keras' is faster: the training functions differ" if keras_faster else
                    "Pinpoint's is faster by its interval" if decided and r.high < 1 else
                    "no difference by its interval")
            verdict = peer
        else:
            faster = decided and r.low > 1
            verdict = "faster with it: part of the gap" if faster else "not faster with it: not the reason here"
            if faster:
                gap.append(what)
        lines.append(f"- {what}: {fmt_summary(r, 4)}: {verdict}")
    g = good[0]
    if peer is None or keras_faster:
        conclusion = (f"Keras' choices that would close part of the gap here: {'; '.join(gap)}." if gap else
                      "Neither of Keras' choices is faster than Pinpoint's own function by its interval in this run.")
    else:
        conclusion = ("Call by call in one process, Keras' train function is not faster than Pinpoint's "
                      f"({peer[0].lower() + peer[1:]}): a gap in the end-to-end row above is not in the training "
                      "function. That row runs each arm in a fresh process, `pinpoint train` with what it does around "
                      "the function (the first call's capture, the train log, the call's example indices)"
                      + _spread_against_gap(results) + "."
                      + (f" Keras' choices that would make Pinpoint's function faster still: {'; '.join(gap)}."
                         if gap else ""))
    return (
        "\n**What Keras' loop does that Pinpoint's does not** (strategy none, issue 34.4). Pinpoint's own training "
        "function in one process against a copy with one choice changed, and against Keras' own train function "
        f"(benchmarks/loop_anatomy.py: the keras-none config, {g.get('steps_per_call', '?')} steps a call, XLA on; "
        f"{g.get('rounds', '?')} rounds of {g.get('calls', '?')} pairs of calls back to back, the order alternating); "
        "speed of the variant over Pinpoint's, median of the rounds [95% interval] (min–max):\n\n"
        + "\n".join(lines) + "\n\n"
        "Pinpoint draws each call's example indices on the host from a seeded permutation per epoch (`EpochOrder`: "
        "a resumed run sees the same batches) and passes them to the training function; it chose them inside the "
        "step with TensorFlow's per-example RandomIndexShuffle before (where Keras shuffles in tf.data on a "
        f"background thread){': ' + '; '.join(saved) if saved else ''}. "
        "Keras compiles its whole train step with XLA, the optimizer's update included; Pinpoint compiles "
        "forward and backward and applies the gradients outside, where its capture reports each update op and "
        "its device (`variable_updates`). Keras' distributed dataset prefetches each batch onto the device on a "
        f"background thread; Pinpoint gathers the batch on the input device ({g.get('input_device', '?')}, the host) "
        f"inside the step, so the input placement is part of the step's graphs, and each step copies it to the "
        f"replica ({g.get('device', '?')}): its loop runs in two partitions. Both are choices for what the report can "
        f"show. {conclusion}\n")


def _spread_against_gap(results: Results) -> str:
    """How much Pinpoint's steady rate varied between the keras-none row's processes, against the
    row's gap to Keras (both from the run's records)."""
    eps = summ((results.get("keras-none") or {}).get("pinpoint", []), "examples_per_sec")
    r = ratio_summary(results, "keras-none", "pinpoint", "keras", "examples_per_sec")
    if eps is None or r is None or not eps.median:
        return ""
    spread, gap = (eps.max - eps.min) / eps.median, abs(r.median - 1)
    return (f"; its steady rate varied from process to process by {fmt(100 * spread, 3)}% of its median (the row's "
            f"min–max), {'more' if spread > gap else 'less'} than the gap, {fmt(100 * gap, 3)}%")


def _first(recs: Sequence[dict], key: str):
    return next((r[key] for r in recs if "error" not in r and r.get(key) is not None), None)


def _settings(c: Comparison, runs: dict) -> str:
    onoff = lambda v: "?" if v is None else ("on" if v else "off")
    spe_pp = c.arms[0].spec["config"]["train"].get("log_every", 10)
    pp, ke = runs.get("pinpoint", []), runs.get("keras", [])
    return (f"XLA {onoff(_first(pp, 'jit_compile'))} / {onoff(_first(ke, 'jit_compile'))}, "
            f"{spe_pp} / {_first(ke, 'steps_per_execution') or '?'}")


def section_targets(plan: list[Comparison], results: Results, *, partial: bool = False) -> str:
    """One line per target of every section, met or not met as measured (a partial run: the
    targets of what it ran)."""
    lines = []
    for c in plan:
        if partial and c.key not in results:
            continue
        for rt in c.ratios:
            if not rt.target:
                continue
            r = compare_summary(results, c.key, rt)
            verdict = (target_met(r, rt.target) if c.key in results
                       else f"skipped, {c.skipped}" if c.skipped else "not run")
            lines.append(f"- {c.title}: {rt.label} = {fmt_summary(r)}: **{verdict}**")
    return "\n".join(lines) + "\n" if lines else "none\n"


def section_times(plan: list[Comparison], raw: dict) -> str:
    """Each comparison's runs, the plan's estimate and the time it took (results.json `timings`)."""
    planned, took = raw.get("planned_s") or {}, raw.get("timings") or {}
    rows = [[c.key, c.section, fmt(planned.get(c.key, 0) / 60, 3), fmt(took[c.key] / 60, 3)]
            for c in plan if c.key in took]
    total = [["all", "", fmt(sum(planned.get(k, 0) for k in took) / 60, 3), fmt(sum(took.values()) / 60, 3)]]
    return markdown_table(["comparison", "section", "planned min", "took min"], rows + total) if rows else "none\n"


def section_overhead(plan: list[Comparison], results: Results) -> str:
    comp = next((c for c in plan if c.key == "overhead"), None)
    if comp is None or comp.key not in results:
        return "not run\n"
    runs = results[comp.key]
    arm_rows = []
    for a in comp.arms:
        recs = runs.get(a.name, [])
        arm_rows.append([a.label, fmt_summary(summ(recs, "train_s")), fmt_summary(summ(recs, "examples_per_sec"), 4),
                         fmt_summary(summ(recs, "process_wall_s")), str(len(recs))])
    out = markdown_table(["arm", "train time s (train_command)", "steady ex/s", "process wall s", "runs"], arm_rows)
    ratio_rows = []
    for rt in comp.ratios:
        # A steady cost: the ratio of steady rates; a fixed cost: the difference in seconds (issue 50.2).
        r = compare_summary(results, comp.key, rt)
        wall = compare_summary(results, comp.key, dataclasses.replace(rt, metric="process_wall_s", difference=True))
        ratio_rows.append([rt.label, fmt_summary(r, 3, " s" if rt.difference else ""), fmt_summary(wall, 3, " s"),
                           target_met(r, rt.target) or "recorded"])
    out += "\n" + markdown_table(["same round", "value", "process wall difference", "target"], ratio_rows)
    return out


def section_tracking(plan: list[Comparison], results: Results) -> str:
    """Issue 15.4: tracking on/off (local store, real server), with and without the model."""
    comp = next((c for c in plan if c.key == "tracking"), None)
    if comp is None or comp.key not in results:
        return "not run\n"
    runs = results[comp.key]
    arm_rows = [[a.label, fmt_summary(summ(runs.get(a.name, []), "train_s")),
                 fmt_summary(summ(runs.get(a.name, []), "examples_per_sec"), 4),
                 fmt_summary(summ(runs.get(a.name, []), "process_wall_s")), str(len(runs.get(a.name, [])))]
                for a in comp.arms]
    out = markdown_table(["arm", "train time s (train_command)", "steady ex/s", "process wall s", "runs"], arm_rows)
    rows = []
    for rt in comp.ratios:
        r = compare_summary(results, comp.key, rt)
        wall = (compare_summary(results, comp.key, dataclasses.replace(rt, metric="process_wall_s"))
                if rt.difference else None)
        rows.append([rt.label, fmt_summary(r, 3, " s" if rt.difference else ""),
                     fmt_summary(wall, 3, " s") if wall else "", target_met(r, rt.target) or "recorded"])
    out += "\n" + markdown_table(["same round", "value", "process wall difference", "target"], rows)
    return out + (f"\n{comp.note}\n" if comp.note else "")


def bytes_points(plan: list[Comparison], results: Results, key: str) -> list[dict[str, Any]]:
    """Per arm of comparison `key`: examples/sec, measured bytes per step and the ring minimum."""
    comp = next((c for c in plan if c.key == key), None)
    if comp is None or comp.key not in results:
        return []
    points = []
    for a in comp.arms:
        recs = results[comp.key].get(a.name, [])
        n = a.spec["config"]["cluster"]["devices_per_worker"]
        pb = next((r["param_bytes"] for r in recs if r.get("param_bytes")), None)
        measured = summ(recs, "transfer_bytes_per_step")
        coll = summ(recs, "collective_bytes_per_step")
        points.append({
            "arm": a.name,
            "all_reduce": a.spec["config"]["train"].get("all_reduce", "auto"),
            "devices": n,
            "eps": summ(recs, "examples_per_sec"),
            "mfu": summ(recs, "mfu", 100),
            "bytes": measured,
            # Ring all-reduce on the wire, per device: 2(N-1)/N of the bytes each device reduces.
            "collective_wire_per_device": (ring_allreduce_min_bytes(n, coll.median / n)
                                           if coll and coll.median else 0),
            "param_bytes": pb,
            "ring_min_per_device": ring_allreduce_min_bytes(n, pb) if pb else None,
            "runs": len(recs),
        })
    return points


def scaling_points(plan: list[Comparison], results: Results) -> list[dict[str, Any]]:
    """Per device count: examples/sec, measured bytes per step and the ring minimum."""
    return bytes_points(plan, results, "scaling")


def _bytes_cells(p: dict[str, Any]) -> list[str]:
    """_Send/_Recv bytes per step, collective wire bytes per device, per device (the collective
    wire bytes + the device's share of the _Send/_Recv bytes), ring minimum, measured / minimum."""
    n, b, ring = p["devices"], p["bytes"], p["ring_min_per_device"]
    wire = p.get("collective_wire_per_device") or 0
    per_dev = b.median / n + wire if b else None
    return [
        fmt(b.median, 6) if b else "n/a", fmt(wire, 6), fmt(per_dev, 6),
        fmt(ring, 6) if ring is not None else "n/a",
        (fmt(per_dev / ring) + "x") if per_dev and ring else ("n/a (nothing to reduce)" if ring == 0 else "n/a"),
    ]


def section_scaling(plan: list[Comparison], results: Results) -> str:
    pts = scaling_points(plan, results)
    if not pts:
        return "not run\n"
    rows = [[str(p["devices"]), fmt_summary(p["eps"], 4), _pct(p["mfu"]), *_bytes_cells(p), str(p["runs"])]
            for p in pts]
    pb = next((p["param_bytes"] for p in pts if p["param_bytes"]), None)
    head = f"Parameter bytes P = {fmt(pb, 6)} (float32 trainable parameters).\n\n" if pb else ""
    return head + markdown_table(
        ["devices", "ex/s", "MFU", "_Send/_Recv bytes / step", "ring all-reduce / device", "per device",
         "ring min 2(N-1)/N·P",
         "measured / min", "runs"],
        rows,
    )


def section_allreduce(plan: list[Comparison], results: Results) -> str:
    """Issue 15.6: each train.all_reduce choice run here, its bytes against the ring minimum."""
    comp = next((c for c in plan if c.key == "allreduce"), None)
    pts = bytes_points(plan, results, "allreduce")
    if comp is None or not pts:
        return f"skipped: {comp.skipped}\n" if comp is not None and comp.skipped else "not run\n"
    rows = [[p["all_reduce"], str(p["devices"]), fmt_summary(p["eps"], 4), *_bytes_cells(p), str(p["runs"])]
            for p in sorted(pts, key=lambda p: p["devices"]) if p["runs"]]  # arms not run: no row
    return markdown_table(
        ["choice", "devices", "ex/s", "_Send/_Recv bytes / step", "collective wire bytes / device", "per device",
         "ring min 2(N-1)/N·P", "measured / min", "runs"],
        rows,
    ) + (f"\n{comp.note}\n" if comp.note else "")




def section_real_models(plan: list[Comparison], results: Results) -> str:
    """Issue 25.5: capture + analysis at scale, one row per model and device count; the growth
    stated as analysis time per op across the rows (constant: linear in ops)."""
    from benchmarks.targets import target
    comp = next((c for c in plan if c.key == "real-models"), None)
    if comp is None or comp.key not in results:
        return f"skipped: {comp.skipped}\n" if comp is not None and comp.skipped else "not run\n"
    rows, per_op = [], {}
    for a in comp.arms:
        recs = [r for r in results[comp.key].get(a.name, []) if "error" not in r]
        if not recs:
            continue
        rec = {k: (summ(recs, k).median if summ(recs, k) else None) for k in recs[0]
               if isinstance(recs[0][k], (int, float)) and not isinstance(recs[0][k], bool)}
        model, n = a.name.rsplit("-n", 1)
        us = 1e6 * rec["analysis_s"] / rec["ops_per_step"] if rec.get("ops_per_step") else None
        per_op.setdefault(model, []).append(us)
        rows.append([model, n, fmt(rec.get("ops_per_step"), 6), fmt(rec.get("analysis_s"), 3), fmt(us, 3),
                     fmt(rec.get("write_s"), 3), fmt(rec.get("placement_json_mb"), 3),
                     fmt(rec.get("placement_ops_mb"), 3), fmt(rec.get("peak_rss_mb"), 4),
                     fmt(rec.get("analysis_rss_growth_mb"), 3),
                     fmt(rec.get("open_report_ms"), 3) if rec.get("open_report_ms") is not None else ""])
    if not rows:
        return "not run\n"
    lines = []
    for model, vals in per_op.items():
        vals = [v for v in vals if v]
        if len(vals) > 1:
            # One run per device count: the spread is recorded against its target, not decided.
            spread = max(vals) / min(vals)
            lines.append(f"- {model}: analysis time per op {fmt(min(vals), 3)}-{fmt(max(vals), 3)} µs over "
                         f"{len(vals)} device counts (largest / smallest {fmt(spread, 3)}); target linear in ops "
                         f"(per-op time, largest / smallest {target('real_models.per_op_spread')}): "
                         f"**recorded (one run per device count)**")
    opened = summarize(pooled([r for recs in results[comp.key].values() for r in recs], "open_report_runs_ms"),
                       interval=True)
    if opened:
        lines.append(f"- report.html of each model's largest run opened in headless Chromium: "
                     f"{fmt_summary(opened, 3, ' ms')} over {opened.n} loads (load event); target {target('real_models.report_open_ms')} ms: "
                     f"**{decide(opened, target('real_models.report_open_ms'))}**")
    return markdown_table(
        ["model", "devices", "ops / step", "analysis s", "µs / op", "write s", "placement.json MB",
         "placement_ops.json.gz MB", "peak RSS MB", "RSS growth in analysis MB", "report open ms"],
        rows,
    ) + "\n" + "\n".join(lines) + ("\n" if lines else "") + (f"\n{comp.note}\n" if comp.note else "")


def section_mfu(plan: list[Comparison], results: Results) -> str:
    rows = []
    for c in plan:
        for a in c.arms:
            recs = (results.get(c.key) or {}).get(a.name, [])
            if not any(r.get("mfu") is not None for r in recs):
                continue
            f = next((r["flops_per_step"] for r in recs if r.get("flops_per_step")), None)
            rows.append([
                f"{c.key} / {a.name}", fmt(f, 6), fmt_summary(summ(recs, "step_time_s", 1000)),
                fmt_summary(summ(recs, "peak_flops", 1e-9)), _pct(summ(recs, "mfu", 100)),
            ])
    if not rows:
        return "no run measured MFU\n"
    return markdown_table(["run", "model FLOPs / step", "step time ms", "matmul peak GFLOP/s", "MFU"], rows)


def section_make_run(plan: list[Comparison], results: Results) -> str:
    """Issue 15.7: the wall time of `make run`, per pipeline step, and its time to the first
    training step (from the command's start to the end of step 1, per train_log.jsonl)."""
    from benchmarks.targets import target

    runs = (results.get("make-run") or {}).get("make-run")
    if not runs:
        return "not run\n"
    step = next((r.get("first_logged_step") for r in runs if r.get("first_logged_step")), None)
    # Records from before the trainer logged step 1 time its first logged step (log_every).
    first = "time to first training step s" if step in (1, None) else f"time to first logged step s (step {step})"
    cols = ["wall_s", "startup_s", "step_provision_s", "step_train_s", "step_report_s", "shutdown_s",
            "first_step_s", "train_to_first_step_s"]
    table = markdown_table(
        ["command", "wall time s", "before the steps s", "provision s", "train s", "report s", "after the steps s",
         first, "of which in the train step s", "runs"],
        [["make run", *(fmt_summary(summ(runs, c)) for c in cols), str(len(runs))]],
    )
    wall = summ(runs, "wall_s", interval=True)
    verdict = "not run" if wall is None else decide(wall, target("make_run.wall_s"))
    return table + (
        f"\nTarget (issue 15.7): wall time {target('make_run.wall_s')} s: {fmt_summary(wall)} s: **{verdict}**. "
        "A step's time is its "
        "process's, from kfp.local starting it to its exit (imports, its MLflow step run and exit included); "
        "before the steps: the CLI, kfp and the MLflow parent run; after: the parent run's end, the summary, "
        "exit. The first training step's time is its train_log.jsonl record's (step 1 runs as a call of its "
        "own), from the command's start; 'of which in the train step' counts from the train step's start "
        "(process, TensorFlow's import, data, model, tracing).\n"
    )


def failures(results: Results) -> list[str]:
    out = []
    for comp, runs in results.items():
        for arm, recs in runs.items():
            for i, r in enumerate(recs):
                if "error" in r:
                    out.append(f"{comp}/{arm} round {i + 1}: {r['error'][:300]} (log: {r.get('log')})")
    return out


SETTINGS = """\
- Every figure is the median of the runs, with (min–max); ratios are taken between the arms of
  the same round, then summarized. A ratio (or difference) also shows [low, high], the 95%
  bootstrap interval of its median (the rounds resampled with replacement, {resamples} times), and a
  target (benchmarks/targets.py) is decided by that interval: met when all of it is on the target's
  side, NOT met when none of it is, undecided when it straddles the target; a figure with fewer
  than {min_values} values (rounds, or pairs of blocks) is recorded, not decided. A steady cost is
  a ratio of steady rates, a fixed cost a difference in seconds.
  A comparison with a time cap runs more rounds until every targeted interval is within ±{tolerance}% of
  its median or the cap is reached. Each run is its own process; the arms of a comparison run back
  to back, alternating order between rounds (A B, B A, ...). On a shared machine (see the load
  average above) the absolute numbers move with the load; the same-round ratios much less.
- Same model (`pinpoint.training.loop.models.build_model`, same seeds), same data arrays (scikit-learn
  digits, 1,797 x 64), same global batch ({batch}), same optimizer (SGD, learning rate {lr}),
  same strategy and the same devices (`pinpoint.devices.setup_devices`: emulated GPUs are
  logical CPU devices; `get_strategy` builds the strategy for both sides).
- Keras: `model.compile(loss=SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
  jit_compile=<as Pinpoint>, steps_per_execution={spe})` and `model.fit` on a `tf.data` pipeline
  (shuffle, repeat, batch, prefetch) of the same arrays. Pinpoint runs `log_every={spe}` steps
  per tf.function call, hence the same steps per execution for Keras. XLA: both sides use
  Pinpoint's choice for the config (`train.jit_compile`, auto: on for strategy none, off for the
  distributed strategies); Keras's own "auto" would leave it off on a CPU-only machine.
- multi_worker_mirrored: Keras 3.15 `fit` fails under MultiWorkerMirroredStrategy with 2+ workers
  (tensorflow/tensorflow#72388); the peer patches the two places that fail (log reduction of
  scalars, first-batch build of the compiled metrics) and runs `steps_per_execution=1`, the only
  value its multi-step loop accepts there, against Pinpoint's {spe} steps per call.
- Steady state: steps after the first {warmup} (tracing and warm-up), to the last step, wall clock between two host syncs: Pinpoint's train_log.jsonl
  timestamps, a Keras callback's clock for Keras. Pinpoint's Keras-comparison runs have checkpoints
  off (Keras saves none) and MLflow off; placement capture stays at its default (step 3 sampled:
  graph collection during the first call of the training function, which instantiates it anyway).
- Overhead runs: the demo config (mirrored on 2 devices, checkpoints every 100 steps) for
  {overhead} steps; "train time" is the wall time of `train_command` (device setup, data, model,
  tracing, capture, steps, checkpoints, final evaluation, MLflow flush) with TensorFlow and Keras
  already imported; "process wall" is the whole process, interpreter start-up and imports included.
- MFU: exact FLOPs of the Dense layers (forward 2·in·out, weight gradient 2·in·out, input gradient
  2·in·out except for the first layer, plus bias) x global batch, over the steady step time, over
  the matmul peak measured in the same process on the run's replica devices (1024² float32
  matmul chains on every device at once; 4096² on GPUs). Logical CPU devices share the machine's
  cores, so their joint peak is the machine's. The tracking rows' runs with the model log it as `mfu`.
- Bytes crossing devices: from placement.json (the runtime's partition graphs, one step of the
  training loop's body; the loop's own predicate/control signal per device is not included):
  every _Send/_Recv pair, dtype size x static shape, including the input batch copied from the host
  to each replica. On emulated GPUs Pinpoint's mirrored strategy all-reduces the gradients with
  TensorFlow's ring collective among the replica devices (the stand-in for a GPU machine's NCCL),
  which uses no _Send/_Recv: its bytes on the wire per device are 2(N-1)/N of what each device
  reduces (`transfers.collectives`), by construction of the ring; "per device" adds that to the
  device's share of the _Send/_Recv bytes, against the ring all-reduce minimum of 2(N-1)/N·P. The
  Keras peer keeps MirroredStrategy's reduction to the host: Keras' multi-step loop wraps each
  step in a tf.cond, where the collective all-reduce fails.
- All-reduce choice: the scaling runs' config with `train.all_reduce` set, each choice TensorFlow
  can run on this machine. `reduce_to_host` (ReductionToOneDevice to /CPU:0) and
  `hierarchical_copy` (HierarchicalCopyAllReduce: each half of the devices sums on its first device,
  the two sums are added, the result copied back) move the gradients with _Send/_Recv, so their
  bytes are all in the _Send/_Recv column (for `reduce_to_host` the host's copies back to the
  replicas included); `ring` uses collectives (wire bytes by construction, as above). Per device:
  the collective wire bytes plus the _Send/_Recv bytes over the N replicas.
"""


def section_reliability(path: Path | None = None) -> str:
    """The fault suite's table (`make test` / `make test-faults` write runs/reliability.json)."""
    from benchmarks.reliability import DEFAULT_IN, reliability_table

    path = path or DEFAULT_IN
    if not path.is_file():
        return "not run: `make test-faults` (part of `make test`) writes `runs/reliability.json`.\n"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    return (f"From the fault suite (`tests/test_faults.py`, real local clusters), run {when}:\n\n"
            + reliability_table(json.loads(path.read_text())))


def render_markdown(plan: list[Comparison], results: Results, raw: dict, chart_name: str | None,
                    *, partial: bool = False) -> str:
    """The whole report from one run: a full run's is RESULTS.md; a partial run's (--only,
    --quick) has only the sections it ran and says it is partial."""
    from benchmarks.sections import render_comparisons, sections

    m, s = raw["machine"], raw["settings"]
    gpus = ", ".join(m["gpus"]) if m["gpus"] else "none (GPUs emulated on logical CPU devices)"
    machine = markdown_table(["machine", ""], [
        ["date", m["date"]], ["nproc", str(m["nproc"])], ["CPU", m["cpu"]], ["GPUs", gpus],
        ["TensorFlow", m["tensorflow"]], ["Keras", m["keras"]], ["MLflow", m["mlflow"]],
        ["Python", m["python"]], ["OS", m["os"]], ["git commit", m["git"]],
        ["load average (1, 5, 15 min) at start / end", " ".join(str(x) for x in m["loadavg_at_start"])
         + " / " + " ".join(str(x) for x in m.get("loadavg_at_end") or ["?"])],
    ], align=["l", "l"])
    skipped = [f"- {c.key}: skipped, {c.skipped}" for c in plan if c.skipped and not (partial and c.key not in results)]
    parts = [
        "# Benchmarks: a partial run\n" if partial else "# Benchmarks\n",
        ("A partial run (`--only` or `--quick`), in its own file: `benchmarks/RESULTS.md` comes from one full "
         "`make bench` only.\n" if partial else
         "Generated by the harness (`make bench`) from one run; do not edit by hand.\n"),
        (f"Command: `{raw['command']}` ({raw['elapsed_s'] / 60:.1f} min, "
         f"{s['repeats']} run(s) per arm unless a table's runs column says otherwise "
         f"({s['repeats'] * s.get('overhead_repeat_factor', 1)} for capture on/off, "
         f"{min(s['repeats'], s.get('recorded_repeats', s['repeats']))} for a Keras row without a target), "
         f"{s['steps']} steps per Pinpoint-vs-Keras, scaling and all-reduce run, half that for multi-worker; "
         f"steady state after step {s['warmup_steps']}).\n"),
        machine,
        "## Targets\n",
        section_targets(plan, results, partial=partial),
    ]
    for sec in sections():
        comps = [c for c in plan if c.section == sec.key]
        if partial and (sec.full_only or not any(c.key in results for c in comps)):
            continue
        parts += [f"## {sec.heading}\n", (sec.render or render_comparisons)(comps, results)]
    parts += ["## Model FLOPs utilization\n", section_mfu(plan, results)]
    if not partial:
        parts += ["## Reliability (fault suite)\n", section_reliability()]
    if chart_name:
        parts += ["## Chart\n", f"![benchmarks]({chart_name})\n"]
    parts += ["## Time per comparison\n", section_times(plan, raw)]
    parts += ["## How it is measured\n", SETTINGS.format(
        resamples=f"{RESAMPLES:,}", min_values=MIN_VALUES, tolerance=fmt(100 * TOLERANCE), batch=2 * s["per_replica_batch"], lr=_lr(plan), spe=_log_every(plan), warmup=s["warmup_steps"],
        overhead=s["overhead_steps"])]
    fails = failures(results)
    if skipped or fails:
        parts += ["## Skipped and failed runs\n", "\n".join(skipped + [f"- {f}" for f in fails]) + "\n"]
    parts.append(f"\nRaw records: `{raw.get('out', 'benchmarks/out')}/results.json` (git-ignored); each run's log and "
                 "run folder under `<that folder>/<comparison>/`.\n")
    return "\n".join(p if p.endswith("\n") else p + "\n" for p in parts)


def _cfg0(plan):
    for c in plan:
        for a in c.arms:
            if "config" in a.spec:
                return a.spec["config"]
    return {"train": {}}


def _lr(plan) -> str:
    return str(_cfg0(plan)["train"].get("learning_rate", "?"))


def _log_every(plan) -> int:
    return int(_cfg0(plan)["train"].get("log_every", 10))


def distinct_labels(labels: list[str], keys: list[str]) -> list[str]:
    """Each chart row's label; one that two comparisons share (trace / python for trace-fit and
    trace-loop) also names its comparison, so no two rows read alike."""
    return [f"{lab} ({k})" if labels.count(lab) > 1 else lab for lab, k in zip(labels, keys)]


def write_chart(plan: list[Comparison], results: Results, path: Path) -> list[str]:
    """A PNG of the panels this run has figures for (a partial run draws only its own): ratios with
    min/max whiskers, scaling, bytes vs ring minimum, MFU, memory predicted against measured. The
    titles of the panels drawn (none: no PNG written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [draw for draw in (_ratios_panel(plan, results), _scaling_panel(plan, results),
                                _bytes_panel(plan, results), _mfu_panel(plan, results),
                                _memory_panel(plan, results)) if draw]
    if not panels:
        return []
    cols = 1 if len(panels) == 1 else 2
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    for ax, draw in zip(axes.flat, panels):
        draw(ax)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [ax.get_title() for ax in list(axes.flat)[:len(panels)]]


def _ratios_panel(plan: list[Comparison], results: Results):
    """Same-round ratios: points with min-max whiskers on a log axis (x2 and /2 look alike)."""
    import matplotlib.ticker

    labels, keys, meds, lo, hi, targets = [], [], [], [], [], []
    for c in plan:
        for rt in c.ratios:
            r = None if rt.difference else ratio_summary(results, c.key, rt.num, rt.den, rt.metric)
            if r is None:
                continue
            name = c.key.replace("keras-", "") if c.key.startswith("keras-") else ""
            labels.append(f"{rt.label} {name}".strip())
            keys.append(c.key)
            meds.append(r.median)
            lo.append(r.median - r.min)
            hi.append(r.max - r.median)
            targets.append(rt.target)
    if not meds:
        return None

    def draw(ax):
        y = list(range(len(meds)))
        ax.errorbar(meds, y, xerr=[lo, hi], fmt="o", color="#4c72b0", capsize=4, ms=7)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xscale("log")
        lo_x = min(min(m - low for m, low in zip(meds, lo)), 1.0)
        hi_x = max(max(m + h for m, h in zip(meds, hi)), 1.0)
        ax.set_xlim(lo_x / 1.6, hi_x * 5)  # room for the labels right of the points
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks([t for t in (0.25, 0.5, 1, 2, 4, 8, 16, 32) if lo_x / 1.6 <= t <= hi_x * 5])
        ax.set_yticks(y, distinct_labels(labels, keys), fontsize=8)
        ax.set_ylim(len(meds) - 0.5, -0.5)
        for yi, m, h, t in zip(y, meds, hi, targets):
            ax.text((m + h) * 1.05, yi, f"{m:.3f}" + (f"  (target {t})" if t else ""), va="center", fontsize=8)
        ax.set_xlabel("ratio, log scale (median; whiskers: min–max)")
        ax.set_title("Same-round ratios")

    return draw


def _scaling_panel(plan: list[Comparison], results: Results):
    pts = [p for p in scaling_points(plan, results) if p["eps"]]
    if not pts:
        return None

    def draw(ax):
        xs = [p["devices"] for p in pts]
        m = [p["eps"].median for p in pts]
        ax.errorbar(xs, m, yerr=[[a - p["eps"].min for a, p in zip(m, pts)], [p["eps"].max - a for a, p in zip(m, pts)]],
                    marker="o", capsize=4)
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("replica devices (mirrored)")
        ax.set_ylabel("examples/sec")
        ax.set_title("Scaling (fixed batch per replica)")

    return draw


def _bytes_panel(plan: list[Comparison], results: Results):
    pts = [p for p in scaling_points(plan, results) if p["bytes"] and p["param_bytes"]]
    if not pts:
        return None

    def draw(ax):
        xs = list(range(len(pts)))
        meas = [(p["bytes"].median / p["devices"] + (p.get("collective_wire_per_device") or 0)) / 1024 for p in pts]
        ring = [p["ring_min_per_device"] / 1024 for p in pts]
        ax.bar([x - 0.2 for x in xs], meas, width=0.4, label="measured (all transfers / N)")
        ax.bar([x + 0.2 for x in xs], ring, width=0.4, label="ring all-reduce min 2(N-1)/N·P")
        ax.set_xticks(xs, [str(p["devices"]) for p in pts])
        ax.set_ylim(0, max(meas + ring) * 1.35)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper left")
        ax.set_xlabel("replica devices")
        ax.set_ylabel("KiB per device per step")
        ax.set_title("Bytes crossing devices per step")

    return draw


def _mfu_panel(plan: list[Comparison], results: Results):
    labels, meds, lo, hi = [], [], [], []
    for c in plan:
        for a in c.arms:
            s = summ((results.get(c.key) or {}).get(a.name, []), "mfu", 100)
            if s is None:
                continue
            labels.append(f"{c.key}/{a.name}")
            meds.append(s.median)
            lo.append(s.median - s.min)
            hi.append(s.max - s.median)
    if not meds:
        return None

    def draw(ax):
        y = list(range(len(meds)))
        ax.barh(y, meds, xerr=[lo, hi], color="#55a868", capsize=4)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("MFU % of the measured matmul peak")
        ax.set_title("Model FLOPs utilization")

    return draw


_STRATEGY_COLORS = {"mirrored": "#4c72b0", "split": "#dd8452", "parameter_server": "#55a868"}


def _memory_panel(plan: list[Comparison], results: Results):
    """Each device's predicted peak against the measured one: the error over the measured bytes, the
    target's band shaded, a miss named."""
    from benchmarks.targets import bound

    points = []  # (measured B, error, strategy, "model, strategy", device)
    for c in plan:
        if c.key != "memory-accuracy":
            continue
        for a in c.arms:
            for r in (results.get(c.key) or {}).get(a.name, []):
                for d, x in (r.get("devices") or {}).items():
                    if x.get("error") is not None and x.get("measured"):
                        strategy = next((k for k in _STRATEGY_COLORS if a.label.endswith(f", {k}")), "Pinpoint's loop")
                        points.append((x["measured"], x["error"], strategy, a.label, d))
    if not points:
        return None
    band = bound("memory.prediction")

    def draw(ax):
        ax.axhspan(-band * 100, band * 100, color="#dddddd", label=f"target: within {band:.0%}")
        for strategy in sorted({p[2] for p in points}):
            mine = [p for p in points if p[2] == strategy]
            ax.scatter([p[0] for p in mine], [p[1] * 100 for p in mine], s=22,
                       color=_STRATEGY_COLORS.get(strategy, "#8172b3"), label=strategy)
        misses: dict[str, list] = {}  # a run's devices that missed, named once beside the first
        for measured, err, _, label, device in points:
            if abs(err) > band:
                misses.setdefault(label, [measured, err, []])[2].append(device)
        for label, (measured, err, devices) in misses.items():
            ax.annotate(f"{label} {', '.join(devices)}", (measured, err * 100), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.axhline(0, color="black", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("measured peak per device, bytes (log scale)")
        ax.set_ylabel("predicted - measured, % of measured")
        ax.legend(fontsize=8, loc="best")
        ax.set_title("Memory per device: predicted against measured")

    return draw


def write_outputs(plan: list[Comparison], results: Results, raw: dict, md_path: Path, chart_path: Path,
                  *, partial: bool = False) -> None:
    from pinpoint.runfolder import atomic_write_text

    drew = write_chart(plan, results, chart_path)
    rel = chart_path.name if chart_path.parent.resolve() == md_path.parent.resolve() else str(chart_path)
    atomic_write_text(md_path, render_markdown(plan, results, raw, rel if drew else None, partial=partial))
