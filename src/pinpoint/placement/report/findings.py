"""What to change, first: one typed list of findings, built from what the placement already holds
(round trips, conformance violations, observed and predicted fallbacks, eager copies and moved
eager ops, memory findings, replica drift) and ranked by what each costs: bytes crossing devices
per step, then time, then memory. No new analysis: each finding points at the section whose
table has the full evidence. The report's first screen lists them (placement.report)."""

from __future__ import annotations

from dataclasses import dataclass

from pinpoint.placement.analysis.conformance import LAZY_SLOT, LAZY_SLOT_FIX
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report.summary import human_bytes

FIRST_SCREEN = 8  # findings listed on the first screen; the rest are counted


@dataclass(frozen=True)
class Finding:
    """One thing to change. `what`: one line of what happens; `op`, `device` and the cost fields
    are the evidence; `fix`: what to change; `anchor`: the report section with the whole table.
    Costs: `bytes` crossing devices per step, `ms` per step, `memory` bytes held at a peak;
    `bytes_note` says when the bytes are not per step (eager copies: over the whole program)."""

    kind: str
    what: str
    op: str
    device: str
    fix: str
    anchor: str
    bytes: int | None = None
    ms: float | None = None
    memory: int | None = None
    bytes_note: str = "per step"

    @property
    def evidence(self) -> str:
        costs = [f"{human_bytes(self.bytes)} {self.bytes_note}" if self.bytes is not None else "",
                 f"{self.ms:.3f} ms per step" if self.ms is not None else "",
                 f"{human_bytes(self.memory)} at the peak" if self.memory is not None else ""]
        return " · ".join(x for x in (self.op, self.device, *costs) if x)


def _rank(f: Finding) -> tuple:
    return (-(f.bytes or 0) if f.bytes_note == "per step" else 0, -(f.ms or 0), -(f.memory or 0),
            -(f.bytes or 0), f.kind, f.op)


def _op_ms(p: Placement) -> dict[str, float]:
    """Each timed op's ms per step (placement.timing's top ops), when the run was timed."""
    if p.timing is None:
        return {}
    return {o.op: o.ms for t in p.timing.devices.values() for o in t.top_ops}


def _round_trips(p: Placement, ms: dict[str, float]) -> list[Finding]:
    return [Finding("round trip", f"{r.tensor} leaves {r.home} for {r.via} and comes straight back "
                    f"({r.rule})", f"{r.op} ({r.op_type})", f"{r.home} -> {r.via} -> {r.home}", r.fix, "transfers",
                    bytes=None if r.bytes is None else 2 * r.bytes, ms=ms.get(r.op))
            for r in p.transfers.round_trips]


def _conformance(p: Placement) -> list[Finding]:
    out = []
    for rule in p.conformance.rules:
        if rule.score is None or rule.score >= 1.0 or not rule.violations:
            continue
        v = rule.violations[0]
        off = rule.violations_total or len(rule.violations)
        out.append(Finding("plan not obeyed", f"rule {rule.rule}: {off} of {rule.relevant} ran off {rule.planned}"
                           + (f" ({v.why})" if v.why else ""), v.op, v.placed,
                           LAZY_SLOT_FIX if v.why == LAZY_SLOT else
                           f"pin {v.op} to {rule.planned}, or change the rule to where it runs", "conformance"))
    return out


def _fallbacks(p: Placement, ms: dict[str, float]) -> list[Finding]:
    out = [Finding("fallback", f"{f.op_type} asked for {f.requested} and ran on {f.placed}"
                   + (f": {f.reason}" if f.reason else ""), f.op, f.placed,
                   "give it a device with a kernel for its dtypes, or cast its inputs", "fallbacks", ms=ms.get(f.op))
           for f in p.observed_fallbacks]
    out += [Finding("predicted fallback", f"{f.op_type} has no GPU kernel for its dtypes: a GPU machine runs it on "
                    f"{f.would_run_on or 'the host'}" + (f" ({f.reason})" if f.reason else ""), f.op, f.placed,
                    "pin it to the host yourself, or cast its inputs to a dtype the GPU kernel takes", "fallbacks",
                    ms=ms.get(f.op)) for f in p.predicted_fallbacks]
    return out


