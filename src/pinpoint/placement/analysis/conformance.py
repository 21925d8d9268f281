"""Did the plan hold: each pinning rule's planned device against the devices the relevant ops and
variables really ran on, the requests behind each op, fallbacks (observed, and predicted under GPU
emulation from the kernel registry), and the per-layer table of model parallelism."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from pinpoint.device_names import DeviceMap, matches, normalize, sort_key, split_prefix
from pinpoint.layer_keys import LayerPins, scope_regex
from pinpoint.placement.graphs.captured import requested_devices
from pinpoint.placement.graphs.ops import BOOKKEEPING, INPUT_RE, NOT_COMPUTE, XLA_ATTR
from pinpoint.placement.model.sections import LayerRow, mean_score

# The graph partitioner's own Identity where an edge between devices arrives (".../_65" on the
# receiving device, fed across the devices by ".../ctrl/_62" for a control edge): it is placed
# with the consumer, not where the layer whose name it carries asked to run.
PARTITIONER_RE = re.compile(r"/_\d+$")


def predicted_fallback(node, pre, requested: str | None, namer: DeviceMap, emulated_gpus: set) -> dict | None:
    """A GPU machine's fallback for an op that ran on an emulated GPU, from the kernel registry."""
    if node.op in BOOKKEEPING or pre is None or XLA_ATTR in node.attr:
        return None
    if node.op != pre.op and not node.op.startswith("_"):
        return None  # grappler replaced it (e.g. constant-folded to a Const): not the op that ran
    norm = normalize(node.device)
    prefix, local = split_prefix(norm)
    if local not in emulated_gpus:
        return None
    from pinpoint.kernels import missing_gpu_kernel

    reason = missing_gpu_kernel(pre.op, pre.attr)
    if reason is None:
        return None
    placed = namer.canonical_spec(node.device)
    host = f"{prefix}/CPU:0"
    return {
        "op": node.name,
        "op_type": pre.op,
        "requested": namer.canonical_spec(requested) if requested else placed,
        "requested_physical": normalize(requested) if requested else norm,
        "placed": placed,
        "placed_physical": norm,
        "predicted": True,
        "would_run_on": host,
        "reason": reason,  # a GPU machine runs it on `would_run_on` (soft placement)
    }


def as_predicted(ops: list[dict], predicted: dict) -> list[dict]:
    """Ops as a GPU machine would place them: a predicted fallback on the host."""
    if not predicted:
        return ops
    return [dict(o, device=predicted[o["op"]]["would_run_on"]) if o["op"] in predicted else o for o in ops]


def mark_predicted(rules, predicted: dict) -> None:
    """Label each rule violation that is a predicted fallback (a GPU machine's host op) as such."""
    for rule in rules:
        for viol in rule.get("violations") or []:
            fb = predicted.get(viol["op"])
            if fb is not None:
                viol["predicted"] = True
                viol["why"] = fb["reason"] + " (predicted fallback)"


def _rule(name: str, planned: str, relevant: list[tuple[str, str]]) -> dict:
    """relevant: (op or variable, placed device) pairs."""
    observed = Counter(dev for _, dev in relevant)
    ok = sum(1 for _, dev in relevant if matches(planned, dev))
    violations = [{"op": op, "placed": dev} for op, dev in relevant if not matches(planned, dev)]
    return {
        "rule": name,
        "planned": planned,
        "observed": {d: observed[d] for d in sorted(observed, key=sort_key)},
        "relevant": len(relevant),
        "score": round(ok / len(relevant), 4) if relevant else None,
        "violations": violations[:50],
        "violations_total": len(violations),
    }


def gradient_re(scope: str = "gradients"):
    """Backward-pass op names: the trainer's gradient scope (Keras may number it) or gradient_tape."""
    return re.compile(rf"(^|/)({re.escape(scope)}(_\d+)?|gradient_tape)/")


def layer_re(layer: str, names=None):
    """Ops in the name scope of the layers a train.pinning.layers key selects (`names`: the
    layers it matched in the built model, when known)."""
    # Keras 3 uniquifies scopes inside tf.function ("dense" -> "dense_1"), so accept a suffix.
    return re.compile(rf"(^|/)(?:{scope_regex(layer, names)})(_\d+)?/")


def _scope(layer: str, pins: LayerPins | None):
    """The name scopes of the layers a key selected: the resolved layers' names when known."""
    return layer_re(layer, pins.names_by_key().get(layer) if pins is not None else None)


def check_conformance(ops, variables, plan, strategy, device_map, namer, grad_re, pins, input_re) -> dict:
    """placement.json's `conformance`: one rule per pin of the plan and per strategy expectation
    (planned device, observed devices, score, violations); `score` is the mean of the rules'.
    `pins`: train.pinning.layers as resolved against the model (None: the keys as scopes)."""
    compute = [o for o in ops if o["type"] not in NOT_COMPUTE
               and not (o["type"] == "Identity" and PARTITIONER_RE.search(o["op"]))]
    is_input = lambda o: bool(INPUT_RE.match(o["type"]) or input_re.search(o["op"]))  # noqa: E731
    rules = _plan_rules(compute, variables, plan, namer, grad_re, pins, is_input, strategy) if plan is not None else []
    rules += _strategy_rules(compute, variables, strategy, device_map, namer, is_input)
    return {"score": mean_score(r["score"] for r in rules), "rules": rules}


