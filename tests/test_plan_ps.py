"""The parameter-server plan on a real localhost cluster (a chief, a worker, four ps tasks): train
with TensorFlow's round-robin, plan from that run, train with the plan's pinning, and compare the
predicted bytes per server with the measured ones (placement.json's transfers)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from benchmarks.plan_ps import HIDDEN, WIDTH, train, write_model
from pinpoint.placement.files import read_placement
from pinpoint.plan.servers import measured_ps_bytes

# A multi-process parameter-server cluster trained three times: the slow tier (pyproject markers).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVERS = [f"/job:ps/task:{i}/CPU:0" for i in range(4)]
FEATURES, CLASSES = 64, 10  # digits
# The model (benchmarks/plan_ps.py, the bench's plan section trains the same): HIDDEN equal
# Dense(WIDTH) layers and a head, two variables each (kernel, bias), so TensorFlow's round-robin
# over four servers puts every kernel on ps 0 or 2 and every bias on ps 1 or 3.


def _train(folder, name: str, layers: dict | None = None) -> dict:
    return read_placement(train(folder, name, layers) / "placement.json")


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


def test_ps_plan_balances_servers_and_predicts_their_bytes_exactly(tmp_path):
    write_model(tmp_path)

    rr = measured_ps_bytes(_train(tmp_path, "rr"))
    assert rr == _round_robin_bytes()
    # ps 0 holds four hidden kernels and the head's: 2 * (4 * 16384 + 2560) of 271456 bytes a step.
    assert _ratio(rr) == Fraction(2 * (4 * 16384 + 2560) * 4, 271456)  # 2.0068x

    from pinpoint.cli import main

    assert main(["plan", str(tmp_path / "rr"), "--out", str(tmp_path / "plan.yaml")]) == 0
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    predicted = plan["prediction"]
    assert predicted["round_robin_ps"]["ps_bytes"] == rr
    assert predicted["measured"]["ps_bytes"] == rr
    layers = plan["pinning"]["layers"]
    assert sorted(layers) == sorted([f"h{i}" for i in range(HIDDEN)] + ["head"])

    placement = _train(tmp_path, "planned", layers)
    measured = measured_ps_bytes(placement)
    assert measured == predicted["plan"]["ps_bytes"]
    assert _ratio(measured) <= Fraction(110, 100)
    # Largest first, each layer to the server carrying least: two hidden layers per server, the
    # head on top of one (the step counter's 8 bytes keep it off ps 2): 1.0574x.
    hidden, head = 4 * FEATURES * WIDTH + 4 * WIDTH, 4 * WIDTH * CLASSES + 4 * CLASSES
    assert max(measured.values()) == 2 * (2 * hidden + head)
    for v in placement["variables"]:  # each layer's kernel and bias on its planned server
        layer = v["name"].split("/")[0]
        if layer in layers:
            assert v["devices"] == [layers[layer]], v
    assert placement["layer_pins"] == layers
    # Planned again from the planned run: its own assignment is the plan, predicted as measured.
    assert main(["plan", str(tmp_path / "planned"), "--out", str(tmp_path / "again.yaml")]) == 0
    again = yaml.safe_load((tmp_path / "again.yaml").read_text())
    assert again["algorithm"] == "as measured"
    assert again["prediction"]["measured"]["ps_bytes"] == again["prediction"]["user"]["ps_bytes"] == measured
    assert again["prediction"]["round_robin_ps"]["ps_bytes"] == rr
    # Conformance scores a parameter-server layer pin by the layer's variables (two each).
    rules = {r["rule"]: r for r in placement["conformance"]["rules"]}
    assert {k: (rules[f"layers.{k}"]["relevant"], rules[f"layers.{k}"]["score"]) for k in layers} == \
        dict.fromkeys(layers, (2, 1.0))
