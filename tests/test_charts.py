"""Each chart is checked for what it draws: the data of its matplotlib artists (bars, image cells,
lines, labels) against figures written in the test, from a small hand-written placement. The
figure is taken as the chart saves it (charts._save), so the PNG is still written as in a run."""

from __future__ import annotations

import pytest

from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report import charts

pytestmark = pytest.mark.unit
MiB = 2**20


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """draw(chart, data) -> the chart's figure, after the chart wrote its PNG."""
    figures = []
    save = charts._save

    def keep(plt, fig, path):
        figures.append(fig)
        return save(plt, fig, path)

    monkeypatch.setattr(charts, "_save", keep)

    def draw(chart, data):
        # A placement chart takes the model; the test writes placement.json's content (plan_timeline: a plan check).
        arg = data if chart is charts.plan_timeline else Placement.from_json(data)
        path = chart(arg, tmp_path / f"{chart.__name__}.png")
        assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return figures[-1]

    return draw


def _bars(container) -> list[tuple[float, float, float, float]]:
    """(x, y, width, height) of each bar of a bar container, rounded."""
    return [tuple(round(v, 6) for v in (r.get_x(), r.get_y(), r.get_width(), r.get_height()))
            for r in container.patches]


def _ticks(labels) -> list[str]:
    return [t.get_text() for t in labels]


def test_ops_heatmap_draws_ops_per_device_and_type_with_the_rest_as_other(drawn, monkeypatch):
    monkeypatch.setattr(charts, "TOP_OP_TYPES", 2)  # MatMul (4) and Const (2) shown; Relu (1) as other
    types = {"/CPU:0": {"Const": 2}, "/GPU:0": {"MatMul": 3, "Relu": 1}, "/GPU:1": {"MatMul": 1}}
    ax = drawn(charts.ops_heatmap, {"op_types_by_device": types}).axes[0]
    assert _ticks(ax.get_xticklabels()) == ["MatMul", "Const", "(other)"]
    assert _ticks(ax.get_yticklabels()) == ["/CPU:0", "/GPU:0", "/GPU:1"]
    assert ax.images[0].get_array().filled(0).tolist() == [[0, 2, 0], [3, 0, 1], [1, 0, 0]]
    assert sorted(t.get_text() for t in ax.texts) == ["1", "1", "2", "3"]  # a cell's count, zeros left blank


def test_transfer_matrix_draws_bytes_per_source_and_destination(drawn):
    p = {"devices": ["/CPU:0", "/GPU:0", "/GPU:1"],
         "physical_devices": {"/CPU:0": "/CPU:0", "/GPU:0": "/CPU:1"},  # an emulated GPU: its logical CPU
         "transfers": {"matrix": {"/CPU:0": {"/GPU:0": {"count": 1, "bytes": 320}},
                                  "/GPU:0": {"/GPU:1": {"count": 2, "bytes": 2048}}},
                       "per_step": {"count": 3, "bytes": 320 + 2048}}}
    ax = drawn(charts.transfer_matrix, p).axes[0]
    assert ax.images[0].get_array().filled(0).tolist() == [[0, 320, 0], [0, 0, 2048], [0, 0, 0]]
    cells = [t.get_text() for t in ax.texts]
    assert [c.split("\n")[1] for c in cells if "\n" in c] == ["1 transfer", "2 transfers"]
    assert cells.count("-") == 3  # the diagonal
    assert _ticks(ax.get_yticklabels()) == ["/CPU:0", "/GPU:0\n(= CPU:1)", "/GPU:1"]
    assert ax.get_title().startswith("Cross-device transfers per step: 3 (")


def test_ops_per_device_stacks_the_backward_pass_on_the_rest(drawn):
    p = {"ops_by_device": {"/CPU:0": 5, "/GPU:0": 10, "/GPU:1": 7},
         "gradients": {"ops_by_device": {"/GPU:0": 4, "/GPU:1": 3}}}
    ax = drawn(charts.ops_per_device, p).axes[0]
    rest, grads = ax.containers
    assert [(y, h) for _, y, _, h in _bars(rest)] == [(0, 5), (0, 10 - 4), (0, 7 - 3)]
    assert [(y, h) for _, y, _, h in _bars(grads)] == [(5, 0), (6, 4), (4, 3)]  # on top of the rest
    assert [t.get_text() for t in ax.texts] == ["5", "10", "7"]


def test_conformance_draws_each_scored_rule(drawn):
    rules = [{"rule": "variables", "planned": "/GPU:0", "score": 1.0, "relevant": 4, "violations_total": 0},
             {"rule": "layers.head", "planned": "/GPU:1", "score": 0.5, "relevant": 6, "violations_total": 3,
              "task": "worker:1"},
             {"rule": "input", "planned": "/CPU:0", "score": None, "relevant": 0, "violations_total": 0}]
    ax = drawn(charts.conformance, {"conformance": {"rules": rules}}).axes[0]
    (bars,) = ax.containers
    assert [w for _, _, w, _ in _bars(bars)] == [1.0, 0.5]
    assert [r.get_facecolor()[:3] for r in bars.patches] == [pytest.approx((0x54 / 255, 0xa2 / 255, 0x4b / 255)),
                                                             pytest.approx((0xe4 / 255, 0x57 / 255, 0x56 / 255))]
    assert _ticks(ax.get_yticklabels()) == ["variables -> /GPU:0", "[worker:1] layers.head -> /GPU:1"]
    assert [t.get_text() for t in ax.texts] == ["1.00  (4/4)", "0.50  (3/6)"]


