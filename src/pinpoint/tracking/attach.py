"""The report where a user opens a run: report.html (and the charts it was drawn with) logged to
runs that are already finished, the pipeline's `train` run and its parent, beside the `report`
child run that owns them. Straight through the client, after the report's own run has closed:
a run that cannot be reached keeps its place in the child run, so this warns and never raises."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pinpoint.runfolder import TRACKING_COST
from pinpoint.tracking.spool import warn
from pinpoint.tracking.uri import redact, resolve_tracking_uri


def recorded_run_id(run_dir: Path) -> str | None:
    """The MLflow run id the folder's last tracked step recorded (tracking.json), if any. Read it
    before opening another step run there: that run's close writes the file again."""
    try:
        run_id = json.loads((Path(run_dir) / TRACKING_COST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


def attach_files(cfg, runs: Iterable[tuple[str | None, str | None]], files: Iterable[Path]) -> list[str]:
    """Log `files` to each run of `runs`, (run id, the step it must be or None for any: a folder's
    tracking.json names the last step that ran there, a rerun report's own); a `local-...` id is
    looked up by its tag, as the parent run's end does. The ids that got them."""
    wanted = {r: step for r, step in runs if r}
    ids, files = list(wanted), list(files)
    if not ids:
        return []
    uri = resolve_tracking_uri(cfg)
    done = []
    try:
        from pinpoint.tracking.run import STEP_TAG
        from pinpoint.tracking.sender import find_run_by_local_id, mlflow_client

        client = mlflow_client(uri)
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        for run_id in ids:
            step = wanted[run_id]
            if run_id.startswith("local-"):
                run_id = exp and find_run_by_local_id(client, exp.experiment_id, run_id)
                if not run_id:
                    continue
            if step is not None and client.get_run(run_id).data.tags.get(STEP_TAG) != step:
                continue
            for f in files:
                client.log_artifact(run_id, str(f))
            done.append(run_id)
    except Exception as err:  # noqa: BLE001 - the report is in its own run whatever happens here
        warn(f"could not add the report to run(s) {', '.join(ids)} at {redact(uri)}: "
             f"{str(err).splitlines()[0][:200]}")
    return done
