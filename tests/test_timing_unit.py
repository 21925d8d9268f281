"""placement.timing without training: the trace reader on a constructed XSpace (the profiler's own
protobuf), and the section's headline metrics, summary lines, report and multi-worker merge."""

from __future__ import annotations

import re

import pytest

from pinpoint.device_names import DeviceMap
from pinpoint.placement.analysis.merge import merge_placements
from pinpoint.placement.analysis.timing import device_timing, timing_from_trace, union_ps
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.profile.xspace import OpEvent
from pinpoint.placement.report.metrics import headline_metrics
from pinpoint.placement.report.summary import format_summary, timing_lines

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

US = 1_000_000  # picoseconds per microsecond
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"


def _xspace():
    """Three threads of one host plane, as tf.profiler writes them (times in microseconds):
    - line 1: MatMul on GPU:0 [0, 100]; a _Send on GPU:0 [200, 250] whose callback runs the
      receiving side's executor [210, 240] with a Relu of GPU:1 [215, 235] nested in it;
    - line 2: AddV2 on GPU:0 [50, 150] (overlaps the MatMul); an eager op no graph knows [0, 10];
    - line 3: a _Recv's asynchronous start on GPU:1 [300, 305]; a collective on GPU:1 [400, 500].
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xs = xplane_pb2.XSpace()
    plane = xs.planes.add(name="/host:CPU")
    plane.stat_metadata[1].name = "kernel_type"
    plane.stat_metadata[2].name = "name"
    metas = {}

    def meta(name, display=""):
        if name not in metas:
            mid = len(metas) + 1
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = name
            plane.event_metadata[mid].display_name = display
            metas[name] = mid
        return metas[name]

    def event(line, label, display, start_us, dur_us, **stats):
        e = line.events.add(metadata_id=meta(label, display), offset_ps=start_us * US, duration_ps=dur_us * US)
        for key, value in stats.items():
            e.stats.add(metadata_id=1 if key == "kernel_type" else 2, str_value=value)

    one = plane.lines.add(id=1, name="tf_Compute/1", timestamp_ns=0)
    event(one, "fwd/MatMul:MatMul", "MatMul", 0, 100)
    event(one, "fwd/MatMul/_1:_Send", "_Send", 200, 50)
    event(one, "ExecutorState::Process", "", 210, 30)
    event(one, "head/Relu:Relu", "Relu", 215, 20)
    two = plane.lines.add(id=2, name="tf_Compute/2", timestamp_ns=0)
    event(two, "eager_add:AddV2", "AddV2", 0, 10)
    event(two, "fwd/add:AddV2", "AddV2", 50, 100)
    three = plane.lines.add(id=3, name="tf_Compute/3", timestamp_ns=0)
    event(three, "ExecutorState::ProcessAsync::Start", "", 300, 5, **{"kernel_type": "_Recv", "name": "head/x/_2"})
    event(three, "head/CollectiveReduceV2:CollectiveReduceV2", "CollectiveReduceV2", 400, 100)
    return xs


def _graphs():
    from tensorflow.core.framework import graph_pb2

    g0, g1 = graph_pb2.GraphDef(), graph_pb2.GraphDef()
    for name, op in (("fwd/MatMul", "MatMul"), ("fwd/add", "AddV2"), ("fwd/MatMul/_1", "_Send")):
        g0.node.add(name=name, op=op, device=GPU0)
    for name, op in (("head/Relu", "Relu"), ("head/x/_2", "_Recv"), ("head/CollectiveReduceV2", "CollectiveReduceV2")):
        g1.node.add(name=name, op=op, device=GPU1)
    return [g0, g1]


def test_trace_is_read_per_device_busy_as_a_union_without_nested_work(tmp_path):
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(_xspace().SerializeToString())
    t = timing_from_trace(path, _graphs(), DeviceMap.of(None), steps=[3, 4])
    assert t["steps"] == [3, 4] and t["wall_ms"] == 0.5 and t["step_ms"] == 0.25
    g0, g1 = t["devices"]["/GPU:0"], t["devices"]["/GPU:1"]
    # GPU:0: MatMul and AddV2 overlap -> union [0, 150] (not 200); the _Send's own time is 20 us
    # (the 30 us of the receiver's executor nested in it are not GPU:0's).
    assert g0["busy_ms"] == 0.17 and g0["transfer_ms"] == 0.02 and g0["compute_ms"] == 0.15
    assert g0["idle_share"] == pytest.approx(1 - 0.17 / 0.5) and g0["ops"] == 3
    assert g0["top_ops"][0]["ms"] == 0.1 and {o["op"] for o in g0["top_ops"][:2]} == {"fwd/MatMul", "fwd/add"}
    # GPU:1: the Relu nested in the _Send is its own; the receive's start and the collective are transfers.
    assert g1["busy_ms"] == 0.125 and g1["transfer_ms"] == 0.105 and g1["compute_ms"] == 0.02
    assert g1["top_ops"][0] == {"op": "head/CollectiveReduceV2", "type": "CollectiveReduceV2", "ms": 0.1, "count": 1}
    assert t["unattributed"] == {"events": 1, "ms": 0.01}
    assert t["notes"] == []


def test_union_and_a_name_on_two_devices_is_not_attributed():
    assert union_ps([(0, 10), (5, 20), (30, 40), (40, 45)]) == 35
    assert union_ps([]) == 0
    ev = [OpEvent("a", "MatMul", 0, 10), OpEvent("b", "MatMul", 0, 30)]
    t = device_timing(ev, {"a": "/GPU:0"}, display=str.upper)
    assert list(t["devices"]) == ["/GPU:0"] and t["devices"]["/GPU:0"]["top_ops"][0]["op"] == "A"
    assert t["unattributed"]["events"] == 1 and t["step_ms"] is None


def _placement_with_timing(task="chief:0", prefix=""):
    dev = lambda d: prefix + d  # noqa: E731
    return {
        "task": task, "devices": [dev("/GPU:0"), dev("/GPU:1")], "ops_by_device": {dev("/GPU:0"): 10},
        "timing": {
            "steps": [3], "wall_ms": 2.5, "step_ms": 2.5, "trace": "profile" if not prefix else f"profile/{task}",
            "devices": {
                dev("/GPU:0"): {"busy_ms": 1.5, "compute_ms": 1.0, "transfer_ms": 0.5, "transfer_share": 0.3333,
                                "idle_share": 0.4, "ops": 12,
                                "top_ops": [{"op": "mlp/dense_1/MatMul", "type": "MatMul", "ms": 0.7, "count": 1}]},
                dev("/GPU:1"): {"busy_ms": 0.5, "compute_ms": 0.5, "transfer_ms": 0.0, "transfer_share": 0.0,
                                "idle_share": 0.8, "ops": 4, "top_ops": []},
            },
            "unattributed": {"events": 0, "ms": 0.0}, "notes": [],
        },
    }


def test_timing_headline_metrics_summary_and_report():
    from pinpoint.placement.report.html import render_html

    p = _placement_with_timing()
    hm = headline_metrics(p)
    assert hm["placement.timing.GPU_0.busy_ms"] == 1.5 and hm["placement.timing.GPU_1.idle_share"] == 0.8
    assert hm["placement.timing.wall_ms"] == 2.5 and all(re.fullmatch(r"[A-Za-z0-9_.\-/ ]+", k) for k in hm)
    lines = timing_lines(p["timing"])
    assert lines[0].startswith("time       : step 3 timed, 2.500 ms wall; trace in profile/")
    assert "busy 1.500 ms (33% transfers), idle 40%; top mlp/dense_1/MatMul (MatMul) 0.700 ms" in lines[1]
    assert "time       :" in format_summary(p, {})
    html = render_html(p, None, {}, "t")
    assert "Time per device" in html and "tensorboard --logdir profile" in html and "mlp/dense_1/MatMul" in html
    assert timing_lines({"devices": {}, "notes": ["not measured: why"]}) == ["time       : not measured: why"]


def test_multi_worker_merge_keeps_each_tasks_devices_and_walls():
    a = _placement_with_timing("chief:0", "/job:chief/task:0")
    b = _placement_with_timing("worker:0", "/job:worker/task:0")
    b["timing"]["wall_ms"] = 4.0
    m = merge_placements([Placement.from_json(a), Placement.from_json(b)]).to_json()["timing"]
    assert set(m["devices"]) == {"/job:chief/task:0/GPU:0", "/job:chief/task:0/GPU:1",
                                 "/job:worker/task:0/GPU:0", "/job:worker/task:0/GPU:1"}
    assert m["wall_ms"] == 4.0 and m["tasks"]["chief:0"]["wall_ms"] == 2.5 and m["trace"] == "profile"


def test_an_ops_time_per_step_is_its_fastest_execution_so_waiting_for_threads_does_not_count():
    from pinpoint.placement.analysis.timing import op_times

    us = 1_000_000  # picoseconds per µs
    # conv ran once in each of 3 steps, two of them stretched 10x (its shards waited for the
    # thread pool another device's op held): the median would be the wait; add ran twice a step.
    events = [OpEvent("conv", "Conv2D", i * 1000 * us, d * us) for i, d in enumerate((200, 20, 200))]
    events += [OpEvent("add", "AddV2", i * 1000 * us + 500 * us, 3 * us) for i in range(6)]
    assert op_times(events, steps=3) == {"conv": 20.0, "add": 6.0}
