"""One `pinpoint train` run, measured: steady-state examples/sec, train time, bytes per step, MFU."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def steady_state(log_path: Path, warmup_steps: int, global_batch: int) -> dict[str, Any]:
    """Examples/sec between the first train_log record at or after `warmup_steps` and the last.

    Each record is written right after a host sync (the loss of the last call is a Python float),
    so the window is wall-clock time of everything the loop does: steps, logging, hooks,
    checkpoints. This is the same window the Keras peer's callback measures.
    """
    records = [json.loads(ln) for ln in log_path.read_text().splitlines() if ln.strip()]
    if not records:
        return {}
    first_logged = records[0]
    after = [r for r in records if r["step"] >= warmup_steps]
    out: dict[str, Any] = {"first_logged_step": first_logged["step"], "first_logged_time": first_logged["time"]}
    if len(after) >= 2:
        a, b = after[0], after[-1]
        steps, secs = b["step"] - a["step"], b["time"] - a["time"]
        if secs > 0 and steps > 0:
            out.update(examples_per_sec=steps * global_batch / secs, step_time_s=secs / steps, steps_timed=steps)
    return out


def _transfers(placement: dict | None) -> dict[str, Any]:
    if not placement:
        return {}
    per_step = (placement.get("transfers") or {}).get("per_step") or {}
    return {
        "transfer_bytes_per_step": per_step.get("bytes"),
        "transfers_per_step": per_step.get("count"),
        "unsized_transfers_per_step": per_step.get("unsized"),
        "transfer_matrix": (placement.get("transfers") or {}).get("matrix"),
        # Gradients all-reduced by collective ops (no _Send/_Recv): the bytes each device reduces.
        "collective_bytes_per_step": sum(c.get("input_bytes", 0) for c in
                                         ((placement.get("transfers") or {}).get("collectives") or {}).values()),
    }


def _log_mfu(cfg, out: Path, started_ms: int, values: dict) -> str | None:
    """Log `mfu` (and the peak it was computed with) into this run's MLflow train run."""
    from mlflow.tracking import MlflowClient

    from pinpoint.tracking.uri import resolve_tracking_uri

    client = MlflowClient(resolve_tracking_uri(cfg))
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`pinpoint.pipeline` = '{cfg.name}' and tags.`pinpoint.step` = 'train' "
        f"and attributes.start_time >= {started_ms}",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    run_id = runs[0].info.run_id
    for key, value in values.items():
        if value is not None:
            client.log_metric(run_id, key, float(value))
    return run_id


def pinpoint_train(spec: dict) -> dict[str, Any]:
    from pinpoint.config import config_from_dict

    cfg = config_from_dict(spec["config"])
    if cfg.tracking.enabled:
        from pinpoint.tracking import warm_tracking

        # As `pinpoint train` does: the MLflow sender process starts before TensorFlow is
        # imported (it imports MLflow and opens the store on another core meanwhile).
        warm_tracking(cfg, "train")
    # Import the frameworks before the clock starts (5-10 s, the same with or without Pinpoint's
    # options): the clock measures the run. They do not initialize any device.
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    from benchmarks.worker import _mfu_fields
    from pinpoint.placement.model.files import read_placement
    from pinpoint.runfolder import METRICS, PLACEMENT, TRAIN_LOG
    from pinpoint.training.command import train_command

    out = Path(spec["out"])
    started_ms = int(time.time() * 1000)
    t0 = time.perf_counter()
    rc = train_command(cfg, out)
    train_s = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"pinpoint train exited {rc}")
    metrics = json.loads((out / METRICS).read_text())
    placement = read_placement(out / PLACEMENT, detail=False) if (out / PLACEMENT).is_file() else None
    rec: dict[str, Any] = {
        "train_s": train_s,
        "reported_examples_per_sec": metrics.get("examples_per_sec"),
        "final_loss": metrics.get("final_loss"),
        "final_accuracy": metrics.get("final_accuracy"),
        "num_params": metrics.get("num_params"),
        "jit_compile": metrics.get("jit_compile"),
        "num_replicas_in_sync": metrics.get("num_replicas"),
        "global_batch": metrics.get("global_batch"),
        "replica_devices": (metrics.get("device_map") or {}).get("replica_devices"),
        "param_bytes": _param_bytes(placement, metrics),
    }
    rec.update(steady_state(out / TRAIN_LOG, spec["warmup_steps"], metrics["global_batch"]))
    rec.update(_tracking_cost(out))
    rec.update(_transfers(placement))
    rec["model_layers"] = _kernels_from_placement(placement) or _dense_layers(cfg)
    rec.update(_mfu_fields(cfg, rec, peak=spec.get("peak", False)))
    if spec.get("log_mfu") and cfg.tracking.enabled and rec.get("mfu") is not None:
        rec["mlflow_run_id"] = _log_mfu(cfg, out, started_ms, {"mfu": rec["mfu"], "matmul_peak_flops": rec.get("peak_flops")})
    return rec


def _tracking_cost(out: Path) -> dict[str, Any]:
    """Issue 34.2, from the run's tracking.json: the sender's CPU share while sending (training's
    part, and its steady rate over the second half), the training's µs per logging call, the
    wait at close."""
    from pinpoint.runfolder import TRACKING_COST

    path = out / TRACKING_COST
    if not path.is_file():
        return {}
    cost = json.loads(path.read_text())
    train = cost.get("train") or {}
    return {"sender_cpu_share": train.get("sender_cpu_share"), "sender_cpu_s": train.get("sender_cpu_s"),
            "sender_steady_share": train.get("sender_steady_share"),
            "sending_wall_s": train.get("sending_wall_s"), "log_us_per_call": train.get("log_us_per_call"),
            "tracking_close_s": cost.get("close_s")}


def _param_bytes(placement: dict | None, metrics: dict) -> int | None:
    # float32 trainable parameters: the bytes one all-reduce of the gradients moves.
    n = metrics.get("num_params")
    return 4 * int(n) if n else None


def _kernels_from_placement(placement: dict | None) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of the model's kernels as placement.json lists them (model order)."""
    if not placement:
        return []
    return [tuple(v["shape"]) for v in placement.get("variables") or []
            if str(v.get("name", "")).endswith("/kernel") and len(v.get("shape") or ()) == 2]


def _dense_layers(cfg) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of the model's kernels, from the same builder the trainer used."""
    if cfg.train.model != "mlp":
        return []
    from benchmarks.keras_peer import dense_shapes
    from pinpoint.devices import setup_devices
    from pinpoint.training.input.data import load_arrays
    from pinpoint.training.loop.models import build_model

    setup_devices(cfg)  # a launcher parent has not initialized TensorFlow yet
    arrays = load_arrays(cfg)
    return dense_shapes(build_model(cfg.train.model, (arrays.features,), arrays.num_classes, seed=cfg.train.seed))
