"""Issue 26.7: the Kubernetes path at the scale parameter-server users run (benchmarks/k8s_scale.py):
provision seconds, manifest bytes and the launch step's API requests per poll at 16, 256 and 1,024
pods, against the fake API."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks.sections import section


def _render(plan: list[p.Comparison], results: dict) -> str:
    from benchmarks.k8s_scale import section as render

    return render(results)


@section("Kubernetes path at scale (parameter_server, 16 to 1,024 pods)", order=65, render=_render)
def k8s_scale(s: p.Settings, out: Path) -> list[p.Comparison]:
    from benchmarks.k8s_scale import comparison

    return [comparison()]
