"""The allocator's peak, reset before a profiled call and read inside it (`get_memory_info`)."""

from __future__ import annotations

from pinpoint.placement.profile.allocator import PEAK_READ


def reset_memory_peak(real_gpus: bool = True) -> None:
    """Start the allocator's peak over again (every logical CPU shares it: the host's is the process's),
    and each real GPU's (`real_gpus`: False under emulation, where a 'GPU' answers for its logical CPU)."""
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU")) if real_gpus else 0
    for device in ["CPU:0", *(f"GPU:{i}" for i in range(gpus))]:
        try:
            tf.config.experimental.reset_memory_stats(device)
        except (ValueError, RuntimeError):
            pass  # no allocator stats (another allocator): memory_traced says so


def gpu_peaks() -> dict[str, int]:
    """A GPU machine's own figure: each GPU's allocator peak since reset_memory_peak (one allocator
    per GPU there, so get_memory_info is per device); {} on a machine without GPUs."""
    import tensorflow as tf

    out = {}
    for i in range(len(tf.config.list_physical_devices("GPU"))):
        try:
            out[f"/GPU:{i}"] = int(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"])
        except (ValueError, RuntimeError):
            continue
    return out


def read_peak() -> int | None:
    """get_memory_info's peak since reset_memory_peak, read inside a PEAK_READ trace event (so the
    replay can be held to the events before it); None when the host allocator keeps no statistics."""
    import tensorflow as tf

    with tf.profiler.experimental.Trace(PEAK_READ):
        try:
            return int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        except (ValueError, RuntimeError):
            return None
