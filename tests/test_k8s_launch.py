"""The Kubernetes launch path (pinpoint.k8s.launch, the real `kubernetes` client) against
FakeKubeApiServer, a FAKE API server: create -> watch -> failure -> cleanup; the checks before
creating (namespace, run folder on the claim, ReadWriteMany claim), ownerReferences to the
launcher pod, 409 handling, 403 lines, retries of transient API errors and SIGTERM.
The watcher's own behaviours are in test_k8s_watch.py."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import NO_TRACKING, make_config
from tests.fakes.kube_api import FakeKubeApiServer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _config(flavor: str = "tfjob", image: str = "registry.example/pinpoint-cpu:0.1.0", name: str = "k8s-test",
            cluster: dict | None = None, train: dict | None = None):
    return make_config(
        name,
        cluster={"chief": 1, "workers": 1, "devices_per_worker": 1, "flavor": flavor, "image": image,
                 "runs_volume_claim": "shared-runs", "namespace": "team-a", "memory": "3Gi", **(cluster or {})},
        train={"strategy": "multi_worker_mirrored", "steps": 2, **(train or {})},
        tracking=NO_TRACKING,
    )


@pytest.fixture
def run_dir(tmp_path):
    from pinpoint.provision import provision

    def make(flavor="tfjob"):
        cfg = _config(flavor)
        out = tmp_path / cfg.name
        provision(cfg, out)
        return cfg, out

    return make


def _launch(fake, cfg, out, parent_run_id=None, **opts):
    from pinpoint.k8s.launch import LaunchOptions, launch_manifests

    lines: list[str] = []
    options = LaunchOptions(poll_seconds=0.01, unschedulable_grace_seconds=0, image_pull_grace_seconds=0.2,
                            timeout_seconds=20, failed_create_grace_seconds=0, operator_grace_seconds=5,
                            retry_base_seconds=0.01, log=lines.append)
    for k, v in opts.items():
        setattr(options, k, v)
    try:
        return launch_manifests(fake.api_client(), out, cfg.name, cfg.cluster.namespace, options,
                                parent_run_id=parent_run_id), lines
    finally:
        _launch.lines = lines


def hang_until_steady(launch, cfg, out, *, skip: int = 3, polls: int = 2) -> FakeKubeApiServer:
    """`launch(fake, cfg, out, timeout_seconds=...)` of a run whose pods stay Running ("hang"), ended
    by its timeout once it has made `polls` polls past its first `skip`: a loaded machine makes fewer
    polls in a given time, so the timeout doubles (2.5 s to 20 s) until they are there. The fake API
    server, with every request it took."""
    from pinpoint.errors import TrainingFailed

    timeout = 2.5
    while True:
        with FakeKubeApiServer("hang") as fake:
            with pytest.raises(TrainingFailed, match="did not finish within"):
                launch(fake, cfg, out, timeout_seconds=timeout)
        if len(fake.requests_per_poll()) >= skip + polls or timeout >= 20:
            return fake
        timeout *= 2


def _assert_cleaned_up(fake):
    assert fake.created, "nothing was created"
    assert fake.objects == {}, f"left behind: {list(fake.objects)}"
    assert fake.pods == {}, f"pods left behind: {list(fake.pods)}"
    # Deleted newest first: the workload goes before the ConfigMap its pods mount.
    assert fake.deleted == list(reversed(fake.created))


def test_success_creates_streams_logs_and_cleans_up(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success") as fake:
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        assert [k[0] for k in fake.created] == ["ConfigMap", "TFJob"]
        assert all(ns == "team-a" for _, ns, _ in fake.created)
        # Pods were found by the run's instance label, and their logs streamed once each, prefixed.
        assert "[k8s-test-chief-0] step 1 loss 2.30" in lines
        assert "[k8s-test-worker-0] done" in lines
        assert lines.count("[k8s-test-chief-0] step 2 loss 1.10") == 1
        _assert_cleaned_up(fake)


def test_pods_log_under_the_pipelines_parent_run(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success") as fake:
        seen = {}
        original = fake._spawn_pods
        fake._spawn_pods = lambda kind, obj: (seen.setdefault(kind, obj), original(kind, obj))
        rc, _ = _launch(fake, cfg, out, parent_run_id="parent-123")
        assert rc == 0
        for spec in seen["TFJob"]["spec"]["tfReplicaSpecs"].values():
            cmd = spec["template"]["spec"]["containers"][0]["command"]
            assert cmd[:2] == ["pinpoint", "train"] and cmd[-2:] == ["--parent-run-id", "parent-123"]


def test_plain_flavor_creates_services_and_jobs(run_dir):
    cfg, out = run_dir("plain")
    with FakeKubeApiServer("success") as fake:
        rc, _ = _launch(fake, cfg, out)
        assert rc == 0
        kinds = [k[0] for k in fake.created]
        assert kinds[0] == "ConfigMap" and "Service" in kinds and kinds.count("Job") == 2
        assert kinds.index("Service") < kinds.index("Job")  # DNS names exist before the pods
        _assert_cleaned_up(fake)


@pytest.mark.parametrize(
    "scenario, expected",
    [
        ("image_pull", ["pod k8s-test-", "registry.example/pinpoint-cpu:0.1.0", "ImagePullBackOff", "cluster.image"]),
        ("oom", ["pod k8s-test-chief-0", "OOMKilled", "memory limit 3Gi", "train.batch_size"]),
        ("unschedulable", ["cannot be scheduled", "Insufficient nvidia.com/gpu", "add nodes"]),
        ("crash", ["pod k8s-test-chief-0", "exited with code 1"]),
    ],
)
def test_failures_are_one_clear_line_and_clean_up(run_dir, scenario, expected):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer(scenario) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        message = str(err.value)
        assert "\n" not in message
        for part in expected:
            assert part in message, message
        _assert_cleaned_up(fake)


def test_crash_log_is_streamed_before_the_failure(run_dir):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("crash") as fake:
        with pytest.raises(TrainingFailed):
            _launch(fake, cfg, out)
    assert "[k8s-test-chief-0] ValueError: boom" in _launch.lines


def test_unschedulable_waits_for_the_grace_period(run_dir):
    """Within the grace period (an autoscaler may add a node) it keeps waiting, up to the timeout."""
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("unschedulable") as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out, unschedulable_grace_seconds=3600, timeout_seconds=0.3)
        assert "did not finish within" in str(err.value) and "Pending" in str(err.value)
        _assert_cleaned_up(fake)


def test_missing_tfjob_crd_is_explained_and_configmap_removed(run_dir):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success", missing_kinds=("TFJob",)) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert "Training Operator" in str(err.value) and "cluster.flavor: plain" in str(err.value)
        assert fake.created == [("ConfigMap", "team-a", "k8s-test-config")]
        _assert_cleaned_up(fake)


def test_forbidden_names_the_rbac_fix(run_dir):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success", forbid={("create", "configmaps")}) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert "forbidden" in str(err.value) and "service account" in str(err.value)
        assert fake.created == []


def test_unreachable_api_server_is_one_line(run_dir):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    fake = FakeKubeApiServer()
    with fake:
        client = fake.api_client()
    # The fake is stopped: nothing listens on its port any more.
    from pinpoint.k8s.launch import LaunchOptions, launch_manifests

    with pytest.raises(TrainingFailed) as err:
        launch_manifests(client, out, cfg.name, cfg.cluster.namespace,
                         LaunchOptions(log=lambda s: None, retry_base_seconds=0.01))
    assert "\n" not in str(err.value) and "unreachable" in str(err.value)
    assert "after 5 attempts to create configmaps in namespace team-a" in str(err.value)


def test_no_manifests_is_a_clear_error(tmp_path):
    from pinpoint.errors import ProvisionError
    from pinpoint.k8s.launch import load_manifests

    with pytest.raises(ProvisionError, match="run the provision step first"):
        load_manifests(tmp_path)


def test_kubernetes_launch_needs_a_shared_run_folder(tmp_path):
    from pinpoint.config import config_from_dict
    from pinpoint.errors import ConfigError
    from pinpoint.k8s.launch import launch_training

    cfg = config_from_dict({"name": "no-pvc", "cluster": {"chief": 1, "workers": 1},
                            "train": {"strategy": "multi_worker_mirrored"}, "tracking": {"enabled": False}})
    with pytest.raises(ConfigError, match="cluster.runs_volume_claim"):
        launch_training(cfg, tmp_path)


# ---- launch_training: namespace, run folder on the claim, the claim itself ----------------------
LAUNCHER_POD = "pipeline-step-7x2kq"


@pytest.fixture
def outside_a_pod(monkeypatch, tmp_path):
    """No service-account namespace file: the step does not run in a pod."""
    import pinpoint.provision.namespace as namespace

    monkeypatch.setattr(namespace, "SA_NAMESPACE_FILE", tmp_path / "no-sa-namespace-file")
    monkeypatch.setenv("HOSTNAME", LAUNCHER_POD)


@pytest.fixture
def in_a_pod(monkeypatch, tmp_path):
    """The step runs in pod LAUNCHER_POD of namespace team-a (its service-account namespace file)."""
    import pinpoint.provision.namespace as namespace

    sa = tmp_path / "sa-namespace"
    sa.write_text("team-a\n")
    monkeypatch.setattr(namespace, "SA_NAMESPACE_FILE", sa)
    monkeypatch.setenv("HOSTNAME", LAUNCHER_POD)
    return sa


def _on_claim(tmp_path, *parts, flavor="tfjob", **overrides):
    """A run folder provisioned at <claim root>/<parts...>/<name>; the claim root stands for /runs."""
    from pinpoint.provision import provision

    cfg = _config(flavor, name=parts[-1] if parts else "k8s-test", **overrides)
    root = tmp_path / "claim"
    out = root.joinpath(*parts) if parts else root / cfg.name
    provision(cfg, out)
    return cfg, root, out


def _train_options(lines, **kw):
    from pinpoint.k8s.launch import LaunchOptions

    return LaunchOptions(poll_seconds=0.01, image_pull_grace_seconds=0.2, failed_create_grace_seconds=0,
                         operator_grace_seconds=5, retry_base_seconds=0.01, log=lines.append, **kw)


def test_namespace_other_than_the_pods_is_refused(tmp_path, monkeypatch, outside_a_pod):
    import pinpoint.provision.namespace as namespace
    from pinpoint.errors import ConfigError
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    sa = tmp_path / "sa-namespace"
    sa.write_text("team-b\n")
    monkeypatch.setattr(namespace, "SA_NAMESPACE_FILE", sa)
    with FakeKubeApiServer("success") as fake:
        with pytest.raises(ConfigError) as err:
            launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root, options=_train_options([]))
        assert str(err.value) == (
            "cluster.namespace: got 'team-a' but this step runs in namespace 'team-b', where its service account "
            "has its permissions; remove cluster.namespace or set it to 'team-b'"
        )
        assert fake.requests == []


def test_run_folder_outside_the_claim_mount_is_refused(tmp_path, outside_a_pod):
    from pinpoint.errors import ConfigError
    from pinpoint.k8s.launch import launch_training

    cfg, root, _ = _on_claim(tmp_path)
    elsewhere = tmp_path / "elsewhere" / cfg.name
    with FakeKubeApiServer("success") as fake:
        with pytest.raises(ConfigError) as err:
            launch_training(cfg, elsewhere, api_client=fake.api_client(), runs_mount=root, options=_train_options([]))
        assert str(err.value) == (
            f"run_dir: got '{elsewhere}', outside {root} where this step and the training pods mount "
            f"cluster.runs_volume_claim 'shared-runs' (the pods could not write there); put the run folder under "
            f"{root}/, e.g. {root}/k8s-test"
        )
        assert fake.requests == []


@pytest.mark.parametrize("cluster, tracking_uri, expected", [
    ({"image": "pinpoint-gpu:latest", "emulate": False, "devices_per_worker": 1,
      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, None,
     "cluster.image: got 'pinpoint-gpu:latest', a name without a registry host"),
    ({}, "https://u:secret-pw@mlflow.example.com", "tracking.uri: got a URI with credentials (user:password@host)"),
], ids=["unqualified-image-real-gpu", "credentials-in-uri"])
def test_what_provision_only_warned_about_stops_the_launch(tmp_path, outside_a_pod, cluster, tracking_uri, expected):
    """Provision writes the folder without manifests and a warning (a local run still works);
    the launch step refuses with the same line before calling the API."""
    from pinpoint.config import config_from_dict
    from pinpoint.errors import ProvisionError
    from pinpoint.k8s.launch import launch_training
    from pinpoint.provision import provision

    base = _config(cluster=cluster).model_dump(mode="json", exclude_unset=True)
    base["tracking"] = {"enabled": False, **({"uri": tracking_uri} if tracking_uri else {})}
    cfg = config_from_dict(base)
    root = tmp_path / "claim"
    summary = provision(cfg, root / cfg.name)
    assert summary["manifests"] == [] and [w.split(",")[0].split(";")[0] for w in summary["warnings"]] == [
        expected.split(",")[0].split(";")[0]]
    with FakeKubeApiServer("success") as fake:
        with pytest.raises(ProvisionError) as err:
            launch_training(cfg, root / cfg.name, api_client=fake.api_client(), runs_mount=root,
                            options=_train_options([]))
        assert str(err.value).startswith(expected) and str(err.value) == summary["warnings"][0]
        assert "secret-pw" not in str(err.value)
        assert fake.requests == []


@pytest.mark.parametrize(
    "modes, expected",
    [
        (None, "cluster.runs_volume_claim: PersistentVolumeClaim team-a/shared-runs not found; create it "
               "(accessModes: [ReadWriteMany]) in namespace team-a or fix the name"),
        (["ReadWriteOnce"], "cluster.runs_volume_claim: PersistentVolumeClaim team-a/shared-runs has accessModes "
                            "['ReadWriteOnce']; multi_worker_mirrored runs pods on several nodes that all mount it; "
                            "use a ReadWriteMany claim (NFS, CephFS, Filestore, EFS...)"),
    ],
)
def test_the_claim_must_exist_and_be_read_write_many(tmp_path, outside_a_pod, modes, expected):
    from pinpoint.errors import ConfigError
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    with FakeKubeApiServer("success") as fake:
        if modes:
            fake.add_pvc("team-a", "shared-runs", modes)
        with pytest.raises(ConfigError) as err:
            launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root, options=_train_options([]))
        assert str(err.value) == expected
        assert fake.created == []


def test_training_on_the_claim_succeeds_and_pods_write_the_run_folder(tmp_path, outside_a_pod):
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    lines: list[str] = []
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options(lines)) == 0
        _assert_cleaned_up(fake)
    assert (out / "placement.json").is_file()


@pytest.mark.parametrize(
    "scenario, overrides, expected",
    [
        ("peer_lost", {"train": {"max_restarts": 0}},
         "pod k8s-test-worker-0 (worker:0): restarted 1 times, more than train.max_restarts=0; see its log above for "
         "why it keeps exiting with a retryable code (>= 128), fix that or raise train.max_restarts"),
        ("unschedulable", {"cluster": {"unschedulable_grace_s": 0}},
         "pod k8s-test-chief-0: cannot be scheduled for 0s (0/3 nodes are available: 3 Insufficient nvidia.com/gpu.); "
         "request fewer GPUs/CPU/memory per replica (cluster.*), fix node_selector/tolerations, or add nodes"),
    ],
)
def test_launch_training_takes_its_limits_from_the_config(tmp_path, outside_a_pod, scenario, overrides, expected):
    from pinpoint.errors import TrainingFailed
    from pinpoint.k8s.launch import LaunchOptions, launch_training

    cfg, root, out = _on_claim(tmp_path, **overrides)
    with FakeKubeApiServer(scenario) as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        # The options' own values are replaced by the config's.
        options = _train_options([])
        options.max_restarts, options.unschedulable_grace_seconds = 99, 3600
        with pytest.raises(TrainingFailed) as err:
            launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root, options=options)
        assert str(err.value) == expected
        _assert_cleaned_up(fake)
    assert (LaunchOptions().max_restarts, options.max_restarts) == (None, 99)  # the caller's object is not changed


def test_launch_training_times_out_after_cluster_deadline(tmp_path, outside_a_pod):
    from pinpoint.errors import TrainingFailed
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path, cluster={"deadline_s": 60})
    with FakeKubeApiServer("hang") as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        options = _train_options([], clock=lambda: fake.pod_lists * 30.0)  # 30 s per poll
        with pytest.raises(TrainingFailed) as err:
            launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root, options=options)
        assert str(err.value) == (
            "kubernetes: k8s-test did not finish within 60s (pods: k8s-test-chief-0=Running, "
            "k8s-test-worker-0=Running); raise cluster.deadline_s or look at the pod logs"
        )
        assert fake.pod_lists == 4
        _assert_cleaned_up(fake)


def test_pods_write_where_the_steps_read_for_a_nested_run_folder(tmp_path, monkeypatch, outside_a_pod):
    """Steps read /runs/sweep/variant-a; the pods must write there too (not /runs/<name>). The
    provision and launch steps see the claim at `root` here (tests cannot write /runs)."""
    from pinpoint.k8s.launch import launch_training
    from pinpoint.provision import manifests

    root = tmp_path / "claim"
    pod_run_rel = manifests.pod_run_rel  # the provision step, with the claim mounted at `root`
    monkeypatch.setattr(manifests, "pod_run_rel", lambda out_dir, name: pod_run_rel(out_dir, name, str(root)))
    cfg, root, out = _on_claim(tmp_path, "sweep", "variant-a")
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options([])) == 0
    assert json.loads((root / "sweep" / "variant-a" / "placement.json").read_text())["pod"].startswith("variant-a-")


def test_a_sweep_on_kubernetes_gets_every_variants_placement(tmp_path, monkeypatch, outside_a_pod):
    """placement_sweep's variants as its provision step derives them (name '<name>-<variant>',
    folder '<run_dir>/<variant>'), launched one after the other on one claim: each variant's pods
    write its own placement.json where the compare step reads it."""
    from pinpoint.config import config_from_dict
    from pinpoint.k8s.launch import launch_training
    from pinpoint.provision import manifests, provision

    root = tmp_path / "claim"
    pod_run_rel = manifests.pod_run_rel
    monkeypatch.setattr(manifests, "pod_run_rel", lambda out_dir, name: pod_run_rel(out_dir, name, str(root)))
    base = _config().model_dump(mode="json", exclude_unset=True)
    variants = {"ring": {"all_reduce": "ring"}, "auto": {"all_reduce": "auto"}}
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        for label, overrides in variants.items():
            cfg = config_from_dict({**base, "name": f"{base['name']}-{label}", "train": {**base["train"], **overrides}})
            out = root / "k8s-test-sweep" / label
            provision(cfg, out)
            assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                                   options=_train_options([])) == 0
        assert (fake.objects, fake.pods) == ({}, {})  # each launch cleaned up after itself
    written = {label: json.loads((root / "k8s-test-sweep" / label / "placement.json").read_text())["pod"]
               for label in variants}
    assert [pod.rsplit("-", 2)[0] for pod in written.values()] == ["k8s-test-ring", "k8s-test-auto"]


# ---- owner references: the garbage collector removes a dead step's objects ---------------------
def test_objects_are_owned_by_the_launcher_pod_and_collected_with_it(tmp_path, in_a_pod):
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    with FakeKubeApiServer("success") as fake:
        uid = fake.add_pod("team-a", LAUNCHER_POD)
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options([], keep=True)) == 0
        assert [k[0] for k in fake.objects] == ["ConfigMap", "TFJob"]
        for obj in fake.objects.values():
            assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": LAUNCHER_POD,
                                                           "uid": uid, "blockOwnerDeletion": False,
                                                           "controller": False}]
        assert fake.pods  # the TFJob's pods, kept (keep=True)
        fake.delete_pod("team-a", LAUNCHER_POD)
        assert fake.objects == {}
        assert fake.pods == {}
        assert sorted(fake.collected) == sorted(fake.created)


def test_outside_a_pod_objects_have_no_owner(tmp_path, outside_a_pod):
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    with FakeKubeApiServer("success") as fake:
        fake.add_pod("team-a", LAUNCHER_POD)  # HOSTNAME names a pod, but no namespace file: not in a pod
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options([], keep=True)) == 0
        assert len(fake.objects) == 2
        assert [obj["metadata"].get("ownerReferences") for obj in fake.objects.values()] == [None, None]


def test_hostname_that_is_no_pod_gives_no_owner(tmp_path, in_a_pod):
    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path)
    lines: list[str] = []
    with FakeKubeApiServer("success") as fake:  # no pod named LAUNCHER_POD
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options(lines, keep=True)) == 0
        assert [obj["metadata"].get("ownerReferences") for obj in fake.objects.values()] == [None, None]
    assert (f"[k8s] pod team-a/{LAUNCHER_POD} not found; the created objects get no ownerReference") in lines


# ---- 409: a dead attempt's leftovers are replaced, a live run's objects are left alone ---------
@pytest.mark.parametrize("owner_phase", ["Succeeded", "Failed", "gone"])
def test_leftover_of_a_dead_attempt_is_replaced(run_dir, owner_phase):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success") as fake:
        fake.add_pod("team-a", "pipeline-step-old", phase="Running" if owner_phase == "gone" else owner_phase)
        fake.add_object("TFJob", "team-a", "k8s-test", owner_pod="pipeline-step-old")
        if owner_phase == "gone":
            del fake.launcher_pods[("team-a", "pipeline-step-old")]
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        assert (f"[k8s] TFJob team-a/k8s-test is left over by a dead attempt (launcher pod pipeline-step-old "
                f"{owner_phase}); replacing it") in lines
        assert fake.objects == {}
        assert fake.deleted == [("TFJob", "team-a", "k8s-test"), *reversed(fake.created)]
        assert [k[0] for k in fake.created] == ["ConfigMap", "TFJob"]


@pytest.mark.parametrize(
    "owner, owned",
    [("running", "owned by pod pipeline-step-other, Running"), (None, "no launcher pod owns it")],
)
def test_name_taken_by_another_run_is_refused_and_left_alone(run_dir, owner, owned):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success") as fake:
        fake.add_pod("team-a", "pipeline-step-other", phase="Running")
        theirs = fake.add_object("TFJob", "team-a", "k8s-test",
                                 owner_pod="pipeline-step-other" if owner else None)
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert str(err.value) == (
            f"kubernetes: TFJob team-a/k8s-test already exists ({owned}) — another run uses this name; wait for it, "
            "delete it with `kubectl delete tfjob -n team-a k8s-test`, or give this run its own name"
        )
        assert fake.objects == {("TFJob", "team-a", "k8s-test"): theirs}
        assert fake.created == [("ConfigMap", "team-a", "k8s-test-config")]
        assert fake.deleted == [("ConfigMap", "team-a", "k8s-test-config")]


# ---- 403: the line names the verb and the resource ----------------------------------------------
@pytest.mark.parametrize(
    "verb, resource",
    [("create", "tfjobs"), ("list", "pods"), ("get", "pods/log"), ("get", "tfjobs"), ("list", "events")],
)
def test_forbidden_call_names_verb_and_resource(run_dir, verb, resource):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success", forbid={(verb, resource)}) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert str(err.value) == (
            f"kubernetes: forbidden to {verb} {resource} in namespace team-a; apply docker/rbac.yaml (Role + "
            f"RoleBinding for the pipeline's service account) or grant its service account '{verb}' on "
            f"'{resource}' there"
        )
        assert fake.objects == {}


# ---- transient API errors are retried ----------------------------------------------------------
def test_transient_api_errors_are_retried(run_dir):
    cfg, out = run_dir("tfjob")
    flaky = {"POST tfjobs": 2, "GET pods": (3, "reset"), "GET pods/log": (1, 503), "GET tfjobs": (1, "timeout"),
             "DELETE configmaps": (1, 502)}
    with FakeKubeApiServer("success", flaky=flaky) as fake:
        fake.hang_seconds = 1.0
        rc, lines = _launch(fake, cfg, out, request_timeout_seconds=0.3)
        assert rc == 0
        assert [line.split(": ", 1)[0] for line in lines if "; retry " in line] == [
            "[k8s] create tfjobs in namespace team-a",
            "[k8s] create tfjobs in namespace team-a",
            "[k8s] list pods in namespace team-a",
            "[k8s] list pods in namespace team-a",
            "[k8s] list pods in namespace team-a",
            "[k8s] get tfjobs k8s-test in namespace team-a",
            "[k8s] get pods/log k8s-test-chief-0 in namespace team-a",
            "[k8s] delete configmaps k8s-test-config in namespace team-a",
        ]
        assert any("get tfjobs k8s-test in namespace team-a: " in line and "Read timed out. (read timeout=0.3)" in line
                   for line in lines)
        assert fake.requests.count(("POST", "/apis/kubeflow.org/v1/namespaces/team-a/tfjobs")) == 3
        assert "[k8s-test-chief-0] done" in lines
        _assert_cleaned_up(fake)


@pytest.mark.parametrize(
    "flaky, expected",
    [
        ({"GET pods": (100, 503)}, "kubernetes: list pods in namespace team-a failed 5 times (last: HTTP 503 "
                                   "Service Unavailable); the API server is overloaded or restarting; retry the step later"),
        ({"POST tfjobs": (100, 500)}, "kubernetes: create tfjobs in namespace team-a failed 5 times (last: HTTP 500 "
                                      "Internal Server Error); the API server is overloaded or restarting; retry the "
                                      "step later"),
    ],
)
def test_a_failing_endpoint_ends_in_one_line_after_the_retries(run_dir, flaky, expected):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success", flaky=flaky) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert str(err.value) == expected
        assert fake.objects == {}


# ---- SIGTERM: clean up, exit 143 ---------------------------------------------------------------
SIGTERM_SCRIPT = """
import sys
from pathlib import Path
from kubernetes import client
from components._common import run_step
from pinpoint.k8s.launch import LaunchOptions, launch_manifests

