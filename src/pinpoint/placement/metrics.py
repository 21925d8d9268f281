"""The placement metrics MLflow gets: the one place they are chosen, for the training run
(pinpoint.tracking.hook) and `pinpoint report` alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pinpoint.placement.conformance import split_fallbacks
from pinpoint.placement.naming import metric_key
from pinpoint.placement.variables import user_variables


def headline_metrics(placement: Mapping[str, Any]) -> dict[str, float]:
    """MLflow-safe headline numbers: placement.ops.GPU_0, placement.transfers_per_step, ..."""
    out: dict[str, float] = {}
    for dev, n in (placement.get("ops_by_device") or {}).items():
        out[f"placement.ops.{metric_key(dev)}"] = float(n)
    for dev, n in ((placement.get("gradients") or {}).get("ops_by_device") or {}).items():
        out[f"placement.gradient_ops.{metric_key(dev)}"] = float(n)
    per_step = (placement.get("transfers") or {}).get("per_step") or {}
    out["placement.transfers_per_step"] = float(per_step.get("count", 0))
    out["placement.transfer_bytes_per_step"] = float(per_step.get("bytes", 0))
    coll = (placement.get("transfers") or {}).get("collectives") or {}
    out["placement.collectives_per_step"] = float(sum(c.get("count", 0) for c in coll.values()))
    out["placement.collective_bytes_per_step"] = float(sum(c.get("input_bytes", 0) for c in coll.values()))
    observed, predicted = split_fallbacks(placement)
    out["placement.fallbacks"] = float(len(observed))
    out["placement.predicted_fallbacks"] = float(len(predicted))
    out["placement.devices"] = float(len(placement.get("devices") or []))
    out["placement.variables"] = float(len(user_variables(placement.get("variables") or [])))
    score = (placement.get("conformance") or {}).get("score")
    if score is not None:
        out["placement.conformance"] = float(score)
    rc = placement.get("replica_consistency") or {}
    if rc.get("max_abs_diff") is not None:
        # The headline: what must not drift (a placement.json from before the split: the overall max).
        split = rc.get("trainable_drift") is not None and rc.get("state_drift") is not None
        out["placement.replica_drift"] = float(max(rc["trainable_drift"], rc["state_drift"]) if split
                                               else rc["max_abs_diff"])
        for part in ("trainable", "state", "on_read"):
            if rc.get(f"{part}_drift") is not None:
                out[f"placement.replica_drift.{part}"] = float(rc[f"{part}_drift"])
    timing = placement.get("timing") or {}
    if timing.get("wall_ms") is not None:
        out["placement.timing.wall_ms"] = float(timing["wall_ms"])
    for dev, t in (timing.get("devices") or {}).items():
        for field in ("busy_ms", "compute_ms", "transfer_ms", "idle_share"):
            if t.get(field) is not None:
                out[f"placement.timing.{metric_key(dev)}.{field}"] = float(t[field])
    for dev, m in ((placement.get("memory") or {}).get("devices") or {}).items():
        if dev.startswith("/"):  # a device, not the bucket of allocations outside the step's graphs
            out[f"memory.peak_bytes.{metric_key(dev)}"] = float(m["peak_requested"])
            out[f"memory.peak_allocated_bytes.{metric_key(dev)}"] = float(m["peak_allocated"])
    # "input": the bytes the iterator copied from the host to each device per step, outside the step.
    for dev, b in (((placement.get("transfers") or {}).get("input") or {}).get("per_step") or {}).items():
        out[f"placement.input_bytes_per_step.{metric_key(dev)}"] = float(b)
    return out


def metrics_step(placement: Mapping[str, Any]) -> int:
    """The training step the placement metrics belong to: the last captured step (placement.json's
    `captured_steps`), 0 when no step was captured."""
    steps = placement.get("captured_steps") or []
    return int(steps[-1]) if steps else 0
