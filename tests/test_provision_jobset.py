"""The jobset and trainjob flavours' manifests, validated offline and strictly (unknown fields are
errors) against the real CRD schemas in ../shared/schemas: JobSet v0.9.1 (commit acea4e18c8d0)
and Kubeflow Trainer v2.3.0 (commit 658725bdae5c); the pod templates and child Jobs inside
against the Kubernetes OpenAPI (kubernetes-validate, strict). Plus what each field is for: the
DNS names TF_CONFIG uses, the failure/success/startup policies, gang admission, the runtime."""

import copy
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pinpoint.config import STRATEGIES, config_from_dict
from pinpoint.errors import ProvisionError
from pinpoint.provision.manifests import build_manifests, dump
from pinpoint.provision.podenv import tf_config_from_env
from pinpoint.provision.spec import build_tasks
from tests.test_provision_manifests import IMAGE, K8S_VERSION, TOPOLOGIES, _cfg, _strict

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent
SCHEMAS = HERE.parent.parent / "shared" / "schemas"


def _validator(file: str, version: str) -> jsonschema.Draft7Validator:
    for folder in (HERE / "data" / "provision", SCHEMAS):
        if (folder / file).is_file():
            crd = yaml.safe_load((folder / file).read_text())
            (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
            return jsonschema.Draft7Validator(_strict(v["schema"]["openAPIV3Schema"]))
    raise FileNotFoundError(f"{file}: not in tests/data/provision/ nor ../shared/schemas/")


@pytest.fixture(scope="module")
def validators():
    return {
        "JobSet": _validator("jobset.x-k8s.io_jobsets.yaml", "v1alpha2"),
        "TrainJob": _validator("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
        "ClusterTrainingRuntime": _validator("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1"),
    }


def _docs(cfg, run_rel=None):
    files = build_manifests(cfg, build_tasks(cfg), run_rel=run_rel)
    return {name: list(yaml.safe_load_all(dump(docs))) for name, docs in files.items()}


def _check(doc, validators):
    errors = sorted(validators[doc["kind"]].iter_errors(doc), key=str) if doc["kind"] in validators else []
    assert not errors, errors[0]


def _validate_jobset_spec(spec):
    """Every child Job as a batch/v1 Job (its pod template included), strictly."""
    for rjob in spec["replicatedJobs"]:
        kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                                      "spec": rjob["template"]["spec"]}, K8S_VERSION, strict=True)


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_manifests_validate_against_real_schemas(flavor, topology, validators):
    strategy, cluster = TOPOLOGIES[topology]
    if flavor == "trainjob" and topology in ("ps", "multiworker"):  # refused: the roles' GPUs differ (below)
        cluster = {**cluster, "emulate": True, "gpu_type": None}
    files = _docs(_cfg(flavor, strategy, **cluster), run_rel="team/sweep/variant-a")
    kinds = sorted(d["kind"] for docs in files.values() for d in docs)
    assert kinds == sorted(["ConfigMap", "JobSet" if flavor == "jobset" else "TrainJob"])
    for docs in files.values():
        for doc in docs:
            _check(doc, validators)
            if doc["kind"] == "ConfigMap":
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            if doc["kind"] == "JobSet":
                _validate_jobset_spec(doc["spec"])


def test_the_runtime_validates_and_docker_runtime_yaml_is_the_generators_output(validators):
    from pinpoint.provision.trainjob import runtime, runtime_yaml

    doc = yaml.safe_load(runtime_yaml())
    assert doc == runtime()
    _check(doc, validators)
    _validate_jobset_spec(doc["spec"]["template"]["spec"])
    shipped = (HERE.parent / "docker" / "runtime.yaml").read_text()
    assert shipped == runtime_yaml(), (
        "docker/runtime.yaml drifted; regenerate: .venv/bin/python -c \"from pinpoint.provision.trainjob import "
        "runtime_yaml; open('docker/runtime.yaml', 'w').write(runtime_yaml())\"")


