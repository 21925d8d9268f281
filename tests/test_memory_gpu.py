"""Issue 49, the gpu tier (`make test-gpu`, a machine with 2 GPUs): the GPU machine's memory
predicted on emulated GPUs, held to what the real GPUs' own allocators say over the same training
(`get_memory_info("GPU:i")`, one allocator per GPU there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement
from tests.conftest import NO_TRACKING, make_config
from tests.test_fidelity import two_gpus  # noqa: F401 - the fixture

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.timeout(1800)]

BAND = 0.15  # docs/memory.md: the verdict's band, the allocator's fragmentation


def _train(tmp: Path, model: str, strategy: str, *, emulate: bool) -> dict:
    cfg = make_config(f"memory-{model}-{strategy.replace('_', '-')}", as_dict=True,
                      cluster={"devices_per_worker": 2, "emulate": emulate},
                      train={"strategy": strategy, "model": model, "data": "digits", "batch_size": 64, "steps": 8,
                             "checkpoint_every": 0, "pinning": {"input": "/CPU:0"},
                             **({"pinning": {"input": "/CPU:0", "layers": {"dense_1": "/GPU:0", "dense_2": "/GPU:1",
                                                                           "head": "/GPU:1"}}}
                                if strategy == "none" else {})},
                      tracking=NO_TRACKING, placement={"warmup_steps": 2, "memory": True})
    path = tmp / f"{cfg['name']}-{'emulated' if emulate else 'gpu'}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if emulate else {}))
    out = path.with_suffix("")
    r = subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(path), "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return read_placement(out / "placement.json")["memory"]


@pytest.mark.parametrize(("model", "strategy"), [("mlp", "mirrored"), ("mlp", "none")])
def test_the_gpu_machines_prediction_holds_to_each_gpus_allocator(model, strategy, tmp_path, two_gpus):  # noqa: F811
    predicted = _train(tmp_path, model, strategy, emulate=True)["predicted"]["devices"]
    real = _train(tmp_path, model, strategy, emulate=False)
    peaks = real["gpu_allocator_peaks"]
    assert set(peaks) == {"/GPU:0", "/GPU:1"}
    off = {d: round(predicted[d]["gpu_machine"] / peaks[d] - 1, 3) for d in peaks}
    assert all(abs(x) <= BAND for x in off.values()), off