def _plan_rules(compute, variables, plan, namer, grad_re, pins, is_input, strategy=None) -> list[dict]:
    rules = []
    if getattr(plan, "variables", None):
        rel = [(v["name"], c["device"]) for v in variables for c in v["components"]]
        rule = _rule("variables", namer.canonical_spec(plan.variables), rel)
        # A layer's variables are created inside the layer's device scope, so a layers.<name>
        # rule wins over the variables rule for that layer: say so next to the violation.
        for viol in rule["violations"]:
            for layer, dev in (getattr(plan, "layers", None) or {}).items():
                if _scope(layer, pins).search(viol["op"] + "/") and matches(namer.canonical_spec(dev), viol["placed"]):
                    viol["why"] = f"created inside layers.{layer}'s device scope ({dev})"
        rules.append(rule)
    if getattr(plan, "gradients", None):
        rel = [(o["op"], o["device"]) for o in compute if grad_re.search(o["op"])]
        rules.append(_rule("gradients", namer.canonical_spec(plan.gradients), rel))
    for layer, dev in (getattr(plan, "layers", None) or {}).items():
        rule = _layer_rule(layer, namer.canonical_spec(dev), compute, grad_re, pins,
                           backward_pinned=bool(getattr(plan, "gradients", None)))
        if strategy == "parameter_server":
            rule = _ps_layer_rule(rule, layer, variables, pins)
        rules.append(rule)
    if getattr(plan, "input", None):
        # An Identity the partitioner adds where a replica receives its batch (".../_27" on
        # the replica's device) forwards the copy; it does no input work.
        rel = [(o["op"], o["device"]) for o in compute if is_input(o) and o["type"] != "Identity"]
        rules.append(_rule("input", namer.canonical_spec(plan.input), rel))
    return rules


def _layer_rule(layer: str, planned: str, compute, grad_re, pins: LayerPins | None, *,
                backward_pinned: bool = False) -> dict:
    """layers.<key>: its forward ops and its backward ops (gradients/.../<layer>/..._grad; a plan
    whose backward pass ignores the pins cannot score 1), scored together and apart. With
    pinning.gradients the backward ops belong to the gradients rule (the trainer puts them on its
    device, not the layer's): the layer's rule scores its forward ops, its backward ops unscored."""
    lre = _scope(layer, pins)
    fwd = [(o["op"], o["device"]) for o in compute if lre.search(o["op"]) and not grad_re.search(o["op"])]
    bwd = [(o["op"], o["device"]) for o in compute if lre.search(o["op"]) and grad_re.search(o["op"])]
    rule = _rule(f"layers.{layer}", planned, fwd if backward_pinned else fwd + bwd)
    if pins is not None and layer in pins.devices:
        rule["layers_matched"] = len(pins.names_by_key().get(layer, ()))
    for part, rel in (("forward", fwd), ("backward", bwd)):
        sub = _rule(part, planned, rel)
        scored = part == "forward" or not backward_pinned
        rule[part] = {"relevant": sub["relevant"], "score": sub["score"] if scored else None,
                      "observed": sub["observed"]}
    return rule


def _ps_layer_rule(ops_rule: dict, layer: str, variables, pins: LayerPins | None) -> dict:
    """parameter_server: layers.<key> pins the layer's variables to a ps task and the layer still
    computes on the worker, so the rule scores its variables; its ops' devices stay beside it
    (forward/backward, unscored)."""
    lre = _scope(layer, pins)
    rel = [(v["name"], c["device"]) for v in variables if lre.search(v["name"] + "/") for c in v["components"]]
    rule = _rule(ops_rule["rule"], ops_rule["planned"], rel)
    rule["scores"] = "variables"
    for key in ("layers_matched", "forward", "backward"):
        if key in ops_rule:
            rule[key] = ops_rule[key] if key == "layers_matched" else {**ops_rule[key], "score": None}
    return rule


# Keras 3 builds an optimizer's slots at its first apply_gradients, inside the step: under
# ParameterServerStrategy the coordinator creates them there, and each step sends them to the ps and back.
LAZY_SLOT = "an optimizer slot Keras made at the first apply_gradients, inside the step: the coordinator holds it"


LAZY_SLOT_FIX = ("build the optimizer inside strategy.scope() before the first step: "
                 "optimizer.build(model.trainable_variables)")


