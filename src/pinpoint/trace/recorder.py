"""Record what an unchanged program executed: its tf.functions, eager ops and Session.run calls.

- tf.functions: `AtomicFunction.call_flat` is wrapped. The first eager call of each function
  (each concrete function, so a retrace is a new one) runs with graph collection on, which the
  runtime does when it instantiates the function anyway: its partition graphs are recorded once,
  and later calls pay one counter increment.
- eager ops: an op callback (TensorFlow's own hook, as tf.debugging's numeric checks use) sees
  every eager op with its inputs and outputs: the device it ran on (its outputs' device; an op
  without outputs that takes a variable runs on the variable's device) and every input that
  had to be copied there, with its bytes. TensorFlow's callback mechanism alone costs an eager
  op more than the microsecond counting it may cost (issue 34), so once the program's eager ops
  (and tf.function calls) have produced no new signature -- (op type, device) pair, copy
  (source, destination), request not met, or updated variable -- for `quiet_ops` callbacks in a
  row, the callback is switched off: later eager ops run on TensorFlow's fast path. It is
  switched on again for a sampling window (which ends the same way) at the first call of each
  new tf.function (a new phase: evaluation, prediction) and when 1, 2, 4 ... 16 s have passed
  (looked at on the program's own thread: at its tf.function calls, `pinpoint.log` calls and
  Keras batch logs), so a signature that first appears later (an eager fallback in
  a late phase) is still found when it recurs. Every op up to `EagerRecord.stopped` is counted;
  after that the counts are those of the windows, and the report says so.
- tf.compat.v1 sessions: the first `Session.run` of each fetch/feed signature asks the runtime
  for its partition graphs (RunOptions.output_partition_graphs).

The variables behind the captured functions are found once per capture (a scan of the live
objects for the variables whose handles the function was called with) and kept alive until the
program ends, so the report can show them and compare their mirrored copies.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from pinpoint.placement.capture import (
    GET_NEXT,
    CapturedGraphs,
    add_branch_shapes,
    add_function_graphs,
    branch_shapes,
    has_dynamic_dims,
    map_arg_values,
    run_profiled,
    size_from_inference,
    size_iterator_outputs,
)
from pinpoint.placement.memory import enabled as memory_enabled
from pinpoint.tfcompat.api import (
    current_device,
    eager_state,
    eager_tensor_type,
    executing_eagerly,
    keras_variable_class,
    keras_wrapped,
    set_op_device,
)
from pinpoint.tfcompat.graphs import called_graphs, collect_graphs, output_shapes
from pinpoint.tfcompat.patches import Patches

_SUFFIX_RE = re.compile(r"^__(inference|forward|backward)_(.*?)(_\d+)?$")
_UPDATE_RE = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|ResourceSparseApply\w+|ResourceScatter\w+)$")
_PLATFORM_VARIABLES = {"save_counter:0", "save_counter"}
# Eager ops that hand out an iterator's element (a `for x in dist_dataset` loop's next()).
_INPUT_OPS = {"IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "MultiDeviceIteratorGetNextFromShard"}
MAX_INPUT_ELEMENTS = 64  # the latest eager input tensors remembered (weakly) to recognise a step's arguments
MAX_EAGER_KINDS = 5000  # distinct (op type, device) and copy keys kept: a bound on memory, not on counts
# Op callbacks in a row that bring no new eager signature, after which the callback is switched off.
EAGER_QUIET_OPS = 1000
# The first wait before a sampling window, doubled after each up to the last: a window of
# EAGER_QUIET_OPS slow-path ops (~5 ms) every 16 s costs a program well under 0.1%.
EAGER_RESAMPLE_S = (1.0, 16.0)
# A known tf.function's calls between two looks at the clock (is a sampling window due?).
WINDOW_CHECK_CALLS = 64


def python_name(concrete: str) -> str:
    """'__inference_one_step_on_iterator_1234' -> 'one_step_on_iterator'."""
    m = _SUFFIX_RE.match(concrete)
    return m.group(2) if m else concrete


# TensorFlow's wrapper around a function whose first call creates variables it cannot lift out.
_WRAPPERS = {"fn_with_cond"}
_KERAS_ROLES = {"fit": "train", "train_on_batch": "train", "evaluate": "evaluate", "test_on_batch": "evaluate",
                "predict": "predict", "predict_on_batch": "predict"}


def user_name(fn, concrete: str) -> str:
    """The program's name for a function: TensorFlow's `fn_with_cond` (the first call of a
    function that creates variables) is named after the user's function it wraps."""
    name = python_name(concrete)
    if name not in _WRAPPERS:
        return name
    try:
        library = called_graphs(fn.graph)
    except Exception:  # noqa: BLE001 - no Python graph
        return name
    for key in library:
        inner = python_name(key if isinstance(key, str) else key.decode())
        if inner != key and inner not in _WRAPPERS:
            return inner
    return name


