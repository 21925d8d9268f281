"""Device setup: emulated GPUs, visible devices and soft placement (the TensorFlow side).

A spec is written for the target cluster (``/GPU:0``, ``/GPU:1``). On a CPU-only machine with
``cluster.emulate: true`` each ``/GPU:i`` becomes logical CPU device ``/CPU:{i+1}``; ``/CPU:0``
stays the host, so central storage and input pipelines stay distinguishable from the "GPUs".
Everything here must run before TensorFlow initializes its devices (first op, first strategy).
Device names and the spec <-> physical mapping are pinpoint.device_names.
"""

from __future__ import annotations

import logging

from pinpoint.config import Config, pinned_devices
from pinpoint.device_names import HOST, DeviceMap, emulation_aliases, local_name, parse_device
from pinpoint.errors import PlacementError

log = logging.getLogger("pinpoint.devices")


def configure_logical_cpus(tf, count: int) -> int:
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        # Already initialized (e.g. a second run in the same process): fine if it has enough.
        have = len(tf.config.list_logical_devices("CPU"))
        if have < count:
            raise PlacementError(
                f"cluster.devices_per_worker: this process already initialized {have} logical CPU "
                f"device(s) but the spec needs {count}; run it in a fresh process"
            ) from None
        return have
    return count


def _set_visible(tf, devices) -> None:
    try:
        tf.config.set_visible_devices(devices)
    except RuntimeError:
        # The runtime is already initialized (a second run in one process): fine if unchanged.
        if {d.name for d in tf.config.get_visible_devices()} != {d.name for d in devices}:
            raise PlacementError(
                "train.pinning.visible_devices: TensorFlow was already initialized in this process "
                "with other visible devices; run training in a fresh process"
            ) from None


def device_scope(device: str | None):
    """tf.device(device), or no scope for None."""
    import contextlib

    import tensorflow as tf

    return tf.device(device) if device else contextlib.nullcontext()


def setup_devices(cfg: Config) -> DeviceMap:
    """Configure devices for this process and return the spec <-> physical mapping.

    Must be called before TensorFlow creates any tensor. Applies, in order:
    visible_devices (real ones via tf.config.set_visible_devices), GPU emulation on logical CPUs,
    soft placement, and a check that every pinned device exists (or is allowed to fall back).
    """
    import tensorflow as tf

    c, pin = cfg.cluster, cfg.train.pinning
    n = c.devices_per_worker
    real_gpus = tf.config.list_physical_devices("GPU")

    # --- visible devices: which spec devices this process may see (renumbered like TF does).
    visible: dict[str, str] = {}
    spec_gpus = list(range(n)) if c.device_type == "GPU" else []
    if pin.visible_devices is not None:
        wanted = [parse_device(d) for d in pin.visible_devices]
        gpu_idx = sorted({i for _, _, t, i in wanted if t == "GPU"})
        keep = [g for g in real_gpus if int(g.name.rsplit(":", 1)[1]) in gpu_idx]
        # CPUs must stay visible (TF needs a host). On a CPU-only machine this hides nothing
        # physical; the emulated GPUs are limited to the visible ones below.
        _set_visible(tf, tf.config.list_physical_devices("CPU") + keep)
        visible = {f"/GPU:{old}": f"/GPU:{new}" for new, old in enumerate(gpu_idx)}
        if c.device_type == "GPU":
            spec_gpus = list(range(len(gpu_idx)))
        real_gpus = tf.config.list_physical_devices("GPU") if real_gpus else []

    cpu_count = 1
    aliases: dict[str, str] = {}
    fallbacks: dict[str, str] = {}
    emulated = False
    if c.device_type == "GPU" and n > 0:
        if real_gpus:
            replica = [f"/GPU:{i}" for i in spec_gpus]
        elif c.emulate:
            emulated = True
            cpu_count = configure_logical_cpus(tf, len(spec_gpus) + 1)
            aliases = emulation_aliases(spec_gpus)
            replica = [aliases[f"/GPU:{i}"] for i in spec_gpus]
        elif pin.soft_placement:
            fallbacks = {f"/GPU:{i}": HOST for i in spec_gpus}
            log.warning(
                "no GPU on this machine and cluster.emulate is false: soft placement runs %s on %s",
                ", ".join(fallbacks), HOST,
            )
            replica = [HOST]
        else:
            raise PlacementError(
                f"cluster.device_type: got GPU, but this machine has no GPU (devices: {HOST}); "
                "set cluster.emulate: true, enable train.pinning.soft_placement, or use device_type: CPU"
            )
        spec_replica = [f"/GPU:{i}" for i in spec_gpus]
    else:
        count = max(n, 1)
        if count > 1:
            cpu_count = configure_logical_cpus(tf, count)
        replica = [f"/CPU:{i}" for i in range(count)]
        spec_replica = list(replica)

    tf.config.set_soft_device_placement(pin.soft_placement)
    # Listed from the configuration, not tf.config.list_logical_devices(): that would initialize
    # the runtime, after which a multi-worker strategy can no longer configure collectives.
    local = tuple([f"/CPU:{i}" for i in range(cpu_count)] + [f"/GPU:{i}" for i in range(len(real_gpus))])
    dm = DeviceMap(
        aliases=aliases,
        replica_devices=tuple(replica),
        spec_replica_devices=tuple(spec_replica),
        emulated=emulated,
        fallbacks=fallbacks,
        visible=visible,
        local_devices=local,
    )
    check_pinned_devices(cfg, dm)
    return dm


def check_pinned_devices(cfg: Config, dm: DeviceMap) -> None:
    """Every pinned device must exist here; soft placement on: warn (TF falls back), off: fail."""
    pin = cfg.train.pinning
    for fieldname, device in pinned_devices(pin):
        if fieldname.endswith("visible_devices"):
            continue
        job, _, _, _ = parse_device(device)
        if job is not None and job != "localhost":
            continue  # a remote task's device: checked by that task
        physical = local_name(dm.physical(device))
        if physical in dm.local_devices:
            continue
        devices = ", ".join(dm.spec(d) if dm.spec(d) != d else d for d in dm.local_devices)
        if pin.soft_placement:
            log.warning(
                "%s: %s does not exist on this machine (devices: %s); soft placement will fall back",
                fieldname, device, devices,
            )
        else:
            raise PlacementError(
                f"{fieldname}: got {device}, which does not exist on this machine (devices: {devices}); "
                "enable train.pinning.soft_placement or pick an existing device"
            )
