"""The differential corpus: programs generated from one small template per model family and per
program shape, each run by the differential suite (tests/differential.py) under
`pinpoint trace --gpus 2` and as plain TensorFlow, compared op by op, variable by variable and
transfer by transfer.

A combination is family x shape x strategy x dtype, named `<family>-<shape>-<strategy>-<dtype>`
(e.g. `cnn-fit_data-mirrored-f32`). Not the full cross product: COMBINATIONS lists the valid,
representative ones (Keras 3 `fit` does not run under a parameter-server strategy; a model split
by `tf.device` is a program without a strategy; `mixed_float16` where the shape trains through
Keras' own loss scaling or the guide's custom loop with a LossScaleOptimizer).

The programs are written the way TensorFlow's and Keras' guides write them, but for one line: a
mixed-precision program sets a seed, so that its loss scale takes the same branches in each of
the processes compared. Nothing is committed but this generator: `write(combo, folder)` writes
one program and returns its path.

    python -m tests.corpus                 # the combinations, one a line
    python -m tests.corpus --write DIR     # every program into DIR
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# ---- model families ------------------------------------------------------------------------
# Each family: its data (x, y for N examples), a front (the feature extractor) and a head, both
# built Keras models; the whole model is the two composed. A model split by tf.device puts the
# front on /GPU:0 and the head on /GPU:1.


@dataclass(frozen=True)
class Family:
    data: str
    front: str
    features: int  # the front's output width (the head's input)
    outputs: int
    classify: bool  # sparse categorical labels (else a regression)
    note: str


FAMILIES: dict[str, Family] = {
    "mlp": Family(
        note="a multilayer perceptron: two Dense layers",
        data="""
            x = rng.normal(size=(N, 8)).astype("float32")
            y = rng.normal(size=(N, 1)).astype("float32")
        """,
        front="""
            return tf.keras.Sequential([
                tf.keras.Input((8,)),
                tf.keras.layers.Dense(16, activation="relu"),
                tf.keras.layers.Dense(8, activation="relu"),
            ], name="front")
        """,
        features=8, outputs=1, classify=False),
    "cnn": Family(
        note="a CNN: Conv2D, BatchNormalization, ReLU, MaxPooling2D, global average pooling",
        data="""
            x = rng.normal(size=(N, 8, 8, 1)).astype("float32")
            y = rng.randint(0, 4, size=(N,)).astype("int64")
        """,
        front="""
            return tf.keras.Sequential([
                tf.keras.Input((8, 8, 1)),
                tf.keras.layers.Conv2D(4, 3, padding="same"),
                tf.keras.layers.BatchNormalization(),
                tf.keras.layers.ReLU(),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Conv2D(8, 3),
                tf.keras.layers.GlobalAveragePooling2D(),
            ], name="front")
        """,
        features=8, outputs=4, classify=True),
    "mobilenet": Family(
        note="keras.applications.MobileNetV2 (alpha 0.35, 32x32, weights=None) and a Dense head",
        data="""
            x = rng.normal(size=(N, 32, 32, 3)).astype("float32")
            y = rng.randint(0, 4, size=(N,)).astype("int64")
        """,
        front="""
            return tf.keras.applications.MobileNetV2(
                input_shape=(32, 32, 3), alpha=0.35, include_top=False, weights=None, pooling="avg")
        """,
        features=1280, outputs=4, classify=True),
    "rnn": Family(
        note="a recurrent model: GRU (sequences) then LSTM",
        data="""
            x = rng.normal(size=(N, 6, 4)).astype("float32")
            y = rng.normal(size=(N, 1)).astype("float32")
        """,
        front="""
            return tf.keras.Sequential([
                tf.keras.Input((6, 4)),
                tf.keras.layers.GRU(8, return_sequences=True),
                tf.keras.layers.LSTM(8),
            ], name="front")
        """,
        features=8, outputs=1, classify=False),
    "transformer": Family(
        note="a transformer block: Embedding, MultiHeadAttention, LayerNormalization, feed-forward",
        data="""
            x = rng.randint(0, 20, size=(N, 6)).astype("int32")
            y = rng.normal(size=(N, 1)).astype("float32")
        """,
        front="""
            tokens = tf.keras.Input((6,), dtype="int32")
            h = tf.keras.layers.Embedding(20, 8)(tokens)
            attention = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(h, h)
            h = tf.keras.layers.LayerNormalization()(h + attention)
            ffn = tf.keras.layers.Dense(16, activation="relu")(h)
            h = tf.keras.layers.LayerNormalization()(h + tf.keras.layers.Dense(8)(ffn))
            return tf.keras.Model(tokens, tf.keras.layers.GlobalAveragePooling1D()(h), name="front")
        """,
        features=8, outputs=1, classify=False),
    "embedding": Family(
        note="an embedding model: StringLookup on string tokens, Embedding, average pooling",
        data="""
            VOCABULARY = ["red", "green", "blue", "cyan", "gold"]
            x = rng.choice(VOCABULARY + ["unseen"], size=(N, 3))
            y = rng.normal(size=(N, 1)).astype("float32")
        """,
        front="""
            return tf.keras.Sequential([
                tf.keras.Input((3,), dtype="string"),
                tf.keras.layers.StringLookup(vocabulary=VOCABULARY),
                tf.keras.layers.Embedding(len(VOCABULARY) + 1, 8),
                tf.keras.layers.GlobalAveragePooling1D(),
            ], name="front")
        """,
        features=8, outputs=1, classify=False),
}

# ---- strategies ----------------------------------------------------------------------------
STRATEGY = {
    "one_device": 'strategy = tf.distribute.OneDeviceStrategy("/GPU:0")',
    "mirrored": "strategy = tf.distribute.MirroredStrategy()",
    "parameter_server": """
        TAKEN = set()  # a port the kernel frees may come back from the next bind: never one twice


        def free_port():
            while True:
                with socket.socket() as s:
                    s.bind(("localhost", 0))
                    port = s.getsockname()[1]
                if port not in TAKEN:
                    TAKEN.add(port)
                    return port


        def create_in_process_cluster(num_workers, num_ps):
            cluster_dict = {
                "worker": [f"localhost:{free_port()}" for _ in range(num_workers)],
                "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
            }
            cluster_spec = tf.train.ClusterSpec(cluster_dict)
            worker_config = tf.compat.v1.ConfigProto()
            worker_config.inter_op_parallelism_threads = num_workers + 1
            for i in range(num_workers):
                tf.distribute.Server(cluster_spec, job_name="worker", task_index=i, config=worker_config,
                                     protocol="grpc")
            for i in range(num_ps):
                tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, protocol="grpc")
            return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")


        strategy = tf.distribute.experimental.ParameterServerStrategy(create_in_process_cluster(2, 1))
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    """,
}

# ---- program shapes ------------------------------------------------------------------------
# Each: the text after the family's definitions, the strategy made; {scope} is `with
# strategy.scope():` (or nothing without a strategy), the body under it indented by {ind}.
FIT_MODEL = """
    {scope}
    {ind}model = build_model()
    {ind}model.compile(optimizer="adam", loss={loss})
