"""Merge the placements of the tasks of a multi-worker cluster into one cluster-wide report.

Each task analyses its own partition graphs (device names keep their job/task, e.g.
"/job:worker/task:1/GPU:0"); the chief merges, section by section (SECTIONS: one function per
placement.json section, each given every task's Placement, the chief's first): devices are
united, counts summed, variables united by name (a mirrored variable has components on every
worker), conformance averaged with the per-task detail kept under `tasks`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from pinpoint.device_names import sort_key
from pinpoint.placement.analysis.variables import FINGERPRINT_SAMPLES, INTERNAL, coverage_text, summarize_consistency
from pinpoint.placement.model.memory import Memory
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.model.records import Gradients, InputPipeline, Precision, ReplicaConsistency, VariableUpdates
from pinpoint.placement.model.schema import EXPLAIN, json_number
from pinpoint.placement.model.sections import Conformance, Variable
from pinpoint.placement.model.traffic import Collective, PerStep, Timing, Traffic, Transfers


def _sum_into(dst: dict, src) -> None:
    for k, v in (src or {}).items():
        dst[k] = dst.get(k, 0) + v


def _sorted(d: dict) -> dict:
    return {k: json_number(d[k]) for k in sorted(d, key=sort_key)}


def _by_device(d: dict) -> list:
    return sorted(d.items(), key=lambda kv: sort_key(kv[0]))


# ---- one function per section ------------------------------------------------------------------
def _devices(ps: list[Placement]) -> tuple[str, ...]:
    return tuple(sorted({d for p in ps for d in p.devices}, key=sort_key))


def _physical_devices(ps: list[Placement]) -> dict:
    physical: dict[str, str] = {}
    for p in ps:
        physical.update(p.physical_devices)
    return {d: physical.get(d, d) for d in _devices(ps)}


def _device_aliases(ps: list[Placement]) -> dict:
    aliases: dict[str, str] = {}
    for p in ps:
        aliases.update(p.device_aliases)
    return aliases


def _ops_by_device(ps: list[Placement]) -> dict:
    ops: dict[str, float] = {}
    for p in ps:
        _sum_into(ops, p.ops_by_device)
    return _sorted(ops)


def _op_types_by_device(ps: list[Placement]) -> dict:
    types: dict[str, dict[str, float]] = defaultdict(dict)
    for p in ps:
        for d, t in p.op_types_by_device.items():
            _sum_into(types[d], t)
    return {d: dict(sorted(types[d].items())) for d in sorted(types, key=sort_key)}


def _transfers(ps: list[Placement]) -> Transfers:
    matrix: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    per_step = {"count": 0, "bytes": 0, "sized": 0, "unsized": 0}
    loop_control = {"count": 0, "bytes": 0}
    collectives: dict[str, list] = {}
    largest = []
    reasons: dict[str, float] = {}
    errors: list[str] = []
    for p in ps:
        tr = p.transfers
        errors += [f"[{p.task}] {e}" for e in tr.sizing_errors]
        _sum_into(reasons, tr.unsized_reasons)
        for k in per_step:
            per_step[k] += getattr(tr.per_step, k)
        for k in loop_control:
            loop_control[k] += getattr(tr.loop_control, k)
        for s, row in tr.matrix.items():
            for d, cell in row.items():
                matrix[s][d][0] += cell.count
                matrix[s][d][1] += cell.bytes
        largest.extend(replace(t, task=p.task) for t in tr.largest)
        for d, c in tr.collectives.items():
            cur = collectives.setdefault(d, [0, 0])
            cur[0] += c.count
            cur[1] += c.input_bytes
    return Transfers(
        per_step=PerStep(**{k: json_number(v) for k, v in per_step.items()}),
        unsized_reasons={k: json_number(v) for k, v in reasons.items()},
        matrix={s: {d: Traffic(*c) for d, c in _by_device(row)} for s, row in _by_device(matrix)},
        collectives={d: Collective(*collectives[d]) for d in sorted(collectives, key=sort_key)},
        largest=tuple(sorted(largest, key=lambda t: -(t.bytes or 0))[:25]),
        loop_control=Traffic(**{k: json_number(v) for k, v in loop_control.items()}),
        sizing_errors=tuple(errors),
    )


def _fallbacks(ps: list[Placement]) -> tuple:
    return tuple(replace(f, task=p.task) for p in ps for f in p.fallbacks)


def _united_variables(ps: list[Placement]) -> dict[tuple[str, bool], Variable]:
    variables: dict[tuple[str, bool], Variable] = {}
    for p in ps:
        for v in p.variables:
            key = (v.name, v.freed)  # one freed before its task ended stays apart
            cur = variables.get(key) or replace(v, components=(), devices=(), update_devices=(), update_ops=0)
            variables[key] = replace(
                cur, components=cur.components + tuple(dict(c, task=p.task) for c in v.components),
                devices=tuple(sorted(set(cur.devices) | set(v.devices), key=sort_key)),
                update_devices=tuple(sorted(set(cur.update_devices) | set(v.update_devices), key=sort_key)),
                update_ops=cur.update_ops + v.update_ops)
    return variables


def _variables(ps: list[Placement]) -> tuple[Variable, ...]:
    return tuple(_united_variables(ps).values())


def _variable_updates(ps: list[Placement]) -> VariableUpdates:
    update_ops = sum(p.variable_updates.update_ops or 0 for p in ps)
    unattributed = sum(p.variable_updates.unattributed_ops or 0 for p in ps)
    united = list(_united_variables(ps).values())
    users = [v for v in united if not v.internal and not v.freed]
    return VariableUpdates(
        method=ps[0].variable_updates.method or "", update_ops=update_ops, unattributed_ops=unattributed,
        variables_with_updates=sum(1 for v in users if v.update_devices), variables=len(users),
        internal_variables=len(united) - len(users),
        coverage=coverage_text([v.to_json() for v in united], unattributed),
    )


def _gradients(ps: list[Placement]) -> Gradients:
    grads: dict[str, float] = {}
    for p in ps:
        _sum_into(grads, p.gradients.ops_by_device)
    return Gradients(scope=ps[0].gradients.scope or "", ops_by_device=_sorted(grads),
                     total=json_number(sum(grads.values())))


def _cross_task_drift(ps: list[Placement]) -> dict[str, float]:
    """Every task holds its own copy of a mirrored variable: the sampled values each task recorded
    compared with the chief's (a lower bound on the true max |difference|)."""
    prints: dict[str, list] = defaultdict(list)
    for p in ps:
        for v in p.variables:
            # TensorFlow's own variables (collective-ordering tokens) are each task's own by design.
            if v.cls == INTERNAL:
                continue
            if v.fingerprint and v.fingerprint.get("sample") is not None:
                prints[v.name].append(v.fingerprint["sample"])
    return {name: max((abs(a - b) for other in samples[1:] for a, b in zip(samples[0], other)), default=0.0)
            for name, samples in prints.items() if len(samples) > 1}


