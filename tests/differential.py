"""The differential suite: each program in tests/programs/ runs under `pinpoint trace --gpus 2`
and as plain TensorFlow (tests/oracle.py), and what Pinpoint wrote is compared with what
TensorFlow said, op by op, variable by variable and transfer by transfer.

`python -m tests.differential --write` runs every program and rewrites the table in
docs/trace.md ("Checked against TensorFlow") from that run; tests/test_differential.py asserts
each program has no difference.

Devices are compared in the program's spelling: the oracle's /CPU:1 and /CPU:2 stand in for
/GPU:0 and /GPU:1 (its rewrite of the program), /CPU:0 is the host in both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.oracle import RECEIVES, SENDS

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "tests" / "programs"
ORACLE = REPO / "tests" / "oracle.py"
DOC = REPO / "docs" / "trace.md"
BEGIN = "<!-- differential table: written by `python -m tests.differential --write`; do not edit -->"
END = "<!-- end of differential table -->"
# A run of a program (the oracle's process, which makes two, has twice this): a guard against a
# hang. A MobileNetV2 combination's run takes about 65 s alone; beside CI's other streams on two
# cores it took more than 300 s.
TIMEOUT = 600
# The shapes run made again after tfdbg crashed it (a signal, not an error of the program).
SHAPES_RETRIES = 2
# The most one program's runs may take: the oracle's two runs, made again at most SHAPES_RETRIES times.
PROGRAM_TIMEOUT = 2 * TIMEOUT * (1 + SHAPES_RETRIES)
ORACLE_DUMP = ".dump"  # tests/oracle.py's DUMP: next to shapes.json, the path of its finished tfdbg dump

# The program -> the function that trains it, as its author wrote it (TensorFlow has no notion of
# a training function: this one row is checked against the program, not the oracle).
TRAINING = {
    "custom_loop_mirrored": "distributed_train_step",
    "split_two_gpus": "train_step",
    "pipeline_on_cpu_fit": "multi_step_on_iterator",
    "string_ops_soft_placement": "train_step",
    "mirrored_fit_batchnorm": "multi_step_on_iterator",
    "parameter_server": "worker_fn",
    "variable_cpu_assign_gpu": "step",
    "evaluate_predict": "multi_step_on_iterator",
    "subclass_lazy_build": "train_step",
    "subclass_built_in_scope": "train_step",
    "distribute_dataset_reduce": "distributed_step",
    "eager_split_loop": None,
    "mirrored_fit_cnn": "multi_step_on_iterator",
    "strategies_in_turn": "multi_step_on_iterator",
}

# Programs that connect to a cluster: the oracle cannot hold a default device scope around them
# (tests/oracle.py, DEFAULT_DEVICE); their unrequested ops go where TensorFlow's default puts them.
NO_DEFAULT_DEVICE = {"parameter_server"}

# Programs whose training function runs only in a ClusterCoordinator's closures: the remote
# workers' runtimes instantiate it, so neither TensorFlow's run metadata on this process nor
# Pinpoint sees its graphs; its calls are compared, its ops cannot be.
REMOTE_TRAINING = {"parameter_server"}

# The ops that read a program's input batches, as TensorFlow runs them: an iterator's get-next
# (a multi-device iterator's per-device shard), and the RemoteCall a distributed iterator makes
# on a replica's device to run the host's pipeline.
INPUT_OPS = re.compile(r"^(?:RemoteCall|\w*IteratorGetNext\w*)$")
BOOKKEEPING = SENDS | RECEIVES | {"_Arg", "_Retval", "_DeviceArg", "_DeviceRetval"}
# Dtype enums that have no byte size (string, resource, variant): not sizable on either side.
_UNSIZED = {7, 20, 21}
_MKL = re.compile(r"^_Mkl(?:Native)?(?=[A-Z])")
_PARTITION_SUFFIX = re.compile(r"/_\d+(?=/|$)")
# A TensorFlow log line of an eager op sent to a remote task: the sending thread's id, the op, the device.
_ON_TASK = re.compile(r"^\S+ \S+\s+(\d+) execute\.cc:\d+\] Executing op (\S+) on task (\S+)$", re.M)
_FUNCTION_NAME = re.compile(r"^__(?:inference|forward|backward)_(.*?)(?:_\d+)?$")

def short_function(concrete: str) -> str:
    m = _FUNCTION_NAME.match(concrete)
    return m.group(1) if m else concrete


def spec_device(device: str) -> str:
    """The oracle's logical CPU as the program spells it: /CPU:1 -> /GPU:0, /CPU:2 -> /GPU:1."""
    m = re.match(r"^(.*)/CPU:(\d+)$", device or "")
    if not m or m.group(1):
        return device or ""
    i = int(m.group(2))
    return "/CPU:0" if i == 0 else f"/GPU:{i - 1}"


