"""The global batch's split over the replicas, one rule for every input pipeline (in-memory
arrays, training.input.data, and streamed sources, training.input.streams)."""

from __future__ import annotations

from pinpoint.errors import ConfigError


def check_divisible(global_batch: int, num_replicas: int) -> None:
    if global_batch % num_replicas:
        raise ConfigError(
            f"train.batch_size: got {global_batch}; it must be divisible by the "
            f"{num_replicas} replicas; use a multiple of {num_replicas}"
        )
