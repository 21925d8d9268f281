"""The one way Pinpoint patches TensorFlow and Keras: `Patches`, an ExitStack of undos.

Only names registered as patched in `targets.TARGETS` can be replaced, so the registry, the
start-up check and the test that every patched name is the original again after a trace all see
every patch. Closing undoes in reverse order what was installed, also when an install failed
part-way (the stack holds exactly what was done).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pinpoint.tfcompat.targets import TARGETS

LOCAL_DEVICES = "CollectiveAllReduceExtended._initialize_local_devices"
FAST_PATH = "pywrap_tfe.TFE_Py_FastPathExecute"
SET_DEVICE = "Operation._set_device"


class Patches(contextlib.ExitStack):
    """Replacements of registered private names; `close()` (or leaving `with`) undoes them."""

    def replace(self, key: str, value: Any) -> None:
        """Set target `key` to `value` until close. The class's own __dict__ entry is what is put
        back (a staticmethod stays one)."""
        target = TARGETS[key]
        if not target.patched:
            raise KeyError(f"{key} is not registered as patched in pinpoint.tfcompat.targets")
        owner, name = target.owner()
        self.callback(setattr, owner, name, owner.__dict__[name])
        setattr(owner, name, value)

    def switch(self, key: str, value: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        """Target `key` switchable, call by call, between `value` and what it is now (e.g. a
        benchmark pairing two implementations): returns (to_value, back); close puts back what
        it is now, whichever was set last."""
        target = TARGETS[key]
        if not target.patched:
            raise KeyError(f"{key} is not registered as patched in pinpoint.tfcompat.targets")
        owner, name = target.owner()
        now = owner.__dict__[name]
        self.callback(setattr, owner, name, now)
        return (lambda: setattr(owner, name, value)), (lambda: setattr(owner, name, now))

    @staticmethod
    def current(key: str) -> Any:
        """Target `key` as an attribute now (what a replacement calls), without patching it."""
        owner, name = TARGETS[key].owner()
        return getattr(owner, name)

    def op_callback(self, callback, reads=None) -> OpCallback:
        """TensorFlow's op callback `callback` on this thread until close, as a switch (see
        `OpCallback`); close removes it for good. With `reads`, also called (with the variables)
        for the reads of variables passed straight to an op on this thread, which the C fast path
        makes without calling the op callback (`tf.math.argmax(v)`, `v == v`)."""
        fast = None
        if reads is not None:
            fast = self.switch(FAST_PATH, _reading(self.current(FAST_PATH), reads, threading.get_ident()))
        switch = OpCallback(callback, fast)
        self.callback(switch.close)
        return switch


class OpCallback:
    """An op callback that can be switched off and on again without leaving TensorFlow's slow
    path on: `off()` and `on()` edit the adding thread's own callback list (op callbacks are
    thread-local), which TensorFlow's eager fast path reads before every op: an empty list puts
    each eager op back on the C fast path (the callback mechanism alone costs an op microseconds),
    a non-empty one sends it down the slow path. Like TensorFlow's own add/remove, they also set
    the slow path's `execute` (which every tf.function call goes through) to
    `execute_with_callbacks` and back to `quick_execute`. Either may be called from any thread:
    a new tf.function's first call on another thread re-arms the program's thread this way."""

    def __init__(self, callback, fast=None) -> None:
        from tensorflow.python.framework import op_callbacks

        # The fast path's read counting (Patches.op_callback), switched with the callback: off, no
        # eager op pays for it.
        self._fast_on, self._fast_off = fast or (_nothing, _nothing)
        self._fast_on()
        op_callbacks.add_op_callback(callback)
        # The adding thread's list object itself: another thread appends to it to re-arm.
        self._list = _context()._thread_local_data.op_callbacks
        self._callback = callback
        self._lock = threading.Lock()
        self.armed = True
        self._closed = False

    def off(self) -> None:
        with self._lock:
            if self.armed:
                self.armed = False
                # Also from inside the callback: TensorFlow iterates over this list, so an entry
                # after ours is skipped for this one op (ours is normally the only one).
                self._list.remove(self._callback)
                if not self._list:
                    _execute().execute = _execute().quick_execute
                self._fast_off()

    def on(self) -> None:
        with self._lock:
            if not self.armed and not self._closed:
                self.armed = True
                # The slow path first: an op that sees the list non-empty must find the callbacks.
                _execute().execute = _execute().execute_with_callbacks
                self._fast_on()
                self._list.append(self._callback)

    def close(self) -> None:
        """Remove the callback as TensorFlow does (on the adding thread): the fast path's
        `execute` is restored once no callback is left."""
        from tensorflow.python.framework import op_callbacks

        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self.armed:
                _execute().execute = _execute().execute_with_callbacks
                self._list.append(self._callback)
            self.armed = False
        op_callbacks.remove_op_callback(self._callback)


def _nothing() -> None:
    pass


def _reading(fast_path, reads, thread: int):
    """`fast_path` (pywrap_tfe.TFE_Py_FastPathExecute: ctx, op type, name, then the op's inputs and
    attributes) that calls `reads` with the resource variables among the inputs once the op ran
    on `thread`. The fast path reads each such input on the variable's device and runs the op
    callback for the op alone. When it cannot run the op it raises before reading, and the slow
    path it falls back to converts the variables itself, through ops the callback sees."""
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    def fast_path_reading(*args):
        if get_ident() != thread:
            return fast_path(*args)
        found = []
        for a in args[3:]:
            if isinstance(a, BaseResourceVariable):
                found.append(a)
            elif type(a) is list or type(a) is tuple:  # a list input (tf.concat's values)
                found += [x for x in a if isinstance(x, BaseResourceVariable)]
        out = fast_path(*args)
        if found:
            reads(found)
        return out

    get_ident = threading.get_ident
    return fast_path_reading


def _execute():
    from tensorflow.python.eager import execute

    return execute


def _context():
    from tensorflow.python.eager import context

    return context.context()


def patch_local_devices(patches: Patches, indices: Sequence[int]) -> None:
    """MultiWorkerMirroredStrategy's local devices become logical CPUs `indices` (the emulated
    GPUs). TF picks a worker's local devices from its GPU count, 0 on a CPU-only machine (one
    replica on CPU:0); as CPUs, its collectives use the ring (NCCL needs real GPUs)."""
    local = tuple(indices)

    def initialize_local_devices(ext, cluster_resolver, worker_device):
        return tuple(f"{worker_device}/device:CPU:{i}" for i in local), "CPU"

    patches.replace(LOCAL_DEVICES, initialize_local_devices)


# What a program reads back as a device's name.
DEVICE_NAMES = ("EagerTensor.device", "EagerTensor.backing_device", "Operation.device", "PyTensor.device")


def show_device_names(patches: Patches, shown: Callable[[str], str], runtime: Callable[[str], str]) -> None:
    """Every device name a program reads back (a tensor's, its memory's, an op's request, a
    variable's through its handle) passes through `shown` until close, and a name set on an op
    unparsed (TensorFlow colocates a gradient with its op by setting the op's `device` on it)
    through `runtime`, its inverse. Pinpoint's own reads keep the runtime's names (`api.device_of`)."""
    from pinpoint.tfcompat import api

    patches.callback(api.RUNTIME_DEVICE.clear)
    for key in DEVICE_NAMES:
        owner, name = TARGETS[key].owner()
        get = owner.__dict__[name].__get__  # a property's or a C type's getter, unbound
        patches.replace(key, property(lambda obj, get=get: shown(get(obj))))
        if name == "device":
            api.RUNTIME_DEVICE[owner] = get
    set_device = Patches.current(SET_DEVICE)

    def set_runtime_device(op, device) -> None:
        set_device(op, runtime(device) if isinstance(device, str) else device)

    patches.replace(SET_DEVICE, set_runtime_device)


def originals() -> dict[str, Any]:
    """Every patched target's current __dict__ entry, by key (a test compares them by identity)."""
    out = {}
    for key, target in TARGETS.items():
        if target.patched:
            owner, name = target.owner()
            out[key] = owner.__dict__[name]
    return out
