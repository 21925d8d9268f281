"""Issue 49: memory per device. Each model x strategy is traced once with `--memory`, on 2 emulated
GPUs or on the guide's in-process parameter_server cluster (benchmarks/memory_bench.py); the table
holds each device's predicted peak to the allocator's measured one, and the replay's self-check.
One run each: the figures are recorded (a verdict needs an interval over 3 rounds, which would take
this section past 20 minutes); the cost of memory on is decided over 3 rounds."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import Results, section
from benchmarks.targets import bound, target

TARGET = f"within {bound('memory.prediction'):.0%} of the measured peak"


@section("Memory per device: predicted against measured", order=57, render=lambda c, r: render_memory(c, r))
def memory(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.memory_bench import memory_arms

    arms = tuple(p.Arm(name, label, spec) for name, label, spec in memory_arms())
    comps = [p.Comparison(
        key="memory-accuracy", title="predicted vs measured peak per device (`pinpoint trace --memory --gpus 2`)",
        arms=arms, repeats=1, run_s=RUN_S,
        note="parameter_server: the guide's in-process cluster (one worker, one ps); the chief's row is the "
             "coordinator's share of the step (what the step's graph placed there)"),
        cost_comparison(s)]
    return comps


# Seconds of one run, the mean over the 19, +5% (2026-11-29, benchmarks/runs/2026-11-29-0528-memory.md:
# the section took 5.9 min, its 6 on/off runs ~33 s of it; MobileNetV2 and ResNet50 most of the rest).
RUN_S = 17.5


COST_STEPS = 500


def cost_comparison(s: p.Settings) -> p.Comparison:
    """placement.memory on against off (timing on in both: the memory rides on its profiled call)."""
    def arm(name: str, memory: bool) -> p.Arm:
        cfg = p.bench_config(f"bench-{name}", strategy="mirrored", devices=2, steps=COST_STEPS,
                             batch=2 * s.per_replica_batch, placement=True, tracking=False)
        cfg["placement"].update(timing=True, memory=memory)
        return p.Arm(name, name.replace("-", " "), {"kind": "pinpoint", "config": cfg, "peak": False,
                                                   "warmup_steps": min(s.warmup_steps, COST_STEPS // 2)})

    return p.Comparison(
        key="memory-cost", title=f"placement.memory on / off, {COST_STEPS}-step mirrored runs (timing on in both)",
        arms=(arm("memory-on", True), arm("memory-off", False)),
        ratios=(p.Ratio("memory on / off, steady examples/s", "memory-on", "memory-off", "examples_per_sec",
                        target("memory.steady")),
                p.Ratio("memory on - off, train time", "memory-on", "memory-off", "train_s", target("memory.fixed_s"),
                        difference=True)),
        repeats=3, run_s=8.0,
        note="the steady window excludes the profiled call: the memory measurement costs once per run (its "
             "replay and prediction when the placement is built), nothing per steady step")


def render_memory(comps: list[p.Comparison], results: Results) -> str:
    """One row per model, strategy and device: predicted, measured, error, the self-check."""
    from benchmarks.sections import render_comparisons
    from benchmarks.table import markdown_table

    if not comps:
        return "Not run in this bench.\n"
    rows, bad, cost = [], 0, [c for c in comps if c.key == "memory-cost"]
    for c in comps:
        if c.key != "memory-accuracy":
            continue
        runs = results.get(c.key) or {}
        for a in c.arms:
            for r in runs.get(a.name, []):
                if r.get("error") or r.get("why_not") or "devices" not in r:
                    rows.append([a.label, "-", "-", "-", "-", "-", "-", r.get("error") or r.get("why_not") or "no figures",
                                 "-"])
                    continue
                bad += r["mismatched"] or 0
                calls = ", ".join(map(str, r.get("calls") or [])) or r.get("call") or "-"
                for d, x in r["devices"].items():
                    err = x["error"]
                    within = err is not None and abs(err) <= bound("memory.prediction")
                    spread = f"{x['least']:,}–{x['most']:,}" if "most" in x else "-"
                    rows.append([a.label, d, f"{x['predicted']:,}", f"{x['measured']:,}",
                                 "-" if err is None else f"{err:+.1%}", spread, calls,
                                 f"{r['mismatched']} of {r['events']}",
                                 f"recorded ({'meets' if within else 'misses'}: {TARGET})"])
    table = markdown_table(["model, strategy", "device", "predicted B", "measured B", "error",
                            "measured over the calls, least–most B", "calls measured", "mismatched events",
                            "target"], rows)
    return (f"{table}\n\nReplay self-check: {bad} mismatched events over every run (target 0).\n"
            + "".join(f"\n{c.note}\n" for c in comps if c.note and c.key == "memory-accuracy")
            + ("\n" + render_comparisons(cost, results) if cost else ""))
