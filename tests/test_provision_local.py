"""Local task list: one process per task, TF_CONFIG on localhost ports."""

import json
import socket

import pytest

from pinpoint.errors import ProvisionError
from pinpoint.provision.local import LocalTask, free_ports, local_tasks
from tests.conftest import make_config

pytestmark = pytest.mark.unit


def _cfg(strategy, **cluster):
    return make_config("t", cluster=cluster, train={"strategy": strategy})


def test_multiworker_with_evaluator_keeps_evaluator_out_of_cluster():
    tasks = local_tasks(_cfg("multi_worker_mirrored", chief=1, workers=2, evaluator=1))
    assert [t.name for t in tasks] == ["chief:0", "worker:0", "worker:1", "evaluator:0"]
    ports = [t.port for t in tasks]
    assert len(set(ports)) == 4
    cluster = tasks[0].tf_config["cluster"]
    assert cluster == {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
    }
    for t in tasks:
        assert t.tf_config["cluster"] == cluster
        assert t.tf_config["task"] == {"type": t.role, "index": t.index}
        json.dumps(t.tf_config)  # must be JSON for the TF_CONFIG env var


def test_parameter_server_explicit_ports_in_task_order():
    tasks = local_tasks(_cfg("parameter_server", chief=1, workers=2, ps=1), ports=[5000, 5001, 5002, 5003])
    assert [(t.role, t.index, t.port) for t in tasks] == [
        ("chief", 0, 5000), ("worker", 0, 5001), ("worker", 1, 5002), ("ps", 0, 5003)]
    assert tasks[0].tf_config["cluster"]["ps"] == ["127.0.0.1:5003"]
    # The coordinator and the ps hold no replica; the workers compute on the spec's devices.
    assert [t.devices for t in tasks] == [("/CPU:0",), ("/GPU:0",), ("/GPU:0",), ("/CPU:0",)]
    assert list(tasks[0].tf_config["cluster"]) == ["chief", "ps", "worker"]


def test_ports_mapping_and_errors():
    cfg = _cfg("mirrored")
    (t,) = local_tasks(cfg, ports={"chief:0": 6000})
    assert t == LocalTask("chief", 0, {"cluster": {"chief": ["127.0.0.1:6000"]},
                                       "task": {"type": "chief", "index": 0}, "environment": "cloud"}, 6000,
                          ("/GPU:0",))
    with pytest.raises(ProvisionError, match="no port for chief:0"):
        local_tasks(cfg, ports={"worker:0": 1})
    with pytest.raises(ProvisionError, match="1 task"):
        local_tasks(cfg, ports=[1, 2])
    mw = _cfg("multi_worker_mirrored", chief=1, workers=1)
    with pytest.raises(ProvisionError, match="its own port"):
        local_tasks(mw, ports=[7000, 7000])


def test_free_ports_are_bindable_and_distinct():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
