"""`placement_sweep`: strategy x pinning variants in a ParallelFor -> compare -> the fastest run
that obeyed its plan, with a comparison chart. Each variant logs its own MLflow runs under the
sweep's parent run.

(No `from __future__ import annotations`: kfp reads the parameter annotations at run time.)
"""

from kfp import dsl

from components import build_components
from pipelines.settings import PipelineSettings, local_settings
from pipelines.tasks import configure_step, provision_and_train

PIPELINE_NAME = "pinpoint-placement-sweep"

# Each variant overrides config sections ({"train": {...}} replaces those keys of `train`).
# These fit the default 2-device spec; pinning rules are only legal with strategy 'none'.
DEFAULT_VARIANTS = [
    {"name": "mirrored", "train": {"strategy": "mirrored", "pinning": {"input": "/CPU:0"}}},
    {"name": "central-storage", "train": {"strategy": "central_storage", "pinning": {"input": "/CPU:0"}}},
    {"name": "one-device", "train": {"strategy": "one_device", "pinning": {}}},
    {
        "name": "vars-on-cpu",
        "train": {"strategy": "none", "pinning": {"variables": "/CPU:0", "gradients": "/GPU:0", "input": "/CPU:0"}},
    },
]


def build_placement_sweep(settings: PipelineSettings | None = None, variants: list | None = None):
    settings = settings or local_settings()
    comp = build_components(settings.image)
    default_variants = list(variants if variants is not None else DEFAULT_VARIANTS)
    default_root = f"{settings.default_run_dir}-sweep" if settings.default_run_dir else ""

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Train every strategy x pinning variant, then pick the fastest run that obeyed its plan.",
    )
    def placement_sweep(
        config_yaml: str = settings.default_config_yaml,
        runs_root: str = default_root,
        parent_run_id: str = "",
        variants: list = default_variants,
    ):
        # parallelism=1: variants are timed against each other, so they must not share the cores.
        with dsl.ParallelFor(items=variants, parallelism=1) as variant:
            tr = provision_and_train(
                comp, settings, config_yaml=config_yaml, run_dir=runs_root, parent_run_id=parent_run_id,
                variant=variant, resume_from_run="",
            )
        cmp = comp.compare_runs(
            run_dirs=dsl.Collected(tr.outputs["Output"]), out_dir=runs_root, parent_run_id=parent_run_id
        )
        configure_step(cmp, settings, display_name="compare", cache=False, retries=2)

    return placement_sweep


placement_sweep = build_placement_sweep()
