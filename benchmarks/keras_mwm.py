"""The Keras peer of a local multi_worker_mirrored cluster: one `fit` process per task.

Same task list as Pinpoint's launcher (`pinpoint.provision.local.local_tasks`: free localhost
ports, one TF_CONFIG per task, set in the child's environment before TensorFlow starts).
The chief's record is the run's record.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.worker import RESULT_PREFIX

TIMEOUT_S = 600


def _reap(p: subprocess.Popen) -> None:
    """A task still running (a peer failed, or the launch timed out) is killed."""
    if p.poll() is None:
        p.kill()
        p.wait()


def launch(spec: dict) -> dict:
    from pinpoint.config import config_from_dict
    from pinpoint.provision.local import local_tasks

    cfg = config_from_dict(spec["config"])
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in local_tasks(cfg) if t.role in ("chief", "worker")]
    records, failures = {}, []
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        procs = []
        for t in tasks:
            is_chief = t.role == "chief"
            child = dict(spec, kind="keras_task", peak=bool(spec.get("peak")) and is_chief)
            env = dict(os.environ, TF_CONFIG=json.dumps(t.tf_config))
            log = stack.enter_context(open(out / f"{t.role}-{t.index}.log", "w"))
            p = subprocess.Popen([sys.executable, "-m", "benchmarks.worker", json.dumps(child)],
                                 env=env, stdout=subprocess.PIPE, stderr=log, text=True)
            stack.callback(_reap, p)
            procs.append((t, p))
        # A task that dies leaves its peer blocked in a collective: stop the group at once.
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for _, p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for _, p in procs):
                break
            time.sleep(0.2)
        for _, p in procs:
            _reap(p)
        for t, p in procs:
            stdout, _ = p.communicate()
            line = next((ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
            if p.returncode != 0 or line is None:
                failures.append(f"{t.role}:{t.index} exited {p.returncode} (log {out}/{t.role}-{t.index}.log)")
            else:
                records[t.name] = json.loads(line[len(RESULT_PREFIX):])
    if failures:
        raise RuntimeError("; ".join(failures))
    chief = records.get("chief:0") or records[min(records)]
    chief["wall_s"] = time.perf_counter() - t0
    chief["tasks"] = sorted(records)
    return chief
