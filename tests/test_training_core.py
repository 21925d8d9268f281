"""The training core's shape: the controller drives any trainer it is handed (a small fake here:
no TensorFlow), one step counter, checkpoints after the step's log record, and a training step
no more than 8 Python frames below the CLI."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from pinpoint.config import config_from_dict
from pinpoint.hooks import Hook


class FakeTrainer:
    """What the controller needs of a trainer: a step counter, calls, n steps at a time."""

    def __init__(self, start: int = 0):
        self.start_step = self.step = start
        self.calls = 0
        self.global_batch = 8
        self.pipeline = type("P", (), {"global_batch": 8})()
        self.taken: list[tuple[int, int]] = []

    def train_steps(self, n: int) -> dict:
        self.taken.append((self.step, n))
        self.step += n
        self.calls += 1
        return {"loss": 1.0 / self.step, "accuracy": 0.5, "step_time": 0.01, "examples_per_sec": 800.0}


class FakeCheckpoints:
    def __init__(self):
        self.saved: list[int] = []

    def save(self, step: int) -> str:
        self.saved.append(step)
        return f"ckpt-{step}"


class Recorder(Hook):
    def __init__(self, events):
        self.events = events

    def on_step_end(self, step, metrics):
        self.events.append(("log", step))

    def on_checkpoint(self, step, path):
        self.events.append(("checkpoint", step))


def _state():
    var = type("V", (), {"numpy": lambda self: np.zeros((3, 2))})()
    model = type("M", (), {"trainable_variables": [var]})()
    step_var = type("S", (), {"assign": lambda self, v: None})()
    data = type("D", (), {"source": "fake"})()
    objective = type("O", (), {"has_accuracy": True})()
    from pinpoint.training.loop.engine import TrainState

    return TrainState(data, model, None, step_var, objective, 1)


@pytest.mark.unit
@pytest.mark.parametrize("start", [0, 20])
def test_the_controller_drives_a_fake_trainer_logs_then_checkpoints(tmp_path, start):
    from pinpoint.device_names import DeviceMap
    from pinpoint.training.loop.controller import Controller
    from pinpoint.training.setup import TaskContext

    cfg = config_from_dict({"name": "fake", "train": {"strategy": "none", "steps": 40, "log_every": 10,
                                                       "checkpoint_every": 20},
                            "placement": {"enabled": False}, "tracking": {"enabled": False}})
    strategy = type("S", (), {"num_replicas_in_sync": 1})()
    ctx = TaskContext(strategy=strategy, device_map=DeviceMap(aliases={}, replica_devices=("/CPU:0",),
                                                              spec_replica_devices=("/CPU:0",)))
    trainer, ckpts, events = FakeTrainer(start), FakeCheckpoints(), []
    controller = Controller(cfg, tmp_path, ctx, trainer, _state(), checkpoints=ckpts, hooks=[Recorder(events)])
    run = controller.begin()
    controller.train_until(run, cfg.train.steps)
    # The run's first step is a call of its own; then calls stop at every log and checkpoint step.
    expected_calls = [(0, 1), (1, 9), (10, 10), (20, 10), (30, 10)] if start == 0 else [(20, 10), (30, 10)]
    assert trainer.taken == expected_calls
    assert trainer.step == 40 and trainer.start_step == start  # the one counter
    assert ckpts.saved == ([20, 40] if start == 0 else [40])
    # A checkpoint is written after its step's log record (a resumed log holds every step up to it).
    logged = [1, 10, 20, 30, 40] if start == 0 else [30, 40]
    order = [e for e in events if e[0] == "log" or e[0] == "checkpoint"]
    expected = []
    for s in logged:
        expected.append(("log", s))
        if s in ckpts.saved:
            expected.append(("checkpoint", s))
    assert order == expected
    lines = (tmp_path / "train_log.jsonl").read_text().splitlines()
    assert len(lines) == len(logged)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_training_step_is_at_most_8_frames_below_the_cli(tmp_path, monkeypatch):
    """Pinpoint's own Python frames between the CLI (cli.py) and one replica's update, while the
    first step is traced (TensorFlow's own frames are not counted; autograph's conversions of
    Pinpoint's functions are): the path a reader follows. Strategy none: a mirrored replica's
    step is traced in a thread of its own, whose stack starts there."""
    import yaml

    import pinpoint
    from pinpoint import cli
    from pinpoint.training.loop.trainer import Trainer

    src = str(Path(pinpoint.__file__).parent)
    paths = []
    original = Trainer.replica_update

    def own(f) -> str | None:
        if f.filename.startswith(src) and not f.filename.endswith("cli.py"):
            return f"{Path(f.filename).stem}.{f.function}"
        if "__autograph_generated" in f.filename and f.function.startswith("tf__") and f.function != "tf__measured":
            return f"trainer.{f.function[len('tf__'):]}"  # autograph's conversion of a Pinpoint function
        return None

    def measured(self, x, y):
        names = [own(f) for f in inspect.stack()[1:]]
        paths.append([n for n in reversed(names) if n])
        return original(self, x, y)

    monkeypatch.setattr(Trainer, "replica_update", measured)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"name": "frames", "cluster": {"devices_per_worker": 2},
                                      "train": {"strategy": "none", "steps": 12, "log_every": 4,
                                                "checkpoint_every": 0},
                                      "tracking": {"enabled": False}}))
    assert cli.main(["train", str(config), "--out", str(Path(tmp_path) / "run")]) == 0
    (path,) = {tuple(p) for p in paths}  # every replica's trace takes the same path
    assert path == ("command.train_command", "run.run_training", "controller.train", "controller.train_until",
                    "capture.capture_first_call", "trainer._train_n_py", "trainer._replica_step"), path
    assert len(path) + 1 <= 8  # and replica_update itself
