"""Memory of the tasks that only serve (parameter_server's workers and ps): their allocator's own
figures, written into the run folder while they serve and read by the coordinator.

A parameter_server step runs as a closure in a worker's runtime and the variables live in the ps
tasks' runtimes: the coordinator's allocator sees neither. A serving task runs no Python loop and
no profiler (a task of a multi-process cluster: placement.timing's CLUSTER_TASK), so what it can
say is its allocator's totals, every device of the task together: `held` (bytes in use: on a ps,
the variables and optimizer slots it holds) and `peak` (the most since the task started, every step
it ran). It rewrites OUT/task_memory/ROLE-INDEX.json every EVERY_S seconds; the coordinator reads
the files when it builds its placement (after the last step). A task on another machine (a pod)
writes into its own file system: the coordinator then finds no file and says so.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from pinpoint.device_names import parse_name
from pinpoint.runfolder import atomic_write_json

TASK_MEMORY = "task_memory"
EVERY_S = 0.25
# What a variable made on a serving task takes from its allocator (the CPU BFC allocator that
# placement.memory turns on): its value in whole 256 B units (the allocator's smallest chunk), and
# one more 256 B chunk (most likely its resource handle). Measured on a ps task: a 1 KiB variable
# adds 1,280 B, a scalar 512 B, a [64, 128] float32 kernel and its Adam slots 33,024 B each.
UNIT = 256


def _stats() -> dict | None:
    import tensorflow as tf

    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, RuntimeError):
        return None  # no allocator statistics (TF_CPU_ALLOCATOR_USE_BFC not set)
    return {"held": int(info["current"]), "peak": int(info["peak"])}


def start_reporting(out_dir: Path, role: str, index: int, every: float = EVERY_S) -> threading.Thread:
    """Write this task's allocator figures into OUT/task_memory/ROLE-INDEX.json every `every` s,
    from a daemon thread (it ends with the process). A folder it cannot write stops the reports,
    never the task: the coordinator then names it among the tasks it has no figures from."""
    path = Path(out_dir) / TASK_MEMORY / f"{role}-{index}.json"

    def loop() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                stats = _stats()
                if stats is not None:
                    atomic_write_json(path, {"task": f"{role}:{index}", **stats, "time": time.time()})
                time.sleep(every)
        except OSError as err:
            print(f"pinpoint: {role}:{index} cannot write its memory figures ({err}); the placement "
                  "will say it has none from this task", flush=True)

    thread = threading.Thread(target=loop, name="pinpoint-task-memory", daemon=True)
    thread.start()
    return thread


def read_reports(out_dir: Path) -> dict[str, dict]:
    """{task: {"held", "peak"}} from the serving tasks' files (an unreadable one is skipped: it is
    rewritten atomically, so only a foreign file can be)."""
    out = {}
    for path in sorted((Path(out_dir) / TASK_MEMORY).glob("*.json")):
        try:
            d = json.loads(path.read_text())
            out[d["task"]] = {"held": int(d["held"]), "peak": int(d["peak"])}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def serving_tasks_memory(out_dir: Path, expected: list[str], why: str) -> dict:
    """placement.json's `memory` section of a parameter_server coordinator: each serving task's
    figures under `tasks`, `why` (no per-device split) and the tasks that wrote nothing."""
    found = read_reports(out_dir)
    missing = [t for t in expected if t not in found]
    reason = f"not measured per device: {why}"
    if missing:
        reason += (f"; no figures from {', '.join(missing)} (none in {TASK_MEMORY}/: a task on another "
                   "machine writes into its own file system)")
    return {"why_not": reason, "tasks": {t: found[t] for t in expected if t in found}}


def variable_bytes(nbytes: int) -> int:
    """What one variable of `nbytes` takes from a serving task's allocator (UNIT)."""
    return -(-max(nbytes, 1) // UNIT) * UNIT + UNIT


def with_task_variables(memory: dict | None, variables) -> dict | None:
    """memory with each serving task's variables (placement.json's rows: a row per variable, its
    `bytes` and the `devices` holding it): `variables` (how many) and `variables_bytes` (what they
    take from the task's allocator, variable_bytes). What the task holds beyond them is what its
    runtime keeps: the constants of each step function instantiated there, cached fill values."""
    tasks = (memory or {}).get("tasks")
    if not tasks:
        return memory
    count: dict[str, int] = {}
    total: dict[str, int] = {}
    # A task holding a variable of unknown bytes, or a shard (a row's bytes are the whole variable's,
    # not its shard's): no split.
    unsized: set[str] = set()
    for v in variables or ():
        for device in v.get("devices") or ():
            job, index, _, _ = parse_name(device)
            task = f"{job}:{index}"
            if "held" not in tasks.get(task, {}):
                continue  # not a serving task's allocator figures
            if v.get("bytes") is None or v.get("kind") == "sharded":
                unsized.add(task)
                continue
            count[task] = count.get(task, 0) + 1
            total[task] = total.get(task, 0) + variable_bytes(v["bytes"])
    return memory | {"tasks": {t: dict(m) | ({"variables": count[t], "variables_bytes": total[t]}
                                             if t in count and t not in unsized else {})
                               for t, m in tasks.items()}}


__all__ = ["EVERY_S", "TASK_MEMORY", "UNIT", "read_reports", "serving_tasks_memory", "start_reporting",
           "variable_bytes", "with_task_variables"]
