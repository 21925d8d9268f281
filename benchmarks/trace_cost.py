"""Issue 24.5: what `pinpoint trace` costs an unchanged program, and `train.entrypoint` against
Pinpoint's own loop on the same model.

- trace-fit / trace-loop: the worked examples (examples/keras_fit, examples/custom_loop) run as
  `python -m MODULE ARGS` and as `pinpoint trace --no-tracking -m MODULE ARGS`, same devices (no
  --gpus: the devices plain python sees), same round. Each program measures its own steady state
  (`--timing-out`: examples/s after its warm-up batches, as TF's official models' TimeHistory does);
  fixed cost = process wall - the time its batches take at that steady rate (start-up, tracing,
  capture, the report), from the two run back to back; the steady ratio from the two run together
  on one CPU (`run_program_pair`).
- entrypoint: the keras_fit example as `train.entrypoint` (fit under ctx.strategy, mirrored on 2
  emulated GPUs) against Pinpoint's own loop training the same model (`train.model:
  fit_example.train:build_model`), digits, sgd 0.1, global batch 64, the same number of steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.plan import Arm, Comparison, Ratio, Settings
from benchmarks.targets import target

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Issue 34.3: about 2 s of steady training per run (4x150 batches gave 0.8 s, and ratios from
# 0.76 to 0.96 over three rounds); the entrypoint comparison keeps its shorter run.
FIT_EPOCHS, FIT_STEPS_PER_EPOCH, FIT_BATCH = 4, 500, 64
ENTRY_STEPS_PER_EPOCH = 150
LOOP_STEPS, LOOP_BATCH = 6000, 32
# Together (run_program_pair), each process has half a CPU: more batches, so both steady states
# share several seconds, after a warm-up past the recorder's quiet window (trace.sampling: up to
# 1,000 eager ops on the slow path, once, a start-up cost the fixed cost counts). fit's batches
# take under 0.5 ms on a CPU with AVX-512: 4x1250 of them keep the shared seconds over MIN_TOGETHER_S.
TOGETHER_FIT_STEPS_PER_EPOCH, TOGETHER_LOOP_STEPS, TOGETHER_WARMUP = 1250, 8000, 1000


def _program(example: str, module: str, args: list[str]) -> dict:
    return {"cwd": str(EXAMPLES / example), "module": module, "args": args}


# Rounds of these comparisons: each run is a whole process (TensorFlow's import included), and the
# full bench stays under its 50 minutes (benchmarks.sections.PLAN_LIMIT_S). The steady ratio is
# decided on the pair run together (`run_program_pair`): back to back, a process' rate moves 10-20%
# with the shared machine's spells, together on one CPU both see the same spells. More rounds while
# its interval is wider than ±3%, up to TRACE_CAP_S of runs; the back-to-back runs give the fixed cost.
ROUNDS = 3
TRACE_ROUNDS, TRACE_CAP_S = 3, 150.0


# run_s: the mean of a comparison's runs (measured: 11 s back to back; together 30-53 s for the fit
# example, 30 s for the loop).
def program_comparison(key: str, title: str, program: dict, together: dict, *, run_s: float) -> Comparison:
    """`python` and `pinpoint trace` back to back (the fixed cost; their steady rates recorded) and
    together on one CPU (`together`: the same program with more batches and a warm-up past the
    recorder's quiet window, so both steady states share several seconds: the steady ratio)."""
    arms = (Arm("python", "python", {"kind": "program", "via": "python", **program}, max_rounds=ROUNDS),
            Arm("trace", "pinpoint trace", {"kind": "program", "via": "trace", **program}, max_rounds=ROUNDS),
            Arm("together", "both at once, one CPU", {"kind": "program_pair", **together}))
    return Comparison(
        key=key, title=title, arms=arms, repeats=TRACE_ROUNDS,
        ratios=(Ratio("trace / python, steady examples/s, together on one CPU", "together", "", "steady_ratio",
                      target("trace.steady")),
                Ratio("trace / python, steady examples/s, back to back", "trace", "python", "examples_per_sec"),
                Ratio("trace - python, fixed cost", "trace", "python", "fixed_s", target("trace.fixed_s"),
                      difference=True)),
        note="the same program and arguments, the same devices; the program measures its own steady state "
             "(--timing-out); fixed cost = process wall - batches x batch / steady examples/s (back to back). "
             f"Together: `{' '.join(together['args'])}`, both processes started at once, pinned to one CPU, each "
             "in a session of its own (the scheduler halves the CPU between the processes, whatever their "
             "threads); each program writes the clock every block of batches of its steady state, and the "
             "rates are compared over the seconds both were in it",
        run_s=run_s, time_cap_s=TRACE_CAP_S,
    )


def trace_comparisons(s: Settings) -> list[Comparison]:
    fit_args = ["--epochs", str(FIT_EPOCHS), "--batch-size", str(FIT_BATCH)]
    fit = _program("keras_fit", "fit_example.train", [*fit_args, "--steps-per-epoch", str(FIT_STEPS_PER_EPOCH)])
    fit_together = _program("keras_fit", "fit_example.train",
                            [*fit_args, "--steps-per-epoch", str(TOGETHER_FIT_STEPS_PER_EPOCH),
                             "--warmup-batches", str(TOGETHER_WARMUP)])
    loop_args = ["--batch-size", str(LOOP_BATCH)]
    loop = _program("custom_loop", "loop_example.train", [*loop_args, "--steps", str(LOOP_STEPS)])
    loop_together = _program("custom_loop", "loop_example.train",
                             [*loop_args, "--steps", str(TOGETHER_LOOP_STEPS), "--warmup-steps", str(TOGETHER_WARMUP)])
    return [
        program_comparison("trace-fit", f"`pinpoint trace` vs `python`: the keras_fit example (model.fit, "
                                        f"{FIT_EPOCHS}x{FIT_STEPS_PER_EPOCH} batches of {FIT_BATCH})", fit,
                           fit_together, run_s=22.0),
        program_comparison("trace-loop", f"`pinpoint trace` vs `python`: the custom_loop example (GradientTape, "
                                         f"{LOOP_STEPS} steps of {LOOP_BATCH})", loop, loop_together, run_s=17.5),
        entrypoint_comparison(s),
    ]


def entrypoint_comparison(s: Settings) -> Comparison:
    import yaml

    steps = FIT_EPOCHS * ENTRY_STEPS_PER_EPOCH
    base = yaml.safe_load((EXAMPLES / "keras_fit" / "config.yaml").read_text())
    base["train"]["code_dir"] = str(EXAMPLES / "keras_fit")
    base["tracking"] = {"enabled": False}
    entry = json.loads(json.dumps(base))
    entry["name"] = "bench-entrypoint"
    entry["train"]["entrypoint_args"] = ["--epochs", str(FIT_EPOCHS), "--steps-per-epoch", str(ENTRY_STEPS_PER_EPOCH),
                                         "--batch-size", str(FIT_BATCH), "--timing-out", "@timing@"]
    own = json.loads(json.dumps(base))
    own["name"] = "bench-own-loop"
    t = own["train"]
    for k in ("entrypoint", "entrypoint_args", "log_every"):
        t.pop(k, None)
    t.update(model="fit_example.train:build_model", data="digits", optimizer="sgd", learning_rate=0.1,
             batch_size=FIT_BATCH, steps=steps, checkpoint_every=0, log_every=10)
    warmup = min(s.warmup_steps, steps // 4)
    return Comparison(
        key="entrypoint",
        title="`train.entrypoint` (the keras_fit example's fit) vs Pinpoint's own loop, same model, mirrored on 2 "
              "emulated GPUs",
        arms=(Arm("entrypoint", "train.entrypoint", {"kind": "entrypoint", "config": entry}),
              Arm("own-loop", "Pinpoint's loop", {"kind": "pinpoint", "config": own, "warmup_steps": warmup,
                                                  "peak": False})),
        ratios=(Ratio("entrypoint / own loop, steady examples/s", "entrypoint", "own-loop", "examples_per_sec"),),
        repeats=ROUNDS,
        run_s=6.4,  # the full run at a8abac4: 36.7 s for its 6 runs; +5%
        note=f"both train digits_mlp (fit_example.train:build_model) with sgd 0.1, global batch {FIT_BATCH}, "
             f"{steps} steps, placement capture on, checkpoints and MLflow off for the own loop (the entrypoint "
             "checkpoints once per epoch through ctx.callbacks()); the entrypoint's rate is the program's own "
             "TimeHistory, the own loop's its train log",
    )


# ---- worker kinds -------------------------------------------------------------------------------
def _program_argv(spec: dict, via: str, timing: Path, out: Path) -> list[str]:
    """`python -m MODULE ARGS` or `pinpoint trace --no-tracking -m MODULE ARGS` (its run folder
    `out`/trace), the program writing its steady state to `timing`."""
    args = [*spec["args"], "--timing-out", str(timing)]
    if via == "python":
        return [sys.executable, "-m", spec["module"], *args]
    return [sys.executable, "-m", "pinpoint.cli", "trace", "--no-tracking", "--out", str(out / "trace"),
            "-m", spec["module"], *args]


def run_program(spec: dict) -> dict[str, Any]:
    """`python -m MODULE ARGS` or `pinpoint trace -m MODULE ARGS`, timed from outside."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    timing = out / "timing.json"
    argv = _program_argv(spec, spec["via"], timing, out)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=spec["cwd"], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not timing.is_file():
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {proc.returncode}: {proc.stderr[-400:]}")
    return _timed(json.loads(timing.read_text()), wall)


def run_program_pair(spec: dict) -> dict[str, Any]:
    """`python -m MODULE ARGS` and `pinpoint trace -m MODULE ARGS` at once on one CPU, each process in
    a session of its own, so the scheduler gives each process half the CPU (whatever its threads)
    and a slow spell of the shared machine slows both alike. Each program writes the clock at every
    block of its steady state; the rates are compared over the seconds both were in it."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    cpu = max(os.sched_getaffinity(0))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    procs, timing = {}, {}
    t0 = time.perf_counter()
    for via in ("python", "trace"):
        timing[via] = out / f"timing-{via}.json"
        procs[via] = start_on_cpu(_program_argv(spec, via, timing[via], out), cpu, spec["cwd"], env, out / f"{via}.log")
    for via, proc in procs.items():
        proc.wait()
        if proc.returncode != 0 or not timing[via].is_file():
            raise RuntimeError(f"{via} {spec['module']} exited {proc.returncode}: {log_tail(out / f'{via}.log')}")
    runs = {via: json.loads(t.read_text()) for via, t in timing.items()}
    return {**together(runs["python"], runs["trace"]), "cpu": cpu, "process_wall_s": time.perf_counter() - t0}


def start_on_cpu(argv: list[str], cpu: int, cwd, env: dict, log: Path) -> subprocess.Popen:
    """Start `argv` pinned to `cpu` in a session of its own (the scheduler shares the CPU between
    sessions, whatever their threads), its output to the file `log`: a pipe this worker is not
    reading yet would stall the program."""
    with open(log, "w") as f:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def log_tail(log: Path) -> str:
    """The end of a program's output file, for an error line."""
    return log.read_text(errors="replace")[-400:]


MIN_TOGETHER_S = 3.0  # the least time both steady states must share for a round to count


def together(python: dict, trace: dict) -> dict[str, Any]:
    """Each program's examples/s over the seconds both were in their steady state (from their
    `stamps`, the clock at each block of `block` batches), and trace / python."""
    a, b = python["stamps"], trace["stamps"]
    lo, hi = max(a[0], b[0]), min(a[-1], b[-1])
    if hi - lo < MIN_TOGETHER_S:
        raise RuntimeError(f"the two steady states shared {max(hi - lo, 0):.1f} s (need {MIN_TOGETHER_S} s): "
                           "give the programs more batches")

    def rate(run: dict) -> float:
        done = [_batches_at(run, t) for t in (lo, hi)]
        return (done[1] - done[0]) * run["batch_size"] / (hi - lo)

    py, tr = rate(python), rate(trace)
    return {"together_s": hi - lo, "python_examples_per_sec": py, "trace_examples_per_sec": tr,
            "steady_ratio": tr / py}


def _batches_at(run: dict, t: float) -> float:
    """Batches a program had done (since its first stamp) at clock `t`: linear between its stamps."""
    st, block = run["stamps"], run["block"]
    for i in range(1, len(st)):
        if t <= st[i]:
            return block * (i - 1 + (t - st[i - 1]) / (st[i] - st[i - 1]))
    return block * (len(st) - 1)


def run_entrypoint(spec: dict) -> dict[str, Any]:
    """`pinpoint train` of an entrypoint config whose program writes its steady state to @timing@."""
    import yaml

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    timing = out / "timing.json"
    cfg = json.loads(json.dumps(spec["config"]).replace("@timing@", str(timing)))
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out", str(out / "run")],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not timing.is_file():
        raise RuntimeError(f"pinpoint train (entrypoint) exited {proc.returncode}: {proc.stderr[-400:]}")
    return _timed(json.loads(timing.read_text()), wall)


def _timed(t: dict, wall: float) -> dict[str, Any]:
    eps = t.get("examples_per_sec")
    work = t["batches"] * t["batch_size"] / eps if eps else None
    return {"examples_per_sec": eps, "process_wall_s": wall, "wall_s": wall,
            "fixed_s": wall - work if work is not None else None, "batches": t["batches"]}
