"""pinpoint.tfcompat: the registry of private TensorFlow/Keras names matches the installed versions,
a moved or changed target fails a command in one line before anything runs, and every patched name
is the original object again after a trace and after a capture whose set-up failed part-way."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata as md
import json
import textwrap
from pathlib import Path

import pytest

import pinpoint.versions as versions_mod
from pinpoint.tfcompat import check as check_mod
from pinpoint.tfcompat.check import DOCS, PrivateApiError, check, problem
from pinpoint.tfcompat.patches import Patches, originals
from pinpoint.tfcompat.targets import TARGETS, Target, render

AF = "tensorflow.python.eager.polymorphic_function.atomic_function"
DEFAULT = object()
SUPPORTED = "tensorflow" + versions_mod.SUPPORTED["tensorflow"]  # the range pyproject declares (test_package)


def versions() -> str:
    return f"tensorflow {md.version('tensorflow')}, keras {md.version('keras')}"


def expected_line(target: Target, what: str) -> str:
    return (f"{versions()}: {target.key} ({target.module}) {what}; Pinpoint relies on it to {target.used_for} "
            f"and supports {SUPPORTED}: install a version in that range — see {DOCS}")


# ---- unit: the start-up check ----------------------------------------------------------------------
@pytest.mark.unit
def test_every_registered_target_matches_the_installed_tensorflow_and_keras():
    assert {key: problem(t) for key, t in TARGETS.items() if problem(t) is not None} == {}


@pytest.mark.unit
def test_a_target_that_moved_fails_in_one_line_naming_the_version_and_the_target(monkeypatch):
    from tensorflow.python.eager.polymorphic_function import atomic_function

    monkeypatch.delattr(atomic_function.AtomicFunction, "call_flat")  # as a TensorFlow release could
    with pytest.raises(PrivateApiError) as err:
        check()
    assert str(err.value) == expected_line(TARGETS["AtomicFunction.call_flat"], "not found")


@pytest.mark.unit
def test_a_changed_signature_names_the_signature_found_and_the_one_expected(monkeypatch):
    from tensorflow.python.client import session

    monkeypatch.setattr(session.BaseSession, "run", lambda self, fetches, *, options=None: None)
    with pytest.raises(PrivateApiError) as err:
        check()
    assert str(err.value) == expected_line(
        TARGETS["BaseSession.run"],
        "has signature (self, fetches, *, options=None) "
        "(expected (self, fetches, feed_dict=None, options=None, run_metadata=None))")


@pytest.mark.unit
def test_an_instance_attribute_no_method_uses_any_more_is_reported():
    moved = dataclasses.replace(TARGETS["Graph._functions"], path="Graph._functions_v3")
    assert problem(moved) == "no longer used by Graph"


@pytest.mark.unit
def test_render_prints_names_kinds_and_simple_defaults():
    def f(a, b=None, *args, c=1, d=DEFAULT, **kw):
        return a

    assert render(f) == "(a, b=None, *args, c=1, d=..., **kw)"
    assert render(lambda x, *, y="s": x) == "(x, *, y='s')"


@pytest.mark.unit
def test_only_registered_patch_targets_can_be_replaced():
    with Patches() as patches, pytest.raises(KeyError, match="Operation._set_attr is not registered as patched"):
        patches.replace("Operation._set_attr", None)


@pytest.mark.unit
def test_a_switched_target_flips_call_by_call_and_close_puts_back_what_it_was():
    from tensorflow.python.eager.polymorphic_function import atomic_function

    cls = atomic_function.AtomicFunction
    original, other = cls.__dict__["call_flat"], object()
    with Patches() as patches:
        to_other, back = patches.switch("AtomicFunction.call_flat", other)
        to_other()
        assert cls.__dict__["call_flat"] is other
        back()
        assert cls.__dict__["call_flat"] is original
        to_other()
    assert cls.__dict__["call_flat"] is original
    with Patches() as patches, pytest.raises(KeyError, match="Operation._set_attr is not registered as patched"):
        patches.switch("Operation._set_attr", None)


@pytest.mark.unit
def test_pinpoint_trace_with_a_moved_target_prints_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from tensorflow.python.eager.polymorphic_function import atomic_function

    from pinpoint.cli import main

    monkeypatch.setattr(check_mod, "_checked", False)
    monkeypatch.delattr(atomic_function.AtomicFunction, "call_flat")
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    out = tmp_path / "out"
    code = main(["trace", "--no-tracking", "--out", str(out), str(script)])
    err = capsys.readouterr()
    assert (code, err.out, out.exists()) == (2, "", False)
    assert err.err == "pinpoint: " + expected_line(TARGETS["AtomicFunction.call_flat"], "not found") + "\n"


SRC = Path(__file__).resolve().parents[1] / "src" / "pinpoint"


def _private_uses(path: Path, attrs: set[str]) -> set[str]:
    """Private modules `path` imports and registered private attributes it reads or sets."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Attribute) and node.attr in attrs:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(node.attr)
            continue
        elif isinstance(node, ast.Constant) and node.value in attrs:
            found.add(node.value)  # getattr(v, "_value")
            continue
        else:
            continue
        for name in names:
            if name.startswith(("tensorflow.python", "keras.src")):
                module = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[1][:1].isupper() else name
                found.add(module)
    return found


