"""The cluster spec: every task of the topology with its address, resources and TF_CONFIG.

It is what `cluster_spec.json` holds and what the manifests and the feasibility check read
(a task itself is pinpoint.provision.tasks.Task). The checks here refuse the requests config.py
cannot judge alone (Kubernetes names, labels).
"""

from __future__ import annotations

import re

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config
from pinpoint.errors import RETRY_EXIT_CODE, ProvisionError
from pinpoint.provision.flavours import flavour_of
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.tasks import NO_CLAIM_LINE, Task, role_devices, role_gpus, role_resources
from pinpoint.provision.tfconfig import TFJOB_REPLICA_TYPES, role_counts, task_list, tf_config

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_request(cfg: Config) -> None:
    """Refuse what Kubernetes would refuse later, one line each (config.py checked the TF traps)."""
    c = cfg.cluster
    flavour = flavour_of(cfg)
    for role, n in role_counts(c).items():
        longest, what = flavour.longest_name(cfg, role, n)
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
    cluster = flavour_of(cfg).cluster(cfg)
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
    out.update(flavour_of(cfg).restart())
    return out


def _notes(cfg: Config) -> list[str]:
    """What the manifests cannot express by themselves."""
    c, notes = cfg.cluster, flavour_of(cfg).notes(cfg)
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES and not c.runs_volume_claim:
        notes.append(NO_CLAIM_LINE)
    return notes
