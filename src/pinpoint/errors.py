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
