"""Streaming, proven by memory: `pinpoint train` reads a 512 MiB TFRecord set once through, and
its peak resident memory grows by far less than the data it read, against the same run on a
1/16 slice. An in-memory loader would hold the whole set (peak + 512 MiB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NO_TRACKING, make_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FEATURES = 4096  # float32: 16 KiB per record
RECORDS = 32768  # x 16 KiB = 512 MiB
FILES = 8
BATCH = 64
# The peak may grow by at most this much more than the small run's: a fraction of the 512 MiB
# read (shuffle buffer, prefetch and parse buffers are bounded; nothing scales with the data).
MAX_GROWTH_MIB = 128


def _write(folder: Path, records: int) -> int:
    """TFRecords of Examples {x: FEATURES floats, label: int64}; returns the bytes written.
    One Example is serialized as a template and its packed float payload replaced per record
    (float_list is stored as raw little-endian float32), so writing 512 MiB takes seconds."""
    import tensorflow as tf

    folder.mkdir(parents=True)
    marker = np.full(FEATURES, 1.2345678, np.float32)
    template = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=marker)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
    })).SerializeToString()
    start = template.index(marker.tobytes())
    head, tail = template[:start], template[start + marker.nbytes:]
    rng = np.random.default_rng(0)
    written = 0
    for f in range(FILES):
        with tf.io.TFRecordWriter(str(folder / f"part-{f}.tfrecord")) as w:
            for _ in range(records // FILES):
                payload = rng.random(FEATURES, dtype=np.float32).tobytes()
                w.write(head + payload + tail)
                written += len(payload)
    return written


def _peak_rss_mib(config: Path, out: Path) -> float:
    """Run `pinpoint train` as the only child of a fresh interpreter; return its peak RSS."""
    probe = (
        "import resource, subprocess, sys\n"
        "rc = subprocess.call(sys.argv[1:])\n"
        "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "pinpoint.cli", "train",
                           str(config), "--out", str(out)], capture_output=True, text=True, env=env, timeout=800)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PEAK"))
    _, kib, rc = line.split()
    assert rc == "0", proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(kib) / 1024


def _config(folder: Path, data: Path, steps: int) -> Path:
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "wide.py").write_text(
        "import keras\n\n"
        "def linear(input_shape, num_classes):\n"
        "    inp = keras.Input(input_shape)\n"
        "    return keras.Model(inp, keras.layers.Dense(num_classes, name='head')(inp))\n"
    )
    return make_config(
        "stream",
        cluster={"devices_per_worker": 1},
        train={"strategy": "none", "model": "model.wide:linear", "data": f"tfrecord:{data}/*.tfrecord",
               "features": {"x": {"shape": [FEATURES]}, "label": {"dtype": "int64"}}, "num_classes": 10,
               "batch_size": BATCH, "steps": steps, "log_every": 64, "checkpoint_every": 0, "shuffle_buffer": 256},
        tracking=NO_TRACKING, path=folder / "config.yaml",
    )


def test_a_dataset_larger_than_the_memory_bound_streams_through(tmp_path):
    big = _write(tmp_path / "big", RECORDS)
    _write(tmp_path / "small", RECORDS // 16)
    assert big == RECORDS * FEATURES * 4 == 512 * 2**20
    steps = RECORDS // BATCH  # every record read once
    small_peak = _peak_rss_mib(_config(tmp_path / "s", tmp_path / "small", steps // 16), tmp_path / "s" / "run")
    big_peak = _peak_rss_mib(_config(tmp_path / "b", tmp_path / "big", steps), tmp_path / "b" / "run")
    metrics = json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())
    assert metrics["steps"] == steps and metrics["data"] == f"tfrecord ({FILES} files)"
    growth = big_peak - small_peak
    print(f"peak RSS: {big_peak:.0f} MiB reading 512 MiB, {small_peak:.0f} MiB reading 32 MiB")
    assert growth < MAX_GROWTH_MIB, f"peak RSS {big_peak:.0f} MiB vs {small_peak:.0f} MiB on 1/16 of the data"
