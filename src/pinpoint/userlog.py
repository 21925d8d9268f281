"""`pinpoint.log(step, **metrics)`: a custom training loop's metrics, sent to the run's MLflow
run when the program runs under `pinpoint trace` or as a `train.entrypoint`; a no-op otherwise.
Imports nothing: a program may call it without Pinpoint doing anything."""

from __future__ import annotations

from collections.abc import Callable

_sink: Callable[[int, dict], None] | None = None


def log(step: int, **metrics) -> None:
    """Log `metrics` (name=number) at `step`; nothing happens when no Pinpoint run is active."""
    if _sink is not None:
        _sink(int(step), {k: float(v) for k, v in metrics.items()})


def set_sink(sink: Callable[[int, dict], None] | None) -> None:
    """Where `log` sends (set by the trace session; None: nowhere)."""
    global _sink
    _sink = sink
