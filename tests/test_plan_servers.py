"""Bytes per parameter server (pinpoint.plan.servers) on hand-built inputs: where each variable
sits under a placement, what a step moves, and the measured figure read off a transfers matrix."""

from __future__ import annotations

import pytest

from pinpoint.placement.model.placement import Placement
from pinpoint.plan.build import _ps_variables
from pinpoint.plan.graph import Group, PlanGraph
from pinpoint.plan.servers import measured_placement, measured_ps_bytes, predicted_ps_bytes, variable_servers

pytestmark = pytest.mark.unit

PS = [f"/job:ps/task:{i}/CPU:0" for i in range(3)]
WORKER = "/job:worker/task:0/CPU:0"


def _var(name, cls, nbytes, server, updates=1):
    return {"name": name, "class": cls, "bytes": nbytes, "devices": [server], "update_ops": updates}


def _graph(servers_measured):
    """Layers a, b (kernel + bias each), the step counter, the learning rate, a's two Adam slots."""
    a_k, a_b, b_k, b_b, it, lr = servers_measured
    rows = [_var("a/kernel", "trainable", 400, a_k), _var("a/bias", "trainable", 40, a_b),
            _var("b/kernel", "trainable", 200, b_k), _var("b/bias", "trainable", 20, b_b),
            _var("adam/iteration", "optimizer", 8, it), _var("adam/learning_rate", "optimizer", 4, lr, 0),
            _var("adam/a_kernel_momentum", "optimizer", 400, a_k), _var("adam/a_kernel_velocity", "optimizer", 400, a_k)]
    variables = _ps_variables(Placement.from_json({"strategy": "parameter_server", "variables": rows}), ["a", "b"])
    groups = tuple(Group(k, i, 0.0, 3, 0, WORKER) for i, k in enumerate(("a", "b", "other")))
    return PlanGraph(groups, (), (*PS, WORKER), WORKER, "parameter_server", False, ps_variables=variables)


ROUND_ROBIN = (PS[0], PS[1], PS[2], PS[0], PS[1], PS[2])  # turns 0..5 over three servers


def test_slots_take_no_turn_and_follow_their_variable():
    g = _graph(ROUND_ROBIN)
    slots = {v.name: (v.follows, v.index, v.per_step) for v in g.ps_variables if v.follows}
    assert slots == {"adam/a_kernel_momentum": ("a/kernel", -1, False), "adam/a_kernel_velocity": ("a/kernel", -1, False)}
    where = variable_servers(g, {"a": PS[2], "b": WORKER, "other": WORKER})
    assert where == {"a/kernel": PS[2], "a/bias": PS[2], "b/kernel": PS[2], "b/bias": PS[0], "adam/iteration": PS[1],
                     "adam/learning_rate": PS[2], "adam/a_kernel_momentum": PS[2], "adam/a_kernel_velocity": PS[2]}


def test_a_step_moves_twice_the_updated_variables_and_not_the_slots_or_learning_rate():
    g = _graph(ROUND_ROBIN)
    unpinned = {"a": WORKER, "b": WORKER, "other": WORKER}
    assert predicted_ps_bytes(g, unpinned) == {PS[0]: 2 * (400 + 20), PS[1]: 2 * (40 + 8), PS[2]: 2 * 200}
    assert predicted_ps_bytes(g, {"a": PS[1], "b": PS[0], "other": WORKER}) == \
        {PS[0]: 2 * (200 + 20), PS[1]: 2 * (400 + 40 + 8), PS[2]: 0}


def test_the_measured_placement_finds_a_layer_pinned_off_its_round_robin_slots():
    g = _graph((PS[1], PS[1], PS[2], PS[0], PS[1], PS[2]))  # a pinned to ps 1, b on its slots
    assert measured_placement(g) == {"a": PS[1], "b": WORKER, "other": WORKER}


def test_measured_bytes_per_server_are_its_traffic_with_workers_and_chief_only():
    cell = lambda n: {"count": 1, "bytes": n}  # noqa: E731
    placement = {"transfers": {"matrix": {
        PS[0]: {WORKER: cell(100), PS[1]: cell(4), "/job:chief/task:0/CPU:0": cell(0)},
        WORKER: {PS[0]: cell(100), PS[1]: cell(30), "/job:chief/task:0/CPU:0": cell(8)},
        "/job:chief/task:0/CPU:0": {WORKER: cell(5000), PS[2]: cell(6)},
    }}}
    assert measured_ps_bytes(Placement.from_json(placement)) == {PS[0]: 200, PS[1]: 30, PS[2]: 6}
