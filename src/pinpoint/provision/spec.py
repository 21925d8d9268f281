"""The cluster spec: every task of the topology with its address, resources and TF_CONFIG.

It is what `cluster_spec.json` holds and what the manifests and the feasibility check read.
The checks here refuse the requests config.py cannot judge alone (Kubernetes names, labels).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config
from pinpoint.errors import RETRY_EXIT_CODE, ProvisionError
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.quantity import parse_quantity
from pinpoint.provision.tfconfig import (
    TFJOB_REPLICA_TYPES,
    jobset_cluster,
    k8s_cluster,
    role_counts,
    task_list,
    tf_config,
    to_json,
    trainjob_cluster,
)

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The Training Operator's ExitCode policy recreates a pod whose container exited with a code
# >= 128 (a signal, or 128+n chosen by the task; IsRetryableExitCode since release 1.7); any
# code 1..127 is permanent (1 an error, 2 bad input...). The plain Jobs' podFailurePolicy
# encodes the same split. Neither counts these recreations the way train.max_restarts means
# (TFJob's backoffLimit ignores ExitCode restarts): the launch step enforces it by counting
# each replica's pod recreations.
def is_retryable_exit_code(code: int) -> bool:
    return code >= 128


# Flavours whose workload is (or instantiates) a JobSet: its pods get the JobSet's DNS names.
JOBSET_FLAVORS = ("jobset", "trainjob")


# A multi-process run without cluster.runs_volume_claim gets no manifests: every pod would get its
# own emptyDir, so the evaluator would never see a checkpoint and a recreated pod would start at
# step 0 (pods do not restore from MLflow). Provision's warning and cluster_spec note.
NO_CLAIM_LINE = (
    "cluster.runs_volume_claim: got None; multi-process runs on Kubernetes share checkpoints through a "
    "ReadWriteMany claim; set it to get manifests/"
)



@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    gpus: int
    gpu_resource: str
    gpu_type: str | None  # required value of the GPU type label, or None

    def amounts(self) -> dict[str, float]:
        """Numeric requests keyed by resource name (cpu in cores, memory in bytes)."""
        out = {"cpu": float(parse_quantity(self.cpu)), "memory": float(parse_quantity(self.memory))}
        if self.gpus:
            out[self.gpu_resource] = float(self.gpus)
        return out


@dataclass(frozen=True)
class Task:
    role: str
    index: int
    replica_type: str  # TFJob replicaSpecs key
    host: str  # the DNS name the other tasks dial, with the port
    resources: Resources
    tf_config: dict = field(compare=False)
    devices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["task"] = self.name
        d["tf_config_json"] = to_json(self.tf_config)
        return d

    def to_spec_json(self) -> dict:
        """The task's entry in cluster_spec.json: its TF_CONFIG without the cluster dict, which the
        file holds once (repeating it per task made the file quadratic in the tasks: 430 KB at 74)."""
        d = {k: v for k, v in self.to_json().items() if k not in ("tf_config", "tf_config_json")}
        d["tf_config"] = {k: v for k, v in self.tf_config.items() if k != "cluster"}
        return d


def role_gpus(cfg: Config, role: str) -> int:
    """GPUs one replica of `role` requests. Emulated or CPU specs request none. A ps task only
    holds variables (host memory); the parameter_server chief only coordinates (dispatches
    functions to workers); an evaluator needs one device to run the model."""
    c = cfg.cluster
    if c.emulate or c.device_type != "GPU" or c.devices_per_worker == 0:
        return 0
    if role == "ps":
        return 0
    if role == "chief" and cfg.train.strategy == "parameter_server":
        return 0
    if role == "evaluator":
        return 1
    return c.devices_per_worker


def role_devices(cfg: Config, role: str) -> tuple[str, ...]:
    """The spec devices one task of `role` computes on (before emulation maps /GPU:i to a
    logical CPU device): replicas use every device of the spec; a ps task and the
    parameter_server coordinator only use the host CPU; an evaluator uses the first device."""
    replica = tuple(cfg.replica_devices())
    if role == "ps" or (role == "chief" and cfg.train.strategy == "parameter_server"):
        return ("/CPU:0",)
    if role == "evaluator":
        return replica[:1]
    return replica


def role_resources(cfg: Config, role: str) -> Resources:
    c = cfg.cluster
    gpus = role_gpus(cfg, role)
    return Resources(c.cpu, c.memory, gpus, c.gpu_resource, c.gpu_type if gpus else None)


def check_request(cfg: Config) -> None:
    """Refuse what Kubernetes would refuse later, one line each (config.py checked the TF traps)."""
    c = cfg.cluster
    for role, n in role_counts(c).items():
        if c.flavor == "trainjob":  # one replicatedJob 'node' holds every task
            longest, what = f"{cfg.name}-node-0-{len(task_list(c)) - 1}-abcde", "a JobSet pod name"
        elif c.flavor == "jobset":
            # The JobSet webhook's check: the longest pod name (with the Job controller's 5
            # random characters) must be a DNS-1035 label.
            longest, what = f"{cfg.name}-{role}-0-{n - 1}-abcde", "a JobSet pod name"
        else:
            longest, what = f"{cfg.name}-{role}-{n - 1}", "a Service name"
        if len(longest) > 63 or not _DNS1035.match(longest):
            raise ProvisionError(
                f"name: got {cfg.name!r}; '{longest}' ({what}) must be a DNS-1035 label of at most "
                "63 characters; use a shorter name"
            )
    if not re.match(r"^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$", c.gpu_resource):
        raise ProvisionError(
            f"cluster.gpu_resource: got {c.gpu_resource!r}; use an extended resource name like 'nvidia.com/gpu'"
        )
    _check_label_key("cluster.gpu_type_label", c.gpu_type_label)
    if c.gpu_type is not None:
        _check_label_value("cluster.gpu_type", c.gpu_type)
    for k, v in c.node_selector.items():
        _check_label_key(f"cluster.node_selector.{k}", k)
        _check_label_value(f"cluster.node_selector.{k}", v)
    for t in c.tolerations:
        _check_label_key("cluster.tolerations.key", t.key)
        if t.operator == "Exists" and t.value:
            raise ProvisionError(
                f"cluster.tolerations: got value {t.value!r} with operator Exists; drop the value or use Equal"
            )
    if c.gpu_type and c.gpu_type_label in c.node_selector and c.node_selector[c.gpu_type_label] != c.gpu_type:
        raise ProvisionError(
            f"cluster.node_selector.{c.gpu_type_label}: got {c.node_selector[c.gpu_type_label]!r} but "
            f"cluster.gpu_type is {c.gpu_type!r}; keep one of them"
        )
    if c.gpu_type and not any(role_gpus(cfg, r) for r in role_counts(c)):
        raise ProvisionError(
            f"cluster.gpu_type: got {c.gpu_type!r} but no replica requests a GPU (emulate: {c.emulate}, "
            f"device_type: {c.device_type}); set emulate: false and device_type: GPU, or drop gpu_type"
        )


def _check_label_key(field_name: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name) or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
        raise ProvisionError(
            f"{field_name}: got {key!r}; use a Kubernetes label key like 'nvidia.com/gpu.product'"
        )


def _check_label_value(field_name: str, value: str) -> None:
    if len(value) > 63 or (value and not _LABEL_NAME.match(value)):
        raise ProvisionError(
            f"{field_name}: got {value!r}; a label value has at most 63 letters, digits, '-', '_' or '.'"
        )


def build_tasks(cfg: Config) -> list[Task]:
    """Every task with the TF_CONFIG the Training Operator would give it (the plain flavour
    reproduces the same one); for the JobSet flavours the same shape with the JobSet's pod hosts."""
    check_request(cfg)
    c = cfg.cluster
    if c.flavor == "trainjob":
        cluster = trainjob_cluster(cfg.name, c)
    else:
        cluster = jobset_cluster(cfg.name, c) if c.flavor == "jobset" else k8s_cluster(cfg.name, c)
    # Every task shares the one cluster dict (no copy per task: memory stays linear in the tasks).
    return [
        Task(
            role=r,
            index=i,
            replica_type=TFJOB_REPLICA_TYPES[r],
            host=cluster[r][i],
            resources=role_resources(cfg, r),
            tf_config=tf_config(cluster, r, i),
            devices=role_devices(cfg, r),
        )
        for r, i in task_list(c)
    ]


