"""A run's placement capture: which trainer call stops where and is captured or profiled
(`CapturePlan`), and placement.json's content from what was captured."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinpoint.config import Config
from pinpoint.errors import first_line
from pinpoint.runfolder import PROFILE

# train_log.jsonl (and the step metrics) hold this step, then every train.log_every steps: a run
# that starts from step 0 runs its first step as a call of its own, so its record's `time` is
# when the first training step completed (tracing included), not when step log_every did.
FIRST_LOGGED_STEP = 1

# What the next trainer call does (CapturePlan.next_call).
TRAIN, CAPTURE_STEP, CAPTURE_STEPS, PROFILED = "train", "capture_step", "capture_steps", "profiled"


def _next_stop(step: int, total: int, every: tuple[int, ...], capture_at: int | None) -> int:
    stops = [total]
    for e in every:
        if e > 0:
            stops.append((step // e + 1) * e)
    if capture_at is not None and capture_at > step:
        stops.append(capture_at)
    return min(stops)


@dataclass
class CapturePlan:
    """When the next trainer call stops, and whether it is captured or profiled.

    Single-client strategies: the first call of the multi-step function is run with graph
    collection on (it instantiates the function anyway; every later step runs the same graphs),
    and the graphs are reported for the sampled steps capture_at.. once they ran.
    parameter_server: one sampled step is run from the coordinator (capture_ps_step).
    placement.timing: the sampled steps capture_at.. run as their own call (a later one than the
    first: no tracing in it) under TensorFlow's profiler (see placement.timing).
    """

    capture_at: int | None
    sample_steps: int
    loop_capture: bool  # graphs collected by the first call (not parameter_server)
    timing_pending: bool  # the profiled call is still to come
    timing: bool
    memory: bool = False
    captures: list = field(default_factory=list)
    loop_captured: Any = None
    timed: dict | None = None

    @classmethod
    def for_run(cls, cfg: Config, start: int, coordinator) -> CapturePlan:
        pc = cfg.placement
        loop_capture = pc.enabled and coordinator is None
        return cls(capture_at=start + pc.warmup_steps if pc.enabled else None, sample_steps=pc.sample_steps,
                   loop_capture=loop_capture, timing_pending=loop_capture and (pc.timing or pc.memory),
                   timing=pc.timing, memory=pc.memory)

    def next_call(self, step: int, calls: int, total: int, every: tuple[int, ...]) -> tuple[str, int]:
        """(what the call does, how many steps it takes) for a trainer at `step` after `calls` calls."""
        if (not self.loop_capture and self.capture_at is not None and step == self.capture_at
                and len(self.captures) < self.sample_steps):
            return CAPTURE_STEP, 1
        ps_stop = self.capture_at if not self.loop_capture or self.timing_pending else None
        stop = _next_stop(step, total, every, ps_stop)
        if step == 0:
            # The run's first step is a call of its own and is logged (FIRST_LOGGED_STEP):
            # train_log.jsonl then says when training really started (after the tracing).
            stop = FIRST_LOGGED_STEP
        profiled = self.timing_pending and calls > 0 and step >= self.capture_at
        if profiled:
            stop = min(stop, step + self.sample_steps)
        if self.loop_capture and calls == 0:
            return CAPTURE_STEPS, stop - step
        return (PROFILED if profiled else TRAIN), stop - step

    def add_capture(self, captured) -> None:
        self.captures.append(captured)
        self.capture_at += 1

    def add_profile(self, timed: dict) -> None:
        self.timed = timed
        self.timing_pending = False

    def sampled(self, last_step: int) -> list:
        """The captures for the sampled steps that ran (the loop capture cut to them)."""
        if self.loop_captured is not None and last_step > self.capture_at:
            from pinpoint.placement import per_step_view

            self.loop_captured.steps = list(range(self.capture_at, min(self.capture_at + self.sample_steps, last_step)))
            return [per_step_view(self.loop_captured)]
        return self.captures


@contextlib.contextmanager
def clean_refusal(trainer):
    """The placement scope's own one-line error (soft placement off, an op with no GPU kernel
    pinned to an emulated GPU), not the tracer's multi-line rewrite of it."""
    try:
        yield
    except Exception:
        refusal = getattr(trainer.trace_scope, "refusal", None)
        if refusal is not None:
            raise refusal from None
        raise


