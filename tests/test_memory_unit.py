"""placement.memory on allocator events written here: the replay self-check, each allocation's
device, the peak and what is live at it. The figures are the events' own arithmetic."""

from __future__ import annotations

import pytest

from pinpoint.placement.memory.measured import UNATTRIBUTED, kind_of, per_device, summarize, thin
from pinpoint.placement.profile.allocator import MemEvent, self_check

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

BEFORE = 1000  # bytes the allocator held before the first event


def _events() -> list[MemEvent]:
    """/GPU:0 allocates 400 then 100 (its peak: 500), frees the 400; /GPU:1 allocates 300 from a
    collective's kernel (no op of its own); tf.data allocates 50 on the host (no op, no kernel)."""
    rows = [  # (alloc, addr, requested, allocated, op, kernel)
        (True, 1, 400, 512, "dense/MatMul", ""),
        (True, 2, 100, 256, "gradient_tape/dense/MatMul", ""),
        (True, 3, 300, 512, "CollectiveAdapterImpl::TempChunk", "replica_1/CollectiveReduceV2"),
        (False, 1, 400, 512, "", ""),
        (True, 4, 50, 256, "", ""),
        (False, 99, 64, 64, "", ""),  # allocated before the trace began
    ]
    total, out = BEFORE, []
    for i, (alloc, addr, req, size, op, kernel) in enumerate(rows):
        total += size if alloc else -size
        out.append(MemEvent(time_ps=i * 1_000_000, alloc=alloc, addr=addr, requested=req, allocated=size,
                            total_after=total, op=op, kernel=kernel))
    return out


DEVICES = {"dense/MatMul": "/GPU:0", "gradient_tape/dense/MatMul": "/GPU:0", "replica_1/CollectiveReduceV2": "/GPU:1"}
TYPES = {"dense/MatMul": "MatMul", "gradient_tape/dense/MatMul": "MatMul",
         "replica_1/CollectiveReduceV2": "CollectiveReduceV2"}


def test_the_replay_matches_the_allocators_running_total_and_counts_each_event_that_does_not():
    events = _events()
    assert self_check(events) == (0, len(events))
    # An allocation the trace lost: the event after it is off, the ones after that follow the
    # allocator's own total again.
    lost = events[:1] + events[2:]
    assert self_check(lost) == (1, len(events) - 1)


def test_each_allocation_goes_to_its_ops_device_its_kernels_or_the_host():
    check: dict = {}
    devs = per_device(_events(), DEVICES, TYPES, host="/CPU:0", check=check)
    peaks = {d: (m.peak_requested, m.peak_allocated) for d, m in devs.items()}
    assert peaks == {"/GPU:0": (400 + 100, 512 + 256), "/GPU:1": (300, 512), "/CPU:0": (50, 256)}
    assert [(x.op, x.requested, x.kind) for x in devs["/GPU:0"].at_peak] == [
        ("dense/MatMul", 400, "activation"), ("gradient_tape/dense/MatMul", 100, "gradient")]
    assert [(x.op, x.kind) for x in devs["/GPU:1"].at_peak] == [("CollectiveAdapterImpl::TempChunk", "collective buffer")]
    assert check == {"unpartitioned": 0}


def test_an_op_outside_the_steps_graphs_is_kept_apart_not_guessed():
    events = [MemEvent(time_ps=0, alloc=True, addr=1, requested=10, allocated=256, total_after=256, op="eager/Foo")]
    assert list(per_device(events, DEVICES, TYPES)) == [UNATTRIBUTED]


def test_the_summary_carries_both_checks_and_the_allocators_peak():
    events = _events()
    out = summarize(events, DEVICES, TYPES, process_peak=BEFORE + 512 + 256 + 512)
    assert out["self_check"] == {"events": 6, "mismatched": 0, "unpartitioned": 0,
                                 "replayed_peak": BEFORE + 512 + 256 + 512, "allocator_peak": BEFORE + 1280}


@pytest.mark.parametrize(("op", "op_type", "region", "kind"), [
    ("replica_1/adam/concat", "ConcatV2", "output", "gradient"),
    ("adam/update_0/Sqrt_1", "Sqrt", "output", "optimizer"),
    ("adam/update_0/AssignAddVariableOp", "AssignAddVariableOp", "temp", "optimizer update"),
    ("cond/OptionalGetValue", "OptionalGetValue", "output", "input"),
    ("dense/Relu", "Relu", "output", "activation"),
    ("max_pooling2d/MaxPool", "_MklNativeMaxPool", "temp", "temporary"),
])
def test_kinds(op, op_type, region, kind):
    assert kind_of(op, op_type, region) == kind


def test_thinning_keeps_every_windows_peak():
    points = [(float(i), i % 7) for i in range(1000)]
    kept = thin(points, 100)
    assert (len(kept), max(b for _, b in kept)) == (100, 6)


def test_mlflow_gets_each_devices_peak_and_input_bytes():
    from pinpoint.placement.report.metrics import headline_metrics

    memory = summarize(_events(), DEVICES, TYPES)
    out = headline_metrics({"memory": memory, "transfers": {"input": {"per_step": {"/GPU:0": 64.0}}}})
    assert {k: v for k, v in out.items() if k.startswith(("memory.", "placement.input"))} == {
        "memory.peak_bytes.CPU_0": 50.0, "memory.peak_allocated_bytes.CPU_0": 256.0,
        "memory.peak_bytes.GPU_0": 500.0, "memory.peak_allocated_bytes.GPU_0": 768.0,
        "memory.peak_bytes.GPU_1": 300.0, "memory.peak_allocated_bytes.GPU_1": 512.0,
        "placement.input_bytes_per_step.GPU_0": 64.0}


def _dev(peak: int, *live: tuple[str, str, int]) -> dict:
    return {"peak_requested": peak, "at_peak": [{"op": op, "kind": kind, "requested": n} for op, kind, n in live]}


