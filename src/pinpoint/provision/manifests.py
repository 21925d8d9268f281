"""Kubernetes manifests for a cluster spec: a TFJob, plain Services + Indexed Jobs, a JobSet, or a
Kubeflow Trainer v2 TrainJob (pinpoint.provision.trainjob) whose runtime holds that JobSet.

Every flavour runs the same container (`pinpoint train /config/config.yaml --out /runs/<rel>
--task <role>:<index>`) with the same TF_CONFIG: the TFJob's comes from the Training Operator,
the plain and JobSet ones from `pinpoint.provision.podenv`, which rebuilds the operator's JSON
from the Indexed Job's completion index (with the JobSet's pod hosts for a JobSet).

Run folder: the pods mount cluster.runs_volume_claim with `subPath: <rel>` at `/runs/<rel>` and
write there, where <rel> is the provisioned run folder relative to RUNS_MOUNT (/runs) when it is
under it (the pipeline's steps, which mount the same claim at /runs), else the run's name
(`pod_run_rel`). So a step's run_dir, a custom one or a sweep variant's '<run_dir>/<variant>',
is exactly the folder its pods write.

Restart semantics: a multi-worker collective cannot continue with a replaced member, so a task
that loses a peer exits with RETRY_EXIT_CODE (138) and is recreated, and the group restarts from
the latest checkpoint on the shared claim. Exit codes >= 128 are retried (the Training
Operator's ExitCode policy, IsRetryableExitCode since release 1.7; the plain Jobs'
podFailurePolicy); codes 1..127 (configuration and code errors) are permanent. The operator does
not count ExitCode recreations against runPolicy.backoffLimit, so train.max_restarts is enforced
by the launch step (pinpoint.k8s.launch), which counts each replica's pod recreations.
A JobSet restarts the whole group itself (every child Job recreated, `status.restarts` counted
up to failurePolicy.maxRestarts = train.max_restarts); the launch step only watches it.
"""

from __future__ import annotations

import json
import posixpath

import yaml

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config, config_to_yaml
from pinpoint.errors import ProvisionError
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.podenv import (
    MLFLOW_SECRET_KEYS,
    collective_timeout_env,
    uri_has_credentials,
)
from pinpoint.provision.spec import NO_CLAIM_LINE, Task
from pinpoint.provision.tfconfig import TFJOB_REPLICA_TYPES, role_counts, task_list
from pinpoint.runfolder import RUNS_MOUNT

CONTAINER = "tensorflow"  # the Training Operator finds the TF container and its port by these names
PORT_NAME = "tfjob-port"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
ROLE_LABEL = "pinpoint.dev/role"
UID = 1000  # the non-root user of the pinpoint images
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EXAMPLE_REGISTRY = "registry.example.com"


def pod_run_rel(out_dir, name: str, runs_mount: str = RUNS_MOUNT) -> str:
    """The pods' run folder relative to the claim's root: `out_dir` relative to `runs_mount`
    when it is under it (where the pipeline's steps mount the claim), else `name` (a folder
    elsewhere, e.g. `pinpoint provision --out runs/x` on a laptop for kubectl apply).
    Pure: `out_dir` is an absolute path string, nothing is read from the file system."""
    path = posixpath.normpath(str(out_dir))
    root = posixpath.normpath(runs_mount)
    if posixpath.isabs(path) and path != root and path.startswith(root.rstrip("/") + "/"):
        return posixpath.relpath(path, root)
    return name


def pod_run_dir(rel: str, runs_mount: str = RUNS_MOUNT) -> str:
    """The folder the pods write (their --out): the claim's `rel` folder, mounted at the same path."""
    return f"{posixpath.normpath(runs_mount)}/{rel}"


def is_unqualified_image(image: str) -> bool:
    """True for an image name without a registry host ('pinpoint-cpu:latest', 'team/app:1'):
    the first path component of a qualified name has a '.' or ':' or is 'localhost'."""
    first, sep, _ = image.partition("/")
    return not sep or not ("." in first or ":" in first or first == "localhost")