def node_name(name: str) -> str:
    """A node's name without the partitioner's '/_<n>' parts (their numbers are process-wide)."""
    return _PARTITION_SUFFIX.sub("", name)


def _nbytes(dtype: int | None, dims: list | None) -> int | None:
    import numpy as np
    from tensorflow.python.framework import dtypes

    if dtype is None or dims is None or dtype in _UNSIZED or any(d is None or d < 0 for d in dims):
        return None
    try:
        size = dtypes.as_dtype(dtype).size
    except (TypeError, ValueError):
        return None
    return int(size * int(np.prod(dims, dtype=np.int64)))


# ---- the two views ---------------------------------------------------------------------------
@dataclass
class View:
    """What one side says: functions (ops, transfers), variables, eager ops."""

    training: str | None = None
    functions: list[dict] = field(default_factory=list)  # name, calls, ops Counter[(op, device)], transfers
    variables: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    eager_ops: Counter = field(default_factory=Counter)  # (op type, device) -> n
    eager_by_device: Counter = field(default_factory=Counter)
    eager_top: set = field(default_factory=set)  # devices whose op types are a top-25 list (Pinpoint)
    copies: dict = field(default_factory=dict)  # (from, to) -> (count, bytes)
    notes: list[str] = field(default_factory=list)
    sizing_errors: list[str] = field(default_factory=list)  # Pinpoint's: where its shape inference failed
    input_ops: Counter = field(default_factory=Counter)  # (op type, device) -> n: the oracle's input reads


def oracle_view(placement: dict, shapes: dict, log: str) -> View:
    v = View()
    for f in placement["functions"]:
        ops: Counter = Counter()
        transfers: Counter = Counter()
        unsized: list[str] = []
        for parts in f["partitions"]:
            # One function graph's partitions: a tensor received is followed to its sender.
            nodes = {n["name"]: n for graph in parts for n in graph}
            senders = {n["tensor_name"]: n for graph in parts for n in graph if n["op"] in SENDS}
            nodes["__senders__"] = senders
            for graph in parts:
                for n in graph:
                    if n["op"] not in BOOKKEEPING:
                        ops[(node_name(n["name"]), spec_device(n["device"]))] += 1
                    # An XLA cluster: the ops its function has run as one program on the call's
                    # device (no per-op placement), named as TensorFlow names an inlined body.
                    for inner in n.get("xla_ops", ()):
                        ops[(node_name(f"{n['name']}/{inner}"), spec_device(n["device"]))] += 1
                    if INPUT_OPS.match(n["op"]):
                        v.input_ops[(n["op"], spec_device(n["device"]))] += 1
                    if n["op"] in SENDS and n["send_device"] != n["recv_device"]:
                        tensor = n["inputs"][0].lstrip("^")
                        size = _oracle_size(n, tensor, nodes, f["args"], shapes)
                        if size == "?":
                            unsized.append(tensor)
                            size = None
                        transfers[(node_name(tensor.split(":")[0]), spec_device(n["send_device"]),
                                   spec_device(n["recv_device"]), size)] += 1
        v.functions.append({"name": short_function(f["name"]), "concrete": f["name"], "calls": f["calls"],
                            "ops": ops, "transfers": transfers})
        v.notes += [f"oracle: no runtime shape for {t} in {f['name']}" for t in unsized]
    v.variables = sorted((x["name"], tuple(spec_device(d) for d in x["devices"])) for x in placement["variables"])
    inside = log.split("ORACLE-BEGIN", 1)[-1].split("ORACLE-END", 1)[0]
    main = inside.split(None, 1)[0] if inside.strip() else ""
    # Calls as TensorFlow logged them: every thread's (a coordinator's closures too), not the
    # component functions a multi-device function runs on each device.
    calls = Counter(op for op, _ in re.findall(r"Executing op (__inference_\S+) in device (\S+)", inside)
                    if "_partitioned_" not in op)
    known = {f["concrete"] for f in v.functions}
    for f in v.functions:
        f["calls"] = calls.get(f["concrete"], 0)
    for concrete in sorted(set(calls) - known):
        v.functions.append({"name": short_function(concrete), "concrete": concrete, "calls": calls[concrete],
                            "ops": None, "transfers": None})
    # An IteratorGetNext that raised (the end of a dataset, which ends a `for` loop) is logged but
    # returns nothing: no op callback sees it. Those the log has beyond the callback's count are
    # left out, and said in the notes.
    seen = Counter()
    for op, _, n in placement["eager_callback"]:
        seen[op] += n
    raised = Counter()
    # Eager ops another thread sent to a remote task (a ClusterCoordinator's threads making each
    # worker's iterator): logged once where they were sent from ("on task", naming the thread)
    # and once where they ran. Op callbacks are per thread, so Pinpoint's sees none of them:
    # they are left out, and said in the notes.
    remote = Counter((op, _short(dev)) for tid, op, dev in _ON_TASK.findall(inside)
                     if tid != main and not op.startswith("__"))
    for op, dev in re.findall(r"Executing op (\S+) in device (\S+)", inside):
        # _EagerConst turns a Python value into a tensor (no op callback sees it); function calls
        # are compared as functions.
        if op == "_EagerConst" or op.startswith("__"):
            continue
        # oneDNN builds log an eager op under its rewritten kernel's name (_MklMatMul): the op
        # the program ran (MatMul) is the name an op callback, and Pinpoint, see.
        op = _MKL.sub("", op)
        if INPUT_OPS.match(op):
            v.input_ops[(op, spec_device(_short(dev)))] += 1
        if op == "IteratorGetNext":
            raised[op] += 1
            if raised[op] > seen[op]:
                v.notes.append(f"oracle: an IteratorGetNext on {spec_device(_short(dev))} raised (end of data)")
                continue
        if remote[(op, _short(dev))] > 0:
            remote[(op, _short(dev))] -= 1
            v.notes.append(f"oracle: {op} on {spec_device(_short(dev))} was sent there by another thread")
            continue
        d = spec_device(_short(dev))
        v.eager_ops[(op, d)] += 1
        v.eager_by_device[d] += 1
    v.copies = {(spec_device(c["from"]), spec_device(c["to"])): (c["count"], c["bytes"]) for c in placement["copies"]}
    return v


