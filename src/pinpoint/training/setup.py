"""One task's set-up, shared by Pinpoint's own loop and `train.entrypoint`: its strategy and
TaskContext, for a single process, a parameter_server chief (the coordinator) or a
multi_worker_mirrored task (TF_CONFIG)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from pinpoint.config import Config
from pinpoint.device_names import DeviceMap
from pinpoint.provision.podenv import COLLECTIVE_TIMEOUT_ENV


@dataclass
class TaskContext:
    """Who this process is in the cluster and what it trains with."""

    strategy: Any
    device_map: DeviceMap
    role: str = "chief"
    index: int = 0
    is_chief: bool = True
    multi_worker: bool = False
    coordinator: Any = None
    extra_info: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return f"{self.role}:{self.index}"


def resolver():
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def task_context(cfg: Config, dm: DeviceMap, role: str = "chief", index: int = 0, *,
                 cluster: bool = False) -> TaskContext:
    """The strategy for cfg.train.strategy on `dm`'s devices, and who this task is.

    cluster=False: one process (every single-process strategy). cluster=True: task role:index
    of the cluster TF_CONFIG describes (parameter_server's chief, or any multi_worker_mirrored task).
    role "evaluator": the side-car evaluator (no distribution).
    """
    from pinpoint.distribute.strategies import get_strategy

    name = cfg.train.strategy
    if role == "evaluator":
        import tensorflow as tf

        # The side-car evaluator is no part of the training cluster: TensorFlow's default strategy.
        return TaskContext(strategy=tf.distribute.get_strategy(), device_map=dm, role=role, index=index,
                           is_chief=False)
    if not cluster:
        strategy = get_strategy(name, dm.replica_devices, host=dm.host, emulated=dm.emulated,
                                all_reduce=cfg.train.all_reduce)
        return TaskContext(strategy=strategy, device_map=dm)
    if name == "parameter_server":
        import tensorflow as tf

        strategy = get_strategy(name, dm.replica_devices, cluster_resolver=resolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        workers = tuple(f"/job:worker/task:{i}/CPU:0" for i in range(cfg.cluster.workers))
        dm = dataclasses.replace(dm, replica_devices=workers, spec_replica_devices=workers)
        return TaskContext(strategy=strategy, device_map=dm, coordinator=coordinator)
    timeout = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    strategy = get_strategy(name, dm.replica_devices, cluster_resolver=resolver(), emulated=dm.emulated,
                            all_reduce=cfg.train.all_reduce, collective_timeout=float(timeout) if timeout else None)
    replicas = tuple(strategy.extended.worker_devices)
    dm = dataclasses.replace(dm, replica_devices=replicas, spec_replica_devices=tuple(dm.spec(d) for d in replicas))
    # The chief (or worker 0 without a chief) keeps checkpoints and writes the run's files.
    return TaskContext(strategy=strategy, device_map=dm, role=role, index=index,
                       is_chief=bool(strategy.extended.should_checkpoint), multi_worker=True,
                       extra_info={"task_device_prefix": f"/job:{role}/task:{index}"})
