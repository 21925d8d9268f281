"""Place ops under emulation the way TensorFlow's placer does on a GPU machine.

With real GPUs the placer puts an op that has no device request on /GPU:0 when a GPU kernel
accepts its dtypes, else on the host. Emulated GPUs are logical CPU devices, so without help
those ops land on the host /CPU:0 (the runtime's default device). `GpuPlacement` installs a
device function, TensorFlow's own mechanism for default placement, around the traced step:

- an op with a device request keeps it (pins, strategy replica scopes);
- an op that reads or writes a resource (other than a function call), or is colocated with
  another op, gets none: the runtime colocates it with its variable (or group), as on a GPU
  machine;
- any other op goes to the emulated /GPU:0 when the kernel registry has a GPU kernel for
  its type attributes (marked with EMULATED_ATTR, so the report does not mistake the request
  for the user's), else stays unrequested and the runtime puts it on the host.

With soft placement off, an op pinned to an emulated GPU that has no GPU kernel fails the
trace, as its instantiation would fail on a GPU machine.
"""

from __future__ import annotations

import contextlib
import re

from pinpoint.device_names import DeviceMap, local_name, normalize
from pinpoint.errors import PlacementError
from pinpoint.kernels import missing_gpu_kernel
from pinpoint.placement import CALLS, EMULATED_ATTR, gradient_re, layer_re
from pinpoint.tfcompat.api import device_of, set_op_attr

_GRAD_RE = gradient_re()


def default_device(dm: DeviceMap) -> str | None:
    """The physical device a GPU machine's runtime would use for unrequested ops, under emulation."""
    if not dm.emulated or "/GPU:0" not in dm.aliases:
        return None
    return "/device:" + dm.aliases["/GPU:0"].lstrip("/")


def eager_default(dm: DeviceMap, strategy: str):
    """Eager default device for state created outside a strategy's own placement (strategy
    `none`): variables a GPU machine would create on /GPU:0."""
    device = default_device(dm)
    if device is None or strategy != "none":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.device(device)


class GpuPlacement:
    """Callable returning the device-function scope for tracing a training step (a no-op without
    emulation). `refusal` keeps the clean one-line error when soft placement is off: TensorFlow's
    tracer rewrites an exception raised inside a trace into a multi-line message."""

    def __init__(self, dm: DeviceMap, plan=None, *, soft_placement: bool = True):
        self.dm, self.plan, self.soft_placement = dm, plan, soft_placement
        self.device = default_device(dm)
        self.refusal: PlacementError | None = None

    def __call__(self):
        if self.device is None:
            return contextlib.nullcontext()
        import tensorflow as tf

        emulated = {normalize(p) for p in self.dm.aliases.values()}

        def place(op) -> str:
            device = device_of(op)
            if device:
                if not self.soft_placement and local_name(device) in emulated:
                    self._refuse(op)
                return device
            return self.unrequested(op) or ""

        return tf.compat.v1.device(place)

    def unrequested(self, op) -> str | None:
        """Where a GPU machine's placer puts `op`, which has no device request: the emulated
        /GPU:0 (the op is marked EMULATED_ATTR), or None to leave it to the runtime."""
        import tensorflow as tf
        from tensorflow.core.framework import attr_value_pb2

        if self.device is None or op.type == "Placeholder" or _colocated(op):
            return None
        if op.type not in CALLS and any(t.dtype == tf.resource for t in op.inputs):
            return None
        if missing_gpu_kernel(op.type, op.node_def.attr) is not None:
            return None  # the real placer runs it on the host
        set_op_attr(op, EMULATED_ATTR, attr_value_pb2.AttrValue(b=True))
        return self.device

    def _refuse(self, op) -> None:
        reason = missing_gpu_kernel(op.type, op.node_def.attr)
        if reason is None:
            return
        spec = self.dm.spec(local_name(device_of(op)))
        field = rule_for(op.name, device_of(op), self.plan, self.dm)
        name = re.sub(r"^while(_\d+)?/", "", op.name)  # the trainer's step loop, not the user's scope
        self.refusal = PlacementError(
            f"{field}: op '{name}' is pinned to {spec} but a GPU machine has {reason} and "
            "train.pinning.soft_placement is false, so it would fail there; enable soft_placement "
            "(the op then runs on the host) or keep that op out of the GPU's device scope"
        )
        raise self.refusal


def _colocated(op) -> bool:
    return op.colocation_groups() != [b"loc:@" + op.name.encode()]


def rule_for(op_name: str, device: str, plan, dm: DeviceMap) -> str:
    """The config field whose device request placed this op (best match by scope and device)."""
    where = local_name(device)
    same = lambda spec: bool(spec) and local_name(dm.physical(spec)) == where  # noqa: E731
    if plan is not None:
        if same(plan.gradients) and _GRAD_RE.search(op_name):
            return "train.pinning.gradients"
        for layer, dev in (plan.layers or {}).items():
            if same(dev) and layer_re(layer).search(op_name):
                return f"train.pinning.layers.{layer}"
        for fieldname in ("input", "variables", "gradients"):
            if same(getattr(plan, fieldname)):
                return f"train.pinning.{fieldname}"
    return "train.strategy"
