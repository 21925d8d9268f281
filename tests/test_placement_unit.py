"""Pure-Python parts of placement: device names, headline metrics, summary, multi-worker merge."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from pinpoint.device_names import DeviceMap, matches, normalize
from pinpoint.placement.analysis.merge import merge_placements
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report.metrics import headline_metrics, metric_key, metrics_step
from pinpoint.placement.report.summary import format_summary

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SAMPLE = Path(__file__).parent / "data" / "placement-sample.json"


def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


def test_normalize_and_spec_names():
    assert normalize("/job:localhost/replica:0/task:0/device:CPU:1") == "/CPU:1"
    assert normalize("/job:worker/replica:0/task:1/device:GPU:0") == "/job:worker/task:1/GPU:0"
    assert normalize("/device:GPU:0") == "/GPU:0"
    assert normalize("") == ""
    namer = DeviceMap.of(type("DM", (), {"aliases": {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"}})())
    assert namer.canonical_spec("/job:localhost/replica:0/task:0/device:CPU:2") == "/GPU:1"
    assert namer.canonical_spec("/job:worker/replica:0/task:1/device:CPU:1") == "/job:worker/task:1/GPU:0"
    assert namer.canonical_spec("/job:localhost/replica:0/task:0/device:CPU:0") == "/CPU:0"
    assert namer.canonical_physical("/GPU:1") == "/CPU:2"


def test_matches_only_what_the_plan_specifies():
    assert matches("/GPU:0", "/GPU:0")
    assert not matches("/GPU:0", "/GPU:1")
    assert matches("/job:ps", "/job:ps/task:1/CPU:0")
    assert not matches("/job:ps", "/job:worker/task:0/CPU:0")
    assert matches("/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0")
    assert not matches("/job:worker/task:1/GPU:0", "/job:worker/task:0/GPU:0")


def test_headline_metrics_keys_are_mlflow_safe():
    hm = headline_metrics(_sample())
    for k, v in hm.items():
        assert re.fullmatch(r"[A-Za-z0-9_.\-/ ]+", k), k
        assert isinstance(v, float)
    assert {"placement.ops.CPU_0", "placement.ops.GPU_0", "placement.ops.GPU_1", "placement.transfers_per_step",
            "placement.transfer_bytes_per_step", "placement.fallbacks", "placement.conformance"} <= set(hm)
    assert hm["placement.conformance"] == _sample()["conformance"]["score"]
    assert metric_key("/job:worker/task:1/GPU:0") == "worker_1_GPU_0"


def test_placement_metrics_belong_to_the_last_captured_step():
    assert metrics_step(_sample()) == _sample()["captured_steps"][-1] == 3
    assert metrics_step({"captured_steps": [2, 3, 4]}) == 4
    assert metrics_step({"captured_steps": []}) == metrics_step({}) == 0


def test_summary_is_short_and_has_the_numbers():
    p = _sample()
    text = format_summary(p, {"final_loss": 0.25, "final_accuracy": 0.875, "examples_per_sec": 5000, "steps": 12})
    lines = text.splitlines()
    assert 8 <= len(lines) <= 15
    assert "loss 0.2500" in text and "accuracy 0.875" in text and "5,000 examples/s" in text
    assert "/GPU:0=/CPU:1" in text
    assert f"{p['transfers']['per_step']['count']} per step" in text
    assert "variables 0.75" in text  # the rule below 1 is named
    assert "fallbacks  : 0" in text
    assert "not captured" in format_summary(None, {"final_loss": 1.0})
    p["replica_consistency"] = {"checked": 0, "max_abs_diff": None, "variables": {}, "error": "remote read failed"}
    assert "replica drift: not checked (remote read failed)" in format_summary(p, {})
    p["replica_consistency"] = {"checked": 3, "max_abs_diff": 0.5, "variables": {}}
    assert "max |diff| 0.5 over 3" in format_summary(p, {})


def _as_task(p: dict, job: str, task: int) -> dict:
    """The same placement as if captured by task `job:task` of a cluster (device names prefixed)."""
    q = copy.deepcopy(p)
    pre = f"/job:{job}/task:{task}"
    ren = lambda d: pre + d
    q["task"] = f"{job}:{task}"
    q["devices"] = [ren(d) for d in p["devices"]]
    q["ops_by_device"] = {ren(d): n for d, n in p["ops_by_device"].items()}
    q["op_types_by_device"] = {ren(d): t for d, t in p["op_types_by_device"].items()}
    q["gradients"]["ops_by_device"] = {ren(d): n for d, n in p["gradients"]["ops_by_device"].items()}
    q["transfers"]["matrix"] = {ren(s): {ren(d): c for d, c in row.items()} for s, row in p["transfers"]["matrix"].items()}
    for v in q["variables"]:
        v["devices"] = [ren(d) for d in v["devices"]]
        v["update_devices"] = [ren(d) for d in v["update_devices"]]
        for c in v["components"]:
            c["device"] = ren(c["device"])
    return q


def _merge(*contents) -> dict:
    """placement.json's content of the merge of each task's placement.json content."""
    return merge_placements([Placement.from_json(c) for c in contents]).to_json()


def test_merge_leaves_tensorflows_own_variables_out_of_the_cross_task_drift():
    # Each task's collective-ordering token differs from the others' by design (multi-worker).
    base = _sample()
    a, b = _as_task(base, "chief", 0), _as_task(base, "worker", 0)
    for task, value in ((a, 1.0), (b, 7.0)):
        task["variables"].append({"name": "Variable", "class": "internal", "devices": [], "update_devices": [],
                                  "components": [], "fingerprint": {"sample": [value]}})
    rc = _merge(a, b)["replica_consistency"]
    assert "Variable" not in rc["variables"]


def test_merge_placements_unites_tasks():
    base = _sample()
    a, b = _as_task(base, "chief", 0), _as_task(base, "worker", 0)
    b["conformance"]["score"] = 0.5
    b["replica_consistency"] = {"checked": 2, "max_abs_diff": 0.125, "variables": {"dense_1/kernel": 0.125}}
    m = _merge(a, b)
    assert m["task"] == "cluster"
    assert set(m["devices"]) == set(a["devices"]) | set(b["devices"])
    assert sum(m["ops_by_device"].values()) == sum(base["ops_by_device"].values()) * 2
    assert m["transfers"]["per_step"]["count"] == base["transfers"]["per_step"]["count"] * 2
    assert m["transfers"]["per_step"]["bytes"] == base["transfers"]["per_step"]["bytes"] * 2
    assert m["conformance"]["score"] == pytest.approx((base["conformance"]["score"] + 0.5) / 2)
    assert m["conformance"]["by_task"] == {"chief:0": base["conformance"]["score"], "worker:0": 0.5}
    assert {r["task"] for r in m["conformance"]["rules"]} == {"chief:0", "worker:0"}
    # a variable mirrored on both tasks: one entry, components from both
    v = next(v for v in m["variables"] if v["name"] == "dense_1/kernel")
    assert len(v["components"]) == 2 and {c["task"] for c in v["components"]} == {"chief:0", "worker:0"}
    assert v["devices"] == ["/job:chief/task:0/GPU:0", "/job:worker/task:0/GPU:0"]
    assert m["replica_consistency"]["max_abs_diff"] == 0.125
    assert set(m["tasks"]) == {"chief:0", "worker:0"} and "ops" not in m["tasks"]["chief:0"]
    one = Placement.from_json(a)
    assert merge_placements([one]) is one and merge_placements([]) is None
    # the merged placement renders
    from pinpoint.placement.report.html import render_html

    html = render_html(m, None, {}, "cluster")
    assert "Tasks of the cluster" in html and "[worker:0] variables" in html


def test_variables_rule_violation_names_the_layer_rule():
    """head's variables on /GPU:1 violate variables=/GPU:0 because layers.head=/GPU:1 created them."""
    import re as _re

    from pinpoint.config import PinningConfig
    from pinpoint.placement.analysis.conformance import check_conformance

    variables = [
        {"name": "dense_1/kernel", "devices": ["/GPU:0"], "components": [{"device": "/GPU:0"}]},
        {"name": "head/kernel", "devices": ["/GPU:1"], "components": [{"device": "/GPU:1"}]},
    ]
    plan = PinningConfig(variables="/GPU:0", layers={"head": "/GPU:1"})
    conf = check_conformance([], variables, plan, "none", None, DeviceMap.of(None), _re.compile("gradients/"), None,
                             _re.compile("input/"))
    rule = next(r for r in conf["rules"] if r["rule"] == "variables")
    assert rule["score"] == 0.5
    assert rule["violations"] == [{"op": "head/kernel", "placed": "/GPU:1",
                                   "why": "created inside layers.head's device scope (/GPU:1)"}]


