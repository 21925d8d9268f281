"""tf.functions: each concrete function's record, its name in the program, and its first call.

The first eager call of each function (each concrete function, so a retrace is a new one) runs
with graph collection on, which the runtime does when it instantiates the function anyway: its
partition graphs and traced shapes are recorded once; later calls are counted inside
TensorFlow's call path (tfcompat.counting). With memory measured (--memory), the second, third and fourth calls run
under the profiler (MEMORY_CALLS): which temporaries overlap changes with the executor's order.
A function another thread calls (a ClusterCoordinator's closure, run by a worker's runtime) is not
captured; with memory measured, its second call is profiled there too, and its graphs are read
from TensorFlow's dumps (placement.graphs.dumps) when the placement is built.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from pinpoint.placement import (
    CapturedGraphs,
    add_branch_shapes,
    add_function_graphs,
    dump_dir,
    map_arg_values,
    run_profiled,
    size_from_inference,
    size_iterator_outputs,
)
from pinpoint.placement import enabled as memory_enabled
from pinpoint.tfcompat.api import current_device, executing_eagerly, wait_for_executor
from pinpoint.tfcompat.counting import forget, know, take_count
from pinpoint.tfcompat.graphs import called_graphs, collect_graphs
from pinpoint.trace.eager import is_resource
from pinpoint.trace.shapes import function_shapes

# With memory measured, the calls after the first that run under the profiler (a function called
# fewer times: those it had). The first call is measured only for a function called once: it
# makes the function's constants.
MEMORY_CALLS = (2, 3, 4)

_SUFFIX_RE = re.compile(r"^__(inference|forward|backward)_(.*?)(_\d+)?$")
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
    capture: CapturedGraphs | None = None
    kind: str = "tf.function"  # or "Session.run"
    # The Keras method its first call came from ("train", "evaluate", "predict"), else None.
    role: str | None = None
    # The exception its first call raised (type and first line), else None.
    error: str | None = None
    # Memory measured on a call another thread made (a closure): its allocator's events, and the
    # device that call was made on (the worker's), else None.
    remote: CapturedGraphs | None = None
    remote_device: str = ""


class FunctionCalls:
    """Every call of a function not known yet: its first call (captured), its measured calls, a
    call while a function traces. `functions` holds the records by concrete name (Session.run's
    too); `known` the functions whose calls tfcompat.counting counts inside TensorFlow's call path."""

    def __init__(self, functions: dict, on_new, eager_ops, finder, real_gpus: bool) -> None:
        self.functions = functions
        self.on_new = on_new  # () -> None: a new function (a new phase: its eager ops are sampled)
        self.eager_ops = eager_ops  # trace.eager.EagerOps: the latest input elements
        self.finder = finder  # trace.variables.VariableFinder
        self.real_gpus = real_gpus  # False under emulation: a listed GPU is a logical CPU, no GPU allocator
        self.active = False
        self.known: dict[int, FunctionRecord] = {}  # id(AtomicFunction) -> its record
        self._alive: list = []  # the functions in `known` (kept alive: an id is not reused)

    def flush(self) -> None:
        """Add the calls counted inside TensorFlow's call path to their records."""
        for fn in self._alive:
            self.known[id(fn)].calls += take_count(fn)

    def forget_all(self) -> None:
        """The trace ends: the calls counted so far to their records, the functions as they were."""
        self.flush()
        for fn in self._alive:
            forget(fn)

    def _know(self, fn, r: FunctionRecord, call_flat) -> None:
        if id(fn) not in self.known:
            know(fn, call_flat)  # its calls skip the slow path from now on, counted in TensorFlow's
            self.known[id(fn)] = r
            self._alive.append(fn)  # its id stays its own while it is in `known`

    def call(self, call_flat, fn, args):
        """A call of a function not known yet (TensorFlow's `call_flat`, the function, its arguments)."""
        if not self.active or not executing_eagerly(fn):
            return call_flat(fn, *args)
        name = fn.name.decode() if isinstance(fn.name, bytes) else str(fn.name)
        r = self.functions.get(name)
        seen = r is not None
        if not seen:
            r = self.functions[name] = FunctionRecord(name, user_name(fn, name), role=keras_role())
            self.on_new()
        r.calls += 1
        try:
            return self._record_call(call_flat, fn, args, r, seen)
        finally:
            # Memory: the calls up to the last of MEMORY_CALLS come here too, to be measured. Known
            # after this call, which is counted here (not in TensorFlow's call path too).
            if not memory_enabled() or (seen and r.calls >= MEMORY_CALLS[-1]):
                self._know(fn, r, call_flat)

    def _record_call(self, call_flat, fn, args, r: FunctionRecord, seen: bool):
        if seen:
            return self._seen_call(lambda: call_flat(fn, *args), r)
        if threading.current_thread() is not threading.main_thread():
            # e.g. a ClusterCoordinator's closures: graph collection is process-wide, and
            # those functions are instantiated by the remote workers' runtimes anyway.
            return call_flat(fn, *args)
        try:
            out, r.capture = self._capture_first_call(lambda: call_flat(fn, *args), fn, args)
        except BaseException as err:
            r.error = error_line(err)
            raise
        return out

    def _capture_first_call(self, call, fn, args) -> tuple[Any, CapturedGraphs]:
        cap = CapturedGraphs(step=0)
        # The traced shapes, before the call: they tell whether the profiler is needed.
        dynamic = function_shapes(fn, cap)
        with collect_graphs() as collected:
            # A cond's branch that did not run sends nothing: which one ran is read off the profiled call.
            if dynamic or cap.branch_shapes or memory_enabled():
                # TensorFlow records no step stats for a tf.function call (dev_stats stays empty), so a
                # dynamic batch dimension is read off the bytes the iterator handed out (the profiler),
                # and what derives from it off TensorFlow's shape inference (size_from_inference).
                # The same profiled call holds the allocator's events when memory is measured.
                out, element_bytes, kernels, why = run_profiled(call, cap if memory_enabled() else None,
                                                                real_gpus=self.real_gpus)
            else:
                out, element_bytes, kernels, why = call(), None, None, None
        add_function_graphs(cap, collected.metadata, fn.name)
        add_branch_shapes(cap)
        size_iterator_outputs(cap, element_bytes, why)
        size_from_inference(cap, element_bytes, kernels)
        map_arg_values(cap, list(args))  # the handles attribute the variable updates
        cap.input_arg_ids = {id(a) for a in args if self.eager_ops.is_input_element(a)}
        self.finder.find({id(a) for a in args if is_resource(a)})
        return out, cap

    def _seen_call(self, call, r: FunctionRecord):
        """A later call on the slow path: with memory measured, the MEMORY_CALLS are measured."""
        if r.calls in MEMORY_CALLS and r.capture is not None and memory_enabled():
            return self._measure_memory(call, r.capture, r.calls)
        if r.calls == 2 and r.capture is None and r.error is None and memory_enabled() and dump_dir() is not None \
                and threading.current_thread() is not threading.main_thread():
            return self._measure_remote(call, r)
        return call()

    def _measure_remote(self, call, r: FunctionRecord):
        """A closure's second call under the profiler, waited for: its function runs in a worker's
        runtime of this process, on the executor of the closure's thread."""
        def waited():
            out = call()
            wait_for_executor()
            return out

        r.remote, r.remote_device = CapturedGraphs(step=0), current_device()
        out, *_ = run_profiled(waited, r.remote, real_gpus=self.real_gpus)
        return out

    def _measure_memory(self, call, cap: CapturedGraphs, n: int):
        """A function's call `n` under the profiler: its memory without what only a first call
        allocates (its constants, variables still sharing the buffer they were initialized from).
        The second call's replaces the first call's (which stays when the program calls the
        function once); later ones go to cap.memory_more."""
        taken = CapturedGraphs(step=0)
        out, *_ = run_profiled(call, taken, real_gpus=self.real_gpus)
        if n != MEMORY_CALLS[0]:
            if taken.memory_events:
                cap.memory_more.append((n, taken))
            return out
        if taken.memory_events:
            cap.memory_events, cap.memory_peak, cap.memory_why = taken.memory_events, taken.memory_peak, taken.memory_why
            cap.memory_read_ps, cap.memory_trace = taken.memory_read_ps, taken.memory_trace
            cap.memory_gpu_peaks, cap.memory_first_call = taken.memory_gpu_peaks, False
        return out
