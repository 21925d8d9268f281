"""Feasibility: every replica placed on a node of an inventory, or the reason it cannot be."""

import re
from pathlib import Path

import pytest
from kubernetes import client

from pinpoint.errors import ProvisionError
from pinpoint.provision.feasibility import plan_placement
from pinpoint.provision.inventory import Taint, inventory_from_cluster, load_inventory, node_from_v1
from pinpoint.provision.spec import build_tasks
from tests.conftest import make_config

pytestmark = pytest.mark.unit
DATA = Path(__file__).parent / "data" / "provision"
ROOT = Path(__file__).parent.parent
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _cfg(strategy="multi_worker_mirrored", **cluster):
    base = {"workers": 1, "emulate": False, "gpu_type": "A100", "tolerations": TOLERATE_GPU}
    return make_config("job", cluster={**base, **cluster}, train={"strategy": strategy})


def _plan(cfg, inventory):
    nodes = load_inventory(DATA / inventory, gpu_resource=cfg.cluster.gpu_resource,
                           gpu_type_label=cfg.cluster.gpu_type_label)
    return plan_placement(cfg, build_tasks(cfg), nodes, source=inventory)


def _where(plan):
    return {p["task"]: p["node"] for p in plan["placements"]}


def test_multiworker_fits_and_respects_capacity():
    cfg = _cfg(chief=1, workers=2, devices_per_worker=2)
    plan = _plan(cfg, "nodes-ok.yaml")
    assert plan["status"] == "feasible"
    where = _where(plan)
    assert set(where) == {"chief:0", "worker:0", "worker:1"}
    assert set(where.values()) <= {"a100-0", "a100-1"}  # cpu-0 has no A100
    used = {n["name"]: n["used"].get("nvidia.com/gpu", 0) for n in plan["nodes"]}
    assert sum(used.values()) == 6 and max(used.values()) <= 4


def test_cpu_only_replicas_stay_off_gpu_nodes():
    cfg = _cfg("parameter_server", chief=1, workers=2, ps=1, devices_per_worker=4)
    where = _where(_plan(cfg, "nodes-ok.yaml"))
    assert where["chief:0"] == where["ps:0"] == "cpu-0"
    assert {where["worker:0"], where["worker:1"]} == {"a100-0", "a100-1"}


def test_emulated_request_needs_no_gpus():
    cfg = _cfg(chief=1, workers=2, emulate=True, gpu_type=None)
    plan = _plan(cfg, "nodes-wrong-type.yaml")
    assert plan["status"] == "feasible" and all(p["requests"].keys() == {"cpu", "memory"} for p in plan["placements"])


INFEASIBLE = [
    ("nodes-small-gpu.yaml", dict(devices_per_worker=8),
     "chief needs 8 x nvidia.com/gpu of type A100; the largest matching node has 4"),
    ("nodes-wrong-type.yaml", dict(devices_per_worker=1),
     "none of the 2 node(s) qualifies: v100-0 has nvidia.com/gpu.product=V100; cpu-0 lacks label nvidia.com/gpu.product"),
    ("nodes-tainted.yaml", dict(devices_per_worker=1),
     "a100-0 has taint dedicated=team-b:NoSchedule (add it to cluster.tolerations)"),
    ("nodes-low-memory.yaml", dict(devices_per_worker=1, memory="32Gi"),
     "chief needs 32Gi memory; the largest matching node has 16Gi memory"),
    ("nodes-capacity.yaml", dict(workers=2, devices_per_worker=4),
     "the 3 chief/worker replica(s) need 12 x nvidia.com/gpu of type A100 in total; the matching nodes have "
     "8 x nvidia.com/gpu (a100-0: 4, a100-1: 4)"),
    ("nodes-fragmented.yaml", dict(workers=2, devices_per_worker=3),
     "the replicas fit in total but not node by node: the 3 chief/worker replica(s) need 3 x nvidia.com/gpu of type A100 + 4Gi memory + 2 CPU each and the matching nodes hold 2 of them (a100-0: 1, a100-1: 1, a100-2: 0)"),
    ("nodes-mixed.yaml", dict(workers=3, evaluator=1, devices_per_worker=2, gpu_type=None),
     "evaluator:0 needs 1 x nvidia.com/gpu + 4Gi memory + 2 CPU and after placing the larger replicas the matching "
     "nodes have n0: 2 x nvidia.com/gpu + 56Gi + 1 CPU, n1: 0 x nvidia.com/gpu + 56Gi + 4 CPU left"),
    ("nodes-cordoned.yaml", dict(devices_per_worker=1),
     "none of the 1 node(s) qualifies: a100-0 is cordoned (unschedulable)"),
    ("nodes-ok.yaml", dict(devices_per_worker=1, cpu="48"),
     "chief needs 48 CPU; the largest matching node has 32 CPU"),
]