def test_validators_reject_a_typo(validators):
    """Negative control: the strict CRD validators really look at field names."""
    (js,) = _docs(_cfg("jobset", workers=2))["jobset.yaml"]
    bad = copy.deepcopy(js)
    bad["spec"]["failurePolicy"]["maxRestart"] = 3
    assert list(validators["JobSet"].iter_errors(bad))
    bad = copy.deepcopy(js)
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert list(validators["JobSet"].iter_errors(bad))
    (tj,) = _docs(_cfg("trainjob", workers=2))["trainjob.yaml"]
    bad = copy.deepcopy(tj)
    bad["spec"]["trainer"]["numNode"] = 2
    assert list(validators["TrainJob"].iter_errors(bad))


# ---- the JobSet -------------------------------------------------------------------------------------
def test_one_replicated_job_per_role_and_the_failure_policy():
    cfg = _cfg("jobset", "multi_worker_mirrored", chief=1, workers=3, evaluator=1)
    (js,) = _docs(cfg)["jobset.yaml"]
    spec = js["spec"]
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert [(r["name"], r["replicas"], r["template"]["spec"]["completions"], r["template"]["spec"]["parallelism"])
            for r in spec["replicatedJobs"]] == [("chief", 1, 1, 1), ("worker", 1, 3, 3), ("evaluator", 1, 1, 1)]
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "job", "publishNotReadyAddresses": True}
    # The whole group restarts on a retryable exit (BackoffLimitExceeded with backoffLimit 0), up to
    # train.max_restarts; permanent exits (PodFailurePolicy) and deadlines fail it.
    assert spec["failurePolicy"] == {
        "maxRestarts": 3, "restartStrategy": "BlockingRecreate",
        "rules": [
            {"name": "permanentExit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            {"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
            {"name": "retryableExit", "action": "RestartJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]},
        ]}
    for rjob in spec["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert (job["completionMode"], job["backoffLimit"], job["activeDeadlineSeconds"]) == ("Indexed", 0, 86400)
        assert job["podFailurePolicy"]["rules"] == [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                                  "values": list(range(1, 128))}},
        ]
        assert job["template"]["spec"]["restartPolicy"] == "Never"
        assert "subdomain" not in job["template"]["spec"]  # the JobSet sets it
    # Done when the chief is: the evaluator is not waited for.
    assert spec["successPolicy"] == {"operator": "Any", "targetReplicatedJobs": ["chief"]}
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert "startupPolicy" not in spec
    assert js["metadata"]["labels"] == {"app.kubernetes.io/name": "pinpoint", "app.kubernetes.io/instance": "job",
                                        "app.kubernetes.io/managed-by": "pinpoint"}


def test_without_a_chief_every_worker_must_succeed():
    (js,) = _docs(_cfg("jobset", "multi_worker_mirrored", chief=0, workers=3))["jobset.yaml"]
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker"]}


def test_parameter_server_starts_the_ps_first():
    (js,) = _docs(_cfg("jobset", "parameter_server", chief=1, workers=2, ps=2))["jobset.yaml"]
    assert js["spec"]["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["ps", "worker", "chief"]


def test_pods_get_tf_config_from_the_jobsets_dns_names():
    cfg = _cfg("jobset", "multi_worker_mirrored", chief=1, workers=2, evaluator=1, namespace="team-a",
               cluster_domain="cluster.local")
    (js,) = _docs(cfg)["jobset.yaml"]
    tasks = {t.name: t for t in build_tasks(cfg)}
    host = "{r}-0-{i}.job.team-a.svc.cluster.local:2222"
    assert tasks["worker:1"].tf_config["cluster"] == {
        "chief": ["job-" + host.format(r="chief", i=0)], "evaluator": ["job-" + host.format(r="evaluator", i=0)],
        "worker": ["job-" + host.format(r="worker", i=0), "job-" + host.format(r="worker", i=1)]}
    for rjob in js["spec"]["replicatedJobs"]:
        (c,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        index_ref = next(e for e in c["env"] if e["name"] == "PINPOINT_TASK_INDEX")["valueFrom"]["fieldRef"]
        assert index_ref == {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
        for i in range(rjob["template"]["spec"]["completions"]):
            # The pod's entry point rebuilds exactly the task's TF_CONFIG from its completion index.
            got = tf_config_from_env({**env, "PINPOINT_TASK_INDEX": str(i)})
            assert got == tasks[f"{rjob['name']}:{i}"].to_json()["tf_config_json"]


def test_deadline_ttl_secrets_claim_and_pull_secrets_as_today():
    cfg = _cfg("jobset", workers=1, deadline_s=7200, ttl_after_finished_s=0, mlflow_secret="team-mlflow",
               image_pull_secrets=["regcred"])
    (js,) = _docs(cfg, run_rel="team/run-1")["jobset.yaml"]
    assert js["spec"]["ttlSecondsAfterFinished"] == 0
    for rjob in js["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        pod = job["template"]["spec"]
        (c,) = pod["containers"]
        assert job["activeDeadlineSeconds"] == 7200
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "runs-rwx"}} in pod["volumes"]
        assert {"name": "runs", "mountPath": "/runs/team/run-1", "subPath": "team/run-1"} in c["volumeMounts"]
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs == {"team-mlflow"}


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
def test_gang_kueue_admits_every_role_together(flavor, validators):
    """One object holds every role, so the plain flavour's single-role limit does not apply."""
    cfg = _cfg(flavor, "multi_worker_mirrored", chief=1, workers=2, evaluator=1, gang="kueue", queue="team-queue",
               emulate=True, gpu_type=None)
    (doc,) = _docs(cfg)[f"{flavor}.yaml"]
    _check(doc, validators)
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
def test_gang_operator_is_the_training_operators_only(flavor):
    from pinpoint.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^cluster.gang: got 'operator'; .*flavor {flavor} has none"):
        _cfg(flavor, gang="operator", queue="q")


# ---- the TrainJob and its runtime -----------------------------------------------------------------
def test_trainjob_names_the_runtime_and_sets_the_per_run_parts():
    cfg = _cfg("trainjob", "multi_worker_mirrored", chief=1, workers=2, evaluator=1, namespace="team-a",
               emulate=True, gpu_type=None, image_pull_secrets=["regcred"])
    (tj,) = _docs(cfg, run_rel="r1")["trainjob.yaml"]
    spec = tj["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                  "name": "pinpoint-tensorflow"}
    assert spec["trainer"]["numNodes"] == 4 and spec["trainer"]["image"] == IMAGE
    assert spec["trainer"]["command"][-4:] == ["--out", "/runs/r1", "--task", "{task}"]
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["name"] == "node" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "runs-rwx"}} in pod["volumes"]


def test_trainjob_pods_rebuild_tf_config_from_the_runtimes_jobset_names():
    """Trainer names the JobSet like the TrainJob and its pods '<trainjob>-node-0-<k>.<trainjob>'
    (IdentifyPodNetwork); task k of the layout is completion index k."""
    from pinpoint.provision.trainjob import runtime

    cfg = _cfg("trainjob", "multi_worker_mirrored", chief=1, workers=2, evaluator=1, namespace="team-a",
               emulate=True, gpu_type=None)
    tasks = build_tasks(cfg)
    assert [t.host for t in tasks] == [f"job-node-0-{k}.job.team-a.svc:2222" for k in range(4)]
    (tj,) = _docs(cfg)["trainjob.yaml"]
    env = {e["name"]: e["value"] for e in tj["spec"]["trainer"]["env"] if "value" in e}
    (rjob,) = runtime()["spec"]["template"]["spec"]["replicatedJobs"]
    (c,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    assert {e["name"] for e in c["env"]} >= {"PINPOINT_TASK_INDEX"}
    for k, task in enumerate(tasks):
        got = json.loads(tf_config_from_env({**env, "PINPOINT_TASK_INDEX": str(k)}))
        assert got == task.tf_config


def test_trainjob_refuses_roles_with_different_gpus_and_restarts_above_the_runtimes():
    with pytest.raises(ProvisionError, match=r"^cluster.flavor: got trainjob.*\(chief 0, worker 4, ps 0\); use flavor: jobset"):
        _docs(_cfg("trainjob", "parameter_server", chief=1, workers=2, ps=1, devices_per_worker=4))
    with pytest.raises(ProvisionError, match=r"^train.max_restarts: got 11; the pinpoint-tensorflow runtime"):
        _docs(_cfg("trainjob", train_extra={"max_restarts": 11}))


def test_provision_runtime_writes_the_runtime(tmp_path):
    from pinpoint.provision import provision
    from pinpoint.provision.trainjob import runtime_yaml

    cfg = config_from_dict({"name": "job", "cluster": {"workers": 1, "flavor": "trainjob", "runs_volume_claim": "rwx"},
                            "train": {"strategy": "multi_worker_mirrored"}})
    summary = provision(cfg, tmp_path / "run", runtime=True)
    assert summary["runtime"] == str(tmp_path / "run" / "runtime.yaml")
    assert (tmp_path / "run" / "runtime.yaml").read_text() == runtime_yaml()
    assert sorted(p.name for p in (tmp_path / "run" / "manifests").iterdir()) == ["configmap.yaml", "trainjob.yaml"]
    assert "runtime.yaml" not in summary["manifests"]  # cluster-scoped: an admin applies it once


@pytest.mark.parametrize("flavor", ["jobset", "trainjob"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_validates(flavor, strategy, validators):
    """Every strategy, in the smallest topology it accepts (multi-process ones with an evaluator)."""
    multi = strategy in ("multi_worker_mirrored", "parameter_server")
    cluster = {"workers": 2, "evaluator": 1, **({"ps": 1} if strategy == "parameter_server" else {})} if multi \
        else {"workers": 0, "devices_per_worker": 2}
    files = _docs(_cfg(flavor, strategy, emulate=True, gpu_type=None, **cluster))
    (doc,) = files[f"{flavor}.yaml"]
    _check(doc, validators)
    if flavor == "jobset":
        _validate_jobset_spec(doc["spec"])


def test_podenv_turns_the_layout_index_into_the_task_argument():
    """A TrainJob pod's entry point: completion index 2 of 'chief:1,worker:2' is worker:1, in
    TF_CONFIG and in place of the command's '{task}'."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PINPOINT_TF_CLUSTER": '{"chief":["a:1"],"worker":["b:1","c:1"]}',
           "PINPOINT_TASK_LAYOUT": "chief:1,worker:2", "PINPOINT_TASK_INDEX": "2"}
    code = "import os, sys; print(sys.argv[1], os.environ['TF_CONFIG'])"
    out = subprocess.run([sys.executable, "-m", "pinpoint.provision.podenv", "--", sys.executable, "-c", code,
                          "{task}"], env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[0] == "worker:1"
    assert json.loads(out[1])["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize("field,ok,too_many", [("workers", 1024, 1025), ("ps", 64, 65)])
def test_parameter_server_scale_caps(field, ok, too_many):
    from pinpoint.errors import ConfigError

    base = {"chief": 1, "workers": 2, "ps": 1, "flavor": "jobset"}
    cfg = config_from_dict({"name": "big", "cluster": {**base, field: ok}, "train": {"strategy": "parameter_server"}})
    assert getattr(cfg.cluster, field) == ok
    with pytest.raises(ConfigError, match=f"^cluster.{field}: "):
        config_from_dict({"name": "big", "cluster": {**base, field: too_many}, "train": {"strategy": "parameter_server"}})
