"""Build the placement model from its inputs, in one pass: where every op, variable and gradient ran.

Runs once, after training (never on the hot path). Input: a `PlacementInputs` (placement.inputs):
the CapturedGraphs of the sampled steps (each capture is one executed step), the model's and
optimizer's variables, the pinning plan with its resolved layer pins, the device map, the timing,
and for a traced program its functions, eager ops and weight requests. Every device is reported by
its spec name ("/GPU:0") and the physical name it ran on is kept in `physical_devices` /
`device_aliases`.

This module puts the sections together; each is computed where its rules live: transfers
(placement.transfers), variables and replica consistency (placement.variables), requests,
fallbacks and conformance (placement.conformance, placement.requests); the model and its JSON in
placement.model.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from pinpoint.device_names import DeviceMap, local_name, matches, normalize, sort_key
from pinpoint.placement.analysis.conformance import (
    as_predicted,
    check_conformance,
    gradient_re,
    layer_table,
    mark_predicted,
    predicted_fallback,
    requested_rules,
)
from pinpoint.placement.analysis.inputs import PlacementInputs
from pinpoint.placement.analysis.opgraph import LayerMatcher, add_graph_fields, resource_variables
from pinpoint.placement.analysis.requests import weight_rules
from pinpoint.placement.analysis.transfers import merge_transfer_steps, step_transfers
from pinpoint.placement.analysis.variables import analyze_variables, safe_consistency, user_variables
from pinpoint.placement.graphs.captured import requested_defs, requested_devices
from pinpoint.placement.graphs.ops import BOOKKEEPING
from pinpoint.placement.memory.fit import with_fit
from pinpoint.placement.memory.tasks import with_task_variables
from pinpoint.placement.model.memory import Memory
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.model.records import (
    Gradients,
    InputPipeline,
    OpRow,
    Precision,
    ReplicaConsistency,
    VariableUpdates,
)
from pinpoint.placement.model.schema import EXPLAIN, EXPLAIN_TRACE, json_number
from pinpoint.placement.model.sections import Conformance, Eager, Fallback, FunctionRow, Rule, Variable, mean_score
from pinpoint.placement.model.traffic import Timing, TransferItem, Transfers


def build_placement(captures: list, **inputs: Any) -> dict:
    """placement.json's content from loose inputs (the fields of PlacementInputs)."""
    return build(PlacementInputs(captures=tuple(captures), **inputs)).to_json()


