"""kfp component: train from a provisioned run folder, here (processes) or on Kubernetes."""

from kfp.dsl import Artifact, Metrics, Output


def train(
    run_dir: str,
    config_digest: str,
    parent_run_id: str,
    launch: str,
    resume_from_run: str,
    metrics: Output[Metrics],
    placement: Output[Artifact],
) -> str:
    """launch='local': run the strategy in this container (processes for multi-worker);
    launch='kubernetes': apply the provisioned manifests, wait, stream logs, clean up.
    Returns the run folder so downstream steps depend on this one."""
    import json
    import shutil
    from pathlib import Path

    from pinpoint.config import load_config
    from pinpoint.runfolder import CONFIG_FILE, METRICS, PLACEMENT

    out = Path(run_dir)
    cfg = run_step(load_config, out / CONFIG_FILE)
    if cfg.digest() != config_digest:
        # The provision step's output is keyed by the config digest (and may be cached):
        # training a different config than the one provisioned would mislabel the run.
        fail(
            f"run_dir: {out / CONFIG_FILE} has digest {cfg.digest()} but provision produced "
            f"{config_digest}; rerun the whole pipeline (the run folder changed between steps)"
        )
    if launch == "kubernetes":
        from pinpoint.k8s.launch import launch_training

        run_step(launch_training, cfg, out, parent_run_id=parent_run_id or None)
    elif launch == "local":
        from pinpoint.training.command import train_command

        run_step(
            train_command,
            cfg,
            out,
            resume_from_run=resume_from_run or None,
            parent_run_id=parent_run_id or None,
        )
    else:
        fail(f"launch: got {launch!r}; use 'local' or 'kubernetes'")

    summary = json.loads((out / METRICS).read_text())
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    shutil.copyfile(out / PLACEMENT, placement.path)
    placement.metadata["config_digest"] = config_digest
    return str(out)
