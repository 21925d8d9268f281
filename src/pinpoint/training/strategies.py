"""One factory for every tf.distribute strategy Pinpoint supports."""

from __future__ import annotations

from collections.abc import Sequence

from pinpoint.config import STRATEGIES
from pinpoint.errors import ConfigError


def get_strategy(name: str, devices: Sequence[str], *, cluster_resolver=None, host: str = "/CPU:0"):
    """The strategy `name` over physical `devices` (this task's replica devices).

    none                   TensorFlow's default strategy (no distribution; placement is yours)
    one_device             everything on devices[0]
    mirrored               one replica per device, variables mirrored, all-reduce of gradients
    central_storage        one replica per device, variables on `host`, gradients reduced there
    multi_worker_mirrored  mirrored across tasks (needs `cluster_resolver`), collective all-reduce
    parameter_server       variables on ps tasks, steps scheduled on workers by a ClusterCoordinator
    """
    import tensorflow as tf

    devices = list(devices)
    if name == "none":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    if name == "mirrored":
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
