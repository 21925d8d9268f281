"""The call's kernels in the order they ran, ready to replay under any device assignment
(`Schedule`): the inline kernels the trace does not show placed (`with_inline_ops`), a loop's
iterations each in its own order, its frames and tensor lists, and the allocator's times merged in.
`Schedule.peaks` replays each iteration with a `Simulation`."""

from __future__ import annotations

import bisect
import enum
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pinpoint.placement.graphs.ops import (
    ALIASES_FIRST_INPUT,
    DENSE_UPDATE_RE,
    LIST_MAKERS,
    LIST_OPS,
    MERGES,
    MKL_PREFIX,
    NOT_MADE,
    NOTHING_MADE,
    RECVS,
    SENDS,
)
from pinpoint.placement.memory.nodes import Measured, Node, data_inputs, other_task
from pinpoint.placement.memory.simulation import Simulation


class Event(enum.Enum):
    """What happens at one instant of a replayed call (a Schedule's run is (time, Event, node) in time order)."""

    START = "start"  # a kernel starts: its outputs and scratch are made (unless measured later)
    END = "end"  # a kernel ends: its inputs are let go of (unless measured later), its scratch freed
    RELEASED = "released"  # the RPC layer lets go of a node's output (`Replay.released`)
    SCRATCH = "scratch"  # a kernel's scratch is made, after its start (`Replay.temp_after`)
    OUTPUTS = "outputs"  # a kernel's outputs are made, after its start (`Replay.outputs_after`)
    INPUTS = "inputs"  # a kernel's inputs are let go of, after its end (`Replay.inputs_after`)


MAX_ITERATIONS = 64  # a loop's iterations replayed one by one: the first 64 at most


# What each event of a run does to the call being replayed (Event.RELEASED: Simulation.let_go_of).
STEPS = {Event.START: Simulation.start, Event.END: Simulation.end, Event.SCRATCH: Simulation.scratch, Event.OUTPUTS: Simulation.outputs,
         Event.INPUTS: Simulation.let_inputs_go}