def capture_first_call(trainer, n: int):
    """Run n steps as the training function's FIRST call, with graph collection on; return
    (captured, metrics). The runtime records partition graphs when it instantiates a function,
    which this call does anyway: the capture costs no extra trace and no extra step, and the
    graphs are those of every step the function runs (fixed signature)."""
    from pinpoint.placement import add_trace_info, collecting

    if trainer.coordinator is not None or trainer.calls:
        raise RuntimeError("capture_first_call must be the first call of a single-client trainer")
    t0 = time.perf_counter()
    args = trainer.call_args(n)
    with collecting(trainer.step) as captured:
        loss, acc = trainer.train_n(*args)
    add_trace_info(trainer.train_n, args, {}, captured)
    return captured, trainer.finish_call(loss, acc, n, t0)


# The device parameter_server's scheduled closures run on: a captured step is placed there.
PS_WORKER = "/job:worker/replica:0/task:0"


def capture_ps_step(trainer):
    """parameter_server: one real step run from the coordinator with graph collection on.

    A closure scheduled by the ClusterCoordinator is instantiated by the worker's own runtime,
    so the coordinator never sees its partition graphs. Running one real step from here with its
    ops placed on worker 0 lets this runtime place and partition it: compute shows on the worker,
    variables and their updates on the ps tasks. Returns (captured, metrics)."""
    import tensorflow as tf

    from pinpoint.placement import capture_on_device

    per_replica = trainer.pipeline.per_replica
    t0 = time.perf_counter()
    (loss, correct), captured = capture_on_device(
        trainer.ps_batch_step, PS_WORKER, tf.constant(trainer.step, tf.int64), step=trainer.step)
    calls = trainer.calls
    metrics = trainer.finish_call(loss, float(correct) / per_replica, 1, t0, examples_per_step=per_replica)
    trainer.calls = calls  # a captured step is not one of the scheduled calls
    return captured, metrics


def profiled_steps(trainer, n: int, out_dir: Path, ctx, memory: bool = False) -> tuple[dict, dict]:
    """Run n steps under TensorFlow's profiler, the trace in the run folder's profile/ folder:
    one call per step, each under a step marker (as Keras marks its steps), so TensorBoard's
    profile overview, step-time graph and trace viewer show the steps (and, with `memory`, its
    memory profile: the allocator's events are in the trace)."""
    from pinpoint.placement import gpu_peaks, profile_call, read_peak, reset_memory_peak, step_marker

    rel = PROFILE if not ctx.multi_worker else f"{PROFILE}/{ctx.role}-{ctx.index}"
    first = trainer.step

    def marked_steps() -> dict:
        if memory:
            reset_memory_peak()  # inside the trace: the allocator's peak and the events cover one window
        calls = []
        for step in range(first, first + n):
            with step_marker(step):
                calls.append(trainer.train_steps(1))
        if memory:
            peak[0], gpus[0] = read_peak(), gpu_peaks()
        mean = {k: sum(c[k] for c in calls) / n for k in calls[0] if k != "examples_per_sec"}
        return dict(mean, examples_per_sec=trainer.global_batch / mean["step_time"])

    peak: list[int | None] = [None]
    gpus: list[dict | None] = [None]
    m, xplane, why = profile_call(marked_steps, out_dir / rel)
    return m, {"steps": list(range(first, first + n)), "xplane": xplane, "why": why, "trace": rel,
               "memory_peak": peak[0], "gpu_peaks": gpus[0]}


