"""Run a provisioned cluster on Kubernetes: create the run folder's manifests, watch the pods,
stream their logs, turn pod failures into one clear line, and always clean up.

Failures recognised (each a one-line TrainingFailed naming the pod, the reason and a fix):
image pull errors, OOMKilled containers, unschedulable pods (after a grace period, so a cluster
autoscaler can add a node), permanent container exits, and the overall timeout.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from pinpoint.errors import ProvisionError, TrainingFailed
from pinpoint.provision.spec import is_retryable_exit_code
from pinpoint.runfolder import MANIFESTS_DIR

INSTANCE_LABEL = "app.kubernetes.io/instance"
ROLE_LABEL = "pinpoint.dev/role"
CONTAINER = "tensorflow"
IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
# Kinds in creation order: what pods need (config, DNS names) exists before the pods do.
CREATE_ORDER = {"ConfigMap": 0, "Secret": 0, "Service": 1, "Job": 2, "TFJob": 2}


@dataclass
class LaunchOptions:
    poll_seconds: float = 2.0
    timeout_seconds: float = 24 * 3600.0
    unschedulable_grace_seconds: float = 120.0
    image_pull_grace_seconds: float = 30.0
    keep: bool = False  # leave the objects for debugging (they are still listed)
    log: Callable[[str], None] = field(default=lambda line: print(line, flush=True))


@dataclass(frozen=True)
class Created:
    kind: str
    name: str
    namespace: str
    api_version: str


def load_manifests(run_dir: Path) -> list[dict]:
    """Every document under run_dir/manifests/, in creation order."""
    folder = Path(run_dir) / MANIFESTS_DIR
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise ProvisionError(f"run_dir: no manifests in {folder}; run the provision step first")
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    unknown = sorted({d.get("kind", "?") for d in docs} - set(CREATE_ORDER))
    if unknown:
        raise ProvisionError(f"manifests: kind(s) {unknown} in {folder} are not launched by pinpoint; remove them")
    return sorted(docs, key=lambda d: CREATE_ORDER[d["kind"]])


def api_client_from_env(kubeconfig: str | None = None):
    """In-cluster credentials when running in a pod (the pipeline's train step), else kubeconfig."""
    from kubernetes import client, config

    try:
        if kubeconfig:
            raise config.ConfigException("kubeconfig given")
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=kubeconfig)
        except Exception as err:  # noqa: BLE001 - any config problem is the same user error
            raise ProvisionError(
                f"kubernetes: no in-cluster credentials and no usable kubeconfig ({str(err).splitlines()[0][:160]}); "
                "set KUBECONFIG or run inside the cluster"
            ) from None
    return client.ApiClient()


