"""A parameter-server coordinator (the "Parameter server training" guide's in-process cluster):
two workers and one ps in this process, ParameterServerStrategy, a ClusterCoordinator
scheduling a tf.function step on the workers."""

import socket

import numpy as np
import tensorflow as tf

TAKEN = set()  # a port the kernel frees may come back from the next bind: never one twice


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        if port not in TAKEN:
            TAKEN.add(port)
            return port


def create_in_process_cluster(num_workers, num_ps):
    cluster_dict = {
        "worker": [f"localhost:{free_port()}" for _ in range(num_workers)],
        "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
    }
    cluster_spec = tf.train.ClusterSpec(cluster_dict)
    worker_config = tf.compat.v1.ConfigProto()
    worker_config.inter_op_parallelism_threads = num_workers + 1
    for i in range(num_workers):
        tf.distribute.Server(cluster_spec, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
    for i in range(num_ps):
        tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, protocol="grpc")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")


strategy = tf.distribute.experimental.ParameterServerStrategy(create_in_process_cluster(2, 1))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

rng = np.random.RandomState(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)


with strategy.scope():
    w = tf.Variable(tf.zeros([8, 1]), name="w")
    b = tf.Variable(tf.zeros([1]), name="b")
    optimizer = tf.keras.optimizers.SGD(0.05)


@tf.function
def worker_fn(iterator):
    def replica_fn(batch):
        features, target = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - target))
        grads = tape.gradient(loss, [w, b])
        optimizer.apply_gradients(zip(grads, [w, b]))
        return loss

    return strategy.run(replica_fn, args=(next(iterator),))


per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
for _ in range(4):
    coordinator.schedule(worker_fn, args=(per_worker_iterator,))
coordinator.join()
print("w", w.numpy().ravel()[:3])
