"""The all-reduce choice of a mirrored run (`train.all_reduce`), priced by the link model.

Under MirroredStrategy every replica runs the whole model; what a plan can move is how the
gradients are summed across the replicas. Each choice's communication, as TensorFlow 2.21
implements it (tensorflow/python/distribute/cross_device_ops.py, cross_device_utils.py), with G
the bytes of all trainable variables (their gradients, one copy) and n replicas d0..d(n-1):

- reduce_to_host (ReductionToOneDevice(reduce_to_device=host)): each gradient tensor is copied
  from every replica to the host, summed there (add_n) and the sum copied back to every replica:
  G bytes each way per replica, one transfer per tensor. _Send/_Recv pairs: measured.
- hierarchical_copy (AllReduceCrossDeviceOps("hierarchical_copy", num_packs=1)): the gradients
  are packed (concatenated) into one tensor of G bytes; with h = n // 2 (aggregate_gradients_
  using_hierarchical_copy, pack 0): d1..d(h-1) send it to d0 and d(h+1)..d(n-1) to dh, dh sends
  its group's sum to d0, d0 sends the total to dh, then d0 to its group and dh to its group. 2(n-1)
  copies of G. _Send/_Recv pairs: measured.
- ring (Pinpoint's CollectiveAllReduce with the RING implementation, bytes_per_pack 0: one pack):
  one CollectiveReduceV2 per replica over the packed G bytes; its instance key is a call-time
  int32 fed from the host, 4 bytes to each replica per step (a _Send). The exchange itself runs
  inside the collective, not as _Send/_Recv: modeled as the textbook ring, 2(n-1)/n x G from
  each replica to the next; measured is each replica's collective input (G).
- nccl (AllReduceCrossDeviceOps("nccl")): NcclAllReduce over the packed G bytes, modeled as a
  ring like the above; real GPUs only (the config refuses it elsewhere).

The transfers that are not the all-reduce (the input batch, the loss sums, the loop's counter)
are the run's measured transfers matrix minus its own all-reduce's _Send/_Recv pairs; they are
the same whichever choice runs, so each choice's pairs are those plus its own.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from pinpoint.config import ALL_REDUCE, Config, config_from_dict
from pinpoint.device_names import parse_name, sort_key
from pinpoint.errors import ConfigError
from pinpoint.placement import COLLECTIVE_TRAFFIC_RE, NCCL_ALL_REDUCE, RING_COLLECTIVE_RE, Placement
from pinpoint.plan.links import LinkModel

CHOICES = tuple(a for a in ALL_REDUCE if a != "auto")  # auto is one of these, resolved per cluster
COLLECTIVE = ("ring", "nccl")  # their exchange runs inside a collective op, not as _Send/_Recv
RING_KEY_BYTES = 4  # CollectiveReplicaLauncher: the instance key, an int32 fed from the host per launch
Pair = tuple[str, str]


@dataclass(frozen=True)
class AllReduceCase:
    """What a mirrored run gives the all-reduce planner."""

    replicas: tuple[str, ...]  # the replica devices (spec names), in the strategy's order
    host: str
    gradient_bytes: tuple[int, ...]  # each trainable variable's bytes (its gradient), creation order
    emulated: bool
    measured: str  # the all-reduce the run used, read from what ran (see run_choice)
    base: dict[Pair, int]  # bytes per ordered pair per step that are not the all-reduce
    replica_compute_us: dict[str, float] | None  # per replica, the profiler's time per step (timed runs)
    aggregated_state_bytes: int = 0  # non-trainable ON_WRITE variables with an aggregation (not modeled)
    short_pairs: tuple[str, ...] = ()  # pairs whose measured bytes fell short of the run's own all-reduce
    unsized: float = 0.0  # transfers per step the run's capture could not size (counted 0 bytes)

    @property
    def total(self) -> int:
        return sum(self.gradient_bytes)

    @property
    def device_type(self) -> str:
        return "GPU" if all(parse_name(d)[2] == "GPU" for d in self.replicas) else "CPU"


def send_pairs(choice: str, case: AllReduceCase) -> dict[Pair, int]:
    """The all-reduce's _Send/_Recv bytes per ordered device pair per step (see the module doc)."""
    r, out = case.replicas, {}

    def add(a: str, b: str, n: int) -> None:
        if a != b and n:
            out[(a, b)] = out.get((a, b), 0) + n

    if choice == "reduce_to_host":
        for d in r:
            add(d, case.host, case.total)
            add(case.host, d, case.total)
    elif choice == "hierarchical_copy":
        h = len(r) // 2
        for j in range(1, h):
            add(r[j], r[0], case.total)
        for j in range(h + 1, len(r)):
            add(r[j], r[h], case.total)
        add(r[h], r[0], case.total)
        add(r[0], r[h], case.total)
        for j in range(1, h):
            add(r[0], r[j], case.total)
        for j in range(h + 1, len(r)):
            add(r[h], r[j], case.total)
    elif choice == "ring":
        for d in r:
            add(case.host, d, RING_KEY_BYTES)
    return out


