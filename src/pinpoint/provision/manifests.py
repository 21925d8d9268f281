"""Kubernetes manifests for a cluster spec: a TFJob, or plain Services + Indexed Jobs.

Both flavours run the same container (`pinpoint train /config/config.yaml --out /runs/<name>
--task <role>:<index>`) with the same TF_CONFIG: the TFJob's comes from the Training Operator,
the plain one from `pinpoint.provision.podenv`, which rebuilds the operator's JSON from the
Indexed Job's completion index.

Restart semantics: a multi-worker collective cannot continue with a replaced member, so a task
that loses a peer exits with RETRY_EXIT_CODE (138) and is recreated, and the group restarts from
the latest checkpoint; configuration and code errors (exit 1, 2, 3...) are permanent. TFJob's
`ExitCode` policy and the plain Jobs' podFailurePolicy both encode exactly that split.
"""

from __future__ import annotations

import json

import yaml

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config, config_to_yaml
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.spec import Task
from pinpoint.provision.tfconfig import TFJOB_REPLICA_TYPES, role_counts, task_list

CONTAINER = "tensorflow"  # the Training Operator finds the TF container and its port by these names
PORT_NAME = "tfjob-port"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
ROLE_LABEL = "pinpoint.dev/role"
UID = 1000  # the non-root user of the pinpoint images


def labels(cfg: Config) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pinpoint",
        "app.kubernetes.io/instance": cfg.name,
        "app.kubernetes.io/managed-by": "pinpoint",
    }


def configmap(cfg: Config) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{cfg.name}-config", "namespace": namespace_of(cfg.cluster), "labels": labels(cfg)},
        "data": {"config.yaml": config_to_yaml(cfg)},
    }


def _command(cfg: Config, role: str, plain: bool) -> list[str]:
    cmd = ["pinpoint", "train", "/config/config.yaml", "--out", f"/runs/{cfg.name}"]
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES:
        # $(VAR) is expanded by the kubelet from the container's env.
        cmd += ["--task", f"{role}:$(PINPOINT_TASK_INDEX)"]
    if plain:
        cmd = ["python", "-m", "pinpoint.provision.podenv", "--", *cmd]
    return cmd


def _env(cfg: Config, task: Task, plain: bool) -> list[dict]:
    index_path = (
        f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']" if plain else f"metadata.labels['{REPLICA_INDEX_LABEL}']"
    )
    env = [
        {"name": "PINPOINT_TASK_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_path}}},
        # The root filesystem is read-only: caches (Keras, matplotlib) go to the /tmp emptyDir.
        {"name": "HOME", "value": "/tmp"},
    ]
    if plain:
        env += [
            {"name": "PINPOINT_TASK_ROLE", "value": task.role},
            {"name": "PINPOINT_TF_CLUSTER", "value": json.dumps(task.tf_config["cluster"], separators=(",", ":"))},
        ]
    return env


def pod_template(cfg: Config, task: Task, *, plain: bool) -> dict:
    """The pod of one role (every replica of a role is identical but for its index)."""
    c, res = cfg.cluster, task.resources
    limits: dict[str, object] = {"cpu": res.cpu, "memory": res.memory}
    if res.gpus:
        limits[res.gpu_resource] = res.gpus
    node_selector = dict(c.node_selector)
    if res.gpu_type:
        node_selector[c.gpu_type_label] = res.gpu_type
    runs = (
        {"name": "runs", "persistentVolumeClaim": {"claimName": c.runs_volume_claim}}
        if c.runs_volume_claim
        else {"name": "runs", "emptyDir": {}}
    )
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
                "command": _command(cfg, task.role, plain),
                "env": _env(cfg, task, plain),
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
                    {"name": "runs", "mountPath": "/runs"},
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
    if node_selector:
        spec["nodeSelector"] = node_selector
    if c.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in c.tolerations]
    pod_labels = {**labels(cfg), ROLE_LABEL: task.role, "sidecar.istio.io/inject": "false"}
    return {
        "metadata": {"labels": pod_labels, "annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": spec,
    }


def _first_tasks(tasks: list[Task]) -> dict[str, Task]:
    first: dict[str, Task] = {}
    for t in tasks:
        first.setdefault(t.role, t)
    return first


def tfjob(cfg: Config, tasks: list[Task]) -> dict:
    """A kubeflow.org/v1 TFJob for the Training Operator 1.x."""
    counts = role_counts(cfg.cluster)
    replica_specs = {
        TFJOB_REPLICA_TYPES[role]: {
            "replicas": counts[role],
            # ExitCode: 130/137/138/143 recreate the pod, any other failure fails the job.
            "restartPolicy": "ExitCode",
            "template": pod_template(cfg, task, plain=False),
        }
        for role, task in _first_tasks(tasks).items()
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": cfg.name, "namespace": namespace_of(cfg.cluster), "labels": labels(cfg)},
        "spec": {
            "runPolicy": {
                # ps (and parameter_server workers) serve forever; remove them when the chief is done.
                "cleanPodPolicy": "Running",
                "backoffLimit": cfg.train.max_restarts,
            },
            "tfReplicaSpecs": replica_specs,
        },
    }


def _service(cfg: Config, name: str, selector: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace_of(cfg.cluster), "labels": labels(cfg)},
        "spec": {
            "clusterIP": "None",
            # Peers dial each other while starting, before every pod is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": PORT_NAME, "port": cfg.cluster.port, "targetPort": cfg.cluster.port, "protocol": "TCP"}],
        },
    }


def plain_services(cfg: Config) -> list[dict]:
    """The governing headless Service (pod subdomain) plus one headless Service per task named
    like the Training Operator's, so `<name>-<role>-<i>.<ns>.svc` resolves to that pod."""
    base = {"app.kubernetes.io/instance": cfg.name}
    docs = [_service(cfg, cfg.name, base)]
    for role, i in task_list(cfg.cluster):
        docs.append(_service(cfg, f"{cfg.name}-{role}-{i}", {**base, ROLE_LABEL: role, COMPLETION_INDEX_LABEL: str(i)}))
    return docs


def plain_job(cfg: Config, task: Task, replicas: int) -> dict:
    """One Indexed Job per role; pod hostnames are `<job>-<index>` = `<name>-<role>-<index>`."""
    template = pod_template(cfg, task, plain=True)
    template["spec"]["restartPolicy"] = "Never"  # required by podFailurePolicy
    template["spec"]["subdomain"] = cfg.name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{cfg.name}-{task.role}", "namespace": namespace_of(cfg.cluster), "labels": labels(cfg)},
        "spec": {
            "completionMode": "Indexed",
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimitPerIndex": cfg.train.max_restarts,
            "podFailurePolicy": {
                "rules": [
                    # Same split as TFJob's ExitCode policy: codes >= 128 are retried.
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": list(range(1, 128)),
                        },
                    },
                    # Preemption or node drain: recreate without counting a failure.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": template,
        },
    }


def build_manifests(cfg: Config, tasks: list[Task]) -> dict[str, list[dict]]:
    """File name -> documents, for cfg.cluster.flavor."""
    files = {"configmap.yaml": [configmap(cfg)]}
    if cfg.cluster.flavor == "tfjob":
        files["tfjob.yaml"] = [tfjob(cfg, tasks)]
    else:
        files["services.yaml"] = plain_services(cfg)
        counts = role_counts(cfg.cluster)
        for role, task in _first_tasks(tasks).items():
            files[f"job-{role}.yaml"] = [plain_job(cfg, task, counts[role])]
    return files


def dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
