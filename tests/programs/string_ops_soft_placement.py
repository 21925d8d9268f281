"""String ops under tf.device('/GPU:0') with soft placement on (GPUs have no string kernels:
TensorFlow moves them), parsing text into the features a variable is trained on."""

import tensorflow as tf

tf.config.set_soft_device_placement(True)
lines = tf.constant(["1 2 3 4", "5 6 7 8", "1 3 5 7", "2 4 6 8"])
w = tf.Variable(tf.ones([4, 1]), name="w")


@tf.function
def train_step(text):
    with tf.device("/GPU:0"):
        tokens = tf.strings.split(text).to_tensor()
        numbers = tf.strings.to_number(tokens, out_type=tf.float32)
        buckets = tf.strings.to_hash_bucket_fast(text, 100)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(numbers, w)))
        w.assign_sub(0.001 * tape.gradient(loss, w))
    return loss, buckets


for _ in range(2):
    loss, _ = train_step(lines)
print("loss", float(loss))