class Launcher:
    """Create -> watch -> (fail) -> clean up, against one namespace."""

    def __init__(self, api_client, name: str, namespace: str, options: LaunchOptions | None = None):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.name, self.namespace = name, namespace
        self.opts = options or LaunchOptions()
        self.created: list[Created] = []
        self._log_offsets: dict[str, int] = {}
        self._first_seen: dict[str, float] = {}

    # ---- create / delete -----------------------------------------------------------
    def _create_one(self, doc: dict) -> None:
        kind, ns = doc["kind"], doc["metadata"].get("namespace") or self.namespace
        name = doc["metadata"]["name"]
        if kind == "ConfigMap":
            self.core.create_namespaced_config_map(ns, doc)
        elif kind == "Secret":
            self.core.create_namespaced_secret(ns, doc)
        elif kind == "Service":
            self.core.create_namespaced_service(ns, doc)
        elif kind == "Job":
            self.batch.create_namespaced_job(ns, doc)
        elif kind == "TFJob":
            group, version = doc["apiVersion"].split("/")
            self.custom.create_namespaced_custom_object(group, version, ns, "tfjobs", doc)
        self.created.append(Created(kind, name, ns, doc["apiVersion"]))
        self.opts.log(f"[k8s] created {kind} {ns}/{name}")

    def create(self, docs: list[dict]) -> None:
        from kubernetes.client.rest import ApiException

        for doc in docs:
            try:
                self._create_one(doc)
            except ApiException as err:
                if err.status == 409:
                    # Left over by an interrupted earlier attempt of this run: replace it.
                    self.opts.log(f"[k8s] {doc['kind']} {doc['metadata']['name']} exists (an earlier attempt); replacing it")
                    self._delete(Created(doc["kind"], doc["metadata"]["name"],
                                         doc["metadata"].get("namespace") or self.namespace, doc["apiVersion"]))
                    self._wait_gone(doc["kind"], doc["metadata"]["name"])
                    self._create_one(doc)
                else:
                    raise TrainingFailed(_create_error(doc, err)) from None

    def _delete(self, obj: Created) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        # Background propagation: the Job/TFJob's pods are removed by the garbage collector.
        body = client.V1DeleteOptions(propagation_policy="Background")
        try:
            if obj.kind == "ConfigMap":
                self.core.delete_namespaced_config_map(obj.name, obj.namespace, body=body)
            elif obj.kind == "Secret":
                self.core.delete_namespaced_secret(obj.name, obj.namespace, body=body)
            elif obj.kind == "Service":
                self.core.delete_namespaced_service(obj.name, obj.namespace, body=body)
            elif obj.kind == "Job":
                self.batch.delete_namespaced_job(obj.name, obj.namespace, body=body)
            elif obj.kind == "TFJob":
                group, version = obj.api_version.split("/")
                self.custom.delete_namespaced_custom_object(group, version, obj.namespace, "tfjobs", obj.name, body=body)
        except ApiException as err:
            if err.status != 404:
                raise

    def _wait_gone(self, kind: str, name: str, timeout: float = 60.0) -> None:
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if kind == "TFJob":
                    self.custom.get_namespaced_custom_object("kubeflow.org", "v1", self.namespace, "tfjobs", name)
                elif kind == "Job":
                    self.batch.read_namespaced_job(name, self.namespace)
                elif kind == "Service":
                    self.core.read_namespaced_service(name, self.namespace)
                else:
                    self.core.read_namespaced_config_map(name, self.namespace)
            except ApiException as err:
                if err.status == 404:
                    return
                raise
            time.sleep(self.opts.poll_seconds)

    def cleanup(self) -> list[Created]:
        """Delete everything this launcher created, newest first; never raises."""
        if self.opts.keep:
            self.opts.log(f"[k8s] keeping {len(self.created)} object(s) (keep=True)")
            return []
        deleted = []
        for obj in reversed(self.created):
            try:
                self._delete(obj)
                deleted.append(obj)
            except Exception as err:  # noqa: BLE001 - cleanup must try every object
                self.opts.log(f"[k8s] could not delete {obj.kind} {obj.namespace}/{obj.name}: {str(err).splitlines()[0][:160]}")
        self.opts.log(f"[k8s] cleaned up {len(deleted)} object(s)")
        return deleted

    # ---- watch ---------------------------------------------------------------------
    def pods(self) -> list:
        return self.core.list_namespaced_pod(self.namespace, label_selector=f"{INSTANCE_LABEL}={self.name}").items

    def stream_logs(self, pod) -> None:
        """Print the new part of a started pod's log, each line prefixed with the pod name."""
        from kubernetes.client.rest import ApiException

        if pod.status.phase not in ("Running", "Succeeded", "Failed"):
            return
        name = pod.metadata.name
        try:
            text = self.core.read_namespaced_pod_log(name, self.namespace, container=CONTAINER)
        except ApiException:
            return  # the container may not have started yet; the next poll retries
        start = self._log_offsets.get(name, 0)
        if len(text) < start:  # a recreated pod with the same name: start over
            start = 0
        new = text[start:]
        complete = new.rsplit("\n", 1)[0] + "\n" if "\n" in new else ""
        for line in complete.splitlines():
            self.opts.log(f"[{name}] {line}")
        self._log_offsets[name] = start + len(complete)

    def diagnose(self, pod, now: float) -> str | None:
        """One line if this pod shows a failure that will not fix itself, else None."""
        name, status = pod.metadata.name, pod.status
        self._first_seen.setdefault(name, now)
        age = now - self._first_seen[name]
        for cs in status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in IMAGE_PULL_REASONS:
                if waiting.reason != "ErrImagePull" or age >= self.opts.image_pull_grace_seconds:
                    return (
                        f"pod {name}: image '{cs.image}' cannot be pulled ({waiting.reason}: "
                        f"{_first_line(waiting.message)}); push it to a registry the cluster can reach or fix cluster.image"
                    )
            if waiting and waiting.reason == "CreateContainerConfigError":
                return f"pod {name}: container config error ({_first_line(waiting.message)}); check the ConfigMap/Secret it mounts"
            for state in (cs.state, cs.last_state):
                term = state.terminated if state else None
                if term and term.reason == "OOMKilled":
                    limit = _memory_limit(pod)
                    return (
                        f"pod {name}: container {cs.name} was OOMKilled (memory limit {limit}); "
                        "raise cluster.memory or lower train.batch_size"
                    )
            term = cs.state.terminated if cs.state else None
            if term and term.exit_code != 0 and not is_retryable_exit_code(term.exit_code):
                return (
                    f"pod {name}: container {cs.name} exited with code {term.exit_code}"
                    f"{' (' + term.reason + ')' if term.reason and term.reason != 'Error' else ''}; see its log above"
                )
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                if age >= self.opts.unschedulable_grace_seconds:
                    return (
                        f"pod {name}: cannot be scheduled for {age:.0f}s ({_first_line(cond.message)}); "
                        "request fewer GPUs/CPU/memory per replica (cluster.*), fix node_selector/tolerations, or add nodes"
                    )
        if status.phase == "Failed" and not status.container_statuses:
            return f"pod {name}: failed ({status.reason or 'unknown'}: {_first_line(status.message)})"
        return None

    def wait(self) -> None:
        """Until the chief (or, without one, every worker) succeeded; raise TrainingFailed on a failure."""
        deadline = time.monotonic() + self.opts.timeout_seconds
        seen_roles: set[str] = set()
        while True:
            now = time.monotonic()
            pods = self.pods()
            for pod in pods:
                self.stream_logs(pod)
            for pod in pods:
                reason = self.diagnose(pod, now)
                if reason:
                    raise TrainingFailed(reason)
            by_role: dict[str, list] = {}
            for pod in pods:
                by_role.setdefault((pod.metadata.labels or {}).get(ROLE_LABEL, "worker"), []).append(pod)
            seen_roles |= set(by_role)
            primary = by_role.get("chief") or by_role.get("worker") or []
            if primary and all(p.status.phase == "Succeeded" for p in primary):
                return
            if now > deadline:
                raise TrainingFailed(
                    f"kubernetes: {self.name} did not finish within {self.opts.timeout_seconds:.0f}s "
                    f"(pods: {_phases(pods)}); raise the timeout or look at the pod logs"
                )
            time.sleep(self.opts.poll_seconds)


