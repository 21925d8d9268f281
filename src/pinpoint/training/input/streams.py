"""Streamed training data: a user's tf.data.Dataset, or files read by tf.data, never loaded whole.

One pipeline per worker, in this order (each choice is why resumes and sharding are exact):
  files (sharded by file when there are at least as many files as workers)
  -> records (sharded by record otherwise, or by the user's callable given `input_context`)
  -> seeded shuffle (reshuffled every epoch) -> repeat
  -> skip to the resumed step: records are still raw, so skipping costs reading, not parsing
  -> parse -> batch per replica (drop_remainder: static shapes) -> prefetch.
tf.data keeps element order deterministic (its default), so the element stream is a pure
function of (data, seed, worker): a resumed run sees the batches an uninterrupted one sees.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinpoint.config import Config, file_source, is_import_path
from pinpoint.errors import ConfigError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
IMAGE_ARGS = {"image_size", "color_mode", "interpolation"}
CHANNELS = {"grayscale": 1, "rgb": 3, "rgba": 4}
EVAL_BATCH = 256


@dataclass(frozen=True)
class Source:
    """Where the examples come from, before batching."""

    kind: str  # callable | tfrecord | csv | parquet | images
    description: str
    files: tuple[str, ...] = ()
    num_classes: int | None = None
    # files -> a dataset of raw records (cheap to skip); parse: record -> (features, label)
    records: Callable | None = None
    parse: Callable | None = None
    # callable sources: input_context (or None) -> the user's dataset of (features, label)
    user: Callable | None = None
    user_shards: bool = False

    def examples(self, files: tuple[str, ...] | None = None, input_context=None):
        """The unbatched (features, label) stream of `files` (default: all), unshuffled."""
        if self.user is not None:
            return self.user(input_context)
        ds = self.records(self.files if files is None else files)
        return ds.map(self.parse) if self.parse else ds


def _fail(field: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"{field}: got {value!r}; {fix}")


def open_source(cfg: Config) -> Source:
    """The configured streamed source; a glob that matches nothing fails here, in one line."""
    t = cfg.train
    if is_import_path(t.data):
        return _callable_source(cfg)
    kind, where = file_source(t.data)
    if kind == "images":
        return _image_source(cfg, where)
    if t.data_args:
        raise _fail("train.data_args", dict(t.data_args), f"{kind} data takes no arguments; remove train.data_args")
    import tensorflow as tf

    files = tuple(sorted(tf.io.gfile.glob(where)))
    if not files:
        from pinpoint.usercode import no_files

        raise no_files(t.data)
    return {"tfrecord": _tfrecord_source, "csv": _csv_source, "parquet": _parquet_source}[kind](cfg, files)


def _callable_source(cfg: Config) -> Source:
    import inspect

    import tensorflow as tf

    from pinpoint import usercode

    t = cfg.train
    fn = usercode.load_callable(cfg, "train.data", t.data)
    try:
        shards = "input_context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        shards = False

    def user(input_context):
        ds = usercode.call(fn, "train.data", t.data, t.data_args, {"input_context": input_context}, "train.data_args")
        if not isinstance(ds, tf.data.Dataset):
            raise _fail("train.data", t.data, f"the callable returned a {type(ds).__name__}, not a tf.data.Dataset; "
                        "return an unbatched tf.data.Dataset of (features, label) pairs")
        return ds

    return Source("callable", t.data, user=user, user_shards=shards)


def _split_label(cfg: Config, example: dict):
    label = example.pop(cfg.train.label_column)
    features = next(iter(example.values())) if len(example) == 1 else example
    return features, label


def _tfrecord_source(cfg: Config, files: tuple[str, ...]) -> Source:
    import tensorflow as tf

    spec = {name: tf.io.FixedLenFeature(list(f.shape), getattr(tf, f.dtype)) for name, f in cfg.train.features.items()}
    compression = "GZIP" if files[0].endswith(".gz") else None

    def records(fs):
        return tf.data.TFRecordDataset(list(fs), compression_type=compression,
                                       num_parallel_reads=min(len(fs), 8) if len(fs) > 1 else None)

    return Source("tfrecord", f"tfrecord ({len(files)} files)", files, cfg.train.num_classes, records,
                  lambda r: _split_label(cfg, tf.io.parse_single_example(r, spec)))


def _label_dtype(cfg: Config):
    import tensorflow as tf

    return tf.int64 if cfg.train.loss == "sparse_categorical_crossentropy" else tf.float32


def _columns(cfg: Config, files: tuple[str, ...], header: list[str]) -> int:
    label = cfg.train.label_column
    if label not in header:
        raise _fail("train.label_column", label, f"{files[0]} has columns {header}; name the label column")
    if len(header) < 2:
        raise _fail("train.data", cfg.train.data, f"{files[0]} has no feature column besides the label")
    return header.index(label)


def _csv_source(cfg: Config, files: tuple[str, ...]) -> Source:
    import tensorflow as tf

    with open(files[0], newline="") as f:
        header = next(csv.reader(f), [])
    li = _columns(cfg, files, header)
    defaults = [_label_dtype(cfg) if i == li else tf.float32 for i in range(len(header))]

    def records(fs):
        # Rows are parsed while read (CsvDataset), a few KiB at a time: never the whole file.
        return tf.data.experimental.CsvDataset(list(fs), defaults, header=True)

    def parse(*row):
        return tf.stack([row[i] for i in range(len(row)) if i != li]), row[li]

    return Source("csv", f"csv ({len(files)} files)", files, cfg.train.num_classes, records, parse)


def _parquet_source(cfg: Config, files: tuple[str, ...]) -> Source:
    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf

    header = [f.name for f in pq.read_schema(files[0])]
    li = _columns(cfg, files, header)
    label, feats = header[li], [c for i, c in enumerate(header) if i != li]
    ldtype = _label_dtype(cfg)

    def batches(names):
        # One record batch (<= 1024 rows) in memory at a time.
        for name in names:
            for rb in pq.ParquetFile(name.decode()).iter_batches(batch_size=1024, columns=feats + [label]):
                cols = rb.to_pydict()
                x = np.stack([np.asarray(cols[c], np.float32) for c in feats], axis=1)
                yield x, np.asarray(cols[label]).astype(ldtype.as_numpy_dtype)

    def records(fs):
        ds = tf.data.Dataset.from_generator(batches, args=(list(fs),), output_signature=(
            tf.TensorSpec([None, len(feats)], tf.float32), tf.TensorSpec([None], ldtype)))
        return ds.unbatch()

    return Source("parquet", f"parquet ({len(files)} files)", files, cfg.train.num_classes, records)


def _image_source(cfg: Config, folder: str) -> Source:
    import tensorflow as tf

    t = cfg.train
    unknown = set(t.data_args) - IMAGE_ARGS
    if unknown:
        raise _fail("train.data_args", dict(t.data_args), f"image folders take {', '.join(sorted(IMAGE_ARGS))}; "
                    f"remove {', '.join(sorted(unknown))}")
    root = Path(folder)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = tuple(str(p) for c in classes for p in sorted((root / c).iterdir())
                  if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise _fail("train.data", t.data, "no images found; use the image_dataset_from_directory layout "
                    "DIR/<class>/<image>.png|jpg (a relative path is resolved against the config file's folder)")
    size = tuple(t.data_args.get("image_size", (256, 256)))
    mode = t.data_args.get("color_mode", "rgb")
    if mode not in CHANNELS or len(size) != 2:
        raise _fail("train.data_args", dict(t.data_args), "use image_size: [height, width] and color_mode: "
                    "grayscale, rgb or rgba")
    index = {c: i for i, c in enumerate(classes)}
    interpolation = t.data_args.get("interpolation", "bilinear")

    def records(fs):
        labels = [index[Path(f).parent.name] for f in fs]
        # Paths, not pixels: sharding, shuffling and skipping happen before any decode.
        return tf.data.Dataset.from_tensor_slices((list(fs), tf.constant(labels, tf.int64)))

    def parse(path, label):
        img = tf.io.decode_image(tf.io.read_file(path), channels=CHANNELS[mode], expand_animations=False)
        img = tf.image.resize(img, size, method=interpolation)  # float32, values 0..255 like Keras
        img.set_shape((*size, CHANNELS[mode]))
        return img, label

    return Source("images", f"images ({len(files)} files, {len(classes)} classes)", files, len(classes),
                  records, parse)


def probe(cfg: Config, src: Source):
    """(features spec, label spec) of one example, read for real: a file that does not parse,
    or a dataset whose elements are not (features, label) pairs, fails here in one line."""
    import tensorflow as tf

    ds = src.examples(src.files[:1] if src.files else None, tf.distribute.InputContext())
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise _fail("train.data", cfg.train.data, f"its elements are {_describe(spec)}, not (features, label) pairs; "
                    "return ds.map(lambda ex: (features, label)) from your callable")
    if not isinstance(spec[1], tf.TensorSpec):
        raise _fail("train.data", cfg.train.data, f"its labels are {_describe(spec[1])}; a label must be one tensor")
    try:
        next(iter(ds.take(1)))
    except StopIteration:
        raise _fail("train.data", cfg.train.data, "it yields no example; check the files or the callable") from None
    except tf.errors.OpError as err:
        field = "train.features" if src.kind == "tfrecord" else "train.data"
        value = {k: v.model_dump() for k, v in cfg.train.features.items()} if src.kind == "tfrecord" else cfg.train.data
        last = (err.message or "").strip().splitlines()
        raise _fail(field, value, f"the first example does not read ({type(err).__name__}: "
                    f"{last[0] if last else ''}); make the spec match the data") from None
    return spec


def _describe(spec) -> str:
    import tensorflow as tf

    if isinstance(spec, tf.TensorSpec):
        return f"{spec.dtype.name}{list(spec.shape)}"
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in spec.items()) + "}"
    if isinstance(spec, (tuple, list)):
        return "(" + ", ".join(_describe(s) for s in spec) + ")"
    return type(spec).__name__


def shard_plan(src: Source, worker: int, num_workers: int) -> dict:
    """How this worker's share is chosen: by file (each worker reads its own files), by record
    (every worker reads everything and keeps 1/N), by the user's callable, or not at all."""
    if num_workers == 1:
        how = "none"
    elif src.user is not None:
        how = "user" if src.user_shards else "record"
    else:
        how = "file" if len(src.files) >= num_workers else "record"
    files = src.files[worker::num_workers] if how == "file" else src.files
    return {"by": how, "worker": worker, "workers": num_workers, "files": len(files)}