def _short(device: str) -> str:
    from tests.oracle import short

    return short(device)


def _oracle_size(send: dict, tensor: str, nodes: dict, args: dict, shapes: dict, depth: int = 0):
    """Bytes of one transfer: dtype x the shape TensorFlow produced ('?' when none is known)."""
    dtype = send.get("T")
    if dtype in _UNSIZED:
        return None
    if depth > 20:
        return "?"
    name, _, idx = tensor.partition(":")
    src = nodes.get(name)
    branch_input = _BRANCH_INPUT.match(name)
    if branch_input and not _branch_ran(branch_input.group(1), branch_input.group(2), shapes):
        return "?"  # the input of a branch that did not run: nothing was produced, nothing moved
    if src is not None and src["op"] in ("_Arg", "_DeviceArg") and name in args:
        return _nbytes(*args[name])
    if src is not None and "const" in src:
        return _nbytes(*src["const"])
    if src is not None and src["op"] == "Identity" and src["inputs"] and not src["inputs"][0].startswith("^"):
        # Identity's output is its input (tfdbg does not trace a function's output Identity).
        return _oracle_size(send, src["inputs"][0], nodes, args, shapes, depth + 1)
    if src is not None and src["op"] in ("Switch", "RefSwitch") and src["inputs"]:
        # A lowered cond's Switch forwards its data input to the branch taken (an input of a
        # branch inlined as 'Func/<cond>/then/input/...': a LossScaleOptimizer's step counter).
        return _oracle_size(send, src["inputs"][0], nodes, args, shapes, depth + 1)
    if src is not None and src["op"] in RECEIVES:
        # A tensor received from another partition: what its sender sent.
        sender = nodes["__senders__"].get(src.get("tensor_name"))
        if sender is not None:
            return _oracle_size(sender, sender["inputs"][0], nodes, args, shapes, depth + 1)
    if src is not None and src["op"] == "Merge":
        # A lowered cond's output is the input of the branch that ran; tfdbg traces that
        # branch's ops, not the Merge: the one size its data inputs have at run time (a branch's
        # constant placeholder output is not a runtime size).
        sized = {_oracle_size(send, i, nodes, args, shapes, depth + 1) for i in src["inputs"]
                 if not i.startswith("^") and nodes.get(i.split(":")[0], {}).get("op") != "Const"}
        sized.discard("?")
        return sized.pop() if len(sized) == 1 else "?"
    lowered = _LOWERED_BRANCH.match(name)
    if lowered:
        # An op of a lowered cond's branch: the oracle's shapes of that branch's ops, only if it ran.
        found = _branch_shapes(lowered.group(1), lowered.group(2), f"{node_name(lowered.group(3))}:{idx or 0}", shapes)
        if not found:
            return "?"
        sized = {_nbytes(d, s) for d, s in found if d == dtype} or {_nbytes(d, s) for d, s in found}
        return sized.pop() if len(sized) == 1 else "?"
    key = f"{node_name(name)}:{idx or 0}"
    parts = key.split("/")
    for i in range(len(parts)):  # an inlined callee's op is '<call op>/<op>'
        found = shapes.get("/".join(parts[i:]))
        if found:
            sized = {_nbytes(d, s) for d, s in found if d == dtype} or {_nbytes(d, s) for d, s in found}
            return sized.pop() if len(sized) == 1 else "?"
    return "?"


