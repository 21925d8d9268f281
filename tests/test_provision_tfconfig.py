"""TF_CONFIG tables: the exact JSON the Training Operator generates, and the plain flavour's
pod entry (podenv) reproducing it byte for byte."""

import json
import os
import subprocess
import sys

import pytest

from pinpoint.provision.manifests import build_manifests
from pinpoint.provision.podenv import tf_config_from_env
from pinpoint.provision.spec import build_tasks
from pinpoint.provision.tfconfig import training_tf_config
from tests.conftest import make_config


def _cfg(name, strategy, **cluster):
    return make_config(name, cluster=cluster, train={"strategy": strategy})


# (config, task, exact TF_CONFIG JSON as the operator's json.Marshal writes it)
TABLE = [
    (
        _cfg("demo", "mirrored", devices_per_worker=2),
        "chief:0",
        '{"cluster":{"chief":["demo-chief-0.default.svc:2222"]},"task":{"type":"chief","index":0},"environment":"cloud"}',
    ),
    (
        _cfg("mw", "multi_worker_mirrored", chief=1, workers=2, namespace="ml", port=3000, cluster_domain="cluster.local"),
        "worker:1",
        '{"cluster":{"chief":["mw-chief-0.ml.svc.cluster.local:3000"],'
        '"worker":["mw-worker-0.ml.svc.cluster.local:3000","mw-worker-1.ml.svc.cluster.local:3000"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}',
    ),
    (
        _cfg("ps", "parameter_server", chief=1, workers=2, ps=1),
        "ps:0",
        '{"cluster":{"chief":["ps-chief-0.default.svc:2222"],"ps":["ps-ps-0.default.svc:2222"],'
        '"worker":["ps-worker-0.default.svc:2222","ps-worker-1.default.svc:2222"]},'
        '"task":{"type":"ps","index":0},"environment":"cloud"}',
    ),
    (
        # The operator (since kubeflow/trainer#1146) lists the evaluator in the cluster dict.
        _cfg("ev", "multi_worker_mirrored", chief=1, workers=1, evaluator=1),
        "evaluator:0",
        '{"cluster":{"chief":["ev-chief-0.default.svc:2222"],"evaluator":["ev-evaluator-0.default.svc:2222"],'
        '"worker":["ev-worker-0.default.svc:2222"]},"task":{"type":"evaluator","index":0},"environment":"cloud"}',
    ),
    (
        _cfg("nochief", "multi_worker_mirrored", chief=0, workers=3),
        "worker:2",
        '{"cluster":{"worker":["nochief-worker-0.default.svc:2222","nochief-worker-1.default.svc:2222",'
        '"nochief-worker-2.default.svc:2222"]},"task":{"type":"worker","index":2},"environment":"cloud"}',
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize("cfg,task,expected", TABLE, ids=[t[0].name for t in TABLE])
def test_tf_config_table(cfg, task, expected):
    tasks = {t.name: t for t in build_tasks(cfg)}
    assert tasks[task].to_json()["tf_config_json"] == expected
    assert json.loads(expected) == tasks[task].tf_config
    role, index = task.split(":")
    assert tasks[task].host == json.loads(expected)["cluster"][role][int(index)]


@pytest.mark.unit
def test_task_order_and_replica_types():
    tasks = build_tasks(_cfg("p", "parameter_server", chief=1, workers=2, ps=2, evaluator=1))
    assert [(t.name, t.replica_type) for t in tasks] == [
        ("chief:0", "Chief"), ("worker:0", "Worker"), ("worker:1", "Worker"),
        ("ps:0", "PS"), ("ps:1", "PS"), ("evaluator:0", "Evaluator")]


@pytest.mark.unit
def test_training_tf_config_drops_only_the_evaluator():
    (ev,) = [t for t in build_tasks(_cfg("ev", "multi_worker_mirrored", workers=1, evaluator=1)) if t.role == "evaluator"]
    stripped = training_tf_config(ev.tf_config)
    assert set(stripped["cluster"]) == {"chief", "worker"}
    assert stripped["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" in ev.tf_config["cluster"]  # the original is untouched


def _plain_env(cfg, role):
    """The env a plain-flavour pod of `role` gets from its Job manifest (fieldRefs resolved by hand)."""
    # Multi-process manifests need the shared claim (a pod's own emptyDir would hold no checkpoint).
    plain = cfg.cluster.model_copy(update={"flavor": "plain", "runs_volume_claim": "runs-rwx"})
    files = build_manifests(cfg.model_copy(update={"cluster": plain}), build_tasks(cfg))
    (job,) = files[f"job-{role}.yaml"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}, container


@pytest.mark.unit
@pytest.mark.parametrize("cfg", [row[0] for row in TABLE], ids=[row[0].name for row in TABLE])
def test_plain_pods_rebuild_the_operator_tf_config_byte_for_byte(cfg):
    for task in build_tasks(cfg):
        env, container = _plain_env(cfg, task.role)
        env["PINPOINT_TASK_INDEX"] = str(task.index)  # the Indexed Job's completion index
        assert tf_config_from_env(env) == task.to_json()["tf_config_json"]
        assert container["command"][:4] == ["python", "-m", "pinpoint.provision.podenv", "--"]


@pytest.mark.unit
def test_podenv_bad_environment_is_one_line():
    with pytest.raises(ValueError, match="PINPOINT_TF_CLUSTER is not set"):
        tf_config_from_env({"PINPOINT_TASK_ROLE": "worker", "PINPOINT_TASK_INDEX": "0"})
    with pytest.raises(ValueError, match="outside the 2 'worker' tasks"):
        tf_config_from_env({"PINPOINT_TF_CLUSTER": '{"worker":["a:1","b:1"]}', "PINPOINT_TASK_ROLE": "worker",
                            "PINPOINT_TASK_INDEX": "2"})


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_podenv_execs_the_command_with_tf_config():
    cfg = TABLE[2][0]
    env, _ = _plain_env(cfg, "worker")
    env = {**os.environ, **env, "PINPOINT_TASK_INDEX": "1"}
    code = "import os; print(os.environ['TF_CONFIG'])"
    out = subprocess.run(
        [sys.executable, "-m", "pinpoint.provision.podenv", "--", sys.executable, "-c", code],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()
    expected = {t.name: t for t in build_tasks(cfg)}["worker:1"].to_json()["tf_config_json"]
    assert out == expected
    bad = subprocess.run([sys.executable, "-m", "pinpoint.provision.podenv", "--", "true"],
                         env={**os.environ, "PINPOINT_TASK_ROLE": "worker"}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "PINPOINT_TF_CLUSTER" in bad.stderr


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tensorflow_accepts_every_tf_config(monkeypatch):
    """TF's own resolver and validator read the operator-shaped and the local TF_CONFIGs."""
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    from pinpoint.provision.local import local_tasks

    for cfg, _, _ in TABLE:
        shapes = [(t.role, t.index, t.tf_config) for t in build_tasks(cfg)]
        shapes += [(t.role, t.index, t.tf_config) for t in local_tasks(cfg)]
        for role, index, tf_config in shapes:
            monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
            resolver = TFConfigClusterResolver()
            assert (resolver.task_type, resolver.task_id) == (role, index)
            spec = resolver.cluster_spec()
            assert spec.as_dict() == {k: v for k, v in tf_config["cluster"].items()}
            multi_worker_util._validate_cluster_spec(spec, role, index)
