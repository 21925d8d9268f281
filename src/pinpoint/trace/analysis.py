"""The placement inputs of a traced program: the training function's capture (the same sections
as Pinpoint's own loop), plus `functions` (every captured function), `eager` (eager ops per
device and eager copies) and the weights' requests; conformance is by requested device: the plan
is what the program asked for in its own `tf.device` scopes."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from pinpoint.device_names import DeviceMap, local_name, normalize, sort_key
from pinpoint.errors import first_line
from pinpoint.placement import BOOKKEEPING, Placement, PlacementInputs, TraceInputs, build, json_number, step_transfers
from pinpoint.tfcompat.api import device_of

# What Keras (3) and common custom loops call their training function.
TRAIN_NAMES = re.compile(r"(^|_)(train_function|one_step_on_iterator|multi_step_on_iterator|one_step_on_data|"
                         r"train_step|distributed_train_step|train)($|_)")
# TensorFlow's own checkpoint functions (tf.train.Checkpoint's save/restore): never the training function.
PLATFORM_FUNCTIONS = re.compile(r"^(tf_function_save|tf_function_restore|save_fn|restore_fn)$")
_APPLY_RE = re.compile(r"^(ResourceApply\w+|ResourceSparseApply\w+|Apply\w+|AssignSubVariableOp)$")
# Names custom code gives its evaluation and inference functions (a role when Keras gives none).
_EVAL_NAMES = re.compile(r"(^|_)(test|eval|evaluate|evaluation|valid|validation|val)(_|$)")
_PREDICT_NAMES = re.compile(r"(^|_)(predict|prediction|infer|inference|serve|serving)(_|$)")
ROLES = ("train", "evaluate", "predict", "other")
# An input pipeline's function (a ClusterCoordinator's per-worker `dataset_fn`): called once per
# worker, it never trains; a tie in calls with the step it feeds goes to the step.
_INPUT_NAMES = re.compile(r"(^|_)(dataset|datasets|input)(_fn)?$")


def role_of(name: str, keras_role: str | None, applies: int, modifies: int) -> str:
    """A function's role: the Keras method it came from; else train when it applies optimizer
    updates; evaluate or predict by its name; train when it is named so or changes variables
    (not only assigns them, as TensorFlow's lifted initializers do); else other."""
    if keras_role:
        return keras_role
    if applies:
        return "train"
    if _EVAL_NAMES.search(name):
        return "evaluate"
    if _PREDICT_NAMES.search(name):
        return "predict"
    if TRAIN_NAMES.search(name) or modifies:
        return "train"
    return "other"


def _stats(record, namer: DeviceMap) -> dict:
    """One function's row: ops per call (per device), transfers and their bytes per call."""
    cap = record.capture
    from pinpoint.placement import UPDATE_RE

    ops: Counter = Counter()
    updates = applies = modifies = 0
    for g in cap.partition_graphs if cap else []:
        for n in g.node:
            if n.op in BOOKKEEPING:
                continue
            ops[namer.canonical_spec(n.device)] += 1
            updates += bool(UPDATE_RE.match(n.op))
            modifies += bool(UPDATE_RE.match(n.op)) and n.op != "AssignVariableOp"
            applies += bool(_APPLY_RE.match(n.op))
    tr = step_transfers(cap, namer) if cap else {"count": 0, "bytes": 0, "collectives": {}}
    return {
        "name": record.python_name,
        "concrete": record.name,
        "kind": record.kind,
        "calls": record.calls,
        "captured": cap is not None,
        "ops_per_call": sum(ops.values()),
        "ops_by_device": {d: ops[d] for d in sorted(ops, key=sort_key)},
        "transfers_per_call": tr["count"],
        "transfer_bytes_per_call": tr["bytes"],
        "collectives_per_call": sum(c["count"] for c in tr["collectives"].values()),
        "variable_updates": updates,
        "optimizer_updates": applies,
        "role": role_of(record.python_name, getattr(record, "role", None), applies, modifies),
        "error": getattr(record, "error", None),
        # Eager ops the runtime ran on its own threads during the captured call (a py_function
        # body): reported, not the function's ops and not requests of the program.
        "runtime_ops": [{"op_type": t, "device": namer.canonical_spec(d), "count": n}
                        for (t, d), n in sorted(Counter(cap.runtime_ops if cap else ()).items())],
    }


def pick_training(rows: list[dict]) -> dict | None:
    """The training function: one that updates variables, preferring the names Keras and custom
    loops give it, then the most calls; else the most-called function."""
    rows = [r for r in rows if not PLATFORM_FUNCTIONS.match(r["name"])]
    if not rows:
        return None
    pool = ([r for r in rows if r["role"] == "train"] or [r for r in rows if r["optimizer_updates"]]
            or [r for r in rows if r["role"] == "other"] or rows)
    return max(pool, key=lambda r: (bool(TRAIN_NAMES.search(r["name"])), not _INPUT_NAMES.search(r["name"]),
                                    r["calls"], r["ops_per_call"]))


def strategy_of(variables: list) -> str:
    """The strategy the program trained with, read off its variables."""
    from pinpoint.placement import unwrap, variable_kind

    kinds = Counter(variable_kind(unwrap(v)) for v in variables)
    devices = [device_of(unwrap(v)) for v in variables]
    if kinds.get("mirrored") or kinds.get("sync_on_read"):
        comps = [c for v in variables for c in (getattr(unwrap(v), "values", None) or ())]
        jobs = {normalize(device_of(c)).split("/task")[0] for c in comps}
        return "multi_worker_mirrored" if any("/job:worker" in j or "/job:chief" in j for j in jobs) else "mirrored"
    if kinds.get("central_storage"):
        return "central_storage"
    if any("/job:ps" in d for d in devices):
        return "parameter_server"
    return "none"


def replica_devices(variables: list, dm: DeviceMap) -> tuple[str, ...]:
    """The mirrored variables' component devices (the strategy's replicas), in order."""
    from pinpoint.placement import unwrap

    for v in variables:
        vals = getattr(unwrap(v), "values", None)
        if isinstance(vals, (tuple, list)) and len(vals) > 1:
            return tuple(normalize(device_of(c)) for c in vals)
    return dm.replica_devices


def eager_section(eager, namer: DeviceMap, default_device: str) -> dict:
    """placement.json's `eager`: ops per device and op type, cross-device copies (source ->
    destination, count, bytes, the ops that needed them), and requests the runtime did not meet."""
    spec = namer.canonical_spec
    copies = []
    for (src, dst), c in sorted(eager.copies.items(), key=lambda kv: -kv[1]["bytes"]):
        copies.append({"from": spec(src), "to": spec(dst), "count": c["count"], "bytes": c["bytes"],
                       "ops": dict(c["ops"].most_common(10))})
    moved = [{"op_type": t, "requested": spec(r), "ran": spec(d), "count": n}
             for (t, r, d), n in sorted(eager.moved.items(), key=lambda kv: -kv[1])]
    return {
        "ops": eager.total,
        "predicted_fallbacks": eager_predicted(eager, namer),
        "ops_by_device": {spec(d): n for d, n in sorted(eager.ops.items(), key=lambda kv: sort_key(spec(kv[0])))},
        "op_types_by_device": {spec(d): dict(t.most_common(25)) for d, t in eager.op_types.items()},
        "copies": copies,
        "copy_bytes": sum(c["bytes"] for c in copies),
        "not_where_requested": moved,
        "default_device": spec(default_device) if default_device else None,
        # Every eager op of the program counted (None), or every op up to the Nth: the op callback
        # was switched off after `quiet_ops` callbacks in a row brought no new signature, and on
        # again for `sampling_windows` windows (recorder: a new tf.function, or 1, 2, 4 ... 16 s passed).
        "counted_until": eager.stopped,
        "quiet_ops": eager.quiet if eager.stopped is not None else None,
        "sampling_windows": eager.windows if eager.stopped is not None else None,
    }


# The eager section of a program none of whose eager ops could be read (trace_placement's last part).
BARE_EAGER = {"ops": 0, "predicted_fallbacks": [], "ops_by_device": {}, "op_types_by_device": {}, "copies": [],
              "copy_bytes": 0, "not_where_requested": [], "default_device": None, "counted_until": None,
              "quiet_ops": None, "sampling_windows": None}


def attr_values(op_type: str, attrs) -> dict:
    """An op callback's attrs (name, value, name, value, ...) as AttrValues (type attrs only: all a
    kernel lookup keys on)."""
    from tensorflow.core.framework import attr_value_pb2

    from pinpoint.tfcompat.api import op_def as registered_op_def

    op_def = registered_op_def(op_type)
    if op_def is None or not attrs:
        return {}
    kinds = {a.name: a.type for a in op_def.attr}
    out = {}
    for name, value in zip(attrs[::2], attrs[1::2]):
        kind = kinds.get(name)
        if kind == "type":
            out[name] = attr_value_pb2.AttrValue(type=int(value))
        elif kind == "list(type)":
            out[name] = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=[int(v) for v in value]))
    return out


