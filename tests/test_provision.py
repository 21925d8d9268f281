"""provision(): the run folder it writes, the traps it refuses, the CLI's one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pinpoint.config import config_from_dict, load_config
from pinpoint.errors import ConfigError, PinpointError, ProvisionError
from pinpoint.provision import PLACEMENT_PLAN, provision
from pinpoint.provision.local import local_tasks
from pinpoint.provision.spec import build_tasks
from tests.conftest import CPU_IMAGE, make_config

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "provision"
IMAGE = "registry.example.com/pinpoint-gpu:0.1.0"
NO_CLAIM = ("cluster.runs_volume_claim: got None; multi-process runs on Kubernetes share checkpoints through a "
            "ReadWriteMany claim; set it to get manifests/")


def _cfg(strategy="multi_worker_mirrored", tracking=False, **cluster):
    cluster = {"workers": 1, **cluster} if strategy == "multi_worker_mirrored" else cluster
    return make_config("job", cluster=cluster, train={"strategy": strategy}, tracking={"enabled": tracking})


# ---- traps: one line naming the field, the value and the fix -----------------------------------
CONFIG_TRAPS = [
    ({"cluster": {"chief": 2, "workers": 1}}, "cluster.chief: got 2; TF_CONFIG allows at most one chief"),
    ({"cluster": {"chief": 1, "workers": 2}, "train": {"strategy": "parameter_server"}},
     "cluster.ps: got 0; parameter_server needs at least one ps task"),
    ({"cluster": {"chief": 0, "workers": 2, "ps": 1}, "train": {"strategy": "parameter_server"}},
     "cluster.chief: got 0; parameter_server needs a chief to coordinate"),
    ({"cluster": {"chief": 1, "workers": 0, "ps": 1}, "train": {"strategy": "parameter_server"}},
     "cluster.workers: got 0; parameter_server needs at least one worker"),
    ({"cluster": {"evaluator": 1}, "train": {"strategy": "mirrored"}},
     "cluster.evaluator: got 1; a side-car evaluator only works with multi_worker_mirrored or parameter_server"),
    ({"cluster": {"workers": 1, "evaluator": 2}},
     "cluster.evaluator: got 2; TensorFlow runs at most one side-car evaluator"),
    ({"cluster": {"chief": 0, "workers": 0}}, "cluster.workers: got 0; a cluster needs at least one chief or worker"),
    ({"name": "Train_Job"}, "name: got 'Train_Job'; 'Train_Job' is not a DNS-1123 name"),
    ({"name": "7days"}, "name: got '7days'; '7days' must start with a letter"),
    ({"cluster": {"namespace": "ML"}}, "cluster.namespace: got 'ML'"),
    ({"cluster": {"cluster_domain": "Cluster.Local"}}, "cluster.cluster_domain: got 'Cluster.Local'"),
    ({"cluster": {"port": 15001}}, "cluster.port: got 15001; port 15001 is reserved (Istio outbound)"),
    ({"cluster": {"port": 80}}, "cluster.port: got 80"),
    ({"cluster": {"memory": "4GB"}}, "cluster.memory: got '4GB'; '4GB' is not a Kubernetes quantity"),
    # One task of multi_worker_mirrored: the operator gives a one-replica TFJob no TF_CONFIG; the
    # plain flavour is refused by the same check (at load, before any manifest).
    ({"cluster": {"chief": 1, "workers": 0, "flavor": "tfjob"}},
     "cluster.workers: got 0; multi_worker_mirrored with a single task has no peers"),
    ({"cluster": {"chief": 1, "workers": 0, "flavor": "plain"}},
     "cluster.workers: got 0; multi_worker_mirrored with a single task has no peers"),
    ({"cluster": {"chief": 0, "workers": 1, "flavor": "plain", "runs_volume_claim": "runs-rwx"}},
     "cluster.workers: got 1; multi_worker_mirrored with a single task has no peers"),
]


@pytest.mark.unit
@pytest.mark.parametrize("overrides,message", CONFIG_TRAPS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(CONFIG_TRAPS)])
def test_config_traps(overrides, message):
    data = {"name": "job", "cluster": {}, "train": {"strategy": "multi_worker_mirrored"}}
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert message in str(err.value) and "\n" not in str(err.value)


PROVISION_TRAPS = [
    (dict(gpu_resource="nvidia gpu"), "cluster.gpu_resource: got 'nvidia gpu'; use an extended resource name"),
    (dict(gpu_type_label="-bad-"), "cluster.gpu_type_label: got '-bad-'; use a Kubernetes label key"),
    (dict(node_selector={"zone": "a b"}), "cluster.node_selector.zone: got 'a b'; a label value"),
    (dict(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
     "cluster.tolerations: got value 'v' with operator Exists"),
    (dict(emulate=False, gpu_type="A100", node_selector={"nvidia.com/gpu.product": "V100"}),
     "cluster.node_selector.nvidia.com/gpu.product: got 'V100' but cluster.gpu_type is 'A100'"),
    (dict(emulate=True, gpu_type="A100"), "cluster.gpu_type: got 'A100' but no replica requests a GPU"),
]


@pytest.mark.unit
@pytest.mark.parametrize("cluster,message", PROVISION_TRAPS, ids=[m.split(":")[0] for _, m in PROVISION_TRAPS])
def test_provision_traps(cluster, message, tmp_path):
    with pytest.raises(ProvisionError) as err:
        provision(_cfg(workers=1, **cluster), tmp_path / "out")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.unit
def test_combined_names_must_stay_dns_labels():
    cfg = _cfg(workers=1).model_copy(update={"name": "a" * 55})  # bypasses the 40-char config check
    with pytest.raises(ProvisionError, match="'a{55}-worker-0' \\(a Service name\\) must be a DNS-1035 label"):
        build_tasks(cfg)


@pytest.mark.unit
def test_local_port_collisions_are_refused():
    with pytest.raises(ProvisionError, match="every local task needs its own port"):
        local_tasks(_cfg(workers=1), ports=[2222, 2222])


@pytest.mark.unit
def test_nodes_and_kubeconfig_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="give one source of nodes"):
        provision(_cfg(), tmp_path, nodes=DATA / "nodes-ok.yaml", kubeconfig=tmp_path / "kc")


# ---- outputs -----------------------------------------------------------------------------------
@pytest.mark.unit
def test_provision_writes_the_run_folder(tmp_path):
    cfg = _cfg(workers=2, evaluator=1, emulate=False, devices_per_worker=2, image=IMAGE, runs_volume_claim="runs-rwx",
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    out = tmp_path / "run"
    summary = provision(cfg, out, nodes=DATA / "nodes-ok.yaml")
    assert summary["feasibility"] == "feasible"
    assert summary["tasks"] == ["chief:0", "worker:0", "worker:1", "evaluator:0"]
    # The run folder's config names the namespace it resolved (no service-account file here).
    written = load_config(out / "config.yaml")
    assert (cfg.cluster.namespace, written.cluster.namespace) == (None, "default")
    assert written.digest() == summary["config_digest"] != cfg.digest()
    spec = json.loads((out / "cluster_spec.json").read_text())
    assert spec["config_digest"] == summary["config_digest"] and spec["flavor"] == "tfjob"
    assert [t["task"] for t in spec["tasks"]] == summary["tasks"]
    # The cluster dict is written once; a task's TF_CONFIG is it plus the task's own entry.
    from pinpoint.provision.spec import build_tasks
    expected = {t.name: t.tf_config for t in build_tasks(written)}
    assert all({"cluster": spec["cluster"], **t["tf_config"]} == expected[t["task"]] for t in spec["tasks"])
    assert all("cluster" not in t["tf_config"] and "tf_config_json" not in t for t in spec["tasks"])
    assert spec["restart"]["retry_exit_code"] == 138
    assert spec["pod_run_dir"] == summary["pod_run_dir"] == "/runs/job"  # a folder outside /runs: the name
    plan = json.loads((out / PLACEMENT_PLAN).read_text())
    assert {p["task"] for p in plan["placements"]} == set(summary["tasks"])
    assert sorted(p.name for p in (out / "manifests").iterdir()) == ["configmap.yaml", "tfjob.yaml"]
    (tfjob,) = yaml.safe_load_all((out / "manifests" / "tfjob.yaml").read_text())
    assert set(tfjob["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "Evaluator"}

    # Re-provisioning with the other flavour replaces manifests/ as a whole (no stale tfjob.yaml).
    plain = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"flavor": "plain"})})
    provision(plain, out)
    assert sorted(p.name for p in (out / "manifests").iterdir()) == [
        "configmap.yaml", "job-chief.yaml", "job-evaluator.yaml", "job-worker.yaml", "services.yaml"]
    assert json.loads((out / PLACEMENT_PLAN).read_text())["status"] == "skipped"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.unit
def test_infeasible_inventory_writes_nothing(tmp_path):
    cfg = _cfg(workers=2, emulate=False, gpu_type="A100", devices_per_worker=4, image=IMAGE, runs_volume_claim="rwx")
    provision(cfg, tmp_path)  # an earlier, unchecked provision of the same folder
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(ProvisionError, match="need 12 x nvidia.com/gpu of type A100 in total"):
        provision(cfg, tmp_path, nodes=DATA / "nodes-capacity.yaml")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    fresh = tmp_path / "fresh"
    with pytest.raises(ProvisionError):
        provision(cfg, fresh, nodes=DATA / "nodes-capacity.yaml")
    assert not fresh.exists()


@pytest.mark.unit
@pytest.mark.timeout(120)
def test_cli_reports_one_line_and_exit_code(tmp_path):
    cfg = {"name": "big", "cluster": {"workers": 1, "emulate": False, "gpu_type": "A100", "devices_per_worker": 8},
           "train": {"strategy": "multi_worker_mirrored"}, "tracking": {"enabled": False}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "pinpoint.cli", "provision", str(path), "--out", str(tmp_path / "o"),
                          "--nodes", str(DATA / "nodes-small-gpu.yaml")], capture_output=True, text=True, timeout=120)
    assert run.returncode == PinpointError.exit_code
    assert run.stderr == ("pinpoint: feasibility: chief needs 8 x nvidia.com/gpu of type A100; "
                          "the largest matching node has 4; request less per replica (cluster.*) or add a larger node\n")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_provision_logs_to_mlflow(tmp_path):
    """The provision step run: params, cluster_spec.json, placement plan and manifests as artifacts."""
    from mlflow.tracking import MlflowClient

    from pinpoint.steps.provision import provision_step

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config_from_dict({"name": "tracked", "cluster": {"workers": 1, "runs_volume_claim": "runs-rwx"},
                            "train": {"strategy": "multi_worker_mirrored"},
                            "tracking": {"enabled": True, "uri": uri, "experiment": "provision-test"}})
    summary = provision_step(cfg, tmp_path / "run", nodes=DATA / "nodes-ok.yaml")
    assert summary["run_id"]
    client = MlflowClient(uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["strategy"] == "multi_worker_mirrored"
    assert run.data.params["replicas.worker"] == "1" and run.data.params["feasibility"] == "feasible"
    assert run.data.params["config_digest"] == summary["config_digest"]  # once, with the config's params
    names = {a.path for a in client.list_artifacts(summary["run_id"])}
    assert {"cluster_spec.json", PLACEMENT_PLAN, "manifests"} <= names
    manifests = {a.path for a in client.list_artifacts(summary["run_id"], "manifests")}
    assert manifests == {"manifests/configmap.yaml", "manifests/tfjob.yaml"}


@pytest.mark.unit
def test_cluster_spec_notes_what_manifests_cannot_say(tmp_path):
    from pinpoint.provision.spec import cluster_spec

    cfg = _cfg(workers=1, cluster_domain="cluster.local")
    notes = cluster_spec(cfg, build_tasks(cfg))["notes"]
    assert any("CUSTOM_CLUSTER_DOMAIN=cluster.local" in n for n in notes)
    assert any("runs_volume_claim" in n for n in notes)
    ps = _cfg("parameter_server", workers=1, ps=1, flavor="plain", runs_volume_claim="shared")
    assert cluster_spec(ps, build_tasks(ps))["notes"] == [
        "parameter_server ps/worker tasks serve until stopped: when the chief Job completes, delete the rest "
        "with `kubectl delete jobs -n default -l app.kubernetes.io/instance=job`"]


@pytest.mark.unit
def test_user_code_on_a_stock_image_is_warned_about_and_a_user_image_is_not():
    from pinpoint.config import config_from_dict
    from pinpoint.provision import image_warnings

    def cfg(image):
        return config_from_dict({"name": "u", "cluster": {"image": image},
                                 "train": {"model": "mypkg.models:build", "code_dir": "/src/code"}})

    (line,) = image_warnings(cfg(CPU_IMAGE))
    assert line.startswith(f"cluster.image: got '{CPU_IMAGE}'") and "CODE_DIR=/src/code" in line
    assert image_warnings(cfg("registry.example/team/pinpoint-user:1.2")) == []


@pytest.mark.unit
@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_multi_process_without_a_claim_writes_no_manifests(tmp_path, flavor):
    """Each pod would get its own emptyDir (no shared checkpoint): no manifests/, one line why."""
    from pinpoint.provision.spec import cluster_spec

    out = tmp_path / "run"
    provision(_cfg(workers=1, flavor=flavor, runs_volume_claim="rwx"), out)  # an earlier provision with a claim
    assert (out / "manifests").is_dir()
    cfg = _cfg(workers=1, flavor=flavor)
    summary = provision(cfg, out)
    assert summary["warnings"] == [NO_CLAIM] and summary["manifests"] == [] and summary["pod_run_dir"] is None
    assert not (out / "manifests").exists()  # the earlier manifests are not launched with this config
    spec = json.loads((out / "cluster_spec.json").read_text())
    assert NO_CLAIM in spec["notes"] and spec["pod_run_dir"] is None
    assert NO_CLAIM in cluster_spec(cfg, build_tasks(cfg))["notes"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    single = _cfg("mirrored", flavor=flavor)
    assert NO_CLAIM not in provision(single, tmp_path / "single")["warnings"]  # its own emptyDir is enough


@pytest.mark.unit
def test_cluster_spec_says_codes_1_to_127_are_permanent_and_who_counts_restarts():
    from pinpoint.provision.spec import cluster_spec

    cfg = _cfg(workers=1, runs_volume_claim="rwx")
    restart = cluster_spec(cfg, build_tasks(cfg))["restart"]
    assert (restart["retryable_exit_codes"], restart["permanent_exit_codes"]) == (">= 128", "1..127")
    assert "launch step" in restart["max_restarts_enforced_by"] and "backoffLimit" in restart["max_restarts_enforced_by"]
    assert "IsRetryableExitCode" in restart["retried_by"]


@pytest.mark.unit
def test_the_sweep_variants_of_one_run_dir_get_distinct_pod_folders(tmp_path):
    """provision() on two variant folders (tmp dirs: outside /runs, so each pod folder is the name)."""
    names = {}
    for variant in ("narrow", "wide"):
        cfg = _cfg(workers=1, runs_volume_claim="rwx").model_copy(update={"name": f"job-{variant}"})
        summary = provision(cfg, tmp_path / "sweep" / variant)
        (tfjob,) = yaml.safe_load_all((tmp_path / "sweep" / variant / "manifests" / "tfjob.yaml").read_text())
        for replica in tfjob["spec"]["tfReplicaSpecs"].values():
            (c,) = replica["template"]["spec"]["containers"]
            assert c["command"][c["command"].index("--out") + 1] == summary["pod_run_dir"]
            assert {"name": "runs", "mountPath": summary["pod_run_dir"], "subPath": f"job-{variant}"} in c["volumeMounts"]
        names[variant] = summary["pod_run_dir"]
    assert names == {"narrow": "/runs/job-narrow", "wide": "/runs/job-wide"}


@pytest.mark.unit
def test_rbac_option_writes_the_launch_role_outside_manifests(tmp_path):
    from pinpoint.cli import main
    from pinpoint.provision.rbac import rbac_yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "job", "cluster": {"workers": 1, "namespace": "team-a",
                                                               "runs_volume_claim": "rwx"},
                                    "train": {"strategy": "multi_worker_mirrored"}, "tracking": {"enabled": False}}))
    out = tmp_path / "out"
    assert main(["provision", str(path), "--out", str(out), "--rbac", "default-editor"]) == 0
    assert (out / "rbac.yaml").read_text() == rbac_yaml("team-a", "default-editor")
    assert sorted(p.name for p in (out / "manifests").iterdir()) == ["configmap.yaml", "tfjob.yaml"]
    # Without cluster.namespace: the namespace provision resolved (no service-account file here).
    summary = provision(_cfg(workers=1, runs_volume_claim="rwx"), tmp_path / "default", rbac="pipeline-runner")
    assert Path(summary["rbac"]).read_text() == rbac_yaml("default", "pipeline-runner")


@pytest.mark.unit
def test_a_bad_rbac_service_account_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError) as err:
        provision(_cfg(workers=1, runs_volume_claim="rwx"), tmp_path / "out", rbac="Pipeline Runner")
    assert str(err.value) == ("--rbac: got 'Pipeline Runner'; give a ServiceAccount name (lower-case letters, digits, "
                              "'-' and '.'), e.g. pipeline-runner or default-editor")
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
def test_repo_configs_still_provision(tmp_path):
    for name in ("demo", "multiworker", "ps"):
        summary = provision(load_config(ROOT / "configs" / f"{name}.yaml"), tmp_path / name)
        multi = name != "demo"
        assert (summary["manifests"] == []) is multi
        assert (NO_CLAIM in summary["warnings"]) is multi


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", ["keras_fit", "custom_loop"])
def test_the_example_configs_provision_like_any_other(tmp_path, example, monkeypatch):
    """The worked examples' configs provision as any config does, logged as they say (to a store in
    tmp_path here, not the checkout's mlruns/: the sender and the store are why this is not a unit test)."""
    from pinpoint.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    out = tmp_path / "run"
    assert main(["provision", str(ROOT / "examples" / example / "config.yaml"), "--out", str(out)]) == 0
    cfg = load_config(out / "config.yaml")
    assert cfg.train.entrypoint == f"{'fit_example' if example == 'keras_fit' else 'loop_example'}.train:entrypoint"
    assert cfg.train.code_dir == str((ROOT / "examples" / example).resolve())
    # The pods run the same `pinpoint train` on the same config (the user image sets PINPOINT_CODE_DIR).
    configmap = yaml.safe_load((out / "manifests" / "configmap.yaml").read_text())
    assert f"entrypoint: {cfg.train.entrypoint}" in configmap["data"]["config.yaml"]
    tfjob = yaml.safe_load((out / "manifests" / "tfjob.yaml").read_text())
    (container,) = tfjob["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["pinpoint", "train", "/config/config.yaml"]
