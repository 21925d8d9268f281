"""One training task inside its MLflow step run: the one path the single-process run, the
parameter_server chief and every multi_worker_mirrored task take, and the one place that
chooses who takes the steps: Pinpoint's own loop (training.loop) or the user's
`train.entrypoint` (training.entrypoint). What both do around the steps: training.skeleton."""

from __future__ import annotations

from pathlib import Path

from pinpoint.config import Config
from pinpoint.runfolder import ensure_dir


def run_training(cfg: Config, out_dir: str | Path, ctx, *, resume_from_run: str | None = None,
                 parent_run_id: str | None = None) -> int:
    """Train this task inside an MLflow step run (only the chief's tracks), resuming from
    `resume_from_run`'s latest checkpoint if given; the chief writes metrics.json and
    placement.json (the cluster's merged view under multi_worker_mirrored)."""
    from pinpoint.tracking import open_step_run
    from pinpoint.training.loop import engine

    # What takes the steps is made first: bad user code or data fails with nothing written.
    own_loop = not cfg.train.entrypoint
    if own_loop:
        state = engine.build_state(cfg, ctx)
    else:
        from pinpoint.usercode import load_callable

        function = load_callable(cfg, "train.entrypoint", cfg.train.entrypoint)
    out = ensure_dir(out_dir)
    with open_step_run(cfg, "train", out, parent_run_id=parent_run_id, is_chief=ctx.is_chief) as run:
        prefix = fetch_resume(cfg, out, resume_from_run, task=f"{ctx.role}-{ctx.index}")
        if not own_loop:
            from pinpoint.training.entrypoint.context import run_entrypoint

            return run_entrypoint(cfg, out, ctx, run, function, resume_prefix=prefix,
                                  resumed_from_run=resume_from_run)
        from pinpoint.training.loop.controller import Controller

        checkpoints = engine.restore(cfg, out, ctx, state, prefix)
        controller = Controller(cfg, out, ctx, engine.make_trainer(cfg, ctx, state), state, checkpoints=checkpoints,
                                hooks=[run.hook()])
        result = controller.train(resumed_from_run=resume_from_run)
        if ctx.is_chief:
            controller.finish(result)
    return 0


def fetch_resume(cfg: Config, out: Path, run_id: str | None, task: str = "chief-0") -> str | None:
    """Download the latest checkpoint of MLflow run `run_id` (None: resume from local files)."""
    if not run_id:
        return None
    from pinpoint.tracking import fetch_checkpoint

    return str(fetch_checkpoint(run_id, cfg, out / ".resume" / task))