def with_parent_run(doc: dict, parent_run_id: str | None) -> dict:
    """Add `--parent-run-id` to the `pinpoint train` containers of a TFJob/Job, so the pods'
    MLflow runs are children of the pipeline's parent run."""
    if not parent_run_id or doc["kind"] not in ("TFJob", "Job"):
        return doc
    templates = (
        [r["template"] for r in doc["spec"]["tfReplicaSpecs"].values()]
        if doc["kind"] == "TFJob"
        else [doc["spec"]["template"]]
    )
    for template in templates:
        for container in template["spec"]["containers"]:
            cmd = container.get("command") or []
            if "train" in cmd and "--parent-run-id" not in cmd:
                container["command"] = [*cmd, "--parent-run-id", parent_run_id]
    return doc


def launch_manifests(api_client, run_dir: Path, name: str, namespace: str,
                     options: LaunchOptions | None = None, *, parent_run_id: str | None = None) -> int:
    """Create the run folder's manifests, wait for the chief, clean up; 0 or TrainingFailed."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    docs = [with_parent_run(d, parent_run_id) for d in load_manifests(run_dir)]
    launcher = Launcher(api_client, name, namespace, options)
    try:
        launcher.create(docs)
        launcher.wait()
        launcher.opts.log(f"[k8s] {name}: training finished")
        return 0
    except HTTPError as err:
        host = getattr(api_client.configuration, "host", "?")
        raise TrainingFailed(
            f"kubernetes: API server {host} unreachable ({_first_line(getattr(err, 'reason', None) or err)[:160]}); "
            "check the kubeconfig/in-cluster credentials and the network"
        ) from None
    except ApiException as err:
        raise TrainingFailed(f"kubernetes: HTTP {err.status} {err.reason} while watching {name}; "
                             "check the service account's permissions (pods, pods/log)") from None
    finally:
        launcher.cleanup()


def launch_training(cfg, run_dir, *, parent_run_id: str | None = None, kubeconfig: str | None = None,
                    options: LaunchOptions | None = None) -> int:
    """The pipeline's train step with launch='kubernetes' (in-cluster credentials in a pod)."""
    from pinpoint.errors import ConfigError

    if not cfg.cluster.runs_volume_claim:
        raise ConfigError(
            "config error: cluster.runs_volume_claim: got None; the training pods must write the run folder "
            "to a PVC this step also mounts; set cluster.runs_volume_claim (ReadWriteMany)"
        )
    return launch_manifests(api_client_from_env(kubeconfig), Path(run_dir), cfg.name, cfg.cluster.namespace, options,
                            parent_run_id=parent_run_id)


