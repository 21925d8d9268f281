"""An input pipeline pinned to the CPU feeding model.fit (the tf.data performance guide's advice:
the pipeline on the host, the model on the GPU)."""

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")

with tf.device("/CPU:0"):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=0).batch(16).prefetch(2)

model = tf.keras.Sequential([
    tf.keras.Input((8,)),
    tf.keras.layers.Dense(16, activation="relu"),
    tf.keras.layers.Dense(1),
])
# jit_compile=False: the oracle runs plain TensorFlow on a CPU-only machine, where Keras' "auto" means
# no XLA; under `pinpoint trace --gpus` Keras compiles with XLA as on a GPU machine (checked by
# tests/test_trace_gpu_answers.py), which the oracle cannot show op by op.
model.compile(optimizer="sgd", loss="mse", jit_compile=False)
model.fit(dataset, epochs=2, verbose=0)
