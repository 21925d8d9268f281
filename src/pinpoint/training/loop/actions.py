"""What a run does around its steps, composed by the controller: the progress bar, the
train_log.jsonl log with its plain "step N/M" lines, and checkpointing. The first two are hooks
(see pinpoint.hooks) of the chief; checkpointing runs on every task (collectives need all)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pinpoint.hooks import Hook
from pinpoint.runfolder import atomic_write_text


class Action(Hook):
    """A hook the controller also calls after every trainer call, a logged step or not."""

    def after_steps(self, step: int, n: int, metrics: Mapping[str, float]) -> None:
        """The trainer just took n steps, up to `step`."""

    def close(self) -> None:
        """Training ended (or failed): release what the action holds."""


def _postfix(metrics: Mapping[str, float]) -> str:
    acc = f" acc={metrics['accuracy']:.3f}" if "accuracy" in metrics else ""
    return f"loss={metrics['loss']:.4f}{acc}"


class ProgressBar(Action):
    """tqdm on stderr, off when it is not a TTY."""

    def __init__(self, start: int, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=start, file=sys.stderr, desc="train", unit="step",
                        dynamic_ncols=True, mininterval=0.5, disable=None)  # None: off when not a TTY

    def after_steps(self, step, n, metrics):
        self.bar.update(n)

    def on_step_end(self, step, metrics):
        self.bar.set_postfix_str(_postfix(metrics))

    def close(self):
        self.bar.close()


class TrainLog(Action):
    """train_log.jsonl (one record per logged step) and, without a progress bar, a plain line."""

    def __init__(self, path: Path, start: int, total: int):
        truncate_log(path, start)
        self.file = path.open("a")
        self.total = total
        self.plain = not sys.stderr.isatty()  # no progress bar: print a line per log step

    def on_step_end(self, step, metrics):
        record = {"step": step, **{k: round(v, 6) for k, v in metrics.items()}, "time": time.time()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.plain:
            print(f"step {step}/{self.total} {_postfix(metrics)} {metrics['examples_per_sec']:.0f} ex/s", flush=True)

    def close(self):
        self.file.close()


def truncate_log(path: Path, start: int) -> None:
    """Keep only records up to the resumed step, so every logged step appears exactly once
    after any number of restarts (steps after the checkpoint are redone and logged again)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= start:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a killed writer
    atomic_write_text(path, "".join(k + "\n" for k in kept))


class Checkpointing(Action):
    """Save every train.checkpoint_every steps and at the last one; tell the hooks what was written."""

    def __init__(self, checkpoints, step_var, every: int, total: int, hooks: Hook):
        self.checkpoints, self.step_var, self.every, self.total = checkpoints, step_var, every, total
        self.hooks = hooks

    def after_steps(self, step, n, metrics):
        if self.every and (step % self.every == 0 or step == self.total):
            self.step_var.assign(step)
            path = self.checkpoints.save(step)
            if path:
                self.hooks.on_checkpoint(step, path)
