"""Issue 33: `pinpoint plan` — the parameter-server balance before and after a plan, measured, and
the planning time (benchmarks/plan_ps.py); the model-parallel balance of a user's split and of
the verified plan (benchmarks/plan_mp.py); the predicted step against the measured one over seven
placements (benchmarks/plan_step.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import section


def _render(plan: list[p.Comparison], results: dict) -> str:
    from benchmarks.plan_mp import section as render_mp
    from benchmarks.plan_ps import section as render_ps
    from benchmarks.plan_step import section as render_step

    return (render_ps(results) + "\n**Model-parallel balance** (benchmarks/plan_mp.py)\n" + render_mp(results)
            + "\n**Step time, predicted vs measured** (benchmarks/plan_step.py)\n" + render_step(results))


@section("Placement planner (`pinpoint plan`)", order=68, render=_render)
def plan(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.plan_mp import comparison as model_parallel
    from benchmarks.plan_ps import comparison as parameter_servers
    from benchmarks.plan_step import comparison as step_time

    return [parameter_servers(), model_parallel(), step_time(quick=s.steps < 1000)]
