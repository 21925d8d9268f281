"""The launch step with the jobset and trainjob flavours against FakeKubeApiServer, a FAKE API
server whose FAKE JobSet and Trainer controllers (tests/fakes/jobset_controller.py) apply the
provisioned manifests' own policies: the cluster restarts the whole group, the launch step only
watches (conditions, status.restarts, the chief's log across restarts) and cleans up."""

from __future__ import annotations

import pytest

from tests.conftest import NO_TRACKING, make_config
from tests.fakes.kube_api import FakeKubeApiServer
from tests.test_k8s_launch import _assert_cleaned_up, hang_until_steady

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _config(flavor="jobset", max_restarts=2, **cluster):
    return make_config("grp", cluster={"chief": 1, "workers": 2, "evaluator": 1, "flavor": flavor,
                                       "image": "registry.example/p:1", "runs_volume_claim": "shared-runs",
                                       "namespace": "team-a", **cluster},
                       train={"strategy": "multi_worker_mirrored", "max_restarts": max_restarts}, tracking=NO_TRACKING)


@pytest.fixture
def claim(tmp_path):
    """provision(cfg) into <claim>/grp; returns (cfg, claim root, run folder)."""
    from pinpoint.provision import provision

    def make(flavor="jobset", **kw):
        cfg = _config(flavor, **kw)
        root = tmp_path / "claim"
        out = root / cfg.name
        provision(cfg, out)
        return cfg, root, out

    return make


def _launch(fake, cfg, out, **opts):
    from pinpoint.k8s.launch import LaunchOptions, launch_manifests
    from pinpoint.provision.trainjob import runtime

    fake.add_runtime(runtime())
    lines: list[str] = []
    options = LaunchOptions(poll_seconds=0.01, timeout_seconds=20, operator_grace_seconds=5,
                            failed_create_grace_seconds=0, retry_base_seconds=0.01, log=lines.append,
                            max_restarts=cfg.train.max_restarts)
    for k, v in opts.items():
        setattr(options, k, v)
    try:
        return launch_manifests(fake.api_client(), out, cfg.name, "team-a", options), lines
    finally:
        _launch.lines = lines


