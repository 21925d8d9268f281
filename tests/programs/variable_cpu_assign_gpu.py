"""A tf.Variable made on the CPU and assigned under a GPU scope, eagerly and in a tf.function
(TensorFlow runs a variable's assign where the variable lives)."""

import tensorflow as tf

with tf.device("/CPU:0"):
    table = tf.Variable(tf.zeros([4, 4]), name="table")
    counter = tf.Variable(0.0, name="counter")

with tf.device("/GPU:0"):
    table.assign(tf.random.normal([4, 4], seed=0))
    counter.assign_add(1.0)


@tf.function
def step(x):
    with tf.device("/GPU:1"):
        y = tf.matmul(x, table)
        table.assign_add(0.1 * y)
        counter.assign_add(1.0)
    return y


for _ in range(2):
    out = step(tf.ones([4, 4]))
print(float(tf.reduce_sum(out)), float(counter))
