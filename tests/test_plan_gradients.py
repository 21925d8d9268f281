"""A plan moves a pinned backward pass (train.pinning.gradients) as one piece.

When the program put its whole backward pass on one device, every layer's backward ops (and the
loss's) are a group of their own there, also where a layer ran beside them: moving the layer
leaves its backward pass on that device. The plan may move all of them together to another
device, written as `pinning.gradients`.

Unit: a hand-built step whose forward pass ran on /GPU:0 and backward pass on /GPU:1 (the plan
brings the gradients to the layers), the checker, the plan file, the baselines, the config and the
conformance of a verification. Integration: a real MLP so pinned, placed three other ways, each
trained; the bytes per device pair predicted on the source run's graph are what each training
measured; `pinpoint plan --verify` holds its own plan to the same."""

from __future__ import annotations

import json

import pytest
import yaml

from pinpoint.errors import PlacementError
from pinpoint.placement.model.files import load_placement
from pinpoint.placement.model.placement import Placement
from pinpoint.plan.graph import BACKWARD, Edge, Group, PlanGraph
from tests.conftest import NO_TRACKING, make_config

GPUS = ("/GPU:0", "/GPU:1")
DEVICES = ("/CPU:0", *GPUS)
B = BACKWARD


def pinned_chain(**extra) -> PlanGraph:
    """Two layers and the loss ran on /GPU:0, their backward groups on /GPU:1 (pinned there): the
    activations cross to the backward pass, the weight gradients cross back to the updates."""
    groups = (
        Group("input", 0, 10.0, 2, 0, "/CPU:0", allowed=frozenset({"CPU"}), movable=False),
        Group("l1", 1, 100.0, 4, 4000, "/GPU:0", requested="/GPU:0"),
        Group("l2", 2, 100.0, 4, 4000, "/GPU:0", requested="/GPU:0"),
        Group("other", 3, 20.0, 4, 0, "/GPU:0"),
        Group("other" + B, 4, 20.0, 4, 0, "/GPU:1", movable=False),
        Group("l2" + B, 5, 200.0, 6, 0, "/GPU:1", movable=False),
        Group("l1" + B, 6, 200.0, 6, 0, "/GPU:1", movable=False),
    )
    edges = (Edge("input", "l1", 1000), Edge("l1", "l2", 3000), Edge("l2", "other", 400),
             Edge("other", "other" + B, 400), Edge("other" + B, "l2" + B, 400), Edge("l2", "l2" + B, 3000),
             Edge("l1", "l1" + B, 3000), Edge("l2" + B, "l1" + B, 3000), Edge("l1" + B, "l1", 4000),
             Edge("l2" + B, "l2", 4000))
    fields = {"groups": groups, "edges": edges, "devices": DEVICES, "host": "/CPU:0", "strategy": "none",
              "timed": True, "gradient_device": "/GPU:1"}
    return PlanGraph(**{**fields, **extra})


def _plan(graph: PlanGraph, objective: str = "step_time") -> dict:
    from pinpoint.plan.command import plan_run
    from pinpoint.plan.links import LinkModel

    return plan_run(graph, source_run="runs/pinned", devices=2, objective=objective,
                    links=LinkModel.from_dict({"pcie": {"latency_us": 1, "gb_per_s": 1}}))[0]


@pytest.mark.unit
def test_the_plan_brings_a_pinned_backward_pass_to_the_layers_as_one_piece():
    doc = _plan(pinned_chain())
    # All of it on /GPU:0: nothing but the batch crosses (the loss, unpinnable, stays on /GPU:0).
    assert doc["pinning"] == {"layers": {"l1": "/GPU:0", "l2": "/GPU:0"}, "gradients": "/GPU:0"}
    assert doc["tf_device"] == {"l1": "/GPU:0", "l2": "/GPU:0", "gradients": "/GPU:0"}
    assert doc["algorithm"].endswith("gradients on /GPU:0")
    assert doc["prediction"]["plan"]["bytes_crossing"] == {"/CPU:0 -> /GPU:0": 1000}
    assert doc["prediction"]["measured"]["bytes_crossing_per_step"] == 1000 + 400 + 3000 * 2 + 4000 * 2
    # One rationale line for the backward pass, not one per backward group.
    (line,) = doc["rationale"]
    assert line.startswith("gradients (pinning.gradients): /GPU:1 -> /GPU:0 (0.42 ms compute), ")
    assert line.endswith(f"{-(400 + 3000 * 2 + 4000 * 2) / 1024:+.0f} KiB/step crossing")


