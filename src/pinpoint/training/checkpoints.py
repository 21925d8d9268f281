"""Checkpoints: a CheckpointManager per task, and a restore that survives a bad latest checkpoint.

Files are OUT/checkpoints/ckpt-<step>.{index,data-*}. Under multi_worker_mirrored every worker
must call save (saving reads the variables collectively), but only the chief's copy is kept:
the others write to a temporary folder that is deleted right after.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import tensorflow as tf

from pinpoint.runfolder import CHECKPOINT_BASENAME, checkpoint_indexes, checkpoint_step

log = logging.getLogger("pinpoint.checkpoints")


class Checkpoints:
    def __init__(self, checkpoint: tf.train.Checkpoint, directory: Path, *, keep: int, is_chief: bool = True, task: str = "chief:0"):
        self.checkpoint = checkpoint
        self.directory = Path(directory)
        self.is_chief = is_chief
        # Non-chief workers save to a private temp folder (deleted after every save).
        self.save_dir = self.directory if is_chief else self.directory / f".tmp-{task.replace(':', '-')}"
        self.manager = tf.train.CheckpointManager(checkpoint, str(self.save_dir), max_to_keep=keep,
                                                  checkpoint_name=CHECKPOINT_BASENAME)

    def save(self, step: int) -> str | None:
        """Save at `step`; return the prefix on the chief, None elsewhere.

        TF writes the data to a temporary name and renames it, then rewrites the 'checkpoint'
        state file; a crash midway leaves the previous checkpoint intact (restore() verifies).
        """
        path = self.manager.save(checkpoint_number=step)
        if not self.is_chief:
            shutil.rmtree(self.save_dir, ignore_errors=True)
            return None
        return path

    def restore_latest(self) -> int:
        """Restore the newest readable checkpoint in the shared folder; return its step (0 if none)."""
        return restore_latest_good(self.checkpoint, self.directory)


def candidates(directory: Path) -> list[tuple[int, str]]:
    """(step, prefix) of every checkpoint in `directory`, newest first (from the files, not from
    the 'checkpoint' state file, which may itself be stale or damaged)."""
    return [(step, str(index)[: -len(".index")]) for step, index in checkpoint_indexes(directory)]


def verify(prefix: str) -> None:
    """Read every tensor of a checkpoint (the bundle checks sizes and CRCs); raise if damaged."""
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


def restore_latest_good(checkpoint: tf.train.Checkpoint, directory: Path) -> int:
    """Restore the newest checkpoint that verifies; warn about each damaged newer one."""
    for step, prefix in candidates(directory):
        try:
            verify(prefix)
            checkpoint.restore(prefix).expect_partial()
        except Exception as err:  # noqa: BLE001 - any read error means "damaged"
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            log.warning("checkpoint %s is unreadable (%s); falling back to the previous one", prefix, first)
            print(f"pinpoint: warning: checkpoint {Path(prefix).name} is unreadable ({first}); "
                  "falling back to the previous one", flush=True)
            continue
        return step
    return 0


def restore_prefix(checkpoint: tf.train.Checkpoint, prefix: str) -> int:
    """Restore one given checkpoint (e.g. fetched from MLflow); return its step."""
    verify(prefix)
    checkpoint.restore(prefix).expect_partial()
    return checkpoint_step(prefix) or 0
