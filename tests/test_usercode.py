"""A user's own model, data and loss, trained for real in-process on 3 logical CPUs (host + two
emulated GPUs): import paths from train.code_dir, streamed files written by the test, pinning
by the user's layer names, resume with the same batches, mixed precision."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NO_TRACKING, make_config
from tests.test_training import rule, train, var_devices

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

USER_PACKAGE = {
    "__init__.py": "",
    "models.py": """
        import keras

        def functional(input_shape, num_classes, seed=0, width=32):
            inp = keras.Input(input_shape)
            x = keras.layers.Flatten(name="flat")(inp)
            x = keras.layers.Dense(width, activation="relu", name="hidden",
                                   kernel_initializer=keras.initializers.GlorotUniform(seed))(x)
            out = keras.layers.Dense(num_classes, name="head",
                                     kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(x)
            return keras.Model(inp, out, name="functional")

        def nested(input_shape, num_classes):
            trunk = keras.Sequential([keras.layers.Flatten(name="flat"),
                                      keras.layers.Dense(16, activation="relu", name="inner")], name="trunk")
            inp = keras.Input(input_shape)
            return keras.Model(inp, keras.layers.Dense(num_classes, name="head")(trunk(inp)), name="outer")

        class Subclassed(keras.Model):
            def __init__(self, num_classes):
                super().__init__(name="subclassed")
                self.flat = keras.layers.Flatten(name="flat")
                self.hidden = keras.layers.Dense(24, activation="relu", name="hidden")
                self.head = keras.layers.Dense(num_classes, name="head")

            def call(self, x, training=False):
                return self.head(self.hidden(self.flat(x)))

        def subclassed(num_classes):
            return Subclassed(num_classes)

        def regressor(input_shape):
            inp = keras.Input(input_shape)
            x = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
            return keras.Model(inp, keras.layers.Dense(1, name="out")(x))
    """,
    "data.py": """
        import numpy as np
        import tensorflow as tf

        def digits(images=False):
            from pinpoint.training.input.digits import load_digits

            x, y = load_digits()
            x = (x / 16.0).astype("float32")
            if images:
                x = x.reshape(-1, 8, 8, 1)
            return tf.data.Dataset.from_tensor_slices((x, y.astype("int64")))

        def sharded_digits(input_context):
            ds = digits()
            return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    """,
    "losses.py": """
        import tensorflow as tf

        def huber(y_true, y_pred):
            err = tf.cast(y_true, tf.float32) - tf.squeeze(tf.cast(y_pred, tf.float32), -1)
            small = tf.abs(err) <= 1.0
            return tf.where(small, 0.5 * tf.square(err), tf.abs(err) - 0.5)
    """,
}


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("usercode")
    pkg = root / "userpkg"
    pkg.mkdir()
    for name, text in USER_PACKAGE.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return root


@pytest.fixture(autouse=True, scope="module")
def _three_logical_cpus():
    from pinpoint.devices import setup_devices

    setup_devices(make_cfg(None))


def make_cfg(code_dir, pinning=None, **train):
    base = {
        "strategy": "none", "steps": 40, "batch_size": 32, "learning_rate": 0.1, "log_every": 10,
        "checkpoint_every": 20, "pinning": pinning or {}, "code_dir": str(code_dir) if code_dir else None,
    }
    base.update(train)
    return make_config("u", cluster={"devices_per_worker": 2, "emulate": True}, train=base, tracking=NO_TRACKING,
                       placement={"warmup_steps": 2})


def write_digits_tfrecords(folder: Path, shards: int) -> None:
    import tensorflow as tf

    from pinpoint.training.input.digits import load_digits

    images, labels = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    writers = [tf.io.TFRecordWriter(str(folder / f"digits-{i}.tfrecord")) for i in range(shards)]
    for i, (x, y) in enumerate(zip(images / 16.0, labels)):
        ex = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(float_list=tf.train.FloatList(value=x.astype(np.float32))),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)])),
        }))
        writers[i % shards].write(ex.SerializeToString())
    for w in writers:
        w.close()


TFRECORD = {"features": {"image": {"shape": [8, 8, 1], "dtype": "float32"}, "label": {"dtype": "int64"}},
            "num_classes": 10}


def test_functional_model_split_over_two_devices_by_its_own_layer_names(code_dir, tmp_path):
    cfg = make_cfg(code_dir, {"layers": {"hidden": "/GPU:0", "head": "/GPU:1"}},
                   model="userpkg.models:functional", model_args={"width": 48}, data="userpkg.data:digits",
                   num_classes=10)
    metrics, placement, log = train(cfg, tmp_path)
    assert log[-1]["loss"] < 0.9 * log[0]["loss"]
    devices = var_devices(placement)
    assert devices["hidden/kernel"] == {"/GPU:0"} and devices["head/kernel"] == {"/GPU:1"}
    assert rule(placement, "layers.hidden")["score"] == 1.0 and rule(placement, "layers.head")["score"] == 1.0
    # hidden's 48-wide activation crosses to head's device every step (32 x 48 float32), and
    # its gradient crosses back: each layer's backward pass runs on its own device. The logits
    # go to the (unpinned: /GPU:0) loss and its gradient back; head's parameter set goes to the
    # optimizer's unpinned arithmetic on /GPU:0 and its update back, as on a GPU machine.
    head = (48 * 10 + 10) * 4
    assert placement["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["bytes"] == 32 * 48 * 4 + 32 * 10 * 4 + head
    assert placement["transfers"]["matrix"]["/GPU:1"]["/GPU:0"]["bytes"] == 32 * 48 * 4 + 32 * 10 * 4 + head
    assert rule(placement, "layers.hidden")["backward"] == {"relevant": 3, "score": 1.0, "observed": {"/GPU:0": 3}}
    assert metrics["model"] == "userpkg.models:functional" and metrics["num_params"] == 64 * 48 + 48 + 48 * 10 + 10
    # The tf.data pipeline runs on the host (no input pinning) and says which ops it has.
    assert placement["input_pipeline"]["device"] == "/CPU:0"
    assert placement["input_pipeline"]["ops"]["TensorSliceDataset"] == 1


def test_a_nested_models_layer_is_pinned_by_its_name(code_dir, tmp_path):
    cfg = make_cfg(code_dir, {"layers": {"inner": "/GPU:1"}}, model="userpkg.models:nested",
                   data="userpkg.data:digits", num_classes=10, steps=20)
    _, placement, _ = train(cfg, tmp_path)
    devices = var_devices(placement)
    inner = [name for name in devices if name.endswith("inner/kernel")]
    assert len(inner) == 1 and devices[inner[0]] == {"/GPU:1"}, sorted(devices)
    assert devices["head/kernel"] == {"/GPU:0"}  # unpinned: where a GPU machine creates it
    assert rule(placement, "layers.inner")["score"] == 1.0


def test_subclassed_model_under_mirrored_gets_a_copy_per_device(code_dir, tmp_path):
    cfg = make_cfg(code_dir, strategy="mirrored", model="userpkg.models:subclassed",
                   data="userpkg.data:digits", num_classes=10)
    metrics, placement, log = train(cfg, tmp_path)
    assert log[-1]["loss"] < 0.9 * log[0]["loss"]
    assert var_devices(placement)["subclassed/hidden/kernel"] == {"/GPU:0", "/GPU:1"}
    assert metrics["num_replicas"] == 2


def test_tfrecord_files_stream_onto_the_pinned_input_device(code_dir, tmp_path):
    write_digits_tfrecords(tmp_path / "shards", 3)
    cfg = make_cfg(code_dir, {"input": "/GPU:0"}, strategy="mirrored", model="cnn",
                   data=f"tfrecord:{tmp_path}/shards/*.tfrecord", **TFRECORD)
    metrics, placement, log = train(cfg, tmp_path / "run")
    assert log[-1]["loss"] < 0.9 * log[0]["loss"]
    pipe = placement["input_pipeline"]
    assert pipe["device"] == "/GPU:0" and pipe["source"] == "tfrecord (3 files)"
    assert pipe["ops"]["TFRecordDataset"] == 1 and pipe["ops"]["ParseExampleV2"] == 1
    assert rule(placement, "input")["score"] == 1.0
    # Each replica's 16 examples of 8x8x1 float32 are copied from the input device to /GPU:1.
    assert placement["transfers"]["matrix"]["/GPU:0"]["/GPU:1"]["bytes"] >= 16 * 64 * 4
    assert metrics["data"] == "tfrecord (3 files)"


def test_csv_regression_with_float_labels_and_mse(code_dir, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((512, 4), dtype=np.float32)
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.25
    for i in range(2):
        rows = "\n".join(",".join(f"{v:.6f}" for v in (*r, t)) for r, t in zip(x[i::2], y[i::2]))
        (tmp_path / f"part-{i}.csv").write_text("a,b,c,d,target\n" + rows + "\n")
    cfg = make_cfg(code_dir, model="userpkg.models:regressor", data=f"csv:{tmp_path}/part-*.csv",
                   label_column="target", loss="mse", steps=60, learning_rate=0.05)
    metrics, _, log = train(cfg, tmp_path / "run")
    assert log[-1]["loss"] < 0.5 * log[0]["loss"]
    assert "accuracy" not in log[-1] and metrics["final_accuracy"] is None
    assert metrics["eval_loss"] < 1.0


def test_parquet_classification_with_a_user_loss(code_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    x = rng.random((400, 3))
    table = pa.table({"f0": x[:, 0], "f1": x[:, 1], "f2": x[:, 2], "label": (x.sum(1) > 1.5).astype(np.float32)})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=100)
    cfg = make_cfg(code_dir, model="userpkg.models:regressor", data=f"parquet:{tmp_path}/*.parquet",
                   loss="userpkg.losses:huber", steps=40)
    metrics, _, log = train(cfg, tmp_path / "run")
    assert log[-1]["loss"] < log[0]["loss"]
    assert metrics["loss_fn"] == "userpkg.losses:huber"


def test_image_folder_trains_a_builtin_model(code_dir, tmp_path):
    import tensorflow as tf

    from pinpoint.training.input.digits import load_digits

    images, labels = load_digits()
    for i, (img, label) in enumerate(zip(images[:300].reshape(-1, 8, 8), labels[:300])):
        folder = tmp_path / "imgs" / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        png = tf.io.encode_png(tf.constant((img * 15).astype(np.uint8)[..., None]))
        (folder / f"{i}.png").write_bytes(png.numpy())
    cfg = make_cfg(code_dir, model="mlp", data=f"images:{tmp_path}/imgs",
                   data_args={"image_size": [8, 8], "color_mode": "grayscale"}, learning_rate=0.002)
    metrics, _, log = train(cfg, tmp_path / "run")
    assert log[-1]["loss"] < log[0]["loss"]
    assert metrics["data"] == "images (300 files, 10 classes)"


def test_resumed_run_sees_the_batches_of_an_uninterrupted_one(code_dir, tmp_path):
    """Stop at step 20, resume to 40: the weights equal a straight 40-step run's, so every
    batch after the resume was the one the uninterrupted run drew (deterministic skip)."""
    import tensorflow as tf

    write_digits_tfrecords(tmp_path / "shards", 2)
    common = dict(model="userpkg.models:functional", data=f"tfrecord:{tmp_path}/shards/*.tfrecord",
                  checkpoint_every=20, shuffle_buffer=200, **TFRECORD)
    train(make_cfg(code_dir, steps=40, **common), tmp_path / "straight")
    train(make_cfg(code_dir, steps=20, **common), tmp_path / "resumed")
    metrics, _, _ = train(make_cfg(code_dir, steps=40, **common), tmp_path / "resumed")
    assert metrics["start_step"] == 20

    def weights(run):
        reader = tf.train.load_checkpoint(str(tmp_path / run / "checkpoints" / "ckpt-40"))
        # The model's weights, reached through the optimizer's references in this checkpoint.
        return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "_trainable_variables" in k}

    a, b = weights("straight"), weights("resumed")
    assert a.keys() == b.keys() and len(a) == 4
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_and_the_report_shows_the_casts(code_dir, tmp_path, policy):
    cfg = make_cfg(code_dir, model="userpkg.models:functional", data="userpkg.data:digits", num_classes=10,
                   precision=policy, learning_rate=0.1)
    metrics, placement, log = train(cfg, tmp_path)
    assert log[-1]["loss"] < 0.9 * log[0]["loss"]
    assert placement["precision"]["policy"] == policy
    # float32 variables are cast to the compute dtype on the device that computes (/GPU:0).
    assert placement["precision"]["casts_by_device"]["/GPU:0"] >= 4
    assert metrics["precision"] == policy


def test_a_split_user_model_computes_what_the_unsplit_one_does(code_dir, tmp_path):
    """Model parallelism on the user's own model: forward and backward on each layer's device,
    the same losses as without the split (same seed, same batches)."""
    common = dict(model="userpkg.models:functional", data="userpkg.data:digits", num_classes=10, steps=20)
    _, placement, split = train(make_cfg(code_dir, {"layers": {"hidden": "/GPU:0", "head": "/GPU:1"}}, **common),
                                tmp_path / "split")
    _, _, plain = train(make_cfg(code_dir, **common), tmp_path / "plain")
    assert rule(placement, "layers.head")["backward"]["observed"] == {"/GPU:1": 3}
    np.testing.assert_allclose([r["loss"] for r in split], [r["loss"] for r in plain], rtol=1e-5)