def error_line(err: BaseException) -> str:
    """'<type>: <the line that says what went wrong>' (a graph execution error's cause is last)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if lines and lines[0].rstrip(":") == "Graph execution error":
        # The cause is the last line before the runtime's '[[{{node X}}]] [Op:...]' trailer.
        lines = [ln for ln in lines if not ln.startswith("[[")][-1:] or lines[-1:]
    text = lines[0] if lines else ""
    return f"{type(err).__name__}: {text[:200]}"


def keras_role(frame=None) -> str | None:
    """Which Keras method (fit, evaluate, predict) the call comes from: the innermost one on the
    stack (fit's validation runs evaluate)."""
    import sys

    f = frame or sys._getframe(1)
    while f is not None:
        code = f.f_code
        role = _KERAS_ROLES.get(code.co_name)
        if role and "/keras/src/" in code.co_filename.replace("\\", "/"):
            return role
        f = f.f_back
    return None


@dataclass
class FunctionRecord:
    """One concrete function (or one Session.run signature): its calls and what its first call ran."""

    name: str  # the concrete function's name ('__inference_f_22') or 'Session.run(...)'
    python_name: str
    calls: int = 0
    check_at: int = 0  # the call count at which the recorder next asks whether a window is due
    capture: CapturedGraphs | None = None
    kind: str = "tf.function"  # or "Session.run"
    # The Keras method its first call came from ("train", "evaluate", "predict"), else None.
    role: str | None = None
    # The exception its first call raised (type and first line), else None.
    error: str | None = None


@dataclass
class EagerRecord:
    """Eager ops per device, the copies between devices, and variable updates."""

    ops: Counter = field(default_factory=Counter)  # device -> ops
    op_types: dict = field(default_factory=lambda: defaultdict(Counter))  # device -> op type -> n
    copies: dict = field(default_factory=dict)  # (src, dst) -> {"count", "bytes", "ops": Counter}
    moved: dict = field(default_factory=dict)  # (op type, requested, ran) -> n: requests not met
    updates: dict = field(default_factory=lambda: defaultdict(set))  # handle id -> devices
    handles: dict = field(default_factory=dict)  # handle id -> the handle tensor (kept alive)
    attrs: dict = field(default_factory=dict)  # (device, op type) -> the first call's attrs
    total: int = 0
    # Eager ops counted when the op callback was first switched off (no new signature in `quiet`
    # callbacks in a row); None: every eager op of the program was counted.
    stopped: int | None = None
    quiet: int = 0
    windows: int = 0  # sampling windows since (a new tf.function, or 1, 2, 4 ... 16 s passed)


class Recorder:
    """Install with `install()`, read the records, `uninstall()` when the program ended."""

    def __init__(self, default_device: str = "", graph_placement=None, quiet_ops: int = EAGER_QUIET_OPS):
        # The emulated /GPU:0 scope the program runs in (its requests are not the program's).
        self.default_device = default_device
        # distribute.emulation.GpuPlacement under emulation: a tf.compat.v1 graph's unrequested
        # ops are placed as on a GPU machine before its first Session.run.
        self.graph_placement = graph_placement
        self._placed_graphs: set[int] = set()
        self.functions: dict[str, FunctionRecord] = {}
        self.eager = EagerRecord()
        self._variables: dict[int, Any] = {}  # id -> variable (Keras or tf), in discovery order
        self._index: dict[int, Any] = {}  # component handle id -> weakref to its outermost variable
        self._seen_handles: set[int] = set()
        self._resolved: set[int] = set()
        self._pending: dict[int, bool] = {}  # eager-updated handles not yet matched to a variable
        self._patches = Patches()
        self.active = False
        self._quiet = threading.local()  # set while Pinpoint itself runs eager ops on this thread
        self.quiet_ops = quiet_ops
        self._since_new = 0  # op callbacks since the last new eager signature
        self._callback = None  # tfcompat.patches.OpCallback
        self._next_window = float("inf")  # monotonic time the next sampling window is due
        self._delay: float | None = None  # the wait before it (doubled after each window)
        # id -> weak reference of the latest tensors an eager iterator op handed out: a step called with
        # them on a device other than the host read an element the iterator copied there.
        self._input_elements: dict[int, Any] = {}
        self._known: dict[int, FunctionRecord] = {}  # id(AtomicFunction) -> its record
        self._alive: list = []  # the functions in _known (kept alive: an id is not reused)

    # ---- install -----------------------------------------------------------------------------
    def install(self) -> Recorder:
        call_flat = Patches.current("AtomicFunction.call_flat")
        rec = self

        known = self._known

        known_get = known.get
        # The eager context's per-thread state (False on a thread while a tf.function traces).
        state = eager_state()
        eager_tensor = eager_tensor_type()
        # The function called last and its calls not yet added to its record: a program calls
        # its training function over and over, and one identity test and a counter in this
        # closure are all such a call pays. Issue 34: <= 2 µs a call; a dict lookup by id and
        # the eager context's pybind property each cost ~1 µs here on a real call (cold caches
        # after TensorFlow's ~200 µs of work), ~0.1 µs in a tight loop.
        last_fn = last_r = None
        pending = 0
        check_calls = WINDOW_CHECK_CALLS  # a closure cell: no module-global lookup per call

        def flush() -> None:
            nonlocal pending
            if last_r is not None and pending:
                last_r.calls += pending
                pending = 0

        def recorded_call_flat(fn, *args):
            nonlocal last_fn, last_r, pending
            # Called eagerly: its arguments are EagerTensors (symbolic while another function
            # traces a call to it, which is not a call that runs).
            if fn is last_fn and args and type(args[0]) is eager_tensor:
                pending += 1
                if pending >= check_calls:  # now and then: is a sampling window due?
                    flush()
                    rec.sample_if_due()
                return call_flat(fn, *args)
            r = known_get(id(fn))
            if r is not None and state.is_eager:
                flush()
                last_fn, last_r, pending = fn, r, 1
                if r.calls >= r.check_at:  # functions called in turn: the same check, by record
                    r.check_at = r.calls + check_calls
                    rec.sample_if_due()
                return call_flat(fn, *args)
            if not rec.active or not executing_eagerly(fn):
                return call_flat(fn, *args)
            name = fn.name.decode() if isinstance(fn.name, bytes) else str(fn.name)
            r = rec.functions.get(name)
            seen = r is not None
            if not seen:
                r = rec.functions[name] = FunctionRecord(name, user_name(fn, name), role=keras_role())
                rec._resample()  # a new function may start a new phase: its eager ops are sampled
            if seen or not memory_enabled():  # memory: the second call comes here too, to be measured
                rec._fast_path(known, fn, r)
            r.calls += 1
            if seen:
                return rec._seen_call(lambda: call_flat(fn, *args), r)
            if threading.current_thread() is not threading.main_thread():
                # e.g. a ClusterCoordinator's closures: graph collection is process-wide, and
                # those functions are instantiated by the remote workers' runtimes anyway.
                return call_flat(fn, *args)
            try:
                out, r.capture = rec._capture_first_call(lambda: call_flat(fn, *args), fn, args)
            except BaseException as err:
                r.error = error_line(err)
                raise
            return out

        self._patches.replace("AtomicFunction.call_flat", recorded_call_flat)
        self.flush_calls = flush
        run = Patches.current("BaseSession.run")

        def recorded_run(sess, fetches, feed_dict=None, options=None, run_metadata=None):
            if not rec.active or options is not None or run_metadata is not None:
                return run(sess, fetches, feed_dict, options, run_metadata)
            return rec._session_run(run, sess, fetches, feed_dict)

        self._patches.replace("BaseSession.run", recorded_run)
        self._callback = self._patches.op_callback(self._on_op)
        self.active = True
        return self

    def flush_calls(self) -> None:
        """Add the calls the tf.function wrapper still holds to their records (install sets it)."""

    def uninstall(self) -> None:
        """Undo what `install` did (also a part-way install), newest first."""
        self.active = False
        self.flush_calls()
        self._patches.close()

    @contextlib.contextmanager
    def quiet(self):
        """Eager ops Pinpoint runs itself on this thread (reading a Keras parameter) are not recorded."""
        before = getattr(self._quiet, "on", False)
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = before

    # ---- tf.function ---------------------------------------------------------------------------
    def _capture_first_call(self, call, fn, args) -> tuple[Any, CapturedGraphs]:
        cap = CapturedGraphs(step=0)
        # The traced shapes, before the call: they tell whether the profiler is needed.
        dynamic = _shapes(fn, cap)
        # A cond's branch that did not run sends nothing: which one ran is read off the profiled call.
        branches = branch_shapes(fn)
        with collect_graphs() as collected:
            if dynamic or branches or memory_enabled():
                # TensorFlow records no step stats for a tf.function call (dev_stats stays empty), so a
                # dynamic batch dimension is read off the bytes the iterator handed out (the profiler),
                # and what derives from it off TensorFlow's shape inference (size_from_inference).
                # The same profiled call holds the allocator's events when memory is measured.
                # Under emulation (graph_placement set) a listed GPU is a logical CPU: no GPU allocator.
                out, element_bytes, kernels, why = run_profiled(call, cap if memory_enabled() else None,
                                                                real_gpus=self.graph_placement is None)
            else:
                out, element_bytes, kernels, why = call(), None, None, None
        add_function_graphs(cap, collected.metadata, fn.name)
        add_branch_shapes(cap, branches)
        size_iterator_outputs(cap, element_bytes, why)
        size_from_inference(cap, element_bytes, kernels)
        map_arg_values(cap, list(args))  # the handles attribute the variable updates
        cap.input_arg_ids = {id(a) for a in args if (ref := self._input_elements.get(id(a))) is not None and ref() is a}
        self._find_variables({id(a) for a in args if _is_resource(a)})
        return out, cap

    def _fast_path(self, known: dict, fn, r: FunctionRecord) -> None:
        """Calls of fn take the fast path from now on."""
        known[id(fn)] = r
        self._alive.append(fn)  # its id stays its own while it is in `known`

    def _seen_call(self, call, r: FunctionRecord):
        """A later call on the slow path: with memory measured, the second call is the one measured."""
        if r.calls == 2 and r.capture is not None and memory_enabled():
            return self._measure_memory(call, r.capture)
        return call()

    def _measure_memory(self, call, cap: CapturedGraphs):
        """A function's second call under the profiler: its memory without what only a first call
        allocates (its constants, variables still sharing the buffer they were initialized from).
        The first call's measurement stays when the program calls the function once."""
        taken = CapturedGraphs(step=0)
        out, *_ = run_profiled(call, taken, real_gpus=self.graph_placement is None)
        if taken.memory_events:
            cap.memory_events, cap.memory_peak, cap.memory_why = taken.memory_events, taken.memory_peak, taken.memory_why
            cap.memory_read_ps, cap.memory_trace = taken.memory_read_ps, taken.memory_trace
            cap.memory_gpu_peaks, cap.memory_first_call = taken.memory_gpu_peaks, False
        return out

    # ---- Session.run ----------------------------------------------------------------------------
    def _session_run(self, run, sess, fetches, feed_dict):
        import tensorflow as tf

        key = f"Session.run({_fetch_names(fetches)})"
        r = self.functions.get(key)
        if r is not None:
            r.calls += 1
            return run(sess, fetches, feed_dict, None, None)
        graph = sess.graph
        if self.graph_placement is not None and id(graph) not in self._placed_graphs:
            # Before the session sends the graph to the runtime (its first run extends it).
            self._placed_graphs.add(id(graph))
            for op in graph.get_operations():
                if not op.device:
                    device = self.graph_placement.unrequested(op)
                    if device:
                        set_op_device(op, device)
        options = tf.compat.v1.RunOptions(output_partition_graphs=True,
                                          trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        md = tf.compat.v1.RunMetadata()
        out = run(sess, fetches, feed_dict, options, md)
        cap = CapturedGraphs(step=0)
        cap.functions.append((key, graph.as_graph_def(), list(md.partition_graphs)))
        for op in graph.get_operations():
            cap.shapes.setdefault(op.name, output_shapes(op))
        _run_shapes(md.step_stats, cap)
        self.functions[key] = FunctionRecord(key, key, calls=1, capture=cap, kind="Session.run")
        for v in graph.get_collection("variables"):
            self._variables.setdefault(id(v), v)
        return out

    # ---- eager ops ---------------------------------------------------------------------------
    def _on_op(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None or not self.active:
            return None  # graph construction
        if isinstance(op_type, bytes):  # the eager fallback path passes bytes
            op_type = op_type.decode()
        if getattr(self._quiet, "on", False):
            return None  # Pinpoint's own eager ops
        if op_type.startswith("__"):
            self._since_new += 1  # a tf.function call (counted by call_flat): nothing new for eager
            if self._since_new >= self.quiet_ops:
                self._stop_eager()
            return None
        e = self.eager
        e.total += 1
        # An op with no inputs and no outputs (NoOp) runs on the device of its scope.
        device = _ran_on(inputs, outputs) or ("" if inputs or outputs else current_device())
        if not device:
            return None
        new = False
        e.ops[device] += 1
        kinds = e.op_types[device]
        if op_type in kinds or len(e.attrs) < MAX_EAGER_KINDS:
            if op_type not in kinds:
                e.attrs[(device, op_type)] = attrs  # for the kernel lookup (predicted fallbacks)
                new = True
            kinds[op_type] += 1
        requested = current_device()
        if requested and requested != self.default_device and _short(requested) != _short(device):
            k = (op_type, requested, device)
            new = new or k not in e.moved
            e.moved[k] = e.moved.get(k, 0) + 1
        if op_type in _INPUT_OPS:
            self._remember_inputs(outputs)
        for t in inputs:
            src = getattr(t, "device", "")
            if not src or src == device or _is_resource(t):
                continue
            k = (src, device)
            c = e.copies.get(k)
            if c is None:
                if len(e.copies) >= MAX_EAGER_KINDS:
                    continue
                c = e.copies[k] = {"count": 0, "bytes": 0, "ops": Counter()}
                new = True
            new = new or op_type not in c["ops"]
            c["count"] += 1
            c["bytes"] += _nbytes(t)
            c["ops"][op_type] += 1
        if _UPDATE_RE.match(op_type) and inputs and _is_resource(inputs[0]):
            h = id(inputs[0])
            # New: a handle or device not seen updating, or a variable not yet looked for.
            new = (new or device not in e.updates.get(h, ())
                   or (h not in self._resolved and not self._pending.get(h, False)))
            e.updates[h].add(device)
            e.handles.setdefault(h, inputs[0])
            self._on_update(h)
        if new:
            self._since_new = 0
        else:
            self._since_new += 1
            if self._since_new >= self.quiet_ops:
                self._stop_eager()
        return None

    def _remember_inputs(self, outputs) -> None:
        import weakref

        for t in outputs or ():
            if _is_resource(t):
                continue
            if len(self._input_elements) >= MAX_INPUT_ELEMENTS:
                self._input_elements.pop(next(iter(self._input_elements)))
            try:
                self._input_elements[id(t)] = weakref.ref(t)
            except TypeError:  # not weakly referenceable: not remembered
                continue

    def _stop_eager(self) -> None:
        """Switch the op callback off: the program's eager ops have stopped producing new
        signatures (called from the callback, on the thread that added it)."""
        if not self._callback.armed:
            return
        e = self.eager
        if e.stopped is None:
            e.stopped, e.quiet = e.total, self.quiet_ops
        self._callback.off()
        # The next window is due after 1, 2, 4 ... 16 s. No timer thread: a thread merely waiting
        # slows every tf.function call of the program by ~10% (measured); the program's own
        # thread checks at its tf.function calls, pinpoint.log calls and Keras batch logs.
        first, longest = EAGER_RESAMPLE_S
        self._delay = first if self._delay is None else min(self._delay * 2, longest)
        self._next_window = time.monotonic() + self._delay

    def _resample(self) -> None:
        """Switch the op callback on for a sampling window (any thread; a no-op while it is on)."""
        if self._callback is None or self._callback.armed or self.eager.stopped is None:
            return
        self._since_new = 0  # the callback is off: nothing else writes it now
        self.eager.windows += 1
        self._callback.on()

    def sample_if_due(self) -> None:
        """Switch the op callback on for a window if the next one is due (the program's thread)."""
        if time.monotonic() >= self._next_window:
            self._next_window = float("inf")  # set again when this window ends
            self._resample()

    def _on_update(self, handle_id: int) -> None:
        """Find the variable an eager op updated. A variable's first update is its initializer,
        run inside its constructor before the object holds its handle: it is looked up again at
        its next update (one scan resolves every handle waiting then)."""
        if handle_id in self._resolved:
            return
        if self._keep(handle_id):
            return
        if handle_id not in self._pending:
            self._pending[handle_id] = False  # not yet looked for by a scan
            return
        if not self._pending[handle_id]:
            self._reindex()
            for h in list(self._pending):
                if not self._keep(h):
                    self._pending[h] = True  # scanned once; found at the end if still alive

    def _keep(self, handle_id: int) -> bool:
        v = self._lookup(handle_id)
        if v is None:
            return False
        self._variables.setdefault(id(v), v)
        self._resolved.add(handle_id)
        self._pending.pop(handle_id, None)
        return True

    # ---- variables ---------------------------------------------------------------------------
    def _find_variables(self, handle_ids: set[int]) -> None:
        """Keep (alive, until the report is written) the variables whose component handles are
        among `handle_ids`: the outermost wrapper (Keras, else distributed, else plain). The live
        objects are scanned only when a handle is new to the index (new variables exist)."""
        new = handle_ids - self._seen_handles
        if not new:
            return
        self._seen_handles |= new
        missing = [h for h in new if self._lookup(h) is None]
        if missing:
            self._reindex()
        for h in new:
            v = self._lookup(h)
            if v is not None:
                self._variables.setdefault(id(v), v)

    def _lookup(self, handle_id: int):
        ref = self._index.get(handle_id)
        return ref() if ref is not None else None

    def _reindex(self) -> None:
        import weakref

        for v in live_variables():
            try:
                ref = weakref.ref(v)
            except TypeError:
                continue
            for c in _components(v):
                h = getattr(c, "handle", None)
                if h is not None:
                    self._index[id(h)] = ref

    def resolve_pending(self) -> None:
        """Match the eager-updated handles still unmatched (call while the program's objects live)."""
        if self._pending:
            self._reindex()
            for h in list(self._pending):
                self._keep(h)

    def adopt(self, created: list) -> None:
        """Keep the variables the program created and still holds, as their outermost wrapper
        (trace.created's records; call while the program's objects live)."""
        alive = [v for v in (r.ref() for r in created) if v is not None]
        if not alive:
            return
        self._reindex()
        for v in alive:
            handle = getattr(_components(v)[0], "handle", None)
            outer = self._lookup(id(handle)) if handle is not None else None
            self._variables.setdefault(id(outer if outer is not None else v), outer if outer is not None else v)

    def variables(self) -> list:
        """The variables the captured functions used, and those the eager ops updated (not a
        tf.train.Checkpoint's own save counter)."""
        return [v for v in self._variables.values() if getattr(v, "name", "") not in _PLATFORM_VARIABLES]


def live_variables() -> list:
    """Every live variable, outermost wrapper only (a Keras variable hides its tf.Variable, a
    distributed variable its components)."""
    import tensorflow as tf

    KerasVariable = keras_variable_class()
    keras_vars, tf_vars = [], []
    for obj in gc.get_objects():
        if KerasVariable and isinstance(obj, KerasVariable):
            keras_vars.append(obj)
        elif isinstance(obj, tf.Variable):
            tf_vars.append(obj)
    inner = set()
    for kv in keras_vars:
        value = keras_wrapped(kv)
        if value is not None:
            inner.add(id(value))
            inner.update(id(c) for c in _components(value))
    for v in tf_vars:
        comps = _components(v)
        if len(comps) != 1 or comps[0] is not v:  # (== on variables compares values)
            inner.update(id(c) for c in comps)
    outer = [kv for kv in keras_vars if keras_wrapped(kv) is not None]
    return outer + [v for v in tf_vars if id(v) not in inner]


def _components(v) -> list:
    from pinpoint.placement.variables import components, unwrap

    return components(unwrap(v))


def _is_resource(t) -> bool:
    dtype = getattr(t, "dtype", None)
    return getattr(dtype, "name", "") == "resource"


def _short(device: str) -> str:
    from pinpoint.device_names import local_name

    return local_name(device)


def _ran_on(inputs, outputs) -> str:
    """Where an eager op ran: its outputs' device; an op without outputs that takes a resource
    runs on the resource's device (TensorFlow's eager rule); else its first input's."""
    for t in outputs or ():
        dev = getattr(t, "device", "")
        if dev:
            return dev
    for t in inputs or ():
        if _is_resource(t) and getattr(t, "device", ""):
            return t.device
    for t in inputs or ():
        if getattr(t, "device", ""):
            return t.device
    return ""


def _nbytes(t) -> int:
    try:
        n = t.shape.num_elements()
        return int(n * t.dtype.size) if n is not None and t.dtype.is_numpy_compatible else 0
    except (AttributeError, TypeError, ValueError):
        return 0


def _fetch_names(fetches) -> str:
    import tensorflow as tf

    names = []
    for f in tf.nest.flatten(fetches):
        names.append(getattr(f, "name", None) or str(f))
    text = ", ".join(names)
    return text if len(text) <= 120 else text[:117] + "..."


def _shapes(fn, cap: CapturedGraphs) -> bool:
    """Static output shapes by op name (sizes the transfers), from the function's graph and the
    graphs of the functions it calls: the runtime inlines a call, naming the callee's ops
    '<call op>/<op>' (Keras' train function calls its step function this way). True when an input
    element (in the function or any function it calls, a cond's branch too) has a dynamic shape."""
    try:
        graph = fn.graph
    except Exception:  # noqa: BLE001 - a function loaded without its Python graph
        return False
    _graph_shapes(graph, "", cap, depth=0)
    return bool(cap.dynamic_inputs) or _dynamic_source(graph, set())


def _dynamic_source(graph, seen: set) -> bool:
    """An op handing out input elements of a dynamic shape, in `graph` or the functions it calls."""
    from pinpoint.placement.runshapes import SOURCES

    for op in graph.get_operations():
        if op.type in SOURCES and has_dynamic_dims(output_shapes(op)):
            return True
    for name, inner in called_graphs(graph).items():
        if name not in seen:
            seen.add(name)
            if _dynamic_source(inner, seen):
                return True
    return False


_CALL_OPS = {"StatefulPartitionedCall", "PartitionedCall"}


def _graph_shapes(graph, prefix: str, cap: CapturedGraphs, depth: int) -> None:
    library = called_graphs(graph)
    for op in graph.get_operations():
        outs = cap.shapes.setdefault(prefix + op.name, output_shapes(op))
        if op.type in GET_NEXT and has_dynamic_dims(outs):
            cap.dynamic_inputs.append(prefix + op.name)
        if op.type in _CALL_OPS and depth < 8:
            try:
                callee = op.get_attr("f").name
            except (ValueError, AttributeError):
                continue
            inner = library.get(callee)
            if inner is not None:
                _graph_shapes(inner, f"{prefix}{op.name}/", cap, depth + 1)


def _run_shapes(step_stats, cap: CapturedGraphs) -> None:
    """The shapes the nodes really produced (step stats of the captured call), where the traced
    graph's static shape is unknown or partly unknown."""
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            outs = []
            for o in ns.output:
                td = o.tensor_description
                if td.shape.unknown_rank:
                    break
                outs.append((o.slot, td.dtype, [int(d.size) for d in td.shape.dim]))
            if not outs:
                continue
            known = cap.shapes.get(ns.node_name)
            if known and all(dims is not None and None not in dims for _, dims in known):
                continue
            slots = max(slot for slot, _, _ in outs) + 1
            row = [(0, None)] * slots
            for slot, dtype, dims in outs:
                row[slot] = (dtype, dims)
            cap.shapes[ns.node_name] = row


