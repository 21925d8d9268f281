"""Record every variable as the program creates it, so one it drops before the end is still
reported (the live objects scanned at the end no longer hold it).

`tf.Variable(...)` is the one entry point: TensorFlow runs its variable-creator chain there (a
strategy's scope makes the mirrored or one-device variable inside it), so the patched call sees
what the program gets back, whatever strategy it was made under. Keras' weights and optimizer
slots are made through it too. What is read then: the strategy in scope, the device of every
component, the `tf.device` request the program made, the Keras layer (or the program's source
line) that made it. A creation costs ~40 µs more (measured: 60 -> 100 µs for an eager scalar
tf.Variable); a training step nothing (the patched call is not on its path).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from pinpoint.tfcompat.api import device_of, keras_scope_path, ordering_token, requested_device
from pinpoint.tfcompat.patches import Patches

VARIABLE_CALL = "Variable._variable_call"
# TensorFlow's own variables: a strategy's all-reduce launchers each make a collective-ordering
# token by constructing ResourceVariable directly, past tf.Variable's call.
TOKEN_MADE = "CollectiveReplicaLauncher.__init__"
# Frames of these packages are not the program's own line.
_LIBRARY_PARTS = ("/tensorflow/", "/keras/", "/tf_keras/", "/pinpoint/", "/absl/", "<frozen ")


@dataclass
class Created:
    """One variable as it was created (devices are physical device strings)."""

    ref: Any  # weakref to what tf.Variable(...) returned
    name: str
    kind: str
    cls: str
    strategy: str | None
    shape: list | None
    dtype: str
    bytes: int | None
    components: list[str]  # each component's device
    handles: list = field(default_factory=list)  # weakrefs to the components' handles
    requested: str = ""
    layer: str | None = None
    source: str | None = None
    by: str | None = None  # OPTIMIZER_APPLY: an optimizer's slot made at its first apply, inside a step
    graph: int | None = None  # id of the tf.Graph a symbolic variable was made in (None: a runtime one)
    # When the program let go of it: its own line then, and seconds since the trace started.
    freed_at: str | None = None
    freed_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.ref() is not None


class CreationLog:
    """Install with `install()` for the whole traced program, read `records`, `uninstall()`."""

    def __init__(self, default_device: str = ""):
        self.default_device = default_device  # Pinpoint's own scope around the program: not a request
        self.records: list[Created] = []
        self.started = time.monotonic()
        self._patches = Patches()
        self._depth = threading.local()  # tf.Variable called inside a creator: recorded once, outermost

    def install(self) -> CreationLog:
        original = Patches.current(VARIABLE_CALL)  # bound to tf.Variable
        log = self

        def recorded_call(cls, *args, **kwargs):
            depth = getattr(log._depth, "n", 0)
            log._depth.n = depth + 1
            try:
                var = original.__func__(cls, *args, **kwargs)
            finally:
                log._depth.n = depth
            if var is not None and depth == 0:
                log._record(var)
            return var

        self._patches.replace(VARIABLE_CALL, classmethod(recorded_call))
        launcher_init = Patches.current(TOKEN_MADE)

        def recorded_launcher(launcher, *args, **kwargs):
            launcher_init(launcher, *args, **kwargs)
            token = ordering_token(launcher)
            if token is not None:
                log._record(token, internal=True)

        self._patches.replace(TOKEN_MADE, recorded_launcher)
        return self

    def uninstall(self) -> None:
        self._patches.close()

    def _record(self, var, internal: bool = False) -> None:
        """`internal`: TensorFlow's own variable (class 'internal'), made under the launcher's own
        device scope, which is no request of the program's."""
        try:
            record = describe(var, "" if internal else self._request(), _strategy_name())
            if internal:
                from pinpoint.placement import INTERNAL

                record.cls = INTERNAL
            record.ref = weakref.ref(var, functools.partial(_dropped, record, self.started))
            self.records.append(record)
        except Exception:  # noqa: BLE001 - a variable that cannot be read now: not recorded, never fatal
            pass

    def _request(self) -> str:
        try:
            dev = requested_device()
        except Exception:  # noqa: BLE001 - a TensorFlow without these internals: no request known
            return ""
        return "" if dev == self.default_device else dev


