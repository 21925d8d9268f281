"""One factory for every tf.distribute strategy Pinpoint supports."""

from __future__ import annotations

from collections.abc import Sequence

from pinpoint.config import STRATEGIES
from pinpoint.errors import ConfigError

_strategies_made = 0


def _collective_keys():
    """Keys of a new collective group: instance keys restart at the same number in every group,
    so two strategies in one process (a second run, a test) must not share a group key."""
    from tensorflow.python.distribute import cross_device_utils

    global _strategies_made
    _strategies_made += 1
    return cross_device_utils.CollectiveKeys(group_key_start=1 + 1000 * _strategies_made)


def get_strategy(name: str, devices: Sequence[str], *, cluster_resolver=None, host: str = "/CPU:0",
                 emulated: bool = False):
    """The strategy `name` over physical `devices` (this task's replica devices).

    none                   TensorFlow's default strategy (no distribution; placement is yours)
    one_device             everything on devices[0]
    mirrored               one replica per device, variables mirrored, all-reduce of gradients
    central_storage        one replica per device, variables on `host`, gradients reduced there
    multi_worker_mirrored  mirrored across tasks (needs `cluster_resolver`), collective all-reduce
    parameter_server       variables on ps tasks, steps scheduled on workers by a ClusterCoordinator

    `emulated`: the devices are logical CPUs standing in for GPUs (cluster.emulate).
    """
    import tensorflow as tf

    devices = list(devices)
    if name == "none":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    if name == "mirrored":
        if emulated and len(devices) > 1:
            # A GPU machine all-reduces mirrored gradients with NCCL: a collective among the GPUs,
            # nothing through the host. NCCL does not exist for CPUs; TensorFlow's own collective
            # all-reduce (ring) among the emulated devices is the same exchange.
            from tensorflow.python.distribute import collective_util, cross_device_ops

            ring = collective_util.Options(implementation=collective_util.CommunicationImplementation.RING)
            ops = cross_device_ops.CollectiveAllReduce(devices=devices, group_size=len(devices), options=ring,
                                                       collective_keys=_collective_keys())
            return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        if all("CPU" in d for d in devices):
            # NCCL does not exist for CPUs; reduce on the host, which is also where the
            # emulated replicas' memory lives (a copy per replica either way).
            ops = tf.distribute.ReductionToOneDevice(reduce_to_device=host)
            return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        return tf.distribute.MirroredStrategy(devices)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices, parameter_device=host)
    if name == "multi_worker_mirrored":
        if cluster_resolver is None:
            raise ConfigError("config error: train.strategy: multi_worker_mirrored needs a cluster (TF_CONFIG); run it through `pinpoint train` without --task")
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver)
    if name == "parameter_server":
        if cluster_resolver is None:
            raise ConfigError("config error: train.strategy: parameter_server needs a cluster (TF_CONFIG); run it through `pinpoint train` without --task")
        return tf.distribute.experimental.ParameterServerStrategy(cluster_resolver)
    raise ConfigError(f"config error: train.strategy: got {name!r}; use one of {', '.join(STRATEGIES)}")
