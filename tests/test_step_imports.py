"""The provision and report steps never import TensorFlow (issue 15.7: each step is its own
process, and TensorFlow's import is seconds of a step that does not train). Each component body
runs as kfp runs it, in a fresh process, with MLflow tracking on (a sqlite store in tmp_path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"
HEAVY = ("tensorflow", "keras", "tf_keras", "jax", "torch")

# Runs one component function the way kfp's executor does: the function from its module, with
# the shared helpers kfp copies in next to it (additional_funcs), and artifacts as local files.
STEP = """
import json, sys
from pathlib import Path
import components._common as common
import components.{module} as mod
for name in ("run_step", "fail"):
    setattr(mod, name, getattr(common, name))

class Art:
    def __init__(self, path):
        self.path, self.metadata = path, {{}}

out = Path(sys.argv[1])
kwargs = json.loads(sys.argv[2])
for name in {artifacts!r}:
    kwargs[name] = Art(str(out / ("artifact-" + name)))
mod.{function}(**kwargs)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))
"""


def _step(tmp_path: Path, module: str, function: str, artifacts: tuple[str, ...], **kwargs) -> list[str]:
    code = STEP.format(module=module, function=function, artifacts=artifacts, heavy=HEAVY)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(kwargs)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_provision_and_report_steps_do_not_import_tensorflow(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    cfg["tracking"] = {"uri": uri, "experiment": "step-imports"}
    run_dir = tmp_path / "run"

    loaded = _step(tmp_path, "provision_cluster", "provision_cluster", ("cluster_spec",),
                   config_yaml=yaml.safe_dump(cfg), run_dir=str(run_dir), parent_run_id="", variant={})
    assert loaded == [], f"the provision step imported {loaded}"
    assert (run_dir / "cluster_spec.json").is_file() and (run_dir / "config.yaml").is_file()

    # What the train step leaves for the report: placement.json (a real capture) and metrics.json.
    shutil.copy(SAMPLE, run_dir / "placement.json")
    (run_dir / "metrics.json").write_text(json.dumps({"final_loss": 0.5, "final_accuracy": 0.9, "steps": 12}))
    loaded = _step(tmp_path, "report", "report", ("placement", "report_html"), run_dir=str(run_dir),
                   parent_run_id="")
    assert loaded == [], f"the report step imported {loaded}"
    assert (run_dir / "report.html").is_file()

    # Both steps tracked (the MLflow path is part of what they import), and sent everything.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("step-imports")
    steps = {r.data.tags["pinpoint.step"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(steps) == {"provision", "report"}
    assert all(r.info.status == "FINISHED" for r in steps.values())
    assert steps["provision"].data.params["feasibility"] == "skipped"
    assert not list(run_dir.glob(".mlflow-spool/*"))
