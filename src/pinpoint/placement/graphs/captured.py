"""The graphs one captured call left: its functions' pre-placement graphs and the partition
graphs the runtime ran, per device, with the eager ops that ran meanwhile.

`op.device` is only the request. The runtime's placer (with soft placement and kernel
availability) decides, then the graph is partitioned per device with _Send/_Recv pairs on every
cross-device edge. Those partition graphs are recorded when a function is instantiated with graph
collection on (placement.capture.graphs does that); this module is the data they leave.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pinpoint.device_names import DeviceMap
from pinpoint.placement.graphs.ops import ARGS, BOUNDARY, EMULATED_ATTR, RETVALS

if TYPE_CHECKING:  # reading a GraphDef needs no TensorFlow: its protobuf module starts it
    from tensorflow.core.framework import graph_pb2


@dataclass
class CapturedGraphs:
    """What one captured call executed: per function, its pre-placement and partition graphs."""

    step: int
    # One entry per instantiated function: (function name, pre-optimization GraphDef,
    # list of partition GraphDefs, each holding one device's nodes with assigned devices).
    functions: list[tuple[str, graph_pb2.GraphDef, list[graph_pb2.GraphDef]]] = field(default_factory=list)
    # Static output shapes from the traced Python graph, by op name: [(dtype enum, dims or
    # None), ...] per output. _Send nodes carry a dtype but no shape; this sizes transfers.
    shapes: dict[str, list[tuple[int, list[int] | None]]] = field(default_factory=dict)
    # _Arg node name -> the captured eager tensor fed to it (variable handles), so update
    # ops can be attributed to the variable whose resource they write.
    arg_values: dict[str, Any] = field(default_factory=dict)
    # How this capture was taken when it differs from a plain call (shown in placement notes).
    notes: list[str] = field(default_factory=list)
    # The steps these graphs stand for when more than `step` (every step a captured
    # multi-step function ran inside the sample window executes the same graphs).
    steps: list[int] = field(default_factory=list)
    # The XLA-compiled calls expanded into their ops (placement.steps): (function, the device
    # its one program ran on, as the runtime names it).
    xla_calls: list[tuple[str, str]] = field(default_factory=list)
    # Node name -> requested device, when a view renamed the nodes (else read from the graphs).
    requested: dict[str, str] | None = None
    # Node name -> pre-optimization NodeDef (op type and attrs), when a view renamed the nodes.
    defs: dict[str, Any] | None = None
    # A function body's node name (as its NodeDefs' inputs name it) -> the name in `defs`.
    def_names: dict[str, str] = field(default_factory=dict)
    # Input-pipeline ops (IteratorGetNext) whose traced shape has a dynamic dimension: sized
    # from the bytes the runtime reports they handed out (size_iterator_outputs).
    dynamic_inputs: list[str] = field(default_factory=list)
    # The traced shapes of the ops inside each cond's branch functions, by '<cond op>/<then|else>/
    # <op>' (the traced graph holds only the If op); add_branch_shapes names them as executed.
    branch_shapes: dict[str, list] = field(default_factory=dict)
    # Node name -> why its output could not be sized, when a reason is known.
    unsized_why: dict[str, str] = field(default_factory=dict)
    # Eager ops the runtime ran on its own threads during the call (a py_function body, run as
    # one-op functions): (op type, device). Reported, not part of the function.
    runtime_ops: list[tuple[str, str]] = field(default_factory=list)
    # Where sizing failed (TensorFlow's shape inference raised, or disagreed with the traced graph):
    # one line each naming the function and the op; the summary shows them and tests fail on them.
    sizing_errors: list[str] = field(default_factory=list)
    # ids of the call's arguments that an eager iterator op handed out on a device other than the
    # host (`for x in dist_dataset: step(x)`): elements the iterator copied there before the step.
    input_arg_ids: set[int] = field(default_factory=set)
    # With memory measurement on (placement.memory): the allocator's events over the profiled call
    # (placement.memory.MemEvent) and its own process-wide peak over the call; None: not measured.
    memory_events: list | None = None
    memory_peak: int | None = None
    memory_why: str | None = None
    memory_read_ps: int | None = None  # when the peak was read, in the trace's clock
    memory_trace: Any = None  # the profiled call's XSpace (its kernels' order: the memory prediction)
    memory_gpu_peaks: dict | None = None  # a GPU machine's: each GPU allocator's own peak over the call
    memory_first_call: bool = True  # measured on the function's first call (its constants made then)
    # The later calls measured the same way (trace.functions.MEMORY_CALLS): (call number, a
    # CapturedGraphs holding that call's memory_* fields). The executor's order, and so which
    # temporaries overlap, changes from call to call.
    memory_more: list[tuple[int, Any]] = field(default_factory=list)

    @property
    def partition_graphs(self) -> list[graph_pb2.GraphDef]:
        return [g for _, _, parts in self.functions for g in parts]

    @property
    def requested_graphs(self) -> list[graph_pb2.GraphDef]:
        return [pre for _, pre, _ in self.functions]


def has_dynamic_dims(outs: list[tuple[int, list[int] | None]]) -> bool:
    """An op's output shapes (dtype enum, dims) leave a rank or a dimension unknown."""
    return any(dims is None or None in dims for _, dims in outs)


