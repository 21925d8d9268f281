"""`make submit`: argument handling, unreachable host, and a run created on FakeKfpApiServer
(a FAKE Kubeflow Pipelines API) through the real kfp.Client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_port
from tests.fakes.kfp_api import FakeKfpApiServer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]
DEMO = str(REPO / "configs" / "demo.yaml")


def _submit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pipelines.submit", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=100, env=env)


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "--host"),
        (["--host", "kfp.example", "--config", DEMO], "http(s)://"),
        (["--host", "http://127.0.0.1:1", "--config", "nope.yaml"], "does not exist"),
    ],
)
def test_bad_arguments_are_one_line(args, expected, capsys):
    from pipelines.submit import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and err.startswith("pinpoint: ")


def test_unreachable_host_is_one_line_and_non_zero():
    host = f"http://127.0.0.1:{free_port()}"
    proc = _submit("--host", host, "--config", DEMO)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert host in lines[0] and "Connection refused" in lines[0]


def test_submit_creates_a_run_and_prints_its_url(monkeypatch):
    import os

    env = {**os.environ, "MLFLOW_TRACKING_PASSWORD": "sentinel-pw-31ab"}
    with FakeKfpApiServer() as fake:
        proc = _submit("--host", fake.url + "/", "--config", DEMO, env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"Submitted. Run: {fake.url}/#/runs/details/run-1" in proc.stdout
        (run,) = fake.runs
        assert run["display_name"] == "demo"
        assert run["experiment_id"] == "exp-0" and fake.experiments[0]["display_name"] == "pinpoint"
        # The compiled pipeline and its Kubernetes platform spec (PVC, Secret by name) travel together.
        assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "pinpoint-training"
        assert "kubernetes" in run["pipeline_spec"]["platform_spec"]["platforms"]
        assert run["runtime_config"]["parameters"]["run_dir"] == "/runs/demo"
        assert "sentinel-pw-31ab" not in json.dumps(run)


def test_submit_sweep(capsys):
    from pipelines.submit import main

    with FakeKfpApiServer() as fake:
        assert main(["--host", fake.url, "--config", DEMO, "--sweep", "--experiment", "sweeps"]) == 0
        assert f"Submitted. Run: {fake.url}/#/runs/details/run-1" in capsys.readouterr().out
        (run,) = fake.runs
        assert run["display_name"] == "demo-sweep"
        assert run["runtime_config"]["parameters"]["runs_root"] == "/runs/demo-sweep"
        assert fake.experiments[0]["display_name"] == "sweeps"
