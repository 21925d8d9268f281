"""kfp components for Pinpoint. Each body imports `pinpoint` and calls one library step.

The component functions are plain Python here; :func:`build_components` turns them into
lightweight kfp components for a given base image (the local run uses the current interpreter,
DockerRunner and Kubernetes use the pinpoint image). kfp is not installed with the library, so
nothing under src/ imports this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pinpoint.config import DEFAULT_IMAGE  # the config's default cluster.image


@dataclass(frozen=True)
class Components:
    provision_cluster: Any
    train: Any
    report: Any
    compare_runs: Any


def build_components(image: str = DEFAULT_IMAGE) -> Components:
    """Lightweight components running in `image` (which must have pinpoint and kfp installed,
    so no `pip install` happens at run time)."""
    from kfp import dsl

    from components import _common
    from components.compare_runs import compare_runs
    from components.provision_cluster import provision_cluster
    from components.report import report
    from components.train import train

    def make(fn):
        return dsl.component(
            fn,
            base_image=image,
            install_kfp_package=False,
            additional_funcs=[_common.run_step, _common.fail],
        )

    return Components(
        provision_cluster=make(provision_cluster),
        train=make(train),
        report=make(report),
        compare_runs=make(compare_runs),
    )
