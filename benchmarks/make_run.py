"""The wall time of `make run` and its time to the first training step.

Runs the command `make run` runs (`pinpoint run CONFIG`, the kfp.local pipeline) with its own
runs root, and reads the first record of the run's train_log.jsonl: the trainer writes it
(with a wall-clock timestamp) right after the first logged step, so `first_step_s` is the time
from the command's start to the end of step `train.log_every` (a few milliseconds after step 1).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

TIMEOUT_S = 900


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
    start = time.time()
    t0 = time.perf_counter()
    with open(root / "make-run.log", "w") as log:
        p = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}; see {root / 'make-run.log'}")
    lines = (root / cfg.name / TRAIN_LOG).read_text().splitlines()
    first = json.loads(lines[0])
    return {
        "wall_s": wall,
        "first_step_s": first["time"] - start,
        "first_logged_step": first["step"],
        "command": " ".join(cmd),
    }