def collective_pairs(choice: str, case: AllReduceCase) -> dict[Pair, int]:
    """The bytes a collective choice moves inside its op, modeled: the ring, each replica sending
    2(n-1)/n of the packed gradients to the next one (reduce-scatter, then all-gather)."""
    if choice not in COLLECTIVE:
        return {}
    r, n = case.replicas, len(case.replicas)
    each = round(2 * (n - 1) * case.total / n)
    return {(r[i], r[(i + 1) % n]): each for i in range(n)}


def collective_inputs(choice: str, case: AllReduceCase) -> dict[str, int]:
    """Per replica, the bytes its collective op reduces (the packed gradients): what the
    transfers' `collectives` section measures."""
    return {d: case.total for d in case.replicas} if choice in COLLECTIVE else {}


def all_reduce_us(choice: str, case: AllReduceCase, links: LinkModel) -> float:
    """The all-reduce's time per step on the link model: its stages one after the other, the
    transfers of a stage on their own links at once (a link's transfers queue)."""
    r, n, total = case.replicas, len(case.replicas), case.total

    def stage(pairs: list[Pair], nbytes: int) -> float:
        return max((links.transfer_us(a, b, nbytes) for a, b in pairs), default=0.0)

    if choice == "reduce_to_host":
        # Every tensor up to the host, then every sum back: per link, one transfer per tensor.
        up = max(sum(links.transfer_us(d, case.host, g) for g in case.gradient_bytes) for d in r)
        down = max(sum(links.transfer_us(case.host, d, g) for g in case.gradient_bytes) for d in r)
        return up + down
    if choice == "hierarchical_copy":
        h = n // 2
        gather = [(r[j], r[0]) for j in range(1, h)] + [(r[j], r[h]) for j in range(h + 1, n)]
        scatter = [(r[0], r[j]) for j in range(1, h)] + [(r[h], r[j]) for j in range(h + 1, n)]
        return (stage(gather, total) + stage([(r[h], r[0])], total) + stage([(r[0], r[h])], total)
                + stage(scatter, total))
    # ring / nccl: 2(n-1) rounds, each moving a 1/n chunk over every ring link at once.
    chunk = math.ceil(total / n)
    return 2 * (n - 1) * stage([(r[i], r[(i + 1) % n]) for i in range(n)], chunk)


def refusal(choice: str, case: AllReduceCase) -> str | None:
    """The config's own one-line refusal of `choice` on this cluster (None: accepted)."""
    cluster = {"devices_per_worker": len(case.replicas), "device_type": case.device_type, "emulate": case.emulated}
    try:
        config_from_dict({"name": "plan", "cluster": cluster, "train": {"strategy": "mirrored", "all_reduce": choice}})
    except ConfigError as err:
        return str(err)
    return None


