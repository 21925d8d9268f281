"""Placement: where every op, variable, transfer and byte of a run went, as TensorFlow ran it.

This is the face of placement/: the rest of Pinpoint, and a user's code, import these names from
`pinpoint.placement`, never from a room (tests/test_architecture.py holds it for Pinpoint). The rooms, lowest first:

- `graphs`: TensorFlow's executed graphs as data, and `graphs.ops`, the one op vocabulary;
- `profile`: the profiler's trace read back (kernel events, allocator events);
- `model`: placement.json as types;
- `memory`: memory per device, measured, replayed and predicted;
- `analysis`: the sections of placement.json, built from the rooms below;
- `capture`: the only room that drives TensorFlow's runtime around a call (graph collection, the
  profiler, the allocator's peak); the others read what it left (graphs, traces, dtypes);
- `report`: report.html, the summary, the charts and the metrics.

A name is imported from its room on first use (a lazy face: `pinpoint report` does not import
what `capture` needs, and no room is loaded because another is).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the room's module that defines it
_WHERE = {
    # analysis.build
    "build": "analysis.build",
    # analysis.conformance
    "gradient_re": "analysis.conformance",
    "layer_re": "analysis.conformance",
    # analysis.inputs
    "PlacementInputs": "analysis.inputs",
    "TraceInputs": "analysis.inputs",
    # analysis.merge
    "merge_placements": "analysis.merge",
    # analysis.timing
    "not_measured": "analysis.timing",
    "timing_from_trace": "analysis.timing",
    # analysis.transfers
    "step_transfers": "analysis.transfers",
    # analysis.units
    "model_units": "analysis.units",
    "program_units": "analysis.units",
    # analysis.variables
    "INTERNAL": "analysis.variables",
    "classify": "analysis.variables",
    "components": "analysis.variables",
    "unwrap": "analysis.variables",
    "variable_kind": "analysis.variables",
    # capture.allocator
    "gpu_peaks": "capture.allocator",
    "read_peak": "capture.allocator",
    "reset_memory_peak": "capture.allocator",
    # capture.graphs
    "add_branch_shapes": "capture.graphs",
    "add_trace_info": "capture.graphs",
    "capture_on_device": "capture.graphs",
    "capture_call": "capture.graphs",
    "collecting": "capture.graphs",
    "map_arg_values": "capture.graphs",
    "run_profiled": "capture.graphs",
    "size_from_inference": "capture.graphs",
    "size_iterator_outputs": "capture.graphs",
    # capture.profiler
    "profile_call": "capture.profiler",
    "step_marker": "capture.profiler",
    # capture.tasks
    "start_reporting": "capture.tasks",
    # graphs.captured
    "add_function_graphs": "graphs.captured",
    "CapturedGraphs": "graphs.captured",
    "has_dynamic_dims": "graphs.captured",
    # graphs.dumps
    "dump_dir": "graphs.dumps",
    "dump_env": "graphs.dumps",
    "remote_partitions": "graphs.dumps",
    "tasks_of": "graphs.dumps",
    # graphs.ops
    "BOOKKEEPING": "graphs.ops",
    "CALLS": "graphs.ops",
    "COLLECTIVE_TRAFFIC_RE": "graphs.ops",
    "EMULATED_ATTR": "graphs.ops",
    "INPUT_RE": "graphs.ops",
    "INPUT_SOURCES": "graphs.ops",
    "ITERATOR_GET_NEXT": "graphs.ops",
    "NCCL_ALL_REDUCE": "graphs.ops",
    "NOT_COMPUTE": "graphs.ops",
    "PREFETCHED": "graphs.ops",
    "RECVS": "graphs.ops",
    "RING_COLLECTIVE_RE": "graphs.ops",
    "UPDATE_RE": "graphs.ops",
    # graphs.steps
    "display_names": "graphs.steps",
    "expand_xla": "graphs.steps",
    "per_step_view": "graphs.steps",
    # memory.fit
    "GPU_MEMORY_ENV": "memory.fit",
    # memory.replay
    "Replay": "memory.replay",
    # memory.section
    "memory_section": "memory.section",
    # memory.tasks
    "serving_tasks_memory": "memory.tasks",
    # model.files
    "load_placement": "model.files",
    "ops_path": "model.files",
    "read_placement": "model.files",
    "split_placement": "model.files",
    "write_placement": "model.files",
    # model.memory
    "Memory": "model.memory",
    # model.placement
    "as_placement": "model.placement",
    "Placement": "model.placement",
    # model.records
    "OpRow": "model.records",
    # model.schema
    "json_number": "model.schema",
    # model.sections
    "Rule": "model.sections",
    "Variable": "model.sections",
    "Violation": "model.sections",
    # profile.allocator
    "ALLOCATOR_ENV": "profile.allocator",
    "enabled": "profile.allocator",
    "memory_events": "profile.allocator",
    "memory_traced": "profile.allocator",
    "peak_read_ps": "profile.allocator",
    # profile.xspace
    "read_xspace": "profile.xspace",
    # report.html
    "CHARTS_DIR": "report.html",
    "write_report": "report.html",
    # report.metrics
    "headline_metrics": "report.metrics",
    "metrics_step": "report.metrics",
    # report.summary
    "format_summary": "report.summary",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pinpoint.placement' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
