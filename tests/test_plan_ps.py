"""The parameter-server plan on a real localhost cluster (a chief, a worker, four ps tasks): train
with TensorFlow's round-robin, then `pinpoint plan --verify` (plan from that run, train with the
plan's pinning, compare), and check the predicted bytes per server against the measured ones
(placement.json's transfers), both against the sums the model's sizes give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest
import yaml

from benchmarks.plan_ps import HIDDEN, WIDTH, train, write_model
from pinpoint.placement.model.files import read_placement
from pinpoint.placement.model.placement import Placement
from pinpoint.plan.servers import measured_ps_bytes

# A multi-process parameter-server cluster trained twice: the slow tier (pyproject markers).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVERS = [f"/job:ps/task:{i}/CPU:0" for i in range(4)]
FEATURES, CLASSES = 64, 10  # digits
# The model (benchmarks/plan_ps.py, the bench's plan section trains the same): HIDDEN equal
# Dense(WIDTH) layers and a head, two variables each (kernel, bias), so TensorFlow's round-robin
# over four servers puts every kernel on ps 0 or 2 and every bias on ps 1 or 3.


def _train(folder, name: str) -> dict:
    return read_placement(train(folder, name) / "placement.json")


def _round_robin_bytes() -> dict[str, int]:
    """By hand from the model: the variables in creation order (each layer's kernel, then its
    bias; then the optimizer's int64 step counter and its learning rate), variable i on server
    i mod 4. A step pulls each trainable variable and the counter and pushes as many bytes back;
    the learning rate is only read on the servers."""
    sizes = []
    for _ in range(HIDDEN):
        sizes += [4 * FEATURES * WIDTH, 4 * WIDTH]
    sizes += [4 * WIDTH * CLASSES, 4 * CLASSES, 8]  # head kernel, head bias, step counter
    out = dict.fromkeys(SERVERS, 0)
    for i, nbytes in enumerate(sizes):
        out[SERVERS[i % 4]] += 2 * nbytes
    return out


def _ratio(per_server: dict[str, int]) -> Fraction:
    return Fraction(max(per_server.values()) * len(per_server), sum(per_server.values()))


def _planned_bytes(layers: dict[str, str]) -> dict[str, int]:
    """By hand from the model and the plan's pins: each layer's kernel and bias on its pinned
    server; the step counter (variable 2 * HIDDEN + 2 in creation order) keeps its round-robin
    slot. A step pulls and pushes each of them once."""
    sizes = {f"h{i}": 4 * FEATURES * WIDTH + 4 * WIDTH for i in range(HIDDEN)}
    sizes["head"] = 4 * WIDTH * CLASSES + 4 * CLASSES
    out = dict.fromkeys(SERVERS, 0)
    for layer, server in layers.items():
        out[server] += 2 * sizes[layer]
    out[SERVERS[(2 * HIDDEN + 2) % 4]] += 2 * 8
    return out


def test_ps_plan_verified_balances_servers_and_predicts_their_bytes_exactly(tmp_path):
    """Round-robin trained, then `pinpoint plan --verify` through the real entry point: the plan
    trained on a second cluster, its bytes per server predicted on the round-robin run's graph
    and measured on the verification run's, equal server by server."""
    write_model(tmp_path)

    rr = measured_ps_bytes(Placement.from_json(_train(tmp_path, "rr")))
    assert rr == _round_robin_bytes()
    # ps 0 holds four hidden kernels and the head's: 2 * (4 * 16384 + 2560) of 271456 bytes a step.
    assert _ratio(rr) == Fraction(2 * (4 * 16384 + 2560) * 4, 271456)  # 2.0068x

    vdir = tmp_path / "planned"
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "plan", str(tmp_path / "rr"), "--verify",
                           "--config", str(tmp_path / "rr.yaml"), "--out", str(tmp_path / "plan.yaml"),
                           "--verify-out", str(vdir)],
                          check=False, capture_output=True, text=True, timeout=540,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    predicted = plan["prediction"]
    assert predicted["round_robin_ps"]["ps_bytes"] == rr
    assert predicted["measured"]["ps_bytes"] == rr
    layers = plan["pinning"]["layers"]
    assert sorted(layers) == sorted([f"h{i}" for i in range(HIDDEN)] + ["head"])
    expected = _planned_bytes(layers)
    # Largest first, each layer to the server carrying least: two hidden layers per server, the
    # head on top of one (the step counter's 8 bytes keep it off ps 2): 1.0574x.
    hidden, head = 4 * FEATURES * WIDTH + 4 * WIDTH, 4 * WIDTH * CLASSES + 4 * CLASSES
    assert max(expected.values()) == 2 * (2 * hidden + head)
    assert _ratio(expected) <= Fraction(110, 100)

    # plan_check.json: every server's predicted bytes are its measured bytes, and both are the
    # sums the model's sizes give for the plan.
    check = json.loads((vdir / "plan_check.json").read_text())
    assert {r["server"]: (r["predicted"], r["measured"], r["exact"]) for r in check["ps_bytes"]["servers"]} == \
        {d: (n, n, True) for d, n in expected.items()}
    ps = check["ps_bytes"]
    assert (ps["exact"], ps["predicted_total"], ps["measured_total"]) == (True, sum(expected.values()),
                                                                         sum(expected.values()))
    assert ps["predicted_largest_over_mean"] == ps["measured_largest_over_mean"] == round(float(_ratio(expected)), 4)
    # Bytes per pair: each server and the step's worker, half its bytes each way, exact; the
    # pairs outside the model (coordinator <-> worker, server <-> server) listed with their cause.
    worker = "/job:worker/task:0/CPU:0"
    halves = {f"{d} -> {worker}": n // 2 for d, n in expected.items()} | \
        {f"{worker} -> {d}": n // 2 for d, n in expected.items()}
    assert {r["pair"]: (r["predicted"], r["measured"]) for r in check["bytes"]["pairs"]} == \
        {p: (n, n) for p, n in halves.items()}
    assert check["bytes"]["exact"] is True
    outside = {tuple(sorted({d.split("/")[1] for d in r["pair"].split(" -> ")})) for r in check["bytes"]["outside_model"]}
    assert outside == {("job:chief", "job:worker"), ("job:ps",)}
    # Conformance: each layer's two variables on its planned server; the step is measured only.
    assert check["conformance"]["score"] == 1.0 and check["conformance"]["deviations"] == []
    assert check["step"]["predicted_ms"] is None and check["step"]["measured_ms"] > 0
    assert check["step"]["note"].startswith("parameter_server: a step runs as a closure")
    assert "bytes/step per server  predicted  measured" in proc.stdout
    assert f"largest server / mean: predicted {float(_ratio(expected)):.4f}x, measured " \
           f"{float(_ratio(expected)):.4f}x" in proc.stdout

    placement = read_placement(vdir / "placement.json")
    assert measured_ps_bytes(Placement.from_json(placement)) == expected
    for v in placement["variables"]:  # each layer's kernel and bias on its planned server
        layer = v["name"].split("/")[0]
        if layer in layers:
            assert v["devices"] == [layers[layer]], v
    assert placement["layer_pins"] == layers
    # Planned again from the verification run: its own assignment is the plan, predicted as measured.
    from pinpoint.cli import main

    assert main(["plan", str(vdir), "--out", str(tmp_path / "again.yaml")]) == 0
    again = yaml.safe_load((tmp_path / "again.yaml").read_text())
    assert again["algorithm"] == "as measured"
    # The verification folder's report: the plan section has the bytes of every server.
    from pinpoint.placement.report.html import write_report

    html = write_report(vdir)[0].read_text()
    plan_section = html.split('<section id="plan">')[1].split("</section>")[0]
    assert "Bytes each parameter server sends to and receives from the workers per step" in plan_section
    for server, n in expected.items():  # server, predicted, measured, exact
        assert f'<td>{server}</td><td class="num">{n}</td><td class="num">{n}</td><td>True</td>' in plan_section
    assert again["prediction"]["measured"]["ps_bytes"] == again["prediction"]["user"]["ps_bytes"] == expected
    assert again["prediction"]["round_robin_ps"]["ps_bytes"] == rr
    # Conformance scores a parameter-server layer pin by the layer's variables (two each).
    rules = {r["rule"]: r for r in placement["conformance"]["rules"]}
    assert {k: (rules[f"layers.{k}"]["relevant"], rules[f"layers.{k}"]["score"]) for k in layers} == \
        dict.fromkeys(layers, (2, 1.0))