def build(inputs: PlacementInputs) -> Placement:
    """The placement model from its inputs (see schema.EXPLAIN for each field)."""
    namer = DeviceMap.of(inputs.device_map)
    captures = [c for c in inputs.captures if c is not None]
    grad_re = gradient_re(inputs.gradient_scope)
    scan = _scan(captures, namer, inputs.device_map, grad_re)
    trace = inputs.trace
    values: dict = {}  # component values, read once for fingerprints and replica consistency
    var_info = analyze_variables(list(inputs.variables), captures, namer, values, inputs.optimizer_variables,
                                 eager_updates=trace.eager_updates if trace else None,
                                 created=trace.created if trace else ())
    for v in var_info["variables"]:
        scan.devices.update(v["devices"])
        scan.devices.update(v["update_devices"])
    devices = sorted((d for d in scan.devices if d), key=sort_key)
    if captures:
        _graph_fields(scan.ops_detail, captures[0], namer, inputs)
    conformance, rule_rows, explain = _conformance(inputs, scan, var_info["variables"], namer, grad_re, captures)
    items = scan.transfers[0]["items"] if scan.transfers else []
    op_types = {d: _mean_counter([t.get(d, Counter()) for t in scan.types])
                for d in sorted({d for t in scan.types for d in t}, key=sort_key)}
    return Placement(
        task=inputs.task,
        strategy=inputs.strategy,
        captured_steps=tuple(([1] if captures else []) if trace else
                             [s for c in captures for s in (getattr(c, "steps", None) or [c.step])]),
        devices=tuple(devices),
        physical_devices={d: namer.canonical_physical(d) for d in devices},
        device_aliases=dict(namer.aliases),
        ops_by_device=_mean_counter(scan.ops),
        op_types_by_device=op_types,
        transfers=Transfers.from_json(
            merge_transfer_steps(scan.transfers, [getattr(c, "steps", None) or [c.step] for c in captures])),
        fallbacks=tuple(map(Fallback.from_json, _observed_fallbacks(scan, namer, inputs.device_map)
                            + sorted(scan.predicted.values(), key=lambda f: f["op"]))),
        variables=tuple(map(Variable.from_json, var_info["variables"] + var_info["freed"])),
        variable_updates=VariableUpdates.from_json(var_info["updates"]),
        gradients=Gradients(
            scope=f"{inputs.gradient_scope}/ and gradient_tape/",
            ops_by_device=_mean_counter(scan.grads),
            total=json_number(sum(sum(c.values()) for c in scan.grads) / max(len(scan.grads), 1)),
        ),
        # The trainer builds the placement after its last step, so this is the end-of-training check.
        replica_consistency=ReplicaConsistency.from_json(
            safe_consistency(list(inputs.variables), values, inputs.optimizer_variables)),
        conformance=conformance,
        layers=tuple(layer_table(rule_rows, items, inputs.plan, inputs.layer_pins)),
        ops=tuple(map(OpRow.from_json, scan.ops_detail)),
        # Every transfer of the first captured step (tensor, from, to, bytes, consumers).
        transfer_items=tuple(map(TransferItem.from_json, items)),
        notes=tuple(_notes(inputs, captures, scan.ops_detail, var_info["variables"])),
        explain=explain,
        device_map=DeviceMap.from_json(inputs.device_map_json) if inputs.device_map_json else None,
        input_pipeline=InputPipeline.from_json(inputs.input_pipeline),
        timing=Timing.from_json(inputs.timing),
        precision=Precision.from_json(_precision(inputs.precision_policy, op_types)),
        layer_pins={path: namer.canonical_spec(dev) for path, dev in inputs.layer_pins.by_path().items()}
        if inputs.layer_pins is not None else None,
        functions=tuple(map(FunctionRow.from_json, trace.functions)) if trace else None,
        training_function=trace.training_function if trace else None,
        eager=Eager.from_json(trace.eager) if trace else None,
        program=trace.program if trace else None,
        memory=Memory.from_json(with_task_variables(
            with_fit(inputs.memory if inputs.memory is not None else _memory(captures[0], namer) if captures else None,
                     var_info["variables"]), var_info["variables"])),
    )


# Why a call with an XLA cluster is not measured under emulation (on a GPU machine XLA's buffers
# come from the GPU's allocator; XLA's CPU runtime allocates them where the allocator's events
# name no op and no emulated GPU).
XLA_ON_EMULATED_GPUS = ("{n} call(s) compiled by XLA ran in the measured call, and on emulated GPUs "
                        "XLA's CPU runtime holds their buffers outside the emulated GPUs' allocator, so no device's "
                        "peak can be read; trace without --gpus, or compile with jit_compile=False, to measure it")


def _memory(cap, namer: DeviceMap) -> dict | None:
    """The measured memory of the captured call (placement.memory), or why it was not measured."""
    from pinpoint.placement.memory.section import memory_section
    from pinpoint.placement.profile.allocator import enabled

    if cap.memory_events is None:
        return {"why_not": cap.memory_why or "the call was not profiled"} if enabled() else None
    xla = getattr(cap, "xla_calls", ())
    if xla and namer.emulated:
        return {"why_not": XLA_ON_EMULATED_GPUS.format(n=len(xla))}
    def section(taken, call: str) -> dict:
        out = memory_section(cap.partition_graphs, taken.memory_trace, taken.memory_events, namer,
                             peak=taken.memory_peak, read_ps=taken.memory_read_ps, gpus=taken.memory_gpu_peaks,
                             shapes=cap.shapes, call=call)
        return out | ({"why_not": taken.memory_why} if taken.memory_why else {})

    first = section(cap, "first" if cap.memory_first_call else "second")
    if not cap.memory_more:
        return first
    from pinpoint.placement.memory.spread import highest

    return highest([(1 if cap.memory_first_call else 2, first),
                    *((n, section(taken, ORDINALS.get(n, f"call {n}"))) for n, taken in cap.memory_more)])


ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth"}


