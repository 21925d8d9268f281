"""The pod every flavour runs: the `pinpoint train` container with its TF_CONFIG source, its
resources, the run folder on the claim, and the hardening (non-root, read-only root filesystem).
A flavour adapts it (restartPolicy, subdomain, the TrainJob's 'node' container)."""

from __future__ import annotations

import json
import posixpath

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config
from pinpoint.provision.names import (
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER,
    PORT_NAME,
    REPLICA_INDEX_LABEL,
    ROLE_LABEL,
    UID,
    labels,
)
from pinpoint.provision.podenv import MLFLOW_SECRET_KEYS, allocator_env, collective_timeout_env
from pinpoint.provision.tasks import Task
from pinpoint.runfolder import RUNS_MOUNT


def pod_run_dir(rel: str, runs_mount: str = RUNS_MOUNT) -> str:
    """The folder the pods write (their --out): the claim's `rel` folder, mounted at the same path."""
    return f"{posixpath.normpath(runs_mount)}/{rel}"


def _command(cfg: Config, role: str, podenv: bool, run_dir: str) -> list[str]:
    # '$$' is a literal '$' after the kubelet's $(VAR) expansion of the command.
    cmd = ["pinpoint", "train", "/config/config.yaml", "--out", run_dir.replace("$", "$$")]
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES:
        # $(VAR) is expanded by the kubelet from the container's env.
        cmd += ["--task", f"{role}:$(PINPOINT_TASK_INDEX)"]
    if podenv:
        cmd = ["python", "-m", "pinpoint.provision.podenv", "--", *cmd]
    return cmd


def _env(cfg: Config, task: Task, podenv: bool) -> list[dict]:
    index_path = (
        f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']" if podenv else f"metadata.labels['{REPLICA_INDEX_LABEL}']"
    )
    env = [
        {"name": "PINPOINT_TASK_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_path}}},
        # The root filesystem is read-only: caches (Keras, matplotlib) go to the /tmp emptyDir.
        {"name": "HOME", "value": "/tmp"},
        # train.collective_timeout_s, as the local launcher gives it to its tasks (if set).
        *({"name": k, "value": v} for k, v in collective_timeout_env(cfg).items()),
        # placement.memory, as the local launcher and `pinpoint train` give it (if set).
        *({"name": k, "value": v} for k, v in allocator_env(cfg).items()),
    ]
    if cfg.cluster.mlflow_secret:
        # The Secret the pipeline's steps read, by name and key only (optional: a cluster without
        # it uses tracking.uri); the kubelet injects the values, nothing stores them.
        env += [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": cfg.cluster.mlflow_secret, "key": key, "optional": True}}}
            for key, var in MLFLOW_SECRET_KEYS.items()
        ]
    if podenv:
        env += [
            {"name": "PINPOINT_TASK_ROLE", "value": task.role},
            {"name": "PINPOINT_TF_CLUSTER", "value": json.dumps(task.tf_config["cluster"], separators=(",", ":"))},
        ]
    return env


def pod_template(cfg: Config, task: Task, *, podenv: bool, run_rel: str | None = None) -> dict:
    """The pod of one role (every replica of a role is identical but for its index); it writes
    the run folder /runs/<run_rel> (default: the run's name). podenv: its TF_CONFIG is built in the pod
    by pinpoint.provision.podenv from its completion index (else the Training Operator sets it)."""
    rel = run_rel or cfg.name
    run_dir = pod_run_dir(rel)
    c, res = cfg.cluster, task.resources
    limits: dict[str, object] = {"cpu": res.cpu, "memory": res.memory}
    if res.gpus:
        limits[res.gpu_resource] = res.gpus
    node_selector = dict(c.node_selector)
    if res.gpu_type:
        node_selector[c.gpu_type_label] = res.gpu_type
    if c.runs_volume_claim:
        runs = {"name": "runs", "persistentVolumeClaim": {"claimName": c.runs_volume_claim}}
        # Only the run's folder of the claim, at the path the steps see it under /runs.
        runs_mount = {"name": "runs", "mountPath": run_dir, "subPath": rel}
    else:  # single-process only (check_manifest_inputs): the pod's own folder
        runs = {"name": "runs", "emptyDir": {}}
        runs_mount = {"name": "runs", "mountPath": run_dir}
    spec: dict = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": c.image,
                "imagePullPolicy": "IfNotPresent",
                "command": _command(cfg, task.role, podenv, run_dir),
                "env": _env(cfg, task, podenv),
                "ports": [{"name": PORT_NAME, "containerPort": c.port, "protocol": "TCP"}],
                # requests == limits for cpu/memory: Guaranteed QoS, so a busy node does not
                # throttle one replica and stall every collective of the group.
                "resources": {"requests": {"cpu": res.cpu, "memory": res.memory}, "limits": limits},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {"name": "config", "mountPath": "/config", "readOnly": True},
                    runs_mount,
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            # NCCL and tf.data exchange buffers through /dev/shm; the runtime's default is 64Mi.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": c.shm_size}},
            {"name": "config", "configMap": {"name": f"{cfg.name}-config"}},
            runs,
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if c.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in c.image_pull_secrets]
    if node_selector:
        spec["nodeSelector"] = node_selector
    if c.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in c.tolerations]
    pod_labels = {**labels(cfg), ROLE_LABEL: task.role, "sidecar.istio.io/inject": "false"}
    return {
        "metadata": {"labels": pod_labels, "annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": spec,
    }


def first_tasks(tasks: list[Task]) -> dict[str, Task]:
    first: dict[str, Task] = {}
    for t in tasks:
        first.setdefault(t.role, t)
    return first
