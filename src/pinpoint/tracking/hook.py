"""The training hook that sends a run's story to MLflow: params at the start, metrics every step,
checkpoints as they are written, placement metrics + placement.json, the final model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pinpoint.runfolder import CLUSTER_SPEC, METRICS, PLACEMENT, TRAIN_LOG
from pinpoint.tracking.checkpoints import artifact_dir, checkpoint_files
from pinpoint.training.hooks import Hook

STEP_METRICS = ("loss", "accuracy", "examples_per_sec", "step_time")


def numeric_leaves(data: Any, prefix: str, depth: int = 3) -> dict[str, float]:
    """Numbers (bools as 0/1) in a nested dict, keyed 'prefix/a/b'; lists are skipped."""
    out: dict[str, float] = {}
    if depth < 0 or not isinstance(data, Mapping):
        return out
    for key, value in data.items():
        name = f"{prefix}/{key}"
        if isinstance(value, (bool, int, float)):
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(numeric_leaves(value, name, depth - 1))
    return {k: v for k, v in out.items() if _metric_name_ok(k)}


def _metric_name_ok(name: str) -> bool:
    return len(name) <= 250 and all(c.isalnum() or c in "_-. /:" for c in name)


def placement_metrics(placement: Mapping[str, Any]) -> dict[str, float]:
    """Placement metrics: numbers under placement['summary'] (and ['metrics'] if present), else
    the top-level numbers, as 'placement/<name>'."""
    try:
        from pinpoint.placement.analyze import headline_metrics

        picked = {k: v for k, v in headline_metrics(dict(placement)).items() if _metric_name_ok(k)}
        if picked:
            return picked
    except Exception:  # noqa: BLE001, S110 - an unexpected placement shape: fall back to its numbers
        pass
    picked: dict[str, float] = {}
    for section in ("summary", "metrics", "counts", "transfers"):
        if isinstance(placement.get(section), Mapping):
            picked.update(numeric_leaves(placement[section], "placement"))
    if not picked:
        picked = numeric_leaves({k: v for k, v in placement.items() if not isinstance(v, Mapping)}, "placement")
    return picked


class TrackingHook(Hook):
    def __init__(self, run):
        self.run = run
        self.run_dir = Path(run.spool.meta.get("run_dir", ".")) if hasattr(run, "spool") else Path(".")

    def on_train_begin(self, info: Mapping[str, Any]) -> None:
        params = {}
        for key in ("strategy", "start_step", "num_params", "task", "num_replicas", "device_aliases",
                    "devices", "replica_devices", "pinning"):
            if key in info and info[key] is not None:
                value = info[key]
                params[f"run.{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
        self.run.log_params(params)
        if info.get("resumed_from_run"):
            self.run.set_tags({"pinpoint.resumed_from_run": info["resumed_from_run"]})
        out = info.get("out_dir") or info.get("run_dir")
        if out:
            self.run_dir = Path(out)
        spec = self.run_dir / CLUSTER_SPEC
        if spec.is_file():
            self.run.log_artifact(spec)

    def on_step_end(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log_metrics(metrics, step=int(step))

    def on_checkpoint(self, step: int, path: str) -> None:
        # Snapshot now (hard links): the manager may delete old checkpoints before upload.
        for f in checkpoint_files(path):
            self.run.log_artifact(f, artifact_dir(step))

    def on_placement(self, placement: Mapping[str, Any]) -> None:
        step = int(placement.get("step", 0) or 0) if isinstance(placement.get("step"), (int, float)) else 0
        self.run.log_metrics(placement_metrics(placement), step=step)
        self.run.log_dict(dict(placement), PLACEMENT)
        # placement.timing: the profiler trace, a TensorBoard logdir (`tensorboard --logdir profile`).
        trace = (placement.get("timing") or {}).get("trace")
        if trace and (self.run_dir / trace).is_dir():
            self.run.log_artifacts(self.run_dir / trace, trace)

    def on_train_end(self, summary: Mapping[str, Any], model: Any = None) -> None:
        # Run-level numbers (final_*, eval_*, steady-state throughput) at the last step; renamed
        # where they would otherwise add a point to a per-step series such as examples_per_sec.
        final = {}
        for key, value in summary.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key.startswith(("final_", "eval_")):
                final[key] = float(value)
            elif key == "examples_per_sec":
                final["steady_examples_per_sec"] = float(value)
        last = summary.get("steps")
        self.run.log_metrics(final, step=int(last) if isinstance(last, (int, float)) else 0)
        self.run.log_dict(dict(summary), METRICS)
        log = self.run_dir / TRAIN_LOG
        if log.is_file():
            self.run.log_artifact(log)
        if model is not None and self.run.logs_model:
            self.run.log_model(model, "model")  # in the background; the run's close waits for it
