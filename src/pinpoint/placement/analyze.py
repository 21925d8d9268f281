"""Turn captured partition graphs into placement.json: where every op, variable and gradient ran.

Runs once, after training (never on the hot path). Input: the CapturedGraphs of the sampled
steps (each capture is one executed step), the model's and optimizer's variables, the pinning
plan and the device map. Every device is reported by its spec name ("/GPU:0") and the
physical name it ran on is kept in `physical_devices` / `device_aliases`.

This module puts the sections together; each is computed where its rules live: transfers
(placement.transfers), variables and replica consistency (placement.variables), requests,
fallbacks and conformance (placement.conformance); the file's format in placement.schema.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

from pinpoint.device_names import DeviceMap, matches, normalize, sort_key
from pinpoint.placement.conformance import (
    as_predicted,
    check_conformance,
    gradient_re,
    layer_table,
    mark_predicted,
    predicted_fallback,
    requested_defs,
    requested_devices,
)
from pinpoint.placement.schema import EXPLAIN, SCHEMA_VERSION, json_number
from pinpoint.placement.transfers import BOOKKEEPING, merge_transfer_steps, step_transfers
from pinpoint.placement.variables import analyze_variables, safe_consistency


def build_placement(
    captures: list,
    *,
    variables: list,
    plan: Any,
    strategy: str,
    device_map: Any,
    task: str = "chief:0",
    gradient_scope: str = "gradients",
    layer_scopes: dict[str, str] | None = None,
    input_scope: str = "input",
    optimizer_variables: list | None = None,
) -> dict:
    """placement.json content from the captured steps (see schema.EXPLAIN for each field).

    Input-pipeline ops are dataset/iterator op types plus ops under the `input_scope` name scope
    (an in-graph input pipeline). `optimizer_variables` (a subset of `variables`) are classed as
    optimizer slots by the replica-consistency check."""
    namer = DeviceMap.of(device_map)
    captures = [c for c in captures if c is not None]
    grad_re = gradient_re(gradient_scope)

    per_step_ops: list[Counter] = []
    per_step_types: list[dict[str, Counter]] = []
    per_step_grads: list[Counter] = []
    transfer_steps: list[dict] = []
    seen_devices: set[str] = set()
    seen_physical: set[str] = set()
    fallbacks: dict[str, dict] = {}
    predicted: dict[str, dict] = {}
    ops_detail: list[dict] = []
    emulated_gpus = {normalize(p) for p in namer.aliases.values()} if getattr(device_map, "emulated", False) else set()

    for ci, cap in enumerate(captures):
        ops = Counter()
        types: dict[str, Counter] = defaultdict(Counter)
        grads = Counter()
        requested = requested_devices(cap)
        defs = requested_defs(cap) if emulated_gpus else {}
        for g in cap.partition_graphs:
            for n in g.node:
                dev = namer.canonical_spec(n.device)
                if dev:
                    seen_devices.add(dev)
                    seen_physical.add(normalize(n.device))
                if n.op in BOOKKEEPING:
                    continue
                ops[dev] += 1
                types[dev][n.op] += 1
                if grad_re.search(n.name):
                    grads[dev] += 1
                if ci == 0:
                    ops_detail.append({"op": n.name, "type": n.op, "device": dev})
                req = requested.get(n.name)
                if req and not matches(req, n.device):
                    fallbacks.setdefault(
                        n.name,
                        {
                            "op": n.name,
                            "op_type": n.op,
                            "requested": namer.canonical_spec(req),
                            "requested_physical": normalize(req),
                            "placed": dev,
                            "placed_physical": normalize(n.device),
                        },
                    )
                if emulated_gpus and n.name not in predicted:
                    fb = predicted_fallback(n, defs.get(n.name), req, namer, emulated_gpus)
                    if fb is not None:
                        predicted[n.name] = fb
        per_step_ops.append(ops)
        per_step_types.append(types)
        per_step_grads.append(grads)
        transfer_steps.append(step_transfers(cap, namer))

    known = seen_physical | {normalize(p) for p in namer.aliases.values()}
    for fb in fallbacks.values():
        fb["reason"] = (
            "requested device does not exist"
            if not any(matches(fb["requested_physical"], d) for d in known)
            else "moved by the placer (no kernel for this op there, or colocated with a resource "
            "or input on another device)"
        )

    # Devices the setup already resolved elsewhere (no such device here, soft placement on): every
    # op pinned there was redirected before tracing, so the graphs cannot show it; report it.
    for spec, instead in (getattr(device_map, "fallbacks", None) or {}).items():
        fallbacks.setdefault(
            f"(every op pinned to {spec})",
            {
                "op": f"(every op pinned to {spec})",
                "op_type": "*",
                "requested": spec,
                "requested_physical": spec,
                "placed": namer.canonical_spec(instead),
                "placed_physical": normalize(instead),
                "reason": "requested device does not exist on this machine; redirected at device setup "
                "(soft placement)",
            },
        )

    values: dict = {}  # component values, read once for fingerprints and replica consistency
    var_info = analyze_variables(variables, captures, namer, values, optimizer_variables)
    for v in var_info["variables"]:
        seen_devices.update(v["devices"])
        seen_devices.update(v["update_devices"])
    devices = sorted((d for d in seen_devices if d), key=sort_key)

    conformance = check_conformance(
        as_predicted(ops_detail, predicted), var_info["variables"], plan, strategy, device_map, namer,
        grad_re, layer_scopes, re.compile(rf"(^|/){re.escape(input_scope)}(_\d+)?/"),
    )
    mark_predicted(conformance, predicted)
    placement = {
        "schema": SCHEMA_VERSION,
        "task": task,
        "strategy": strategy,
        "captured_steps": [s for c in captures for s in (getattr(c, "steps", None) or [c.step])],
        "devices": devices,
        "physical_devices": {d: namer.canonical_physical(d) for d in devices},
        "device_aliases": dict(namer.aliases),
        "ops_by_device": _mean_counter(per_step_ops),
        "op_types_by_device": {
            d: _mean_counter([t.get(d, Counter()) for t in per_step_types])
            for d in sorted({d for t in per_step_types for d in t}, key=sort_key)
        },
        "transfers": merge_transfer_steps(
            transfer_steps, [getattr(c, "steps", None) or [c.step] for c in captures]),
        "fallbacks": sorted(fallbacks.values(), key=lambda f: f["op"])
        + sorted(predicted.values(), key=lambda f: f["op"]),
        "variables": var_info["variables"],
        "variable_updates": var_info["updates"],
        "gradients": {
            "scope": f"{gradient_scope}/ and gradient_tape/",
            "ops_by_device": _mean_counter(per_step_grads),
            "total": json_number(sum(sum(c.values()) for c in per_step_grads) / max(len(per_step_grads), 1)),
        },
        # The trainer builds the placement after its last step, so this is the end-of-training check.
        "replica_consistency": safe_consistency(variables, values, optimizer_variables),
        "conformance": conformance,
        "layers": layer_table(conformance, transfer_steps[0]["items"] if transfer_steps else [], plan, layer_scopes),
        "ops": ops_detail,
        # Every transfer of the first captured step (tensor, from, to, bytes, consumers).
        "transfer_items": transfer_steps[0]["items"] if transfer_steps else [],
        "notes": _notes(captures, ops_detail, strategy),
        "explain": EXPLAIN,
    }
    return placement


def _notes(captures: list, ops_detail: list, strategy: str) -> list[str]:
    notes = []
    for cap in captures:
        for note in getattr(cap, "notes", None) or []:
            if note not in notes:
                notes.append(note)
    if not captures:
        notes.append("no step was captured (placement sampling off or training ended before warm-up)")
    elif not ops_detail:
        if strategy == "parameter_server":
            notes.append(
                "no partition graphs on this task: under parameter_server the coordinator schedules each "
                "step as a closure that the worker's own runtime instantiates, so ops, transfers and "
                "gradients are not visible here; variables (on the ps tasks) are"
            )
        else:
            notes.append("the captured call executed no function graphs (was the step function already called?)")
    return notes


def _mean_counter(counters: list[Counter]) -> dict:
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    n = max(len(counters), 1)
    keys = sorted(total, key=sort_key) if all(k.startswith("/") or not k for k in total) else sorted(total)
    return {k: json_number(total[k] / n) for k in keys}
