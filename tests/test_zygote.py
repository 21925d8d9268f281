"""The zygote that forks the differential suite's runs (tests/zygote.py), with nothing preloaded:
a child is `python SCRIPT ARGS...` in its folder and environment, its stderr in its log, its exit
status (a signal's as Popen gives it) and its CPU seconds back. The runs with TensorFlow preloaded
are the differential and corpus tiers'."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests import zygote

pytestmark = pytest.mark.unit


def _script(tmp_path, text: str):
    path = tmp_path / "program.py"
    path.write_text(text)
    return path


def _spawn(tmp_path, text: str, env: dict | None = None, mode: str = "w"):
    script = _script(tmp_path, text)
    env = dict(os.environ, **(env or {}))
    z = zygote.Zygote.get(sys.executable, env, ())
    return z, z.spawn([sys.executable, str(script), "one", "two"], tmp_path / "work", env, tmp_path / "run.log", mode)


def test_a_child_runs_the_script_in_its_folder_with_its_arguments_environment_and_exit_status(tmp_path):
    (tmp_path / "work").mkdir()
    _, p = _spawn(tmp_path, "import os, sys\n"
                            "print(os.getcwd(), sys.argv[1:], os.environ['ZYGOTE_TEST'], file=sys.stderr)\n"
                            "print('to stdout: not the log')\n"
                            "sys.exit(3)\n", {"ZYGOTE_TEST": "seen"})
    assert p.wait(timeout=60) == 3
    assert (tmp_path / "run.log").read_text() == f"{tmp_path / 'work'} ['one', 'two'] seen\n"


def test_a_childs_uncaught_error_is_printed_and_exits_1_and_append_mode_keeps_the_log(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "run.log").write_text("before\n")
    _, p = _spawn(tmp_path, "raise ValueError('the program failed')\n", mode="a")
    assert p.wait(timeout=60) == 1
    log = (tmp_path / "run.log").read_text()
    assert log.startswith("before\nTraceback") and log.endswith("ValueError: the program failed\n")


def test_a_killed_child_ends_with_the_signal_and_a_wait_past_its_timeout_raises(tmp_path):
    (tmp_path / "work").mkdir()
    _, p = _spawn(tmp_path, "import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    p.kill()
    assert p.wait(timeout=60) == -signal.SIGKILL


def test_a_childs_cpu_seconds_are_counted_when_it_ends(tmp_path):
    (tmp_path / "work").mkdir()
    before = zygote.cpu_seconds()
    _, p = _spawn(tmp_path, "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n")
    assert p.wait(timeout=60) == 0
    assert 0.5 <= zygote.cpu_seconds() - before < 5


def test_the_servers_death_ends_its_runs_as_killed_and_names_its_log(tmp_path):
    (tmp_path / "work").mkdir()
    z, p = _spawn(tmp_path, "import time\ntime.sleep(60)\n", {"ZYGOTE_SERVER": "to be killed"})
    os.kill(z._proc.pid, signal.SIGKILL)
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert "the server that forked this run ended with exit status -9" in (tmp_path / "run.log").read_text()
    os.kill(p.pid, signal.SIGKILL)  # the orphan the server left


def test_beyond_the_kept_servers_the_least_recently_used_idle_one_is_stopped(monkeypatch, tmp_path):
    monkeypatch.setattr(zygote.Zygote, "_servers", {})  # this test's servers only
    script = _script(tmp_path, "pass\n")

    def server(name: str):
        env = {**os.environ, "ZYGOTE_ENV": name}
        z = zygote.Zygote.get(sys.executable, env, ())
        assert z.spawn([sys.executable, str(script)], tmp_path, env, tmp_path / "run.log").wait(timeout=60) == 0
        return z

    servers = [server(str(i)) for i in range(zygote.Zygote.KEPT)]
    server("0")  # used again: the most recent
    server("new")
    assert [s._proc.wait(timeout=60) if i == 1 else s._proc.poll() for i, s in enumerate(servers)] == [None, 0, None]


def test_mlflows_environment_does_not_choose_a_server_but_reaches_the_child(monkeypatch, tmp_path):
    """A test's own tracking server (MLFLOW_TRACKING_URI) is read by MLflow in the child, which no
    server preloads: the run goes to the server of the rest of its environment, with its own URI."""
    monkeypatch.setattr(zygote.Zygote, "_servers", {})  # this test's servers only
    (tmp_path / "work").mkdir()
    script = _script(tmp_path, "import os, sys\nprint(os.environ['MLFLOW_TRACKING_URI'], file=sys.stderr)\n")
    seen = []
    for uri in ("http://127.0.0.1:1", "http://127.0.0.1:2"):
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        z = zygote.Zygote.get(sys.executable, env, ())
        log = tmp_path / f"{uri[-1]}.log"
        assert z.spawn([sys.executable, str(script)], tmp_path / "work", env, log).wait(timeout=60) == 0
        seen.append((z, log.read_text()))
    assert seen == [(seen[0][0], "http://127.0.0.1:1\n"), (seen[0][0], "http://127.0.0.1:2\n")]
