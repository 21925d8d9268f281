"""Keras fit, evaluate and predict on NumPy arrays (the "Training and evaluation" guide)."""

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")

inputs = tf.keras.Input((8,))
hidden = tf.keras.layers.Dense(16, activation="relu")(inputs)
outputs = tf.keras.layers.Dense(1)(hidden)
model = tf.keras.Model(inputs, outputs)
# jit_compile=False: the oracle runs plain TensorFlow on a CPU-only machine, where Keras' "auto" means
# no XLA; under `pinpoint trace --gpus` Keras compiles with XLA as on a GPU machine (checked by
# tests/test_trace_gpu_answers.py), which the oracle cannot show op by op.
model.compile(optimizer="rmsprop", loss="mse", metrics=["mae"], jit_compile=False)
model.fit(x, y, batch_size=16, epochs=1, verbose=0)
print(model.evaluate(x, y, batch_size=16, verbose=0))
print(model.predict(x, batch_size=16, verbose=0).shape)