@pytest.mark.unit
def test_private_names_are_spelled_only_in_tfcompat():
    attrs = {part for t in TARGETS.values() for part in t.parts if part.startswith("_") and not part.startswith("__")}
    uses = {(str(p.relative_to(SRC)), use) for p in sorted(SRC.rglob("*.py")) if p.parent.name != "tfcompat"
            for use in _private_uses(p, attrs)}
    assert sorted(uses) == []


@pytest.mark.unit
def test_docs_list_every_target_with_its_module_and_parameters():
    docs = (SRC.parents[1] / "docs" / "trace.md").read_text()
    section = docs.split("\n## Private APIs\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip().strip("`") for c in r.strip().strip("|").split("|")] for r in section.splitlines()
            if r.startswith("| `")]
    assert {r[0]: (r[1], r[2] == "patched", r[3] or None) for r in rows} == {
        k: (t.module, t.patched, t.signature) for k, t in TARGETS.items()}
    assert DOCS == "docs/trace.md#private-apis"  # the heading's anchor


@pytest.mark.unit
def test_nothing_outside_tfcompat_patches_with_setattr():
    """Every patch goes through tfcompat.patches.Patches (registered, undone, checked)."""
    calls = [f"{p.relative_to(SRC)}:{n.lineno}" for p in sorted(SRC.rglob("*.py")) if p.parent.name != "tfcompat"
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"]
    assert calls == []


@pytest.mark.unit
def test_the_guard_sees_a_private_import_and_a_private_attribute(tmp_path):
    """Negative control for the test above."""
    bad = tmp_path / "bad.py"
    bad.write_text("from tensorflow.python.eager import context\n"
                   "def f(layer):\n    return layer._flatten_layers(), getattr(layer, '_value')\n")
    assert _private_uses(bad, {"_flatten_layers", "_value"}) == {
        "tensorflow.python.eager.context", "_flatten_layers", "_value"}


# ---- integration: every patch is undone ------------------------------------------------------------
PROGRAM = """
    import json, sys
    import numpy as np
    import tensorflow as tf
    from pinpoint.tfcompat.patches import originals

    during = {k: id(v) for k, v in originals().items()}  # what each patched name is while traced
    tf.config.experimental.set_memory_growth(tf.config.list_physical_devices("GPU")[0], True)
    # Reduced on one device, not TensorFlow's default collective: this trace runs inside the test
    # process, where another MirroredStrategy() may already have used collective group key 1, and
    # two strategies sharing it abort the process's collectives (as in plain TensorFlow).
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=4, epochs=1, verbose=0)
    with tf.Graph().as_default():
        total = tf.constant(1.0) + 1.0
        with tf.compat.v1.Session() as sess:
            sess.run(total)
    json.dump(during, open(sys.argv[1], "w"))
"""


@pytest.mark.integration
def test_after_a_trace_every_patched_name_is_the_original_again(tf, tmp_path):
    from pinpoint import userlog
    from pinpoint.cli import main

    before = originals()
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    during = tmp_path / "during.json"
    out = tmp_path / "out"
    assert main(["trace", "--gpus", "2", "--no-tracking", "--out", str(out), str(script), str(during)]) == 0
    patched = json.loads(during.read_text())
    # Every registered patch was in place while the program ran ...
    assert sorted(k for k, v in before.items() if patched[k] == id(v)) == []
    # ... and is the very object it was before, once the trace ended.
    assert sorted(k for k, v in originals().items() if v is not before[k]) == []
    assert userlog._sink is None
    placement = json.loads((out / "placement.json").read_text())
    assert sorted({f["kind"] for f in placement["functions"]}) == ["Session.run", "tf.function"]
    # Set before the program used the devices: a GPU machine takes it (tests/test_trace_gpu_answers.py
    # checks the refusal after).
    assert ("emulation: set_memory_growth: accepted before the program used the devices, as on a GPU machine, "
            "and answered back by tf.config; not applied: memory growth of the emulated GPUs (logical CPUs have "
            "no GPU memory)" in placement["notes"])


@pytest.mark.integration
@pytest.mark.parametrize("failing", ["MirroredExtended.__init__", "Model.fit"])
def test_a_capture_whose_set_up_fails_part_way_leaves_nothing_patched(tf, monkeypatch, failing):
    """The GPU-name patches fail after 8 of their own (a failure inside one part), or the Keras fit
    patch fails after the GPU names, the default scope, the recorder and its op callback."""
    from tensorflow.python.eager import context

    from pinpoint import userlog
    from pinpoint.trace.gpus import emulate
    from pinpoint.trace.session import Capture

    before, device = originals(), context.context().device_name
    monkeypatch.setattr(check_mod, "_checked", True)  # a failure the start-up check cannot see
    monkeypatch.setitem(TARGETS, failing, dataclasses.replace(TARGETS[failing], path=failing + "_moved"))
    with pytest.raises(AttributeError, match=f"{failing}_moved"), Capture(emulate(2)):
        pass
    monkeypatch.undo()
    assert sorted(k for k, v in originals().items() if v is not before[k]) == []
    assert (context.context().device_name, userlog._sink) == (device, None)