def run_choice(placement: Placement, replicas: tuple[str, ...], host: str, total: int) -> str | None:
    """The all-reduce a mirrored run used, from what ran: a collective op on the replicas (ring;
    NcclAllReduce: nccl), else every replica's gradients to the host and back (reduce_to_host),
    else the packed gradients between the two halves' first devices (hierarchical_copy). When the
    host is a replica the two can move the same copies (two replicas): read as reduce_to_host.
    Half the gradients' bytes on the pattern's pairs decide: the runtime cannot size every
    transfer (a dynamic shape counts 0), and the directions read carry little else (a replica
    sends the host only the loss sums; the batch goes the other way)."""
    types = {t for d in replicas for t in placement.op_types_by_device.get(d, {})}
    if NCCL_ALL_REDUCE in types:
        return "nccl"
    if any(RING_COLLECTIVE_RE.match(t) for t in types):
        return "ring"
    matrix = {(a, b): c.bytes or 0 for a, row in placement.transfers.matrix.items() for b, c in row.items()}
    half = total / 2
    if all(matrix.get((d, host), 0) >= half for d in replicas if d != host):
        return "reduce_to_host"
    h = len(replicas) // 2
    if len(replicas) % 2 == 0 and min(matrix.get((replicas[h], replicas[0]), 0),
                                      matrix.get((replicas[0], replicas[h]), 0)) >= half:
        return "hierarchical_copy"
    return None


def case_of(placement: Placement) -> AllReduceCase | None:
    """The AllReduceCase of a mirrored run's placement.json (with its op rows); None for another
    strategy or one replica (nothing to all-reduce)."""
    dm = placement.device_map
    replicas = dm.spec_replica_devices if dm is not None else ()
    if placement.strategy != "mirrored" or len(replicas) < 2:
        return None
    aliases = placement.device_aliases
    host_physical = dm.host
    host = next((spec for spec, phys in aliases.items() if phys == host_physical), host_physical)
    grads = tuple(int(v.bytes or 0) for v in placement.variables if v.cls == "trainable")
    measured = run_choice(placement, replicas, host, sum(grads))
    if measured is None:
        raise ConfigError(f"run_dir: got a mirrored run on {', '.join(replicas)} whose transfers show none of "
                          f"{', '.join(CHOICES)} moving its {sum(grads)} bytes of gradients; plan from a run "
                          "trained by Pinpoint with train.all_reduce set")
    matrix = {(a, b): int(c.bytes or 0) for a, row in placement.transfers.matrix.items() for b, c in row.items()}
    draft = AllReduceCase(replicas, host, grads, dm.emulated, measured, {}, None)
    base = dict(matrix)
    short = []
    for pair, n in send_pairs(measured, draft).items():
        # Less than the all-reduce's own bytes: some of its transfers went unsized (0 bytes); the
        # pair's other traffic is then unknown, taken as 0 and named in the plan's caveat.
        if base.get(pair, 0) < n:
            short.append(f"{pair[0]} -> {pair[1]}")
        base[pair] = max(0, base.get(pair, 0) - n)
    unsized = float(placement.transfers.per_step.unsized or 0)
    rows = placement.ops
    timed = bool(rows) and all(r.us is not None for r in rows)
    # A collective op's time is the exchange itself (and, on shared cores, waiting for the other
    # replicas): the link model prices it, so it is not the replica's compute.
    compute = {d: round(sum(r.us for r in rows if r.device == d and not COLLECTIVE_TRAFFIC_RE.match(r.type)), 3)
               for d in replicas} if timed else None
    # Assigned in replica context with an aggregation, such a variable is reduced at each update
    # by the same cross-device ops, one reduction per variable: not modeled (see `caveat`).
    state = sum(int(v.bytes or 0) for v in placement.variables if v.cls == "aggregated_state")
    return AllReduceCase(replicas, host, grads, draft.emulated, measured,
                         {p: n for p, n in sorted(base.items()) if n}, compute, state, tuple(short), unsized)