"""

SHAPES: dict[str, str] = {
    # Keras fit on a batched tf.data dataset.
    "fit_data": """
        {fit_model}
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        model.fit(dataset, epochs=1, verbose=0)
    """,
    # Keras fit on NumPy arrays.
    "fit_numpy": """
        {fit_model}
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    """,
    # Keras fit with validation data (the evaluation function runs after the epoch).
    "fit_val": """
        {fit_model}
        train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        val_dataset = tf.data.Dataset.from_tensor_slices((x[:GLOBAL_BATCH], y[:GLOBAL_BATCH])).batch(GLOBAL_BATCH)
        model.fit(train_dataset, validation_data=val_dataset, epochs=1, verbose=0)
    """,
    # The "Custom training with tf.distribute.Strategy" guide: experimental_distribute_dataset,
    # strategy.run in a tf.function, the per-replica losses reduced.
    "ctl": """
        {custom_model}


        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = compute_loss(labels, predictions)
                {scale}
            gradients = tape.gradient({scaled}, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss


        @tf.function
        def distributed_train_step(dist_inputs):
            per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        dist_dataset = strategy.experimental_distribute_dataset(dataset)
        for batch in dist_dataset:
            loss = distributed_train_step(batch)
        print("loss", float(loss))
    """,
    # The distributed input guide: distribute_datasets_from_function, each replica's batch from
    # the input context, an iterator stepped a fixed number of times.
    "dfn": """
        {custom_model}


        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = compute_loss(labels, predictions)
                {scale}
            gradients = tape.gradient({scaled}, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss


        @tf.function
        def distributed_train_step(dist_inputs):
            per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


        def dataset_fn(input_context):
            batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
            dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return dataset.batch(batch_size)


        dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
        iterator = iter(dist_dataset)
        for _ in range(STEPS):
            loss = distributed_train_step(next(iterator))
        print("loss", float(loss))
    """,
    # strategy.reduce along an axis (the tf.distribute guide): each replica returns its
    # per-example losses; the step reduces them to the global batch's mean.
    "reduce": """
        {custom_model}


        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example_loss = loss_object(labels, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)
                {scale}
            gradients = tape.gradient({scaled}, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return per_example_loss


        @tf.function
        def distributed_train_step(dist_inputs):
            per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica_losses, axis=0)


        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        dist_dataset = strategy.experimental_distribute_dataset(dataset)
        for batch in dist_dataset:
            loss = distributed_train_step(batch)
        print("loss", float(loss))
    """,
    # A model split over two GPUs by hand (the model-parallel pattern): the front's weights and
    # ops on /GPU:0, the head's on /GPU:1, a GradientTape step in a tf.function.
    "split": """
        with tf.device("/GPU:0"):
            front = build_front()
        with tf.device("/GPU:1"):
            head = build_head()
        optimizer = {optimizer}
        loss_object = {loss}
        variables = front.trainable_variables + head.trainable_variables


        @tf.function
        def train_step(features, labels):
            with tf.GradientTape() as tape:
                with tf.device("/GPU:0"):
                    hidden = front(features, training=True)
                with tf.device("/GPU:1"):
                    loss = loss_object(labels, head(hidden, training=True))
                {scale}
            gradients = tape.gradient({scaled}, variables)
            optimizer.apply_gradients(zip(gradients, variables))
            return loss


        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        for features, labels in dataset:
            loss = train_step(features, labels)
        print("loss", float(loss))
    """,
    # The distributed training guide's variables (issue 66): a variable made under no strategy and
    # scratch variables made in the strategy's scope, printed and deleted before any tf.function
    # uses them, then the model trained with fit.
    "scratch": """
        before = tf.Variable(tf.zeros((GLOBAL_BATCH,)), name="before")
        print("before", float(tf.reduce_sum(before)))
        del before
        {scope}
        {ind}scratch = [tf.Variable(float(i), name=f"scratch_{{i}}") for i in range(2)]
        {ind}model = build_model()
        {ind}model.compile(optimizer="adam", loss={loss})
        print("scratch", [float(v.numpy()) for v in scratch])
        del scratch
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        model.fit(dataset, epochs=1, verbose=0)
    """,
    # The "Save and load a model using a distribution strategy" tutorial: the model trained under
    # the strategy, saved with tf.saved_model.save, loaded back in the strategy's scope and its
    # serving signature called on a batch.
    "saved": """
        {fit_model}
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        model.fit(dataset, epochs=1, verbose=0)
        with tempfile.TemporaryDirectory() as saved_model_path:
            tf.saved_model.save(model, saved_model_path)
            {scope}
            {ind}loaded = tf.saved_model.load(saved_model_path)
        inference_func = loaded.signatures["serving_default"]
        for features, _ in dataset.take(1):
            print({{k: v.shape for k, v in inference_func(features).items()}})
    """,
    # The "Parameter server training" guide's custom loop: a ClusterCoordinator schedules the
    # step on the workers, each reading its own per-worker dataset.
    "ps": """
        with strategy.scope():
            model = build_model()
            optimizer = tf.keras.optimizers.Adam(0.01)
            optimizer.build(model.trainable_variables)
            loss_object = {loss_none}


        def dataset_fn():
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH)


        @tf.function
        def worker_fn(iterator):
            def replica_fn(inputs):
                features, labels = inputs
                with tf.GradientTape() as tape:
                    predictions = model(features, training=True)
                    loss = tf.nn.compute_average_loss(loss_object(labels, predictions),
                                                      global_batch_size=GLOBAL_BATCH)
                gradients = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))
                return loss

            losses = strategy.run(replica_fn, args=(next(iterator),))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


        per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
        per_worker_iterator = iter(per_worker_dataset)
        for _ in range(STEPS):
            coordinator.schedule(worker_fn, args=(per_worker_iterator,))
        coordinator.join()
    """,
}

CUSTOM_MODEL = """
    with strategy.scope():
        model = build_model()
        optimizer = {optimizer}
        # Keras 3: the optimizer's slots made here, not at the first step (a tf.function that
        # creates them under two replicas fails in TF 2.21).
        optimizer.build(model.trainable_variables)
        loss_object = {loss_none}


    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)