# A lowered cond's branch op, '<cond>/then/_<k>/<op>' (the last such segment: the innermost cond),
# and a branch's input, 'Func/<cond>/then/_<k>/input/_<j>'.
_LOWERED_BRANCH = re.compile(r"^(.*)/(then|else)/_\d+/(.*)$")
_BRANCH_INPUT = re.compile(r"^Func/(.*)/(then|else)/_\d+/input/_\d+$")


def _branch_entries(shapes: dict, role: str):
    """(scope with '/' as '_', op key, shapes) of the oracle's branch ops of `role` (then/else)."""
    from tests.oracle import BRANCH, SCOPES

    for key, found in shapes.items():
        if key.startswith(BRANCH) and key != SCOPES:
            _, scope, r, op = key.split(BRANCH, 3)
            if r == role:
                yield scope, op, found


_CALLS = re.compile(r"(^|/)((Stateful)?PartitionedCall(_\d+)?|body/_\d+)(?=/)")


def _matches(cond: str, scope: str) -> bool:
    """Whether a branch graph of `scope` ('<scope>@<call depth>', tests/oracle.py) could be one of
    the cond op named `cond` (its name, each function it was inlined from a prefix)."""
    flat = node_name(cond).replace("/", "_")
    name, _, depth = scope.rpartition("@")
    if int(depth) != len(_CALLS.findall(node_name(cond))):
        return False
    return flat == name or flat.endswith("_" + name)


def _scope_of(cond: str, shapes: dict) -> str | None:
    """The branch functions' scope of the cond op named `cond`: the longest of the traced ones
    that its name ends with ('cond_adam_cond', not the 'cond' of an outer or sibling cond)."""
    from tests.oracle import SCOPES

    found = [scope for scope in shapes[SCOPES] if _matches(cond, scope)]
    return max(found, key=len) if found else None


def _branch_shapes(cond: str, role: str, op_key: str, shapes: dict) -> list:
    scope = _scope_of(cond, shapes)
    return [tuple(x) for s, op, found in _branch_entries(shapes, role) if op == op_key and s == scope for x in found]


def _branch_ran(cond: str, role: str, shapes: dict) -> bool:
    """Whether tfdbg saw any op of that branch of `cond` run."""
    scope = _scope_of(cond, shapes)
    return any(s == scope for s, _, _ in _branch_entries(shapes, role))


def pinpoint_view(p: dict) -> View:
    v = View(training=p.get("training_function"), sizing_errors=list((p.get("transfers") or {}).get("sizing_errors") or ()))
    train = next((f for f in p.get("functions", []) if f.get("training")), None)
    for f in p.get("functions", []):
        row = {"name": f["name"], "concrete": f["concrete"], "calls": f["calls"], "captured": f["captured"],
               "ops_by_device": f["ops_by_device"], "transfers_per_call": f["transfers_per_call"],
               "transfer_bytes_per_call": f["transfer_bytes_per_call"]}
        if f is train:
            row["ops"] = Counter((node_name(o["op"]), o["device"]) for o in p.get("ops") or [])
            row["transfers"] = Counter((node_name(t["tensor"].split(":")[0]), t["from"], t["to"], t["bytes"])
                                       for t in p.get("transfer_items") or [])
        v.functions.append(row)
    # Freed ones too: the oracle's creator scope holds every variable it saw created.
    v.variables = sorted((x["name"], tuple(c["device"] for c in x["components"])) for x in p.get("variables") or [])
    e = p.get("eager") or {}
    v.eager_by_device = Counter(e.get("ops_by_device") or {})
    for dev, types in (e.get("op_types_by_device") or {}).items():
        for t, n in types.items():
            v.eager_ops[(t, dev)] += n
        if len(types) >= 25:
            v.eager_top.add(dev)
    v.copies = {(c["from"], c["to"]): (c["count"], c["bytes"]) for c in e.get("copies") or []}
    return v


