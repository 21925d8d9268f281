"""Checkpoints logged as they are written and fetched back; the final Keras model logged in a form
MLflow loads back and predicts with. Real TensorFlow, real `mlflow server`."""

from __future__ import annotations

import contextlib
import uuid

import numpy as np
import pytest

from pinpoint.errors import ConfigError
from pinpoint.tracking import fetch_checkpoint, open_step_run
from tests.conftest import make_config


def make_cfg(uri, **tracking):
    return make_config("trk-tf", cluster={"devices_per_worker": 1}, train={"strategy": "none"},
                       tracking={"uri": uri, "experiment": f"tf-{uuid.uuid4().hex[:8]}", **tracking})


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_checkpoints_uploaded_fetched_back_and_model_predicts(live_mlflow, tmp_path, monkeypatch):
    import mlflow
    import tensorflow as tf
    from mlflow.tracking import MlflowClient

    cfg = make_cfg(live_mlflow.uri, checkpoints_every_s=0)  # every checkpoint goes up
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="dense")])
    step = tf.Variable(0, dtype=tf.int64, name="step")
    opt = tf.keras.optimizers.SGD(0.1)
    ckpt = tf.train.Checkpoint(step=step, model=model, optimizer=opt)
    # keep=1: the manager deletes ckpt-5 when it writes ckpt-10, before the upload may have
    # happened; the spool's snapshot must still deliver it.
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path / "checkpoints"), max_to_keep=1, checkpoint_name="ckpt")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
        hook = run.hook()
        for s in (5, 10):
            step.assign(s)
            model.layers[0].kernel.assign(tf.fill((4, 3), float(s)))
            hook.on_checkpoint(s, manager.save(checkpoint_number=s))
        assert not list((tmp_path / "checkpoints").glob("ckpt-5.*"))
        hook.on_train_end({"final_loss": 0.5, "examples_per_sec": 10.0, "steps": 10}, model)
        run_id = run.run_id
    c = MlflowClient(live_mlflow.uri)
    logged = sorted(a.path for a in c.list_artifacts(run_id, "checkpoints"))
    assert logged == ["checkpoints/ckpt-10", "checkpoints/ckpt-5"]
    files = {a.path.rsplit("/", 1)[1] for a in c.list_artifacts(run_id, "checkpoints/ckpt-10")}
    assert {"ckpt-10.index", "checkpoint"} <= files and any(".data-" in f for f in files)
    assert c.get_run(run_id).data.metrics["final_loss"] == 0.5

    prefix = fetch_checkpoint(run_id, cfg, tmp_path / "fetched")
    assert prefix.name == "ckpt-10" and prefix.parent.is_relative_to(tmp_path / "fetched")
    reader = tf.train.load_checkpoint(str(prefix))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 10
    # Restoring into fresh objects continues the step count.
    step2 = tf.Variable(0, dtype=tf.int64)
    model2 = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="dense")])
    tf.train.Checkpoint(step=step2, model=model2, optimizer=tf.keras.optimizers.SGD(0.1)).restore(str(prefix)).expect_partial()
    assert int(step2.numpy()) == 10
    np.testing.assert_allclose(model2.layers[0].kernel.numpy(), np.full((4, 3), 10.0))

    monkeypatch.setenv("MLFLOW_TRACKING_URI", live_mlflow.uri)  # how a user points MLflow at the server
    loaded = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    np.testing.assert_allclose(np.asarray(loaded.predict(x)), model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_fetch_checkpoint_errors_are_one_line(live_mlflow, tmp_path):
    cfg = make_cfg(live_mlflow.uri)
    with pytest.raises(ConfigError, match="--resume-from-run: run 'nope' not found"):
        fetch_checkpoint("nope", cfg, tmp_path)
    with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
        run_id = run.run_id
    with pytest.raises(ConfigError, match="has no checkpoints logged") as err:
        fetch_checkpoint(run_id, cfg, tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ending", ["train_end", "error"])
def test_checkpoints_written_faster_than_the_interval_send_the_first_and_the_last(live_mlflow, tmp_path, ending):
    """tracking.checkpoints_every_s (default 10 s): four checkpoints within a second reach MLflow
    as the first (the time had come) and the last (held, sent at the end of training, or at the
    run's close when training stopped on an error); all four were written to the run folder."""
    import tensorflow as tf
    from mlflow.tracking import MlflowClient

    cfg = make_cfg(live_mlflow.uri)
    assert cfg.tracking.checkpoints_every_s == 10.0
    step = tf.Variable(0, dtype=tf.int64, name="step")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path / "checkpoints"),
                                         max_to_keep=4, checkpoint_name="ckpt")
    with pytest.raises(RuntimeError, match="stopped") if ending == "error" else contextlib.nullcontext():
        with open_step_run(cfg, "train", tmp_path, system_metrics=False) as run:
            hook = run.hook()
            for s in (5, 10, 15, 20):
                step.assign(s)
                hook.on_checkpoint(s, manager.save(checkpoint_number=s))
            run_id = run.run_id
            if ending == "error":
                raise RuntimeError("training stopped")
            hook.on_train_end({"steps": 20}, None)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-10.index", "ckpt-15.index", "ckpt-20.index", "ckpt-5.index"]
    c = MlflowClient(live_mlflow.uri)
    assert sorted(a.path for a in c.list_artifacts(run_id, "checkpoints")) == ["checkpoints/ckpt-20", "checkpoints/ckpt-5"]
    prefix = fetch_checkpoint(run_id, cfg, tmp_path / "fetched")
    assert tf.train.load_checkpoint(str(prefix)).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 20