def test_findings_name_the_packed_gradients_the_backward_pass_apart_and_the_activation_heavy_device():
    from pinpoint.placement.memory.measured import findings

    packed = findings({"/GPU:0": _dev(1000, ("adam/concat", "gradient", 400), ("dense/MatMul", "activation", 300)),
                       "/GPU:1": _dev(1000, ("adam/concat_1", "gradient", 400), ("dense/MatMul", "activation", 300))})
    assert [(f["device"], f["evidence"]) for f in packed] == [("/GPU:0", "adam/concat 400 B (40% of the peak)")]
    split = findings({"/GPU:0": _dev(1000, ("gradient_tape/d2/MatMul", "gradient", 600), ("adam/Sqrt", "optimizer", 200)),
                      "/GPU:1": _dev(900, ("d1/MatMul", "activation", 800)),
                      "/GPU:2": _dev(300, ("d2/MatMul", "activation", 200))})
    assert [(f["device"], f["what"].split(",")[0].split(" (")[0]) for f in split] == [
        ("/GPU:0", "the backward pass and the optimizer's math ran here"),
        ("/GPU:1", "one device holds most of the activations")]
    assert findings({"/GPU:0": _dev(100, ("a", "activation", 60)), "/GPU:1": _dev(100, ("b", "activation", 60))}) == []


def test_a_parameter_servers_update_and_a_workers_whole_model_are_the_strategys_design_not_findings():
    """The same bytes as the split above, on a ps and a worker: the ps holds the update beside its
    variables and the worker runs the whole model, as parameter_server places them."""
    from pinpoint.placement.memory.measured import findings

    assert findings({"/job:ps/task:0/CPU:0": _dev(1000, ("adam/Mul", "optimizer", 800), ("adam/Sqrt", "optimizer", 200)),
                     "/job:worker/task:0/CPU:0": _dev(900, ("d1/MatMul", "activation", 800)),
                     "/job:chief/task:0/CPU:0": _dev(300, ("adam/ReadVariableOp", "optimizer", 200))}) == []


def _graph(*nodes):
    """A GraphDef of (name, op, inputs, device) rows."""
    from tensorflow.core.framework import graph_pb2

    g = graph_pb2.GraphDef()
    for name, op, inputs, device in nodes:
        n = g.node.add(name=name, op=op, device=device)
        n.input.extend(inputs)
    return g


def test_the_prediction_frees_after_the_last_reader_writes_in_place_and_shares_a_received_buffer():
    """x (400 B) on /GPU:0; relu writes into x (its last reader); y = matmul (100 B) is sent to /GPU:1,
    where z = y * 2 writes into the received buffer once the send is done: logical CPUs share it, so
    /GPU:1 allocates nothing. On a GPU machine the received y is a 100 B copy in /GPU:1's memory."""
    from pinpoint.placement.memory.schedule import predict_peaks

    g0 = _graph(("x", "MatMul", [], "/GPU:0"), ("relu", "Relu", ["x"], "/GPU:0"),
                ("y", "MatMul", ["relu"], "/GPU:0"), ("send", "_Send", ["y"], "/GPU:0"))
    g0.node[-1].attr["tensor_name"].s = b"edge_y"
    g1 = _graph(("recv", "_Recv", [], "/GPU:1"), ("z", "Mul", ["recv"], "/GPU:1"))
    g1.node[0].attr["tensor_name"].s = b"edge_y"
    sizes = {"x": [400], "relu": [400], "y": [100], "z": [100]}
    order = [("x", 0, 1), ("relu", 2, 3), ("y", 4, 5), ("send", 6, 6), ("recv", 7, 7), ("z", 8, 9)]
    devices = {n.name: n.device for g in (g0, g1) for n in g.node}
    emulated = predict_peaks([g0, g1], order, lambda n: sizes.get(n, []), devices.get)
    gpu = predict_peaks([g0, g1], order, lambda n: sizes.get(n, []), devices.get, copies=True)
    # /GPU:0: x (reused by relu) and y live together: 400 + 100.
    assert (emulated, gpu) == ({"/GPU:0": 500}, {"/GPU:0": 500, "/GPU:1": 100})


def test_a_kernel_the_trace_does_not_show_runs_when_its_inputs_are_made():
    """A Reshape the executor runs inline (no event) keeps its input alive for its own readers."""
    from pinpoint.placement.memory.schedule import predict_peaks

    g = _graph(("a", "MatMul", [], "/GPU:0"), ("r", "Reshape", ["a"], "/GPU:0"),
               ("b", "MatMul", [], "/GPU:0"), ("c", "ConcatV2", ["r", "b"], "/GPU:0"))
    sizes = {"a": [300], "b": [200], "c": [500]}
    peaks = predict_peaks([g], [("a", 0, 1), ("b", 2, 3), ("c", 4, 5)], lambda n: sizes.get(n, []),
                          lambda n: "/GPU:0")
    assert peaks == {"/GPU:0": 300 + 200 + 500}


def _unseen_collective_graph():
    """g (400 B) read by the gradients' concat c (400 B) and by x (after c); r, the all-reduce of c
    over 2 replicas, whose kernel the trace does not show: its chunk of the ring is 400 / 2 B."""
    from pinpoint.placement.memory.nodes import Node

    nodes = [Node("g", "MatMul"), Node("c", "ConcatV2", (("g", 0),)), Node("x", "Relu", (("g", 0),)),
             Node("r", "CollectiveReduceV2", (("c", 0),))]
    sizes = {"g": (400,), "c": (400,), "x": (400,), "r": (400,)}
    return nodes, sizes


