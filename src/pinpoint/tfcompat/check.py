"""The start-up check: every registered private name exists with the signature Pinpoint relies on.

Run when a command starts to capture or emulate (`pinpoint trace`, `pinpoint train`), not on
`import pinpoint`. A moved target fails the command in one line naming TensorFlow's version and
the target, instead of a traceback deep inside a run (or a patch that silently never applies).
"""

from __future__ import annotations

from collections.abc import Iterable

from pinpoint.errors import PinpointError
from pinpoint.tfcompat.targets import TARGETS, Target, member_used, render

DOCS = "docs/trace.md#private-apis"
_checked = False


class PrivateApiError(PinpointError):
    """A private TensorFlow or Keras name Pinpoint relies on moved or changed its signature."""


def problem(target: Target) -> str | None:
    """What is wrong with `target` in the installed TensorFlow/Keras (None: nothing)."""
    try:
        obj = target.resolve()
    except (ImportError, AttributeError):
        return "not found"
    if target.member:
        if not isinstance(obj, type) or not member_used(obj, target.parts[-1]):
            return f"no longer used by {'.'.join(target.parts[:-1])}"
        return None
    if target.patched:
        try:
            target.owner()
        except AttributeError:
            return "not found on the class (it cannot be patched)"
    if target.signature is None:
        return None
    try:
        got = render(obj)
    except (TypeError, ValueError):
        return f"has no readable signature (expected {target.signature})"
    if got != target.signature:
        return f"has signature {got} (expected {target.signature})"
    return None


def _versions() -> str:
    import importlib.metadata as md

    found = []
    for dist in ("tensorflow", "keras"):
        try:
            found.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def _supported() -> str:
    """The TensorFlow range Pinpoint declares ('tensorflow>=2.16,<2.22')."""
    from pinpoint.versions import SUPPORTED

    return "tensorflow" + SUPPORTED["tensorflow"]


def message(target: Target, what: str) -> str:
    return (f"{_versions()}: {target.key} ({target.module}) {what}; Pinpoint relies on it to {target.used_for} "
            f"and supports {_supported()}: install a version in that range — see {DOCS}")


def check(targets: Iterable[Target] | None = None) -> None:
    """Raise PrivateApiError (one line) for the first target that moved."""
    for target in TARGETS.values() if targets is None else targets:
        what = problem(target)
        if what is not None:
            raise PrivateApiError(message(target, what))


def require() -> None:
    """`check()` once per process (a command and the capture it starts both ask)."""
    global _checked
    if not _checked:
        check()
        _checked = True
