"""Node inventories for the feasibility check: from a YAML file, or from a cluster's nodes.

YAML shape (configs/nodes-example.yaml)::

    nodes:
      - name: gpu-a100-0
        gpus: 8                      # allocatable GPUs (resource: gpu_resource, default nvidia.com/gpu)
        gpu_type: NVIDIA-A100-SXM4-80GB   # shortcut for the GPU type label
        cpu: "96"
        memory: 1000Gi
        labels: {topology.kubernetes.io/zone: a}
        taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        allocatable: {example.com/fpga: 1}   # any other extended resource
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pinpoint.errors import ProvisionError
from pinpoint.provision.quantity import parse_quantity

_NODE_KEYS = {"name", "gpus", "gpu_resource", "gpu_type", "cpu", "memory", "labels", "taints", "allocatable", "unschedulable"}


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: dict[str, float]  # cpu in cores, memory in bytes, extended resources as counts
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "allocatable": self.allocatable,
            "labels": self.labels,
            "taints": [t.__dict__ for t in self.taints],
        }


def _amount(where: str, value: Any, source: str) -> float:
    try:
        return float(parse_quantity(value))
    except ValueError:
        raise ProvisionError(
            f"{where}: got {value!r} in {source}; write a Kubernetes quantity like '8', '500m' or '64Gi'"
        ) from None


def node_from_dict(d: Any, i: int, *, gpu_resource: str, gpu_type_label: str, source: str) -> Node:
    # Fields are named like config fields: nodes[<index>] until the node has a name, then nodes[<name>].
    where = f"nodes[{i}]"
    if not isinstance(d, dict):
        raise ProvisionError(f"{where}: got {d!r} in {source}; each node is a mapping with name, gpus, cpu, memory")
    unknown = set(d) - _NODE_KEYS
    if unknown:
        raise ProvisionError(f"{where}: got an unknown key {sorted(unknown)[0]!r} in {source}; "
                             f"use {', '.join(sorted(_NODE_KEYS))}")
    for key in ("name", "cpu", "memory"):
        if key not in d:
            raise ProvisionError(f"{where}.{key}: got nothing (missing) in {source}; add it")
    name = str(d["name"])
    where = f"nodes[{name}]"
    alloc = {"cpu": _amount(f"{where}.cpu", d["cpu"], source), "memory": _amount(f"{where}.memory", d["memory"], source)}
    for key, value in (d.get("allocatable") or {}).items():
        alloc[str(key)] = _amount(f"{where}.allocatable.{key}", value, source)
    if d.get("gpus"):
        alloc[str(d.get("gpu_resource") or gpu_resource)] = _amount(f"{where}.gpus", d["gpus"], source)
    labels = {str(k): str(v) for k, v in (d.get("labels") or {}).items()}
    if d.get("gpu_type") is not None:
        labels[gpu_type_label] = str(d["gpu_type"])
    taints = []
    for t in d.get("taints") or ():
        if not isinstance(t, dict) or "key" not in t or t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ProvisionError(
                f"{where}.taints: got {t!r} in {source}; write it as {{key: K, value: V, effect: NoSchedule|PreferNoSchedule|NoExecute}}"
            )
        taints.append(Taint(str(t["key"]), t["effect"], None if t.get("value") is None else str(t["value"])))
    if d.get("unschedulable"):
        taints.append(Taint("node.kubernetes.io/unschedulable", "NoSchedule"))
    return Node(name, alloc, labels, tuple(taints))


def load_inventory(path: str | Path, *, gpu_resource: str, gpu_type_label: str) -> list[Node]:
    p = Path(path)
    if not p.is_file():
        raise ProvisionError(f"--nodes: got '{p}', which does not exist; pass a node inventory such as configs/nodes-example.yaml")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError:
        raise ProvisionError(f"--nodes: got '{p}', which is not valid YAML; fix the syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise ProvisionError(f"--nodes: got '{p}', which has no 'nodes:' list; see configs/nodes-example.yaml")
    nodes = [
        node_from_dict(d, i, gpu_resource=gpu_resource, gpu_type_label=gpu_type_label, source=str(p))
        for i, d in enumerate(data["nodes"])
    ]
    names = [n.name for n in nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProvisionError(f"--nodes: got node name {dup[0]!r} twice in '{p}'; give every node its own name")
    return nodes


def node_from_v1(v1node: Any) -> Node:
    """A kubernetes.client.V1Node -> Node (allocatable, labels, taints; cordoned nodes get the
    unschedulable taint the scheduler applies)."""
    meta, spec, status = v1node.metadata, v1node.spec, v1node.status
    name = meta.name
    alloc = {str(k): _amount(f"nodes[{name}].allocatable.{k}", v, "the cluster") for k, v in ((status and status.allocatable) or {}).items()}
    alloc.setdefault("cpu", 0.0)
    alloc.setdefault("memory", 0.0)
    taints = [
        Taint(t.key, t.effect, t.value) for t in ((spec and spec.taints) or ()) if t.effect
    ]
    if spec is not None and spec.unschedulable:
        taints.append(Taint("node.kubernetes.io/unschedulable", "NoSchedule"))
    return Node(name, alloc, dict(meta.labels or {}), tuple(taints))


def _pod_requests(pod: Any) -> dict[str, float]:
    """Effective requests of a pod: max(sum of containers, largest init container), as the scheduler counts."""
    def requests(c) -> dict[str, float]:
        res = (c.resources and c.resources.requests) or {}
        return {str(k): float(parse_quantity(v)) for k, v in res.items()}

    total: dict[str, float] = {}
    for c in pod.spec.containers or ():
        for k, v in requests(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in pod.spec.init_containers or ():
        for k, v in requests(c).items():
            total[k] = max(total.get(k, 0.0), v)
    return total


def subtract_pods(nodes: list[Node], pods: Any) -> list[Node]:
    """Nodes with the requests of their running pods taken off (what is still free to schedule)."""
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        node_name = pod.spec.node_name if pod.spec else None
        phase = pod.status.phase if pod.status else None
        if not node_name or phase in ("Succeeded", "Failed"):
            continue
        for k, v in _pod_requests(pod).items():
            used.setdefault(node_name, {})[k] = used.get(node_name, {}).get(k, 0.0) + v
    return [
        Node(n.name, {k: max(v - used.get(n.name, {}).get(k, 0.0), 0.0) for k, v in n.allocatable.items()}, n.labels, n.taints)
        for n in nodes
    ]


def inventory_from_cluster(kubeconfig: str | Path, *, subtract_running: bool = True) -> list[Node]:
    """Read every node of the cluster `kubeconfig` points at (needs `list nodes`); with
    `subtract_running`, the requests of pods already running there are taken off (needs `list
    pods` in all namespaces; without that permission, allocatable is used as is)."""
    try:
        from kubernetes import client, config
    except ImportError:  # pragma: no cover - kubernetes is in requirements.lock
        raise ProvisionError("--kubeconfig: got no 'kubernetes' package to read it with; pip install kubernetes") from None
    p = Path(kubeconfig)
    if not p.is_file():
        raise ProvisionError(f"--kubeconfig: got '{p}', which does not exist; pass a kubeconfig file")
    try:
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(p)))
        items = api.list_node(_request_timeout=30).items
    except Exception as err:  # the client raises many types (config, HTTP, connection)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ProvisionError(
            f"--kubeconfig: cannot list nodes with '{p}' ({first}); check the context and that you may list nodes, "
            "or pass --nodes FILE"
        ) from None
    if not items:
        raise ProvisionError(f"--kubeconfig: got '{p}', whose cluster has no nodes; pass --nodes FILE instead")
    nodes = [node_from_v1(n) for n in items]
    if subtract_running:
        try:
            pods = api.list_pod_for_all_namespaces(_request_timeout=30).items
        except client.ApiException as err:
            if err.status in (401, 403):
                return nodes  # may not list pods: judge by allocatable alone
            raise ProvisionError(f"--kubeconfig: got HTTP {err.status} {err.reason} listing the pods; retry or pass --nodes FILE") from None
        nodes = subtract_pods(nodes, pods)
    return nodes
