"""The differential suite's oracle: a program run as plain TensorFlow, with what TensorFlow itself
says about where things ran. No Pinpoint module is imported here (the oracle must not share the
code it checks).

    python tests/oracle.py placement PROGRAM.py OUT.json   # devices, functions, variables, eager ops
    python tests/oracle.py shapes PROGRAM.py OUT.json      # the shape every graph op produced
    python tests/oracle.py both PROGRAM.py OUT.json SHAPES.json  # placement, then shapes, in one process
    python tests/oracle.py read DUMP_DIR OUT.json          # the same, from a finished shapes run's dump

Devices: the process gets 3 logical CPUs (/CPU:0 the host, /CPU:1 for /GPU:0, /CPU:2 for /GPU:1).
The program's text is rewritten before it runs: every '/GPU:i' literal becomes '/CPU:i+1' and
`MirroredStrategy()` gets the two stand-in devices and TensorFlow's own default cross-device ops
for them (on CPU devices that is the ring collective: the exchange a GPU machine does with NCCL).
A source rewrite, not a device function: TensorFlow's device functions act in
graph mode only, and a strategy's device list must be concrete strings. The body runs under
`tf.device('/CPU:1')`, where a GPU machine puts the ops nobody asked for a device for.

What is read, each from TensorFlow:
- tf.functions: graph collection (`context.enable_graph_collection`) is on for the whole run; the
  run metadata is exported at every eager op, so the partition graphs exported at a function's
  first call are the ones its first call instantiated. The call's inputs give its arguments' shapes.
- eager ops: `tf.debugging.set_log_device_placement(True)`: TensorFlow logs "Executing op X in
  device Y" for every eager op (read from stderr by the test); an op callback records the inputs
  the runtime had to copy to the op's device (input device != the op's outputs' device; for an op
  with no outputs, its resource's device, else the device it was asked for: SaveV2's).
- variables: a `tf.variable_creator_scope` around the program records every variable it creates
  through `tf.Variable` (Keras', the optimizer's and the program's own). After the run, the
  distributed and Keras wrappers holding them are found among the live objects, and each
  component's `.device` is read. TensorFlow's own variables (tf.distribute's collective-ordering
  tokens, constructed directly, past the creator scope) are every other live plain variable. The
  scope holds what it recorded, so a variable the program dropped is still read; a dropped
  distributed variable's components (no wrapper left) are joined under its name by the strategy's
  '<name>/replica_<i>' naming.
- shapes (a second run, since tfdbg instruments the graphs): tfdbg v2 in SHAPE mode
  (`tf.debugging.experimental.enable_dump_debug_info`) records the shape of the tensors ops inside
  a tf.function produced at run time; they size the transfers. Under `both`, only the ops whose
  outputs the placement run's transfers carried are instrumented (sent_tensors), and a program
  whose placement run moved nothing between devices has no second run.

`both` runs the program twice in one process (one TensorFlow start-up, not two): the placement
run, then the shapes run. Between them Keras' session is cleared, so that the second run names its
layers (and so its graphs' ops) as a fresh process would. A program that connects to a cluster
runs each in a process of its own: a second in-process cluster would reconnect the context.
tests/differential.py forks the others from a process that has imported TensorFlow
(tests/zygote.py), which is this file run as a fresh process would be, but for the import.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
import tempfile
import threading
from collections import Counter, defaultdict

HOST = "/CPU:0"
# The ops of a transfer between two partitions (tests/differential.py reads them too).
SENDS = frozenset({"_Send", "_HostSend"})
RECEIVES = frozenset({"_Recv", "_HostRecv"})
# Off for a program that connects to a cluster (a parameter-server coordinator): an eager device
# scope names its job, and TensorFlow rejects the old job's device once the context reconnects.
DEFAULT_DEVICE = os.environ.get("ORACLE_DEFAULT_DEVICE", "1") == "1"
GPUS = ("/CPU:1", "/CPU:2")  # /GPU:0, /GPU:1
_GPU_RE = re.compile(r"""(['"])/(?:device:)?[Gg][Pp][Uu]:(\d)""")
_MIRRORED_RE = re.compile(r"MirroredStrategy\(\)")


def rewrite(source: str) -> str:
    """The program as it runs on the logical devices."""
    source = _GPU_RE.sub(lambda m: f"{m.group(1)}/CPU:{int(m.group(2)) + 1}", source)
    return _MIRRORED_RE.sub(f"MirroredStrategy({list(GPUS)!r})", source)


def short(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> '/CPU:1'; another job keeps its task."""
    m = re.match(r"^(?:/job:([^/]+))?(?:/replica:\d+)?(?:/task:(\d+))?(?:/device:)?/?([A-Za-z_]+):(\d+)$", device or "")
    if not m:
        return device or ""
    job, task, kind, index = m.groups()
    local = f"/{kind.upper()}:{index}"
    if job in (None, "localhost"):
        return local
    return f"/job:{job}/task:{task or 0}{local}"


# Whether Keras' `jit_compile="auto"` decides as on a GPU machine: the placement run's, not the
# shapes run's (tfdbg has no kernel inside an XLA cluster). Read at each decision, so that `both`'s
# two runs each have their own.
_JIT = [True]


def _configure(tf, jit: bool = True) -> None:
    _JIT[0] = jit
    cpus = tf.config.list_physical_devices("CPU")
    if tf.config.get_logical_device_configuration(cpus[0]):  # `both`'s second run: configured by its first
        return
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(3)])
    _keras_decides_as_on_gpus(tf)


def _keras_decides_as_on_gpus(tf) -> None:
    """Keras 3 makes two choices by looking for a GPU: `compile(jit_compile="auto")` compiles a
    strategy-free `fit` with XLA when one exists, and LSTM/GRU take cuDNN (turning XLA off for the
    model). The oracle stands in for the GPU machine, so both are decided by Keras' own code with a
    GPU in view; cuDNN's kernels cannot run on CPUs, so its path answers as Keras' own does when
    cuDNN cannot run (NotImplementedError: the generic kernels, the layer's XLA choice kept).
    Without `_JIT` (the shapes run: tfdbg has no kernel inside an XLA cluster) every function runs
    op by op; its tensors are the same."""
    import importlib

    try:
        from keras.src import backend as keras_backend
        from keras.src.trainers import trainer

        # The module by its path: the package also exports a function named `rnn`.
        rnn = importlib.import_module("keras.src.backend.tensorflow.rnn")
    except ImportError:
        return  # a Keras without these choices
    resolve = trainer.Trainer._resolve_auto_jit_compile
    listing = tf.config.list_physical_devices

    def with_a_gpu(device_type=None):
        devices = listing(device_type)
        if device_type in (None, "GPU"):
            devices = [*devices, tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
        return devices

    def resolve_on_gpus(self):
        if not _JIT[0]:
            return resolve(self)
        tf.config.list_physical_devices = with_a_gpu
        try:
            return resolve(self)
        finally:
            tf.config.list_physical_devices = listing

    def no_cudnn(*args, **kwargs):
        raise NotImplementedError

    trainer.Trainer._resolve_auto_jit_compile = resolve_on_gpus
    rnn._is_gpu_available = lambda: True
    for name in ("lstm", "gru"):
        if hasattr(keras_backend, name):
            setattr(keras_backend, name, no_cudnn)


def _run_program(path: str, wrap, work: str) -> None:
    """Run the rewritten program as __main__ inside `wrap()` (a context manager)."""
    with open(path) as f:
        source = rewrite(f.read())
    # AutoGraph reads a tf.function's source back from its file: the rewritten text must be in a
    # file of its own, or AutoGraph would convert the original '/GPU:i' spelling.
    copy = os.path.join(tempfile.mkdtemp(prefix="program-", dir=work), os.path.basename(path))
    with open(copy, "w") as f:
        f.write(source)
    code = compile(source, copy, "exec")
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    scope = {"__name__": "__main__", "__file__": path}
    with wrap():
        exec(code, scope)  # noqa: S102 - running the program is the point
    return scope


def _shape(t):
    try:
        dims = t.shape.as_list() if t.shape.rank is not None else None
    except (AttributeError, ValueError):
        dims = None
    return [t.dtype.as_datatype_enum if getattr(t, "dtype", None) is not None else 0, dims]


# ---- placement -------------------------------------------------------------------------------
class Observer:
    """The op callback: function calls (and their first call's partition graphs), eager copies."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.functions: dict[str, dict] = {}
        self.order: list[str] = []
        self.copies: dict[tuple, dict] = {}
        self.eager = Counter()  # (op type, device) by the callback's rule (a check of the log)

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None:
            return None
        if isinstance(op_type, bytes):
            op_type = op_type.decode()
        md = self.ctx.export_run_metadata()  # what was instantiated since the previous eager op
        if op_type.startswith("__"):
            f = self.functions.get(op_type)
            if f is None:
                fgs = md.function_graphs if md is not None else []
                graphs = [[_nodes(g, self.ctx) for g in fg.partition_graphs] for fg in fgs]
                # The called function's arguments by name (its graph is the one with as many
                # _Arg nodes as the call has inputs): they size the transfers of an argument.
                args = {}
                for fg in fgs:
                    nodes = [n for n in fg.pre_optimization_graph.node if n.op == "_Arg"]
                    if len(nodes) == len(inputs):
                        args = {n.name: _shape(inputs[n.attr["index"].i]) for n in nodes}
                f = self.functions[op_type] = {"calls": 0, "partitions": graphs, "args": args}
                self.order.append(op_type)
            f["calls"] += 1
            return None
        device = ""
        for t in outputs or ():
            device = getattr(t, "device", "") or device
            if device:
                break
        if not device:
            for t in inputs or ():
                if getattr(getattr(t, "dtype", None), "name", "") == "resource" and t.device:
                    device = t.device
                    break
        if not device and inputs:
            # No output and no resource input (SaveV2 writing a checkpoint): the device it was
            # asked for, where the runtime ran it (the log says the same); its inputs were copied there.
            device = self.ctx.device_name or ""
        self.eager[(op_type, short(device))] += 1
        for t in inputs or ():
            src = getattr(t, "device", "")
            if not src or not device or short(src) == short(device):
                continue
            if getattr(t.dtype, "name", "") == "resource":
                continue  # a handle is not copied: the op runs where its resource is
            k = (short(src), short(device))
            c = self.copies.setdefault(k, {"count": 0, "bytes": 0})
            c["count"] += 1
            n = t.shape.num_elements()
            c["bytes"] += int(n * t.dtype.size) if n is not None and t.dtype.is_numpy_compatible else 0
        return None


def _nodes(graph, ctx) -> list[dict]:
    """A partition graph's nodes: name, op, device, inputs and the attrs a transfer needs; a call
    XLA compiles (`_XlaMustCompile`: the runtime launches it as one program on its device, not
    inlined) with the names of the ops of its function."""
    out = []
    for n in graph.node:
        row = {"name": n.name, "op": n.op, "device": short(n.device), "inputs": list(n.input)}
        if "_XlaMustCompile" in n.attr and n.attr["_XlaMustCompile"].b and "f" in n.attr:
            row["xla_ops"] = [nd.name for nd in ctx.get_function_def(n.attr["f"].func.name).node_def]
        if n.op in SENDS or n.op in RECEIVES:
            row["send_device"] = short(n.attr["send_device"].s.decode())
            row["recv_device"] = short(n.attr["recv_device"].s.decode())
            row["tensor_name"] = n.attr["tensor_name"].s.decode()
        if "T" in n.attr:
            row["T"] = n.attr["T"].type
        if n.op == "Const" and "value" in n.attr:
            t = n.attr["value"].tensor
            row["const"] = [t.dtype, [d.size for d in t.tensor_shape.dim]]
        out.append(row)
    return out


def _variables(created: list) -> list[dict]:
    """Every variable the program created, by its outermost wrapper: name and component devices."""
    import tensorflow as tf
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    try:
        from keras.src.backend.common.variables import Variable as KerasVariable
    except ImportError:
        KerasVariable = ()
    ids = {id(v): v for v in created}
    owner: dict[int, object] = {}  # component id -> distributed wrapper
    keras_of: dict[int, object] = {}  # tf variable (or wrapper) id -> Keras variable
    gc.collect()
    for obj in gc.get_objects():
        if KerasVariable and isinstance(obj, KerasVariable):
            value = getattr(obj, "_value", None)
            if value is not None:
                keras_of[id(value)] = obj
        elif isinstance(obj, tf.Variable) and id(obj) not in ids:
            parts = getattr(obj, "values", None) or ((obj._v,) if hasattr(obj, "_v") else ())
            for c in parts:
                if id(c) in ids:
                    owner[id(c)] = obj
    # TensorFlow's own variables (a strategy's collective-ordering tokens, one per device) are
    # made by constructing ResourceVariable directly, past the creator scope: every other live
    # plain variable, one entry each.
    inner = set(ids) | {id(c) for w in gc.get_objects() if isinstance(w, tf.Variable) and id(w) not in ids
                        for c in (getattr(w, "values", None) or ((w._v,) if hasattr(w, "_v") else ()))}
    others = [o for o in gc.get_objects() if isinstance(o, BaseResourceVariable) and id(o) not in inner
              and not hasattr(o, "values") and not hasattr(o, "_v")]
    out, seen = [], set()
    for v in others:
        out.append({"name": v.name.removesuffix(":0"), "devices": [short(v.device)], "type": "internal"})
    for v in created:
        outer = owner.get(id(v), v)
        if id(outer) in seen:
            continue
        seen.add(id(outer))
        comps = [c for c in created if owner.get(id(c), c) is outer]
        kv = keras_of.get(id(outer))
        name = getattr(kv, "path", kv.name) if kv is not None else outer.name.removesuffix(":0")
        out.append({"name": name, "devices": [short(c.device) for c in comps], "type": type(outer).__name__})
    return _orphans_under_their_name(out)


_REPLICA = re.compile(r"^(.*)/replica_\d+$")


def _orphans_under_their_name(rows: list[dict]) -> list[dict]:
    """A distributed variable the program dropped leaves its components (this scope holds them)
    and no wrapper: the strategy names them '<name>' and '<name>/replica_<i>', so a component
    named so whose '<name>' is a plain component too joins it."""
    plain = {r["name"]: r for r in rows if r["type"] == "ResourceVariable"}
    out = []
    for r in rows:
        m = _REPLICA.match(r["name"])
        base = plain.get(m.group(1)) if m and r["type"] == "ResourceVariable" else None
        if base is None:
            out.append(r)
        else:
            base["devices"] = base["devices"] + r["devices"]
    return out


def placement(program: str, out: str) -> None:
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.framework import op_callbacks

    _configure(tf)
    ctx = context.context()
    created: list = []

    def creator(next_creator, **kwargs):
        v = next_creator(**kwargs)
        created.append(v)
        return v

    obs = Observer(ctx)

    class Wrap:
        def __enter__(self):
            tf.debugging.set_log_device_placement(True)
            ctx.enable_graph_collection()
            ctx.enable_run_metadata()
            ctx.export_run_metadata()
            op_callbacks.add_op_callback(obs)
            self.scopes = [tf.variable_creator_scope(creator)]
            if DEFAULT_DEVICE:
                self.scopes.insert(0, tf.device(GPUS[0]))
            for s in self.scopes:
                s.__enter__()
            # The main thread's id, as TensorFlow's log lines name the thread that logged them.
            print(f"ORACLE-BEGIN {threading.get_native_id()}", file=sys.stderr, flush=True)

        def __exit__(self, *exc):
            print("ORACLE-END", file=sys.stderr, flush=True)
            for s in reversed(self.scopes):
                s.__exit__(None, None, None)
            op_callbacks.remove_op_callback(obs)
            ctx.disable_run_metadata()
            ctx.disable_graph_collection()
            tf.debugging.set_log_device_placement(False)

    scope = _run_program(program, Wrap, os.path.dirname(os.path.abspath(out)))
    result = {
        "functions": [dict(obs.functions[n], name=n) for n in obs.order],
        "variables": _variables(created),
        "copies": [{"from": s, "to": d, **c} for (s, d), c in sorted(obs.copies.items())],
        "eager_callback": [[t, d, n] for (t, d), n in sorted(obs.eager.items())],
    }
    del scope
    # `both`'s shapes run may crash the process after this (tests/differential.py then runs the
    # shapes alone).
    _write_whole(out, json.dumps(result))


def _write_whole(path: str, text: str) -> None:
    """`text` into `path`, whole or not at all: this process may crash (tfdbg) at any point, and
    tests/differential.py decides its next run by which files exist."""
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def both(program: str, out: str, shapes_out: str) -> None:
    """`placement` into `out`, then `shapes` into `shapes_out`, in this one process: the shapes of
    the tensors the placement run's transfers carried."""
    import keras

    placement(program, out)
    # The first run's layer names are taken: cleared, the second run's are a fresh process's.
    keras.backend.clear_session()
    gc.collect()
    with open(out) as f:
        sent = sent_tensors(json.load(f))
    if not sent:  # no transfer between devices: no shape sizes anything, and no second run is made
        _write_whole(shapes_out, json.dumps({SCOPES: []}))
        return
    shapes(program, shapes_out, sent)


# What hands a tensor on unchanged: a transfer's size is its input's (tests/differential.py).
_PASS_ON = {"Identity", "Switch", "RefSwitch", "Merge"}


def sent_tensors(result: dict) -> set[str]:
    """The ops whose outputs the placement run's cross-device transfers carried, followed back
    through the ops that hand a tensor on (Identity, a cond's Switch and Merge, a receive's sender):
    every op tests/differential.py may size a transfer from."""
    found: set[str] = set()
    for f in result["functions"]:
        for parts in f["partitions"]:
            nodes = {n["name"]: n for graph in parts for n in graph}
            senders = {n["tensor_name"]: n for graph in parts for n in graph if n["op"] in SENDS}
            todo = [n["inputs"][0] for graph in parts for n in graph
                    if n["op"] in SENDS and n["send_device"] != n["recv_device"] and n["inputs"]]
            while todo:
                name = todo.pop().lstrip("^").split(":")[0]
                if name in found:
                    continue
                found.add(name)
                src = nodes.get(name)
                if src is None:
                    continue
                if src["op"] in _PASS_ON:
                    todo += [i for i in src["inputs"] if not i.startswith("^")]
                elif src["op"] in RECEIVES and src.get("tensor_name") in senders:
                    todo += senders[src["tensor_name"]]["inputs"][:1]
    return found


# ---- shapes ----------------------------------------------------------------------------------
# A cond's branch function is named '<its name scope, '/' as '_'>_{true,false}_<uid>' (cond_v2).
_BRANCH_GRAPH = re.compile(r"^(.+)_(true|false)_\d+$")
BRANCH = "::"  # the separator of a branch op's key: ::<scope>::<then|else>::<op>:<slot>
SCOPES = "::scopes"  # the key of every branch function's scope, whether it ran or not


def _graphs(reader):
    """Every graph tfdbg saw, from the outermost down."""
    graphs = list(reader.outermost_graphs())
    while graphs:
        g = graphs.pop()
        yield g
        graphs.extend(reader.graph_by_id(i) for i in g.inner_graph_ids)


def _scope(reader, graph_id, scope: str) -> str:
    """A branch function's scope and its call depth, '<scope>@<n>': the function graphs (called
    functions, loop bodies) between it and the traced function that runs it. Two conds named
    alike, one in the traced function and one in a function it calls, are then two scopes."""
    functions, g = 0, reader.graph_by_id(graph_id)
    while g.outer_graph_id:
        g = reader.graph_by_id(g.outer_graph_id)
        functions += bool(g.name) and not _BRANCH_GRAPH.match(g.name)  # the eager context has no name
    return f"{scope}@{max(functions - 1, 0)}"


def _graph_name(reader, graph_id) -> str:
    try:
        return reader.graph_by_id(graph_id).name or ""
    except KeyError:
        return ""


def shapes(program: str, out: str, sent: set[str] | None = None) -> None:
    """The shape every op inside a tf.function produced at run time, into `out`; with `sent`
    (sent_tensors: `both`), only the ops those names end like, and one op of each cond branch that
    ran (which branches ran is what sizes a branch's inputs)."""
    import tensorflow as tf

    _configure(tf, jit=False)
    root = tempfile.mkdtemp(prefix="tfdbg-", dir=os.path.dirname(os.path.abspath(out)))

    @contextlib.contextmanager
    def wrap():
        tf.debugging.experimental.enable_dump_debug_info(root, tensor_debug_mode="SHAPE", circular_buffer_size=-1)
        with tf.device(GPUS[0]) if DEFAULT_DEVICE else contextlib.nullcontext():
            yield
        tf.debugging.experimental.disable_dump_debug_info()

    if sent is not None:
        plain = wrap

        @contextlib.contextmanager
        def wrap():
            with _instrumenting_only(sent), plain():
                yield

    _run_program(program, wrap, os.path.dirname(os.path.abspath(out)))
    # The dump is complete (the program ran, tfdbg's writer closed): once its path is written, a
    # crash is the reading's, and `read` in a fresh process reads the same dump
    # (tests/differential.py). Crashes while writing a plain file here (CI, TensorFlow 2.16, two
    # programs in one run) left it empty, and `read` was given ''.
    _write_whole(out + DUMP, root)
    read_shapes(root, out)


@contextlib.contextmanager
def _instrumenting_only(sent: set[str]):
    """tfdbg instruments only the ops named as a name in `sent` ends ('<call op>/<op>' is how the
    runtime names an inlined callee's op: tests/differential.py looks a transfer's source up by
    each such ending), and the first op of each cond branch function with an output SHAPE mode
    records; and it records no op's Python stack. A tensor's shape is the same whether the ops
    beside it are instrumented or not, and instrumenting every op costs most of the run (two debug
    ops a tensor, built with their stacks, then run at every step)."""
    from tensorflow.core.protobuf import debug_event_pb2
    from tensorflow.python.debug.lib import dumping_callback as dc

    endings = {"/".join(parts[i:]) for name in sent for parts in [name.split("/")] for i in range(len(parts))}
    marked: set = set()  # the branch functions with an instrumented op
    cls = dc._DumpingCallback
    instrument, stack = cls._instrument_symbolic_tensors, cls._process_stack_frames

    def recorded(t) -> bool:  # what SHAPE mode instruments (dumping_callback.py)
        return t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_bool

    def only_sent(self, tensors, op_type, op_name, context_id, tensor_ids):
        name = op_name.decode() if isinstance(op_name, bytes) else op_name
        branch = _BRANCH_GRAPH.match(getattr(tensors[0].graph, "name", "") or "") if tensors else None
        first = bool(branch) and context_id not in marked and any(recorded(t) for t in tensors)
        if first:
            marked.add(context_id)
        if name in endings or first:
            return instrument(self, tensors, op_type, op_name, context_id, tensor_ids)
        return None

    def no_stack(self):
        return debug_event_pb2.CodeLocation(host_name=self._hostname)

    cls._instrument_symbolic_tensors, cls._process_stack_frames = only_sent, no_stack
    try:
        yield
    finally:
        cls._instrument_symbolic_tensors, cls._process_stack_frames = instrument, stack


# Where `shapes` leaves the path of its finished tfdbg dump: next to its output.
DUMP = ".dump"


def read_shapes(root: str, out: str) -> None:
    """The runtime shapes in the tfdbg dump `root`, into `out`. Reading it in the process that ran
    a MirroredStrategy program crashes (SIGSEGV inside protobuf, in DebugDataReader's
    graph_execution_traces or _load_graphs) for some programs on every attempt (measured:
    cnn-dfn-mirrored-f32 on TensorFlow 2.21, rnn-dfn-mirrored-f32 on 2.16); the same dump read
    in a fresh process reads whole."""
    from tensorflow.python.debug.lib import debug_events_reader

    found: dict[str, set] = defaultdict(set)
    with debug_events_reader.DebugDataReader(root) as reader:
        reader.update()
        for t in reader.graph_execution_traces():
            v = reader.graph_execution_trace_to_tensor_value(t)
            # SHAPE mode: [tensor id, dtype enum, rank, element count, dims (up to 6, padded)].
            rank = int(v[2])
            if rank > 6:
                continue
            shape = (int(v[1]), tuple(int(d) for d in v[4:4 + rank]))
            branch = _BRANCH_GRAPH.match(_graph_name(reader, t.graph_id))
            if branch:
                # An op of a cond's branch function: its name is the branch's own, and the other
                # branch may have one alike; kept under the cond and the branch, so a lowered
                # '<cond>/then/_k/<op>' finds it only when that branch ran.
                scope = _scope(reader, t.graph_id, branch.group(1))
                role = {"true": "then", "false": "else"}[branch.group(2)]
                found[f"{BRANCH}{scope}{BRANCH}{role}{BRANCH}{t.op_name}:{t.output_slot}"].add(shape)
            else:
                found[f"{t.op_name}:{t.output_slot}"].add(shape)
        # Every branch function traced, run or not: a cond is matched to the longest scope that
        # names it, so a nested cond is not taken for an outer one its name ends like.
        scopes = {_scope(reader, g.graph_id, _BRANCH_GRAPH.match(g.name).group(1)) for g in _graphs(reader)
                  if _BRANCH_GRAPH.match(g.name or "")}
    result = {k: sorted([d, list(s)] for d, s in v) for k, v in found.items()}
    result[SCOPES] = sorted(scopes)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]  # read: the dump's folder instead of a program
    {"placement": placement, "shapes": shapes, "both": both, "read": read_shapes}[mode](*args)
    # Everything is written: TensorFlow 2.21 can crash tearing down a distributed program that
    # ran under tfdbg (a segfault at interpreter exit, after the results are out).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