def _eager(p: Placement) -> list[Finding]:
    """The program's eager copies as one finding (their bytes over the whole program, the largest
    pair as evidence), and its eager ops that ran off their request as another."""
    if p.eager is None:
        return []
    out = []
    copies = sorted((c for c in p.eager.copies if c["from"] != c["to"]), key=lambda c: -c["bytes"])
    if copies:
        top = copies[0]
        out.append(Finding("eager copies", f"{sum(c['count'] for c in copies)} eager copies between devices, the "
                           f"most {top['from']} -> {top['to']} ({top['count']} for " + ", ".join(top["ops"]) + ")",
                           next(iter(top["ops"]), ""), f"{top['from']} -> {top['to']}",
                           "make each tensor on the device that reads it (under its tf.device), or the variable "
                           "where its value is made", "eager", bytes=sum(c["bytes"] for c in copies),
                           bytes_note="over the program"))
    moved = sorted(p.eager.not_where_requested, key=lambda m: -m["count"])
    if moved:
        m = moved[0]
        out.append(Finding("eager ops moved", f"{sum(x['count'] for x in moved)} eager ops ran off the device they "
                           f"asked for, the most {m['count']} {m['op_type']} asked for {m['requested']}, ran on "
                           f"{m['ran']}", m["op_type"], m["ran"], f"run it under {m['ran']}'s scope, or move its "
                           f"resource to {m['requested']}", "eager"))
    return out


def _memory(p: Placement) -> list[Finding]:
    devices = (p.memory.devices if p.memory else None) or {}
    verdicts = ((p.memory.fit if p.memory else None) or {}).get("devices") or {}
    short = {d for d, v in verdicts.items() if v.get("verdict") != "fits"}
    # (a finding that matters only near the limit is one to act on where a GPU size says the device is short)
    return [Finding("memory", m["what"], m["evidence"], m["device"], m["fix"], "memory",
                    memory=(devices.get(m["device"]) or {}).get("peak_requested"))
            for m in (p.memory.findings if p.memory else None) or ()
            if not m.get("near_limit_only") or m["device"] in short]


def _drift(p: Placement) -> list[Finding]:
    rc = p.replica_consistency
    if rc is None:
        return []
    # A placement.json from before the trainable/state split has only the largest difference.
    drift = rc.trainable_drift if rc.split else (rc.max_abs_diff if rc.state_drift is None else None)
    if not drift:
        return []
    return [Finding("replica drift", f"mirrored trainable variables differ between replicas by up to {drift:.3g}",
                    f"{rc.checked} mirrored variables", "replicas",
                    "update every replica's copy (an update outside strategy.run, or a non-sync aggregation)",
                    "replicas")]


def findings(p: Placement) -> tuple[Finding, ...]:
    """Every finding of the run, most costly first; () when there is nothing to change."""
    ms = _op_ms(p)
    found = [*_round_trips(p, ms), *_conformance(p), *_fallbacks(p, ms), *_eager(p), *_memory(p), *_drift(p)]
    return tuple(sorted(found, key=_rank))


def first_screen(p: Placement, metrics, charts, x) -> dict:
    """The report's first section: the findings as rows (each linking to its section) and the run
    diagram beside them."""
    from pinpoint.placement.report.rundiagram import run_diagram

    per = p.transfers.per_step
    found = findings(p)
    return {"rows": [{"kind": f.kind, "what": f.what, "evidence": f.evidence, "fix": f.fix, "anchor": f.anchor}
                     for f in found[:FIRST_SCREEN]], "more": len(found) - min(len(found), FIRST_SCREEN),
            "svg": run_diagram(p),
            "crossing": f"{human_bytes(per.bytes)} in {per.count:g} transfers per step cross devices"}
