"""`pinpoint train`: one process, a local cluster, or one task of a cluster (--task)."""

from __future__ import annotations

import os
from pathlib import Path

from pinpoint.config import MULTI_PROCESS_STRATEGIES, Config
from pinpoint.errors import ConfigError
from pinpoint.runfolder import ensure_dir


def parse_task(task: str) -> tuple[str, int]:
    role, _, index = task.partition(":")
    if role not in ("chief", "worker", "ps", "evaluator") or not index.isdigit():
        raise ConfigError(f"--task: got {task!r}; use ROLE:INDEX such as 'worker:1'")
    return role, int(index)


def train_command(
    cfg: Config,
    out_dir: str | Path,
    *,
    task: str | None = None,
    resume_from_run: str | None = None,
    parent_run_id: str | None = None,
) -> int:
    """Train with cfg; write placement.json, metrics.json, checkpoints/ and train_log.jsonl to out_dir.

    Single-process strategies run here; multi-process ones start a local cluster (one process
    per task), and `task="worker:1"` runs one task of such a cluster (TF_CONFIG from the env).
    """
    from pinpoint.provision.podenv import allocator_env
    from pinpoint.quiet import import_tensorflow
    from pinpoint.tfcompat.check import require

    # placement.memory: read once, when TensorFlow starts (a local cluster's tasks get it from the launcher).
    os.environ.update(allocator_env(cfg))
    if task is not None:
        from pinpoint.training.cluster.task import run_task

        role, index = parse_task(task)
        import_tensorflow()
        require()
        return run_task(cfg, ensure_dir(out_dir), role, index, resume_from_run=resume_from_run,
                        parent_run_id=parent_run_id)
    from pinpoint.usercode import preflight, uses_user_code

    if uses_user_code(cfg):
        import_tensorflow()  # the user's modules import it: quietly, before they do
    preflight(cfg)  # user modules and files, before any folder or process exists
    if cfg.train.strategy in MULTI_PROCESS_STRATEGIES:
        from pinpoint.training.cluster.launcher import run_local_cluster

        return run_local_cluster(cfg, ensure_dir(out_dir), parent_run_id=parent_run_id,
                                 resume_from_run=resume_from_run)

    if cfg.tracking.enabled:
        from pinpoint.tracking import warm_tracking

        warm_tracking(cfg, "train")  # MLflow's import and store open while TensorFlow starts
    from pinpoint.devices import setup_devices

    import_tensorflow()
    require()  # the private TensorFlow names Pinpoint patches and reads (one line if one moved)
    dm = setup_devices(cfg)  # before TensorFlow initializes anything
    from pinpoint.training.run import run_training
    from pinpoint.training.setup import task_context

    return run_training(cfg, out_dir, task_context(cfg, dm), resume_from_run=resume_from_run,
                        parent_run_id=parent_run_id)
