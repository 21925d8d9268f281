"""The cluster spec as a local task list: one process per task on localhost ports."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

from pinpoint.config import Config
from pinpoint.errors import ProvisionError
from pinpoint.provision.tasks import role_devices
from pinpoint.provision.tfconfig import cluster_dict, task_list, tf_config

Ports = Union[Sequence[int], Mapping[str, int], None]


@dataclass(frozen=True)
class LocalTask:
    role: str  # "chief", "worker", "ps" or "evaluator"
    index: int
    tf_config: dict
    port: int
    devices: tuple[str, ...] = ()  # spec devices this task computes on (emulation maps /GPU:i)

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free ports, found by binding port 0; all sockets stay open until every
    port is chosen so the kernel cannot hand out the same one twice."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
    return ports


def _resolve_ports(tasks: list[tuple[str, int]], ports: Ports, host: str) -> list[int]:
    if ports is None:
        return free_ports(len(tasks), host)
    if isinstance(ports, Mapping):
        missing = [f"{r}:{i}" for r, i in tasks if f"{r}:{i}" not in ports]
        if missing:
            raise ProvisionError(f"ports: no port for {', '.join(missing)}; give one per 'role:index'")
        chosen = [int(ports[f"{r}:{i}"]) for r, i in tasks]
    else:
        chosen = [int(p) for p in ports]
        if len(chosen) != len(tasks):
            raise ProvisionError(
                f"ports: got {len(chosen)} port(s) for {len(tasks)} task(s); give one per task "
                f"in the order {', '.join(f'{r}:{i}' for r, i in tasks)}"
            )
    if len(set(chosen)) != len(chosen):
        raise ProvisionError(f"ports: got {chosen}; every local task needs its own port")
    return chosen


def local_tasks(cfg: Config, host: str = "127.0.0.1", ports: Ports = None) -> list[LocalTask]:
    """One LocalTask per task of cfg.cluster (chief, workers, ps, evaluator), each with the
    TF_CONFIG its process must see. `ports`: None (free ports), a list in task order, or a
    mapping 'role:index' -> port."""
    tasks = task_list(cfg.cluster)
    chosen = _resolve_ports(tasks, ports, host)
    by_task = dict(zip(tasks, chosen))
    cluster = cluster_dict(cfg.cluster, lambda r, i: f"{host}:{by_task[(r, i)]}")
    return [LocalTask(r, i, tf_config(cluster, r, i), by_task[(r, i)], role_devices(cfg, r)) for r, i in tasks]
