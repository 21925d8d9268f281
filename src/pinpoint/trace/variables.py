"""The variables behind what a program ran, found by their handles and kept alive until the
report is written (so it can show them and compare their mirrored copies).

A captured function's variables are looked up by the handles it was called with; an eager
update's by the handle it updated. The live objects are scanned (`gc.get_objects()`) only when
a handle is new to the index: new variables exist.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from typing import Any

from pinpoint.tfcompat.api import keras_variable_class, keras_wrapped

_PLATFORM_VARIABLES = {"save_counter:0", "save_counter"}


class VariableFinder:
    """Variables by the ids of their component handles, outermost wrapper (Keras, else
    distributed, else plain), in discovery order."""

    def __init__(self) -> None:
        self._variables: dict[int, Any] = {}  # id -> variable (Keras or tf), in discovery order
        self._index: dict[int, Any] = {}  # component handle id -> weakref to its outermost variable
        self._seen_handles: set[int] = set()
        self._resolved: set[int] = set()
        self._pending: dict[int, bool] = {}  # eager-updated handles not yet matched; True: scanned once
        self._created: list = []  # trace.created's records (watch): the variables that may be let go
        self._created_seen = 0  # how many of them the last release_dropped saw

    def watch(self, created: list) -> None:
        """Let go of the program's dropped variables (`release_dropped`) among `created`, the
        records trace.created appends to as the program creates variables."""
        self._created = created

    def release_dropped(self) -> None:
        """Let go of each kept variable that the program no longer holds, so that it is freed as in
        the program and reported freed (from its creation record). Only variables with such a record
        are let go (the rest would vanish from the report), only after new ones were created since
        the last time (a model built to replace one), and only on the program's thread: one full
        collection tells what nothing but this finder holds."""
        if len(self._created) == self._created_seen or threading.current_thread() is not threading.main_thread():
            return
        self._created_seen = len(self._created)
        recorded = {id(h) for r in self._created for h in (ref() for ref in r.handles if ref is not None)
                    if h is not None}
        order = list(self._variables)
        weak = _weak_refs(self._variables, recorded)
        kept = {k: v for k, v in self._variables.items() if k not in weak}
        self._variables = {}
        gc.collect()
        for key in order:
            v = weak[key]() if key in weak else kept[key]
            if v is not None:
                self._variables[key] = v
        if len(self._variables) < len(order):
            self._prune()

    def _prune(self) -> None:
        """Forget the handles of variables that are gone: an id may be a new handle's now."""
        for h in [h for h, ref in self._index.items() if ref() is None]:
            del self._index[h]
            self._resolved.discard(h)
            self._seen_handles.discard(h)

    def keep(self, variable) -> None:
        """Keep `variable` (e.g. a tf.compat.v1 graph's collection)."""
        self._variables.setdefault(id(variable), variable)

    def looked_for(self, handle_id: int) -> bool:
        """Whether an updated handle's variable was found or a scan already looked for it."""
        return handle_id in self._resolved or self._pending.get(handle_id, False)

    def on_update(self, handle_id: int) -> None:
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
        self.keep(v)
        self._resolved.add(handle_id)
        self._pending.pop(handle_id, None)
        return True

    def find(self, handle_ids: set[int]) -> None:
        """Keep the variables whose component handles are among `handle_ids`."""
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
                self.keep(v)

    def _lookup(self, handle_id: int):
        ref = self._index.get(handle_id)
        return ref() if ref is not None else None

    def _reindex(self) -> None:
        for v in live_variables():
            try:
                ref = weakref.ref(v)
            except TypeError:
                continue
            for c in components(v):
                h = getattr(c, "handle", None)
                if h is not None:
                    self._index[id(h)] = ref

    def settle(self, created: list) -> None:
        """At the program's end, while its objects live: match the eager-updated handles still
        unmatched, and keep the variables the program created and still holds, as their outermost
        wrapper (trace.created's records). One scan serves both: nothing runs in between."""
        alive = [v for v in (r.ref() for r in created) if v is not None]
        if not self._pending and not alive:
            return
        self._reindex()
        for h in list(self._pending):
            self._keep(h)
        for v in alive:
            handle = getattr(components(v)[0], "handle", None)
            outer = self._lookup(id(handle)) if handle is not None else None
            self.keep(outer if outer is not None else v)

    def variables(self) -> list:
        """The variables found (not a tf.train.Checkpoint's own save counter)."""
        return [v for v in self._variables.values() if getattr(v, "name", "") not in _PLATFORM_VARIABLES]


_OTHER, _KERAS, _TF = 0, 1, 2


def live_variables() -> list:
    """Every live variable, outermost wrapper only (a Keras variable hides its tf.Variable, a
    distributed variable its components)."""
    import tensorflow as tf

    KerasVariable = keras_variable_class()
    keras_vars, tf_vars = [], []
    # Classified by type, once per type: a process holds some 10^5-10^6 objects of a few thousand
    # types, and this scan runs at the program's end and at eager updates (0.44 -> 0.19 s a scan
    # with MobileNetV2 built). By the type's MRO, not issubclass: tf.Variable is an ABC, and an
    # issubclass that fails puts the type into the negative cache of tf.Variable and of each of
    # its ~20 subclasses, a weak reference each (some 20,000 for one scan), and every later
    # tf.function call of the program paid for the bigger caches. (tf.Variable registers no
    # virtual subclasses, so the MRO says the same.)
    kinds: dict[type, int] = {}
    for obj in gc.get_objects():
        t = type(obj)
        kind = kinds.get(t)
        if kind is None:
            mro = t.__mro__
            kind = kinds[t] = (_KERAS if KerasVariable and KerasVariable in mro
                               else _TF if tf.Variable in mro else _OTHER)
        if kind == _KERAS:
            keras_vars.append(obj)
        elif kind == _TF:
            tf_vars.append(obj)
    inner = set()
    for kv in keras_vars:
        value = keras_wrapped(kv)
        if value is not None:
            inner.add(id(value))
            inner.update(id(c) for c in components(value))
    for v in tf_vars:
        comps = components(v)
        if len(comps) != 1 or comps[0] is not v:  # (== on variables compares values)
            inner.update(id(c) for c in comps)
    outer = [kv for kv in keras_vars if keras_wrapped(kv) is not None]
    return outer + [v for v in tf_vars if id(v) not in inner]


def _weak_refs(variables: dict, handle_ids: set[int]) -> dict:
    """Weak references to the variables a component handle of which is among `handle_ids` (a
    function of its own: no local name outlives it to hold one of them)."""
    refs = {}
    for key, v in variables.items():
        if any(id(getattr(c, "handle", None)) in handle_ids for c in components(v)):
            with contextlib.suppress(TypeError):  # not weakly referable: kept
                refs[key] = weakref.ref(v)
    return refs


def components(v) -> list:
    from pinpoint.placement import components as parts
    from pinpoint.placement import unwrap

    return parts(unwrap(v))