def test_a_collective_the_trace_does_not_show_runs_while_its_chunk_made_on_no_kernels_thread_is_held():
    """The chunk allocated outside any kernel, of r's input over the group (the allocator's request
    off by its alignment), is r's: r ran from its allocation to its release. A chunk made inside a
    kernel is that kernel's, and a collective the trace shows keeps its own times."""
    from pinpoint.placement.graphs.ops import COLLECTIVE_CHUNK
    from pinpoint.placement.memory.from_trace import unseen_collectives

    nodes, sizes = _unseen_collective_graph()

    def chunk(t, alloc, addr, kernel=""):
        return MemEvent(time_ps=t, alloc=alloc, addr=addr, requested=232, allocated=256, total_after=0,
                        op=COLLECTIVE_CHUNK, kernel=kernel)

    events = [chunk(3, True, 1, kernel="other/CollectiveReduceV2"), chunk(4, False, 1),
              chunk(10, True, 2), chunk(12, False, 2)]
    assert unseen_collectives(nodes, sizes, events, {"g", "c", "x"}, 2) == [("r", 10, 12)]
    assert unseen_collectives(nodes, sizes, events, {"g", "c", "x", "r"}, 2) == []


def test_a_collective_placed_as_its_chunk_was_held_does_not_hold_it_beside_its_inputs_maker():
    """Placed at once when c ends (as an inline op), r's chunk (200 B) would be held with g (400, x
    still to read it) and c (400): 1,000 B. Placed as its chunk was held (t 10 to 12): g and c
    together while c runs, 800 B."""
    from pinpoint.placement.memory.schedule import Schedule

    nodes, sizes = _unseen_collective_graph()
    ran = [("g", 0, 1), ("c", 2, 5), ("x", 6, 7)]
    peaks = [Schedule.of(nodes, order).peaks(lambda n: list(sizes.get(n, ())), lambda n: "/GPU:0", group_size=2)
             for order in (ran, [*ran, ("r", 10, 12)])]
    assert peaks == [{"/GPU:0": 400 + 400 + 200}, {"/GPU:0": 400 + 400}]


@pytest.mark.parametrize(("text", "size"), [("16GiB", 16 * 2**30), ("80GB", 80 * 10**9), ("1.5 TiB", int(1.5 * 2**40)),
                                            ("600MiB", 600 * 2**20)])
def test_gpu_sizes_parse_with_their_unit(text, size):
    from pinpoint.sizes import parse_size

    assert parse_size(text, "--gpu-memory") == size


@pytest.mark.parametrize(("text", "hint"), [("16", "pass a size with a unit"), ("16GBB", "pass a size with a unit"),
                                            ("100MiB", "a CUDA context takes")])
def test_a_bad_gpu_size_is_one_line_naming_the_field(text, hint):
    from pinpoint.errors import ConfigError
    from pinpoint.sizes import parse_size

    with pytest.raises(ConfigError) as err:
        parse_size(text, "--gpu-memory")
    assert str(err.value).startswith(f"--gpu-memory: got {text!r}") and hint in str(err.value)
    assert "\n" not in str(err.value)


def test_the_verdict_adds_each_stated_term_and_keeps_a_band_either_side():
    from pinpoint.placement.memory.fit import CONTEXT, NCCL, verdicts

    gib = 2**30
    memory = {"devices": {"/GPU:0": {"peak_requested": 100, "peak_allocated": 125, "at_peak": []}},
              "predicted": {"replicas": 2, "devices": {"/GPU:0": {"gpu_machine": 8 * gib}}}}
    need = 8 * gib + 2 * gib + NCCL  # the replay, 25% rounding as measured, NCCL's buffers
    cases = {size: verdicts(memory, size)["/GPU:0"] for size in (16 * gib, 11 * gib, 8 * gib)}
    assert {size: (v["verdict"], v["needs"], v["usable"]) for size, v in cases.items()} == {
        16 * gib: ("fits", need, 16 * gib - CONTEXT),
        11 * gib: ("borderline", need, 11 * gib - CONTEXT),
        8 * gib: ("does not fit", need, 8 * gib - CONTEXT)}


def test_replicas_share_the_highest_replay_and_allocator_rounding_measured_among_them():
    """Two replicas run the same kernels: one replayed to 8 GiB and its allocator fragmented by 25%,
    the other 4 GiB and 0%, draws either may get on the GPU machine, so both need 8 GiB x 1.25; a
    tf.device split's devices (one replica) keep their own."""
    from pinpoint.placement.memory.fit import NCCL, verdicts

    gib = 2**30
    devices = {"/GPU:0": {"peak_requested": 100, "peak_allocated": 125, "at_peak": []},
               "/GPU:1": {"peak_requested": 100, "peak_allocated": 100, "at_peak": []}}
    rows = {"/GPU:0": {"gpu_machine": 8 * gib}, "/GPU:1": {"gpu_machine": 4 * gib}}

    def needs(replicas: int) -> dict[str, int]:
        memory = {"devices": devices, "predicted": {"replicas": replicas, "devices": rows}}
        return {d: v["needs"] for d, v in verdicts(memory, 16 * gib).items()}

    assert (needs(2), needs(1)) == ({"/GPU:0": 10 * gib + NCCL, "/GPU:1": 10 * gib + NCCL},
                                    {"/GPU:0": 10 * gib, "/GPU:1": 4 * gib})


def test_a_cluster_merge_keeps_each_tasks_devices_checks_and_reasons():
    from pinpoint.placement.analysis.merge import merge_placements
    from pinpoint.placement.model.placement import Placement
    from pinpoint.placement.report.summary import memory_line

    chief = summarize(_events(), DEVICES, TYPES)
    worker = {"why_not": "not measured: not run in a task of a multi-process TensorFlow cluster"}
    base = {"devices": [], "transfers": {}, "variables": [], "conformance": {}}
    merged = merge_placements([Placement.from_json(dict(base, task="chief:0", memory=chief)),
                               Placement.from_json(dict(base, task="worker:0", memory=worker))])
    memory = merged.memory
    assert (sorted(memory.devices), memory.why_not, sorted(memory.tasks)) == (
        ["/CPU:0", "/GPU:0", "/GPU:1"], "[worker:0] not measured: not run in a task of a multi-process TensorFlow "
        "cluster", ["chief:0", "worker:0"])
    assert memory_line(memory).endswith("self-check: 0 of 6 allocator events off")


