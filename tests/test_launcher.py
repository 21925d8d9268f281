"""Local multi-process launcher: task commands, the process group, and a real MWMS cluster."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pinpoint.config import config_from_dict
from pinpoint.errors import TrainingFailed
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV
from pinpoint.runfolder import checkpoint_name, checkpoint_step, last_logged_step, latest_checkpoint_step
from pinpoint.training.cluster import launcher
from pinpoint.training.cluster.launcher import task_specs
from pinpoint.training.cluster.supervise import Exit, ProcessGroup, TaskSpec
from tests.conftest import NO_TRACKING, make_config

ROOT = Path(__file__).resolve().parents[1]


def _cfg(strategy="multi_worker_mirrored", train=None, **cluster):
    return make_config("lt", cluster={"chief": 1, "workers": 1, "devices_per_worker": 1, **cluster},
                       train={"strategy": strategy, **(train or {})}, tracking=NO_TRACKING)


# ---- unit: commands, TF_CONFIG, run-folder readers ------------------------------------------
@pytest.mark.unit
def test_task_specs_one_process_per_task_with_its_tf_config(tmp_path):
    specs = task_specs(_cfg("parameter_server", ps=1), tmp_path, parent_run_id="abc", resume_from_run="r1")
    assert [s.name for s in specs] == ["chief:0", "worker:0", "ps:0"]
    for s in specs:
        tf = json.loads(s.env["TF_CONFIG"])
        role, index = s.name.split(":")
        assert tf["task"] == {"type": role, "index": int(index)}
        assert f"127.0.0.1:{s.port}" in tf["cluster"][role]
        assert s.argv[1:4] == ("-m", "pinpoint.cli", "train")
        assert s.argv[s.argv.index("--task") + 1] == s.name
        assert s.argv[s.argv.index("--out") + 1] == str(tmp_path)
        assert s.argv[4] == str(tmp_path / "config.yaml")
        assert ("--parent-run-id", "abc") == s.argv[s.argv.index("--parent-run-id"):][:2]
        assert "--resume-from-run" in s.argv  # first attempt restores from MLflow
        assert COLLECTIVE_TIMEOUT_ENV not in s.env  # train.collective_timeout_s is off by default
    assert len({s.port for s in specs}) == 3
    # Set: every task gets it, as the pods do (pinpoint.provision.podenv.collective_timeout_env).
    timed = task_specs(_cfg(train={"collective_timeout_s": 45}), tmp_path)
    assert [s.env[COLLECTIVE_TIMEOUT_ENV] for s in timed] == ["45", "45"]


@pytest.mark.unit
def test_task_hosts_and_prefix_rewrite_every_tf_config(tmp_path):
    specs = task_specs(
        _cfg(), tmp_path, host="10.1.0.1", task_hosts={"worker:0": "10.1.0.2"},
        task_prefix={"worker:0": ["ip", "netns", "exec", "ns1"]}, extra_env={"X": "1"},
    )
    chief, worker = specs
    assert worker.argv[:4] == ("ip", "netns", "exec", "ns1") and chief.argv[0] == sys.executable
    for s in specs:
        cluster = json.loads(s.env["TF_CONFIG"])["cluster"]
        assert cluster == {"chief": [f"10.1.0.1:{chief.port}"], "worker": [f"10.1.0.2:{worker.port}"]}
        assert s.env["X"] == "1"


@pytest.mark.unit
def test_unknown_task_name_is_one_clear_error(tmp_path):
    with pytest.raises(TrainingFailed, match="no task 'worker:5'.*chief:0, worker:0"):
        task_specs(_cfg(), tmp_path, task_hosts={"worker:5": "10.0.0.1"})


@pytest.mark.unit
def test_run_folder_readers(tmp_path):
    assert latest_checkpoint_step(tmp_path) is None and last_logged_step(tmp_path) is None
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for name in ("ckpt-10.index", "ckpt-30.index", "ckpt-30.data-00000-of-00001", "ckpt-x.index"):
        (ck / name).write_text("")
    assert latest_checkpoint_step(tmp_path) == 30
    # One parser for every form of a checkpoint's name: index file, prefix, MLflow artifact folder.
    assert [checkpoint_step(n) for n in ("ckpt-30.index", str(ck / "ckpt-30"), "checkpoints/ckpt-30")] == [30] * 3
    assert [checkpoint_step(n) for n in ("ckpt-30.data-00000-of-00001", "checkpoint", "ckpt-x.index", "xckpt-3")] == [None] * 4
    assert checkpoint_name(30) == "ckpt-30"
    (tmp_path / "train_log.jsonl").write_text('{"step": 5}\n{"step": 15}\n{"step": 2')  # torn last line
    assert last_logged_step(tmp_path) == 15


@pytest.mark.unit
def test_exit_descriptions():
    assert Exit("worker:1", -9).describe() == "worker:1 died (signal SIGKILL)"
    assert Exit("chief:0", 1).describe() == "chief:0 exited with code 1"


# ---- integration: the process group with real (non-TF) processes ------------------------------
def _py(name, code, **kw):
    return TaskSpec(name, (sys.executable, "-c", textwrap.dedent(code)), **kw)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_group_prefixes_lines_and_reports_exits(capfd):
    g = ProcessGroup([
        _py("chief:0", "import os; print('hello', os.environ['TF_CONFIG'])", env={"TF_CONFIG": "{}"}),
        _py("worker:0", "import sys; print('bye'); sys.stdout.flush(); sys.exit(7)"),
    ])
    g.start()
    deadline = time.time() + 30
    while len(g.poll()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    g.stop()
    out = capfd.readouterr().out
    assert "[chief:0] hello {}" in out.splitlines()
    assert "[worker:0] bye" in out.splitlines()
    assert {e.name: e.returncode for e in g.poll()} == {"chief:0": 0, "worker:0": 7}
    assert g.last_words("worker:0") == "bye"


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_stop_escalates_to_sigkill_for_a_task_ignoring_sigterm():
    g = ProcessGroup([_py("ps:0", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        time.sleep(120)
    """)])
    g.start()
    while "ready" not in g.last_words("ps:0"):
        time.sleep(0.05)
    t0 = time.time()
    g.stop(grace=1.0)
    assert time.time() - t0 < 10
    assert g.poll()[0].returncode == -signal.SIGKILL


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_tasks_die_with_a_killed_launcher(tmp_path):
    # A launcher killed with SIGKILL cannot clean up; the kernel must kill its tasks for it.
    code = textwrap.dedent(f"""
        import sys, time
        from pinpoint.training.cluster.supervise import ProcessGroup, TaskSpec
        g = ProcessGroup([TaskSpec("worker:0", (sys.executable, "-c", "import time; time.sleep(120)"))])
        g.start()
        open({str(tmp_path / 'pid')!r}, 'w').write(str(g.pids['worker:0']))
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code])
    pid_file = tmp_path / "pid"
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (reaped by init later) is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# ---- integration: the supervisor, with real stand-in processes for the tasks ------------------
# `task_prefix` runs a task under a wrapper; a `python -c CODE` wrapper is a real process that
# behaves like a task that crashes, hangs or finishes, without paying TensorFlow's start-up.
def _as(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


FAST = {"grace": 1.0, "startup_timeout": 60.0, "stall_timeout": 60.0}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_user_error_exit_code_is_propagated_without_restart(tmp_path, capfd):
    crash = _as("import sys; print('pinpoint: x: got 1; fix it', flush=True); sys.exit(2)")
    rc = launcher.run_local_cluster(_cfg(train={"max_restarts": 3}), tmp_path, task_prefix={"chief:0": crash}, **FAST)
    assert rc == 2
    rec = json.loads((tmp_path / "launcher.json").read_text())
    assert rec["status"] == "failed" and len(rec["attempts"]) == 1
    out = capfd.readouterr().out
    assert "[chief:0] pinpoint: x: got 1; fix it" in out
    assert "not restarting" in out


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_crashing_task_restarts_the_group_then_fails_with_its_last_words(tmp_path, capfd):
    crash = _as("import sys; print('boom: device lost', flush=True); sys.exit(1)")
    with pytest.raises(TrainingFailed) as err:
        launcher.run_local_cluster(_cfg(train={"max_restarts": 2}), tmp_path, task_prefix={"worker:0": crash}, **FAST)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("local cluster failed: worker:0 exited with code 1 on attempt 3 (train.max_restarts=2")
    assert "boom: device lost" in msg
    out = capfd.readouterr().out
    assert "[launcher] restart 1/2 after worker:0 exited with code 1" in out
    assert "[launcher] restart 2/2 after worker:0 exited with code 1" in out
    tasks = json.loads((tmp_path / "tasks.json").read_text())
    assert tasks["attempt"] == 3 and set(tasks["tasks"]) == {"chief:0", "worker:0"}
    rec = json.loads((tmp_path / "launcher.json").read_text())
    assert [f["task"] for f in rec["failures"]] == ["worker:0"] * 3 and rec["status"] == "failed"
    # The real chief processes (pinpoint train --task chief:0, still importing TensorFlow when the
    # worker's crash lands) were killed with each broken group.
    assert [a["sigkilled"] for a in rec["attempts"]] == [["chief:0"]] * 3


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_watchdog_ends_a_group_that_makes_no_progress(tmp_path):
    hang = _as("import time; time.sleep(600)")
    t0 = time.time()
    with pytest.raises(TrainingFailed, match=r"no first logged step for 2 s .*hung or cut off"):
        launcher.run_local_cluster(
            _cfg(train={"max_restarts": 0}), tmp_path,
            task_prefix={"chief:0": hang, "worker:0": hang}, grace=1.0, startup_timeout=2.0,
        )
    assert time.time() - t0 < 20


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_ps_and_evaluator_are_stopped_once_the_chief_finishes(tmp_path, capfd):
    serve_forever = _as("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a TF server: only SIGKILL ends it
        print('serving', flush=True)
        time.sleep(600)
    """)
    finish = _as("import time; time.sleep(1); print('trained', flush=True)")
    cfg = config_from_dict({
        "name": "lt", "cluster": {"chief": 1, "workers": 1, "ps": 1, "evaluator": 1},
        "train": {"strategy": "parameter_server"}, "tracking": {"enabled": False},
    })
    t0 = time.time()
    rc = launcher.run_local_cluster(
        cfg, tmp_path, grace=1.0,
        task_prefix={"chief:0": finish, "worker:0": serve_forever, "ps:0": serve_forever,
                     "evaluator:0": serve_forever},
    )
    assert rc == 0 and time.time() - t0 < 30
    rec = json.loads((tmp_path / "launcher.json").read_text())
    assert rec["status"] == "succeeded"
    assert set(rec["attempts"][0]["sigkilled"]) == {"worker:0", "ps:0", "evaluator:0"}
    out = capfd.readouterr().out
    assert "[chief:0] trained" in out and "[ps:0] serving" in out and "[evaluator:0] serving" in out


