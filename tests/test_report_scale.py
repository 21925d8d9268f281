"""Reports at scale: placement.json without the per-op list (placement_ops.json.gz beside it, one
reader for both), and a report that groups variables, ops and replica differences by layer or
name scope, collapsed, after a "largest N" view; built from templates, one per section."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from pinpoint.placement.model.files import ops_path, read_placement, write_placement
from pinpoint.placement.report.html import LARGEST, SECTIONS, render_html, write_report

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


@pytest.mark.unit
def test_placement_files_split_and_read_back_as_one(tmp_path):
    p = _sample()
    p["transfer_items"] = [{"tensor": "a", "from": "/GPU:0", "to": "/GPU:1", "bytes": 8, "consumers": ["b"]}]
    p["variables"][0]["fingerprint"] = {"sum": 1.5, "sample": [0.5, 1.0]}
    write_placement(tmp_path / "placement.json", p)
    main = json.loads((tmp_path / "placement.json").read_text())
    assert "ops" not in main and "transfer_items" not in main and "fingerprint" not in main["variables"][0]
    with gzip.open(ops_path(tmp_path / "placement.json")) as f:
        detail = json.loads(f.read())
    assert len(detail["ops"]) == len(p["ops"]) and detail["transfer_items"] == p["transfer_items"]
    # The sample is schema 1 without layers rows: it reads back as schema 2 with nothing added,
    # split or not (the upgrade itself: test_a_schema_1_placement_reads_as_the_hand_written_schema_2).
    assert read_placement(tmp_path) == {**p, "schema": 2}
    assert read_placement(tmp_path, detail=False) == {**main, "schema": 2}
    assert ops_path(tmp_path / "placement-worker-0.json").name == "placement-worker-0_ops.json.gz"


@pytest.mark.unit
def test_a_schema_1_placement_reads_as_the_hand_written_schema_2(tmp_path):
    """Schema 1 had no layer_pins: they are read off the layers rows (each matched layer -> its
    key's device). The expected file is written by hand (tests/data), not by the upgrader."""
    expected = json.loads((SAMPLE.parent / "placement-schema2-expected.json").read_text())
    shutil.copy(SAMPLE.parent / "placement-schema1.json", tmp_path / "placement.json")
    assert read_placement(tmp_path) == expected
    assert expected["layer_pins"] == {"dense_1": "/GPU:0", "dense_2": "/GPU:1", "head": "/GPU:1"}
    assert read_placement(SAMPLE.parent / "placement-schema2-expected.json") == expected  # schema 2 as it is


@pytest.mark.unit
@pytest.mark.parametrize("schema", [3, "2"])
def test_a_newer_or_unknown_schema_is_refused_in_one_line(tmp_path, schema):
    from pinpoint.errors import ConfigError
    from pinpoint.placement.model.schema import SCHEMA_VERSION

    assert SCHEMA_VERSION == 2  # the version this test's files are written for
    doc = json.loads((SAMPLE.parent / "placement-schema2-expected.json").read_text())
    (tmp_path / "placement.json").write_text(json.dumps({**doc, "schema": schema}))
    with pytest.raises(ConfigError) as err:
        read_placement(tmp_path)
    assert str(err.value) == (f"placement.json schema: got {schema!r}; this pinpoint reads versions 1 to 2; read it "
                              "with the pinpoint version that wrote it, or upgrade pinpoint")


@pytest.mark.unit
def test_a_placement_json_from_before_the_split_reads_the_same(tmp_path):
    shutil.copy(SAMPLE, tmp_path / "placement.json")
    assert read_placement(tmp_path) == {**_sample(), "schema": 2}


def _large(n_layers: int = 300, vars_per_layer: int = 4, ops_per_layer: int = 40) -> dict:
    """The sample placement grown to a big model: n_layers layers of mirrored variables and ops."""
    p = _sample()
    devices = ["/GPU:0", "/GPU:1"]
    p["variables"] = [
        {"name": f"block_{i}/w{j}", "kind": "mirrored", "class": "trainable", "shape": [i + 1, 8], "dtype": "float32",
         "bytes": 32 * (i + 1), "components": [{"device": d, "physical": d} for d in devices], "devices": devices,
         "update_devices": devices, "update_ops": 2}
        for i in range(n_layers) for j in range(vars_per_layer)]
    p["ops"] = [{"op": f"{r}model/block_{i}/op_{k}", "type": "MatMul" if k % 2 else "AddV2", "device": devices[r != ""]}
                for i in range(n_layers) for k in range(ops_per_layer // 2) for r in ("", "replica_1/")]
    drift = {v["name"]: 0.0 for v in p["variables"]}
    drift["block_7/w0"] = 0.25
    p["replica_consistency"] = {"checked": len(drift), "max_abs_diff": 0.25, "trainable_drift": 0.25, "state_drift": 0.0,
                                "variables": drift, "classes": {n: "trainable" for n in drift}, "aggregations": {},
                                "state": []}
    return p


@pytest.mark.unit
def test_a_large_report_groups_by_layer_collapsed_after_a_largest_view():
    p = _large()
    html = render_html(p, None, {}, "big")
    variables = html[html.index('<section id="variables">'):html.index("</section>", html.index('<section id="variables">'))]
    # the largest-N view first, then one collapsed group per layer with its totals
    assert f"The {LARGEST} largest of 1200 variables" in variables
    first_group = variables.index("<details class=\"all\">")
    assert variables.index("block_299/w0") < first_group  # the largest variable is in the first view
    assert "All by layer: 300 group(s)" in variables
    assert variables.count("<details><summary>block_") == 300
    assert re.search(r"<details><summary>block_3</summary>.*?</details></td><td class=\"num\">4</td>"
                     r"<td class=\"num\">512 B</td>", variables)
    # ops by name scope: per device counts, replica and loop prefixes folded into the layer's scope
    ops = html[html.index('<section id="ops">'):html.index("</section>", html.index('<section id="ops">'))]
    assert "All by name scope: 300 group(s)" in ops
    assert re.search(r"<tr><td>model/block_0</td><td class=\"num\">40</td><td class=\"num\">0</td>"
                     r"<td class=\"num\">20</td><td class=\"num\">20</td></tr>", ops)
    # a drifting trainable variable: red in the largest view and its layer's group
    replicas = html[html.index('<section id="replicas">'):]
    assert re.search(r'<tr class="bad"><td>block_7/w0</td><td>trainable</td><td class="num">0.25</td>', replicas)
    assert re.search(r'<tr class="bad"><td><details><summary>block_7</summary>', replicas)
    # still one self-contained page: no script, no external resource
    assert "<script" not in html and not re.search(r'(src|href)="(https?:|//)', html)


@pytest.mark.unit
def test_the_sections_are_a_list_of_templates_in_page_order():
    html = render_html(_sample(), None, {}, "t")
    anchors = re.findall(r'<section id="([a-z]+)">', html)
    present = [s.anchor for s in SECTIONS if s.anchor in anchors]
    assert anchors == present and anchors[:4] == ["change", "summary", "devices", "ops"]  # the first screen leads
    for s in SECTIONS:
        assert (Path(__file__).parents[1] / "src" / "pinpoint" / "placement" / "report" / "templates" / s.template).is_file()
    nav = re.search(r"<main><p>(.*?)</p>", html).group(1)
    assert re.findall(r'href="#([a-z]+)"', nav) == anchors


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_resnet50_on_4_gpus_placement_stays_small_and_the_report_groups_it(tmp_path):
    """keras.applications.ResNet50 (no weights, 32x32 RGB) under mirrored on 4 emulated GPUs:
    ~16,000 ops per step; placement.json under 300 KB, the per-op list in placement_ops.json.gz."""
    from tests.test_replica_consistency import MODELS, train_user_model

    resnet = ("\n\ndef resnet(input_shape, num_classes, synchronized=False):\n"
              "    return keras.applications.ResNet50(input_shape=input_shape, weights=None, classes=num_classes,\n"
              "                                       classifier_activation=None)\n")
    import tests.test_replica_consistency as rc

    rc.MODELS = MODELS + resnet
    try:
        p = train_user_model(tmp_path, "resnet", devices_per_worker=4)
    finally:
        rc.MODELS = MODELS
    run = tmp_path / "run"
    assert (run / "placement.json").stat().st_size < 300_000
    assert len(p["ops"]) == sum(p["ops_by_device"].values()) > 15_000
    html_path, _, _ = write_report(run)
    html = html_path.read_text()
    assert "<script" not in html
    assert re.search(r"All by layer: \d+ group\(s\)", html) and "<details><summary>conv5_block3_3_conv</summary>" in html