def _pairs(d: dict[Pair, int]) -> dict[str, int]:
    return {f"{a} -> {b}": n for (a, b), n in sorted(d.items(), key=lambda kv: (sort_key(kv[0][0]), sort_key(kv[0][1])))}


def predict_choice(choice: str, case: AllReduceCase, links: LinkModel) -> dict[str, Any]:
    """One choice's prediction: bytes per ordered pair through _Send/_Recv (the run's other
    transfers included), the bytes inside its collective (modeled), its all-reduce time and the
    step (the busiest replica's measured compute, then the all-reduce: one pack, so the
    exchange starts once the backward pass is done)."""
    sends = dict(case.base)
    for pair, n in send_pairs(choice, case).items():
        sends[pair] = sends.get(pair, 0) + n
    inside = collective_pairs(choice, case)
    ar_us = all_reduce_us(choice, case, links)
    step = None if case.replica_compute_us is None else max(case.replica_compute_us.values()) + ar_us
    return {
        "all_reduce": choice,
        "step_ms": None if step is None else round(step / 1e3, 4),
        "all_reduce_ms": round(ar_us / 1e3, 4),
        "busiest_over_mean": None,
        "bytes_crossing_per_step": sum(sends.values()),
        "bytes_crossing": _pairs(sends),
        "all_reduce_bytes": _pairs(send_pairs(choice, case)),
        "collective_bytes": _pairs(inside),
        "collective_input_bytes": collective_inputs(choice, case),
        "bytes_per_step": sum(sends.values()) + sum(inside.values()),
        "peak_variable_bytes": case.total,  # every replica holds one copy of the variables
    }


def section(case: AllReduceCase, links: LinkModel) -> dict[str, Any]:
    """The plan file's all-reduce part for a mirrored run: `all_reduce`, the train.all_reduce with
    the lowest predicted all-reduce time (the replicas' compute is the same whichever runs), ties
    to the fewest bytes, then to the run's own choice; `all_reduce_plan`, each choice's prediction,
    the refused ones with the config's line, the rationale and the caveats."""
    refused = {c: why for c in CHOICES if (why := refusal(c, case)) is not None}
    rows = {c: predict_choice(c, case, links) for c in CHOICES if c not in refused}
    # Ties (e.g. CPU replicas sharing one memory: every choice free) keep the run's own choice.
    chosen = min(rows, key=lambda c: (all_reduce_us(c, case, links), rows[c]["bytes_per_step"], c != case.measured,
                                      CHOICES.index(c)))
    # Copies: one dict twice in the document would be a YAML alias.
    prediction = {"plan": copy.deepcopy(rows[chosen]), "measured": predict_choice(case.measured, case, links), **rows}
    plan = {"replicas": list(case.replicas), "measured": case.measured, "prediction": prediction,
            "refused": refused, "rationale": rationale(case, chosen, prediction)}
    if caveats(case):
        plan["caveat"] = caveats(case)
    return {"all_reduce": chosen, "all_reduce_plan": plan}


def caveats(case: AllReduceCase) -> list[str]:
    """What the prediction of a mirrored run's choices leaves out, one line each."""
    out = []
    if case.aggregated_state_bytes:
        out.append(f"{case.aggregated_state_bytes} bytes of non-trainable variables with an aggregation are reduced "
                   "at each update by the same cross-device ops; that traffic is carried over as the run moved it "
                   f"with {case.measured}, not re-modeled per choice")
    if case.short_pairs:
        out.append(f"{case.unsized:g} transfer(s) per step of the run could not be sized (a dynamic shape, counted 0 "
                   f"bytes): on {', '.join(case.short_pairs)} the run's {case.measured} moved less than its "
                   "gradients' bytes as measured, so the other traffic there is taken as 0")
    return out