def _replica_consistency(ps: list[Placement]) -> ReplicaConsistency | None:
    drift: dict[str, float] = {}
    classes: dict[str, str] = {}
    aggregations: dict[str, str] = {}
    checked, seen = 0, False
    for p in ps:
        for v in p.variables:
            if v.cls:
                classes.setdefault(v.name, v.cls)
        rc = p.replica_consistency
        if rc is not None:
            seen = True
            checked = max(checked, rc.checked)
            for name, diff in rc.variables.items():
                drift[name] = max(drift.get(name, 0.0), diff)
            classes.update(rc.classes or {})
            aggregations.update(rc.aggregations or {})
    cross = _cross_task_drift(ps)
    if cross:
        seen = True
        checked = max(checked, len(cross))
        for name, diff in cross.items():
            drift[name] = max(drift.get(name, 0.0), diff)
    if not seen:
        return None
    return ReplicaConsistency.from_json(dict(
        summarize_consistency(drift, {n: classes.get(n, "trainable") for n in drift}, aggregations), checked=checked,
        method="within each task: every component compared in full; across tasks: "
        f"up to {FINGERPRINT_SAMPLES} evenly spaced values of each copy compared with the first task's"))


def _conformance(ps: list[Placement]) -> Conformance:
    scores = [p.conformance.score for p in ps if p.conformance.score is not None]
    return Conformance(
        score=round(sum(scores) / len(scores), 4) if scores else None,
        rules=tuple(replace(r, task=p.task) for p in ps for r in p.conformance.rules),
        by_task={p.task: p.conformance.score for p in ps},
    )


def _tasks(ps: list[Placement]) -> dict[str, Placement]:
    return {p.task: replace(p, ops=(), transfer_items=(), explain={}) for p in ps}  # model.TASK_LEFT_OUT


