"""`pinpoint plan --verify`: the config that trains a plan, and the plan's prediction set against
what the verification run measured (plan_check.json). Training itself is the execution layer's
(pinpoint.steps.verify); this module only derives and compares.

Compared: the bytes crossing each ordered device pair per step (predicted on the source run's
graph, measured in the verification run's placement.json transfers matrix; exact on emulated
devices too), conformance (the verification run's `layers.<key>` rules, every violation with its
cause) and the step time (predicted vs the measured median; on emulated GPUs the measured step
cannot show the link model's transfer prices, see STEP_NOTE). A plan over parameter servers
trains under strategy parameter_server, and adds the bytes per server (ps_bytes, predicted vs
servers.measured_ps_bytes); its pairs are each server's with the step's worker. When the source run
kept its memory replay, the verification run measures memory too and each device's predicted peak
is held to the measured one (plan.memory.compare_memory).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pinpoint.config import MODEL_LAYERS, Config, config_from_dict
from pinpoint.device_names import parse_name
from pinpoint.errors import ConfigError
from pinpoint.layer_keys import key_matches
from pinpoint.placement import NOT_COMPUTE, Placement, Rule, Violation, gradient_re
from pinpoint.plan import allreduce as all_reduce
from pinpoint.plan.emit import placement_of
from pinpoint.plan.graph import PlanGraph
from pinpoint.plan.links import LinkModel
from pinpoint.plan.memory import compare_memory, memory_lines
from pinpoint.plan.predict import predict, schedule
from pinpoint.plan.servers import measured_ps_bytes, predicted_ps_pairs, servers_of

PLAN_CHECK = "plan_check.json"
PLAN_FILE = "plan.yaml"
STEP_NOTE = {
    True: "emulated GPUs: the logical devices share the host's cores and hand tensors over by reference, so the "
          "measured step shows neither parallel speed-up nor the link model's transfer prices; the predicted step "
          "is what the plan costs on the links the model describes",
    False: "real devices: the measured step is the real figure the prediction is held to",
}
STEP_NOTE_PS = ("parameter_server: a step runs as a closure in a worker's runtime, out of the profiler's reach, so "
                "no compute is measured and no step is predicted; measured_ms is the chief's median step (the "
                "closure's dispatch, its pulls and pushes through gRPC and its compute), so it shows what a step "
                "costs, not which server is the bottleneck: ps_bytes shows that")
# Measured pairs a parameter_server plan does not predict (they do not depend on where the
# variables sit), by the jobs of their two ends.
OUTSIDE_PS_MODEL = {
    "chief": "between the coordinator and a worker: the closure's inputs and results, not parameter-server traffic",
    "ps": "between two servers: an update op reading a variable on another server, such as the learning rate",
    "other": "not between a server and a worker: not what the variables' placement moves",
}


def verify_config(cfg: Config, doc: dict[str, Any], config_path: str) -> Config:
    """cfg with the plan's pinning.layers (and pinning.input) applied, placement captured and
    timed; a ConfigError naming the field when cfg cannot train the plan."""
    if doc.get("all_reduce") and cfg.train.strategy == "mirrored":  # a mirrored run's train.all_reduce
        return all_reduce.verify_config(cfg, doc, config_path)
    t = cfg.train
    if t.entrypoint is not None:
        raise ConfigError(f"train.entrypoint: got '{t.entrypoint}' in {config_path}; --verify trains with Pinpoint's "
                          "own loop (train.model), which pinning.layers steers; apply the plan's tf_device mapping "
                          "in your program, run it again, then check it with `pinpoint plan RUN_DIR --verify "
                          "--against NEW_RUN`")
    if t.strategy == "parameter_server" or servers_of(doc["devices"]):
        _check_servers(cfg, doc, config_path)
    elif t.strategy != "none":
        raise ConfigError(f"train.strategy: got '{t.strategy}' in {config_path}; a plan of layers over devices "
                          "trains with strategy 'none' (model parallelism); set train.strategy: none")
    layers = dict(doc["pinning"]["layers"])
    if t.builtin_model:
        names = MODEL_LAYERS[t.model]
        missing = [k for k in layers if not any(key_matches(k, n) for n in names)]
        if missing:
            raise ConfigError(f"train.model: got '{t.model}' in {config_path}, which has no layer {missing[0]} of the "
                              f"plan (its layers: {', '.join(names)}); verify with the config the run "
                              f"{doc.get('source_run')} was trained with")
    data = cfg.model_dump(mode="json", exclude_unset=True)  # what was written (config_scope)
    pinning = data.setdefault("train", {}).setdefault("pinning", {})
    pinning["layers"] = layers
    if doc["pinning"].get("input") is not None:
        pinning["input"] = doc["pinning"]["input"]
    if doc["pinning"].get("gradients") is not None:
        pinning["gradients"] = doc["pinning"]["gradients"]
    # memory: the plan's predicted peaks are held to the verification run's measured ones.
    data.setdefault("placement", {}).update(enabled=True, timing=True, **({"memory": True} if doc.get("memory") else {}))
    return config_from_dict(data, source=config_path)


def _check_servers(cfg: Config, doc: dict[str, Any], config_path: str) -> None:
    """A plan over parameter servers trains under strategy parameter_server with at least the
    plan's ps tasks (the same local multi-process cluster `pinpoint train` starts); a
    parameter_server config trains only such a plan."""
    servers, strategy = servers_of(doc["devices"]), cfg.train.strategy
    if not servers:
        raise ConfigError(f"train.strategy: got 'parameter_server' in {config_path}, but the plan places layers on "
                          f"{', '.join(doc['devices'])}, not on parameter servers; set train.strategy to the one the run "
                          f"{doc.get('source_run')} was trained with, or plan a parameter_server run")
    if strategy != "parameter_server":
        raise ConfigError(f"train.strategy: got '{strategy}' in {config_path}, but the plan places variables on "
                          f"parameter servers ({', '.join(servers)}); set train.strategy: parameter_server")
    needed = 1 + max(parse_name(d)[1] or 0 for d in servers)
    if cfg.cluster.ps < needed:
        raise ConfigError(f"cluster.ps: got {cfg.cluster.ps} in {config_path}, but the plan uses {servers[-1]}; "
                          f"set cluster.ps: {needed} or more")


def pair_bytes(placement: Placement) -> dict[str, int]:
    """Bytes per step per device pair ('a -> b'), as a run's placement.json transfers matrix counted them."""
    return {f"{a} -> {b}": cell.bytes or 0 for a, row in placement.transfers.matrix.items() for b, cell in row.items()}