FLAVORS = ["jobset", "trainjob"]
CHIEF = {"jobset": "grp-chief-0-0", "trainjob": "grp-node-0-0"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_success_on_the_chief_streams_its_log_and_cleans_up(claim, flavor):
    cfg, root, out = claim(flavor)
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        workload = "JobSet" if flavor == "jobset" else "TrainJob"
        assert [k[0] for k in fake.created] == ["ConfigMap", workload]
        # The JobSet controller made the headless Service and the child Jobs, not the launch step.
        assert f"[{CHIEF[flavor]}] done" in lines and lines[-2:] == ["[k8s] grp: training finished",
                                                                   "[k8s] cleaned up 2 object(s)"]
        # Only the chief's log is read: no other pod's line appears.
        assert all(line.startswith((f"[{CHIEF[flavor]}]", "[k8s]")) for line in lines)
        assert (root / "grp" / "placement.json").is_file()
        _assert_cleaned_up(fake)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_lost_worker_restarts_the_group_which_resumes_from_the_checkpoint(claim, flavor):
    cfg, root, out = claim(flavor)
    with FakeKubeApiServer("worker_lost_once", pvc_root=root) as fake:
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        # The cluster (the fake JobSet controller, applying the manifest's failurePolicy) restarted
        # every child Job once, counted; the launch step only reported it.
        assert [a for _, a, _ in fake.jobset_restarts] == ["RestartJobSet"]
        assert "[k8s] JobSet team-a/grp restarted the whole group (restart 1; 1 of 2 allowed counted)" in lines
        # The restarted chief reads the checkpoint the first attempt wrote on the shared claim.
        chief = f"[{CHIEF[flavor]}] "
        assert lines.index(chief + "restored checkpoint at step 1") > \
            lines.index("[k8s] JobSet team-a/grp restarted the whole group (restart 1; 1 of 2 allowed counted)") > \
            lines.index(chief + "no checkpoint: starting at step 0")
        assert (root / "grp" / "ckpt").read_text() == "2"
        _assert_cleaned_up(fake)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_exhausted_restarts_end_in_one_line(claim, flavor):
    from pinpoint.errors import TrainingFailed

    cfg, root, out = claim(flavor, max_restarts=1)
    with FakeKubeApiServer("worker_lost", pvc_root=root) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        fix = ("a task kept exiting with a retryable code (>= 128: a lost peer, a signal); see the logs above, fix "
               "the cause or raise train.max_restarts")
        if flavor == "jobset":  # the JobSet's own maxRestarts = train.max_restarts
            first = "grp-worker-0"
            assert str(err.value) == (
                f"kubernetes: JobSet team-a/grp failed after 1 restart(s) (ReachedMaxRestarts: jobset failed due to "
                f"reaching max number of restarts (first failed job: {first})); {fix}")
            assert len(fake.jobset_restarts) == 1
        else:  # the runtime's maxRestarts is a ceiling: the launch step stops at train.max_restarts
            assert str(err.value) == f"kubernetes: TrainJob team-a/grp restarted 2 times, more than " \
                                     f"train.max_restarts=1 ({fix})"
            assert len(fake.jobset_restarts) == 2
        assert "\n" not in str(err.value)
        _assert_cleaned_up(fake)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_disruption_is_not_counted(claim, flavor):
    cfg, root, out = claim(flavor, max_restarts=0)
    with FakeKubeApiServer("disruption", pvc_root=root) as fake:
        rc, lines = _launch(fake, cfg, out)
        assert rc == 0
        # The preempted worker was recreated by its Job (podFailurePolicy Ignore): no JobSet
        # restart, so even max_restarts 0 completes.
        assert fake.jobset_restarts == []
        assert not any("restarted the whole group" in line for line in lines)
        assert len(fake.pod_uids) == 4 + 1
        _assert_cleaned_up(fake)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_permanent_exit_fails_at_once_in_one_line(claim, flavor):
    from pinpoint.errors import TrainingFailed

    cfg, root, out = claim(flavor)
    with FakeKubeApiServer("crash", pvc_root=root) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        container = "tensorflow" if flavor == "jobset" else "node"
        assert str(err.value) == f"pod {CHIEF[flavor]}: container {container} exited with code 1; see its log above"
        assert f"[{CHIEF[flavor]}] ValueError: boom" in _launch.lines
        assert fake.jobset_restarts == []
        _assert_cleaned_up(fake)


def test_missing_jobset_crd_and_missing_runtime_are_one_line(claim):
    from pinpoint.errors import TrainingFailed

    cfg, root, out = claim("jobset")
    with FakeKubeApiServer("success", missing_kinds=("JobSet",)) as fake:
        with pytest.raises(TrainingFailed, match=r"^kubernetes: the JobSet resource \(jobset.x-k8s.io/v1alpha2 "
                                                 r"jobsets\) is not installed; install JobSet"):
            _launch(fake, cfg, out)
        assert fake.objects == {}
    cfg, root, out = claim("trainjob")
    with FakeKubeApiServer("success") as fake:
        from pinpoint.k8s.launch import LaunchOptions, launch_manifests

        with pytest.raises(TrainingFailed) as err:  # no add_runtime: the Trainer webhook refuses
            launch_manifests(fake.api_client(), out, cfg.name, "team-a",
                             LaunchOptions(poll_seconds=0.01, retry_base_seconds=0.01, log=lambda line: None))
        assert str(err.value) == (
            "kubernetes: TrainJob team-a/grp refused: the ClusterTrainingRuntime pinpoint-tensorflow is not installed; "
            "apply docker/runtime.yaml (or `pinpoint provision CONFIG --runtime`) once per cluster")
        assert fake.objects == {}


def test_a_jobset_nobody_reconciles_is_one_line(claim, monkeypatch):
    """No JobSet controller: the JobSet never gets a status."""
    from pinpoint.errors import TrainingFailed

    cfg, root, out = claim("jobset")
    with FakeKubeApiServer("success") as fake:
        monkeypatch.setattr(fake, "_jobset_created", lambda js: None)
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out, operator_grace_seconds=0.2)
        assert str(err.value).startswith("kubernetes: the JobSet controller does not seem to run (no status on JobSet "
                                         "team-a/grp after ")
        _assert_cleaned_up(fake)


