"""One custom training loop (GradientTape + strategy.run) for every strategy.

The Trainer only takes steps: `train_steps(n)` runs n steps inside ONE tf.function call (a
tf.range loop), so Python and the host sync happen once per call, not once per step.
Logging, checkpoints and tracking are driven by the caller between calls.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import tensorflow as tf

from pinpoint.devices import device_scope


def tf_variables(variables) -> list:
    """The tf.Variables (possibly distributed) behind Keras 3 variables."""
    out = []
    for v in variables:
        out.append(v if isinstance(v, tf.Variable) else getattr(v, "value", v))
    return out


def step_metrics(loss: float, accuracy: float, n: int, seconds: float, examples: int) -> dict[str, Any]:
    """What one trainer call reports: means over its n steps, and its speed."""
    return {"loss": loss, "accuracy": accuracy, "step_time": seconds / n, "examples_per_sec": examples / seconds}


class Trainer:
    """Steps of synchronous SGD for one strategy; `coordinator` set for parameter_server.

    `step` is the run's one step counter: the step the next call starts at (the resumed
    checkpoint's step at first). Capturing placement is the capture plan's business
    (training.loop.capture); the trainer exposes the function it captures (`train_n`) and one
    replica's update (`replica_update`)."""

    def __init__(
        self,
        strategy,
        model,
        optimizer,
        pipeline,
        objective,
        *,
        gradient_device: str | None = None,
        backward_follows_layers: bool = False,
        coordinator=None,
        start_step: int = 0,
        jit_compile: bool = False,
        trace_scope=None,
    ):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.pipeline = pipeline  # InputPipeline (in memory) or StreamInput (tf.data)
        self.objective = objective
        self.gradient_device = gradient_device
        # pinning.gradients wins: all gradients on its device.
        self.backward_follows_layers = backward_follows_layers and gradient_device is None
        self.coordinator = coordinator
        self.global_batch = pipeline.global_batch
        self.start_step = start_step
        self.step = start_step
        # XLA for the fast path's forward+backward (one fused program per replica device). The
        # placement capture reports the compiled call's ops on its device (placement.graphs.steps).
        self.jit_compile = jit_compile
        self._compute_jit = tf.function(self._loss_and_grads, jit_compile=True) if jit_compile else None
        # A fixed signature: one concrete function (one instantiation) serves every call, so the
        # graphs captured when it is instantiated are the graphs of every step it runs.
        self.train_n = self.make_train_n()
        # Entered while the step is traced: default placement for ops without a device request
        # (GPU emulation: where a GPU machine's placer would put them; see distribute.emulation).
        self.trace_scope = trace_scope or contextlib.nullcontext
        self.calls = 0
        self._ps_iter = None

    # ---- one replica's step -------------------------------------------------------------
    def _loss_and_grads(self, x, y):
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            # Scale by the GLOBAL batch: the cross-replica SUM of gradients is then the mean.
            loss = tf.reduce_sum(self.objective.loss(y, pred)) / self.global_batch
            # mixed_float16: the loss-scale optimizer scales up here and unscales in apply.
            scaled = self.optimizer.scale_loss(loss)
        variables = self.model.trainable_variables
        if self.backward_follows_layers:
            # Model parallelism: graph-mode gradients (this runs inside the training tf.function)
            # colocate every gradient op with its forward op, so each pinned layer's backward pass
            # runs on the layer's device and activation gradients cross back between devices.
            # tape.gradient would place them all by the device scope of this call instead.
            # A tensor read on several devices has its gradient summed per device first
            # (_MultiDeviceAddN), one partial sum crossing per device: keep that default.
            # EXPERIMENTAL_TREE would sum beside the producer, every contribution crossing (a
            # transformer block split from the next sends its boundary gradient 4x, not once).
            grads = tf.gradients(scaled, tf_variables(variables), name="gradients")
        else:
            # The backward pass: pinned to one device when train.pinning.gradients is set.
            with tf.name_scope("gradients"), device_scope(self.gradient_device):
                grads = tape.gradient(scaled, variables)
        correct = (tf.reduce_sum(self.objective.correct(y, pred)) if self.objective.correct is not None
                   else tf.constant(0.0))
        return loss, correct, grads

    def replica_update(self, x, y):
        """One replica's forward, backward and update; (loss, correct) of its batch."""
        compute = self._compute_jit if self.jit_compile else self._loss_and_grads
        loss, correct, grads = compute(x, y)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss, correct

    def _replica_step(self, step, i, *inputs):
        ctx = tf.distribute.get_replica_context()
        x, y = self.pipeline.replica_batch(step, ctx.replica_id_in_sync_group, i, *inputs)
        return self.replica_update(x, y)

    def call_args(self, n: int) -> tuple:
        """train_n's arguments for the next n steps."""
        return (tf.constant(self.step, tf.int64), tf.constant(n, tf.int32), *self.pipeline.call_inputs(self.step, n))

    def _accumulate(self, sums, per_replica):
        """sums + (loss, correct) of one step, summed over the replicas. Sync point: the
        reductions gather one scalar per replica onto the host."""
        sum_ = tf.distribute.ReduceOp.SUM
        loss, correct = (self.strategy.reduce(sum_, v, axis=None) for v in per_replica)
        # The loop's own bookkeeping in its own name scope, apart from the step's ops.
        with tf.name_scope("loop"):
            return sums[0] + loss, sums[1] + correct

    @staticmethod
    def _means(sums, n, examples_per_step):
        nf = tf.cast(n, tf.float32)
        return sums[0] / nf, sums[1] / (nf * examples_per_step)

    def make_train_n(self):
        """The n-step training function of this trainer's pipeline: (start, n, *the pipeline's
        call inputs, e.g. the call's example indices) -> (mean loss, accuracy)."""
        return tf.function(self._train_n_py, input_signature=[
            tf.TensorSpec([], tf.int64, name="start"), tf.TensorSpec([], tf.int32, name="n"),
            *self.pipeline.call_specs()])

    def _train_n_py(self, start, n, *inputs):
        """n steps in one tf.range loop -> (mean loss, accuracy)."""
        with self.trace_scope():
            sums = (tf.constant(0.0), tf.constant(0.0))
            for i in tf.range(n):
                with tf.name_scope("loop"):
                    # The i-th step of the call, as an op of its own: the loop variable itself,
                    # sent to the input device, has no shape the runtime reports (unsized).
                    row = tf.cast(i, tf.int64)
                    step = start + row
                sums = self._accumulate(sums, self.strategy.run(self._replica_step, args=(step, row, *inputs)))
            return self._means(sums, n, self.global_batch)

    # ---- public ---------------------------------------------------------------------------
    def train_steps(self, n: int) -> dict[str, Any]:
        """Run n steps; return {loss, accuracy} (means over the n steps) as Python floats."""
        if self.coordinator is not None:
            return self._ps_train_steps(n)
        t0 = time.perf_counter()
        loss, acc = self.train_n(*self.call_args(n))
        return self.finish_call(loss, acc, n, t0)

    def finish_call(self, loss, acc, n: int, t0: float, examples_per_step: int | None = None) -> dict[str, Any]:
        """Account for a call of n steps that started at `t0`: the host sync, the step counter."""
        loss, acc = float(loss), float(acc)  # host sync once per call
        self.step += n
        self.calls += 1
        return step_metrics(loss, acc, n, time.perf_counter() - t0, n * (examples_per_step or self.global_batch))

    def variables(self) -> list:
        """Keras variables (placement names them by their Keras path, e.g. a subclassed model's
        'model/hidden/kernel'; it reads the tf.Variable each one wraps)."""
        return list(self.model.variables) + list(self.optimizer.variables)

    # ---- parameter_server: steps are closures scheduled on workers ---------------------------
    def _ps_setup(self):
        if self._ps_iter is not None:
            return
        pipeline = self.pipeline
        strategy = self.strategy
        start = self.step

        def per_worker_dataset_fn():
            return strategy.distribute_datasets_from_function(
                lambda ctx: pipeline.dataset(start, ctx.input_pipeline_id).map(
                    lambda x, y: (x[: pipeline.per_replica], y[: pipeline.per_replica])
                )
            )

        ds = self.coordinator.create_per_worker_dataset(per_worker_dataset_fn)
        self._ps_iter = iter(ds)

        def ps_n(iterator, n):
            sums = (tf.constant(0.0), tf.constant(0.0))
            for _ in tf.range(n):
                x, y = next(iterator)
                sums = self._accumulate(sums, strategy.run(self.replica_update, args=(x, y)))
            return self._means(sums, n, pipeline.per_replica)

        self._ps_fn = tf.function(ps_n)

    def _ps_train_steps(self, n: int) -> dict[str, Any]:
        """Schedule n steps as closures of `chunk` steps each, spread over the workers."""
        self._ps_setup()
        t0 = time.perf_counter()
        chunk = max(1, min(n, 10))
        results = []
        done = 0
        while done < n:
            k = min(chunk, n - done)
            results.append((k, self.coordinator.schedule(self._ps_fn, args=(self._ps_iter, tf.constant(k)))))
            done += k
        self.coordinator.join()  # sync point: every scheduled closure has finished
        fetched = [(k, r.fetch()) for k, r in results]  # already computed: join() returned
        loss = sum(k * float(v[0]) for k, v in fetched) / n
        acc = sum(k * float(v[1]) for k, v in fetched) / n
        # Each step consumes one per-replica batch on one worker.
        return self.finish_call(loss, acc, n, t0, examples_per_step=self.pipeline.per_replica)

    def ps_batch_step(self, step):
        """parameter_server: one replica's update on batch `step` (what a captured step runs)."""
        self._ps_setup()
        x, y = self.pipeline.replica_batch(step, 0)
        return self.replica_update(x, y)
