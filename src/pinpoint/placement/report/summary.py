"""The short terminal summary printed at the end of `pinpoint train` and `make run`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pinpoint.device_names import is_host
from pinpoint.placement.analysis.requests import weight_lines
from pinpoint.placement.model.memory import Memory
from pinpoint.placement.model.placement import Placement, as_placement
from pinpoint.placement.model.records import ReplicaConsistency
from pinpoint.placement.model.sections import Eager
from pinpoint.placement.model.traffic import Timing, Transfers


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def drift_line(rc: ReplicaConsistency) -> str:
    """Trainable drift (must be 0) and state drift (per-replica state, explained) in one line."""
    trainable = rc.trainable_drift
    state = 0 if rc.state_drift is None else rc.state_drift
    line = (f"replica drift: trainable {trainable:.3g}"
            + (" (copies that must be identical differ: a sync bug)" if trainable else "")
            + f", state {state:.3g} over {rc.checked} mirrored variable(s)")
    if rc.on_read_drift:
        line += f" (ON_READ accumulators {rc.on_read_drift:.3g}, not counted: per replica by design)"
    for group in rc.state or []:
        names = group["variables"]
        line += (f"; {len(names)} {group['what']} differ by design (each replica's own batch share; a "
                 f"checkpoint keeps {group.get('checkpoint_keeps', 'one copy')}), e.g. {names[0]['variable']}; "
                 f"fix: {group['fix'].split(':')[0]}")
    return line


def timing_lines(timing: Timing | Mapping[str, Any]) -> list[str]:
    """placement.timing: the timed window, then one line per device (busy, transfers, idle, top op)."""
    timing = timing if isinstance(timing, Timing) else Timing.from_json(timing) or Timing()
    if not timing.devices:
        return [f"time       : {'; '.join(timing.notes) or 'no op found in the trace'}"]
    steps = timing.steps
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}" if steps else "?"
    trace = f"; trace in {timing.trace}/ (TensorBoard)" if timing.trace else ""
    lines = [f"time       : {span} timed, {timing.wall_ms or 0:.3f} ms wall{trace}"]
    for dev, t in timing.devices.items():
        top = t.top_ops[0] if t.top_ops else None
        lines.append(
            f"  {dev:<9}: busy {t.busy_ms:.3f} ms ({100 * t.transfer_share:.0f}% transfers)"
            + (f", idle {100 * t.idle_share:.0f}%" if t.idle_share is not None else "")
            + (f"; top {top.op} ({top.type}) {top.ms:.3f} ms" if top else "")
        )
    return lines


def program_lines(placement: Placement) -> list[str]:
    """`pinpoint trace` / train.entrypoint: the functions that ran and the eager ops."""
    if not placement.traced:
        return []
    funcs = placement.functions

    def label(f) -> str:
        tags = (["training"] if f.training else []) + ([f.role] if f.role not in ("train", "other") else [])
        return f"{f.name} x{f.calls}" + (f" ({', '.join(tags)})" if tags else "")

    shown = ", ".join(label(f) for f in funcs[:3])
    lines = [f"functions  : {len(funcs)}" + (f": {shown}" + (" ..." if len(funcs) > 3 else "") if funcs else "")]
    eager = placement.eager or Eager()
    by_dev = ", ".join(f"{d} {n}" for d, n in eager.ops_by_device.items())
    copies = eager.copies
    copy = "; copies: " + ", ".join(f"{c['from']}->{c['to']} {human_bytes(c['bytes'])}" for c in copies[:2]) if copies else ""
    counted = (f" (all counted up to op {eager.counted_until}, then sampled in {eager.sampling_windows or 0} window(s))"
               if eager.counted_until is not None else "")
    lines.append(f"eager ops  : {eager.ops}{counted}" + (f" ({by_dev})" if by_dev else "") + copy)
    return lines


def format_summary(placement: Placement | Mapping[str, Any] | None, metrics: Mapping[str, Any] | None) -> str:
    """10-15 lines: final loss/accuracy, throughput, ops per device, transfers, fallbacks,
    conformance and replica drift."""
    p = as_placement(placement)
    lines = ["== pinpoint summary " + "=" * 40, _training_line(metrics or {})]
    if p is None:
        lines.append("placement  : not captured (placement.enabled is false or no step was sampled)")
        return "\n".join(lines)
    lines.append(f"strategy   : {p.strategy}   task: {p.task}")
    lines.append(_ops_line(p))
    lines.extend(_transfer_lines(p.transfers))
    if p.timing:
        lines.extend(timing_lines(p.timing))
    memory = memory_line(p.memory)
    if memory:
        lines.append(memory)
    lines.extend(fit_lines(p.memory))
    if batch_line(p.memory):
        lines.append(batch_line(p.memory))
    lines.append(_variables_line(p))
    lines.extend(_fallback_lines(p))
    lines.extend(_input_lines(p))
    lines.append(_conformance_line(p))
    lines.extend(weight_lines(p.conformance.rules))
    lines.extend(program_lines(p))
    lines.extend(f"note       : {note}" for note in p.notes[:1])
    lines.append(_drift_summary(p.replica_consistency))
    return "\n".join(lines)


def memory_line(memory) -> str | None:
    """The summary's memory line: each device's peak (requested, allocated), the largest tensor live
    at the busiest device's peak, the self-check."""
    memory = Memory.from_json(memory)
    if not memory:
        return None
    if not memory.devices:
        return _unsplit_memory_line(memory)
    # (devices only: not the buckets of what no device of the step's graphs held, memory.UNATTRIBUTED and
    # memory_calls.OTHER_CALL)
    devs = {d: m for d, m in memory.devices.items() if d.startswith("/")}
    parts = [f"{d} {human_bytes(m['peak_requested'])} ({human_bytes(m['peak_allocated'])} allocated)"
             for d, m in devs.items()]
    busiest = max(devs, key=lambda d: devs[d]["peak_requested"], default=None)
    top = (devs[busiest]["at_peak"] or [None])[0] if busiest else None
    largest = (f"; largest at {busiest}'s peak: {top['op']} {human_bytes(top['requested'])} ({top['kind']})"
               if top else "")
    # A merged cluster's: each task replayed its own allocator's events.
    checks = [memory.self_check] if memory.self_check else [
        t["self_check"] for t in (memory.tasks or {}).values() if t.get("self_check")]
    check = {"events": sum(c["events"] for c in checks), "mismatched": sum(c["mismatched"] for c in checks),
             "unpartitioned": sum(c.get("unpartitioned") or 0 for c in checks),
             **({k: checks[0].get(k) for k in ("replayed_peak", "allocator_peak")} if len(checks) == 1 else {})}
    peak = ("" if check.get("allocator_peak") in (None, check.get("replayed_peak")) else
            f", replayed peak {check['replayed_peak']:,} B but get_memory_info's {check['allocator_peak']:,} B")
    off = f", {check['unpartitioned']} not adding up over the devices" if check.get("unpartitioned") else ""
    return (f"memory     : step peak per device: {', '.join(parts)}{largest}{_spread(memory)}; self-check: "
            f"{check['mismatched']} of {check['events']} allocator events off{off}{peak}")