"""

FIT_SHAPES = ("fit_data", "fit_numpy", "fit_val", "scratch", "saved")
STRATEGIES = ("none", "one_device", "mirrored", "parameter_server")
DTYPES = ("f32", "mixed")

# The function the author's code trains with (Keras 3's trainer: multi_step_on_iterator).
TRAINING = {"fit_data": "multi_step_on_iterator", "fit_numpy": "multi_step_on_iterator",
            "fit_val": "multi_step_on_iterator", "ctl": "distributed_train_step",
            "dfn": "distributed_train_step", "reduce": "distributed_train_step", "split": "train_step",
            "ps": "worker_fn", "scratch": "multi_step_on_iterator", "saved": "multi_step_on_iterator"}


@dataclass(frozen=True)
class Combo:
    family: str
    shape: str
    strategy: str
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.family}-{self.shape}-{self.strategy}-{self.dtype}"

    @property
    def training(self) -> str:
        return TRAINING[self.shape]

    @property
    def distributed(self) -> bool:
        """A strategy on this process's devices: its replicas read the input on their devices."""
        return self.strategy in ("one_device", "mirrored")

    @property
    def replica_devices(self) -> tuple[str, ...]:
        return {"one_device": ("/GPU:0",), "mirrored": ("/GPU:0", "/GPU:1")}.get(self.strategy, ())

    @property
    def parameter_server(self) -> bool:
        return self.strategy == "parameter_server"


