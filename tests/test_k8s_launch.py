"""The Kubernetes launch path (pinpoint.k8s.launch, the real `kubernetes` client) against
FakeKubeApiServer, a FAKE API server: create -> watch -> failure -> cleanup."""

from __future__ import annotations

import pytest

from tests.fakes.kube_api import FakeKubeApiServer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _config(flavor: str = "tfjob", image: str = "registry.example/pinpoint-cpu:0.1.0"):
    from pinpoint.config import config_from_dict

    return config_from_dict(
        {
            "name": "k8s-test",
            "cluster": {"chief": 1, "workers": 1, "devices_per_worker": 1, "flavor": flavor, "image": image,
                        "runs_volume_claim": "shared-runs",
                        "namespace": "team-a", "memory": "3Gi"},
            "train": {"strategy": "multi_worker_mirrored", "steps": 2},
            "tracking": {"enabled": False},
        }
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
                            timeout_seconds=20, log=lines.append)
    for k, v in opts.items():
        setattr(options, k, v)
    try:
        return launch_manifests(fake.api_client(), out, cfg.name, cfg.cluster.namespace, options,
                                parent_run_id=parent_run_id), lines
    finally:
        _launch.lines = lines


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


def test_leftover_objects_of_an_earlier_attempt_are_replaced(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("success") as fake:
        fake.objects[("ConfigMap", "team-a", "k8s-test-config")] = {"metadata": {"name": "k8s-test-config"}}
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        assert any("exists (an earlier attempt); replacing it" in line for line in lines)
        assert fake.objects == {}


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
    with FakeKubeApiServer("success", forbid=("ConfigMap",)) as fake:
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
        launch_manifests(client, out, cfg.name, cfg.cluster.namespace, LaunchOptions(log=lambda s: None))
    assert "\n" not in str(err.value) and "unreachable" in str(err.value)


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
