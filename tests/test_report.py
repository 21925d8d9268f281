"""report.html and PNG charts from a stored placement (tests/data/placement-sample.json was
captured from a real `pinpoint train` run: strategy none, variables pinned to /GPU:0, gradients to
/GPU:1, layers dense_1 -> /GPU:0 and head -> /GPU:1, two GPUs emulated on logical CPUs)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from pinpoint.errors import ConfigError
from pinpoint.placement.report.html import render_html, write_report
from pinpoint.steps.report import report_command

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_sample_is_a_real_capture():
    p = _sample()
    # facts of the captured run, as TensorFlow placed it
    assert p["device_aliases"] == {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}
    assert all(p["ops_by_device"][d] > 0 for d in ("/CPU:0", "/GPU:0", "/GPU:1"))
    assert len(p["ops"]) > 50 and p["transfers"]["per_step"]["count"] > 0


def test_report_writes_self_contained_html_and_pngs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(SAMPLE, run / "placement.json")
    (run / "metrics.json").write_text(json.dumps({"final_loss": 0.5, "final_accuracy": 0.9, "examples_per_sec": 1234.0, "steps": 12}))
    assert report_command(run) == 0
    html = (run / "report.html").read_text()
    charts = sorted(p.name for p in (run / "charts").glob("*.png"))
    assert charts == sorted(["ops_heatmap.png", "transfer_matrix.png", "ops_per_device.png", "conformance.png", "variable_bytes.png"])
    for c in charts:
        w, h = _png_size(run / "charts" / c)
        assert w > 300 and h > 150
    # self-contained: every image inline, no external resource
    assert html.count("data:image/png;base64,") == len(charts)
    assert not re.search(r'(src|href)="(https?:|//)', html)
    assert "<link" not in html and "<script" not in html
    for section in ("Devices", "Ops by device", "Transfers between devices", "Fallbacks", "Variables",
                    "Gradients (backward pass)", "Conformance with the plan", "Replica consistency"):
        assert f">{section}</h2>" in html
    # the device alias table and the explanations are there
    assert "<td>/GPU:0</td><td>/CPU:1</td>" in html
    assert "only a request" in html and "copied there first" in html
    # the variables rule was violated in this run (head's variables were created on /GPU:1)
    assert "head/kernel" in html and 'class="bad"' in html
    assert "examples/s" in html and "loss 0.5000" in html
    # no partial files left behind
    assert not list(run.glob(".*.tmp")) and not list((run / "charts").glob(".*"))


def test_fallbacks_and_violations_highlighted():
    p = _sample()
    p["fallbacks"] = [{"op": "AsString", "op_type": "AsString", "requested": "/GPU:3", "requested_physical": "/GPU:3",
                       "placed": "/CPU:0", "placed_physical": "/CPU:0", "reason": "requested device does not exist"}]
    html = render_html(p, None, {}, "t")
    row = re.search(r'<tr class="bad"><td>AsString</td><td>AsString</td><td>/GPU:3</td><td>/CPU:0</td>', html)
    assert row, "fallback row is not highlighted"
    assert "1 op(s) did not run where they were requested" in html
    clean = copy.deepcopy(p)
    clean["fallbacks"] = []
    for r in clean["conformance"]["rules"]:
        r.update(score=1.0, violations=[], violations_total=0)
    clean["conformance"]["score"] = 1.0
    html2 = render_html(clean, None, {}, "t")
    assert "every op that requested a device ran on it" in html2
    assert "Violations" not in html2


def test_predicted_fallbacks_get_their_own_table_apart_from_observed_ones():
    p = _sample()
    p["fallbacks"] = [{"op": "shuffle/RandomIndexShuffle", "op_type": "RandomIndexShuffle", "requested": "/GPU:1",
                       "requested_physical": "/CPU:2", "placed": "/GPU:1", "placed_physical": "/CPU:2",
                       "predicted": True, "would_run_on": "/CPU:0",
                       "reason": "no GPU kernel for RandomIndexShuffle (dtype=int64)"}]
    html = render_html(p, None, {}, "t")
    # No observed fallback: the observed table says so; the predicted one has its own rows.
    assert "every op that requested a device ran on it" in html
    assert "Predicted for a GPU machine: 1 op(s)" in html
    assert re.search(r'<tr class="bad"><td>shuffle/RandomIndexShuffle</td><td>RandomIndexShuffle</td>'
                     r'<td>/GPU:1 \(/CPU:2\)</td><td>/CPU:0</td><td>no GPU kernel for RandomIndexShuffle '
                     r'\(dtype=int64\)</td>', html), "predicted fallback row missing"
    assert "<b>1</b><span>predicted fallbacks</span>" in html


def test_report_errors_are_one_line(tmp_path):
    # One format: the field, the value received, the fix.
    with pytest.raises(ConfigError, match=r"^run_dir: got '.*placement\.json', which does not exist; run the previous step"):
        write_report(tmp_path)
    with pytest.raises(ConfigError, match=r"^run_dir: got '.*missing', which is not a folder; pass a trained run folder"):
        write_report(tmp_path / "missing")
    (tmp_path / "placement.json").write_text("[]")
    with pytest.raises(ConfigError, match=r"^run_dir: got '.*', whose placement\.json is not a placement file; re-run"):
        write_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_cli_report_bad_dir_one_line(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pinpoint.cli", "report", str(tmp_path / "nope")],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().startswith("pinpoint:") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_a_layer_split_gets_one_row_per_layer_and_a_red_row_when_its_backward_ran_elsewhere():
    p = _sample()
    p["layers"] = [
        {"layer": "dense_1", "device": "/GPU:0", "forward_ops": {"/GPU:0": 3}, "backward_ops": {"/GPU:0": 3},
         "bytes_in": 8192, "bytes_out": 16384},
        {"layer": "head", "device": "/GPU:1", "forward_ops": {"/GPU:1": 3}, "backward_ops": {"/CPU:0": 4},
         "bytes_in": 16384, "bytes_out": 1280},
    ]
    html = render_html(p, None, {}, "t")
    section = html[html.index('<section id="layers">'):]
    section = section[: section.index("</section>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", section)
    cells = [re.sub(r"<[^>]+>", "|", r) for r in rows[1:]]
    assert len(cells) == 2
    assert "dense_1" in cells[0] and "16.0 KiB" in cells[0] and "8.0 KiB" in cells[0]
    assert "/CPU:0: 4" in cells[1]
    bad = re.findall(r'<tr class="bad"', section)
    assert len(bad) == 1


def test_a_layer_rule_shows_its_forward_and_backward_scores_apart():
    p = _sample()
    p["conformance"]["rules"] = [{"rule": "layers.head", "planned": "/GPU:1", "observed": {"/GPU:1": 3, "/CPU:0": 4},
                                  "relevant": 7, "score": 0.4286, "violations": [], "violations_total": 4,
                                  "forward": {"relevant": 3, "score": 1.0, "observed": {"/GPU:1": 3}},
                                  "backward": {"relevant": 4, "score": 0.0, "observed": {"/CPU:0": 4}}}]
    html = render_html(p, None, {}, "t")
    section = html[html.index('<section id="conformance">'):]
    assert "forward 1.00 (3), backward 0.00 (4)" in section[: section.index("</section>")]
