"""The sections every `make bench` has had: Keras `fit`, placement capture, MLflow tracking,
scaling, the all-reduce choice and `make run` (their comparisons: benchmarks/plan.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks import render as r
from benchmarks.sections import section


@section("Pinpoint against Keras `model.fit` (steady-state examples/sec)", order=10, render=r.section_keras)
def keras(s: p.Settings, out: Path) -> list[p.Comparison]:
    return p.keras_comparisons(s, out)


@section("Placement capture", order=20, render=r.section_overhead)
def overhead(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.overhead_comparison(s)]


@section("MLflow tracking cost", order=30, render=r.section_tracking)
def tracking(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.tracking_comparison(s, 2 * s.per_replica_batch, out)]


@section("Scaling: examples/sec and bytes crossing devices per step", order=40, render=r.section_scaling)
def scaling(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.scaling_comparison(s)]  # after keras: its 2-device arm is keras-mirrored's runs


@section("All-reduce choice (`train.all_reduce`)", order=50, render=r.section_allreduce)
def allreduce(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.allreduce_comparison(s)]  # after scaling: its `auto` arms are the scaling runs


@section("`make run`", order=60, render=r.section_make_run)
def make_run(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.make_run_comparison(s)]
