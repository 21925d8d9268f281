"""`training_pipeline`: provision -> train -> report.

(No `from __future__ import annotations`: kfp reads the parameter annotations at run time.)
"""

from kfp import dsl

from components import build_components
from pipelines.settings import PipelineSettings, local_settings
from pipelines.tasks import configure_step, provision_and_train

PIPELINE_NAME = "pinpoint-training"


def build_training_pipeline(settings: PipelineSettings | None = None):
    """The pipeline function for these settings (kfp needs them at definition time)."""
    settings = settings or local_settings()
    comp = build_components(settings.image)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Provision a TensorFlow cluster, train with the configured strategy and pinning, "
        "report where every op, variable and gradient ran.",
    )
    def training_pipeline(
        config_yaml: str = settings.default_config_yaml,
        run_dir: str = settings.default_run_dir,
        parent_run_id: str = "",
        resume_from_run: str = "",
    ):
        tr = provision_and_train(
            comp, settings, config_yaml=config_yaml, run_dir=run_dir, parent_run_id=parent_run_id,
            variant={}, resume_from_run=resume_from_run,
        )
        rep = comp.report(run_dir=tr.outputs["Output"], parent_run_id=parent_run_id, placement=tr.outputs["placement"])
        # Reports are rewritten atomically from the run folder: retrying is safe.
        configure_step(rep, settings, display_name="report", cache=False, retries=2)

    return training_pipeline


training_pipeline = build_training_pipeline()
