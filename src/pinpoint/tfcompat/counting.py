"""Call counting for `pinpoint trace`: every tf.function call, counted inside TensorFlow's own call path.

A function's first calls go through the replacement of `AtomicFunction.call_flat` (the slow path,
trace.functions.FunctionCalls: its capture, its measured calls; trace.recorder installs both). Then the function is known: its
own `call_flat` attribute becomes TensorFlow's, bound to it, so its calls skip the replacement,
and they are counted where TensorFlow's call_flat already runs Python of its own for each call:
it makes an `InterpolateRuntimeError(self)` around the call, and the replacement of that class (a
subclass) adds one to the function's counter. A call made while another function traces
(`make_call_op_in_graph`: a node added to a graph, not a call that runs) takes it back.

Why not a wrapper: a frame of Pinpoint's around each call cost ~0.2 µs in a tight loop, ~2 µs
where a call ran ~200 µs of TensorFlow's (cold caches); the counter adds no frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A known function's calls between two looks at the clock (is a sampling window due?): a power
# of two, tested with a mask.
WINDOW_CHECK_CALLS = 64

# The instance attribute a known function's calls are counted in: [calls not yet in its record].
COUNTER = "_pinpoint_calls"


def counting_hooks(interpolate: type, in_graph: Callable, sample_if_due: Callable[[], None]
                   ) -> tuple[type, Callable]:
    """(the replacement of InterpolateRuntimeError, of make_call_op_in_graph): a known function's
    call adds one to its COUNTER, a call while another function traces takes it back;
    `sample_if_due()` is asked every WINDOW_CHECK_CALLS calls of a function."""
    mask = WINDOW_CHECK_CALLS - 1

    class CountingInterpolateRuntimeError(interpolate):
        def __init__(self, top_level_func):
            self._func = top_level_func  # TensorFlow's __init__ (pinned by tfcompat's signature check)
            counter = top_level_func.__dict__.get(COUNTER)
            if counter is not None:
                n = counter[0] = counter[0] + 1
                if not n & mask:
                    sample_if_due()

    def counted_in_graph(atomic, *args: Any, **kwargs: Any):
        counter = atomic.__dict__.get(COUNTER)
        if counter is not None:
            counter[0] -= 1  # a node in a graph being traced, not a call
        return in_graph(atomic, *args, **kwargs)

    return CountingInterpolateRuntimeError, counted_in_graph


def know(fn, call_flat: Callable) -> None:
    """From now on `fn`'s calls skip the replacement of call_flat (TensorFlow's own, bound to it)
    and are counted in its COUNTER."""
    setattr(fn, COUNTER, [0])
    fn.call_flat = call_flat.__get__(fn)


def take_count(fn) -> int:
    """The calls counted in `fn`'s COUNTER since the last take."""
    counter = fn.__dict__.get(COUNTER)
    if counter is None:
        return 0
    n, counter[0] = counter[0], 0
    return n


def forget(fn) -> None:
    """Undo `know` (the trace ends)."""
    for name in ("call_flat", COUNTER):
        fn.__dict__.pop(name, None)
