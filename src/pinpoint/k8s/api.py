"""Every Kubernetes API call of the launch step, through one retrying wrapper.

Transient answers (HTTP 429/500/502/503/504, timeouts, refused or reset connections) are retried
with exponential backoff; 403 becomes one line naming the verb and the resource to grant; any
other status the caller did not ask to handle becomes one line naming the call.
"""

from __future__ import annotations

import time
from typing import Callable

from pinpoint.errors import TrainingFailed, first_line
from pinpoint.provision.flavours import FLAVOURS

RETRYABLE_STATUS = (429, 500, 502, 503, 504)
# kind -> (resource, API group, version) of what the run folder's manifests hold: the ConfigMap,
# Secrets and Services, and each flavour's workload (its class knows its API).
KINDS = {
    "ConfigMap": ("configmaps", "", "v1"),
    "Secret": ("secrets", "", "v1"),
    "Service": ("services", "", "v1"),
    **{f.kind: f.api for f in FLAVOURS.values()},
}
BUILTIN_GROUPS = ("", "batch")  # served by CoreV1Api and BatchV1Api
# Kinds served by CustomResourceDefinitions (the CustomObjectsApi).
CUSTOM_KINDS = tuple(kind for kind, (_, group, _) in KINDS.items() if group not in BUILTIN_GROUPS)
RBAC_HINT = "apply docker/rbac.yaml (Role + RoleBinding for the pipeline's service account)"


def forbidden_line(verb: str, resource: str, namespace: str) -> str:
    return (f"kubernetes: forbidden to {verb} {resource} in namespace {namespace}; {RBAC_HINT} "
            f"or grant its service account '{verb}' on '{resource}' there")




def api_message(err) -> str:
    """The Status message of an ApiException, else its reason."""
    import json

    try:
        return first_line(json.loads(err.body).get("message")) or str(err.reason)
    except (TypeError, ValueError, AttributeError):
        return first_line(err.body) or str(err.reason)


