"""The private TensorFlow and Keras names Pinpoint reads or calls, behind plain functions.

Each one is a registered target (`targets.TARGETS`, checked at start); the rest of Pinpoint calls
these functions and never spells a private module or attribute itself (tests/test_tfcompat.py
keeps it so). TensorFlow is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ---- device names ----------------------------------------------------------------------------

# Class -> its device getter as the runtime names devices, while `patches.show_device_names` shows
# the program other names (empty otherwise).
RUNTIME_DEVICE: dict[type, Callable[[Any], str]] = {}


def device_of(x) -> str:
    """`x.device` as the runtime names it (a tensor, an op, a resource variable through its handle),
    whatever name the program is shown: under `--gpus` emulation a program reads /GPU:i where
    Pinpoint reads the logical CPU that emulates it."""
    if not RUNTIME_DEVICE:
        return getattr(x, "device", "") or ""
    get = _runtime_getter(type(x))
    if get is None:
        handle = getattr(x, "_handle", None)  # a resource variable's: what its `device` reads
        if handle is not None and (get := _runtime_getter(type(handle))) is not None:
            x = handle
    return (get(x) if get is not None else getattr(x, "device", "")) or ""


def _runtime_getter(cls: type):
    get = RUNTIME_DEVICE.get(cls)
    if get is None and RUNTIME_DEVICE:
        get = next((RUNTIME_DEVICE[c] for c in cls.__mro__[1:] if c in RUNTIME_DEVICE), None)
        if get is not None:
            RUNTIME_DEVICE[cls] = get
    return get


# ---- the eager context -----------------------------------------------------------------------


def requested_device() -> str:
    """The device the innermost `tf.device` scopes ask for now, merged as TensorFlow merges them
    for a new op ('' when none). While a function is traced, the graph's scope stack; eagerly,
    the context's device."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    if context.executing_eagerly():
        return context.context().device_name or ""
    probe = _Probe()
    for spec in ops.get_default_graph()._device_function_stack.peek_objs():  # innermost first
        if spec.is_null_merge:
            continue
        if spec.function is None or not spec.fast_string_merge:
            break  # tf.device(None) clears the outer scopes; a device function is not a string request
        probe.device = spec.string_merge(probe)
    return probe.device


class _Probe:
    """Stands in for a new op's NodeDef while the scope stack is merged."""

    device = ""


def current_device() -> str:
    """The eager context's current device scope, fully named ('' outside any scope)."""
    from tensorflow.python.eager import context

    return context.context().device_name


def wait_for_executor() -> None:
    """Wait until every op the calling thread's eager executor was given has run: a
    ClusterCoordinator's closure calls its function on an asynchronous executor of its own, so the
    call returns before the worker has run it."""
    from tensorflow.python.eager import context

    context.context().executor.wait()


def executing_eagerly(fn) -> bool:
    """True when tf.function `fn` (an AtomicFunction) is called eagerly, not while tracing."""
    return fn._bound_context.executing_eagerly()


def eager_state():
    """The eager context's thread-local state: `.is_eager` reads the calling thread's mode (False
    while a tf.function traces), a cheaper test than `executing_eagerly` for a hot path."""
    from tensorflow.python.eager import context

    return context.context()._thread_local_data


def in_cluster_task() -> bool:
    """Whether this process is a task of a multi-process TensorFlow cluster: its strategy
    (multi-worker mirrored, parameter server) has configured the coordination service."""
    from tensorflow.python.eager import context

    return context.context().coordination_service is not None


def eager_tensor_type() -> type:
    """The type of a tensor in eager mode (a traced one is symbolic): `type(t) is` it tells them apart."""
    from tensorflow.python.framework import ops

    return ops.EagerTensor


def soft_placement() -> bool:
    """Whether the program's ops and tf.functions run with soft placement: its own
    tf.config.set_soft_device_placement, else TensorFlow 2's default, on (the public getter answers
    False while a function is being traced, though the function runs with it on)."""
    from tensorflow.python.eager import context

    setting = context.context()._soft_device_placement
    return True if setting is None else bool(setting)