# ---- comparison ------------------------------------------------------------------------------
@dataclass
class Result:
    program: str
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # kind, name, pinpoint, tensorflow
    counts: Counter = field(default_factory=Counter)  # what was compared
    notes: list[str] = field(default_factory=list)  # what the oracle could not read (not differences)
    uncaptured: list[str] = field(default_factory=list)  # functions neither side saw the graphs of
    seconds: float = 0.0
    training: str | None = None
    input_ops: Counter = field(default_factory=Counter)  # the oracle's: (op type, device) -> n

    @property
    def differences(self) -> list:
        return self.rows

    def add(self, kind: str, name: str, pinpoint, tensorflow) -> None:
        self.rows.append((kind, name, _fmt(pinpoint), _fmt(tensorflow)))


def _fmt(x) -> str:
    if x is None:
        return "(absent)"
    if isinstance(x, (list, tuple)):
        return ", ".join(_fmt(i) for i in x) if x else "[]"
    return str(x)


def _pair_functions(pp: list[dict], tf: list[dict]) -> list[tuple[dict | None, dict | None]]:
    """Functions paired by name, then by the order they were traced (a retrace is a new one)."""
    def key(f):
        m = re.search(r"_(\d+)$", f["concrete"])
        return int(m.group(1)) if m else 0

    by_pp, by_tf = defaultdict(list), defaultdict(list)
    for f in pp:
        by_pp[f["name"]].append(f)
    for f in tf:
        by_tf[f["name"]].append(f)
    out = []
    for name in sorted(set(by_pp) | set(by_tf)):
        a, b = sorted(by_pp[name], key=key), sorted(by_tf[name], key=key)
        for i in range(max(len(a), len(b))):
            out.append((a[i] if i < len(a) else None, b[i] if i < len(b) else None))
    return out


def _by_device(ops: Counter) -> dict:
    out: Counter = Counter()
    for (_, dev), n in ops.items():
        out[dev] += n
    return dict(sorted(out.items()))


def _transfer_totals(transfers: Counter) -> tuple[int, int]:
    return sum(transfers.values()), sum((b or 0) * n for (_, _, _, b), n in transfers.items())


def compare(program: str, pp: View, tf: View, training: str | None) -> Result:
    r = Result(program)
    for err in pp.sizing_errors:  # a shape inference that failed sizes nothing after it: always a difference
        r.add("sizing error", "-", err, "(TensorFlow ran it)")
    if pp.training != training:
        r.add("training function", "-", pp.training, training)
    for a, b in _pair_functions(pp.functions, tf.functions):
        name = (a or b)["name"]
        r.counts["functions"] += 1
        if a is None or b is None:
            r.add("function", name, a and a["concrete"], b and b["concrete"])
            continue
        if a["calls"] != b["calls"]:
            r.add("function calls", name, a["calls"], b["calls"])
        if not a["captured"] or b["ops"] is None:
            if a["captured"] != (b["ops"] is not None):
                r.add("function", name, "captured" if a["captured"] else "not captured",
                      "captured" if b["ops"] is not None else "not captured")
            else:
                r.uncaptured.append(name)  # run by another thread's or task's runtime: calls compared only
            continue
        tf_dev = _by_device(b["ops"])
        if a["ops_by_device"] != tf_dev:
            r.add("function ops by device", name, a["ops_by_device"], tf_dev)
        count, nbytes = _transfer_totals(b["transfers"])
        if (a["transfers_per_call"], a["transfer_bytes_per_call"]) != (count, nbytes):
            r.add("function transfers", name, f"{a['transfers_per_call']} / {a['transfer_bytes_per_call']} B",
                  f"{count} / {nbytes} B")
        if "ops" in a:
            _compare_ops(r, a["ops"], b["ops"])
            _compare_transfers(r, a["transfers"], b["transfers"])
    _compare_variables(r, pp.variables, tf.variables)
    _compare_eager(r, pp, tf)
    return r


def _multimap(counter: Counter, width: int) -> dict:
    """(name, *values) -> n  as  name -> sorted list of values (one per occurrence)."""
    out = defaultdict(list)
    for k, n in counter.items():
        out[k[0]] += [k[1:] if width > 1 else k[1]] * n
    return {k: sorted(v, key=str) for k, v in out.items()}


