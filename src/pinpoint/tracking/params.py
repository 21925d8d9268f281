"""What a run records as MLflow params: the flattened config, library versions, the config digest.

Never secrets: the tracking URI, credentials and the environment are not logged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_PARAM_LEN = 6000  # MLflow 3 param value limit


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = param_value(value)
    return out


def param_value(value: Any) -> str:
    """One MLflow param value: a string as is, anything else as JSON, cut to MAX_PARAM_LEN."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_LEN]


def library_versions() -> dict[str, str]:
    import pinpoint
    from pinpoint.versions import installed

    out = {}
    for name in ("tensorflow", "keras", "mlflow", "numpy"):
        version = installed(name)
        if version is not None:
            out[f"version.{name}"] = version

    out["version.pinpoint"] = pinpoint.__version__
    return out


def config_params(cfg) -> dict[str, str]:
    """cluster.*, train.*, train.pinning.*, placement.*, tracking.experiment, name, digest, versions."""
    data = cfg.model_dump(mode="json")
    tracking = data.pop("tracking", {})
    params = flatten(data)
    params["tracking.experiment"] = str(tracking.get("experiment"))
    params["config_digest"] = cfg.digest()
    params.update(library_versions())
    return params
