"""Pure aggregation helpers: median/min/max of repeated runs and same-round ratios, the 95%
bootstrap interval of a median, and a target's verdict from that interval (issue 34.3)."""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEVEL = 0.95  # the intervals' confidence level
RESAMPLES = 4000
TOLERANCE = 0.03  # a comparison is settled when its interval is within ±3% of its median


@dataclass(frozen=True)
class Summary:
    """Median with min and max over `n` runs (None-valued runs are dropped and counted), and
    with `interval`, the 95% bootstrap interval of the median (`low`, `high`; None under 2 values)."""

    median: float
    min: float
    max: float
    n: int
    failed: int = 0
    low: float | None = None
    high: float | None = None

    def as_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n, "failed": self.failed,
                "low": self.low, "high": self.high}


def summarize(values: Iterable[float | None], *, interval: bool = False) -> Summary | None:
    """Median/min/max of the finite values (and their median's interval); None when no run
    produced a value."""
    vals = list(values)
    good = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
    if not good:
        return None
    low, high = bootstrap_interval(good) if interval else (None, None)
    return Summary(statistics.median(good), min(good), max(good), len(good), len(vals) - len(good), low, high)


def bootstrap_interval(values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                       seed: int = 0) -> tuple[float | None, float | None]:
    """The percentile bootstrap interval of the median of `values` (each a round's ratio, or a
    pair of blocks' difference): resample the values with replacement, take each resample's
    median, keep the middle `level` of them. (None, None) under two values: one has no spread.
    Seeded: the same values give the same interval in every report."""
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:
        return None, None
    return _bootstrap(vals, level, resamples, seed)


@functools.lru_cache(maxsize=4096)
def _bootstrap(vals: tuple[float, ...], level: float, resamples: int, seed: int) -> tuple[float, float]:
    # Cached: a report renders every summary again at each comparison's end (4,000 resamples each).
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(resamples))
    tail = (1 - level) / 2
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1 - tail) * resamples))]


MIN_VALUES = 3  # a verdict needs an interval from at least this many values (benchmarks/targets.py)


def decide(s: Summary | None, target: str) -> str:
    """'met', 'NOT met', 'undecided (...)' or 'recorded (...)' for `target` ('>= x' / '<= x'), by
    the interval: met when all of it is on the target's side, NOT met when none of it is,
    undecided when it straddles the target; recorded (no verdict) under MIN_VALUES values."""
    op, _, num = target.partition(" ")
    bound = float(num)
    if op not in (">=", "<="):
        raise ValueError(f"target: got {target!r}; use '>= NUMBER' or '<= NUMBER'")
    if s is None:
        return f"NOT met (no data: every run failed; target {target})"
    if s.n < MIN_VALUES:
        return f"recorded ({s.n} value{'s' if s.n != 1 else ''}: a verdict needs {MIN_VALUES}; target {target})"
    if s.low is None or s.high is None:
        return f"undecided (one value, no interval; target {target})"
    ok_low, ok_high = (s.low >= bound, s.high >= bound) if op == ">=" else (s.low <= bound, s.high <= bound)
    if ok_low and ok_high:
        return f"met (target {target})"
    if not ok_low and not ok_high:
        return f"NOT met (target {target})"
    return f"undecided (the interval straddles it; target {target})"


def settled(s: Summary | None, tolerance: float = TOLERANCE) -> bool:
    """Whether the interval is within ±tolerance of the median (more rounds would not move it much)."""
    if s is None or s.low is None or s.high is None:
        return False
    return max(s.median - s.low, s.high - s.median) <= tolerance * abs(s.median)


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
    """'median (min-max)' e.g. '1.02 (0.98-1.05)'; with an interval, 'median [low, high] (min-max)'."""
    if s is None:
        return "n/a"
    ci = f" [{fmt(s.low, digits)}, {fmt(s.high, digits)}]" if s.low is not None and s.high is not None else ""
    return f"{fmt(s.median, digits)}{suffix}{ci} ({fmt(s.min, digits)}–{fmt(s.max, digits)})"
