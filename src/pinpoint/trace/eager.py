"""Eager ops as an op callback sees them (TensorFlow's own hook, as tf.debugging's numeric checks
use): the device each ran on (its outputs' device; an op without outputs that takes a variable
runs on the variable's device) and every input that had to be copied there, with its bytes;
requests not met; variable updates. Each callback tells the sampling state machine
(trace.sampling) whether it brought a new signature: (op type, device) pair, copy (source,
destination), request not met, or updated variable."""

from __future__ import annotations

import threading
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from pinpoint.placement import PREFETCHED, UPDATE_RE
from pinpoint.tfcompat.api import current_device, device_of

MAX_INPUT_ELEMENTS = 64  # the latest eager input tensors remembered (weakly) to recognise a step's arguments
MAX_EAGER_KINDS = 5000  # distinct (op type, device) and copy keys kept: a bound on memory, not on counts


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


class EagerOps:
    """The op callback: records into `record`, finds updated variables with `finder`
    (trace.variables.VariableFinder) and tells `sampler` (trace.sampling.Sampler) what was new."""

    def __init__(self, record: EagerRecord, finder, sampler, default_device: str = "", request_of=None) -> None:
        self.record = record
        self.finder = finder
        self.sampler = sampler
        # The emulated /GPU:0 scope the program runs in (its requests are not the program's).
        self.default_device = default_device
        # Under emulation: the eager scope's device as the program asked for it (trace.gpus), where
        # TensorFlow's own name of the scope is already the device soft placement chose.
        self.request_of = request_of
        self.active = False
        self._quiet = threading.local()  # set while Pinpoint itself runs eager ops on this thread
        # id -> weak reference of the latest tensors an eager iterator op handed out: a step called with
        # them on a device other than the host read an element the iterator copied there.
        self.input_elements: dict[int, Any] = {}

    def quiet_on(self, on: bool) -> bool:
        """Set whether this thread's eager ops are Pinpoint's own (not recorded); the previous setting."""
        before = getattr(self._quiet, "on", False)
        self._quiet.on = on
        return before

    def is_input_element(self, t) -> bool:
        """Whether `t` is one of the latest tensors an eager iterator op handed out."""
        ref = self.input_elements.get(id(t))
        return ref is not None and ref() is t

    def on_op(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None or not self.active:
            return None  # graph construction
        if isinstance(op_type, bytes):  # the eager fallback path passes bytes
            op_type = op_type.decode()
        if getattr(self._quiet, "on", False):
            return None  # Pinpoint's own eager ops
        if op_type.startswith("__"):
            self.sampler.nothing_new()  # a tf.function call (counted by call_flat): nothing new for eager
            return None
        self.record.total += 1
        # An op with no inputs and no outputs (NoOp) runs on the device of its scope.
        device = ran_on(inputs, outputs) or ("" if inputs or outputs else current_device())
        if not device:
            return None
        new = self._count(op_type, attrs, device)
        if op_type in PREFETCHED:
            self._remember_inputs(outputs)
        new = self._copies(op_type, inputs, device) or new
        if UPDATE_RE.match(op_type) and inputs and is_resource(inputs[0]):
            new = self._update(inputs[0], device) or new
        if new:
            self.sampler.new()
        else:
            self.sampler.nothing_new()
        return None

    def on_fast_reads(self, variables) -> None:
        """The reads of `variables` the C fast path made for an op they were passed to straight
        (`tf.math.argmax(v)`, `v == v`): no op callback sees them. Each is a ReadVariableOp on the
        variable's device, where TensorFlow runs it whatever the scope requests."""
        if not self.active or getattr(self._quiet, "on", False):
            return
        new = False
        for v in variables:
            device = device_of(v)
            if device:
                self.record.total += 1
                new = self._count("ReadVariableOp", ("dtype", v.dtype.as_datatype_enum), device,
                                  requested=False) or new
        if new:
            self.sampler.new()

    def _count(self, op_type: str, attrs, device: str, requested: bool = True) -> bool:
        """Count the op on its device, and a request it did not meet (unless not `requested`: an
        op TensorFlow places by its input); True if either is new."""
        e, new = self.record, False
        e.ops[device] += 1
        kinds = e.op_types[device]
        if op_type in kinds or len(e.attrs) < MAX_EAGER_KINDS:
            if op_type not in kinds:
                e.attrs[(device, op_type)] = attrs  # for the kernel lookup (predicted fallbacks)
                new = True
            kinds[op_type] += 1
        requested = current_device() if requested else ""
        if requested and self.request_of is not None:
            requested = self.request_of(requested)
        if requested and requested != self.default_device and _short(requested) != _short(device):
            k = (op_type, requested, device)
            new = new or k not in e.moved
            e.moved[k] = e.moved.get(k, 0) + 1
        return new

    def _copies(self, op_type: str, inputs, device: str) -> bool:
        """Count the inputs copied to `device`; True if a copy (or its op) is new."""
        e, new = self.record, False
        for t in inputs:
            src = device_of(t)
            if not src or src == device or is_resource(t):
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
        return new

    def _update(self, handle, device: str) -> bool:
        """Record a variable update; True for a handle or device not seen updating, or a
        variable not yet looked for."""
        e, h = self.record, id(handle)
        new = device not in e.updates.get(h, ()) or not self.finder.looked_for(h)
        e.updates[h].add(device)
        e.handles.setdefault(h, handle)
        self.finder.on_update(h)
        return new

    def _remember_inputs(self, outputs) -> None:
        for t in outputs or ():
            if is_resource(t):
                continue
            if len(self.input_elements) >= MAX_INPUT_ELEMENTS:
                self.input_elements.pop(next(iter(self.input_elements)))
            try:
                self.input_elements[id(t)] = weakref.ref(t)
            except TypeError:  # not weakly referenceable: not remembered
                continue


def is_resource(t) -> bool:
    dtype = getattr(t, "dtype", None)
    return getattr(dtype, "name", "") == "resource"


def _short(device: str) -> str:
    from pinpoint.device_names import local_name

    return local_name(device)


def ran_on(inputs, outputs) -> str:
    """Where an eager op ran: its outputs' device; an op without outputs that takes a resource
    runs on the resource's device (TensorFlow's eager rule); else its first input's."""
    for t in outputs or ():
        dev = device_of(t)
        if dev:
            return dev
    devices = [(device_of(t), t) for t in inputs or ()]
    for dev, t in devices:
        if dev and is_resource(t):
            return dev
    return next((dev for dev, _ in devices if dev), "")


def _nbytes(t) -> int:
    try:
        n = t.shape.num_elements()
        return int(n * t.dtype.size) if n is not None and t.dtype.is_numpy_compatible else 0
    except (AttributeError, TypeError, ValueError):
        return 0