conf = client.Configuration()
conf.host = sys.argv[1]
conf.retries = 0
run_step(launch_manifests, client.ApiClient(conf), Path(sys.argv[2]), "k8s-test", "team-a",
         LaunchOptions(poll_seconds=0.05, retry_base_seconds=0.01))
"""


def sigterm_launch(fake, out, name: str, watching=lambda fake: None) -> tuple[int, str, str]:
    """Run the launch step as its own process against `fake`, wait until it watches its pods (its
    third pod list), call `watching(fake)`, send it SIGTERM; its exit code, stdout and stderr."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "src")])}
    script = SIGTERM_SCRIPT.replace('"k8s-test"', repr(name))
    proc = subprocess.Popen([sys.executable, "-c", script, fake.url, str(out)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 40
        while fake.pod_lists < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert fake.pod_lists >= 3, "the launch never got to watching its pods"
        watching(fake)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr


def test_sigterm_cleans_up_and_exits_143(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("hang") as fake:
        def two_objects(fake):
            assert len(fake.objects) == 2

        rc, stdout, stderr = sigterm_launch(fake, out, "k8s-test", watching=two_objects)
        assert rc == 143
        assert stderr.strip().splitlines()[-1] == (
            "pinpoint: kubernetes: k8s-test stopped by SIGTERM (run terminated or pod evicted); deleted 2 object(s)"
        )
        assert "[k8s] cleaned up 2 object(s)" in stdout
        _assert_cleaned_up(fake)


def test_sigterm_handler_is_restored(run_dir):
    import signal

    cfg, out = run_dir("tfjob")
    before = signal.getsignal(signal.SIGTERM)
    with FakeKubeApiServer("success") as fake:
        rc, _ = _launch(fake, cfg, out)
    assert rc == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_fake_claim_follows_the_pods_mount_and_out(tmp_path, outside_a_pod):
    """The fake's claim emulation reads the pod spec, whatever the manifests say: with the pods'
    runs mount rewritten by hand (subPath = the run folder relative to /runs, mounted at /runs/<rel>,
    --out /runs/<rel>), placement.json lands in the nested run folder on the claim."""
    import yaml

    from pinpoint.k8s.launch import launch_training

    cfg, root, out = _on_claim(tmp_path, "sweep", "variant-a")
    manifest = out / "manifests" / "tfjob.yaml"
    doc = yaml.safe_load(manifest.read_text())
    for spec in doc["spec"]["tfReplicaSpecs"].values():
        container = spec["template"]["spec"]["containers"][0]
        cmd = container["command"]
        cmd[cmd.index("--out") + 1] = "/runs/sweep/variant-a"
        for mount in container["volumeMounts"]:
            if mount["name"] == "runs":
                mount.update(mountPath="/runs/sweep/variant-a", subPath="sweep/variant-a")
    manifest.write_text(yaml.safe_dump(doc))
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options([])) == 0
    assert json.loads((root / "sweep" / "variant-a" / "placement.json").read_text())["pod"].startswith("variant-a-")
    assert not (root / "variant-a").exists()


# ---- RBAC: docker/rbac.yaml grants exactly the calls the launch step makes ---------------------
_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/[^/]+/(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?"
                   r"(?P<sub>/log)?$")


def _rbac_calls(requests) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of each request the fake API server recorded."""
    calls = set()
    for method, path in requests:
        m = _PATH.match(path)
        assert m, path
        resource = m["res"] + ("/log" if m["sub"] else "")
        verb = {"POST": "create", "DELETE": "delete"}.get(method) or ("get" if m["name"] else "list")
        calls.add((m["group"] or "", resource, verb))
    return calls


FLAVORS = ["tfjob", "plain", "jobset", "trainjob"]
LEFTOVERS = {
    "tfjob": [("TFJob", "k8s-test")],
    "plain": [("Service", "k8s-test"), ("Job", "k8s-test-worker")],
    "jobset": [("JobSet", "k8s-test")],
    "trainjob": [("TrainJob", "k8s-test")],
}


def _launch_calls(tmp_path, flavor) -> set[tuple[str, str, str]]:
    """Every path a launch of `flavor` takes (in a pod: owner lookup; a dead attempt's leftover
    replaced; the claim checked; pods watched and their logs read; events read; cleanup), as the
    (API group, resource, verb) calls the fake API server recorded."""
    from pinpoint.k8s.launch import launch_training
    from pinpoint.provision.trainjob import runtime

    cfg, root, out = _on_claim(tmp_path / flavor, flavor=flavor)
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_runtime(runtime())
        fake.add_pod("team-a", LAUNCHER_POD)
        fake.add_pod("team-a", "pipeline-step-old", phase="Failed")
        for kind, name in [("ConfigMap", "k8s-test-config"), *LEFTOVERS[flavor]]:
            fake.add_object(kind, "team-a", name, owner_pod="pipeline-step-old")
        fake.add_pvc("team-a", "shared-runs", ["ReadWriteMany"])
        assert launch_training(cfg, out, api_client=fake.api_client(), runs_mount=root,
                               options=_train_options([])) == 0
        return _rbac_calls(fake.requests)


def _granted() -> set[tuple[str, str, str]]:
    from pinpoint.provision.rbac import rbac_docs

    role, _ = rbac_docs("team-a", "pipeline-runner")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rbac_yaml_grants_what_each_flavours_launch_calls(tmp_path, in_a_pod, flavor):
    """The role the generator writes (docker/rbac.yaml is its output) misses nothing a launch of
    any flavour calls."""
    assert sorted(_launch_calls(tmp_path, flavor) - _granted()) == []


def test_rbac_yaml_grants_nothing_no_launch_calls(tmp_path, in_a_pod):
    """...and grants nothing that no flavour's launch calls (one role serves the four flavours)."""
    used = set().union(*(_launch_calls(tmp_path, f) for f in FLAVORS))
    assert sorted(_granted() - used) == []