def eager_predicted(eager, namer: DeviceMap) -> list[dict]:
    """Eager ops that ran on an emulated GPU but have no GPU kernel for their dtypes: a GPU
    machine runs them on the host."""
    from pinpoint.kernels import missing_gpu_kernel

    if not namer.emulated:
        return []
    emulated = {normalize(p) for p in namer.aliases.values()}
    out = []
    for (device, op_type), attrs in eager.attrs.items():
        if local_name(device) not in emulated:
            continue
        why = missing_gpu_kernel(op_type, attr_values(op_type, attrs))
        if why:
            out.append({"op_type": op_type, "ran_on": namer.canonical_spec(device), "would_run_on": "/CPU:0",
                        "count": eager.op_types[device][op_type], "reason": why})
    return sorted(out, key=lambda f: -f["count"])


def eager_updates(recorder, namer: DeviceMap) -> dict[int, tuple[str, ...]] | None:
    """Variables updated by eager ops (a `v.assign(...)` outside any tf.function): id(variable) ->
    the devices the eager runtime ran the updates on (None: no eager update at all). By object, not
    name: two models' variables may share a name (each Keras model's 'loss/total')."""
    from pinpoint.placement import components, unwrap

    by_handle = recorder.eager.updates
    if not by_handle:
        return None
    out = {}
    for var in recorder.variables():
        devs = set()
        for c in components(unwrap(var)):
            devs |= {namer.canonical_spec(d) for d in by_handle.get(id(getattr(c, "handle", None)), ())}
        if devs:
            out[id(var)] = tuple(sorted(devs, key=sort_key))
    return out