def compare_bytes(predicted: dict[str, int], measured: dict[str, int]) -> dict[str, Any]:
    """Per ordered pair: predicted vs measured bytes per step (a pair absent on one side is 0)."""
    pairs = sorted(set(predicted) | set(measured))
    rows = [{"pair": p, "predicted": predicted.get(p, 0), "measured": measured.get(p, 0)} for p in pairs]
    rows = [dict(r, exact=r["predicted"] == r["measured"]) for r in rows if r["predicted"] or r["measured"]]
    return {"pairs": rows, "exact": all(r["exact"] for r in rows),
            "predicted_total": sum(predicted.values()), "measured_total": sum(measured.values())}


def _causes(placement: Placement) -> dict[str, str]:
    """Op -> why it left its requested device (the run's fallbacks)."""
    return {f.op: f.reason or "" for f in placement.fallbacks if f.op}


def compare_conformance(placement: Placement, layers: dict[str, str], gradients: str | None = None
                        ) -> dict[str, Any]:
    """Each planned layer's rule of the verification run (and the `gradients` rule when the plan
    pins the backward pass, listed as layer `pinning.gradients`): its score, and every deviation
    with its cause (the rule's own `why`, else the run's fallback reason for the op)."""
    rules = {r.rule: r for r in placement.conformance.rules}
    causes = _causes(placement)
    out, deviations = [], []
    planned = {f"layers.{key}": (key, device) for key, device in layers.items()}
    if gradients is not None:
        planned["gradients"] = ("pinning.gradients", gradients)
    for name, (key, device) in planned.items():
        rule = rules.get(name) or _rule_from_rows(placement, key, device, gradients_pinned=gradients is not None)
        if rule is None:
            out.append({"layer": key, "planned": device, "score": 0.0, "observed": {}, "note": "no rule in the run"})
            deviations.append({"layer": key, "op": None, "placed": None,
                               "cause": "the verification run has no layers rule for it (no op matched the layer)"})
            continue
        out.append({"layer": key, "planned": device, "score": rule.score, "observed": dict(rule.observed)})
        for v in rule.violations:
            deviations.append({"layer": key, "op": v.op, "placed": v.placed,
                               "cause": v.why or causes.get(v.op)
                               or "placed off the layer's device with no recorded fallback (the placer's choice)"})
    score = round(sum(r["score"] for r in out) / len(out), 4) if out else None
    return {"score": score, "layers": out, "deviations": deviations}


