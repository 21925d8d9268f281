"""A tf.keras.Model subclass built inside a device scope: `model.build` under tf.device('/GPU:1')
makes every weight there before training starts."""

import numpy as np
import tensorflow as tf


class Regressor(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.out = tf.keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


rng = np.random.RandomState(0)
x = tf.constant(rng.normal(size=(32, 8)).astype("float32"))
y = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
with tf.device("/GPU:1"):
    model = Regressor()
    model.build((None, 8))
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