def test_cluster_tasks_measured_without_the_profiler_show_each_tasks_peak_and_the_reason_once():
    """Tasks of a multi-process cluster run no profiler: each keeps its allocator's peak (task_peak),
    the merge says the shared reason once, naming the tasks, and the summary is one line."""
    from pinpoint.placement.analysis.merge import merge_placements
    from pinpoint.placement.model.placement import Placement
    from pinpoint.placement.report.summary import memory_line

    why = "not measured per device: not run in a task of a multi-process TensorFlow cluster"
    base = {"devices": [], "transfers": {}, "variables": [], "conformance": {}}
    merged = merge_placements([
        Placement.from_json(dict(base, task="chief:0", memory={"why_not": why, "task_peak": 3 * 2**20, "steps": [2]})),
        Placement.from_json(dict(base, task="worker:0", memory={"why_not": why, "task_peak": 1536, "steps": [2]}))])
    memory = merged.memory
    assert memory.why_not == f"[chief:0, worker:0] {why}"
    assert {t: v["task_peak"] for t, v in memory.tasks.items()} == {"chief:0": 3 * 2**20, "worker:0": 1536}
    assert memory_line(memory) == (
        "memory     : step peak per task (all its devices together, the allocator's own): chief:0 3.0 MiB, "
        f"worker:0 1.5 KiB; [chief:0, worker:0] {why}")
    from pinpoint.placement.report.metrics import headline_metrics

    assert {k: v for k, v in headline_metrics(merged).items() if k.startswith("memory.")} == {
        "memory.task_peak_bytes.chief_0": 3.0 * 2**20, "memory.task_peak_bytes.worker_0": 1536.0}