def rationale(case: AllReduceCase, chosen: str, prediction: dict[str, Any]) -> str:
    """One line: the choice against the run's own and each other candidate, by the link model."""
    others = ", ".join(f"{c} {p['all_reduce_ms']:.4f} ms" for c, p in prediction.items()
                       if c not in ("plan", "measured", chosen))
    own = prediction["measured"]
    return (f"train.all_reduce: {case.measured} -> {chosen}: all-reduce {own['all_reduce_ms']:.4f} -> "
            f"{prediction['plan']['all_reduce_ms']:.4f} ms/step for {case.total} B of gradients over "
            f"{len(case.replicas)} replicas ({others or 'no other choice'})")


def table(doc: dict[str, Any]) -> str:
    """What `pinpoint plan` prints of a mirrored run's all-reduce choice: one row per choice."""
    head = ("all-reduce", "train.all_reduce", "step ms", "all-reduce ms", "send/recv/step", "in collective/step")
    rows = [head]
    plan = doc["all_reduce_plan"]
    for name, p in plan["prediction"].items():
        rows.append((name, p["all_reduce"], "-" if p["step_ms"] is None else f"{p['step_ms']:.3f}",
                     f"{p['all_reduce_ms']:.4f}", f"{p['bytes_crossing_per_step']} B",
                     f"{sum(p['collective_bytes'].values())} B"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines += [f"  refused {c}: {why}" for c, why in plan["refused"].items()]
    lines += [f"  caveat: {line}" for line in plan.get("caveat", [])]
    lines.append(f"  {plan['rationale']}")
    return "\n".join(lines)


def verify_config(cfg: Config, doc: dict[str, Any], config_path: str) -> Config:
    """cfg training the plan's train.all_reduce (mirrored, the plan's replica count), placement
    captured and timed; the config's own refusal when it cannot run the choice."""
    t, replicas = cfg.train, doc["all_reduce_plan"]["replicas"]
    n = len(replicas)
    if t.entrypoint is not None:
        raise ConfigError(f"train.entrypoint: got '{t.entrypoint}' in {config_path}; --verify trains with Pinpoint's "
                          "own loop (train.model), which train.all_reduce steers; set train.all_reduce in the "
                          "program's MirroredStrategy by hand and re-run pinpoint trace")
    if t.strategy != "mirrored":
        raise ConfigError(f"train.strategy: got '{t.strategy}' in {config_path}; the plan chooses train.all_reduce "
                          f"for a mirrored run of {doc.get('source_run')}; set train.strategy: mirrored")
    if cfg.cluster.devices_per_worker != n:
        raise ConfigError(f"cluster.devices_per_worker: got {cfg.cluster.devices_per_worker} in {config_path}, but "
                          f"the plan is for {n} replicas ({', '.join(replicas)}); set devices_per_worker: {n}")
    data = cfg.model_dump(mode="json", exclude_unset=True)  # what was written (config_scope)
    data.setdefault("train", {})["all_reduce"] = doc["all_reduce"]
    data.setdefault("placement", {}).update(enabled=True, timing=True)
    return config_from_dict(data, source=config_path)


NOT_SEEN = ("the exchange of {choice} runs inside its collective op (CollectiveReduceV2 / NcclAllReduce), not as "
            "_Send/_Recv between the replicas: the transfers matrix cannot see it, so its bytes per pair "
            "(collective_bytes) are the model's; measured instead: each replica's collective input "
            "(transfers.collectives), which is the packed gradients the exchange moves")


def check(doc: dict[str, Any], verified: Any, placement: Placement, links: LinkModel, *,
          bytes_: dict[str, Any], measured_pairs: dict[str, int], verify_run: str, step_note: str) -> dict[str, Any]:
    """plan_check.json of an all-reduce plan (doc) against the verification run (`verified`, its
    PlanGraph; `placement`, its placement.json): bytes per ordered pair (`bytes_`, plan.verify's
    comparison of the _Send/_Recv pairs, exact on emulated devices too), each replica's collective
    input for ring and nccl, the step."""
    case: AllReduceCase = verified.all_reduce
    predictions = doc["all_reduce_plan"]["prediction"]
    planned = predictions["plan"]
    measured_inputs = {d: int(c.input_bytes or 0) for d, c in placement.transfers.collectives.items()}
    predicted_inputs = planned["collective_input_bytes"]
    choice = doc["all_reduce"]
    ran = case.measured
    if choice not in COLLECTIVE and ran not in COLLECTIVE and send_pairs(choice, case) == send_pairs(ran, case):
        ran = choice  # the host is a replica and both move the same copies: what ran cannot tell them apart
    as_run = predict_choice(choice, case, links)  # the model on the verification run's own figures
    measured_ms = None if verified.measured_step_us is None else round(verified.measured_step_us / 1e3, 4)
    verified_row = dict(as_run, step_ms=measured_ms, bytes_crossing_per_step=bytes_["measured_total"],
                        bytes_crossing={p: n for p, n in measured_pairs.items() if n},
                        collective_input_bytes=measured_inputs, all_reduce=ran)
    predicted_ms = planned.get("step_ms")
    return {
        "source_run": doc.get("source_run"),
        "verify_run": verify_run,
        "objective": "step_time",
        "algorithm": "all-reduce choice by the link model",
        "devices": list(doc["all_reduce_plan"]["replicas"]),
        "emulated": case.emulated,
        "pinning": {"layers": {}},  # nothing pinned: every replica runs the whole model
        "all_reduce": {
            "planned": choice,
            "ran": ran,  # read back from what the verification run executed
            "collective_inputs": {"predicted": predicted_inputs, "measured": measured_inputs,
                                  "exact": predicted_inputs == measured_inputs},
            "collective_bytes_predicted": planned["collective_bytes"],
            # Transfers the verification run's capture could not size count 0 bytes in its matrix.
            "unsized_measured": case.unsized,
            "compared": ("bytes per ordered pair: every _Send/_Recv of the step, the all-reduce's included"
                         if choice not in COLLECTIVE else
                         "bytes per ordered pair: every _Send/_Recv of the step (the run's other transfers and "
                         "the collective's instance keys); " + NOT_SEEN.format(choice=choice)),
        },
        "bytes": bytes_,
        "conformance": {"score": None, "layers": [], "deviations": []},
        "step": {
            "predicted_ms": predicted_ms,
            "measured_ms": measured_ms,
            "measured_over_predicted": round(measured_ms / predicted_ms, 3) if predicted_ms and measured_ms else None,
            "predicted_from_verified_ms": as_run["step_ms"],
            "note": step_note,
        },
        "placements": {**predictions, "verified": verified_row},
        "timeline": {"measured": [], "plan": []},
    }


def headline(a: dict[str, Any]) -> str:
    """The line `pinpoint plan --verify` prints above the bytes of an all-reduce plan."""
    return f"train.all_reduce: planned {a['planned']}, ran {a['ran']}"


def detail_lines(a: dict[str, Any]) -> list[str]:
    """The lines printed under the bytes of an all-reduce plan: unsized transfers, and each
    replica's collective input (the exchange inside the collective is modeled only)."""
    lines = []
    if a["unsized_measured"]:
        lines.append(f"  ({a['unsized_measured']:g} transfer(s) per step the capture could not size count 0 bytes "
                     "in the measured column)")
    ci = a["collective_inputs"]
    if ci["predicted"] or ci["measured"]:
        for d in sorted(set(ci["predicted"]) | set(ci["measured"]), key=sort_key):
            lines.append(f"  collective input {d:<6} {ci['predicted'].get(d, 0):>9} {ci['measured'].get(d, 0):>9}")
        lines.append(f"  (the exchange inside the collective is modeled, not measured: "
                     f"{sum(a['collective_bytes_predicted'].values())} B/step predicted)")
    return lines
