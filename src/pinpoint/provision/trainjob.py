"""Flavour trainjob: a Kubeflow Trainer v2 TrainJob on Pinpoint's TensorFlow runtime.

Trainer v2 (trainer.kubeflow.org/v1alpha1, schema of release v2.3.0) ships no TensorFlow runtime
(kubeflow/trainer#2699); `runtime_yaml()` is one: the ClusterTrainingRuntime
'pinpoint-tensorflow' (docker/runtime.yaml is its output, `pinpoint provision --runtime` writes it),
plain ML policy, whose JobSet template is the jobset flavour's (network, failurePolicy, the
podFailurePolicy of its child Job) with ONE replicatedJob 'node' (label trainjob-ancestor-step:
trainer), because a TrainJob sets only that replicatedJob's size (trainer.numNodes; Trainer's
plainml + SyncParallelCount make it the Job's parallelism and completions) and its container
'node' (image, command, args, env, resourcesPerNode). Every task of the run is one completion
index of that Job, in task order (chief, workers, ps, evaluator); `podenv` turns the index into
the role and index with PINPOINT_TASK_LAYOUT. The JobSet is named like the TrainJob (Trainer's
jobset plugin), so the pods are `<name>-node-0-<k>.<name>` (IdentifyPodNetwork's endpoints).

The per-run parts the runtime cannot hold go in the TrainJob: the command (run folder), the
environment (cluster dict, layout, MLflow Secret refs), the resources, and, as runtimePatches of
the 'node' pod template, the ConfigMap and claim volumes, nodeSelector, tolerations and pull
secrets. Limits: every task gets the same resources (refused when the roles' GPU counts differ:
use flavor jobset); the runtime's failurePolicy.maxRestarts is RUNTIME_MAX_RESTARTS and the launch
step stops the run after train.max_restarts counted restarts; the Job completes when task 0 (the
chief) succeeds (a Job successPolicy), so ps servers and the evaluator are not waited for.
"""

from __future__ import annotations

import yaml

from pinpoint.config import Config
from pinpoint.errors import ProvisionError
from pinpoint.provision.jobset import CONTAINER_EXIT_RULES, JOBSET_FAILURE_RULES, GroupFlavour
from pinpoint.provision.names import EXAMPLE_REGISTRY, UID, labels, workload_labels
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.pods import pod_template
from pinpoint.provision.tasks import Task, role_gpus
from pinpoint.provision.tfconfig import role_counts, task_list, trainjob_cluster

RUNTIME_NAME = "pinpoint-tensorflow"
RUNTIME_FILE = "runtime.yaml"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
NODE = "node"  # Trainer's name for the trainer replicatedJob and its container
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# A ceiling: the launch step stops a run after train.max_restarts counted restarts.
RUNTIME_MAX_RESTARTS = 10
PATCH_MANAGER = "pinpoint.dev/provision"
TASK_LAYOUT_ENV = "PINPOINT_TASK_LAYOUT"
TASK_PLACEHOLDER = "{task}"  # podenv replaces it with ROLE:INDEX


def task_layout(cfg: Config) -> str:
    """'chief:1,worker:2,ps:1': the roles of the completion indexes, in order."""
    return ",".join(f"{r}:{n}" for r, n in role_counts(cfg.cluster).items())


def check_trainjob(cfg: Config) -> None:
    """What one shared replicatedJob cannot express, refused with one line."""
    gpus = {r: role_gpus(cfg, r) for r in role_counts(cfg.cluster)}
    if len(set(gpus.values())) > 1:
        detail = ", ".join(f"{r} {g}" for r, g in gpus.items())
        raise ProvisionError(
            f"cluster.flavor: got trainjob, whose tasks share one replicatedJob and one resourcesPerNode, but the "
            f"roles request different GPUs ({detail}); use flavor: jobset (one replicatedJob per role)"
        )
    if cfg.train.max_restarts > RUNTIME_MAX_RESTARTS:
        raise ProvisionError(
            f"train.max_restarts: got {cfg.train.max_restarts}; the {RUNTIME_NAME} runtime restarts a TrainJob at "
            f"most {RUNTIME_MAX_RESTARTS} times; lower it or use flavor: jobset"
        )


