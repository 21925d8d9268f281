"""The plan's memory: each device's predicted peak under a placement, and the cap it must fit.

A run measured with `placement.memory: true` keeps its profiled call's replay (pinpoint.
placement.memory.replay.Replay: the executed nodes, the kernels in the order they ran, each output's
bytes). A placement moves each group's nodes to its device; the replay is run again with the same
kernels in the same order, each node on its group's planned device:

- `peak`: the call's peak on emulated devices (logical CPU devices share a tensor one device sends
  another): what `--verify` measures, and is held to;
- `gpu_machine`: the same call on a GPU machine, where a tensor read on another device is a copy in
  that device's memory;
- `held`: the bytes a device holds before the call, its variables and their optimizer slots (a
  variable goes with the group its name is scoped under, a slot with its variable, the rest stay
  where they were measured);
- `needs`: what a GPU of the plan must hold: held + gpu_machine x the allocator's ratio of
  allocated to requested bytes measured on that device in the source run (the BFC allocator
  rounds up and hands out whole free chunks).

Assumptions, written where the figures are shown: the kernels keep the order they ran in (another
placement may run them in another order, and a peak depends on the order); nodes of no group (the
partitioner's sends and receives, the loop's machinery) stay where they ran, a receive with the
first reader of its tensor.

A device cap (`pinpoint plan --gpu-memory`: the size less the CUDA context, on every GPU it plans
for; or PlanGraph.memory_cap_bytes) rules out every candidate placement whose `needs` on a device
is above its cap. Without a measured replay the cap holds the variables alone (plan.check).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pinpoint.device_names import parse_name
from pinpoint.errors import ConfigError, PlacementError
from pinpoint.placement import RECVS, Memory, Placement, Replay

ASSUMPTION = ("the kernels of the measured call replayed in the order they ran, each node on its group's planned "
              "device; held: variables and their optimizer slots; needs: held + the GPU machine's peak (a tensor read "
              "on another device is a copy there) x the allocator's allocated/requested ratio measured on the device")


ORDER_NOTE = ("a peak depends on the order the kernels ran in, which differs between two runs of one placement on "
              "emulated devices (they share the host's threads): the plan's prediction replays the source run's order; "
              "replayed_in_its_order is the verification run's own, the gap between the two is the order's")


@dataclass(frozen=True)
class DeviceMemory:
    """One device's predicted memory under a placement (bytes)."""

    peak: int  # the call's peak on emulated devices (what --verify measures)
    gpu_machine: int  # the call's peak on a GPU machine (received tensors copied)
    held: int  # variables and slots, held before the call
    needs: int  # held + gpu_machine x the allocator's ratio

    def to_json(self) -> dict[str, int]:
        return {"peak": self.peak, "gpu_machine": self.gpu_machine, "held": self.held, "needs": self.needs}


@dataclass(frozen=True)
class MemoryModel:
    """What the plan replays: the source run's call, its nodes' groups, its variables, its ratios."""

    replay: Replay
    group_of: Mapping[str, str]  # node -> group key
    variables: tuple[tuple[str, int, str], ...]  # (name, bytes, measured device)
    ratio: Mapping[str, float]  # device -> allocated / requested at its measured peak
    measured: Mapping[str, int]  # device -> the source call's measured peak (requested)


def memory_model(placement: Placement, group_of: Mapping[str, str]) -> MemoryModel | None:
    """The model of a run whose placement kept its memory replay; None without one, or for a run of
    several replicas (mirrored: each replica's nodes belong to the same layers, and a layer plan is
    trained with one replica)."""
    memory = placement.memory
    if (placement.strategy or "none") != "none" or memory is None:
        return None
    replay = (memory.predicted or {}).get("replay")
    if not replay:
        return None
    devices = {d: m for d, m in (memory.devices or {}).items() if d.startswith("/")}
    ratio = {d: m["peak_allocated"] / m["peak_requested"] for d, m in devices.items() if m.get("peak_requested")}
    variables = tuple((v.name, v.bytes or 0, (v.devices or ("",))[0]) for v in placement.variables)
    return MemoryModel(Replay.from_json(replay), dict(group_of), variables, ratio,
                       {d: m["peak_requested"] for d, m in devices.items()})


def device_memory(model: MemoryModel, assign: Mapping[str, str]) -> dict[str, DeviceMemory]:
    """Each device's predicted memory with every group on assign[group]."""
    where = _node_devices(model, assign)

    def device_of(name: str) -> str:
        return where.get(name) or model.replay.devices.get(name, "")

    peak = model.replay.peaks(device_of)
    gpu = model.replay.peaks(device_of, copies=True)
    held = _held(model, assign)
    top = max(model.ratio.values(), default=1.0)
    out = {}
    for d in sorted(set(peak) | set(gpu) | set(held)):
        if not d:
            continue
        ratio = model.ratio.get(d, top)
        out[d] = DeviceMemory(peak.get(d, 0), gpu.get(d, 0), held.get(d, 0),
                              held.get(d, 0) + round(gpu.get(d, 0) * ratio))
    return out


def _node_devices(model: MemoryModel, assign: Mapping[str, str]) -> dict[str, str]:
    """Node -> device: its group's planned device; a receive goes with its tensor's first reader."""
    out = {n: assign[g] for n, g in model.group_of.items() if g in assign}
    readers = model.replay.schedule.readers
    for n in model.replay.nodes:
        if n.name not in out and n.op in RECVS:
            first = next((r for r in readers.get((n.name, 0), ()) if r in out), None)
            if first is not None:
                out[n.name] = out[first]
    return out