def _valid(c: Combo) -> bool:
    if c.shape == "ps":
        return c.strategy == "parameter_server" and c.dtype == "f32"
    if c.strategy == "parameter_server":
        return False  # Keras 3 fit does not train under a parameter-server strategy
    if c.shape == "split":
        return c.strategy == "none"
    if c.family == "embedding" and c.shape == "fit_numpy":
        return False  # Keras' NumPy adapter takes no string array (plain Keras: "Invalid dtype: str192")
    if c.family == "embedding" and c.shape in FIT_SHAPES and c.strategy == "mirrored":
        # Plain TensorFlow fails it too (measured, TF 2.21 / Keras 3.15, logical CPUs as replicas):
        # fit's symbolic build averages a distributed string batch across the replicas
        # (strategy.reduce -> AddN on strings: "Value for attr 'T' of string is not in the list").
        return False
    if c.shape in ("ctl", "dfn", "reduce"):
        return c.strategy in ("one_device", "mirrored")
    return True


# The matrix: per family, every program shape once or twice with the strategies a program of that
# shape is written with, float32, and mixed_float16 where Keras' fit (or the custom loop's
# LossScaleOptimizer) carries it.
_PER_FAMILY = [
    ("fit_data", "none", "f32"),
    ("fit_data", "mirrored", "f32"),
    ("fit_data", "mirrored", "mixed"),
    ("fit_numpy", "one_device", "f32"),
    ("fit_numpy", "none", "mixed"),
    ("fit_val", "mirrored", "f32"),
    ("ctl", "mirrored", "f32"),
    ("dfn", "mirrored", "f32"),
    ("reduce", "one_device", "f32"),
    ("split", "none", "f32"),
    ("ps", "parameter_server", "f32"),
]
_EXTRA = [
    ("mlp", "ctl", "mirrored", "mixed"),
    ("mlp", "ctl", "one_device", "f32"),
    ("mlp", "split", "none", "mixed"),
    ("cnn", "fit_val", "one_device", "mixed"),
    ("cnn", "dfn", "one_device", "f32"),
    ("transformer", "fit_numpy", "mirrored", "f32"),
    ("rnn", "fit_val", "one_device", "mixed"),
    ("embedding", "ctl", "one_device", "f32"),
    ("transformer", "ctl", "mirrored", "mixed"),
    # More shapes under the strategies a guide pairs them with (each seconds to run).
    ("mlp", "reduce", "mirrored", "f32"),
    ("cnn", "reduce", "mirrored", "f32"),
    ("rnn", "reduce", "mirrored", "f32"),
    ("mlp", "dfn", "one_device", "f32"),
    ("rnn", "ctl", "one_device", "f32"),
    ("cnn", "ctl", "one_device", "f32"),
    ("mlp", "fit_val", "one_device", "f32"),
    ("cnn", "fit_numpy", "mirrored", "f32"),
    ("rnn", "fit_numpy", "mirrored", "f32"),
    ("mlp", "fit_numpy", "mirrored", "mixed"),
    ("mlp", "fit_data", "one_device", "mixed"),
    ("transformer", "fit_val", "one_device", "f32"),
    # Issue 66's programs: scratch variables dropped before training, a model saved and loaded back
    # (measured alone, 1 worker: 58 s, 64 s, 34 s). Its distributed-input program is the ctl and dfn
    # shapes'; its request for a missing /GPU:2 the oracle cannot answer (docs/development.md).
    ("mlp", "scratch", "mirrored", "f32"),
    ("cnn", "saved", "mirrored", "f32"),
    ("mlp", "saved", "one_device", "f32"),
]

