"""`pinpoint trace` shows a program as `python` shows it, and leaves nothing misleading behind:
the program's traceback without runpy's frames, its own warnings (its `warnings.warn`, Keras'
UserWarnings), a used --out without the earlier program's charts, and an MLflow store that
refuses the run named as such with MLflow's whole message. Each program runs for real, and
under plain `python` where `python` is the reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_trace import trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WARNS_THEN_RAISES = """
    import warnings

    import keras

    warnings.warn("the program's own warning")
    keras.layers.Dense(2, input_shape=(3,))  # Keras warns: prefer keras.Input(shape)


    def step():
        raise ValueError("boom in the program")


    step()
"""


@pytest.fixture(scope="module")
def warns_then_raises(tmp_path_factory):
    """(pinpoint's stderr, python's stderr) for the same program, run from its folder."""
    folder = tmp_path_factory.mktemp("rough")
    script = write(folder, "prog.py", WARNS_THEN_RAISES)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    ours = trace([str(script)], cwd=folder, out=folder / "out", expect=1)
    plain = subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True, text=True, env=env,
                           timeout=300)
    assert plain.returncode == 1, plain.stderr[-2000:]
    return ours.stderr, plain.stderr


def _traceback(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("ValueError"))
    return lines[start:end + 1]


def test_the_programs_traceback_is_pythons_without_runpy_frames(warns_then_raises):
    ours, plain = warns_then_raises
    assert "<frozen runpy>" not in ours
    assert _traceback(ours) == _traceback(plain)


def _warnings(stderr: str) -> list[str]:
    """Python's warning lines ('file:line: Category: message') for the program's and Keras' own."""
    return [ln for ln in stderr.splitlines() if "Warning: " in ln and ("prog.py" in ln or "/keras/" in ln)]


def test_the_programs_own_and_keras_warnings_are_shown_as_python_shows_them(warns_then_raises):
    ours, plain = warns_then_raises
    expected = _warnings(plain)
    assert any("UserWarning: the program's own warning" in ln for ln in expected)
    assert any("input_shape" in ln for ln in expected)  # the Keras one
    assert _warnings(ours) == expected


SPLIT = """
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.device("/GPU:1"):
            y = tf.matmul(x, x)
        return tf.reduce_sum(y)

    step(tf.ones([8, 8]))
"""
EAGER_ONLY = """
    import tensorflow as tf

    print(float(tf.reduce_sum(tf.ones([4]))))
"""


def test_a_used_out_keeps_no_chart_of_the_earlier_program(tmp_path):
    """Tracing another program into a used --out replaces Pinpoint's own files, charts included;
    a file of the user's in the folder is left alone."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    trace(["--gpus", "2", str(write(tmp_path, "split.py", SPLIT))], cwd=tmp_path, out=out)
    before = {p.name for p in (out / "charts").iterdir()}
    assert "transfer_matrix.png" in before  # the split program's transfers
    (out / "notes.txt").write_text("mine")
    eager = write(tmp_path, "eager.py", EAGER_ONLY)
    trace(["--gpus", "2", str(eager)], cwd=tmp_path, out=out)
    trace(["--gpus", "2", str(eager)], cwd=tmp_path, out=fresh)
    assert {p.name for p in (out / "charts").iterdir()} == {p.name for p in (fresh / "charts").iterdir()}
    assert "transfer_matrix.png" not in {p.name for p in (out / "charts").iterdir()}
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.newest  # MLflow's refusal and Pinpoint's report of it: nothing TensorFlow's version changes
def test_an_mlflow_file_store_refusal_is_reported_whole_not_as_unreachable(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(MlflowException) as refused:  # what MLflow itself says about this store
        MlflowClient(tracking_uri=uri).search_experiments()
    message = " ".join(str(refused.value).split())
    script = write(tmp_path, "eager.py", EAGER_ONLY)
    proc = trace([str(script)], cwd=tmp_path, out=tmp_path / "out", tracking=True, env={"MLFLOW_TRACKING_URI": uri})
    (warning,) = [ln for ln in proc.stderr.splitlines() if "refused the run" in ln]
    assert warning.startswith(f"pinpoint: warning: MLflow tracking store {uri} refused the run: {message} Spooling to ")
    assert "unreachable" not in proc.stderr