def _compare_ops(r: Result, pp: Counter, tf: Counter) -> None:
    a, b = _multimap(pp, 1), _multimap(tf, 1)
    for name in sorted(set(a) | set(b)):
        r.counts["ops"] += 1
        if a.get(name) != b.get(name):
            r.add("op", name, a.get(name), b.get(name))


def _compare_transfers(r: Result, pp: Counter, tf: Counter) -> None:
    a, b = _multimap(pp, 3), _multimap(tf, 3)
    for name in sorted(set(a) | set(b)):
        r.counts["transfers"] += 1
        r.counts["bytes"] += sum(x[2] or 0 for x in b.get(name, []))
        if a.get(name) != b.get(name):
            def show(items):
                return None if items is None else [f"{s}->{d} {'?' if n is None else n} B" for s, d, n in items]
            r.add("transfer", name, show(a.get(name)), show(b.get(name)))


def _compare_variables(r: Result, pp: list, tf: list) -> None:
    a, b = defaultdict(list), defaultdict(list)
    for name, devs in pp:
        a[name].append(devs)
    for name, devs in tf:
        b[name].append(devs)
    for name in sorted(set(a) | set(b)):
        r.counts["variables"] += 1
        if sorted(a.get(name, [])) != sorted(b.get(name, [])):
            r.add("variable", name, sorted(a[name]) if name in a else None, sorted(b[name]) if name in b else None)


def _compare_eager(r: Result, pp: View, tf: View) -> None:
    tf_by_dev = dict(sorted(tf.eager_by_device.items()))
    pp_by_dev = dict(sorted(pp.eager_by_device.items()))
    if pp_by_dev != tf_by_dev:
        r.add("eager ops by device", "-", pp_by_dev, tf_by_dev)
    for key in sorted(set(pp.eager_ops) | set(tf.eager_ops)):
        op, dev = key
        if dev in pp.eager_top and key not in pp.eager_ops:
            continue  # beyond the 25 op types Pinpoint lists per device: in the device's total above
        r.counts["eager op types"] += 1
        if pp.eager_ops.get(key) != tf.eager_ops.get(key):
            r.add("eager op", f"{op} on {dev}", pp.eager_ops.get(key), tf.eager_ops.get(key))
    for key in sorted(set(pp.copies) | set(tf.copies)):
        r.counts["eager copies"] += 1
        r.counts["bytes"] += (tf.copies.get(key) or (0, 0))[1]
        if pp.copies.get(key) != tf.copies.get(key):
            def show(c):
                return None if c is None else f"{c[0]} x, {c[1]} B"
            r.add("eager copy", f"{key[0]}->{key[1]}", show(pp.copies.get(key)), show(tf.copies.get(key)))


# ---- running ---------------------------------------------------------------------------------
# TensorFlow processes of this suite running at once, over every thread that runs programs (a
# program's three runs and the corpus' parallel workers share them); DIFFERENTIAL_PROCESSES caps it.
_SLOTS = threading.BoundedSemaphore(int(os.environ.get("DIFFERENTIAL_PROCESSES", "64")))


def _run_processes(cmds: dict[str, list[str]], work: Path, env: dict, mode: str = "w") -> dict[str, int | None]:
    """Each command in a process of its own, as many at once as there are free slots; each waited
    for (or killed at its timeout: TIMEOUT a run, `tests/oracle.py both` makes two) before this
    returns: the exit statuses, None for a timeout."""
    codes: dict[str, int | None] = {}

    def one(k: str) -> None:
        with _SLOTS:
            p = _start(cmds[k], work, env, work / f"{k}.log", mode)
            try:
                codes[k] = p.wait(timeout=_timeout(cmds[k]))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[k] = None

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in cmds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def _start(cmd: list[str], work: Path, env: dict, log: Path, mode: str):
    """A run of `cmd`, its stderr into `log`. The oracle's runs and `pinpoint trace`'s are forked
    from a process that has imported TensorFlow (tests/zygote.py): the process each would be, but
    for its start-up. A program that connects to a cluster runs in processes of their own
    (ORACLE_DEFAULT_DEVICE=0: its context connects and reconnects), and so does every run with
    TEST_ZYGOTE=0."""
    from tests import zygote

    if env.get("ORACLE_DEFAULT_DEVICE") == "1" and zygote.enabled():
        if cmd[1:2] == [str(ORACLE)]:
            return zygote.Zygote.get(cmd[0], env, zygote.TENSORFLOW).spawn(cmd, work, env, log, mode)
        if Path(cmd[0]).name == "pinpoint":  # its console script, run as `python SCRIPT ARGS...`
            return zygote.Zygote.get(sys.executable, env, zygote.PINPOINT).spawn([sys.executable, *cmd], work,
                                                                                    env, log, mode)
    with open(log, mode) as f:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=work, env=env)


