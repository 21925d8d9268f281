"""The report step: report.html and the charts from a trained run folder, logged to MLflow."""

from __future__ import annotations

import sys
from pathlib import Path

from pinpoint.placement import CHARTS_DIR, ops_path, write_report
from pinpoint.runfolder import CONFIG_FILE, PLACEMENT


def report_command(run_dir, *, parent_run_id: str | None = None) -> int:
    """CLI entry: write the report, log headline metrics and the files to MLflow (if configured)."""
    from pinpoint.placement import headline_metrics, metrics_step

    run_dir = Path(run_dir)
    cfg = None
    cfg_path = run_dir / CONFIG_FILE
    if cfg_path.is_file():
        from pinpoint.config import load_config

        cfg = load_config(cfg_path)
        if cfg.tracking.enabled:
            from pinpoint.tracking import warm_tracking

            warm_tracking(cfg, "report")  # MLflow's import and store open in the sender while the charts render
    out, charts, placement = write_report(run_dir)
    if cfg is not None and cfg.tracking.enabled:
        from pinpoint.tracking import open_step_run
        from pinpoint.tracking.attach import attach_files, recorded_run_id

        train_run = recorded_run_id(run_dir)  # the train step's run, before this run's close rewrites it

        with open_step_run(cfg, "report", run_dir, parent_run_id=parent_run_id) as run:
            run.log_metrics(headline_metrics(placement), step=metrics_step(placement))  # the captured step
            run.log_artifact(run_dir / PLACEMENT)
            if ops_path(run_dir / PLACEMENT).is_file():
                run.log_artifact(ops_path(run_dir / PLACEMENT))
            run.log_artifact(out)
            if charts:
                run.log_artifacts(run_dir / CHARTS_DIR, artifact_path=CHARTS_DIR)
        # The report where the user opens the pipeline: its train run and its parent run.
        attach_files(cfg, [(train_run, "train"), (parent_run_id, None)], [out])
    print(f"report: {out}", file=sys.stderr)
    print(f"charts: {', '.join(str(p) for p in charts.values()) or 'none'}", file=sys.stderr)
    return 0
