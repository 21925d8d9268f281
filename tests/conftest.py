"""Shared fixtures. The MLflow fixtures start a REAL `mlflow server` process (sqlite store +
proxied artifacts) on a free localhost port; tests may stop and restart it (same port, same store)
to simulate an outage."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pinpoint.config import DEFAULT_IMAGE, config_from_dict

REPO = Path(__file__).resolve().parents[1]
# The MLflow server's command, from its own venv (the Makefile's .venv-mlflow: the full `mlflow`
# package, kept out of the venv that runs TensorFlow).
MLFLOW_CLI = REPO / ".venv-mlflow" / "bin" / "mlflow"


def mlflow_cli() -> str:
    if not MLFLOW_CLI.exists():
        raise RuntimeError(f"no MLflow server at {MLFLOW_CLI}; run `make setup` (it builds .venv-mlflow)")
    return str(MLFLOW_CLI)


def pytest_addoption(parser):
    # The fault suite's rows for the reliability table: `make test`/`make test-faults` pass
    # runs/reliability.json (what `make bench` reads); without it they go to a temp folder.
    parser.addoption("--reliability-out", default=None, help="where test_faults.py writes reliability.json")


TIERS = ("unit", "integration", "slow", "corpus")


def pytest_collection_modifyitems(config, items):
    # A test belongs to one tier: a unit test that is also marked integration ran in both tiers.
    both = [i.nodeid for i in items if i.get_closest_marker("unit") and any(
        i.get_closest_marker(t) for t in TIERS[1:])]
    if both:
        raise pytest.UsageError(f"unit and another tier's marker on {both}: a test that trains, serves or starts "
                                "TensorFlow is not a unit test; mark it integration (or slow) only")


def _cpu_seconds() -> float:
    import resource

    # The oracle's runs forked by a zygote (tests/zygote.py) are its children, not this process'.
    zygote = sys.modules.get("tests.zygote")
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN))) + \
        (zygote.cpu_seconds() if zygote else 0.0)


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # The CPU seconds of the test, its fixtures and the processes it waited for, into the JUnit XML
    # (scripts/ci_times.py): wall time under CI's two streams says little of what a test costs.
    outcome = yield
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", f"{_cpu_seconds() - item.stash[_CPU_AT_SETUP]:.1f}"))


@pytest.fixture(autouse=True)
def _unit_tests_start_no_tensorflow(request):
    """The unit tier is what a developer runs between edits: a unit test that starts a TensorFlow
    process fails (counted by tests/tf_starts.py when the tier runs through make)."""
    log = os.environ.get("PINPOINT_TF_STARTS")
    if not log or request.node.get_closest_marker("unit") is None:
        yield
        return
    yield
    nodeid = request.node.nodeid
    started = [line.split("\t")[2] for line in (Path(log).read_text().splitlines() if Path(log).exists() else [])
               if line.split("\t")[:1] == [nodeid] and line.split("\t")[1] != str(os.getpid())]
    assert not started, (f"{nodeid} started {len(started)} TensorFlow process(es) ({', '.join(started)}): "
                         "mark it integration")


@pytest.fixture(scope="session")
def reliability_file(request, tmp_path_factory) -> Path:
    given = request.config.getoption("--reliability-out")
    return Path(given).resolve() if given else tmp_path_factory.mktemp("reliability") / "reliability.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def makefile_ui_args(port: int) -> list[str]:
    """`make mlflow-ui`'s `mlflow ui` arguments (its store layout and host), on `port`."""
    text = (Path(__file__).resolve().parents[1] / "Makefile").read_text().replace("\\\n", " ")
    args = next(line for line in text.splitlines() if "mlflow ui" in line).split("mlflow ui", 1)[1].split()
    return [str(port) if a == "$(MLFLOW_PORT)" else a for a in args]


