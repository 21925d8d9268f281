"""Run a provisioned cluster on Kubernetes: create the run folder's manifests, watch the pods and
the TFJob/Jobs/JobSet/TrainJob, stream the pods' logs, turn failures into one clear line, and
always clean up.

A JobSet or TrainJob restarts the whole group itself (its failurePolicy): for those flavours the
launch step only watches (pinpoint.k8s.watch.GroupWatcher: the conditions, status.restarts, the
chief's log across restarts), with a constant number of API requests per poll.

Refused before anything is created (one line each): a cluster.namespace other than the step
pod's; cluster.runs_volume_claim unset; a run folder outside RUNS_MOUNT (/runs, where the steps
and the pods mount the claim); for multi-process strategies, a claim that does not exist or is
not ReadWriteMany; a name taken by another run's live objects (an object of the same name owned
by a launcher pod that is still Running, or by no launcher pod). Leftovers of a dead attempt
(owner pod gone, Succeeded or Failed) are deleted and recreated.

Failures recognised while running (each a one-line TrainingFailed naming the object, the reason
and a fix): image pull errors, container config errors (CreateContainerConfigError), pods failed
before a container ran (e.g. Evicted), OOMKilled containers, unschedulable pods (after a grace period,
so a cluster autoscaler can add a node), permanent container exits (codes 1-127; codes >= 128 are
retried by the operator/podFailurePolicy), a replica restarted more than train.max_restarts
times, a TFJob or Job with condition Failed (BackoffLimitExceeded, FailedIndexes,
PodFailurePolicy, DeadlineExceeded, TFJobFailed...), pods that cannot be created (FailedCreate
Events, e.g. an exceeded ResourceQuota, after a grace period), a TFJob the Training Operator never
picks up, a TFJob/Job deleted by someone else while running, the overall timeout
(cluster.deadline_s), API answers 403 (naming the verb and resource to grant) or other
unexpected statuses (naming the call), an unreachable API server or transient errors (429/5xx,
timeouts, reset connections) that outlast the retries, and SIGTERM (the step's pod is deleted or
evicted: exit 143 after cleaning up). The watch loop is pinpoint.k8s.watch, the API calls and
their retries pinpoint.k8s.api.

Inside a pod, every object created gets an ownerReference to the step's pod, so the garbage
collector removes the TFJob/Jobs/JobSet/TrainJob if the step's pod goes away without cleaning up.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import yaml

from pinpoint.errors import ConfigError, ProvisionError, TrainingFailed
from pinpoint.k8s.api import KubeApi, api_message, first_line
from pinpoint.k8s.options import Created, LaunchOptions
from pinpoint.k8s.watch import GroupWatcher, Watcher
from pinpoint.provision.flavour import Flavour
from pinpoint.provision.flavours import BY_KIND, WORKLOAD_KINDS, flavour_of_docs
from pinpoint.provision.namespace import namespace_of, pod_namespace
from pinpoint.runfolder import MANIFESTS_DIR, RUNS_MOUNT
from pinpoint.signals import Terminated, sigterm_raises

# Kinds in creation order: what pods need (config, DNS names) exists before the pods do.
CREATE_ORDER = {"ConfigMap": 0, "Secret": 0, "Service": 1, **dict.fromkeys(WORKLOAD_KINDS, 2)}
__all__ = ["Created", "LaunchOptions", "launch_manifests", "launch_training"]
LAUNCH_ID_ANNOTATION = "pinpoint.dev/launch-id"
SIGTERM_EXIT_CODE = 143


class StoppedBySignal(TrainingFailed):
    """SIGTERM (the step's pod deleted or evicted): cleaned up, exit 128 + 15."""

    exit_code = SIGTERM_EXIT_CODE


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


def launcher_pod_name(sa_namespace_file: Path | None = None) -> str | None:
    """$HOSTNAME (a pod's name) when this process runs in a pod, else None. Read at call time."""
    if pod_namespace(sa_namespace_file) is None:
        return None
    return os.environ.get("HOSTNAME") or None


def _expected_pods(docs: list[dict]) -> int:
    return sum(BY_KIND[d["kind"]].pod_count(d) for d in docs if d["kind"] in BY_KIND)


class Launcher:
    """Create -> watch -> (fail) -> clean up, against one namespace."""

    def __init__(self, api_client, name: str, namespace: str, flavour: Flavour,
                 options: LaunchOptions | None = None):
        self.name, self.namespace, self.flavour = name, namespace, flavour
        self.opts = options or LaunchOptions()
        self.api = KubeApi(api_client, namespace, attempts=self.opts.retry_attempts,
                           base_delay=self.opts.retry_base_seconds,
                           request_timeout=self.opts.request_timeout_seconds, log=self.opts.log)
        self.created: list[Created] = []
        self.launch_id = uuid.uuid4().hex
        self.owner: dict | None = None

    # ---- owner ---------------------------------------------------------------------
    def resolve_owner(self) -> None:
        """The ownerReference of the step's pod (opts.owner_pod), if the API knows that pod."""
        if not self.opts.owner_pod:
            return
        pod = self.api.read_pod(self.opts.owner_pod)
        if pod is None:
            self.opts.log(f"[k8s] pod {self.namespace}/{self.opts.owner_pod} not found; "
                          "the created objects get no ownerReference")
            return
        self.owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid,
                      "blockOwnerDeletion": False, "controller": False}

    # ---- create / delete -----------------------------------------------------------
    def _create_one(self, doc: dict, primary: bool) -> None:
        from kubernetes.client.rest import ApiException

        kind, name = doc["kind"], doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace") or self.namespace
        try:
            obj = self.api.create(doc, ns, handle=(404, 409, 422))
        except ApiException as err:
            if err.status == 409:
                self._already_exists(doc, ns, primary)
                return
            raise TrainingFailed(self._create_error(doc, ns, err)) from None
        self._record(doc, ns, obj, primary)
        self.opts.log(f"[k8s] created {kind} {ns}/{name}")

    def _record(self, doc: dict, ns: str, obj: dict, primary: bool) -> None:
        uid = (obj.get("metadata") or {}).get("uid") or ""
        self.created.append(Created(doc["kind"], doc["metadata"]["name"], ns, doc["apiVersion"], uid, primary,
                                    self.opts.clock()))

    def _already_exists(self, doc: dict, ns: str, primary: bool) -> None:
        """409: replace a dead attempt's leftover; refuse (and leave alone) anything else."""
        kind, name = doc["kind"], doc["metadata"]["name"]
        existing = self._get(kind, name, ns)
        if existing is None:  # deleted meanwhile
            return self._create_one(doc, primary)
        meta = existing.get("metadata") or {}
        if (meta.get("annotations") or {}).get(LAUNCH_ID_ANNOTATION) == self.launch_id:
            self._record(doc, ns, existing, primary)  # ours: a retried create that had succeeded
            return None
        ref = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Pod"), None)
        state = "is this one"
        if ref is None:
            owned = "no launcher pod owns it"
        elif self.owner and ref.get("uid") == self.owner["uid"]:
            owned = None  # an earlier attempt in this very pod
        else:
            pod = self.api.read_pod(ref["name"], ns)
            phase = pod.status.phase if pod is not None and pod.metadata.uid == ref.get("uid") else None
            owned = f"owned by pod {ref['name']}, {phase}" if phase not in (None, "Succeeded", "Failed") else None
            state = phase or "gone"
        if owned or ref is None:
            raise TrainingFailed(
                f"kubernetes: {kind} {ns}/{name} already exists ({owned}) — another run uses this name; wait for it, "
                f"delete it with `kubectl delete {kind.lower()} -n {ns} {name}`, or give this run its own name"
            )
        self.opts.log(f"[k8s] {kind} {ns}/{name} is left over by a dead attempt (launcher pod {ref['name']} "
                      f"{state}); replacing it")
        self.api.delete(kind, name, ns)
        self._wait_gone(kind, name, ns)
        obj = self.api.create(doc, ns)
        self._record(doc, ns, obj, primary)
        self.opts.log(f"[k8s] created {kind} {ns}/{name}")
        return None

    def _get(self, kind: str, name: str, ns: str) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            return self.api.get(kind, name, ns)
        except ApiException:
            return None

    def create(self, docs: list[dict]) -> None:
        workloads = [d for d in docs if d["kind"] in WORKLOAD_KINDS]
        for doc in docs:
            doc = {**doc, "metadata": {**doc["metadata"]}}
            meta = doc["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), LAUNCH_ID_ANNOTATION: self.launch_id}
            if self.owner:
                meta["ownerReferences"] = [*(meta.get("ownerReferences") or []), dict(self.owner)]
            primary = doc["kind"] in WORKLOAD_KINDS and self.flavour.is_primary(doc, workloads)
            self._create_one(doc, primary)

    def _wait_gone(self, kind: str, name: str, ns: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._get(kind, name, ns) is None:
                return
            time.sleep(self.opts.poll_seconds)
        raise TrainingFailed(f"kubernetes: {kind} {ns}/{name} still exists {timeout:.0f}s after deleting it "
                             f"(a finalizer?); check `kubectl get {kind.lower()} -n {ns} {name} -o yaml`")

    def cleanup(self) -> list[Created]:
        """Delete everything this launcher created, newest first; never raises."""
        if self.opts.keep:
            self.opts.log(f"[k8s] keeping {len(self.created)} object(s) (keep=True)")
            return []
        deleted = []
        for obj in reversed(self.created):
            try:
                self.api.delete(obj.kind, obj.name, obj.namespace)
                deleted.append(obj)
            except Exception as err:  # noqa: BLE001 - cleanup must try every object
                self.opts.log(f"[k8s] could not delete {obj.kind} {obj.namespace}/{obj.name}: {first_line(err)[:160]}")
        self.opts.log(f"[k8s] cleaned up {len(deleted)} object(s)")
        return deleted

    # ---- watch ---------------------------------------------------------------------
    def wait(self, expected_pods: int) -> None:
        workloads = [c for c in self.created if c.kind in WORKLOAD_KINDS]
        # A JobSet's controller restarts the group (failurePolicy): watch it, do not count pod restarts.
        watcher = GroupWatcher if self.flavour.restarts_group else Watcher
        watcher(self.api, self.name, self.opts, self.flavour, workloads, expected_pods).wait()

    def _create_error(self, doc: dict, ns: str, err) -> str:
        kind, name = doc["kind"], doc["metadata"]["name"]
        line = self.flavour.create_error(err.status, api_message(err), ns, name) if kind in WORKLOAD_KINDS else None
        if line:
            return line
        if err.status == 404:
            return f"kubernetes: namespace '{ns}' not found while creating {kind} {name}; create it or fix cluster.namespace"
        return f"kubernetes: {kind} {ns}/{name} rejected as invalid ({api_message(err)[:160]}); rerun provision"


def with_parent_run(doc: dict, parent_run_id: str | None) -> dict:
    """Add `--parent-run-id` to the workload's `pinpoint train` containers (its flavour knows
    where they are), so the pods' MLflow runs are children of the pipeline's parent run."""
    if not parent_run_id or doc["kind"] not in WORKLOAD_KINDS:
        return doc
    return BY_KIND[doc["kind"]].with_parent_run(doc, parent_run_id)


def launch_manifests(api_client, run_dir: Path, name: str, namespace: str,
                     options: LaunchOptions | None = None, *, parent_run_id: str | None = None) -> int:
    """Create the run folder's manifests, wait for the chief, clean up; 0 or TrainingFailed.
    In the main thread, SIGTERM cleans up and raises StoppedBySignal (exit code 143)."""
    from kubernetes.client.rest import ApiException

    docs = [with_parent_run(d, parent_run_id) for d in load_manifests(run_dir)]
    launcher = Launcher(api_client, name, namespace, flavour_of_docs(docs), options)
    with sigterm_raises() as guard:
        try:
            launcher.resolve_owner()
            launcher.create(docs)
            launcher.wait(_expected_pods(docs))
            launcher.opts.log(f"[k8s] {name}: training finished")
            return 0
        except Terminated:
            deleted = launcher.cleanup()
            raise StoppedBySignal(f"kubernetes: {name} stopped by SIGTERM (run terminated or pod evicted); "
                                  f"deleted {len(deleted)} object(s)") from None
        except ApiException as err:  # a status a caller let through and did not handle
            raise TrainingFailed(f"kubernetes: HTTP {err.status} {err.reason} while running {name} "
                                 f"({api_message(err)[:160]}); check the service account's permissions") from None
        finally:
            if guard.armed:  # not cleaned up above: do it now, and let no SIGTERM interrupt it
                guard.disarm()
                launcher.cleanup()


def check_run_folder(run_dir: Path, runs_mount: str | Path, claim: str, name: str) -> Path:
    """The run folder must be on the claim (under runs_mount), where the training pods write."""
    root, path = Path(runs_mount).resolve(), Path(run_dir).resolve()
    if root not in path.parents:
        raise ConfigError(
            f"run_dir: got '{run_dir}', outside {runs_mount} where this step and the training pods mount "
            f"cluster.runs_volume_claim '{claim}' (the pods could not write there); put the run folder under "
            f"{runs_mount}/, e.g. {runs_mount}/{name}"
        )
    return path


def check_claim(api: KubeApi, claim: str, strategy: str) -> None:
    """A multi-process run's pods land on several nodes: the claim must be ReadWriteMany."""
    pvc = api.read_pvc(claim)
    ns = api.namespace
    if pvc is None:
        raise ConfigError(
            f"cluster.runs_volume_claim: PersistentVolumeClaim {ns}/{claim} not found; create it "
            f"(accessModes: [ReadWriteMany]) in namespace {ns} or fix the name"
        )
    modes = list(pvc.spec.access_modes or []) if pvc.spec else []
    if "ReadWriteMany" not in modes:
        raise ConfigError(
            f"cluster.runs_volume_claim: PersistentVolumeClaim {ns}/{claim} has accessModes {modes}; {strategy} "
            "runs pods on several nodes that all mount it; use a ReadWriteMany claim (NFS, CephFS, Filestore, EFS...)"
        )


def launch_training(cfg, run_dir, *, parent_run_id: str | None = None, kubeconfig: str | None = None,
                    options: LaunchOptions | None = None, api_client=None, runs_mount: str | Path = RUNS_MOUNT) -> int:
    """The pipeline's train step with launch='kubernetes' (in-cluster credentials in a pod).
    cfg sets the options' max_restarts, unschedulable grace and timeout; api_client and
    runs_mount are for tests (default: credentials from the environment, /runs)."""
    from pinpoint.config import MULTI_PROCESS_STRATEGIES
    from pinpoint.provision.manifests import check_manifest_inputs

    namespace = namespace_of(cfg.cluster)
    claim = cfg.cluster.runs_volume_claim
    if not claim:
        raise ConfigError(
            "cluster.runs_volume_claim: got None; the training pods must write the run folder "
            "to a PVC this step also mounts; set cluster.runs_volume_claim (ReadWriteMany)"
        )
    # What provision only warned about (it still serves local runs) stops a launch: credentials
    # the ConfigMap would carry, an image a real cluster cannot pull.
    check_manifest_inputs(cfg)
    run_dir = check_run_folder(Path(run_dir), runs_mount, claim, cfg.name)
    opts = options or LaunchOptions()
    opts = replace(opts, max_restarts=cfg.train.max_restarts,
                   unschedulable_grace_seconds=cfg.cluster.unschedulable_grace_s,
                   timeout_seconds=float(cfg.cluster.deadline_s),
                   owner_pod=opts.owner_pod or launcher_pod_name())
    client = api_client or api_client_from_env(kubeconfig)
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES:
        check_claim(KubeApi(client, namespace, attempts=opts.retry_attempts, base_delay=opts.retry_base_seconds,
                            request_timeout=opts.request_timeout_seconds, log=opts.log),
                    claim, cfg.train.strategy)
    return launch_manifests(client, run_dir, cfg.name, namespace, opts, parent_run_id=parent_run_id)


if __name__ == "__main__":  # pragma: no cover - manual use: python -m pinpoint.k8s.launch RUN_DIR
    from pinpoint.config import load_config

    run = Path(sys.argv[1])
    sys.exit(launch_training(load_config(run / "config.yaml"), run))