def eager_op_function(graph) -> str | None:
    """The op type if `graph` is the one-op function the eager runtime wraps an eager op in
    (TensorFlow runs every eager op as a function: its arguments and results are named after the
    op's own input and output args, its one node after the op type), else None. A py_function's
    body runs this way on the runtime's threads while the calling function is captured."""
    from pinpoint.tfcompat.api import op_def as registered_op_def

    body = [n for n in graph.node if n.op not in BOUNDARY]
    if len(body) != 1 or body[0].name != body[0].op:
        return None
    op_def = registered_op_def(body[0].op)
    if op_def is None:
        return None
    ins = {a.name for a in op_def.input_arg}
    outs = tuple(a.name for a in op_def.output_arg)
    for n in graph.node:
        if n.op in ("_Arg", "_DeviceArg") and n.name.split("_", 1)[0] not in ins and n.name not in ins:
            return None
        if n.op in ("_Retval", "_DeviceRetval") and not (n.name.endswith("_RetVal") and n.name.startswith(outs)):
            return None
    return body[0].op


def _peel_eager_ops(pre):
    """`pre` less the one-op functions the runtime appended to it (it records the graphs of a
    py_function body's eager ops into the calling function's entry): (graph, their nodes)."""
    nodes = list(pre.node)
    peeled = []
    while True:
        i = len(nodes)
        while i > 0 and nodes[i - 1].op in RETVALS:
            i -= 1
        body = i - 1
        j = body
        while j > 0 and nodes[j - 1].op in ARGS:
            j -= 1
        if body <= 0 or j == body or j == 0:
            break
        block = _graph_def()
        block.node.extend(nodes[j:])
        if not eager_op_function(block):
            break
        peeled.append(nodes[body])
        nodes = nodes[:j]
    if not peeled:
        return pre, []
    out = _graph_def()
    out.CopyFrom(pre)
    del out.node[:]
    out.node.extend(nodes)
    return out, peeled


def add_function_graphs(captured: CapturedGraphs, md, name) -> None:
    """The run metadata's function graphs, less the one-op functions of eager ops that ran on the
    runtime's threads meanwhile (kept in `runtime_ops`)."""
    for fg in md.function_graphs if md is not None else []:
        pre = fg.pre_optimization_graph
        if eager_op_function(pre):
            for part in fg.partition_graphs:
                captured.runtime_ops.extend((n.op, n.device) for n in part.node if n.op not in BOUNDARY)
            continue
        pre, peeled = _peel_eager_ops(pre)
        captured.runtime_ops.extend((n.op, n.device) for n in peeled if not fg.partition_graphs)
        parts = []
        for part in fg.partition_graphs:
            if eager_op_function(part):
                captured.runtime_ops.extend((n.op, n.device) for n in part.node if n.op not in BOUNDARY)
            else:
                parts.append(part)
        fname = name or (pre.library.function[0].signature.name if pre.library.function else "")
        captured.functions.append((fname, pre, parts))


def function_of(captured: CapturedGraphs, node: str | None) -> str:
    """The captured function whose partition graphs hold `node` (or the first one's name)."""
    for fname, _, parts in captured.functions:
        if any(n.name == node for g in parts for n in g.node):
            return fname
    return captured.functions[0][0] if captured.functions else "the captured call"


def requested_devices(cap) -> dict[str, str]:
    """Node name -> requested device (pre-optimization NodeDef.device), when the user's code (or
    a strategy) requested one: GPU emulation's own default requests are not counted."""
    if getattr(cap, "requested", None) is not None:
        return cap.requested
    return {name: n.device for name, n in requested_defs(cap).items() if n.device and EMULATED_ATTR not in n.attr}


def requested_defs(cap) -> dict:
    """Node name -> pre-optimization NodeDef (the op type and attrs the code asked for)."""
    if getattr(cap, "defs", None) is not None:
        return cap.defs
    out = {}
    for pre in cap.requested_graphs:
        for n in pre.node:
            out[n.name] = n
        for f in pre.library.function:
            for n in f.node_def:
                out.setdefault(n.name, n)
    return out


def node_devices(partition_graphs: Iterable, namer: DeviceMap) -> dict[str, str]:
    """Node name -> spec device from the partition graphs the runtime ran (a name seen on two
    devices, in two functions, is left out: its events cannot be attributed)."""
    out: dict[str, str] = {}
    clash: set[str] = set()
    for g in partition_graphs:
        for n in g.node:
            dev = namer.canonical_spec(n.device)
            if not dev:
                continue
            if out.setdefault(n.name, dev) != dev:
                clash.add(n.name)
    for name in clash:
        out.pop(name, None)
    return out


def _graph_def():
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef()
