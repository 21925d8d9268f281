"""Bytes per parameter server: predicted for a placement, and measured from a run's transfers.

Where a variable lives under a placement (ParameterServerStrategyV2, see docs/plan.md): a variable
of a group placed on a ps device is there (train.pinning.layers); any other variable keeps
TensorFlow's round-robin slot, server (creation index mod servers), since the strategy's counter
counts pinned variables too. A step is one closure on one worker (ClusterCoordinator): it pulls
each variable the step updates and pushes its gradient (or increment) back, the same bytes each
way, so a server carries 2 * sum(bytes of its per-step variables) between it and the workers
per step, however many workers there are. A variable the step
only reads (the learning rate) is read by the update ops on the servers: that server-to-server
traffic is not part of the figure (measured_ps_bytes leaves it out too).
"""

from __future__ import annotations

from pinpoint.device_names import parse_name, sort_key
from pinpoint.placement import Placement as PlacementModel
from pinpoint.plan.check import Placement
from pinpoint.plan.graph import OTHER, PlanGraph


def servers_of(devices) -> list[str]:
    return sorted((d for d in devices if parse_name(d)[0] == "ps"), key=sort_key)


def is_server(device: str) -> bool:
    return parse_name(device)[0] == "ps"


def variable_servers(graph: PlanGraph, assign: Placement) -> dict[str, str]:
    """variable name -> the server it lives on under `assign`."""
    servers = servers_of(graph.devices)
    out = {}
    for v in graph.ps_variables:
        if v.follows:
            continue
        # "other" (the optimizer's counters) has no pinning field: its variables keep their slots.
        pinned = assign.get(v.group) if v.group != OTHER else None
        out[v.name] = pinned if pinned and is_server(pinned) else servers[v.index % len(servers)]
    for v in graph.ps_variables:
        if v.follows:  # an optimizer slot, colocated with its variable
            out[v.name] = out[v.follows]
    return out


def predicted_ps_bytes(graph: PlanGraph, assign: Placement) -> dict[str, int]:
    """server -> bytes it sends to and receives from the workers per step under `assign`."""
    out = dict.fromkeys(servers_of(graph.devices), 0)
    where = variable_servers(graph, assign)
    for v in graph.ps_variables:
        if v.per_step:
            out[where[v.name]] += 2 * v.bytes
    return out


def unpinned(graph: PlanGraph) -> Placement:
    """No layer pinned to a server: TensorFlow's round-robin for every variable. A layer group
    whose ops ran mostly on a server (its reads and updates outnumber its compute) is put on the
    first worker, since a group placed on a server means pinned there."""
    home = step_worker(graph)
    return {g.key: home if is_server(g.device) and g.key != OTHER else g.device for g in graph.groups}


def requested_placement(graph: PlanGraph) -> Placement:
    """The user's own pins (a layer requested on a server), the rest unpinned."""
    return unpinned(graph) | {g.key: g.requested for g in graph.groups if g.requested and is_server(g.requested)}


def measured_placement(graph: PlanGraph) -> Placement:
    """The run as measured: a group whose variables all sat on one server other than their
    round-robin slots was pinned there; the rest unpinned."""
    servers = servers_of(graph.devices)
    assign = unpinned(graph)
    by_group: dict[str, list] = {}
    for v in graph.ps_variables:
        by_group.setdefault(v.group, []).append(v)
    for key, vs in by_group.items():
        where = {v.server for v in vs}
        turns = [v for v in vs if not v.follows]
        if key != OTHER and key in assign and len(where) == 1 and \
                any(v.server != servers[v.index % len(servers)] for v in turns):
            assign[key] = where.pop()
    return assign


def step_worker(graph: PlanGraph) -> str:
    """The task a captured step ran on: the first worker (the capture places its one step on
    /job:worker/replica:0/task:0), else the host."""
    return next((d for d in sorted(graph.devices, key=sort_key) if parse_name(d)[0] == "worker"), graph.host)


def predicted_ps_pairs(graph: PlanGraph, assign: Placement) -> dict[str, int]:
    """'a -> b' -> bytes per step between each server and the step's worker under `assign`:
    the pulls (server -> worker) and the pushed updates (worker -> server), half of each
    server's predicted_ps_bytes each way."""
    worker, out = step_worker(graph), {}
    for server, nbytes in predicted_ps_bytes(graph, assign).items():
        out[f"{server} -> {worker}"] = out[f"{worker} -> {server}"] = nbytes // 2
    return out


def measured_ps_bytes(placement: PlacementModel) -> dict[str, int]:
    """server -> bytes per step it sent to and received from the worker and chief tasks, from
    placement.json's transfers.matrix (rows: sender, columns: receiver)."""
    matrix = placement.transfers.matrix
    servers = servers_of(set(matrix) | {d for row in matrix.values() for d in row})
    out = dict.fromkeys(servers, 0)
    for src, row in matrix.items():
        for dst, cell in row.items():
            a, b = parse_name(src)[0], parse_name(dst)[0]
            if a == "ps" and b in ("worker", "chief"):
                out[src] += cell.bytes
            elif b == "ps" and a in ("worker", "chief"):
                out[dst] += cell.bytes
    return out


def ps_rationale(graph: PlanGraph, plan: Placement, before: float | None, after: float | None) -> list[str]:
    """One line per layer whose variables the plan moves off the servers they were measured on."""
    was, now = variable_servers(graph, measured_placement(graph)), variable_servers(graph, plan)
    ratio = f", largest server/mean {before:.2f} -> {after:.2f}x" if before and after else ""
    lines = []
    for key in dict.fromkeys(v.group for v in graph.ps_variables if v.group != OTHER):
        vs = [v for v in graph.ps_variables if v.group == key and not v.follows]
        if all(was[v.name] == now[v.name] for v in vs):
            continue
        old = sorted({was[v.name] for v in vs}, key=sort_key)
        lines.append(f"{key}: variables ({sum(v.bytes for v in vs)} B) {' + '.join(old)} -> {now[vs[0].name]}{ratio}")
    return lines
