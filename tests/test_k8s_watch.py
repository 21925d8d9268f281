"""The launch step's watcher (pinpoint.k8s.watch) against FakeKubeApiServer, a FAKE API server:
restarts per replica, TFJob/Job conditions, FailedCreate Events, a missing Training Operator,
grace timers keyed by pod UID, and incremental log streaming."""

from __future__ import annotations

import pytest

from tests import test_k8s_launch
from tests.fakes.kube_api import FakeKubeApiServer
from tests.test_k8s_launch import _assert_cleaned_up, _launch, hang_until_steady

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
run_dir = test_k8s_launch.run_dir  # the same provisioned run folder fixture


def _pod_lines(lines, pod):
    return [line for line in lines if line.startswith(f"[{pod}] ")]


# ---- restarts (the operator's ExitCode policy recreates a pod that exits >= 128) ---------------
@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
def test_restarts_beyond_max_restarts_fail_with_one_line(run_dir, flavor):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir(flavor)
    with FakeKubeApiServer("peer_lost") as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out, max_restarts=2)
        message = str(err.value)
        pod = message.split(" ", 2)[1]
        # TFJob: the operator reuses the name (new uid); a Job makes a new pod name for the index.
        assert pod == "k8s-test-worker-0" if flavor == "tfjob" else pod.startswith("k8s-test-worker-0-")
        assert message == (
            f"pod {pod} (worker:0): restarted 3 times, more than train.max_restarts=2; see its log above for why it "
            "keeps exiting with a retryable code (>= 128), fix that or raise train.max_restarts"
        )
        assert len(fake.pod_uids) == 2 + 3  # chief, worker, and the worker recreated 3 times
        _assert_cleaned_up(fake)


def test_restarts_within_the_budget_succeed_and_each_log_line_is_printed_once(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("peer_lost_once") as fake:
        rc, lines = _launch(fake, cfg, out, max_restarts=1)
        assert rc == 0
        assert len(fake.pod_uids) == 3  # the worker was recreated once, under the same name
        worker = _pod_lines(lines, "k8s-test-worker-0")
        assert worker == [
            "[k8s-test-worker-0] k8s-test-worker-0 starting",
            "[k8s-test-worker-0] step 1 loss 2.30",
            "[k8s-test-worker-0] peer lost; exiting 138 to be restarted",
            "[k8s-test-worker-0] k8s-test-worker-0 starting (attempt 2)",
            "[k8s-test-worker-0] step 1 loss 2.30",
            "[k8s-test-worker-0] step 2 loss 1.10",
            "[k8s-test-worker-0] done",
        ]
        assert _pod_lines(lines, "k8s-test-chief-0") == [
            "[k8s-test-chief-0] k8s-test-chief-0 starting",
            "[k8s-test-chief-0] step 1 loss 2.30",
            "[k8s-test-chief-0] done",
        ]
        _assert_cleaned_up(fake)


def test_log_reads_after_the_first_are_incremental(run_dir):
    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("hang") as fake:
        from pinpoint.errors import TrainingFailed

        with pytest.raises(TrainingFailed):
            _launch(fake, cfg, out, timeout_seconds=0.5)
        reads = [q for m, p, q in fake.queries if p == "/api/v1/namespaces/team-a/pods/k8s-test-chief-0/log"]
        assert all(q.get("timestamps") in ("true", "True") for q in reads)
        assert "sinceSeconds" not in reads[0]
        assert all(int(q["sinceSeconds"]) <= 6 for q in reads[1:])
        chief_uid = fake.pod_uids[0]
        written = [f"[k8s-test-chief-0] {line}" for _, line in fake.logs[chief_uid]]
        served = fake.log_lines_served[chief_uid]
    # The pod's log as the hang scenario writes it: its start, step 1, then one line per pod list.
    assert written == ["[k8s-test-chief-0] k8s-test-chief-0 starting", "[k8s-test-chief-0] step 1 loss 2.30",
                       *(f"[k8s-test-chief-0] step {i} loss 1.00" for i in range(3, len(written) + 1))]
    # Every line the pod wrote is printed exactly once, though the reads returned lines again.
    assert _pod_lines(_launch.lines, "k8s-test-chief-0") == written
    assert served > len(written), (served, len(written))


# ---- a launch that cannot finish ends with one line, and leaves nothing behind ----------------------
QUOTA = ('kubernetes: {obj} cannot create its pods ({reason}: Error creating: pods "{pod}" is forbidden: '
         "exceeded quota: gpu-quota, requested: nvidia.com/gpu=4, used: nvidia.com/gpu=4, limited: "
         "nvidia.com/gpu=4); free or raise the ResourceQuota (`kubectl describe resourcequota -n team-a`) or "
         "request fewer resources per replica (cluster.*)")
NOT_FINISHED = ("kubernetes: k8s-test did not finish within 0s (pods: none created); raise cluster.deadline_s or "
                "look at the pod logs")
FAILED_LAUNCHES = [
    # (flavor, fake scenario, launch options, the one line)
    pytest.param("plain", "failed_indexes", {"max_restarts": 5},
                 "kubernetes: Job team-a/k8s-test-worker failed (FailedIndexes: Job has failed indexes); an index "
                 "failed more often than backoffLimitPerIndex (train.max_restarts); see the pod logs above, fix the "
                 "cause or raise train.max_restarts", id="job-failed-by-backoff-limit-per-index"),
    pytest.param("tfjob", "tfjob_failed", {"max_restarts": 5},
                 "kubernetes: TFJob team-a/k8s-test failed (TFJobFailed: TFJob team-a/k8s-test has failed because 1 "
                 "Worker replica(s) failed.); see the pod logs above", id="tfjob-failed-condition"),
    pytest.param("tfjob", "quota", {}, QUOTA.format(obj="TFJob team-a/k8s-test", reason="FailedCreatePod",
                                                    pod="k8s-test-chief-0"), id="quota-event-tfjob"),
    pytest.param("plain", "quota", {}, QUOTA.format(obj="Job team-a/k8s-test-chief", reason="FailedCreate",
                                                    pod="k8s-test-chief-0-x7k2p"), id="quota-event-job"),
    # Within its grace period a FailedCreate Event is not the end: the timeout is.
    pytest.param("tfjob", "quota", {"failed_create_grace_seconds": 3600, "timeout_seconds": 0.3}, NOT_FINISHED,
                 id="quota-event-within-its-grace"),
    pytest.param("tfjob", "no_operator", {"operator_grace_seconds": 0},
                 "kubernetes: the Training Operator does not seem to run (no status on TFJob team-a/k8s-test after "
                 "0s); check `kubectl get pods -n kubeflow`, or set cluster.flavor: plain", id="no-training-operator"),
    pytest.param("tfjob", "no_operator", {"operator_grace_seconds": 3600, "timeout_seconds": 0.3}, NOT_FINISHED,
                 id="no-training-operator-within-its-grace"),
]


@pytest.mark.parametrize("flavor, scenario, options, line", FAILED_LAUNCHES)
def test_a_launch_that_cannot_finish_ends_with_its_line_and_cleans_up(run_dir, flavor, scenario, options, line):
    """Job/TFJob Failed conditions, FailedCreate Events (after their grace period) and a TFJob no
    operator picks up each end the launch with one line; everything created is deleted."""
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir(flavor)
    with FakeKubeApiServer(scenario) as fake:
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out, **options)
        assert str(err.value) == line
        _assert_cleaned_up(fake)