class KubeApi:
    """The calls the launcher makes, each retried on transient failures."""

    def __init__(self, api_client, namespace: str, *, attempts: int = 5, base_delay: float = 0.5,
                 request_timeout: float = 30.0, log: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep):
        from kubernetes import client

        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.attempts, self.base_delay, self.request_timeout = max(1, attempts), base_delay, request_timeout
        self.log, self.sleep = log, sleep

    # ---- the wrapper ----------------------------------------------------------------
    def call(self, verb: str, resource: str, fn: Callable, *args, handle: tuple[int, ...] = (),
             namespace: str | None = None, what: str = "", **kwargs):
        """fn(*args, **kwargs) with retries. ApiExceptions whose status is in `handle` are raised
        for the caller; everything else that does not succeed ends in one TrainingFailed line."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        ns = namespace or self.namespace
        call = f"{verb} {resource}{' ' + what if what else ''} in namespace {ns}"
        for attempt in range(1, self.attempts + 1):
            try:
                # A (connect, read) tuple: the client ignores a float _request_timeout (it checks for int).
                return fn(*args, _request_timeout=(self.request_timeout, self.request_timeout), **kwargs)
            except ApiException as err:
                if err.status in handle:
                    raise
                if err.status == 403:
                    raise TrainingFailed(forbidden_line(verb, resource, ns)) from None
                if err.status not in RETRYABLE_STATUS:
                    raise TrainingFailed(
                        f"kubernetes: {call} answered HTTP {err.status} {err.reason} ({api_message(err)[:160]}); "
                        "check the API server and the service account's permissions"
                    ) from None
                last = f"HTTP {err.status} {err.reason}"
                if attempt == self.attempts:
                    raise TrainingFailed(
                        f"kubernetes: {call} failed {self.attempts} times (last: {last}); the API server is "
                        "overloaded or restarting; retry the step later"
                    ) from None
            except HTTPError as err:
                last = first_line(getattr(err, "reason", None) or err)[:160]
                if attempt == self.attempts:
                    host = getattr(self.client.configuration, "host", "?")
                    raise TrainingFailed(
                        f"kubernetes: API server {host} unreachable ({last}) after {self.attempts} attempts to "
                        f"{call}; check the kubeconfig/in-cluster credentials and the network"
                    ) from None
            delay = self.base_delay * 2 ** (attempt - 1)
            self.log(f"[k8s] {call}: {last}; retry {attempt}/{self.attempts - 1} in {delay:.2f}s")
            self.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- objects of the run folder ------------------------------------------------------
    def _object_call(self, verb: str, kind: str, namespace: str, target) -> tuple[Callable, tuple]:
        """The client method and arguments to `verb` (create/read/delete) one object of `kind`:
        `target` is the document to create, else the object's name."""
        resource, group, version = KINDS[kind]
        if kind in CUSTOM_KINDS:
            custom_verb = "get" if verb == "read" else verb
            return (getattr(self.custom, f"{custom_verb}_namespaced_custom_object"),
                    (group, version, namespace, resource, target))
        api = self.batch if group == "batch" else self.core
        snake = "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in kind).lstrip("_")  # ConfigMap -> config_map
        args = (namespace, target) if verb == "create" else (target, namespace)
        return getattr(api, f"{verb}_namespaced_{snake}"), args

    def create(self, doc: dict, namespace: str, handle: tuple[int, ...] = ()) -> dict:
        fn, args = self._object_call("create", doc["kind"], namespace, doc)
        out = self.call("create", KINDS[doc["kind"]][0], fn, *args, handle=handle, namespace=namespace)
        return out if isinstance(out, dict) else self.client.sanitize_for_serialization(out)

    def get(self, kind: str, name: str, namespace: str, handle: tuple[int, ...] = (404,)) -> dict:
        """The object as a plain dict (camelCase keys, as in the manifests)."""
        fn, args = self._object_call("read", kind, namespace, name)
        out = self.call("get", KINDS[kind][0], fn, *args, handle=handle, namespace=namespace, what=name)
        return out if isinstance(out, dict) else self.client.sanitize_for_serialization(out)

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        """Delete (background propagation: the garbage collector removes the pods); False if gone."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        body = client.V1DeleteOptions(propagation_policy="Background")
        fn, args = self._object_call("delete", kind, namespace, name)
        try:
            self.call("delete", KINDS[kind][0], fn, *args, body=body, handle=(404,), namespace=namespace, what=name)
        except ApiException:
            return False
        return True

    # ---- pods, logs, events, claims -------------------------------------------------------
    def list_pods(self, label_selector: str) -> list:
        return self.call("list", "pods", self.core.list_namespaced_pod, self.namespace,
                         label_selector=label_selector).items

    def read_pod(self, name: str, namespace: str | None = None):
        """The pod, or None if it does not exist."""
        from kubernetes.client.rest import ApiException

        try:
            return self.call("get", "pods", self.core.read_namespaced_pod, name, namespace or self.namespace,
                             handle=(404,), namespace=namespace, what=name)
        except ApiException:
            return None

    def read_log(self, name: str, container: str, since_seconds: int | None) -> str | None:
        """The pod's log with timestamps (None while the container has not started)."""
        from kubernetes.client.rest import ApiException

        kwargs: dict = {"container": container, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        try:
            return self.call("get", "pods/log", self.core.read_namespaced_pod_log, name, self.namespace,
                             handle=(400, 404), what=name, **kwargs)
        except ApiException:
            return None

    def list_events(self, involved_uid: str | None = None, field_selector: str | None = None) -> list:
        """Events of one object (by uid), or those matching a field selector."""
        selector = field_selector or f"involvedObject.uid={involved_uid}"
        return self.call("list", "events", self.core.list_namespaced_event, self.namespace,
                         field_selector=selector).items

    def read_pvc(self, name: str):
        """The PersistentVolumeClaim, or None if it does not exist."""
        from kubernetes.client.rest import ApiException

        try:
            return self.call("get", "persistentvolumeclaims", self.core.read_namespaced_persistent_volume_claim,
                             name, self.namespace, handle=(404,), what=name)
        except ApiException:
            return None
