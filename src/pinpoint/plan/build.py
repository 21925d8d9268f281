"""A run folder's training step as the planner's PlanGraph (pinpoint.plan.graph).

Reads placement.json and its per-op file (placement.model.files.load_placement), whose op rows record
the step as a graph (placement.analysis.opgraph: each op's data inputs with their bytes, layer, requested
device, colocation groups, kernel devices, own time), and the run's step times (train_log.jsonl,
else metrics.json). Groups: one per layer key, "input" for the input pipeline's ops, "other" for
the rest (loss, optimizer bookkeeping); `<layer> (backward)` for a backward pass the program
placed apart (every layer's when it pinned the whole pass to one device: graph.gradient_device);
`arguments on <device>` for step arguments that live on a device other than the host. Constants and NoOps are left out: they do no work and the
runtime makes them where they are used. The step function's arguments fed on the host (the
trainer's step counter, the call's example indices) are sent like any tensor: they count as the input
pipeline's output. Where the run's graph depends on its own placement, the graph keeps what does
not: gradient sums as what they sum (_grad_sums), grappler's merged adds as the one tensor that
crosses apart (_unabsorb).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from graphlib import TopologicalSorter
from pathlib import Path

from pinpoint.device_names import parse_name, sort_key
from pinpoint.errors import ConfigError
from pinpoint.layer_keys import is_pattern, key_matches
from pinpoint.placement import INPUT_RE, NOT_COMPUTE, OpRow, Placement, Variable, gradient_re, load_placement
from pinpoint.plan.allreduce import case_of
from pinpoint.plan.graph import (
    BACKWARD,
    HELD,
    INPUT,
    OTHER,
    Edge,
    GradSum,
    Group,
    PlanGraph,
    PsVariable,
    Tensor,
    held_on,
    is_held,
)
from pinpoint.plan.memory import memory_model
from pinpoint.runfolder import METRICS, PLACEMENT, TRAIN_LOG

FIELD = "run_dir"
_ADD_OPS_REWRITE = "/ArithmeticOptimizer/AddOpsRewrite_"  # grappler's merged adds (_unabsorb)
_INPUT_SCOPE = re.compile(r"(^|/)input(_\d+)?/")  # the trainer's input_scope
_FIRST_LOGGED_STEP = 1  # its record's time per step includes the tracing (training.loop.capture)


def plan_graph(run_dir: str | Path, *, field: str = FIELD) -> PlanGraph:
    """The PlanGraph of the run in `run_dir` (a ConfigError naming `field` when it cannot give one)."""
    run = Path(run_dir)
    if not (run / PLACEMENT).is_file():
        raise ConfigError(f"{field}: got '{run}', which has no {PLACEMENT}; plan from the folder of a run "
                          "trained with placement.enabled: true (the default)")
    placement = load_placement(run, field=field)
    rows = placement.ops
    if not rows:
        raise ConfigError(f"{field}: got '{run}', whose {PLACEMENT} holds no op of a captured step (its notes say "
                          "why; a multi-worker run's merged view has none: its tasks' placement-<role>-<index>.json "
                          "do); plan from a run folder whose placement captured a step")
    if any(r.inputs is None for r in rows):
        raise ConfigError(f"{field}: got '{run}', whose placement was captured by an older Pinpoint (its op rows "
                          "have no inputs); re-run with placement.enabled (this version records the graph)")
    return build(placement, measured_step_us=_step_us(run))


def build(placement: Placement, *, measured_step_us: float | None = None) -> PlanGraph:
    """The PlanGraph of a placement (placement.json joined with its op rows)."""
    rows = [r for r in placement.ops if r.type not in NOT_COMPUTE]
    group_of = {r.op: _group_key(r) for r in rows}
    gradient_device = None
    if (placement.strategy or "none") == "none":  # one replica: a layer's passes can run apart
        gradient_device = _gradient_device(rows, group_of, placement)
        group_of = _split_backward(rows, group_of, every=gradient_device is not None)
    by_group: dict[str, list[OpRow]] = defaultdict(list)
    for r in rows:
        by_group[group_of[r.op]].append(r)
    aliases = placement.device_aliases
    physical_to_spec = {v: k for k, v in aliases.items()}
    host_physical = placement.device_map.host if placement.device_map else "/CPU:0"
    host = physical_to_spec.get(host_physical, host_physical)
    if any(a[2] == host for r in rows for a in r.args or ()):
        by_group.setdefault(INPUT, [])  # the host's arguments are sent from the input pipeline's side
    held = sorted({a[2] for r in rows for a in r.args or () if _held(a, host)}, key=sort_key)
    timed = bool(rows) and all(r.us is not None for r in rows)
    order = _order(rows, group_of)
    if INPUT in by_group and INPUT not in order:
        order.insert(0, INPUT)
    for device in reversed(held):
        order.insert(0, held_on(device))
        by_group.setdefault(held_on(device), [])
    var_bytes = _variable_bytes(placement.variables, [k for k in by_group if _is_layer(k)])
    pins = placement.layer_pins or {}
    groups = []
    for key in order:
        ops = by_group[key]
        kernels = [frozenset(r.kernel_devices) for r in ops if r.kernel_devices]
        groups.append(Group(
            key=key,
            order=order.index(key),
            compute_us=round(sum(r.us for r in ops), 3) if timed else 0.0,
            ops=len(ops),
            variable_bytes=var_bytes.get(key, 0),
            device=_majority(r.device for r in ops) if ops else key.removeprefix(HELD) if is_held(key) else host,
            requested=_requested(key, ops, pins),
            allowed=frozenset.intersection(*kernels) if kernels else None,
            movable=key != INPUT and not key.endswith(BACKWARD) and not is_held(key)
            and not any(r.kernel_devices == ("CPU",) for r in ops),
        ))
    devices = set(placement.devices) | set(placement.device_map.spec_replica_devices if placement.device_map else ())
    sums, summing = _grad_sums(rows, group_of)
    tensors = _tensors(rows, group_of, host, summing)
    return PlanGraph(
        groups=tuple(groups),
        edges=_edges(tensors + _sum_edges(sums)),
        tensors=tensors,
        sums=sums,
        devices=tuple(sorted(devices, key=sort_key)),
        host=host,
        strategy=placement.strategy or "",
        timed=timed,
        measured_step_us=measured_step_us,
        colocated=_colocated(rows, group_of),
        ps_variables=_ps_variables(placement, [k for k in by_group if k not in (INPUT, OTHER)]),
        emulated=bool(aliases),
        us_per_transfer=_us_per_transfer(placement),
        all_reduce=case_of(placement),
        gradient_device=gradient_device,
        memory=memory_model(placement, group_of),
    )


def _us_per_transfer(placement: Placement) -> float | None:
    """The profiled _Send/_Recv time per step (timing, summed over the devices) over the tensors
    crossing devices per step (the transfers matrix's count); None when untimed or no transfer."""
    devices = placement.timing.devices if placement.timing is not None else {}
    matrix = placement.transfers.matrix
    count = sum(cell.count or 0 for row in matrix.values() for cell in row.values())
    if not devices or not count:
        return None
    return round(sum(d.transfer_ms or 0.0 for d in devices.values()) * 1e3 / count, 3)


def _ps_variables(placement: Placement, keys: list[str]) -> tuple[PsVariable, ...]:
    """parameter_server: each variable with its group, round-robin turn and measured server.

    placement.json lists the variables in creation order. An optimizer slot (Keras names it
    `<optimizer>/<variable path with _>_<slot>`) is created colocated with its variable, which
    takes no round-robin turn; it follows its variable and never leaves the server (the update
    runs there). The other variables the step updates are pulled by the worker and their update
    pushed (trainable variables: read, gradient; the step counter: read, increment); one the step
    only reads (the learning rate) is read on the servers by their update ops, not by a worker."""
    if placement.strategy != "parameter_server":
        return ()
    rows = [v for v in placement.variables if len([d for d in v.devices if parse_name(d)[0] == "ps"]) == 1]
    trainable = [v.name for v in rows if v.cls == "trainable"]
    out, turn = [], 0
    for v in rows:
        server = next(d for d in v.devices if parse_name(d)[0] == "ps")
        follows = _slot_of(v, trainable)
        if follows:
            key, index = _group_of(follows, keys), -1
        else:
            key, index = _group_of(v.name, keys), turn
            turn += 1
        out.append(PsVariable(v.name, key, int(v.bytes or 0), index, server,
                              bool(v.update_ops) and follows is None, follows))
    return tuple(out)


def _group_of(name: str, keys: list[str]) -> str:
    layer_path = name.rpartition("/")[0]
    return next((k for k in keys if layer_path and _owns(k, layer_path)), OTHER)


def _slot_of(row: Variable, trainable: list[str]) -> str | None:
    """The trainable variable an optimizer slot belongs to (None: not a slot): the longest whose
    path, '/' written '_', starts the slot's name after the optimizer's prefix."""
    if row.cls != "optimizer":
        return None
    rest = row.name.partition("/")[2]
    owners = [t for t in trainable if rest.startswith(t.replace("/", "_") + "_")]
    return max(owners, key=len) if owners else None


def _is_layer(key: str) -> bool:
    return key not in (INPUT, OTHER) and not key.endswith(BACKWARD) and not is_held(key)


def _held(arg: list, host: str) -> bool:
    """An argument of the step that is data living on a device other than the host (it has bytes:
    a resource handle has none, and its variable moves with its layer)."""
    return bool(arg[1]) and arg[2] != host


def _passes(rows: list[OpRow], group_of: dict[str, str]) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """(forward, backward) op devices per layer: how many of each pass's ops ran on each device."""
    grad = gradient_re()
    fwd: dict[str, Counter] = defaultdict(Counter)
    bwd: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        key = group_of[r.op]
        if _is_layer(key):
            (bwd if grad.search(r.op) else fwd)[key][r.device] += 1
    return fwd, bwd


def _gradient_device(rows: list[OpRow], group_of: dict[str, str], placement: Placement) -> str | None:
    """The one device the program put its whole backward pass on, else None (it follows the
    layers, or runs on several devices). Pinned: the run's conformance has a `gradients` rule
    (train.pinning.gradients). Chosen by a traced program (a tf.device around tape.gradient): some
    layer's backward pass ran apart from the layer, and every layer's on that one device."""
    rules = placement.conformance.rules
    fwd, bwd = _passes(rows, group_of)
    grad = gradient_re()
    if any(r.rule == "gradients" for r in rules):
        return _majority(r.device for r in rows if grad.search(r.op) and group_of[r.op] != INPUT) or None
    ends = {_majority(c.elements()) for c in bwd.values()}
    apart = any(fwd.get(k) and _majority(c.elements()) != _majority(fwd[k].elements()) for k, c in bwd.items())
    return next(iter(ends)) if apart and len(ends) == 1 else None


def _split_backward(rows: list[OpRow], group_of: dict[str, str], *, every: bool) -> dict[str, str]:
    """group_of, with the backward ops of a layer whose backward pass ran on another device than
    its forward pass (the program chose where gradients run: train.pinning.gradients, a tf.device
    around tape.gradient) as a group of their own, `<layer> (backward)`: pinning a layer moves its
    forward pass, not them. A layer whose backward pass follows it keeps one group. With `every`
    (the whole backward pass on one device, graph.gradient_device) every layer's backward ops and
    the loss's ("other") are split, also where they ran beside their forward ops: moving a layer
    off that device leaves its backward pass there."""
    grad = gradient_re()
    fwd, bwd = _passes(rows, group_of)
    if every:
        apart = set(bwd) | {OTHER}
    else:
        apart = {k for k in bwd if fwd.get(k) and _majority(bwd[k].elements()) != _majority(fwd[k].elements())}
    return {op: f"{k}{BACKWARD}" if k in apart and grad.search(op) else k for op, k in group_of.items()}


def _group_key(row: OpRow) -> str:
    if row.layer:
        return row.layer
    if INPUT_RE.match(row.type) or _INPUT_SCOPE.search(row.op):
        return INPUT
    return OTHER


def _order(rows: list[OpRow], group_of: dict[str, str]) -> list[str]:
    """Groups in the order their forward ops run: each op's depth in the step's dataflow (longest
    path from a source), a group ranked by its deepest forward op, so a layer chain comes out in
    order and the loss after the last layer. Forward: neither a gradient op nor downstream of one
    (an optimizer's update is not); groups with no forward op come after them all; ties keep the
    rows' order."""
    depth, backward = _depths(rows)
    fwd: dict[str, int] = {}
    every: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, r in enumerate(rows):
        g = group_of[r.op]
        first.setdefault(g, i)
        every[g] = max(every.get(g, -1), depth[r.op])
        if r.op not in backward:
            fwd[g] = max(fwd.get(g, -1), depth[r.op])
    top = max(every.values(), default=0) + 1
    return sorted(first, key=lambda g: (fwd[g] if g in fwd else top + every[g], first[g]))


def _depths(rows: list[OpRow]) -> tuple[dict[str, int], set[str]]:
    """(op -> longest path in ops from a source of the step's data edges, the ops that are gradient
    ops or downstream of one), in Kahn's order."""
    grad = gradient_re()
    names = {r.op for r in rows}
    preds = {r.op: {t.partition(":")[0] for t, _ in r.inputs} & names for r in rows}
    succs: dict[str, list[str]] = defaultdict(list)
    for op, ps in preds.items():
        for p in ps:
            succs[p].append(op)
    waiting = {op: len(ps) for op, ps in preds.items()}
    depth = {op: 0 for op in names}
    backward = {op for op in names if grad.search(op)}
    ready = [op for op, n in waiting.items() if n == 0]
    while ready:
        op = ready.pop()
        for s in succs[op]:
            depth[s] = max(depth[s], depth[op] + 1)
            if op in backward:
                backward.add(s)
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    return depth, backward


def _tensors(rows: list[OpRow], group_of: dict[str, str], host: str, summing: set[str]) -> tuple[Tensor, ...]:
    """Every tensor one group's ops hand to another group's, with the groups reading it. An
    argument of the step function on the host comes from the input group; a sized one on another
    device (a captured tensor) from that device's `arguments on <device>` group; a variable's
    handle (unsized) is not a tensor a plan moves. What the ops of a gradient
    sum (`summing`) read and make is the sum's (PlanGraph.sums)."""
    found: dict[str, tuple[str, int, set[str]]] = {}
    for r in rows:
        if r.op in summing:
            continue
        dst = group_of[r.op]
        fed = [(group_of.get(t.partition(":")[0]), t, b) for t, b in r.inputs if t.partition(":")[0] not in summing]
        fed += [(INPUT if dev == host else held_on(dev), t, b) for t, b, dev in r.args or ()
                if dev == host or _held([t, b, dev], host)]
        for src, tensor, nbytes in fed:
            if src is not None and src != dst:
                found.setdefault(tensor, (src, nbytes or 0, set()))[2].add(dst)
    _unabsorb(rows, group_of, found)
    return tuple(Tensor(src, nbytes, frozenset(dsts), name) for name, (src, nbytes, dsts) in sorted(found.items()))


_SUM_OP = re.compile(r"(^|/)gradients(_\d+)?/AddN(_\d+)?$")  # tf.gradients' aggregation (_MultiDeviceAddN)


def _grad_sums(rows: list[OpRow], group_of: dict[str, str]) -> tuple[tuple[GradSum, ...], set[str]]:
    """The step's gradient sums as TensorFlow builds them whatever the placement, and their ops.

    The run shows each sum as its placement built it: an AddN per device of contributions (read
    only by the sum across devices), that one colocated with the op that made the tensor. A sum
    is kept as its contributions (the inputs of its AddNs that are not its own partial sums), the
    group of the op that made the tensor (the op its contributions' forward ops read it from) and
    the groups reading the result; the ops of a sum whose maker is not found stay plain ops."""
    sum_ops = {r.op: r for r in rows if r.type == "AddN" and r.colocation and _SUM_OP.search(r.op)}
    if not sum_ops:
        return (), set()
    by_name = {r.op: r for r in rows}
    readers: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        for t, _ in r.inputs:
            op = t.partition(":")[0]
            if op in sum_ops:
                readers[op].append(r.op)
    partial_of = {op: rs[0] for op, rs in readers.items() if len(rs) == 1 and rs[0] in sum_ops}
    roots = [op for op in sum_ops if op not in partial_of]
    parts: dict[str, list[str]] = defaultdict(list)  # root -> its ops (itself and its partial sums)
    for op in sum_ops:
        root = op
        while root in partial_of:
            root = partial_of[root]
        parts[root].append(op)
    index: dict[str, int] = {}  # a kept sum's root -> its position
    kept: list[tuple[str, str, int, tuple]] = []  # (root, maker's group, bytes, contributions)
    summing: set[str] = set()
    for root in _sum_order(roots, parts, sum_ops):
        ops = parts[root]
        leaves = [(t, b) for op in ops for t, b in sum_ops[op].inputs if t.partition(":")[0] not in ops]
        home = _maker_group([(t, b) for t, b in leaves if t.partition(":")[0] not in sum_ops], by_name, group_of)
        # Another sum passed through is one of its contributions: kept only when that one is.
        if home is None or any(t.partition(":")[0] in sum_ops and t.partition(":")[0] not in index for t, _ in leaves):
            continue
        contributions = tuple((t, None, index[t.partition(":")[0]]) if t.partition(":")[0] in sum_ops
                              else (t, group_of.get(t.partition(":")[0]), None) for t, _ in leaves)
        if any(g is None and j is None for _, g, j in contributions):
            continue
        index[root] = len(kept)
        kept.append((root, home, max(b or 0 for _, b in leaves), contributions))
        summing.update(ops)
    # Readers: the ops reading a sum's result other than the kept sums it contributes to (a sum
    # that is not kept reads it as any op does).
    sums = tuple(GradSum(home, nbytes, contributions,
                         frozenset(group_of[r] for r in readers.get(root, ()) if r not in summing))
                 for root, home, nbytes, contributions in kept)
    return sums, summing


def _sum_order(roots: list[str], parts: dict[str, list[str]], sum_ops: dict[str, dict]) -> list[str]:
    """The sums' roots, each after the sums it reads."""
    root_of = {op: root for root, ops in parts.items() for op in ops}
    reads = {root: {root_of[t.partition(":")[0]] for part in parts[root] for t, _ in sum_ops[part].inputs
                    if t.partition(":")[0] in root_of} - {root}
             for root in roots}
    return list(TopologicalSorter(reads).static_order())


def _maker_group(leaves: list[tuple[str, int | None]], by_name: dict[str, OpRow],
                 group_of: dict[str, str]) -> str | None:
    """The group of the op that made the tensor a sum's contributions are the gradient of (None
    when not found). A contribution's op is colocated with the forward op that read a tensor, and
    that op's input of the contribution's size is the tensor. A contribution an Add passed through
    names a tensor made from it further on (the Add's output): the sum's is the one the others are
    made from."""
    found = set()
    for t, nbytes in leaves:
        op = by_name.get(t.partition(":")[0])
        for fwd in op.colocation if op is not None else ():
            reader = by_name.get(fwd)
            if reader is None:
                continue
            inputs = [i for i, b in reader.inputs if b == nbytes]
            if len(inputs) == 1 and inputs[0].partition(":")[0] in group_of:
                found.add(inputs[0])
    upstream = [c for c in found if all(o == c or c in _made_from(o, by_name) for o in found)]
    return group_of[upstream[0].partition(":")[0]] if len(upstream) == 1 else None


def _made_from(tensor: str, by_name: dict[str, OpRow], depth: int = 6) -> set[str]:
    """The tensors `tensor` is computed from, `depth` ops back."""
    out: set[str] = set()
    frontier = [tensor]
    for _ in range(depth):
        nxt = []
        for t in frontier:
            row = by_name.get(t.partition(":")[0])
            for i, _ in (row.inputs if row is not None else None) or ():
                if i not in out:
                    out.add(i)
                    nxt.append(i)
        frontier = nxt
    return out


def _sum_edges(sums: tuple[GradSum, ...]) -> tuple[Tensor, ...]:
    """What the search weighs for the sums: each contribution to the maker's group, the result from
    it to its readers (the exact bytes are PlanGraph.crossings')."""
    out = []
    for s in sums:
        for _, group, j in s.contributions:
            src = group if group is not None else sums[j].home
            if src != s.home:
                out.append(Tensor(src, s.bytes, frozenset({s.home})))
        if s.readers - {s.home}:
            out.append(Tensor(s.home, s.bytes, frozenset(s.readers - {s.home})))
    return tuple(out)


def _unabsorb(rows: list[OpRow], group_of: dict[str, str], found: dict[str, tuple[str, int, set[str]]]) -> None:
    """Undo grappler's merge of another group's adds into a group's sum, in `found` (in place).

    ArithmeticOptimizer's AddOpsRewrite merges a tree of adds on one device into one sum under the
    root's name (`<scope>/ArithmeticOptimizer/AddOpsRewrite_*`): a residual block's Add absorbs the
    last add of the BatchNormalization before it (x * scale + offset) and reads that layer's
    operands instead of its output (a full activation and a vector per channel). Placed apart the
    two groups are on two devices, the adds are not merged, and one tensor crosses: the absorbed
    add's output, as large as its largest operand. So the operands one group hands another's
    rewritten sum count as that one tensor."""
    grad = gradient_re()
    tree_of: dict[str, tuple[str, str]] = {}  # a rewritten node -> (its tree's scope, its group)
    for r in rows:
        scope, sep, _ = r.op.partition(_ADD_OPS_REWRITE)
        # Not a gradient's sum: its adds are all its own group's (colocated with the op whose
        # gradient it sums); the operands other groups hand it are contributions, each its own tensor.
        if sep and not grad.search(scope + "/"):
            tree_of[r.op] = (scope, group_of[r.op])
    if not tree_of:
        return
    operands: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    read_elsewhere: dict[str, set[str]] = defaultdict(set)  # group -> tensors its other ops read
    sums_in = {dst for _, dst in tree_of.values()}
    for r in rows:
        tree, dst = tree_of.get(r.op), group_of[r.op]
        if tree is None and dst not in sums_in:
            continue
        for t, _ in r.inputs:
            src = group_of.get(t.partition(":")[0])
            if src is not None and src != dst and t in found:
                (operands[tree][src] if tree else read_elsewhere[dst]).add(t)
    for (scope, dst), by_src in sorted(operands.items()):
        for src, tensors in sorted(by_src.items()):
            if len(tensors) < 2:
                continue
            largest = max(found[t][1] for t in tensors)
            for t in tensors - read_elsewhere[dst]:
                producer, nbytes, dsts = found.pop(t)
                if dsts - {dst}:
                    found[t] = (producer, nbytes, dsts - {dst})
            found[f"{scope}{_ADD_OPS_REWRITE}* <- {src}"] = (src, largest, {dst})


def _edges(tensors: tuple[Tensor, ...]) -> tuple[Edge, ...]:
    """Bytes (and tensors) per step between groups: each tensor counted once per consuming group
    (what the search weighs; the prediction counts a tensor once per consuming device, from
    `tensors`)."""
    total: Counter = Counter()
    count: Counter = Counter()
    for t in tensors:
        for dst in t.dsts:
            total[(t.src, dst)] += t.bytes
            count[(t.src, dst)] += 1
    return tuple(Edge(s, d, b, count[(s, d)]) for (s, d), b in sorted(total.items()))


def _colocated(rows: list[OpRow], group_of: dict[str, str]) -> tuple[frozenset[str], ...]:
    """Groups the runtime keeps on one device: an op's colocation groups name ops of other groups
    (transitively merged)."""
    parent: dict[str, str] = {}

    def find(g: str) -> str:
        while parent.setdefault(g, g) != g:
            g = parent[g]
        return g

    for r in rows:
        for other in r.colocation or ():
            g = group_of.get(other)
            if g is not None and g != group_of[r.op]:
                parent[find(g)] = find(group_of[r.op])
    sets: dict[str, set[str]] = defaultdict(set)
    for g in list(parent):
        sets[find(g)].add(g)
    return tuple(sorted((frozenset(s) for s in sets.values() if len(s) > 1), key=sorted))


def _owns(key: str, layer_path: str) -> bool:
    """Does group `key` (a pinning.layers key) hold the layer at `layer_path`, or one it nests in?"""
    return key_matches(key, layer_path) or (not is_pattern(key) and layer_path.startswith(key + "/"))


def _variable_bytes(variables: tuple[Variable, ...], keys: list[str]) -> dict[str, int]:
    """Group -> bytes of the variables it owns (one copy): a variable belongs to the layer its name
    is scoped under ("dense_1/kernel" -> dense_1); the rest (optimizer slots, counters) to "other"."""
    out: Counter = Counter()
    for v in variables:
        layer_path = v.name.rpartition("/")[0]
        key = next((k for k in keys if layer_path and _owns(k, layer_path)), OTHER)
        out[key] += v.bytes or 0
    return dict(out)


def _majority(devices) -> str:
    counts = Counter(devices)
    return min(counts, key=lambda d: (-counts[d], sort_key(d))) if counts else ""


def _requested(key: str, ops: list[OpRow], pins: dict[str, str]) -> str | None:
    """The user's pin for the group (placement.json's layer_pins, by layer path), else the one
    device its ops requested (none, or several: None)."""
    pinned = {dev for path, dev in pins.items() if _owns(key, path)} if key not in (INPUT, OTHER) else set()
    if len(pinned) == 1:
        return pinned.pop()
    asked = {r.requested for r in ops} - {"", None}
    return asked.pop() if len(asked) == 1 else None


def _step_us(run: Path) -> float | None:
    """The run's median time per step in µs: train_log.jsonl's records (not the first step's, which
    includes the tracing), else metrics.json's examples per second over the global batch."""
    log = run / TRAIN_LOG
    if log.is_file():
        times = []
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("step", 0) > _FIRST_LOGGED_STEP and rec.get("step_time"):
                times.append(float(rec["step_time"]))
        if times:
            return round(statistics.median(times) * 1e6, 3)
    metrics = run / METRICS
    if metrics.is_file():
        m = json.loads(metrics.read_text())
        if m.get("examples_per_sec") and m.get("global_batch"):
            return round(m["global_batch"] / m["examples_per_sec"] * 1e6, 3)
    return None