# ---- slow: a real multi-worker cluster through the CLI ----------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_multi_worker_cluster_with_evaluator_through_the_cli(tmp_path):
    cfg = config_from_dict({
        "name": "lt",
        "cluster": {"chief": 1, "workers": 1, "evaluator": 1, "device_type": "CPU", "devices_per_worker": 1},
        "train": {"strategy": "multi_worker_mirrored", "model": "mlp", "data": "digits", "batch_size": 32,
                  "steps": 60, "checkpoint_every": 30, "log_every": 10},
        "placement": {"enabled": False},
        "tracking": {"enabled": False},
    })
    from pinpoint.config import config_to_yaml

    cfg_path = tmp_path / "lt.yaml"
    cfg_path.write_text(config_to_yaml(cfg))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "pinpoint.cli", "train", str(cfg_path), "--out", str(out), "--verbose"],
        check=False, capture_output=True, text=True, timeout=560, cwd=ROOT,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    # Every task's output (--verbose: TensorFlow's start-up lines too, so the worker and the
    # evaluator have some) arrives whole-line and prefixed with its name.
    for name in ("chief:0", "worker:0", "evaluator:0"):
        assert any(ln.startswith(f"[{name}] ") for ln in lines), name
    assert all(ln.startswith("[") for ln in lines if ln.strip())
    assert any(ln.startswith("[chief:0] step 60/60") for ln in lines)
    tasks = json.loads((out / "tasks.json").read_text())
    assert tasks["attempt"] == 1 and set(tasks["tasks"]) == {"chief:0", "worker:0", "evaluator:0"}
    for t in tasks["tasks"].values():  # the processes are gone
        assert not _alive(t["pid"])
    rec = json.loads((out / "launcher.json").read_text())
    assert rec["status"] == "succeeded" and rec["failures"] == []
    assert latest_checkpoint_step(out) == 60 and last_logged_step(out) == 60
    assert json.loads((out / "metrics.json").read_text())["steps"] == 60


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_stops_every_task(tmp_path):
    # The launcher as `pinpoint train` would run it, with stand-in tasks that ignore SIGTERM.
    code = textwrap.dedent(f"""
        import sys
        from pinpoint.config import config_from_dict
        from pinpoint.training.cluster.launcher import run_local_cluster
        from pinpoint.errors import PinpointError
        hang = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
        cfg = config_from_dict({{"name": "lt", "cluster": {{"chief": 1, "workers": 1}},
                                "train": {{"strategy": "multi_worker_mirrored"}}, "tracking": {{"enabled": False}}}})
        try:
            run_local_cluster(cfg, {str(tmp_path)!r}, grace=1.0, task_prefix={{"chief:0": hang, "worker:0": hang}})
        except PinpointError as err:
            print("pinpoint:", err, file=sys.stderr)
            sys.exit(err.exit_code)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tasks_file = tmp_path / "tasks.json"
    deadline = time.time() + 60
    while not tasks_file.exists() and time.time() < deadline:
        time.sleep(0.05)
    pids = [t["pid"] for t in json.loads(tasks_file.read_text())["tasks"].values()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert "stopped by SIGTERM; every task was stopped" in err
    assert not any(_alive(p) for p in pids)
    assert json.loads((tmp_path / "launcher.json").read_text())["status"] == "interrupted"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_restarts_resume_from_mlflow_until_a_local_checkpoint_exists(tmp_path, capfd):
    # Attempt 1 dies before any checkpoint, attempt 2 writes one then dies, attempt 3 must use it.
    crash = _as(f"""
        import sys, pathlib
        print('argv', ' '.join(sys.argv), flush=True)
        marker = pathlib.Path({str(tmp_path)!r}) / 'runs'
        n = len(marker.read_text()) if marker.exists() else 0
        marker.write_text('x' * (n + 1))
        if n == 1:
            (pathlib.Path({str(tmp_path)!r}) / 'checkpoints').mkdir(exist_ok=True)
            (pathlib.Path({str(tmp_path)!r}) / 'checkpoints' / 'ckpt-40.index').write_text('')
        sys.exit(1)
    """)
    with pytest.raises(TrainingFailed):
        launcher.run_local_cluster(_cfg(train={"max_restarts": 2}), tmp_path, resume_from_run="run123",
                                   task_prefix={"chief:0": crash}, **FAST)
    argvs = [ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("[chief:0] argv")]
    assert len(argvs) == 3
    assert ["--resume-from-run run123" in a for a in argvs] == [True, True, False]
    rec = json.loads((tmp_path / "launcher.json").read_text())
    assert [a["resume_step"] for a in rec["attempts"]] == [None, None, 40]