def _timeout(cmd: list[str]) -> int:
    return 2 * TIMEOUT if cmd[2:3] == ["both"] else TIMEOUT  # [python, oracle.py, mode, ...]


def run_program(name: str, work: Path, *, path: Path | None = None, training: str | None = None,
                cluster: bool | None = None) -> Result:
    """Both sides of one program (two processes at once, slots permitting: Pinpoint's and the
    oracle's; three for a program that connects to a cluster), compared.

    `name` is a program in tests/programs/ (its training function from TRAINING), or with `path`
    any program file (a generated one: tests/corpus.py) with its `training` function and whether
    it connects to a `cluster` (NO_DEFAULT_DEVICE, REMOTE_TRAINING)."""
    if path is None:
        program, training, cluster = PROGRAMS / f"{name}.py", TRAINING[name], name in NO_DEFAULT_DEVICE
    else:
        program = Path(path)
    work.mkdir(parents=True, exist_ok=True)
    # PYTHONFAULTHANDLER: a crashed run's log shows every thread's Python stack (tfdbg, below).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", PYTHONHASHSEED="0", PYTHONFAULTHANDLER="1",
               ORACLE_DEFAULT_DEVICE="0" if cluster else "1")
    env.pop("MLFLOW_TRACKING_URI", None)
    bin_dir = Path(sys.executable).parent
    oracle = [sys.executable, str(ORACLE)]
    shapes = [*oracle, "shapes", str(program), str(work / "shapes.json")]
    cmds = {"pinpoint": [str(bin_dir / "pinpoint"), "trace", "--gpus", "2", "--no-tracking", "--out",
                         str(work / "pinpoint"), str(program)]}
    if cluster:  # a second in-process cluster in one process would reconnect its context
        cmds |= {"placement": [*oracle, "placement", str(program), str(work / "oracle.json")], "shapes": shapes}
    else:  # one TensorFlow start-up for the oracle's two runs (tests/oracle.py, both)
        cmds["oracle"] = [*oracle, "both", str(program), str(work / "oracle.json"), str(work / "shapes.json")]
    t0 = time.monotonic()
    # Every run is waited for (or killed) before any failure is raised: none outlives the test.
    codes = _run_processes(cmds, work, env)
    late = [k for k, c in codes.items() if c is None]
    if late:
        took = ", ".join(f"the {k} run more than {_timeout(cmds[k])}s" for k in late)
        raise RuntimeError(f"{name}: {took}; see {work}")
    last = "oracle" if "oracle" in codes else "shapes"  # the run that writes shapes.json
    attempts = [f"{cmds[last][2]} {codes[last]}"]  # each run of `last`: its mode and exit status
    reading = False  # whether the last attempt read a finished dump (any failure of it: try again)
    for _ in range(SHAPES_RETRIES):
        if codes[last] is None or codes[last] == 0 or (codes[last] > 0 and not reading):
            break
        # tfdbg under TensorFlow 2.21 now and then crashes a distributed program (a segfault in
        # its writer threads, more often on a loaded machine): the shapes run is made again. A
        # crash after the program ran is the reading's (tests/oracle.py, read_shapes): a fresh
        # process reads the finished dump. The placement run's file is whole or absent: absent,
        # both runs are made again.
        dump = work / ("shapes.json" + ORACLE_DUMP)
        again, mode = (shapes, "a") if (work / "oracle.json").exists() else (cmds[last], "w")
        reading = dump.exists()  # written whole by a run that finished the program (tests/oracle.py)
        if reading:
            again = [*oracle, "read", dump.read_text(), str(work / "shapes.json")]
            dump.unlink()
        # Appended to the log after a whole placement run; a new one replaces a crashed one's.
        codes.update(_run_processes({last: again}, work, env, mode=mode))
        attempts.append(f"{again[2]} {codes[last]}")
        if codes[last] is None:
            raise RuntimeError(f"{name}: the shapes run took more than {_timeout(again)}s; see {work}")
    for k, code in codes.items():
        if code != 0:
            log = (work / f"{k}.log").read_text()
            errors = [line for line in log.splitlines() if re.match(r"^[\w.]+(Error|Exception): ", line)]
            first = errors[-1] if errors else f"exit status {code}"
            runs = f" (its runs, mode and exit status: {', '.join(attempts)})" if k == last else ""
            raise RuntimeError(f"{name}: the {k} run failed with {first}{runs}\n{log[-3000:]}")
    result = compare_saved(name, work, training)
    result.seconds = time.monotonic() - t0
    return result


