"""MLflow tracking: one parent run per pipeline run, one child run per step, through a local spool
so that a tracking-server outage neither stops training nor loses anything."""

from pinpoint.tracking.checkpoints import fetch_checkpoint
from pinpoint.tracking.parent import end_parent_run, start_parent_run
from pinpoint.tracking.run import NullStepRun, StepRun, open_step_run
from pinpoint.tracking.uri import local_store, resolve_tracking_uri


def warm_tracking(cfg, step: str) -> None:
    """Start cfg's sender process now: it imports MLflow and opens the store (no run, no write)
    while this process starts TensorFlow, and `step`'s run (open_step_run) takes it: at the
    priority that step's sender has (run.TRAINING_STEPS)."""
    from pinpoint.tracking.process import warm
    from pinpoint.tracking.run import TRAINING_STEPS

    warm(resolve_tracking_uri(cfg), step in TRAINING_STEPS)

__all__ = [
    "NullStepRun",
    "StepRun",
    "end_parent_run",
    "fetch_checkpoint",
    "local_store",
    "open_step_run",
    "resolve_tracking_uri",
    "start_parent_run",
    "warm_tracking",
]
