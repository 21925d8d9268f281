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


def rounding(memory: Mapping, replicas: int) -> dict[str, float]:
    """Device -> the ratio of allocated to requested bytes at its measured peak, the replicas' the
    highest measured among them (memory.batch.replicas_alike)."""
    from pinpoint.placement.memory.batch import replicas_alike

    return replicas_alike({d: (m["peak_allocated"] / m["peak_requested"] if m.get("peak_requested") else 1.0)
                           for d, m in (memory.get("devices") or {}).items() if d.startswith("/")}, replicas)


def terms(replayed: int, ratio: float, replicas: int, convolutions: bool, held: int = 0) -> list[dict]:
    """What the GPU machine holds at the device's peak beyond the emulated replay, each with its
    assumption: (name, bytes, assumption); `replayed`: the replay's peak with received tensors
    copied, `ratio`: the allocator's rounding (`rounding`), each the highest among the replicas."""
    how = "as measured here" if replicas <= 1 else "the highest measured on a replica here"
    which = "this GPU's memory" if replicas <= 1 else "a replica GPU's memory, the highest among the replicas"
    out = [{"term": "variables and optimizer slots", "bytes": held,
            "assumption": "held before the step on this device, as placed in this run (a mirrored variable on "
                          "each replica)"},
           {"term": "tensors at the peak, received ones copied", "bytes": replayed,
            "assumption": "the executed graphs replayed in the order they ran, each received tensor a copy in "
                          f"{which} (logical CPU devices share it)"},
           {"term": "allocator rounding", "bytes": int(replayed * (ratio - 1)),
            "assumption": f"the same ratio of allocated to requested bytes, {how} ({ratio:.2f}): "
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


def verdicts(memory: Mapping, gpu_memory: int, convolutions: bool = False,
             held: Mapping[str, int] | None = None) -> dict[str, dict]:
    """Per device: fits / borderline / does not fit, the margin, the terms, the largest contributors
    and, when the step's batch is known, the largest batch that fits (memory_batch)."""
    from pinpoint.placement.memory.batch import replicas_alike

    predicted = (memory.get("predicted") or {}).get("devices") or {}
    replicas = (memory.get("predicted") or {}).get("replicas") or 1
    usable = gpu_memory - CONTEXT
    ratios = rounding(memory, replicas)
    largest = _largest_batches(memory, usable, replicas, held or {}, ratios)
    replayed = replicas_alike({d: row["gpu_machine"] for d, row in predicted.items()}, replicas)
    out = {}
    for d in predicted:
        if is_host(d):
            continue  # the host: its memory is not the GPU's
        measured = memory["devices"][d]
        parts = terms(replayed[d], ratios.get(d, 1.0), replicas, convolutions, (held or {}).get(d, 0))
        need = sum(t["bytes"] for t in parts)
        ratio = need / usable
        verdict = "fits" if ratio <= 1 - BAND else "borderline" if ratio <= 1 + BAND else "does not fit"
        out[d] = {"verdict": verdict, "needs": need, "usable": usable, "margin": usable - need,
                  "terms": parts, "largest": [{"op": a["op"], "bytes": a["requested"], "kind": a["kind"]}
                                              for a in measured["at_peak"][:3]]}
        if d in largest:
            out[d]["largest_batch"] = largest[d]
    return out


def _largest_batches(memory: Mapping, usable: int, replicas: int, held: Mapping[str, int],
                     ratios: Mapping[str, float]) -> dict[str, int]:
    """Per device: the largest batch whose need (the same terms) is within the fits threshold."""
    from pinpoint.placement.memory.batch import highest_peaks, largest_batch
    from pinpoint.placement.memory.overlap import variants
    from pinpoint.placement.memory.replay import Replay

    raw = (memory.get("predicted") or {}).get("replay")
    if not raw or not raw.get("batch"):
        return {}
    replay = Replay.from_json(raw)
    others, _ = variants(replay)
    cache: dict[int, dict[str, int]] = {}

    def gpu(b: int) -> dict[str, int]:
        if b not in cache:
            cache[b] = highest_peaks(replay, others, b, copies=True)
        return cache[b]

    out = {}
    for d, m in memory["devices"].items():
        if not d.startswith("/") or is_host(d) or not m.get("peak_requested"):
            continue
        extra, ratio = held.get(d, 0) + (NCCL if replicas > 1 else 0), ratios.get(d, 1.0)
        out[d] = largest_batch(lambda b, d=d, r=ratio, x=extra: x + round(gpu(b).get(d, 0) * r),
                               int(usable * (1 - BAND)))
    return out


def held_bytes(variables) -> dict[str, int]:
    """Device -> bytes of the variables (and slots) on it: each variable's bytes on each device holding a copy."""
    out: dict[str, int] = {}
    for v in variables or ():
        for d in v.get("devices") or ():
            out[d] = out.get(d, 0) + (v.get("bytes") or 0)
    return out


def with_fit(memory: dict | None, variables=()) -> dict | None:
    """memory with its `fit` section when a device size was given (PINPOINT_GPU_MEMORY); `variables`:
    placement.json's, whose bytes each device holds before the step."""
    import os

    size = os.environ.get(GPU_MEMORY_ENV)
    if not memory or not size or not (memory.get("predicted") or {}).get("devices"):
        return memory
    nodes = ((memory.get("predicted") or {}).get("replay") or {}).get("nodes") or ()
    conv = any("Conv" in n[1] for n in nodes)
    held = held_bytes(variables)
    return memory | {"fit": {"gpu_memory": int(size), "context": CONTEXT,
                             "context_assumption": "the CUDA context and the cuBLAS/cuDNN handles take about 512 MiB "
                                                   "of each GPU before TensorFlow allocates anything",
                             "band": BAND, "devices": verdicts(memory, int(size), conv, held)}}