def with_inline_ops(nodes: dict, ran: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
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
                [] if n.op in RECVS else [t for t, _ in data_inputs(n)]
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
            for src, _ in data_inputs(n):
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
    runs: tuple[tuple[tuple[int, Event, str], ...], ...]  # per iteration: (time, event, node) in time order
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
            ran = with_inline_ops(by_name, [(name, *r[min(k, len(r) - 1)]) for name, r in runs_of.items()
                                             if by_name[name].op not in RECVS]
                                   + [(name, s, e) for name, r in runs_of.items() if by_name[name].op in RECVS
                                      for s, e in r])
            names |= {name for name, _, _ in ran}
            # At one instant: what ended is released, then what starts allocates, in the order the inline
            # ops were found (their inputs first), and an op of no duration ends after it started.
            steps = []
            for seq, (name, s, e) in enumerate(ran):
                steps += [(s, 1, seq, Event.START, name), (e, 2 if e == s else 0, seq, Event.END, name)]
            runs.append(tuple((t, event, name) for t, _, _, event, name in sorted(steps)))
        readers: dict[tuple[str, int], list[str]] = defaultdict(list)
        for name in names:
            for t in data_inputs(by_name[name]):
                readers[t].append(name)
        lists = {name: list_times(by_name[name], r, readers, runs_of) for name, r in runs_of.items()
                 if by_name[name].op in LIST_OPS}
        return cls(by_name, tuple(runs), {t: tuple(sorted(r)) for t, r in readers.items()}, sent, lists,
                   loop_frames(by_name), {name: tuple(r) for name, r in runs_of.items() if len(r) > 1
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
            for t, event, name in run:
                if event is Event.END:
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
        return timeline(changes)

    def other_iterations(self, size_of: Callable[[str], list[int]], device_of: Callable[[str], str]):
        """(k -> time -> device -> bytes) what the loop's other iterations hold while iteration k is
        replayed. A loop runs up to parallel_iterations iterations at once: a gradient loop's weight
        gradients (each iteration's MatMul, summed by an AddN chain one iteration at a time) can all be
        made before the sums catch up. Each run j of a body kernel holds its output from its start to
        the end of its readers' j-th runs (a reader that did not run once per iteration: not counted)."""
        lives = []  # (node, j, start, end, device, bytes)
        for name, runs in self.repeated.items():
            op = MKL_PREFIX.sub("", self.nodes[name].op)
            if op in NOT_MADE or DENSE_UPDATE_RE.match(op):
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
        every = timeline([c for _, _, s, e, d, b in lives for c in ((s, d, b), (e, d, -b))])
        by_run, lasts = defaultdict(list), []  # iteration k replays each kernel's k-th run, or its last
        for life in lives:
            by_run[life[1]].append(life)
            if life[1] == len(self.repeated[life[0]]) - 1:
                lasts.append(life)

        def of(k: int):
            mine = by_run.get(k, []) + [life for life in lasts if life[1] < k]
            own = timeline([c for _, _, s, e, d, b in mine for c in ((s, d, b), (e, d, -b))])
            return lambda t: {d: v - (own(t).get(d, 0) if own else 0) for d, v in every(t).items()}

        return of

    @staticmethod
    def _with_measured_times(run, releases, m: Measured, sim) -> tuple:
        """The run with the allocator's times merged in (in time order; at one instant the run's own
        order first): the RPC layer's releases, and each kernel's scratch and outputs made, and inputs
        let go of, when the allocator did it rather than at the kernel's start or end."""
        later = tuple((t + after[name], event, name) for t, start, name in run if start is Event.START
                      for event, after, names in ((Event.SCRATCH, m.temp_after, sim.temp_after),
                                                  (Event.OUTPUTS, m.outputs_after, sim.outputs_after))
                      if name in names)
        later += tuple((t + m.inputs_after[name], Event.INPUTS, name) for t, end, name in run
                       if end is Event.END and name in sim.inputs_after)
        return tuple(sorted(run + tuple(releases) + later, key=lambda x: x[0])) if releases or later else run

    def peaks(self, size_of: Callable[[str], list[int]], device_of: Callable[[str], str], group_size: int = 1,
              first_call: bool = False, copies: bool = False, measured: Measured | None = None,
              record: dict | None = None) -> dict[str, int]:
        """Each device's peak (bytes requested) with node -> device_of(node); `copies`: a tensor read
        on another device than its maker's is a copy there (a GPU machine's); `measured`: what the
        allocator's events told (each kernel's scratch, made `temp_after` its start, else at it; when
        the RPC layer let go of a node's output it sent to another task; how long after its end a
        kernel's inputs were let go of, after its start its outputs were made); `record`: kernel ->
        the makers of the buffers its end freed (filled)."""
        m = measured if measured is not None else Measured()
        out: dict[str, int] = {}
        previous = None
        lists = self.held_in_lists(size_of, device_of)
        others = self.other_iterations(size_of, device_of)
        across = [n.tensor_name for n in self.nodes.values() if n.op in RECVS and n.tensor_name in self.sent
                  and other_task(device_of(self.sent[n.tensor_name][0]), device_of(n.name))]
        remote, remote_names = frozenset(self.sent[t] for t in across), frozenset(across)
        releases = sorted((t, Event.RELEASED, name) for name, t in m.released.items() if name in self.nodes)
        size_of = self._with_list_elements(size_of)
        for k, run in enumerate(self.runs):
            other = others(k) if others is not None else None
            counts = defaultdict(int, {t: len(r) for t, r in self.readers.items()})
            sim = Simulation(dict(self.nodes), dict(self.sent), counts, size_of, group_size, first_call, copies,
                       m.constants, m.copied, temps=m.temps, frames=self.frames, remote=remote, remote_names=remote_names,
                       released=frozenset(name for _, _, name in releases), temp_after=frozenset(m.temp_after),
                       inputs_after=frozenset(m.inputs_after), outputs_after=frozenset(m.outputs_after), freed=record)
            if previous is not None:
                sim.carry(previous)
            if copies:
                for t, names in self.readers.items():
                    for name in names:
                        sim.on[(t, device_of(name))] = sim.on.get((t, device_of(name)), 0) + 1
            for t, event, name in self._with_measured_times(run, releases, m, sim):
                if event is Event.RELEASED:
                    sim.let_go_of(name)
                else:
                    STEPS[event](sim, self.nodes[name], device_of(name))
                held = defaultdict(int, lists(t) if lists is not None else {})
                for d, b in (other(t).items() if other is not None else ()):
                    held[d] += max(0, b)
                for d, b in held.items():
                    out[d] = max(out.get(d, 0), sim.live[d] + b)
            for d, p in sim.peak.items():
                out[d] = max(out.get(d, 0), p)
            previous = sim
        return out


def timeline(changes: list[tuple[int, str, int]]):
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


def loop_frames(nodes: Mapping[str, Node]) -> dict[str, str]:
    """Each loop variable's Exit -> the Enter of its initial value. Measured (the allocator's events of
    Keras' LSTM): the value a loop variable enters with is freed when the loop exits, not
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


def list_times(n: Node, runs: list[tuple[int, int]], readers: Mapping, runs_of: Mapping) -> tuple[int, ...]:
    """When each run of a push added its element to the list (its end), or when each run of a pop let
    its element go: once the ops reading the popped element in that iteration have ended (a loop runs
    iterations in parallel: the pops can run ahead of the gradient math that reads their elements)."""
    if n.op == "TensorListFromTensor":  # its elements exist from when it starts copying them in
        return tuple(s for s, _ in runs)
    if n.op != "TensorListPopBack":
        return tuple(e for _, e in runs)
    users = [u for u in readers.get((n.name, 1), ()) if u in runs_of]
    return tuple(max([e, *(runs_of[u][j][1] for u in users if j < len(runs_of[u]))]) for j, (_, e) in enumerate(runs))
