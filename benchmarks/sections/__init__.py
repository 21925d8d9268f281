"""The sections of benchmarks/RESULTS.md, each registered by one function.

A section is a function decorated with :func:`section`: given the run's Settings and output
folder it returns the comparisons to run (a section may have none, e.g. one that reads a file);
`render` turns their results into the section's markdown (default: :func:`render_comparisons`,
a table of the arms and one of the ratios with their targets). The harness runs the sections in
`order`, renders them under their heading in that order, lists every Ratio target of every
section under "Targets", and times each comparison.

Every module of this package is imported by :func:`sections`, so adding a section is adding
one module here with one decorated function; nothing else in the harness changes:

    @section("Trace cost", order=35)
    def trace_cost(s: Settings, out: Path) -> list[Comparison]:
        return [Comparison(key="trace-cost", title=..., arms=(...), ratios=(...), run_s=9.0)]

Each Comparison states `run_s`, the seconds one of its runs takes here (process wall time):
the plan's time estimate (`python -m benchmarks.run --plan`) must stay under PLAN_LIMIT_S.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.plan import Comparison, Settings

Results = dict[str, dict[str, list[dict]]]
Build = Callable[[Settings, Path], Sequence[Comparison]]
Render = Callable[[list[Comparison], Results], str]

PLAN_LIMIT_S = 65 * 60  # a full `make bench` on the 2-core bench machine (the memory section: about 14 of them,
# its parameter_server column 2, its runs at 4x the batch, three processes a model, 7)


@dataclass(frozen=True)
class Section:
    key: str
    heading: str
    order: int
    build: Build
    render: Render | None = None  # None: render_comparisons
    full_only: bool = False  # rendered only in RESULTS.md (not in a partial run's file)


_REGISTRY: dict[str, Section] = {}


def section(heading: str, *, order: int, render: Render | None = None, full_only: bool = False):
    """Register the decorated function as a section of RESULTS.md (key: its name, '-' for '_')."""

    def register(build: Build) -> Build:
        key = build.__name__.replace("_", "-")
        clash = next((s for s in _REGISTRY.values() if s.order == order and s.key != key), None)
        if clash is not None:
            raise ValueError(f"benchmarks section {key}: order {order} is taken by {clash.key}; pick another")
        _REGISTRY[key] = Section(key, heading, order, build, render, full_only)
        return build

    return register


def sections() -> list[Section]:
    """Every registered section, in order (imports every module of this package once)."""
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    return sorted(_REGISTRY.values(), key=lambda s: s.order)


def render_comparisons(comps: list[Comparison], results: Results) -> str:
    """The default rendering: per comparison, its arms (train time, steady ex/s, process wall,
    runs) and its ratios (value and target)."""
    from benchmarks.render import compare_summary, summ, target_met
    from benchmarks.stats import fmt_summary
    from benchmarks.table import markdown_table

    parts = []
    for c in comps:
        runs = results.get(c.key)
        if runs is None:
            parts.append(f"{c.title}: " + (f"skipped, {c.skipped}\n" if c.skipped else "not run\n"))
            continue
        rows = [[a.label, fmt_summary(summ(runs.get(a.name, []), "train_s")),
                 fmt_summary(summ(runs.get(a.name, []), "examples_per_sec"), 4),
                 fmt_summary(summ(runs.get(a.name, []), "process_wall_s")), str(len(runs.get(a.name, [])))]
                for a in c.arms]
        out = (f"{c.title}\n\n" if len(comps) > 1 else "") + markdown_table(
            ["arm", "train time s", "steady ex/s", "process wall s", "runs"], rows)
        if c.ratios:
            out += "\n" + markdown_table(["same round", "value", "target"], [
                [rt.label, fmt_summary(compare_summary(results, c.key, rt), 3, " s" if rt.difference else ""),
                 target_met(compare_summary(results, c.key, rt), rt.target) or "recorded"] for rt in c.ratios])
        parts.append(out + (f"\n{c.note}\n" if c.note else ""))
    return "\n".join(parts)