def _spread(memory: Memory) -> str:
    """Several calls measured: which, each device's least and most peak, the call the figures are from."""
    calls = memory.calls or {}
    if len(calls.get("measured") or ()) < 2:
        return ""
    spread = ", ".join(f"{d} {peak_range(v, '–')}" for d, v in calls["devices"].items())
    return (f"; over calls {', '.join(map(str, calls['measured']))}: {spread} (the figures are call "
            f"{calls['kept']}'s, whose busiest device needs the most)")


def peak_range(v: Mapping[str, int], sep: str) -> str:
    """A device's least and most peak over the calls measured ('1.0 MiB' when they are equal)."""
    least, most = human_bytes(v["least"]), human_bytes(v["most"])
    return least if least == most else f"{least}{sep}{most}"


def _unsplit_memory_line(memory: Memory) -> str:
    """No per-device figures: why, and each task's allocator peak when it was read (a cluster task)."""
    why = memory.why_not or "no allocation was traced"
    tasks = dict(memory.tasks or {})
    peaks = {t: v["task_peak"] for t, v in tasks.items() if v.get("task_peak") is not None}
    if memory.task_peak is not None:
        peaks["this process"] = memory.task_peak
    serving = {t: v for t, v in tasks.items() if v.get("held") is not None}
    if peaks:
        return (f"memory     : step peak per task (all its devices together, the allocator's own): "
                f"{', '.join(f'{t} {human_bytes(b)}' for t, b in peaks.items())}; {why}")
    if serving:
        return ("memory     : per task (all its devices together, the allocator's own): " + ", ".join(
            f"{t} holds {human_bytes(v['held'])}{_of_variables(v)} (peak {human_bytes(v['peak'])} since it started)"
            for t, v in serving.items()) + f"; {why}")
    return f"memory     : not measured: {why}"


