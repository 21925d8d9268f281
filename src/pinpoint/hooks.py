"""The hook protocol: what a training run tells the outside world (logging, the progress bar,
checkpoints, tracking). Neutral ground: training calls hooks, tracking implements one, and
neither imports the other for it. Imports nothing from pinpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Hook:
    """Base hook: every method is optional. Only the chief's hooks are called."""

    def on_train_begin(self, info: Mapping[str, Any]) -> None:
        """info: config, devices, device_aliases, strategy name, start step, num params..."""

    def on_step_end(self, step: int, metrics: Mapping[str, float]) -> None:
        """metrics: loss, accuracy, examples_per_sec, step_time (seconds)."""

    def on_checkpoint(self, step: int, path: str) -> None:
        """path: the checkpoint prefix just written (readable by tf.train.load_checkpoint)."""

    def on_placement(self, placement: Any) -> None:
        """placement: what was written to placement.json, as pinpoint.placement.model.placement.Placement."""

    def on_train_end(self, summary: Mapping[str, Any], model: Any = None) -> None:
        """summary: the dict written to metrics.json; model: the trained Keras model (chief)."""


class HookList(Hook):
    def __init__(self, hooks=()):
        self.hooks = [h for h in hooks if h is not None]

    def on_train_begin(self, info):
        for h in self.hooks:
            h.on_train_begin(info)

    def on_step_end(self, step, metrics):
        for h in self.hooks:
            h.on_step_end(step, metrics)

    def on_checkpoint(self, step, path):
        for h in self.hooks:
            h.on_checkpoint(step, path)

    def on_placement(self, placement):
        for h in self.hooks:
            h.on_placement(placement)

    def on_train_end(self, summary, model=None):
        for h in self.hooks:
            h.on_train_end(summary, model)
