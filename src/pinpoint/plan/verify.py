"""`pinpoint plan --verify`: the config that trains a plan, and the plan's prediction set against
what the verification run measured (plan_check.json). Training itself is the execution layer's
(pinpoint.steps.verify); this module only derives and compares.

Compared: the bytes crossing each ordered device pair per step (predicted on the source run's
graph, measured in the verification run's placement.json transfers matrix; exact on emulated
devices too), conformance (the verification run's `layers.<key>` rules, every violation with its
cause) and the step time (predicted vs the measured median; on emulated GPUs the measured step
cannot show the link model's transfer prices, see STEP_NOTE).
"""

from __future__ import annotations

from typing import Any

from pinpoint.config import MODEL_LAYERS, Config, config_from_dict
from pinpoint.errors import ConfigError
from pinpoint.layer_keys import key_matches
from pinpoint.plan import allreduce as all_reduce
from pinpoint.plan.graph import PlanGraph
from pinpoint.plan.links import LinkModel
from pinpoint.plan.predict import predict, schedule

PLAN_CHECK = "plan_check.json"
PLAN_FILE = "plan.yaml"
STEP_NOTE = {
    True: "emulated GPUs: the logical devices share the host's cores and hand tensors over by reference, so the "
          "measured step shows neither parallel speed-up nor the link model's transfer prices; the predicted step "
          "is what the plan costs on the links the model describes",
    False: "real devices: the measured step is the real figure the prediction is held to",
}


def verify_config(cfg: Config, doc: dict[str, Any], config_path: str) -> Config:
    """cfg with the plan's pinning.layers (and pinning.input) applied, placement captured and
    timed; a ConfigError naming the field when cfg cannot train the plan."""
    if doc.get("all_reduce"):  # a mirrored run's plan: its train.all_reduce (plan.allreduce)
        return all_reduce.verify_config(cfg, doc, config_path)
    t = cfg.train
    if t.entrypoint is not None:
        raise ConfigError(f"train.entrypoint: got '{t.entrypoint}' in {config_path}; --verify trains with Pinpoint's "
                          "own loop (train.model), which pinning.layers steers; verify a traced program by hand "
                          "(apply the plan's tf_device mapping and re-run pinpoint trace)")
    if t.strategy != "none":
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
    data = cfg.model_dump(mode="json")
    pinning = data["train"]["pinning"]
    pinning["layers"] = layers
    if doc["pinning"].get("input") is not None:
        pinning["input"] = doc["pinning"]["input"]
    data["placement"].update(enabled=True, timing=True)
    return config_from_dict(data, source=config_path)


def pair_bytes(placement: dict[str, Any]) -> dict[str, int]:
    """Bytes per step per device pair ('a -> b'), as a run's placement.json transfers matrix counted them."""
    matrix = (placement.get("transfers") or {}).get("matrix") or {}
    return {f"{a} -> {b}": cell.get("bytes") or 0 for a, row in matrix.items() for b, cell in row.items()}


def compare_bytes(predicted: dict[str, int], measured: dict[str, int]) -> dict[str, Any]:
    """Per ordered pair: predicted vs measured bytes per step (a pair absent on one side is 0)."""
    pairs = sorted(set(predicted) | set(measured))
    rows = [{"pair": p, "predicted": predicted.get(p, 0), "measured": measured.get(p, 0)} for p in pairs]
    rows = [dict(r, exact=r["predicted"] == r["measured"]) for r in rows if r["predicted"] or r["measured"]]
    return {"pairs": rows, "exact": all(r["exact"] for r in rows),
            "predicted_total": sum(predicted.values()), "measured_total": sum(measured.values())}


def _causes(placement: dict[str, Any]) -> dict[str, str]:
    """Op -> why it left its requested device (the run's fallbacks)."""
    return {f["op"]: f.get("reason") or "" for f in placement.get("fallbacks") or [] if f.get("op")}


