"""Will it fit: each device's predicted peak on the real GPU machine against a device size.

The prediction for a GPU machine starts from the executed graphs replayed with every received
tensor copied into the receiving GPU (logical CPU devices share it) and adds what the emulated run
cannot show, each term with its assumption written beside it. The verdict keeps a band either side
of the device's usable memory, because the allocator's rounding and fragmentation depend on the
order the ops ran.
"""

from __future__ import annotations

from collections.abc import Mapping

from pinpoint.device_names import is_host
from pinpoint.sizes import CONTEXT

BAND = 0.15  # the borderline band either side of the usable memory
NCCL = 32 * 2**20
GPU_MEMORY_ENV = "PINPOINT_GPU_MEMORY"  # bytes: set by --gpu-memory and cluster.gpu_memory  # NCCL's buffers for one all-reduce group (channels x NCCL_BUFFSIZE 4 MiB)


def terms(row: Mapping, measured: Mapping, replicas: int, convolutions: bool) -> list[dict]:
    """What the GPU machine holds at the device's peak beyond the emulated replay, each with its
    assumption: (name, bytes, assumption)."""
    ratio = measured["peak_allocated"] / measured["peak_requested"] if measured["peak_requested"] else 1.0
    out = [{"term": "tensors at the peak, received ones copied", "bytes": row["gpu_machine"],
            "assumption": "the executed graphs replayed in the order they ran, each received tensor a copy in "
                          "this GPU's memory (logical CPU devices share it)"},
           {"term": "allocator rounding", "bytes": int(row["gpu_machine"] * (ratio - 1)),
            "assumption": f"the same ratio of allocated to requested bytes as measured here ({ratio:.2f}): "
                          "the GPU's allocator is the same BFC allocator"}]
    if replicas > 1:
        out.append({"term": "NCCL buffers", "bytes": NCCL,
                    "assumption": "NCCL's own buffers for the all-reduce (its channels x NCCL_BUFFSIZE, 4 MiB), "
                                  "outside TensorFlow's allocator"})
    if convolutions:
        out.append({"term": "cuDNN workspace", "bytes": 0,
                    "assumption": "not counted: cuDNN picks its convolution algorithms (and their workspace, "
                                  "capped by TF_CUDNN_WORKSPACE_LIMIT_IN_MB) on the GPU itself"})
    return out


def verdicts(memory: Mapping, gpu_memory: int, convolutions: bool = False) -> dict[str, dict]:
    """Per device: fits / borderline / does not fit, the margin, the terms and the largest contributors."""
    predicted = (memory.get("predicted") or {}).get("devices") or {}
    replicas = (memory.get("predicted") or {}).get("replicas") or 1
    usable = gpu_memory - CONTEXT
    out = {}
    for d, row in predicted.items():
        if is_host(d):
            continue  # the host: its memory is not the GPU's
        measured = memory["devices"][d]
        parts = terms(row, measured, replicas, convolutions)
        need = sum(t["bytes"] for t in parts)
        ratio = need / usable
        verdict = "fits" if ratio <= 1 - BAND else "borderline" if ratio <= 1 + BAND else "does not fit"
        out[d] = {"verdict": verdict, "needs": need, "usable": usable, "margin": usable - need,
                  "terms": parts, "largest": [{"op": a["op"], "bytes": a["requested"], "kind": a["kind"]}
                                              for a in measured["at_peak"][:3]]}
    return out


def with_fit(memory: dict, partitions: list = ()) -> dict:
    """memory with its `fit` section when a device size was given (PINPOINT_GPU_MEMORY)."""
    import os

    size = os.environ.get(GPU_MEMORY_ENV)
    if not size or not (memory.get("predicted") or {}).get("devices"):
        return memory
    conv = any("Conv" in n.op for g in partitions for n in g.node)
    return memory | {"fit": {"gpu_memory": int(size), "context": CONTEXT,
                             "context_assumption": "the CUDA context and the cuBLAS/cuDNN handles take about 512 MiB "
                                                   "of each GPU before TensorFlow allocates anything",
                             "band": BAND, "devices": verdicts(memory, int(size), conv)}}
