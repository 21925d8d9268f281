"""One call replayed (`Simulation`): each tensor's buffer, each buffer's pending readers, each
device's live bytes. Each method is one of TensorFlow's buffer rules, named in docs/memory.md's rule
table: `outputs` (which op makes a buffer), `receive`, `fetch`, `compute` (written in place),
`update` (copy-on-write), `sparse_access` and `read_copy` (copy-on-read mode), `carry`,
`free_if_done`, `let_go_of` and `rpc_holds` (the RPC layer)."""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pinpoint.placement.graphs.ops import (
    ALIASES_FIRST_INPUT,
    CWISE,
    DENSE_UPDATE_RE,
    MERGES,
    MKL_PREFIX,
    NOTHING_MADE,
    PREFETCHED,
    RECVS,
    REDUCING_COLLECTIVE_RE,
    REPLAY_HANDLE_PASS,
    SENDS,
    SPARSE_ACCESS_RE,
    SPARSE_UPDATE_RE,
)
from pinpoint.placement.memory.nodes import Node, data_inputs, this_host


class Slot(enum.IntEnum):
    """The buffers a node holds besides its outputs, keyed (node, slot) beside its outputs (node, k >= 0)."""

    CHUNK = -1  # a collective's chunk of its input, while it runs
    COPY = -2  # the copy a copy-on-write update wrote: the variable's buffer from then on
    SCRATCH = -3  # a kernel's scratch, while it runs
    SWAP = -4  # a copy-on-read variable's new buffer while its update runs (the old one is freed then)


# A buffer's readers when it is held until the call ends (a constant, a variable's copy).
HELD_ALL_CALL = 1 << 30


@dataclass
class Buffer:
    device: str
    bytes: int
    refs: int = 0
    shared: bool = False  # a variable's own buffer, which a read only borrows (never written in place)
    holds: Buffer | None = None  # a read's: the variable's old buffer it keeps alive after a copy-on-write
    pinned: bool = False  # a received buffer the RPC layer still holds: kept after its last reader
    maker: str = ""  # the node that allocated it (its aliases share it)