def _rule_from_rows(placement: Placement, key: str, planned: str, *, gradients_pinned: bool) -> Rule | None:
    """A planned pin scored from the run's op rows when the run has no rule for it (a traced
    program: its rules are its own tf.device scopes): the ops of layer `key` (its forward ops when
    the plan pins the gradients), or every backward op for `pinning.gradients`. None: no such op."""
    grad = gradient_re()
    rows = [r for r in placement.ops if r.type not in NOT_COMPUTE]
    if key == "pinning.gradients":
        mine = [r for r in rows if grad.search(r.op)]
    else:
        mine = [r for r in rows if r.layer == key and not (gradients_pinned and grad.search(r.op))]
    if not mine:
        return None
    on = sum(r.device == planned for r in mine)
    off = tuple(Violation(op=r.op, placed=r.device) for r in mine if r.device != planned)
    return Rule(rule=key, planned=planned, observed=dict(Counter(r.device for r in mine)), relevant=len(mine),
                score=round(on / len(mine), 4), violations=off, violations_total=len(off))


def plan_check(doc: dict[str, Any], source: PlanGraph, verified: PlanGraph, placement: Placement,
               links: LinkModel, *, verify_run: str) -> dict[str, Any]:
    """plan_check.json: the plan's prediction (doc, made on `source`) against the verification
    run (`verified`, its placement.json `placement`)."""
    emulated = bool(placement.device_aliases)
    if doc.get("all_reduce") and verified.all_reduce is not None:  # the all-reduce choice, trained mirrored
        measured = pair_bytes(placement)
        predicted = doc["all_reduce_plan"]["prediction"]["plan"]["bytes_crossing"]
        return all_reduce.check(doc, verified, placement, links, verify_run=verify_run, step_note=STEP_NOTE[emulated],
                                bytes_=compare_bytes(predicted, measured), measured_pairs=measured)
    planned = doc["prediction"]["plan"]
    devices = tuple(doc["devices"])
    plan_placement = placement_of(source, doc["pinning"])
    servers = servers_of(devices)
    if servers:
        # Over parameter servers the plan moves variables, so the pairs it predicts are each
        # server's with the step's worker; the other measured pairs are listed beside them.
        measured_pairs = pair_bytes(placement)
        bytes_ = compare_bytes(predicted_ps_pairs(source, plan_placement),
                               {p: n for p, n in measured_pairs.items() if _ps_pair(p)})
        bytes_["outside_model"] = [{"pair": p, "measured": n, "why": _outside_why(p)}
                                   for p, n in sorted(measured_pairs.items()) if n and not _ps_pair(p)]
    else:
        bytes_ = compare_bytes(planned["bytes_crossing"], pair_bytes(placement))
    conformance = compare_conformance(placement, doc["pinning"]["layers"], doc["pinning"].get("gradients"))
    ran = {g.key: g.device for g in verified.groups}
    as_run = predict(verified, ran, links, devices).to_dict()
    measured_ms = None if verified.measured_step_us is None else round(verified.measured_step_us / 1e3, 4)
    # The verification run as measured, beside the predictions: its own compute per device, the
    # bytes its transfers matrix counted, its median step.
    measured_all = {p: n for p, n in pair_bytes(placement).items() if n}
    verified_row = dict(as_run, step_ms=measured_ms, bytes_crossing_per_step=sum(measured_all.values()),
                        bytes_crossing=measured_all)
    predicted_ms = planned.get("step_ms")
    check = {
        "source_run": doc.get("source_run"),
        "verify_run": verify_run,
        "objective": doc["objective"],
        "algorithm": doc["algorithm"],
        "devices": list(devices),
        "emulated": emulated,
        "pinning": doc["pinning"],
        "bytes": bytes_,
        "conformance": conformance,
        "step": {
            "predicted_ms": predicted_ms,
            "measured_ms": measured_ms,
            "measured_over_predicted": round(measured_ms / predicted_ms, 3) if predicted_ms and measured_ms else None,
            # What the verification run's own measured compute predicts for it: the same model
            # with the new run's costs, so the gap to measured_ms is the per-step overhead.
            "predicted_from_verified_ms": as_run["step_ms"],
            "note": STEP_NOTE_PS if servers else STEP_NOTE[emulated],
        },
        "placements": {**doc["prediction"], "verified": verified_row},
        "timeline": {
            "measured": schedule(source, {g.key: g.device for g in source.groups}, links),
            "plan": schedule(source, plan_placement, links),
        },
    }
    if servers:
        check["ps_bytes"] = compare_servers(planned["ps_bytes"], measured_ps_bytes(placement))
    if planned.get("memory"):
        check["memory"] = compare_memory(planned["memory"], placement)
    return check


