"""Issue 49, an in-process parameter_server cluster with two workers: both run the same graphs at once,
so an allocation's op does not tell whose call made it. A constructed trace as TensorFlow writes one
(step ids on allocations and executor runs; a call's EagerService request before its FunctionRun);
the figures are arithmetic on it."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

US = 1_000_000  # picoseconds per microsecond
W0, W1, PS = "/job:worker/task:0/CPU:0", "/job:worker/task:1/CPU:0", "/job:ps/task:0/CPU:0"
S0, S1, BEFORE, UNKNOWN = 101, 202, 303, 404  # steps: worker 0's, worker 1's, and two begun before the trace
MIB = 1 << 20
# The caller (worker 1)'s graphs: every node of the step on its task.
DEVICES = {"MatMul": W1, "ones": W1, "ReadVariableOp": PS}
STATS = ("id", "tf_op", "requested_bytes", "allocation_bytes", "addr", "bytes_allocated", "debug_str", "_ct", "_c",
         "_pt", "_p")


def _request(task: int) -> str:
    """An EagerService:Enqueue request's debug string: the operation's device, and an input's."""
    return (f'context_id: 1\nqueue {{\n  operation {{\n    id: 6\n    name: "__inference_step_16"\n'
            f'    device: "/job:worker/replica:0/task:{task}/device:CPU:0"\n    op_inputs {{\n      remote_handle {{\n'
            f'        device: "/job:ps/replica:0/task:0/device:CPU:0"\n      }}\n    }}\n  }}\n}}\n')