def _of_variables(task: dict) -> str:
    if task.get("variables") is None:
        return ""
    n = task["variables"]
    return f", {human_bytes(task['variables_bytes'])} of it {n} variable{'s' if n != 1 else ''}"


def fit_lines(memory) -> list[str]:
    """The fits verdict per device for the GPU size given (--gpu-memory, cluster.gpu_memory)."""
    fit = (Memory.from_json(memory) or Memory()).fit
    if not fit:
        return []
    rows = ", ".join(f"{d} {v['verdict']} (needs {human_bytes(v['needs'])} of {human_bytes(v['usable'])}"
                     + (f"; batch up to {v['largest_batch']:,}" if "largest_batch" in v else "") + ")"
                     for d, v in fit["devices"].items())
    return [f"memory fit : on {human_bytes(fit['gpu_memory'])} GPUs: {rows}"]


def batch_line(memory) -> str | None:
    """The memory predicted at other batch sizes (placement.memory_batch), busiest device first."""
    batch = ((Memory.from_json(memory) or Memory()).predicted or {}).get("batch") or {}
    devices = {d: v for d, v in (batch.get("devices") or {}).items() if not is_host(d)} or batch.get("devices") or {}
    if not devices:
        return None
    sizes = list(next(iter(devices.values())))
    rows = "; ".join(f"batch {b}: " + ", ".join(f"{d} {human_bytes(v[b])}" for d, v in devices.items()) for b in sizes)
    kept = (batch.get("kept_scratch") or [None])[0]
    # The largest scratch the prediction keeps at its size (docs/memory.md, "At another batch size").
    tail = f" (scratch kept at its size, the largest: {kept['op'].rsplit('/', 1)[-1]} {human_bytes(kept['bytes'])})" \
        if kept else ""
    return f"memory at  : measured at batch {batch['measured']}, predicted {rows}{tail}"


def _training_line(metrics: Mapping[str, Any]) -> str:
    # metrics.json's keys (pinpoint.training.loop.controller, Controller.finalize; "loss_fn" names the loss function).
    loss, acc = _number(metrics, "final_loss"), _number(metrics, "final_accuracy")
    eps, steps = _number(metrics, "examples_per_sec"), _number(metrics, "steps")
    parts = []
    if steps is not None:
        parts.append(f"steps {steps:.0f}")
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if acc is not None:
        parts.append(f"accuracy {acc:.3f}")
    if eps is not None:
        parts.append(f"{eps:,.0f} examples/s")
    return "training   : " + (", ".join(parts) if parts else "no metrics recorded")


def _ops_line(p: Placement) -> str:
    grads = p.gradients.ops_by_device or {}

    def short_phys(d: str) -> str:
        phys = p.physical_devices.get(d, d)
        return f"={phys[phys.rfind('/'):]}" if phys != d else ""

    return "ops/step   : " + (", ".join(
        f"{d}{short_phys(d)} {n} ({grads.get(d, 0)} grad)" for d, n in p.ops_by_device.items()) or "none captured")


def _transfer_lines(tr: Transfers) -> list[str]:
    per, reasons = tr.per_step, tr.unsized_reasons
    sized = (f" ({per.unsized} unsized: " + "; ".join(reasons) + ")" if reasons
             else f" ({per.unsized} unsized)" if per.unsized else "")
    if tr.loop_control.count:
        sized += f" (+{tr.loop_control.count} loop control)"
    lines = [f"transfers  : {per.count} per step, {human_bytes(per.bytes)} per step{sized}"]
    if tr.input.items:
        # Copied by the iterator outside the step: no _Send in the step graph shows them.
        unsized = f" ({tr.input.unsized:g} unsized)" if tr.input.unsized else ""
        lines.append("  input    : from the host per step, by the iterator's prefetch: "
                     + ", ".join(f"{d} {human_bytes(b)}" for d, b in tr.input.per_step.items()) + unsized)
    coll = tr.collectives.values()
    if coll:
        lines.append(f"collectives: {sum(c.count for c in coll)} per step (all-reduce etc.), "
                     f"{human_bytes(sum(c.input_bytes for c in coll))} reduced per step")
    top = sorted(((s, d, c.bytes) for s, row in tr.matrix.items() for d, c in row.items()), key=lambda t: -t[2])[:3]
    if top:
        lines.append("  busiest  : " + ", ".join(f"{s}->{d} {human_bytes(b)}" for s, d, b in top))
    if tr.round_trips:
        r = max(tr.round_trips, key=lambda r: r.bytes or 0)
        what = "an input batch" if r.input else r.tensor
        total = sum(t.bytes or 0 for t in tr.round_trips)
        lines.append(f"  round trips: {len(tr.round_trips)} per step, {human_bytes(total)} each way; largest: {what} "
                     f"{r.home}->{r.via}->{r.home}, {human_bytes(r.bytes or 0)}, forced by {r.op} ({r.op_type}) on "
                     f"{r.via}; fix: {r.fix.split(':')[0]}")
    if tr.sizing_errors:
        more = f" (+{len(tr.sizing_errors) - 1} more in placement.json)" if len(tr.sizing_errors) > 1 else ""
        lines.append(f"  sizing   : {tr.sizing_errors[0]}{more}")
    return lines


