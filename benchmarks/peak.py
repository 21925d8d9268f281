"""Measured matmul peak of a set of devices (the MFU denominator).

One float32 matmul chain per device, all devices in one tf.function so they run at once: on
real GPUs that is the sum of the GPUs' peaks; on logical CPU devices (emulation) it is the
machine's peak, since the logical devices share the same cores.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.flops import matmul_flops


def matmul_peak(devices: Sequence[str], *, size: int | None = None, chain: int = 4, repeats: int = 5) -> dict:
    """FLOP/s of `chain` dependent size x size matmuls on each device at once (best of `repeats`)."""
    import tensorflow as tf

    if size is None:
        # Big enough to be compute-bound: GPUs need far larger matrices than CPUs to reach peak.
        size = 4096 if any("GPU" in d for d in devices) else 1024
    mats = []
    for i, d in enumerate(devices):
        with tf.device(d):
            a = tf.random.stateless_normal((size, size), seed=(i, 1), dtype=tf.float32) / size**0.5
            b = tf.random.stateless_normal((size, size), seed=(i, 2), dtype=tf.float32) / size**0.5
        mats.append((a, b))

    @tf.function
    def run():
        outs = []
        for d, (a, b) in zip(devices, mats):
            with tf.device(d):
                x = a
                for _ in range(chain):
                    x = tf.matmul(x, b)
                # A scalar result: the host fetches 4 bytes, not the matrix.
                outs.append(tf.reduce_sum(x))
        return tf.add_n(outs)

    float(run())  # trace and warm up (allocations, thread pools, autotuning)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        float(run())  # float() waits for every device: the timing covers the whole chain
        best = min(best, time.perf_counter() - t0)
    flops = len(devices) * chain * matmul_flops(size, size, size)
    return {"peak_flops": flops / best, "peak_size": size, "peak_devices": list(devices), "peak_seconds": best}
