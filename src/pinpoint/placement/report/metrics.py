"""The placement metrics MLflow gets: the one place they are chosen, for the training run
(pinpoint.tracking.hook) and `pinpoint report` alike."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pinpoint.device_names import parse_name
from pinpoint.placement.model.placement import Placement, as_placement
from pinpoint.placement.model.records import ReplicaConsistency


def metric_key(device: str) -> str:
    """MLflow-safe key part: "/job:worker/task:1/GPU:0" -> "worker_1_GPU_0", "/GPU:0" -> "GPU_0"."""
    job, task, dtype, index = parse_name(device)
    parts = []
    if job:
        parts.append(job + (f"_{task}" if task is not None else ""))
    parts.append(f"{dtype}_{index}" if dtype else "unknown")
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))


def headline_metrics(placement: Placement | Mapping[str, Any]) -> dict[str, float]:
    """MLflow-safe headline numbers: placement.ops.GPU_0, placement.transfers_per_step, ..."""
    p = as_placement(placement) or Placement()
    out: dict[str, float] = {}
    for dev, n in p.ops_by_device.items():
        out[f"placement.ops.{metric_key(dev)}"] = float(n)
    for dev, n in (p.gradients.ops_by_device or {}).items():
        out[f"placement.gradient_ops.{metric_key(dev)}"] = float(n)
    out["placement.transfers_per_step"] = float(p.transfers.per_step.count)
    out["placement.transfer_bytes_per_step"] = float(p.transfers.per_step.bytes)
    coll = p.transfers.collectives
    out["placement.collectives_per_step"] = float(sum(c.count for c in coll.values()))
    out["placement.collective_bytes_per_step"] = float(sum(c.input_bytes for c in coll.values()))
    out["placement.fallbacks"] = float(len(p.observed_fallbacks))
    out["placement.predicted_fallbacks"] = float(len(p.predicted_fallbacks))
    out["placement.devices"] = float(len(p.devices))
    out["placement.variables"] = float(len(p.user_variables))
    if p.conformance.score is not None:
        out["placement.conformance"] = float(p.conformance.score)
    out |= _drift_metrics(p.replica_consistency)
    out |= _timing_metrics(p)
    for dev, m in ((p.memory.devices if p.memory else None) or {}).items():
        if dev.startswith("/"):  # a device, not the bucket of allocations outside the step's graphs
            out[f"memory.peak_bytes.{metric_key(dev)}"] = float(m["peak_requested"])
            out[f"memory.peak_allocated_bytes.{metric_key(dev)}"] = float(m["peak_allocated"])
    out |= _task_memory_metrics(p.memory.tasks if p.memory else None)
    # "input": the bytes the iterator copied from the host to each device per step, outside the step.
    for dev, b in p.transfers.input.per_step.items():
        out[f"placement.input_bytes_per_step.{metric_key(dev)}"] = float(b)
    return out


# A cluster's task without a per-device split: its allocator's own totals (docs/memory.md).
TASK_MEMORY_METRICS = {"task_peak": "memory.task_peak_bytes", "held": "memory.held_bytes",
                       "peak": "memory.peak_since_start_bytes", "variables_bytes": "memory.variables_bytes"}


def _task_memory_metrics(tasks: Mapping[str, Any] | None) -> dict[str, float]:
    # `peak` is a serving task's (beside `held`), never another section's key.
    return {f"{name}.{task.replace(':', '_')}": float(t[key]) for task, t in (tasks or {}).items()
            for key, name in TASK_MEMORY_METRICS.items()
            if t.get(key) is not None and (key == "task_peak" or t.get("held") is not None)}


def _drift_metrics(rc: ReplicaConsistency | None) -> dict[str, float]:
    out: dict[str, float] = {}
    if rc is not None and rc.max_abs_diff is not None:
        # The headline: what must not drift (a placement.json from before the split: the overall max).
        split = rc.trainable_drift is not None and rc.state_drift is not None
        out["placement.replica_drift"] = float(max(rc.trainable_drift, rc.state_drift) if split else rc.max_abs_diff)
        for part in ("trainable", "state", "on_read"):
            if getattr(rc, f"{part}_drift") is not None:
                out[f"placement.replica_drift.{part}"] = float(getattr(rc, f"{part}_drift"))
    return out


def _timing_metrics(p: Placement) -> dict[str, float]:
    out: dict[str, float] = {}
    if p.timing is None:
        return out
    if p.timing.wall_ms is not None:
        out["placement.timing.wall_ms"] = float(p.timing.wall_ms)
    for dev, t in p.timing.devices.items():
        for field in ("busy_ms", "compute_ms", "transfer_ms", "idle_share"):
            if getattr(t, field) is not None:
                out[f"placement.timing.{metric_key(dev)}.{field}"] = float(getattr(t, field))
    return out


def metrics_step(placement: Placement | Mapping[str, Any]) -> int:
    """The training step the placement metrics belong to: the last captured step (placement.json's
    `captured_steps`), 0 when no step was captured."""
    p = as_placement(placement) or Placement()
    return int(p.captured_steps[-1]) if p.captured_steps else 0
