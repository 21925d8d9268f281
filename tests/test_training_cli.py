"""`pinpoint train` from the shell: user errors are one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pinpoint.placement.model.files import read_placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _train(tmp_path, cfg: dict, *extra):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out", str(tmp_path / "out"), *extra],
                          check=False, capture_output=True, text=True, env=env, timeout=190)


def _pinpoint_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pinpoint:")]


def test_gpu_request_without_gpu_and_soft_placement_off(tmp_path):
    proc = _train(tmp_path, {
        "name": "x", "cluster": {"devices_per_worker": 2, "emulate": False},
        "train": {"strategy": "mirrored", "pinning": {"soft_placement": False}},
        "tracking": {"enabled": False},
    })
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = _pinpoint_lines(proc.stderr)
    assert lines == [
        ("pinpoint: cluster.device_type: got GPU, but this machine has no GPU (devices: /CPU:0); "
        "set cluster.emulate: true, enable train.pinning.soft_placement, or use device_type: CPU")
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_task_flag_needs_role_index_and_tf_config(tmp_path):
    cfg = {"name": "x", "cluster": {"chief": 1, "workers": 1}, "train": {"strategy": "multi_worker_mirrored"},
           "tracking": {"enabled": False}}
    proc = _train(tmp_path, cfg, "--task", "boss:x")
    assert proc.returncode == 2 and "--task: got 'boss:x'; use ROLE:INDEX" in proc.stderr
    proc = _train(tmp_path, cfg, "--task", "worker:0")
    assert proc.returncode == 2 and "TF_CONFIG is not set" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hierarchical_copy_on_four_devices_counts_every_copy_between_the_replicas(tmp_path):
    """4 emulated GPUs (a fresh process: the in-process tests have 2): two halves sum on /GPU:0
    and /GPU:2, the sums meet on /GPU:0, the result goes back: 2(N-1) = 6 copies of the
    parameters. The graph optimizer merges the sums into a node with no traced shape; it is sized
    from its inputs."""

    proc = _train(tmp_path, {
        "name": "x", "cluster": {"devices_per_worker": 4},
        "train": {"strategy": "mirrored", "all_reduce": "hierarchical_copy", "steps": 12, "batch_size": 64,
                  "log_every": 4, "checkpoint_every": 0},
        "tracking": {"enabled": False}, "placement": {"warmup_steps": 2},
    })
    assert proc.returncode == 0, proc.stderr[-2000:]
    p = read_placement(tmp_path / "out" / "placement.json")
    params = sum(v["bytes"] for v in p["variables"] if v["name"].endswith(("kernel", "bias")))
    t = p["transfers"]
    between = sum(c["bytes"] for s, row in t["matrix"].items() for d, c in row.items() if "/GPU" in s and "/GPU" in d)
    assert (t["per_step"]["unsized"], t["collectives"]) == (0, {})
    assert 6 * params <= between <= 6 * params + 64, (between, params)  # + a few scalars


NOISE = ("cpu_feature_guard", "oneDNN", "cuda", "absl::InitializeLog", "UserWarning", "Downloading artifacts")


@pytest.mark.timeout(400)  # two runs, each with MLflow's model logging
def test_a_run_starts_quietly_and_verbose_shows_the_libraries_logs(tmp_path):
    """By default none of TensorFlow's, CUDA's or MLflow's start-up lines reach the terminal
    (the run's own lines do); `--verbose` shows them. MLflow tracking on: model logging included."""
    cfg = {"name": "quiet", "train": {"steps": 6},
           "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "quiet"}}
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS", "PINPOINT_VERBOSE")}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))

    def run(*extra):
        proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out",
                               str(tmp_path / f"out{len(extra)}"), *extra],
                              check=False, capture_output=True, text=True, env=env, timeout=190)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout + proc.stderr

    quiet = run()
    assert [n for n in NOISE if n in quiet] == []
    assert "step 6/6" in quiet and "== pinpoint summary" in quiet
    verbose = run("--verbose")
    # TensorFlow's own start-up lines: oneDNN's (a CPU with AVX-512), the CPU features', CUDA's stub.
    assert [n for n in ("oneDNN custom operations are on", "cpu_feature_guard", "cuda") if n in verbose] != []