@pytest.mark.parametrize("inventory,cluster,message", INFEASIBLE, ids=[i[0] for i in INFEASIBLE])
def test_infeasible_inventories_say_why(inventory, cluster, message):
    with pytest.raises(ProvisionError) as err:
        _plan(_cfg(**cluster), inventory)
    text = str(err.value)
    assert message in text, text
    assert "\n" not in text and text.startswith("feasibility: ")


def test_node_selector_is_honoured():
    cfg = _cfg(devices_per_worker=1, node_selector={"topology.kubernetes.io/zone": "zone-b"})
    with pytest.raises(ProvisionError, match="a node with topology.kubernetes.io/zone=zone-b, nvidia.com/gpu.product=A100"):
        _plan(cfg, "nodes-ok.yaml")


@pytest.mark.parametrize("text,message", [
    ("nodes: []\n", "has no 'nodes:' list"),
    ("nodes:\n  - {name: a, cpu: '1'}\n", "nodes[0].memory: got nothing (missing)"),
    ("nodes:\n  - {name: a, cpu: '1', memory: 1Gi, gpu: 2}\n", "unknown key 'gpu'"),
    ("nodes:\n  - {name: a, cpu: '1', memory: 1Gi, taints: [{key: k, effect: Never}]}\n", "taint"),
    ("nodes:\n  - {name: a, cpu: '1', memory: 1Gi}\n  - {name: a, cpu: '1', memory: 1Gi}\n", "got node name 'a' twice"),
    ("nodes: [unclosed\n", "not valid YAML"),
])
def test_bad_inventory_files(tmp_path, text, message):
    p = tmp_path / "nodes.yaml"
    p.write_text(text)
    with pytest.raises(ProvisionError, match=re.escape(message)):
        load_inventory(p, gpu_resource="nvidia.com/gpu", gpu_type_label="nvidia.com/gpu.product")
    with pytest.raises(ProvisionError, match="memory: got 'lots'"):
        load_inventory(DATA / "nodes-malformed.yaml", gpu_resource="nvidia.com/gpu", gpu_type_label="x")
    with pytest.raises(ProvisionError, match="does not exist"):
        load_inventory(tmp_path / "missing.yaml", gpu_resource="nvidia.com/gpu", gpu_type_label="x")


def test_example_inventory_places_the_example_configs():
    from pinpoint.config import load_config

    for name in ("multiworker", "ps", "demo"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        nodes = load_inventory(ROOT / "configs" / "nodes-example.yaml", gpu_resource=cfg.cluster.gpu_resource,
                               gpu_type_label=cfg.cluster.gpu_type_label)
        plan = plan_placement(cfg, build_tasks(cfg), nodes, source="example")
        assert "cpu-1" not in _where(plan).values()  # cordoned


def _v1node(name, allocatable, labels=None, taints=(), unschedulable=None):
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1NodeSpec(taints=[client.V1Taint(**t) for t in taints] or None, unschedulable=unschedulable),
        status=client.V1NodeStatus(allocatable=allocatable),
    )


