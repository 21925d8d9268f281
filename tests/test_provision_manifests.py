"""Manifests validated offline: Kubernetes OpenAPI schemas (kubernetes-validate, strict) and the
TFJob CRD's openAPIV3Schema (made strict: unknown fields are errors); plus the pod details, the
run folder the pods write, the MLflow Secret, images, deadlines, gang scheduling and RBAC."""

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pinpoint.config import config_from_dict
from pinpoint.errors import ProvisionError
from pinpoint.provision.manifests import build_manifests
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV
from pinpoint.provision.spec import build_tasks
from tests.conftest import make_config

pytestmark = pytest.mark.unit

K8S_VERSION = "1.33.0"  # podFailurePolicy (GA 1.31) and backoffLimitPerIndex (GA 1.33)
HERE = Path(__file__).parent


def _crd_path() -> Path:
    # A copy lives in the repo; ../shared/schemas is the upstream of that copy.
    for p in (HERE / "data" / "provision" / "kubeflow.org_tfjobs.yaml",
              HERE.parent.parent / "shared" / "schemas" / "kubeflow.org_tfjobs.yaml"):
        if p.is_file():
            return p
    raise FileNotFoundError("kubeflow.org_tfjobs.yaml: not in tests/data/provision/ nor ../shared/schemas/")


