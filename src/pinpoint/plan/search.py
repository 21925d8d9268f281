"""The planner: Baechi's memory-constrained list schedulers over the F/B task DAG (tasks.py).

From Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs" (SoCC 2020):
- m-ETF (earliest task first): repeatedly take, over every ready task and every device it may
  use, the pair with the earliest possible start — the device free and the task's inputs there
  (a transfer from another device priced by the link model) — and put the task there. A group
  is placed with its first task; its other task and its colocated groups follow it. "m": a
  device is a candidate only while the group's variables fit its memory cap (and, when the run
  kept its memory replay, a finished candidate whose predicted peak on a device is above that
  device's cap is ruled out: plan.memory).
- m-SCT (smallest communication time): ETF with a favorite child per group, kept on its
  parent's device. The paper picks favorite children with an LP relaxation; here the favorite
  child is chosen greedily: the group the parent's heaviest forward edge feeds. When a parent
  is placed, its device is reserved for the favorite child: other unplaced groups go elsewhere
  while they have another device, and a ready favorite child is scheduled first, on the
  reserved device.
Transfers are priced without link contention while scheduling; the prediction (predict.py)
queues them.

Objectives (both schedulers run, and the run's own placement, the user's and the even split
compete when they keep to the target devices; the best by the objective is the plan):
- step_time: the smallest predicted step_us (fewer bytes crossing on a tie);
- balance: the smallest busiest-device compute, ties broken by bytes crossing, where a busiest
  device within BALANCE_TOLERANCE of the mean counts as a tie (a perfect balance bought with
  five times the traffic is not a better plan); when the user's own split spreads the model over
  two or more of the target devices, only plans sending no more bytes per step than it compete
  (if any does). The schedulers' placements and the even
  topological split (baselines.py) are refined by moving one unit (a group with its colocated
  groups) at a time while that lowers the key.
A backward pass the program pinned to one device (graph.gradient_device) moves as one piece: the
layers are planned around it where it ran and on each other target device it may take, and all of
those candidates compete.
For strategy parameter_server the plan spreads variables over the servers instead: the groups
with variables, largest first, each to the server carrying the fewest bytes so far (LPT), the
rest where they ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pinpoint.device_names import parse_name
from pinpoint.errors import PlacementError
from pinpoint.plan.baselines import even_split, measured, user
from pinpoint.plan.check import Placement, Unit, backward_fits, fits_type, units, violations
from pinpoint.plan.graph import OTHER, PlanGraph
from pinpoint.plan.links import LinkModel
from pinpoint.plan.memory import no_fit_error, over_cap, ruled_lines
from pinpoint.plan.predict import predict
from pinpoint.plan.servers import is_server, measured_placement, servers_of, unpinned
from pinpoint.plan.tasks import TaskGraph, costs, task_graph

OBJECTIVES = ("step_time", "balance")
BALANCE_TOLERANCE = 0.05


def balance_key(load: dict[str, float], devices: tuple[str, ...], crossing: int) -> tuple[float, int]:
    """(busiest compute over `devices`, but no less than (1 + tolerance) x their mean; crossing)."""
    values = [load.get(d, 0.0) for d in devices]
    floor = (1 + BALANCE_TOLERANCE) * sum(values) / len(values)
    # Rounded to the ns: the same loads summed in another order must tie (then bytes decide).
    return round(max(max(values), floor), 3), crossing


@dataclass(frozen=True)
class Plan:
    placement: Placement
    algorithm: str  # "m-ETF", "m-SCT", "... + balance moves", "LPT over parameter servers"
    # Candidates whose predicted memory was above a device's cap, one line each (plan.memory.ruled_lines).
    ruled_out: tuple[str, ...] = ()


class _Space:
    """The units and the devices each may use, with memory left per device."""

    def __init__(self, graph: PlanGraph, devices: tuple[str, ...]):
        self.graph = graph
        self.units = units(graph)
        self.unit_of = {k: i for i, u in enumerate(self.units) for k in u.keys}
        self.candidates = [self._candidates(u, devices) for u in self.units]
        self.caps = dict(graph.memory_cap_bytes)

    def _candidates(self, u: Unit, devices: tuple[str, ...]) -> list[str]:
        if u.fixed is not None:
            return [u.fixed]
        found = [d for d in devices if fits_type(u.allowed, d)]
        if not found:  # e.g. a host-only group on a GPU plan: the host, or any run device it fits
            found = [d for d in (self.graph.host, *self.graph.devices) if fits_type(u.allowed, d)][:1]
        if not found:
            raise PlacementError(f"allowed: got {sorted(u.allowed or ())} for {', '.join(u.keys)}, and no device of "
                                 f"the run ({', '.join(self.graph.devices)}) has that type; add such a device")
        room = [d for d in found if u.variable_bytes <= self.caps_get(d)]
        if not room:
            caps = {d: self.graph.memory_cap_bytes[d] for d in found}
            raise PlacementError(f"memory_cap_bytes: got {caps}, but {', '.join(u.keys)} holds {u.variable_bytes} "
                                 "bytes of variables, more than any device it may use; raise the cap")
        return found

    def caps_get(self, d: str) -> float:
        return self.graph.memory_cap_bytes.get(d, math.inf)


def _no_room(space: _Space, u: Unit) -> PlacementError:
    caps = {d: space.graph.memory_cap_bytes[d] for d in space.candidates[space.unit_of[u.keys[0]]]
            if d in space.graph.memory_cap_bytes}
    return PlacementError(f"memory_cap_bytes: got {caps}, but no placement fits: {', '.join(u.keys)} needs "
                          f"{u.variable_bytes} bytes of variables after the others took theirs; raise the caps "
                          "or add devices")


def _favorites(graph: PlanGraph, rank: dict[str, int], space: _Space) -> dict[int, int]:
    """m-SCT's favorite child per unit, chosen greedily (not by the paper's LP): the unit its
    heaviest forward edge feeds."""
    heaviest: dict[str, tuple[int, str]] = {}
    for e in graph.edges:
        if e.src in rank and e.dst in rank and rank[e.src] < rank[e.dst]:
            if e.bytes > heaviest.get(e.src, (-1, ""))[0]:
                heaviest[e.src] = (e.bytes, e.dst)
    favorite: dict[int, int] = {}
    for src, (_, dst) in heaviest.items():
        a, b = space.unit_of[src], space.unit_of[dst]
        if a != b:
            favorite.setdefault(a, b)
    return favorite


def _options(space: _Space, u: int, at: dict[str, float], left: dict[str, float],
             reserved: dict[str, set[int]] | None) -> tuple[list[str], bool]:
    """(devices unplaced unit u may take now, whether it is an urgent favorite child): those with
    room; under m-SCT (reserved given) only its reserved device if it has one, else the devices
    not reserved for another unit while there are any."""
    vb = space.units[u].variable_bytes
    options = [d for d in at if vb <= left[d]]
    if not options:
        raise _no_room(space, space.units[u])
    if reserved is None:
        return options, False
    mine = [d for d in options if u in reserved[d]]
    if mine:
        return mine, True
    return [d for d in options if not reserved[d]] or options, False


def list_schedule(graph: PlanGraph, tg: TaskGraph, space: _Space, links: LinkModel, sct: bool) -> Placement:
    """m-ETF (sct False) or m-SCT (sct True); see the module doc."""
    n = len(tg.duration)
    rank = {k: i for i, k in enumerate(tg.keys)}
    unit_of_task = [space.unit_of[tg.keys[t // 2]] for t in range(n)]
    placed: list[str | None] = [None] * len(space.units)
    left = {d: space.caps_get(d) for c in space.candidates for d in c}
    free = dict.fromkeys(left, 0.0)
    finish = [0.0] * n
    device_of_task: list[str | None] = [None] * n
    missing = [len(p) for p in tg.pred]
    ready: dict[int, dict[str, float]] = {}  # task -> device -> time its inputs are there
    position = {t: i for i, t in enumerate(tg.topo)}
    favorite: dict[int, int] = {}  # parent unit -> favorite child unit (m-SCT)
    reserved: dict[str, set[int]] = {d: set() for d in left}
    if sct:
        favorite = _favorites(graph, rank, space)

    def inputs_at(t: int, d: str) -> float:
        at = 0.0
        for p, nbytes in tg.pred[t]:
            src = device_of_task[p]
            at = max(at, finish[p] + (0.0 if src == d else links.transfer_us(src, d, nbytes)))
        return at

    def make_ready(t: int) -> None:
        u = unit_of_task[t]
        devs = [placed[u]] if placed[u] is not None else space.candidates[u]
        ready[t] = {d: inputs_at(t, d) for d in devs}

    for t in range(n):
        if missing[t] == 0:
            make_ready(t)
    while ready:
        best = None
        for t, at in ready.items():
            u = unit_of_task[t]
            options, urgent = ([placed[u]], False) if placed[u] is not None else \
                _options(space, u, at, left, reserved if sct else None)
            for d in options:
                key = (not urgent, max(free[d], at[d]), position[t], d)
                if best is None or key < best[0]:
                    best = (key, t, d)
        _, t, d = best
        del ready[t]
        u = unit_of_task[t]
        if placed[u] is None:
            placed[u] = d
            left[d] -= space.units[u].variable_bytes
            for held in reserved.values():
                held.discard(u)
            child = favorite.get(u)
            if child is not None and placed[child] is None and d in space.candidates[child]:
                reserved[d].add(child)
            for other in ready:  # the unit's other ready tasks may now only go to d
                if unit_of_task[other] == u:
                    ready[other] = {d: ready[other].get(d, inputs_at(other, d))}
        start = max(free[d], inputs_at(t, d))
        finish[t] = free[d] = start + tg.duration[t]
        device_of_task[t] = d
        for s, _ in tg.succ[t]:
            missing[s] -= 1
            if missing[s] == 0:
                make_ready(s)
    return {k: placed[space.unit_of[k]] for k in tg.keys}


def _balance_moves(graph: PlanGraph, space: _Space, assign: Placement, devices: tuple[str, ...],
                   cost: dict[str, float]) -> Placement:
    """Move one unit at a time while (busiest compute over `devices`, bytes crossing) drops."""
    dev_of = [assign[u.keys[0]] for u in space.units]
    ucost = [sum(cost[k] for k in u.keys) for u in space.units]
    adj: list[dict[int, int]] = [{} for _ in space.units]
    for e in graph.edges:
        a, b = space.unit_of.get(e.src), space.unit_of.get(e.dst)
        if a is not None and b is not None and a != b:
            adj[a][b] = adj[a].get(b, 0) + e.bytes
            adj[b][a] = adj[b].get(a, 0) + e.bytes
    load = dict.fromkeys(devices, 0.0)
    mem: dict[str, float] = {}
    for i, d in enumerate(dev_of):
        load[d] = load.get(d, 0.0) + ucost[i]
        mem[d] = mem.get(d, 0) + space.units[i].variable_bytes
    crossing = sum(n for a in range(len(adj)) for b, n in adj[a].items() if a < b and dev_of[a] != dev_of[b])

    current = balance_key(load, devices, crossing)
    for _ in range(4 * len(space.units) + 10):
        best = None
        for i, u in enumerate(space.units):
            src = dev_of[i]
            for dst in space.candidates[i]:
                if dst == src or mem.get(dst, 0) + u.variable_bytes > space.caps_get(dst):
                    continue
                load[src] -= ucost[i]
                load[dst] = load.get(dst, 0.0) + ucost[i]
                delta = sum(n * ((dev_of[j] != dst) - (dev_of[j] != src)) for j, n in adj[i].items())
                key = balance_key(load, devices, crossing + delta)
                load[src] += ucost[i]
                load[dst] -= ucost[i]
                if key < current and (best is None or key < best[0]):
                    best = (key, i, dst, delta)
        if best is None:
            break
        current, i, dst, delta = best
        src = dev_of[i]
        load[src] -= ucost[i]
        load[dst] += ucost[i]
        mem[src] -= space.units[i].variable_bytes
        mem[dst] = mem.get(dst, 0) + space.units[i].variable_bytes
        crossing += delta
        dev_of[i] = dst
    return {k: dev_of[i] for i, u in enumerate(space.units) for k in u.keys}


def _depth_first(graph: PlanGraph, space: _Space) -> list[int]:
    """The units in a topological order (forward edges) that finishes a branch before starting
    the next (Kahn's algorithm taking the unit released last): a tower's units stay together, so
    contiguous runs of this order can put parallel towers on their own devices."""
    n = len(space.units)
    succ: list[set[int]] = [set() for _ in range(n)]
    for e in graph.edges:
        a, b = space.unit_of.get(e.src), space.unit_of.get(e.dst)
        if a is not None and b is not None and a < b:
            succ[a].add(b)
    missing = [0] * n
    for a in range(n):
        for b in succ[a]:
            missing[b] += 1
    stack = [i for i in range(n - 1, -1, -1) if missing[i] == 0]
    out = []
    while stack:
        a = stack.pop()
        out.append(a)
        for b in sorted(succ[a], reverse=True):
            missing[b] -= 1
            if missing[b] == 0:
                stack.append(b)
    return out


def _cut_edges(graph: PlanGraph, space: _Space, pos: dict[int, int], dev_of: dict[int, str],
               order: tuple[str, ...]) -> tuple[list[list[tuple[int, int]]], list[int], list[list[int]]]:
    """For the free units (by position): each one's edges to later free units (position, bytes),
    the bytes of its edges to earlier ones, and per device slot the bytes of its edges to fixed
    units on another device."""
    n, k = len(pos), len(order)
    later: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    into = [0] * n
    ext = [[0] * k for _ in range(n)]
    for e in graph.edges:
        a, b = space.unit_of.get(e.src), space.unit_of.get(e.dst)
        if a is None or b is None or a == b:
            continue
        if a in pos and b in pos:
            lo, hi = sorted((pos[a], pos[b]))
            later[lo].append((hi, e.bytes))
            into[hi] += e.bytes
        elif a in pos or b in pos:
            j, fixed = (pos[a], dev_of[b]) if a in pos else (pos[b], dev_of[a])
            for s in range(k):
                ext[j][s] += e.bytes * (order[s] != fixed)
    return later, into, ext


def _lowest_busiest(load, n: int, k: int) -> float:
    """The lowest busiest device over every cut of n units into k runs (`load(s, p, q)`: run s
    holding units p..q-1). A run's load only grows as it starts earlier, so the scan over its
    start p stops once that load alone is no better than the best found."""
    lowest = [load(0, 0, q) for q in range(n + 1)]
    for s in range(1, k):
        row = []
        for q in range(n + 1):
            found = math.inf
            for p in range(q, -1, -1):
                here = load(s, p, q)
                if here >= found:
                    break
                found = min(found, max(lowest[p], here))
            row.append(found)
        lowest = row
    return lowest[n]


def _fewest_bytes(load, limit: float, prefix_ext: list[list[int]], later: list[list[tuple[int, int]]],
                  into: list[int], n: int, k: int) -> list[list[tuple[float, int]]]:
    """best[s][q] = (bytes, start of run s) of the cut of units 0..q-1 into runs 0..s with the
    fewest bytes crossing and every run's load within `limit`. Crossing = all edges between free
    units - those inside a run + edges to fixed units elsewhere; the first term is the same for
    every cut. `inside` is the bytes of the edges within the run p..q-1."""
    inf = math.inf
    best = [[(inf, -1)] * (n + 1) for _ in range(k)]
    inside = 0
    for q in range(n + 1):
        if q > 0:
            inside += into[q - 1]
        if load(0, 0, q) <= limit:
            best[0][q] = (prefix_ext[0][q] - inside, 0)
    for s in range(1, k):
        for q in range(n + 1):
            inside = 0
            for p in range(q, -1, -1):
                if p < q:
                    inside += sum(nb for hi, nb in later[p] if hi < q)
                if load(s, p, q) > limit:
                    break
                if best[s - 1][p][0] < inf:
                    c = best[s - 1][p][0] + prefix_ext[s][q] - prefix_ext[s][p] - inside
                    if c < best[s][q][0]:
                        best[s][q] = (c, p)
    return best


def _contiguous(graph: PlanGraph, space: _Space, devices: tuple[str, ...], cost: dict[str, float],
                reverse: bool, sequence: list[int] | None = None) -> Placement | None:
    """The movable units in `sequence` (default: the graph's order), cut into one contiguous run
    per device (`devices` in order, or reversed): among the cuts whose busiest device is as low as
    any cut's (or within the balance tolerance of the mean), the one with the fewest bytes
    crossing. Exact over contiguous cuts (dynamic programming over cut points); None when no unit
    may take every device."""
    order = devices[::-1] if reverse else devices
    k = len(order)
    if sequence is None:
        sequence = list(range(len(space.units)))
    free = [i for i in sequence if set(order) <= set(space.candidates[i])]
    if not free:
        return None
    pos = {u: j for j, u in enumerate(free)}
    ran = [graph.group(u.keys[0]).device for u in space.units]  # the others stay where they ran, if allowed
    dev_of = {i: ran[i] if ran[i] in space.candidates[i] else space.candidates[i][0]
              for i in range(len(space.units)) if i not in pos}
    w = [sum(cost[key] for key in space.units[i].keys) for i in free]
    base = [sum(sum(cost[key] for key in space.units[i].keys) for i, d in dev_of.items() if d == dev) for dev in order]
    n = len(free)
    later, into, ext = _cut_edges(graph, space, pos, dev_of, order)
    prefix_w = [0.0]
    for x in w:
        prefix_w.append(prefix_w[-1] + x)
    prefix_ext = [[0] * (n + 1) for _ in range(k)]
    for s in range(k):
        for j in range(n):
            prefix_ext[s][j + 1] = prefix_ext[s][j] + ext[j][s]

    def load(s: int, p: int, q: int) -> float:
        return base[s] + prefix_w[q] - prefix_w[p]

    mean = (sum(base) + prefix_w[n]) / k
    limit = max(_lowest_busiest(load, n, k), (1 + BALANCE_TOLERANCE) * mean) * (1 + 1e-9)
    best = _fewest_bytes(load, limit, prefix_ext, later, into, n, k)
    if best[k - 1][n][0] == math.inf:  # float edge: the limit came from this very table
        return None
    cuts, q = [], n
    for s in range(k - 1, -1, -1):
        p = best[s][q][1]
        cuts.append((s, p, q))
        q = p
    assign = {key: d for i, d in dev_of.items() for key in space.units[i].keys}
    for s, p, q in cuts:
        for j in range(p, q):
            for key in space.units[free[j]].keys:
                assign[key] = order[s]
    return assign


def _ps_plan(graph: PlanGraph, space: _Space, servers: tuple[str, ...]) -> Placement:
    assign = {g.key: g.device for g in graph.groups}
    carried = dict.fromkeys(servers, 0)
    if graph.ps_variables:  # a group left on a server would mean pinned there: start unpinned
        assign = unpinned(graph)
        # Variables no pin moves (the optimizer's step counter) keep their round-robin slots.
        every = servers_of(graph.devices)
        for v in graph.ps_variables:
            slot = every[v.index % len(every)]
            if v.group == OTHER and v.per_step and slot in carried:
                carried[slot] += v.bytes
    mem = {d: 0 for d in servers}
    order = sorted(range(len(space.units)), key=lambda i: (-space.units[i].variable_bytes, i))
    for i in order:
        u = space.units[i]
        if u.variable_bytes == 0 or u.fixed is not None:
            continue
        options = [d for d in servers if fits_type(u.allowed, d) and mem[d] + u.variable_bytes <= space.caps_get(d)]
        if not options:
            raise _no_room(space, u)
        d = min(options, key=lambda d: (carried[d], servers.index(d)))
        carried[d] += u.variable_bytes
        mem[d] += u.variable_bytes
        for k in u.keys:
            assign[k] = d
    return assign


def _best_ps(graph: PlanGraph, links: LinkModel, servers: tuple[str, ...], lpt: Plan) -> Plan:
    """The run's own assignment when LPT carries no less on its largest server (a plan then moves
    nothing for nothing), else LPT."""
    own = Plan(measured_placement(graph), "as measured")
    if any(is_server(d) and d not in servers for d in own.placement.values()) or violations(graph, own.placement):
        return lpt

    def largest(plan: Plan) -> int:
        return max(predict(graph, plan.placement, links, servers).ps_bytes[d] for d in servers)

    return own if largest(own) <= largest(lpt) else lpt


def _within(space: _Space, assign: Placement) -> bool:
    """Every unit on a device it may use in this search (e.g. not on a GPU beyond --devices)."""
    return all(assign[u.keys[0]] in space.candidates[i] for i, u in enumerate(space.units))


def search(graph: PlanGraph, links: LinkModel, objective: str, devices: tuple[str, ...]) -> Plan:
    """The plan over `devices` (the accelerators, or the parameter servers, a plan spreads
    over) for `objective`; raises PlacementError when no placement satisfies the constraints."""
    if objective not in OBJECTIVES:
        raise PlacementError(f"--objective: got {objective!r}; use step_time or balance")
    if objective == "step_time" and not graph.timed:
        raise PlacementError("--objective: got step_time, but the run was not timed; re-run with "
                             "placement.timing: true (or plan with --objective balance)")
    space = _Space(graph, devices)
    if graph.strategy == "parameter_server" and all(parse_name(d)[0] == "ps" for d in devices):
        found = [Plan(_ps_plan(graph, space, devices), "LPT over parameter servers")]
        if graph.ps_variables:
            return _best_ps(graph, links, devices, found[0])
    else:
        found = _layer_plans(graph, space, links, devices)
        # The backward pass the program pinned to one device moves as one piece (pinning.gradients):
        # the layers are planned around it on each device it may take.
        for device in _gradient_devices(graph, devices):
            moved = graph.with_gradients(device)
            found += [Plan(p.placement, f"{p.algorithm}, gradients on {device}")
                      for p in _layer_plans(moved, _Space(moved, devices), links, devices)]
    scored, ruled = [], []
    for plan in found:
        bad = violations(graph, plan.placement)
        if bad:  # the schedulers keep the constraints; this is the guard that they did
            raise PlacementError(bad[0])
        pred = predict(graph, plan.placement, links, devices)
        over = over_cap(graph.memory_cap_bytes, pred.memory) if pred.memory else []
        if over:  # its predicted peak is above a device's cap
            ruled.append((plan, pred.memory, over))
            continue
        load = pred.compute_us if graph.timed else pred.ops
        if objective == "step_time":
            key = (pred.step_us, pred.crossing_total)
        else:
            key = balance_key(load, devices, pred.crossing_total)
        scored.append((key, len(scored), plan))
    if not scored:
        raise no_fit_error(graph.memory_cap_bytes, [(p.algorithm, m) for p, m, _ in ruled])
    cap = _traffic_cap(graph, space, links, devices) if objective == "balance" else None
    within = [x for x in scored if cap is None or x[0][1] <= cap]
    best = min(within or scored)[2]
    return replace(best, ruled_out=ruled_lines(ruled))


def _gradient_devices(graph: PlanGraph, devices: tuple[str, ...]) -> list[str]:
    """The target devices other than its own that a pinned backward pass may move to (every
    backward group has kernels there)."""
    if graph.gradient_device is None:
        return []
    return [d for d in devices if d != graph.gradient_device and backward_fits(graph, d)]


def _layer_plans(graph: PlanGraph, space: _Space, links: LinkModel, devices: tuple[str, ...]) -> list[Plan]:
    """The candidate placements of the layers over `devices`: both list schedulers, the run's own
    placement, the user's, the even split and contiguous cuts, each also refined by balance moves."""
    cost = costs(graph)
    tg = task_graph(graph, cost)
    found = [Plan(list_schedule(graph, tg, space, links, sct), name)
             for name, sct in (("m-ETF", False), ("m-SCT", True))]
    # The run's own placement, the user's and the even split compete too (when they keep to
    # the target devices and the constraints): a plan is never predicted worse than them.
    others = [Plan(measured(graph), "as measured"), Plan(user(graph), "the user's plan"),
              Plan(even_split(graph, devices), "even split")]
    others = [p for p in others if _within(space, p.placement) and not violations(graph, p.placement)]
    # Contiguous cuts of the graph's order (a chain: MobileNet) and of a depth-first order
    # (parallel towers), each with the devices in both directions.
    sequences = {"": list(range(len(space.units)))}
    depth_first = _depth_first(graph, space)
    if depth_first != sequences[""] and len(depth_first) == len(space.units):
        sequences[" (depth-first)"] = depth_first
    cuts = []
    for label, sequence in sequences.items():
        for reverse in (False, True):
            cut = _contiguous(graph, space, devices, cost, reverse, sequence)
            if cut is not None and _within(space, cut) and not violations(graph, cut):
                cuts.append(Plan(cut, "contiguous cuts" + label))
    starts = [*found, *others, *cuts]
    found += others + cuts
    for start in starts:
        moved = _balance_moves(graph, space, start.placement, devices, cost)
        if moved != start.placement:
            found.append(Plan(moved, f"{start.algorithm} + balance moves"))
    return found


def _traffic_cap(graph: PlanGraph, space: _Space, links: LinkModel, devices: tuple[str, ...]) -> int | None:
    """The bytes per step of the user's own split when it spreads the model over two or more of
    the target devices: a balanced plan is taken among those that send no more (balance is not
    bought with more traffic than the user's split already costs). None: no such split."""
    if graph.strategy == "parameter_server":
        return None
    mine = user(graph)
    if not _within(space, mine) or violations(graph, mine) or len(set(mine.values()) & set(devices)) < 2:
        return None
    return predict(graph, mine, links, devices).crossing_total
