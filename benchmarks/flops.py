"""Model FLOPs, MFU and the ring all-reduce lower bound (pure arithmetic, no TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def dense_flops_per_step(layers: Sequence[tuple[int, int]], batch: int, *, bias: bool = True) -> int:
    """Exact FLOPs of one training step of a stack of Dense layers, given (fan_in, fan_out) pairs.

    Per layer and example: forward matmul 2*in*out; backward 2*in*out for the weight gradient and
    2*in*out for the input gradient, except the first layer, whose input needs no gradient (the
    tape never computes it). Bias: `out` adds forward and `out` adds for its gradient (the
    batch reduction). Activations and the optimizer update are elementwise and left out, as in
    the usual MFU convention (matmul work only would give 6*params*batch for a deep stack).
    """
    if batch < 1:
        raise ValueError(f"batch: got {batch}; need at least 1")
    total = 0
    for i, (fan_in, fan_out) in enumerate(layers):
        mm = 2 * fan_in * fan_out
        total += mm * (2 if i == 0 else 3) * batch
        if bias:
            total += 2 * fan_out * batch
    return total


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of one (m x k) @ (k x n) matmul: one multiply and one add per term."""
    return 2 * m * k * n


def mfu(flops_per_step: float, step_time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the measured matmul peak."""
    if step_time_s <= 0 or peak_flops_per_s <= 0:
        raise ValueError("mfu: step time and peak must be positive")
    return flops_per_step / step_time_s / peak_flops_per_s


def ring_allreduce_min_bytes(num_devices: int, param_bytes: int) -> float:
    """Bytes each device must send per all-reduce of `param_bytes` with a ring: 2(N-1)/N * P.

    Reduce-scatter then all-gather, each moving (N-1) chunks of P/N; it is the bandwidth lower
    bound for any all-reduce algorithm. Zero for a single device (nothing to exchange)."""
    if num_devices < 1:
        raise ValueError(f"num_devices: got {num_devices}; need at least 1")
    return 2.0 * (num_devices - 1) / num_devices * param_bytes


def param_bytes(shapes: Iterable[Sequence[int]], bytes_per_element: int = 4) -> int:
    """Bytes of a list of variable shapes (float32 by default)."""
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total * bytes_per_element
