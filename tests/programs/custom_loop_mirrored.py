"""Custom training with tf.distribute (the guide's "Custom training with tf.distribute.Strategy"):
MirroredStrategy(), a dataset distributed from a function, a GradientTape step under
strategy.run in a tf.function, the per-replica losses reduced."""

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16
rng = np.random.RandomState(0)
features = rng.normal(size=(64, 8)).astype("float32")
labels = rng.normal(size=(64, 1)).astype("float32")

strategy = tf.distribute.MirroredStrategy()


def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    ds = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(batch)
    return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((8,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    optimizer = tf.keras.optimizers.Adam(0.01)
    # Keras 3: the optimizer's slots made here, not at the first step (a tf.function that creates
    # them under two replicas fails in TF 2.21: "You must feed a value for placeholder tensor").
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.MeanSquaredError(reduction="none")


def compute_loss(y, predictions):
    per_example_loss = loss_object(y, predictions)
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)


def train_step(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
        loss = compute_loss(y, model(x, training=True))
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    per_replica_losses = strategy.run(train_step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(dist_dataset)
for _ in range(3):
    loss = distributed_train_step(next(iterator))
print("loss", float(loss))