def describe(var, requested: str, strategy: str | None) -> Created:
    """What a freshly created variable is and where TensorFlow put each of its components."""
    import numpy as np

    from pinpoint.placement import classify, components, variable_kind

    comps = components(var)
    handles = [getattr(c, "handle", None) for c in comps]
    shape = [int(d) if d is not None else None for d in var.shape.as_list()] if var.shape.rank is not None else None
    size = var.dtype.size if var.dtype.is_numpy_compatible else 0
    layer = _keras_path()
    short = (getattr(var, "name", "") or "").removesuffix(":0").rpartition("/")[2]
    return Created(
        ref=weakref.ref(var), name=f"{layer}/{short}" if layer else (var.name or "").removesuffix(":0"),
        kind=variable_kind(var), cls=classify(var)[0], strategy=strategy, shape=shape, dtype=var.dtype.name,
        bytes=int(size * int(np.prod(shape))) if shape is not None and None not in shape else None,
        components=[device_of(c) for c in comps],
        handles=[_weak(h) for h in handles],
        requested=requested, layer=layer or None, source=None if layer else _program_line(),
        by=OPTIMIZER_APPLY if _in_optimizer_apply() else None, graph=_graph_of(handles))


def _graph_of(handles: list) -> int | None:
    """The graph a variable made while building one (not lifted out to the runtime) belongs to, by
    its components' handles: it exists only if a Session runs that graph (tf.saved_model.save
    builds such copies to export)."""
    from pinpoint.tfcompat.api import eager_tensor_type

    if not handles or any(h is None or type(h) is eager_tensor_type() for h in handles):
        return None
    return id(handles[0].graph)


OPTIMIZER_APPLY = "the optimizer's first apply"


def _in_optimizer_apply() -> bool:
    """Made inside a Keras optimizer's `apply` (its public method behind apply_gradients): Keras 3
    builds the slots there, inside the training step, unless `optimizer.build` ran first."""
    keras = sys.modules.get("keras")  # (a program that never imported Keras made no Keras slot)
    try:
        base = keras.optimizers.Optimizer
    except Exception:  # noqa: BLE001 - no Keras, or no Keras 3
        return False
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "apply" and isinstance(f.f_locals.get("self"), base):
            return True
        f = f.f_back
    return False


def _weak(obj):
    try:
        return weakref.ref(obj) if obj is not None else None
    except TypeError:
        return None


def _keras_path() -> str:
    try:
        return keras_scope_path() or ""
    except Exception:  # noqa: BLE001 - no Keras 3
        return ""


def _strategy_name() -> str | None:
    """The tf.distribute strategy in scope (None: TensorFlow's default, no strategy)."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    return type(tf.distribute.get_strategy()).__name__


def _dropped(record: Created, started: float, _ref) -> None:
    """The weakref callback of a recorded variable: where and when the program let go of it (the
    program's line running then: a `del`, a name bound again, a model replaced)."""
    try:
        record.freed_at, record.freed_s = _program_line(), round(time.monotonic() - started, 3)
    except Exception:  # noqa: BLE001 - a callback while the interpreter shuts down: nothing to record
        pass


def _program_line() -> str | None:
    """'file:line' of the innermost frame that is the program's own (not a library's)."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename.replace("\\", "/")
        if not any(part in path for part in _LIBRARY_PARTS):
            return f"{path}:{f.f_lineno}"
        f = f.f_back
    return None


def creation_rows(records: list[Created], eager_updates: dict | None = None,
                  run_graphs: frozenset = frozenset()) -> tuple[dict, ...]:
    """The records as placement inputs (trace.analysis): `handle_ids` only of handles still held
    (an id of a freed object may be another's now), `alive` whether the variable still is, and
    the devices eager ops updated it on (`eager_updates`: handle id -> devices, the recorder's).
    A variable of a graph no Session ran (`run_graphs`: their ids) was never made on a device:
    no row."""
    rows = []
    for r in records:
        if r.graph is not None and r.graph not in run_graphs:
            continue
        handles = [h for h in (ref() for ref in r.handles if ref is not None) if h is not None]
        eager = sorted({d for h in handles for d in (eager_updates or {}).get(id(h), ())})
        rows.append({
            "name": r.name, "kind": r.kind, "class": r.cls, "strategy": r.strategy, "shape": r.shape,
            "dtype": r.dtype, "bytes": r.bytes, "components": list(r.components), "requested": r.requested,
            "layer": r.layer, "source": r.source, "alive": r.alive, **({"by": r.by} if r.by else {}),
            **({"freed_at": {"source": r.freed_at, "s": r.freed_s}} if not r.alive and r.freed_s is not None else {}),
            "handle_ids": [id(h) for h in handles], "eager_update_devices": eager,
        })
    return tuple(rows)
