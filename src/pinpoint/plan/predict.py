"""A prediction of one training step for a placement (group key -> device) of a PlanGraph.

The step is simulated as a list schedule over the F/B task DAG (tasks.py): each device runs one
task at a time, a task starts once its inputs have arrived, and among the tasks ready on a device
the one whose inputs arrived first runs first (TensorFlow's executor runs ops as they become
ready). An input from another device arrives after latency_us + bytes / bandwidth of the link
between the two devices (links.py); a transfer occupies its link (one per ordered device pair),
so transfers on one link queue. step_us is the makespan: the last task's or transfer's end.

Figures that do not depend on the schedule are exact sums:
- bytes crossing (a, b) per step: the bytes of every edge from a group on a to a group on b;
- peak variable memory on a device: the variable_bytes of the groups on it (one copy each);
- memory per device, when the run kept its memory replay: the measured call replayed with each
  group's nodes on its planned device (plan.memory);
- bytes per parameter server (strategy parameter_server): a step is one closure on one worker
  (ClusterCoordinator), which pulls each variable the step updates and pushes its gradient (same
  size), so a server carries 2 * sum(bytes of those variables on it) per step, however many
  workers there are; which variable sits on which server: servers.py (a pinned group's on its
  server, the rest on TensorFlow's round-robin slot).

When the source run's GPUs were emulated, emulated_step_us is the step on the machine that ran it
(emulated.py: its measured step, plus its profiled time per transfer for each tensor the
placement sends across devices beyond the source's own).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from pinpoint.device_names import parse_name, sort_key
from pinpoint.plan.check import Placement
from pinpoint.plan.emulated import EmulatedHost
from pinpoint.plan.graph import PlanGraph
from pinpoint.plan.links import LinkModel
from pinpoint.plan.memory import DeviceMemory, device_memory
from pinpoint.plan.servers import is_server, predicted_ps_bytes, variable_servers
from pinpoint.plan.tasks import TaskGraph, task_graph


@dataclass(frozen=True)
class Prediction:
    """What one step of a placement is predicted to cost."""

    step_us: float | None  # None when the run was not timed (no compute costs to schedule)
    compute_us: dict[str, float]  # per device: the measured compute of its groups
    ops: dict[str, int]  # per device: ops per step
    busy_share: dict[str, float]  # per device: compute_us / step_us
    bytes_crossing: dict[tuple[str, str], int]  # per ordered device pair (src, dst)
    peak_variable_bytes: dict[str, int]
    ps_bytes: dict[str, int]  # per parameter server (parameter_server only)
    devices: tuple[str, ...]  # the devices the balance figures are taken over
    timed: bool
    # The step on the machine that ran the source run when its GPUs were emulated (emulated.py);
    # step_us stays the link model's (what the placement costs on the devices it describes).
    emulated_step_us: float | None = None
    # Per device: the predicted memory (plan.memory.DeviceMemory) when the run kept its memory replay.
    memory: dict[str, DeviceMemory] = field(default_factory=dict)

    @property
    def busiest_over_mean(self) -> float | None:
        """The busiest device's compute over the mean of `devices` (ops when untimed)."""
        load = self.compute_us if self.timed else self.ops
        values = [load.get(d, 0) for d in self.devices]
        mean = sum(values) / len(values) if values else 0
        return max(values) / mean if mean > 0 else None

    @property
    def ps_over_mean(self) -> float | None:
        """The most loaded parameter server's bytes over the servers' mean (None: no servers)."""
        values = list(self.ps_bytes.values())
        mean = sum(values) / len(values) if values else 0
        return max(values) / mean if mean > 0 else None

    @property
    def crossing_total(self) -> int:
        return sum(self.bytes_crossing.values())

    @property
    def peak_memory(self) -> int:
        return max(self.peak_variable_bytes.values(), default=0)

    def to_dict(self) -> dict[str, Any]:
        ratio = self.busiest_over_mean
        return {
            "step_ms": None if self.step_us is None else round(self.step_us / 1e3, 4),
            "busiest_over_mean": None if ratio is None else round(ratio, 4),
            "bytes_crossing_per_step": self.crossing_total,
            "peak_variable_bytes": self.peak_memory,
            "ps_over_mean": None if self.ps_over_mean is None else round(self.ps_over_mean, 4),
            "compute_us": {d: round(v, 2) for d, v in self.compute_us.items()},
            "busy_share": {d: round(v, 4) for d, v in self.busy_share.items()},
            "ops": dict(self.ops),
            "bytes_crossing": {f"{a} -> {b}": n for (a, b), n in self.bytes_crossing.items()},
            "variable_bytes": dict(self.peak_variable_bytes),
            "ps_bytes": dict(self.ps_bytes),
            **({} if self.emulated_step_us is None else {"emulated_step_ms": round(self.emulated_step_us / 1e3, 4)}),
            **({"memory": {d: m.to_json() for d, m in self.memory.items()}} if self.memory else {}),
        }