def test_variable_bytes_counts_every_component_where_it_lives_and_not_freed_ones(drawn):
    variables = [{"name": "a", "bytes": 100, "components": [{"device": "/GPU:0"}, {"device": "/GPU:1"}]},
                 {"name": "b", "bytes": 40, "components": [{"device": "/GPU:0"}]},
                 {"name": "c", "bytes": 1000, "freed": True, "components": [{"device": "/GPU:1"}]},
                 {"name": "d", "bytes": 8, "components": [{"device": "/CPU:0", "task": "ps:0"}]}]
    ax = drawn(charts.variable_bytes, {"variables": variables}).axes[0]
    (bars,) = ax.containers
    assert [h for *_, h in _bars(bars)] == [100 + 40, 100, 8]
    assert _ticks(ax.get_xticklabels()) == ["/GPU:0", "/GPU:1", "[ps:0] /CPU:0"]


def test_time_per_device_stacks_compute_transfers_and_idle_over_the_window(drawn):
    timing = {"wall_ms": 10.0, "steps": [3, 4],
              "devices": {"/GPU:0": {"compute_ms": 6.0, "transfer_ms": 1.0, "busy_ms": 7.0},
                          "/GPU:1": {"compute_ms": 2.0, "transfer_ms": 3.0, "busy_ms": 5.0}}}
    ax = drawn(charts.time_per_device, {"timing": timing}).axes[0]
    compute, moved, idle = ax.containers
    assert [(x, w) for x, _, w, _ in _bars(compute)] == [(0, 6), (0, 2)]
    assert [(x, w) for x, _, w, _ in _bars(moved)] == [(6, 1), (2, 3)]
    assert [(x, w) for x, _, w, _ in _bars(idle)] == [(7, 10 - 7), (5, 10 - 5)]
    assert ax.get_title() == "Time per device over 2 timed step(s), 10.000 ms wall"


def test_memory_peaks_stacks_each_devices_peak_by_kind(drawn):
    devices = {"/GPU:0": {"peak_requested": 3 * MiB, "peak_allocated": 4 * MiB,
                          "at_peak": [{"kind": "activation", "requested": MiB}, {"kind": "variable", "requested": MiB}]},
               "/GPU:1": {"peak_requested": MiB, "peak_allocated": MiB,
                          "at_peak": [{"kind": "gradient", "requested": MiB // 2}]},
               "host": {"peak_requested": 9 * MiB}}  # not a device: left out
    ax = drawn(charts.memory_peaks, {"memory": {"devices": devices}}).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["activation", "gradient", "variable",
                                                                   "smaller allocations"]
    activation, gradient, variable, smaller = ([(x, w) for x, _, w, _ in _bars(c)] for c in ax.containers)
    assert activation == [(0, 1), (0, 0)]  # MiB
    assert gradient == [(1, 0), (0, 0.5)]
    assert variable == [(1, 1), (0.5, 0)]
    assert smaller == [(2, 3 - 2), (0.5, 1 - 0.5)]  # the peak not held by the largest allocations
    assert _ticks(ax.get_yticklabels()) == ["/GPU:0", "/GPU:1"]


def test_memory_timeline_draws_live_bytes_over_time_and_each_peak(drawn):
    devices = {"/GPU:0": {"peak_requested": 2 * MiB, "peak_time_us": 20,
                          "timeline": [[0, 0], [10, MiB], [20, 2 * MiB], [30, 0]]},
               "/GPU:1": {"peak_requested": MiB, "peak_time_us": 5, "timeline": []}}  # nothing traced: left out
    ax = drawn(charts.memory_timeline, {"memory": {"devices": devices}}).axes[0]
    live, peak = ax.lines
    assert (list(live.get_xdata()), list(live.get_ydata())) == ([0, 10, 20, 30], [0, 1, 2, 0])  # MiB
    assert live.get_drawstyle() == "steps-post" and live.get_label() == "/GPU:0"
    assert (list(peak.get_xdata()), list(peak.get_ydata())) == ([20], [2])


def test_plan_timeline_draws_each_task_from_start_to_end_per_panel(drawn):
    rows = [{"device": "/GPU:0", "group": "dense_1", "pass": "forward", "start_us": 0, "end_us": 100},
            {"device": "/GPU:1", "group": "head", "pass": "backward", "start_us": 100, "end_us": 250}]
    fig = drawn(charts.plan_timeline, {"timeline": {"placement": rows, "plan": rows[:1], "empty": []}})
    first, second = fig.axes
    bars = [(x, y, w) for c in first.containers for x, y, w, _ in _bars(c)]
    assert [(x, w) for x, _, w in bars] == [(0, 100), (100, 150)]
    assert [p.get_hatch() for c in first.containers for p in c.patches] == [None, "//"]
    assert first.get_title().startswith("placement: simulated step 0.250 ms")
    assert second.get_title().startswith("plan: simulated step 0.100 ms")


def test_a_chart_without_its_data_draws_nothing(tmp_path):
    for chart in charts.CHARTS.values():
        assert chart(Placement.from_json({}), tmp_path / "x.png") is None
    assert charts.plan_timeline({}, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_every_chart_has_its_test():
    tested = {name[len("test_"):].split("_draws")[0].split("_stacks")[0].split("_counts")[0]
              for name in globals() if name.startswith("test_")}
    assert {fn.__name__ for fn in (*charts.CHARTS.values(), charts.plan_timeline)} <= tested