def _node_job_template() -> dict:
    """The Job of the runtime's 'node' replicatedJob (sized by the TrainJob)."""
    return {
        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
        "spec": {
            "completionMode": "Indexed",
            "backoffLimit": 0,
            # Task 0 is the chief (or worker 0): its success is the run's; the Job then stops
            # the ps servers and the evaluator, which never exit by themselves.
            "successPolicy": {"rules": [{"succeededIndexes": "0"}]},
            "podFailurePolicy": {"rules": CONTAINER_EXIT_RULES(NODE)},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "pinpoint", "sidecar.istio.io/inject": "false"},
                             "annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": NODE,
                        # The TrainJob sets the image and the command (trainer.image, trainer.command).
                        "image": f"{EXAMPLE_REGISTRY}/pinpoint-cpu:latest",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python", "-m", "pinpoint.provision.podenv"],
                        "env": [
                            {"name": "PINPOINT_TASK_INDEX", "valueFrom": {"fieldRef": {
                                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                            {"name": "HOME", "value": "/tmp"},
                        ],
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def runtime(max_restarts: int = RUNTIME_MAX_RESTARTS, ttl_after_finished_s: int = 3600) -> dict:
    """The ClusterTrainingRuntime 'pinpoint-tensorflow' (cluster-scoped, one per cluster)."""
    return {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME_NAME, "labels": {"trainer.kubeflow.org/framework": "tensorflow",
                                                      "app.kubernetes.io/name": "pinpoint"}},
        "spec": {
            "mlPolicy": {"numNodes": 1},  # plain ML policy: no torch/mpi/jax section
            "template": {"spec": {
                "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                "replicatedJobs": [{"name": NODE, "replicas": 1, "template": _node_job_template()}],
                "failurePolicy": {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate",
                                  "rules": JOBSET_FAILURE_RULES},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": [NODE]},
                "ttlSecondsAfterFinished": ttl_after_finished_s,
            }},
        },
    }


_HEADER = """\
# ClusterTrainingRuntime 'pinpoint-tensorflow': Pinpoint as the TensorFlow runtime of Kubeflow
# Trainer v2 (cluster.flavor: trainjob). Generated by pinpoint.provision.trainjob
# (`pinpoint provision CONFIG --runtime` writes it); apply once per cluster:
#   kubectl apply -f runtime.yaml
"""


def runtime_yaml() -> str:
    """The text of runtime.yaml (docker/runtime.yaml)."""
    return _HEADER + yaml.safe_dump(runtime(), sort_keys=False, default_flow_style=False)


def trainjob(cfg: Config, tasks: list[Task], run_rel: str | None = None) -> dict:
    """The run's TrainJob: runtimeRef pinpoint-tensorflow, the per-run parts set or patched."""
    check_trainjob(cfg)
    c = cfg.cluster
    # The jobset flavour's pod of the first task, reshaped into what a TrainJob may set.
    pod = pod_template(cfg, tasks[0], podenv=True, run_rel=run_rel or cfg.name)
    (container,) = pod["spec"]["containers"]
    spec = pod["spec"]
    command = list(container["command"])
    if "--task" in command:  # podenv replaces the placeholder with this pod's ROLE:INDEX
        command[command.index("--task") + 1] = TASK_PLACEHOLDER
    env = [e for e in container["env"] if e["name"] not in ("PINPOINT_TASK_INDEX", "HOME", "PINPOINT_TASK_ROLE")]
    env.append({"name": TASK_LAYOUT_ENV, "value": task_layout(cfg)})
    per_run_mounts = [m for m in container["volumeMounts"] if m["name"] in ("config", "runs")]
    per_run_volumes = [v for v in spec["volumes"] if v["name"] in ("config", "runs")]
    pod_patch: dict = {"containers": [{"name": NODE, "volumeMounts": per_run_mounts}], "volumes": per_run_volumes}
    for key in ("nodeSelector", "tolerations", "imagePullSecrets"):
        if key in spec:
            pod_patch[key] = spec[key]
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        # gang: kueue: the queue label on the TrainJob (Kueue's TrainJob integration admits it whole).
        "metadata": {"name": cfg.name, "namespace": namespace_of(c), "labels": workload_labels(cfg)},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": RUNTIME_NAME},
            "activeDeadlineSeconds": c.deadline_s,
            "trainer": {
                "image": c.image,
                "numNodes": len(tasks),
                "command": command,
                "env": env,
                "resourcesPerNode": container["resources"],
            },
            "runtimePatches": [{
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": NODE,
                    "template": {"spec": {"template": {
                        "metadata": {"labels": labels(cfg)},
                        "spec": pod_patch,
                    }}},
                }]}}},
            }],
        },
    }


