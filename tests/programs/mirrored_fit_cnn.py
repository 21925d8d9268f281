"""A Keras CNN under MirroredStrategy fit (the distributed training guide's Keras path): Conv2D,
MaxPooling2D, Flatten, Dense compiled in strategy.scope(), fit on a shuffled, batched tf.data
dataset. oneDNN fuses its filter gradient with the bias gradient: every transfer must be sized."""

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.normal(size=(256, 28, 28, 1)).astype("float32")
y = rng.randint(0, 10, size=(256,)).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=0).batch(64)

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

model.fit(dataset, epochs=2, verbose=0)
