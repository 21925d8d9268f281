"""The training hook that sends a run's story to MLflow: params at the start, metrics every step,
checkpoints as they are written, placement metrics + placement.json, the final model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pinpoint.hooks import Hook
from pinpoint.placement import Placement, headline_metrics, metrics_step, ops_path, split_placement
from pinpoint.runfolder import CLUSTER_SPEC, METRICS, PLACEMENT, TRAIN_LOG
from pinpoint.tracking.checkpoints import artifact_dir, checkpoint_files

STEP_METRICS = ("loss", "accuracy", "examples_per_sec", "step_time")


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
        self.run.log_step_metrics(metrics, step=int(step))

    def on_checkpoint(self, step: int, path: str) -> None:
        # By time (tracking.checkpoints_every_s); a file sent is snapshotted at once (hard links):
        # the manager may delete old checkpoints before the upload.
        self.run.log_checkpoint(checkpoint_files(path), artifact_dir(step))

    def on_placement(self, placement: Placement) -> None:
        # The placement metrics (the report logs the same ones) at the step they were captured at.
        self.run.log_metrics(headline_metrics(placement), step=metrics_step(placement))
        # placement.json and its per-op file as the run folder has them (placement.model.files).
        main, ops = self.run_dir / PLACEMENT, ops_path(self.run_dir / PLACEMENT)
        if main.is_file() and ops.is_file():
            self.run.log_artifact(main)
            self.run.log_artifact(ops)
        else:
            self.run.log_dict(split_placement(placement.to_json())[0], PLACEMENT)
        # placement.timing: the profiler trace, a TensorBoard logdir (`tensorboard --logdir profile`).
        trace = placement.timing.trace if placement.timing is not None else None
        if trace and (self.run_dir / trace).is_dir():
            self.run.log_artifacts(self.run_dir / trace, trace)

    def on_train_end(self, summary: Mapping[str, Any], model: Any = None) -> None:
        self.run.flush_checkpoint()  # the last checkpoint is in the run, whenever it was written
        self.run.flush_step_metrics()  # the last logged step is in the run before its summary
        self.run.train_cost = cost = self.run.cost()
        last = summary.get("steps")
        step = int(last) if isinstance(last, (int, float)) else 0
        # What tracking cost training (tracking.json has the same, and the close's wait).
        self.run.log_metrics({f"tracking.{k}": v for k, v in cost.items()
                              if k in ("sender_cpu_share", "sender_steady_share", "log_us_per_call")
                              and v is not None}, step=step)
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
        self.run.log_metrics(final, step=step)
        self.run.log_dict(dict(summary), METRICS)
        log = self.run_dir / TRAIN_LOG
        if log.is_file():
            self.run.log_artifact(log)
        if model is not None and self.run.logs_model:
            self.run.log_model(model, "model")  # in the background; the run's close waits for it
