"""Manifests validated offline: Kubernetes OpenAPI schemas (kubernetes-validate, strict) and the
TFJob CRD's openAPIV3Schema (made strict: unknown fields are errors); plus the pod details."""

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pinpoint.config import config_from_dict
from pinpoint.provision.manifests import build_manifests
from pinpoint.provision.spec import build_tasks

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


def _cfg(flavor, strategy="multi_worker_mirrored", **cluster):
    base = {"workers": 1, "emulate": False, "gpu_type": "NVIDIA-A100-SXM4-80GB", "flavor": flavor,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "node_selector": {"topology.kubernetes.io/zone": "zone-a"}}
    return config_from_dict({"name": "job", "cluster": {**base, **cluster},
                             "train": {"strategy": strategy, "max_restarts": 3}})


TOPOLOGIES = {
    "single": ("mirrored", dict(workers=0, devices_per_worker=2)),
    "multiworker": ("multi_worker_mirrored", dict(chief=1, workers=2, evaluator=1, devices_per_worker=2)),
    "ps": ("parameter_server", dict(chief=1, workers=2, ps=2, runs_volume_claim="runs-rwx")),
    "emulated": ("multi_worker_mirrored", dict(workers=1, emulate=True, gpu_type=None, cluster_domain="cluster.local")),
}


def _docs(cfg):
    files = build_manifests(cfg, build_tasks(cfg))
    # Round-trip through YAML: what is validated is what lands on disk.
    from pinpoint.provision.manifests import dump
    return {name: list(yaml.safe_load_all(dump(docs))) for name, docs in files.items()}


@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_manifests_validate_against_real_schemas(flavor, topology, tfjob_validator):
    strategy, cluster = TOPOLOGIES[topology]
    files = _docs(_cfg(flavor, strategy, **cluster))
    kinds = []
    for docs in files.values():
        for doc in docs:
            kinds.append(doc["kind"])
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
        role = cmd[cmd.index("--task") + 1].split(":")[0]
        assert cmd[cmd.index("--task") + 1] == f"{role}:$(PINPOINT_TASK_INDEX)"
        seen[role] = (c["resources"]["limits"].get("nvidia.com/gpu", 0), spec.get("nodeSelector", {}))
        if flavor == "tfjob":
            assert owner["restartPolicy"] == "ExitCode"
            assert "restartPolicy" not in spec  # the operator derives it (Never for ExitCode)
        else:
            assert spec["restartPolicy"] == "Never" and spec["subdomain"] == "job"
            rules = owner["podFailurePolicy"]["rules"]
            assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                                                   "values": list(range(1, 128))}}
            assert owner["completionMode"] == "Indexed" and owner["backoffLimitPerIndex"] == 3
            assert owner["completions"] == owner["parallelism"] == {"chief": 1, "worker": 2, "ps": 1}[role]
    # parameter_server: only workers compute; they get the GPUs and the GPU type selector.
    assert seen["worker"][0] == 4
    assert seen["worker"][1]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    for role in ("chief", "ps"):
        assert seen[role][0] == 0 and "nvidia.com/gpu.product" not in seen[role][1]
    if flavor == "tfjob":
        tfjob = files["tfjob.yaml"][0]
        assert tfjob["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3}
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
