"""Checkpoints for `model.fit` under `train.entrypoint` (ctx.callbacks()): the model and its
optimizer in run_dir/checkpoints/ckpt-<batches trained>, after every epoch; at the start of fit the
latest one (or the --resume-from-run one) is restored and fit continues at its epoch."""

from __future__ import annotations

import keras
import tensorflow as tf

from pinpoint.tfcompat.api import set_initial_epoch


class FitCheckpoint(keras.callbacks.Callback):
    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx
        self.batches = 0
        self.epoch = None  # tf.Variable, created with the model's checkpoint

    def on_train_begin(self, logs=None):
        self.ctx.model = self.model
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="pinpoint_epoch")
        self.batches = self.ctx.checkpoint(model=self.model, optimizer=self.model.optimizer, epoch=self.epoch)
        if self.batches:
            # As keras.callbacks.BackupAndRestore does: fit runs from the restored epoch on.
            set_initial_epoch(self.model, int(self.epoch.numpy()))

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.assign(epoch + 1)
        self.ctx.save(self.batches)
