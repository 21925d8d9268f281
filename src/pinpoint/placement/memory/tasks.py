"""Memory of the tasks that only serve (parameter_server's workers and ps): their allocator's own
figures, read back from the run folder by the coordinator.

A parameter_server step runs as a closure in a worker's runtime and the variables live in the ps
tasks' runtimes: the coordinator's allocator sees neither. A serving task runs no Python loop and
no profiler (placement.capture.profiler's CLUSTER_TASK), so what it can say is its allocator's
totals, every device of the task together: `held` (bytes in use: on a ps, the variables and
optimizer slots it holds) and `peak` (the most since the task started). Each task rewrites
OUT/task_memory/ROLE-INDEX.json (placement.capture.tasks); the coordinator reads the files when it
builds its placement. A task on another machine (a pod) writes into its own file system: the
coordinator then finds no file and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from pinpoint.device_names import parse_name

TASK_MEMORY = "task_memory"


# What a variable made on a serving task takes from its allocator (the CPU BFC allocator that
# placement.memory turns on): its value in whole 256 B units (the allocator's smallest chunk), and
# one more 256 B chunk (most likely its resource handle). Measured on a ps task: a 1 KiB variable
# adds 1,280 B, a scalar 512 B, a [64, 128] float32 kernel and its Adam slots 33,024 B each.
UNIT = 256


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
