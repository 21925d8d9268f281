"""Issue 49: memory per device, predicted from the executed graphs against the allocator's own
measurement, on small models under `pinpoint trace --memory --gpus 2`.

Each run traces PROGRAM (below) for one model and one strategy: `mirrored` (Keras fit under
MirroredStrategy over 2 emulated GPUs) or `split` (a GradientTape step with the model's first
half under tf.device("/GPU:0") and the rest under "/GPU:1"; a functional model, whose layers do not
run one after another, runs whole on /GPU:1 with the loss and the optimizer on /GPU:0) or
`parameter_server` (the "Parameter server training" guide's in-process cluster with one worker and
one ps: a ClusterCoordinator schedules a GradientTape step on the worker; the worker's runtime runs
it, the ps holds the variables). The models: six small ones, and `digits_cnn`, the worked example's own
model (examples/digits_cnn) on a random batch of its input. Each program calls its step 4 times (the
parameter_server's closure 3), so `pinpoint trace` measures calls 2, 3 and 4. The record is each
device's predicted and measured peak (placement.json memory.predicted: the call kept, whose
busiest device needs the most), the least and most peak over the calls measured (memory.calls),
the predicted peaks at 2x and 4x the batch (memory.predicted.batch), the replay self-check's
mismatched events, and the process wall time. Under `mirrored`, each model and Keras's MNIST
convnet also run at FACTOR x the batch (`at_batch_arms`), to hold those predictions to a measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ("mlp", "cnn", "lstm", "transformer", "mobilenetv2", "resnet50", "digits_cnn")
STRATEGIES = ("mirrored", "split", "parameter_server")
BATCH, FACTOR = 32, 4
# At FACTOR x the batch, under mirrored: each model, and Keras's "Simple MNIST convnet" example
# (two Conv2D, two MaxPooling2D, Flatten, Dropout, Dense), whose conv kernels' scratch overlaps its
# activations differently from call to call.
AT_BATCH_MODELS = (*MODELS, "convnet")
# Which temporaries overlap is the executor's draw per process, so the truth at FACTOR x is the most
# over AT_BATCH_ROUNDS processes (MobileNetV2's most has spread 11% across them). ResNet50 runs once:
# a minute and a half a process, and its most has spread under 0.01%.
AT_BATCH_ROUNDS = 3
ONE_ROUND = ("resnet50",)

PROGRAM = '''
import socket
import sys

import keras
import numpy as np
import tensorflow as tf

MODEL, STRATEGY = sys.argv[1], sys.argv[2]
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 32
SHAPES = {"mlp": (64,), "cnn": (16, 16, 3), "lstm": (16, 8), "transformer": (16, 32), "mobilenetv2": (32, 32, 3),
          "resnet50": (32, 32, 3), "digits_cnn": (8, 8, 1), "convnet": (28, 28, 1)}


def transformer(shape):
    x = inp = keras.Input(shape)
    a = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization()(x + a)
    f = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(32)(f))
    return keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x)))


def build():
    shape = SHAPES[MODEL]
    if MODEL == "mlp":
        return keras.Sequential([keras.Input(shape), *[keras.layers.Dense(256, activation="relu") for _ in range(3)],
                                 keras.layers.Dense(10)])
    if MODEL == "cnn":
        return keras.Sequential([keras.Input(shape), keras.layers.Conv2D(16, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                                 keras.layers.Flatten(), keras.layers.Dense(10)])
    if MODEL == "lstm":
        return keras.Sequential([keras.Input(shape), keras.layers.LSTM(32), keras.layers.Dense(10)])
    if MODEL == "convnet":  # Keras's "Simple MNIST convnet" example
        return keras.Sequential([keras.Input(shape), keras.layers.Conv2D(32, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dropout(0.5),
                                 keras.layers.Dense(10)])
    if MODEL == "transformer":
        return transformer(shape)
    if MODEL == "digits_cnn":  # the worked example's own model (examples/digits_cnn, on PYTHONPATH)
        from digits_cnn.model import build_model
        return build_model(SHAPES[MODEL], 10, seed=0, filters=16)
    if MODEL == "mobilenetv2":
        return keras.applications.MobileNetV2(input_shape=shape, alpha=0.35, weights=None, classes=10)
    return keras.applications.ResNet50(input_shape=shape, weights=None, classes=10)


x = np.random.default_rng(0).normal(size=(4 * BATCH, *SHAPES[MODEL])).astype("float32")
y = np.zeros(4 * BATCH, "int32")
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TAKEN = set()  # a port the kernel frees may come back from the next bind: never one twice


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        if port not in TAKEN:
            TAKEN.add(port)
            return port


def parameter_server():
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{free_port()}"], "ps": [f"localhost:{free_port()}"]})
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)  # the guide's: workers + 1
    tf.distribute.Server(spec, job_name="worker", task_index=0, config=config, protocol="grpc")
    tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model, opt = build(), keras.optimizers.Adam()
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)))

    @tf.function
    def step(iterator):
        def replica(batch):
            xb, yb = batch
            with tf.GradientTape() as tape:
                value = per_example(yb, model(xb, training=True)) / BATCH
            opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
            return value

        return strategy.run(replica, args=(next(iterator),))

    for _ in range(3):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()


if STRATEGY == "mirrored":
    with tf.distribute.MirroredStrategy(["/GPU:0", "/GPU:1"]).scope():
        model = build()
        model.compile(optimizer="adam", loss=loss)
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=4, verbose=0)
elif STRATEGY == "parameter_server":
    parameter_server()
else:
    model, opt = build(), keras.optimizers.Adam()
    layers = model.layers if isinstance(model, keras.Sequential) else None

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            if layers is None:
                with tf.device("/GPU:1"):
                    out = model(xb, training=True)
            else:
                out = xb
                for i, layer in enumerate(layers):
                    with tf.device("/GPU:0" if i < len(layers) // 2 else "/GPU:1"):
                        out = layer(out, training=True)
            with tf.device("/GPU:0"):
                value = loss(yb, out)
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value

    for i in range(4):
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
'''


def memory_arms(models=MODELS, strategies=STRATEGIES) -> list[tuple[str, str, dict]]:
    """(name, label, spec) of each model x strategy run, and the worked example in Pinpoint's loop."""
    return [(f"{m}-{s}", f"{m}, {s}", {"kind": "memory", "model": m, "strategy": s}) for m in models
            for s in strategies] + [
        ("digits-cnn", "examples/digits_cnn (Pinpoint's loop, split over 2 GPUs)", {"kind": "memory",
                                                                                     "example": "digits_cnn"})]


