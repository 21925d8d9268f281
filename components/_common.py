"""Shared by every component body (kfp copies it into each component through `additional_funcs`)."""


def run_step(fn, *args, **kwargs):
    """Call a pinpoint function the way the CLI does: a PinpointError becomes one line on stderr
    and the process exit code (kfp marks the task failed), never a traceback."""
    import sys

    from pinpoint.errors import PinpointError

    try:
        result = fn(*args, **kwargs)
    except PinpointError as err:
        print(f"pinpoint: {err}", file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None
    if isinstance(result, int) and not isinstance(result, bool) and result != 0:
        print(f"pinpoint: {getattr(fn, '__name__', 'step')} exited with status {result}", file=sys.stderr, flush=True)
        raise SystemExit(result)
    return result


def fail(message: str, code: int = 2):
    """Stop the step with one line on stderr (the CLI's format) and a non-zero exit."""
    import sys

    print(f"pinpoint: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)
