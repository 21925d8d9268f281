"""TensorFlow's profiler around a call (`tf.profiler.experimental`): the XSpace trace it writes
(`<run>/profile/plugins/profile/<time>/<host>.xplane.pb`, which TensorBoard's profile plugin
opens) and the step markers xprof groups it by.

(`context.enable_run_metadata()` step stats would be cheaper to read, but TF 2.x records none for
a tf.function call: `step_stats.dev_stats` stays empty.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pinpoint.errors import first_line
from pinpoint.placement.profile.xspace import STEP_MARKER

# Why the profiler is not run in a task of a multi-process cluster (see profile_call).
CLUSTER_TASK = ("not run in a task of a multi-process TensorFlow cluster: TensorFlow's profiler "
                "crashes such a task when it stops about one time in five (a double free in its merge "
                "of events that began on one thread and ended on another; reproduced with plain "
                "TensorFlow 2.21 and MultiWorkerMirroredStrategy)")


def profile_call(fn: Callable[[], Any], logdir: Path) -> tuple[Any, Path | None, str | None]:
    """Run fn() under tf.profiler.experimental writing to logdir; return (result, the
    .xplane.pb it wrote or None, why not or None).

    Not in a task of a multi-process cluster (a coordination service is configured: multi-worker
    and parameter-server strategies set one up). There the profiler's stop aborts the process
    (SIGABRT "double free", SIGSEGV or SIGBUS; gdb: in SplitEventTracker::FindStartAndMerge under
    TraceMeRecorder::Consume, which pairs events begun on one thread with their end on another) in
    3 of 20 runs of a two-task MultiWorkerMirroredStrategy program with plain TensorFlow 2.21, also
    after a barrier that waits for both tasks to finish the profiled call; with placement.memory in
    Pinpoint's loop on a local chief + worker cluster, 4 of 6 runs (and 3 of 6 with host tracer level
    1, which still records the allocator's events) lost the worker to it. A lost training run is a
    worse price than an unmeasured figure, which the caller reports with this reason."""
    import tensorflow as tf

    from pinpoint.tfcompat.api import in_cluster_task

    if in_cluster_task():
        return fn(), None, CLUSTER_TASK
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.glob("plugins/profile/*/*.xplane.pb"))
    try:
        # Default options: host tracer level 2 (every kernel), device tracer on, Python tracer off.
        # (Passing ProfilerOptions makes TF 2.21 log "... expects an i value" per option.)
        tf.profiler.experimental.start(str(logdir))
    except Exception as err:  # noqa: BLE001 - e.g. a profiler session the user's code started
        return fn(), None, f"the profiler did not start ({_first_line(err)})"
    try:
        result = fn()
    finally:
        try:
            tf.profiler.experimental.stop()
        except Exception:  # noqa: BLE001, S110 - the call's own error (if any) is the one to raise
            pass
    new = sorted(set(logdir.glob("plugins/profile/*/*.xplane.pb")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        return result, None, f"the profiler wrote no .xplane.pb under {logdir}"
    return result, new[-1], None


def step_marker(step: int):
    """The profiler's step marker around one training step, as Keras writes it (a TraceMe named
    'train' with step_num and _r=1): TensorBoard's profile plugin (xprof) groups the trace into
    steps by it; without it the overview says 'No step marker observed'."""
    import tensorflow as tf

    return tf.profiler.experimental.Trace(STEP_MARKER, step_num=int(step), _r=1)


def _first_line(err: BaseException) -> str:
    return first_line(err) or type(err).__name__
