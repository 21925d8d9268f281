"""experimental_distribute_dataset with strategy.reduce (the distributed input guide): a batched
dataset split over the replicas of MirroredStrategy(), a step per replica, the losses summed."""

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16
rng = np.random.RandomState(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")

strategy = tf.distribute.MirroredStrategy()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    w = tf.Variable(tf.zeros([8, 1]), name="w")
    b = tf.Variable(tf.zeros([1]), name="b")
    optimizer = tf.keras.optimizers.SGD(0.05)


@tf.function
def distributed_step(batch):
    def step(inputs):
        features, target = inputs
        with tf.GradientTape() as tape:
            per_example = tf.square(tf.matmul(features, w) + b - target)
            loss = tf.reduce_sum(per_example) / GLOBAL_BATCH
        grads = tape.gradient(loss, [w, b])
        optimizer.apply_gradients(zip(grads, [w, b]))
        return loss

    per_replica = strategy.run(step, args=(batch,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


total = 0.0
for batch in dist_dataset:
    total += float(distributed_step(batch))
print("total loss", total)
