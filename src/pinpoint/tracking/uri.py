"""Where runs go: the configured tracking URI, or the embedded store `mlruns/` of the checkout
(the nearest folder above the working directory holding Pinpoint's pyproject.toml), else of the
working directory.

Nothing here runs at import time: the environment is read when `resolve_tracking_uri` is called.
"""

from __future__ import annotations

import os
import tomllib  # Python >= 3.11 (pyproject's requires-python)
from pathlib import Path

LOCAL_DIR = "mlruns"
LOCAL_DB = "mlflow.db"
LOCAL_ARTIFACTS = "artifacts"

# Low HTTP retry/timeouts so an outage fails fast into the spool instead of blocking for minutes.
# Set with setdefault inside the tracker (never at import), so a user's explicit choice wins.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def configure_http() -> None:
    import logging

    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # urllib3 logs every retry during an outage; the tracker reports an outage once, itself.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest ancestor of `start` (default cwd) holding the pinpoint pyproject.toml, else cwd."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            try:
                name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                name = None  # an unreadable pyproject is just "not ours"
            if name == "pinpoint":
                return folder
    return here


def local_store(root: str | Path | None = None) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of the embedded store: <repo>/mlruns/mlflow.db + artifacts/.

    `make mlflow-ui` serves exactly this layout.
    """
    base = repo_root(root) / LOCAL_DIR
    return f"sqlite:///{base / LOCAL_DB}", (base / LOCAL_ARTIFACTS).as_uri()


def resolve_tracking_uri(cfg) -> str:
    """cfg.tracking.uri, else $MLFLOW_TRACKING_URI, else the local store."""
    if cfg is not None and cfg.tracking.uri:
        return cfg.tracking.uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return local_store()[0]


def artifact_root_for(uri: str) -> str | None:
    """The artifact location to give new experiments: only for the embedded sqlite store (a server
    chooses its own, e.g. mlflow-artifacts:/ when it proxies artifacts)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / LOCAL_ARTIFACTS).as_uri()
    return None


def prepare_store(uri: str) -> None:
    """Create the folder of a sqlite store (sqlite does not create parent folders)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        (db.parent / LOCAL_ARTIFACTS).mkdir(parents=True, exist_ok=True)


def redact(uri: str) -> str:
    """A URI fit for logs: drops user:password@ if present."""
    if "@" in uri and "://" in uri:
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return uri
