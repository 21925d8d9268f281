"""Issue 49, parameter servers: a tensor one task sends another, as the allocator records it and as
the prediction replays it; and the partition graphs TensorFlow writes for a closure's function.
The figures are arithmetic on the constructed events and graphs."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

US = 1_000_000  # picoseconds per microsecond
WORKER = "/job:worker/task:0/CPU:0"
PS = "/job:ps/task:0/CPU:0"


def _rpc_thread_xspace(another_thread: bool = False, **no_op):
    """An RPC thread of the host plane: in one threadpool region, an allocation with no op (the
    receive's bytes arriving) and then the receive's asynchronous Done; in a later region, an
    allocation with no receive after it (not a receive's). `no_op`: the allocations' own `tf_op`
    stat, as a TensorFlow version writes it when no op made them (2.21 writes none).
    `another_thread`: the Done runs on a second RPC thread."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xs = xplane_pb2.XSpace()
    plane = xs.planes.add(name="/host:CPU")
    for i, name in enumerate(("kernel_type", "name", "requested_bytes", "allocation_bytes", "addr",
                              "bytes_allocated", "tf_op"), start=1):
        plane.stat_metadata[i].name = name
    for i, name in enumerate(("ThreadpoolListener::StartRegion", "MemoryAllocation",
                              "ExecutorState::ProcessAsync::Done", "ThreadpoolListener::StopRegion"), start=1):
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
    line = plane.lines.add(id=1, name="tf_GrpcWorkerEnvQueues/1", timestamp_ns=0)
    other = plane.lines.add(id=2, name="tf_GrpcWorkerEnvQueues/2", timestamp_ns=0) if another_thread else line

    def event(meta, at_us, **stats):
        e = (other if meta == 3 else line).events.add(metadata_id=meta, offset_ps=at_us * US, duration_ps=US)
        for key, value in stats.items():
            sid = {"kernel_type": 1, "name": 2, "requested_bytes": 3, "allocation_bytes": 4, "addr": 5,
                   "bytes_allocated": 6, "tf_op": 7}[key]
            if isinstance(value, str):
                e.stats.add(metadata_id=sid, str_value=value)
            else:
                e.stats.add(metadata_id=sid, int64_value=value)

    event(1, 10)
    event(2, 11, requested_bytes=4096, allocation_bytes=4096, addr=1, bytes_allocated=4096, **no_op)
    event(3, 12, kernel_type="_Recv", name="grad/_7")
    event(4, 13)
    event(1, 20)
    event(2, 21, requested_bytes=64, allocation_bytes=256, addr=2, bytes_allocated=4352, **no_op)
    event(4, 22)
    return xs


@pytest.mark.parametrize("no_op", [{}, {"tf_op": "(null)"}], ids=["2.21", "2.16"])
def test_an_rpc_threads_allocation_belongs_to_the_receive_done_after_it(no_op):
    from pinpoint.placement.profile.allocator import memory_events
    from pinpoint.placement.profile.xspace import receive_arrivals

    xs = _rpc_thread_xspace(**no_op)
    assert ([(e.requested, e.op, e.kernel) for e in memory_events(xs)], receive_arrivals(xs)) == (
        [(4096, "", "grad/_7"), (64, "", "")], {"grad/_7": [12 * US]})


def test_a_receives_buffer_is_its_own_when_its_done_runs_on_another_rpc_thread():
    """Under load a receive's bytes can arrive on one RPC thread and its Done run on another: the
    allocation is still the receive's (the latest unclaimed one on an RPC thread before that Done);
    the later one with no receive after it stays nobody's."""
    from pinpoint.placement.profile.allocator import memory_events

    xs = _rpc_thread_xspace(another_thread=True)
    assert [(e.requested, e.kernel) for e in memory_events(xs)] == [(4096, "grad/_7"), (64, "")]


def test_a_receives_buffer_is_its_own_when_the_trace_lost_its_done():
    """TensorFlow 2.16 lost a receive's Done in about one run of twenty: the receive of step 7 started
    at 5 us, its bytes arrived at 10 us on an RPC thread, and no Done followed. The allocation is that
    receive's (and its step's), not the host's; a receive whose Done is there (step 8) claims nothing."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from pinpoint.placement.profile.allocator import memory_events

    xs = xplane_pb2.XSpace()
    plane = xs.planes.add(name="/host:CPU")
    stats = ("kernel_type", "name", "step_id", "requested_bytes", "allocation_bytes", "addr", "bytes_allocated")
    for i, name in enumerate(stats, start=1):
        plane.stat_metadata[i].name = name
    for i, name in enumerate(("ExecutorState::ProcessAsync::Start", "ExecutorState::ProcessAsync::Done",
                              "MemoryAllocation"), start=1):
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
    compute = plane.lines.add(id=1, name="tf_Compute/1", timestamp_ns=0)
    rpc = plane.lines.add(id=2, name="tf_GrpcWorkerEnvQueues/2", timestamp_ns=0)
    for line, meta, at_us, values in (
            (compute, 1, 5, {"kernel_type": "_Recv", "name": "w/_2", "step_id": 7}),
            (compute, 1, 6, {"kernel_type": "_Recv", "name": "w/_2", "step_id": 8}),
            (compute, 2, 8, {"kernel_type": "_Recv", "name": "w/_2", "step_id": 8}),
            (rpc, 3, 10, {"requested_bytes": 4096, "allocation_bytes": 4096, "addr": 1, "bytes_allocated": 4096})):
        e = line.events.add(metadata_id=meta, offset_ps=at_us * US, duration_ps=US)
        for key, value in values.items():
            e.stats.add(metadata_id=stats.index(key) + 1, **(
                {"str_value": value} if isinstance(value, str) else {"int64_value": value}))
    assert [(e.requested, e.kernel, e.step) for e in memory_events(xs)] == [(4096, "w/_2", 7)]


def test_a_received_buffer_is_made_when_the_allocator_gave_it_not_at_the_receives_done():
    """The receive's bytes got their buffer at 11 us and its Done came at 12 us: the replay makes the
    buffer at 11 (a 256 KiB tensor's allocation came 20 us before its Done, and a buffer let go of
    in between was still live beside it)."""
    from pinpoint.placement.memory.from_trace import receive_times
    from pinpoint.placement.profile.allocator import memory_events

    xs = _rpc_thread_xspace()
    assert receive_times(xs, memory_events(xs)) == {"grad/_7": [11 * US]}


def _graph(*nodes):
    from tensorflow.core.framework import graph_pb2

    g = graph_pb2.GraphDef()
    for name, op, inputs, device, tensor in nodes:
        n = g.node.add(name=name, op=op, device=device)
        n.input.extend(inputs)
        if tensor:
            n.attr["tensor_name"].s = tensor.encode()
    return g


def test_a_tensor_sent_to_another_task_is_a_new_buffer_there_and_held_here_until_the_rpc_layer_lets_go():
    """The worker's x (100 B); relu of x is sent to the ps, so it gets a buffer of its own (the RPC
    layer's, never x's written in place): 200 B while relu runs. q (150 B) runs after the send. The
    ps's receive is a copy made when its bytes arrive (t=6), which z writes into. The RPC layer let go
    of relu at t=9 (the allocator's event): q and relu live together, 250 B. Without that time, relu
    is let go of at the send, and the worker's peak is x and relu's 200 B."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    worker = _graph(("x", "MatMul", [], WORKER, ""), ("relu", "Relu", ["x"], WORKER, ""),
                    ("send", "_Send", ["relu"], WORKER, "edge_relu"), ("q", "MatMul", [], WORKER, ""))
    ps = _graph(("recv", "_Recv", [], PS, "edge_relu"), ("z", "Mul", ["recv"], PS, ""))
    nodes = [Node.of(n) for g in (worker, ps) for n in g.node]
    devices = {n.name: n.device for g in (worker, ps) for n in g.node}
    sizes = {"x": [100], "relu": [100], "recv": [100], "z": [100], "q": [150]}
    # The receive is posted at 1 and its bytes arrive at 6 (its trace event ends then).
    order = [("x", 0, 1), ("relu", 2, 3), ("send", 4, 4), ("recv", 1, 6), ("q", 5, 8), ("z", 7, 8)]
    schedule = Schedule.of(nodes, order)
    held = schedule.peaks(lambda n: sizes.get(n, []), devices.get, measured=Measured(released={"relu": 9}))
    at_send = schedule.peaks(lambda n: sizes.get(n, []), devices.get)
    assert (held, at_send) == ({WORKER: 250, PS: 100}, {WORKER: 200, PS: 100})


def test_a_tensor_from_another_task_is_a_new_buffer_even_when_its_sender_is_unsized():
    """The worker sends g, an IdentityN of a loop's sum whose shape inference left it unsized (the
    LSTM's gate-weight gradient under parameter_server). The ps's receive is still a new buffer of
    what the allocator gave it (100 B), which its MatMul reads: 100 + 80 B on the ps."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    worker = _graph(("s", "AddN", [], WORKER, ""), ("g", "IdentityN", ["s"], WORKER, ""),
                    ("send", "_Send", ["g"], WORKER, "edge_g"))
    ps = _graph(("recv", "_Recv", [], PS, "edge_g"), ("z", "MatMul", ["recv"], PS, ""))
    nodes = [Node.of(n) for g in (worker, ps) for n in g.node]
    devices = {n.name: n.device for g in (worker, ps) for n in g.node}
    sizes = {"recv": [100], "z": [80]}  # (the receive's bytes as the allocator gave them; s and g unknown)
    order = [("s", 0, 1), ("g", 1, 1), ("send", 2, 2), ("recv", 1, 4), ("z", 5, 6)]
    assert Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), devices.get)[PS] == 100 + 80


def _dump(folder, name: str, devices: list[str]) -> None:
    """TensorFlow's file for one dumped graph: one node per device given."""
    nodes = "".join(f'node {{\n  name: "n{i}"\n  op: "NoOp"\n  device: "{d}"\n}}\n' for i, d in enumerate(devices))
    (folder / f"{name}.main.after_partition_passes.pbtxt").write_text(nodes)


W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"
P0 = "/job:ps/replica:0/task:0/device:CPU:0"


def test_a_closures_graphs_are_its_workers_part_and_each_component_it_ran_on_another_task(tmp_path):
    """The caller's own part of step_9 (its worker's), not the part the ps ran as a component of its
    own; each component's latest final graph; another function's files are not read."""
    from pinpoint.placement.graphs.dumps import remote_partitions

    _dump(tmp_path, "__inference_step_9_partition__job:worker_replica:0_task:0_device:CPU:0.0003", [W0])
    _dump(tmp_path, "__inference_step_9_partition__job:ps_replica:0_task:0_device:CPU:0.0003", [P0, P0, P0])
    _dump(tmp_path, "__inference_step_9_partitioned_41_1_partition__job:ps_replica:0_task:0_device:CPU:0.0000", [P0])
    _dump(tmp_path, "__inference_step_9_partitioned_41_1_partition__job:ps_replica:0_task:0_device:CPU:0.0001",
          [P0, P0])
    _dump(tmp_path, "__inference_step_91_partition__job:worker_replica:0_task:0_device:CPU:0.0003", [W0] * 5)
    graphs, why = remote_partitions(tmp_path, "__inference_step_9", W0)
    assert ([len(g.node) for g in graphs], why) == ([1, 2], None)


def test_tensorflow_2_16s_component_names_are_read_too(tmp_path):
    """TensorFlow 2.16 names a component `<fn>_<id>_<k>`, without `partitioned_`."""
    from pinpoint.placement.graphs.dumps import remote_partitions

    _dump(tmp_path, "__inference_step_9_partition__job:worker_replica:0_task:0_device:CPU:0.0003", [W0])
    _dump(tmp_path, "__inference_step_9_41_1_partition__job:ps_replica:0_task:0_device:CPU:0.0001", [P0, P0])
    graphs, why = remote_partitions(tmp_path, "__inference_step_9", W0)
    assert ([len(g.node) for g in graphs], why) == ([1, 2], None)


def test_with_two_workers_the_callers_part_is_read_and_their_identical_components_once(tmp_path):
    """Each worker instantiates step_9: its own part, and a component on the ps under an id of its own."""
    from pinpoint.placement.graphs.dumps import remote_partitions, tasks_of

    _dump(tmp_path, "__inference_step_9_partition__job:worker_replica:0_task:0_device:CPU:0.0003", [W0])
    _dump(tmp_path, "__inference_step_9_partition__job:worker_replica:0_task:1_device:CPU:0.0003", [W1, W1])
    _dump(tmp_path, "__inference_step_9_partitioned_41_1_partition__job:ps_replica:0_task:0_device:CPU:0.0001", [P0])
    _dump(tmp_path, "__inference_step_9_partitioned_57_1_partition__job:ps_replica:0_task:0_device:CPU:0.0002", [P0])
    graphs, why = remote_partitions(tmp_path, "__inference_step_9", W1)
    assert ([len(g.node) for g in graphs], why, tasks_of(tmp_path, "__inference_step_9", W1)) == ([2, 1], None, 2)


def test_components_that_differ_are_not_guessed_between(tmp_path):
    from pinpoint.placement.graphs.dumps import remote_partitions

    _dump(tmp_path, "__inference_step_9_partition__job:worker_replica:0_task:0_device:CPU:0.0003", [W0])
    _dump(tmp_path, "__inference_step_9_partitioned_41_1_partition__job:ps_replica:0_task:0_device:CPU:0.0001", [P0])
    _dump(tmp_path, "__inference_step_9_partitioned_57_1_partition__job:ps_replica:0_task:0_device:CPU:0.0002",
          [P0, P0])
    assert remote_partitions(tmp_path, "__inference_step_9", W0) == (
        [], "__inference_step_9 was instantiated 2 times; which one ran the measured call is not known")


def test_a_received_buffer_the_rpc_layer_still_holds_outlives_its_reader():
    """The ps receives 100 B (bytes arrive at t=6); z sums it (4 B) and is its only reader; w (200 B)
    runs after. The RPC layer let go of the received bytes at t=11 (the allocator's event), so they
    and w live together: 300 B. Without that time they go with their reader: 200 B at w."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    worker = _graph(("x", "MatMul", [], WORKER, ""), ("send", "_Send", ["x"], WORKER, "edge_x"))
    ps = _graph(("recv", "_Recv", [], PS, "edge_x"), ("z", "Sum", ["recv"], PS, ""), ("w", "MatMul", [], PS, ""))
    nodes = [Node.of(n) for g in (worker, ps) for n in g.node]
    devices = {n.name: n.device for g in (worker, ps) for n in g.node}
    sizes = {"x": [100], "recv": [100], "z": [4], "w": [200]}
    order = [("x", 0, 1), ("send", 2, 2), ("recv", 1, 6), ("z", 7, 8), ("w", 9, 10)]
    schedule = Schedule.of(nodes, order)
    held = schedule.peaks(lambda n: sizes.get(n, []), devices.get, measured=Measured(released={"recv": 11}))
    freed = schedule.peaks(lambda n: sizes.get(n, []), devices.get)
    assert (held[PS], freed[PS]) == (300, 200)


def test_a_received_allocation_holds_what_its_sender_made():
    """A worker receives a ps's variable value (the receive `<sender>/_<n>` of a ReadVariableOp) and
    a gradient the ps computed: each is the kind its sender's tensor is, not an activation."""
    from pinpoint.placement.memory.measured import per_device
    from pinpoint.placement.profile.allocator import MemEvent

    rows = [("dense/ReadVariableOp/_4", 4096), ("gradient_tape/dense/MatMul/_6", 1024)]
    events = [MemEvent(time_ps=i, alloc=True, addr=i + 1, requested=size, allocated=size, total_after=0, kernel=recv)
              for i, (recv, size) in enumerate(rows)]
    devices = {recv: WORKER for recv, _ in rows} | {"dense/ReadVariableOp": PS, "gradient_tape/dense/MatMul": PS}
    types = {"dense/ReadVariableOp/_4": "_Recv", "gradient_tape/dense/MatMul/_6": "_Recv",
             "dense/ReadVariableOp": "ReadVariableOp", "gradient_tape/dense/MatMul": "MatMul"}
    worker = per_device(events, devices, types)[WORKER]
    assert [(x.requested, x.kind) for x in worker.at_peak] == [(4096, "variable"), (1024, "gradient")]
