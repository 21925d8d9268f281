"""placement.timing through the real trainer, in process, on 3 logical CPUs (host, /GPU:0=/CPU:1,
/GPU:1=/CPU:2): the sampled steps run under TensorFlow's profiler, the trace lands in the run
folder and a device given more work shows more busy time."""

from __future__ import annotations

import json

import pytest

from pinpoint.config import config_from_dict
from tests.conftest import NO_TRACKING, make_config
from tests.test_training import _three_logical_cpus, train  # noqa: F401 (autouse fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# The cnn's convolutions (most of its work, forward and backward) on /GPU:1; its small dense
# layers on /GPU:0.
HEAVY, LIGHT = "/GPU:1", "/GPU:0"
LAYERS = {"reshape": HEAVY, "conv_1": HEAVY, "conv_2": HEAVY, "pool": HEAVY, "flatten": HEAVY,
          "dense_1": LIGHT, "head": LIGHT}


def _cfg(timing: bool, steps: int = 6):
    return make_config(
        "t", cluster={"devices_per_worker": 2, "emulate": True},
        train={"strategy": "none", "model": "cnn", "steps": steps, "batch_size": 128, "learning_rate": 0.05,
               "log_every": 10, "checkpoint_every": 0, "jit_compile": False, "pinning": {"layers": LAYERS}},
        tracking=NO_TRACKING, placement={"warmup_steps": 2, "sample_steps": 2, "timing": timing},
    )


def test_the_device_with_more_work_is_busier_and_the_trace_is_in_the_run_folder(tmp_path):
    _, placement, _ = train(_cfg(True), tmp_path / "on")
    t = placement["timing"]
    assert t["steps"] == placement["captured_steps"] == [2, 3], t
    heavy, light = t["devices"][HEAVY], t["devices"][LIGHT]
    assert heavy["busy_ms"] > light["busy_ms"] > 0, t
    assert heavy["compute_ms"] > light["compute_ms"], t
    # The heaviest ops on the conv device are the convolutions (forward or backward), named as
    # one step's ops (the loop's own prefix removed). Among the first three: an op's measured time
    # includes any preemption of its thread, and CI's other streams preempt (a ReluGrad of 4.2 ms
    # once came first, the backward convolution second).
    top = heavy["top_ops"][:3]
    assert any("Conv" in o["type"] and "conv_" in o["op"] for o in top), heavy["top_ops"]
    assert not any(o["op"].startswith("while/") for o in heavy["top_ops"]), heavy["top_ops"]
    for d in (heavy, light):
        assert 0 <= d["idle_share"] < 1 and d["busy_ms"] == pytest.approx(d["compute_ms"] + d["transfer_ms"], abs=2e-3)
    # The boundary activation crosses between the two: transfer time on both.
    assert heavy["transfer_ms"] > 0 and light["transfer_ms"] > 0
    assert t["wall_ms"] >= heavy["busy_ms"] and t["unattributed"]["events"] == 0, t
    # The trace TensorBoard's profile plugin opens: <run>/profile/plugins/profile/<time>/<host>.xplane.pb.
    assert t["trace"] == "profile"
    traces = list((tmp_path / "on" / "profile").glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    # One step marker per profiled step, as Keras writes them: TensorBoard's profile overview and
    # step-time graph group the trace by them.
    from pinpoint.placement.profile.xspace import read_xspace, step_markers

    assert step_markers(read_xspace(traces[0])) == [2, 3]
    from pinpoint.placement.report.metrics import headline_metrics

    hm = headline_metrics(placement)
    assert hm["placement.timing.GPU_1.busy_ms"] == heavy["busy_ms"]


def test_mlflow_gets_the_timing_metrics_and_the_trace_folder(tmp_path):
    """A tracked run (the local sqlite store, in tmp_path): the headline timing metrics, and the
    trace under the artifact folder profile/ as TensorBoard's profile plugin expects it."""
    from mlflow.tracking import MlflowClient

    cfg = _cfg(True, steps=4).model_dump(mode="json", exclude_unset=True)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    cfg["tracking"] = {"enabled": True, "uri": uri, "experiment": "timing", "log_model": False}
    _, placement, _ = train(config_from_dict(cfg), tmp_path / "run")
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name("timing").experiment_id],
                           filter_string="tags.`pinpoint.step` = 'train'")
    assert run.data.metrics["placement.timing.GPU_1.busy_ms"] == placement["timing"]["devices"][HEAVY]["busy_ms"]
    assert "placement.timing.GPU_0.idle_share" in run.data.metrics and "placement.timing.wall_ms" in run.data.metrics
    (session,) = c.list_artifacts(run.info.run_id, "profile/plugins/profile")
    files = [a.path for a in c.list_artifacts(run.info.run_id, session.path)]
    assert len(files) == 1 and files[0].endswith(".xplane.pb"), files


def test_timing_off_runs_nothing_new(tmp_path):
    _, placement, _ = train(_cfg(False, steps=4), tmp_path / "off")
    assert "timing" not in placement and not (tmp_path / "off" / "profile").exists()
    assert json.loads((tmp_path / "off" / "train_log.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_timing_needs_the_capture():
    from pinpoint.errors import ConfigError

    with pytest.raises(ConfigError, match=r"placement.timing: got True; set placement.enabled: true"):
        config_from_dict({"name": "t", "placement": {"enabled": False, "timing": True}})


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_multi_worker_task_does_not_run_the_profiler_and_says_why(tmp_path):
    """Two tasks of a local cluster (chief and worker, multi_worker_mirrored) with timing on:
    the profiler's stop crashes such a task about one time in five (reproduced with plain
    TensorFlow), so neither runs it and the timing section names the reason; training completes."""
    import yaml

    from pinpoint.placement.capture.profiler import CLUSTER_TASK
    from tests.test_entrypoint import train as cli_train

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "mw-timing", "cluster": {"chief": 1, "workers": 1, "devices_per_worker": 1},
        "train": {"strategy": "multi_worker_mirrored", "steps": 8, "log_every": 2, "checkpoint_every": 0,
                  "max_restarts": 0},
        "placement": {"warmup_steps": 2, "sample_steps": 2, "timing": True},
        "tracking": {"enabled": False}}))
    out = tmp_path / "run"
    cli_train(config, out)
    timing = json.loads((out / "placement.json").read_text())["timing"]
    assert (timing["devices"], timing["notes"]) == (
        {}, [f"[{task}] not measured: {CLUSTER_TASK}" for task in ("chief:0", "worker:0")])
    assert json.loads((out / "metrics.json").read_text())["steps"] == 8
