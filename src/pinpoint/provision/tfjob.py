"""Flavour tfjob: one kubeflow.org/v1 TFJob for the Kubeflow Training Operator 1.x, which gives
every pod its TF_CONFIG and recreates a pod that exits with a code >= 128 (ExitCode policy)."""

from __future__ import annotations

from pinpoint.config import Config
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.names import workload_labels
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.pods import first_tasks, pod_template
from pinpoint.provision.tasks import Task
from pinpoint.provision.tfconfig import TFJOB_REPLICA_TYPES, k8s_cluster, role_counts

TFJOB_API = "kubeflow.org/v1"


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
            "template": pod_template(cfg, task, podenv=False, run_rel=run_rel),
        }
        for role, task in first_tasks(tasks).items()
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
        "apiVersion": TFJOB_API,
        "kind": "TFJob",
        "metadata": {"name": cfg.name, "namespace": namespace_of(c), "labels": workload_labels(cfg)},
        "spec": {
            "runPolicy": run_policy,
            "tfReplicaSpecs": replica_specs,
        },
    }


class TFJobFlavour(Flavour, name="tfjob", kind="TFJob", api_version=TFJOB_API, tf_cluster=k8s_cluster):
    not_installed = ("kubernetes: the TFJob resource (kubeflow.org/v1 tfjobs) is not installed; install the Kubeflow "
                     "Training Operator, or set cluster.flavor: jobset (JobSet installed) or cluster.flavor: plain")

    def manifests(self, cfg: Config, tasks: list[Task], run_rel: str | None) -> dict[str, list[dict]]:
        return {"tfjob.yaml": [tfjob(cfg, tasks, run_rel)]}

    def notes(self, cfg: Config) -> list[str]:
        if not cfg.cluster.cluster_domain:
            return []
        return [f"the Training Operator appends a cluster domain only if its Deployment sets CUSTOM_CLUSTER_DOMAIN="
                f"{cfg.cluster.cluster_domain}; without it the TFJob's TF_CONFIG hosts end in '.svc'"]

    def pod_count(self, doc: dict) -> int:
        return sum(s.get("replicas", 1) for s in doc["spec"]["tfReplicaSpecs"].values())

    def pod_templates(self, doc: dict) -> list[dict]:
        return [r["template"] for r in doc["spec"]["tfReplicaSpecs"].values()]

    def controller_missing(self, namespace: str, name: str, age: float) -> str | None:
        return (f"kubernetes: the Training Operator does not seem to run (no status on TFJob {namespace}/"
                f"{name} after {age:.0f}s); check `kubectl get pods -n kubeflow`, or set cluster.flavor: plain")
