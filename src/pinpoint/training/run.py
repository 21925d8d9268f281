"""A run inside its MLflow step run: the one path the single-process run, the parameter_server
chief and every multi_worker_mirrored task take."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pinpoint.config import Config


def train_tracked(cfg: Config, out: Path, ctx, *, resume_from_run: str | None = None,
                  parent_run_id: str | None = None, state=None,
                  cluster_placement: Callable[[], dict | None] | None = None) -> int:
    """Train in this process inside an MLflow step run (only the chief's tracks), resuming from
    `resume_from_run`'s latest checkpoint if given; the chief writes metrics.json and
    placement.json: `cluster_placement()`'s (the cluster's merged view) if given and not None,
    else its own."""
    from pinpoint.tracking import open_step_run
    from pinpoint.training.loop.controller import Controller
    from pinpoint.training.loop.engine import build_state, make_trainer, restore

    with open_step_run(cfg, "train", out, parent_run_id=parent_run_id, is_chief=ctx.is_chief) as run:
        prefix = fetch_resume(cfg, out, resume_from_run, task=f"{ctx.role}-{ctx.index}")
        state = state or build_state(cfg, ctx)
        checkpoints = restore(cfg, out, ctx, state, prefix)
        controller = Controller(cfg, out, ctx, make_trainer(cfg, ctx, state), state, checkpoints=checkpoints,
                                hooks=[run.hook()])
        result = controller.train(resumed_from_run=resume_from_run)
        if ctx.is_chief:
            placement = cluster_placement() if cluster_placement is not None else None
            controller.finish(result, placement=placement)
    return 0


def fetch_resume(cfg: Config, out: Path, run_id: str | None, task: str = "chief-0") -> str | None:
    """Download the latest checkpoint of MLflow run `run_id` (None: resume from local files)."""
    if not run_id:
        return None
    from pinpoint.tracking import fetch_checkpoint

    return str(fetch_checkpoint(run_id, cfg, out / ".resume" / task))
