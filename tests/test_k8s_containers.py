"""The plain flavour's pods, as `pinpoint provision` writes them, run as podman containers.

`tests/k8s_pods.py` turns each Indexed Job's pod template into `podman run` arguments generically
(command, env with fieldRef/secretKeyRef, securityContext, limits, volumes with subPath, hostname
and the Services' DNS names); the containers then run the CPU image on one podman network, with
one host folder standing in for the runs claim. Real processes, real network, real pod specs:

- unit: the converter on provisioned manifests (and on the subPath/secret layout);
- slow: chief + worker train to completion, checkpoints and the chief's files on the "claim";
- slow: the worker container SIGKILLed mid-training, the chief exits with the retry code;
- slow: a training container's thread count stays within a budget (a node's pids limit).

Cluster DNS is stood in for by --add-host on static addresses: podman's CNI backend here has no
dnsname plugin, so --network-alias names would not resolve. The node's own settings (no pids
limit, a high RLIMIT_NPROC) are modelled by NODE_ARGS; podman's defaults here are stricter.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from pinpoint.config import DEFAULT_RUNS_CLAIM
from pinpoint.errors import RETRY_EXIT_CODE
from pinpoint.provision import provision
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV
from pinpoint.runfolder import last_logged_step, latest_checkpoint_step
from tests.conftest import CPU_IMAGE, NO_TRACKING, make_config
from tests.k8s_pods import (
    Converter,
    Pod,
    Unsupported,
    dns_names,
    expand,
    indexed_job_pods,
    jobset_children,
    load_docs,
    out_dir_arg,
)

CLAIM = DEFAULT_RUNS_CLAIM
UID = 1000  # the image's user (runAsUser of the pods)
# The survivor of a killed peer must exit within this (it notices the broken connection, or TF's
# coordination service the missing heartbeats, in seconds; no PINPOINT_COLLECTIVE_TIMEOUT needed).
DETECT_BOUND = 120.0
# The node, not the pod: a default kubelet + containerd node gives a container no pids limit and
# no RLIMIT_NPROC worth the name. podman's defaults here are far stricter (pids_limit 2048 per
# container; nproc 4096 from docker/podman-setup.sh's containers.conf, counted over EVERY process
# of uid 1000 on the host, i.e. over both pods at once): model the node explicitly. nofile must be
# restated (any --ulimit drops the configured defaults) and nproc cannot go above 16384 here.
NODE_ARGS = ["--pids-limit=-1", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=16384:16384"]
# Threads one training task may hold: ~120 is what TensorFlow needs here (flat over the run);
# 1024 is CRI-O's long-standing default pids limit per container, a budget real clusters enforce.
THREAD_BUDGET = 1024


def _cfg(name: str, *, steps: int, checkpoint_every: int, log_every: int = 10, devices: int = 2,
         flavor: str = "plain", max_restarts: int = 0) -> object:
    return make_config(
        name,
        cluster={
            "chief": 1, "workers": 1, "devices_per_worker": devices, "device_type": "GPU", "emulate": True,
            "flavor": flavor, "runs_volume_claim": CLAIM, "image": CPU_IMAGE,
            "cpu": "1", "memory": "2Gi", "shm_size": "256Mi",
        },
        train={
            "strategy": "multi_worker_mirrored", "model": "mlp", "data": "digits", "batch_size": 32,
            "steps": steps, "checkpoint_every": checkpoint_every, "log_every": log_every,
            "keep_checkpoints": 3, "max_restarts": max_restarts,
        },
        tracking=NO_TRACKING,
    )


def _provisioned(tmp_path: Path, cfg) -> Path:
    out = tmp_path / "provision"
    provision(cfg, out)
    return out


def _manifests(prov: Path, restarts: int = 0) -> tuple[list[dict], list[dict], list[dict]]:
    """(jobs, services, configmaps + secrets) from manifests/ (job-*.yaml, services.yaml, configmap.yaml;
    or jobset.yaml, whose child Jobs and Service of restart attempt `restarts` the JobSet controller makes)."""
    m = prov / "manifests"
    objects = load_docs(m / "configmap.yaml")
    if (m / "jobset.yaml").is_file():
        (jobset,) = load_docs(m / "jobset.yaml")
        jobs, services = jobset_children(jobset, restarts)
        return jobs, services, objects
    jobs = load_docs(*sorted(m.glob("job-*.yaml")))
    services = load_docs(m / "services.yaml")
    return jobs, services, objects


def _converter(root: Path, objects: list[dict], **kw) -> tuple[Converter, Path]:
    shared = root / "claim"  # ONE host folder standing in for the ReadWriteMany claim
    shared.mkdir(parents=True)
    os.chown(shared, UID, UID)
    shared.chmod(0o775)
    vols = root / "volumes"
    vols.mkdir()
    conv = Converter(volume_root=vols, claims={CLAIM: shared},
                     configmaps=[d for d in objects if d["kind"] == "ConfigMap"],
                     secrets=[d for d in objects if d["kind"] == "Secret"], **kw)
    return conv, shared


# ---- unit: the converter -------------------------------------------------------------------------
@pytest.mark.unit
def test_expand_is_the_kubelets_var_expansion():
    env = {"A": "1", "B": "x"}
    assert expand("w:$(A)", env) == "w:1"
    assert expand("$$(A) $(MISSING) $(B)$(A)", env) == "$(A) $(MISSING) x1"


def _resolve_every_address(tmp_path, pods, services, *, pod_name) -> dict[str, str]:
    """Give the pods IPs 10.0.0.10, .11, ...; their DNS names -> IP, after checking that every
    address of the provisioned TF_CONFIG resolves to its own pod (`pod_name(role, index)`)."""
    hosts = {}
    for i, p in enumerate(pods):
        p.ip = f"10.0.0.{10 + i}"
        hosts.update({n: p.ip for n in dns_names(p, services)})
    spec = json.loads((tmp_path / "provision" / "cluster_spec.json").read_text())
    for role, addrs in spec["cluster"].items():
        for i, addr in enumerate(addrs):
            assert hosts[addr.rsplit(":", 1)[0]] == next(p.ip for p in pods if p.name == pod_name(role, i))
    return hosts


@pytest.mark.unit
def test_converter_translates_the_provisioned_pod_specs(tmp_path):
    cfg = _cfg("conv", steps=20, checkpoint_every=10)
    jobs, services, objects = _manifests(_provisioned(tmp_path, cfg))
    conv, shared = _converter(tmp_path, objects)
    pods = [p for j in jobs for p in indexed_job_pods(j)]
    assert [p.name for p in pods] == ["conv-chief-0", "conv-worker-0"]
    hosts = _resolve_every_address(tmp_path, pods, services, pod_name=lambda role, i: f"conv-{role}-{i}")
    assert hosts["conv-worker-0.conv.default.svc.cluster.local"] == "10.0.0.11"  # hostname.subdomain

    worker = pods[1]
    args = conv.run_args(worker, name="c", network="net", hosts=hosts)
    joined = " ".join(args)
    entry = json.loads(args[args.index("--entrypoint") + 1])
    # The image last: the pod's command is its entrypoint (podman's trailing args would follow the image).
    assert args[args.index("--entrypoint") + 2:] == [CPU_IMAGE]
    assert entry[:4] == ["python", "-m", "pinpoint.provision.podenv", "--"]
    assert entry[entry.index("--task") + 1] == "worker:0"  # $(PINPOINT_TASK_INDEX) from the completion index
    assert "--env PINPOINT_TASK_INDEX=0" in joined and "--env PINPOINT_TASK_ROLE=worker" in joined
    assert "--user 1000:1000" in joined and "--group-add 1000" in joined
    assert "--read-only --read-only-tmpfs=false" in joined
    assert "--cap-drop ALL" in joined and "--security-opt no-new-privileges" in joined
    assert "--cpus 1 " in joined and f"--memory {2 * 2**30}" in joined
    assert f"--shm-size {256 * 2**20}" in joined
    assert "--mount type=tmpfs,destination=/tmp,tmpfs-mode=1777" in joined
    # The claim: at /runs (whole volume) or, with subPath, the run's own folder at /runs/<rel>.
    runs = next(m for m in worker.container["volumeMounts"] if m["name"] == "runs")
    assert f"{shared / runs.get('subPath', '')}".rstrip("/") + f":{runs['mountPath']}" in args
    cm = tmp_path / "volumes" / "conv-worker-0" / "config"
    assert f"--volume {cm}:/config:ro" in joined
    assert "name: conv" in (cm / "config.yaml").read_text()
    assert "--hostname conv-worker-0" in joined and "--ip 10.0.0.11" in joined and "--expose 2222/tcp" in joined
    assert conv.host_path(worker, out_dir_arg(worker)) == shared / "conv"


@pytest.mark.unit
def test_converter_runs_the_jobsets_pods_under_its_dns_names(tmp_path):
    """The jobset flavour: the JobSet controller's child Jobs and headless Service give every
    TF_CONFIG address a pod (<jobset>-<role>-0-<i>.<jobset>.<ns>.svc), and each pod's entry point
    gets its role and index."""
    cfg = _cfg("convj", steps=20, checkpoint_every=10, flavor="jobset")
    jobs, services, objects = _manifests(_provisioned(tmp_path, cfg), restarts=2)
    conv, _ = _converter(tmp_path, objects)
    pods = [p for j in jobs for p in indexed_job_pods(j)]
    assert [p.name for p in pods] == ["convj-chief-0-0", "convj-worker-0-0"]
    assert {p.labels["jobset.sigs.k8s.io/restart-attempt"] for p in pods} == {"2"}
    hosts = _resolve_every_address(tmp_path, pods, services, pod_name=lambda role, i: f"convj-{role}-0-{i}")
    args = conv.run_args(pods[1], name="c", network="net", hosts=hosts)
    entry = json.loads(args[args.index("--entrypoint") + 1])
    assert entry[entry.index("--task") + 1] == "worker:0"
    assert "--hostname convj-worker-0-0" in " ".join(args)


@pytest.mark.unit
def test_converter_handles_a_claim_subpath_and_optional_secrets(tmp_path):
    """The layout where the claim is mounted with subPath at /runs/<rel>, env from an optional
    Secret and PINPOINT_COLLECTIVE_TIMEOUT in the manifest (rewritten here onto today's manifest)."""
    cfg = _cfg("sub", steps=20, checkpoint_every=10)
    jobs, services, objects = _manifests(_provisioned(tmp_path, cfg))
    pod = indexed_job_pods(jobs[0])[0]
    c = pod.container
    # The whole claim at /runs, the run folder under it (the layout before subPath).
    c["volumeMounts"] = [m if m["name"] != "runs" else {"name": "runs", "mountPath": "/runs"} for m in c["volumeMounts"]]
    c["command"][c["command"].index("--out") + 1] = "/runs/sub"
    whole, _ = _converter(tmp_path / "whole", objects)
    assert f"{whole.claims[CLAIM]}:/runs" in whole.run_args(pod, name="c", network=None, hosts={})
    assert whole.host_path(pod, out_dir_arg(pod)) == whole.claims[CLAIM] / "sub"
    # The claim's subfolder at the run folder itself.
    c["volumeMounts"] = [m if m["name"] != "runs" else {"name": "runs", "mountPath": "/runs/team/sub",
                                                        "subPath": "team/sub"} for m in c["volumeMounts"]]
    c["command"][c["command"].index("--out") + 1] = "/runs/team/sub"
    c["env"] = [e for e in c["env"] if e["name"] != COLLECTIVE_TIMEOUT_ENV] + [
        {"name": COLLECTIVE_TIMEOUT_ENV, "value": "120"},
        {"name": "MLFLOW_TRACKING_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": "mlflow-credentials", "key": "token", "optional": True}}},
    ]
    conv, shared = _converter(tmp_path, objects, env_overrides={COLLECTIVE_TIMEOUT_ENV: "20"})
    args = conv.run_args(pod, name="c", network=None, hosts={})
    joined = " ".join(args)
    assert f"--volume {shared / 'team' / 'sub'}:/runs/team/sub" in joined
    assert (shared / "team" / "sub").stat().st_uid == UID  # created like the kubelet does, writable by the pod
    assert "MLFLOW_TRACKING_TOKEN" not in joined  # optional and absent: left out
    assert f"--env {COLLECTIVE_TIMEOUT_ENV}=20" in joined and f"{COLLECTIVE_TIMEOUT_ENV}=120" not in joined
    assert conv.host_path(pod, out_dir_arg(pod)) == shared / "team" / "sub"
    # A required Secret that is absent stops the pod, as CreateContainerConfigError does.
    c["env"][-1]["valueFrom"]["secretKeyRef"]["optional"] = False
    with pytest.raises(Unsupported, match="CreateContainerConfigError"):
        conv.run_args(pod, name="c", network=None, hosts={})