def compare_conformance(placement: dict[str, Any], layers: dict[str, str]) -> dict[str, Any]:
    """Each planned layer's rule of the verification run: its score, and every deviation with its
    cause (the rule's own `why`, else the run's fallback reason for the op)."""
    rules = {r["rule"]: r for r in (placement.get("conformance") or {}).get("rules") or []}
    causes = _causes(placement)
    out, deviations = [], []
    for key, device in layers.items():
        rule = rules.get(f"layers.{key}")
        if rule is None:
            out.append({"layer": key, "planned": device, "score": 0.0, "observed": {}, "note": "no rule in the run"})
            deviations.append({"layer": key, "op": None, "placed": None,
                               "cause": "the verification run has no layers rule for it (no op matched the layer)"})
            continue
        out.append({"layer": key, "planned": device, "score": rule["score"], "observed": rule.get("observed") or {}})
        for v in rule.get("violations") or []:
            deviations.append({"layer": key, "op": v["op"], "placed": v["placed"],
                               "cause": v.get("why") or causes.get(v["op"])
                               or "placed off the layer's device with no recorded fallback (the placer's choice)"})
    score = round(sum(r["score"] for r in out) / len(out), 4) if out else None
    return {"score": score, "layers": out, "deviations": deviations}


def plan_check(doc: dict[str, Any], source: PlanGraph, verified: PlanGraph, placement: dict[str, Any],
               links: LinkModel, *, verify_run: str) -> dict[str, Any]:
    """plan_check.json: the plan's prediction (doc, made on `source`) against the verification
    run (`verified`, its placement.json `placement`)."""
    emulated = bool(placement.get("device_aliases"))
    if doc.get("all_reduce"):
        measured = pair_bytes(placement)
        return all_reduce.check(doc, verified, placement, links, verify_run=verify_run, step_note=STEP_NOTE[emulated],
                                bytes_=compare_bytes(doc["prediction"]["plan"]["bytes_crossing"], measured),
                                measured_pairs=measured)
    planned = doc["prediction"]["plan"]
    bytes_ = compare_bytes(planned["bytes_crossing"], pair_bytes(placement))
    conformance = compare_conformance(placement, doc["pinning"]["layers"])
    devices = tuple(doc["devices"])
    ran = {g.key: g.device for g in verified.groups}
    as_run = predict(verified, ran, links, devices).to_dict()
    measured_ms = None if verified.measured_step_us is None else round(verified.measured_step_us / 1e3, 4)
    # The verification run as measured, beside the predictions: its own compute per device, the
    # bytes its transfers matrix counted, its median step.
    verified_row = dict(as_run, step_ms=measured_ms, bytes_crossing_per_step=bytes_["measured_total"],
                        bytes_crossing={p: n for p, n in pair_bytes(placement).items() if n})
    plan_placement = {g.key: g.device for g in source.groups}
    plan_placement.update({k: v for k, v in doc["pinning"]["layers"].items() if k in plan_placement})
    if doc["pinning"].get("input") is not None and "input" in plan_placement:
        plan_placement["input"] = doc["pinning"]["input"]
    predicted_ms = planned.get("step_ms")
    return {
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
            "note": STEP_NOTE[emulated],
        },
        "placements": {**doc["prediction"], "verified": verified_row},
        "timeline": {
            "measured": schedule(source, {g.key: g.device for g in source.groups}, links),
            "plan": schedule(source, plan_placement, links),
        },
    }


def check_table(check: dict[str, Any]) -> str:
    """The short table `pinpoint plan --verify` prints."""
    if check.get("all_reduce"):
        return all_reduce.check_table(check)
    lines = ["bytes/step  predicted  measured"]
    for r in check["bytes"]["pairs"]:
        lines.append(f"  {r['pair']:<22} {r['predicted']:>9} {r['measured']:>9}{'' if r['exact'] else '  DIFFERS'}")
    b = check["bytes"]
    lines.append(f"  {'total':<22} {b['predicted_total']:>9} {b['measured_total']:>9}  "
                 f"({'exact' if b['exact'] else 'not exact'})")
    c = check["conformance"]
    lines.append(f"conformance of the plan's layers: {c['score']} ({len(c['deviations'])} deviation(s))")
    for d in c["deviations"]:
        lines.append(f"  layers.{d['layer']}: {d['op']} on {d['placed']}: {d['cause']}")
    s = check["step"]
    pred = "-" if s["predicted_ms"] is None else f"{s['predicted_ms']:.3f}"
    meas = "-" if s["measured_ms"] is None else f"{s['measured_ms']:.3f}"
    lines.append(f"step ms: predicted {pred}, measured median {meas}")
    lines.append(f"  ({s['note']})")
    return "\n".join(lines)
