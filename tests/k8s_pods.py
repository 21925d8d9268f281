"""Kubernetes pod specs -> `podman run` arguments, for tests that run provisioned manifests.

Generic over the pod spec (nothing here knows Pinpoint's command line): an Indexed Job becomes one
pod per completion index, with what the Job controller and the kubelet add (hostname
`<job>-<index>`, the completion-index annotation and label, `$(VAR)` expansion, the governing
Service's DNS names); each pod then becomes `podman run` arguments:

  command/args        entrypoint + arguments, `$(VAR)` expanded from the container's env ($$ -> $)
  env                 value; valueFrom.fieldRef (metadata.annotations[...]/labels[...], name,
                      namespace, status.podIP, spec.hostname); configMapKeyRef/secretKeyRef
                      (optional: true and absent -> left out, as the kubelet does)
  envFrom             configMapRef/secretRef (optional honoured), prefix
  securityContext     runAsUser/runAsGroup -> --user, fsGroup/supplementalGroups -> --group-add,
                      runAsNonRoot (checked), readOnlyRootFilesystem -> --read-only,
                      capabilities.drop/add -> --cap-drop/--cap-add,
                      allowPrivilegeEscalation: false -> --security-opt no-new-privileges
  resources.limits    cpu -> --cpus, memory -> --memory (extended resources: unsupported)
  volumes             emptyDir (Memory at /dev/shm -> --shm-size, else a tmpfs with sizeLimit);
                      configMap/secret -> a host folder of its data files, read-only;
                      persistentVolumeClaim -> the claim's host folder (shared by every pod),
                      subPath/subPathExpr honoured (created, owned by the pod's user)
  hostname/subdomain  --hostname; every DNS name the Services give the pod -> --add-host on its IP
  ports               --expose (one network: every port is reachable; hostPort unsupported)
  workingDir, imagePullPolicy -> --workdir, --pull

Anything else the converter meets raises Unsupported, so a manifest change shows up as a clear
failure instead of a silently different container.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from pinpoint.provision.quantity import parse_quantity

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_DOMAIN = "cluster.local"
_VAR = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")
_PULL = {"Always": "always", "IfNotPresent": "missing", "Never": "never"}
# Pod/container fields that do not change what runs in a single-node podman test.
_IGNORED_POD = {"restartPolicy", "subdomain", "hostname", "nodeSelector", "tolerations", "affinity",
                "terminationGracePeriodSeconds", "priorityClassName", "schedulerName", "imagePullSecrets",
                "serviceAccountName", "automountServiceAccountToken", "securityContext", "containers", "volumes",
                "activeDeadlineSeconds", "enableServiceLinks", "dnsPolicy", "topologySpreadConstraints"}
_IGNORED_CONTAINER = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
                      "resources", "securityContext", "volumeMounts", "workingDir", "terminationMessagePolicy",
                      "terminationMessagePath", "readinessProbe", "livenessProbe", "startupProbe"}


class Unsupported(Exception):
    """A pod spec field this converter does not translate."""


def load_docs(*paths: Path) -> list[dict]:
    docs: list[dict] = []
    for p in paths:
        docs += [d for d in yaml.safe_load_all(Path(p).read_text()) if d]
    return docs


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
    references to undefined variables are left as they are."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


@dataclass
class Pod:
    """One pod as the Job controller would create it."""

    name: str  # also its hostname (`<job>-<index>` for an Indexed Job)
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict
    ip: str | None = None

    @property
    def hostname(self) -> str:
        return self.spec.get("hostname", self.name)

    @property
    def container(self) -> dict:
        containers = self.spec["containers"]
        if len(containers) != 1 or self.spec.get("initContainers"):
            raise Unsupported(f"pod {self.name}: {len(containers)} containers / init containers; one container only")
        return containers[0]


def indexed_job_pods(job: dict) -> list[Pod]:
    """The pods of an Indexed Job, one per completion index."""
    if job.get("kind") != "Job" or job["spec"].get("completionMode") != "Indexed":
        raise Unsupported(f"{job.get('kind')} {job['metadata']['name']}: only Indexed Jobs")
    meta, spec = job["metadata"], job["spec"]
    pods = []
    for i in range(int(spec.get("completions", 1))):
        tmpl = copy.deepcopy(spec["template"])
        tm = tmpl.get("metadata", {})
        name = f"{meta['name']}-{i}"
        labels = {**tm.get("labels", {}), COMPLETION_INDEX: str(i), "batch.kubernetes.io/job-name": meta["name"],
                  "job-name": meta["name"]}
        annotations = {**tm.get("annotations", {}), COMPLETION_INDEX: str(i)}
        pod_spec = tmpl["spec"]
        pod_spec.setdefault("hostname", name)  # what the Job controller sets for Indexed Jobs
        pods.append(Pod(name, meta.get("namespace", "default"), labels, annotations, pod_spec))
    return pods


JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


def jobset_children(jobset: dict, restarts: int = 0) -> tuple[list[dict], list[dict]]:
    """What the JobSet controller makes of a JobSet (v0.9.1, jobset_controller.go): per
    replicatedJob, `replicas` Jobs `<jobset>-<rjob>-<jobIdx>` whose pods carry the JobSet labels
    and, with network.enableDNSHostnames, the subdomain; and the headless Service named the
    subdomain (default: the JobSet's name) selecting the JobSet's pods. `restarts` is the
    restart attempt the Jobs belong to (status.restarts)."""
    meta, spec = jobset["metadata"], jobset["spec"]
    name, ns = meta["name"], meta.get("namespace", "default")
    net = spec.get("network") or {}
    dns = net.get("enableDNSHostnames", True)
    subdomain = net.get("subdomain") or name
    jobs = []
    for rjob in spec["replicatedJobs"]:
        for idx in range(int(rjob.get("replicas", 1))):
            labels = {JOBSET_NAME: name, "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                      "jobset.sigs.k8s.io/job-index": str(idx), RESTART_ATTEMPT: str(restarts)}
            tmpl = copy.deepcopy(rjob["template"])
            job_spec = tmpl["spec"]
            job_spec.setdefault("completionMode", "Indexed")  # the JobSet webhook's default
            pod_meta = job_spec["template"].setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
            if dns:
                job_spec["template"]["spec"]["subdomain"] = subdomain
            jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": f"{name}-{rjob['name']}-{idx}", "namespace": ns,
                                      "labels": {**((tmpl.get("metadata") or {}).get("labels") or {}), **labels}},
                         "spec": job_spec})
    services = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": subdomain, "namespace": ns},
                 "spec": {"clusterIP": "None", "selector": {JOBSET_NAME: name},
                          "publishNotReadyAddresses": net.get("publishNotReadyAddresses", True)}}] if dns else []
    return jobs, services


def dns_names(pod: Pod, services: list[dict], domain: str | None = None) -> list[str]:
    """Every name cluster DNS resolves to this pod: headless Services selecting it (`<svc>.<ns>.svc`
    and shorter forms) and, for its subdomain's Service, `<hostname>.<subdomain>.<ns>.svc`."""
    domain = domain or DEFAULT_DOMAIN
    names: list[str] = []

    def add(base: str) -> None:
        for n in (base, f"{base}.{domain}"):
            if n not in names:
                names.append(n)

    for svc in services:
        if svc.get("kind") != "Service" or svc["metadata"].get("namespace", "default") != pod.namespace:
            continue
        s, sel = svc["metadata"]["name"], svc["spec"].get("selector") or {}
        if svc["spec"].get("clusterIP") != "None":
            raise Unsupported(f"Service {s}: only headless Services (clusterIP: None)")
        if not sel or any(pod.labels.get(k) != v for k, v in sel.items()):
            continue
        if s == pod.spec.get("subdomain"):
            add(f"{pod.hostname}.{s}.{pod.namespace}.svc")
            continue  # the subdomain's own name resolves to every pod: not one pod's alias
        add(f"{s}.{pod.namespace}.svc")
        names += [n for n in (f"{s}.{pod.namespace}", s) if n not in names]
    return names


@dataclass
class Converter:
    """Pod -> podman run arguments. `claims`: claimName -> host folder standing in for the volume;
    `configmaps`/`secrets`: the ConfigMap/Secret documents of the namespace; `volume_root`: where
    the configMap/secret folders are written."""

    volume_root: Path
    claims: dict[str, Path]
    configmaps: list[dict] = field(default_factory=list)
    secrets: list[dict] = field(default_factory=list)
    env_overrides: dict[str, str] = field(default_factory=dict)  # replaces a manifest env var's value
    extra_env: dict[str, str] = field(default_factory=dict)  # appended when the manifest lacks the var
    # The node's settings, not the pod's (a kubelet/runtime gives every container these): e.g. no
    # per-container pids limit and no RLIMIT_NPROC, where podman's defaults here have both.
    node_args: list[str] = field(default_factory=list)
    enforce_limits: bool = True  # False where podman cannot set cgroup limits (then noted, not enforced)
    notes: list[str] = field(default_factory=list)

    # ---- lookups ------------------------------------------------------------------------------
    def _object(self, kind: str, name: str, namespace: str) -> dict | None:
        pool = self.configmaps if kind == "ConfigMap" else self.secrets
        for d in pool:
            if d["metadata"]["name"] == name and d["metadata"].get("namespace", "default") == namespace:
                return d
        return None

    def _data(self, kind: str, name: str, namespace: str) -> dict[str, str] | None:
        obj = self._object(kind, name, namespace)
        if obj is None:
            return None
        data = dict(obj.get("data") or {})
        if kind == "Secret":
            import base64

            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(obj.get("stringData") or {})
        return data

    # ---- env ------------------------------------------------------------------------------------
    def _field(self, pod: Pod, path: str) -> str:
        m = _FIELD.match(path)
        if m:
            source = pod.annotations if m.group(1) == "annotations" else pod.labels
            if m.group(2) not in source:
                raise Unsupported(f"fieldRef {path}: pod {pod.name} has no such {m.group(1)[:-1]}")
            return source[m.group(2)]
        simple = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "spec.hostname": pod.hostname,
                  "status.podIP": pod.ip or "", "spec.nodeName": "podman"}
        if path in simple:
            return simple[path]
        raise Unsupported(f"fieldRef {path}")

    def _key_ref(self, kind: str, ref: dict, pod: Pod, var: str) -> str | None:
        data = self._data(kind, ref["name"], pod.namespace)
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                self.notes.append(f"{pod.name}: {var} left out ({kind} {ref['name']} key {ref['key']} absent, optional)")
                return None
            raise Unsupported(f"{pod.name}: env {var} needs {kind} {ref['name']} key {ref['key']}, which is absent "
                              "(the kubelet would not start the container: CreateContainerConfigError)")
        return data[ref["key"]]

    def env(self, pod: Pod) -> dict[str, str]:
        c = pod.container
        env: dict[str, str] = {}
        for src in c.get("envFrom", []):
            kind, ref = ("ConfigMap", src["configMapRef"]) if "configMapRef" in src else ("Secret", src.get("secretRef"))
            if ref is None:
                raise Unsupported(f"envFrom {src}")
            data = self._data(kind, ref["name"], pod.namespace)
            if data is None:
                if ref.get("optional"):
                    self.notes.append(f"{pod.name}: envFrom {kind} {ref['name']} absent (optional)")
                    continue
                raise Unsupported(f"{pod.name}: envFrom {kind} {ref['name']} is absent and not optional")
            env.update({src.get("prefix", "") + k: v for k, v in data.items()})
        for e in c.get("env", []):
            name = e["name"]
            if "value" in e:
                value = expand(str(e["value"]), env)
            elif "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    value = self._field(pod, vf["fieldRef"]["fieldPath"])
                elif "secretKeyRef" in vf:
                    value = self._key_ref("Secret", vf["secretKeyRef"], pod, name)
                elif "configMapKeyRef" in vf:
                    value = self._key_ref("ConfigMap", vf["configMapKeyRef"], pod, name)
                else:
                    raise Unsupported(f"env {name}: valueFrom {sorted(vf)}")
                if value is None:
                    continue
            else:
                value = ""
            if name in self.env_overrides:
                self.notes.append(f"{pod.name}: env {name}={self.env_overrides[name]} (manifest: {value})")
                value = self.env_overrides[name]
            env[name] = value
        for name, value in self.extra_env.items():
            if name not in env:
                self.notes.append(f"{pod.name}: env {name}={value} added (not in the manifest)")
                env[name] = value
        return env

    # ---- volumes --------------------------------------------------------------------------------
    def _uid_gid(self, pod: Pod) -> tuple[int | None, int | None]:
        psc, csc = pod.spec.get("securityContext") or {}, pod.container.get("securityContext") or {}
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup"))
        return uid, gid

    def _files(self, pod: Pod, vol: dict, kind: str, source: dict) -> Path | None:
        name = source.get("name") or source.get("secretName")
        data = self._data(kind, name, pod.namespace)
        if data is None:
            if source.get("optional"):
                data = {}
            else:
                raise Unsupported(f"{pod.name}: volume {vol['name']} needs {kind} {name}, which is absent")
        folder = self.volume_root / pod.name / vol["name"]
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
        mode = int(source.get("defaultMode", 0o644))
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for it in items:
            target = folder / it["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[it["key"]])
            target.chmod(int(it.get("mode", mode)))
        return folder

    def mounts(self, pod: Pod, env: dict[str, str]) -> list[str]:
        c = pod.container
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        uid, gid = self._uid_gid(pod)
        fs_group = (pod.spec.get("securityContext") or {}).get("fsGroup")
        args: list[str] = []
        for m in c.get("volumeMounts", []):
            vol = volumes.get(m["name"])
            if vol is None:
                raise Unsupported(f"{pod.name}: volumeMount {m['name']} has no volume")
            dest = m["mountPath"]
            sub = m.get("subPath") or (expand(m["subPathExpr"], env) if m.get("subPathExpr") else "")
            if sub and (PurePosixPath(sub).is_absolute() or ".." in PurePosixPath(sub).parts):
                raise Unsupported(f"{pod.name}: subPath {sub!r} (the kubelet refuses it too)")
            ro = bool(m.get("readOnly"))
            if "emptyDir" in vol:
                ed = vol["emptyDir"] or {}
                if sub:
                    raise Unsupported(f"{pod.name}: subPath on emptyDir {vol['name']}")
                size = int(parse_quantity(ed["sizeLimit"])) if ed.get("sizeLimit") else None
                if ed.get("medium") == "Memory" and dest == "/dev/shm":
                    if size:
                        args += ["--shm-size", str(size)]
                    continue
                if ed.get("medium") not in (None, "", "Memory"):
                    raise Unsupported(f"emptyDir medium {ed.get('medium')}")
                opts = [f"type=tmpfs,destination={dest}", "tmpfs-mode=1777"]  # emptyDir: 0777, fsGroup-owned
                if size:
                    opts.append(f"tmpfs-size={size}")
                if ro:
                    opts.append("readonly=true")
                args += ["--mount", ",".join(opts)]
            elif "configMap" in vol or "secret" in vol:
                kind = "ConfigMap" if "configMap" in vol else "Secret"
                folder = self._files(pod, vol, kind, vol["configMap"] if kind == "ConfigMap" else vol["secret"])
                src = folder / sub if sub else folder
                args += ["--volume", f"{src}:{dest}:ro"]  # the kubelet always mounts these read-only
            elif "persistentVolumeClaim" in vol:
                pvc = vol["persistentVolumeClaim"]
                root = self.claims.get(pvc["claimName"])
                if root is None:
                    raise Unsupported(f"{pod.name}: no host folder for claim {pvc['claimName']}")
                src = Path(root) / sub if sub else Path(root)
                if sub and not src.exists():
                    # The kubelet creates a missing subPath folder; here owned by the pod's user, so
                    # the non-root container can write it whatever the volume's own permissions.
                    src.mkdir(parents=True)
                    os.chown(src, uid if uid is not None else -1, fs_group if fs_group is not None else (gid or -1))
                ro = ro or bool(pvc.get("readOnly"))
                args += ["--volume", f"{src}:{dest}" + (":ro" if ro else "")]
            else:
                raise Unsupported(f"{pod.name}: volume {vol['name']} of type {sorted(set(vol) - {'name'})}")
        return args

    def host_path(self, pod: Pod, container_path: str) -> Path:
        """Where a path inside the container lives on the host (through its claim mounts)."""
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        best = None
        for m in pod.container.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/") or "/"
            if container_path == mp or container_path.startswith(mp + "/"):
                if best is None or len(mp) > len(best[0]):
                    best = (mp, m)
        if best is None:
            raise ValueError(f"{container_path} is on no volume of {pod.name}")
        mp, m = best
        vol = volumes[m["name"]]
        if "persistentVolumeClaim" not in vol:
            raise ValueError(f"{container_path} is on volume {m['name']}, which is not a claim")
        base = Path(self.claims[vol["persistentVolumeClaim"]["claimName"]]) / (m.get("subPath") or "")
        rest = container_path[len(mp):].lstrip("/")
        return base / rest if rest else base

    # ---- the whole pod ------------------------------------------------------------------------
    def command(self, pod: Pod, env: dict[str, str]) -> tuple[list[str], list[str]]:
        """(--entrypoint args, trailing args) for podman run."""
        c = pod.container
        cmd = [expand(str(a), env) for a in c.get("command", [])]
        args = [expand(str(a), env) for a in c.get("args", [])]
        if cmd:
            import json

            return ["--entrypoint", json.dumps(cmd)], args
        return [], args

    def run_args(self, pod: Pod, *, name: str, network: str | None, hosts: dict[str, str],
                 labels: dict[str, str] | None = None) -> list[str]:
        """`podman run` arguments (after `run`) for `pod`: image and command last."""
        c = pod.container
        unknown = (set(pod.spec) - _IGNORED_POD) | (set(c) - _IGNORED_CONTAINER)
        if unknown:
            raise Unsupported(f"{pod.name}: fields {sorted(unknown)}")
        psc, csc = pod.spec.get("securityContext") or {}, c.get("securityContext") or {}
        env = self.env(pod)
        args = ["--name", name, "--hostname", pod.hostname, "--restart", "no", *self.node_args]
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        if network:
            args += ["--network", network]
            if pod.ip:
                args += ["--ip", pod.ip]
        for host, ip in hosts.items():
            args += ["--add-host", f"{host}:{ip}"]
        # Security.
        uid, gid = self._uid_gid(pod)
        non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root and (uid is None or int(uid) == 0):
            raise Unsupported(f"{pod.name}: runAsNonRoot without a non-zero runAsUser (image USER not checked here)")
        if uid is not None:
            args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
        for g in [psc.get("fsGroup"), *psc.get("supplementalGroups", [])]:
            if g is not None:
                args += ["--group-add", str(g)]
        if csc.get("readOnlyRootFilesystem"):
            # Nothing writable but the pod's volumes (podman would add tmpfs on /tmp, /run...).
            args += ["--read-only", "--read-only-tmpfs=false"]
        caps = csc.get("capabilities") or {}
        for cap in caps.get("drop", []):
            args += ["--cap-drop", cap]
        for cap in caps.get("add", []):
            args += ["--cap-add", cap]
        if csc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if csc.get("privileged"):
            raise Unsupported("privileged containers")
        seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in (None, "RuntimeDefault"):
            raise Unsupported(f"seccompProfile {seccomp}")  # RuntimeDefault = podman's default profile
        # Resources (limits are what the runtime enforces).
        limits = (c.get("resources") or {}).get("limits") or {}
        for key, value in limits.items():
            if key in ("cpu", "memory") and not self.enforce_limits:
                self.notes.append(f"{pod.name}: limit {key}={value} not enforced (podman cannot set it here)")
            elif key == "cpu":
                args += ["--cpus", f"{float(parse_quantity(value)):g}"]
            elif key == "memory":
                args += ["--memory", str(int(parse_quantity(value)))]
            elif int(parse_quantity(value)):
                raise Unsupported(f"{pod.name}: resource {key}={value}")
        args += self.mounts(pod, env)
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        for port in c.get("ports", []):  # one network, every port reachable: recorded, not published
            if port.get("hostPort"):
                raise Unsupported(f"{pod.name}: hostPort {port['hostPort']}")
            args += ["--expose", f"{port['containerPort']}/{port.get('protocol', 'TCP').lower()}"]
        if c.get("workingDir"):
            args += ["--workdir", c["workingDir"]]
        args += ["--pull", _PULL.get(c.get("imagePullPolicy", "IfNotPresent"), "missing")]
        entry, rest = self.command(pod, env)
        return [*args, *entry, c["image"], *rest]


def out_dir_arg(pod: Pod) -> str | None:
    """The value after `--out` in the container's command line (a Pinpoint-specific helper for the
    tests, kept out of the generic converter)."""
    argv = [*pod.container.get("command", []), *pod.container.get("args", [])]
    return argv[argv.index("--out") + 1] if "--out" in argv else None
