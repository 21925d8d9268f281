"""Record the device requests a program made for its Keras layers and their weights, as it made
them: the `tf.device` scope active when each layer was created, built and called, and when each
weight was created (Keras 3 creates a layer's weights lazily, at its first call).

A request is kept as the physical device TensorFlow parsed it to (under `--gpus` emulation
`/GPU:1` is the logical CPU standing in for it; the DeviceMap shows it as `/GPU:1` again).
Pinpoint's own default scope (the emulated `/GPU:0` around the program) is not a request.
`placement.requests` judges the weights against these requests.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

from pinpoint.tfcompat.api import device_of, keras_deferred, requested_device
from pinpoint.tfcompat.patches import Patches


@dataclass
class LayerRequests:
    """What one Keras layer was asked for: at creation, at an explicit build, and at its calls."""

    ref: weakref.ref
    created: str = ""
    built: str = ""
    called: set = field(default_factory=set)


@dataclass
class WeightRequest:
    """One weight (a Keras variable) and the request active when it was created."""

    ref: weakref.ref
    layer: weakref.ref
    requested: str = ""
    deferred: bool = False  # declared in a symbolic build: created later, outside `requested`


class RequestLog:
    """Install with `install()` (the Keras layer hooks), read `layers` / `weights`, `uninstall()`."""

    def __init__(self, default_device: str = ""):
        self.default_device = default_device  # Pinpoint's own scope around the program
        self.layers: dict[int, LayerRequests] = {}
        self.weights: dict[int, WeightRequest] = {}
        self._patches = Patches()

    def request(self) -> str:
        """The program's request now ('' for none, or for Pinpoint's default scope)."""
        try:
            dev = requested_device()
        except Exception:  # noqa: BLE001 - a TensorFlow without these internals: no request known
            return ""
        return "" if dev == self.default_device else dev

    def _layer(self, layer) -> LayerRequests:
        rec = self.layers.get(id(layer))
        if rec is None or rec.ref() is not layer:
            rec = self.layers[id(layer)] = LayerRequests(weakref.ref(layer))
        return rec

    def install(self) -> RequestLog:
        try:
            from keras.layers import Layer
        except ImportError:  # no Keras 3: nothing to hook
            return self
        log = self
        new, call, add_weight = Layer.__dict__["__new__"], Layer.__call__, Layer.add_weight

        def recorded_new(cls, *args, **kwargs):
            obj = new(cls, *args, **kwargs)
            rec = log._layer(obj)
            rec.created = log.request()
            build = obj.build  # Keras' per-instance build wrapper

            @functools.wraps(build)
            def recorded_build(*a, **kw):
                if not obj.built:
                    rec.built = log.request() or rec.built
                return build(*a, **kw)

            obj.build = recorded_build
            return obj

        def recorded_call(layer, *args, **kwargs):
            dev = log.request()
            if dev and not _in_replica_fn():
                log._layer(layer).called.add(dev)
            return call(layer, *args, **kwargs)

        def recorded_add_weight(layer, *args, **kwargs):
            dev = log.request()
            var = add_weight(layer, *args, **kwargs)
            try:
                log.weights[id(var)] = WeightRequest(weakref.ref(var), weakref.ref(layer), dev,
                                                     bool(dev) and keras_deferred(var))
            except TypeError:
                pass  # not weak-referenceable: not judged
            return var

        self._patches.replace("Layer.__new__", staticmethod(recorded_new))
        self._patches.replace("Layer.__call__", recorded_call)
        self._patches.replace("Layer.add_weight", recorded_add_weight)
        return self

    def uninstall(self) -> None:
        self._patches.close()

    # ---- read back ---------------------------------------------------------------------------
    def units(self) -> tuple[str, ...]:
        """The layers a plan moves, of every Keras layer the program created and still holds
        (placement.units.program_units). Read while the program's objects live."""
        from pinpoint.placement import program_units

        return program_units(x for x in (rec.ref() for rec in list(self.layers.values())) if x is not None)

    def rows(self) -> list[dict]:
        """One row per (weight, request) the program made for it: `layer` and `variable` (the
        weight's Keras path, split), `requested` and `actual` (physical device strings) and
        `how` the request was made: "created" (the scope around the weight's own creation),
        "declared" (the same, for a weight Keras declared in a symbolic build and created
        later), "layer created" / "layer built" (around the creation or an explicit `build()`
        of its layer or of an enclosing model, `by`; the innermost such layer counts) or
        "layer called".
        The live objects are read now: call it before the program's objects are released."""
        scoped = []  # (weights of the layer, kind, device, its weights' ids)
        for rec in list(self.layers.values()):
            layer = rec.ref()
            if layer is None or not (rec.created or rec.built or rec.called):
                continue
            try:
                ids = {id(w) for w in layer.weights}
            except Exception:  # noqa: BLE001 - a half-built layer: nothing to judge
                continue
            by = str(getattr(layer, "path", None) or getattr(layer, "name", ""))
            if rec.built:
                scoped.append((len(ids), 0, "layer built", rec.built, ids, by))
            if rec.created:
                scoped.append((len(ids), 1, "layer created", rec.created, ids, by))
            for dev in sorted(rec.called):
                scoped.append((len(ids), 2, "layer called", dev, ids, by))
        scoped.sort(key=lambda s: (s[0], s[1]))
        out = []
        for wid, w in list(self.weights.items()):
            var = w.ref()
            actual = _device_of(var)
            if not actual:
                continue
            path = str(getattr(var, "path", "") or getattr(var, "name", ""))
            layer, _, name = path.rpartition("/")
            seen = set()
            own = w.requested
            if own:
                seen.add(own)
                how = "declared" if w.deferred else "created"
                out.append({"layer": layer, "variable": name, "requested": own, "actual": actual, "how": how,
                            "by": layer})
            made, read = bool(own), None
            for _, _, how, dev, ids, by in scoped:
                called = how == "layer called"
                if wid not in ids or dev in seen or (made if not called else read not in (None, by)):
                    continue
                # The innermost layer's request stands: for the weight's creation (its own scope
                # first), and for its reads (the calls of the innermost layer called in a scope).
                made = made or not called
                read = by if called else read
                seen.add(dev)
                out.append({"layer": layer, "variable": name, "requested": dev, "actual": actual, "how": how,
                            "by": by})
        return out


def _in_replica_fn() -> bool:
    """Inside a strategy's replica function: its device scopes are the strategy's, not requests."""
    import tensorflow as tf

    return tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False


def _device_of(var) -> str:
    """Where a Keras weight's TensorFlow variable lives ('' when it was never created, and for a
    distributed variable: its components are the strategy rules' to judge)."""
    if var is None:
        return ""
    try:
        value = var.value
    except Exception:  # noqa: BLE001 - never initialized (deferred): it holds no memory anywhere
        return ""
    if isinstance(getattr(value, "values", None), (tuple, list)):
        return ""
    return device_of(value)
