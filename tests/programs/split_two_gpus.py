"""A model split over two GPUs by hand: the first layer on /GPU:0, the second on /GPU:1, trained
with a GradientTape step in a tf.function (the TensorFlow guide's model-parallel pattern)."""

import tensorflow as tf

with tf.device("/GPU:0"):
    w1 = tf.Variable(tf.random.normal([8, 16], seed=1), name="w1")
    b1 = tf.Variable(tf.zeros([16]), name="b1")
with tf.device("/GPU:1"):
    w2 = tf.Variable(tf.random.normal([16, 1], seed=2), name="w2")
optimizer = tf.keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        with tf.device("/GPU:0"):
            h = tf.nn.relu(tf.matmul(x, w1) + b1)
        with tf.device("/GPU:1"):
            pred = tf.matmul(h, w2)
            loss = tf.reduce_mean(tf.square(pred - y))
    grads = tape.gradient(loss, [w1, b1, w2])
    optimizer.apply_gradients(zip(grads, [w1, b1, w2]))
    return loss


x = tf.random.normal([32, 8], seed=3)
y = tf.random.normal([32, 1], seed=4)
for _ in range(3):
    loss = train_step(x, y)
print("loss", float(loss))
