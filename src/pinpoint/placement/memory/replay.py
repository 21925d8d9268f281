"""Memory per device, predicted from the executed graphs: each tensor's bytes from its shape, its
buffer's life from the order the kernels ran, and TensorFlow's own buffer rules.

The rules (checked against the allocator's events on emulated devices, docs/memory.md):
- an op that hands an input on unchanged allocates nothing (Identity, Reshape, a cond's Switch and
  Merge, a loop's Enter and Exit, ReadVariableOp: the variable's own buffer);
- a received tensor is the sent buffer itself (logical CPU devices share it; a GPU would copy it),
  written in place by its last reader once the send is done;
- a tensor from another task crosses the RPC layer, even in one process: the receiver's copy is made
  when its bytes start to arrive (the allocator's event), sized by them; the sender's buffer, and the receiver's, are held until the RPC layer lets
  go of them, at the times the allocator recorded (no kernel does it); an op whose output goes to
  another task never writes into an input (the executor allocates it for the RPC layer);
- an element-wise op (and a collective all-reduce) writes into an input buffer of its size when it is
  that buffer's last reader;
- a buffer is freed when the last op reading it (through any alias) has finished;
- a collective all-reduce holds a chunk of its input (input / group size) while it runs;
- an update of a variable that a read still holds copies the variable first (copy-on-write), and
  the copy is the variable from then on;
- constants, arguments and variables exist before the call: not part of its peak, nor an input
  element (its iterator prefetched it);
- a loop: a variable's initial value is held from its Enter to its Exit; a tensor list's elements
  are copies its maker allocated (TensorListFromTensor), read without an allocation
  (TensorListGetItem), held until popped when pushed for the gradient; iterations run in parallel,
  so each run of a body kernel holds its output until its readers' runs of the same iteration end;
  a list is known by the Enter that took it into its loop; a loop variable's push holds nothing new
  when another push keeps its next value; a list nothing pops is dropped at its loop's Exit of it;

- a kernel's scratch (the allocator's `temp` region: oneDNN's convolution and pooling workspaces)
  is held while it runs: the most it held at once in the measured call, of the temps it freed
  before it ended; a temp it outlived is an output (Einsum's);
- a kernel's times are the allocator's: its outputs are made when it gave the first, its scratch
  when the kernel first held that most, and its inputs are let go of when the executor freed them
  (on a loaded machine, up to a ms after the trace's start or end).

What the rules leave out is said where the prediction is compared with the measurement: tf.data's
host buffers.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pinpoint.device_names import is_host, parse_name
from pinpoint.placement.graphs.ops import (
    ALIASES_FIRST_INPUT,
    CWISE,
    DENSE_UPDATE_RE,
    LIST_MAKERS,
    LIST_OPS,
    MERGES,
    MKL_PREFIX,
    NOTHING_MADE,
    PREFETCHED,
    RECVS,
    REDUCING_COLLECTIVE_RE,
    REPLAY_HANDLE_PASS,
    SENDS,
    tensor,
)

_SCRATCH = "scratch"  # a Schedule step: a kernel's scratch made after its start (`Replay.temp_after`)


_INPUTS = "inputs"  # a Schedule step: a kernel's inputs let go of after its end (`Replay.inputs_after`)


_OUTPUTS = "outputs"  # a Schedule step: a kernel's outputs made after its start (`Replay.outputs_after`)


# Ops whose outputs are not a new buffer of their own (an input passed on, a variable's, a list's element).
_NOT_MADE = ALIASES_FIRST_INPUT | MERGES | NOTHING_MADE | SENDS | RECVS | PREFETCHED | LIST_OPS | {
    "IdentityN", "ReadVariableOp", "TensorListGetItem"}


MAX_ITERATIONS = 64  # a loop's iterations replayed one by one: the first 64 at most


@dataclass
class _Buffer:
    device: str
    bytes: int
    refs: int = 0
    shared: bool = False  # a variable's own buffer, which a read only borrows (never written in place)
    holds: _Buffer | None = None  # a read's: the variable's old buffer it keeps alive after a copy-on-write
    pinned: bool = False  # a received buffer the RPC layer still holds: kept after its last reader
    maker: str = ""  # the node that allocated it (its aliases share it)


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


def _this_host(device: str) -> bool:
    """This process's own CPU: where the allocator's events put tf.data's buffers (no op names them).
    An iterator on a GPU, or on another task's CPU (an in-process cluster's worker), hands out an
    element tf.data made there."""
    return is_host(device) and parse_name(device)[0] is None


def other_task(a: str, b: str) -> bool:
    """Whether devices a and b belong to different tasks: a tensor between them crosses the RPC
    layer, which deserializes it into a new buffer on the receiving side (even in one process)."""
    return parse_name(a)[:2] != parse_name(b)[:2]


def _data_inputs(n: Node) -> tuple[tuple[str, int], ...]:
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


@dataclass
class _Sim:
    """One call replayed: each tensor's buffer, each buffer's pending readers, each device's live bytes."""

    nodes: dict
    sent: dict  # a _Send's tensor_name -> the tensor it sends
    readers: dict  # (node, output) -> the ops that ran and read it
    size_of: Callable[[str], list[int]]
    group_size: int
    first_call: bool = False
    copies: bool = False  # a GPU machine's: a tensor read on another device is a copy in that device's memory
    constants: frozenset = frozenset()  # constants made in this call though it is not the first (Measured)
    copied: frozenset = frozenset()  # updates that copied though no read of this call held the variable (Measured)
    on: dict = field(default_factory=dict)  # (tensor, device) -> its readers there (copies)
    buffers: dict = field(default_factory=dict)  # (node, output) -> _Buffer
    local: dict = field(default_factory=dict)  # (tensor, device) -> its copy there (copies)
    views: dict = field(default_factory=lambda: defaultdict(list))  # variable -> its reads' buffers (0 bytes)
    updated: set = field(default_factory=set)  # the variables updated so far in the call
    made: dict = field(default_factory=lambda: defaultdict(list))  # node -> the buffers it allocated
    live: dict = field(default_factory=lambda: defaultdict(int))
    peak: dict = field(default_factory=lambda: defaultdict(int))
    temps: Mapping = field(default_factory=dict)  # node -> its kernel's scratch (bytes), held while it runs
    copies_made: dict = field(default_factory=dict)  # variable -> the copy an update wrote (copy-on-write)
    carried: dict = field(default_factory=dict)  # variable -> the copy a previous iteration wrote
    frames: Mapping = field(default_factory=dict)  # a loop's Exit -> the Enter of its variable's initial value
    remote: frozenset = frozenset()  # the tensors sent to another task (never written in place)
    remote_names: frozenset = frozenset()  # the tensor_name of each of those transfers
    # The nodes whose output (sent away, or received) the RPC layer let go of at a known time.
    let_go: frozenset = frozenset()
    waiting: dict = field(default_factory=dict)  # such a node -> its buffer, until then
    temp_after: frozenset = frozenset()  # the nodes whose scratch is made after their kernel's start
    running: set = field(default_factory=set)  # the kernels started and not ended
    late: frozenset = frozenset()  # the kernels whose inputs are let go of after their end (inputs_after)
    late_outputs: frozenset = frozenset()  # the kernels whose outputs are made after their start
    freed: dict | None = None  # kernel -> the makers of the buffers its reads' end freed (recorded)
    gone: set = field(default_factory=set)  # such nodes the RPC layer let go of before they were held

    def new(self, key, device: str, size: int, refs: int) -> _Buffer:
        buf = self.buffers[key] = _Buffer(device, size, refs, maker=key[0])
        self.made[key[0]].append(buf)
        self.live[device] += size
        self.peak[device] = max(self.peak[device], self.live[device])
        return buf

    def alias(self, key, src, extra: int, device: str = "") -> None:
        buf = self.get(src, device)
        if buf is not None:
            self.buffers[key] = buf
            buf.refs += extra
            self.free_if_done(buf)

    def get(self, t, device: str):
        """Tensor t's buffer as an op on `device` reads it: its copy there, if one was made."""
        return self.local.get((t, device)) or self.buffers.get(t)

    def free_if_done(self, buf: _Buffer) -> None:
        if buf.refs <= 0 and buf.holds is not None:  # a read done: the old buffer it kept is one read freer
            held, buf.holds = buf.holds, None
            held.refs -= 1
            self.free_if_done(held)
        if buf.refs <= 0 and buf.bytes and not buf.pinned:
            self.live[buf.device] -= buf.bytes
            buf.bytes = 0  # freed once, whichever alias saw it last

    def fetch(self, n: Node, device: str) -> None:
        """copies: each input made on another device is copied into `device` once, for all its readers there."""
        for t in _data_inputs(n):
            buf = self.buffers.get(t)
            if buf is None or buf.device == device or (t, device) in self.local:
                continue
            sizes = self.size_of(t[0])
            size = buf.bytes or (sizes[t[1]] if t[1] < len(sizes) else 0)
            if not size:
                continue
            mine = self.on.get((t, device), 0)
            buf.refs -= mine  # its readers here read the copy
            self.free_if_done(buf)
            self.local[(t, device)] = copy = _Buffer(device, 0, mine)
            copy.bytes = size
            self.live[device] += size
            self.peak[device] = max(self.peak[device], self.live[device])

    def start(self, n: Node, device: str) -> None:
        self.running.add(n.name)
        if n.name not in self.temp_after:
            self.scratch(n, device)
        if n.name not in self.late_outputs:
            self.outputs(n, device)

    def outputs(self, n: Node, device: str) -> None:
        """Its outputs: a new buffer, an input's, or nothing, by TensorFlow's rules."""
        op, inputs, reads = MKL_PREFIX.sub("", n.op), _data_inputs(n), self.readers
        if op in ("Const", "HostConst") and (self.first_call or n.name in self.constants):
            # A constant's tensor is made when its kernel is, at the function's first call, and kept.
            for k, size in enumerate(self.size_of(n.name)):
                if size:
                    self.new((n.name, k), device, size, 1 << 30)
            return
        if op in NOTHING_MADE or op in SENDS or (op in PREFETCHED and not _this_host(device)):
            return
        if self.copies and op not in RECVS:
            self.fetch(n, device)
        if op == "TensorListGetItem":  # the list's own element (list_kernels.h: set_output of it), no buffer
            return
        if op == "ReadVariableOp" and inputs:  # the variable's own buffer: counted before the call
            view = self.buffers[(n.name, 0)] = _Buffer(device, 0, reads[(n.name, 0)], shared=True)
            self.views[self.variable(inputs[0])].append(view)
            return
        if DENSE_UPDATE_RE.match(op) and inputs:
            self.update(n, inputs, device)
            return
        if op in RECVS:
            if n.tensor_name not in self.remote_names:  # (another task's: made when its bytes arrive, end)
                self.receive(n, device)
            return
        if op in MERGES:
            live = [t for t in inputs if self.get(t, device) is not None]
            if live:
                self.alias((n.name, 0), live[0], reads[(n.name, 0)], device)
            return
        if op in ALIASES_FIRST_INPUT or op == "IdentityN":
            pairs = list(enumerate(inputs)) if op == "IdentityN" else [(0, inputs[0])] if inputs else []
            if op in ("Switch", "RefSwitch") and inputs:
                pairs = [(0, inputs[0]), (1, inputs[0])]
            for k, t in pairs:
                self.alias((n.name, k), t, reads[(n.name, k)], device)
            if n.name in self.held and self.buffers.get((n.name, 0)) is not None:
                self.buffers[(n.name, 0)].refs += 1  # a loop variable's initial value: held until its Exit
            return
        self.compute(n, op, inputs, device)

    def scratch(self, n: Node, device: str) -> None:
        """Its kernel's scratch while it runs (returned when it ends)."""
        if self.temps.get(n.name) and n.name in self.running and (n.name, -3) not in self.buffers:
            self.new((n.name, -3), device, self.temps[n.name], 1)

    def receive(self, n: Node, device: str) -> None:
        """The sent buffer itself: its send's read passes to the receiver's readers (copies: a copy
        here, once the send is done, unless the sender is on this device)."""
        src = self.sent.get(n.tensor_name)
        remote = n.tensor_name in self.remote_names
        # (another task's tensor is a new buffer whether or not the replay made its sender's: a
        # gradient a loop summed may be unsized on its sender, but the receive's allocation is known)
        if not src or (src not in self.buffers and not remote):
            return
        buf = self.buffers.get(src)
        if remote or (self.copies and buf.device != device):
            sizes = self.size_of(src[0])
            size = ((buf.bytes if buf is not None else 0) or (sizes[src[1]] if src[1] < len(sizes) else 0)
                    or (self.size_of(n.name) or [0])[0])
            if not remote:  # (another task's: the send's read went to the RPC layer at the send's end)
                buf.refs -= 1  # the send's read: done once the copy is made
                self.free_if_done(buf)
            if size:
                copy = self.new((n.name, 0), device, size, self.readers[(n.name, 0)])
                if n.name in self.let_go and n.name not in self.gone:
                    # The RPC layer may keep the bytes after its readers are done (not a read: a
                    # reader may still write into them).
                    copy.pinned = True
                    self.waiting[n.name] = copy
            return
        self.alias((n.name, 0), src, self.readers[(n.name, 0)] - 1)

    def compute(self, n: Node, op: str, inputs, device: str) -> None:
        """A kernel's outputs: new buffers, or an input's written in place (see the module doc)."""
        reads = self.readers
        first = self.get(inputs[0], device) if inputs else None
        if REDUCING_COLLECTIVE_RE.match(op) and first is not None:
            # The ring's chunk of its input while it runs (returned when it ends).
            self.new((n.name, -1), device, first.bytes // max(self.group_size, 1), 1)
        for k, size in enumerate(self.size_of(n.name)):
            if not size:
                continue
            # (a collective reduces in place too; a tensor sent to another task is allocated for the
            # RPC layer, NIC-compatible, unlike its inputs: the executor's InferAllocAttr)
            if k == 0 and (op in CWISE or REDUCING_COLLECTIVE_RE.match(op)) and (n.name, 0) not in self.remote:
                donor = next((b for b in (self.get(t, device) for t in inputs) if b is not None and b.bytes == size
                              and b.refs == 1 and not b.shared
                              and (b.device == device or not self.copies)), None)
                if donor is not None:  # written in place: the input's buffer becomes the output's
                    self.buffers[(n.name, 0)] = donor
                    donor.refs += reads[(n.name, 0)]
                    self.free_if_done(donor)
                    continue
            self.new((n.name, k), device, size, reads[(n.name, k)])

    def variable(self, t: tuple[str, int]) -> str:
        """The node that made a resource handle, through the ops that pass a handle on."""
        name = t[0]
        for _ in range(64):
            n = self.nodes.get(name)
            if n is None:
                break
            if n.op in RECVS:
                src = self.sent.get(n.tensor_name)
                if not src:
                    break
                name = src[0]
                continue
            data = _data_inputs(n)
            if n.op not in REPLAY_HANDLE_PASS or not data:
                break
            name = data[0][0]
        return name

    def update(self, n: Node, inputs, device: str) -> None:
        """Copy-on-write: a read of the variable still pending means the update writes a copy, which
        stays the variable's buffer after the call (its old one was allocated before it). At a
        function's first call every variable's first update copies: its buffer is still shared with
        the value it was initialized from."""
        var = self.variable(inputs[0])
        first = (self.first_call and var not in self.updated) or n.name in self.copied
        self.updated.add(var)
        if not first and not any(v.refs > 0 for v in self.views.get(var, ())):
            return
        size = max((b.bytes for b in (self.get(t, device) for t in inputs[1:]) if b is not None), default=0)
        size = size or max((self.size_of(t[0])[t[1]] for t in inputs[1:]
                            if t[1] < len(self.size_of(t[0]))), default=0)
        if size:
            self.copies_made[var] = self.new((n.name, -2), device, size, 1 << 30)
            old = self.carried.pop(var, None)
            if old is not None:  # the previous iteration's copy: freed once the reads still holding it are done
                pending = [v for v in self.views.get(var, ()) if v.refs > 0]
                old.refs = len(pending)
                for v in pending:
                    v.holds = old
                self.free_if_done(old)

    def carry(self, previous: _Sim) -> None:
        """A loop's next iteration: the copies the previous one made are the variables' buffers now."""
        for var, buf in previous.copies_made.items():
            if buf.bytes:
                self.carried[var] = self.new((f"carried:{var}", 0), buf.device, buf.bytes, 1 << 30)

    @cached_property
    def held(self) -> frozenset:
        return frozenset(self.frames.values())

    def let_go_of(self, name: str) -> None:
        """The RPC layer let go of node `name`'s output (sent to another task, or received from one)."""
        buf = self.waiting.pop(name, None)
        if buf is None:
            self.gone.add(name)
        elif buf.pinned:
            buf.pinned = False
            self.free_if_done(buf)
        else:
            buf.refs -= 1
            self.free_if_done(buf)

    def rpc_holds(self, name: str, buf: _Buffer) -> None:
        """The RPC layer holds `buf` (node `name`'s) until it lets go: now, if it did already."""
        buf.refs += 1
        self.waiting[name] = buf
        if name in self.gone:
            self.let_go_of(name)

    def end(self, n: Node, device: str) -> None:
        self.running.discard(n.name)
        if MKL_PREFIX.sub("", n.op) in RECVS and n.tensor_name in self.remote_names:
            self.receive(n, device)
        if n.name in self.frames:  # the loop is done with its variable's initial value
            buf = self.buffers.get((self.frames[n.name], 0))
            if buf is not None:
                buf.refs -= 1
                self.free_if_done(buf)
        for scratch in (-1, -3):  # a collective's chunk, a kernel's scratch
            chunk = self.buffers.pop((n.name, scratch), None)
            if chunk is not None:
                chunk.refs = 0
                self.free_if_done(chunk)
        if MKL_PREFIX.sub("", n.op) in SENDS and n.tensor_name in self.remote_names:
            # A send to another task: the RPC layer answers the receiver's request with the tensor and
            # lets go of it (a large one once gRPC has sent it): when the trace shows, else at the send.
            for t in _data_inputs(n)[:1]:
                buf = self.get(t, device)
                if buf is not None:
                    if t[0] in self.let_go:  # the send's read passes to the RPC layer
                        self.rpc_holds(t[0], buf)
                    buf.refs -= 1
                    self.free_if_done(buf)
        elif MKL_PREFIX.sub("", n.op) not in SENDS and n.name not in self.late:  # (a send's read: its receiver's)
            self.let_inputs_go(n, device)
        for buf in self.made.get(n.name, ()):  # outputs that nothing that ran reads
            self.free_if_done(buf)

    def let_inputs_go(self, n: Node, device: str) -> None:
        """Its reads are done: each input has one reader less (`freed`: what that freed, by maker)."""
        for t in _data_inputs(n):
            buf = self.get(t, device)
            if buf is not None:
                held = buf.bytes
                buf.refs -= 1
                self.free_if_done(buf)
                if self.freed is not None and held and not buf.bytes and buf.maker:
                    self.freed[n.name].add(buf.maker)


def _with_inline_ops(nodes: dict, ran: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The kernels the trace shows, and the cheap ones it does not (the executor runs a Reshape or an
    Identity inline, without an event): such a node ran once its data inputs were made, at once.
    A receive's event is when it was posted (in a loop, often before this iteration's tensor was
    made, or one iteration ahead): it is done once its sender's tensor is made."""
    ran = sorted(ran, key=lambda x: x[1])  # a node run several times (a loop's body): its last run
    times = {name: (s, e) for name, s, e in ran}
    sent = {n.tensor_name: n.inputs[0][0] for n in nodes.values() if n.op in SENDS and n.inputs}
    posted: dict[str, list[int]] = defaultdict(list)  # a receive -> each time it was posted
    arrived: dict[str, int] = {}  # a receive -> when its tensor last arrived (the end of its run)
    for name, s, e in ran:
        if nodes[name].op in RECVS:
            posted[name].append(s)
            arrived[name] = e
            times.pop(name, None)
    begin = min((s for s, _ in times.values()), default=0)
    for n in nodes.values():  # what exists when the call starts: its arguments, handles and constants
        if n.op in NOTHING_MADE and n.name not in times:
            times[n.name] = (begin, begin)
    changed = True
    while changed:
        changed = False
        for n in nodes.values():
            if n.name in times or n.op in MERGES:
                continue
            srcs = [sent[n.tensor_name]] if n.op in RECVS and n.tensor_name in sent else \
                [] if n.op in RECVS else [t for t, _ in _data_inputs(n)]
            if srcs and all(s in times for s in srcs):
                t = max(times[s][1] for s in srcs)
                times[n.name] = (t, t)
                changed = True
    for name, at in posted.items():  # a receive from outside the call's graphs: when it was last posted
        times.setdefault(name, (at[-1], at[-1]))
    for name, e in arrived.items():  # a receive ends when its tensor arrived (another task's: later)
        s = times[name][0]
        times[name] = (s, max(s, e))
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
    nodes = [Node.of(n) for g in partitions for n in g.node]
    return Schedule.of(nodes, order).peaks(size_of, device_of, group_size, first_call, copies)


@dataclass(frozen=True)
class Schedule:
    """The call's kernels in the order they ran (the inline ones placed), ready to replay under any
    device assignment: the same kernels in the same order, each on the device `device_of` gives it.
    A loop's body runs once per iteration, each in its own order: each iteration is replayed (its
    nodes' k-th runs, the nodes that ran once as they ran), and a device's peak is its highest."""

    nodes: Mapping[str, Node]
    runs: tuple[tuple[tuple[int, bool, str], ...], ...]  # per iteration: (time, starts, node) in time order
    readers: Mapping[tuple[str, int], tuple[str, ...]]  # tensor -> the ops that ran and read it
    sent: Mapping[str, tuple[str, int]]
    # A loop's tensor lists (TensorListPushBack / PopBack): each push or pop node and when each of its
    # runs ended. What the lists hold is counted beside the replay (see `held_in_lists`).
    lists: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # A loop's Exit -> the Enter that took its variable's initial value in (Enter -> Merge -> Switch -> Exit).
    frames: Mapping[str, str] = field(default_factory=dict)
    # A loop body's kernels: each run (start, end), in the order they ran (see `other_iterations`).
    repeated: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Iterable[Node], order: Iterable[tuple[str, int, int]]) -> Schedule:
        by_name = {n.name: n for n in nodes}
        sent = {n.tensor_name: n.inputs[0] for n in by_name.values() if n.op in SENDS and n.inputs}
        runs_of: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for name, s, e in sorted((x for x in order if x[0] in by_name), key=lambda x: x[1]):
            runs_of[name].append((s, e))
        body = [len(r) for name, r in runs_of.items() if by_name[name].op not in RECVS]
        iterations = min(max(body, default=1), MAX_ITERATIONS)
        runs, names = [], set()
        for k in range(iterations):
            ran = _with_inline_ops(by_name, [(name, *r[min(k, len(r) - 1)]) for name, r in runs_of.items()
                                             if by_name[name].op not in RECVS]
                                   + [(name, s, e) for name, r in runs_of.items() if by_name[name].op in RECVS
                                      for s, e in r])
            names |= {name for name, _, _ in ran}
            # At one instant: what ended is released, then what starts allocates, in the order the inline
            # ops were found (their inputs first), and an op of no duration ends after it started.
            steps = []
            for seq, (name, s, e) in enumerate(ran):
                steps += [(s, 1, seq, True, name), (e, 2 if e == s else 0, seq, False, name)]
            runs.append(tuple((t, starts, name) for t, _, _, starts, name in sorted(steps)))
        readers: dict[tuple[str, int], list[str]] = defaultdict(list)
        for name in names:
            for t in _data_inputs(by_name[name]):
                readers[t].append(name)
        lists = {name: _list_times(by_name[name], r, readers, runs_of) for name, r in runs_of.items()
                 if by_name[name].op in LIST_OPS}
        return cls(by_name, tuple(runs), {t: tuple(sorted(r)) for t, r in readers.items()}, sent, lists,
                   _frames(by_name), {name: tuple(r) for name, r in runs_of.items() if len(r) > 1
                                      and by_name[name].op not in RECVS})

    def _passed(self, t: tuple[str, int]):
        """(tensor, node) along the ops tensor t is passed on through (a receive's send, a loop
        variable's Switch, Merge, Enter, an Identity...), ending with the node that made it, or with
        None where the graphs lack the node (or the chain is longer than any loop's)."""
        for _ in range(64):
            n = self.nodes.get(t[0])
            yield t, n
            if n is None:
                return
            if n.op in RECVS and n.tensor_name in self.sent:
                t = self.sent[n.tensor_name]
            elif (n.op in ALIASES_FIRST_INPUT or n.op in MERGES) and n.inputs:
                t = n.inputs[0]
            else:
                return
        yield t, None

    def _element_bytes(self, t: tuple[str, int], size_of: Callable[[str], list[int]]) -> int:
        """The bytes of a pushed tensor, through the ops that pass a tensor on; 0 for a variable's read
        (the list holds the variable's own buffer, nothing new)."""
        for u, n in self._passed(t):
            if n is None or MKL_PREFIX.sub("", n.op) in ("ReadVariableOp", "TensorListGetItem"):
                return 0  # a variable's or a list's own buffer: the pushing list holds nothing new
            sizes = size_of(u[0])
            if u[1] < len(sizes) and sizes[u[1]]:
                return sizes[u[1]]
        return 0

    def _list_source(self, t: tuple[str, int]) -> str:
        """The node that made tensor t, through the ops that pass a tensor (or a list) on."""
        *_, (_, n) = self._passed(t)
        return n.name if n is not None else ""

    def _list_key(self, t: tuple[str, int]) -> str:
        """A loop's list, as its pushes and pops name it: the Enter that took it into the forward loop
        (TensorFlow merges a function's identical empty lists into one node, so that node names many
        lists), else the node that made it."""
        enter, n = "", None
        for _, n in self._passed(t):
            if n is not None and n.op in ("Enter", "RefEnter"):
                enter = n.name
        return enter or (n.name if n is not None else "")

    @cached_property
    def _ends(self) -> Mapping[str, int]:
        """Each node's last end over the replayed iterations."""
        out: dict[str, int] = {}
        for run in self.runs:
            for t, starts, name in run:
                if not starts:
                    out[name] = max(out.get(name, t), t)
        return out

    @cached_property
    def _frame_ops(self) -> Mapping[str, Mapping[str, list[str]]]:
        """"Merge", "Switch", "Exit" -> the node each takes its data from -> those nodes."""
        out: dict[str, dict[str, list[str]]] = {k: defaultdict(list) for k in ("Merge", "Switch", "Exit")}
        for n in self.nodes.values():
            kind = n.op.removeprefix("Ref")
            if kind in out and n.inputs:
                out[kind][n.inputs[0][0]].append(n.name)
        return out

    def _dropped_at(self, key: str) -> int | None:
        """When a list nothing pops is dropped: its loop's Exit of it, once what reads that Exit is done
        (Keras' LSTM under parameter_server pushes the input kernel it receives each step; the gradient
        never pops it, and the allocator freed all 16 when that Exit ran). None: no Exit found."""
        by = self._frame_ops
        switches = {x for m in by["Merge"].get(key, ()) for x in by["Switch"].get(m, ())}
        exits = [x for sw in switches for x in by["Exit"].get(sw, ())]
        times = [self._ends[r] for x in exits for r in (*self.readers.get((x, 0), ()), x) if r in self._ends]
        # (an Exit the replay did not place: the loop's last LoopCond, which sends the list to it)
        times = times or [self._ends[p[0]] for x in switches for p in self.nodes[x].inputs[1:2] if p[0] in self._ends]
        return max(times) if times else None

    def _next_value(self, t: tuple[str, int]) -> str:
        """For a loop variable's value (its Switch of the loop's Merge): the node that makes its value
        for the next iteration (the Merge's NextIteration input), else ''."""
        for _, n in self._passed(t):
            if n is None or n.op not in MERGES and n.op not in ALIASES_FIRST_INPUT and n.op not in RECVS:
                return ""
            if n.op in MERGES:
                back = [self.nodes[i[0]] for i in n.inputs if i[0] in self.nodes
                        and self.nodes[i[0]].op in ("NextIteration", "RefNextIteration")]
                return self._list_source(back[0].inputs[0]) if back and back[0].inputs else ""
        return ""

    @cached_property
    def pushed_twice(self) -> Mapping[str, str]:
        """The pushes of a loop variable whose next value another push of the loop keeps already -> that
        push: from the second iteration on they push that same buffer (Keras' LSTM under
        parameter_server pushes both h and the previous step's h), so they hold nothing new."""
        pushes = [self.nodes[name] for name in self.lists if self.nodes[name].op == "TensorListPushBack"
                  and len(self.nodes[name].inputs) > 1]
        made = {self._list_source(p.inputs[1]): p.name for p in pushes}
        return {p.name: made[v] for p in pushes if (v := self._next_value(p.inputs[1])) and v in made}

    def _shared_pops(self, pops: dict, device_of: Callable[[str], str]) -> None:
        """A buffer two lists hold (see `pushed_twice`) is freed by the later of its two pops: the
        keeping list's j-th pop (last in, first out) pops what the loop variable's list pops at its
        (j-1)-th. The gradient's zeros_like of h pops all of h's list at once as the loop starts;
        the MatMul that pops the same buffers from h's own list runs one iteration at a time."""
        for twice, keeper in self.pushed_twice.items():
            mine, its = ((device_of(n), self._list_key(self.nodes[n].inputs[0])) for n in (twice, keeper))
            if pops.get(mine) and pops.get(its):
                q, p = sorted(pops[its]), sorted(pops[mine])
                pops[its] = [q[0], *(max(t, p[j]) if j < len(p) else t for j, t in enumerate(q[1:]))]

    @cached_property
    def popped_lists(self) -> Mapping[str, str]:
        """The TensorListFromTensor lists whose elements a loop pushes for its gradient (the forward
        loop's TensorListGetItem of them, pushed into an accumulator) -> that accumulator: those
        elements stay until its pops."""
        out = {}
        for name in self.lists:
            n = self.nodes[name]
            if n.op == "TensorListPushBack" and len(n.inputs) > 1:
                item = self.nodes.get(self._list_source(n.inputs[1]))
                if item is not None and item.op == "TensorListGetItem" and item.inputs:
                    out[self._list_source(item.inputs[0])] = self._list_key(n.inputs[0])
        return out

    def _with_list_elements(self, size_of: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
        """size_of, a TensorListFromTensor's list with its elements (the tensor's bytes, copied into the
        list), unless they are counted with the lists a loop pops (`held_in_lists`)."""
        extra = {name: self._element_bytes(n.inputs[0], size_of) for name, n in self.nodes.items()
                 if n.op in LIST_MAKERS and n.inputs and name not in self.popped_lists}
        extra = {k: v for k, v in extra.items() if v}
        if not extra:
            return size_of

        def sized(name: str) -> list[int]:
            out = list(size_of(name))
            if name in extra:
                out[:1] = [(out[0] if out else 0) + extra[name]]
            return out

        return sized

    def held_in_lists(self, size_of: Callable[[str], list[int]], device_of: Callable[[str], str]):
        """time -> device -> the bytes a loop's tensor lists hold then: each element pushed and not yet
        popped (a loop keeps each iteration's activations so for its gradient), on its pusher's device."""
        changes: list[tuple[int, str, int]] = []
        pushed: dict[tuple[str, str], int] = defaultdict(int)  # (device, list) -> bytes pushed over the call
        pops: dict[tuple[str, str], list[int]] = defaultdict(list)  # (device, list) -> when each pop ended
        last_push: dict[tuple[str, str], int] = {}  # (device, list) -> when its last push ended
        for name, ends in self.lists.items():
            n, d = self.nodes[name], device_of(name)
            if n.op == "TensorListFromTensor":  # its elements, from when it made them until popped
                size = self._element_bytes(n.inputs[0], size_of) if name in self.popped_lists else 0
                changes += [(t, d, size) for t in ends[:1] if size]
                pushed[(d, self.popped_lists.get(name, ""))] += size
                continue
            key = (d, self._list_key(n.inputs[0]) if n.inputs else "")
            if n.op != "TensorListPushBack":
                pops[key] += ends
                continue
            size = self._element_bytes(n.inputs[1], size_of) if len(n.inputs) > 1 and name not in self.pushed_twice \
                else 0
            changes += [(t, d, size) for t in ends if size]
            pushed[key] += size * len(ends)
            last_push[key] = max([last_push.get(key, 0), *ends])
        self._shared_pops(pops, device_of)
        # A pop's element is unsized: each pop frees its share of what was pushed into its list (the pops
        # of a list traced to no push: their share of what the device's lists no pop traced to hold).
        unmatched, spare = defaultdict(int), defaultdict(list)
        for (d, lst), size in pushed.items():
            dropped = None if (d, lst) in pops else self._dropped_at(lst)
            if dropped is not None:  # (its Exit waits for the last push: a late one runs past the loop's end)
                changes.append((max(dropped, last_push.get((d, lst), 0)), d, -size))
            else:
                unmatched[d] += 0 if (d, lst) in pops else size
        for (d, lst), ends in pops.items():
            if pushed.get((d, lst)):
                changes += [(t, d, -(pushed[(d, lst)] // len(ends))) for t in ends]
            else:
                spare[d] += ends
        for d, ends in spare.items():
            changes += [(t, d, -(unmatched[d] // len(ends))) for t in ends if unmatched[d]]
        return _timeline(changes)

    def other_iterations(self, size_of: Callable[[str], list[int]], device_of: Callable[[str], str]):
        """(k -> time -> device -> bytes) what the loop's other iterations hold while iteration k is
        replayed. A loop runs up to parallel_iterations iterations at once: a gradient loop's weight
        gradients (each iteration's MatMul, summed by an AddN chain one iteration at a time) can all be
        made before the sums catch up. Each run j of a body kernel holds its output from its start to
        the end of its readers' j-th runs (a reader that did not run once per iteration: not counted)."""
        lives = []  # (node, j, start, end, device, bytes)
        for name, runs in self.repeated.items():
            op = MKL_PREFIX.sub("", self.nodes[name].op)
            if op in _NOT_MADE or DENSE_UPDATE_RE.match(op):
                continue
            for k, size in enumerate(size_of(name)):
                users = self.readers.get((name, k), ())
                if not size or not users or any(u not in self.repeated for u in users):
                    continue
                for j, (s, e) in enumerate(runs):
                    ends = [self.repeated[u][j][1] for u in users if j < len(self.repeated[u])]
                    if len(ends) == len(users):
                        lives.append((name, j, s, max(e, *ends), device_of(name), size))
        if not lives:
            return None
        every = _timeline([c for _, _, s, e, d, b in lives for c in ((s, d, b), (e, d, -b))])
        by_run, lasts = defaultdict(list), []  # iteration k replays each kernel's k-th run, or its last
        for life in lives:
            by_run[life[1]].append(life)
            if life[1] == len(self.repeated[life[0]]) - 1:
                lasts.append(life)

        def of(k: int):
            mine = by_run.get(k, []) + [life for life in lasts if life[1] < k]
            own = _timeline([c for _, _, s, e, d, b in mine for c in ((s, d, b), (e, d, -b))])
            return lambda t: {d: v - (own(t).get(d, 0) if own else 0) for d, v in every(t).items()}

        return of

    def peaks(self, size_of: Callable[[str], list[int]], device_of: Callable[[str], str], group_size: int = 1,
              first_call: bool = False, copies: bool = False, measured: Measured = Measured(),
              record: dict | None = None) -> dict[str, int]:
        """Each device's peak (bytes requested) with node -> device_of(node); `copies`: a tensor read
        on another device than its maker's is a copy there (a GPU machine's); `measured`: what the
        allocator's events told (each kernel's scratch, made `temp_after` its start, else at it; when
        the RPC layer let go of a node's output it sent to another task; how long after its end a
        kernel's inputs were let go of, after its start its outputs were made); `record`: kernel ->
        the makers of the buffers its end freed (filled)."""
        m = measured
        out: dict[str, int] = {}
        previous = None
        lists = self.held_in_lists(size_of, device_of)
        others = self.other_iterations(size_of, device_of)
        across = [n.tensor_name for n in self.nodes.values() if n.op in RECVS and n.tensor_name in self.sent
                  and other_task(device_of(self.sent[n.tensor_name][0]), device_of(n.name))]
        remote, remote_names = frozenset(self.sent[t] for t in across), frozenset(across)
        let_go = sorted((t, None, name) for name, t in m.released.items() if name in self.nodes)
        size_of = self._with_list_elements(size_of)
        for k, run in enumerate(self.runs):
            other = others(k) if others is not None else None
            counts = defaultdict(int, {t: len(r) for t, r in self.readers.items()})
            sim = _Sim(dict(self.nodes), dict(self.sent), counts, size_of, group_size, first_call, copies,
                       m.constants, m.copied, temps=m.temps, frames=self.frames, remote=remote, remote_names=remote_names,
                       let_go=frozenset(name for _, _, name in let_go), temp_after=frozenset(m.temp_after),
                       late=frozenset(m.inputs_after), late_outputs=frozenset(m.outputs_after), freed=record)
            if previous is not None:
                sim.carry(previous)
            if copies:
                for t, names in self.readers.items():
                    for name in names:
                        sim.on[(t, device_of(name))] = sim.on.get((t, device_of(name)), 0) + 1
            later = tuple((t + after[name], step, name) for t, starts, name in run
                          for step, after, names in ((_SCRATCH, m.temp_after, sim.temp_after),
                                                     (_OUTPUTS, m.outputs_after, sim.late_outputs))
                          if starts is True and name in names) + tuple(
                (t + m.inputs_after[name], _INPUTS, name) for t, starts, name in run if starts is False and name in sim.late)
            for t, starts, name in (sorted(run + tuple(let_go) + later, key=lambda x: x[0]) if let_go or later else run):
                if starts is None:
                    sim.let_go_of(name)
                elif starts is _SCRATCH:
                    sim.scratch(self.nodes[name], device_of(name))
                elif starts is _INPUTS:
                    sim.let_inputs_go(self.nodes[name], device_of(name))
                elif starts is _OUTPUTS:
                    sim.outputs(self.nodes[name], device_of(name))
                elif starts:
                    sim.start(self.nodes[name], device_of(name))
                else:
                    sim.end(self.nodes[name], device_of(name))
                held = defaultdict(int, lists(t) if lists is not None else {})
                for d, b in (other(t).items() if other is not None else ()):
                    held[d] += max(0, b)
                for d, b in held.items():
                    out[d] = max(out.get(d, 0), sim.live[d] + b)
            for d, p in sim.peak.items():
                out[d] = max(out.get(d, 0), p)
            previous = sim
        return out


def _timeline(changes: list[tuple[int, str, int]]):
    """time -> device -> the running sum of the (time, device, bytes) changes up to then, or None."""
    changes = sorted(changes)
    times = [t for t, _, _ in changes]
    totals, now = [], defaultdict(int)
    for _, d, size in changes:
        now[d] = max(0, now[d] + size)
        totals.append(dict(now))

    def at(t: int) -> Mapping[str, int]:
        i = bisect.bisect_right(times, t)
        return totals[i - 1] if i else {}

    return at if changes else None


def _frames(nodes: Mapping[str, Node]) -> dict[str, str]:
    """Each loop variable's Exit -> the Enter of its initial value. Measured (the allocator's events of
    Keras' LSTM, 2026-11-28): the value a loop variable enters with is freed when the loop exits, not
    after its first iteration read it (nor is it written in place: an AddN in the body writes into its
    other input), so the loop's frame holds it from its Enter to its Exit."""
    out = {}
    merges = {n.name: n for n in nodes.values() if n.op in MERGES}
    merge_of = {n.name: n.inputs[0][0] for n in nodes.values() if n.op in ("Switch", "RefSwitch") and n.inputs}
    for n in nodes.values():
        if n.op not in ("Exit", "RefExit") or not n.inputs:
            continue
        merge = merges.get(merge_of.get(n.inputs[0][0], ""))
        enter = next((t for t, _ in merge.inputs if nodes.get(t) and nodes[t].op in ("Enter", "RefEnter")), None) \
            if merge else None
        if enter:
            out[n.name] = enter
    return out


def _list_times(n: Node, runs: list[tuple[int, int]], readers: Mapping, runs_of: Mapping) -> tuple[int, ...]:
    """When each run of a push added its element to the list (its end), or when each run of a pop let
    its element go: once the ops reading the popped element in that iteration have ended (a loop runs
    iterations in parallel: the pops can run ahead of the gradient math that reads their elements)."""
    if n.op == "TensorListFromTensor":  # its elements exist from when it starts copying them in
        return tuple(s for s, _ in runs)
    if n.op != "TensorListPopBack":
        return tuple(e for _, e in runs)
    users = [u for u in readers.get((n.name, 1), ()) if u in runs_of]
    return tuple(max([e, *(runs_of[u][j][1] for u in users if j < len(runs_of[u]))]) for j, (_, e) in enumerate(runs))


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
    from pinpoint.placement.graphs.ops import dtype_size, shape_bytes

    return [(shape_bytes(dtype_size(dtype), dims) or 0) if dims is not None else 0 for dtype, dims in outs or ()]


@dataclass(frozen=True)
class Replay:
    """One profiled call as the prediction replays it, kept in the run folder (placement_ops.json.gz,
    `memory_replay`) so `pinpoint plan` can replay it under another placement: the executed nodes,
    the kernels as they ran (node, start ps, end ps), each node's output bytes and device."""

    nodes: tuple[Node, ...]
    order: tuple[tuple[str, int, int], ...]
    sizes: Mapping[str, tuple[int, ...]]
    devices: Mapping[str, str]
    replicas: int = 0
    first_call: bool = False
    batch: int | None = None  # the step's batch (memory_batch.batch_of)
    scaled: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> outputs that grow with it
    # node -> the most scratch its kernel asked for at once (the allocator's `temp` region, as measured):
    # oneDNN's convolution and pooling workspaces; kept at any batch and placement.
    temps: Mapping[str, int] = field(default_factory=dict)
    # node -> when the RPC layer let go of its output sent to another task (as `order`'s times): the
    # allocator's own event, for no kernel does it (its time depends on gRPC, not on the graph).
    released: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's start it held that scratch (ps, as measured): two kernels that
    # ran at once each held their most at another time (a transformer's two Einsum gradients).
    temp_after: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's end the executor let go of its inputs (ps, as measured): on a
    # loaded machine a CNN's gradient buffer was freed 179 us after its last reader ended.
    inputs_after: Mapping[str, int] = field(default_factory=dict)
    # node -> how long after its kernel's start it got its first output (ps, as measured), for a kernel
    # with scratch (the others start then): a transformer's Einsum made the temp it hands on as its
    # output 873 us into its 1000 us kernel.
    outputs_after: Mapping[str, int] = field(default_factory=dict)
    # the constants the call made though it was not the function's first call (the allocator's events:
    # a parameter_server worker's first run of its own copy of the function)
    constants: frozenset = frozenset()
    # the updates that wrote a copy of their variable though no read of this call held it (the
    # allocator's events: another worker's call read the parameter_server's variable meanwhile)
    copied: frozenset = frozenset()

    @cached_property
    def schedule(self) -> Schedule:
        return Schedule.of(self.nodes, self.order)

    def size_of(self, name: str) -> list[int]:
        return list(self.sizes.get(name, ()))

    def peaks(self, device_of: Callable[[str], str] | None = None, copies: bool = False,
              record: dict | None = None) -> dict[str, int]:
        """Each device's peak over the call, every node on device_of(node) (default: where it ran)."""
        measured = Measured(self.temps, self.released, self.temp_after, self.inputs_after, self.outputs_after,
                            self.constants, self.copied)
        return self.schedule.peaks(self.size_of, device_of or (lambda name: self.devices.get(name, "")),
                                   self.replicas or 1, self.first_call, copies, measured, record)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [[n.name, n.op, [list(t) for t in n.inputs], n.tensor_name] for n in self.nodes],
                "order": [list(x) for x in self.order], "sizes": {k: list(v) for k, v in self.sizes.items()},
                "devices": dict(self.devices), "replicas": self.replicas, "first_call": self.first_call,
                "batch": self.batch, "scaled": {k: list(v) for k, v in self.scaled.items()}, "temps": dict(self.temps),
                "released": dict(self.released), "temp_after": dict(self.temp_after),
                "inputs_after": dict(self.inputs_after), "outputs_after": dict(self.outputs_after),
                "constants": sorted(self.constants), "copied": sorted(self.copied)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Replay:
        nodes = tuple(Node(name, op, tuple((a, int(b)) for a, b in inputs), key) for name, op, inputs, key in d["nodes"])
        return cls(nodes, tuple((a, int(b), int(c)) for a, b, c in d["order"]),
                   {k: tuple(v) for k, v in d["sizes"].items()}, dict(d["devices"]), int(d.get("replicas") or 0),
                   bool(d.get("first_call")), d.get("batch"), {k: tuple(v) for k, v in (d.get("scaled") or {}).items()},
                   dict(d.get("temps") or {}), dict(d.get("released") or {}), dict(d.get("temp_after") or {}),
                   dict(d.get("inputs_after") or {}), dict(d.get("outputs_after") or {}),
                   frozenset(d.get("constants") or ()), frozenset(d.get("copied") or ()))
