"""Record what an unchanged program executed: its tf.functions, eager ops and Session.run calls.

The Recorder puts together one module per concern and installs their hooks:

- tfcompat.counting: every tf.function call counted inside TensorFlow's own call path (a function not
  known yet goes through the replacement of `AtomicFunction.call_flat`, trace.functions);
- trace.functions: each function's record, its name, and its first call captured (partition
  graphs, shapes; with --memory, the memory of its calls 2 to 4);
- trace.eager: the op callback that records eager ops (devices, copies, requests not met,
  variable updates), and trace.sampling: when that callback is on (off after a quiet window,
  on again for sampling windows). Every op up to `EagerRecord.stopped` is counted; after that
  the counts are those of the windows, and the report says so;
- trace.sessionrun: tf.compat.v1 `Session.run` capture;
- trace.variables: the variables behind the captured functions and the eager updates, found by
  their handles (a scan of the live objects) and kept alive until the program ends;
- trace.shapes: static and run-time output shapes.
"""

from __future__ import annotations

import contextlib

from pinpoint.tfcompat.counting import counting_hooks
from pinpoint.tfcompat.patches import Patches
from pinpoint.trace.eager import EagerOps, EagerRecord
from pinpoint.trace.functions import FunctionCalls, FunctionRecord, error_line, keras_role, python_name
from pinpoint.trace.sampling import EAGER_QUIET_OPS, Sampler
from pinpoint.trace.sessionrun import SessionRuns
from pinpoint.trace.variables import VariableFinder

__all__ = ["EAGER_QUIET_OPS", "FunctionRecord", "Recorder", "error_line", "keras_role", "python_name"]


class Recorder:
    """Install with `install()`, read the records, `uninstall()` when the program ended."""

    def __init__(self, default_device: str = "", graph_placement=None, quiet_ops: int = EAGER_QUIET_OPS,
                 request_of=None):
        # The emulated /GPU:0 scope the program runs in (its requests are not the program's).
        self.default_device = default_device
        # distribute.emulation.GpuPlacement under emulation: a tf.compat.v1 graph's unrequested
        # ops are placed as on a GPU machine before its first Session.run.
        self.graph_placement = graph_placement
        self.functions: dict[str, FunctionRecord] = {}
        self.eager = EagerRecord()
        self.finder = VariableFinder()
        self.sampler = Sampler(self.eager, quiet_ops)
        # request_of: trace.gpus.GpuNames.eager_request under emulation
        self.eager_ops = EagerOps(self.eager, self.finder, self.sampler, default_device, request_of)
        self.calls = FunctionCalls(self.functions, self._on_new_function, self.eager_ops, self.finder,
                                   real_gpus=graph_placement is None)
        self.sessions = SessionRuns(self.functions, self.finder, graph_placement)
        self._patches = Patches()
        self.active = False

    def _on_new_function(self) -> None:
        """A new function: a new phase (its eager ops are sampled), and perhaps a model built to
        replace one (the variables the program dropped are let go)."""
        self.sampler.resample()
        self.finder.release_dropped()

    def watch(self, created: list) -> None:
        """trace.created's records: a variable among them the program drops is let go."""
        self.finder.watch(created)

    @property
    def quiet_ops(self) -> int:
        return self.sampler.quiet_ops

    def install(self) -> Recorder:
        call_flat, slow = Patches.current("AtomicFunction.call_flat"), self.calls.call

        def recorded_call_flat(fn, *args):  # a function not known yet (a known one's calls skip it)
            return slow(call_flat, fn, args)

        interpolate, in_graph = counting_hooks(Patches.current("InterpolateRuntimeError"),
                                               Patches.current("make_call_op_in_graph"), self.sampler.sample_if_due)
        self._patches.replace("InterpolateRuntimeError", interpolate)
        self._patches.replace("make_call_op_in_graph", in_graph)
        self._patches.replace("AtomicFunction.call_flat", recorded_call_flat)
        # Closed first (undone last-in first-out): the known functions as they were.
        self._patches.callback(self.calls.forget_all)
        run, sessions, rec = Patches.current("BaseSession.run"), self.sessions, self

        def recorded_run(sess, fetches, feed_dict=None, options=None, run_metadata=None):
            if not rec.active or options is not None or run_metadata is not None:
                return run(sess, fetches, feed_dict, options, run_metadata)
            return sessions.run(run, sess, fetches, feed_dict)

        self._patches.replace("BaseSession.run", recorded_run)
        self.sampler.watch(self._patches.op_callback(self.eager_ops.on_op, reads=self.eager_ops.on_fast_reads))
        self._set_active(True)
        return self

    def _set_active(self, on: bool) -> None:
        self.active = self.calls.active = self.eager_ops.active = on

    def flush_calls(self) -> None:
        """Add the calls counted inside TensorFlow's call path to their records."""
        self.calls.flush()

    def uninstall(self) -> None:
        """Undo what `install` did (also a part-way install), newest first."""
        self._set_active(False)
        self.flush_calls()
        self._patches.close()

    @contextlib.contextmanager
    def quiet(self):
        """Eager ops Pinpoint runs itself on this thread (reading a Keras parameter) are not recorded."""
        before = self.eager_ops.quiet_on(True)
        try:
            yield
        finally:
            self.eager_ops.quiet_on(before)

    def sample_if_due(self) -> None:
        """Switch the op callback on for a sampling window if one is due (the program's thread)."""
        self.sampler.sample_if_due()

    def settle(self, created: list) -> None:
        """At the program's end, while its objects live: the eager-updated handles still unmatched
        and the variables the program created and still holds (trace.created's records)."""
        self.finder.settle(created)

    def variables(self) -> list:
        """The variables the captured functions used, and those the eager ops updated (not a
        tf.train.Checkpoint's own save counter)."""
        return self.finder.variables()
