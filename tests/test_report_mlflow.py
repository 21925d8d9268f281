"""`pinpoint report` logs the headline placement metrics and the JSON/HTML/PNGs to a REAL
MLflow server (the session fixture from conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.report.metrics import headline_metrics
from pinpoint.runfolder import read_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def test_report_logs_metrics_and_artifacts(tmp_path, live_mlflow):
    import mlflow

    from pinpoint.steps.report import report_command

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(SAMPLE, run_dir / "placement.json")
    cfg = {"name": "report-mlflow", "tracking": {"enabled": True, "uri": live_mlflow.uri, "experiment": "report-test"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))

    assert report_command(run_dir) == 0

    client = mlflow.MlflowClient(live_mlflow.uri)
    exp = client.get_experiment_by_name("report-test")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`pinpoint.step` = 'report'")
    assert len(runs) == 1
    run = runs[0]
    expected = headline_metrics(read_json(run_dir / "placement.json"))
    for key in ("placement.ops.GPU_0", "placement.transfers_per_step", "placement.transfer_bytes_per_step",
                "placement.fallbacks", "placement.conformance"):
        assert run.data.metrics[key] == pytest.approx(expected[key])
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.html", "placement.json", "charts"} <= top
    charts = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "charts")}
    assert {"ops_heatmap.png", "transfer_matrix.png", "conformance.png"} <= charts