def _variables_line(p: Placement) -> str:
    vars_ = p.user_variables
    by_dev: dict[str, int] = {}
    for v in vars_:
        for dev in v.devices:
            by_dev[dev] = by_dev.get(dev, 0) + 1
    # The program's freed variables, and TensorFlow's own (a dropped strategy's tokens) apart.
    freed = [v for v in p.freed_variables if not v.internal]
    internal_freed = len(p.freed_variables) - len(freed)
    internal = len(p.variables) - len(vars_) - len(p.freed_variables)
    return (f"variables  : {len(vars_)} (" + (", ".join(f"{d}: {n}" for d, n in by_dev.items()) or "none")
            + (f"; +{internal} internal, TensorFlow's own" if internal or internal_freed else "")
            + (f" (and {internal_freed} freed before the end)" if internal_freed else "")
            + (f"; +{len(freed)} created and freed before the end: " + _freed_devices(freed) if freed else "")
            + f"); {p.variable_updates.coverage or ''}")


def _freed_devices(freed: list) -> str:
    """'/CPU:0: 3, /GPU:0: 4' over the freed variables' components' devices."""
    by_dev: dict[str, int] = {}
    for v in freed:
        for dev in v.devices:
            by_dev[dev] = by_dev.get(dev, 0) + 1
    return ", ".join(f"{d}: {n}" for d, n in by_dev.items()) or "devices unknown"


def _fallback_lines(p: Placement) -> list[str]:
    fb, pred = p.observed_fallbacks, p.predicted_fallbacks
    lines = [f"fallbacks  : {len(fb)}" + (": " + ", ".join(f"{f.op} {f.requested}->{f.placed}" for f in fb[:3])
                                          + (" ..." if len(fb) > 3 else "") if fb else "")]
    if pred:
        # Under emulation: what a GPU machine would move to the host (no GPU kernel).
        lines.append(
            f"  predicted: {len(pred)} on a GPU machine: "
            + ", ".join(f"{f.op} ({f.op_type}) {f.placed}->{f.would_run_on}" for f in pred[:3])
            + (" ..." if len(pred) > 3 else "")
        )
    return lines


def _input_lines(p: Placement) -> list[str]:
    lines = []
    pipe = p.input_pipeline
    if pipe:
        shard = pipe.sharding or {}
        by = f"; sharded by {shard['by']} ({shard.get('files')} file(s) here)" if shard.get("by") not in (None, "none") else ""
        lines.append(f"input      : {pipe.kind} on {pipe.device} from {pipe.source}{by}")
    prec = p.precision
    if prec is not None and prec.policy != "float32":
        lines.append(f"precision  : {prec.policy}; casts per step: "
                     + (", ".join(f"{d} {n}" for d, n in prec.casts_by_device.items()) or "none"))
    return lines


def _conformance_line(p: Placement) -> str:
    conf = p.conformance
    if conf.score is None:
        return "conformance: no pinning rules to check"
    bad = [r for r in conf.rules if r.below_plan]
    return (f"conformance: {conf.score:.2f} over {len(conf.rules)} rule(s)"
            + ("; below 1: " + ", ".join(f"{r.rule} {r.score:.2f}" for r in bad[:3]) if bad else ""))


def _drift_summary(rc: ReplicaConsistency | None) -> str:
    if rc is None:
        return "replica drift: not applicable (no mirrored variables)"
    if rc.max_abs_diff is None:
        return f"replica drift: not checked ({'components unreadable' if rc.error is None else rc.error})"
    if rc.trainable_drift is None:  # a placement.json from before the split
        return f"replica drift: max |diff| {rc.max_abs_diff:.3g} over {rc.checked} mirrored variable(s)"
    return drift_line(rc)
