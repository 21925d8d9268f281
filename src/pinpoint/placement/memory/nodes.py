"""What the memory replay reads of a call: its executed nodes, the devices they ran on, and what
the allocator's events told beyond the graphs (`Measured`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pinpoint.device_names import is_host, parse_name
from pinpoint.placement.graphs.ops import (
    tensor,
)


@dataclass(frozen=True)
class Node:
    """What the replay reads of an executed node: its name, type, data inputs and, for a _Send or a
    _Recv, the rendezvous key pairing them."""

    name: str
    op: str
    inputs: tuple[tuple[str, int], ...] = ()
    tensor_name: str = ""

    @classmethod
    def of(cls, n) -> Node:
        """From a NodeDef of the executed partition graphs."""
        key = n.attr["tensor_name"].s.decode() if "tensor_name" in n.attr else ""
        return cls(n.name, n.op, tuple(tensor(i) for i in n.input if not i.startswith("^")), key)


def this_host(device: str) -> bool:
    """This process's own CPU: where the allocator's events put tf.data's buffers (no op names them).
    An iterator on a GPU, or on another task's CPU (an in-process cluster's worker), hands out an
    element tf.data made there."""
    return is_host(device) and parse_name(device)[0] is None


def other_task(a: str, b: str) -> bool:
    """Whether devices a and b belong to different tasks: a tensor between them crosses the RPC
    layer, which deserializes it into a new buffer on the receiving side (even in one process)."""
    return parse_name(a)[:2] != parse_name(b)[:2]


def data_inputs(n: Node) -> tuple[tuple[str, int], ...]:
    return n.inputs


@dataclass(frozen=True)
class Measured:
    """What a call's allocator events told the replay beyond its graphs and its kernels' order (each
    rule's evidence is in the module's docstring). Times in the order's unit (ps, as traced)."""

    temps: Mapping[str, int] = field(default_factory=dict)  # kernel -> its scratch while it runs (bytes)
    released: Mapping[str, int] = field(default_factory=dict)  # node -> when the RPC layer let go of it
    temp_after: Mapping[str, int] = field(default_factory=dict)  # kernel -> its scratch's delay after its start
    inputs_after: Mapping[str, int] = field(default_factory=dict)  # kernel -> its inputs let go of after its end
    outputs_after: Mapping[str, int] = field(default_factory=dict)  # kernel -> its outputs made after its start
    constants: frozenset = frozenset()  # the constants the call made (its copy of the function's first run)
    copied: frozenset = frozenset()  # the updates that wrote a copy (a read of another call held the variable)


def bytes_of(outs: list | None) -> list[int]:
    """Each output's bytes from (dtype enum, dims) (0: unknown, or no byte size)."""
    from pinpoint.placement.graphs.ops import dtype_size, shape_bytes

    return [(shape_bytes(dtype_size(dtype), dims) or 0) if dims is not None else 0 for dtype, dims in outs or ()]