def _strict(schema):
    """Structural CRD schemas prune unknown fields silently; forbid them instead."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def tfjob_validator():
    crd = yaml.safe_load(_crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


IMAGE = "registry.example.com/pinpoint-gpu:0.1.0"


def _cfg(flavor, strategy="multi_worker_mirrored", tracking=None, train_extra=None, **cluster):
    base = {"workers": 1, "emulate": False, "gpu_type": "NVIDIA-A100-SXM4-80GB", "flavor": flavor,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "node_selector": {"topology.kubernetes.io/zone": "zone-a"}, "image": IMAGE,
            "runs_volume_claim": "runs-rwx"}
    return make_config("job", cluster={**base, **cluster}, tracking=tracking or None,
                       train={"strategy": strategy, "max_restarts": 3, **(train_extra or {})})


TOPOLOGIES = {
    "single": ("mirrored", dict(workers=0, devices_per_worker=2)),
    "single-emptydir": ("mirrored", dict(workers=0, devices_per_worker=2, runs_volume_claim=None, mlflow_secret=None)),
    "multiworker": ("multi_worker_mirrored", dict(chief=1, workers=2, evaluator=1, devices_per_worker=2)),
    "ps": ("parameter_server", dict(chief=1, workers=2, ps=2)),
    "emulated": ("multi_worker_mirrored", dict(workers=1, emulate=True, gpu_type=None, cluster_domain="cluster.local",
                                               image="pinpoint-cpu:latest")),
    # Every optional field at once: pull secrets, deadlines, a custom MLflow Secret, Kueue gang
    # scheduling (one role, so both flavours may use it).
    "all-fields": ("mirrored", dict(workers=0, image_pull_secrets=["regcred", "mirror.pull"], deadline_s=7200,
                                    ttl_after_finished_s=0, mlflow_secret="team-mlflow", gang="kueue",
                                    queue="team-queue")),
}


def _docs(cfg, run_rel=None):
    files = build_manifests(cfg, build_tasks(cfg), run_rel=run_rel)
    # Round-trip through YAML: what is validated is what lands on disk.
    from pinpoint.provision.manifests import dump
    return {name: list(yaml.safe_load_all(dump(docs))) for name, docs in files.items()}


def _validate(doc, tfjob_validator):
    if doc["kind"] == "TFJob":
        errors = sorted(tfjob_validator.iter_errors(doc), key=str)
        assert not errors, errors[0]
        # The pod templates inside are core/v1 PodTemplateSpecs: validate them strictly too.
        for spec in doc["spec"]["tfReplicaSpecs"].values():
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": spec["template"]},
                K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_manifests_validate_against_real_schemas(flavor, topology, tfjob_validator):
    strategy, cluster = TOPOLOGIES[topology]
    files = _docs(_cfg(flavor, strategy, **cluster), run_rel="team/sweep/variant-a")
    kinds = []
    for docs in files.values():
        for doc in docs:
            kinds.append(doc["kind"])
            _validate(doc, tfjob_validator)
    if flavor == "tfjob":
        assert sorted(kinds) == ["ConfigMap", "TFJob"]
    else:
        tasks = build_tasks(_cfg(flavor, strategy, **cluster))
        assert "TFJob" not in kinds and kinds.count("Job") == len({t.role for t in tasks})
        assert kinds.count("Service") == 1 + len(tasks) and kinds.count("ConfigMap") == 1


def test_validators_reject_a_typo(tfjob_validator):
    """Negative control: both validators really look at field names."""
    files = _docs(_cfg("tfjob"))
    tfjob = copy.deepcopy(files["tfjob.yaml"][0])
    tfjob["spec"]["tfReplicaSpecs"]["Chief"]["restartPolicyy"] = "ExitCode"
    assert list(tfjob_validator.iter_errors(tfjob))
    files = _docs(_cfg("plain"))
    job = copy.deepcopy(files["job-chief.yaml"][0])
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def _pod_specs(files):
    for docs in files.values():
        for doc in docs:
            if doc["kind"] == "TFJob":
                for rtype, spec in doc["spec"]["tfReplicaSpecs"].items():
                    yield rtype, spec, spec["template"]
            elif doc["kind"] == "Job":
                yield doc["metadata"]["name"], doc["spec"], doc["spec"]["template"]


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_pod_details(flavor):
    cfg = _cfg(flavor, "parameter_server", chief=1, workers=2, ps=1, devices_per_worker=4, shm_size="2Gi")
    files = _docs(cfg)
    seen = {}
    for key, owner, template in _pod_specs(files):
        spec = template["spec"]
        (c,) = spec["containers"]
        assert c["name"] == "tensorflow"
        assert c["ports"] == [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
        assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
        assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        shm = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"]["topology.kubernetes.io/zone"] == "zone-a"
        cmd = c["command"]
        i = cmd.index("pinpoint")
        assert cmd[i:i + 5] == ["pinpoint", "train", "/config/config.yaml", "--out", "/runs/job"]
        assert {"name": "runs", "mountPath": "/runs/job", "subPath": "job"} in c["volumeMounts"]
        role = cmd[cmd.index("--task") + 1].split(":")[0]
        assert cmd[cmd.index("--task") + 1] == f"{role}:$(PINPOINT_TASK_INDEX)"
        seen[role] = (c["resources"]["limits"].get("nvidia.com/gpu", 0), spec.get("nodeSelector", {}))
        if flavor == "tfjob":
            assert owner["restartPolicy"] == "ExitCode"
            assert "restartPolicy" not in spec  # the operator derives it (Never for ExitCode)
        else:
            assert spec["restartPolicy"] == "Never" and spec["subdomain"] == "job"
            # The first matching rule wins: a disrupted (preempted, drained) pod is ignored whatever
            # code it exited with, before exit codes 1..127 fail the Job.
            rules = owner["podFailurePolicy"]["rules"]
            assert rules == [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                                      "values": list(range(1, 128))}},
            ]
            assert owner["completionMode"] == "Indexed" and owner["backoffLimitPerIndex"] == 3
            assert (owner["activeDeadlineSeconds"], owner["ttlSecondsAfterFinished"]) == (86400, 3600)
            assert owner["completions"] == owner["parallelism"] == {"chief": 1, "worker": 2, "ps": 1}[role]
    # parameter_server: only workers compute; they get the GPUs and the GPU type selector.
    assert seen["worker"][0] == 4
    assert seen["worker"][1]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    for role in ("chief", "ps"):
        assert seen[role][0] == 0 and "nvidia.com/gpu.product" not in seen[role][1]
    if flavor == "tfjob":
        tfjob = files["tfjob.yaml"][0]
        assert tfjob["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3,
                                              "activeDeadlineSeconds": 86400, "ttlSecondsAfterFinished": 3600}
        assert set(tfjob["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "PS"}


def test_configmap_carries_the_validated_config():
    cfg = _cfg("tfjob")
    (cm,) = _docs(cfg)["configmap.yaml"]
    assert cm["metadata"]["name"] == "job-config"
    assert config_from_dict(yaml.safe_load(cm["data"]["config.yaml"])).digest() == cfg.digest()
    for _, _, template in _pod_specs(_docs(cfg)):
        assert {"name": "config", "configMap": {"name": "job-config"}} in template["spec"]["volumes"]


def test_plain_services_give_operator_host_names():
    cfg = _cfg("plain", chief=1, workers=2)
    services = _docs(cfg)["services.yaml"]
    names = [s["metadata"]["name"] for s in services]
    assert names == ["job", "job-chief-0", "job-worker-0", "job-worker-1"]
    for s in services:
        assert s["spec"]["clusterIP"] == "None" and s["spec"]["publishNotReadyAddresses"] is True
    w1 = services[3]["spec"]["selector"]
    assert w1 == {"app.kubernetes.io/instance": "job", "pinpoint.dev/role": "worker",
                  "batch.kubernetes.io/job-completion-index": "1"}
    # Every host in TF_CONFIG is '<service>.<ns>.svc:<port>' of one of these Services.
    hosts = {t.host.split(".")[0] for t in build_tasks(cfg)}
    assert hosts <= set(names)
    jobs = {d["metadata"]["name"] for f, docs in _docs(cfg).items() if f.startswith("job-") for d in docs}
    assert jobs == {"job-chief", "job-worker"}  # Indexed Job pods get hostname <job>-<index>


def test_emulated_spec_requests_no_gpus():
    cfg = _cfg("tfjob", workers=1, emulate=True, gpu_type=None)
    for _, _, template in _pod_specs(_docs(cfg)):
        limits = template["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in limits


# ---- the run folder the pods write ----------------------------------------------------------------
@pytest.mark.parametrize("out,rel", [
    ("/runs/sweep/narrow", "sweep/narrow"),           # a placement_sweep variant '<run_dir>/<variant>'
    ("/runs/sweep/wide", "sweep/wide"),
    ("/runs/team/custom-dir", "team/custom-dir"),     # a custom run_dir under the claim's mount
    ("/runs/job", "job"),
    ("/runs/team/../job/", "job"),                    # normalised like the launch step resolves it
    ("/home/me/repo/runs/job-x", "job"),              # a laptop folder for kubectl apply: the name
    ("/runsx/other", "job"),                          # a sibling of /runs is not under it
    ("/runs", "job"),
    ("runs/job-x", "job"),                            # relative: not a step's folder
])
def test_pod_run_rel_is_the_folder_relative_to_the_claims_mount(out, rel):
    from pinpoint.provision.manifests import pod_run_rel

    assert pod_run_rel(out, "job") == rel


def _runs_mount_and_out(files):
    for _, _, template in _pod_specs(files):
        (c,) = template["spec"]["containers"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "runs"]
        yield mount, c["command"][c["command"].index("--out") + 1]


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_sweep_variants_write_distinct_folders_on_the_claim(flavor):
    """Each variant's pods mount only their own folder of the claim, at the path the steps see it."""
    from pinpoint.provision.manifests import pod_run_rel

    seen = {}
    for variant in ("narrow", "wide"):
        cfg = _cfg(flavor, "multi_worker_mirrored").model_copy(update={"name": f"job-{variant}"})
        rel = pod_run_rel(f"/runs/my-sweep/{variant}", cfg.name)
        mounts = set()
        for mount, out in _runs_mount_and_out(_docs(cfg, run_rel=rel)):
            assert mount == {"name": "runs", "mountPath": f"/runs/my-sweep/{variant}", "subPath": f"my-sweep/{variant}"}
            assert out == f"/runs/my-sweep/{variant}"
            mounts.add(mount["subPath"])
        (seen[variant],) = mounts
    assert seen == {"narrow": "my-sweep/narrow", "wide": "my-sweep/wide"}


