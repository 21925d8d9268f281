"""FakeKubeApiServer: a FAKE Kubernetes API server (no real cluster can run here).

It implements just the REST endpoints pinpoint.k8s.launch calls through the real `kubernetes`
client: create/read/delete of ConfigMaps, Services, batch/v1 Jobs and kubeflow.org/v1 TFJobs;
list pods by label; read a pod's log. A tiny fake "controller" turns a created TFJob/Job into pods
whose status then advances one step per pod list, following a scenario:

  success        Pending -> Running (log lines) -> Succeeded
  image_pull     containers waiting in ImagePullBackOff
  oom            the chief's container terminated OOMKilled (exit 137)
  unschedulable  PodScheduled=False, reason Unschedulable
  crash          the chief exits 1 after printing a traceback line

Every request is recorded in `.requests` as (method, path) for assertions.
"""

from __future__ import annotations

import json
import re
import threading
from copy import deepcopy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

ROLE_LABEL = "pinpoint.dev/role"
ROUTES = [
    # (regex, kind)
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/configmaps(?:/(?P<name>[^/]+))?$", "ConfigMap"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/services(?:/(?P<name>[^/]+))?$", "Service"),
    (r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?$", "Job"),
    (r"^/apis/kubeflow\.org/v1/namespaces/(?P<ns>[^/]+)/tfjobs(?:/(?P<name>[^/]+))?$", "TFJob"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$", "PodLog"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$", "Pod"),
]


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}