def unqualified_image_fix(image: str) -> str:
    repo = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return f"push it to a registry and use {EXAMPLE_REGISTRY}/{repo}:TAG"


def check_manifest_inputs(cfg: Config) -> None:
    """What makes manifests wrong or unsafe, refused with one line each."""
    c = cfg.cluster
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES and not c.runs_volume_claim:
        raise ProvisionError(NO_CLAIM_LINE)
    if uri_has_credentials(cfg.tracking.uri):
        # The ConfigMap embeds config.yaml: a password in tracking.uri would be readable by anyone
        # who can read ConfigMaps (and printed by every pod). The value itself is never echoed.
        where = f"the Kubernetes Secret '{c.mlflow_secret}'" if c.mlflow_secret else "a Secret named by cluster.mlflow_secret"
        raise ProvisionError(
            "tracking.uri: got a URI with credentials (user:password@host); the manifests' ConfigMap embeds the "
            f"config, so remove them from the URI and put them in {where} (keys username, password)"
        )
    if not c.emulate and is_unqualified_image(c.image):
        raise ProvisionError(
            f"cluster.image: got {c.image!r}, a name without a registry host, which the nodes of a real "
            f"(emulate: false) cluster can only run if it was preloaded on each of them (imagePullPolicy "
            f"IfNotPresent); {unqualified_image_fix(c.image)}"
        )


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


def _command(cfg: Config, role: str, plain: bool, run_dir: str) -> list[str]:
    # '$$' is a literal '$' after the kubelet's $(VAR) expansion of the command.
    cmd = ["pinpoint", "train", "/config/config.yaml", "--out", run_dir.replace("$", "$$")]
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
        # train.collective_timeout_s, as the local launcher gives it to its tasks (if set).
        *({"name": k, "value": v} for k, v in collective_timeout_env(cfg).items()),
    ]
    if cfg.cluster.mlflow_secret:
        # The Secret the pipeline's steps read, by name and key only (optional: a cluster without
        # it uses tracking.uri); the kubelet injects the values, nothing stores them.
        env += [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": cfg.cluster.mlflow_secret, "key": key, "optional": True}}}
            for key, var in MLFLOW_SECRET_KEYS.items()
        ]
    if plain:
        env += [
            {"name": "PINPOINT_TASK_ROLE", "value": task.role},
            {"name": "PINPOINT_TF_CLUSTER", "value": json.dumps(task.tf_config["cluster"], separators=(",", ":"))},
        ]
    return env


def pod_template(cfg: Config, task: Task, *, plain: bool, run_rel: str | None = None) -> dict:
    """The pod of one role (every replica of a role is identical but for its index); it writes
    the run folder /runs/<run_rel> (default: the run's name)."""
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
                "command": _command(cfg, task.role, plain, run_dir),
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


def _first_tasks(tasks: list[Task]) -> dict[str, Task]:
    first: dict[str, Task] = {}
    for t in tasks:
        first.setdefault(t.role, t)
    return first


def _workload_labels(cfg: Config) -> dict[str, str]:
    """The TFJob's/Job's labels: with gang: kueue, the LocalQueue that admits it as one workload."""
    out = labels(cfg)
    if cfg.cluster.gang == "kueue":
        out[KUEUE_QUEUE_LABEL] = cfg.cluster.queue
    return out


