"""The pipeline's parent run in MLflow: created when a pipeline run starts (tag
pinpoint.pipeline=<name>, the config's params), ended when it finishes; every step's run
(run.py) is its child.

The server may be down when the pipeline starts: the parent then gets a `local-...` id, and the
first step run that reaches the server creates it (sender.resolve_parent) with that id as its
pinpoint.local_id tag, by which end_parent_run finds it.
"""

from __future__ import annotations

from pinpoint.tracking.sender import (
    LOCAL_ID_TAG,
    PIPELINE_TAG,
    find_run_by_local_id,
    get_or_create_experiment,
    mlflow_client,
    new_local_id,
    store_problem,
)
from pinpoint.tracking.spool import warn
from pinpoint.tracking.uri import configure_http, redact, resolve_tracking_uri

# parent run id -> (URI, experiment) it was started with in this process, so that
# end_parent_run(run_id, status) needs no config.
_PARENTS: dict[str, tuple[str, str]] = {}


def start_parent_run(cfg, run_name: str | None = None, *, uri: str | None = None) -> str:
    """Create the parent run of a pipeline run (tag pinpoint.pipeline=<name>); returns its id.
    If the server is unreachable, returns a `local-...` id: the first step that reaches the server
    creates the parent with that id as its pinpoint.local_id tag."""
    configure_http()
    uri = uri or resolve_tracking_uri(cfg)
    local_id = new_local_id()
    try:
        client = mlflow_client(uri)
        exp_id = get_or_create_experiment(client, cfg.tracking.experiment, uri)
        run = client.create_run(
            exp_id,
            run_name=run_name or cfg.name,
            tags={PIPELINE_TAG: cfg.name, LOCAL_ID_TAG: local_id, "pinpoint.config_digest": cfg.digest()},
        )
        from mlflow.entities import Param

        from pinpoint.tracking.params import config_params

        params = [Param(k, v) for k, v in config_params(cfg).items()]
        for i in range(0, len(params), 100):
            client.log_batch(run.info.run_id, params=params[i : i + 100])
        _PARENTS[run.info.run_id] = (uri, cfg.tracking.experiment)
        return run.info.run_id
    except Exception as err:  # noqa: BLE001 - tracking must never stop a pipeline
        warn(f"{store_problem(err, uri)}; "
             f"the pipeline's parent run will be created by its first step that reaches it")
        _PARENTS[local_id] = (uri, cfg.tracking.experiment)
        return local_id


def end_parent_run(run_id: str | None, status: str = "FINISHED", *, cfg=None, uri: str | None = None) -> None:
    """Mark the parent run FINISHED/FAILED/KILLED; warns (never raises) if it cannot."""
    if not run_id:
        return
    configure_http()
    known_uri, experiment = _PARENTS.get(run_id, (None, None))
    if cfg is not None:
        known_uri, experiment = resolve_tracking_uri(cfg), cfg.tracking.experiment
    uri = uri or known_uri or resolve_tracking_uri(None)
    try:
        client = mlflow_client(uri)
        if run_id.startswith("local-"):
            # Started while the server was down: a step may have created it since.
            exp = client.get_experiment_by_name(experiment) if experiment else None
            found = exp and find_run_by_local_id(client, exp.experiment_id, run_id)
            if not found:
                warn(f"parent run {run_id} was never created on the server; nothing to end")
                return
            run_id = found
        client.set_terminated(run_id, status)
    except Exception as err:  # noqa: BLE001
        warn(f"could not end MLflow parent run {run_id} at {redact(uri)}: {str(err).splitlines()[0][:200]}")


__all__ = ["end_parent_run", "start_parent_run"]
