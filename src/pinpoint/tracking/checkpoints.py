"""Checkpoints logged to MLflow as they are written, and fetched back to resume a run."""

from __future__ import annotations

from pathlib import Path

from pinpoint.errors import ConfigError
from pinpoint.runfolder import checkpoint_name, checkpoint_step

CKPT_ARTIFACT_DIR = "checkpoints"


def checkpoint_files(prefix: str | Path) -> list[Path]:
    """The files of one TF checkpoint: prefix.index, prefix.data-*, and the `checkpoint` state file."""
    p = Path(prefix)
    files = [f for f in p.parent.glob(p.name + ".*") if f.name.startswith(p.name + ".")
             and (f.name.endswith(".index") or ".data-" in f.name)]
    state = p.parent / "checkpoint"
    if state.is_file():
        files.append(state)
    return sorted(files)


def artifact_dir(step: int) -> str:
    """The MLflow artifact folder of the checkpoint of `step`: checkpoints/ckpt-<step>."""
    return f"{CKPT_ARTIFACT_DIR}/{checkpoint_name(step)}"


def fetch_checkpoint(run_id: str, cfg, dest_dir: str | Path, *, uri: str | None = None) -> Path:
    """Download the latest checkpoint (highest step) logged in MLflow run `run_id` into dest_dir;
    return its prefix (for tf.train.Checkpoint.restore / tf.train.load_checkpoint)."""
    from pinpoint.tracking.sender import mlflow_client
    from pinpoint.tracking.uri import redact, resolve_tracking_uri

    uri = uri or resolve_tracking_uri(cfg)
    client = mlflow_client(uri)
    try:
        client.get_run(run_id)
    except Exception as err:  # noqa: BLE001
        first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise ConfigError(
            f"--resume-from-run: run '{run_id}' not found at {redact(uri)} ({first}); "
            "pass a run id from the MLflow UI, with tracking.uri/MLFLOW_TRACKING_URI pointing at its server"
        ) from None
    steps = [step for info in client.list_artifacts(run_id, CKPT_ARTIFACT_DIR)
             if info.is_dir and (step := checkpoint_step(info.path)) is not None]
    if not steps:
        raise ConfigError(
            f"--resume-from-run: run '{run_id}' has no checkpoints logged under {CKPT_ARTIFACT_DIR}/; "
            "pick a training run that wrote checkpoints (train.checkpoint_every > 0)"
        )
    step = max(steps)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    local = Path(client.download_artifacts(run_id, artifact_dir(step), str(dest)))
    index = sorted(local.glob("*.index"))
    if not index:
        raise ConfigError(
            f"--resume-from-run: checkpoint {artifact_dir(step)} of run '{run_id}' has no .index file; "
            "it is incomplete; resume from another run"
        )
    return index[-1].with_suffix("")
