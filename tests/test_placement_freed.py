"""Variables freed before a traced program ended: the typed model reads and writes them, older
placement.json files (no `created`, no `freed`) read as before, and the counts leave them out."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest

from pinpoint.placement.analysis.variables import coverage_text, user_variables
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report.summary import format_summary

pytestmark = pytest.mark.unit
SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def row(name, devices, **extra):
    comps = [{"device": d, "physical": d} for d in devices]
    return {"name": name, "kind": "variable", "class": "trainable", "shape": [], "dtype": "float32", "bytes": 4,
            "components": comps, "devices": devices, "update_devices": devices, "update_ops": 1, **extra}


def test_an_older_file_reads_with_no_variable_freed_or_created():
    old = json.loads(SAMPLE.read_text())
    assert all("freed" not in v and "created" not in v for v in old["variables"])
    p = Placement.from_json(old)
    assert p.freed_variables == [] and all(v.created is None for v in p.variables)
    assert [v.to_json() for v in p.variables] == [Placement.from_json(p.to_json()).variables[i].to_json()
                                                  for i in range(len(p.variables))]


def test_a_freed_variable_round_trips_and_is_counted_apart():
    created = {"strategy": "MirroredStrategy", "requested": "", "layer": None, "source": "prog.py:3"}
    rows = [row("w", ["/GPU:0", "/GPU:1"], created=dict(created, layer="dense", source=None)),
            dict(row("scratch", ["/GPU:0", "/GPU:1"], created=created, freed=True), update_devices=[], update_ops=0)]
    # 2 of 2 program variables at the end would be wrong: the freed one has no updates to attribute.
    assert [v["name"] for v in user_variables(rows)] == ["w"]
    assert coverage_text(rows) == "updates attributed for 1/1 variables"
    p = Placement.from_json({"schema": 2, "variables": rows,
                             "variable_updates": {"coverage": coverage_text(rows)}})
    assert [v.name for v in p.user_variables] == ["w"] and [v.name for v in p.freed_variables] == ["scratch"]
    assert Placement.from_json(p.to_json()).to_json()["variables"] == rows
    line = next(ln for ln in format_summary(p, {}).splitlines() if ln.startswith("variables"))
    assert line == ("variables  : 1 (/GPU:0: 1, /GPU:1: 1; +1 created and freed before the end: /GPU:0: 1, "
                    "/GPU:1: 1); updates attributed for 1/1 variables")


def test_a_freed_variable_recorded_by_each_replica_thread_is_one_variable():
    """A tf.random.Generator made inside strategy.run: each replica thread records it with the same
    handles, and it is freed before the end. Two records, one variable (its second record's row
    number used to index the live rows: IndexError after the program ended)."""
    from pinpoint.device_names import DeviceMap
    from pinpoint.placement.analysis.variables import analyze_variables

    namer = DeviceMap(aliases={"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}, replica_devices=("/CPU:1", "/CPU:2"),
                      spec_replica_devices=("/GPU:0", "/GPU:1"), emulated=True)
    rec = {"name": "StateVar", "kind": "variable", "class": "non-trainable", "shape": [3], "dtype": "int64",
           "bytes": 24, "strategy": "MirroredStrategy", "handle_ids": [101, 102], "alive": False,
           "components": ["/job:localhost/replica:0/task:0/device:CPU:1"], "eager_update_devices": []}
    again = dict(rec, components=["/job:localhost/replica:0/task:0/device:CPU:1",
                                  "/job:localhost/replica:0/task:0/device:CPU:2"])
    result = analyze_variables([], [], namer, created=[rec, again])
    assert result["variables"] == []
    assert [(v["name"], v["devices"], v["freed"]) for v in result["freed"]] == [("StateVar", ["/GPU:0", "/GPU:1"], True)]


def test_the_report_shows_a_traced_programs_variables_by_the_strategy_that_made_them():
    """The distributed training guide's way: variables made under no strategy, then under one
    strategy after another, some freed; TensorFlow's own apart. A placement without creations
    (an older file) stays grouped by layer."""
    from pinpoint.placement.report.html import render_html

    def created(strategy, layer=None):
        return {"strategy": strategy, "requested": "", "layer": layer, "source": None if layer else "prog.py:3"}

    sample = json.loads(SAMPLE.read_text())
    rows = [row("one/d1/kernel", ["/GPU:1"], created=created("OneDeviceStrategy", "one/d1"), freed=True),
            row("two/d2/kernel", ["/GPU:0", "/GPU:1"], created=created("MirroredStrategy", "two/d2")),
            row("two/d2/bias", ["/GPU:0", "/GPU:1"], created=created("MirroredStrategy", "two/d2")),
            row("plain", ["/GPU:0"], created=created(None)),
            dict(row("Variable", ["/GPU:0"], created=created(None)), **{"class": "internal"}),
            row("restored", ["/GPU:0"])]
    html = render_html(dict(sample, variables=rows), None, {}, "guide")
    section = html[html.index('<section id="variables">'):html.index("</section>", html.index('<section id="variables">'))]
    assert "All by strategy: 5 group(s)" in section
    groups = re.findall(r"<tr[^>]*><td><details><summary>(.*?)</summary>.*?</details></td><td class=\"num\">(\d+)</td>",
                        section, re.S)
    assert [(html_lib.unescape(name), int(n)) for name, n in groups] == [
        ("OneDeviceStrategy", 1), ("MirroredStrategy", 2), ("(no strategy: TensorFlow's default)", 1),
        ("(internal: TensorFlow's own variables)", 1), ("(strategy not recorded)", 1)]
    old = render_html(sample, None, {}, "old")
    assert "All by layer:" in old and "All by strategy" not in old


def test_where_and_when_a_freed_variable_went_round_trips_and_the_report_shows_it():
    from pinpoint.placement.model.sections import Variable
    from pinpoint.placement.report.html import _freed

    at = {"source": "/home/me/train.py:12", "s": 1.25}
    v = Variable.from_json(dict(row("scratch", ["/GPU:0"]), freed=True, freed_at=at))
    assert v.to_json()["freed_at"] == at
    assert _freed(v) == " (freed at train.py:12, 1.2 s in)"
    # An older file's freed variable (no freed_at): as before.
    assert _freed(Variable.from_json(dict(row("scratch", ["/GPU:0"]), freed=True))) == " (freed)"