# MobileNetV2 (about 7,700 ops a step, 580 variables) costs minutes a combination where the other
# families cost seconds, and under MirroredStrategy the oracle's tfdbg shapes run alone takes
# minutes more (docs/development.md): it runs fit without a strategy and under OneDeviceStrategy,
# and the model split by tf.device.
_HEAVY = {"mobilenet": [("fit_data", "none", "f32"), ("fit_numpy", "one_device", "f32"), ("split", "none", "f32")]}

COMBINATIONS: dict[str, Combo] = {}
for _family in FAMILIES:
    for _shape, _strategy, _dtype in _HEAVY.get(_family, _PER_FAMILY):
        _c = Combo(_family, _shape, _strategy, _dtype)
        if _valid(_c):
            COMBINATIONS[_c.id] = _c
for _family, _shape, _strategy, _dtype in _EXTRA:
    _c = Combo(_family, _shape, _strategy, _dtype)
    COMBINATIONS[_c.id] = _c
assert all(_valid(c) for c in COMBINATIONS.values()), [k for k, c in COMBINATIONS.items() if not _valid(c)]

# Differences Pinpoint still makes, each with its cause: the test of such a combination is a
# strict xfail (tests/test_corpus.py); the entry must go once Pinpoint is fixed.
_STRING_LOOKUP = ("Pinpoint leaves StringLookup's two transfers unsized (its lookup's output and the Identity after "
                  "it, /CPU:0<->/GPU:0) where TensorFlow's runtime shapes give 192 B each: the lookup is shaped as "
                  "its keys (placement/graphs/shapes.py, lookups_as_fill), but the keys come from an input element of "
                  "strings, and the runtime's element bytes count each string's contents, so no batch follows "
                  "from them")
