"""MirroredStrategy fit with BatchNormalization, then evaluate (the distributed training guide's
Keras path: model and compile inside strategy.scope(), fit and evaluate on a tf.data dataset)."""

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((8,)),
        tf.keras.layers.Dense(16),
        tf.keras.layers.BatchNormalization(),
        tf.keras.layers.ReLU(),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

model.fit(dataset, epochs=2, verbose=0)
print(model.evaluate(dataset, verbose=0))