def test_a_loops_tensor_list_holds_each_pushed_element_until_the_gradient_reading_it_ends():
    """A forward loop of 3 iterations pushes x (100 B each) into a list; the backward loop pops all 3
    at once (iterations in parallel) and R reads each popped element later (making 50 B). Before the
    first R ends the list still holds all 3: 300 B, with R's own 50 B."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("x", "MatMul"), Node("P", "TensorListPushBack", (("list", 0), ("x", 0))),
             Node("list", "EmptyTensorList"), Node("Q", "TensorListPopBack", (("P", 0),)),
             Node("R", "Mul", (("Q", 1),))]
    order = [("x", 0, 1), ("x", 10, 11), ("x", 20, 21), ("P", 2, 3), ("P", 12, 13), ("P", 22, 23),
             ("Q", 30, 31), ("Q", 32, 33), ("Q", 34, 35), ("R", 40, 45), ("R", 50, 55), ("R", 60, 65)]
    sizes = {"x": [100], "R": [50]}
    peaks = Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0")
    assert peaks == {"/GPU:0": 3 * 100 + 50}


def test_a_kernels_scratch_is_held_while_it_runs():
    """a (300 B) then b reading it (200 B) with 64 B of scratch: 300 + 200 + 64 while b runs."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("a", "Conv2D"), Node("b", "Conv2D", (("a", 0),))]
    sizes = {"a": [300], "b": [200]}
    schedule = Schedule.of(nodes, [("a", 0, 1), ("b", 2, 3)])
    peaks = [schedule.peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0", measured=Measured(temps=t)) for t in ({}, {"b": 64})]
    assert peaks == [{"/GPU:0": 500}, {"/GPU:0": 564}]


def test_a_kernels_scratch_is_the_most_it_held_at_once_and_freed_before_it_ended():
    """MaxPoolGrad's kernel (0-10) asks for 128 KiB and then 64 KiB of scratch while the first is still
    held (the bench's digits_cnn, in some runs): 192 KiB at once. Its later run (20-30) asks for them
    one after the other. Einsum's kernel (40-50) makes a 64 KiB temp it hands on as its output (freed
    at 60, after the kernel) beside 32 KiB of scratch: only the 32 KiB is scratch, and the 64 KiB is
    its output, made at 41."""
    from pinpoint.placement.memory.from_trace import handed_on, scratch_delays, scratch_peaks
    from pinpoint.placement.profile.allocator import MemEvent

    def temp(t, alloc, addr, size, op="pool_grad"):
        return MemEvent(time_ps=t, alloc=alloc, addr=addr, requested=size, allocated=size, total_after=0, op=op,
                        region="temp")

    events = [temp(1, True, 1, 131072), temp(2, True, 2, 65536), temp(3, False, 2, 65536), temp(4, False, 1, 131072),
              temp(21, True, 1, 131072), temp(22, False, 1, 131072), temp(23, True, 3, 65536), temp(24, False, 3, 65536),
              temp(41, True, 4, 65536, "einsum"), temp(42, True, 5, 32768, "einsum"), temp(43, False, 5, 32768, "einsum"),
              temp(60, False, 4, 65536, "einsum")]
    runs = {"pool_grad": [(0, 10), (20, 30)], "einsum": [(40, 50)]}
    assert (scratch_peaks(events, runs), scratch_delays(events, runs), handed_on(events, runs)) == (
        {"pool_grad": 131072 + 65536, "einsum": 32768}, {"pool_grad": 2 - 0, "einsum": 42 - 40}, {"einsum": [41]})


def test_two_kernels_that_run_at_once_hold_their_scratch_when_each_held_its_most():
    """a (0-100) holds 100 B of scratch from 60 on, b (10-50) from its start: never together. Made at
    each kernel's start they would be (a transformer's two Einsum gradients: +11% in a bench run).
    Their outputs (10 B each) and b's scratch: 120 B, not 220."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    schedule = Schedule.of([Node("a", "Einsum"), Node("b", "Einsum")], [("a", 0, 100), ("b", 10, 50)])
    peaks = [schedule.peaks(lambda n: [10], lambda n: "/GPU:0", measured=Measured(temps={"a": 100, "b": 100}, temp_after=after))
             for after in ({}, {"a": 60})]
    assert peaks == [{"/GPU:0": 220}, {"/GPU:0": 120}]


def test_a_parameter_server_coordinator_reads_each_serving_tasks_figures_and_names_the_missing(tmp_path):
    """The serving tasks' files (OUT/task_memory/ROLE-INDEX.json): each task's figures, a task without a
    file named in the one reason, and the summary's one line."""
    import json

    from pinpoint.placement.memory.tasks import TASK_MEMORY, serving_tasks_memory
    from pinpoint.placement.model.memory import Memory
    from pinpoint.placement.report.summary import memory_line

    (tmp_path / TASK_MEMORY).mkdir()
    (tmp_path / TASK_MEMORY / "ps-0.json").write_text(json.dumps({"task": "ps:0", "held": 69_120, "peak": 2**17,
                                                                   "time": 0.0}))
    (tmp_path / TASK_MEMORY / "other.json").write_text("not json")
    memory = serving_tasks_memory(tmp_path, ["worker:0", "ps:0"], "the steps run in the workers")
    assert memory == {"why_not": "not measured per device: the steps run in the workers; no figures from worker:0 "
                                 "(none in task_memory/: a task on another machine writes into its own file system)",
                      "tasks": {"ps:0": {"held": 69_120, "peak": 131_072}}}
    assert memory_line(Memory.from_json(memory)) == (
        "memory     : per task (all its devices together, the allocator's own): ps:0 holds 67.5 KiB (peak 128.0 KiB "
        f"since it started); {memory['why_not']}")


def test_a_serving_tasks_variables_are_counted_as_its_allocator_sizes_them():
    """A ps task's variables, each its value in whole 256 B units plus one 256 B chunk (measured on a
    ps: a 1 KiB variable adds 1,280 B): a [64, 128] float32 kernel (32,768 B), a [128] bias (512 B) and
    an int64 scalar on ps:0 take 33,024 + 768 + 512 = 34,304 B. ps:1 holds a variable of unknown shape
    and ps:2 a shard (its row's bytes are the whole variable's): no split. A worker holds none."""
    from pinpoint.placement.memory.tasks import with_task_variables
    from pinpoint.placement.model.memory import Memory
    from pinpoint.placement.report.metrics import _task_memory_metrics
    from pinpoint.placement.report.summary import memory_line

    memory = {"why_not": "not measured per device: the steps run in the workers",
              "tasks": {"ps:0": {"held": 40_960, "peak": 81_920}, "ps:1": {"held": 1_024, "peak": 1_024},
                        "ps:2": {"held": 1_024, "peak": 1_024}, "worker:0": {"held": 2_048, "peak": 4_096}}}
    variables = [{"bytes": 32_768, "devices": ["/job:ps/task:0/CPU:0"]},
                 {"bytes": 512, "devices": ["/job:ps/task:0/CPU:0"]},
                 {"bytes": 8, "devices": ["/job:ps/task:0/CPU:0"]},
                 {"bytes": None, "devices": ["/job:ps/task:1/CPU:0"]},
                 {"bytes": 512, "kind": "sharded", "devices": ["/job:ps/task:0/CPU:0", "/job:ps/task:2/CPU:0"]}]
    tasks = with_task_variables(memory, variables)["tasks"]
    assert tasks == {"ps:0": {"held": 40_960, "peak": 81_920}, "ps:1": {"held": 1_024, "peak": 1_024},
                     "ps:2": {"held": 1_024, "peak": 1_024}, "worker:0": {"held": 2_048, "peak": 4_096}}
    tasks = with_task_variables(memory, variables[:-1])["tasks"]
    assert tasks == {"ps:0": {"held": 40_960, "peak": 81_920, "variables": 3, "variables_bytes": 34_304},
                     "ps:1": {"held": 1_024, "peak": 1_024}, "ps:2": {"held": 1_024, "peak": 1_024},
                     "worker:0": {"held": 2_048, "peak": 4_096}}
    assert memory_line(Memory(tasks=tasks, why_not=memory["why_not"])).startswith(
        "memory     : per task (all its devices together, the allocator's own): ps:0 holds 40.0 KiB, 33.5 KiB of it "
        "3 variables (peak 80.0 KiB since it started), ps:1 holds 1.0 KiB (peak")
    assert _task_memory_metrics(tasks)["memory.variables_bytes.ps_0"] == 34_304.0


def test_a_loop_holds_its_variables_initial_value_until_its_exit():
    """A loop variable enters as z (Fill, 100 B): Enter -> Merge -> Switch; the body's AddN sums it
    with g (100 B) and h reads the sum (50 B); the Exit comes after two iterations. The loop holds z
    until its Exit, so AddN cannot write into z: it writes into g. While h runs: z + the sum + h."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("z", "Fill"), Node("E", "Enter", (("z", 0),)), Node("M", "Merge", (("E", 0), ("NI", 0))),
             Node("p", "Const"), Node("S", "Switch", (("M", 0), ("p", 0))), Node("g", "MatMul"),
             Node("A", "AddN", (("S", 1), ("g", 0))), Node("NI", "NextIteration", (("A", 0),)),
             Node("h", "MatMul", (("A", 0),)), Node("X", "Exit", (("S", 0),))]
    order = [("z", 0, 1), ("g", 2, 3), ("A", 4, 5), ("h", 6, 7), ("g", 12, 13), ("A", 14, 15), ("h", 16, 17),
             ("X", 20, 21)]
    sizes = {"z": [100], "g": [100], "A": [100], "h": [50]}
    schedule = Schedule.of(nodes, order)
    assert (schedule.frames, schedule.peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0")) == (
        {"X": "E"}, {"/GPU:0": 100 + 100 + 50})


def test_a_tensor_lists_elements_are_copies_held_until_popped_and_reading_one_allocates_nothing():
    """x (300 B) unstacked into a list of 3 (TensorListFromTensor copies each element into its own
    buffer); a loop reads element i (TensorListGetItem: the list's own buffer) and pushes it for the
    gradient; Z (500 B) runs before the first read. The 300 B of elements are live from the unstacking
    on, pushed or not (pushed: until popped; not: as the list's own buffer until its last read), and
    no read adds to them: 300 + 500 while Z runs."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    forward = [Node("x", "Transpose"), Node("L", "TensorListFromTensor", (("x", 0),)), Node("Z", "MatMul"),
               Node("GI", "TensorListGetItem", (("L", 0),)), Node("y", "Tanh", (("GI", 0),))]
    loop = [("x", 0, 1), ("L", 2, 3), ("Z", 4, 5), *((n, 10 * k + 6, 10 * k + 7) for k in range(3) for n in ("GI", "y"))]
    pushed = [*forward, Node("acc", "EmptyTensorList"), Node("P", "TensorListPushBack", (("acc", 0), ("GI", 0))),
              Node("Q", "TensorListPopBack", (("P", 0),)), Node("R", "Mul", (("Q", 1),))]
    backward = [*((("P", 10 * k + 8, 10 * k + 9)) for k in range(3)), ("Q", 40, 41), ("Q", 42, 43), ("Q", 44, 45),
                ("R", 50, 55), ("R", 60, 65), ("R", 70, 75)]
    sizes = {"x": [300], "Z": [500], "GI": [100], "y": [10], "R": [50]}
    peaks = [Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0")
             for nodes, order in ((pushed, loop + backward), (forward, loop))]
    assert peaks == [{"/GPU:0": 300 + 500}, {"/GPU:0": 300 + 500}]


def test_a_loops_iterations_that_run_ahead_hold_their_tensors_together():
    """Two iterations of a body: g (100 B) made in both before the AddN summing each (its reader) runs:
    iteration 1's g is made while iteration 0's still waits for its AddN, so 100 + 100 at once (each
    iteration replayed alone would hold 100)."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("g", "MatMul"), Node("acc", "Const"), Node("A", "AddN", (("acc", 0), ("g", 0)))]
    order = [("g", 0, 1), ("g", 2, 3), ("A", 10, 11), ("A", 12, 13)]
    sizes = {"g": [100], "A": [100]}
    assert Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0") == {"/GPU:0": 2 * 100}


def _loop(body: list, pushes: list) -> list:
    """A loop's frame around `body`: its variable h enters as h0 (Fill) through Enter, Merge (with
    NextIteration of m) and Switch, and leaves through its Exit X; each push takes a list through an Enter of its own (both lists
    are made by one EmptyTensorList node: TensorFlow merges identical ones) and its Switch."""
    from pinpoint.placement.memory.nodes import Node

    frame = [Node("h0", "Fill"), Node("E", "Enter", (("h0", 0),)), Node("M", "Merge", (("E", 0), ("NI", 0))),
             Node("p", "Const"), Node("S", "Switch", (("M", 0), ("p", 0))), Node("NI", "NextIteration", (("m", 0),)),
             Node("X", "Exit", (("S", 0),)), Node("acc", "EmptyTensorList")]
    for k, (name, item) in enumerate(pushes):
        frame += [Node(f"LE{k}", "Enter", (("acc", 0),)), Node(f"LM{k}", "Merge", ((f"LE{k}", 0), (f"LN{k}", 0))),
                  Node(f"LS{k}", "Switch", ((f"LM{k}", 0), ("p", 0))), Node(f"LN{k}", "NextIteration", ((name, 0),)),
                  Node(name, "TensorListPushBack", ((f"LS{k}", 1), item)), Node(f"LX{k}", "Exit", ((f"LS{k}", 0),))]
    return frame + body


def test_a_loop_variables_push_holds_nothing_new_when_its_next_value_is_pushed_too():
    """Each of 3 iterations makes m (MatMul of h, 100 B) and pushes it (P2); it also pushes h itself
    (P1), which from the second iteration on is the previous m: the same buffer. The lists hold
    m's three copies, not six more pushes' worth: 3 x 100 B + h0 (100 B, held until the loop exits)."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = _loop([Node("m", "MatMul", (("S", 1),))], [("P1", ("S", 1)), ("P2", ("m", 0))])
    order = [("h0", 0, 1), *((n, 10 * k + 2 + 2 * j, 10 * k + 3 + 2 * j) for k in range(3)
                             for j, n in enumerate(("P1", "m", "P2"))), ("X", 40, 41)]
    schedule = Schedule.of(nodes, order)
    assert (dict(schedule.pushed_twice), schedule.peaks(lambda n: {"h0": [100], "m": [100]}.get(n, []),
                                                  lambda n: "/GPU:0")) == ({"P1": "P2"}, {"/GPU:0": 100 + 3 * 100})


def test_a_list_nothing_pops_is_dropped_when_its_loop_exits():
    """3 iterations push x (100 B each); the gradient never pops that list (under parameter_server the
    LSTM pushes the input kernel it receives). It is dropped at its Exit (t=40), so Z (500 B) runs
    after it with h0 alone: 500 + 100 B, not 500 + 100 + 300."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = _loop([Node("m", "Identity", (("S", 1),)), Node("x", "MatMul"), Node("Z", "MatMul")],
                  [("P", ("x", 0))])
    order = [("h0", 0, 1), *((n, 10 * k + 2 + 2 * j, 10 * k + 3 + 2 * j) for k in range(3)
                             for j, n in enumerate(("x", "P"))), ("LX0", 40, 41), ("Z", 50, 60), ("X", 70, 71)]
    sizes = {"h0": [100], "x": [100], "Z": [500]}
    assert Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0") == {"/GPU:0": 600}


def test_a_list_nothing_pops_is_held_until_its_last_push_when_that_runs_after_the_loops_end():
    """The loop's last LoopCond (p, t=30) ran before its third push (t=51: iterations run in parallel,
    and a push whose list the gradient never reads can lag). The list's Exit waits for that push, so
    the list (two pushes, 200 B) and the third x (100 B, until its push) are still held while Z
    (500 B) runs at 40-50, beside h0 (100 B): 900 B (dropped at the LoopCond, 600)."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = _loop([Node("m", "Identity", (("S", 1),)), Node("x", "MatMul"), Node("Z", "MatMul")],
                  [("P", ("x", 0))])
    order = [("h0", 0, 1), ("x", 2, 3), ("P", 4, 5), ("x", 12, 13), ("P", 14, 15), ("x", 22, 23), ("p", 30, 31),
             ("Z", 40, 50), ("P", 51, 52), ("X", 70, 71)]
    sizes = {"h0": [100], "x": [100], "Z": [500]}
    assert Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0") == {"/GPU:0": 900}