def _strategy_rules(compute, variables, strategy, device_map, namer, is_input) -> list[dict]:
    """What the strategy promises: where its variables live, and (mirrored) each replica's compute."""
    replicas = [namer.canonical_spec(d) for d in (getattr(device_map, "replica_devices", None) or [])]
    every = [(v["name"], c["device"]) for v in variables for c in v["components"]]
    if strategy in ("mirrored", "multi_worker_mirrored") and replicas:
        return [_mirrored_rule(variables, replicas), *_replica_rules(compute, replicas, is_input)]
    if strategy == "central_storage":
        return [_rule("strategy.variables_on_host",
                      namer.canonical_spec(getattr(device_map, "host", None) or "/CPU:0"), every)]
    if strategy == "one_device" and replicas:
        return [_rule("strategy.variables_on_device", replicas[0], every)]
    if strategy == "parameter_server":
        rule = _rule("strategy.variables_on_ps", "/job:ps", every)
        lazy = {v["name"] for v in variables if (v.get("created") or {}).get("by")}
        for viol in rule["violations"]:
            if viol["op"] in lazy:
                viol["why"] = LAZY_SLOT
        return [rule]
    return []


def _mirrored_rule(variables, replicas: list[str]) -> dict:
    """One component of every variable on every replica device. A plain variable (created outside
    the strategy's scope, e.g. a program's own counters) is not mirrored by design."""
    missing, present = [], []
    for v in variables:
        if v.get("kind") == "variable":
            continue
        devs = set(v["devices"])
        for r in replicas:
            (present if any(matches(r, d) for d in devs) else missing).append((v["name"], r))
    return {
        "rule": "strategy.variables_mirrored",
        "planned": ", ".join(replicas),
        "observed": {},
        "relevant": len(missing) + len(present),
        "score": round(len(present) / (len(missing) + len(present)), 4) if (missing or present) else None,
        "violations": [{"op": n, "placed": f"no component on {r}"} for n, r in missing][:50],
        "violations_total": len(missing),
    }


def _replica_rules(compute, replicas: list[str], is_input) -> list[dict]:
    """Replica i's compute on replica device i: MirroredStrategy names replica i>0 ops
    "replica_i/..." and replica 0's the same without prefix. The input pipeline is excluded:
    where it runs is the `input` rule's business (usually the host)."""
    names = {o["op"] for o in compute}
    rel_by_replica: dict[int, list] = defaultdict(list)
    for o in compute:
        if is_input(o):
            continue
        m = re.match(r"^replica_(\d+)/(.*)$", o["op"])
        if m:
            rel_by_replica[int(m.group(1))].append((o["op"], o["device"]))
        elif f"replica_1/{o['op']}" in names:
            rel_by_replica[0].append((o["op"], o["device"]))
    return [_rule(f"strategy.replica_{i}_compute", dev, rel_by_replica[i])
            for i, dev in enumerate(replicas) if rel_by_replica.get(i)]


def requested_rules(cap, namer: DeviceMap, predicted: dict | None = None) -> list[dict]:
    """A traced program's plan is its own requests: one rule per device it requested in its
    `tf.device` scopes, the ops that asked for it against where they ran (a predicted fallback, with
    no GPU kernel, against the host a GPU machine runs it on)."""
    if cap is None:
        return []
    requested = requested_devices(cap)
    placed, types = {}, {}
    for g in cap.partition_graphs:
        for n in g.node:
            placed[n.name] = n.device
            types[n.name] = n.op
    by_device: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for op, req in requested.items():
        if op not in placed or types[op] in NOT_COMPUTE:
            continue
        fb = (predicted or {}).get(op)
        ran = fb["would_run_on"] if fb else namer.canonical_spec(placed[op])
        by_device[namer.canonical_spec(req)].append((op, ran))
    return [_rule(f"tf.device {dev}", dev, by_device[dev]) for dev in sorted(by_device, key=sort_key)]


def layer_table(rules, items, plan, pins: LayerPins | None) -> list[LayerRow]:
    """Model parallelism at a glance: per pinned layer, its device, forward and backward ops per
    device (its `layers.<name>` rule's counts), and the bytes its ops receive from and send to
    other devices each step."""
    by_name = {r["rule"]: r for r in rules}
    matched = pins.names_by_key() if pins is not None else {}
    rows = []
    for layer in getattr(plan, "layers", None) or {}:
        rule = by_name[f"layers.{layer}"]
        lre = _scope(layer, pins)
        out_b = sum(t["bytes"] or 0 for t in items if lre.search(t["tensor"]))
        in_b = sum(t["bytes"] or 0 for t in items
                   if not lre.search(t["tensor"]) and any(lre.search(c) for c in t.get("consumers", ())))
        names = matched.get(layer)
        rows.append(LayerRow(layer=layer, device=rule["planned"], forward_ops=rule["forward"]["observed"],
                             backward_ops=rule["backward"]["observed"], bytes_in=in_b, bytes_out=out_b,
                             layers_matched=rule.get("layers_matched"),
                             matched=tuple(names) if names is not None else None,
                             backward_pinned=bool(getattr(plan, "gradients", None))))
    return rows
