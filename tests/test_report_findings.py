"""The report's first screen (issue 51): the findings, ranked by cost, and the run diagram, from the
stored real capture (tests/data/placement-sample.json, see test_report.py) and edits of it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pinpoint.placement.model.placement import as_placement
from pinpoint.placement.report.findings import findings
from pinpoint.placement.report.html import render_html
from pinpoint.placement.report.rundiagram import arrows, boxes

pytestmark = pytest.mark.unit

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


def test_the_sample_finds_its_variables_rule_off_plan_and_draws_every_pair():
    p = _sample()
    (f,) = findings(as_placement(p))
    rule = next(r for r in p["conformance"]["rules"] if r["rule"] == "variables")
    assert (f.kind, f.anchor, f.op, f.device) == ("plan not obeyed", "conformance", "head/kernel", "/GPU:1")
    assert f.what == f"rule variables: {rule['violations_total']} of {rule['relevant']} ran off /GPU:0"
    drawn = {(a.source, a.to): a.bytes for a in arrows(as_placement(p))}
    assert drawn == {(s, d): c["bytes"] for s, row in p["transfers"]["matrix"].items() for d, c in row.items()}
    assert {b.device: (b.ops, b.variables) for b in boxes(as_placement(p))} == {
        d: (p["ops_by_device"][d], sum(d in v["devices"] for v in p["variables"])) for d in p["devices"]}
    html = render_html(p, None, {}, "t")
    assert html.index('id="change"') < html.index('id="summary"')  # the first section


def test_a_freed_variable_is_not_counted_in_its_devices_box():
    """A box counts the variables living on its device at the end: one the program freed (trace's
    `freed`) no longer does, on each of its devices."""
    p = _sample()
    before = {b.device: b.variables for b in boxes(as_placement(p))}
    gone = p["variables"][0]
    gone["freed"] = True
    after = {b.device: b.variables for b in boxes(as_placement(p))}
    assert after == {d: n - (d in gone["devices"]) for d, n in before.items()}
    assert after != before


def test_findings_rank_bytes_per_step_first_then_time_then_memory():
    p = _sample()
    p["transfers"]["round_trips"] = [
        {"tensor": "small", "home": "/GPU:1", "via": "/GPU:0", "op": "m1", "op_type": "Merge", "bytes": 100,
         "rule": "r", "fix": "f"},
        {"tensor": "big", "home": "/GPU:1", "via": "/GPU:0", "op": "m2", "op_type": "Merge", "bytes": 5000,
         "rule": "r", "fix": "f"}]
    p["fallbacks"] = [{"op": "x", "op_type": "Where", "requested": "/GPU:0", "placed": "/CPU:0"}]
    got = findings(as_placement(p))
    assert [(f.kind, f.bytes) for f in got] == [("round trip", 10000), ("round trip", 200),
                                                ("fallback", None), ("plan not obeyed", None)]


def test_nothing_to_change_when_nothing_is_found_and_an_empty_capture_renders():
    p = _sample()
    for r in p["conformance"]["rules"]:
        r["score"], r["violations"] = 1.0, []
    assert findings(as_placement(p)) == ()
    assert "Nothing to change." in render_html(p, None, {}, "t")
    empty = copy.deepcopy(p)
    empty.update(devices=[], ops_by_device={}, transfers={})
    assert 'class="run-diagram"' not in render_html(empty, None, {}, "t")


PACKED = {"device": "/GPU:0", "what": "every gradient packed into one buffer for the all-reduce is live at the peak",
          "evidence": "sgd/concat 68,904 B (49% of the peak)", "fix": "nothing while the device has room",
          "near_limit_only": True}


@pytest.mark.parametrize("verdict, found", [(None, []), ("fits", []), ("borderline", ["/GPU:0"]),
                                            ("does not fit", ["/GPU:0"])])
def test_a_memory_finding_that_matters_near_the_limit_is_one_to_act_on_only_where_the_device_is_short(verdict, found):
    """The gradients packed for the all-reduce are held twice by design: a change to make only when a
    GPU size says the device lacks room (the demo, on no size, has nothing to change)."""
    p = _sample()
    for r in p["conformance"]["rules"]:
        r["score"], r["violations"] = 1.0, []
    p["memory"] = {"devices": {"/GPU:0": {"peak_requested": 139229, "at_peak": []}}, "findings": [PACKED]}
    if verdict:
        p["memory"]["fit"] = {"devices": {"/GPU:0": {"verdict": verdict}}}
    assert [f.device for f in findings(as_placement(p)) if f.kind == "memory"] == found
