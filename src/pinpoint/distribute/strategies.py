"""One factory for every tf.distribute strategy Pinpoint supports."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from pinpoint.config import ALL_REDUCE, STRATEGIES
from pinpoint.device_names import parse_name
from pinpoint.errors import ConfigError

_strategies_made = 0


def _collective_keys():
    """Keys of a new collective group: instance keys restart at the same number in every group,
    so two strategies in one process (a second run, a test) must not share a group key."""
    from pinpoint.tfcompat.api import collective_keys

    global _strategies_made
    _strategies_made += 1
    return collective_keys(group_key_start=1 + 1000 * _strategies_made)


def communication_options(all_reduce: str = "auto", timeout_seconds: float | None = None):
    """multi_worker_mirrored's collective options for train.all_reduce: ring -> RING, nccl -> NCCL,
    auto -> AUTO (TensorFlow picks: NCCL among GPUs, ring otherwise)."""
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    choice = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}.get(all_reduce)
    if choice is None:
        raise ConfigError(f"train.all_reduce: got {all_reduce!r}; multi_worker_mirrored "
                          "all-reduces with collectives only: use ring, nccl or auto")
    return tf.distribute.experimental.CommunicationOptions(implementation=choice, timeout_seconds=timeout_seconds)


def require_gpus(devices: Sequence[str]) -> None:
    if not devices or any("GPU" not in d.upper() for d in devices):
        raise ConfigError(
            f"train.all_reduce: got 'nccl' but the replicas are {', '.join(devices)} (no GPU here); "
            "NCCL needs real GPUs: use ring or auto"
        )


@contextlib.contextmanager
def _local_devices(devices: Sequence[str], emulated: bool):
    """Make MultiWorkerMirroredStrategy train on this task's emulated GPUs `devices`.

    TF picks a worker's local devices from its GPU count, which is 0 on a CPU-only machine, so
    it would use one replica on CPU:0. With emulation the spec's GPUs are logical CPUs 1..n:
    hand those to the strategy instead, so each task has devices_per_worker replicas.
    """
    if not emulated or len(devices) < 1:
        yield
        return
    from pinpoint.tfcompat.patches import Patches, patch_local_devices

    with Patches() as patches:
        # The logical CPU indices standing in for the GPUs.
        patch_local_devices(patches, [parse_name(d)[3] for d in devices])
        yield


def emulated_local_devices(dm):
    """_local_devices for a DeviceMap `dm` (a MultiWorkerMirroredStrategy built outside get_strategy)."""
    return _local_devices(dm.replica_devices, dm.emulated)


def mirrored_ops(all_reduce: str, devices: list[str], host: str, emulated: bool):
    """MirroredStrategy's cross-device ops for train.all_reduce (None: TensorFlow's default)."""
    import tensorflow as tf

    if all_reduce == "auto":
        if emulated and len(devices) > 1:
            # A GPU machine all-reduces mirrored gradients with NCCL: a collective among the GPUs,
            # nothing through the host. NCCL does not exist for CPUs; TensorFlow's own collective
            # all-reduce (ring) among the emulated devices is the same exchange.
            all_reduce = "ring"
        elif all("CPU" in d for d in devices):
            # NCCL does not exist for CPUs; reduce on the host, which is also where the
            # emulated replicas' memory lives (a copy per replica either way).
            all_reduce = "reduce_to_host"
        else:
            return None  # real GPUs: TensorFlow's default, NCCL
    if all_reduce == "ring":
        from pinpoint.tfcompat.api import ring_all_reduce

        return ring_all_reduce(devices, _collective_keys())
    if all_reduce == "reduce_to_host":
        return tf.distribute.ReductionToOneDevice(reduce_to_device=host)
    if all_reduce == "hierarchical_copy":
        if len(devices) > 1 and len(devices) % 2:
            # It sums two halves of len // 2 devices (DGX-1 topology): the last one would be left out.
            raise ConfigError(f"train.all_reduce: got 'hierarchical_copy' with {len(devices)} replica "
                              "devices; it reduces two equal halves and would drop the last one: use an even number "
                              "of devices, ring or reduce_to_host")
        return tf.distribute.HierarchicalCopyAllReduce()
    if all_reduce == "nccl":
        require_gpus(devices)
        return tf.distribute.NcclAllReduce()
    raise ConfigError(f"train.all_reduce: got {all_reduce!r}; use one of {', '.join(ALL_REDUCE)}")


def get_strategy(name: str, devices: Sequence[str], *, cluster_resolver=None, host: str = "/CPU:0",
                 emulated: bool = False, all_reduce: str = "auto", collective_timeout: float | None = None):
    """The strategy `name` over physical `devices` (this task's replica devices).

    none                   TensorFlow's default strategy (no distribution; placement is yours)
    one_device             everything on devices[0]
    mirrored               one replica per device, variables mirrored, all-reduce of gradients
    central_storage        one replica per device, variables on `host`, gradients reduced there
    multi_worker_mirrored  mirrored across tasks (needs `cluster_resolver`), collective all-reduce
    parameter_server       variables on ps tasks, steps scheduled on workers by a ClusterCoordinator

    `emulated`: the devices are logical CPUs standing in for GPUs (cluster.emulate); under
    multi_worker_mirrored they become this task's local devices (see emulated_local_devices).
    `all_reduce` (train.all_reduce): the gradient all-reduce of mirrored and multi_worker_mirrored.
    `collective_timeout`: seconds a multi_worker_mirrored collective may wait for a peer (None: forever).
    """
    import tensorflow as tf

    devices = list(devices)
    if name == "none":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    if name == "mirrored":
        ops = mirrored_ops(all_reduce, devices, host, emulated)
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices, parameter_device=host)
    if name == "multi_worker_mirrored":
        if cluster_resolver is None:
            raise ConfigError("train.strategy: multi_worker_mirrored needs a cluster (TF_CONFIG); run it through `pinpoint train` without --task")
        # train.all_reduce: the collectives' implementation (ring, NCCL or TensorFlow's choice).
        if all_reduce == "nccl":
            require_gpus(devices)
        options = communication_options(all_reduce, collective_timeout)
        with _local_devices(devices, emulated):
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver,
                                                             communication_options=options)
    if name == "parameter_server":
        if cluster_resolver is None:
            raise ConfigError("train.strategy: parameter_server needs a cluster (TF_CONFIG); run it through `pinpoint train` without --task")
        return tf.distribute.experimental.ParameterServerStrategy(cluster_resolver)
    raise ConfigError(f"train.strategy: got {name!r}; use one of {', '.join(STRATEGIES)}")