def simulate(tg: TaskGraph, device_of: list[str], links: LinkModel, record: list | None = None) -> float:
    """The makespan of the task DAG with task i on device_of[i // 2] (see the module doc); with
    `record`, each task's (task, device, start, end) in µs is appended to it (the schedule)."""
    n = len(tg.duration)
    missing = [len(p) for p in tg.pred]
    ready_at = [0.0] * n
    queues: dict[str, list[tuple[float, int, int]]] = {d: [] for d in set(device_of)}
    position = {t: i for i, t in enumerate(tg.topo)}
    free = dict.fromkeys(queues, 0.0)
    link_free: dict[tuple[str, str], float] = {}
    for t in range(n):
        if missing[t] == 0:
            heapq.heappush(queues[device_of[t // 2]], (0.0, position[t], t))
    end = 0.0
    for _ in range(n):
        dev = min((d for d, q in queues.items() if q), key=lambda d: (max(free[d], queues[d][0][0]), sort_key(d)))
        ready, _, t = heapq.heappop(queues[dev])
        finish = max(free[dev], ready) + tg.duration[t]
        if record is not None:
            record.append((t, dev, finish - tg.duration[t], finish))
        free[dev] = finish
        end = max(end, finish)
        for s, nbytes in tg.succ[t]:
            target = device_of[s // 2]
            arrive = finish
            if target != dev and nbytes > 0:
                cost = links.transfer_us(dev, target, nbytes)
                if cost > 0:
                    start = max(finish, link_free.get((dev, target), 0.0))
                    arrive = link_free[(dev, target)] = start + cost
                    end = max(end, arrive)
            ready_at[s] = max(ready_at[s], arrive)
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(queues[target], (ready_at[s], position[s], s))
    return end


def predict(graph: PlanGraph, assign: Placement, links: LinkModel, devices: tuple[str, ...] | None = None,
            tg: TaskGraph | None = None) -> Prediction:
    """The prediction for `assign` (every group key mapped); `devices` are the ones the
    balance figures are taken over (default: the devices the placement uses)."""
    if tg is None:
        tg = task_graph(graph, {g.key: g.compute_us for g in graph.groups})
    variables_only = graph.strategy == "parameter_server" and bool(graph.ps_variables)
    original = assign
    if variables_only:
        # A layer pinned to a ps task has its variables there and still computes on the worker.
        assign = {g.key: g.device if is_server(assign[g.key]) else assign[g.key] for g in graph.groups}
        var_where = variable_servers(graph, original)
    used = sorted(set(assign.values()), key=sort_key)
    compute = dict.fromkeys(used, 0.0)
    ops = dict.fromkeys(used, 0)
    memory = dict.fromkeys(used, 0)
    for g in graph.groups:
        d = assign[g.key]
        compute[d] += g.compute_us
        ops[d] += g.ops
        if not variables_only:
            memory[d] += g.variable_bytes
    if variables_only:
        for v in graph.ps_variables:
            memory[var_where[v.name]] = memory.get(var_where[v.name], 0) + v.bytes
    crossing = bytes_crossing(graph, assign)
    step = simulate(tg, [assign[k] for k in tg.keys], links) if graph.timed else None
    busy = {d: (compute[d] / step if step else 0.0) for d in used}
    ps: dict[str, int] = {}
    if variables_only:
        ps = predicted_ps_bytes(graph, original)
    elif graph.strategy == "parameter_server":  # a graph without its variables (built by hand)
        for d in graph.devices:
            if parse_name(d)[0] == "ps":
                ps[d] = 2 * memory.get(d, 0)
    host = EmulatedHost.of(graph)
    return Prediction(step, compute, ops, busy, dict(sorted(crossing.items())), memory, ps,
                      tuple(devices) if devices is not None else tuple(used), graph.timed,
                      None if host is None else host.step_us(graph, original),
                      device_memory(graph.memory, assign) if graph.memory is not None and not variables_only else {})


def bytes_crossing(graph: PlanGraph, assign: Placement) -> dict[tuple[str, str], int]:
    """Bytes per step crossing each ordered device pair: each tensor once per other device that
    reads it (the runtime's one _Send/_Recv pair per tensor and receiving device); from the edges
    when the graph has no tensors (built by hand)."""
    crossing: dict[tuple[str, str], int] = {}
    for a, b, nbytes, _ in graph.crossings(assign):
        crossing[(a, b)] = crossing.get((a, b), 0) + nbytes
    return crossing
    for e in graph.edges:
        a, b = assign[e.src], assign[e.dst]
        if a != b:
            crossing[(a, b)] = crossing.get((a, b), 0) + e.bytes
    return crossing


def schedule(graph: PlanGraph, assign: Placement, links: LinkModel) -> list[dict[str, Any]]:
    """The simulated step of a timed run's placement, task by task: device, group, pass
    (forward/backward), start_us, end_us, in start order ([] for an untimed run)."""
    if not graph.timed:
        return []
    tg = task_graph(graph, {g.key: g.compute_us for g in graph.groups})
    record: list = []
    simulate(tg, [assign[k] for k in tg.keys], links, record)
    return [{"device": dev, "group": tg.group_of(t), "pass": "backward" if t % 2 else "forward",
             "start_us": round(a, 3), "end_us": round(b, 3)}
            for t, dev, a, b in sorted(record, key=lambda r: (r[2], sort_key(r[1]))) if b > a]
