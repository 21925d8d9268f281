"""Issue 50.5: the per-call overheads as a user pays them. benchmarks/user_program.py (a small
tf.function and an eager tf.add) runs as a whole process under `python` and under
`pinpoint trace --no-tracking`.

The targets are decided with both processes running at once (`run_together`, issue 67.4): both
pinned to one CPU, each in a session of its own (the scheduler halves the CPU between the
processes, whatever their threads), both past their warm-up and the recorder's quiet window
before a common start on the machine's monotonic clock, then calling in the same phases (the
tf.function, then the eager add, by turns). Per phase, each process's CPU µs per call (all its
threads); a round's figure is the median over its phases of trace - python, so the few phases a
sampling window of the recorder falls in (50 ms of op callbacks, at most every 16 s) do not
decide it. What Pinpoint adds is work on the program's own threads, which sharing the CPU does
not hide; the machine's slow spells, which move a lone process's rate by 10-20% from one run to
the next, fall on both processes of a phase alike. Sharing the CPU makes each call dearer than
alone (more cache refills after a switch), for both processes.

The `frames` arm runs the same together rounds with python against python running the program as
`pinpoint trace` does, one frame above it (benchmarks/launched.py), recorded: what that frame costs
without anything of Pinpoint.

Tried before and not enough to decide a difference of ~1 µs on a ~200 µs call: the two arms
back to back (each process's best block of 4,000 calls: the pairs' differences spread by tens
of µs on a slow day, as the machine's spells and each process's memory layout move it), taking
turns over a pipe or by SIGSTOP (sd 3.4 µs over 10 pairs), taking turns in 20-100 ms slots of
the shared clock (each slot starts cold: 8-10 µs added, more than at once), each on its own CPU
at once (phases' differences spread by ±80 µs). Both processes run with the same fixed hash seed
and, where `setarch` exists, without address-space randomisation: with random layouts two
`python` processes at once differ by up to 10 µs a call round by round, with a fixed one by
< 0.4 µs. Two pairs of back-to-back processes on any CPU (as a program runs by default) are
recorded beside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.plan import Arm, Comparison, Ratio, Settings
from benchmarks.targets import target
from benchmarks.trace_cost import log_tail, start_on_cpu

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "benchmarks" / "user_program.py"  # run as a script, as `python train.py` is
CALLS, BLOCKS, WARMUP = 4000, 6, 2000
# Together: 12 phases of 0.4 s of each call; a round's median moves by ~0.7 µs (tf.function) and
# ~0.1 µs (eager add) from round to round on a quiet machine, so 20 rounds bring the interval within
# about ±0.35 µs; a loaded machine's rounds spread the eager add's as much (its target is 0.5 µs), and
# 24 rounds narrow that interval by a tenth more.
PHASE_S, PHASES = 0.4, 12
ROUNDS = 24  # pairs run together: a verdict needs 3 (benchmarks/targets.py)
# python against python with the program one frame deeper, as pinpoint trace runs it
# (benchmarks/launched.py), together: what that frame costs without Pinpoint, recorded beside the
# targets. A round's median spreads by a few µs (tf.function) and ~0.7 µs (eager add) on a slow day;
# four rounds keep the full bench within its hour (tests/test_bench.py).
FRAMES_ROUNDS = 4
ANY_CPU_ROUNDS = 2  # pairs on any CPU, back to back, recorded beside them
FIXED_LAYOUT = ["setarch", "-R"] if shutil.which("setarch") else []
KEY = "user-calls"


def comparison(s: Settings) -> Comparison:
    full = s.steps >= 1000  # --quick (60 steps) checks the harness: fewer calls and phases, one round
    spec = {"kind": "user_calls", "calls": CALLS if full else CALLS // 10, "blocks": BLOCKS, "warmup": WARMUP}
    together = {"kind": "user_calls_together", "warmup": WARMUP, "phase_s": PHASE_S, "phases": PHASES if full else 2}
    any_cpu = ANY_CPU_ROUNDS if full else 1
    fn, add = "tf.function call (assign_add + reduce_sum)", "eager tf.add"
    return Comparison(
        key=KEY,
        title="as a user pays it: the program under `pinpoint trace --no-tracking` against `python`, whole processes",
        arms=(Arm("python", "python", {**spec, "via": "python"}, max_rounds=any_cpu),
              Arm("trace", "pinpoint trace --no-tracking", {**spec, "via": "trace"}, max_rounds=any_cpu),
              Arm("together", "both at once, one CPU", together),
              Arm("frames", "python and python one frame deeper as trace runs it, at once, one CPU",
                  {**together, "vias": ["python", "frames"]}, max_rounds=FRAMES_ROUNDS if full else 1)),
        ratios=(Ratio(f"{fn}, together on one CPU: trace - python, µs", "together", "", "fn_added_us",
                      target("calls.tf_function_us")),
                Ratio(f"{add}, together on one CPU: trace - python, µs", "together", "", "add_added_us",
                      target("calls.eager_op_us")),
                Ratio(f"{fn}, any CPU, back to back: trace - python, µs", "trace", "python", "fn_us", difference=True),
                Ratio(f"{add}, any CPU, back to back: trace - python, µs", "trace", "python", "add_us",
                      difference=True),
                Ratio(f"{fn}, the launcher's frame under python, no Pinpoint, together: µs", "frames", "",
                      "fn_added_us"),
                Ratio(f"{add}, the launcher's frame under python, no Pinpoint, together: µs", "frames", "",
                      "add_added_us")),
        repeats=ROUNDS if full else 1,
        # A round together: both imports and warm-ups on one CPU (~12 s), 2 x 12 x 0.4 s of phases;
        # a process back to back ~8 s. Their mean over the runs of a full bench.
        run_s=20.0,
    )


def run(spec: dict) -> dict[str, Any]:
    """The worker kind `user_calls`: one process of benchmarks/user_program.py, via python or trace."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    timing = out / "timing.json"
    args = ["--calls", str(spec["calls"]), "--blocks", str(spec["blocks"]), "--warmup", str(spec["warmup"]),
            "--out", str(timing)]
    argv = _argv(spec["via"], out, args)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    proc = subprocess.run([*FIXED_LAYOUT, *argv], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not timing.is_file():
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {proc.returncode}: {proc.stderr[-400:]}")
    return {**json.loads(timing.read_text()), "wall_s": wall, "fixed_layout": bool(FIXED_LAYOUT)}


def _argv(via: str, out: Path, args: list[str]) -> list[str]:
    """benchmarks/user_program.py ARGS under `python` or under `pinpoint trace --no-tracking` (its
    run folder out/trace), as users run it."""
    if via == "python":
        return [sys.executable, str(PROGRAM), *args]
    if via == "frames":  # python, the program one frame deeper, as trace runs it (cwd: ROOT)
        from benchmarks.launched import BOOT

        return [sys.executable, "-c", BOOT, str(PROGRAM), *args]
    # The `pinpoint` command as users run it (it replaces its process with the program's: trace.launch).
    cli = Path(sys.executable).with_name("pinpoint")
    return [*([str(cli)] if cli.is_file() else [sys.executable, "-m", "pinpoint.cli"]), "trace", "--no-tracking",
            "--out", str(out / "trace"), str(PROGRAM), *args]


def run_together(spec: dict) -> dict[str, Any]:
    """The worker kind `user_calls_together`: the program under python and under trace (or the two
    of spec["vias"]) at once on one CPU, each in a session of its own (trace_cost.start_on_cpu),
    calling in phases both start at the same time. Per phase, each process's CPU µs per call; the
    round's figure is the median over the phases of the second - the first."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    cpu = max(os.sched_getaffinity(0))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    procs, timing = {}, {}
    vias = spec.get("vias", ["python", "trace"])
    for via in vias:
        timing[via] = out / f"timing-{via}.json"
        args = ["--warmup", str(spec["warmup"]), "--out", str(timing[via]), "--together", str(out), "--name", via,
                "--phase-s", str(spec["phase_s"]), "--phases", str(spec["phases"])]
        procs[via] = start_on_cpu([*FIXED_LAYOUT, *_argv(via, out, args)], cpu, ROOT, env, out / f"{via}.log")
    try:
        # Both warmed up, then a common start a little ahead (user_program.wait_for_go).
        while not all((out / f"ready-{via}").is_file() for via in procs):
            dead = [via for via, p in procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited {procs[dead[0]].returncode} before its phases: "
                                   f"{log_tail(out / f'{dead[0]}.log')}")
            time.sleep(0.01)
        tmp = out / "go.tmp"
        tmp.write_text(repr(time.monotonic() + 0.2))
        tmp.rename(out / "go")
        for via, p in procs.items():
            p.wait(timeout=300)
            if p.returncode != 0 or not timing[via].is_file():
                raise RuntimeError(f"{via} exited {p.returncode}: {log_tail(out / f'{via}.log')}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    first, second = (json.loads(timing[via].read_text())["phases"] for via in vias)
    return {**paired_phases(first, second), "vias": vias, "cpu": cpu,
            "warmup": spec["warmup"], "phase_s": spec["phase_s"], "phases": spec["phases"],
            "fixed_layout": bool(FIXED_LAYOUT)}


def paired_phases(python: list[dict], trace: list[dict]) -> dict[str, Any]:
    """Per call kind: each process's median CPU µs per call over its phases, and the median over
    the phases of trace - python (the same phase: the same seconds of the shared machine)."""
    from statistics import median

    got: dict[str, Any] = {}
    for kind in dict.fromkeys(p["kind"] for p in python):
        us = {via: [p["cpu_s"] / p["calls"] * 1e6 for p in ph if p["kind"] == kind]
              for via, ph in (("python", python), ("trace", trace))}
        added = [t - p for p, t in zip(us["python"], us["trace"], strict=True)]
        got.update({f"{kind}_us": median(us["python"]), f"{kind}_trace_us": median(us["trace"]),
                    f"{kind}_added_us": median(added), f"{kind}_added_phases": added})
    return got


def render(comps: list[Comparison], results: dict) -> str:
    """The end-to-end table: per figure, each process's µs per call (median of the rounds,
    min–max), trace - python round by round with its interval, and the verdict."""
    from benchmarks.render import compare_summary, summ, target_met
    from benchmarks.stats import fmt_summary
    from benchmarks.table import markdown_table

    comp = next((c for c in comps if c.key == KEY), None)
    if comp is None or comp.key not in results:
        return "As a user pays it (whole processes): not run\n"
    runs = results[comp.key]
    rows = []
    for rt in comp.ratios:
        if rt.num == "frames" and not runs.get("frames"):
            continue  # results from before the arm, or a run without it
        added = compare_summary(results, comp.key, rt)
        if rt.den:  # back to back: each process's best block
            py, tr = summ(runs.get(rt.den, []), rt.metric), summ(runs.get(rt.num, []), rt.metric)
        else:  # together: each process's median phase (kind_us, kind_trace_us)
            kind = rt.metric.removesuffix("_added_us")
            py, tr = (summ(runs.get(rt.num, []), f"{kind}{m}") for m in ("_us", "_trace_us"))
        rows.append([rt.label.split(":")[0], fmt_summary(py), fmt_summary(tr), fmt_summary(added),
                     target_met(added, rt.target) or "recorded", str(added.n if added else 0)])
    good = {arm: [r for r in recs if "error" not in r] for arm, recs in runs.items()}
    alone = {**comp.arms[0].spec, **next(iter(good.get("python", [])), {})}  # what they ran (their records say)
    both = {**comp.arms[2].spec, **next(iter(good.get("together", [])), {})}
    cpus = sorted({r["cpu"] for r in good.get("together", []) if r.get("cpu") is not None})
    layout = ("Every process with the same fixed hash seed and without address-space randomisation (one memory "
              "layout per arm). " if both.get("fixed_layout") else "Every process with the same fixed hash seed. ")
    return (f"**As a user pays it**: {comp.title}\n\n" + markdown_table(
        ["µs per call", "python", "pinpoint trace", "added µs, trace - python, same round [95% interval] (min–max)",
         "target", "rounds"], rows)
        + f"\nTogether on one CPU (the targets): both processes at once, pinned to CPU "
          f"{', '.join(map(str, cpus)) or '?'}, each in a session of its own; each makes {both['warmup']:,} calls of "
          f"each as a warm-up (past the recorder's quiet window), then from a common start {both['phases']} phases of "
          f"{both['phase_s']} s of each call by turns (benchmarks/user_program.py --together). Per phase its CPU µs "
          "per call (all its threads); the process's figure is its median phase, a round's trace - python the "
          "median over its phases of the same phase's difference. Sharing the CPU makes every call dearer than "
          "alone, for both. Back to back on any CPU (recorded): each process's best of "
          f"{alone['blocks']} blocks of {alone['calls']:,} calls of each after the same warm-up. {layout}"
          "benchmarks/user_calls.py says why the targets are decided together."
          + (f" The rows \"the launcher's frame\": python against python running the same program one frame above "
             f"the process's first, from `python -c` as `pinpoint trace` runs it (benchmarks/launched.py, nothing of "
             f"Pinpoint imported), at once on one CPU as above, {len(good.get('frames', []))} rounds; their second "
             "column is that process. What the frame under the program costs by itself (docs/trace.md, \"Cost\")."
             if good.get("frames") else "") + "\n")
