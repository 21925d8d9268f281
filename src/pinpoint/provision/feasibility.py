"""Feasibility: place every replica on a node of an inventory, or say why it cannot be done.

Like the scheduler's filters: a node qualifies for a replica when its labels match the node
selector (plus the GPU type label for GPU replicas), every NoSchedule/NoExecute taint is
tolerated, and its allocatable resources cover the replica's requests. Replicas are packed with
a best-fit depth-first search (identical replicas of a role are interchangeable, which prunes
the search), so a placement is found whenever one exists within the step budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from pinpoint.config import Config, Toleration
from pinpoint.errors import ProvisionError
from pinpoint.provision.inventory import Node, Taint
from pinpoint.provision.quantity import format_bytes, format_cpu
from pinpoint.provision.tasks import Task

SEARCH_BUDGET = 50_000  # ~1 s; beyond it the request is reported as not placeable
_EPS = 1e-9


@dataclass(frozen=True)
class _Need:
    task: Task
    amounts: dict[str, float]
    selector: dict[str, str]


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.key != taint.key:
        return False
    if tol.effect is not None and tol.effect != taint.effect:
        return False
    return tol.operator == "Exists" or (tol.value or "") == (taint.value or "")


def _exclusion(node: Node, need: _Need, tolerations: tuple[Toleration, ...]) -> str | None:
    """Why `node` cannot take this replica whatever its free capacity (None: it can)."""
    for key, want in need.selector.items():
        have = node.labels.get(key)
        if have != want:
            return f"{node.name} has {key}={have}" if have is not None else f"{node.name} lacks label {key}"
    for taint in node.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            if taint.key == "node.kubernetes.io/unschedulable":
                return f"{node.name} is cordoned (unschedulable)"
            shown = f"{taint.key}={taint.value}" if taint.value else taint.key
            return f"{node.name} has taint {shown}:{taint.effect} (add it to cluster.tolerations)"
    return None


def _describe(resource: str, amount: float, need: _Need) -> str:
    if resource == "memory":
        return f"{format_bytes(amount)} memory"
    if resource == "cpu":
        return f"{format_cpu(amount)} CPU"
    res = need.task.resources
    kind = f" of type {res.gpu_type}" if resource == res.gpu_resource and res.gpu_type else ""
    return f"{amount:g} x {resource}{kind}"


def _ordered(amounts: dict[str, float]) -> list[str]:
    """GPUs (extended resources) first, then memory, then CPU: the order messages use."""
    return sorted(amounts, key=lambda r: (r in ("cpu", "memory"), r != "memory", r))


def _short(resource: str, amount: float) -> str:
    if resource == "memory":
        return format_bytes(amount)
    if resource == "cpu":
        return f"{format_cpu(amount)} CPU"
    return f"{amount:g}"


def _needs(cfg: Config, tasks: list[Task]) -> list[_Need]:
    out = []
    for t in tasks:
        selector = dict(cfg.cluster.node_selector)
        if t.resources.gpu_type:
            selector[cfg.cluster.gpu_type_label] = t.resources.gpu_type
        out.append(_Need(t, t.resources.amounts(), selector))
    return out


def _fits(free: dict[str, float], amounts: dict[str, float]) -> bool:
    return all(free.get(r, 0.0) + _EPS >= a for r, a in amounts.items())


def _single_replica_check(need: _Need, eligible: list[Node], excluded: list[str], n_nodes: int) -> None:
    role = need.task.role
    if not eligible:
        want = ", ".join(f"{k}={v}" for k, v in need.selector.items())
        what = f"a node with {want}" if want else "a node"
        raise ProvisionError(
            f"feasibility: {role} needs {what} whose taints it tolerates; none of the {n_nodes} node(s) qualifies: "
            + "; ".join(excluded[:4])
            + ("; ..." if len(excluded) > 4 else "")
            + "; fix cluster.node_selector/tolerations/gpu_type or the inventory"
        )
    for r in _ordered(need.amounts):
        largest = max(n.allocatable.get(r, 0.0) for n in eligible)
        if largest + _EPS < need.amounts[r]:
            # GPUs: "has 4"; cpu and memory keep their unit: "has 32Gi memory".
            shown = f"{largest:g}" if r not in ("cpu", "memory") else _describe(r, largest, need)
            raise ProvisionError(
                f"feasibility: {role} needs {_describe(r, need.amounts[r], need)}; the largest matching node has {shown}; "
                "request less per replica (cluster.*) or add a larger node"
            )
    if not any(_fits(n.allocatable, need.amounts) for n in eligible):
        wants = " + ".join(_describe(r, need.amounts[r], need) for r in _ordered(need.amounts))
        raise ProvisionError(
            f"feasibility: {role} needs {wants} on one node; no matching node has all of them at once; "
            "request less per replica (cluster.*) or add a larger node"
        )


def plan_placement(cfg: Config, tasks: list[Task], nodes: list[Node], *, source: str) -> dict:
    """The placement plan (dict for placement_plan.json); ProvisionError with the reason if
    some replica cannot be placed."""
    needs = _needs(cfg, tasks)
    eligible_idx = _eligible(needs, nodes, cfg.cluster.tolerations)

    # Biggest replicas first (GPUs, then memory, then CPU): they are the hardest to place.
    def weight(k: int):
        a = needs[k].amounts
        gpus = sum(v for r, v in a.items() if r not in ("cpu", "memory"))
        return (-gpus, -a["memory"], -a["cpu"], needs[k].task.role, needs[k].task.index)

    # Not enough in total: say so before searching (the search would only exhaust its budget).
    short = _capacity_failure(needs, nodes, eligible_idx) or _slot_failure(needs, nodes, eligible_idx)
    if short:
        raise ProvisionError(short)
    order = sorted(range(len(needs)), key=weight)
    gpu_nodes = [any(r not in ("cpu", "memory", "pods", "ephemeral-storage") and v > 0 and not r.startswith("hugepages-")
                     for r, v in n.allocatable.items()) for n in nodes]
    free = [dict(n.allocatable) for n in nodes]
    assign: dict[int, int] = {}
    steps = 0
    first_dead_end: list = []

    def search(pos: int) -> bool:
        nonlocal steps
        if pos == len(order):
            return True
        k = order[pos]
        need = needs[k]
        # Identical replicas of a role are interchangeable: keep their node indices non-decreasing.
        floor = 0
        if pos > 0:
            prev = order[pos - 1]
            if needs[prev].task.role == need.task.role:
                floor = assign[prev]
        candidates = [i for i in eligible_idx[k] if i >= floor and _fits(free[i], need.amounts)]
        # Best fit: the node left with the least room for this replica's scarcest resource.
        # Replicas without GPUs stay off GPU nodes when they can (keep GPUs for GPU replicas).
        wants_gpu = any(r not in ("cpu", "memory") for r in need.amounts)
        candidates.sort(
            key=lambda i: (
                not wants_gpu and gpu_nodes[i],
                *(free[i].get(r, 0.0) - a for r, a in sorted(need.amounts.items(), key=lambda x: x[0] in ("cpu", "memory"))),
            )
        )
        if not first_dead_end and not any(_fits(free[i], need.amounts) for i in eligible_idx[k]):
            # A true dead end (no node has room left, whatever the symmetry rule): explainable.
            first_dead_end.append((k, [dict(f) for f in free]))
        for i in candidates:
            steps += 1
            if steps > SEARCH_BUDGET:
                return False
            for r, a in need.amounts.items():
                free[i][r] -= a
            assign[k] = i
            if search(pos + 1):
                return True
            for r, a in need.amounts.items():
                free[i][r] += a
            del assign[k]
        return False

    if not search(0):
        raise ProvisionError(_packing_failure(needs, nodes, eligible_idx, first_dead_end, steps > SEARCH_BUDGET))

    return _feasible_plan(needs, nodes, assign, source)


def _eligible(needs: list[_Need], nodes: list[Node], tolerations) -> list[list[int]]:
    """Per replica, the indices of the nodes that could take it; ProvisionError when none can."""
    eligible_idx: list[list[int]] = []
    for need in needs:
        excluded, ok = [], []
        for i, node in enumerate(nodes):
            why = _exclusion(node, need, tolerations)
            (excluded.append(why) if why else ok.append(i))
        _single_replica_check(need, [nodes[i] for i in ok], excluded, len(nodes))
        eligible_idx.append(ok)
    return eligible_idx


def _feasible_plan(needs: list[_Need], nodes: list[Node], assign: dict[int, int], source: str) -> dict:
    """The plan of a found assignment (replica index -> node index), with each node's use."""
    used = [dict.fromkeys(n.allocatable, 0.0) for n in nodes]
    placements = []
    for k, need in enumerate(needs):
        i = assign[k]
        for r, a in need.amounts.items():
            used[i][r] = used[i].get(r, 0.0) + a
        placements.append({"task": need.task.name, "node": nodes[i].name, "requests": need.amounts})
    return {
        "status": "feasible",
        "source": source,
        "placements": placements,
        "nodes": [
            {**n.to_json(), "used": {r: v for r, v in used[i].items() if v}, "replicas": sum(1 for k in assign if assign[k] == i)}
            for i, n in enumerate(nodes)
        ],
    }