def test_a_dollar_in_the_run_folder_is_not_expanded_by_the_kubelet():
    cfg = _cfg("tfjob", "mirrored", workers=0)
    ((mount, out),) = _runs_mount_and_out(_docs(cfg, run_rel="a$(HOME)b"))
    assert out == "/runs/a$$(HOME)b" and mount["subPath"] == "a$(HOME)b"


def test_without_a_claim_a_single_process_pod_writes_its_own_empty_dir():
    cfg = _cfg("tfjob", "mirrored", workers=0, runs_volume_claim=None)
    for _, _, template in _pod_specs(_docs(cfg)):
        assert {"name": "runs", "emptyDir": {}} in template["spec"]["volumes"]
        assert {"name": "runs", "mountPath": "/runs/job"} in template["spec"]["containers"][0]["volumeMounts"]


# ---- shared storage -------------------------------------------------------------------------------
@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_multi_process_manifests_need_the_claim(flavor, strategy):
    cluster = {"ps": 1} if strategy == "parameter_server" else {}
    cfg = _cfg(flavor, strategy, runs_volume_claim=None, **cluster)
    with pytest.raises(ProvisionError) as err:
        build_manifests(cfg, build_tasks(cfg))
    assert str(err.value) == (
        "cluster.runs_volume_claim: got None; multi-process runs on Kubernetes share checkpoints through a "
        "ReadWriteMany claim; set it to get manifests/")