# ---- helpers ------------------------------------------------------------------------
def _first_line(text: Any) -> str:
    return (str(text or "").strip().splitlines() or [""])[0][:200]


def _memory_limit(pod) -> str:
    for c in pod.spec.containers if pod.spec else []:
        limits = (c.resources.limits if c.resources else None) or {}
        if "memory" in limits:
            return str(limits["memory"])
    return "unset"


def _phases(pods) -> str:
    return ", ".join(f"{p.metadata.name}={p.status.phase}" for p in pods) or "none created"


def _create_error(doc: dict, err) -> str:
    kind, name = doc["kind"], doc["metadata"]["name"]
    ns = doc["metadata"].get("namespace", "?")
    if err.status == 403:
        return (f"kubernetes: forbidden to create {kind} {ns}/{name}; grant the pipeline's service account "
                f"create/watch/delete on {kind.lower()}s and pods/log in namespace {ns}")
    if err.status == 404 and kind == "TFJob":
        return ("kubernetes: the TFJob resource (kubeflow.org/v1 tfjobs) is not installed; install the Kubeflow "
                "Training Operator or set cluster.flavor: plain")
    if err.status == 404:
        return f"kubernetes: namespace '{ns}' not found while creating {kind} {name}; create it or fix cluster.namespace"
    if err.status == 422:
        return f"kubernetes: {kind} {ns}/{name} rejected as invalid ({_first_line(err.body)[:160]}); rerun provision"
    return f"kubernetes: creating {kind} {ns}/{name} failed with HTTP {err.status} {err.reason}"


if __name__ == "__main__":  # pragma: no cover - manual use: python -m pinpoint.k8s.launch RUN_DIR
    from pinpoint.config import load_config

    run = Path(sys.argv[1])
    sys.exit(launch_training(load_config(run / "config.yaml"), run))