def forget_parsed_devices() -> None:
    """Drop TensorFlow's caches of parsed device strings (parsed before emulation began)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import device_spec

    device_spec._STRING_TO_COMPONENTS_CACHE.clear()
    context._device_parsing_cache.clear()


def logical_device(name: str, device_type: str):
    from tensorflow.python.eager.context import LogicalDevice

    return LogicalDevice(name=name, device_type=device_type)


def physical_device(name: str, device_type: str):
    from tensorflow.python.eager.context import PhysicalDevice

    return PhysicalDevice(name=name, device_type=device_type)


# ---- graphs and kernels ------------------------------------------------------------------------


def set_op_attr(op, name: str, value) -> None:
    """Set attr `name` (an AttrValue) of a graph op before it is instantiated."""
    op._set_attr(name, value)


def set_op_device(op, device: str) -> None:
    """Request `device` for a graph op before its graph is sent to the runtime."""
    op._set_device(device)


def find_kernel(node_def: bytes) -> bool:
    """TensorFlow's own kernel lookup for a serialized NodeDef (device, type attrs, labels)."""
    from tensorflow.python.util import _pywrap_kernel_registry

    return bool(_pywrap_kernel_registry.TryFindKernelClass(node_def))


def op_def(op_type: str):
    """The registered OpDef of `op_type`, or None (not an op: e.g. a function name)."""
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


def dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(enum).name


def dataset_graph(ds):
    """A tf.data.Dataset's serialized GraphDef (a string tensor)."""
    return ds._as_serialized_graph()


# ---- distribution ------------------------------------------------------------------------------


def local_devices() -> list[str]:
    """The names of the devices MirroredStrategy() uses by default (every local GPU, else the CPU)."""
    from tensorflow.python.distribute import mirrored_strategy

    return [d.name for d in mirrored_strategy.all_local_devices()]


def canonical_device(name: str) -> str:
    from tensorflow.python.distribute import device_util

    return device_util.canonicalize(name)


def collective_keys(group_key_start: int):
    from tensorflow.python.distribute import cross_device_utils

    return cross_device_utils.CollectiveKeys(group_key_start=group_key_start)


def ring_all_reduce(devices: list[str], collective_keys):
    """TensorFlow's collective all-reduce among `devices` with the ring implementation."""
    from tensorflow.python.distribute import collective_util, cross_device_ops

    ring = collective_util.Options(implementation=collective_util.CommunicationImplementation.RING)
    return cross_device_ops.CollectiveAllReduce(devices=devices, group_size=len(devices), options=ring,
                                                collective_keys=collective_keys)


def collective_ordering_tokens() -> set[int]:
    """ids of the collective-ordering token variables every live all-reduce launcher of a
    tf.distribute strategy keeps per device (TensorFlow's own variables, not the program's)."""
    import gc

    from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher

    out = set()
    for obj in gc.get_objects():
        if isinstance(obj, CollectiveReplicaLauncher):
            token = getattr(obj, "_ordering_token", None)
            if token is not None:
                out.add(id(token))
    return out


def ordering_token(launcher):
    """The collective-ordering token variable an all-reduce launcher made (None: it uses none)."""
    return getattr(launcher, "_ordering_token", None)


# ---- Keras -------------------------------------------------------------------------------------


def child_layers(layer) -> list:
    """A Keras layer's direct sublayers (attributes, lists, dicts), in creation order."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


def keras_scope_path() -> str:
    """Keras' current name-scope path ('model/dense_1'): the layer whose variables are being made."""
    from keras.src.backend.common.name_scope import current_path

    return current_path()


def keras_variable_class() -> Any:
    """Keras 3's Variable class (a tuple no object is an instance of when Keras has none)."""
    try:
        from keras.src.backend.common.variables import Variable
    except ImportError:  # pragma: no cover - Keras 3 ships with TensorFlow 2.21
        return ()
    return Variable


def keras_wrapped(v):
    """The tf.Variable (or distributed variable) a Keras variable wraps; None when it has none."""
    return getattr(v, "_value", None)


def resource_shared_name(v) -> str | None:
    """The shared name of a resource variable's resource (how the graphs name it), None if none."""
    return getattr(v, "_shared_name", None)


def keras_deferred(var) -> bool:
    """The Keras weight was declared without memory (Keras 3 in a symbolic build, a
    StatelessScope): its TensorFlow variable is created later, under whatever scope is active then."""
    return getattr(var, "_value", False) is None


def set_initial_epoch(model, epoch: int) -> None:
    """The epoch model.fit starts from (a resumed fit)."""
    model._initial_epoch = epoch
