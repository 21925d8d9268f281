"""`train.entrypoint`: the user's own training function as the train step, through `pinpoint train`
as real processes: the worked examples in one process (checkpoints read back by TensorFlow's reader,
resume, MLflow), a failing user function, and multi_worker_mirrored / parameter_server entrypoints
in a local multi-process cluster (slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pinpoint.placement.model.files import read_placement
from tests import zygote

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def train(config: Path, out: Path, *, env: dict | None = None, expect: int = 0) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    # Forked from a process with TensorFlow and Pinpoint imported (tests/zygote.py): a fresh process but
    # for its start-up (a cluster's tasks are the launcher's own processes, fresh ones).
    proc = zygote.python([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out", str(out)],
                         cwd=os.getcwd(), env=full_env, timeout=540, preload=zygote.PINPOINT)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def example_config(tmp_path: Path, example: str, **train_overrides) -> Path:
    """The example's config, copied next to a copy of its package (the config's folder is code_dir)."""
    folder = tmp_path / example
    shutil.copytree(EXAMPLES / example, folder, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["train"].update(train_overrides)
    cfg["tracking"] = {"enabled": False}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "config.yaml"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_custom_loop_entrypoint_checkpoints_resume_and_capture(tmp_path):
    import tensorflow as tf

    config = example_config(tmp_path, "custom_loop",
                            entrypoint_args={"steps": 40, "batch_size": 32, "save_every": 20})
    out = tmp_path / "run"
    train(config, out)
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index"))
    assert ckpts == ["ckpt-20.index", "ckpt-40.index"]
    reader = tf.train.load_checkpoint(str(out / "checkpoints" / "ckpt-40"))
    shapes = reader.get_variable_to_shape_map()
    assert [64, 128] in shapes.values() and [128, 10] in shapes.values()  # dense_1 and head kernels
    p = read_placement(out)
    assert (p["training_function"], p["functions"][0]["calls"]) == ("train_step", 40)
    assert {v["name"]: v["devices"] for v in p["variables"]}["head/kernel"] == ["/GPU:1"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["status"], metrics["last_checkpoint_step"], metrics["start_step"]) == ("FINISHED", 40, 0)

    # More steps in the same folder: the loop resumes at the checkpoint's step.
    cfg = yaml.safe_load(config.read_text())
    cfg["train"]["entrypoint_args"]["steps"] = 60
    config.write_text(yaml.safe_dump(cfg))
    proc = train(config, out)
    assert "resuming from checkpoint step 40" in proc.stderr
    assert "step 50/60" in proc.stdout and "step 10/60" not in proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["start_step"], metrics["last_checkpoint_step"]) == (40, 60)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_fit_entrypoint_logs_keras_and_checkpoints_to_mlflow_and_resumes_at_the_epoch(tmp_path, live_mlflow):
    from mlflow.tracking import MlflowClient

    config = example_config(tmp_path, "keras_fit",
                            entrypoint_args=["--epochs", "2", "--steps-per-epoch", "15", "--batch-size", "64"])
    cfg = yaml.safe_load(config.read_text())
    cfg["tracking"] = {"enabled": True, "uri": live_mlflow.uri, "experiment": "entrypoint-fit",
                       "step_metrics_every_s": 0}  # every logged step (the exact steps are asserted)
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    train(config, out)
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index")) == ["ckpt-15.index", "ckpt-30.index"]
    p = read_placement(out)
    kernel = next(v for v in p["variables"] if v["name"] == "digits_mlp/hidden/kernel")
    assert [c["device"] for c in kernel["components"]] == ["/GPU:0", "/GPU:1"]

    client = MlflowClient(live_mlflow.uri)
    exp = client.get_experiment_by_name("entrypoint-fit")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.`pinpoint.step` = 'train'")
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == [10, 20, 30]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")) == [
        "checkpoints/ckpt-15", "checkpoints/ckpt-30"]
    assert "placement.json" in {a.path for a in client.list_artifacts(run.info.run_id)}

    # A third epoch in the same folder: fit resumes after the second (one epoch of 15 batches runs).
    cfg["train"]["entrypoint_args"] = ["--epochs", "3", "--steps-per-epoch", "15", "--batch-size", "64"]
    config.write_text(yaml.safe_dump(cfg))
    proc = train(config, out)
    assert "Epoch 3/3" in proc.stdout and "Epoch 1/3" not in proc.stdout
    assert "ckpt-45.index" in {p.name for p in (out / "checkpoints").glob("ckpt-*.index")}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_failing_entrypoint_shows_its_traceback_then_one_line_and_keeps_its_checkpoints(tmp_path):
    (tmp_path / "failpkg").mkdir()
    (tmp_path / "failpkg" / "__init__.py").write_text("")
    (tmp_path / "failpkg" / "train.py").write_text(textwrap.dedent("""
        import tensorflow as tf

        def boom(step):
            raise RuntimeError(f"diverged at step {step}")

        def main(ctx):
            v = tf.Variable(1.0)
            start = ctx.checkpoint(v=v)
            for step in range(start + 1, 4):
                v.assign_add(1.0)
                ctx.save(step)
            boom(3)
    """))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"name": "fails", "train": {"strategy": "none", "entrypoint": "failpkg.train:main"},
                                      "tracking": {"enabled": False}}))
    out = tmp_path / "run"
    proc = train(config, out, expect=1)
    err = proc.stderr
    assert 'in boom\n    raise RuntimeError(f"diverged at step {step}")' in err
    assert "RuntimeError: diverged at step 3" in err
    assert "/pinpoint/" not in err.split("Traceback")[1].split("RuntimeError:")[0]  # none of Pinpoint's frames
    last = err.strip().splitlines()[-1]
    assert last.startswith("pinpoint: train.entrypoint: got 'failpkg.train:main'; it raised RuntimeError")
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-1.index", "ckpt-2.index", "ckpt-3.index"]
    assert json.loads((out / "metrics.json").read_text())["status"] == "FAILED"
    assert (out / "placement.json").is_file()


# ---- multi-process clusters ---------------------------------------------------------------------
CLUSTER_PACKAGE = '''
import keras
import tensorflow as tf

import pinpoint


def _data():
    x = tf.random.stateless_normal((256, 8), seed=(1, 2))
    return x, tf.reduce_sum(x, axis=1, keepdims=True)


def _model():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out")], name="regressor")


def _model_and_optimizer(ctx):
    """Both built under the strategy; restored from the latest checkpoint: (model, optimizer, step)."""
    with ctx.strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    return model, optimizer, ctx.checkpoint(model=model, optimizer=optimizer)


def mwms(ctx):
    strategy, batch = ctx.strategy, 32
    model, optimizer, start = _model_and_optimizer(ctx)

    def dataset_fn(input_context):
        ds = tf.data.Dataset.from_tensor_slices(_data()).shard(input_context.num_input_pipelines,
                                                              input_context.input_pipeline_id)
        return ds.repeat().batch(input_context.get_per_replica_batch_size(batch))

    it = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model(x, training=True) - y)) / batch
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=next(iterator)), axis=None)

    for step in range(start + 1, 31):
        loss = train_step(it)
        if step % 10 == 0:
            pinpoint.log(step, loss=float(loss))
            ctx.save(step)


def ps(ctx):
    strategy = ctx.strategy
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    model, optimizer, start = _model_and_optimizer(ctx)

    def dataset_fn(input_context):
        return tf.data.Dataset.from_tensor_slices(_data()).repeat().batch(16)

    it = iter(coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def train_step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica, args=next(iterator))

    for step in range(start + 1, 31):
        result = coordinator.schedule(train_step, args=(it,))
        if step % 10 == 0:
            coordinator.join()
            pinpoint.log(step, loss=float(result.fetch()))
            ctx.save(step)
'''


def _cluster_run(tmp_path: Path, cluster: dict, strategy: str, function: str) -> tuple[dict, dict, Path]:
    (tmp_path / "clusterpkg").mkdir()
    (tmp_path / "clusterpkg" / "__init__.py").write_text("")
    (tmp_path / "clusterpkg" / "train.py").write_text(CLUSTER_PACKAGE)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "name": "ep-cluster", "cluster": cluster,
        "train": {"strategy": strategy, "entrypoint": f"clusterpkg.train:{function}", "max_restarts": 0},
        "tracking": {"enabled": False}}))
    out = tmp_path / "run"
    train(config, out)
    return (read_placement(out), json.loads((out / "metrics.json").read_text()), out)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multi_worker_mirrored_entrypoint_in_a_local_cluster(tmp_path):
    p, metrics, out = _cluster_run(tmp_path, {"chief": 1, "workers": 1, "devices_per_worker": 2, "emulate": True},
                                   "multi_worker_mirrored", "mwms")
    assert metrics["num_replicas"] == 4  # 2 tasks x 2 emulated GPUs
    assert metrics["final_loss"] < 1.0
    kernel = next(v for v in p["variables"] if v["name"] == "regressor/hidden/kernel")
    assert sorted(c["device"] for c in kernel["components"]) == [
        f"/job:{job}/task:0/GPU:{i}" for job in ("chief", "worker") for i in (0, 1)]
    assert p["replica_consistency"]["variables"]["regressor/hidden/kernel"] == 0.0
    assert (p["training_function"], p["functions"][0]["calls"]) == ("train_step", 30)
    assert sorted(f.name for f in out.glob("placement-*.json")) == ["placement-chief-0.json", "placement-worker-0.json"]
    assert sorted(f.name for f in (out / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-10.index", "ckpt-20.index", "ckpt-30.index"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parameter_server_entrypoint_runs_on_the_coordinator_with_variables_on_the_ps(tmp_path):
    p, metrics, out = _cluster_run(tmp_path, {"chief": 1, "workers": 2, "ps": 1, "devices_per_worker": 1},
                                   "parameter_server", "ps")
    weights = [v for v in p["variables"] if v["name"].startswith("regressor/")]
    assert len(weights) == 4
    assert all(v["devices"] == ["/job:ps/task:0/CPU:0"] for v in weights), weights
    train = p["functions"][0]
    assert (train["name"], train["calls"], train["captured"]) == ("train_step", 30, False)
    assert metrics["final_loss"] < 1.0 and metrics["steps"] == 30
    assert (out / "checkpoints" / "ckpt-30.index").is_file()
