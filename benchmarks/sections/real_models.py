"""Issue 25.5: placement at scale on the models users train (benchmarks/real_models.py):
capture + analysis time, placement files and peak memory for MobileNetV2 and ResNet50 under
mirrored on 1, 2 and 4 emulated GPUs, and Pinpoint against Keras `fit` on MobileNetV2."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plan as p
from benchmarks import render as r
from benchmarks.sections import section


@section("Placement at scale: real models", order=45, render=r.section_real_models)
def real_models(s: p.Settings, out: Path) -> list[p.Comparison]:
    return [p.real_models_comparison(s), p._pair_real_model(s, out)]
