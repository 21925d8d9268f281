"""The emulated host's step model (pinpoint.plan.emulated) on hand-built PlanGraphs: the step on
the machine that ran the source run when its GPUs were emulated, every constant from that run."""

from __future__ import annotations

import pytest

from pinpoint.placement.model.placement import Placement
from pinpoint.plan.build import build
from pinpoint.plan.emit import step_models
from pinpoint.plan.emulated import KIND, EmulatedHost, tensors_crossing
from pinpoint.plan.graph import Edge, Group, PlanGraph
from pinpoint.plan.links import LinkModel
from pinpoint.plan.predict import predict

pytestmark = pytest.mark.unit

STEP_US, US_PER_TRANSFER = 1000.0, 10.0


def chain(**extra) -> PlanGraph:
    """input (host) -> a -> b -> c, a and b on /GPU:0, c on /GPU:1; each activation edge carries
    4 tensors forward and its gradient 4 back (16 bytes each)."""
    groups = (Group("input", 0, 5.0, 2, 0, "/CPU:0", movable=False),
              Group("a", 1, 100.0, 10, 400, "/GPU:0"),
              Group("b", 2, 100.0, 10, 400, "/GPU:0"),
              Group("c", 3, 100.0, 10, 400, "/GPU:1"))
    edges = (Edge("input", "a", 64, 1), Edge("a", "b", 64, 4), Edge("b", "a", 64, 4),
             Edge("b", "c", 64, 4), Edge("c", "b", 64, 4))
    fields = {"groups": groups, "edges": edges, "devices": ("/CPU:0", "/GPU:0", "/GPU:1"), "host": "/CPU:0",
              "strategy": "default", "timed": True, "measured_step_us": STEP_US, "emulated": True,
              "us_per_transfer": US_PER_TRANSFER}
    return PlanGraph(**{**fields, **extra})


RAN = {"input": "/CPU:0", "a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"}
ALTERNATE = {"input": "/CPU:0", "a": "/GPU:0", "b": "/GPU:1", "c": "/GPU:0"}
ONE = {"input": "/CPU:0", "a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:0"}


def test_tensors_crossing_counts_the_tensors_of_edges_between_devices():
    # input -> a (1) and b <-> c (4 + 4) cross where the run put them.
    assert tensors_crossing(chain(), RAN) == 1 + 4 + 4


def test_the_source_placement_is_predicted_at_its_measured_step():
    g = chain()
    assert EmulatedHost.of(g).step_us(g, RAN) == STEP_US


def test_each_extra_tensor_crossing_adds_the_source_runs_time_per_transfer():
    # Alternating crosses every edge: 1 + 16 tensors, 8 more than the run's 9.
    g = chain()
    assert EmulatedHost.of(g).step_us(g, ALTERNATE) == STEP_US + 8 * US_PER_TRANSFER


def test_fewer_tensors_crossing_take_the_time_off():
    g = chain()
    assert EmulatedHost.of(g).step_us(g, ONE) == STEP_US - 8 * US_PER_TRANSFER


def test_a_run_on_real_gpus_gets_no_emulated_model():
    assert EmulatedHost.of(chain(emulated=False)) is None


def test_a_run_without_profiled_transfers_gets_no_emulated_model():
    assert EmulatedHost.of(chain(us_per_transfer=None)) is None


def test_a_parameter_server_run_gets_no_emulated_model():
    assert EmulatedHost.of(chain(strategy="parameter_server")) is None


def test_predict_gives_the_emulated_step_beside_the_link_models():
    p = predict(chain(), ALTERNATE, LinkModel())
    assert p.to_dict()["emulated_step_ms"] == (STEP_US + 8 * US_PER_TRANSFER) / 1e3


def test_the_link_models_step_is_the_same_with_or_without_emulation():
    assert predict(chain(), ALTERNATE, LinkModel()).step_us == predict(chain(emulated=False), ALTERNATE,
                                                                       LinkModel()).step_us


def test_a_real_gpu_prediction_has_no_emulated_step_field():
    assert "emulated_step_ms" not in predict(chain(emulated=False), ALTERNATE, LinkModel()).to_dict()


def test_the_plan_file_names_the_emulated_model_and_its_constants():
    assert step_models(chain()) == {"step_ms": "links", "emulated_step_ms": {
        "kind": KIND, "source_step_ms": STEP_US / 1e3, "us_per_transfer": US_PER_TRANSFER,
        "source_tensors_crossing": 9}}


def test_the_plan_file_of_a_real_gpu_run_names_only_the_link_model():
    assert step_models(chain(emulated=False)) == {"step_ms": "links"}


def _placement(**extra) -> Placement:
    """A two-op run: x on /GPU:0 feeds y on /GPU:1 (one tensor of 32 bytes), GPUs emulated."""
    ops = [{"op": "d0/MatMul", "type": "MatMul", "device": "/GPU:0", "layer": "d0", "inputs": [], "us": 5.0},
           {"op": "d1/MatMul", "type": "MatMul", "device": "/GPU:1", "layer": "d1",
            "inputs": [["d0/MatMul:0", 32]], "us": 7.0}]
    return Placement.from_json({"ops": ops, "devices": ["/CPU:0", "/GPU:0", "/GPU:1"], "strategy": "default",
                                "device_aliases": {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}, **extra})


def test_build_reads_the_profiled_time_per_transfer():
    # 0.03 + 0.05 ms of _Send/_Recv per step over 4 tensors crossing per step: 20 us each.
    timing = {"devices": {"/GPU:0": {"transfer_ms": 0.03}, "/GPU:1": {"transfer_ms": 0.05}}}
    matrix = {"/CPU:0": {"/GPU:0": {"count": 1, "bytes": 8}}, "/GPU:0": {"/GPU:1": {"count": 3, "bytes": 96}}}
    assert build(_placement(timing=timing, transfers={"matrix": matrix})).us_per_transfer == 20.0


def test_build_counts_each_tensor_of_an_edge():
    assert [(e.src, e.dst, e.tensors) for e in build(_placement()).edges] == [("d0", "d1", 1)]


def test_build_marks_a_run_with_device_aliases_emulated():
    assert build(_placement()).emulated is True


def test_build_of_a_run_on_real_devices_is_not_emulated():
    assert build(_placement(device_aliases={})).emulated is False


def test_a_step_is_never_predicted_below_zero():
    # 50 us measured, 8 tensors fewer at 10 us each: 0, not -30.
    g = chain(measured_step_us=50.0)
    assert EmulatedHost.of(g).step_us(g, ONE) == 0.0


def test_the_printed_table_shows_the_emulated_step_beside_the_link_models():
    from pinpoint.plan.command import table

    head, row = table({"alternate": predict(chain(), ALTERNATE, LinkModel())}).splitlines()
    assert (head.split("  ")[-1].strip(), row.split()[-1]) == ("here ms (emulated)", "1.080")
