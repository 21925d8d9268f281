"""TF_CONFIG for every task of a topology request.

Roles use TensorFlow's names. The evaluator is never part of the `cluster` dict (TF and the
Training Operator both leave it out: it reads checkpoints and never joins the collectives or the
ps coordination), but it gets its own task entry with the same cluster dict.
"""

from __future__ import annotations

from typing import Callable

from pinpoint.config import ClusterConfig

# Order in which tasks are listed (chief first: it is task 0 of the collective group).
ROLES = ("chief", "worker", "ps", "evaluator")
CLUSTER_ROLES = ("chief", "worker", "ps")
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


def cluster_dict(c: ClusterConfig, address: Callable[[str, int], str]) -> dict[str, list[str]]:
    """The `cluster` part of TF_CONFIG: role -> addresses, evaluator excluded, keys sorted
    (the Training Operator marshals a Go map, whose JSON keys come out sorted)."""
    counts = role_counts(c)
    return {r: [address(r, i) for i in range(counts[r])] for r in sorted(counts) if r in CLUSTER_ROLES}


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> dict:
    """TF_CONFIG for one task, in the Training Operator's shape (cluster, task, environment)."""
    return {"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"}
