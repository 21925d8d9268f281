"""Issue 50.5: the per-call overheads as a user pays them. benchmarks/user_program.py (a small
tf.function and an eager tf.add) runs as a whole process under `python` and under
`pinpoint trace --no-tracking`, the two arms back to back, their order alternating between
rounds; each process times CALLS-call blocks after a warm-up past the recorder's quiet window
and keeps its best block. Added: the trace process's µs per call - the python process's, round
by round; the verdict from the interval of those differences (>= 3 rounds).

Short blocks: a block of 20,000 calls (~3 s) that a slow spell of the machine hits is as slow as
its spell, so the best of 3 moved by 4% from process to process; the best of 15 blocks of 4,000
moves by about 1%. Many short processes rather than a few long ones: what is left moves with the
process, not the block (measured 2026-11-28, 15 pairs of best-of-8: the differences ran from -2.4
to +6.3 µs; in 3 pairs each of the trace process's four best blocks was slower than each of the
python process's), so the interval narrows with pairs, not blocks. Two processes taking turns
block by block (paired in time) were worse: the waiting one's threads moved the other's blocks by
up to 35 µs. Both arms run with the same fixed hash seed and, where
`setarch` exists, without address-space randomisation: the processes of an arm then share one
memory layout, whose luck otherwise moves a call by several µs (measured 2026-11-28: 135.4 to
144.9 µs over 5 python processes with it, 131.5 to 135.0 without)."""

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

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "benchmarks" / "user_program.py"  # run as a script, as `python train.py` is
CALLS, BLOCKS, WARMUP = 4000, 6, 2000
ROUNDS = 28  # pairs of processes: a verdict needs 3 (benchmarks/targets.py); ~1-2 µs, pairs spread by ~3 µs
FIXED_LAYOUT = ["setarch", "-R"] if shutil.which("setarch") else []
KEY = "user-calls"


def comparison(s: Settings) -> Comparison:
    full = s.steps >= 1000  # --quick (60 steps) checks the harness: fewer calls, one round
    spec = {"calls": CALLS if full else CALLS // 10, "blocks": BLOCKS, "warmup": WARMUP}
    return Comparison(
        key=KEY,
        title="as a user pays it: the program under `pinpoint trace --no-tracking` against `python`, whole processes",
        arms=(Arm("python", "python", {"kind": "user_calls", "via": "python", **spec}),
              Arm("trace", "pinpoint trace --no-tracking", {"kind": "user_calls", "via": "trace", **spec})),
        ratios=(Ratio("tf.function call (assign_add + reduce_sum): trace - python, µs", "trace", "python", "fn_us",
                      target("calls.tf_function_us"), difference=True),
                Ratio("eager tf.add: trace - python, µs", "trace", "python", "add_us",
                      target("calls.eager_op_us"), difference=True)),
        repeats=ROUNDS if full else 1,
        run_s=9.0,  # a process: TensorFlow's import, 6 x 4,000 calls of each, the trace's report
    )


def run(spec: dict) -> dict[str, Any]:
    """The worker kind `user_calls`: one process of benchmarks/user_program.py, via python or trace."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    timing = out / "timing.json"
    args = ["--calls", str(spec["calls"]), "--blocks", str(spec["blocks"]), "--warmup", str(spec["warmup"]),
            "--out", str(timing)]
    if spec["via"] == "python":
        argv = [sys.executable, str(PROGRAM), *args]
    else:
        # The `pinpoint` command as users run it (python -m pinpoint.cli puts runpy's frames under the
        # program: see trace.program.run).
        cli = Path(sys.executable).with_name("pinpoint")
        argv = [*([str(cli)] if cli.is_file() else [sys.executable, "-m", "pinpoint.cli"]), "trace", "--no-tracking",
                "--out", str(out / "trace"), str(PROGRAM), *args]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    proc = subprocess.run([*FIXED_LAYOUT, *argv], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not timing.is_file():
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {proc.returncode}: {proc.stderr[-400:]}")
    return {**json.loads(timing.read_text()), "wall_s": wall, "fixed_layout": bool(FIXED_LAYOUT)}


def render(comps: list[Comparison], results: dict) -> str:
    """The end-to-end table: per figure, each arm's best block (median of the rounds, min–max),
    the difference round by round with its interval, and the verdict."""
    from benchmarks.render import compare_summary, summ, target_met
    from benchmarks.stats import fmt_summary
    from benchmarks.table import markdown_table

    comp = next((c for c in comps if c.key == KEY), None)
    if comp is None or comp.key not in results:
        return "As a user pays it (whole processes): not run\n"
    runs = results[comp.key]
    rows = []
    for rt in comp.ratios:
        added = compare_summary(results, comp.key, rt)
        rows.append([rt.label.split(":")[0], fmt_summary(summ(runs.get("python", []), rt.metric)),
                     fmt_summary(summ(runs.get("trace", []), rt.metric)), fmt_summary(added),
                     target_met(added, rt.target) or "recorded", str(added.n if added else 0)])
    good = [r for recs in runs.values() for r in recs if "error" not in r]
    spec = {**comp.arms[0].spec, **(good[0] if good else {})}  # what the processes ran (their records say)
    return (f"**As a user pays it**: {comp.title}\n\n" + markdown_table(
        ["µs per call", "python (best block)", "pinpoint trace (best block)",
         "added µs, trace - python, same round [95% interval] (min–max)", "target", "pairs"], rows)
        + f"\nEach process: {spec['warmup']:,} calls of each as a warm-up (past the recorder's quiet window), then "
          f"{spec['blocks']} blocks of {spec['calls']:,} calls of each (benchmarks/user_program.py), its best block; "
          "the two processes of a round run back to back, the order alternating between rounds"
          + (", both with a fixed hash seed and without address-space randomisation (one memory layout per arm)"
             if spec.get("fixed_layout") else ", both with a fixed hash seed") + ".\n")