class FakeKubeApiServer:
    """A fake API server on 127.0.0.1 (a free port); use as a context manager."""

    def __init__(self, scenario: str = "success", *, forbid: tuple[str, ...] = (), missing_kinds: tuple[str, ...] = ()):
        self.scenario = scenario
        self.forbid = set(forbid)  # kinds whose create answers 403
        self.missing_kinds = set(missing_kinds)  # kinds whose create answers 404 (CRD absent)
        self.objects: dict[tuple[str, str, str], dict] = {}  # (kind, ns, name) -> object
        self.pods: dict[tuple[str, str], dict] = {}  # (ns, name) -> pod
        self.logs: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.created: list[tuple[str, str, str]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> "FakeKubeApiServer":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body, content_type: str = "application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self):
                self._send(*fake.handle("GET", self.path, None))

            def do_POST(self):
                self._send(*fake.handle("POST", self.path, self._body()))

            def do_DELETE(self):
                self._send(*fake.handle("DELETE", self.path, self._body()))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self):
        """A real kubernetes.client.ApiClient pointed at this fake."""
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.url
        # The real client retries connection errors; nothing to retry against a local fake.
        conf.retries = 0
        return client.ApiClient(conf)

    # ---- request handling -----------------------------------------------------------
    def handle(self, method: str, raw_path: str, body):
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.requests.append((method, url.path))
            for pattern, kind in ROUTES:
                m = re.match(pattern, url.path)
                if m:
                    return self._route(method, kind, m.group("ns"), m.group("name"), body, query)
        return 404, _status(404, "NotFound", f"fake: no route for {method} {url.path}")

    def _route(self, method, kind, ns, name, body, query):
        if kind == "PodLog":
            if (ns, name) not in self.pods:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            return 200, self.logs.get(name, ""), "text/plain"
        if kind == "Pod":
            if method == "GET" and name is None:
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self._list_pods(ns, query)}
            return 405, _status(405, "MethodNotAllowed", "fake: pods are made by the fake controller")
        key = (kind, ns, name or (body or {}).get("metadata", {}).get("name"))
        if method == "POST":
            if kind in self.forbid:
                return 403, _status(403, "Forbidden", f"{kind.lower()}s is forbidden")
            if kind in self.missing_kinds:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f'{kind} "{key[2]}" already exists')
            obj = deepcopy(body)
            obj["metadata"].setdefault("namespace", ns)
            obj["metadata"]["uid"] = f"uid-{len(self.created)}"
            obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
            self.objects[key] = obj
            self.created.append(key)
            if kind in ("TFJob", "Job"):
                self._spawn_pods(kind, obj)
            return 201, obj
        if method == "GET":
            if key in self.objects:
                return 200, self.objects[key]
            return 404, _status(404, "NotFound", f'{kind} "{key[2]}" not found')
        if method == "DELETE":
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'{kind} "{key[2]}" not found')
            del self.objects[key]
            self.deleted.append(key)
            # Garbage collection: the owner's pods go with it.
            for pod_key in [k for k, p in self.pods.items() if p["metadata"].get("_owner") == key]:
                del self.pods[pod_key]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        return 405, _status(405, "MethodNotAllowed", method)

    # ---- the fake controller ------------------------------------------------------------
    def _spawn_pods(self, kind: str, obj: dict) -> None:
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if kind == "TFJob":
            roles = [
                (rtype.lower(), spec.get("replicas", 1), spec["template"])
                for rtype, spec in obj["spec"]["tfReplicaSpecs"].items()
            ]
        else:
            t = obj["spec"]["template"]
            roles = [(t["metadata"]["labels"].get(ROLE_LABEL, "worker"), obj["spec"].get("completions", 1), t)]
        for role, replicas, template in roles:
            for i in range(replicas):
                pod_name = f"{name}-{role}-{i}" if kind == "TFJob" else f"{name}-{i}"
                container = template["spec"]["containers"][0]
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "namespace": ns,
                        "labels": {**template["metadata"].get("labels", {}), ROLE_LABEL: role},
                        "_owner": (kind, ns, name),
                        "_step": 0,
                    },
                    "spec": {"containers": [{"name": container["name"], "image": container["image"],
                                             "resources": container.get("resources", {})}]},
                    "status": {"phase": "Pending"},
                }
                self.pods[(ns, pod_name)] = pod

    def _list_pods(self, ns: str, query: dict) -> list[dict]:
        selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if "=" in kv)
        out = []
        for (pns, _), pod in self.pods.items():
            if pns != ns or any(pod["metadata"]["labels"].get(k) != v for k, v in selector.items()):
                continue
            self._advance(pod)
            visible = deepcopy(pod)
            visible["metadata"] = {k: v for k, v in visible["metadata"].items() if not k.startswith("_")}
            out.append(visible)
        return out

    def _advance(self, pod: dict) -> None:
        """One scenario step per list call (deterministic, no timing)."""
        meta, status = pod["metadata"], pod["status"]
        step = meta["_step"] = meta["_step"] + 1
        name, c = meta["name"], pod["spec"]["containers"][0]
        is_primary = meta["labels"].get(ROLE_LABEL) in ("chief", "worker") and name.endswith("-0")

        def cs(state: dict, ready=False, last=None) -> list[dict]:
            entry = {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                     "restartCount": 0, "started": ready, "state": state}
            if last:
                entry["lastState"] = last
            return [entry]

        if self.scenario == "unschedulable":
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]
            return
        if self.scenario == "image_pull":
            status["containerStatuses"] = cs({"waiting": {
                "reason": "ImagePullBackOff" if step > 1 else "ErrImagePull",
                "message": f'Back-off pulling image "{c["image"]}"'}})
            return
        if step == 1:
            status.update(phase="Pending", containerStatuses=cs({"waiting": {"reason": "ContainerCreating"}}))
        elif step == 2:
            status.update(phase="Running", containerStatuses=cs({"running": {"startedAt": "2026-01-01T00:00:01Z"}}, True))
            self.logs[name] = f"{name} starting\nstep 1 loss 2.30\n"
        elif self.scenario == "oom" and is_primary:
            status.update(phase="Failed", containerStatuses=cs(
                {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
        elif self.scenario == "crash" and is_primary:
            self.logs[name] += "Traceback (most recent call last):\nValueError: boom\n"
            status.update(phase="Failed", containerStatuses=cs({"terminated": {"exitCode": 1, "reason": "Error"}}))
        elif self.scenario in ("success", "oom", "crash"):
            if step == 3:
                self.logs[name] += "step 2 loss 1.10\ndone\n"
            status.update(phase="Succeeded", containerStatuses=cs({"terminated": {"exitCode": 0, "reason": "Completed"}}))
