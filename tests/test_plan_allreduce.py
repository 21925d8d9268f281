"""`pinpoint plan` of a mirrored run: the train.all_reduce choice, priced by the link model.

Unit: each choice's bytes per device pair and its time on the link model, from the sizes of a
Dense stack's variables; the choices the config refuses on a cluster are refused with the
config's own line and never planned. Integration: a real MirroredStrategy MLP on 2 emulated GPUs
(in this process) and on 4 (a fresh process): the plan made from a reduce_to_host run predicts
the bytes per ordered device pair of the choices trained afterwards exactly, pair by pair."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from pinpoint.cli import main
from pinpoint.placement.model.files import load_placement
from pinpoint.placement.model.placement import Placement
from pinpoint.plan.allreduce import AllReduceCase, all_reduce_us, refusal, section, send_pairs
from pinpoint.plan.links import LinkModel
from tests.conftest import NO_TRACKING, make_config

# A Dense stack 64 -> 128 -> 64 -> 10 (the built-in mlp on the digits), float32: a kernel and a
# bias per layer, each a gradient of the same bytes.
WIDTHS = (64, 128, 64, 10)
GRADS = tuple(n for a, b in zip(WIDTHS, WIDTHS[1:], strict=False) for n in (a * b * 4, b * 4))
G = sum(GRADS)
GPUS4 = ("/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3")


def _case(replicas=GPUS4, base=None) -> AllReduceCase:
    return AllReduceCase(tuple(replicas), "/CPU:0", GRADS, True, "reduce_to_host", base or {}, None)


@pytest.mark.unit
def test_reduce_to_host_sends_every_gradient_to_the_host_and_back_from_each_replica():
    assert send_pairs("reduce_to_host", _case()) == {
        **{(d, "/CPU:0"): G for d in GPUS4}, **{("/CPU:0", d): G for d in GPUS4}}


@pytest.mark.unit
def test_hierarchical_copy_on_four_replicas_is_six_copies_of_the_packed_gradients_through_the_halves():
    g0, g1, g2, g3 = GPUS4
    assert send_pairs("hierarchical_copy", _case()) == {
        (g1, g0): G, (g3, g2): G,  # each half summed on its first device
        (g2, g0): G, (g0, g2): G,  # the halves' sums meet on /GPU:0, the total goes back
        (g0, g1): G, (g2, g3): G,  # each first device to the rest of its half
    }


@pytest.mark.unit
def test_ring_sends_only_the_collectives_instance_key_from_the_host_the_exchange_is_inside_the_op():
    from pinpoint.plan.allreduce import collective_inputs, collective_pairs

    case = _case()
    assert (send_pairs("ring", case), collective_inputs("ring", case), collective_pairs("ring", case)) == (
        {("/CPU:0", d): 4 for d in GPUS4}, dict.fromkeys(GPUS4, G),
        {(GPUS4[i], GPUS4[(i + 1) % 4]): round(2 * 3 * G / 4) for i in range(4)})


@pytest.mark.unit
def test_each_choice_is_priced_by_the_link_model_stage_by_stage():
    """PCIe (10 us + bytes / 12 GB/s) on every pair of 4 GPUs and the host: reduce_to_host pays a
    transfer per tensor up and down; hierarchical_copy four stages of the packed gradients; the
    ring 2(n-1) rounds of a quarter of them."""
    links = LinkModel()
    pcie = links.pcie
    case = _case()
    assert {c: round(all_reduce_us(c, case, links), 6) for c in ("reduce_to_host", "hierarchical_copy", "ring")} == {
        "reduce_to_host": round(2 * sum(pcie.transfer_us(g) for g in GRADS), 6),
        "hierarchical_copy": round(4 * pcie.transfer_us(G), 6),
        "ring": round(6 * pcie.transfer_us(math.ceil(G / 4)), 6),
    }


@pytest.mark.unit
def test_a_choice_the_config_refuses_on_the_cluster_is_refused_with_the_configs_line_and_never_planned():
    """3 emulated GPUs: hierarchical_copy would drop the last replica and NCCL needs real GPUs."""
    from pinpoint.config import config_from_dict
    from pinpoint.errors import ConfigError

    case = _case(GPUS4[:3])
    lines = {}
    for choice in ("hierarchical_copy", "nccl"):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"name": "x", "cluster": {"devices_per_worker": 3, "emulate": True},
                              "train": {"strategy": "mirrored", "all_reduce": choice}})
        lines[choice] = str(err.value)
    doc = section(case, LinkModel())
    assert (doc["all_reduce_plan"]["refused"], doc["all_reduce"], sorted(doc["all_reduce_plan"]["prediction"])) == (
        lines, "ring", ["measured", "plan", "reduce_to_host", "ring"])
    assert lines["hierarchical_copy"] == (
        "train.all_reduce: got 'hierarchical_copy'; hierarchical_copy reduces two equal halves of the devices and "
        "drops the last one of 3; use an even cluster.devices_per_worker, ring or reduce_to_host")


@pytest.mark.unit
def test_nccl_is_a_choice_only_on_real_gpus():
    real = AllReduceCase(GPUS4[:2], "/CPU:0", GRADS, False, "nccl", {}, None)
    assert (refusal("nccl", real), refusal("nccl", _case(GPUS4[:2]))) == (
        None, "train.all_reduce: got 'nccl'; NCCL needs real GPUs; emulated GPUs are CPU devices: use ring (what "
        "NCCL's exchange is emulated with) or auto, or set cluster.emulate: false on a GPU machine")


# ---- integration: real MirroredStrategy on emulated GPUs ---------------------------------------
BATCH = 32
TRAIN = {"strategy": "mirrored", "model": "mlp", "steps": 8, "batch_size": BATCH, "learning_rate": 0.05,
         "log_every": 2, "checkpoint_every": 0, "jit_compile": False, "all_reduce": "reduce_to_host"}
PLACEMENT = {"warmup_steps": 2, "sample_steps": 2, "timing": True}


def _gradient_bytes(placement: dict) -> int:
    return sum(v["bytes"] for v in placement["variables"] if v["class"] == "trainable")


@pytest.fixture(scope="module")
def source(tmp_path_factory, tf):
    """A mirrored MLP on 2 emulated GPUs all-reduced through the host (reduce_to_host)."""
    from pinpoint.training.command import train_command

    run = tmp_path_factory.mktemp("allreduce") / "source"
    cfg = make_config("ar-src", cluster={"devices_per_worker": 2, "emulate": True}, train=TRAIN,
                      tracking=NO_TRACKING, placement=PLACEMENT)
    assert train_command(cfg, run) == 0
    return run


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_plan_predicts_the_bytes_per_pair_of_the_choices_trained_after_it_exactly(source, tmp_path, capsys):
    """Planned from the reduce_to_host run, verified: ring (the link model's choice on 2 GPUs) and
    hierarchical_copy, each trained; both runs' transfers matrices are the prediction, pair by
    pair, and differ from the source run's by the formulas of the two choices."""
    from pinpoint.plan.verify import pair_bytes
    from pinpoint.training.command import train_command

    config = make_config("ar-verify", cluster={"devices_per_worker": 2, "emulate": True}, train=TRAIN,
                         tracking=NO_TRACKING, placement=PLACEMENT, path=tmp_path / "verify.yaml")
    vdir = tmp_path / "verify"
    capsys.readouterr()
    assert main(["plan", str(source), "--verify", "--config", str(config), "--verify-out", str(vdir)]) == 0
    printed = capsys.readouterr().out
    doc = yaml.safe_load((vdir / "plan.yaml").read_text())
    check = json.loads((vdir / "plan_check.json").read_text())
    assert (doc["all_reduce_plan"]["measured"], doc["all_reduce"], check["all_reduce"]["ran"]) == (
        "reduce_to_host", "ring", "ring")
    assert check["bytes"]["exact"] is True
    assert {r["pair"]: r["measured"] for r in check["bytes"]["pairs"]} == \
        doc["all_reduce_plan"]["prediction"]["ring"]["bytes_crossing"]
    # What the matrix cannot see is named, and what is compared instead matches: each replica's
    # collective input is the packed gradients.
    src = json.loads((source / "placement.json").read_text())
    g = _gradient_bytes(src)
    assert check["all_reduce"]["collective_inputs"] == {
        "predicted": {"/GPU:0": g, "/GPU:1": g}, "measured": {"/GPU:0": g, "/GPU:1": g}, "exact": True}
    assert "inside its collective op" in check["all_reduce"]["compared"]
    assert "(exact)" in printed and "train.all_reduce: planned ring, ran ring" in printed

    # A second choice, trained: its measured pairs are the source plan's hierarchical_copy row.
    hier = tmp_path / "hier"
    cfg = make_config("ar-hier", cluster={"devices_per_worker": 2, "emulate": True},
                      train=dict(TRAIN, all_reduce="hierarchical_copy"), tracking=NO_TRACKING, placement=PLACEMENT)
    assert train_command(cfg, hier) == 0
    measured = {p: n for p, n in pair_bytes(load_placement(hier / "placement.json")).items() if n}
    assert measured == doc["all_reduce_plan"]["prediction"]["hierarchical_copy"]["bytes_crossing"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_change_between_two_choices_is_the_difference_of_their_formulas(source, tmp_path):
    """The source run (reduce_to_host) and a ring run, measured: every pair moves by exactly what
    the two patterns give for the variables' bytes (2 GPUs: G each way between a replica and the
    host for reduce_to_host; the ring's 4-byte instance key to each replica)."""
    from pinpoint.plan.verify import pair_bytes
    from pinpoint.training.command import train_command

    ring = tmp_path / "ring"
    cfg = make_config("ar-ring", cluster={"devices_per_worker": 2, "emulate": True},
                      train=dict(TRAIN, all_reduce="ring"), tracking=NO_TRACKING, placement=PLACEMENT)
    assert train_command(cfg, ring) == 0
    before = pair_bytes(load_placement(source / "placement.json"))
    after = pair_bytes(load_placement(ring / "placement.json"))
    g = _gradient_bytes(json.loads((source / "placement.json").read_text()))
    assert g == G  # the built-in mlp is the Dense stack of the unit tests
    delta = {p: after.get(p, 0) - before.get(p, 0) for p in set(before) | set(after)}
    assert {p: n for p, n in delta.items() if n} == {
        "/GPU:0 -> /CPU:0": -g, "/GPU:1 -> /CPU:0": -g, "/CPU:0 -> /GPU:0": 4 - g, "/CPU:0 -> /GPU:1": 4 - g}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_verifying_with_a_config_on_another_replica_count_is_one_line(source, tmp_path, capsys):
    config = make_config("ar-v3", cluster={"devices_per_worker": 3, "emulate": True}, train=TRAIN,
                         tracking=NO_TRACKING, path=tmp_path / "c3.yaml")
    vdir = tmp_path / "v"
    capsys.readouterr()
    assert main(["plan", str(source), "--verify", "--config", str(config), "--verify-out", str(vdir),
                 "--out", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err == (
        f"pinpoint: cluster.devices_per_worker: got 3 in {config}, but the plan is for 2 replicas (/GPU:0, /GPU:1); "
        "set devices_per_worker: 2\n")
    assert not vdir.exists() and not (tmp_path / "p.yaml").exists()


def _cli(*argv, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return subprocess.run([sys.executable, "-m", "pinpoint.cli", *argv], check=False, capture_output=True, text=True,
                          env=env, timeout=280, cwd=cwd)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_replicas_plan_hierarchical_copy_and_its_bytes_per_pair_are_measured_exactly(tmp_path):
    """4 emulated GPUs (fresh processes: the in-process tests have 2). From a reduce_to_host run
    the link model picks hierarchical_copy (4 PCIe stages of the packed gradients beat the ring's
    6 rounds of a quarter: latency dominates these 67 KiB); trained, its matrix is the prediction."""
    cfg = make_config("ar-four", cluster={"devices_per_worker": 4, "emulate": True}, train=TRAIN,
                      tracking=NO_TRACKING, placement=PLACEMENT, path=tmp_path / "c.yaml")
    proc = _cli("train", str(cfg), "--out", str(tmp_path / "src"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _cli("plan", str(tmp_path / "src"), "--verify", "--config", str(cfg), "--verify-out", str(tmp_path / "v"),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = json.loads((tmp_path / "v" / "plan_check.json").read_text())
    g = _gradient_bytes(json.loads((tmp_path / "src" / "placement.json").read_text()))
    links = LinkModel()
    assert 4 * links.pcie.transfer_us(g) < 6 * links.pcie.transfer_us(math.ceil(g / 4))  # why it wins
    assert (check["all_reduce"]["planned"], check["all_reduce"]["ran"], check["bytes"]["exact"]) == (
        "hierarchical_copy", "hierarchical_copy", True)
    src = json.loads((tmp_path / "src" / "placement.json").read_text())
    it = next(v["bytes"] for v in src["variables"] if v["name"].endswith("/iteration"))
    between = {r["pair"]: r["measured"] for r in check["bytes"]["pairs"] if r["pair"].count("GPU") == 2}
    # The 6 copies of the packed gradients, and the optimizer's step counter from /GPU:0 to each
    # other replica (its update, as in every mirrored run).
    assert {p: n for p, n in between.items() if n} == {
        "/GPU:1 -> /GPU:0": g, "/GPU:3 -> /GPU:2": g, "/GPU:2 -> /GPU:0": g, "/GPU:0 -> /GPU:2": g + it,
        "/GPU:0 -> /GPU:1": g + it, "/GPU:2 -> /GPU:3": g, "/GPU:0 -> /GPU:3": it}


@pytest.mark.unit
def test_cpu_replicas_sharing_the_hosts_memory_keep_the_runs_own_choice():
    """Two CPU replicas, the first the host: every link is one memory (free), and reduce_to_host
    and hierarchical_copy move the same copies, so nothing is gained by a change."""
    cpus = AllReduceCase(("/CPU:0", "/CPU:1"), "/CPU:0", GRADS, False, "reduce_to_host", {}, None)
    doc = section(cpus, LinkModel())
    assert (doc["all_reduce"], send_pairs("hierarchical_copy", cpus)) == (
        "reduce_to_host", {("/CPU:1", "/CPU:0"): G, ("/CPU:0", "/CPU:1"): G})


def _placement(matrix: dict, unsized: int = 0) -> Placement:
    """A mirrored run's placement.json as case_of reads it: 2 emulated GPUs, the Dense stack's
    variables, a transfers matrix."""
    rows = {}
    for (a, b), n in matrix.items():
        rows.setdefault(a, {})[b] = {"count": 1, "bytes": n}
    return Placement.from_json({
        "strategy": "mirrored", "device_aliases": {"/GPU:0": "/CPU:1", "/GPU:1": "/CPU:2"},
        "device_map": {"spec_replica_devices": ["/GPU:0", "/GPU:1"], "host": "/CPU:0", "emulated": True},
        "variables": [{"name": f"v{i}", "bytes": g, "class": "trainable"} for i, g in enumerate(GRADS)],
        "op_types_by_device": {}, "transfers": {"matrix": rows, "per_step": {"unsized": unsized}}})


@pytest.mark.unit
def test_a_runs_own_all_reduce_is_taken_out_of_its_matrix_and_a_short_pair_is_named():
    """reduce_to_host measured with two bias gradients (the last layer's: 40 B) unsized on the way
    up from /GPU:0: the rest of that pair is unknown, taken as 0 and named; the other pairs keep
    their traffic beside the all-reduce (the batch down, the loss sums up)."""
    from pinpoint.plan.allreduce import case_of

    bias = WIDTHS[-1] * 4
    measured = {("/CPU:0", "/GPU:0"): 4168 + G, ("/CPU:0", "/GPU:1"): 4160 + G,
                ("/GPU:0", "/CPU:0"): 16 + G - bias, ("/GPU:1", "/CPU:0"): 8 + G}
    case = case_of(_placement(measured, unsized=1))
    assert (case.measured, case.base, case.short_pairs) == (
        "reduce_to_host", {("/CPU:0", "/GPU:0"): 4168, ("/CPU:0", "/GPU:1"): 4160, ("/GPU:1", "/CPU:0"): 8},
        ("/GPU:0 -> /CPU:0",))


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_strategy_none_config_verifies_the_mirrored_runs_layer_plan_instead(source, tmp_path):
    """The plan of a mirrored run holds both: with strategy none, --verify trains its layers."""
    train = {k: v for k, v in TRAIN.items() if k != "all_reduce"}
    config = make_config("ar-none", cluster={"devices_per_worker": 2, "emulate": True},
                         train=dict(train, strategy="none"), tracking=NO_TRACKING, placement=PLACEMENT,
                         path=tmp_path / "none.yaml")
    vdir = tmp_path / "v"
    assert main(["plan", str(source), "--objective", "balance", "--verify", "--config", str(config),
                 "--verify-out", str(vdir), "--out", str(tmp_path / "p.yaml")]) == 0
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    check = json.loads((vdir / "plan_check.json").read_text())
    assert ("all_reduce" in check, check["pinning"]["layers"], doc["all_reduce"]) == (
        False, doc["pinning"]["layers"], "ring")
