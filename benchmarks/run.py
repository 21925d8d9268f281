"""`make bench` / `python -m benchmarks.run`: interleaved A/B runs -> benchmarks/RESULTS.md + PNG.

RESULTS.md is written whole by one full run (every registered section, benchmarks/sections/). A
partial run (`--only`, `--quick`) writes its own dated file under benchmarks/runs/ and leaves
RESULTS.md alone; `--plan` prints what a run would do and its estimated time, and runs nothing.

Each comparison runs its arms in rounds; within a round the arms run back to back, and the
order alternates between rounds (A B, B A, ...) so slow drift of the machine's load hits both
sides alike. Ratios are taken within a round, then summarized (median, min, max).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine import machine_info
from benchmarks.plan import SERVER_URI, Comparison, Prepare, Settings, build_plan, own_runs, plan_seconds, rounds
from benchmarks.worker import RESULT_PREFIX

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600
RESULTS = ROOT / "benchmarks" / "RESULTS.md"  # a full run's report
PARTIAL_RUNS = ROOT / "benchmarks" / "runs"  # a partial run's report, one dated file each
OUT = ROOT / "benchmarks" / "out"  # raw records (git-ignored)


def run_worker(spec: dict, out: Path, timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run one measured process in a fresh folder; return its record (`error` set if it failed)."""
    if out.exists():
        shutil.rmtree(out)  # a run folder left by an earlier bench would be resumed, not trained
    out.mkdir(parents=True)
    spec = dict(spec, out=str(out / "run"))
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    log = out / "worker.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            p = subprocess.run([sys.executable, "-m", "benchmarks.worker", str(out / "spec.json")],
                               stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout, check=False)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    line = next((ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if rc != 0 or line is None:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        return {"error": f"exit {rc}: {' / '.join(tail)[-400:]}", "log": str(log), "process_wall_s": wall}
    record = json.loads(line[len(RESULT_PREFIX):])
    record["process_wall_s"] = wall
    record["log"] = str(log)
    return record


def run_prepare(prep: Prepare, log: Path, timeout: float = RUN_TIMEOUT_S) -> str | None:
    """Run a comparison's preparation command once; None if it succeeded, else why not."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if prep.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (prep.pythonpath, env.get("PYTHONPATH")) if p)
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, *prep.argv], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc == 0:
        return None
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
    return f"prepare (python {' '.join(prep.argv)}) exit {rc}: {' / '.join(tail)[-400:]}"


def _headline(rec: dict) -> str:
    if "error" in rec:
        return f"FAILED ({rec['error'][:160]})"
    parts = []
    if rec.get("examples_per_sec"):
        parts.append(f"{rec['examples_per_sec']:,.0f} ex/s")
    if rec.get("train_s") is not None:
        parts.append(f"train {rec['train_s']:.2f} s")
    if rec.get("first_step_s") is not None:
        parts.append(f"first step {rec['first_step_s']:.1f} s")
    if rec.get("mfu") is not None:
        parts.append(f"MFU {100 * rec['mfu']:.3f}%")
    parts.append(f"process {rec['process_wall_s']:.1f} s")
    return ", ".join(parts)


def _with_server(spec: dict, uri: str) -> dict:
    """The arm's spec with SERVER_URI (its tracking.uri placeholder) replaced by `uri`."""
    text = json.dumps(spec)
    return json.loads(text.replace(json.dumps(SERVER_URI), json.dumps(uri)))


def run_comparison(comp: Comparison, repeats: int, out: Path, results: dict, log=print) -> dict:
    """Rounds of interleaved arms; returns {arm: [record per round]}."""
    if comp.mlflow_server:
        from benchmarks.mlflow_server import mlflow_server

        try:
            with mlflow_server(out / comp.key / "server") as uri:
                log(f"[{comp.key}] mlflow server at {uri}")
                arms = tuple(dataclasses.replace(a, spec=_with_server(a.spec, uri)) for a in comp.arms)
                return _run_rounds(dataclasses.replace(comp, arms=arms, mlflow_server=False), repeats, out,
                                   results, log)
        except RuntimeError as err:
            log(f"[{comp.key}] {err}")
            return {a.name: [{"error": str(err), "log": str(out / comp.key / "server" / "server.log"),
                              "process_wall_s": 0.0}] for a in comp.arms}
    return _run_rounds(comp, repeats, out, results, log)


def _run_rounds(comp: Comparison, repeats: int, out: Path, results: dict, log=print) -> dict:
    runs: dict[str, list[dict]] = {}
    own = [a for a in comp.arms if not (a.reuse and a.reuse[0] in results and a.reuse[1] in results[a.reuse[0]])]
    if comp.prepare is not None:
        err = run_prepare(comp.prepare, out / comp.key / "prepare.log")
        if err:
            log(f"[{comp.key}] {err}")
            return {a.name: [{"error": err, "log": str(out / comp.key / "prepare.log"), "process_wall_s": 0.0}]
                    for a in own}
    for a in comp.arms:
        if a not in own:
            runs[a.name] = results[a.reuse[0]][a.reuse[1]][:repeats]
            log(f"[{comp.key}] {a.name}: reusing the {len(runs[a.name])} runs of {a.reuse[0]}/{a.reuse[1]}")
    started = time.perf_counter()
    r = 0
    while r < repeats or more_rounds(comp, runs, time.perf_counter() - started, r):
        order = own if r % 2 == 0 else list(reversed(own))
        for a in order:
            if a.max_rounds is not None and r >= a.max_rounds:
                continue
            rec = run_worker(a.spec, out / comp.key / f"r{r}-{a.name}")
            runs.setdefault(a.name, []).append(rec)
            log(f"[{comp.key}] round {r + 1}/{repeats}{'+' if r >= repeats else ''} {a.name}: {_headline(rec)}")
        r += 1
    # Keep the rounds aligned with the arm order for same-round ratios.
    return runs


def more_rounds(comp: Comparison, runs: dict, elapsed: float, done: int) -> bool:
    """Issue 34.3: one more round, when the comparison has a time cap that another round fits in
    (at its rounds' mean time so far) and a targeted ratio's interval is still wider than ±3%.
    A difference (seconds of fixed cost) is left out: ±3% of a fraction of a second is noise."""
    from benchmarks.render import compare_summary
    from benchmarks.stats import settled

    if comp.time_cap_s is None or done == 0 or elapsed + elapsed / done > comp.time_cap_s:
        return False
    results = {comp.key: runs}
    # A ratio with no figures yet (failed or figure-less runs) is not one more round would settle.
    found = [compare_summary(results, comp.key, rt) for rt in comp.ratios if rt.target and not rt.difference]
    return any(x is not None and not settled(x) for x in found)


def _save(out: Path, machine: dict, command: str, s: Settings, elapsed: float, results: dict, *,
          timings: dict[str, float], planned: dict[str, float], only: list[str]) -> dict:
    machine = dict(machine, loadavg_at_end=[round(x, 2) for x in os.getloadavg()])
    raw = {"machine": machine, "command": command, "settings": s.__dict__, "only": only, "elapsed_s": elapsed,
           "timings": timings, "planned_s": planned, "out": _shown(out), "results": results}
    from pinpoint.runfolder import atomic_write_json

    atomic_write_json(out / "results.json", raw)
    return raw


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _load_prior(path: Path, s: Settings, only: list[str], commit: str) -> dict | str:
    """A previous results.json of the same run (same settings, selection and commit), or why it
    cannot be resumed: a resumed run never splices in runs of other code or other settings."""
    if not path.is_file():
        return f"no {_shown(path)} to resume"
    prior = json.loads(path.read_text())
    why = ("other settings" if prior.get("settings") != json.loads(json.dumps(s.__dict__))
           else "another --only" if prior.get("only", []) != only
           else f"commit {prior['machine'].get('git')}, not {commit}" if prior["machine"].get("git") != commit
           else "")
    return f"{_shown(path)} was made with {why}" if why else prior


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="runs per arm (default 5; --quick: 1)")
    p.add_argument("--quick", action="store_true",
                   help="1 repeat, few steps: checks the harness, not the numbers (a partial run)")
    p.add_argument("--only", default="", help="comma-separated sections or comparisons (a partial run); "
                   "--plan lists them")
    p.add_argument("--steps", type=int, default=None, help="steps of the Pinpoint-vs-Keras and scaling runs")
    p.add_argument("--out", default=None, help="raw results (git-ignored; default benchmarks/out, a partial "
                   "run: benchmarks/out/runs/<its name>)")
    p.add_argument("--results", default=None, help="the markdown report (default benchmarks/RESULTS.md; a "
                   "partial run: benchmarks/runs/<UTC date and time>-<what it ran>.md)")
    p.add_argument("--chart", default=None, help="the PNG chart (default: next to --results, .png)")
    p.add_argument("--resume", action="store_true",
                   help="keep the comparisons already complete in OUT/results.json (same settings, selection "
                   "and commit); run the rest. Refused, with nothing written, when that file is of another run")
    p.add_argument("--plan", action="store_true", help="print the comparisons, their runs and the estimated "
                   "time; run nothing")
    return p.parse_args(argv)


def settings_from(args, gpus: int) -> Settings:
    if args.quick:
        s = Settings(repeats=args.repeats or 1, steps=args.steps or 60, warmup_steps=20, overhead_steps=60,
                     overhead_repeat_factor=1, gpus=gpus)
    else:
        steps = args.steps or Settings.steps
        s = Settings(repeats=args.repeats or 5, steps=steps, warmup_steps=min(Settings.warmup_steps, steps // 4), gpus=gpus)
    if s.repeats < 1:
        raise SystemExit("benchmarks.run: --repeats: need at least 1")
    return s


def select(plan: list[Comparison], only: list[str]) -> list[Comparison] | str:
    """The comparisons `--only` names (a section's key stands for all of its comparisons), or
    the one-line error."""
    names = {c.key for c in plan} | {c.section for c in plan}
    bad = [k for k in only if k not in names]
    if bad:
        return (f"--only: got {', '.join(bad)}; use sections ({', '.join(dict.fromkeys(c.section for c in plan))}) "
                f"or comparisons ({', '.join(c.key for c in plan)})")
    return [c for c in plan if not only or c.key in only or c.section in only]


def describe_plan(plan: list[Comparison], s: Settings) -> str:
    """The plan as a table: each comparison's runs and estimated minutes, and the total."""
    from benchmarks.sections import PLAN_LIMIT_S

    est = plan_seconds(plan, s)
    keys = {c.key for c in plan if not c.skipped}
    lines = [f"{'comparison':<20} {'section':<12} {'rounds':>6} {'runs':>5} {'min':>6}"]
    for c in plan:
        runs = 0 if c.skipped else own_runs(c, s, keys)
        lines.append(f"{c.key:<20} {c.section:<12} {rounds(c, s):>6} {runs:>5} {est[c.key] / 60:>6.1f}"
                     + (f"  skipped: {c.skipped}" if c.skipped else ""))
    total = sum(est.values())
    lines.append(f"{'total':<20} {'':<12} {'':>6} {'':>5} {total / 60:>6.1f}  (limit {PLAN_LIMIT_S / 60:.0f} min)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.render import write_outputs

    args = parse_args(argv)
    machine = machine_info()
    s = settings_from(args, len(machine["gpus"]))
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    partial = bool(only) or args.quick
    stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    name = f"{stamp}-{'-'.join(only) or 'all'}{'-quick' if args.quick else ''}"
    out = Path(args.out) if args.out else (OUT / "runs" / name if partial else OUT)
    results_md = Path(args.results) if args.results else (PARTIAL_RUNS / f"{name}.md" if partial else RESULTS)
    if partial and results_md.resolve() == RESULTS.resolve():
        print(f"benchmarks.run: --results: got {_shown(RESULTS)} for a partial run (--only/--quick); RESULTS.md comes "
              "from one full `make bench`; leave --results unset (the report goes to benchmarks/runs/)", file=sys.stderr)
        return 2
    full_plan = build_plan(s, out)
    plan = select(full_plan, only)
    if isinstance(plan, str):
        print(f"benchmarks.run: {plan}", file=sys.stderr)
        return 2
    if args.plan:
        print(describe_plan(plan, s))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.run" + "".join(" " + shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    chart = Path(args.chart) if args.chart else results_md.with_suffix(".png")
    planned = plan_seconds(plan, s)
    results: dict[str, dict[str, list[dict]]] = {}
    timings: dict[str, float] = {}
    before = 0.0
    if args.resume:
        prior = _load_prior(out / "results.json", s, only, machine["git"])
        if isinstance(prior, str):
            # Not afresh: a fresh run would write over the raw results this --resume was meant to keep.
            print(f"benchmarks.run: --resume: {prior}; rerun with the same settings, --only and commit, or "
                  "without --resume (a fresh run replaces it)", file=sys.stderr)
            return 2
        results, before, timings = prior["results"], prior["elapsed_s"], prior.get("timings", {})
        machine = dict(prior["machine"], loadavg_at_start=prior["machine"]["loadavg_at_start"])
        command = f"{prior['command']}; then {command}"

    def save() -> dict:
        return _save(out, machine, command, s, before + time.perf_counter() - t0, results,
                     timings=timings, planned=planned, only=only)

    for comp in plan:
        if comp.skipped:
            print(f"[{comp.key}] skipped: {comp.skipped}", flush=True)
            continue
        reps = rounds(comp, s)
        done = results.get(comp.key) or {}
        if done and all(len(done.get(a.name, [])) >= min(reps, a.max_rounds or reps) for a in comp.arms):
            print(f"[{comp.key}] kept from {out / 'results.json'} (--resume)", flush=True)
            continue
        started = time.perf_counter()
        results[comp.key] = run_comparison(comp, reps, out, results, log=lambda m: print(m, flush=True))
        timings[comp.key] = time.perf_counter() - started
        # Partial results survive a stop: raw records and the report so far.
        write_outputs(plan, results, save(), results_md, chart, partial=partial)
    elapsed = before + time.perf_counter() - t0
    write_outputs(plan, results, save(), results_md, chart, partial=partial)
    print(f"benchmarks: {elapsed / 60:.1f} min (planned {sum(planned.values()) / 60:.1f}); wrote {results_md} "
          f"and {chart} (raw: {out / 'results.json'})")
    failed = sum(1 for runs in results.values() for recs in runs.values() for r in recs if "error" in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