def _placement_log(work: Path) -> Path:
    """The placement run's stderr: its own process's, or the one it shares with the shapes run."""
    return work / "placement.log" if (work / "placement.log").exists() else work / "oracle.log"


def compare_saved(name: str, work: Path, training: str | None) -> Result:
    """The comparison of one program's runs from what they wrote into `work` (no run)."""
    from pinpoint.placement.model.files import read_placement

    pp = pinpoint_view(read_placement(work / "pinpoint"))
    tf = oracle_view(json.loads((work / "oracle.json").read_text()), json.loads((work / "shapes.json").read_text()),
                     _placement_log(work).read_text())
    result = compare(name, pp, tf, training)
    result.training = training
    result.notes = list(tf.notes)
    result.input_ops = tf.input_ops
    result.counts["transfers TF could not size"] = sum(1 for n in tf.notes if "no runtime shape" in n)
    return result


def table(result: Result) -> str:
    """The rows as a text table: program, kind, name, pinpoint, tensorflow (then the oracle's notes)."""
    head = ("program", "kind", "name", "pinpoint", "tensorflow")
    rows = [head] + [(result.program, *row) for row in result.rows]
    rows += [(result.program, "oracle note", n, "", "") for n in result.notes]
    widths = [min(60, max(len(str(r[i])) for r in rows)) for i in range(len(head))]
    return "\n".join(" | ".join(str(c)[:60].ljust(w) for c, w in zip(r, widths)) for r in rows)


def docs_table(results: list[Result], failed: dict[str, str], seconds: float) -> str:
    lines = [BEGIN, "",
             "| program | training function | functions | ops | variables | transfers | bytes compared "
             "| transfers TF could not size | eager op types | differences | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    total: Counter = Counter()
    for r in results:
        c = r.counts
        total.update(c)
        total["differences"] += len(r.differences)
        lines.append(f"| `{r.program}` | {TRAINING[r.program] or '(eager only)'} | {c['functions']} | {c['ops']} "
                     f"| {c['variables']} | {c['transfers']} | {c['bytes']} | {c['transfers TF could not size']} "
                     f"| {c['eager op types']} | {len(r.differences)} | {r.seconds:.0f} |")
    for name, why in sorted(failed.items()):
        lines.append(f"| `{name}` | {TRAINING[name]} | did not run: {why} | | | | | | | | |")
    lines += ["", f"{len(results)} programs compared ({len(failed)} did not run): {total['ops']} ops, "
              f"{total['variables']} variables, {total['transfers']} transfers ({total['bytes']} bytes), "
              f"{total['eager op types']} eager op types; {total['differences']} differences; "
              f"{seconds:.0f} s in all.", "", END]
    return "\n".join(lines)


def write_docs(results: list[Result], failed: dict[str, str], seconds: float) -> None:
    text = DOC.read_text()
    block = docs_table(results, failed, seconds)
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        raise SystemExit(f"{DOC} has no differential table markers")
    DOC.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the table in docs/trace.md")
    ap.add_argument("--work", help="keep the runs in this folder (default: a temporary one)")
    ap.add_argument("programs", nargs="*", default=sorted(TRAINING))
    args = ap.parse_args(argv)
    results, failed = [], {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="differential-") as tmp:
        for name in args.programs:
            try:
                r = run_program(name, Path(args.work or tmp) / name)
            except RuntimeError as e:
                print(f"{name}: FAILED TO RUN: {e}", flush=True)
                failed[name] = str(e).splitlines()[0].split(": ", 1)[1]
                continue
            print(table(r) if r.rows or r.notes else f"{name}: no differences", flush=True)
            print(f"{name}: {dict(r.counts)} in {r.seconds:.0f}s", flush=True)
            results.append(r)
    seconds = time.monotonic() - t0
    print(f"{len(results)} programs compared, {len(failed)} did not run, in {seconds:.0f}s", flush=True)
    if args.write:
        write_docs(results, failed, seconds)
    return 0 if not failed and all(not r.differences for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
