"""One class per workload kind (cluster.flavor): the interface every flavour implements.

A flavour owns what differs between a TFJob, plain Indexed Jobs, a JobSet and a TrainJob: the
TF_CONFIG hosts of its pods, its manifests and their pod count, where its pods' containers are
(for the parent run id), who restarts what, the line for a create the API refuses, and the
watch hooks the launch step's watcher (pinpoint.k8s.watch) calls. The registry of instances is
pinpoint.provision.flavours; nothing else switches on the flavour's name or kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar

from pinpoint.config import ClusterConfig, Config
from pinpoint.provision.names import CONTAINER
from pinpoint.provision.tasks import Task

POD_LOGS_FIX = "see the pod logs above"


class Flavour(ABC):
    """A flavour class declares its identity in its header:
    `class TFJobFlavour(Flavour, name="tfjob", kind="TFJob", api_version=..., tf_cluster=k8s_cluster)`."""

    name: ClassVar[str]  # cluster.flavor
    kind: ClassVar[str]  # the kind of its workload object(s)
    api_version: ClassVar[str]  # the apiVersion of that kind, as its manifests write it
    # The cluster restarts the whole group itself (a JobSet's failurePolicy): the launch step only
    # watches the group (pinpoint.k8s.watch.GroupWatcher) instead of counting pod restarts.
    restarts_group: ClassVar[bool] = False
    container: ClassVar[str] = CONTAINER  # whose log the watcher streams
    # Conditions of the workload that mean the run is done.
    done_conditions: ClassVar[tuple[str, ...]] = ("Complete", "Succeeded")
    # The line for a 404 on create: the kind's CustomResourceDefinition is not installed.
    not_installed: ClassVar[str | None] = None

    # (name, cluster) -> the `cluster` dict of its pods' TF_CONFIG (pinpoint.provision.tfconfig).
    tf_cluster: ClassVar[Callable[[str, ClusterConfig], dict[str, list[str]]]]

    def __init_subclass__(cls, name: str | None = None, kind: str | None = None, api_version: str | None = None,
                          tf_cluster: Callable | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
        if kind is not None:
            cls.kind = kind
        if api_version is not None:
            cls.api_version = api_version
        if tf_cluster is not None:
            cls.tf_cluster = staticmethod(tf_cluster)

    @property
    def api(self) -> tuple[str, str, str]:
        """(resource, API group, version) of its kind: what the Kubernetes client calls it."""
        group, _, version = self.api_version.rpartition("/")
        return f"{self.kind.lower()}s", group, version

    # ---- provision -----------------------------------------------------------------------
    def cluster(self, cfg: Config) -> dict[str, list[str]]:
        """The `cluster` dict of the pods' TF_CONFIG: role -> the hosts its pods get."""
        return type(self).tf_cluster(cfg.name, cfg.cluster)

    def longest_name(self, cfg: Config, role: str, replicas: int) -> tuple[str, str]:
        """(the longest DNS name made for `role`, what it names): it must be a DNS-1035 label.
        Here the Service of the role's last task, `<name>-<role>-<i>` (the Training Operator's)."""
        return f"{cfg.name}-{role}-{replicas - 1}", "a Service name"

    @abstractmethod
    def manifests(self, cfg: Config, tasks: list[Task], run_rel: str | None) -> dict[str, list[dict]]:
        """File name -> documents of its workload (the ConfigMap is every flavour's)."""

    def restart(self) -> dict[str, str]:
        """Who retries a failed task and who enforces train.max_restarts (cluster_spec.json)."""
        return {
            "retried_by": ("the Training Operator's ExitCode policy (IsRetryableExitCode, release >= 1.7) or the "
                           "plain Jobs' podFailurePolicy (DisruptionTarget ignored first, then FailJob on 1..127)"),
            "max_restarts_enforced_by": ("the launch step, counting each replica's pod recreations (TFJob "
                                         "backoffLimit does not count ExitCode restarts)"),
        }

    def notes(self, cfg: Config) -> list[str]:
        """What its manifests cannot express by themselves (cluster_spec.json's notes)."""
        return []

    # ---- launch ------------------------------------------------------------------------------
    @abstractmethod
    def pod_count(self, doc: dict) -> int:
        """How many pods its workload document makes."""

    @abstractmethod
    def pod_templates(self, doc: dict) -> list[dict]:
        """The pod templates of its workload document (where the `pinpoint train` commands are)."""

    def is_primary(self, doc: dict, workloads: list[dict]) -> bool:
        """Whether this workload document's completion (of the run's `workloads`) means the run is done."""
        return True

    def with_parent_run(self, doc: dict, parent_run_id: str) -> dict:
        """Add `--parent-run-id` to its `pinpoint train` containers (the pods' MLflow runs become
        children of the pipeline's parent run)."""
        for template in self.pod_templates(doc):
            for container in template["spec"]["containers"]:
                cmd = container.get("command") or []
                if "train" in cmd and "--parent-run-id" not in cmd:
                    container["command"] = [*cmd, "--parent-run-id", parent_run_id]
        return doc

    def create_error(self, status: int, message: str, namespace: str, name: str) -> str | None:
        """One line for a create the API refused with `status`, None when it is not this kind's."""
        return self.not_installed if status == 404 else None

    # ---- watch hooks (pinpoint.k8s.watch) ---------------------------------------------------
    def failed_fix(self, reason: str | None) -> str:
        """The fix for its workload's Failed condition with `reason`."""
        return POD_LOGS_FIX

    def controller_missing(self, namespace: str, name: str, age: float) -> str | None:
        """The line when its controller made no status after the grace period (None: the kind is
        built in, there is no controller to miss)."""
        return None