def _transfer_items(ps: list[Placement]) -> tuple:
    return tuple(replace(t, task=p.task) for p in ps for t in p.transfer_items)


def _input_pipeline(ps: list[Placement]) -> InputPipeline | None:
    return ps[0].input_pipeline or None  # the chief's; each task's own is under tasks.<task>


def _timing(ps: list[Placement]) -> Timing | None:
    """Each task timed its own devices (names keep job/task); idle is against its own wall."""
    timed = [(p.task, p.timing) for p in ps if p.timing is not None]
    if not timed:
        return None
    walls = [t.wall_ms for _, t in timed if t.wall_ms is not None]
    devs = {d: x for _, t in timed for d, x in t.devices.items()}
    traces = [t.trace for _, t in timed if t.trace]
    return Timing(
        steps=timed[0][1].steps,
        wall_ms=max(walls) if walls else None,
        step_ms=None,
        devices={d: devs[d] for d in sorted(devs, key=sort_key)},
        notes=tuple(f"[{task}] {n}" for task, t in timed for n in t.notes),
        tasks={task: {"steps": list(t.steps), "wall_ms": t.wall_ms, "step_ms": t.step_ms, "trace": t.trace}
               for task, t in timed},
        trace=traces[0].split("/")[0] if traces else None,  # profile/ holds every task's folder
    )


def _memory(ps: list[Placement]) -> Memory | None:
    """Each task measured its own devices (names keep job/task) with its own self-check; a task that
    could not measure says why under its name."""
    measured = [p for p in ps if p.memory]
    if not measured:
        return None
    devices = {d: m for p in measured for d, m in (p.memory.devices or {}).items() if d.startswith("/")}
    out: dict = {"devices": {d: devices[d] for d in sorted(devices, key=sort_key)},
                 "tasks": {p.task: {k: v for k, v in p.memory.to_json().items() if k != "devices"} for p in measured}}
    why = _tasks_by_reason({p.task: p.memory.why_not for p in measured if p.memory.why_not})
    if why:
        out["why_not"] = "; ".join(f"[{', '.join(tasks)}] {reason}" for reason, tasks in why.items())
    return Memory.from_json(out)


def _tasks_by_reason(why: dict[str, str]) -> dict[str, list[str]]:
    """Each reason once, with the tasks it holds for (every task of a cluster usually has the same)."""
    out: dict[str, list[str]] = {}
    for task, reason in why.items():
        out.setdefault(reason, []).append(task)
    return out


def _precision(ps: list[Placement]) -> Precision | None:
    if ps[0].precision is None:
        return None
    return Precision(policy=ps[0].precision.policy,
                     casts_by_device={d: t["Cast"] for d, t in _op_types_by_device(ps).items() if t.get("Cast")})


# (section, how it is merged): every task's Placement -> the cluster's field.
SECTIONS: list[tuple[str, Callable[[list[Placement]], object]]] = [
    ("devices", _devices),
    ("physical_devices", _physical_devices),
    ("device_aliases", _device_aliases),
    ("ops_by_device", _ops_by_device),
    ("op_types_by_device", _op_types_by_device),
    ("transfers", _transfers),
    ("fallbacks", _fallbacks),
    ("variables", _variables),
    ("variable_updates", _variable_updates),
    ("gradients", _gradients),
    ("replica_consistency", _replica_consistency),
    ("conformance", _conformance),
    ("tasks", _tasks),
    ("transfer_items", _transfer_items),
    ("input_pipeline", _input_pipeline),
    ("timing", _timing),
    ("precision", _precision),
    ("memory", _memory),
]


# A traced program (train.entrypoint): the merge unites the tasks' ops, transfers and variables;
# the program's own sections (its functions and eager ops) are the chief's.
PROGRAM_SECTIONS = ("functions", "training_function", "eager", "program")


def merge_placements(placements: list[Placement]) -> Placement | None:
    """One cluster-wide placement from each task's placement (the first is the chief's); None
    when there is none."""
    if not placements:
        return None
    if len(placements) == 1:
        return placements[0]
    chief = placements[0]
    merged = {key: merge(placements) for key, merge in SECTIONS}
    merged |= {key: getattr(chief, key) for key in PROGRAM_SECTIONS}
    return Placement(task="cluster", strategy=chief.strategy, captured_steps=chief.captured_steps,
                     explain=EXPLAIN, **merged)
