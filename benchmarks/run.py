"""`make bench` / `python -m benchmarks.run`: interleaved A/B runs -> benchmarks/RESULTS.md + PNG.

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
from benchmarks.plan import SERVER_URI, Comparison, Prepare, Settings, build_plan
from benchmarks.worker import RESULT_PREFIX

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600


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
    for r in range(repeats):
        order = own if r % 2 == 0 else list(reversed(own))
        for a in order:
            if a.max_rounds is not None and r >= a.max_rounds:
                continue
            rec = run_worker(a.spec, out / comp.key / f"r{r}-{a.name}")
            runs.setdefault(a.name, []).append(rec)
            log(f"[{comp.key}] round {r + 1}/{repeats} {a.name}: {_headline(rec)}")
    # Keep the rounds aligned with the arm order for same-round ratios.
    return runs


def _save(out: Path, machine: dict, command: str, s: Settings, elapsed: float, results: dict) -> dict:
    machine = dict(machine, loadavg_at_end=[round(x, 2) for x in os.getloadavg()])
    raw = {"machine": machine, "command": command, "settings": s.__dict__, "elapsed_s": elapsed,
           "results": results}
    from pinpoint.runfolder import atomic_write_json

    atomic_write_json(out / "results.json", raw)
    return raw


def _load_prior(path: Path, s: Settings) -> dict | None:
    """A previous results.json made with the same settings, or None."""
    if not path.is_file():
        return None
    prior = json.loads(path.read_text())
    if prior.get("settings") != json.loads(json.dumps(s.__dict__)):
        print(f"benchmarks.run: --resume: {path} was made with other settings; starting afresh", flush=True)
        return None
    return prior


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="runs per arm (default 5; --quick: 1)")
    p.add_argument("--quick", action="store_true", help="1 repeat, few steps: checks the harness, not the numbers")
    p.add_argument("--only", default="", help="comma-separated comparisons (keras-none, keras-mirrored, keras-mwm, "
                   "keras-user-model, keras-cnn, keras-transformer, overhead, tracking, scaling, allreduce, make-run, "
                   "k8s-scale)")
    p.add_argument("--steps", type=int, default=None, help="steps of the Pinpoint-vs-Keras and scaling runs")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"), help="raw results (git-ignored)")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="the markdown report")
    p.add_argument("--chart", default=None, help="the PNG chart (default: next to --results, .png)")
    p.add_argument("--resume", action="store_true",
                   help="keep the comparisons already complete in OUT/results.json (same settings); run the rest")
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


def main(argv: list[str] | None = None) -> int:
    from benchmarks.render import write_outputs

    args = parse_args(argv)
    machine = machine_info()
    s = settings_from(args, len(machine["gpus"]))
    plan = build_plan(s, Path(args.out))
    keys = [c.key for c in plan]
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in only if k not in keys]
    if bad:
        print(f"benchmarks.run: --only: unknown comparison(s) {', '.join(bad)}; use {', '.join(keys)}", file=sys.stderr)
        return 2
    full_plan = plan
    if only:
        plan = [c for c in plan if c.key in only]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.run" + "".join(" " + shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    chart = Path(args.chart) if args.chart else Path(args.results).with_suffix(".png")
    results: dict[str, dict[str, list[dict]]] = {}
    before = 0.0
    if args.resume:
        prior = _load_prior(out / "results.json", s)
        if prior is not None:
            results, before = prior["results"], prior["elapsed_s"]
            machine = dict(prior["machine"], loadavg_at_start=prior["machine"]["loadavg_at_start"])
            command = f"{prior['command']}; then {command}"
    for comp in plan:
        if comp.skipped:
            print(f"[{comp.key}] skipped: {comp.skipped}", flush=True)
            continue
        reps = (s.make_run_repeats or s.repeats) if comp.key == "make-run" else (comp.repeats or s.repeats)
        done = results.get(comp.key) or {}
        if done and all(len(done.get(a.name, [])) >= min(reps, a.max_rounds or reps) for a in comp.arms):
            print(f"[{comp.key}] kept from {out / 'results.json'} (--resume)", flush=True)
            continue
        results[comp.key] = run_comparison(comp, reps, out, results, log=lambda m: print(m, flush=True))
        # Partial results survive a stop: raw records and the report so far.
        raw = _save(out, machine, command, s, before + time.perf_counter() - t0, results)
        write_outputs(full_plan, results, raw, Path(args.results), chart)
    elapsed = before + time.perf_counter() - t0
    raw = _save(out, machine, command, s, elapsed, results)
    write_outputs(full_plan, results, raw, Path(args.results), chart)
    print(f"benchmarks: {elapsed / 60:.1f} min; wrote {args.results} and {chart} (raw: {out / 'results.json'})")
    failed = sum(1 for runs in results.values() for recs in runs.values() for r in recs if "error" in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
