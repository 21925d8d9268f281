"""An eager training loop (no tf.function) with a layer on each GPU: every op runs eagerly, and
the activations cross from /GPU:0 to /GPU:1 as eager copies."""

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = tf.constant(rng.normal(size=(16, 8)).astype("float32"))
y = tf.constant(rng.normal(size=(16, 1)).astype("float32"))

with tf.device("/GPU:0"):
    w1 = tf.Variable(tf.random.normal([8, 16], seed=1), name="w1")
with tf.device("/GPU:1"):
    w2 = tf.Variable(tf.random.normal([16, 1], seed=2), name="w2")

for _ in range(3):
    with tf.GradientTape() as tape:
        with tf.device("/GPU:0"):
            h = tf.nn.relu(tf.matmul(x, w1))
        with tf.device("/GPU:1"):
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))
    g1, g2 = tape.gradient(loss, [w1, w2])
    w1.assign_sub(0.01 * g1)
    w2.assign_sub(0.01 * g2)
print("loss", float(loss))