KNOWN: dict[str, str] = {
    "embedding-fit_data-none-f32": _STRING_LOOKUP,
}


def _older_tensorflow() -> bool:
    from packaging.version import Version

    from pinpoint.versions import installed

    return Version(installed("tensorflow")) < Version("2.17")


# Combinations the oracle cannot compare on an older TensorFlow of the supported range (as
# tests/test_differential.py's parameter_server): not run there (each took ~20 s of CI to xfail).
UNCOMPARABLE: dict[str, str] = {}
if _older_tensorflow():
    for _cid, _c in COMBINATIONS.items():
        if _c.parameter_server and _cid not in KNOWN:
            UNCOMPARABLE[_cid] = ("TensorFlow 2.16's log lines carry no thread id, so the oracle cannot leave out the "
                                  "eager ops a ClusterCoordinator's threads sent to the workers or the worker_fn calls "
                                  "the workers' runtimes logged")

# The sample `make test` runs and the compat tier runs on the oldest TensorFlow: one per family, the
# shapes spread over them (every shape but ps, which the oracle cannot compare on 2.16), and
# mixed_float16 both ways a guide writes it (Keras' own loss scaling in fit, a custom loop's
# LossScaleOptimizer).
SAMPLE = ("mlp-dfn-mirrored-f32", "cnn-fit_data-mirrored-f32", "mobilenet-fit_numpy-one_device-f32",
          "rnn-split-none-f32", "transformer-fit_val-mirrored-f32", "embedding-reduce-one_device-f32",
          "cnn-fit_data-mirrored-mixed", "mlp-ctl-mirrored-mixed")
assert set(SAMPLE) <= set(COMBINATIONS) and set(KNOWN) <= set(COMBINATIONS), set(KNOWN) - set(COMBINATIONS)


def _block(text: str, indent: str = "") -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), indent)


def source(combo: Combo) -> str:
    """The program's text."""
    f = FAMILIES[combo.family]
    mixed = combo.dtype == "mixed"
    loss_class = ("tf.keras.losses.SparseCategoricalCrossentropy" if f.classify
                  else "tf.keras.losses.MeanSquaredError")
    loss = f"{loss_class}({'from_logits=True' if f.classify else ''})"
    loss_none = f"{loss_class}({'from_logits=True, ' if f.classify else ''}reduction=\"none\")"
    optimizer = "tf.keras.optimizers.Adam(0.01)"
    if mixed and combo.shape not in FIT_SHAPES:
        optimizer = f"tf.keras.mixed_precision.LossScaleOptimizer({optimizer})"
    # The mixed precision guide: the model's output in float32 (the last layer's dtype).
    out_dtype = ', dtype="float32"' if mixed else ""
    parts = [f'"""{combo.id}: {f.note}; program shape {combo.shape}, strategy {combo.strategy}, '
             f'{"mixed_float16" if mixed else "float32"} (generated by tests/corpus.py)."""', ""]
    imports = []
    if combo.parameter_server:
        imports.append("import socket")
    if combo.shape == "saved":
        imports.append("import tempfile")
    parts += [*imports, "", "import numpy as np", "import tensorflow as tf", "", ""]
    if mixed:
        # The one line a guide would not write: whether the loss scale's first steps see finite
        # gradients depends on the initial weights (1 seed in 40 overflows on the MLP split), and
        # the differential compares one process's run with another's. A seed makes them one run.
        parts += ['tf.keras.mixed_precision.set_global_policy("mixed_float16")',
                  "tf.keras.utils.set_random_seed(0)  # the same branches in every process", ""]
    parts += ["GLOBAL_BATCH = 8", "STEPS = 2", "N = GLOBAL_BATCH * STEPS", "rng = np.random.RandomState(0)",
              _block(f.data), "", ""]
    parts += ["def build_front():", _block(f.front, "    "), "", ""]
    parts += ["def build_head():",
              f"    return tf.keras.Sequential([tf.keras.Input(({f.features},)), "
              f"tf.keras.layers.Dense({f.outputs}{out_dtype})], name=\"head\")", "", ""]
    parts += ["def build_model():",
              "    front = build_front()",
              "    return tf.keras.Model(front.inputs, build_head()(front.outputs[0]))", "", ""]
    if combo.strategy != "none":
        parts += [_block(STRATEGY[combo.strategy]), ""]
    scope = "with strategy.scope():" if combo.strategy != "none" else ""
    ind = "    " if scope else ""
    scale, scaled = ("pass", "loss")
    if mixed and combo.shape not in FIT_SHAPES:
        scale, scaled = ("scaled_loss = optimizer.scale_loss(loss)", "scaled_loss")
    body = textwrap.dedent(SHAPES[combo.shape]).strip("\n")
    custom = _block(CUSTOM_MODEL).format(optimizer=optimizer, loss_none=loss_none)
    body = body.replace("{custom_model}", custom).replace("{fit_model}", _block(FIT_MODEL))
    body = body.format(scope=scope, ind=ind, loss=loss, loss_none=loss_none, optimizer=optimizer,
                       scale=scale, scaled=scaled)
    # A `pass` line left where no loss is scaled, and the empty scope line without a strategy.
    lines = [ln for ln in body.splitlines() if ln.strip() not in ("pass", "") or not ln]
    parts += ["\n".join(lines), ""]
    text = "\n".join(parts)
    compile(text, combo.id, "exec")  # a template error is the generator's, not the program's
    return text


