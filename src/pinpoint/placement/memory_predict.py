"""Memory per device, predicted from the executed graphs: each tensor's bytes from its shape, its
buffer's life from the order the kernels ran, and TensorFlow's own buffer rules.

The rules (checked against the allocator's events on emulated devices, docs/memory.md):
- an op that hands an input on unchanged allocates nothing (Identity, Reshape, a cond's Switch and
  Merge, a loop's Enter and Exit, ReadVariableOp: the variable's own buffer);
- a received tensor is the sent buffer itself (logical CPU devices share it; a GPU would copy it),
  written in place by its last reader once the send is done;
- an element-wise op (and a collective all-reduce) writes into an input buffer of its size when it is
  that buffer's last reader;
- a buffer is freed when the last op reading it (through any alias) has finished;
- a collective all-reduce holds a chunk of its input (input / group size) while it runs;
- an update of a variable that a read still holds copies the variable first (copy-on-write), and
  the copy is the variable from then on;
- constants, arguments and variables exist before the call: not part of its peak.

What the rules leave out is said where the prediction is compared with the measurement: kernel
temporaries (oneDNN's pooling workspace, convolution scratch) and tf.data's host buffers.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

_ALIAS_FIRST = {"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "PreventGradient", "Enter",
                "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "EnsureShape", "Switch",
                "RefSwitch", "_Retval", "_DeviceRetval"}
_HANDLE_PASS = {"Identity", "Enter", "RefEnter", "Switch", "RefSwitch", "Merge", "Exit"}
_UPDATE = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+)$")
_MERGES = {"Merge", "RefMerge"}
_RECVS = {"_Recv", "_HostRecv"}
_SENDS = {"_Send", "_HostSend"}
_NOTHING = {"Const", "HostConst", "_Arg", "_DeviceArg", "VarHandleOp", "NoOp", "ControlTrigger"}
_CWISE = {"Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "Exp", "Log", "Log1p", "Neg",
          "Square", "Sqrt", "Rsqrt", "Abs", "Sign", "Reciprocal", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div",
          "DivNoNan", "Maximum", "Minimum", "Pow", "SquaredDifference", "ReluGrad", "Relu6Grad", "EluGrad",
          "SeluGrad", "LeakyReluGrad", "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "SoftplusGrad",
          "BiasAdd", "AddN", "Snapshot", "Floor", "Ceil", "Round", "Erf", "Cos", "Sin", "ClipByValue", "Select",
          "SelectV2", "Gelu"}
_MKL = re.compile(r"^_Mkl(?:Native)?(?=[A-Z])")
_COLLECTIVE = re.compile(r"^(Collective(Reduce|Gather|AllToAll)\w*|NcclAllReduce)$")


@dataclass
class _Buffer:
    device: str
    bytes: int
    refs: int = 0
    shared: bool = False  # a variable's own buffer, which a read only borrows (never written in place)


def _tensor(inp: str) -> tuple[str, int]:
    name, _, idx = inp.lstrip("^").partition(":")
    return name, int(idx or 0)


def _data_inputs(n) -> list[tuple[str, int]]:
    return [_tensor(i) for i in n.input if not i.startswith("^")]


@dataclass
class _Sim:
    """One call replayed: each tensor's buffer, each buffer's pending readers, each device's live bytes."""

    nodes: dict
    sent: dict  # a _Send's tensor_name -> the tensor it sends
    readers: dict  # (node, output) -> the ops that ran and read it
    size_of: Callable[[str], list[int]]
    group_size: int
    first_call: bool = False
    copies: bool = False  # a GPU machine's: a received tensor is a copy in the receiver's memory
    buffers: dict = field(default_factory=dict)  # (node, output) -> _Buffer
    views: dict = field(default_factory=lambda: defaultdict(list))  # variable -> its reads' buffers (0 bytes)
    updated: set = field(default_factory=set)  # the variables updated so far in the call
    made: dict = field(default_factory=lambda: defaultdict(list))  # node -> the buffers it allocated
    live: dict = field(default_factory=lambda: defaultdict(int))
    peak: dict = field(default_factory=lambda: defaultdict(int))

    def new(self, key, device: str, size: int, refs: int) -> None:
        buf = self.buffers[key] = _Buffer(device, size, refs)
        self.made[key[0]].append(buf)
        self.live[device] += size
        self.peak[device] = max(self.peak[device], self.live[device])

    def alias(self, key, src, extra: int) -> None:
        buf = self.buffers.get(src)
        if buf is not None:
            self.buffers[key] = buf
            buf.refs += extra
            self.free_if_done(buf)

    def free_if_done(self, buf: _Buffer) -> None:
        if buf.refs <= 0 and buf.bytes:
            self.live[buf.device] -= buf.bytes
            buf.bytes = 0  # freed once, whichever alias saw it last

    def start(self, n, device: str) -> None:
        op, inputs, reads = _MKL.sub("", n.op), _data_inputs(n), self.readers
        if op in ("Const", "HostConst") and self.first_call:
            # A constant's tensor is made when its kernel is, at the function's first call, and kept.
            for k, size in enumerate(self.size_of(n.name)):
                if size:
                    self.new((n.name, k), device, size, 1 << 30)
            return
        if op in _NOTHING or op in _SENDS:
            return
        if op == "ReadVariableOp" and inputs:  # the variable's own buffer: counted before the call
            view = self.buffers[(n.name, 0)] = _Buffer(device, 0, reads[(n.name, 0)], shared=True)
            self.views[self.variable(inputs[0])].append(view)
            return
        if _UPDATE.match(op) and inputs:
            self.update(n, inputs, device)
            return
        if op in _RECVS:  # the sent buffer itself: its send's read passes to the receiver's readers
            src = self.sent.get(n.attr["tensor_name"].s)
            if self.copies and src and _tensor(src) in self.buffers:
                buf = self.buffers[_tensor(src)]
                size = buf.bytes or (self.size_of(_tensor(src)[0]) or [0])[_tensor(src)[1]]
                buf.refs -= 1  # the send's read: done once the copy is made
                self.free_if_done(buf)
                if size:
                    self.new((n.name, 0), device, size, reads[(n.name, 0)])
                return
            if src and _tensor(src) in self.buffers:
                self.alias((n.name, 0), _tensor(src), reads[(n.name, 0)] - 1)
            return
        if op in _MERGES:
            live = [t for t in inputs if t in self.buffers]
            if live:
                self.alias((n.name, 0), live[0], reads[(n.name, 0)])
            return
        if op in _ALIAS_FIRST or op == "IdentityN":
            pairs = list(enumerate(inputs)) if op == "IdentityN" else [(0, inputs[0])] if inputs else []
            if op in ("Switch", "RefSwitch") and inputs:
                pairs = [(0, inputs[0]), (1, inputs[0])]
            for k, t in pairs:
                self.alias((n.name, k), t, reads[(n.name, k)])
            return
        if _COLLECTIVE.match(op) and inputs and inputs[0] in self.buffers:
            # The ring's chunk of its input while it runs (returned when it ends).
            self.new((n.name, -1), device, self.buffers[inputs[0]].bytes // max(self.group_size, 1), 1)
        for k, size in enumerate(self.size_of(n.name)):
            if not size:
                continue
            if k == 0 and (op in _CWISE or _COLLECTIVE.match(op)):  # a collective reduces in place too
                donor = next((t for t in inputs if t in self.buffers and self.buffers[t].bytes == size
                              and self.buffers[t].refs == 1 and not self.buffers[t].shared), None)
                if donor is not None:  # written in place: the input's buffer becomes the output's
                    self.alias((n.name, 0), donor, reads[(n.name, 0)])
                    continue
            self.new((n.name, k), device, size, reads[(n.name, k)])

    def variable(self, t: tuple[str, int]) -> str:
        """The node that made a resource handle, through the ops that pass a handle on."""
        name = t[0]
        for _ in range(64):
            n = self.nodes.get(name)
            if n is None:
                break
            if n.op in _RECVS:
                src = self.sent.get(n.attr["tensor_name"].s)
                name = _tensor(src)[0] if src else name
                if not src:
                    break
                continue
            data = _data_inputs(n)
            if n.op not in _HANDLE_PASS or not data:
                break
            name = data[0][0]
        return name

    def update(self, n, inputs, device: str) -> None:
        """Copy-on-write: a read of the variable still pending means the update writes a copy, which
        stays the variable's buffer after the call (its old one was allocated before it). At a
        function's first call every variable's first update copies: its buffer is still shared with
        the value it was initialized from."""
        var = self.variable(inputs[0])
        first = self.first_call and var not in self.updated
        self.updated.add(var)
        if not first and not any(v.refs > 0 for v in self.views.get(var, ())):
            return
        size = max((self.buffers[t].bytes for t in inputs[1:] if t in self.buffers), default=0)
        size = size or max((self.size_of(t[0])[t[1]] for t in inputs[1:]
                            if t[1] < len(self.size_of(t[0]))), default=0)
        if size:
            self.new((n.name, -2), device, size, 1 << 30)

    def end(self, n) -> None:
        chunk = self.buffers.pop((n.name, -1), None)
        if chunk is not None:
            chunk.refs = 0
            self.free_if_done(chunk)
        if _MKL.sub("", n.op) not in _SENDS:  # a send's read passes to its receiver
            for t in _data_inputs(n):
                buf = self.buffers.get(t)
                if buf is not None:
                    buf.refs -= 1
                    self.free_if_done(buf)
        for buf in self.made.get(n.name, ()):  # outputs that nothing that ran reads
            self.free_if_done(buf)


def _with_inline_ops(nodes: dict, ran: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The kernels the trace shows, and the cheap ones it does not (the executor runs a Reshape or an
    Identity inline, without an event): such a node ran once its data inputs were made, at once."""
    times = {name: (s, e) for name, s, e in ran}
    begin = min((s for s, _ in times.values()), default=0)
    for n in nodes.values():  # what exists when the call starts: its arguments, handles and constants
        if n.op in _NOTHING and n.name not in times:
            times[n.name] = (begin, begin)
    changed = True
    while changed:
        changed = False
        for n in nodes.values():
            if n.name in times or n.op in _MERGES:
                continue
            srcs = [t for t, _ in _data_inputs(n)]
            if n.op in _RECVS or not srcs:
                continue
            if all(s in times for s in srcs):
                t = max(times[s][1] for s in srcs)
                times[n.name] = (t, t)
                changed = True
    # An op is done before any reader of its outputs starts: an event that lasts longer holds its
    # readers' work (an asynchronous kernel's done callback runs them inline), not its own.
    first_read: dict[str, int] = {}
    for n in nodes.values():
        if n.name in times:
            for src, _ in _data_inputs(n):
                first_read[src] = min(first_read.get(src, times[n.name][0]), times[n.name][0])
    return [(name, s, max(s, min(e, first_read.get(name, e)))) for name, (s, e) in times.items()]


def predict_peaks(partitions: list, order: Iterable[tuple[str, int, int]], size_of: Callable[[str], list[int]],
                  device_of: Callable[[str], str], group_size: int = 1, first_call: bool = False,
                  copies: bool = False) -> dict[str, int]:
    """Each device's predicted peak (bytes requested) over one call: `order` the kernels that ran
    as (node, start, end) in any unit, `size_of(node)` its outputs' bytes (0: unknown or none),
    `device_of(node)` its device."""
    nodes = {n.name: n for g in partitions for n in g.node}
    sent = {n.attr["tensor_name"].s: n.input[0] for n in nodes.values() if n.op in _SENDS and n.input}
    ran = _with_inline_ops(nodes, [(name, s, e) for name, s, e in order if name in nodes])
    readers: dict[tuple[str, int], int] = defaultdict(int)
    for name in {name for name, _, _ in ran}:
        for t in _data_inputs(nodes[name]):
            readers[t] += 1
    sim = _Sim(nodes, sent, readers, size_of, group_size, first_call, copies)
    # At one instant: what ended is released, then what starts allocates, in the order the inline ops
    # were found (their inputs first), and an op of no duration ends after it started.
    steps = []
    for seq, (name, s, e) in enumerate(ran):
        steps += [(s, 1, seq, True, name), (e, 2 if e == s else 0, seq, False, name)]
    for _, _, _, is_start, name in sorted(steps):
        if not is_start:
            sim.end(nodes[name])
        else:
            sim.start(nodes[name], device_of(name))
    return dict(sim.peak)


def compare(predicted: Mapping[str, int], measured: Mapping[str, dict]) -> dict[str, dict]:
    """Per device: predicted and measured peak (requested) and the error of the prediction."""
    out = {}
    for d, m in measured.items():
        if not d.startswith("/") or d not in predicted:
            continue
        meas = m["peak_requested"]
        out[d] = {"predicted": predicted[d], "measured": meas,
                  "error": round((predicted[d] - meas) / meas, 4) if meas else None}
    return out


def bytes_of(outs: list | None) -> list[int]:
    """Each output's bytes from (dtype enum, dims) (0: unknown, or no byte size)."""
    from pinpoint.placement.transfers import _bytes, _dtype_size

    return [(_bytes(_dtype_size(dtype), dims) or 0) if dims is not None else 0 for dtype, dims in outs or ()]


def predict_call(partitions: list, shapes: Mapping[str, list], xspace, devices: Mapping[str, str],
                 measured: Mapping[str, dict], first_call: bool = False) -> dict:
    """The prediction for the profiled call as it ran (its kernels' order from the trace), per device
    beside the measured peak. An output whose shape inference left unknown (a batch dimension that
    depends on the step) is sized by what its op really asked the allocator for: `sizes` counts both."""
    from pinpoint.placement.memory import memory_events
    from pinpoint.placement.timing import op_events

    asked: dict[str, int] = {}
    for e in memory_events(xspace):
        if e.alloc and e.op and e.region == "output":
            asked.setdefault(e.op, e.requested)
    counts = {"shapes": 0, "allocator": 0}

    def size_of(name: str) -> list[int]:
        out = bytes_of(shapes.get(name))
        if out and not out[0] and name in asked:
            counts["allocator"] += 1
            return [asked[name], *out[1:]]
        counts["shapes"] += any(out)
        return out

    events, _ = op_events(xspace)
    order = [(e.name, e.start_ps, e.start_ps + e.dur_ps) for e in events]
    replicas = len({devices[n.name] for g in partitions for n in g.node
                    if _COLLECTIVE.match(_MKL.sub("", n.op)) and n.name in devices})
    predicted = predict_peaks(partitions, order, size_of, lambda name: devices.get(name, ""),
                              group_size=replicas or 1, first_call=first_call)
    # A GPU machine's: every received tensor copied into the receiving GPU's memory.
    gpu = predict_peaks(partitions, order, size_of, lambda name: devices.get(name, ""),
                        group_size=replicas or 1, first_call=first_call, copies=True)
    rows = compare(predicted, measured)
    for d, row in rows.items():
        row["gpu_machine"] = gpu.get(d, 0)
    return {"devices": rows, "sized": counts, "replicas": replicas}


def predict_from_trace(partitions: list, xspace, devices: Mapping[str, str], measured: Mapping[str, dict]) -> dict:
    """predict_call for a call whose shapes are not known yet: TensorFlow's shape inference over its
    partition graphs (placement.runshapes), the kernels that ran read off the trace."""
    from pinpoint.placement.runshapes import infer_shapes
    from pinpoint.placement.timing import kernel_nodes

    try:
        shapes, _ = infer_shapes(partitions, None, kernel_nodes(xspace), loops=True)
    except Exception as err:  # noqa: BLE001 - a sizing error: said, not raised after training
        return {"error": f"shape inference failed ({type(err).__name__}: {str(err).splitlines()[0][:160]})"}
    return predict_call(partitions, shapes, xspace, devices, measured)