def _held(model: MemoryModel, assign: Mapping[str, str]) -> dict[str, int]:
    """Device -> bytes of the variables (and slots) on it under the placement `assign` (group -> device)."""
    keys = sorted(assign, key=len, reverse=True)
    home: dict[str, str | None] = {}  # a layer's variable -> its group's device
    for name, _, _ in model.variables:
        scope = name.rpartition("/")[0]
        key = next((k for k in keys if scope == k or scope.startswith(k + "/")), None)
        home[name] = assign[key] if key is not None else None
    out: dict[str, int] = {}
    for name, nbytes, measured in model.variables:
        d = home[name]
        if d is None:  # an optimizer slot ("adam/dense_1_kernel_momentum") sits with its variable
            owner = max((v for v, at in home.items() if at is not None and v.replace("/", "_") in name),
                        key=len, default=None)
            d = home[owner] if owner is not None else measured
        out[d] = out.get(d, 0) + nbytes
    return out


def over_cap(caps: Mapping[str, int], memory: Mapping[str, DeviceMemory]) -> list[str]:
    """One line per device whose predicted need is above its cap."""
    return [f"{d}: needs {memory[d].needs} bytes, above its cap of {cap}" for d, cap in sorted(caps.items())
            if d in memory and memory[d].needs > cap]


def ruled_lines(ruled: list) -> tuple[str, ...]:
    """One line per distinct placement ruled out: (Plan, memory, over_cap lines) each."""
    out: dict[tuple, str] = {}
    for plan, _, over in ruled:
        key = tuple(sorted(plan.placement.items()))
        moved = ", ".join(f"{k} {d}" for k, d in sorted(plan.placement.items()))
        out.setdefault(key, f"{plan.algorithm} ({moved}): {'; '.join(over)}")
    return tuple(out.values())


def no_fit_error(caps: Mapping[str, int], tried: list[tuple[str, dict[str, DeviceMemory]]]) -> PlacementError:
    """No candidate placement fits the caps: the one that comes closest, and the fix."""
    def excess(mem: dict[str, DeviceMemory]) -> int:
        return max((mem[d].needs - c for d, c in caps.items() if d in mem), default=0)

    name, mem = min(tried, key=lambda t: excess(t[1]))
    worst = max((d for d in caps if d in mem), key=lambda d: mem[d].needs - caps[d])
    return PlacementError(f"memory_cap_bytes: got {dict(sorted(caps.items()))}, but no placement fits: the closest "
                          f"({name}) needs {mem[worst].needs} bytes on {worst} (its predicted peak with its variables); "
                          "give the devices more memory, add devices, or lower the batch size")


def with_gpu_memory(graph, size: int | None, devices: tuple[str, ...], field: str = "--gpu-memory"):
    """graph with each target GPU capped at `size` less the CUDA context (None: graph as it is);
    a ConfigError when the run kept no memory replay to predict the peaks from."""
    from pinpoint.sizes import CONTEXT

    if size is None:
        return graph
    if graph.memory is None:
        raise ConfigError(f"{field}: got {size} bytes, but the run kept no memory measurement of one replica to "
                          "predict each device's peak from; re-run it with strategy none and placement.memory: true "
                          f"(pinpoint trace --memory), or drop {field}")
    caps = {d: size - CONTEXT for d in devices if parse_name(d)[2] == "GPU"}
    return replace(graph, memory_cap_bytes={**graph.memory_cap_bytes, **caps})


def memory_doc(graph, ruled_out: tuple[str, ...]) -> dict[str, Any]:
    """The plan file's `memory`: the caps, the candidates they ruled out, and the assumption."""
    return {"caps": dict(sorted(graph.memory_cap_bytes.items())), "ruled_out": list(ruled_out),
            "measured_peak": dict(graph.memory.measured), "assumption": ASSUMPTION}


def compare_memory(predicted: Mapping[str, Mapping[str, int]], placement: Placement) -> dict[str, Any]:
    """plan_check.json's `memory`: per device the plan's predicted peak of the call (emulated, as the
    verification run measures it) against the verification run's measured peak (requested bytes),
    with the error, and the measurement's own self-check."""
    memory = placement.memory or Memory()
    measured = {d: m["peak_requested"] for d, m in (memory.devices or {}).items() if d.startswith("/")}
    if not measured:
        return {"why_not": memory.why_not or "the verification run measured no memory"}
    # The verification run's own replay (its kernels in the order they ran there): the gap between the
    # two predictions is the order the kernels ran in, not the placement.
    own = {d: r.get("predicted") for d, r in ((memory.predicted or {}).get("devices") or {}).items()}
    rows = []
    for d in sorted(set(predicted) | set(measured), key=_order):
        p, m = (predicted.get(d) or {}).get("peak", 0), measured.get(d, 0)
        rows.append({"device": d, "predicted": p, "measured": m, "error": round((p - m) / m, 4) if m else None,
                     "replayed_in_its_order": own.get(d)})
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    return {"devices": rows, "largest_error": max(errors, default=None),
            "mismatched_events": (memory.self_check or {}).get("mismatched"), "assumption": ASSUMPTION,
            "order_note": ORDER_NOTE}


def _order(device: str) -> tuple:
    from pinpoint.device_names import sort_key

    return sort_key(device)


def memory_lines(check: Mapping[str, Any]) -> list[str]:
    """The lines `pinpoint plan --verify` prints for the memory check."""
    if "why_not" in check:
        return [f"memory: not checked ({check['why_not']})"]
    lines = ["peak memory per device  predicted  measured  error   (replayed in the run's own order)"]
    for r in check["devices"]:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        own = r.get("replayed_in_its_order")
        lines.append(f"  {r['device']:<22} {r['predicted']:>9} {r['measured']:>9}  {err:>6}   "
                     f"({'-' if own is None else own})")
    lines.append(f"  (the call's peak, variables aside; the allocator's self-check: {check['mismatched_events']} "
                 "mismatched event(s))")
    return lines
