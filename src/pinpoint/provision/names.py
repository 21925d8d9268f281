"""Names every flavour's manifests and the launch step's watcher share: labels, the container,
the port, the pods' user. One definition each, so the manifests and the watcher cannot drift."""

from __future__ import annotations

from pinpoint.config import Config

CONTAINER = "tensorflow"  # the Training Operator finds the TF container and its port by these names
PORT_NAME = "tfjob-port"
INSTANCE_LABEL = "app.kubernetes.io/instance"
ROLE_LABEL = "pinpoint.dev/role"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Where a pod's task index is: the TFJob's label, else the Indexed Job's label or annotation.
INDEX_LABELS = (REPLICA_INDEX_LABEL, COMPLETION_INDEX_LABEL)
UID = 1000  # the non-root user of the pinpoint images
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on a JobSet's pods: the JobSet's name
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EXAMPLE_REGISTRY = "registry.example.com"


def labels(cfg: Config) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pinpoint",
        INSTANCE_LABEL: cfg.name,
        "app.kubernetes.io/managed-by": "pinpoint",
    }


def workload_labels(cfg: Config) -> dict[str, str]:
    """A workload's labels: with gang: kueue, the LocalQueue that admits it as one workload."""
    out = labels(cfg)
    if cfg.cluster.gang == "kueue":
        out[KUEUE_QUEUE_LABEL] = cfg.cluster.queue
    return out