def test_a_buffer_two_lists_hold_is_freed_by_the_later_of_its_pops():
    """As in the loop-variable test, h's list (P1) and m's (P2) hold the same three m buffers. The
    gradient pops all of m's list at once (Q2, t=50-52: a zeros_like of each, which runs ahead) and
    h's one iteration at a time (Q1, t=60, 70, 80). Z (500 B) runs at 55-58: m's first popped buffer
    is gone, the other two are still held by h's list (h0 left at the loop's Exit): 500 + 200 B."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = _loop([Node("m", "MatMul", (("S", 1),)), Node("Z", "MatMul"),
                   Node("Q1", "TensorListPopBack", (("LX0", 0),)), Node("Q2", "TensorListPopBack", (("LX1", 0),))],
                  [("P1", ("S", 1)), ("P2", ("m", 0))])
    order = [("h0", 0, 1), *((n, 10 * k + 2 + 2 * j, 10 * k + 3 + 2 * j) for k in range(3)
                             for j, n in enumerate(("P1", "m", "P2"))), ("X", 40, 41),
             ("Q2", 50, 50), ("Q2", 51, 51), ("Q2", 52, 52), ("Z", 55, 58), ("Q1", 60, 60), ("Q1", 70, 70),
             ("Q1", 80, 80)]
    sizes = {"h0": [100], "m": [100], "Z": [500]}
    assert Schedule.of(nodes, order).peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0") == {"/GPU:0": 500 + 200}


def test_a_kernel_starts_in_the_replay_when_it_got_its_first_output_buffer_inside_its_run():
    """A kernel traced from 100 to 200 whose output the allocator gave at 160 (an earlier one, at 50,
    was another run's) starts at 160; one whose only allocation came at 250, after its run, or that
    allocated nothing, keeps its traced start."""
    from pinpoint.placement.memory.from_trace import kernel_start

    assert [kernel_start(made, 100, 200) for made in ([50, 160, 170], [250], None)] == [160, 100, 100]


def _late_reader():
    """b reads a (300 B) from 2 to 10; c (200 B) is made at 12; d reads b and c from 14 to 15."""
    from pinpoint.placement.memory.nodes import Node
    from pinpoint.placement.memory.replay import Replay

    nodes = (Node("a", "MatMul"), Node("b", "MatMul", (("a", 0),)), Node("c", "MatMul"),
             Node("d", "ConcatV2", (("b", 0), ("c", 0))))
    order = (("a", 0, 1), ("b", 2, 10), ("c", 12, 13), ("d", 14, 15))
    return Replay(nodes, order, {"a": (300,), "b": (100,), "c": (200,), "d": (50,)}, dict.fromkeys("abcd", "/GPU:0"))


def test_a_kernels_inputs_are_let_go_of_when_the_allocator_freed_them_after_its_end():
    """The allocator freed a at 15, 5 after b ended (a loaded machine's executor: a CNN's gradient buffer
    179 us after its reader in a bench run), so a, b, c and d were live together: 650 B. Let go of at
    b's end, the replay's peak would be a and b's 400 B. d's inputs were freed at 16."""
    from dataclasses import replace

    from pinpoint.placement.memory.from_trace import input_lags

    replay = _late_reader()
    lags = input_lags(replay, {"a": [15], "b": [16], "c": [16]})
    assert (lags, replay.peaks(), replace(replay, inputs_after=lags).peaks()) == (
        {"b": 5, "d": 1}, {"/GPU:0": 400}, {"/GPU:0": 650})


def test_a_free_long_after_a_kernels_end_or_before_it_is_not_its_inputs_being_let_go_of():
    """a freed 2 ms after b's end was let go of by something else; a free before b's end is no lag."""
    from pinpoint.placement.memory.from_trace import input_lags

    assert [input_lags(_late_reader(), {"a": [t]}) for t in (10 + 2_000_000_000, 9)] == [{}, {}]


def test_a_kernel_with_scratch_makes_its_outputs_when_the_allocator_gave_them():
    """a (2-100) holds 50 B of scratch from its start and made its 40 B output at 82 (a transformer's
    Einsum made the temp it hands on 873 us into its 1000 us kernel: +8.7% on a split made at the start).
    b (5-60) reads x (300 B) and makes 20 B. Made at a's start, a's output would be live beside x and
    b's: 410 B. Made at 82, after x was freed: x, the scratch and b's output, 370 B."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("x", "MatMul"), Node("a", "Einsum"), Node("b", "MatMul", (("x", 0),)),
             Node("c", "AddV2", (("a", 0), ("b", 0)))]
    sizes = {"x": [300], "a": [40], "b": [20], "c": [20]}
    schedule = Schedule.of(nodes, [("x", 0, 1), ("a", 2, 100), ("b", 5, 60), ("c", 110, 120)])
    peaks = [schedule.peaks(lambda n: sizes.get(n, []), lambda n: "/GPU:0", measured=Measured(temps={"a": 50}, outputs_after=after))
             for after in ({}, {"a": 80})]
    assert peaks == [{"/GPU:0": 410}, {"/GPU:0": 370}]


