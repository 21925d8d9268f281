"""Multi-process strategies for real: local TF clusters on localhost through `pinpoint train`
(the launcher starts one `--task` process per task; this checks the per-task training path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(tmp_path: Path, cfg: dict) -> tuple[dict, dict, list]:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out", str(out)],
                          check=False, capture_output=True, text=True, env=env, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    placement = read_placement(out / "placement.json")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return metrics, placement, log


def test_multi_worker_mirrored_trains_on_every_emulated_gpu_of_every_task(tmp_path):
    metrics, placement, log = _run(tmp_path, {
        "name": "mw",
        "cluster": {"chief": 1, "workers": 1, "devices_per_worker": 2, "emulate": True},
        "train": {"strategy": "multi_worker_mirrored", "steps": 40, "batch_size": 32, "learning_rate": 0.1,
                  "log_every": 10, "checkpoint_every": 20, "max_restarts": 0},
        "tracking": {"enabled": False}, "placement": {"warmup_steps": 2},
    })
    assert [r["step"] for r in log] == [1, 10, 20, 30, 40]
    assert log[-1]["loss"] < 0.92 * log[0]["loss"]
    assert metrics["num_replicas"] == 4  # 2 tasks x 2 emulated GPUs
    # Every variable has one copy on each emulated GPU of each task.
    kernel = next(v for v in placement["variables"] if v["name"] == "dense_1/kernel")
    devices = set(kernel["devices"])
    for task in ("/job:chief/task:0", "/job:worker/task:0"):
        for gpu in ("GPU:0", "GPU:1"):
            assert any(d.startswith(task) and d.endswith(gpu) for d in devices), (task, gpu, devices)
    ckpts = tmp_path / "out" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("ckpt-*.index")) == ["ckpt-20.index", "ckpt-40.index"]
    assert not list(ckpts.glob(".tmp-*"))  # the worker's copies were temporary
    for task in ("chief-0", "worker-0"):
        assert (tmp_path / "out" / f"placement-{task}.json").is_file()


def test_parameter_server_keeps_variables_on_the_ps_and_trains(tmp_path):
    _metrics, placement, log = _run(tmp_path, {
        "name": "ps",
        "cluster": {"chief": 1, "workers": 2, "ps": 1, "devices_per_worker": 1},
        "train": {"strategy": "parameter_server", "steps": 40, "batch_size": 32, "learning_rate": 0.1,
                  "log_every": 10, "checkpoint_every": 20, "max_restarts": 0},
        "tracking": {"enabled": False}, "placement": {"warmup_steps": 2},
    })
    assert [r["step"] for r in log] == [1, 10, 20, 30, 40]
    assert log[-1]["loss"] < 0.92 * log[0]["loss"]
    for v in placement["variables"]:
        if v["name"].startswith(("dense_", "head")):
            assert all(d.startswith("/job:ps/task:0") for d in v["devices"]), v
    assert (tmp_path / "out" / "checkpoints" / "ckpt-40.index").is_file()


def _user_package(folder: Path) -> None:
    """The user package of test_usercode, written next to the config (train.code_dir's default)."""
    import textwrap

    from tests.test_usercode import USER_PACKAGE, write_digits_tfrecords

    (folder / "userpkg").mkdir()
    for name, text in USER_PACKAGE.items():
        (folder / "userpkg" / name).write_text(textwrap.dedent(text))
    write_digits_tfrecords(folder / "shards", 4)


def test_multi_worker_mirrored_trains_a_user_model_on_user_files_sharded_by_file(tmp_path):
    _user_package(tmp_path)
    metrics, placement, log = _run(tmp_path, {
        "name": "mwu",
        "cluster": {"chief": 1, "workers": 1, "devices_per_worker": 1, "emulate": True},
        "train": {"strategy": "multi_worker_mirrored", "steps": 30, "batch_size": 32, "learning_rate": 0.1,
                  "log_every": 10, "checkpoint_every": 0, "max_restarts": 0,
                  "model": "userpkg.models:functional", "data": "tfrecord:shards/*.tfrecord",
                  "features": {"image": {"shape": [8, 8, 1]}, "label": {"dtype": "int64"}}, "num_classes": 10},
        "tracking": {"enabled": False}, "placement": {"warmup_steps": 2},
    })
    assert log[-1]["loss"] < 0.92 * log[0]["loss"]
    assert metrics["num_replicas"] == 2 and metrics["model"] == "userpkg.models:functional"
    kernel = next(v for v in placement["variables"] if v["name"] == "hidden/kernel")
    for job in ("/job:chief/", "/job:worker/"):
        assert any(d.startswith(job) for d in kernel["devices"]), kernel["devices"]
    # Four files, two workers: each reads its own two (file sharding), chief first.
    shards = {t: p["input_pipeline"]["sharding"] for t, p in placement["tasks"].items()}
    assert sorted(s["worker"] for s in shards.values()) == [0, 1]
    assert all(s["by"] == "file" and s["files"] == 2 and s["workers"] == 2 for s in shards.values()), shards


def test_parameter_server_trains_a_user_model_on_a_user_dataset(tmp_path):
    _user_package(tmp_path)
    _metrics, placement, log = _run(tmp_path, {
        "name": "psu",
        "cluster": {"chief": 1, "workers": 1, "ps": 1, "devices_per_worker": 1},
        "train": {"strategy": "parameter_server", "steps": 30, "batch_size": 32, "learning_rate": 0.1,
                  "log_every": 10, "checkpoint_every": 0, "max_restarts": 0,
                  "model": "userpkg.models:functional", "data": "userpkg.data:digits", "num_classes": 10},
        "tracking": {"enabled": False}, "placement": {"warmup_steps": 2},
    })
    assert log[-1]["loss"] < 0.92 * log[0]["loss"]
    for v in placement["variables"]:
        if v["name"].startswith(("hidden", "head")):
            assert all(d.startswith("/job:ps/task:0") for d in v["devices"]), v
