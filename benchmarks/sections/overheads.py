"""Per-call overheads. Issue 50.5: as a user pays them, whole processes under `python` and under
`pinpoint trace` (benchmarks/user_calls.py), with the targets. Issue 34.1: where they arise, each
microbenchmark's plain path against Pinpoint's in one process (benchmarks/overheads.py): µs per
call of each path and what Pinpoint adds (the pinpoint.log call has a target on its own time)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import section
from benchmarks.targets import target

# (record name, label, target on the added µs, target on Pinpoint's own µs)
ROWS = (
    ("tf_function_wrapper", "`tf.function` call, after capture and the recorder's quiet window: the recorder's "
     "call counter against TensorFlow's own, paired call by call", None, None),
    ("tf_function", "`tf.function` call, after capture and the recorder's quiet window: the Capture entered "
     "against not, in blocks", None, None),
    ("tf_function_recording", "`tf.function` call, within the quiet window (op callback on)", None, None),
    ("eager_op", "eager `tf.add`, signature recorded (quiet window passed)", None, None),
    ("eager_recording", "eager `tf.add`, within the quiet window (every op counted)", None, None),
    ("train_on_batch", "Keras `train_on_batch` (64-32-10 MLP, batch 32)", None, None),
    ("log", "`pinpoint.log(step, loss=, accuracy=)` into a real MLflow step run", None,
     target("calls.log_us")),
    ("checkpoint", "checkpoint save (CheckpointManager; Pinpoint: + the tracking hook's snapshot)", None, None),
)
ARM = "calls"


def comparison(s: p.Settings) -> p.Comparison:
    ratios = []
    for name, label, added, own in ROWS:
        ratios.append(p.Ratio(f"{label}: added µs", ARM, "", f"{name}_added_us", added,
                              pooled=f"{name}_added_blocks"))
        if own:
            ratios.append(p.Ratio(f"{label}: µs", ARM, "", f"{name}_pinpoint_us", own,
                                  pooled=f"{name}_pinpoint_blocks"))
    return p.Comparison(
        key="overheads",
        title="per-call overheads: plain against Pinpoint's path in one process",
        arms=(p.Arm(ARM, "microbenchmarks", {"kind": "overheads"}),),
        ratios=tuple(ratios),
        # One round: its one target (the log call's) is decided from the round's pairs of blocks;
        # the section's other targets are on whole processes (benchmarks/user_calls.py).
        repeats=1,
        run_s=45.0,  # measured: 28.9 s a round before the paired tf.function row (+~6 s)
        note="",
    )


def render(comps: list[p.Comparison], results: dict) -> str:
    from benchmarks.user_calls import render as render_user

    return render_user(comps, results) + "\n" + render_in_process(comps, results)


def render_in_process(comps: list[p.Comparison], results: dict) -> str:
    from benchmarks.render import compare_summary, pooled, target_met
    from benchmarks.stats import fmt, fmt_summary, summarize
    from benchmarks.table import markdown_table

    comp = next((c for c in comps if c.key == "overheads"), None)
    if comp is None or comp.key not in results:
        return "Where it arises, in one process: not run\n"
    recs = results[comp.key].get(ARM, [])
    good = [r for r in recs if "error" not in r]
    if not good:
        return "every run failed (see Skipped and failed runs)\n"
    by_metric = {rt.pooled: rt for rt in comp.ratios}
    rows = []
    for name, label, added, own in ROWS:
        best = lambda key: fmt(min(r[key] for r in good if r.get(key) is not None), 3)  # noqa: E731
        paired = name == "tf_function_wrapper"  # no blocks of one path: pairs of calls
        if not all(r.get(f"{name}_added_blocks") if paired else r.get(f"{name}_plain_us") is not None for r in good):
            continue
        add = compare_summary(results, comp.key, by_metric[f"{name}_added_blocks"])
        verdicts = [target_met(add, added) if added else ""]
        if own:
            mine = compare_summary(results, comp.key, by_metric[f"{name}_pinpoint_blocks"])
            verdicts.append(f"Pinpoint's median block {fmt_summary(mine)}: {target_met(mine, own)}")
        blocks = len(pooled(good, f"{name}_added_blocks"))
        rows.append([label, "paired" if paired else best(f"{name}_plain_us"),
                     "paired" if paired else best(f"{name}_pinpoint_us"), fmt_summary(add, 3),
                     "; ".join(v for v in verdicts if v) or "recorded",
                     f"{good[0].get(f'{name}_calls', '?')} x {blocks}"])
    out = markdown_table(["call", "plain µs (best block)", "Pinpoint µs (best block)",
                          "added µs: median of pairs [95% interval] (min–max)", "target", "calls x pairs"], rows)
    quiet = good[0].get("eager_quiet_ops")
    rec = summarize([r.get("eager_recording_added_us") for r in good])
    first, longest = good[0].get("eager_resample_s") or (None, None)
    if quiet and rec and first:
        out += (f"\nThe recorder counts every eager op until {quiet:,} op callbacks in a row bring no new signature "
                f"(op type and device, copy, request not met, updated variable), then switches its op callback off "
                f"(on again for a window of the same kind at a new tf.function's first call and after {fmt(first)}, "
                f"{fmt(2 * first)}, {fmt(4 * first)} ... {fmt(longest)} s): "
                f"a program pays about {fmt(rec.median, 3)} µs per eager op for its first ops, "
                f"{fmt(rec.median * quiet / 1000, 3)} ms for a window's worth: once, then at most every {fmt(longest)} s.\n")
    return ("**Where it arises, in one process** (recorded: what each part adds, no target but the log call's)\n\n"
            + out + (
        "\nIn one process, in pairs of blocks (plain, then Pinpoint's path: `pinpoint.trace.session.Capture` "
        "entered as `pinpoint trace` enters it), each call timed on its own and a block's figure the median of its "
        "calls (a call preempted on the shared machine is an outlier the median ignores; the log call and the "
        "checkpoint save, which do work now and then, the mean). The call counter row: the recorder's "
        "subclass of `InterpolateRuntimeError` (pinpoint.tfcompat.counting), the only Pinpoint code on a known "
        "tf.function call's path once the quiet window has passed (its op callback off, so TensorFlow's fast "
        "`execute`), switched inside the Capture against TensorFlow's own class call by call, the first of a pair alternating, a block's figure the "
        "median of its pairs' differences. The row below it (the Capture entered against not, in blocks) is the "
        "cross-check for the rest of its state. Best block: the lowest of a path's block medians; added: each "
        "pair's difference, pooled over the rounds, its median and bootstrap 95% interval. The log call's "
        "target is on Pinpoint's own time per call (its median block).\n"))


@section("Per-call overheads (µs per call)", order=58, render=render)
def overheads(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.user_calls import comparison as user_calls

    return [user_calls(s), comparison(s)]