@dataclass
class Simulation:
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
    buffers: dict = field(default_factory=dict)  # (node, output) -> Buffer
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
    released: frozenset = frozenset()
    waiting: dict = field(default_factory=dict)  # such a node -> its buffer, until then
    temp_after: frozenset = frozenset()  # the nodes whose scratch is made after their kernel's start
    running: set = field(default_factory=set)  # the kernels started and not ended
    inputs_after: frozenset = frozenset()  # the kernels whose inputs are let go of after their end
    outputs_after: frozenset = frozenset()  # the kernels whose outputs are made after their start
    freed: dict | None = None  # kernel -> the makers of the buffers its reads' end freed (recorded)
    gone: set = field(default_factory=set)  # such nodes the RPC layer let go of before they were held
    copy_on_read: set = field(default_factory=set)  # the variables in copy-on-read mode (`sparse_access`)

    def __post_init__(self) -> None:
        if not self.first_call:  # a previous call's gather or sparse update left them in that mode
            self.copy_on_read |= self.sparse_accessed

    @cached_property
    def sparse_accessed(self) -> frozenset:
        """The variables a gather or a sparse update of this call's graph reads (SPARSE_ACCESS_RE)."""
        return frozenset(self.variable(data_inputs(n)[0]) for n in self.nodes.values()
                         if SPARSE_ACCESS_RE.match(MKL_PREFIX.sub("", n.op)) and data_inputs(n))

    @cached_property
    def variable_bytes(self) -> dict:
        """Variable -> its size, as its reads' outputs are sized (0 when no read is)."""
        out: dict = defaultdict(int)
        for n in self.nodes.values():
            if n.op == "ReadVariableOp" and data_inputs(n):
                sizes = self.size_of(n.name)
                var = self.variable(data_inputs(n)[0])
                out[var] = max(out[var], sizes[0] if sizes else 0)
        return out

    def new(self, key, device: str, size: int, refs: int) -> Buffer:
        buf = self.buffers[key] = Buffer(device, size, refs, maker=key[0])
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

    def free_if_done(self, buf: Buffer) -> None:
        if buf.refs <= 0 and buf.holds is not None:  # a read done: the old buffer it kept is one read freer
            held, buf.holds = buf.holds, None
            held.refs -= 1
            self.free_if_done(held)
        if buf.refs <= 0 and buf.bytes and not buf.pinned:
            self.live[buf.device] -= buf.bytes
            buf.bytes = 0  # freed once, whichever alias saw it last

    def fetch(self, n: Node, device: str) -> None:
        """copies: each input made on another device is copied into `device` once, for all its readers there."""
        for t in data_inputs(n):
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
            self.local[(t, device)] = copy = Buffer(device, 0, mine)
            copy.bytes = size
            self.live[device] += size
            self.peak[device] = max(self.peak[device], self.live[device])

    def start(self, n: Node, device: str) -> None:
        self.running.add(n.name)
        if n.name not in self.temp_after:
            self.scratch(n, device)
        if n.name not in self.outputs_after:
            self.outputs(n, device)

    def outputs(self, n: Node, device: str) -> None:
        """Its outputs: a new buffer, an input's, or nothing, by TensorFlow's rules."""
        op, inputs, reads = MKL_PREFIX.sub("", n.op), data_inputs(n), self.readers
        if op in ("Const", "HostConst") and (self.first_call or n.name in self.constants):
            # A constant's tensor is made when its kernel is, at the function's first call, and kept.
            for k, size in enumerate(self.size_of(n.name)):
                if size:
                    self.new((n.name, k), device, size, HELD_ALL_CALL)
            return
        if op in NOTHING_MADE or op in SENDS or (op in PREFETCHED and not this_host(device)):
            return
        if self.copies and op not in RECVS:
            self.fetch(n, device)
        if op == "TensorListGetItem":  # the list's own element (list_kernels.h: set_output of it), no buffer
            return
        if op == "ReadVariableOp" and inputs and self.variable(inputs[0]) in self.copy_on_read:
            self.read_copy(n, op, inputs, device)
            return
        if op == "ReadVariableOp" and inputs:  # the variable's own buffer: counted before the call
            view = self.buffers[(n.name, 0)] = Buffer(device, 0, reads[(n.name, 0)], shared=True)
            self.views[self.variable(inputs[0])].append(view)
            return
        if SPARSE_ACCESS_RE.match(op) and inputs:
            self.sparse_access(n, inputs, device)
            if SPARSE_UPDATE_RE.match(op):
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
        if self.temps.get(n.name) and n.name in self.running and (n.name, Slot.SCRATCH) not in self.buffers:
            self.new((n.name, Slot.SCRATCH), device, self.temps[n.name], 1)

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
                if n.name in self.released and n.name not in self.gone:
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
            self.new((n.name, Slot.CHUNK), device, first.bytes // max(self.group_size, 1), 1)
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
            data = data_inputs(n)
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
        if var in self.copy_on_read:
            # PrepareToUpdateVariable copies a copy-on-read variable whatever holds it; no read holds
            # its old buffer (each read copied it), so that one is freed when the update ends.
            self.updated.add(var)
            if self.variable_bytes[var]:
                self.new((n.name, Slot.SWAP), device, self.variable_bytes[var], 1)
            return
        self.copy_on_write(n, var, inputs, device)

    def copy_on_write(self, n: Node, var: str, inputs, device: str, size: int = 0) -> None:
        """The copy an update writes when a read still holds its variable's buffer (or, at a first
        call, the value it was initialized from); `size`: the variable's, else the update's largest
        other input."""
        first = (self.first_call and var not in self.updated) or n.name in self.copied
        self.updated.add(var)
        if not first and not any(v.refs > 0 for v in self.views.get(var, ())):
            return
        size = size or max((b.bytes for b in (self.get(t, device) for t in inputs[1:]) if b is not None), default=0)
        size = size or max((self.size_of(t[0])[t[1]] for t in inputs[1:]
                            if t[1] < len(self.size_of(t[0]))), default=0)
        if size:
            self.copies_made[var] = self.new((n.name, Slot.COPY), device, size, HELD_ALL_CALL)
            old = self.carried.pop(var, None)
            if old is not None:  # the previous iteration's copy: freed once the reads still holding it are done
                pending = [v for v in self.views.get(var, ()) if v.refs > 0]
                old.refs = len(pending)
                for v in pending:
                    v.holds = old
                self.free_if_done(old)

    def sparse_access(self, n: Node, inputs, device: str) -> None:
        """A gather or a sparse update puts its variable in copy-on-read mode
        (EnsureSparseVariableAccess): the first one copies the whole variable if a read still holds it."""
        var = self.variable(inputs[0])
        if var in self.copy_on_read:
            return
        self.copy_on_write(n, var, inputs, device, self.variable_bytes[var])
        self.copy_on_read.add(var)

    def read_copy(self, n: Node, op: str, inputs, device: str) -> None:
        """A read of a variable in copy-on-read mode copies the whole variable (CopyVariable)."""
        self.compute(n, op, inputs, device)

    def carry(self, previous: Simulation) -> None:
        """A loop's next iteration: the copies the previous one made are the variables' buffers now."""
        self.copy_on_read |= previous.copy_on_read
        for var, buf in previous.copies_made.items():
            if buf.bytes:
                self.carried[var] = self.new((f"carried:{var}", 0), buf.device, buf.bytes, HELD_ALL_CALL)

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

    def rpc_holds(self, name: str, buf: Buffer) -> None:
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
        for scratch in (Slot.CHUNK, Slot.SCRATCH, Slot.SWAP):
            chunk = self.buffers.pop((n.name, scratch), None)
            if chunk is not None:
                chunk.refs = 0
                self.free_if_done(chunk)
        if MKL_PREFIX.sub("", n.op) in SENDS and n.tensor_name in self.remote_names:
            # A send to another task: the RPC layer answers the receiver's request with the tensor and
            # lets go of it (a large one once gRPC has sent it): when the trace shows, else at the send.
            for t in data_inputs(n)[:1]:
                buf = self.get(t, device)
                if buf is not None:
                    if t[0] in self.released:  # the send's read passes to the RPC layer
                        self.rpc_holds(t[0], buf)
                    buf.refs -= 1
                    self.free_if_done(buf)
        elif MKL_PREFIX.sub("", n.op) not in SENDS and n.name not in self.inputs_after:  # (a send's read: its receiver's)
            self.let_inputs_go(n, device)
        for buf in self.made.get(n.name, ()):  # outputs that nothing that ran reads
            self.free_if_done(buf)

    def let_inputs_go(self, n: Node, device: str) -> None:
        """Its reads are done: each input has one reader less (`freed`: what that freed, by maker)."""
        for t in data_inputs(n):
            buf = self.get(t, device)
            if buf is not None:
                held = buf.bytes
                buf.refs -= 1
                self.free_if_done(buf)
                if self.freed is not None and held and not buf.bytes and buf.maker:
                    self.freed[n.name].add(buf.maker)
