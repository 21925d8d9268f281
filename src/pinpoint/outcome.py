"""A run's outcome: the one writer of placement.json and metrics.json, for every way Pinpoint
runs code (its own loop's chief, a `train.entrypoint` chief, `pinpoint trace`). The file is
written first, then the hooks hear of it (MLflow logs the file as written), then the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinpoint.hooks import Hook
from pinpoint.placement import Placement, as_placement, write_placement
from pinpoint.runfolder import METRICS, PLACEMENT, atomic_write_json


def write_outcome(out: Path, placement: dict | None, metrics: dict, hooks: Hook, *, model: Any = None,
                  summary: str | None = None) -> None:
    """OUT/placement.json (if captured) and OUT/metrics.json; the hooks' on_placement and
    on_train_end; then `summary` (default: the placement summary table) on stdout."""
    if placement is not None:
        write_placement(Path(out) / PLACEMENT, placement)
        hooks.on_placement(as_placement(placement) or Placement())
    atomic_write_json(Path(out) / METRICS, metrics)
    hooks.on_train_end(metrics, model)
    if summary is None:
        from pinpoint.placement import format_summary

        summary = format_summary(placement, metrics)
    print(summary, flush=True)
