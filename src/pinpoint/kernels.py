"""Which ops a GPU machine can run on its GPU: TensorFlow's own kernel registry.

The wheel installed here registers its GPU kernels even on a machine without a GPU, with
the dtype constraints of each kernel. The lookup is TensorFlow's own (`FindKernelDef`, via
`TryFindKernelClass`): the op's NodeDef with a GPU device, its type attributes matched against
each kernel's constraints, attr defaults filled in, kernel labels and DEVICE_DEFAULT kernels
honoured, i.e. the check the placer makes before it moves an op to the CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from pinpoint.tfcompat.api import dtype_name, find_kernel, op_def

_cache: dict[tuple, bool] = {}


def _types(value) -> tuple[int, ...] | None:
    """The dtype enums an AttrValue holds (type or list(type)); None for other attrs."""
    which = value.WhichOneof("value")
    if which == "type":
        return (value.type,)
    if which == "list" and value.list.type:
        return tuple(value.list.type)
    return None


@contextlib.contextmanager
def _quiet_stderr():
    """TensorFlow logs a multi-line warning to fd 2 for every lookup that finds no kernel; a miss
    is an answer here, not a problem, so the lookup runs with fd 2 pointed at /dev/null."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def has_kernel(op_type: str, attrs: Mapping[str, Any], device_type: str) -> bool:
    """True when `device_type` ("GPU", "CPU") has a kernel for this op and these attrs."""
    # Kernels are chosen by the type attributes and the `_kernel` label only: key on those.
    chosen = []
    for k, v in attrs.items():
        types = _types(v)
        if types is not None:
            chosen.append((k, types))
        elif k == "_kernel":
            chosen.append((k, v.s))
    key = (op_type, device_type, tuple(sorted(chosen)))
    found = _cache.get(key)
    if found is None:
        from tensorflow.core.framework import node_def_pb2

        node = node_def_pb2.NodeDef(op=op_type, name="pinpoint_kernel_probe", device=f"/device:{device_type}:0")
        for k, v in attrs.items():
            node.attr[k].CopyFrom(v)
        with _quiet_stderr():
            found = find_kernel(node.SerializeToString())
        _cache[key] = found
    return found


def missing_gpu_kernel(op_type: str, attrs: Mapping[str, Any]) -> str | None:
    """Why a GPU machine would run this op on the CPU ("no GPU kernel for PadV2 (T=int64,
    Tpaddings=int32)"), or None when a GPU kernel accepts it, or the op has no kernel on any
    device (not a registered op, e.g. a function name, or an op a graph pass rewrites)."""
    if op_def(op_type) is None or has_kernel(op_type, attrs, "GPU"):
        return None
    if not has_kernel(op_type, attrs, "CPU"):
        return None
    return f"no GPU kernel for {op_type}{_describe(op_type, attrs)}"


def _describe(op_type: str, attrs: Mapping[str, Any]) -> str:
    """' (T=int64, out_idx=int32)': the op's type attributes (from its OpDef, defaults filled in)."""
    definition = op_def(op_type)
    parts = []
    for a in sorted(definition.attr, key=lambda a: a.name) if definition else []:
        if a.type not in ("type", "list(type)"):
            continue
        value = attrs[a.name] if a.name in attrs else (a.default_value if a.HasField("default_value") else None)
        got = _types(value) if value is not None else None
        if got:
            parts.append(f"{a.name}={','.join(dtype_name(t) for t in got)}")
    return f" ({', '.join(parts)})" if parts else ""