def tfjob(cfg: Config, tasks: list[Task], run_rel: str | None = None) -> dict:
    """A kubeflow.org/v1 TFJob for the Training Operator 1.x (schema of release 1.9)."""
    c = cfg.cluster
    counts = role_counts(c)
    replica_specs = {
        TFJOB_REPLICA_TYPES[role]: {
            "replicas": counts[role],
            # ExitCode: a container exit code >= 128 (a signal, RETRY_EXIT_CODE 138) recreates the
            # pod (IsRetryableExitCode, operator >= 1.7); 1..127 fails the job for good. These
            # recreations do not count against backoffLimit: the launch step enforces
            # train.max_restarts by counting them.
            "restartPolicy": "ExitCode",
            "template": pod_template(cfg, task, plain=False, run_rel=run_rel),
        }
        for role, task in _first_tasks(tasks).items()
    }
    run_policy: dict = {
        # ps (and parameter_server workers) serve forever; remove them when the chief is done.
        "cleanPodPolicy": "Running",
        "backoffLimit": cfg.train.max_restarts,
        # The cluster stops a run that outlives its launcher, and removes it once finished.
        "activeDeadlineSeconds": c.deadline_s,
        "ttlSecondsAfterFinished": c.ttl_after_finished_s,
    }
    if c.gang == "operator":
        # All-or-nothing: the gang scheduler (Volcano, scheduler-plugins) binds every replica or none.
        policy: dict = {"minAvailable": sum(counts.values())}
        if c.queue:
            policy["queue"] = c.queue
        run_policy["schedulingPolicy"] = policy
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": cfg.name, "namespace": namespace_of(c), "labels": _workload_labels(cfg)},
        "spec": {
            "runPolicy": run_policy,
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


def plain_job(cfg: Config, task: Task, replicas: int, run_rel: str | None = None) -> dict:
    """One Indexed Job per role; pod hostnames are `<job>-<index>` = `<name>-<role>-<index>`."""
    template = pod_template(cfg, task, plain=True, run_rel=run_rel)
    template["spec"]["restartPolicy"] = "Never"  # required by podFailurePolicy
    template["spec"]["subdomain"] = cfg.name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        # gang: kueue is only allowed with a single role (config.py), so this Job is the whole run.
        "metadata": {"name": f"{cfg.name}-{task.role}", "namespace": namespace_of(cfg.cluster),
                     "labels": _workload_labels(cfg)},
        "spec": {
            "completionMode": "Indexed",
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimitPerIndex": cfg.train.max_restarts,
            "activeDeadlineSeconds": cfg.cluster.deadline_s,
            "ttlSecondsAfterFinished": cfg.cluster.ttl_after_finished_s,
            # Rules are evaluated in order and the first match wins.
            "podFailurePolicy": {
                "rules": [
                    # Preemption or node drain first: recreate without counting a failure, whatever
                    # code the disrupted container exited with (a preempted task may exit 1).
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    # Same split as TFJob's ExitCode policy: 1..127 permanent, >= 128 retried
                    # (counted by backoffLimitPerIndex = train.max_restarts).
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": list(range(1, 128)),
                        },
                    },
                ]
            },
            "template": template,
        },
    }


JOBSET_API = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# JobSet startup order for parameter_server: the ps serve the variables the workers and the
# coordinator (chief) connect to, so they start (and are Ready) first.
PS_STARTUP_ORDER = ("ps", "worker", "chief", "evaluator")


def CONTAINER_EXIT_RULES(container: str) -> list[dict]:  # noqa: N802 - a constant of one parameter
    """The podFailurePolicy of a JobSet's child Job (rules in order, the first match wins)."""
    return [
        # Preemption or node drain: the Job recreates the pod without counting it (JobSet v0.9.1
        # matches only a Job's failure reason, and a FailJob here would share the reason
        # PodFailurePolicy with the permanent exits below).
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # 1..127: configuration or code errors; the JobSet fails at once (FailJobSet).
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": list(range(1, 128))}},
    ]


