"""TF_CONFIG for every task of a topology request.

Roles use TensorFlow's names. Two shapes exist and both are produced here:

* Kubernetes (`k8s_cluster`): exactly what the Kubeflow Training Operator 1.x generates
  (pkg/controller.v1/tensorflow/tensorflow.go, genClusterSpec/genTFConfigJSONStr): host
  `<job>-<role>-<index>.<namespace>.svc[.<CUSTOM_CLUSTER_DOMAIN>]:<port>`, role keys lower-cased
  and sorted (a marshalled Go map), `"environment": "cloud"`, and -- since kubeflow/trainer#1146
  -- the evaluator INCLUDED in the cluster dict. The plain flavour reproduces it byte for byte.
* JobSet (`jobset_cluster`, flavours jobset and trainjob): the same shape, with the hosts the
  JobSet controller gives its pods (network.enableDNSHostnames): one child Job per role, so
  `<jobset>-<role>-0-<index>.<subdomain>` (the subdomain is the JobSet's name, and a TrainJob's
  JobSet is named like the TrainJob), qualified with `.<namespace>.svc[.<domain>]`.
* Local (`cluster_dict(..., include_evaluator=False)`): the evaluator is left out of the cluster
  dict, as TensorFlow's docs describe it (it only reads checkpoints), but has its own task entry.

`training_tf_config` drops the evaluator from a TF_CONFIG so a task can normalise the operator's
shape: ParameterServerStrategy's coordinator connects to every job in the cluster dict, and an
evaluator that runs no tf.distribute.Server would make that connection fail.
"""

from __future__ import annotations

import json
from typing import Callable

from pinpoint.config import ClusterConfig
from pinpoint.provision.namespace import namespace_of

# Order in which tasks are listed (chief first: it is task 0 of the collective group).
ROLES = ("chief", "worker", "ps", "evaluator")
# TFJob replicaSpecs keys for each TF role.
TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


def role_counts(c: ClusterConfig) -> dict[str, int]:
    """Replica count per TF role (roles with zero replicas are left out)."""
    counts = {"chief": c.chief, "worker": c.workers, "ps": c.ps, "evaluator": c.evaluator}
    return {r: n for r, n in counts.items() if n > 0}


def task_list(c: ClusterConfig) -> list[tuple[str, int]]:
    """Every (role, index) of the topology, chief first, evaluator last."""
    counts = role_counts(c)
    return [(r, i) for r in ROLES for i in range(counts.get(r, 0))]


def cluster_dict(
    c: ClusterConfig, address: Callable[[str, int], str], *, include_evaluator: bool = False
) -> dict[str, list[str]]:
    """The `cluster` part of TF_CONFIG: role -> addresses, keys sorted (the Training Operator
    marshals a Go map, whose JSON keys come out sorted)."""
    counts = role_counts(c)
    return {
        r: [address(r, i) for i in range(counts[r])]
        for r in sorted(counts)
        if include_evaluator or r != "evaluator"
    }


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> dict:
    """TF_CONFIG for one task, in the Training Operator's field order (cluster, task, environment)."""
    return {"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"}


def to_json(tf_config_dict: dict) -> str:
    """Serialise like Go's json.Marshal: no spaces, keys in the dict's order."""
    return json.dumps(tf_config_dict, separators=(",", ":"))


def _svc_address(pod_host: str, c: ClusterConfig) -> str:
    """A pod's address in the cluster DNS: '<pod_host>.<ns>.svc[.<domain>]:<port>'."""
    host = f"{pod_host}.{namespace_of(c)}.svc"
    if c.cluster_domain:
        host += f".{c.cluster_domain}"
    return f"{host}:{c.port}"


def k8s_host(name: str, role: str, index: int, c: ClusterConfig) -> str:
    """The Training Operator's address for a replica (GenGeneralName + '.<ns>.svc[.<domain>]')."""
    return _svc_address(f"{name}-{role}-{index}", c)


def k8s_cluster(name: str, c: ClusterConfig) -> dict[str, list[str]]:
    """The cluster dict the Training Operator generates for this topology (evaluator included)."""
    return cluster_dict(c, lambda r, i: k8s_host(name, r, i, c), include_evaluator=True)


def jobset_host(name: str, role: str, index: int, c: ClusterConfig) -> str:
    """A JobSet pod's address: the Indexed Job `<name>-<role>-0` (replicatedJob `role`, job index 0)
    names its pod `<job>-<index>` in the headless Service `<name>` (jobset's GenPodName; Trainer
    v2's IdentifyPodNetwork builds the same '<trainjob>-<rjob>-<jobIdx>-<podIdx>.<subdomain>')."""
    return _svc_address(f"{name}-{role}-0-{index}.{name}", c)


def jobset_cluster(name: str, c: ClusterConfig) -> dict[str, list[str]]:
    """The cluster dict of a JobSet's pods (evaluator included, as the plain flavour's)."""
    return cluster_dict(c, lambda r, i: jobset_host(name, r, i, c), include_evaluator=True)


def trainjob_cluster(name: str, c: ClusterConfig) -> dict[str, list[str]]:
    """The cluster dict of a TrainJob on the pinpoint-tensorflow runtime: every task is a completion
    index of the one replicatedJob 'node', in task order (chief, workers, ps, evaluator)."""
    index = {t: k for k, t in enumerate(task_list(c))}
    return cluster_dict(c, lambda r, i: jobset_host(name, "node", index[(r, i)], c), include_evaluator=True)


def training_tf_config(tf_config_dict: dict) -> dict:
    """A copy of TF_CONFIG without the evaluator in its cluster dict (see the module doc)."""
    cluster = {k: v for k, v in tf_config_dict.get("cluster", {}).items() if k != "evaluator"}
    return {**tf_config_dict, "cluster": cluster}
