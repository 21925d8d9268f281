"""What the runtime enforces, as the planner sees it: the units that move together, and the one
checker of a placement (used by the search's tests and by read_plan alike).

A placement maps every group key to a device string. It is one the runtime would obey when each
group's device type has kernels for all its ops (Group.allowed), an unmovable group stays where
it ran, colocated groups share a device, every device is one of the run's, and the variables on
a device fit its stated memory cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from pinpoint.device_names import parse_name
from pinpoint.errors import PlacementError
from pinpoint.plan.graph import PlanGraph, is_backward

Placement = dict[str, str]

# Group keys that are not `pinning.layers` keys (graph.py).
NOT_LAYERS = frozenset({"input", "other"})
# Groups no config field pins (the loss, the optimizer's bookkeeping): a plan leaves them where
# they ran, or its prediction would price a placement the plan file cannot ask for.
UNPINNABLE = frozenset({"other"})


def device_type(device: str) -> str | None:
    return parse_name(device)[2]


@dataclass(frozen=True)
class Unit:
    """Groups that move as one: a colocation set (or a single group)."""

    keys: tuple[str, ...]  # in the graph's order
    fixed: str | None  # the device an unmovable (or unpinnable) member keeps the unit on
    allowed: frozenset[str] | None  # device types every member has kernels for; None: any
    variable_bytes: int


def units(graph: PlanGraph) -> list[Unit]:
    """The graph's groups joined by colocation (transitively), in order of their first group."""
    parent = {g.key: g.key for g in graph.groups}

    def root(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for members in graph.colocated:
        known = [k for k in members if k in parent]
        for k in known[1:]:
            parent[root(k)] = root(known[0])
    rank = {g.key: i for i, g in enumerate(sorted(graph.groups, key=lambda g: (g.order, g.key)))}
    by_root: dict[str, list[str]] = {}
    for key in sorted(parent, key=rank.__getitem__):
        by_root.setdefault(root(key), []).append(key)
    out = []
    for keys in sorted(by_root.values(), key=lambda ks: rank[ks[0]]):
        groups = [graph.group(k) for k in keys]
        fixed = {g.device for g in groups if not g.movable or g.key in UNPINNABLE}
        if len(fixed) > 1:
            raise PlacementError(f"colocated: got {sorted(keys)} kept together but held on {sorted(fixed)} (groups "
                                 "that may not move); the run's capture is inconsistent, re-run the capture")
        allowed = None
        for g in groups:
            if g.allowed is not None:
                allowed = g.allowed if allowed is None else allowed & g.allowed
        out.append(Unit(tuple(keys), next(iter(fixed)) if fixed else None, allowed,
                        sum(g.variable_bytes for g in groups)))
    return out


def fits_type(allowed: frozenset[str] | None, device: str) -> bool:
    return allowed is None or device_type(device) in allowed


def backward_fits(graph: PlanGraph, device: str) -> bool:
    """Whether every backward group has kernels on `device` (where a pinned backward pass may go)."""
    return all(fits_type(g.allowed, device) for g in graph.groups if is_backward(g.key))


def where(key: str) -> str:
    """The plan file's field for a group: pinning.input for the input pipeline, pinning.gradients
    for a backward pass, else its layer."""
    if is_backward(key):
        return "pinning.gradients"
    return "pinning.input" if key == "input" else f"pinning.layers.{key}"


def violations(graph: PlanGraph, assign: Placement) -> list[str]:
    """One line per way the runtime would not obey `assign` (empty: it would), each naming
    the plan file's field."""
    known = set(graph.devices) | {graph.host}
    out = []
    for g in graph.groups:
        dev = assign.get(g.key)
        where_ = where(g.key)
        if dev is None:
            out.append(f"{where_}: got no device; give every group one")
        elif dev not in known:
            out.append(f"{where_}: got '{dev}', not a device of the run ({', '.join(sorted(known))}); use one of them")
        elif dev != g.device and not fits_type(g.allowed, dev):
            # (Where it ran is no override: an emulated GPU is a logical CPU and runs CPU-only ops.)
            types = ", ".join(sorted(g.allowed or ()))
            out.append(f"{where_}: got '{dev}', where {g.key} has no kernel for all its ops (it runs on {types}); "
                       f"pin it to a {types} device")
        elif not g.movable and dev != g.device and not (graph.gradient_device and is_backward(g.key)):
            why = "the program computes it there" if is_backward(g.key) else "host-only ops"
            out.append(f"{where_}: got '{dev}', but {g.key} must stay on '{g.device}' ({why}); pin it there")
    passes = sorted({assign[g.key] for g in graph.groups if is_backward(g.key) and g.key in assign})
    if graph.gradient_device and len(passes) > 1:
        out.append(f"pinning.gradients: got the backward pass on {', '.join(passes)}; pinning.gradients puts all "
                   "of it on one device, pick one")
    for members in graph.colocated:
        placed = sorted((k, assign[k]) for k in members if k in assign)
        if len({d for _, d in placed}) > 1:
            (k0, d0), (k1, d1) = placed[0], next(p for p in placed if p[1] != placed[0][1])
            out.append(f"{where(k1)}: got '{d1}', split from {k0} on '{d0}' (TensorFlow keeps them on one device); "
                       "pin them to one device")
    used: dict[str, int] = {}
    for g in graph.groups:
        if g.key in assign:
            used[assign[g.key]] = used.get(assign[g.key], 0) + g.variable_bytes
    for dev, cap in sorted(graph.memory_cap_bytes.items()):
        if used.get(dev, 0) > cap:
            out.append(f"memory_cap_bytes.{dev}: got {cap}, but the placement puts {used[dev]} bytes of variables "
                       "there; raise the cap or move groups off it")
    return out