@pytest.mark.unit
def test_a_split_group_and_its_backward_group_are_all_forward_tasks():
    """Their ops are one pass each: the layer's forward (and its updates), the backward group's
    gradients, ordered after every forward group."""
    from pinpoint.plan.tasks import BACKWARD_SHARE, costs, task_graph

    g = pinned_chain()
    tg = task_graph(g, costs(g))
    assert [tg.duration[2 * tg.keys.index(k):2 * tg.keys.index(k) + 2] for k in ("l1", "l1" + B)] == \
        [(100.0, 0.0), (200.0, 0.0)]
    whole = task_graph(pinned_chain(gradient_device=None, groups=pinned_chain().groups[:4]), costs(g))
    assert whole.duration[2:4] == (100.0 * (1 - BACKWARD_SHARE), 100.0 * BACKWARD_SHARE)


@pytest.mark.unit
def test_the_checker_keeps_a_pinned_backward_pass_on_one_device():
    from pinpoint.plan.check import violations

    g = pinned_chain()
    ran = {x.key: x.device for x in g.groups}
    together = {**ran, **{k: "/GPU:0" for k in ran if k.endswith(B)}}
    assert violations(g, together) == []
    assert violations(g, {**ran, "l1" + B: "/GPU:0"}) == [
        "pinning.gradients: got the backward pass on /GPU:0, /GPU:1; pinning.gradients puts all of it on one "
        "device, pick one"]
    # A backward pass the program did not pin to one device (backward groups apart, each where the
    # program computed it) stays where it ran.
    assert violations(pinned_chain(gradient_device=None), together)[0] == (
        "pinning.gradients: got '/GPU:0', but other (backward) must stay on '/GPU:1' (the program computes it "
        "there); pin it there")


@pytest.mark.unit
def test_the_plan_file_carries_the_gradients_and_refuses_them_for_a_run_that_did_not_pin_them(tmp_path):
    from pinpoint.plan.emit import read_plan, write_plan

    g = pinned_chain()
    path = write_plan(tmp_path / "plan.yaml", _plan(g))
    read = read_plan(path, g)
    assert read.placement == {"input": "/CPU:0", "l1": "/GPU:0", "l2": "/GPU:0", "other": "/GPU:0",
                              **{k: "/GPU:0" for k in ("l1" + B, "l2" + B, "other" + B)}}
    with pytest.raises(PlacementError) as err:
        read_plan(path, pinned_chain(gradient_device=None))
    assert str(err.value) == ("pinning.gradients: got '/GPU:0', but the run's backward pass follows its layers; "
                              "plan gradients from a run that pins them (train.pinning.gradients), or remove the "
                              "field")
    data = yaml.safe_load(path.read_text())
    data["pinning"]["gradients"] = "/GPU:7"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlacementError) as err:
        read_plan(path, g)
    assert str(err.value) == ("pinning.gradients: got '/GPU:7', not a device of the run (/CPU:0, /GPU:0, /GPU:1); "
                              "use one of them (and 2 more)")


@pytest.mark.unit
def test_everything_on_one_device_includes_a_pinned_backward_pass():
    from pinpoint.plan.baselines import one_device, user

    g = pinned_chain()
    assert {k: d for k, d in one_device(g, "/GPU:1").items() if k != "input"} == \
        dict.fromkeys(("l1", "l2", "l1" + B, "l2" + B, "other" + B), "/GPU:1") | {"other": "/GPU:0"}
    assert user(g)["l1" + B] == "/GPU:1"  # the user's plan keeps the user's own gradient pin


