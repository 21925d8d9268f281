"""The wall time of `make run`, per pipeline step, and its time to the first training step.

Runs the command `make run` runs (`pinpoint run CONFIG`, the kfp.local pipeline) with its own
runs root and `make run`'s environment (unbuffered output, TF_CPP_MIN_LOG_LEVEL=2), timing each
output line as it arrives. kfp.local logs "Executing task 'NAME'" when it starts a step's process
and "Task 'NAME' finished with status ..." when that process has exited: a step's wall time is
between the two, so it includes the process's start (imports), its MLflow step run and its exit.

The time to the first training step comes from the run's train_log.jsonl: the trainer runs the
run's first step as a call of its own and writes its record (step 1, with a wall-clock `time`)
as soon as it returned, so `first_step_s` is the time from the command's start to the end of
training step 1 (data, model, tracing included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

TIMEOUT_S = 900
# kfp.local's task names -> the record's keys (step_<key>_s).
STEPS = {"provision-cluster": "provision", "train": "train", "report": "report"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# kfp.local's own log lines ("08:10:01.972 - INFO - ..."), not a step's (indented) output.
_KFP = r"^\d\d:\d\d:\d\d\.\d+ - INFO - "
_START = re.compile(_KFP + r"Executing task '([^']+)'")
_END = re.compile(_KFP + r"Task '([^']+)' finished with status")


def step_times(events: list[tuple[float, str]], wall: float) -> dict:
    """Per-step wall times from (seconds since start, output line) pairs: `startup_s` before
    the first step starts (CLI, config, kfp, the MLflow parent run), `step_<name>_s` for each
    step, `shutdown_s` after the last one ended (the parent run's end, the summary, exit)."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for t, line in events:
        text = _ANSI.sub("", line)
        m = _START.search(text)
        if m:
            starts.setdefault(m.group(1), t)
            continue
        m = _END.search(text)
        if m:
            ends[m.group(1)] = t
    out: dict = {"step_starts_s": dict(starts)}
    for name, s in starts.items():
        if name in ends:
            out[f"step_{STEPS.get(name, name.replace('-', '_'))}_s"] = ends[name] - s
    if starts:
        out["startup_s"] = min(starts.values())
    if ends:
        out["shutdown_s"] = wall - max(ends.values())
    return out


def time_make_run(spec: dict) -> dict:
    from pinpoint.config import load_config
    from pinpoint.runfolder import TRAIN_LOG

    config_path = spec["config_path"]
    cfg = load_config(config_path)
    root = Path(spec["out"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    pinpoint = Path(sys.executable).with_name("pinpoint")
    cmd = [str(pinpoint), "run", config_path, "--runs-root", str(root)]
    # What the Makefile exports for `make run`.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    events: list[tuple[float, str]] = []
    start = time.time()
    t0 = time.perf_counter()
    with open(root / "make-run.log", "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                             errors="replace", bufsize=1)
        timer = threading.Timer(TIMEOUT_S, p.kill)
        timer.start()
        try:
            assert p.stdout is not None
            for line in p.stdout:
                t = time.perf_counter() - t0
                events.append((t, line))
                log.write(f"[{t:7.2f}] {line}")
            rc = p.wait()
        finally:
            timer.cancel()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}; see {root / 'make-run.log'}")
    lines = (root / cfg.name / TRAIN_LOG).read_text().splitlines()
    first = json.loads(lines[0])
    rec = {
        "wall_s": wall,
        "first_step_s": first["time"] - start,
        "first_logged_step": first["step"],
        "command": " ".join(cmd),
        **step_times(events, wall),
    }
    train_start = rec["step_starts_s"].get("train")
    if train_start is not None:
        # Inside the train step: its process start, TensorFlow's import, data, model, tracing.
        rec["train_to_first_step_s"] = rec["first_step_s"] - train_start
    return rec
