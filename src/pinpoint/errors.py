"""Errors that the CLI turns into one line on stderr and a non-zero exit (no traceback)."""


class PinpointError(Exception):
    """A user-facing error: what happened, the value received and how to fix it."""

    exit_code = 2


class ConfigError(PinpointError):
    """The config file or a CLI argument is invalid."""


class PlacementError(PinpointError):
    """A device request could not be met (soft placement off) or a pinning rule is unusable."""


class ProvisionError(PinpointError):
    """The cluster request is impossible or cannot be scheduled on the given nodes."""


class TrainingFailed(PinpointError):
    """Training failed for good (e.g. a local cluster exhausted its restarts)."""

    exit_code = 3


# The exit code of a task that lost a peer of its cluster: >= 128, so the Training Operator's
# ExitCode policy (and the plain Jobs' podFailurePolicy, and the local launcher) recreate the
# task and the group restarts from the latest checkpoint. 138 = 128 + SIGUSR1, "retry me".
RETRY_EXIT_CODE = 138


class PeerLost(PinpointError):
    """A collective or a remote call failed because another task of the cluster went away."""

    exit_code = RETRY_EXIT_CODE


def first_line(text) -> str:
    """The first line of an error's (or any) text, at most 200 characters: what a one-line message quotes."""
    return (str(text or "").strip().splitlines() or [""])[0][:200]
