"""Issue 33: `pinpoint plan` — the parameter-server balance before and after a plan, measured, and
the planning time (benchmarks/plan_ps.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import section


def _render(plan: list[p.Comparison], results: dict) -> str:
    from benchmarks.plan_ps import section as render

    return render(results)


@section("Placement planner (`pinpoint plan`)", order=68, render=_render)
def plan(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.plan_ps import comparison

    return [comparison()]