# A layers row as schema 1 (before the typed model) wrote it: main's build of an mlp with
# pinning.layers {"dense_*": /GPU:0, "head": /GPU:1} on 2 emulated GPUs.
V1_LAYERS = [
    {"layer": "dense_*", "layers_matched": 2, "matched": ["dense_1", "dense_2"], "device": "/GPU:0",
     "forward_ops": {"/GPU:0": 6}, "backward_ops": {"/GPU:0": 7}, "bytes_in": 16384, "bytes_out": 8192},
    {"layer": "head", "layers_matched": 1, "matched": ["head"], "device": "/GPU:1",
     "forward_ops": {"/GPU:1": 3}, "backward_ops": {"/GPU:0": 1, "/GPU:1": 3}, "bytes_in": 9472, "bytes_out": 12072},
]


def test_a_schema_1_placement_reads_in_the_current_schema(tmp_path):
    """tests/data/placement-sample.json is schema 1; with the layers rows schema 1 wrote, it reads as
    schema 2 with `layer_pins` read off the rows, and the model names each row's fields."""
    from pinpoint.placement.model.files import read_placement, write_placement
    from pinpoint.placement.model.placement import Placement
    from pinpoint.placement.model.schema import SCHEMA_VERSION
    from pinpoint.placement.model.sections import LayerRow

    old = dict(_sample(), layers=V1_LAYERS)
    assert old["schema"] == 1
    write_placement(tmp_path / "placement.json", old)
    read = read_placement(tmp_path)
    assert (read["schema"], SCHEMA_VERSION) == (2, 2)
    assert read["layer_pins"] == {"dense_1": "/GPU:0", "dense_2": "/GPU:0", "head": "/GPU:1"}
    head = Placement.from_json(read).layers[1]
    assert head == LayerRow(layer="head", device="/GPU:1", forward_ops={"/GPU:1": 3},
                            backward_ops={"/GPU:0": 1, "/GPU:1": 3}, bytes_in=9472, bytes_out=12072,
                            layers_matched=1, matched=("head",))