def trace_inputs(recorder, dm: DeviceMap, *, program: str, notes: list[str] = (), weight_rows=(),
                 task: str = "chief:0", layer_units: tuple[str, ...] = (), created=(),
                 bare: bool = False) -> PlacementInputs:
    """The placement inputs of a traced program: its training function's capture, its variables
    and strategy, its functions, eager ops and weight requests, and its Keras layers (`layer_units`:
    what its ops are attributed to, and what `pinpoint plan` moves); `created`: trace.created's
    records of every variable the program made."""
    from pinpoint.placement import expand_xla
    from pinpoint.trace.created import creation_rows

    namer = DeviceMap.of(dm)
    recorder.flush_calls()
    records = list(recorder.functions.values())
    for r in records:  # an XLA-compiled call is reported as Pinpoint's own loop reports it
        if r.capture is not None:
            expand_xla(r.capture)
    rows = [_stats(r, namer) for r in records]
    train = pick_training(rows)
    by_name = {r.name: r for r in records}
    variables = [] if bare else recorder.variables()
    replicas = replica_devices(variables, dm)
    view = DeviceMap(aliases=dm.aliases, replica_devices=replicas,
                     spec_replica_devices=tuple(namer.canonical_spec(d) for d in replicas),
                     host=dm.host, emulated=dm.emulated, local_devices=dm.local_devices, missing=dm.missing)
    cap = by_name[train["concrete"]].capture if train and not bare else None
    # A training function another thread ran (a parameter_server closure), its memory measured there.
    remote = by_name[train["concrete"]] if train and cap is None and by_name[train["concrete"]].remote and not bare \
        else None
    rows = [dict(r, training=r is train) for r in rows]
    rows.sort(key=lambda r: (not r["training"], -r["calls"], r["name"]))
    trace = TraceInputs(
        program=program, functions=tuple(rows), training_function=train["name"] if train else None,
        eager=eager_section(recorder.eager, namer, recorder.default_device),
        eager_updates=None if bare else eager_updates(recorder, namer), weight_rows=tuple(weight_rows),
        created=() if bare else creation_rows(created, recorder.eager.updates,
                                                     frozenset(recorder.sessions.run_graphs)),
        notes=tuple(notes) + tuple(_trace_notes(rows, records, train, cap, recorder.eager, remote is not None)))
    return PlacementInputs(captures=(cap,) if cap else (), variables=tuple(variables), plan=None,
                           strategy=strategy_of(variables), device_map=view, task=task,
                           device_map_json=dm.to_json(), trace=trace, layer_units=tuple(layer_units),
                           memory=remote_memory(remote, namer) if remote else None)


