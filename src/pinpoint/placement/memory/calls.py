"""One call among several in a trace: the workers of an in-process parameter_server cluster run the
same function at once. Their graphs share every node name, and the allocator's events of all of them
land in one profile, so an op's name does not tell which worker's call made an allocation.

TensorFlow tags what each call did with its step id, the same on every task the call ran on: an
allocation's `id`, a receive's `ProcessAsync::Done`'s `step_id`, the `ExecutorState::Process` a
kernel runs in (`id`). A worker's call of a remote function is the `FunctionRun` that follows the
`EagerService:Enqueue` whose operation names that worker's device, on the same thread. A call
enqueued before the trace began has no such request in it: its worker is the one whose threads ran
it (each worker's runtime has a thread pool of its own; a ps's threads serve every worker's calls).
A kernel is a call's by the threadpool region it ran in: the step the region's work names, else
that of the region that queued it (`ThreadpoolListener` flows).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from pinpoint.device_names import parse_name
from pinpoint.placement.profile.xspace import stat_value

ENQUEUE = "EagerService:Enqueue"


FUNCTION_RUN = "FunctionRun"


PROCESS = "ExecutorState::Process"


_MEMORY = ("MemoryAllocation", "MemoryDeallocation")


START_REGION, STOP_REGION = "ThreadpoolListener::StartRegion", "ThreadpoolListener::StopRegion"


RECORD = "ThreadpoolListener::Record"


# The events that name the step they are for (`id`, a receive's `step_id`), and the flow's Record.
_STEP_EVENTS = {PROCESS, FUNCTION_RUN, "MemoryAllocation", "ExecutorDoneCallback", RECORD,
                "ExecutorState::ProcessAsync::Start", "ExecutorState::ProcessAsync::Done"}


# The enqueued operation's own device (an input's remote handle names its device deeper in).
_OP_DEVICE = re.compile(r'\n  operation \{\n(?:    .*\n)*?    device: "([^"]+)"')


# Where an allocation of another call goes when its worker is not known: a call begun before the
# trace (its request not in it) on threads that ran no call the trace names.
OTHER_CALL = "(another worker's call, begun before the trace)"


@dataclass(frozen=True)
class Calls:
    """The worker calls in a trace around `caller`'s: `enqueued`, step -> device of each call requested
    in it; `steps`, those and calls begun before it, by the threads that ran them; `threads`, line ->
    the worker whose pool it belongs to; `unknown`, worker threads that ran only calls of no known worker."""

    caller: str
    enqueued: Mapping[int, str]
    steps: Mapping[int, str]
    threads: Mapping[int, str]
    unknown: frozenset[int]

    def worker(self, step: int, thread: int) -> str:
        """The worker device (or OTHER_CALL) whose call an allocation of `step` on `thread` was; ''
        when no call's is known (tf.data's; a ps's thread's)."""
        if step in self.steps or (not step and thread in self.threads):
            return self.steps.get(step) or self.threads[thread]
        return OTHER_CALL if step or thread in self.unknown else ""

    def others(self, step: int, thread: int) -> bool:
        """Whether an allocation of `step` on `thread` was another call's than the caller's."""
        worker = self.worker(step, thread)
        return worker == OTHER_CALL or (bool(worker) and _task(worker) != _task(self.caller))

    def step_of(self) -> tuple[int | None, str | None]:
        """(the step of the one call requested on the caller's task in the trace, or None and why not)."""
        own = [s for s, d in self.enqueued.items() if _task(d) == _task(self.caller)]
        if len(own) != 1:
            return None, (f"the trace holds {len(own)} calls requested on {self.caller}'s task, not one, so which "
                          "allocations were the measured call's cannot be told")
        return own[0], None


def worker_calls(xspace, devices: Mapping[str, str], caller: str) -> Calls:
    """The worker calls the trace holds (see the module's docstring). `devices`: node -> device of
    the caller's graphs; a worker's thread runs nodes of the caller's task and none of another's."""
    enqueued: dict[int, str] = {}
    ran: dict[int, set[int]] = defaultdict(set)  # line -> the steps it ran
    tasks: dict[int, set[tuple]] = defaultdict(set)  # line -> the tasks of the nodes it ran or allocated for
    for line, plane, names in _host_lines(xspace):
        device = ""
        for e in sorted(line.events, key=lambda e: e.offset_ps):
            meta = plane.event_metadata.get(e.metadata_id)
            name = meta.name if meta is not None else ""
            stats = _stats(e, names) if name in (ENQUEUE, FUNCTION_RUN, PROCESS, "MemoryAllocation") else {}
            if name == ENQUEUE:
                m = _OP_DEVICE.search(str(stats.get("debug_str", "")))
                device = m.group(1) if m else ""
            elif step := int(stats.get("id") or 0):
                ran[line.id].add(step)
                if name == FUNCTION_RUN and device:
                    enqueued[step], device = device, ""
            node = stats.get("tf_op") or (name[: -len(meta.display_name) - 1] if meta is not None and meta.display_name
                                          and name.endswith(":" + meta.display_name) else "")
            if node in devices:
                tasks[line.id].add(_task(devices[node]))
    workers = {line for line, t in tasks.items() if t == {_task(caller)}}
    threads = {}
    for line in workers:
        known = {_task(enqueued[s]): enqueued[s] for s in ran[line] if s in enqueued}
        if len(known) == 1:
            threads[line] = next(iter(known.values()))
    steps: dict[int, str] = dict(enqueued)
    for line, worker in threads.items():
        for s in ran[line] - set(enqueued):
            steps[s] = worker if steps.get(s, worker) == worker else ""  # threads of two workers: not known
    return Calls(caller, enqueued, {s: d for s, d in steps.items() if d}, threads,
                 frozenset(line for line in workers - set(threads) if ran[line]))


def on_own_devices(events: Iterable, calls: Calls, devices: Mapping[str, str], canonical) -> list:
    """The events, each allocation of another worker's call on that worker's device (OTHER_CALL when
    not known): the graphs put every node on the caller's task, and the other workers ran the same
    nodes on theirs. `canonical`: a runtime device name -> its spelling in `devices`."""
    out = []
    for e in events:
        device = devices.get(e.op) or devices.get(e.kernel) or ""
        if e.alloc and device and _task(device) == _task(calls.caller) and calls.others(e.step, e.thread):
            other = calls.worker(e.step, e.thread)
            e = replace(e, device=OTHER_CALL if other == OTHER_CALL
                        else canonical(re.sub(r"/task:\d+", f"/task:{_task(other)[1]}", device)))
        out.append(e)
    return out


def one_call(xspace, events: Iterable, calls: Calls, step: int):
    """(the trace, the events) of the caller's call (`step`): other calls' kernels, receives and
    allocations (and the frees of those allocations) left out, and every event of another call's
    threads; allocations of no call (tf.data's, no step) kept. `events`: on_own_devices'."""
    regions, made_in = region_steps(xspace)
    kept, dropped_at, dropped = [], set(), set()
    for e in events:
        region = regions.get(made_in.get((e.thread, e.time_ps)), step)  # (a constant's: no step of its own)
        other = e.alloc and (e.device or e.step not in (0, step) or region != step or calls.others(0, e.thread))
        if other or (not e.alloc and e.addr in dropped):
            (dropped.add if e.alloc else dropped.discard)(e.addr)
            dropped_at.add(e.time_ps)
        else:
            kept.append(e)
    out = type(xspace)()
    out.CopyFrom(xspace)
    for line, plane, names in _host_lines(out):
        if calls.others(0, line.id):  # another call's thread: none of it
            here = [e for e in line.events if _memory(plane, e) and line.timestamp_ns * 1000 + e.offset_ps
                    not in dropped_at]
        else:
            here = list(_ours(line, plane, names, step, dropped_at, regions))
        del line.events[:]
        line.events.extend(here)
    return out, kept


def _ours(line, plane, names: dict, step: int, dropped_at: set[int], regions: Mapping[tuple[int, int], int]):
    """The events of a thread that are the call's: its allocator events not dropped; the others by
    the step of the threadpool region they ran in (region_steps), else by the executor run around
    them or their own `step_id`."""
    base, region = line.timestamp_ns * 1000, None
    others = [(e.offset_ps, e.offset_ps + e.duration_ps) for e in line.events if _name(plane, e) == PROCESS
              and int(_stats(e, names).get("id") or 0) not in (0, step)]
    for e in sorted(line.events, key=lambda e: e.offset_ps):
        name = _name(plane, e)
        region = (line.id, e.offset_ps) if name == START_REGION else None if name == STOP_REGION else region
        if name in _MEMORY:
            if base + e.offset_ps not in dropped_at:
                yield e
        elif region in regions:
            if regions[region] == step:
                yield e
        elif not any(start <= e.offset_ps <= end for start, end in others) and int(
                _stats(e, names).get("step_id") or step) == step:
            yield e


def region_steps(xspace) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], tuple[int, int]]]:
    """((line, offset of a threadpool region's start) -> the step its work was for, (line, time) of
    each allocation -> its region). A region's step is the one step its executor runs, receives or
    allocations name, else the step of the region that queued it (TensorFlow's flow: the region's `_c`
    is the `_p` of the `ThreadpoolListener::Record` that queued it). A ps's update kernels can run in a
    region that names no step: they forward their inputs."""
    own: dict[tuple[int, int], tuple[tuple, set[int]]] = {}  # region -> (its flow id, the steps in it)
    queued_in: dict[tuple, tuple[int, int]] = {}  # flow id -> the region that queued it
    made_in: dict[tuple[int, int], tuple[int, int]] = {}
    for line, plane, names in _host_lines(xspace):
        region = None
        for e in sorted(line.events, key=lambda e: e.offset_ps):
            name = _name(plane, e)
            if name == START_REGION:
                region = (line.id, e.offset_ps)
                stats = _stats(e, names)
                own[region] = ((stats.get("_ct"), stats.get("_c")), set())
            elif name == STOP_REGION:
                region = None
            elif region is not None and name in _STEP_EVENTS:
                stats = _stats(e, names)
                if s := int(stats.get("id") or stats.get("step_id") or 0):
                    own[region][1].add(s)
                if name == RECORD:
                    queued_in[(stats.get("_pt"), stats.get("_p"))] = region
                if name == "MemoryAllocation":
                    made_in[(line.id, line.timestamp_ns * 1000 + e.offset_ps)] = region
    out = {}
    for region in own:
        at, hops = region, 0
        while at is not None and not own[at][1] and hops < 32:  # (a flow's chain of regions, bounded)
            at, hops = queued_in.get(own[at][0]), hops + 1
        if at is not None and len(own[at][1]) == 1:
            out[region] = next(iter(own[at][1]))
    return out, made_in


def _name(plane, e) -> str:
    meta = plane.event_metadata.get(e.metadata_id)
    return meta.name if meta is not None else ""


def _memory(plane, e) -> bool:
    return _name(plane, e) in _MEMORY


def _task(device: str) -> tuple:
    return parse_name(device)[:2]


def _host_lines(xspace):
    for plane in xspace.planes:
        if plane.name == "/host:CPU":
            names = {k: v.name for k, v in plane.stat_metadata.items()}
            for line in plane.lines:
                yield line, plane, names


def _stats(e, names: dict) -> dict:
    return {names.get(s.metadata_id): stat_value(s, names) for s in e.stats}


__all__ = ["OTHER_CALL", "Calls", "on_own_devices", "one_call", "worker_calls"]
