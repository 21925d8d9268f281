"""One measured run in its own process: `python -m benchmarks.worker SPEC.json` -> one JSON line.

The logical device layout is fixed once per process, so each run (Pinpoint or Keras, any
device count) gets a fresh process. SPEC keys:
  kind          "pinpoint" | "keras" | "keras_mwm" | "keras_task" | "make_run" | "program" | "program_pair" | "entrypoint"
                | "k8s_scale" | "placement_scale" | "overheads" | "user_calls" | "user_calls_together" | "loop_anatomy" | "plan_ps" | "plan_mp"
                | "plan_step" | "memory"
  config        a Pinpoint config as a dict (pinpoint, keras*)
  out           the run folder
  warmup_steps  steps excluded from the steady state (trace, warm-up, placement capture)
  peak          measure the matmul peak of the run's devices afterwards (for MFU)
  log_mfu       log `mfu` into the run's MLflow run (pinpoint runs with tracking on)
The printed line starts with RESULT_PREFIX so it can be told apart from TensorFlow's chatter.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


# Each kind's runner as "module:function", imported only when a run of that kind is made (each
# imports the frameworks its kind needs: TensorFlow, MLflow, kfp).
KINDS = {
    "program": "benchmarks.trace_cost:run_program",
    "program_pair": "benchmarks.trace_cost:run_program_pair",
    "entrypoint": "benchmarks.trace_cost:run_entrypoint",
    "pinpoint": "benchmarks.pinpoint_run:pinpoint_train",
    "keras": "benchmarks.keras_peer:measure",
    "keras_task": "benchmarks.keras_peer:measure",
    "keras_mwm": "benchmarks.keras_mwm:launch",
    "make_run": "benchmarks.make_run:time_make_run",
    "k8s_scale": "benchmarks.k8s_scale:measure",
    "placement_scale": "benchmarks.placement_scale:measure",
    "overheads": "benchmarks.overheads:measure",
    "user_calls": "benchmarks.user_calls:run",
    "user_calls_together": "benchmarks.user_calls:run_together",
    "loop_anatomy": "benchmarks.loop_anatomy:measure",
    "plan_ps": "benchmarks.plan_ps:measure",
    "plan_mp": "benchmarks.plan_mp:measure",
    "plan_step": "benchmarks.plan_step:measure",
    "memory": "benchmarks.memory_bench:measure",
}


def _runner(kind: str) -> Callable[[dict], dict]:
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


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
    record = _runner(kind)(spec)
    record.setdefault("process_s", time.perf_counter() - t0)
    record["kind"] = kind
    record["pid"] = os.getpid()
    _emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