@dataclass
class _Scan:
    """What one walk over the captured partition graphs found (per step: ops, op types and
    gradient ops per device, transfers; over all steps: devices, fallbacks; the first step's ops)."""

    ops: list[Counter] = field(default_factory=list)
    types: list[dict[str, Counter]] = field(default_factory=list)
    grads: list[Counter] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)
    devices: set[str] = field(default_factory=set)
    physical: set[str] = field(default_factory=set)
    fallbacks: dict[str, dict] = field(default_factory=dict)
    predicted: dict[str, dict] = field(default_factory=dict)
    ops_detail: list[dict] = field(default_factory=list)


def _scan(captures: list, namer: DeviceMap, device_map, grad_re) -> _Scan:
    scan = _Scan()
    emulated_gpus = {normalize(p) for p in namer.aliases.values()} if getattr(device_map, "emulated", False) else set()
    for ci, cap in enumerate(captures):
        ops, grads, types = Counter(), Counter(), defaultdict(Counter)
        requested = requested_devices(cap)
        defs = requested_defs(cap) if emulated_gpus else {}
        for g in cap.partition_graphs:
            for n in g.node:
                dev = namer.canonical_spec(n.device)
                if dev:
                    scan.devices.add(dev)
                    scan.physical.add(normalize(n.device))
                if n.op in BOOKKEEPING:
                    continue
                ops[dev] += 1
                types[dev][n.op] += 1
                grads[dev] += bool(grad_re.search(n.name))
                if ci == 0:
                    scan.ops_detail.append({"op": n.name, "type": n.op, "device": dev})
                req = requested.get(n.name)
                if req and not matches(req, n.device):
                    scan.fallbacks.setdefault(n.name, {
                        "op": n.name, "op_type": n.op, "requested": namer.canonical_spec(req),
                        "requested_physical": normalize(req), "placed": dev, "placed_physical": normalize(n.device)})
                if emulated_gpus and n.name not in scan.predicted:
                    fb = predicted_fallback(n, defs.get(n.name), req, namer, emulated_gpus)
                    if fb is not None:
                        scan.predicted[n.name] = fb
        scan.ops.append(ops)
        scan.types.append(types)
        scan.grads.append(+grads)  # unary +: drop the devices that ran no gradient op
        scan.transfers.append(step_transfers(cap, namer))
    return scan


def _graph_fields(rows: list[dict], cap, namer: DeviceMap, inputs: PlacementInputs) -> None:
    """The first step's op rows as a graph (placement.opgraph): inputs, requests, colocation, layer,
    kernels and, when timed, each op's own time."""
    matcher = LayerMatcher(inputs.layer_units, inputs.layer_pins)
    resource_layers = {op: layer for op, var in resource_variables(cap, inputs.variables).items()
                       if (layer := matcher(var)) is not None}
    op_us = (inputs.timing or {}).get("op_us")
    add_graph_fields(rows, cap, namer, layer_of=matcher, op_us=op_us, resource_layers=resource_layers)


def _observed_fallbacks(scan: _Scan, namer: DeviceMap, device_map) -> list[dict]:
    """The ops the runtime placed off their requested device, each with the reason."""
    known = scan.physical | {normalize(p) for p in namer.aliases.values()}
    out = {}
    missing = {normalize(p) for p in namer.missing.values()}
    for name, fb in scan.fallbacks.items():
        out[name] = dict(fb, reason=(
            "requested device does not exist"
            if not any(matches(fb["requested_physical"], d) for d in known)
            else "moved by the placer (no kernel for this op there, or colocated with a resource "
            "or input on another device)"))
        if local_name(fb["requested_physical"]) in missing:
            # A GPU the emulated machine lacks: no device stands for it, the request is as written.
            out[name]["requested_physical"] = fb["requested"]
    # Devices the setup already resolved elsewhere (no such device here, soft placement on): every
    # op pinned there was redirected before tracing, so the graphs cannot show it; report it.
    for spec, instead in (getattr(device_map, "fallbacks", None) or {}).items():
        op = f"(every op pinned to {spec})"
        out.setdefault(op, {
            "op": op, "op_type": "*", "requested": spec, "requested_physical": spec,
            "placed": namer.canonical_spec(instead), "placed_physical": normalize(instead),
            "reason": "requested device does not exist on this machine; redirected at device setup "
            "(soft placement)"})
    return sorted(out.values(), key=lambda f: f["op"])