class TrainJobFlavour(GroupFlavour, name="trainjob", kind="TrainJob", api_version=TRAINER_API,
                      tf_cluster=trainjob_cluster):
    # The runtime's JobSet is named like the TrainJob; its failurePolicy.maxRestarts is only a
    # ceiling (RUNTIME_MAX_RESTARTS): the watcher enforces train.max_restarts.
    is_jobset = False
    enforces_max_restarts = False
    container = NODE
    done_conditions = ("Complete",)
    not_installed = ("kubernetes: the TrainJob resource (trainer.kubeflow.org/v1alpha1 trainjobs) is not installed; "
                     "install Kubeflow Trainer v2 or set cluster.flavor: jobset")

    def longest_name(self, cfg: Config, role: str, replicas: int) -> tuple[str, str]:
        # One replicatedJob 'node' holds every task.
        return f"{cfg.name}-{NODE}-0-{len(task_list(cfg.cluster)) - 1}-abcde", "a JobSet pod name"

    def manifests(self, cfg: Config, tasks: list[Task], run_rel: str | None) -> dict[str, list[dict]]:
        return {"trainjob.yaml": [trainjob(cfg, tasks, run_rel)]}

    def notes(self, cfg: Config) -> list[str]:
        return [f"the TrainJob runs on the ClusterTrainingRuntime '{RUNTIME_NAME}': apply docker/runtime.yaml once "
                "per cluster (`pinpoint provision CONFIG --runtime` writes it)"]

    def pod_count(self, doc: dict) -> int:
        return int(doc["spec"]["trainer"].get("numNodes", 1))

    def pod_templates(self, doc: dict) -> list[dict]:
        return []  # the pod template is the runtime's; the TrainJob holds the command

    def with_parent_run(self, doc: dict, parent_run_id: str) -> dict:
        """`--parent-run-id` on the TrainJob's command (the pods' MLflow runs become its children)."""
        cmd = doc["spec"]["trainer"].get("command") or []
        if "train" in cmd and "--parent-run-id" not in cmd:
            doc["spec"]["trainer"]["command"] = [*cmd, "--parent-run-id", parent_run_id]
        return doc

    def create_error(self, status: int, message: str, namespace: str, name: str) -> str | None:
        if status == 422 and "ClusterTrainingRuntime" in message:
            return (f"kubernetes: TrainJob {namespace}/{name} refused: the ClusterTrainingRuntime {RUNTIME_NAME} is "
                    "not installed; apply docker/runtime.yaml (or `pinpoint provision CONFIG --runtime`) once per "
                    "cluster")
        return super().create_error(status, message, namespace, name)

    def controller_missing(self, namespace: str, name: str, age: float) -> str | None:
        return (f"kubernetes: the Trainer controller made no JobSet (or the JobSet controller does not run) for "
                f"TrainJob {namespace}/{name} after {age:.0f}s); check `kubectl get clustertrainingruntime "
                f"{RUNTIME_NAME}` (pinpoint provision --runtime) and `kubectl get pods -n kubeflow-system`")