def test_a_constant_or_an_update_the_allocator_saw_made_is_made_in_a_later_call():
    """A parameter_server worker's first run of its own copy of the function makes its constants (c,
    64 B) though it is not the function's first call; an update another worker's read held (u on v,
    with a 100 B value) writes a copy of the variable. Without that evidence neither is made."""
    from pinpoint.placement.memory.nodes import Measured, Node
    from pinpoint.placement.memory.schedule import Schedule

    nodes = [Node("v", "VarHandleOp"), Node("c", "Const"), Node("d", "Mul", (("c", 0),)),
             Node("g", "MatMul"), Node("u", "AssignAddVariableOp", (("v", 0), ("g", 0)))]
    sizes = {"c": [64], "d": [64], "g": [100]}
    schedule = Schedule.of(nodes, [("c", 0, 1), ("d", 2, 3), ("g", 4, 5), ("u", 6, 7)])
    peaks = [schedule.peaks(lambda n: sizes.get(n, []), lambda n: "/job:ps/task:0/CPU:0", measured=m)[
        "/job:ps/task:0/CPU:0"] for m in (Measured(), Measured(constants=frozenset({"c"}), copied=frozenset({"u"})))]
    # Without: d's 64 B (c made before the call), then g's 100 B with d let go of. With: c stays,
    # and u's copy of v (100 B) joins g's.
    assert peaks == [100, 64 + 100 + 100]


