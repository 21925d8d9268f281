"""Is a TensorFlow error a lost peer of the cluster? Then the task exits with the retry code
and the group restarts from its latest checkpoint (training.cluster), whichever code trained."""

from __future__ import annotations

import sys

# Status codes of a collective or remote call whose peer went away (killed, partitioned,
# preempted): the coordination service reports UNAVAILABLE, an aborted collective CANCELLED or
# ABORTED, a collective past train.collective_timeout_s DEADLINE_EXCEEDED.
_PEER_LOST_CODES = ("UNAVAILABLE", "ABORTED", "CANCELLED", "DEADLINE_EXCEEDED")


def peer_lost(err: BaseException) -> bool:
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(err, tf.errors.OpError):
        return False
    return any(err.error_code == getattr(tf.errors, code) for code in _PEER_LOST_CODES)


_CAUSE_WORDS = ("unhealthy", "aborted", "timed out", "deadline", "unavailable", "connect", "socket", "cancel")


def first_line(err: BaseException) -> str:
    """The line of a TensorFlow error that says what happened (its first line is often only
    'Graph execution error:')."""
    lines = [ln.strip() for ln in (getattr(err, "message", None) or str(err)).splitlines() if ln.strip()]
    cause = next((ln for ln in lines if any(w in ln.lower() for w in _CAUSE_WORDS)), lines[-1] if lines else "")
    return cause[:200]