# ---- restart semantics, deadlines -----------------------------------------------------------------
def _first_matching_rule(rules, *, exit_code, disrupted):
    """The Job controller's evaluation: rules in order, the first match decides."""
    for rule in rules:
        if "onPodConditions" in rule and disrupted and any(
                c == {"type": "DisruptionTarget", "status": "True"} for c in rule["onPodConditions"]):
            return rule["action"]
        codes = rule.get("onExitCodes")
        if codes and codes["operator"] == "In" and exit_code in codes["values"]:
            return rule["action"]
    return "Count"


def test_a_preempted_pod_that_exited_1_is_recreated_not_failed():
    (job,) = _docs(_cfg("plain", "mirrored", workers=0))["job-chief.yaml"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert _first_matching_rule(rules, exit_code=1, disrupted=True) == "Ignore"
    assert _first_matching_rule(rules, exit_code=1, disrupted=False) == "FailJob"
    assert _first_matching_rule(rules, exit_code=138, disrupted=False) == "Count"  # retried, per index


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_deadline_and_ttl_come_from_the_config(flavor, tfjob_validator):
    cfg = _cfg(flavor, deadline_s=600, ttl_after_finished_s=0)
    for docs in _docs(cfg).values():
        for doc in docs:
            _validate(doc, tfjob_validator)
            if doc["kind"] == "TFJob":
                policy = doc["spec"]["runPolicy"]
                assert (policy["activeDeadlineSeconds"], policy["ttlSecondsAfterFinished"]) == (600, 0)
            if doc["kind"] == "Job":
                assert (doc["spec"]["activeDeadlineSeconds"], doc["spec"]["ttlSecondsAfterFinished"]) == (600, 0)


# ---- MLflow Secret, collective timeout, credentials ---------------------------------------------
def _env(template):
    return {e["name"]: e for e in template["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_pods_read_mlflow_from_the_steps_secret_and_get_the_collective_timeout(flavor):
    from pinpoint.provision.podenv import MLFLOW_SECRET_KEYS
    from pinpoint.training.cluster.launcher import task_specs
    from pipelines import settings

    assert settings.MLFLOW_SECRET_KEYS is MLFLOW_SECRET_KEYS  # one table for steps and pods
    # train.collective_timeout_s reaches the pods as it reaches the local tasks; off: neither has it.
    timed = _cfg(flavor, mlflow_secret="team-mlflow", train_extra={"collective_timeout_s": 90})
    local = {s.env.get(COLLECTIVE_TIMEOUT_ENV) for s in task_specs(timed, Path("/tmp/unused"))}
    assert local == {"90"}
    for _, _, template in _pod_specs(_docs(_cfg(flavor))):
        assert COLLECTIVE_TIMEOUT_ENV not in _env(template)
    for _, _, template in _pod_specs(_docs(timed)):
        env = _env(template)
        assert env[COLLECTIVE_TIMEOUT_ENV] == {"name": COLLECTIVE_TIMEOUT_ENV, "value": "90"}
        for key, var in MLFLOW_SECRET_KEYS.items():
            assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": "team-mlflow", "key": key,
                                                                            "optional": True}}}
    for _, _, template in _pod_specs(_docs(_cfg(flavor, mlflow_secret=None))):
        assert not {e for e in _env(template) if e.startswith("MLFLOW_")}