def test_parameter_server_ps_start_before_the_workers(tmp_path):
    """startupPolicy InOrder: the fake controller creates the worker Job once the ps pods run."""
    from pinpoint.config import config_from_dict
    from pinpoint.provision import provision

    cfg = config_from_dict({"name": "ps", "cluster": {"chief": 1, "workers": 2, "ps": 1, "flavor": "jobset",
                                                     "image": "registry.example/p:1", "runs_volume_claim": "r",
                                                     "namespace": "team-a"},
                            "train": {"strategy": "parameter_server"}, "tracking": {"enabled": False}})
    out = tmp_path / "claim" / "ps"
    provision(cfg, out)
    with FakeKubeApiServer("success", pvc_root=tmp_path / "claim") as fake:
        rc, _ = _launch(fake, cfg, out)
        assert rc == 0
        order = [fake.pod_names[uid] for uid in fake.pod_uids]
        # ps, then the workers, then the chief (each replicatedJob once the previous one's pods run).
        assert order == ["ps-ps-0-0", "ps-worker-0-0", "ps-worker-0-1", "ps-chief-0-0"]


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.timeout(240)  # hang_until_steady: up to 37.5 s a launch on a loaded machine
def test_requests_per_poll_do_not_grow_with_the_pods(tmp_path, flavor):
    """A poll lists pods by label selector once: 2 or 64 workers cost the same requests."""
    from pinpoint.config import config_from_dict
    from pinpoint.provision import provision

    per_poll = []
    for workers in (2, 64):
        cfg = config_from_dict({"name": f"w{workers}", "cluster": {"chief": 1, "workers": workers, "flavor": flavor,
                                                                   "image": "registry.example/p:1",
                                                                   "runs_volume_claim": "r", "namespace": "team-a"},
                                "train": {"strategy": "multi_worker_mirrored"}, "tracking": {"enabled": False}})
        out = tmp_path / "claim" / cfg.name
        provision(cfg, out)
        fake = hang_until_steady(_launch, cfg, out)
        steady = fake.requests_per_poll()[3:]  # every pod is Running from the third poll on
        per_poll.append(set(steady))
    # A poll: list pods, get the JobSet (a TrainJob: and its JobSet), the chief's log, the Events.
    assert per_poll == [{4 if flavor == "jobset" else 5}] * 2


def test_sigterm_cleans_up_a_jobset(claim):
    from tests.test_k8s_launch import sigterm_launch

    cfg, root, out = claim("jobset")
    with FakeKubeApiServer("hang") as fake:
        rc, _, stderr = sigterm_launch(fake, out, "grp")
        assert rc == 143
        assert stderr.strip().splitlines()[-1] == (
            "pinpoint: kubernetes: grp stopped by SIGTERM (run terminated or pod evicted); deleted 2 object(s)")
        _assert_cleaned_up(fake)
        assert fake.pods == {} and fake.child_jobs == set()  # the JobSet's Jobs went with it (GC)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_pods_log_under_the_pipelines_parent_run(claim, flavor):
    from pinpoint.k8s.launch import LaunchOptions, launch_manifests
    from pinpoint.provision.trainjob import runtime

    cfg, root, out = claim(flavor)
    with FakeKubeApiServer("success", pvc_root=root) as fake:
        fake.add_runtime(runtime())
        seen = []
        original = fake._make_group_pod
        fake._make_group_pod = lambda job, i, gen: seen.append(original(job, i, gen)) or seen[-1]
        assert launch_manifests(fake.api_client(), out, cfg.name, "team-a",
                                LaunchOptions(poll_seconds=0.01, retry_base_seconds=0.01, log=lambda line: None),
                                parent_run_id="parent-123") == 0
        assert len(seen) == 4
        for pod in seen:  # every pod's command, whoever built it (the JobSet, or Trainer from the runtime)
            cmd = pod["spec"]["containers"][0]["command"]
            assert cmd[4:6] == ["pinpoint", "train"] and cmd[-2:] == ["--parent-run-id", "parent-123"]