def _xspace():
    """Worker 0's and worker 1's request threads (each a call, and the constants its first run makes);
    each worker's executor thread (its call's MatMul; worker 0's also runs a call begun before the
    trace); the ps's thread (both calls' reads); a thread that ran only a call of no known worker."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xs = xplane_pb2.XSpace()
    plane = xs.planes.add(name="/host:CPU")
    for i, name in enumerate(STATS, start=1):
        plane.stat_metadata[i].name = name
    names = ["EagerService:Enqueue", "FunctionRun", "ExecutorState::Process", "MemoryAllocation",
             "MemoryDeallocation", "MatMul:MatMul", "ReadVariableOp:ReadVariableOp", "ThreadpoolListener::StartRegion",
             "ThreadpoolListener::StopRegion", "ThreadpoolListener::Record"]
    for i, name in enumerate(names, start=1):
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
        plane.event_metadata[i].display_name = name.split(":")[1] if name.count(":") == 1 else ""
    total = [0]
    addr = iter(range(1, 100))

    def event(line, kind, at_us, dur_us=1, **stats):
        e = line.events.add(metadata_id=names.index(kind) + 1, offset_ps=at_us * US, duration_ps=dur_us * US)
        if kind == "MemoryAllocation":
            total[0] += stats["requested_bytes"]
            stats |= {"allocation_bytes": stats["requested_bytes"], "addr": next(addr), "bytes_allocated": total[0]}
        for key, value in stats.items():
            sid = STATS.index(key) + 1
            e.stats.add(metadata_id=sid, **({"str_value": value} if isinstance(value, str) else {"int64_value": value}))

    def thread(i):
        return plane.lines.add(id=i, name=f"tf_Compute/{i}", timestamp_ns=0)

    for line, task, step in ((thread(1), 0, S0), (thread(2), 1, S1)):
        event(line, "MemoryAllocation", 5, tf_op="ones", id=0, requested_bytes=MIB // 2)
        event(line, "EagerService:Enqueue", 10, 5, debug_str=_request(task))
        event(line, "FunctionRun", 12, id=step)
    for line, steps in ((thread(3), (S0, BEFORE)), (thread(4), (S1,))):
        for k, step in enumerate(steps):
            event(line, "ExecutorState::Process", 20 + 10 * k, 5, id=step)
            event(line, "MatMul:MatMul", 21 + 10 * k, 3)
            event(line, "MemoryAllocation", 22 + 10 * k, tf_op="MatMul", id=step, requested_bytes=MIB)
    ps = thread(5)
    event(ps, "ThreadpoolListener::StartRegion", 14, 0, _ct=15, _c=98)
    for k, step in enumerate((S0, S1)):
        event(ps, "ExecutorState::Process", 15 + 2 * k, 1, id=step)
        event(ps, "ReadVariableOp:ReadVariableOp", 15 + 2 * k)
        if step == S0:  # worker 0's call queues more work on the ps (a threadpool flow, 15)
            event(ps, "ThreadpoolListener::Record", 15, 0, _pt=15, _p=99)
            event(ps, "ThreadpoolListener::StopRegion", 16, 0)
    # ... which runs in a region that names no step.
    event(ps, "ThreadpoolListener::StartRegion", 50, 0, _ct=15, _c=99)
    event(ps, "ReadVariableOp:ReadVariableOp", 51)
    event(ps, "ThreadpoolListener::StopRegion", 53, 0)
    unknown = thread(6)
    event(unknown, "ExecutorState::Process", 40, 5, id=UNKNOWN)
    event(unknown, "MemoryAllocation", 41, tf_op="MatMul", id=UNKNOWN, requested_bytes=MIB)
    return xs


def test_each_workers_call_is_told_apart_by_its_step_and_the_threads_that_ran_it():
    """Worker 0's call and the one begun before the trace on its thread go to worker 0's device, and so
    do the constants its request thread made; worker 1's (the caller's) stay; a call no thread ties to a
    worker goes to OTHER_CALL, not to the caller."""
    from pinpoint.placement.memory.calls import OTHER_CALL, on_own_devices, worker_calls
    from pinpoint.placement.profile.allocator import memory_events

    xs = _xspace()
    calls = worker_calls(xs, DEVICES, W1)
    placed = on_own_devices(memory_events(xs), calls, DEVICES, lambda d: d)
    assert (dict(calls.enqueued), calls.step_of(), sorted((e.op, e.step, e.device) for e in placed)) == (
        {S0: "/job:worker/replica:0/task:0/device:CPU:0", S1: "/job:worker/replica:0/task:1/device:CPU:0"},
        (S1, None),
        [("MatMul", S0, W0), ("MatMul", S1, ""), ("MatMul", BEFORE, W0), ("MatMul", UNKNOWN, OTHER_CALL),
         ("ones", 0, ""), ("ones", 0, W0)])


def test_the_callers_own_call_keeps_only_its_kernels_and_allocations():
    """The ps's read at 51 us ran in a region no step names, queued by worker 0's call: left out with
    it. (An EagerService:Enqueue reads as a kernel named EagerService, as in TensorFlow's traces: the
    caller's is kept, worker 0's left out with its thread.)"""
    from pinpoint.placement.memory.calls import on_own_devices, one_call, worker_calls
    from pinpoint.placement.profile.allocator import memory_events
    from pinpoint.placement.profile.xspace import op_events

    xs = _xspace()
    calls = worker_calls(xs, DEVICES, W1)
    own_xs, own = one_call(xs, on_own_devices(memory_events(xs), calls, DEVICES, lambda d: d), calls, S1)
    assert (sorted((e.op, e.requested) for e in own), sorted((e.name, e.start_ps) for e in op_events(own_xs)[0])) == (
        [("MatMul", MIB), ("ones", MIB // 2)],
        [("EagerService", 10 * US), ("MatMul", 21 * US), ("ReadVariableOp", 17 * US)])


def test_a_trace_with_no_call_requested_on_the_callers_task_says_which_call_is_not_known():
    from pinpoint.placement.memory.calls import worker_calls

    calls = worker_calls(_xspace(), DEVICES, W0.replace("task:0", "task:2"))
    assert calls.step_of() == (None, "the trace holds 0 calls requested on /job:worker/task:2/CPU:0's task, "
                                     "not one, so which allocations were the measured call's cannot be told")