@contextlib.contextmanager
def mlflow_ui(repo: Path, port: int):
    """`mlflow ui` as `make mlflow-ui` starts it, in `repo`, on `port`; yields its base URL once it
    answers /health from a socket of its own, and stops its process group after. Another process
    can take a free port before mlflow binds it (CI runs two streams of servers): this ui then exits,
    and it starts again on another port (a CI run got another server's 404 for its run before)."""
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    for attempt in range(3):
        port = port if attempt == 0 else free_port()
        proc = subprocess.Popen([mlflow_cli(), "ui", *makefile_ui_args(port)],
                                cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            if _answers_itself(proc, port):
                yield f"http://127.0.0.1:{port}"
                return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
    raise RuntimeError(f"mlflow ui did not start in {repo} on three free ports")


def _answers_itself(proc: subprocess.Popen, port: int, timeout: float = 300) -> bool:
    """Whether `proc` (or a process it started) listens on `port` and answers /health there."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            # (/health can answer before the tracking API serves the store: a run read then was a 404)
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1",
                                   timeout=10)
            group = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for p in group for c in p.net_connections("tcp")):
                return True
        except (OSError, psutil.Error):
            pass
        time.sleep(0.5)
    return False


class MlflowServer:
    """A real `mlflow server` in its own process group; start/stop/restart keep port and store."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "server.log"
        self.startup_seconds: list[float] = []

    def start(self, timeout: float = 180.0) -> None:
        cmd = [
            mlflow_cli(), "server",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]
        env = dict(os.environ)
        # The genai job runners (huey consumers) are not needed and cost CPU on a 2-core box.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env.pop("MLFLOW_TRACKING_URI", None)
        t0 = time.monotonic()
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=self.root)
        self._watch(self.proc.pid)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited early; see {self.log}:\n{self.log.read_text()[-2000:]}")
            if self.healthy():
                self.startup_seconds.append(time.monotonic() - t0)
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {timeout}s; see {self.log}")

    @staticmethod
    def _watch(pgid: int) -> None:
        """If this pytest process dies (timeout, kill -9) before stopping the server, a tiny
        watcher stops the server's process group, so no server outlives its test session."""
        script = (f"while kill -0 {os.getpid()} 2>/dev/null && kill -0 -{pgid} 2>/dev/null; "
                  f"do sleep 2; done; kill -TERM -{pgid} 2>/dev/null; exit 0")
        subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self, hard: bool = False) -> None:
        """Stop the whole process group (server + workers); hard=True is a crash (SIGKILL), so
        the port stops answering at once."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
            self.proc.wait(15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
        deadline = time.monotonic() + 10
        while self.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A running MLflow tracking server for the session (URI in `.uri`). A test that stops it must
    start it again (the fixture checks and restarts it if not)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live_mlflow(mlflow_server):
    """The session server, guaranteed up before and after the test."""
    if not mlflow_server.healthy():
        mlflow_server.start()
    yield mlflow_server
    if mlflow_server.proc is None or not mlflow_server.healthy():
        mlflow_server.start()


# ---- configs -----------------------------------------------------------------------------------
NO_TRACKING = {"enabled": False}


def make_config(name: str, *, cluster: dict | None = None, train: dict | None = None, tracking: dict | None = None,
                placement: dict | None = None, path: Path | None = None, as_dict: bool = False):
    """The tests' one config factory: a config named `name` with the sections a test gives (a
    section left None is left out: its defaults apply; NO_TRACKING turns MLflow off). Returns the
    validated Config; with as_dict the dict; with path the YAML file written there."""
    data: dict = {"name": name}
    for key, section in (("cluster", cluster), ("train", train), ("tracking", tracking), ("placement", placement)):
        if section is not None:
            data[key] = section
    if as_dict:
        return data
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path
    return config_from_dict(data)


# The built-in mlp trained on digits (64 features, 10 classes), the tests' default model: layer ->
# (inputs, units) of its Dense kernel and bias, float32 (training/loop/models.py builds it).
MLP_DIGITS = {"dense_1": (64, 128), "dense_2": (128, 64), "head": (64, 10)}


def mlp_param_bytes(layers=tuple(MLP_DIGITS)) -> int:
    """Bytes of the kernels and biases of `layers` (4 bytes a float32): the whole model's are
    (64*128 + 128 + 128*64 + 64 + 64*10 + 10) * 4 = 68,904, what one replica's gradients hold."""
    return sum((MLP_DIGITS[n][0] * MLP_DIGITS[n][1] + MLP_DIGITS[n][1]) * 4 for n in layers)


# ---- TensorFlow in this process -----------------------------------------------------------------
LOGICAL_CPUS = 3  # the host /CPU:0 and two emulated GPUs /CPU:1, /CPU:2 (as pinpoint.devices maps them)


@pytest.fixture(scope="session")
def tf():
    """TensorFlow in this process with LOGICAL_CPUS logical CPU devices, soft placement on. The
    in-process training tests configure the same layout (2 emulated GPUs); a test that initialized
    TensorFlow with fewer devices first makes this fail, never skip, so CI cannot lose these tests."""
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
    except RuntimeError:
        pass  # already initialized by an earlier test in this process: fine if it has enough
    have = len(tf.config.list_logical_devices("CPU"))
    if have < LOGICAL_CPUS:
        pytest.fail(f"TensorFlow was initialized in this process with {have} logical CPU device(s) before this "
                    f"fixture; it needs {LOGICAL_CPUS}: initialize TensorFlow in-process through this fixture or "
                    "pinpoint.devices.setup_devices with 2 emulated GPUs")
    tf.config.set_soft_device_placement(True)
    return tf


# ---- podman and the CPU image (test_images.py, test_k8s_containers.py) -------------------------
PODMAN_SETUP = REPO / "docker" / "podman-setup.sh"
PODMAN_SOCKET = Path("/run/pinpoint-podman/podman.sock")
CPU_IMAGE = f"localhost/{DEFAULT_IMAGE}"  # podman's name of `make images`' CPU image


def _podman_service_answers() -> bool:
    return PODMAN_SOCKET.exists() and subprocess.run(
        ["curl", "-s", "--unix-socket", str(PODMAN_SOCKET), "http://d/_ping"], capture_output=True, text=True
    ).stdout == "OK"


@pytest.fixture(scope="session")
def cpu_image():
    """podman set up, the CPU image (CPU_IMAGE) built from the working tree once per session (or its
    cached layers reused); yields the environment with DOCKER_HOST on podman's socket. Stops the
    podman service afterwards if it started it."""
    if os.geteuid() != 0:
        pytest.skip("podman here runs as root only (no user namespaces)")
    was_running = _podman_service_answers()
    proc = subprocess.run(["bash", str(PODMAN_SETUP)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "DOCKER_HOST": proc.stdout.strip().splitlines()[-1].split("=", 1)[1]}
    try:
        proc = subprocess.run(["bash", str(REPO / "docker" / "build.sh")],
                              env={**env, "ENGINE": "podman", "IMAGES": "cpu"},
                              capture_output=True, text=True, timeout=1800, cwd=REPO)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        yield env
    finally:
        if not was_running:
            subprocess.run(["bash", str(PODMAN_SETUP), "stop"], timeout=60)