def _conformance(inputs: PlacementInputs, scan: _Scan, variables: list, namer: DeviceMap, grad_re,
                 captures: list) -> tuple[Conformance, list[dict], dict]:
    """Every rule at once: a traced program's requests first, then the plan's and the strategy's,
    then its weights' requests; each violation that is a predicted fallback marked. With the rules
    as computed (the layers table reads them) and explain."""
    input_re = re.compile(rf"(^|/){re.escape(inputs.input_scope)}(_\d+)?/")
    rules = check_conformance(as_predicted(scan.ops_detail, scan.predicted), variables, inputs.plan,
                              inputs.strategy, inputs.device_map, namer, grad_re, inputs.layer_pins,
                              input_re)["rules"]
    explain = dict(EXPLAIN)
    if inputs.trace is not None:
        rules = requested_rules(captures[0] if captures else None, namer, scan.predicted) + rules
        explain.update(EXPLAIN_TRACE)
    mark_predicted(rules, scan.predicted)
    if inputs.trace is not None:
        weights, weight_explain = weight_rules(list(inputs.trace.weight_rows), namer)
        rules += weights
        explain.update(weight_explain)
    conformance = Conformance(score=mean_score(r["score"] for r in rules), rules=tuple(map(Rule.from_json, rules)))
    return conformance, rules, explain


def xla_note(captures: list, device_map) -> str | None:
    """How the report shows XLA-compiled calls (Pinpoint's loop and a traced program alike)."""
    calls = [(f, device_map.canonical_spec(d)) for cap in captures for f, d in getattr(cap, "xla_calls", ())]
    if not calls:
        return None
    where = ", ".join(f"{f} on {d}" for f, d in sorted(set(calls), key=lambda c: (c[1], c[0])))
    return (f"{len(calls)} call(s) compiled by XLA ({where}): each runs as one XLA cluster, one program on its "
            "device; ops inside an XLA cluster have no per-op placement, so its ops are listed on the cluster's "
            "device (a device requested inside it is not honoured and shows as a fallback); the cluster's "
            "transfers are those of its call")


def _notes(inputs: PlacementInputs, captures: list, ops_detail: list, variables: list) -> list[str]:
    notes = []
    xla = xla_note(captures, DeviceMap.of(inputs.device_map))
    if xla is not None:
        notes.append(xla)
    for cap in captures:
        for note in getattr(cap, "notes", None) or []:
            if note not in notes:
                notes.append(note)
    trace = inputs.trace
    if not captures:
        if trace is None:  # a traced program says why in its own notes
            notes.append("no step was captured (placement sampling off or training ended before warm-up)")
    elif not ops_detail:
        if inputs.strategy == "parameter_server":
            notes.append(
                "no partition graphs on this task: under parameter_server the coordinator schedules each "
                "step as a closure that the worker's own runtime instantiates, so ops, transfers and "
                "gradients are not visible here; variables (on the ps tasks) are"
            )
        else:
            notes.append("the captured call executed no function graphs (was the step function already called?)")
    if trace is not None:
        notes += _outside_strategy(inputs.strategy, variables) + list(trace.notes)
    return notes


def _outside_strategy(strategy: str, variables: list) -> list[str]:
    """Under mirrored, a traced program's plain variables (created outside the strategy's scope,
    e.g. Keras' own counters): a finding, not a broken mirror (the variables_mirrored rule checks
    the distributed ones)."""
    plain = [v for v in user_variables(variables) if v["kind"] == "variable"]
    if strategy not in ("mirrored", "multi_worker_mirrored") or not plain:
        return []
    where = Counter(d for v in plain for d in v["devices"])
    return [f"{len(plain)} plain variable(s) outside the strategy (created outside its scope): "
            + ", ".join(f"{n} on {d}" for d, n in sorted(where.items()))]


def _precision(policy: str | None, op_types: dict) -> dict | None:
    """The precision policy and the casts between float32 variables and float16/bfloat16 compute,
    per device."""
    if policy is None:
        return None
    return {"policy": policy,
            "casts_by_device": {d: types["Cast"] for d, types in op_types.items() if types.get("Cast")}}


def _mean_counter(counters: list[Counter]) -> dict:
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    n = max(len(counters), 1)
    keys = sorted(total, key=sort_key) if all(k.startswith("/") or not k for k in total) else sorted(total)
    return {k: json_number(total[k] / n) for k in keys}
