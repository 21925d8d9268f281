"""Determinism, resume-equals-uninterrupted, and damaged checkpoints, for real (in-process,
same 3-logical-CPU layout as test_training.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_training import make_cfg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _train(cfg, out):
    from pinpoint.training.command import train_command

    assert train_command(cfg, out) == 0
    return json.loads((out / "metrics.json").read_text())


def _tensors(prefix) -> dict:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k}


def test_same_seed_same_loss(tmp_path):
    a = _train(make_cfg("none", steps=30, optimizer="adam", learning_rate=0.01), tmp_path / "a")
    b = _train(make_cfg("none", steps=30, optimizer="adam", learning_rate=0.01), tmp_path / "b")
    assert a["final_loss"] == pytest.approx(b["final_loss"], abs=1e-6)
    c = _train(make_cfg("none", steps=30, optimizer="adam", learning_rate=0.01, seed=1), tmp_path / "c")
    assert c["final_loss"] != pytest.approx(a["final_loss"], abs=1e-6)  # the seed matters


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    kw = {"optimizer": "adam", "learning_rate": 0.01, "checkpoint_every": 10}
    whole = tmp_path / "whole"
    _train(make_cfg("mirrored", steps=30, **kw), whole)
    parts = tmp_path / "parts"
    _train(make_cfg("mirrored", steps=20, **kw), parts)  # "interrupted" after step 20
    resumed = _train(make_cfg("mirrored", steps=30, **kw), parts)
    assert resumed["start_step"] == 20 and resumed["steps"] == 30
    a, b = _tensors(whole / "checkpoints" / "ckpt-30"), _tensors(parts / "checkpoints" / "ckpt-30")
    assert a.keys() == b.keys() and len(a) > 10
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)
    # Each logged step appears once, even though the process ran twice (step 1: the run's first).
    steps = [json.loads(line)["step"] for line in (parts / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 10, 20, 30]


def test_rerun_of_a_finished_run_says_nothing_to_train_and_keeps_its_figures(tmp_path, capsys):
    """Training a folder whose checkpoint is already at train.steps runs no step, says so, and
    leaves the completed run's metrics.json and placement.json as they were (it used to rewrite
    metrics.json with final_loss and examples_per_sec null)."""
    cfg = make_cfg("none", steps=10, checkpoint_every=10)
    first = _train(cfg, tmp_path)
    placement = (tmp_path / "placement.json").read_text()
    capsys.readouterr()
    again = _train(cfg, tmp_path)
    assert again == first and again["final_loss"] is not None and again["examples_per_sec"] is not None
    assert (tmp_path / "placement.json").read_text() == placement
    out = capsys.readouterr().out
    assert "nothing to train: the checkpoint is already at step 10" in out


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    import tensorflow as tf

    from pinpoint.devices import setup_devices
    from pinpoint.distribute.strategies import get_strategy
    from pinpoint.training.checkpoints import restore_latest_good
    from pinpoint.training.loop import engine
    from pinpoint.training.setup import TaskContext

    cfg = make_cfg("none", steps=30, checkpoint_every=10)
    _train(cfg, tmp_path)
    ckpts = tmp_path / "checkpoints"
    # ckpt-30: data file truncated (a crash or a full disk while writing it)
    data = next(ckpts.glob("ckpt-30.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    # ckpt-40: only a garbage index, as if killed in the middle of a save
    (ckpts / "ckpt-40.index").write_bytes(b"\x00garbage")
    dm = setup_devices(cfg)
    ctx = TaskContext(strategy=get_strategy("none", dm.replica_devices), device_map=dm)
    state = engine.build_state(cfg, ctx)
    model, optimizer, step_var = state.model, state.optimizer, state.step_var
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    assert restore_latest_good(ckpt, ckpts) == 20
    assert int(step_var.numpy()) == 20
    # The weights are ckpt-20's: restore it explicitly into a second model and compare.
    s2 = engine.build_state(cfg, ctx)
    model2 = s2.model
    tf.train.Checkpoint(model=model2, optimizer=s2.optimizer, step=s2.step_var).restore(str(ckpts / "ckpt-20")).expect_partial()
    for v, w in zip(model.trainable_variables, model2.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), w.numpy())
    fresh = engine.build_state(cfg, ctx).model  # same seed, never trained
    assert not np.array_equal(fresh.trainable_variables[0].numpy(), model.trainable_variables[0].numpy())
    err = capsys.readouterr().out
    assert "ckpt-40 is unreadable" in err and "ckpt-30 is unreadable" in err

    # A whole run also resumes from the good one and finishes.
    shutil.rmtree(tmp_path / "placement.json", ignore_errors=True)
    resumed = _train(make_cfg("none", steps=40, checkpoint_every=10), tmp_path)
    assert resumed["start_step"] == 20 and resumed["steps"] == 40
