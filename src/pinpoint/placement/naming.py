"""Names the placement report uses besides device names (pinpoint.device_names): the NodeDef
attrs pinpoint sets on captured graphs and MLflow-safe metric keys per device."""

from __future__ import annotations

import re

from pinpoint.device_names import parse_name

# NodeDef attr pinpoint.placement.steps sets on the per-step view (no TensorFlow import here):
# a _Send of the training loop's own predicate/control signal.
LOOP_ATTR = "_pinpoint_loop_control"
# NodeDef attr on ops that GPU emulation placed on the emulated /GPU:0 (no device request of the
# user's: a GPU machine's placer would have put them there), see pinpoint.distribute.emulation.
EMULATED_ATTR = "_pinpoint_emulated"
# NodeDef attr on ops expanded from an XLA-compiled call (XLA, not the kernel registry, runs them).
XLA_ATTR = "_pinpoint_xla"


def metric_key(device: str) -> str:
    """MLflow-safe key part: "/job:worker/task:1/GPU:0" -> "worker_1_GPU_0", "/GPU:0" -> "GPU_0"."""
    job, task, dtype, index = parse_name(device)
    parts = []
    if job:
        parts.append(job + (f"_{task}" if task is not None else ""))
    parts.append(f"{dtype}_{index}" if dtype else "unknown")
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))
