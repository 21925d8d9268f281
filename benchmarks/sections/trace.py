"""Issue 24.5: your own training code, unchanged — `pinpoint trace` against plain `python` on the
worked examples, and `train.entrypoint` against Pinpoint's own loop (benchmarks/trace_cost.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import section


@section("Your own training code: `pinpoint trace` and `train.entrypoint`", order=55)
def trace(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.trace_cost import trace_comparisons

    return trace_comparisons(s)