def test_a_tracking_uri_with_credentials_is_refused_without_echoing_it():
    cfg = _cfg("tfjob", tracking={"uri": "https://alice:hunter2-secret@mlflow.example.com"})
    with pytest.raises(ProvisionError) as err:
        build_manifests(cfg, build_tasks(cfg))
    assert str(err.value) == (
        "tracking.uri: got a URI with credentials (user:password@host); the manifests' ConfigMap embeds the config, "
        "so remove them from the URI and put them in the Kubernetes Secret 'mlflow-credentials' (keys username, "
        "password)")


def test_no_manifest_contains_a_credential(tmp_path, monkeypatch):
    """Credentials reach the pods from the Secret only: none in any file provision writes."""
    from pinpoint.provision import provision

    password = "sentinel-password-3c9e"
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sentinel-user-77aa")
    cfg = _cfg("plain", tracking={"enabled": False, "uri": "https://mlflow.example.com"})
    provision(cfg, tmp_path / "run")
    files = {str(p.relative_to(tmp_path / "run")): p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert sorted(files) == ["cluster_spec.json", "config.yaml", "manifests/configmap.yaml", "manifests/job-chief.yaml",
                             "manifests/job-worker.yaml", "manifests/services.yaml", "placement_plan.json"]
    assert [name for name, text in files.items() if password in text or "sentinel-user-77aa" in text] == []
    # A URI with credentials: no manifests (the ConfigMap would carry it), one line that does not
    # echo it; the folder still serves a local run (its config.yaml is the user's own file).
    summary = provision(_cfg("plain", tracking={"enabled": False, "uri": f"https://u:{password}@mlflow.example.com"}),
                        tmp_path / "refused")
    assert not (tmp_path / "refused" / "manifests").exists() and summary["manifests"] == []
    assert [w.split(";")[0] for w in summary["warnings"]] == ["tracking.uri: got a URI with credentials (user:password@host)"]
    assert password not in " ".join(summary["warnings"])


# ---- images -------------------------------------------------------------------------------------
@pytest.mark.parametrize("image,unqualified", [
    ("pinpoint-cpu:latest", True),
    ("pinpoint-cpu", True),
    ("team/pinpoint:1.0", True),
    ("localhost/pinpoint-cpu:0.1.0", False),
    ("registry:5000/pinpoint-cpu:1", False),
    ("registry.example.com/pinpoint-gpu:0.1.0", False),
    ("docker.io/library/python:3.12", False),
])
def test_unqualified_image_names(image, unqualified):
    from pinpoint.provision.manifests import is_unqualified_image

    assert is_unqualified_image(image) is unqualified


def test_an_unqualified_image_is_refused_for_a_real_gpu_run():
    cfg = _cfg("tfjob", image="pinpoint-gpu:latest")
    with pytest.raises(ProvisionError) as err:
        build_manifests(cfg, build_tasks(cfg))
    assert str(err.value) == (
        "cluster.image: got 'pinpoint-gpu:latest', a name without a registry host, which the nodes of a real "
        "(emulate: false) cluster can only run if it was preloaded on each of them (imagePullPolicy IfNotPresent); "
        "push it to a registry and use registry.example.com/pinpoint-gpu:TAG")


def test_an_unqualified_image_is_only_warned_about_for_an_emulated_run():
    from pinpoint.provision import image_warnings

    cfg = _cfg("tfjob", image="pinpoint-cpu:latest", emulate=True, gpu_type=None)
    assert _docs(cfg)["tfjob.yaml"][0]["kind"] == "TFJob"
    assert image_warnings(cfg) == [
        "cluster.image: got 'pinpoint-cpu:latest', a name without a registry host; the manifests' pods "
        "(imagePullPolicy IfNotPresent) only start on nodes where it was preloaded (kind load, minikube image load); "
        "for any other cluster push it to a registry and use registry.example.com/pinpoint-cpu:TAG"]
    assert image_warnings(_cfg("tfjob", emulate=True, gpu_type=None)) == []


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_image_pull_secrets_reach_every_pod(flavor):
    for _, _, template in _pod_specs(_docs(_cfg(flavor, image_pull_secrets=["regcred", "mirror"]))):
        assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    for _, _, template in _pod_specs(_docs(_cfg(flavor))):
        assert "imagePullSecrets" not in template["spec"]


# ---- gang scheduling ----------------------------------------------------------------------------
def test_gang_operator_sets_the_tfjob_scheduling_policy(tfjob_validator):
    cfg = _cfg("tfjob", chief=1, workers=2, evaluator=1, gang="operator", queue="gpu-queue")
    (tfjob,) = _docs(cfg)["tfjob.yaml"]
    _validate(tfjob, tfjob_validator)
    assert tfjob["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "queue": "gpu-queue"}
    assert "kueue.x-k8s.io/queue-name" not in tfjob["metadata"]["labels"]
    (unqueued,) = _docs(_cfg("tfjob", gang="operator"))["tfjob.yaml"]
    assert unqueued["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    (off,) = _docs(_cfg("tfjob"))["tfjob.yaml"]
    assert "schedulingPolicy" not in off["spec"]["runPolicy"]


def test_gang_kueue_labels_the_workload(tfjob_validator):
    (tfjob,) = _docs(_cfg("tfjob", workers=2, gang="kueue", queue="team-queue"))["tfjob.yaml"]
    _validate(tfjob, tfjob_validator)
    assert tfjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert "schedulingPolicy" not in tfjob["spec"]["runPolicy"]
    # plain: one role only (config.py refuses more), so its one Job is the whole workload.
    files = _docs(_cfg("plain", "mirrored", workers=0, gang="kueue", queue="team-queue"))
    (job,) = files["job-chief.yaml"]
    _validate(job, tfjob_validator)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert all("kueue.x-k8s.io/queue-name" not in d["metadata"]["labels"] for d in files["services.yaml"])


# ---- RBAC ---------------------------------------------------------------------------------------
# What pinpoint.k8s.launch calls: (API group, resource, verb).
LAUNCH_CALLS = [
    ("", "configmaps", "create"), ("", "configmaps", "get"), ("", "configmaps", "delete"),
    ("", "services", "create"), ("", "services", "get"), ("", "services", "delete"),
    *[("batch", "jobs", v) for v in ("create", "get", "delete")],
    *[("kubeflow.org", "tfjobs", v) for v in ("create", "get", "delete")],
    *[("jobset.x-k8s.io", "jobsets", v) for v in ("create", "get", "delete")],
    *[("trainer.kubeflow.org", "trainjobs", v) for v in ("create", "get", "delete")],
    ("", "pods", "get"), ("", "pods", "list"),
    ("", "pods/log", "get"),
    ("", "events", "list"),
    ("", "persistentvolumeclaims", "get"),
]


def test_rbac_validates_and_grants_exactly_the_launch_calls():
    from pinpoint.provision.rbac import rbac_docs

    role, binding = rbac_docs("kubeflow", "pipeline-runner")
    for doc in (role, binding):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == set(LAUNCH_CALLS)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}]


def test_docker_rbac_yaml_is_the_generators_output():
    from pinpoint.provision.rbac import rbac_yaml

    shipped = (HERE.parent / "docker" / "rbac.yaml").read_text()
    assert shipped == rbac_yaml("kubeflow", "pipeline-runner"), (
        "docker/rbac.yaml drifted; regenerate: .venv/bin/python -c \"from pinpoint.provision.rbac import rbac_yaml; "
        "open('docker/rbac.yaml', 'w').write(rbac_yaml('kubeflow', 'pipeline-runner'))\"")
    assert "default-editor" in shipped  # the profile namespaces' account is named in its comment


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_placement_memory_starts_every_task_with_the_allocator_that_traces(flavor):
    """placement.memory: the pods and the local tasks get TF_CPU_ALLOCATOR_USE_BFC=true (read once,
    when TensorFlow starts); off: neither has it."""
    from pinpoint.placement.profile.allocator import ALLOCATOR_ENV
    from pinpoint.training.cluster.launcher import task_specs

    on = make_config("job", cluster=_cfg(flavor).cluster.model_dump(), train={"strategy": "multi_worker_mirrored"},
                     placement={"memory": True})
    assert {s.env.get(ALLOCATOR_ENV) for s in task_specs(on, Path("/tmp/unused"))} == {"true"}
    assert [_env(t).get(ALLOCATOR_ENV) for _, _, t in _pod_specs(_docs(on))] == (
        [{"name": ALLOCATOR_ENV, "value": "true"}] * len(list(_pod_specs(_docs(on)))))
    assert {ALLOCATOR_ENV in _env(t) for _, _, t in _pod_specs(_docs(_cfg(flavor)))} == {False}