def worker_dataset(src: Source, cfg: Config, *, per_replica: int, local_replicas: int, worker: int = 0,
                   num_workers: int = 1, num_replicas: int = 1, start_step: int = 0):
    """This worker's batches: one per replica per step (see the module docstring)."""
    import tensorflow as tf

    t = cfg.train
    how = shard_plan(src, worker, num_workers)["by"]
    parse = None
    if src.user is not None:
        ds = src.user(tf.distribute.InputContext(num_workers, worker, num_replicas) if src.user_shards else None)
    else:
        ds = src.records(src.files[worker::num_workers] if how == "file" else src.files)
        parse = src.parse
    if how == "record":
        ds = ds.shard(num_workers, worker)
    ds = ds.shuffle(t.shuffle_buffer, seed=t.seed, reshuffle_each_iteration=True).repeat()
    if start_step:
        ds = ds.skip(start_step * local_replicas * per_replica)
    if parse is not None:
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)  # deterministic order (tf.data default)
    return ds.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def eval_batches(src: Source, limit: int):
    """The first `limit` examples, unshuffled, in batches (for the final evaluation)."""
    import tensorflow as tf

    return src.examples(None, tf.distribute.InputContext()).take(limit).batch(EVAL_BATCH)


class StreamInput:
    """A worker's iterator on the input device; each replica draws its batch inside the step.

    The iterator lives on `input_device` (its IteratorGetNext runs there and the batch is
    copied to the replica: a transfer in placement.json). Replicas of one step draw in order:
    their get_next ops share one iterator resource, which serializes them.
    """

    def __init__(self, src: Source, cfg: Config, global_batch: int, num_replicas: int, input_device: str, *,
                 worker: int = 0, num_workers: int = 1, local_replicas: int | None = None, start_step: int = 0):
        import tensorflow as tf

        from pinpoint.training.input.batch import check_divisible

        check_divisible(global_batch, num_replicas)
        self.src, self.cfg = src, cfg
        self.global_batch = global_batch
        self.per_replica = global_batch // num_replicas
        self.device = input_device
        self.num_workers = num_workers
        self.sharding = shard_plan(src, worker, num_workers)
        local = num_replicas if local_replicas is None else local_replicas
        with tf.device(input_device):
            self.ds = worker_dataset(src, cfg, per_replica=self.per_replica, local_replicas=local, worker=worker,
                                     num_workers=num_workers, num_replicas=num_replicas, start_step=start_step)
            self.iterator = iter(self.ds)

    def call_specs(self) -> tuple:
        """No extra arguments: the iterator decides the examples."""
        return ()

    def call_inputs(self, start: int, n: int) -> tuple:
        return ()

    def replica_batch(self, step, replica_id, i=None):
        """(x, y) for one replica at this step; call inside strategy.run."""
        import tensorflow as tf

        with tf.device(self.device), tf.name_scope("input"):
            return self.iterator.get_next()

    def dataset(self, start_step: int = 0, worker: int = 0):
        """parameter_server: worker `worker`'s dataset of per-replica batches. Which worker runs
        which step is decided at run time, so a resumed run does not skip (not replayable)."""
        return worker_dataset(self.src, self.cfg, per_replica=self.per_replica, local_replicas=1, worker=worker,
                              num_workers=self.num_workers)

    def describe(self) -> dict:
        """The input pipeline for placement.json: its dataset ops and the device they run on."""
        from collections import Counter

        types: Counter = Counter()
        try:
            from tensorflow.core.framework import graph_pb2

            from pinpoint.tfcompat.api import dataset_graph

            g = graph_pb2.GraphDef()
            g.ParseFromString(dataset_graph(self.ds).numpy())
            types.update(n.op for n in g.node if n.op not in ("Const", "Identity"))
            for f in g.library.function:
                types.update(n.op for n in f.node_def if n.op not in ("Const", "Identity", "NoOp"))
        except Exception:  # noqa: BLE001 - a dataset that cannot serialize (py_func): no op list
            pass
        return {"kind": "tf.data", "source": self.src.description, "device": self.device,
                "sharding": self.sharding, "ops": dict(sorted(types.items()))}
