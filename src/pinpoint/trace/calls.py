"""Call counting: the wrapper of `AtomicFunction.call_flat` every tf.function call goes through.

A known function's call (its first call captured) pays one identity test and a counter: a
program calls its training function over and over, and the function called last and its calls
not yet added to its record live in this closure. Issue 34: <= 2 µs a call; a dict lookup by id
and the eager context's pybind property each cost ~1 µs here on a real call (cold caches after
TensorFlow's ~200 µs of work), ~0.1 µs in a tight loop. Every other call (a function's first,
a call while another function traces) goes to the slow path, trace.functions.FunctionCalls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pinpoint.tfcompat.api import eager_state, eager_tensor_type

# A known tf.function's calls between two looks at the clock (is a sampling window due?).
WINDOW_CHECK_CALLS = 64


def counting_wrapper(call_flat: Callable, known: dict, slow: Callable, sample_if_due: Callable[[], None]
                     ) -> tuple[Callable, Callable[[], None]]:
    """(the replacement of call_flat, flush): `known` maps id(AtomicFunction) to its record (a
    FunctionRecord: `calls`, `check_at`); `slow(call_flat, fn, args)` handles any other call;
    `sample_if_due()` is asked every WINDOW_CHECK_CALLS calls; `flush()` adds the calls the
    wrapper still holds to their record."""
    known_get = known.get
    # The eager context's per-thread state (False on a thread while a tf.function traces).
    state = eager_state()
    eager_tensor = eager_tensor_type()
    last_fn = last_r = None
    pending = 0
    check_calls = WINDOW_CHECK_CALLS  # a closure cell: no module-global lookup per call

    def flush() -> None:
        nonlocal pending
        if last_r is not None and pending:
            last_r.calls += pending
            pending = 0

    def recorded_call_flat(fn, *args: Any):
        nonlocal last_fn, last_r, pending
        # Called eagerly: its arguments are EagerTensors (symbolic while another function
        # traces a call to it, which is not a call that runs).
        if fn is last_fn and args and type(args[0]) is eager_tensor:
            pending += 1
            if pending >= check_calls:  # now and then: is a sampling window due?
                flush()
                sample_if_due()
            return call_flat(fn, *args)
        r = known_get(id(fn))
        if r is not None and state.is_eager:
            flush()
            last_fn, last_r, pending = fn, r, 1
            if r.calls >= r.check_at:  # functions called in turn: the same check, by record
                r.check_at = r.calls + check_calls
                sample_if_due()
            return call_flat(fn, *args)
        return slow(call_flat, fn, args)

    return recorded_call_flat, flush
