"""Training data. In memory (digits, synthetic, one .npz/.csv file): batches are a pure function
of (seed, step). Streamed (a user's tf.data callable or files): see training.input.streams.

The example order is a seeded permutation of each epoch, a pure function of (seed, epoch), so
the batch at step k is the same whether the run started at 0 or resumed at k: an interrupted and
resumed run sees exactly the batches an uninterrupted one sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pinpoint.config import Config
from pinpoint.errors import ConfigError
from pinpoint.training.input.batch import check_divisible

NUM_SYNTHETIC_CLASSES = 10
SYNTHETIC_FEATURES = 64


@dataclass(frozen=True)
class Arrays:
    x: np.ndarray  # float32 (N, features)
    y: np.ndarray  # int32 (N,)
    num_classes: int
    source: str

    @property
    def features(self) -> int:
        return int(self.x.shape[1])


@dataclass(frozen=True)
class Data:
    """What a model and a pipeline need to know of the configured data."""

    input_shape: Any  # one example's features without the batch dimension (a dict for dict features)
    num_classes: int | None
    label_spec: Any  # tf.TensorSpec of one label
    source: str
    arrays: Arrays | None = None  # in memory
    stream: Any = None  # training.input.streams.Source

    def pipeline(self, cfg: Config, global_batch: int, num_replicas: int, input_device: str, *,
                 worker: int = 0, num_workers: int = 1, local_replicas: int | None = None, start_step: int = 0):
        if self.stream is None:
            return InputPipeline(self.arrays, global_batch, num_replicas, input_device, cfg.train.seed)
        from pinpoint.training.input.streams import StreamInput

        return StreamInput(self.stream, cfg, global_batch, num_replicas, input_device, worker=worker,
                           num_workers=num_workers, local_replicas=local_replicas, start_step=start_step)

    def eval_batches(self, limit: int):
        """(x, y) batches of the first `limit` examples, unshuffled (the final evaluation)."""
        if self.stream is None:
            return [(self.arrays.x[:limit], self.arrays.y[:limit])]
        from pinpoint.training.input.streams import eval_batches

        return eval_batches(self.stream, limit)


def load_data(cfg: Config) -> Data:
    """The configured data, checked against the loss: one line on anything unusable."""
    import tensorflow as tf

    from pinpoint.training.objectives import check_labels

    t = cfg.train
    if not t.streamed:
        arrays = load_arrays(cfg)
        data = Data((arrays.features,), t.num_classes or arrays.num_classes, tf.TensorSpec([], tf.int32),
                    arrays.source, arrays=arrays)
    else:
        from pinpoint.training.input.streams import open_source, probe

        src = open_source(cfg)
        features, label = probe(cfg, src)
        shape = ({k: tuple(v.shape) for k, v in features.items()} if isinstance(features, dict)
                 else tuple(features.shape))
        num_classes = t.num_classes or src.num_classes
        if num_classes is None and t.loss == "categorical_crossentropy" and label.shape.rank == 1:
            num_classes = label.shape[0]
        data = Data(shape, num_classes, label, src.description, stream=src)
    check_labels(cfg, data.label_spec)
    return data


def load_arrays(cfg: Config) -> Arrays:
    """Load the configured data set as float32 features (scaled to ~[0, 1]) and int labels."""
    src = cfg.train.data
    if src == "digits":
        from pinpoint.training.input.digits import load_digits

        x, y = load_digits()
        return Arrays(x.astype(np.float32) / 16.0, y.astype(np.int32), 10, "digits")
    if src == "synthetic":
        return synthetic(cfg.train.synthetic_examples, seed=1234)
    path = Path(src)
    if not path.is_file():
        raise ConfigError(f"train.data: got '{src}', which does not exist; give an existing .npz or .csv file")
    if src.endswith(".npz"):
        with np.load(path) as f:
            missing = [k for k in ("x", "y") if k not in f.files]
            if missing:
                raise ConfigError(
                    f"train.data: got '{src}' with arrays {sorted(f.files)}, not 'x' and 'y'; "
                    "save features as x and labels as y (np.savez(path, x=..., y=...))"
                )
            x, y = f["x"], f["y"]
    else:
        x, y = _read_csv(path, cfg.train.label_column)
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    y = np.asarray(y).astype(np.int64).reshape(-1)
    if len(x) != len(y) or len(x) == 0:
        raise ConfigError(f"train.data: '{src}' has {len(x)} rows of features and {len(y)} labels; they must match and be non-empty")
    if y.min() < 0:
        raise ConfigError(f"train.data: '{src}' has negative labels; labels must be 0..K-1")
    return Arrays(x, y.astype(np.int32), int(y.max()) + 1, str(path))


def _read_csv(path: Path, label_column: str):
    import csv

    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ConfigError(f"train.data: '{path}' is empty; give a CSV with a header row")
    header, body = rows[0], rows[1:]
    if label_column not in header:
        raise ConfigError(
            f"train.label_column: got {label_column!r}, which is not among {path}'s columns {header}; set label_column"
        )
    li = header.index(label_column)
    try:
        data = np.array([[float(v) for v in r] for r in body if r], dtype=np.float64)
    except ValueError as err:
        raise ConfigError(f"train.data: '{path}' has a non-numeric value ({err}); use numbers only") from None
    return np.delete(data, li, axis=1), data[:, li]


def synthetic(n: int, seed: int = 1234, features: int = SYNTHETIC_FEATURES) -> Arrays:
    """A learnable synthetic problem: labels from a fixed random linear teacher."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, features), dtype=np.float32)
    w = rng.normal(size=(features, NUM_SYNTHETIC_CLASSES)).astype(np.float32)
    y = np.argmax((x - 0.5) @ w, axis=1).astype(np.int32)
    return Arrays(x, y, NUM_SYNTHETIC_CLASSES, f"synthetic({n})")


