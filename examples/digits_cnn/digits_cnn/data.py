"""The data: the digits that ship with Pinpoint as TFRecord files, and a tf.data reader for them.

    python -m digits_cnn.data OUT_DIR [--shards 4]

writes OUT_DIR/digits-0000-of-0004.tfrecord ... (feature `image`: 64 floats in [0, 1], an 8x8x1
image; `label`: int64). config.yaml reads them with `data: "tfrecord:data/digits-*.tfrecord"`;
`dataset()` is the same data as a callable (`data: digits_cnn.data:dataset`).
"""

import argparse
import os
from pathlib import Path

import tensorflow as tf

EXAMPLE_DIR = Path(__file__).resolve().parents[1]
FEATURES = {
    "image": tf.io.FixedLenFeature([8, 8, 1], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def shard_paths(out_dir, shards=4):
    return [Path(out_dir) / f"digits-{i:04d}-of-{shards:04d}.tfrecord" for i in range(shards)]


def write_tfrecords(out_dir, shards=4):
    """Write the 1,797 digits round-robin into `shards` files; return their paths.

    Idempotent: files that already exist are kept (the data is fixed, so they are the same).
    Each file is written under a temporary name and renamed, so an interrupted run never leaves
    a half-written shard that a later run would take as done.
    """
    from pinpoint.training.input.digits import load_digits  # ships with Pinpoint: no download

    paths = shard_paths(out_dir, shards)
    # Shards of another count would be read too by the glob `digits-*.tfrecord`: drop them.
    for stale in set(Path(out_dir).glob("digits-*-of-*.tfrecord")) - set(paths):
        stale.unlink()
    if all(p.exists() for p in paths):
        return paths
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    pixels, labels = load_digits()
    images = pixels.astype("float32") / 16.0  # pixels are 0..16
    for i, path in enumerate(paths):
        if path.exists():
            continue
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # hidden: the glob does not match it
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for image, label in zip(images[i::shards], labels[i::shards]):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(float_list=tf.train.FloatList(value=image)),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                        }
                    )
                )
                writer.write(example.SerializeToString(deterministic=True))  # same bytes every run
        tmp.replace(path)  # atomic on one file system
    return paths


def dataset(pattern, input_context=None):
    """An unbatched dataset of (image [8, 8, 1] float32, label int64) from the files `pattern` names.

    A relative `pattern` is taken against the example folder (the one holding config.yaml), since
    Pinpoint resolves `train.data` paths but passes `train.data_args` as they are. Pinpoint passes `input_context` because the signature names it; then this function shards
    (by file) and Pinpoint does not. Files are listed in sorted order, unshuffled, so a resumed
    run can skip to the same examples.
    """
    files = tf.data.Dataset.list_files(str(EXAMPLE_DIR / pattern), shuffle=False)
    if input_context is not None and input_context.num_input_pipelines > 1:
        files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    records = tf.data.TFRecordDataset(files)

    def parse(record):
        ex = tf.io.parse_single_example(record, FEATURES)
        return ex["image"], ex["label"]

    return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m digits_cnn.data", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder for the .tfrecord files (created if missing)")
    parser.add_argument("--shards", type=int, default=4, help="number of files (default 4)")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    existed = {p for p in shard_paths(args.out_dir, args.shards) if p.exists()}
    paths = write_tfrecords(args.out_dir, args.shards)
    for p in paths:
        count = sum(1 for _ in tf.data.TFRecordDataset(str(p)))
        print(f"{'kept' if p in existed else 'wrote'} {p} ({count} examples)")


if __name__ == "__main__":
    main()
