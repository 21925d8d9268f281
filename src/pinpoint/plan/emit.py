"""The plan file (YAML) and its reader.

Fields: `pinning: {layers: {key: device}}` as Pinpoint's config takes it (the movable layer
groups; `input` too when the input pipeline may move, `gradients` when the program pinned its
backward pass), `tf_device` (the same mapping, for `with tf.device(...)` in a traced program:
`gradients` is the device for the `tape.gradient` call), `links` (the model the prediction used),
`step_models` (which model each predicted step comes from: emulated.py's when the run's GPUs
were emulated),
`objective`, `algorithm`, `devices`, `source_run`, `prediction` (the plan's and each
baseline's), `baselines` (their placements) and `rationale` (one line per group the plan moves
from where it ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError, PlacementError
from pinpoint.plan.check import NOT_LAYERS, Placement, violations, where
from pinpoint.plan.emulated import EmulatedHost
from pinpoint.plan.graph import PlanGraph, is_backward, is_held
from pinpoint.plan.links import LinkModel
from pinpoint.plan.predict import Prediction
from pinpoint.plan.servers import ps_rationale
from pinpoint.runfolder import atomic_write_text


def pinning_of(graph: PlanGraph, assign: Placement) -> dict[str, Any]:
    """The `pinning` section of a placement, the groups a config can pin: `layers` (the movable
    layers), `input` when the input pipeline may move, `gradients` when the program pinned its
    backward pass (graph.gradient_device)."""
    out: dict[str, Any] = {"layers": {g.key: assign[g.key] for g in graph.groups
                                      if g.movable and g.key not in NOT_LAYERS}}
    inp = next((assign[g.key] for g in graph.groups if g.key == "input" and g.movable), None)
    if inp is not None:
        out["input"] = inp
    backward = next((assign[g.key] for g in graph.groups if is_backward(g.key)), None)
    if graph.gradient_device is not None and backward is not None:
        out["gradients"] = backward
    return out


def placement_of(graph: PlanGraph, pinning: dict[str, Any]) -> Placement:
    """Every group's device under a plan file's `pinning` (what it leaves out stays where it ran)."""
    assign = {g.key: g.device for g in graph.groups}
    assign.update({k: v for k, v in (pinning.get("layers") or {}).items() if k in assign})
    if pinning.get("input") is not None and "input" in assign:
        assign["input"] = pinning["input"]
    if pinning.get("gradients") is not None and graph.gradient_device is not None:
        assign.update({g.key: pinning["gradients"] for g in graph.groups if is_backward(g.key)})
    return assign


def _kib(n: int) -> str:
    return f"{n / 1024:+.0f} KiB" if abs(n) >= 1024 else f"{n:+d} B"


def rationale(graph: PlanGraph, plan: Placement, before: Prediction, after: Prediction) -> list[str]:
    """One short line per group the plan moves from where it ran (parameter_server: per layer
    whose variables move to another server)."""
    if graph.ps_variables:
        return ps_rationale(graph, plan, before.ps_over_mean, after.ps_over_mean)
    lines = []
    r0, r1 = before.busiest_over_mean, after.busiest_over_mean
    balance = f"busiest/mean compute {r0:.2f} -> {r1:.2f}x" if r0 is not None and r1 is not None else ""
    step = (f"step {before.step_us / 1e3:.2f} -> {after.step_us / 1e3:.2f} ms"
            if before.step_us is not None and after.step_us is not None else "")
    ran = {g.key: g.device for g in graph.groups}
    moved = [g for g in sorted(graph.groups, key=lambda g: (g.order, g.key)) if plan[g.key] != g.device]
    # A pinned backward pass moves as one (pinning.gradients): one line for all its groups.
    backward = [g for g in moved if graph.gradient_device is not None and is_backward(g.key)]
    pieces = [(g.key, [g]) for g in moved if g not in backward]
    if backward:
        pieces.append(("gradients (pinning.gradients)", backward))
    for name, groups in pieces:
        keys = {g.key for g in groups}
        # What the move changes in the bytes crossing on these groups' own edges.
        delta = sum(e.bytes * (int(plan[e.src] != plan[e.dst]) - int(ran[e.src] != ran[e.dst]))
                    for e in graph.edges if e.src in keys or e.dst in keys)
        why = ", ".join(x for x in (balance, step, f"{_kib(delta)}/step crossing") if x)
        own = (f"{sum(g.compute_us for g in groups) / 1e3:.2f} ms compute" if graph.timed
               else f"{sum(g.ops for g in groups)} ops")
        lines.append(f"{name}: {groups[0].device} -> {plan[groups[0].key]} ({own}), {why}")
    return lines


def plan_document(graph: PlanGraph, *, source_run: str, objective: str, algorithm: str, devices: tuple[str, ...],
                  links: LinkModel, plan: Placement, predictions: dict[str, Prediction],
                  baselines: dict[str, Placement]) -> dict[str, Any]:
    pinning = pinning_of(graph, plan)
    return {
        "source_run": source_run,
        "measured_step_ms": None if graph.measured_step_us is None else round(graph.measured_step_us / 1e3, 4),
        "objective": objective,
        "algorithm": algorithm,
        "devices": list(devices),
        "pinning": pinning,
        "tf_device": dict(pinning["layers"], **{k: v for k, v in pinning.items() if k != "layers"}),
        "links": links.to_dict(),
        "step_models": step_models(graph),
        "prediction": {name: p.to_dict() for name, p in predictions.items()},
        "baselines": {name: dict(p) for name, p in baselines.items()},
        "rationale": rationale(graph, plan, predictions["measured"], predictions["plan"])
        if "measured" in predictions else [],
    }


def step_models(graph: PlanGraph) -> dict[str, Any]:
    """Which model each predicted step figure comes from: `step_ms` always the link model
    (`links`), `emulated_step_ms` the emulated host's (with its constants) when the run's GPUs
    were emulated."""
    host = EmulatedHost.of(graph)
    return {"step_ms": "links", **({} if host is None else {"emulated_step_ms": host.to_dict()})}


def write_plan(path: str | Path, document: dict[str, Any]) -> Path:
    """Write the plan file atomically (a reader never sees half of it)."""
    import yaml

    return atomic_write_text(path, yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


@dataclass(frozen=True)
class PlanFile:
    placement: Placement  # every group: the file's pinning over where the run put the rest
    layers: dict[str, str]
    objective: str | None
    source_run: str | None


def read_plan(path: str | Path, graph: PlanGraph) -> PlanFile:
    """Read a plan file and refuse, with one line, one the runtime would override (a group
    pinned where it has no kernel, split from its colocated groups, moved though it may not
    move, on a device the run does not have, or over a memory cap)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"plan: got '{p}', which does not exist; write one with `pinpoint plan RUN_DIR --out {p}`")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"plan: got '{p}', which is not YAML ({str(err).splitlines()[0]}); fix the file") from None
    pinning = data.get("pinning") if isinstance(data, dict) else None
    layers = pinning.get("layers") if isinstance(pinning, dict) else None
    if not isinstance(layers, dict):
        raise ConfigError(f"pinning.layers: got {layers!r} in '{p}'; a plan file maps layer keys to devices there")
    keys = {g.key for g in graph.groups}
    wanted = dict(layers)
    if pinning.get("input") is not None:
        wanted["input"] = pinning["input"]
    for key, dev in wanted.items():
        if key not in keys:
            raise PlacementError(f"{where(key)}: got a layer the run does not have; use one of "
                                 f"{', '.join(sorted(k for k in keys - NOT_LAYERS if not is_backward(k) and not is_held(k)))}")
        if not isinstance(dev, str):
            raise PlacementError(f"{where(key)}: got {dev!r}; write a device string such as '/GPU:0'")
    gradients = pinning.get("gradients")
    if gradients is not None:
        if not isinstance(gradients, str):
            raise PlacementError(f"pinning.gradients: got {gradients!r}; write a device string such as '/GPU:0'")
        if graph.gradient_device is None:
            raise PlacementError(f"pinning.gradients: got '{gradients}', but the run's backward pass follows its "
                                 "layers; plan gradients from a run that pins them (train.pinning.gradients), or "
                                 "remove the field")
    placement = placement_of(graph, pinning)
    bad = violations(graph, placement)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PlacementError(bad[0] + more)
    return PlanFile(placement, {k: v for k, v in layers.items()}, data.get("objective"), data.get("source_run"))