def at_batch_arms(models=AT_BATCH_MODELS) -> list[tuple[str, str, dict, int | None]]:
    """(name, label, spec, max_rounds) of the mirrored runs at FACTOR x the batch (AT_BATCH_ROUNDS
    of them, ONE_ROUND's once), and of the measured batch's runs the others' arms do not already
    make (once: the prediction is made from one run, as a user's is)."""
    base = [] if set(models) <= set(MODELS) else [
        (f"{m}-mirrored", f"{m}, mirrored", {"kind": "memory", "model": m, "strategy": "mirrored"}, 1)
        for m in models if m not in MODELS]
    return base + [(f"{m}-mirrored-x{FACTOR}", f"{m}, mirrored, batch {FACTOR * BATCH}",
                    {"kind": "memory", "model": m, "strategy": "mirrored", "batch": FACTOR * BATCH},
                    1 if m in ONE_ROUND else None) for m in models]


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits_cnn"


def example(out: Path) -> dict[str, Any]:
    """`pinpoint train` of the worked example's own config with placement.memory on (60 steps, no
    MLflow, no checkpoints); its TFRecords are written first when missing (make example-data)."""
    import yaml

    if not list((EXAMPLE / "data").glob("digits-*.tfrecord")):
        subprocess.run([sys.executable, "-m", "digits_cnn.data", str(EXAMPLE / "data")], check=True,
                       env={**os.environ, "PYTHONPATH": str(EXAMPLE)}, capture_output=True)
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg["train"].update(code_dir=str(EXAMPLE), data=f"tfrecord:{EXAMPLE}/data/digits-*.tfrecord", steps=60,
                        checkpoint_every=0)
    cfg["tracking"] = {"enabled": False}
    cfg["placement"] = {"memory": True, "timing": True}
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "train", str(config), "--out", str(out / "run")],
                          capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"pinpoint train digits_cnn exited {proc.returncode}: {proc.stderr[-400:]}")
    return dict(memory_record(json.loads((out / "run" / "placement.json").read_text()).get("memory") or {}),
                process_wall_s=wall)


def measure(spec: dict) -> dict[str, Any]:
    """One traced run: each device's predicted and measured peak, the self-check, the wall time."""
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    if spec.get("example"):
        return example(out)
    prog = out / "program.py"
    prog.write_text(PROGRAM)
    argv = [sys.executable, "-m", "pinpoint.cli", "trace", "--memory", "--gpus", "2", "--no-tracking",
            "--out", str(out / "trace"), str(prog), spec["model"], spec["strategy"], str(spec.get("batch", BATCH))]
    t0 = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(argv, cwd=out, capture_output=True, text=True, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"pinpoint trace {spec['model']} {spec['strategy']} exited {proc.returncode}: "
                           f"{proc.stderr[-400:]}")
    return dict(memory_record(json.loads((out / "trace" / "placement.json").read_text()).get("memory") or {}),
                process_wall_s=wall)


def memory_record(memory: dict) -> dict[str, Any]:
    """The figures of one run's memory section: per device predicted, measured, error."""
    if not memory.get("devices"):
        return {"why_not": memory.get("why_not") or "no memory section"}
    predicted = (memory.get("predicted") or {}).get("devices") or {}
    spread = (memory.get("calls") or {}).get("devices") or {}
    batch = (memory.get("predicted") or {}).get("batch") or {}
    return {"devices": {d: {k: r[k] for k in ("predicted", "measured", "error")} | (
                {"least": spread[d]["least"], "most": spread[d]["most"]} if d in spread else {})
                        for d, r in predicted.items()},
            "mismatched": (memory.get("self_check") or {}).get("mismatched"),
            "events": (memory.get("self_check") or {}).get("events"), "call": memory.get("call"),
            "calls": (memory.get("calls") or {}).get("measured"),
            # Each device's predicted peak at 2x and 4x the measured batch (per replica).
            "batch": {"measured": batch.get("measured"), "devices": batch.get("devices") or {}}}
