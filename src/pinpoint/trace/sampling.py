"""When the eager-op callback is on: the sampling state machine.

TensorFlow's op-callback mechanism alone costs an eager op more than the microsecond counting
it may cost (issue 34), so once the program's eager ops (and tf.function calls) have produced
no new signature for `quiet_ops` callbacks in a row, the callback is switched off: later eager
ops run on TensorFlow's fast path. It is switched on again for a sampling window (which ends the
same way, or after EAGER_WINDOW_S with nothing new, whichever comes first) at the first call of
each new tf.function (a new phase: evaluation, prediction) and when 1, 2, 4 ... 16 s have passed,
looked at on the program's own thread (its tf.function calls, `pinpoint.log` calls and Keras batch
logs): no timer thread, since a thread merely waiting slows every tf.function call of the program
by ~10% (measured).
"""

from __future__ import annotations

import time

# Op callbacks in a row that bring no new eager signature, after which the callback is switched off.
EAGER_QUIET_OPS = 1000
# The first wait before a sampling window, doubled after each up to the last.
EAGER_RESAMPLE_S = (1.0, 16.0)
# A sampling window with nothing new also ends after this long: a training loop runs an eager op
# or two a step, so EAGER_QUIET_OPS of them span as many steps (about a second of a small model's
# steps, on the slow path); 50 ms every 16 s keeps the windows' share of a program's time under 0.5%.
EAGER_WINDOW_S = 0.05


class Sampler:
    """Switches an op callback (tfcompat.patches.OpCallback) off after `quiet_ops` callbacks with
    nothing new, and on again for a window when one is due. `record` is the EagerRecord whose
    `stopped`, `quiet` and `windows` say what was counted."""

    def __init__(self, record, quiet_ops: int = EAGER_QUIET_OPS) -> None:
        self.record = record
        self.quiet_ops = quiet_ops
        self.callback = None  # tfcompat.patches.OpCallback, set by `watch`
        self._since_new = 0  # op callbacks since the last new eager signature
        self._next_window = float("inf")  # monotonic time the next sampling window is due
        self._delay: float | None = None  # the wait before it (doubled after each window)
        # Monotonic time a window with nothing new ends (inf: not in one; None: in one whose clock
        # starts at its next callback).
        self._window_until: float | None = float("inf")

    def watch(self, callback) -> None:
        """The op callback this machine switches (it is on when given)."""
        self.callback = callback

    def new(self) -> None:
        """A callback brought a new signature: the quiet count (and a window's time) starts again."""
        self._since_new = 0
        if self._window_until != float("inf"):
            self._window_until = time.monotonic() + EAGER_WINDOW_S

    def nothing_new(self) -> None:
        """A callback brought nothing new: after `quiet_ops` in a row (in a sampling window, or
        EAGER_WINDOW_S), the callback goes off."""
        self._since_new += 1
        now = time.monotonic()
        if self._window_until is None:
            self._window_until = now + EAGER_WINDOW_S
        if self._since_new >= self.quiet_ops or now >= self._window_until:
            self._stop()

    def _stop(self) -> None:
        """Switch the op callback off (called from the callback, on the thread that added it)."""
        if not self.callback.armed:
            return
        e = self.record
        if e.stopped is None:
            e.stopped, e.quiet = e.total, self.quiet_ops
        self.callback.off()
        self._window_until = float("inf")
        first, longest = EAGER_RESAMPLE_S
        self._delay = first if self._delay is None else min(self._delay * 2, longest)
        self._next_window = time.monotonic() + self._delay

    def resample(self) -> None:
        """Switch the op callback on for a sampling window (any thread; a no-op while it is on)."""
        if self.callback is None or self.callback.armed or self.record.stopped is None:
            return
        self._since_new = 0  # the callback is off: nothing else writes it now
        # The window's time starts at its first callback: a new function's first call (tracing,
        # graph optimization, slow on a busy machine) ends before its callback, and would otherwise
        # use up the window before the phase's first eager op.
        self._window_until = None
        self.record.windows += 1
        self.callback.on()

    def sample_if_due(self) -> None:
        """Switch the op callback on for a window if the next one is due (the program's thread)."""
        if time.monotonic() >= self._next_window:
            self._next_window = float("inf")  # set again when this window ends
            self.resample()
