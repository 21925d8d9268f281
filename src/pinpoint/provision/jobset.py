"""Flavour jobset: one jobset.x-k8s.io/v1alpha2 JobSet (schema of JobSet v0.9.1), one
replicatedJob per role. The JobSet controller restarts the whole group itself (failurePolicy,
counted in status.restarts up to train.max_restarts): the launch step only watches it.

`GroupFlavour` is what the jobset and trainjob flavours share: pods named by the JobSet, the
group restarted by its controller, the watcher's hooks for the JobSet's conditions."""

from __future__ import annotations

from typing import ClassVar

from pinpoint.config import Config
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.names import CONTAINER, workload_labels
from pinpoint.provision.namespace import namespace_of
from pinpoint.provision.pods import first_tasks, pod_template
from pinpoint.provision.tasks import Task
from pinpoint.provision.tfconfig import jobset_cluster, role_counts

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
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
    template = pod_template(cfg, task, podenv=True, run_rel=run_rel)
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
    first = first_tasks(tasks)
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
        "metadata": {"name": cfg.name, "namespace": namespace_of(cfg.cluster), "labels": workload_labels(cfg)},
        "spec": jobset_spec(cfg, tasks, run_rel),
    }


# The JobSet controller's Failed reasons (pkg/constants of JobSet v0.9.1) -> the fix.
JOBSET_FAILED_FIXES = {
    "ReachedMaxRestarts": "a task kept exiting with a retryable code (>= 128: a lost peer, a signal); see the logs "
                          "above, fix the cause or raise train.max_restarts",
    "FailJobSetFailurePolicyAction": "a task exited with a permanent code (1-127) or its Job ran past "
                                     "cluster.deadline_s; see the logs above",
    "FailedJobs": "a child Job failed and the JobSet has no failure policy; rerun provision",
}


class GroupFlavour(Flavour):
    """A workload that is, or instantiates, a JobSet named like the run."""

    restarts_group = True
    # The workload is the JobSet itself (else its controller makes one of the same name).
    is_jobset: ClassVar[bool] = True
    # The JobSet's failurePolicy.maxRestarts is train.max_restarts exactly; else (a runtime's
    # ceiling) the watcher stops the run after train.max_restarts counted restarts.
    enforces_max_restarts: ClassVar[bool] = True

    def restart(self) -> dict[str, str]:
        return {
            "retried_by": ("the JobSet controller: a child Job failing with BackoffLimitExceeded (exit >= 128) "
                           "recreates every child Job (RestartJobSet, counted); PodFailurePolicy (exit 1..127) and "
                           "DeadlineExceeded fail the JobSet; a disrupted pod (DisruptionTarget) is recreated by "
                           "its Job without counting"),
            "max_restarts_enforced_by": "the JobSet's failurePolicy.maxRestarts (status.restarts counts them)",
        }

    def failed_fix(self, reason: str | None) -> str:
        return JOBSET_FAILED_FIXES.get(reason or "", "see the logs above")


class JobSetFlavour(GroupFlavour, name="jobset", kind="JobSet", api_version=JOBSET_API, tf_cluster=jobset_cluster):
    done_conditions = ("Completed",)
    not_installed = ("kubernetes: the JobSet resource (jobset.x-k8s.io/v1alpha2 jobsets) is not installed; install "
                     "JobSet (v0.9.1: kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/"
                     "download/v0.9.1/manifests.yaml) or set cluster.flavor: plain")

    def longest_name(self, cfg: Config, role: str, replicas: int) -> tuple[str, str]:
        # The JobSet webhook's check: the longest pod name (with the Job controller's 5 random
        # characters) must be a DNS-1035 label.
        return f"{cfg.name}-{role}-0-{replicas - 1}-abcde", "a JobSet pod name"

    def manifests(self, cfg: Config, tasks: list[Task], run_rel: str | None) -> dict[str, list[dict]]:
        return {"jobset.yaml": [jobset(cfg, tasks, run_rel)]}

    def pod_count(self, doc: dict) -> int:
        return sum(r.get("replicas", 1) * r["template"]["spec"].get("parallelism", 1)
                   for r in doc["spec"]["replicatedJobs"])

    def pod_templates(self, doc: dict) -> list[dict]:
        return [r["template"]["spec"]["template"] for r in doc["spec"]["replicatedJobs"]]

    def controller_missing(self, namespace: str, name: str, age: float) -> str | None:
        return (f"kubernetes: the JobSet controller does not seem to run (no status on JobSet {namespace}/{name} "
                f"after {age:.0f}s); install JobSet (kubectl get pods -n jobset-system), or set cluster.flavor: plain")
