"""The Keras peer of a local multi_worker_mirrored cluster: one `fit` process per task.

Same task list as Pinpoint's launcher (`pinpoint.provision.local.local_tasks`: free localhost
ports, one TF_CONFIG per task, set in the child's environment before TensorFlow starts).
The chief's record is the run's record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.worker import RESULT_PREFIX

TIMEOUT_S = 600


def launch(spec: dict) -> dict:
    from pinpoint.config import config_from_dict
    from pinpoint.provision.local import local_tasks

    cfg = config_from_dict(spec["config"])
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in local_tasks(cfg) if t.role in ("chief", "worker")]
    procs = []
    t0 = time.perf_counter()
    for t in tasks:
        is_chief = t.role == "chief"
        child = dict(spec, kind="keras_task", peak=bool(spec.get("peak")) and is_chief)
        env = dict(os.environ, TF_CONFIG=json.dumps(t.tf_config))
        log = open(out / f"{t.role}-{t.index}.log", "w")
        procs.append((t, subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", json.dumps(child)],
            env=env, stdout=subprocess.PIPE, stderr=log, text=True,
        ), log))
    records, failures = {}, []
    try:
        for t, p, log in procs:
            stdout, _ = p.communicate(timeout=TIMEOUT_S)
            log.close()
            line = next((ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
            if p.returncode != 0 or line is None:
                failures.append(f"{t.role}:{t.index} exited {p.returncode} (log {out}/{t.role}-{t.index}.log)")
            else:
                records[t.name] = json.loads(line[len(RESULT_PREFIX):])
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if failures:
        raise RuntimeError("; ".join(failures))
    chief = records.get("chief:0") or records[sorted(records)[0]]
    chief["wall_s"] = time.perf_counter() - t0
    chief["tasks"] = sorted(records)
    return chief
