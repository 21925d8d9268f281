"""The run skeleton: what every training task does whichever code takes its steps (Pinpoint's
own loop, training.loop, or the user's `train.entrypoint`, training.entrypoint): the run info
the hooks hear first, the input-pipeline ids, the checkpoints it restores and saves, the
per-task placement file and the cluster's merged view the chief finishes with. The finish
itself (placement.json and metrics.json) is pinpoint.outcome.write_outcome."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pinpoint.config import Config
from pinpoint.runfolder import CHECKPOINTS
from pinpoint.training.setup import TaskContext

PLACEMENT_WAIT = 120.0  # seconds the chief waits for the other tasks' placement files


def run_info(cfg: Config, ctx: TaskContext, out: Path, resumed_from_run: str | None, **extra) -> dict:
    """What the hooks hear at on_train_begin: the config, who this task is and its devices."""
    dm = ctx.device_map
    return {"config": cfg.model_dump(mode="json"), "strategy": cfg.train.strategy, "task": ctx.task,
            "num_replicas": ctx.strategy.num_replicas_in_sync, "devices": list(dm.local_devices),
            "replica_devices": list(dm.spec_replica_devices), "device_aliases": dict(dm.aliases),
            "pinning": cfg.train.pinning.model_dump(mode="json"), "out_dir": str(out),
            "resumed_from_run": resumed_from_run, **extra}


def input_pipelines(cfg: Config, ctx: TaskContext) -> tuple[int, int]:
    """(this task's input pipeline id, the number of pipelines) of the cluster."""
    if ctx.multi_worker:
        # Pipeline ids follow TF's id_in_cluster: the chief first, then the workers.
        return ctx.index + (cfg.cluster.chief if ctx.role == "worker" else 0), cfg.cluster.replicas
    if ctx.coordinator is not None:
        return 0, cfg.cluster.workers  # parameter_server: the coordinator feeds every worker
    return 0, 1


def open_checkpoints(cfg: Config, out: Path, ctx: TaskContext, checkpoint, resume_prefix: str | None = None):
    """(Checkpoints in OUT/checkpoints for `checkpoint`, the step restored: `resume_prefix`'s,
    fetched from an MLflow run, else the latest good local one; 0 for none)."""
    from pinpoint.training.checkpoints import Checkpoints, restore_prefix

    ckpts = Checkpoints(checkpoint, Path(out) / CHECKPOINTS, keep=cfg.train.keep_checkpoints,
                        is_chief=ctx.is_chief, task=ctx.task)
    step = restore_prefix(checkpoint, resume_prefix) if resume_prefix else ckpts.restore_latest()
    return ckpts, step


def task_placement_file(out: Path, role: str, index: int) -> Path:
    return Path(out) / f"placement-{role}-{index}.json"


def write_task_placement(out: Path, ctx: TaskContext, placement: dict) -> None:
    """A multi_worker_mirrored task's own view (every task has one; the chief merges them)."""
    if ctx.multi_worker:
        from pinpoint.placement import write_placement

        write_placement(task_placement_file(out, ctx.role, ctx.index), placement)


def cluster_placement(cfg: Config, out: Path) -> dict | None:
    """Wait for every training task's placement file and merge them (None: none arrived)."""
    from pinpoint.placement import load_placement, merge_placements

    c = cfg.cluster
    tasks = [("chief", i) for i in range(c.chief)] + [("worker", i) for i in range(c.workers)]
    files = [task_placement_file(out, role, i) for role, i in tasks]
    deadline = time.monotonic() + PLACEMENT_WAIT
    while time.monotonic() < deadline and not all(f.is_file() for f in files):
        time.sleep(0.5)
    present = [load_placement(f) for f in files if f.is_file()]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        print(f"pinpoint: warning: no placement from {', '.join(missing)}; merging the others", file=sys.stderr)
    return merge_placements(present).to_json() if present else None


def chief_placement(cfg: Config, out: Path, ctx: TaskContext, own: dict | None, *,
                    merge: bool = True) -> dict | None:
    """What the chief writes as placement.json: the cluster's merged view when its tasks each
    captured one, else its own."""
    if not (merge and ctx.multi_worker and cfg.placement.enabled):
        return own
    merged = cluster_placement(cfg, out)
    return own if merged is None else merged