def _ps_pair(pair: str) -> bool:
    """A server's pair with a worker or the chief (what measured_ps_bytes sums)."""
    a, b = (parse_name(d)[0] for d in pair.split(" -> "))
    return (a == "ps" and b in ("worker", "chief")) or (b == "ps" and a in ("worker", "chief"))


def _outside_why(pair: str) -> str:
    jobs = {parse_name(d)[0] for d in pair.split(" -> ")}
    return OUTSIDE_PS_MODEL["ps" if jobs == {"ps"} else "chief" if "chief" in jobs else "other"]


def compare_servers(predicted: dict[str, int], measured: dict[str, int]) -> dict[str, Any]:
    """Per parameter server: predicted vs measured bytes per step with the workers (a server
    absent on one side is 0), and the largest server over the mean on each side."""
    rows = [{"server": d, "predicted": predicted.get(d, 0), "measured": measured.get(d, 0)}
            for d in servers_of(set(predicted) | set(measured))]
    rows = [dict(r, exact=r["predicted"] == r["measured"]) for r in rows]

    def over_mean(side: str) -> float | None:
        total = sum(r[side] for r in rows)
        return round(max(r[side] for r in rows) * len(rows) / total, 4) if total else None

    return {"servers": rows, "exact": all(r["exact"] for r in rows),
            "predicted_total": sum(r["predicted"] for r in rows), "measured_total": sum(r["measured"] for r in rows),
            "predicted_largest_over_mean": over_mean("predicted"), "measured_largest_over_mean": over_mean("measured")}


def check_table(check: dict[str, Any]) -> str:
    """The short table `pinpoint plan --verify` prints (an all-reduce plan: its choice above the
    bytes, its collective inputs below them, and no layers to conform)."""
    a = check.get("all_reduce")
    lines = [all_reduce.headline(a)] if a else []
    lines.append("bytes/step  predicted  measured")
    for r in check["bytes"]["pairs"]:
        lines.append(f"  {r['pair']:<22} {r['predicted']:>9} {r['measured']:>9}{'' if r['exact'] else '  DIFFERS'}")
    b = check["bytes"]
    lines.append(f"  {'total':<22} {b['predicted_total']:>9} {b['measured_total']:>9}  "
                 f"({'exact' if b['exact'] else 'not exact'})")
    if a:
        lines += all_reduce.detail_lines(a)
    for r in b.get("outside_model") or []:
        lines.append(f"  not predicted: {r['pair']} {r['measured']} ({r['why']})")
    ps = check.get("ps_bytes")
    if ps:
        lines.append("bytes/step per server  predicted  measured")
        for r in ps["servers"]:
            lines.append(f"  {r['server']:<22} {r['predicted']:>9} {r['measured']:>9}{'' if r['exact'] else '  DIFFERS'}")
        lines.append(f"  {'total':<22} {ps['predicted_total']:>9} {ps['measured_total']:>9}  "
                     f"({'exact' if ps['exact'] else 'not exact'})")
        lines.append(f"  largest server / mean: predicted {_ratio(ps['predicted_largest_over_mean'])}, "
                     f"measured {_ratio(ps['measured_largest_over_mean'])}")
    if not a:
        c = check["conformance"]
        lines.append(f"conformance of the plan's layers: {c['score']} ({len(c['deviations'])} deviation(s))")
        for d in c["deviations"]:
            lines.append(f"  layers.{d['layer']}: {d['op']} on {d['placed']}: {d['cause']}")
    if check.get("memory"):
        lines += memory_lines(check["memory"])
    s = check["step"]
    pred = "-" if s["predicted_ms"] is None else f"{s['predicted_ms']:.3f}"
    meas = "-" if s["measured_ms"] is None else f"{s['measured_ms']:.3f}"
    lines.append(f"step ms: predicted {pred}, measured median {meas}")
    lines.append(f"  ({s['note']})")
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}x"