def test_v1node_conversion():
    node = node_from_v1(_v1node(
        "gpu-0",
        {"cpu": "31850m", "memory": "257846584Ki", "nvidia.com/gpu": "8", "pods": "110", "ephemeral-storage": "100Gi"},
        labels={"nvidia.com/gpu.product": "A100"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        unschedulable=True,
    ))
    assert node.allocatable["cpu"] == pytest.approx(31.85)
    assert node.allocatable["memory"] == 257846584 * 1024
    assert node.allocatable["nvidia.com/gpu"] == 8
    assert node.labels == {"nvidia.com/gpu.product": "A100"}
    assert node.taints == (Taint("nvidia.com/gpu", "NoSchedule", "present"),
                           Taint("node.kubernetes.io/unschedulable", "NoSchedule"))
    bare = node_from_v1(_v1node("cpu-0", None))
    assert bare.allocatable == {"cpu": 0.0, "memory": 0.0} and bare.taints == () and bare.labels == {}


def test_converted_nodes_feed_the_same_placement():
    nodes = [
        node_from_v1(_v1node("gpu-0", {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"},
                             labels={"nvidia.com/gpu.product": "A100"},
                             taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])),
        node_from_v1(_v1node("gpu-1", {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "2"},
                             labels={"nvidia.com/gpu.product": "A100"})),
    ]
    cfg = _cfg(workers=1, devices_per_worker=3)
    with pytest.raises(ProvisionError, match=re.escape(
            "the 2 chief/worker replica(s) need 3 x nvidia.com/gpu of type A100 + 4Gi memory + 2 CPU each and the "
            "matching nodes hold 1 of them (gpu-0: 1, gpu-1: 0)")):
        plan_placement(cfg, build_tasks(cfg), nodes, source="fake")
    cfg = _cfg(workers=1, devices_per_worker=2)
    assert set(_where(plan_placement(cfg, build_tasks(cfg), nodes, source="fake")).values()) == {"gpu-0", "gpu-1"}


@pytest.mark.timeout(60)
def test_kubeconfig_errors_are_one_line(tmp_path):
    with pytest.raises(ProvisionError, match="does not exist"):
        inventory_from_cluster(tmp_path / "nope")
    # A real kubeconfig pointing at a port nobody listens on: the client's error becomes one line.
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    with pytest.raises(ProvisionError) as err:
        inventory_from_cluster(kc)
    assert "cannot list nodes" in str(err.value) and "\n" not in str(err.value)


class _FakeApiServer:
    """A FAKE Kubernetes API server (no real one can run here): serves a fixed NodeList and
    PodList as JSON so the real kubernetes client's list_node/list_pod path is exercised."""

    def __init__(self, nodes, pods, pods_status=200):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        bodies = {"/api/v1/nodes": (200, {"kind": "NodeList", "apiVersion": "v1", "items": nodes}),
                  "/api/v1/pods": (pods_status, {"kind": "PodList", "apiVersion": "v1", "items": pods}
                                   if pods_status == 200 else {"kind": "Status", "code": pods_status})}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                status, body = bodies.get(self.path.split("?")[0], (404, {"kind": "Status", "code": 404}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _kubeconfig(tmp_path, server):
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return kc


_NODES = [
    {"metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.product": "A100"}},
     "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
     "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4", "pods": "110"}}},
    {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "A100"}},
     "spec": {}, "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"}}},
]
# Another team's pod holds 3 of gpu-1's GPUs; a finished pod holds nothing.
_PODS = [
    {"metadata": {"name": "busy", "namespace": "team-b"},
     "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "3", "cpu": "500m"}}}],
              "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]},
     "status": {"phase": "Running"}},
    {"metadata": {"name": "done", "namespace": "team-b"},
     "spec": {"nodeName": "gpu-0", "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
     "status": {"phase": "Succeeded"}},
]


@pytest.mark.timeout(60)
def test_inventory_from_a_fake_api_server(tmp_path):
    with _FakeApiServer(_NODES, _PODS) as server:
        nodes = {n.name: n for n in inventory_from_cluster(_kubeconfig(tmp_path, server))}
    assert nodes["gpu-0"].allocatable["nvidia.com/gpu"] == 4  # the Succeeded pod frees its GPUs
    assert nodes["gpu-1"].allocatable["nvidia.com/gpu"] == 1
    assert nodes["gpu-1"].allocatable["cpu"] == 28  # max(0.5, init 4) taken off 32
    assert nodes["gpu-0"].taints == (Taint("nvidia.com/gpu", "NoSchedule", "present"),)
    cfg = _cfg(workers=1, devices_per_worker=2)
    with pytest.raises(ProvisionError, match="chief needs 2 x nvidia.com/gpu of type A100; the largest matching node has 1"):
        plan_placement(cfg, build_tasks(cfg), list(nodes.values())[1:], source="fake")
    plan = plan_placement(cfg, build_tasks(cfg), list(nodes.values()), source="fake")
    assert set(_where(plan).values()) == {"gpu-0"}


@pytest.mark.timeout(60)
def test_inventory_without_pod_permission_uses_allocatable(tmp_path):
    with _FakeApiServer(_NODES, [], pods_status=403) as server:
        nodes = {n.name: n for n in inventory_from_cluster(_kubeconfig(tmp_path, server))}
    assert nodes["gpu-1"].allocatable["nvidia.com/gpu"] == 4