@pytest.mark.unit
def test_verify_trains_the_plans_gradient_device_and_holds_it_to_the_gradients_rule():
    from pinpoint.plan.verify import compare_conformance, verify_config

    train = {"strategy": "none", "model": "mlp", "steps": 4,
             "pinning": {"layers": {"dense_1": "/GPU:0"}, "gradients": "/GPU:1"}}
    cfg = make_config("v", cluster={"devices_per_worker": 2, "emulate": True}, train=train, tracking=NO_TRACKING)
    doc = {"devices": list(GPUS), "pinning": {"layers": {"dense_1": "/GPU:1", "head": "/GPU:0"},
                                             "gradients": "/GPU:0"}}
    got = verify_config(cfg, doc, "c.yaml")
    assert (got.train.pinning.layers, got.train.pinning.gradients) == ({"dense_1": "/GPU:1", "head": "/GPU:0"},
                                                                       "/GPU:0")
    placement = {"conformance": {"rules": [
        {"rule": "layers.dense_1", "planned": "/GPU:1", "score": 1.0, "observed": {"/GPU:1": 3}, "violations": []},
        {"rule": "layers.head", "planned": "/GPU:0", "score": 1.0, "observed": {"/GPU:0": 3}, "violations": []},
        {"rule": "gradients", "planned": "/GPU:0", "score": 0.5, "observed": {"/GPU:0": 1, "/CPU:0": 1},
         "violations": [{"op": "gradients/Shape", "placed": "/CPU:0", "why": "host-only (no GPU kernel)"}]}]}}
    got = compare_conformance(Placement.from_json(placement), doc["pinning"]["layers"], doc["pinning"]["gradients"])
    assert got["score"] == round(2.5 / 3, 4)
    assert got["layers"][-1] == {"layer": "pinning.gradients", "planned": "/GPU:0", "score": 0.5,
                                 "observed": {"/GPU:0": 1, "/CPU:0": 1}}
    assert got["deviations"] == [{"layer": "pinning.gradients", "op": "gradients/Shape", "placed": "/CPU:0",
                                  "cause": "host-only (no GPU kernel)"}]


# ---- a real MLP with its backward pass pinned ---------------------------------------------------
SPLIT = {"dense_1": "/GPU:0", "dense_2": "/GPU:0", "head": "/GPU:1"}
TRAIN = {"strategy": "none", "model": "mlp", "steps": 6, "batch_size": 32, "learning_rate": 0.05, "log_every": 2,
         "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": SPLIT, "gradients": "/GPU:1"}}
CLUSTER = {"devices_per_worker": 2, "emulate": True}
PLACEMENT = {"warmup_steps": 1, "sample_steps": 1, "timing": False}
PLACED = {
    # The head leaves the gradient device; its backward pass stays there.
    "head-off": {"layers": {**SPLIT, "head": "/GPU:0"}, "gradients": "/GPU:1"},
    # The gradients move to /GPU:0, where now only the first layer runs.
    "gradients-moved": {"layers": {"dense_1": "/GPU:0", "dense_2": "/GPU:1", "head": "/GPU:1"},
                        "gradients": "/GPU:0"},
    "one-device": {"layers": dict.fromkeys(SPLIT, "/GPU:1"), "gradients": "/GPU:1"},
}


