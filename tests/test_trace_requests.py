"""Requests as the program made them: Keras 3 creates a layer's weights at its first call, so
layers created inside `tf.device('/GPU:1')` (or a subclassed model built there) get no weights
there. `pinpoint trace` judges every weight against the request the program made for it and
names each one that is elsewhere; the correct pattern (each layer built inside the scope) is not
flagged. One program holds the four models, run for real under `--gpus 2`."""

from __future__ import annotations

import pytest

from tests.test_trace import placement, trace, write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WIDTH, HIDDEN = 8, 16
LAYERS = {"hidden": ("kernel", "bias"), "out": ("kernel", "bias")}  # two Dense layers per model

PROGRAM = f"""
import tensorflow as tf
import keras


class LazyInit(keras.Model):
    # The layers are created under /GPU:1, their weights at the first call (in train_step).
    def __init__(self):
        super().__init__(name="lazy_init")
        with tf.device("/GPU:1"):
            self.hidden = keras.layers.Dense({HIDDEN}, activation="relu", name="hidden")
            self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
        return self.out(self.hidden(x))


class Plain(keras.Model):
    def __init__(self, name, device=None, build_inside=False):
        super().__init__(name=name)
        with tf.device(device):
            self.hidden = keras.layers.Dense({HIDDEN}, activation="relu", name=name + "_hidden")
            self.out = keras.layers.Dense(1, name=name + "_out")
            if build_inside:  # the fix: each layer built inside the scope
                self.hidden.build((None, {WIDTH}))
                self.out.build((None, {HIDDEN}))

    def call(self, x):
        return self.out(self.hidden(x))


class CalledInside(Plain):
    # Called inside the scope too: Keras declares the weights in its symbolic build there and
    # creates them after the scope ended.
    def call(self, x):
        with tf.device("/GPU:1"):
            return self.out(self.hidden(x))


x = tf.random.normal((32, {WIDTH}))
y = tf.random.normal((32, 1))

lazy = LazyInit()
opt = keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((lazy(x) - y) ** 2)
    grads = tape.gradient(loss, lazy.trainable_variables)
    opt.apply_gradients(zip(grads, lazy.trainable_variables))
    return loss


for _ in range(2):
    train_step(x, y)

built = Plain("lazy_build")
with tf.device("/GPU:1"):  # a subclassed model's build(shape) creates no weights
    built.build((None, {WIDTH}))
# jit_compile=False: on a GPU machine Keras' default ("auto") compiles fit's step with XLA, and an
# XLA cluster cannot read a variable on another GPU (XLA's known issue "tf.Variable on a different
# device"): a program that pins weights to /GPU:1 turns XLA off there, and so here.
built.compile(optimizer="sgd", loss="mse", jit_compile=False)
built.fit(x, y, epochs=1, verbose=0)

inside = Plain("built_inside", "/GPU:1", build_inside=True)
inside.compile(optimizer="sgd", loss="mse", jit_compile=False)
inside.fit(x, y, epochs=1, verbose=0)

declared = CalledInside("declared", "/GPU:1")
declared.compile(optimizer="sgd", loss="mse", jit_compile=False)
declared.fit(x, y, epochs=1, verbose=0)

for model in (lazy, built, inside, declared):
    for v in model.weights:
        print("WEIGHT", v.path, v.value.device)
"""


@pytest.fixture(scope="module")
def lazy_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("requests")
    write(folder, "lazy.py", PROGRAM)
    out = folder / "out"
    proc = trace(["--gpus", "2", "lazy.py"], cwd=folder, out=out)
    return placement(out), proc.stdout, out


def _layers(model: str) -> list[str]:
    """The Keras paths of a model's layers: a layer built before the model is called has its own
    top-level path."""
    if model == "lazy_init":
        return [f"{model}/{layer}" for layer in LAYERS]
    return [f"{model}_{layer}" if model == "built_inside" else f"{model}/{model}_{layer}" for layer in LAYERS]


def _weights(model: str) -> list[str]:
    return [f"{path}/{w}" for path, ws in zip(_layers(model), LAYERS.values()) for w in ws]


def test_plain_tensorflow_puts_the_lazily_built_weights_on_the_default_device(lazy_run):
    """The truth the judgment rests on, from the program's own print of each weight's device, named
    as on the GPU machine: the default device /GPU:0, the scope's /GPU:1."""
    _, stdout, _ = lazy_run
    where = dict(line.split()[1:3] for line in stdout.splitlines() if line.startswith("WEIGHT "))
    local = {k: v.rsplit("/device:", 1)[1] for k, v in where.items()}
    lazy = _weights("lazy_init") + _weights("lazy_build") + _weights("declared")
    assert {k: local[k] for k in lazy} == dict.fromkeys(lazy, "GPU:0")
    assert {k: local[k] for k in _weights("built_inside")} == dict.fromkeys(_weights("built_inside"), "GPU:1")


def test_weights_not_on_their_requested_device_are_violations_named_by_layer_and_variable(lazy_run):
    p, _, _ = lazy_run
    rule = {r["rule"]: r for r in p["conformance"]["rules"]}["tf.device /GPU:1: weights"]
    per_model = sum(len(ws) for ws in LAYERS.values())
    assert (rule["relevant"], rule["violations_total"]) == (4 * per_model, 3 * per_model)
    assert rule["score"] == round(per_model / (4 * per_model), 4)
    assert rule["observed"] == {"/GPU:0": 3 * per_model, "/GPU:1": per_model}
    got = {(v["layer"], v["variable"], v["requested"], v["placed"], v["how"]) for v in rule["violations"]}
    want = {(path, w, "/GPU:1", "/GPU:0", how) for m, how in (("lazy_init", "layer created"),
                                                              ("lazy_build", "layer built"),
                                                              ("declared", "declared"))
            for path, ws in zip(_layers(m), LAYERS.values()) for w in ws}
    assert got == want
    assert p["conformance"]["score"] < 1.0


def test_the_lazy_build_gets_an_explain_entry_with_its_cause_and_fix(lazy_run):
    p, _, _ = lazy_run
    text = p["explain"]["lazy_build"]
    assert "first call" in text and "default device" in text and ".build(" in text
    why = {v["op"]: v["why"] for r in p["conformance"]["rules"] for v in r["violations"]}
    assert "lazy_build built under tf.device /GPU:1" in why[_weights("lazy_build")[0]]
    assert "lazy_init/hidden created under tf.device /GPU:1" in why["lazy_init/hidden/kernel"]
    assert "declared under tf.device /GPU:1 in Keras' symbolic build" in why[_weights("declared")[0]]


def test_the_summary_and_the_report_show_the_violation(lazy_run):
    _, stdout, out = lazy_run
    per_model = sum(len(ws) for ws in LAYERS.values())
    line = next(ln for ln in stdout.splitlines() if ln.startswith("weights    :"))
    assert line.startswith(f"weights    : {3 * per_model} not where requested: ")
    assert "Keras lazy build" in line
    html = (out / "report.html").read_text()
    violations = html.split("Violations</span>", 1)[1].split("</table>", 1)[0]
    assert all(w in violations for w in _weights("lazy_init") + _weights("lazy_build") + _weights("declared"))
    assert "tf.device /GPU:1: weights" in violations
    assert _weights("built_inside")[0] not in violations  # the correct pattern is not a violation
