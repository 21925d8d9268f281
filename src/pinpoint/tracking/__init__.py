"""MLflow tracking: one parent run per pipeline run, one child run per step, through a local spool
so that a tracking-server outage neither stops training nor loses anything."""

from pinpoint.tracking.checkpoints import fetch_checkpoint
from pinpoint.tracking.parent import end_parent_run, start_parent_run
from pinpoint.tracking.run import NullStepRun, StepRun, open_step_run
from pinpoint.tracking.uri import local_store, resolve_tracking_uri


def warm_tracking(cfg, *, background: bool = False) -> None:
    """Start cfg's sender process now: it imports MLflow and opens the store (no run, no write)
    while this process starts TensorFlow, and the step run that follows takes it. `background`:
    the step trains (train, trace), so the sender runs at a lower priority, as its run's will."""
    from pinpoint.tracking.process import warm

    warm(resolve_tracking_uri(cfg), background)

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