# ---- slow: the pods as podman containers ----------------------------------------------------------
def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}...: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


class PodmanCluster:
    """The provisioned Jobs' pods as containers on one podman network; always cleaned up by close()."""

    def __init__(self, tmp_path: Path, cfg, *, env: dict[str, str] | None = None):
        self.tmp = tmp_path
        self.prov = _provisioned(tmp_path, cfg)
        jobs, self.services, objects = _manifests(self.prov)
        # env: replaces the manifest's value if it has the variable, else added (reported in notes).
        self.conv, self.shared = _converter(tmp_path, objects, env_overrides=dict(env or {}),
                                            extra_env=dict(env or {}))
        self.jobs = jobs
        self.pods: list[Pod] = [p for j in jobs for p in indexed_job_pods(j)]
        self.domain = json.loads((self.prov / "cluster_spec.json").read_text()).get("cluster_domain")
        token = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.network = f"pp-k8s-{token}"
        self.names = {p.name: f"pp-{token}-{p.name}" for p in self.pods}
        self.token = token  # label pinpoint-test=<token> on every container
        self.started: list[str] = []
        self.network_created = False
        self.logs_dir = tmp_path / "logs"
        self.logs_dir.mkdir()

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    @property
    def run_dir(self) -> Path:
        """The run folder (the chief's --out) on the host folder of the claim."""
        chief = self.pods[0]
        return self.conv.host_path(chief, out_dir_arg(chief))

    def _watch(self) -> None:
        """If this pytest process dies (timeout, kill -9) before close(), a tiny watcher removes the
        containers and the network, so none outlives the test session."""
        self.marker = self.tmp / "cluster.alive"
        self.marker.touch()
        names = " ".join(self.names.values())
        script = (f"while kill -0 {os.getpid()} 2>/dev/null && [ -e {self.marker} ]; do sleep 2; done; "
                  f"[ -e {self.marker} ] && {{ podman rm -f -t 0 {names}; podman network rm -f {self.network}; }}; "
                  "exit 0")
        subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> None:
        self._watch()
        _podman("network", "create", self.network)
        self.network_created = True
        subnet = _podman("network", "inspect", self.network, "--format",
                         "{{range .Subnets}}{{.Subnet}} {{end}}").stdout.split()[0]
        addresses = list(ipaddress.ip_network(subnet).hosts())[9:]
        hosts: dict[str, str] = {}
        for p, ip in zip(self.pods, addresses):
            p.ip = str(ip)
            hosts.update({n: p.ip for n in dns_names(p, self.services, self.domain)})
        # Every TF_CONFIG address must resolve, or the tasks would wait for each other forever.
        spec = json.loads((self.prov / "cluster_spec.json").read_text())
        unresolved = [a for addrs in spec["cluster"].values() for a in addrs if a.rsplit(":", 1)[0] not in hosts]
        assert not unresolved, f"no pod answers to {unresolved}; names: {sorted(hosts)}"
        self.hosts = hosts
        for p in self.pods:
            args = self.conv.run_args(p, name=self.names[p.name], network=self.network, hosts=hosts,
                                      labels={"pinpoint-test": self.token})
            (self.logs_dir / f"{p.name}.args.json").write_text(json.dumps(args, indent=1))
            self.started.append(self.names[p.name])
            _podman("run", "-d", *args, timeout=300)
        for note in self.conv.notes:
            print(f"k8s_pods: {note}")

    def restart(self, restarts: int) -> None:
        """Restart the whole group as a JobSet does: every container removed, then the pods of
        restart attempt `restarts` started afresh (same names, addresses and claim)."""
        _podman("rm", "-f", "-t", "0", *self.started, timeout=120, check=False)
        jobs, _, _ = _manifests(self.prov, restarts)
        self.jobs = jobs
        ips = {p.name: p.ip for p in self.pods}
        self.pods = [p for j in jobs for p in indexed_job_pods(j)]
        for p in self.pods:
            p.ip = ips[p.name]
            args = self.conv.run_args(p, name=self.names[p.name], network=self.network, hosts=self.hosts,
                                      labels={"pinpoint-test": self.token})
            _podman("run", "-d", *args, timeout=300)

    def state(self, pod: str) -> tuple[str, int]:
        out = _podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.names[pod]).stdout.split()
        return out[0], int(out[1])

    def exit_code(self, pod: str) -> int | None:
        status, code = self.state(pod)
        return code if status in ("exited", "stopped") else None

    def threads(self, pod: str) -> int | None:
        """Threads of the container's main process (podenv execs the task: it is the task), or None."""
        pid = _podman("inspect", "--format", "{{.State.Pid}}", self.names[pod], check=False).stdout.strip()
        try:
            with open(f"/proc/{pid}/status") as f:
                return int(next(ln.split()[1] for ln in f if ln.startswith("Threads:")))
        except (OSError, ValueError, StopIteration):
            return None

    def logs(self, pod: str, tail: int = 40) -> str:
        proc = _podman("logs", "--tail", str(tail), self.names[pod], check=False)
        return proc.stdout + proc.stderr

    def all_logs(self, tail: int = 40) -> str:
        return "\n".join(f"--- {p.name} ---\n{self.logs(p.name, tail)}" for p in self.pods)

    def wait_exits(self, pods: list[str], timeout: float) -> dict[str, int]:
        """Exit codes of `pods`, waiting at most `timeout` s; AssertionError naming the ones still running."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        while True:
            for p in pods:
                if p not in codes:
                    code = self.exit_code(p)
                    if code is not None:
                        codes[p] = code
            if len(codes) == len(pods):
                return codes
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout:.0f} s: {sorted(set(pods) - set(codes))} "
                                     f"(exited: {codes})\n{self.all_logs()}")
            time.sleep(1.0)

    def close(self) -> None:
        for p in self.pods:
            if self.names[p.name] in self.started:
                (self.logs_dir / f"{p.name}.log").write_text(self.logs(p.name, tail=100000))
        if self.started:
            _podman("rm", "-f", "-t", "0", *self.started, timeout=120, check=False)
        if self.network_created:
            _podman("network", "rm", "-f", self.network, timeout=60, check=False)
        if getattr(self, "marker", None) is not None:
            self.marker.unlink(missing_ok=True)  # the watcher exits without touching anything


@pytest.fixture(scope="session")
def podman_bridge(cpu_image) -> dict:
    """What podman can do here, probed once: containers on a bridge network (else the tests skip,
    saying why) and cgroup cpu/memory limits (else they run without, saying so)."""
    net = f"pp-probe-{os.getpid()}-{secrets.token_hex(3)}"
    base = ["run", "--rm", "--pull", "never", "--network", net, "--entrypoint", '["true"]']
    made = _podman("network", "create", net, check=False)
    try:
        if made.returncode != 0:
            pytest.skip(f"podman here cannot create a bridge network: {made.stderr.strip()[-300:]}")
        run = _podman(*base, CPU_IMAGE, check=False, timeout=300)
        if run.returncode != 0:
            pytest.skip(f"podman here cannot run a container on a bridge network: {run.stderr.strip()[-300:]}")
        limited = _podman(*base[:2], "--cpus", "0.5", "--memory", str(256 * 2**20), *base[2:], CPU_IMAGE,
                          check=False, timeout=300)
        node = _podman(*base[:2], *NODE_ARGS, *base[2:], CPU_IMAGE, check=False, timeout=300)
        return {"limits": limited.returncode == 0, "limits_error": limited.stderr.strip()[-300:],
                "node_args": NODE_ARGS if node.returncode == 0 else [], "node_error": node.stderr.strip()[-300:]}
    finally:
        if made.returncode == 0:
            _podman("network", "rm", "-f", net, check=False)


@pytest.fixture
def podman_cluster(podman_bridge, tmp_path):
    """A factory: cluster(cfg, env=...) -> a started PodmanCluster; every one is removed afterwards."""
    made: list[PodmanCluster] = []
    if not podman_bridge["limits"]:
        print(f"podman here cannot set cpu/memory limits ({podman_bridge['limits_error']}): run without them")
    if not podman_bridge["node_args"]:
        print(f"podman here cannot lift its pids/nproc limits ({podman_bridge['node_error']}): podman's defaults")

    def make(cfg, **kw) -> PodmanCluster:
        c = PodmanCluster(tmp_path / f"c{len(made)}", cfg, **kw)
        c.conv.enforce_limits = podman_bridge["limits"]
        c.conv.node_args = list(podman_bridge["node_args"])
        made.append(c)
        c.start()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(2400)
def test_plain_flavour_pods_train_to_completion_as_podman_containers(podman_cluster):
    steps = 40
    cluster = podman_cluster(_cfg("k8sc", steps=steps, checkpoint_every=20))
    t0 = time.monotonic()
    codes = cluster.wait_exits([p.name for p in cluster.pods], timeout=900)
    took = time.monotonic() - t0
    assert codes == {"k8sc-chief-0": 0, "k8sc-worker-0": 0}, cluster.all_logs()
    print(f"chief + worker trained {steps} steps in {took:.0f} s")

    # The containers ran as the spec says (not as podman's defaults).
    for p in cluster.pods:
        ro, user, memory, shm = _podman(
            "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.Config.User}} {{.HostConfig.Memory}} "
            "{{.HostConfig.ShmSize}}", cluster.names[p.name]).stdout.split()
        assert (ro, user, int(shm)) == ("true", "1000:1000", 256 * 2**20), p.name
        if cluster.conv.enforce_limits:
            assert int(memory) == 2 * 2**30, p.name

    run = cluster.run_dir
    assert run == cluster.shared / "k8sc"
    # Checkpoints on the shared "claim", read back by TensorFlow's own reader.
    import tensorflow as tf

    assert latest_checkpoint_step(run) == steps, sorted(os.listdir(run / "checkpoints"))
    prefix = tf.train.latest_checkpoint(str(run / "checkpoints"))
    assert prefix is not None and prefix.endswith(f"ckpt-{steps}"), prefix
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    step_keys = [k for k in shapes if k.startswith("step/")]
    assert step_keys and int(reader.get_tensor(step_keys[0])) == steps, sorted(shapes)
    # The model's weights: the first layer's kernel over digits' 64 features (Keras 3 models are
    # reached through the optimizer's variables in the object graph, so no fixed path is assumed).
    assert any(len(s) == 2 and s[0] == 64 for s in shapes.values()), shapes
    # The chief's files, written by uid 1000 into the run folder on the claim; the worker's
    # placement reached the chief through the same shared folder.
    for name in ("placement.json", "metrics.json"):
        assert (run / name).is_file(), sorted(os.listdir(run))
        assert (run / name).stat().st_uid == UID
    assert (run / "placement-worker-0.json").is_file(), sorted(os.listdir(run))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == steps, metrics
    placement = (run / "placement.json").read_text()
    assert "/job:worker/task:0" in placement and "/job:chief/task:0" in placement


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(2400)
def test_sigkill_of_the_worker_container_makes_the_chief_exit_with_the_retry_code(podman_cluster):
    # Long enough that the kill lands mid-training; the chief must notice well before the end.
    cfg = _cfg("k8sk", steps=20000, checkpoint_every=50)
    cluster = podman_cluster(cfg)  # the pods as provisioned, env included
    run = cluster.run_dir
    deadline = time.monotonic() + 600
    while (latest_checkpoint_step(run) or 0) < 50 or (last_logged_step(run) or 0) < 60:
        exited = {p.name: cluster.exit_code(p.name) for p in cluster.pods}
        assert not any(c is not None for c in exited.values()), f"a task ended before training ran: {exited}\n" \
            + cluster.all_logs()
        assert time.monotonic() < deadline, "no checkpoint + logged step within 600 s\n" + cluster.all_logs()
        time.sleep(1.0)
    step_at_kill = last_logged_step(run)
    _podman("kill", "-s", "KILL", cluster.names["k8sk-worker-0"])
    killed_at = time.monotonic()
    # Bounded: the chief notices in seconds, never hangs.
    codes = cluster.wait_exits(["k8sk-chief-0", "k8sk-worker-0"], timeout=DETECT_BOUND)
    detected = time.monotonic() - killed_at
    chief_log = cluster.logs("k8sk-chief-0", 60)
    print(f"worker SIGKILLed at logged step {step_at_kill}; chief exited {codes['k8sk-chief-0']} "
          f"after {detected:.0f} s (last logged step {last_logged_step(run)})")
    assert codes["k8sk-worker-0"] == 137  # 128 + SIGKILL
    assert (last_logged_step(run) or 0) < cfg.train.steps  # it really was mid-training
    assert codes["k8sk-chief-0"] == RETRY_EXIT_CODE, (
        f"the chief exited {codes['k8sk-chief-0']} {detected:.0f} s after its peer was killed; "
        f"expected the retry code {RETRY_EXIT_CODE}\n" + chief_log)
    # ...because it lost its peer (the one line the task prints), not for another reason.
    assert "lost a peer" in chief_log, chief_log
    print("chief's last line:", chief_log.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_training_containers_stay_within_a_thread_budget(podman_cluster):
    """The pods exactly as provisioned (PINPOINT_COLLECTIVE_TIMEOUT as the manifest sets it, if it
    does): a training task's thread count must not grow with the steps. A collective timeout makes
    TensorFlow park one sleeping thread per collective op for the whole timeout
    (base_collective_executor.cc: SchedNonBlockingClosureAfter -> Env::SchedClosureAfter, a detached
    std::thread), i.e. collectives/s x timeout threads: thousands within seconds, so a node's pids
    limit kills the task (EAGAIN -> std::system_error -> exit 134/139) instead of it training."""
    steps = 600
    cluster = podman_cluster(_cfg("k8st", steps=steps, checkpoint_every=200))
    run = cluster.run_dir
    timeout = next((e.get("value") for e in cluster.pods[0].container.get("env", [])
                    if e["name"] == COLLECTIVE_TIMEOUT_ENV), None)
    peak = {p.name: 0 for p in cluster.pods}
    deadline = time.monotonic() + 900
    while True:
        for p in cluster.pods:
            n = cluster.threads(p.name)
            if n is not None:
                peak[p.name] = max(peak[p.name], n)
        over = {k: v for k, v in peak.items() if v > THREAD_BUDGET}
        assert not over, (f"threads over the budget of {THREAD_BUDGET}: {over} at logged step {last_logged_step(run)} "
                          f"of {steps}; the pods' {COLLECTIVE_TIMEOUT_ENV}: {timeout!r}")
        codes = {p.name: cluster.exit_code(p.name) for p in cluster.pods}
        if all(c is not None for c in codes.values()):
            break
        assert time.monotonic() < deadline, f"not done in 900 s: {codes}\n" + cluster.all_logs()
        time.sleep(0.5)
    print(f"peak threads {peak} over {steps} steps")
    assert codes == {"k8st-chief-0": 0, "k8st-worker-0": 0}, cluster.all_logs()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(2400)
def test_jobset_pods_restart_together_from_the_checkpoint_as_the_failure_policy_decides(podman_cluster):
    """The jobset flavour's pod templates as containers (DNS names as host entries): killing the
    worker makes both exit; the child Jobs' podFailurePolicy and the JobSet's failurePolicy (as the
    FAKE controller applies them, tests/fakes/jobset_controller.py) decide a counted restart; the
    group then restarts from the last checkpoint on the shared claim and trains to completion."""
    from tests.fakes.jobset_controller import job_failure_reason, jobset_failure_action

    steps = 1500
    cfg = _cfg("k8sj", steps=steps, checkpoint_every=100, log_every=20, flavor="jobset", max_restarts=1)
    t0 = time.monotonic()
    cluster = podman_cluster(cfg)
    assert sorted(cluster.names) == ["k8sj-chief-0-0", "k8sj-worker-0-0"]
    assert cluster.hosts["k8sj-worker-0-0.k8sj.default.svc"] == cluster.pod("k8sj-worker-0-0").ip
    run = cluster.run_dir
    deadline = time.monotonic() + 600
    while (latest_checkpoint_step(run) or 0) < 100:
        exited = {p.name: cluster.exit_code(p.name) for p in cluster.pods}
        assert not any(c is not None for c in exited.values()), f"a task ended before training ran: {exited}\n" \
            + cluster.all_logs()
        assert time.monotonic() < deadline, "no checkpoint within 600 s\n" + cluster.all_logs()
        time.sleep(0.5)
    _podman("kill", "-s", "KILL", cluster.names["k8sj-worker-0-0"])
    codes = cluster.wait_exits(["k8sj-chief-0-0", "k8sj-worker-0-0"], timeout=DETECT_BOUND)
    assert codes == {"k8sj-chief-0-0": RETRY_EXIT_CODE, "k8sj-worker-0-0": 137}, cluster.all_logs()
    ckpt = latest_checkpoint_step(run)
    assert ckpt is not None and 100 <= ckpt < steps

    # What the cluster decides: each child Job's verdict, then the JobSet's (restart, counted).
    (jobset,) = load_docs(cluster.prov / "manifests" / "jobset.yaml")
    failed = []
    for job in cluster.jobs:
        pods = [p for p in cluster.pods if p.name.startswith(job["metadata"]["name"] + "-")]
        statuses = [{"phase": "Failed", "containerStatuses": [{"name": p.container["name"], "state": {
            "terminated": {"exitCode": codes[p.name]}}}]} for p in pods]
        reason = job_failure_reason(job["spec"], statuses)
        failed.append((job["metadata"]["name"], job["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"],
                       reason))
    assert [r for _, _, r in failed] == ["BackoffLimitExceeded", "BackoffLimitExceeded"]
    action, _, _ = jobset_failure_action(jobset["spec"], failed, counted=0)
    assert action == "RestartJobSet"
    # One more would exceed maxRestarts (train.max_restarts = 1): the JobSet would fail.
    assert jobset_failure_action(jobset["spec"], failed, counted=1)[0] == "Fail"

    killed = time.monotonic() - t0
    cluster.restart(1)
    t1 = time.monotonic()
    codes = cluster.wait_exits([p.name for p in cluster.pods], timeout=1200)
    assert codes == {"k8sj-chief-0-0": 0, "k8sj-worker-0-0": 0}, cluster.all_logs()
    chief_log = cluster.logs("k8sj-chief-0-0", 400)
    assert f"resuming from checkpoint step {ckpt}" in chief_log, chief_log
    assert latest_checkpoint_step(run) == steps
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == steps, metrics
    print(f"worker SIGKILLed after checkpoint {ckpt} ({killed:.0f} s in); the group restarted (attempt 1) and "
          f"trained to {steps} in {time.monotonic() - t1:.0f} s")
