"""Flavour plain: headless Services and one Indexed Job per role, no operator. The pods rebuild
the Training Operator's TF_CONFIG from their completion index (pinpoint.provision.podenv), and
each Job's podFailurePolicy splits exit codes as the operator's ExitCode policy does."""

from __future__ import annotations

from pinpoint.config import Config
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.names import (
    COMPLETION_INDEX_LABEL,
    CONTAINER,
    INSTANCE_LABEL,
    PORT_NAME,
    ROLE_LABEL,
    labels,
    workload_labels,
)
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.pods import first_tasks, pod_template
from pinpoint.provision.tasks import Task
from pinpoint.provision.tfconfig import k8s_cluster, role_counts, task_list

JOB_API = "batch/v1"
# A Job's Failed reasons -> the fix.
JOB_FAILED_FIXES = {
    "BackoffLimitExceeded": "its pods failed more often than spec.backoffLimit; see the pod logs above",
    "FailedIndexes": "an index failed more often than backoffLimitPerIndex (train.max_restarts); see the pod "
                     "logs above, fix the cause or raise train.max_restarts",
    "PodFailurePolicy": "a container exited with a permanent code (1-127), which fails the Job; see the pod logs above",
    "DeadlineExceeded": "it ran longer than activeDeadlineSeconds; raise cluster.deadline_s",
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
    base = {INSTANCE_LABEL: cfg.name}
    docs = [_service(cfg, cfg.name, base)]
    for role, i in task_list(cfg.cluster):
        docs.append(_service(cfg, f"{cfg.name}-{role}-{i}", {**base, ROLE_LABEL: role, COMPLETION_INDEX_LABEL: str(i)}))
    return docs


def plain_job(cfg: Config, task: Task, replicas: int, run_rel: str | None = None) -> dict:
    """One Indexed Job per role; pod hostnames are `<job>-<index>` = `<name>-<role>-<index>`."""
    template = pod_template(cfg, task, podenv=True, run_rel=run_rel)
    template["spec"]["restartPolicy"] = "Never"  # required by podFailurePolicy
    template["spec"]["subdomain"] = cfg.name
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        # gang: kueue is only allowed with a single role (config.py), so this Job is the whole run.
        "metadata": {"name": f"{cfg.name}-{task.role}", "namespace": namespace_of(cfg.cluster),
                     "labels": workload_labels(cfg)},
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


def role_of(doc: dict) -> str | None:
    """The role a Job's pods run (its template's role label)."""
    return ((doc["spec"].get("template") or {}).get("metadata", {}).get("labels") or {}).get(ROLE_LABEL)


class PlainFlavour(Flavour, name="plain", kind="Job", api_version=JOB_API, tf_cluster=k8s_cluster):

    def manifests(self, cfg: Config, tasks: list[Task], run_rel: str | None) -> dict[str, list[dict]]:
        files = {"services.yaml": plain_services(cfg)}
        counts = role_counts(cfg.cluster)
        for role, task in first_tasks(tasks).items():
            files[f"job-{role}.yaml"] = [plain_job(cfg, task, counts[role], run_rel)]
        return files

    def notes(self, cfg: Config) -> list[str]:
        if cfg.train.strategy != "parameter_server":
            return []
        return ["parameter_server ps/worker tasks serve until stopped: when the chief Job completes, delete the rest "
                f"with `kubectl delete jobs -n {namespace_of(cfg.cluster)} -l {INSTANCE_LABEL}={cfg.name}`"]

    def pod_count(self, doc: dict) -> int:
        return doc["spec"].get("parallelism", doc["spec"].get("completions", 1))

    def pod_templates(self, doc: dict) -> list[dict]:
        return [doc["spec"]["template"]]

    def is_primary(self, doc: dict, workloads: list[dict]) -> bool:
        """The chief's Job, else the workers'."""
        roles = {role_of(d) for d in workloads}
        return role_of(doc) == ("chief" if "chief" in roles else "worker")

    def failed_fix(self, reason: str | None) -> str:
        return JOB_FAILED_FIXES.get(reason or "", super().failed_fix(reason))