def write(combo: Combo | str, folder: Path) -> Path:
    """The program written as `<folder>/<id with '_' for '-'>.py`; its path."""
    if isinstance(combo, str):
        combo = COMBINATIONS[combo]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{combo.id.replace('-', '_')}.py"
    path.write_text(source(combo))
    return path


# ---- running -------------------------------------------------------------------------------
def run(cid: str, work: Path):
    """One combination: its program written into `work`, run on both sides and compared."""
    from tests import differential

    combo = COMBINATIONS[cid]
    path = write(combo, work / "program")
    return differential.run_program(cid, work, path=path, training=combo.training, cluster=combo.parameter_server)


def run_matrix(ids, work: Path, workers: int = 2, echo=print):
    """The combinations `ids`, `workers` at once (threads; each runs its processes in the
    differential suite's process slots): (results by id, failures by id, seconds in all)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests import differential

    results, failed = {}, {}
    t0 = time.monotonic()

    def one(cid):
        try:
            r = run(cid, work / cid)
        except RuntimeError as e:
            failed[cid] = str(e).split(": ", 1)[1]  # with the run's log tail: CI shows it on failure
            echo(f"{cid}: FAILED TO RUN: {e}")
            return
        results[cid] = r
        echo(differential.table(r) if r.rows else f"{cid}: no differences")
        echo(f"{cid}: {dict(r.counts)} in {r.seconds:.0f}s")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, ids))
    return results, failed, time.monotonic() - t0


def missing_inputs(combo: Combo, result) -> list[str]:
    """The replica devices where the oracle's own view has no op reading the input (a
    distributed strategy's replicas each read their batch on their device)."""
    devices = {dev for (_, dev), n in result.input_ops.items() if n}
    return [d for d in combo.replica_devices if d not in devices]


# ---- the table in docs/trace.md ----------------------------------------------------------
DOC_BEGIN = "<!-- corpus table: written by `python -m tests.corpus --run --docs`; do not edit -->"
DOC_END = "<!-- end of corpus table -->"