def _train(tmp_path, name: str, pinning: dict) -> dict:
    from pinpoint.training.command import train_command

    out = tmp_path / name
    cfg = make_config(name, cluster=CLUSTER, train={**TRAIN, "pinning": pinning}, tracking=NO_TRACKING,
                      placement=PLACEMENT)
    assert train_command(cfg, out) == 0
    return out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bytes_predicted_from_a_run_with_pinned_gradients_are_what_each_placement_measures(tmp_path, tf):
    from pinpoint.cli import main
    from pinpoint.plan.build import plan_graph
    from pinpoint.plan.emit import placement_of
    from pinpoint.plan.predict import bytes_crossing
    from pinpoint.plan.verify import pair_bytes

    source = _train(tmp_path, "source", TRAIN["pinning"])
    # The run obeyed both pins: each layer's rule scores its forward ops, the gradients rule the
    # backward ops (a layer rule scoring those too could never reach 1 beside it).
    ran = json.loads((source / "placement.json").read_text())
    rules = {r["rule"]: r for r in ran["conformance"]["rules"]}
    assert [(rules[f"layers.{k}"]["score"], rules[f"layers.{k}"]["backward"]["score"]) for k in SPLIT] == \
        [(1.0, None)] * 3
    assert rules["gradients"]["score"] == 1.0
    assert [(r["layer"], r["backward_pinned"]) for r in ran["layers"]] == [(k, True) for k in SPLIT]
    graph = plan_graph(source)
    assert graph.gradient_device == "/GPU:1"
    backward = {g.key: g.device for g in graph.groups if g.key.endswith(B)}
    assert backward == {f"{k}{B}": "/GPU:1" for k in (*SPLIT, "other")}  # the head's too, beside its layer
    for name, pinning in PLACED.items():
        predicted = {f"{a} -> {b}": n for (a, b), n in bytes_crossing(graph, placement_of(graph, pinning)).items()}
        run = _train(tmp_path, name, pinning)
        measured = {p: n for p, n in pair_bytes(load_placement(run / "placement.json")).items() if n}
        assert predicted == measured, name

    # The plan of the run, trained: exact bytes and every pin obeyed, the gradients' among them.
    config = make_config("verify", cluster=CLUSTER, train=TRAIN, tracking=NO_TRACKING, placement=PLACEMENT,
                         path=tmp_path / "verify.yaml")
    vdir = tmp_path / "verify"
    assert main(["plan", str(source), "--objective", "balance", "--verify", "--config", str(config),
                 "--verify-out", str(vdir)]) == 0
    check = json.loads((vdir / "plan_check.json").read_text())
    assert check["bytes"]["exact"] is True
    assert check["conformance"]["score"] == 1.0 and check["conformance"]["deviations"] == []
    gradients = check["conformance"]["layers"][-1]
    assert (gradients["layer"], gradients["planned"], list(gradients["observed"])) == \
        ("pinning.gradients", check["pinning"]["gradients"], [check["pinning"]["gradients"]])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_keras_applications_model_with_pinned_gradients_is_planned_and_verified_exactly(tmp_path):
    """keras.applications.MobileNetV2 (alpha 0.35, 32x32) split at block 6 over two emulated GPUs,
    its backward pass pinned to /GPU:1: the plan keeps the gradients one piece, and its training
    sends the predicted bytes per pair and obeys every pin, the gradients' among them."""
    import os
    import subprocess
    import sys

    from tests.test_layer_patterns import SPLIT as BLOCKS
    from tests.test_replica_consistency import train_user_model

    ran = train_user_model(tmp_path, "mobilenet", strategy="none", train={
        "pinning": {"layers": BLOCKS, "gradients": "/GPU:1"}, "jit_compile": False})
    assert {r["rule"]: r["score"] for r in ran["conformance"]["rules"]}["gradients"] == 1.0
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}}
    r = subprocess.run([sys.executable, "-m", "pinpoint.cli", "plan", "run", "--objective", "balance", "--verify",
                        "--config", "cfg.yaml", "--verify-out", "verify"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=840)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    check = json.loads((tmp_path / "verify" / "plan_check.json").read_text())
    gradients = check["conformance"]["layers"][-1]
    assert (check["bytes"]["exact"], check["conformance"]["score"], check["conformance"]["deviations"],
            gradients["layer"], list(gradients["observed"])) == \
        (True, 1.0, [], "pinning.gradients", [check["pinning"]["gradients"]])
