"""One measured run in its own process: `python -m benchmarks.worker SPEC.json` -> one JSON line.

The logical device layout is fixed once per process, so each run (Pinpoint or Keras, any
device count) gets a fresh process. SPEC keys:
  kind          "pinpoint" | "keras" | "keras_mwm" | "keras_task" | "make_run" | "program" | "entrypoint"
                | "k8s_scale" | "placement_scale"
  config        a Pinpoint config as a dict (pinpoint, keras*)
  out           the run folder
  warmup_steps  steps excluded from the steady state (trace, warm-up, placement capture)
  peak          measure the matmul peak of the run's devices afterwards (for MFU)
  log_mfu       log `mfu` into the run's MLflow run (pinpoint runs with tracking on)
The printed line starts with RESULT_PREFIX so it can be told apart from TensorFlow's chatter.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "


def _emit(record: dict) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(record, default=str) + "\n")
    sys.stdout.flush()


def _mfu_fields(cfg, record: dict, *, peak: bool) -> dict:
    """FLOPs per step from the model's Dense shapes, the devices' matmul peak, and their ratio."""
    from benchmarks.flops import dense_flops_per_step, mfu

    out: dict[str, Any] = {}
    layers = record.get("model_layers")
    if layers and cfg.train.model == "mlp":
        out["flops_per_step"] = dense_flops_per_step([tuple(x) for x in layers], cfg.train.batch_size)
    if peak:
        from benchmarks.peak import matmul_peak
        from pinpoint.devices import setup_devices

        # Already configured by the run in this process (or configured now for a launcher parent
        # whose tasks ran elsewhere): same layout, same device names as the run.
        dm = setup_devices(cfg)
        out.update(matmul_peak(list(dm.replica_devices)))
    step_time = record.get("step_time_s")
    if out.get("flops_per_step") and out.get("peak_flops") and step_time:
        out["mfu"] = mfu(out["flops_per_step"], step_time, out["peak_flops"])
    return out


def run_keras(spec: dict) -> dict:
    from benchmarks.keras_peer import keras_fit
    from pinpoint.config import config_from_dict

    cfg = config_from_dict(spec["config"])
    t0 = time.perf_counter()
    rec = keras_fit(cfg, warmup_steps=spec["warmup_steps"], multi_worker=spec["kind"] == "keras_task")
    rec["wall_s"] = time.perf_counter() - t0
    rec.update(_mfu_fields(cfg, rec, peak=spec.get("peak", False)))
    return rec


def run_keras_mwm(spec: dict) -> dict:
    from benchmarks.keras_mwm import launch

    return launch(spec)


def run_pinpoint(spec: dict) -> dict:
    from benchmarks.pinpoint_run import pinpoint_train

    return pinpoint_train(spec)


def run_placement_scale(spec: dict) -> dict:
    from benchmarks.placement_scale import measure

    return measure(spec)


def run_make_run(spec: dict) -> dict:
    from benchmarks.make_run import time_make_run

    return time_make_run(spec)


def run_program(spec: dict) -> dict:
    from benchmarks.trace_cost import run_program as run

    return run(spec)


def run_entrypoint(spec: dict) -> dict:
    from benchmarks.trace_cost import run_entrypoint as run

    return run(spec)


def run_k8s_scale(spec: dict) -> dict:
    from benchmarks.k8s_scale import measure

    return measure(spec)


KINDS = {
    "program": run_program,
    "entrypoint": run_entrypoint,
    "pinpoint": run_pinpoint,
    "keras": run_keras,
    "keras_task": run_keras,
    "keras_mwm": run_keras_mwm,
    "make_run": run_make_run,
    "k8s_scale": run_k8s_scale,
    "placement_scale": run_placement_scale,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.worker SPEC.json", file=sys.stderr)
        return 2
    arg = argv[0]
    spec = json.loads(Path(arg).read_text() if not arg.lstrip().startswith("{") else arg)
    kind = spec.get("kind")
    if kind not in KINDS:
        print(f"benchmarks.worker: kind: got {kind!r}; use one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    record = KINDS[kind](spec)
    record.setdefault("process_s", time.perf_counter() - t0)
    record["kind"] = kind
    record["pid"] = os.getpid()
    _emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
