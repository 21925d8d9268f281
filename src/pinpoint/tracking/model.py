"""The final model in a form MLflow loads back and predicts with:
`mlflow.pyfunc.load_model("runs:/<id>/model").predict(x)`.

A serializable Keras 3 model is saved in MLflow's keras flavor. A model that Keras cannot
serialize (e.g. a subclassed model with device pinning and no get_config) is exported as an
inference SavedModel (`model.export`) wrapped in a small pyfunc. Under a distribution strategy
this runs on the chief only (the tracking hook is chief-only).
"""


import shutil
from pathlib import Path

import mlflow.pyfunc
import numpy as np


class SavedModelPredictor(mlflow.pyfunc.PythonModel):
    """pyfunc over a SavedModel written by keras `model.export` (its `serve` endpoint)."""

    def load_context(self, context):
        import tensorflow as tf

        # Soft placement: a model pinned to (emulated) devices must load on any machine.
        tf.config.set_soft_device_placement(True)
        self._model = tf.saved_model.load(context.artifacts["saved_model"])

    # The type hint (one MLflow accepts without inferring a schema) keeps MLflow from warning
    # "Add type hints" when the class is defined; a DataFrame or list input still works.
    def predict(self, context, model_input: np.ndarray, params=None):
        import tensorflow as tf

        x = model_input.to_numpy() if hasattr(model_input, "to_numpy") else np.asarray(model_input)
        return self._model.serve(tf.constant(x, dtype=tf.float32)).numpy()


def requirements() -> list[str]:
    """The model's pip requirements: the versions this process trained with. Given explicitly,
    because MLflow's inference loads the model again in a new Python process (~10 s)."""
    from importlib.metadata import PackageNotFoundError, version

    reqs = []
    for dist in ("mlflow", "tensorflow", "keras", "numpy"):
        try:
            reqs.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            continue
    return reqs


def save_keras_model(model, path: str | Path) -> Path:
    """Save `model` at `path` as an MLflow model (keras flavor, else SavedModel pyfunc)."""
    import mlflow.keras

    path = Path(path)
    try:
        mlflow.keras.save_model(model, str(path), pip_requirements=requirements())
        return path
    except (NotImplementedError, TypeError, ValueError):
        shutil.rmtree(path, ignore_errors=True)  # half-written keras flavor: start again
    export = path.parent / f"{path.name}-savedmodel"
    _export_savedmodel(model, export)
    mlflow.pyfunc.save_model(str(path), python_model=SavedModelPredictor(),
                             artifacts={"saved_model": str(export)}, pip_requirements=requirements())
    shutil.rmtree(export, ignore_errors=True)
    return path


def input_shape_of(model) -> tuple | None:
    """The batch input shape a (possibly subclassed) model was built with, e.g. (None, 64):
    Keras 3 records it when a layer is built; take the first layer's."""
    for obj in (model, *getattr(model, "layers", [])):
        shapes = getattr(obj, "_build_shapes_dict", None)
        if shapes:
            shape = next(iter(shapes.values()))
            if isinstance(shape, (tuple, list)) and shape and not isinstance(shape[0], (tuple, list)):
                return (None, *tuple(shape)[1:])
    inputs = getattr(model, "inputs", None)
    if inputs:
        return tuple(inputs[0].shape)
    return None


def _export_savedmodel(model, export: Path) -> None:
    """An inference SavedModel with a `serve` endpoint; works for models never called through
    Keras' own __call__ path (a custom training loop inside tf.function)."""
    import keras
    import tensorflow as tf

    shape = input_shape_of(model)
    if shape is None:
        model.export(str(export), verbose=False)  # needs a model Keras has seen called
        return
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda x: model(x, training=False),
        input_signature=[tf.TensorSpec(shape, tf.float32)],
    )
    archive.write_out(str(export), verbose=False)
