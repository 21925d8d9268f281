"""MLflow tracking against a real `mlflow server` process: runs, params, metrics exactly once,
outages at the start / in the middle / at the end, spool upload, checkpoints, the final model."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from pinpoint.config import config_from_dict
from pinpoint.errors import ConfigError
from pinpoint.placement.model.placement import Placement
from pinpoint.tracking import (
    end_parent_run,
    open_step_run,
    resolve_tracking_uri,
    start_parent_run,
)
from pinpoint.tracking.params import config_params
from pinpoint.tracking.replay import upload_spool_command
from pinpoint.tracking.spool import SPOOL_DIR, Spool, find_spools
from pinpoint.tracking.uri import local_store, repo_root
from tests.conftest import make_config


def make_cfg(uri=None, **train):
    return make_config("trk", cluster={"devices_per_worker": 1}, train={"strategy": "none", "steps": 50, **train},
                       tracking={"uri": uri, "experiment": f"t-{uuid.uuid4().hex[:8]}",
                                 "step_metrics_every_s": 0})


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def steps_of(c, run_id, key):
    return sorted(m.step for m in c.get_metric_history(run_id, key))


# ---- unit --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_resolve_tracking_uri_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri(make_cfg()) == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_tracking_uri(make_cfg()) == "http://env:5000"
    assert resolve_tracking_uri(make_cfg("http://cfg:5000")) == "http://cfg:5000"


@pytest.mark.unit
def test_local_store_is_in_the_repo_and_matches_make_mlflow_ui(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root / "tests")
    assert repo_root() == root
    uri, artifacts = local_store()
    assert uri == f"sqlite:///{root}/mlruns/mlflow.db"
    assert artifacts == (root / "mlruns" / "artifacts").as_uri()
    make = (root / "Makefile").read_text()
    assert "sqlite:///mlruns/mlflow.db" in make and "mlruns/artifacts" in make


@pytest.mark.unit
def test_local_store_outside_the_checkout_is_in_the_working_directory(monkeypatch, tmp_path):
    """As docs/tracking.md says: no Pinpoint pyproject.toml above the working directory (another
    project's does not count) -> <cwd>/mlruns."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert repo_root() == tmp_path / "work"
    assert local_store()[0] == f"sqlite:///{tmp_path}/work/mlruns/mlflow.db"
    docs = (Path(__file__).resolve().parents[1] / "docs" / "tracking.md").read_text()
    assert "else of the working directory" in docs


@pytest.mark.unit
def test_params_flatten_config_without_secrets():
    cfg = make_cfg("http://user:secret@host:5000", pinning={"input": "/CPU:0"})
    p = config_params(cfg)
    assert p["train.strategy"] == "none"
    assert p["train.pinning.input"] == "/CPU:0"
    assert p["cluster.devices_per_worker"] == "1"
    assert p["config_digest"] == cfg.digest()
    assert p["version.tensorflow"] and p["version.mlflow"]
    assert not any("secret" in v for v in p.values())
    assert not any(k.startswith("tracking.uri") for k in p)


@pytest.mark.unit
def test_spool_journal_acks_and_pending(tmp_path):
    s = Spool.create(tmp_path / "s", {"local_id": "local-x", "uri": "http://nowhere"})
    a = s.append("metrics", metrics=[["loss", 1.0, 1, 0]])
    b = s.append("metrics", metrics=[["loss", 0.5, 2, 1]])
    assert [r["id"] for r in s.read_new()] == [a["id"], b["id"]]
    assert s.read_new() == []
    s.ack([a])
    again = Spool(tmp_path / "s")  # a new process: acks persist
    assert [r["id"] for r in again.pending()] == [b["id"]]
    assert find_spools(tmp_path) == [tmp_path / "s"]


@pytest.mark.unit
def test_upload_spool_bad_dir_is_one_line_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^upload-spool DIR: got '.*missing', which is not a folder; pass a run folder"):
        upload_spool_command(tmp_path / "missing")
    assert upload_spool_command(tmp_path) == 0
    assert "nothing to upload" in capsys.readouterr().out


@pytest.mark.unit
def test_disabled_or_not_chief_is_a_noop(tmp_path):
    cfg = config_from_dict({"name": "x", "train": {"strategy": "none"}, "tracking": {"enabled": False}})
    with open_step_run(cfg, "train", tmp_path) as run:
        assert run.run_id is None
        run.log_metrics({"loss": 1.0}, step=0)
        run.hook().on_step_end(0, {"loss": 1.0})
    with open_step_run(make_cfg("http://127.0.0.1:9"), "train", tmp_path, is_chief=False) as run:
        assert run.run_id is None
    assert not (tmp_path / SPOOL_DIR).exists()


@pytest.mark.unit
def test_placement_metrics_are_the_headline_numbers():
    from pinpoint.placement.report.metrics import headline_metrics

    m = headline_metrics({"ops_by_device": {"/GPU:0": 12, "/GPU:1": 10},
                          "transfers": {"per_step": {"count": 3, "bytes": 96}}, "fallbacks": []})
    assert m["placement.transfers_per_step"] == 3.0 and m["placement.fallbacks"] == 0.0
    assert any(k.startswith("placement.ops.") for k in m)
    assert all(isinstance(v, float) for v in m.values())


# ---- integration: a real mlflow server --------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_parent_and_child_runs_params_metrics_artifacts(live_mlflow, tmp_path):
    cfg = make_cfg(live_mlflow.uri)
    (tmp_path / "cluster_spec.json").write_text(json.dumps({"cluster": {"chief": ["h:1"]}}))
    parent = start_parent_run(cfg, "trk-pipeline")
    assert not parent.startswith("local-")
    with open_step_run(cfg, "train", tmp_path, parent_run_id=parent) as run:
        hook = run.hook()
        hook.on_train_begin({"strategy": "none", "out_dir": str(tmp_path), "start_step": 0})
        for step in range(1, 21):
            hook.on_step_end(step, {"loss": 1 / step, "accuracy": step / 20, "examples_per_sec": 100.0,
                                    "step_time": 0.01})
        hook.on_placement(Placement.from_json({"ops_by_device": {"/GPU:0": 12},
                                               "transfers": {"per_step": {"count": 3, "bytes": 96}}}))
        run_id = run.run_id
    end_parent_run(parent, "FINISHED")
    c = client(live_mlflow.uri)
    r = c.get_run(run_id)
    assert r.info.status == "FINISHED"
    assert r.data.tags["mlflow.parentRunId"] == parent
    assert r.data.tags["pinpoint.step"] == "train"
    assert c.get_run(parent).info.status == "FINISHED"
    assert c.get_run(parent).data.tags["pinpoint.pipeline"] == "trk"
    assert r.data.params["train.strategy"] == "none" and r.data.params["config_digest"] == cfg.digest()
    assert steps_of(c, run_id, "loss") == list(range(1, 21))
    assert r.data.metrics["placement.transfers_per_step"] == 3.0
    assert any(k.startswith("system/") for k in r.data.metrics)
    names = {a.path for a in c.list_artifacts(run_id)}
    assert {"cluster_spec.json", "placement.json"} <= names
    assert not (tmp_path / SPOOL_DIR).exists()  # everything arrived: no spool left


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_an_error_inside_the_step_run_marks_it_failed(live_mlflow, tmp_path):
    """An error found after the run was created (e.g. a multi-worker task's data check) reaches the
    caller unchanged, and the MLflow run ends FAILED."""
    cfg = make_cfg(live_mlflow.uri)
    with pytest.raises(ConfigError, match="train.num_classes"):
        with open_step_run(cfg, "train", tmp_path) as run:
            run_id = run.run_id
            raise ConfigError("train.num_classes: got None; set train.num_classes")
    assert client(live_mlflow.uri).get_run(run_id).info.status == "FAILED"


def _log_steps(run, steps, pause=0.0):
    hook = run.hook()
    for step in steps:
        hook.on_step_end(step, {"loss": 1.0 / (step + 1), "accuracy": 0.5})
        if pause:
            time.sleep(pause)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_server_stopped_and_restarted_mid_run_every_step_exactly_once(live_mlflow, tmp_path, capfd):
    cfg = make_cfg(live_mlflow.uri)
    with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
        real_id = run.run_id
        assert not real_id.startswith("local-")
        _log_steps(run, range(30), pause=0.02)
        live_mlflow.stop()
        t0 = time.monotonic()
        _log_steps(run, range(30, 60), pause=0.02)
        assert time.monotonic() - t0 < 10, "training waited on the network during the outage"
        live_mlflow.start()
        _log_steps(run, range(60, 90), pause=0.02)
    err = capfd.readouterr().err
    assert "unreachable" in err and "spooling" in err
    c = client(live_mlflow.uri)
    assert steps_of(c, real_id, "loss") == list(range(90))  # every step, exactly once
    assert c.get_run(real_id).info.status == "FINISHED"
    assert not (tmp_path / SPOOL_DIR).exists()


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_server_down_at_start_run_created_later(live_mlflow, tmp_path):
    cfg = make_cfg(live_mlflow.uri)
    live_mlflow.stop()
    t0 = time.monotonic()
    parent = start_parent_run(cfg, "down-pipeline")
    assert parent.startswith("local-")
    with open_step_run(cfg, "train", tmp_path, parent_run_id=parent, system_metrics=False) as run:
        _log_steps(run, range(20))
        # Nothing the training calls waited on the network. Asking for the run id (next) waits for
        # the sender process's first try, which a loaded machine takes longer to start.
        assert time.monotonic() - t0 < 30
        assert run.run_id.startswith("local-")
        live_mlflow.start()
        _log_steps(run, range(20, 40))
        assert run.flush(timeout=60)
        run_id = run.run_id
    assert not run_id.startswith("local-")
    c = client(live_mlflow.uri)
    r = c.get_run(run_id)
    assert steps_of(c, run_id, "loss") == list(range(40))
    assert r.data.params["train.strategy"] == "none"
    parent_id = r.data.tags["mlflow.parentRunId"]
    assert c.get_run(parent_id).data.tags["pinpoint.local_id"] == parent
    end_parent_run(parent, "FINISHED")  # as the pipeline calls it: no config needed
    assert c.get_run(parent_id).info.status == "FINISHED"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_server_down_at_end_leaves_spool_upload_spool_sends_it_once(live_mlflow, tmp_path, capfd):
    from pinpoint.cli import main

    cfg = make_cfg(live_mlflow.uri)
    src = tmp_path / "report.html"
    src.write_text("<html>report</html>")
    with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
        run_id = run.run_id
        _log_steps(run, range(10))
        assert run.flush(timeout=60)
        live_mlflow.stop()
        _log_steps(run, range(10, 25))
        run.log_artifact(src)
    src.unlink()  # the spool has its own copy
    assert "upload-spool" in capfd.readouterr().err
    spools = find_spools(tmp_path)
    assert len(spools) == 1
    # Forget every ack: the replay must still not duplicate what already reached the server.
    (spools[0] / "acked.txt").write_text("")
    live_mlflow.start()
    assert main(["upload-spool", str(tmp_path), "--uri", live_mlflow.uri]) == 0
    assert main(["upload-spool", str(tmp_path)]) == 0  # idempotent: nothing left
    assert "nothing to upload" in capfd.readouterr().out
    c = client(live_mlflow.uri)
    assert steps_of(c, run_id, "loss") == list(range(25))
    assert c.get_run(run_id).info.status == "FINISHED"
    assert "report.html" in {a.path for a in c.list_artifacts(run_id)}


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_spool_of_a_dead_process_is_adopted_by_the_next_step(live_mlflow, tmp_path):
    """A chief killed before it could send (e.g. restarted by the launcher): the next process in
    the same run folder sends its journal and ends that run KILLED."""
    import subprocess
    import sys

    from pinpoint.tracking.spool import Spool

    cfg = make_cfg(live_mlflow.uri)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True)
    folder = tmp_path / SPOOL_DIR / "train-dead"
    local_id = f"local-{uuid.uuid4().hex}"
    spool = Spool.create(folder, {"uri": live_mlflow.uri, "experiment": cfg.tracking.experiment,
                                  "run_name": "trk/train", "local_id": local_id, "pid": int(dead.stdout),
                                  "host": __import__("socket").gethostname()})
    spool.append("create_run", local_id=local_id, experiment=cfg.tracking.experiment, run_name="trk/train",
                 tags={"pinpoint.local_id": local_id}, start_time=int(time.time() * 1000))
    for step in range(5):
        spool.append("metrics", metrics=[["loss", 1.0, int(time.time() * 1000), step]])
    with open_step_run(cfg, "train", tmp_path, system_metrics=False):
        deadline = time.monotonic() + 60
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not folder.exists()
    c = client(live_mlflow.uri)
    (run,) = c.search_runs([c.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
                           filter_string=f"tags.`pinpoint.local_id` = '{local_id}'")
    assert run.info.status == "KILLED"
    assert steps_of(c, run.info.run_id, "loss") == list(range(5))


@pytest.mark.integration  # a real sender process
def test_credentials_in_the_uri_never_reach_the_run_folder(tmp_path, monkeypatch):
    """The spool in the run folder keeps a redacted URI; the sender still gets the real one."""
    from pinpoint.errors import ConfigError
    from pinpoint.tracking import open_step_run
    from pinpoint.tracking.sender import _stored_uri

    secret_uri = "http://alice:hunter2-secret@127.0.0.1:9"  # nothing listens on port 9
    cfg = make_cfg(secret_uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with open_step_run(cfg, "train", tmp_path) as run:
        assert run._sender.uri == secret_uri
        run.log_metrics({"loss": 1.0}, step=1)
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and "hunter2-secret" in p.read_text(errors="ignore")]
    assert not leaked, leaked
    stored = "http://***@127.0.0.1:9"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", secret_uri)
    assert _stored_uri(stored) == secret_uri
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(ConfigError, match="pass --uri"):
        _stored_uri(stored)


def _api_requests(server) -> int:
    """REST calls the real server has answered so far (its access log)."""
    return sum(1 for line in server.log.read_text(errors="ignore").splitlines() if "/api/2.0/mlflow/" in line)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_5000_steps_send_a_bounded_number_of_requests_and_every_value(live_mlflow, tmp_path):
    """Metrics go out once per SEND_INTERVAL_S in log_batch calls, whatever the step
    rate: 5,000 steps logged faster than any training loop (4 metrics each, over ~3 s) cost
    about one request per interval plus one per 1,000 values, and every step's value arrives."""
    import math

    cfg = make_cfg(live_mlflow.uri)
    from pinpoint.tracking.run import SEND_INTERVAL_S as interval
    values = 4 * 5000
    with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
        run_id = run.run_id
        before = _api_requests(live_mlflow)
        hook = run.hook()
        t0 = time.monotonic()
        for step in range(1, 5001):
            hook.on_step_end(step, {"loss": 1.0 / step, "accuracy": step / 5000, "examples_per_sec": 1e5,
                                    "step_time": 1e-4})
            if step % 1000 == 0:
                time.sleep(0.6)  # several send intervals go by during the run
        elapsed = time.monotonic() - t0
    requests = _api_requests(live_mlflow) - before
    # The per-step design this replaced made one request per logged step: 5,000 here.
    passes = math.ceil(elapsed / interval) + 1  # + the last pass at the run's end
    assert requests <= passes + math.ceil(values / 1000) + 2, (requests, elapsed)  # + end_run, its flush
    c = client(live_mlflow.uri)
    assert steps_of(c, run_id, "loss") == list(range(1, 5001))
    assert steps_of(c, run_id, "step_time") == list(range(1, 5001))


@pytest.mark.integration  # a real sender process
def test_a_sender_whose_parent_left_before_it_was_ready_exits_quietly(tmp_path):
    """A step that refuses its input exits while its sender process still starts: the sender's
    'ready' meets a closed pipe and must end without a traceback in the step's log."""
    import subprocess
    import sys

    from pinpoint.tracking.process import URI_ENV

    read, write = os.pipe()
    os.close(read)  # the parent is gone: nobody reads the sender's stdout
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from pinpoint.tracking.process import main; sys.exit(main())"],
        stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
        env={**os.environ, URI_ENV: "http://127.0.0.1:9"})  # nothing listens: the sender copes itself
    os.close(write)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_file_artifacts_pending_at_a_pass_go_up_in_one_call_each_where_it_belongs(tmp_path):
    """Issue 34.2: checkpoints written faster than the sender passes (three files each) reach
    the store in one log_artifacts call of a staged tree, every file at its own artifact path,
    a later record of the same artifact winning; the staging folder is gone afterwards."""
    from pinpoint.tracking.checkpoints import artifact_dir
    from pinpoint.tracking.sender import Sender

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spool = Spool.create(tmp_path / "spool", {"local_id": "local-batch", "uri": uri})
    spool.append("create_run", local_id="local-batch", experiment="batch", run_name="batch", tags={},
                 start_time=0, parent_run_id=None, pipeline="batch")
    src = tmp_path / "ckpts"
    src.mkdir()
    for step in (100, 200, 300):
        for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"):
            (src / name).write_text(f"{name} bytes")
        # The state file, replaced each time as TensorFlow does (a new file renamed over the old):
        # the snapshot taken before keeps its own content.
        (src / "checkpoint.tmp").write_text(f"latest {step}")
        os.replace(src / "checkpoint.tmp", src / "checkpoint")
        for f in sorted(src.glob(f"ckpt-{step}.*")) + [src / "checkpoint"]:
            snap = spool.snapshot(f"local-batch:a{step}{f.name}", f)
            spool.append("artifact", blob=str(snap.relative_to(spool.folder)), artifact_path=artifact_dir(step),
                         is_dir=False)
        spool.append("metrics", metrics=[["loss", 1.0 / step, 0, step]])
    sender = Sender(spool, uri)
    sender.pending.extend(spool.read_new())
    calls = {"log_artifacts": 0, "log_artifact": 0}
    for name in calls:
        real = getattr(sender.client, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(sender.client, name, counted)
    assert sender.drain_once()
    assert calls == {"log_artifacts": 1, "log_artifact": 0}
    c = client(uri)
    for step in (100, 200, 300):
        names = sorted(Path(a.path).name for a in c.list_artifacts(sender.run_id, artifact_dir(step)))
        assert names == sorted(["checkpoint", f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"])
        local = Path(c.download_artifacts(sender.run_id, f"{artifact_dir(step)}/checkpoint", str(tmp_path / "dl")))
        assert local.read_text() == f"latest {step}"  # each checkpoint's own state file
    assert steps_of(c, sender.run_id, "loss") == [100, 200, 300]
    assert list((spool.folder / "stage").iterdir()) == []  # the batch's links are gone


@pytest.mark.unit
def test_the_senders_cpu_time_is_read_to_the_millisecond():
    """The steady share's window is about a second: the sender's CPU time is read from the
    process CPU clock (ns), not /proc's 10 ms ticks. The child tells its own process_time, then
    waits: the parent's reading agrees with it within 2 ms."""
    import subprocess
    import sys

    from pinpoint.tracking.process import SenderProcess

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.123: pass\n"
         "print(time.process_time(), flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sender = SenderProcess("unused")
    sender._proc = child
    try:
        told = float(child.stdout.readline())
        assert sender.cpu_s() == pytest.approx(told, abs=0.002)
    finally:
        child.kill()
        child.wait()


@pytest.mark.unit
def test_the_steady_cpu_window_starts_at_the_middle_not_at_the_last_send(tmp_path, monkeypatch):
    """The sender's CPU is sampled every CPU_SAMPLE_S of logging calls, not only at the 1/s sends:
    over a 2.3 s run sending once a second, the steady window starts within 0.1 s after the middle,
    1.15 s (sampled at sends only, it started at the last send, 0.3 s before the end: often no pass
    of the sender in it). The clock and the sender are stand-ins; the arithmetic is the test's."""
    import pinpoint.tracking.run as trun

    now = [100.0]
    monkeypatch.setattr(trun.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(trun.time, "perf_counter", lambda: now[0])

    class Sender:
        run_created_at = (100.0, 0.0)

        def cpu_s(self):
            return 0.01 * (now[0] - 100.0)  # 1% of a core throughout

    spool = Spool.create(tmp_path / "s", {"local_id": "local-cpu", "uri": "http://nowhere"})
    run = trun.StepRun(spool, Sender(), step_metrics_every_s=1.0)
    for step in range(230):  # 230 steps of 10 ms: 2.3 s, sends at 0, 1 and 2 s
        run.log_step_metrics({"loss": 1.0}, step=step)
        now[0] += 0.01
    cost = run.cost()
    assert cost["steady_wall_s"] == pytest.approx(2.3 - 1.2, abs=0.021)  # the first sample at or after 1.15 s
    assert cost["sender_steady_share"] == pytest.approx(0.01)


@pytest.mark.integration  # real sender processes
@pytest.mark.timeout(300)
def test_only_a_training_steps_sender_gives_way_to_the_training(tmp_path):
    """Once it has tried to create the run, the train and trace steps' sender runs 10 nice levels
    below this process; a provision step's at this process's own, so a busy node does not starve a
    step with nothing else to do."""
    cfg = make_cfg(f"sqlite:///{tmp_path / 'mlflow.db'}")
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}
    for step in ("provision", "train", "trace"):
        with open_step_run(cfg, step, tmp_path / step, system_metrics=False) as run:
            run.run_id  # noqa: B018 - waits for the sender's first try: it has set its priority by then
            seen[step] = {nice - own for nice in _thread_priorities(run._sender._proc.pid)}
    assert seen == {"provision": {0}, "train": {10}, "trace": {10}}


def _thread_priorities(pid: int) -> list[int]:
    """Each live thread's priority: Linux keeps a nice value per thread."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out.append(os.getpriority(os.PRIO_PROCESS, int(task)))
        except ProcessLookupError:  # a thread that ended since the listing
            pass
    return out


@pytest.mark.unit
def test_a_sender_lowers_its_priority_only_while_the_training_runs():
    """The first try to create the run lowers the sender 10 levels. At the training's end it goes
    back only by what it lowered, where the OS lets it: one that never lowered itself keeps the
    priority it started at, and a first try that ends after the training did lowers nothing."""
    import subprocess
    import sys

    def run(calls: str) -> str:
        code = ("import os\n"
                "from pinpoint.tracking import process as p\n"
                "start = os.getpriority(os.PRIO_PROCESS, 0)\n"
                f"{calls}\n"
                "print(os.getpriority(os.PRIO_PROCESS, 0) - start)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
        return out.stdout.split("\n")[-2]

    assert [run("p._relay(True)('tried')"), run("p._PRIORITY.restore()"),
            run("p._PRIORITY.restore()\np._relay(True)('tried')")] == ["10", "0", "0"]