def batch_indices(offset, size: int, num_examples: int, seed: int):
    """Example indices for positions [offset, offset+size) of a seeded example stream, in the
    graph (parameter_server's per-worker datasets, where no host code runs per step).

    Each epoch is a stateless permutation keyed by (seed, epoch): no state to checkpoint.
    `offset` is an int64 tensor (traced once, no retracing per step).
    """
    import tensorflow as tf

    n = tf.constant(num_examples, tf.int64)
    pos = tf.cast(offset, tf.int64) + tf.range(size, dtype=tf.int64)
    epoch = pos // n
    within = pos % n
    seeds = tf.stack(
        [tf.fill([size], tf.constant(seed, tf.int64)), epoch, tf.zeros([size], tf.int64)], axis=1
    )
    # The raw op: the public wrapper mis-pads per-element [n, 2] seeds (pads the n axis).
    return tf.raw_ops.RandomIndexShuffle(index=within, seed=seeds, max_index=n - 1, rounds=4)


class EpochOrder:
    """The example order of the in-memory input: epoch e is a permutation of the examples drawn
    from a generator seeded with (seed, e), so any step's batch is known without replaying the
    steps before it. Computed on the host, one permutation per epoch (O(examples) once an epoch,
    O(batch) a step), like tf.data shuffles outside the step. Chosen in the step instead, with
    TensorFlow's per-element RandomIndexShuffle (batch_indices), it took 24 µs of a 0.4 ms step
    at batch 64 in a profile (the loop anatomy bench: the step 0.98x as fast), and having no GPU
    kernel, it sent a GPU-pinned input's indices through the host every step."""

    def __init__(self, num_examples: int, seed: int):
        self.n, self.seed = num_examples, seed
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) >= 2:  # a call spans at most a few epochs; keep the newest
                del self._perms[min(self._perms)]
            perm = self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """Example indices of stream positions [start, start + count) (int64)."""
        out = np.empty(count, np.int64)
        done = 0
        while done < count:  # one contiguous run of positions per epoch the range touches
            epoch, within = divmod(start + done, self.n)
            take = min(count - done, self.n - within)
            out[done:done + take] = self.permutation(epoch)[within:within + take]
            done += take
        return out


class InputPipeline:
    """Holds the data on the input device and gathers a replica's slice of a global batch.

    The gather runs under tf.device(input_device) inside the step function, so the input
    placement is part of the step's partition graphs and the batch is copied to the replica.
    Which examples a call's steps take is decided on the host (`call_inputs`: an [n, global
    batch] index tensor, one row a step), like a tf.data pipeline's shuffle runs outside the step.
    """

    def __init__(self, arrays: Arrays, global_batch: int, num_replicas: int, input_device: str, seed: int):
        import tensorflow as tf

        check_divisible(global_batch, num_replicas)
        self.arrays = arrays
        self.global_batch = global_batch
        self.per_replica = global_batch // num_replicas
        self.device = input_device
        self.seed = seed
        self.order = EpochOrder(len(arrays.x), seed)
        with tf.device(input_device):
            # Plain (non-distributed) tensors, created outside any strategy scope.
            self.x = tf.constant(arrays.x)
            self.y = tf.constant(arrays.y)

    def call_specs(self) -> tuple:
        """The training function's extra arguments: the call's example indices, a row a step."""
        import tensorflow as tf

        return (tf.TensorSpec([None, self.global_batch], tf.int64, name="indices"),)

    def call_inputs(self, start: int, n: int) -> tuple:
        """The extra arguments of a call of n steps from step `start` (see call_specs)."""
        import tensorflow as tf

        idx = self.order.indices(start * self.global_batch, n * self.global_batch).reshape(n, self.global_batch)
        with tf.device(self.device):  # made where the gather reads it: no copy into the step
            return (tf.constant(idx),)

    def replica_batch(self, step, replica_id, i=None, indices=None):
        """(x, y) for replica `replica_id` at `step`, the i-th step of a call given `indices`
        (call_inputs); call inside strategy.run. Without indices (a parameter_server step), the
        examples are chosen in the graph (batch_indices)."""
        import tensorflow as tf

        with tf.device(self.device), tf.name_scope("input"):
            if indices is None:
                offset = (tf.cast(step, tf.int64) * self.global_batch
                          + tf.cast(replica_id, tf.int64) * self.per_replica)
                idx = batch_indices(offset, self.per_replica, len(self.arrays.x), self.seed)
            else:
                # Rows of replicas, then this replica's: a static [per_replica] shape, so the
                # batch's copy to the replica has a size in the graph (a dynamic slice would not).
                rows = tf.reshape(indices[i], [self.global_batch // self.per_replica, self.per_replica])
                idx = rows[replica_id]
            return tf.gather(self.x, idx), tf.gather(self.y, idx)

    def dataset(self, start_step: int = 0, worker: int = 0):
        """A tf.data pipeline of global batches (for parameter_server's per-worker datasets)."""
        import tensorflow as tf

        x, y, b, n, seed = self.arrays.x, self.arrays.y, self.global_batch, len(self.arrays.x), self.seed
        with tf.device(self.device):
            xs, ys = tf.constant(x), tf.constant(y)

            def take(step):
                idx = batch_indices(step * b, b, n, seed + 7919 * worker)
                return tf.gather(xs, idx), tf.gather(ys, idx)

            ds = tf.data.Dataset.range(start_step, 2**62).map(take, num_parallel_calls=tf.data.AUTOTUNE)
            return ds.prefetch(tf.data.AUTOTUNE)
