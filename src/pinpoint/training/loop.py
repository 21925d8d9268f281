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


def tf_variables(variables) -> list:
    """The tf.Variables (possibly distributed) behind Keras 3 variables."""
    out = []
    for v in variables:
        out.append(v if isinstance(v, tf.Variable) else getattr(v, "value", v))
    return out


def _device(device: str | None):
    return tf.device(device) if device else contextlib.nullcontext()


class Trainer:
    """Steps of synchronous SGD for one strategy; `coordinator` set for parameter_server."""

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
        placement_scope=None,
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
        self.step = start_step
        # XLA for the fast path's forward+backward (one fused program per replica device). The
        # placement capture reports the compiled call's ops on its device (placement.steps).
        self.jit_compile = jit_compile
        self._compute_jit = tf.function(self._loss_and_grads, jit_compile=True) if jit_compile else None
        # A fixed signature: one concrete function (one instantiation) serves every call, so the
        # graphs captured when it is instantiated are the graphs of every step it runs.
        self._train_n = tf.function(self._train_n_py, input_signature=[
            tf.TensorSpec([], tf.int64, name="start"), tf.TensorSpec([], tf.int32, name="n")])
        # Default placement for ops without a device request, entered while the step is traced
        # (GPU emulation: where a GPU machine's placer would put them; see training.emulation).
        self._placement_scope = placement_scope or contextlib.nullcontext
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
            grads = tf.gradients(scaled, tf_variables(variables), name="gradients")
        else:
            # The backward pass: pinned to one device when train.pinning.gradients is set.
            with tf.name_scope("gradients"), _device(self.gradient_device):
                grads = tape.gradient(scaled, variables)
        correct = (tf.reduce_sum(self.objective.correct(y, pred)) if self.objective.correct is not None
                   else tf.constant(0.0))
        return loss, correct, grads

    def _replica_update(self, x, y):
        compute = self._compute_jit if self.jit_compile else self._loss_and_grads
        loss, correct, grads = compute(x, y)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss, correct

    def _replica_step(self, step):
        ctx = tf.distribute.get_replica_context()
        x, y = self.pipeline.replica_batch(step, ctx.replica_id_in_sync_group)
        return self._replica_update(x, y)

    def _one_step(self, step):
        """One global step in cross-replica context -> (loss, correct) summed over replicas."""
        loss, correct = self.strategy.run(self._replica_step, args=(step,))
        # Sync point: the reductions gather one scalar per replica onto the host.
        sum_ = tf.distribute.ReduceOp.SUM
        return self.strategy.reduce(sum_, loss, axis=None), self.strategy.reduce(sum_, correct, axis=None)

    def _train_n_py(self, start, n):
        with self._placement_scope():
            return self._train_n_body(start, n)

    def _train_n_body(self, start, n):
        loss_sum = tf.constant(0.0)
        correct_sum = tf.constant(0.0)
        for i in tf.range(n):
            # The loop's own bookkeeping in its own name scope, apart from the step's ops.
            with tf.name_scope("loop"):
                step = start + tf.cast(i, tf.int64)
            loss, correct = self._one_step(step)
            with tf.name_scope("loop"):
                loss_sum += loss
                correct_sum += correct
        nf = tf.cast(n, tf.float32)
        return loss_sum / nf, correct_sum / (nf * self.global_batch)

    # ---- public ---------------------------------------------------------------------------
    def train_steps(self, n: int) -> dict[str, Any]:
        """Run n steps; return {loss, accuracy} (means over the n steps) as Python floats."""
        if self.coordinator is not None:
            self.calls += 1
            return self._ps_train_steps(n)
        t0 = time.perf_counter()
        with self._clean_refusal():
            loss, acc = self._train_n(tf.constant(self.step, tf.int64), tf.constant(n, tf.int32))
        return self._finish_call(loss, acc, n, t0)

    @contextlib.contextmanager
    def _clean_refusal(self):
        """The placement scope's own one-line error, not the tracer's rewrite of it."""
        try:
            yield
        except Exception:
            refusal = getattr(self._placement_scope, "refusal", None)
            if refusal is not None:
                raise refusal from None
            raise

    def _finish_call(self, loss, acc, n: int, t0: float) -> dict[str, Any]:
        loss, acc = float(loss), float(acc)  # host sync once per call
        dt = time.perf_counter() - t0
        self.step += n
        self.calls += 1
        return {"loss": loss, "accuracy": acc, "step_time": dt / n, "examples_per_sec": n * self.global_batch / dt}

    def capture_steps(self, n: int, capture_call):
        """Run n steps as the training function's FIRST call, with graph collection on; return
        (captured, metrics). The runtime records partition graphs when it instantiates a
        function, which this call does anyway: the capture costs no extra trace and no extra
        step, and the graphs are those of every step the function runs (fixed signature)."""
        if self.coordinator is not None or self.calls:
            raise RuntimeError("capture_steps must be the first call of a single-client trainer")
        t0 = time.perf_counter()
        with self._clean_refusal():
            (loss, acc), captured = capture_call(
                self._train_n, tf.constant(self.step, tf.int64), tf.constant(n, tf.int32), step=self.step)
        return captured, self._finish_call(loss, acc, n, t0)

    def capture_step(self):
        """parameter_server: run one real step from the coordinator with graph collection on
        (see _ps_capture); return (captured, metrics)."""
        if self.coordinator is None:
            raise RuntimeError("capture_step is for parameter_server; other strategies use capture_steps")
        return self._ps_capture()

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

        def ps_replica(x, y):
            return self._replica_update(x, y)

        def ps_n(iterator, n):
            loss_sum = tf.constant(0.0)
            correct_sum = tf.constant(0.0)
            for _ in tf.range(n):
                x, y = next(iterator)
                loss, correct = strategy.run(ps_replica, args=(x, y))
                loss_sum += strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
                correct_sum += strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None)
            return loss_sum / tf.cast(n, tf.float32), correct_sum / (tf.cast(n, tf.float32) * pipeline.per_replica)

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
        dt = time.perf_counter() - t0
        total = sum(k for k, _ in results)
        fetched = [(k, r.fetch()) for k, r in results]  # already computed: join() returned
        loss = sum(k * float(v[0]) for k, v in fetched) / total
        acc = sum(k * float(v[1]) for k, v in fetched) / total
        self.step += n
        # Each step consumes one per-replica batch on one worker.
        examples = n * self.pipeline.per_replica
        return {"loss": loss, "accuracy": acc, "step_time": dt / n, "examples_per_sec": examples / dt}

    def _ps_capture(self):
        # A closure scheduled by the ClusterCoordinator is instantiated by the worker's own
        # runtime, so the coordinator never sees its partition graphs. Running one real step from
        # here with its ops placed on worker 0 lets this runtime place and partition it: compute
        # shows on the worker, variables and their updates on the ps tasks.
        from pinpoint.placement.capture import capture_on_device

        self._ps_setup()

        def body(step):
            x, y = self.pipeline.replica_batch(step, 0)
            return self._replica_update(x, y)

        t0 = time.perf_counter()
        (loss, correct), captured = capture_on_device(
            body, "/job:worker/replica:0/task:0", tf.constant(self.step, tf.int64), step=self.step
        )
        dt = time.perf_counter() - t0
        self.step += 1
        return captured, {"loss": float(loss), "accuracy": float(correct) / self.pipeline.per_replica,
                          "step_time": dt, "examples_per_sec": self.pipeline.per_replica / dt}
