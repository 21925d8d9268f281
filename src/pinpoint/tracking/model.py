"""The final model in a form MLflow loads back: MLflow's keras flavor (Keras 3), with a pyfunc
entry, so `mlflow.pyfunc.load_model("runs:/<id>/model").predict(x)` works."""

from __future__ import annotations

from pathlib import Path


def save_keras_model(model, path: str | Path) -> Path:
    """Save `model` (a Keras 3 model; under a distribution strategy call this on the chief)."""
    import mlflow.keras

    path = Path(path)
    mlflow.keras.save_model(model, str(path))
    return path
