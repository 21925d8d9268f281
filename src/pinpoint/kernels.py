"""Which ops a GPU machine can run on its GPU: TensorFlow's own kernel registry.

The wheel installed here registers its GPU kernels even on a machine without a GPU, with
the dtype constraints of each kernel. An op has a GPU kernel when a kernel registered for
device type GPU (or DEFAULT, TensorFlow's any-device kernels) accepts the op's type
attributes. The placer makes exactly this check before it moves an op to the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

GPU_TYPES = ("GPU", "DEFAULT")


@lru_cache(maxsize=2048)
def _kernels(op_type: str) -> tuple[tuple[str, str, tuple[tuple[str, frozenset[int]], ...]], ...]:
    """(device type, label, ((attr, allowed dtype enums), ...)) per registered kernel."""
    from tensorflow.python.framework import kernels

    try:
        registered = kernels.get_registered_kernels_for_op(op_type).kernel
    except Exception:  # noqa: BLE001 - not a registered op (e.g. a function name): no answer
        return ()
    return tuple(
        (k.device_type, k.label,
         tuple((c.name, frozenset(c.allowed_values.list.type)) for c in k.constraint))
        for k in registered
    )


@lru_cache(maxsize=2048)
def _defaults(op_type: str) -> dict[str, Any]:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    if op_def is None:
        return {}
    return {a.name: a.default_value for a in op_def.attr if a.HasField("default_value")}


def _types(value) -> tuple[int, ...] | None:
    """The dtype enums an AttrValue holds (type or list(type)); None for other attrs."""
    which = value.WhichOneof("value")
    if which == "type":
        return (value.type,)
    if which == "list" and value.list.type:
        return tuple(value.list.type)
    return None


def _attr_types(op_type: str, attrs: Mapping[str, Any], name: str) -> tuple[int, ...] | None:
    if name in attrs:
        return _types(attrs[name])
    default = _defaults(op_type).get(name)
    return _types(default) if default is not None else None


def _accepts(op_type: str, attrs: Mapping[str, Any], constraints) -> bool:
    for name, allowed in constraints:
        got = _attr_types(op_type, attrs, name)
        if got is None or any(t not in allowed for t in got):
            return False
    return True


def missing_gpu_kernel(op_type: str, attrs: Mapping[str, Any]) -> str | None:
    """Why a GPU machine would run this op on the CPU ("no GPU kernel for RandomIndexShuffle
    (T=int64)"), or None when a GPU kernel accepts it or the op is not a registered kernel op
    (a function call, which the runtime places by its body)."""
    kernels = _kernels(op_type)
    if not kernels:
        return None
    label = attrs["_kernel"].s.decode() if "_kernel" in attrs else ""
    for device_type, klabel, constraints in kernels:
        if device_type in GPU_TYPES and klabel == label and _accepts(op_type, attrs, constraints):
            return None
    return f"no GPU kernel for {op_type}{_describe(op_type, attrs)}"


def _describe(op_type: str, attrs: Mapping[str, Any]) -> str:
    """' (T=int64, out_idx=int32)': the op's type attributes (from its OpDef, so the text does not
    depend on which kernel libraries happen to be loaded)."""
    from tensorflow.python.framework import dtypes, op_def_registry

    op_def = op_def_registry.get(op_type)
    names = sorted(a.name for a in op_def.attr if a.type in ("type", "list(type)")) if op_def else []
    parts = []
    for name in names:
        got = _attr_types(op_type, attrs, name)
        if got:
            parts.append(f"{name}={','.join(dtypes.as_dtype(t).name for t in got)}")
    return f" ({', '.join(parts)})" if parts else ""
