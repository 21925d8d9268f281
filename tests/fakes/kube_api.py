"""FakeKubeApiServer: a FAKE Kubernetes API server (no real cluster can run here).

It implements just the REST endpoints pinpoint.k8s.launch calls through the real `kubernetes`
client: create/read/delete of ConfigMaps, Services, batch/v1 Jobs, kubeflow.org/v1 TFJobs,
jobset.x-k8s.io/v1alpha2 JobSets and trainer.kubeflow.org/v1alpha1 TrainJobs (run by the FAKE
controllers of tests/fakes/jobset_controller.py, with their own scenarios);
list pods by label and read one pod; read a pod's log (honouring `timestamps` and
`sinceSeconds`); list Events (honouring an `involvedObject.*` fieldSelector); read
PersistentVolumeClaims seeded with `add_pvc`. A tiny fake "controller" (standing in for the
Job controller and the Training Operator) turns a created TFJob/Job into pods whose status
advances one step per pod list, sets the workload's status.conditions, and follows a scenario:

  success          Pending -> Running (log lines) -> Succeeded (writes placement.json, see pvc_root)
  image_pull       containers waiting in ImagePullBackOff
  oom              the chief's container terminated OOMKilled (exit 137)
  unschedulable    PodScheduled=False, reason Unschedulable
  unschedulable_recreated
                   Unschedulable for 3 lists, then the pod is deleted and recreated (same name for a
                   TFJob, a NEW uid), Unschedulable for 3 more lists, then scheduled and succeeds
  crash            the chief exits 1 after printing a traceback line
  hang             every pod stays Running forever (one log line per list)
  peer_lost        worker 0 exits 138 (RETRY_EXIT_CODE) after starting; the fake operator deletes it
                   and recreates it (TFJob: same name, new uid; Job: a new pod name), forever; the
                   chief stays Running
  peer_lost_once   as peer_lost, but the recreated worker succeeds, then the chief succeeds
  failed_indexes   (plain Jobs) worker 0 exits 138 and its Job gets condition Failed/FailedIndexes
  tfjob_failed     (TFJob) worker 0 exits 138 and the TFJob gets condition Failed/TFJobFailed
  quota            no pods: the workload gets a Warning Event FailedCreate (Job) / FailedCreatePod
                   (TFJob) 'exceeded quota: gpu-quota ...'
  no_operator      a TFJob gets no status and no pods (the Training Operator is not installed);
                   plain Jobs behave as in success

Faults: `forbid` answers 403 for (verb, resource) pairs, e.g. {("list", "events")} (a bare kind
name such as "ConfigMap" means ("create", "configmaps")); `missing_kinds` answers 404 on create
(CRD absent); `flaky` answers the first N matching requests with 500, e.g.
{"POST tfjobs": 2, "GET pods": 3}, or with another status, "reset" (connection closed without
an answer) or "timeout" (no answer for hang_seconds, then closed) given as {"GET pods": (3, "reset")}.

Launcher pods (`add_pod`) stand for the pod running the pipeline step; `delete_pod` emulates the
garbage collector: objects whose ownerReferences name the deleted pod's uid go with it.

Every request is recorded in `.requests` as (method, path) and in `.queries` as
(method, path, query dict) for assertions.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from copy import deepcopy
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.fakes.jobset_controller import JobSetControllerMixin

ROLE_LABEL = "pinpoint.dev/role"
INSTANCE_LABEL = "app.kubernetes.io/instance"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RETRY_EXIT_CODE = 138
RESET = object()  # close the connection without an answer
TIMEOUT = object()  # answer nothing for hang_seconds, then close the connection
ROUTES = [
    # (regex, kind)
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/configmaps(?:/(?P<name>[^/]+))?$", "ConfigMap"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/services(?:/(?P<name>[^/]+))?$", "Service"),
    (r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?$", "Job"),
    (r"^/apis/kubeflow\.org/v1/namespaces/(?P<ns>[^/]+)/tfjobs(?:/(?P<name>[^/]+))?$", "TFJob"),
    (r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets(?:/(?P<name>[^/]+))?$", "JobSet"),
    (r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/(?P<ns>[^/]+)/trainjobs(?:/(?P<name>[^/]+))?$", "TrainJob"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$", "PodLog"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$", "Pod"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/]+))?$", "Event"),
    (r"^/api/v1/namespaces/(?P<ns>[^/]+)/persistentvolumeclaims(?:/(?P<name>[^/]+))?$", "PersistentVolumeClaim"),
]
RESOURCES = {"ConfigMap": "configmaps", "Service": "services", "Job": "jobs", "TFJob": "tfjobs",
             "JobSet": "jobsets", "TrainJob": "trainjobs",
             "PodLog": "pods/log", "Pod": "pods", "Event": "events", "PersistentVolumeClaim": "persistentvolumeclaims"}
PARSE_BOOL_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool, as the API server
VERBS = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}


def rfc3339nano(ts: float) -> str:
    """Go's time.RFC3339Nano in UTC, as the kubelet writes log timestamps (trailing zeros dropped)."""
    whole = int(ts)
    nanos = int(round((ts - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    base = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{nanos:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


class FakeKubeApiServer(JobSetControllerMixin):
    """A fake API server on 127.0.0.1 (a free port); use as a context manager. JobSets and
    TrainJobs are run by the FAKE controllers of tests/fakes/jobset_controller.py."""

    def __init__(self, scenario: str = "success", *, forbid=(), missing_kinds: tuple[str, ...] = (),
                 flaky: dict | None = None, pvc_root: str | Path | None = None):
        self.scenario = scenario
        self.forbid: set[tuple[str, str]] = {
            ("create", RESOURCES[f]) if isinstance(f, str) else tuple(f) for f in forbid
        }
        self.missing_kinds = set(missing_kinds)  # kinds whose create answers 404 (CRD absent)
        # "METHOD resource" -> [remaining, status or "reset"]
        self.flaky = {k: list(v) if isinstance(v, tuple) else [v, 500] for k, v in (flaky or {}).items()}
        self.pvc_root = Path(pvc_root) if pvc_root else None
        self.objects: dict[tuple[str, str, str], dict] = {}  # (kind, ns, name) -> object
        self.pods: dict[tuple[str, str], dict] = {}  # (ns, name) -> pod made by the fake controller
        self.launcher_pods: dict[tuple[str, str], dict] = {}  # (ns, name) -> pod seeded by a test
        self.pvcs: dict[tuple[str, str], dict] = {}
        self.events: list[dict] = []
        self.logs: dict[str, list[tuple[float, str]]] = {}  # pod uid -> [(time, line)]
        self.log_lines_served: dict[str, int] = {}  # pod uid -> lines returned by all its log reads
        self.requests: list[tuple[str, str]] = []
        self.queries: list[tuple[str, str, dict]] = []
        self.created: list[tuple[str, str, str]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.collected: list[tuple[str, str, str]] = []  # removed by the fake garbage collector
        self.pod_uids: list[str] = []  # every training pod ever made, in order
        self.pod_names: dict[str, str] = {}  # pod uid -> its name
        self.pod_lists = 0
        self.runtimes: dict[str, dict] = {}  # ClusterTrainingRuntimes (add_runtime)
        self.child_jobs: set[tuple[str, str, str]] = set()  # Jobs made by the fake JobSet controller
        self.jobset_restarts: list[tuple[str, str, str]] = []  # (jobset, action, first failed job)
        self.hang_seconds = 1.0  # how long a "timeout" fault keeps the client waiting
        self.lock = threading.Lock()
        self._uids = 0
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> "FakeKubeApiServer":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def setup(self):
                super().setup()
                # Headers and body go out in two writes: without this, Nagle + delayed ACK add 40 ms.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _send(self, result):
                if result is TIMEOUT:
                    time.sleep(fake.hang_seconds)  # longer than the client's request timeout
                if result in (RESET, TIMEOUT):
                    self.close_connection = True
                    return
                code, body, *ctype = result
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype[0] if ctype else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self):
                self._send(fake.handle("GET", self.path, None))

            def do_POST(self):
                self._send(fake.handle("POST", self.path, self._body()))

            def do_DELETE(self):
                self._send(fake.handle("DELETE", self.path, self._body()))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
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
        # The real client retries connection errors; the launcher's own retries are under test.
        conf.retries = 0
        return client.ApiClient(conf)

    # ---- seeding (tests) --------------------------------------------------------------
    def _uid(self, prefix: str = "uid") -> str:
        self._uids += 1
        return f"{prefix}-{self._uids:04d}"

    def add_pod(self, ns: str, name: str, phase: str = "Running") -> str:
        """A pod that is not made by the fake controller (e.g. the launcher step's own pod); its uid."""
        uid = self._uid("launcher")
        self.launcher_pods[(ns, name)] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": {}},
            "spec": {"containers": [{"name": "main", "image": "pipeline-step"}]},
            "status": {"phase": phase},
        }
        return uid

    def delete_pod(self, ns: str, name: str) -> None:
        """Delete a seeded pod and garbage-collect what it owns (as Kubernetes' GC does)."""
        with self.lock:
            pod = self.launcher_pods.pop((ns, name))
            uid = pod["metadata"]["uid"]
            for key, obj in list(self.objects.items()):
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []):
                    self._remove(key)
                    self.collected.append(key)

    def add_object(self, kind: str, ns: str, name: str, owner_pod: str | None = None, **metadata) -> dict:
        """An existing object (e.g. of another run) with an optional ownerReference to a seeded pod."""
        obj = {"apiVersion": "v1", "kind": kind,
               "metadata": {"name": name, "namespace": ns, "uid": self._uid(), **metadata}}
        if owner_pod:
            pod = self.launcher_pods[(ns, owner_pod)]
            obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner_pod,
                                                   "uid": pod["metadata"]["uid"], "controller": False,
                                                   "blockOwnerDeletion": False}]
        self.objects[(kind, ns, name)] = obj
        return obj

    def add_pvc(self, ns: str, name: str, access_modes: list[str]) -> None:
        self.pvcs[(ns, name)] = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "uid": self._uid()},
            "spec": {"accessModes": list(access_modes), "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Bound", "accessModes": list(access_modes)},
        }

    def requests_per_poll(self) -> list[int]:
        """Requests from each pod list (one watch poll) up to the next pod list, in order."""
        starts = [i for i, (m, p) in enumerate(self.requests)
                  if m == "GET" and re.match(r"^/api/v1/namespaces/[^/]+/pods$", p)]
        return [b - a for a, b in zip(starts, starts[1:])]

    def log_lines(self, ns: str, name: str) -> list[str]:
        pod = self.pods.get((ns, name))
        return [line for _, line in self.logs.get(pod["metadata"]["uid"], [])] if pod else []

    # ---- request handling -----------------------------------------------------------
    def handle(self, method: str, raw_path: str, body):
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.requests.append((method, url.path))
            self.queries.append((method, url.path, query))
            for pattern, kind in ROUTES:
                m = re.match(pattern, url.path)
                if m:
                    resource = RESOURCES[kind]
                    verb = VERBS.get(method) or ("list" if m.group("name") is None else "get")
                    fault = self.flaky.get(f"{method} {resource}")
                    if fault and fault[0] > 0:
                        fault[0] -= 1
                        if fault[1] in ("reset", "timeout"):
                            return RESET if fault[1] == "reset" else TIMEOUT
                        return fault[1], _status(fault[1], "InternalError", f"fake: transient {fault[1]}")
                    if (verb, resource) in self.forbid:
                        return 403, _status(403, "Forbidden", f'{resource} is forbidden: User "system:serviceaccount:'
                                            f'{m.group("ns")}:pipeline-runner" cannot {verb} resource "{resource}"')
                    return self._route(method, kind, m.group("ns"), m.group("name"), body, query)
        return 404, _status(404, "NotFound", f"fake: no route for {method} {url.path}")

    def _route(self, method, kind, ns, name, body, query):
        if kind == "PodLog":
            return self._read_log(ns, name, query)
        if kind == "Pod":
            if method == "GET" and name is None:
                self.pod_lists += 1
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self._list_pods(ns, query)}
            if method == "GET":
                pod = self.launcher_pods.get((ns, name)) or self.pods.get((ns, name))
                if pod is None:
                    return 404, _status(404, "NotFound", f'pods "{name}" not found')
                return 200, _visible(pod)
            return 405, _status(405, "MethodNotAllowed", "fake: pods are made by the fake controller")
        if kind == "Event":
            items = [e for e in self.events if e["metadata"]["namespace"] == ns and _fields_match(e, query)]
            return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": deepcopy(items)}
        if kind == "PersistentVolumeClaim":
            if (ns, name) in self.pvcs:
                return 200, self.pvcs[(ns, name)]
            return 404, _status(404, "NotFound", f'persistentvolumeclaims "{name}" not found')
        key = (kind, ns, name or (body or {}).get("metadata", {}).get("name"))
        if method == "POST":
            if kind in self.missing_kinds:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f'{RESOURCES[kind]} "{key[2]}" already exists')
            obj = deepcopy(body)
            obj["metadata"].setdefault("namespace", ns)
            obj["metadata"]["uid"] = self._uid()
            obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
            if kind == "TrainJob":
                refused = self._trainjob_created(obj)
                if refused:
                    return refused
            self.objects[key] = obj
            self.created.append(key)
            if kind in ("TFJob", "Job"):
                self._spawn_pods(kind, obj)
            if kind == "JobSet":
                self._jobset_created(obj)
            return 201, obj
        if method == "GET":
            if key in self.objects:
                return 200, self.objects[key]
            return 404, _status(404, "NotFound", f'{RESOURCES[kind]} "{key[2]}" not found')
        if method == "DELETE":
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'{RESOURCES[kind]} "{key[2]}" not found')
            self._remove(key)
            self.deleted.append(key)
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        return 405, _status(405, "MethodNotAllowed", method)

    def _remove(self, key) -> None:
        obj = self.objects.pop(key)
        self.child_jobs.discard(key)
        # Garbage collection: the owner's pods go with it, and the objects it owns (a JobSet's
        # Service and Jobs, a TrainJob's JobSet) with theirs.
        for pod_key in [k for k, p in self.pods.items() if p["metadata"]["_owner"] == key]:
            del self.pods[pod_key]
        uid = obj["metadata"].get("uid")
        for child in [k for k, o in self.objects.items()
                      if any(r.get("uid") == uid and r.get("controller") for r in o["metadata"].get("ownerReferences") or [])]:
            if child in self.objects:
                self._remove(child)

    def _read_log(self, ns: str, name: str, query: dict):
        pod = self.pods.get((ns, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if pod["status"].get("phase", "Pending") == "Pending":
            return 400, _status(400, "BadRequest",
                                f'container "tensorflow" in pod "{name}" is waiting to start: ContainerCreating')
        lines = self.logs.get(pod["metadata"]["uid"], [])
        if "sinceSeconds" in query:
            cutoff = time.time() - int(query["sinceSeconds"])
            lines = [(t, line) for t, line in lines if t >= cutoff]
        uid = pod["metadata"]["uid"]
        self.log_lines_served[uid] = self.log_lines_served.get(uid, 0) + len(lines)
        stamp = query.get("timestamps") in PARSE_BOOL_TRUE
        return 200, "".join(f"{rfc3339nano(t)} {line}\n" if stamp else f"{line}\n" for t, line in lines), "text/plain"

    # ---- the fake controller ------------------------------------------------------------
    def _spawn_pods(self, kind: str, obj: dict) -> None:
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if kind == "TFJob":
            if self.scenario == "no_operator":
                return
            obj["status"] = {"conditions": [_cond("Created", "TFJobCreated", f"TFJob {ns}/{name} is created.")],
                             "replicaStatuses": {}}
            roles = [
                (rtype.lower(), spec.get("replicas", 1), spec["template"])
                for rtype, spec in obj["spec"]["tfReplicaSpecs"].items()
            ]
        else:
            t = obj["spec"]["template"]
            obj["status"] = {}
            roles = [(t["metadata"]["labels"].get(ROLE_LABEL, "worker"), obj["spec"].get("completions", 1), t)]
        if self.scenario == "quota":
            reason = "FailedCreatePod" if kind == "TFJob" else "FailedCreate"
            role, _, _ = roles[0]
            pod_name = f"{name}-{role}-0" if kind == "TFJob" else f"{name}-0-x7k2p"
            self.events.append({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.17a", "namespace": ns, "uid": self._uid("event")},
                "involvedObject": {"kind": kind, "name": name, "namespace": ns, "uid": obj["metadata"]["uid"],
                                   "apiVersion": obj["apiVersion"]},
                "reason": reason, "type": "Warning", "count": 3,
                "message": f'Error creating: pods "{pod_name}" is forbidden: exceeded quota: gpu-quota, requested: '
                           "nvidia.com/gpu=4, used: nvidia.com/gpu=4, limited: nvidia.com/gpu=4",
                "source": {"component": "job-controller" if kind == "Job" else "tfjob-controller"},
            })
            return
        for role, replicas, template in roles:
            for i in range(replicas):
                self._make_pod(kind, obj, role, i, template, gen=0)

    def _make_pod(self, kind: str, owner: dict, role: str, index: int, template: dict, gen: int) -> dict:
        name, ns = owner["metadata"]["name"], owner["metadata"]["namespace"]
        uid = self._uid("pod")
        if kind == "TFJob":
            pod_name = f"{name}-{role}-{index}"  # the Training Operator reuses the name
            index_labels = {REPLICA_INDEX_LABEL: str(index), REPLICA_TYPE_LABEL: role}
            annotations = {}
        else:
            pod_name = f"{name}-{index}" if gen == 0 else f"{name}-{index}-{uid[-4:]}"
            index_labels = {COMPLETION_INDEX: str(index)}
            annotations = {COMPLETION_INDEX: str(index)}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name, "namespace": ns, "uid": uid,
                "labels": {**template["metadata"].get("labels", {}), ROLE_LABEL: role, **index_labels},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": kind, "name": name,
                                     "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
                "_owner": (kind, ns, name), "_step": 0, "_gen": gen, "_role": role, "_index": index,
                "_template": template,
            },
            "spec": deepcopy(template["spec"]),
            "status": {"phase": "Pending"},
        }
        self.pods[(ns, pod_name)] = pod
        self.pod_uids.append(uid)
        self.pod_names[uid] = pod_name
        return pod

    def _recreate(self, pod: dict) -> dict:
        meta = pod["metadata"]
        del self.pods[(meta["namespace"], meta["name"])]
        owner = self.objects[meta["_owner"]]
        return self._make_pod(meta["_owner"][0], owner, meta["_role"], meta["_index"], meta["_template"],
                              meta["_gen"] + 1)

    def _list_pods(self, ns: str, query: dict) -> list[dict]:
        selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if "=" in kv)
        for pod in [p for (pns, _), p in self.pods.items() if pns == ns]:
            if pod["metadata"].get("_group"):
                self._advance_group(pod)
            else:
                self._advance(pod)
        for key, obj in list(self.objects.items()):
            if key[0] in ("TFJob", "Job") and key[1] == ns and obj.get("status") is not None and key not in self.child_jobs:
                self._reconcile(key, obj)
            elif key[0] == "JobSet" and key[1] == ns and key in self.objects and obj.get("status") is not None:
                self._reconcile_jobset(key, obj)
        for key, obj in list(self.objects.items()):
            if key[0] == "TrainJob" and key[1] == ns and obj.get("status") is not None:
                self._reconcile_trainjob(key, obj)
        return [_visible(p) for (pns, _), p in self.pods.items()
                if pns == ns and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]

    def _log(self, pod: dict, *lines: str) -> None:
        entries = self.logs.setdefault(pod["metadata"]["uid"], [])
        for line in lines:
            t = time.time()
            if entries and t <= entries[-1][0]:
                t = entries[-1][0] + 1e-6
            entries.append((t, line))

    def _succeed(self, pod: dict, cs) -> None:
        pod["status"].update(phase="Succeeded", containerStatuses=cs({"terminated": {"exitCode": 0, "reason": "Completed"}}))
        self._write_placement(pod)

    def _write_placement(self, pod: dict) -> None:
        """Emulate the claim: write placement.json where the container's --out points, through the
        volumeMount named 'runs' (its subPath inside the claim, pvc_root standing in for the claim)."""
        folder = self._claim_folder(pod)
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "placement.json").write_text(json.dumps({"pod": pod["metadata"]["name"]}))

    def _claim_folder(self, pod: dict) -> Path | None:
        """The folder of the claim (pvc_root) the container's --out is, or None (no claim, not on it)."""
        if self.pvc_root is None:
            return None
        c = pod["spec"]["containers"][0]
        args = [*(c.get("command") or []), *(c.get("args") or [])]
        out = next((a.split("=", 1)[1] for a in args if a.startswith("--out=")), None)
        if out is None and "--out" in args and args.index("--out") + 1 < len(args):
            out = args[args.index("--out") + 1]
        mount = next((m for m in c.get("volumeMounts") or [] if m["name"] == "runs"), None)
        volume = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == "runs"), {})
        if out is None or mount is None or "persistentVolumeClaim" not in volume:
            return None
        rel = os.path.relpath(out, mount["mountPath"])
        if rel.startswith(".."):
            return None  # --out is not on the claim: the file stays in the container
        return self.pvc_root / (mount.get("subPath") or "") / rel

    def _advance(self, pod: dict) -> None:
        """One scenario step per list call (deterministic, no timing)."""
        meta, status = pod["metadata"], pod["status"]
        step = meta["_step"] = meta["_step"] + 1
        name, c, gen = meta["name"], pod["spec"]["containers"][0], meta["_gen"]
        role, index = meta["_role"], meta["_index"]
        is_primary = role in ("chief", "worker") and index == 0 and (
            role == "chief" or not any(p["metadata"]["_role"] == "chief" for p in self.pods.values()))
        is_worker0 = role == "worker" and index == 0
        scenario = self.scenario

        def cs(state: dict, ready=False, last=None) -> list[dict]:
            entry = {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                     "restartCount": 0, "started": ready, "state": state}
            if last:
                entry["lastState"] = last
            return [entry]

        if status.get("phase") in ("Succeeded", "Failed") and not (
                scenario in ("peer_lost", "peer_lost_once") and is_worker0 and status.get("phase") == "Failed"):
            return
        if scenario == "unschedulable" or (scenario == "unschedulable_recreated" and (gen == 0 or step <= 3)):
            if scenario == "unschedulable_recreated" and gen == 0 and step == 4:
                self._recreate(pod)["metadata"]["_step"] = 1
                return
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]
            return
        if scenario == "unschedulable_recreated":
            step -= 3  # scheduled now: continue like success
            status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        if scenario == "image_pull":
            status["containerStatuses"] = cs({"waiting": {
                "reason": "ImagePullBackOff" if step > 1 else "ErrImagePull",
                "message": f'Back-off pulling image "{c["image"]}"'}})
            return
        if step == 1:
            status.update(phase="Pending", containerStatuses=cs({"waiting": {"reason": "ContainerCreating"}}))
        elif step == 2:
            status.update(phase="Running", containerStatuses=cs({"running": {"startedAt": "2026-01-01T00:00:01Z"}}, True))
            self._log(pod, f"{name} starting" + (f" (attempt {gen + 1})" if gen else ""), "step 1 loss 2.30")
        elif scenario == "hang":
            self._log(pod, f"step {step} loss 1.00")
        elif scenario in ("peer_lost", "peer_lost_once", "failed_indexes", "tfjob_failed") and is_worker0 and (
                scenario != "peer_lost_once" or gen == 0):
            if status.get("phase") == "Failed":  # the operator's ExitCode policy: recreate
                self._recreate(pod)
                return
            self._log(pod, f"peer lost; exiting {RETRY_EXIT_CODE} to be restarted")
            status.update(phase="Failed", containerStatuses=cs(
                {"terminated": {"exitCode": RETRY_EXIT_CODE, "reason": "Error"}}))
        elif scenario in ("peer_lost", "failed_indexes", "tfjob_failed") and role == "chief":
            pass  # keeps Running while its peer restarts
        elif scenario == "peer_lost_once" and role == "chief":
            peers = [p for p in self.pods.values() if p["metadata"]["_role"] != "chief"]
            if all(p["status"].get("phase") == "Succeeded" for p in peers):
                self._log(pod, "done")
                self._succeed(pod, cs)
        elif scenario == "oom" and is_primary:
            status.update(phase="Failed", containerStatuses=cs(
                {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
        elif scenario == "crash" and is_primary:
            self._log(pod, "Traceback (most recent call last):", "ValueError: boom")
            status.update(phase="Failed", containerStatuses=cs({"terminated": {"exitCode": 1, "reason": "Error"}}))
        else:
            if step == 3:
                self._log(pod, "step 2 loss 1.10", "done")
            self._succeed(pod, cs)

    def _reconcile(self, key, obj: dict) -> None:
        """The workload's status.conditions, from its pods (Job controller / Training Operator)."""
        kind, ns, name = key
        pods = [p for p in self.pods.values() if p["metadata"]["_owner"] == key]
        conds = obj["status"].setdefault("conditions", [])
        if any(c["type"] in ("Failed", "Complete", "Succeeded") for c in conds):
            return
        worker0_failed = any(p["metadata"]["_role"] == "worker" and p["metadata"]["_index"] == 0
                             and p["status"].get("phase") == "Failed" for p in pods)
        if kind == "Job":
            if self.scenario == "failed_indexes" and worker0_failed:
                obj["status"]["failedIndexes"] = "0"
                conds.append(_cond("FailureTarget", "FailedIndexes", "Job has failed indexes"))
                conds.append(_cond("Failed", "FailedIndexes", "Job has failed indexes"))
            elif pods and all(p["status"].get("phase") == "Succeeded" for p in pods):
                conds.append(_cond("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"))
                conds.append(_cond("Complete", "CompletionsReached", "Reached expected number of succeeded pods"))
            return
        if self.scenario == "tfjob_failed" and worker0_failed:
            conds.append(_cond("Failed", "TFJobFailed", f"TFJob {ns}/{name} has failed because 1 Worker replica(s) failed."))
            return
        if any(p["status"].get("phase") == "Running" for p in pods) and not any(c["type"] == "Running" for c in conds):
            conds.append(_cond("Running", "TFJobRunning", f"TFJob {ns}/{name} is running."))
        roles = {p["metadata"]["_role"] for p in pods}
        primary = [p for p in pods if p["metadata"]["_role"] == ("chief" if "chief" in roles else "worker")]
        if primary and all(p["status"].get("phase") == "Succeeded" for p in primary):
            conds.append(_cond("Succeeded", "TFJobSucceeded", f"TFJob {ns}/{name} successfully completed."))


def _cond(type_: str, reason: str, message: str) -> dict:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:02Z", "lastUpdateTime": "2026-01-01T00:00:02Z"}


def _visible(pod: dict) -> dict:
    out = deepcopy({k: v for k, v in pod.items() if k != "metadata"})
    out["metadata"] = deepcopy({k: v for k, v in pod["metadata"].items() if not k.startswith("_")})
    return out


def _fields_match(obj: dict, query: dict) -> bool:
    """fieldSelector 'a.b=c,d=e' (only '=' / '==')."""
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        path, value = re.split(r"==?", term, maxsplit=1)
        node = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if str(node) != value:
            return False
    return True