def remote_memory(record, namer: DeviceMap) -> dict:
    """placement.json's `memory` section of a training function a worker's runtime of this process
    ran (an in-process parameter_server cluster's closure): its second call's allocator events, its
    graphs from TensorFlow's dumps (placement.graphs.dumps)."""
    from pinpoint.placement import dump_dir, memory_section, remote_partitions, tasks_of

    taken = record.remote
    if taken.memory_events is None:
        return {"why_not": taken.memory_why or "the closure's call was not profiled"}
    graphs, why = remote_partitions(dump_dir(), record.name, record.remote_device)
    if why:
        return {"why_not": f"not measured per device: {why}"}
    # Several workers ran the same graphs: each call is told apart by its step (placement.memory.calls).
    among = record.remote_device if tasks_of(dump_dir(), record.name, record.remote_device) > 1 else None
    out = memory_section(graphs, taken.memory_trace, taken.memory_events, namer, peak=taken.memory_peak,
                         read_ps=taken.memory_read_ps, gpus=taken.memory_gpu_peaks, call="second", among=among)
    return out | ({"why_not": taken.memory_why} if taken.memory_why else {})


def _trace_notes(rows: list[dict], records: list, train: dict | None, cap, eager, remote: bool = False) -> list[str]:
    """What the functions' capture could not show, and why."""
    notes = []
    runtime = sum(o["count"] for r in rows for o in r["runtime_ops"])
    if runtime:
        notes.append(
            f"{runtime} eager op(s) ran on TensorFlow's runtime threads during the captured calls (py_function "
            "bodies): listed in functions[].runtime_ops, not counted as the functions' ops or as requests")
    if eager.stopped is not None:
        notes.append(
            f"eager ops: every eager op up to op {eager.stopped} was counted; after "
            f"{eager.quiet} op callbacks in a row with no new signature (op type and device, copy, request "
            f"not met, updated variable) the op callback was switched off, then on again for "
            f"{eager.windows} sampling window(s) (at each new tf.function's first call, and after 1, 2, "
            "4 ... 16 s): later eager ops are counted only inside those windows, so the eager numbers are lower "
            "bounds, and a signature first appearing later is found when it recurs in a window (tf.function "
            "calls are all counted)")
    if not records:
        notes.append("the program ran no tf.function and no Session.run: only its eager ops are shown")
    elif train and cap is None and train.get("error"):
        notes.append(
            f"the training function {train['name']} raised in its first call ({train['error']}): its calls are "
            "counted, its graphs were not recorded; variables and eager ops are")
    elif train and cap is None:
        notes.append(
            f"the training function {train['name']} ran in another thread or process (e.g. parameter_server's "
            "closures, which the workers' runtimes instantiate): its calls are counted, its graphs are not "
            "visible here; variables and eager ops are"
            + ("; its memory was measured on its second call, with the graphs TensorFlow wrote for it "
               "(docs/memory.md#parameter-servers)" if remote else ""))
    return notes