# ---- grace timers are keyed by pod UID ---------------------------------------------------------
@pytest.mark.parametrize("grace, fails", [(35, False), (15, True)])
def test_a_recreated_pod_with_the_same_name_gets_a_fresh_unschedulable_timer(run_dir, grace, fails):
    """Each pod UID is unschedulable for at most 20 s (fake clock: 10 s per pod list) while the name
    is for 50 s: a 35 s grace never fires, a 15 s grace does."""
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("unschedulable_recreated") as fake:
        opts = dict(unschedulable_grace_seconds=grace, timeout_seconds=10_000, clock=lambda: fake.pod_lists * 10.0)
        if fails:
            with pytest.raises(TrainingFailed) as err:
                _launch(fake, cfg, out, **opts)
            assert str(err.value).startswith("pod k8s-test-chief-0: cannot be scheduled for 20s (0/3 nodes are "
                                             "available: 3 Insufficient nvidia.com/gpu.)")
            assert len(fake.pod_uids) == 2
        else:
            rc, _ = _launch(fake, cfg, out, **opts)
            assert rc == 0
            assert len(fake.pod_uids) == 4  # both pods recreated once under their names
        _assert_cleaned_up(fake)


def test_workload_deleted_by_someone_else_is_one_line(run_dir):
    from pinpoint.errors import TrainingFailed

    cfg, out = run_dir("tfjob")
    with FakeKubeApiServer("hang") as fake:
        list_pods = fake._list_pods

        def list_then_delete(ns, query):  # `kubectl delete tfjob` from elsewhere, after the 3rd pod list
            items = list_pods(ns, query)
            if fake.pod_lists == 3:
                fake._remove(("TFJob", "team-a", "k8s-test"))
            return items

        fake._list_pods = list_then_delete
        with pytest.raises(TrainingFailed) as err:
            _launch(fake, cfg, out)
        assert str(err.value) == ("kubernetes: TFJob team-a/k8s-test was deleted while running (by someone else, "
                                  "or a TTL); rerun the step")
        assert fake.objects == {}
        assert fake.pod_lists == 3


# ---- scale: a large run's requests per poll do not grow with its pods -----------------------
@pytest.mark.parametrize("flavor", ["tfjob", "plain"])
@pytest.mark.timeout(240)  # hang_until_steady: up to 37.5 s a launch on a loaded machine
def test_a_large_runs_requests_per_poll_do_not_grow_with_the_pods(tmp_path, flavor):
    """Above LaunchOptions.stream_all_logs_up_to pods, only the chief's log is read each poll (and a
    failed pod's once): 12 or 40 workers cost the same requests per poll."""
    from pinpoint.config import config_from_dict
    from pinpoint.provision import provision

    per_poll, logs = [], []
    for workers in (12, 40):
        cfg = config_from_dict({"name": "k8s-test", "cluster": {"chief": 1, "workers": workers, "flavor": flavor,
                                                               "image": "registry.example/p:1",
                                                               "runs_volume_claim": "r", "namespace": "team-a"},
                                "train": {"strategy": "multi_worker_mirrored"}, "tracking": {"enabled": False}})
        out = tmp_path / str(workers)
        provision(cfg, out)
        fake = hang_until_steady(_launch, cfg, out)
        per_poll.append(set(fake.requests_per_poll()[3:]))
        logs.append({p for _, p in fake.requests if p.endswith("/log")})
    assert per_poll[0] == per_poll[1] and len(per_poll[0]) == 1
    assert logs[0] == logs[1] == {"/api/v1/namespaces/team-a/pods/k8s-test-chief-0/log"}