def test_of_several_measured_calls_the_one_whose_busiest_device_needs_most_is_kept_with_each_devices_spread():
    from pinpoint.placement.memory.spread import highest

    def call(gpu0: int, gpu1: int, host: int) -> dict:
        peaks = {"/GPU:0": gpu0, "/GPU:1": gpu1, "/CPU:0": host}
        return {"devices": {d: {"peak_requested": b} for d, b in peaks.items()} | {UNATTRIBUTED: {"peak_requested": 9}},
                "predicted": {"devices": {d: {"gpu_machine": b + 10} for d, b in peaks.items()}}}

    # Call 3's busiest GPU needs 810 (call 2: 710, call 4: 710 with more on the host, which is not a GPU's).
    second, third, fourth = call(700, 500, 50), call(600, 800, 50), call(700, 400, 5000)
    got = highest([(2, second), (3, third), (4, fourth)])
    assert {k: v for k, v in got.items() if k != "calls"} == third
    assert got["calls"] == {"measured": [2, 3, 4], "kept": 3,
                            "devices": {"/GPU:0": {"least": 600, "most": 700}, "/GPU:1": {"least": 400, "most": 800},
                                        "/CPU:0": {"least": 50, "most": 5000}}}


def test_of_measured_calls_that_need_the_same_the_earliest_is_kept():
    from pinpoint.placement.memory.spread import highest

    same = {"devices": {"/GPU:0": {"peak_requested": 5}}, "predicted": {"devices": {"/GPU:0": {"gpu_machine": 8}}}}
    assert highest([(2, same), (3, dict(same))])["calls"]["kept"] == 2


def test_the_summary_and_the_report_page_name_the_calls_measured_and_each_devices_least_and_most():
    from pinpoint.placement.model.memory import Memory
    from pinpoint.placement.report.html import _calls
    from pinpoint.placement.report.summary import _spread

    calls = {"measured": [2, 3, 4], "kept": 3, "devices": {"/GPU:0": {"least": 2_000_000, "most": 3_000_000}}}
    memory = Memory.from_json({"devices": {}, "calls": calls})
    assert _spread(memory) == "; over calls 2, 3, 4: /GPU:0 1.9 MiB–2.9 MiB (the figures are call 3's, whose " \
                              "busiest device needs the most)"
    assert _calls(memory) == ("Calls 2, 3, 4 were measured; the figures above are call 3's, whose busiest device "
                              "needs the most (the fits verdict and the largest batch come from it). Each device's "
                              "peak over those calls: /GPU:0 1.9 MiB to 2.9 MiB.")
    # The same peak in every call: one figure.
    same = Memory.from_json({"devices": {}, "calls": {**calls, "devices": {"/GPU:1": {"least": 1024, "most": 1024}}}})
    assert _spread(same) == "; over calls 2, 3, 4: /GPU:1 1.0 KiB (the figures are call 3's, whose busiest device " \
                            "needs the most)"
    # One call measured (a function called twice): nothing to add.
    one = Memory.from_json({"devices": {}, "calls": {"measured": [2], "kept": 2, "devices": {}}})
    assert (_spread(one), _calls(one)) == ("", None)


def test_the_summary_and_the_report_page_show_the_peaks_at_other_batches_and_the_largest_scratch_kept():
    from pinpoint.placement.model.memory import Memory
    from pinpoint.placement.report.html import _at_batch
    from pinpoint.placement.report.summary import batch_line

    conv = "gradient_tape/conv2d/Conv2DBackpropFilter"
    batch = {"measured": 16, "scaled_outputs": 40, "scaled_scratch": 2, "assumption": "...",
             "kept_scratch": [{"op": conv, "bytes": 18 * 2**20, "device": "/GPU:0"}],
             "devices": {"/GPU:0": {"32": 2 * 2**20, "64": 4 * 2**20}}}
    raw = {"devices": {}, "predicted": {"devices": {}, "batch": batch}}
    assert batch_line(raw) == ("memory at  : measured at batch 16, predicted batch 32: /GPU:0 2.0 MiB; batch 64: /GPU:0 "
                               "4.0 MiB (scratch kept at its size, the largest: Conv2DBackpropFilter 18.0 MiB)")
    got = _at_batch(Memory.from_json(raw))
    assert got["text"] == ("Predicted at other batches, from the measured call at batch 16 (a device's step): 40 "
                           "outputs and 2 kernels' scratch grow in proportion (their shape starts with the batch or "
                           "folds it in). Weight gradients, updates, constants and the other scratch keep their size; "
                           f"the largest scratch kept: {conv} on /GPU:0, 18.0 MiB.")
    assert got["rows"] == [{"device": "/GPU:0", "32": "2.0 MiB", "64": "4.0 MiB"}]
    # No batch known: no section.
    assert _at_batch(Memory.from_json({"devices": {}, "predicted": {"devices": {}, "batch": {"why_not": "x"}}})) is None
