"""The user's own code in the built image, run the way a provisioned pod runs it (slow): the worked
example examples/custom_loop built into a user image with `make images CODE_DIR=` (docker/build.sh,
on the CPU image the session's `cpu_image` fixture built), then in a podman container made from
the TFJob's pod template that `pinpoint provision` writes (its uid, read-only root, dropped
capabilities, env, command, ConfigMap at /config, run folder and /tmp mounts):

- `pinpoint trace --gpus 2 --no-tracking` on the example's script;
- `pinpoint train` on the example's `train.entrypoint` config, the command the manifests give.

Each reads placement.json back on the host with pinpoint.placement.model.files.read_placement. Both
commands import `pinpoint.trace` from the installed wheel, which a package list in pyproject.toml
that misses it breaks in every pod while an editable install still works."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement
from tests.conftest import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "custom_loop"
CODE_DIR = "/opt/pinpoint/code"  # where docker/Dockerfile.user puts the user's folder
# The example's SplitModel: digits (8x8 = 64 inputs) -> dense_1 (128, on /GPU:0) -> head (10 classes,
# on /GPU:1); the runs below use its batch size 32.
BATCH, INPUTS, HIDDEN, CLASSES = 32, 64, 128, 10
STEPS = 20
F32 = 4


@pytest.fixture(scope="module")
def user_image(cpu_image, tmp_path_factory):
    """examples/custom_loop built into its own image as a user builds it (`make images CODE_DIR=`);
    yields (image name, the env with podman's socket). Removed afterwards."""
    code = tmp_path_factory.mktemp("usercode") / "custom_loop"
    shutil.copytree(EXAMPLE, code, ignore=shutil.ignore_patterns("__pycache__"))
    image = f"localhost/pinpoint-usercode-test:{os.getpid()}"
    proc = subprocess.run(["bash", str(REPO / "docker" / "build.sh")],
                          env={**cpu_image, "ENGINE": "podman", "IMAGES": "cpu", "CODE_DIR": str(code),
                               "USER_IMAGE": image},
                          capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    try:
        yield image, cpu_image
    finally:
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True, timeout=120, env=cpu_image)


def _provisioned_pod(config: Path, out: Path) -> tuple[dict, dict]:
    """`pinpoint provision`'s manifests for `config`: the Chief's pod template (TFJob) and the
    ConfigMap's data, read back from the files the launch step applies."""
    from pinpoint.config import load_config
    from pinpoint.provision import provision

    provision(load_config(config), out)
    (cm,) = yaml.safe_load_all((out / "manifests" / "configmap.yaml").read_text())
    (job,) = yaml.safe_load_all((out / "manifests" / "tfjob.yaml").read_text())
    return job["spec"]["tfReplicaSpecs"]["Chief"]["template"], cm["data"]


def _kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of a container command: $(VAR) from the env, '$$' a literal '$'."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], arg)


def _podman_run(pod: dict, image: str, mounts: dict[str, Path], env: dict[str, str],
                command: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the pod template's one container in podman as the kubelet would: its user and group,
    read-only root, dropped capabilities, no privilege escalation, its env (a fieldRef is the
    first replica's index), each volume at its mountPath (`mounts`: volume name -> host folder,
    the others emptyDirs as tmpfs; no optional Secret exists), and its command unless `command`
    replaces it. No network: everything the run needs is in the image. A single-replica TFJob gets
    no TF_CONFIG from the Training Operator (not distributed), so none is set here either."""
    spec = pod["spec"]
    (c,) = spec["containers"]
    sc, csc = spec["securityContext"], c["securityContext"]
    args = ["--user", f"{sc['runAsUser']}:{sc['runAsGroup']}", "--network", "none"]
    if csc["readOnlyRootFilesystem"]:
        args += ["--read-only", "--read-only-tmpfs=false"]  # only the pod's own emptyDirs are writable
    args += [a for cap in csc["capabilities"]["drop"] for a in ("--cap-drop", cap)]
    if csc["allowPrivilegeEscalation"] is False:
        args += ["--security-opt", "no-new-privileges"]
    pod_env = {}
    for e in c["env"]:
        if "value" in e:
            pod_env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            pod_env[e["name"]] = "0"
        else:  # an optional Secret's key: unset, as the kubelet leaves it when there is no such Secret
            assert e["valueFrom"]["secretKeyRef"]["optional"] is True, e
    args += [a for k, v in pod_env.items() for a in ("--env", f"{k}={v}")]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        if m["name"] in mounts:
            ro = ":ro" if m.get("readOnly") else ""
            args += ["--volume", f"{mounts[m['name']]}:{m['mountPath']}{ro}"]
        elif m["mountPath"] != "/dev/shm":  # the runtime's own /dev/shm stands for the dshm emptyDir
            assert "emptyDir" in volumes[m["name"]], m
            args += ["--tmpfs", f"{m['mountPath']}:rw,exec,mode=1777"]
    cmd = command or [_kubelet_expand(a, pod_env) for a in c["command"]]
    return subprocess.run(["podman", "run", "--rm", *args, image, *cmd],
                          capture_output=True, text=True, timeout=900, env=env)


@pytest.fixture
def pod(user_image, tmp_path):
    """The example's entrypoint config shrunk to STEPS steps, its image the user image, tracking off,
    provisioned on the host; yields (pod template, ConfigMap data, run, mounts)."""
    image, env = user_image
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg["cluster"]["image"] = image
    cfg["train"]["entrypoint_args"] = {"steps": STEPS, "batch_size": BATCH, "learning_rate": 0.1,
                                       "save_every": STEPS // 2}
    cfg["tracking"] = {"enabled": False}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    template, data = _provisioned_pod(config, tmp_path / "provisioned")
    assert template["spec"]["containers"][0]["image"] == image
    # The ConfigMap's files, as the kubelet projects them into /config.
    cm_dir = tmp_path / "configmap"
    cm_dir.mkdir()
    for name, text in data.items():
        (cm_dir / name).write_text(text)
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)  # the pod's uid 1000 writes the run folder
    return template, image, env, {"config": cm_dir, "runs": runs}


def _runs_mount(template: dict) -> str:
    """The pod's run folder: where its `runs` volume is mounted."""
    (c,) = template["spec"]["containers"]
    (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "runs"]
    return mount


def _assert_split_model_placement(p: dict) -> None:
    """dense_1 on /GPU:0 and head on /GPU:1, as the example's tf.device scopes request, with the
    variables' shapes the model's sizes."""
    assert (p["training_function"], p["functions"][0]["calls"]) == ("train_step", STEPS)
    variables = {v["name"]: v for v in p["variables"]}
    assert {n: (v["shape"], [c["device"] for c in v["components"]]) for n, v in variables.items()
            if n.split("/")[0] in ("dense_1", "head")} == {
        "dense_1/kernel": ([INPUTS, HIDDEN], ["/GPU:0"]),
        "dense_1/bias": ([HIDDEN], ["/GPU:0"]),
        "head/kernel": ([HIDDEN, CLASSES], ["/GPU:1"]),
        "head/bias": ([CLASSES], ["/GPU:1"]),
    }
    assert variables["head/kernel"]["update_devices"] == ["/GPU:1"]
    assert variables["dense_1/kernel"]["update_devices"] == ["/GPU:0"]


@pytest.mark.timeout(2400)
def test_pinpoint_trace_runs_the_users_script_in_the_image_as_a_pod(pod):
    template, image, env, mounts = pod
    mount, host = _runs_mount(template), mounts["runs"]
    script = f"{CODE_DIR}/loop_example/train.py"
    proc = _podman_run(template, image, mounts, env, command=[
        "pinpoint", "trace", "--gpus", "2", "--no-tracking", "--out", f"{mount}/trace",
        script, "--steps", str(STEPS), "--batch-size", str(BATCH)])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"step {STEPS}/{STEPS}: loss" in proc.stdout  # the program's own output
    out = host / "trace"
    assert os.stat(out / "placement.json").st_uid == 1000
    p = read_placement(out)
    assert p["program"] == script
    _assert_split_model_placement(p)
    forward = [o for o in p["ops"] if not o["op"].startswith("gradient_tape/")]
    assert ({o["device"] for o in forward if o["op"].startswith("dense_1")},
            {o["device"] for o in forward if o["op"].startswith("head")}) == ({"/GPU:0"}, {"/GPU:1"})
    # GPU:0 -> GPU:1 per step: dense_1's activations, then head's gradients (computed under /GPU:0).
    assert p["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["bytes"] == (
        BATCH * HIDDEN * F32 + (HIDDEN * CLASSES + CLASSES) * F32)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["exit_code"], metrics["steps"]) == (0, STEPS)


@pytest.mark.timeout(2400)
def test_pinpoint_train_runs_the_entrypoint_config_in_the_image_as_the_manifests_say(pod):
    template, image, env, mounts = pod
    mount, host = _runs_mount(template), mounts["runs"]
    # The manifests' command as provisioned: train the ConfigMap's config into the runs mount.
    assert template["spec"]["containers"][0]["command"] == [
        "pinpoint", "train", "/config/config.yaml", "--out", mount]
    proc = _podman_run(template, image, mounts, env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"step {STEPS}/{STEPS}: loss" in proc.stdout  # the user's loop ran
    assert os.stat(host / "placement.json").st_uid == 1000
    _assert_split_model_placement(read_placement(host))
    metrics = json.loads((host / "metrics.json").read_text())
    assert (metrics["status"], metrics["start_step"], metrics["last_checkpoint_step"]) == ("FINISHED", 0, STEPS)
    assert sorted(p.name for p in (host / "checkpoints").glob("ckpt-*.index")) == [
        f"ckpt-{STEPS // 2}.index", f"ckpt-{STEPS}.index"]