def docs_table(results: dict, failed: dict[str, str], seconds: float, workers: int) -> str:
    lines = [DOC_BEGIN, "",
             "| combination | training function | functions | ops | variables | transfers | bytes compared "
             "| transfers TF could not size | eager op types | replicas reading input | differences | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    total: Counter = Counter()
    for cid in COMBINATIONS:
        combo = COMBINATIONS[cid]
        if cid in failed:
            lines.append(f"| `{cid}` | {combo.training} | did not run{' (known)' if cid in KNOWN else ''}: "
                         f"{_short_error(failed[cid])} | | | | | | | | | |")
            continue
        if cid not in results:
            continue
        r = results[cid]
        c = r.counts
        total.update(c)
        total["differences"] += len(r.differences)
        reading = (f"{len(combo.replica_devices) - len(missing_inputs(combo, r))}/{len(combo.replica_devices)}"
                   if combo.distributed else "-")
        diff = str(len(r.differences)) + (" (known)" if cid in KNOWN else "")
        lines.append(f"| `{cid}` | {combo.training} | {c['functions']} | {c['ops']} | {c['variables']} "
                     f"| {c['transfers']} | {c['bytes']} | {c['transfers TF could not size']} "
                     f"| {c['eager op types']} | {reading} | {diff} | {r.seconds:.0f} |")
    clean = sum(1 for r in results.values() if not r.differences)
    lines += ["", f"{len(results)} combinations compared ({len(failed)} did not run), {clean} with no difference: "
              f"{total['ops']} ops, {total['variables']} variables, {total['transfers']} transfers "
              f"({total['bytes']} bytes), {total['eager op types']} eager op types; {total['differences']} "
              f"differences; {seconds:.0f} s in all with {workers} workers.", "", DOC_END]
    return "\n".join(lines)


def _short_error(why: str) -> str:
    """A run's failure in a table cell: the exception's class and the start of its message."""
    why = why.splitlines()[0]
    why = re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Z]\w*(?:Error|Exception))", "", why)  # tensorflow...errors_impl.
    why = why.replace("|", "/")
    return why if len(why) <= 110 else why[:107].rstrip() + "..."


def write_docs(results: dict, failed: dict[str, str], seconds: float, workers: int) -> None:
    from tests.differential import DOC

    text = DOC.read_text()
    if DOC_BEGIN not in text:
        raise SystemExit(f"{DOC} has no corpus table markers")
    block = docs_table(results, failed, seconds, workers)
    DOC.write_text(text[:text.index(DOC_BEGIN)] + block + text[text.index(DOC_END) + len(DOC_END):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="DIR", help="write every program into DIR")
    ap.add_argument("--show", metavar="ID", help="print one program")
    ap.add_argument("--run", action="store_true", help="run the combinations named (default: all) and compare")
    ap.add_argument("--sample", action="store_true", help="with --run: the fast sample only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", help="keep the runs in this folder (default: a temporary one)")
    ap.add_argument("--docs", action="store_true", help="with --run: rewrite the corpus table in docs/trace.md")
    ap.add_argument("ids", nargs="*")
    args = ap.parse_args(argv)
    if args.show:
        print(source(COMBINATIONS[args.show]))
        return 0
    if not args.run:
        for cid in COMBINATIONS:
            if args.write:
                write(cid, Path(args.write))
            print(cid)
        print(f"{len(COMBINATIONS)} combinations", file=sys.stderr)
        return 0
    ids = args.ids or (list(SAMPLE) if args.sample else list(COMBINATIONS))
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        results, failed, seconds = run_matrix(ids, Path(args.work or tmp), args.workers,
                                              echo=lambda s: print(s, flush=True))
    clean = sum(1 for r in results.values() if not r.differences)
    print(f"{len(results)} combinations compared, {clean} with no difference, {len(failed)} did not run, "
          f"in {seconds:.0f}s with {args.workers} workers", flush=True)
    for cid, r in sorted(results.items()):
        print(f"{cid}: {len(r.differences)} differences, {r.seconds:.0f}s, input ops {dict(r.input_ops)}",
              flush=True)
    if args.docs:
        write_docs(results, failed, seconds, args.workers)
    return 0 if not failed and clean == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