def cluster_spec(cfg: Config, tasks: list[Task], *, pod_run_dir: str | None = None) -> dict:
    """The content of cluster_spec.json; pod_run_dir: the folder the manifests' pods write
    (their --out, on the claim), None when no manifests are written."""
    c = cfg.cluster
    return {
        "name": cfg.name,
        "config_digest": cfg.digest(),
        "strategy": cfg.train.strategy,
        "multi_process": cfg.train.strategy in MULTI_PROCESS_STRATEGIES,
        "flavor": c.flavor,
        "namespace": namespace_of(c),
        "port": c.port,
        "cluster_domain": c.cluster_domain,
        "emulated": c.emulate,
        "devices_per_replica": cfg.replica_devices(),
        "roles": role_counts(c),
        "cluster": tasks[0].tf_config["cluster"] if tasks else {},
        # A task's TF_CONFIG is {"cluster": <cluster above>, **tasks[i].tf_config}.
        "pod_run_dir": pod_run_dir,
        "restart": _restart(cfg),
        "notes": _notes(cfg),
        "tasks": [t.to_spec_json() for t in tasks],
    }


def _restart(cfg: Config) -> dict:
    """Who retries what, for cfg.cluster.flavor."""
    out = {
        "retryable_exit_codes": ">= 128",
        "permanent_exit_codes": "1..127",
        "retry_exit_code": RETRY_EXIT_CODE,
        "max_restarts": cfg.train.max_restarts,
    }
    if cfg.cluster.flavor in JOBSET_FLAVORS:
        out["retried_by"] = ("the JobSet controller: a child Job failing with BackoffLimitExceeded (exit >= 128) "
                             "recreates every child Job (RestartJobSet, counted); PodFailurePolicy (exit 1..127) and "
                             "DeadlineExceeded fail the JobSet; a disrupted pod (DisruptionTarget) is recreated by "
                             "its Job without counting")
        out["max_restarts_enforced_by"] = "the JobSet's failurePolicy.maxRestarts (status.restarts counts them)"
    else:
        out["retried_by"] = ("the Training Operator's ExitCode policy (IsRetryableExitCode, release >= 1.7) or the "
                             "plain Jobs' podFailurePolicy (DisruptionTarget ignored first, then FailJob on 1..127)")
        out["max_restarts_enforced_by"] = ("the launch step, counting each replica's pod recreations (TFJob "
                                           "backoffLimit does not count ExitCode restarts)")
    return out


def _notes(cfg: Config) -> list[str]:
    """What the manifests cannot express by themselves."""
    c, notes = cfg.cluster, []
    if c.flavor == "tfjob" and c.cluster_domain:
        notes.append(
            f"the Training Operator appends a cluster domain only if its Deployment sets CUSTOM_CLUSTER_DOMAIN="
            f"{c.cluster_domain}; without it the TFJob's TF_CONFIG hosts end in '.svc'"
        )
    if c.flavor == "plain" and cfg.train.strategy == "parameter_server":
        notes.append(
            "parameter_server ps/worker tasks serve until stopped: when the chief Job completes, delete the rest "
            f"with `kubectl delete jobs -n {namespace_of(c)} -l app.kubernetes.io/instance={cfg.name}`"
        )
    if c.flavor == "trainjob":
        notes.append(
            "the TrainJob runs on the ClusterTrainingRuntime 'pinpoint-tensorflow': apply docker/runtime.yaml once per "
            "cluster (`pinpoint provision CONFIG --runtime` writes it)"
        )
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES and not c.runs_volume_claim:
        notes.append(NO_CLAIM_LINE)
    return notes