def trace_placement(recorder, dm: DeviceMap, *, program: str, notes: list[str] = (), weight_rows=(),
                    task: str = "chief:0", layer_units: tuple[str, ...] = (), created=()) -> dict:
    """placement.json's content for a traced program.

    The program has run when this reads it: whatever Pinpoint fails to read costs that part, named
    in a note (the first, so the summary shows it), never the placement file nor the program's exit
    code. The parts, richest first: everything; the functions and eager ops without their captures,
    variables and memory; the program and its notes alone."""
    unread: list[str] = []
    try:
        return build(trace_inputs(recorder, dm, program=program, notes=notes, weight_rows=weight_rows,
                                  task=task, layer_units=layer_units, created=created)).to_json()
    except Exception as err:  # noqa: BLE001 - see the docstring: a note, never a failed program
        unread.append(unread_note("its captured calls, variables and memory", err))
    try:
        return build(trace_inputs(recorder, dm, program=program, notes=(*unread, *notes), task=task,
                                  bare=True)).to_json()
    except Exception as err:  # noqa: BLE001
        unread.append(unread_note("its functions and eager ops", err))
    return build(bare_inputs(dm, program=program, notes=(*unread, *notes), task=task)).to_json()


def unread_note(what: str, err: BaseException) -> str:
    """One line for what could not be read after the program ended, and where it failed."""
    import traceback

    frame = (traceback.extract_tb(err.__traceback__) or [None])[-1]
    where = f", at {Path(frame.filename).name}:{frame.lineno}" if frame is not None else ""
    first = first_line(err)
    return (f"Pinpoint could not read {what} after the program ended ({type(err).__name__}: {first}{where}): "
            "left out of this file; the program's exit code is its own")


def bare_inputs(dm: DeviceMap, *, program: str, notes: tuple[str, ...], task: str) -> PlacementInputs:
    """The placement inputs of a program nothing of whose run could be read: its name and notes."""
    trace = TraceInputs(program=program, functions=(), training_function=None, eager=BARE_EAGER, notes=notes)
    return PlacementInputs(captures=(), variables=(), plan=None, strategy="default", device_map=DeviceMap.of(dm),
                           task=task, device_map_json=dm.to_json(), trace=trace)


def trace_metrics(recorder, placement: Placement, *, exit_code: int, seconds: float, keras: dict | None) -> dict:
    """metrics.json for a traced program."""
    train = placement.training
    out: dict[str, Any] = {
        "program": placement.program,
        "exit_code": exit_code,
        "seconds": json_number(seconds),
        "strategy": placement.strategy,
        "steps": train.calls if train else 0,
        "training_function": train.name if train else None,
        "functions": len(placement.functions or ()),
        "eager_ops": recorder.eager.total,
    }
    if recorder.eager.stopped is not None:  # later eager ops ran uncounted (placement.json's notes)
        out["eager_ops_counted_until"] = recorder.eager.stopped
        out["eager_sampling_windows"] = recorder.eager.windows
    if keras:
        out.update(keras)
    return out


def eager_devices(eager) -> list[str]:
    return sorted({local_name(d) for d in eager.ops}, key=sort_key)
