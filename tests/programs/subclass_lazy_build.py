"""A tf.keras.Model subclass built lazily: its layers make their weights at the first call, which
is traced inside the training tf.function, under the device scopes of `call`."""

import numpy as np
import tensorflow as tf


class TwoTower(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.encoder = tf.keras.layers.Dense(16, activation="relu")
        self.head = tf.keras.layers.Dense(1)

    def call(self, x):
        with tf.device("/GPU:0"):
            h = self.encoder(x)
        with tf.device("/GPU:1"):
            return self.head(h)


rng = np.random.RandomState(0)
x = tf.constant(rng.normal(size=(32, 8)).astype("float32"))
y = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
model = TwoTower()
optimizer = tf.keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for _ in range(3):
    loss = train_step(x, y)
print("loss", float(loss))