def _capacity_failure(needs, nodes, eligible_idx) -> str | None:
    """Total demand against the total supply of the nodes that could take those replicas."""
    resources = sorted({r for n in needs for r in n.amounts}, key=lambda r: (r in ("cpu", "memory"), r))
    for r in resources:
        group = [k for k, n in enumerate(needs) if n.amounts.get(r)]
        demand = sum(needs[k].amounts[r] for k in group)
        pool = sorted({i for k in group for i in eligible_idx[k]})
        supply = sum(nodes[i].allocatable.get(r, 0.0) for i in pool)
        if demand > supply + _EPS:
            roles = sorted({needs[k].task.role for k in group})
            d, s = _describe(r, demand, needs[group[0]]), _describe(r, supply, needs[group[0]])
            per = ", ".join(f"{nodes[i].name}: {_describe(r, nodes[i].allocatable.get(r, 0.0), needs[group[0]]).split(' x ')[0]}" for i in pool[:6])
            return (
                f"feasibility: the {len(group)} {'/'.join(roles)} replica(s) need {d} in total; the matching nodes "
                f"have {s.split(' of type')[0]} ({per}); add nodes or reduce replicas"
            )
    return None


def _slot_failure(needs, nodes, eligible_idx) -> str | None:
    """Identical replicas (same requests and selector): count how many each node can hold."""
    groups: dict[tuple, list[int]] = {}
    for k, n in enumerate(needs):
        groups.setdefault((tuple(sorted(n.amounts.items())), tuple(sorted(n.selector.items()))), []).append(k)
    for members in groups.values():
        need = needs[members[0]]
        slots = {
            i: int(min((nodes[i].allocatable.get(r, 0.0) + _EPS) // a for r, a in need.amounts.items() if a > 0))
            for i in eligible_idx[members[0]]
        }
        if sum(slots.values()) < len(members):
            roles = "/".join(dict.fromkeys(needs[k].task.role for k in members))
            wants = " + ".join(_describe(r, need.amounts[r], need) for r in _ordered(need.amounts))
            per = ", ".join(f"{nodes[i].name}: {c}" for i, c in list(slots.items())[:6])
            return (
                f"feasibility: the replicas fit in total but not node by node: the {len(members)} {roles} replica(s) "
                f"need {wants} each and the matching nodes hold {sum(slots.values())} of them ({per}); "
                "add nodes or use fewer devices per replica"
            )
    return None


def _packing_failure(needs, nodes, eligible_idx, dead_end, over_budget: bool) -> str:
    if dead_end and not over_budget:
        k, free = dead_end[0]
        need = needs[k]
        pool = eligible_idx[k]
        # Name only the resources that blocked this replica on every node it could use.
        blocking = [r for r in _ordered(need.amounts) if all(free[i].get(r, 0.0) + _EPS < need.amounts[r] for i in pool)]
        shown = blocking or _ordered(need.amounts)
        # One blocking resource: bare amounts ("gpu-0: 1"); several: each with its unit.
        fmt = _short if len(shown) == 1 else (lambda r, a: _short(r, a) if r in ("cpu", "memory") else f"{a:g} x {r}")
        left = ", ".join(
            f"{nodes[i].name}: " + " + ".join(fmt(r, max(free[i].get(r, 0.0), 0.0)) for r in shown) for i in pool
        )
        wants = " + ".join(_describe(r, need.amounts[r], need) for r in shown)
        return (
            f"feasibility: the replicas fit in total but not node by node: {need.task.name} needs {wants} "
            f"and after placing the larger replicas the matching nodes have {left} left; add a node or use fewer "
            "devices per replica"
        )
    if over_budget:
        return f"feasibility: no placement found within {SEARCH_BUDGET} search steps; reduce replicas or check the inventory"
    capacity = ", ".join(
        f"{n.name}: " + " + ".join(_short(r, n.allocatable.get(r, 0.0)) for r in _ordered(needs[0].amounts)) for n in nodes[:6]
    )
    return (
        f"feasibility: no assignment of the {len(needs)} replicas fits every node's resources at once "
        f"(nodes: {capacity}); add a node or use fewer devices per replica"
    )