def test_the_model_round_trips_placement_json():
    """Placement.from_json(...).to_json() gives back every section of the file, schema bumped."""
    from pinpoint.placement.model.placement import Placement

    sample = dict(_sample(), layers=V1_LAYERS)
    out = Placement.from_json(sample).to_json()
    # The sample predates transfers.loop_control and unsized_reasons: they read as empty.
    assert (out["transfers"]["loop_control"], out["transfers"]["unsized_reasons"]) == ({"count": 0, "bytes": 0}, {})
    out["transfers"] = {k: v for k, v in out["transfers"].items() if k in sample["transfers"]}
    assert {k: v for k, v in out.items() if k in sample and k != "schema"} == \
        {k: v for k, v in sample.items() if k != "schema"}
    assert out["schema"] == 2


def test_a_newer_schema_is_refused_in_one_line(tmp_path):
    from pinpoint.errors import ConfigError
    from pinpoint.placement.model.files import read_placement

    (tmp_path / "placement.json").write_text(json.dumps(dict(_sample(), schema=3)))
    with pytest.raises(ConfigError, match=r"^placement.json schema: got 3; this pinpoint reads versions 1 to 2; "):
        read_placement(tmp_path)


def test_the_layers_table_names_its_columns():
    """layers.html.j2 reads named fields: the row of a layer whose backward op ran off its device is
    red and lists the layers its key matched."""
    from pinpoint.placement.report.html import render_html

    html = render_html(dict(_sample(), layers=V1_LAYERS), None, {}, "t")
    section = html[html.index('<section id="layers">'):]
    section = section[:section.index("</section>")]
    assert '<details><summary>dense_*</summary>dense_1, dense_2</details>' in section
    rows = re.findall(r"<tr( class=\"bad\")?><td>(?:<details><summary>)?(dense_\*|head)<", section)
    assert rows == [("", "dense_*"), (' class="bad"', "head")]


def test_layer_pins_map_paths_to_their_keys_devices():
    from pinpoint.layer_keys import resolve_pins

    pins = resolve_pins({"dense_*": "/GPU:0", "backbone/block_1": "/GPU:1"},
                        ["dense_1", "backbone", "backbone/block_1", "backbone/block_1/conv", "dense_2"], "m")
    assert pins.by_path() == {"dense_1": "/GPU:0", "backbone/block_1": "/GPU:1", "backbone/block_1/conv": "/GPU:1",
                              "dense_2": "/GPU:0"}
    assert pins.names_by_key() == {"dense_*": ["dense_1", "dense_2"], "backbone/block_1": ["block_1", "conv"]}


def test_a_merged_traced_program_keeps_the_chiefs_own_sections():
    """train.entrypoint in a cluster: the merge unites the tasks' sections; functions, the training
    function, eager ops and the program are the chief's (the first placement)."""
    def fn(name: str, calls: int) -> dict:
        return {"name": name, "concrete": name, "kind": "tf.function", "calls": calls, "captured": True,
                "ops_per_call": 1, "ops_by_device": {}, "transfers_per_call": 0, "transfer_bytes_per_call": 0,
                "collectives_per_call": 0, "variable_updates": 0, "optimizer_updates": 0, "role": "train"}

    chief = dict(_sample(), task="chief:0", functions=[fn("train_step", 3)],
                 training_function="train_step", eager={"ops": 7}, program="train:main")
    worker = dict(_sample(), task="worker:0", functions=[fn("other", 1)],
                  training_function="other", eager={"ops": 1}, program="train:main")
    merged = merge_placements([Placement.from_json(chief), Placement.from_json(worker)])
    assert ([(f.name, f.calls) for f in merged.functions], merged.training_function, merged.eager.ops,
            merged.program) == ([("train_step", 3)], "train_step", 7, "train:main")


def test_a_sizing_error_is_one_summary_line_under_the_transfers():
    p = _sample()
    p["transfers"]["sizing_errors"] = ["shape inference failed in train_step at adam/split (ValueError: x)",
                                       "shape inference failed in eval_step at b (ValueError: y)"]
    lines = [line for line in format_summary(p, {}).splitlines() if line.startswith("  sizing")]
    assert lines == ["  sizing   : shape inference failed in train_step at adam/split (ValueError: x) "
                     "(+1 more in placement.json)"]
