"""Pure aggregation helpers: median/min/max of repeated runs and same-round ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median with min and max over `n` runs (None-valued runs are dropped and counted)."""

    median: float
    min: float
    max: float
    n: int
    failed: int = 0

    def as_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n, "failed": self.failed}


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Median/min/max of the finite values; None when no run produced a value."""
    vals = list(values)
    good = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
    if not good:
        return None
    return Summary(statistics.median(good), min(good), max(good), len(good), len(vals) - len(good))


def paired_ratios(a: Sequence[float | None], b: Sequence[float | None]) -> list[float | None]:
    """a[i] / b[i] for each round i (A and B of the same round ran back to back)."""
    if len(a) != len(b):
        raise ValueError(f"paired_ratios: {len(a)} A runs but {len(b)} B runs; pair them by round")
    out: list[float | None] = []
    for x, y in zip(a, b):
        out.append(None if x is None or y is None or y == 0 else float(x) / float(y))
    return out


def fmt(value: float | None, digits: int = 3) -> str:
    """A compact human number: 3 significant digits, thousands kept readable."""
    if value is None:
        return "n/a"
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def fmt_summary(s: Summary | None, digits: int = 3, suffix: str = "") -> str:
    """'median (min-max)' e.g. '1.02 (0.98-1.05)'."""
    if s is None:
        return "n/a"
    return f"{fmt(s.median, digits)}{suffix} ({fmt(s.min, digits)}–{fmt(s.max, digits)})"