# The JobSet's failurePolicy rules (in order, the first match wins; unmatched: RestartJobSet).
JOBSET_FAILURE_RULES = [
    {"name": "permanentExit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
    {"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
    # backoffLimit 0: a pod's exit >= 128 (a lost peer's 138, a signal) fails its Job with
    # BackoffLimitExceeded; every child Job is recreated, counted against maxRestarts.
    {"name": "retryableExit", "action": "RestartJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]},
]


def _child_job(cfg: Config, task: Task, replicas: int, run_rel: str | None) -> dict:
    """The Job template of one replicatedJob: an Indexed Job of `replicas` pods that fails as a
    whole on its first failed pod (backoffLimit 0), so the JobSet decides what happens next."""
    template = pod_template(cfg, task, plain=True, run_rel=run_rel)
    template["spec"]["restartPolicy"] = "Never"  # required by podFailurePolicy
    return {
        "completionMode": "Indexed",
        "completions": replicas,
        "parallelism": replicas,
        # Any counted pod failure (an exit >= 128: a lost peer's 138, a signal) fails this Job
        # with BackoffLimitExceeded, which the JobSet answers by recreating every child Job.
        "backoffLimit": 0,
        # Per attempt: a restarted JobSet makes new child Jobs (the launch step's timeout is overall).
        "activeDeadlineSeconds": cfg.cluster.deadline_s,
        "podFailurePolicy": {"rules": CONTAINER_EXIT_RULES(CONTAINER)},
        "template": template,
    }


def jobset_spec(cfg: Config, tasks: list[Task], run_rel: str | None = None) -> dict:
    """The spec of the run's JobSet (flavour jobset; the template of the trainjob runtime)."""
    c = cfg.cluster
    counts = role_counts(c)
    first = _first_tasks(tasks)
    roles = list(first)
    if cfg.train.strategy == "parameter_server":
        roles = [r for r in PS_STARTUP_ORDER if r in first]
    primary = "chief" if "chief" in counts else "worker"
    spec: dict = {
        # Pods reach each other as <name>-<role>-0-<i>.<name> (the headless Service the JobSet makes).
        "network": {"enableDNSHostnames": True, "subdomain": cfg.name, "publishNotReadyAddresses": True},
        "replicatedJobs": [
            {"name": role, "replicas": 1, "template": {"spec": _child_job(cfg, first[role], counts[role], run_rel)}}
            for role in roles
        ],
        # Rules are evaluated in order, the first match wins; unmatched failures restart (counted).
        "failurePolicy": {
            "maxRestarts": cfg.train.max_restarts,
            # The old pods are gone before the new ones start: two attempts never write one checkpoint.
            "restartStrategy": "BlockingRecreate",
            "rules": JOBSET_FAILURE_RULES,
        },
        # Done when the chief (else every worker) completed; the evaluator is not waited for, and
        # the JobSet controller deletes the Jobs still running (ps servers, the evaluator).
        "successPolicy": {"operator": "Any" if primary == "chief" else "All", "targetReplicatedJobs": [primary]},
        "ttlSecondsAfterFinished": c.ttl_after_finished_s,
    }
    if cfg.train.strategy == "parameter_server":
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return spec


def jobset(cfg: Config, tasks: list[Task], run_rel: str | None = None) -> dict:
    """A jobset.x-k8s.io/v1alpha2 JobSet (schema of JobSet v0.9.1): one replicatedJob per role."""
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        # gang: kueue: the queue label on the JobSet, which Kueue admits as one workload (every role).
        "metadata": {"name": cfg.name, "namespace": namespace_of(cfg.cluster), "labels": _workload_labels(cfg)},
        "spec": jobset_spec(cfg, tasks, run_rel),
    }


def build_manifests(cfg: Config, tasks: list[Task], *, run_rel: str | None = None) -> dict[str, list[dict]]:
    """File name -> documents, for cfg.cluster.flavor; the pods write /runs/<run_rel> on the
    claim (default: the run's name, see `pod_run_rel`). ProvisionError (one line) for what
    check_manifest_inputs refuses."""
    check_manifest_inputs(cfg)
    files = {"configmap.yaml": [configmap(cfg)]}
    if cfg.cluster.flavor == "tfjob":
        files["tfjob.yaml"] = [tfjob(cfg, tasks, run_rel)]
    elif cfg.cluster.flavor == "jobset":
        files["jobset.yaml"] = [jobset(cfg, tasks, run_rel)]
    elif cfg.cluster.flavor == "trainjob":
        from pinpoint.provision.trainjob import trainjob

        files["trainjob.yaml"] = [trainjob(cfg, tasks, run_rel)]
    else:
        files["services.yaml"] = plain_services(cfg)
        counts = role_counts(cfg.cluster)
        for role, task in _first_tasks(tasks).items():
            files[f"job-{role}.yaml"] = [plain_job(cfg, task, counts[role], run_rel)]
    return files


def dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