def memory_section(ctx, loop_captured, timed: dict | None, out_dir: Path, serving: tuple[str, ...] = ()) -> dict:
    """placement.json's `memory` section from the profiled call's allocator events (placement.memory);
    parameter_server: the `serving` tasks' own figures (placement.memory.tasks)."""
    from pinpoint.device_names import DeviceMap
    from pinpoint.placement import (
        memory_events,
        memory_section,
        memory_traced,
        peak_read_ps,
        read_xspace,
        serving_tasks_memory,
    )

    if loop_captured is None:
        return serving_tasks_memory(
            out_dir, list(serving),
            "parameter_server's steps run as closures in the workers' runtimes, out of the coordinator's "
            "allocator, and a task of a multi-process cluster runs no profiler; each serving task's allocator "
            "totals, every device of the task together")
    if timed is None:
        return {"why_not": "not measured: training ended before the sampled steps ran as their own call"}
    if timed["xplane"] is None:
        # The allocator's peak was still read over the same steps (no profiler needed): this
        # process's total, every device together.
        peak = timed.get("memory_peak")
        return {"why_not": f"not measured per device: {timed['why']}",
                **({"task_peak": peak, "steps": timed["steps"]} if peak is not None else {})}
    xspace = read_xspace(timed["xplane"])
    events = memory_events(xspace)
    why = memory_traced(events, timed.get("memory_peak"))
    if not events:
        return {"why_not": why}
    out = memory_section(loop_captured.partition_graphs, xspace, events, DeviceMap.of(ctx.device_map),
                         peak=timed.get("memory_peak"), read_ps=peak_read_ps(xspace), gpus=timed.get("gpu_peaks"))
    return out | {"steps": timed["steps"], "trace": timed["trace"]}


def timing_section(ctx, loop_captured, timed: dict | None) -> dict:
    """placement.json's `timing` section from the profiled call's trace (see placement.timing)."""
    from pinpoint.device_names import DeviceMap
    from pinpoint.placement import display_names, not_measured, timing_from_trace

    if loop_captured is None:
        return not_measured("not measured under parameter_server: its steps run as closures in the "
                            "workers' runtimes, out of this process's profiler")
    if timed is None:
        return not_measured("not measured: training ended before the sampled steps ran as their own call")
    if timed["xplane"] is None:
        return dict(not_measured(f"not measured: {timed['why']}"), steps=timed["steps"])
    try:
        timing = timing_from_trace(timed["xplane"], loop_captured.partition_graphs, DeviceMap.of(ctx.device_map),
                                   display=display_names(loop_captured), steps=timed["steps"])
    except Exception as err:  # noqa: BLE001 - an unreadable trace must not fail a finished run
        return dict(not_measured(f"not measured: the trace could not be read ({type(err).__name__}: {first_line(err)})"),
                    steps=timed["steps"], trace=timed["trace"])
    timing["trace"] = timed["trace"]
    return timing


def placement_report(cfg: Config, ctx, trainer, captures, *, timing: dict | None = None,
                     memory: dict | None = None) -> dict:
    """placement.json's content from the captured steps and the timing and memory of the profiled call."""
    from pinpoint.placement import PlacementInputs, build
    from pinpoint.training.loop.models import layer_pins, layer_units

    describe = getattr(trainer.pipeline, "describe", None)
    return build(PlacementInputs(
        captures=tuple(captures), variables=tuple(trainer.variables()), plan=cfg.train.pinning,
        strategy=cfg.train.strategy, device_map=ctx.device_map, task=ctx.task, gradient_scope="gradients",
        optimizer_variables=tuple(trainer.optimizer.variables), layer_pins=layer_pins(trainer.model),
        layer_units=layer_units(trainer.model),
        timing=timing, memory=memory, precision_policy=cfg.train.precision, device_map_json=ctx.device_map.to_json(),
        # A tf.data pipeline: its ops run inside the iterator, on its device.
        input_pipeline={**describe(), "device": ctx.device_map.spec(trainer.pipeline.device)} if describe is not None else None,
    )).to_json()
