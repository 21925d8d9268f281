"""MLflow tracking: one parent run per pipeline run, one child run per step, through a local spool
so that a tracking-server outage neither stops training nor loses anything."""

from pinpoint.tracking.checkpoints import fetch_checkpoint
from pinpoint.tracking.run import NullStepRun, StepRun, end_parent_run, open_step_run, start_parent_run
from pinpoint.tracking.uri import local_store, resolve_tracking_uri

__all__ = [
    "open_step_run",
    "StepRun",
    "NullStepRun",
    "start_parent_run",
    "end_parent_run",
    "fetch_checkpoint",
    "resolve_tracking_uri",
    "local_store",
]
