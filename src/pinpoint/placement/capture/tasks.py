"""A serving task's reporting thread: its allocator's totals written to
OUT/task_memory/ROLE-INDEX.json every EVERY_S seconds (read back by placement.memory.tasks)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pinpoint.placement.memory.tasks import TASK_MEMORY
from pinpoint.runfolder import atomic_write_json

EVERY_S = 0.25


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
