"""The bad-input table: every case gives one line naming the field and the fix, a non-zero exit,
no traceback, and no partial outputs. Config-level cases run the CLI in-process (fast); cases that
need TensorFlow (devices, layers, data files) run `pinpoint` as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml

from pinpoint.cli import main
from tests.conftest import NO_TRACKING, make_config

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "provision"


@dataclass
class Case:
    id: str
    argv: list[str]  # {cfg} {out} {tmp} are substituted
    config: dict | str | None = None  # written to {cfg}; a str is written verbatim
    expect: tuple[str, ...] = ()  # substrings of the one error line (field, fix)
    # Extra files under {tmp}: text, a dict (an .npz) or a callable that writes the path.
    files: dict[str, object] = field(default_factory=dict)
    subprocess: bool = False  # needs TensorFlow: run as a real process


def base(**train) -> dict:
    # Pinpoint's loop runs 4 steps; an entrypoint's code runs its own (the fields would be refused).
    loop = {} if "entrypoint" in train else {"steps": 4, "batch_size": 8, "checkpoint_every": 0}
    return make_config("bad", cluster={"devices_per_worker": 2}, tracking=NO_TRACKING, as_dict=True,
                       train={"strategy": "none", **loop, **train})


def tracked(config: dict) -> dict:
    """The same config with MLflow tracking on (an embedded store under the case's folder): its
    sender process starts before TensorFlow, so the error comes after start-up."""
    return {**config, "tracking": {"enabled": True, "uri": "sqlite:///{tmp}/store/mlflow.db"}}


def cluster(**c) -> dict:
    d = base()
    d["cluster"].update(c)
    return d


# A user package written into the case's folder (the config's folder, so train.code_dir).
USER_FILES = {
    "upkg/__init__.py": "",
    "upkg/broken.py": "import not_installed_lib\n",
    "upkg/m.py": (
        "import keras\nimport numpy as np\nimport tensorflow as tf\n\n"
        "def good_model(input_shape, num_classes):\n"
        "    inp = keras.Input(input_shape)\n"
        "    return keras.Model(inp, keras.layers.Dense(num_classes, name='head')("
        "keras.layers.Dense(8, name='hidden')(inp)))\n\n"
        "def raising_model(input_shape):\n    raise ValueError('filters must be even')\n\n"
        "def not_a_model():\n    return 42\n\n"
        "def not_a_dataset():\n    return [1, 2, 3]\n\n"
        "def features_only():\n    return tf.data.Dataset.from_tensor_slices(np.zeros((4, 3), 'float32'))\n\n"
        "NOT_CALLABLE = 3\n\n"
        "def int_labels():\n"
        "    return tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), 'float32'), np.zeros(4, 'int64')))\n\n"
        "def float_labels():\n"
        "    return tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), 'float32'), np.zeros(4, 'float32')))\n\n"
        "def per_position_model(input_shape, num_classes):\n"
        "    # One output per input position: [batch, features, classes], not [batch, classes].\n"
        "    inp = keras.Input(input_shape)\n"
        "    out = keras.layers.Dense(num_classes, name='head')(keras.layers.Reshape((*input_shape, 1))(inp))\n"
        "    return keras.Model(inp, out)\n"
    ),
}

# A TFRecord of Examples {x: 5 floats, label: int64}, written by TensorFlow in its own process (this
# one must not initialize TensorFlow: the in-process tests configure its devices first).
FIVE_FLOAT_RECORDS = """
import sys
import tensorflow as tf

with tf.io.TFRecordWriter(sys.argv[1]) as w:
    for i in range(4):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * 5)),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
        })).SerializeToString())
"""


def five_float_records(path: Path) -> None:
    subprocess.run([sys.executable, "-c", FIVE_FLOAT_RECORDS, str(path)], check=True, timeout=300,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})

PROV = ["provision", "{cfg}", "--out", "{out}"]
TRACE = ["trace", "--no-tracking", "--out", "{out}"]
TRAIN = ["train", "{cfg}", "--out", "{out}"]

CASES = [
    # --- the config file itself ------------------------------------------------------------
    Case("malformed-yaml", PROV, "name: x\ntrain: {strategy: [\n", ("malformed YAML", "line")),
    Case("top-level-list", PROV, "- name: x\n", ("got a list at the top level",)),
    Case("missing-file", ["provision", "{tmp}/nope.yaml", "--out", "{out}"], None, ("does not exist", "configs/demo.yaml")),
    Case("unknown-key", PROV, {**base(), "trian": {}}, ("trian", "unknown key")),
    Case("unknown-strategy", PROV, base(strategy="horovod"), ("train.strategy", "horovod", "mirrored")),
    Case("wrong-type", PROV, base(batch_size="large"), ("train.batch_size", "large")),
    Case("zero-steps", PROV, base(steps=0), ("train.steps", "greater than or equal to 1")),
    Case("negative-lr", PROV, base(learning_rate=-0.1), ("train.learning_rate", "-0.1")),
    Case("name-not-dns", PROV, {**base(), "name": "My_Run"}, ("name", "My_Run", "DNS-1123")),
    Case("unknown-model", PROV, base(model="resnet"), ("train.model", "resnet")),
    Case("data-bad-extension", PROV, base(data="x.parquet"), ("train.data", "x.parquet", "parquet:GLOB")),
    Case("tfrecord-without-features", PROV, base(data="tfrecord:*.tfrecord"), ("train.features", "feature spec")),
    Case("accuracy-with-mse", PROV, base(loss="mse", metrics=["accuracy"]), ("train.metrics", "classification loss")),
    Case("loss-unknown", PROV, base(loss="hinge"), ("train.loss", "hinge", "package.module:callable")),
    # --- your own training code: pinpoint trace and train.entrypoint ------------------------------
    Case("trace-missing-script", [*TRACE, "{tmp}/nope.py", "--epochs", "2"], None, ("SCRIPT", "nope.py", "does not exist")),
    Case("trace-no-script", TRACE, None, ("SCRIPT", "got nothing", "-m MODULE")),
    # A folder is a program for `python` only with a __main__.py in it; it does exist.
    Case("trace-script-is-a-folder", [*TRACE, "{tmp}/code"], None, ("SCRIPT", "a folder without __main__.py"),
         files={"code/train.py": "print('not run')\n"}),
    Case("trace-module-not-found", [*TRACE, "-m", "no_such_pkg_xyz.train"], None,
         ("-m", "no_such_pkg_xyz.train", "does not import")),
    Case("trace-negative-gpus", ["trace", "--gpus", "-1", "{tmp}/x.py"], None, ("--gpus", "-1")),
    Case("trace-negative-metrics-every", ["trace", "--metrics-every-s", "-1", "{tmp}/x.py"], None,
         ("--metrics-every-s", "-1", "0 (every logged step) to 3600")),
    Case("tracking-negative-step-metrics-every", PROV, {**base(), "tracking": {"step_metrics_every_s": -1}},
         ("tracking.step_metrics_every_s", "-1")),
    Case("tracking-negative-checkpoints-every", PROV, {**base(), "tracking": {"checkpoints_every_s": -1}},
         ("tracking.checkpoints_every_s", "-1")),
    Case("entrypoint-not-import-path", PROV, base(entrypoint="train.py"), ("train.entrypoint", "package.module:function")),
    Case("entrypoint-with-evaluator", PROV,
         {**cluster(workers=1, evaluator=1), "train": base(strategy="multi_worker_mirrored", entrypoint="upkg.m:main")["train"]},
         ("cluster.evaluator", "train.entrypoint")),
    # Issue 50: a field the entrypoint's path ignores is refused, not validated against a default model.
    Case("entrypoint-with-layer-pins", TRAIN, base(entrypoint="fit_example.train:main", model="cnn",
                                                   pinning={"layers": {"my_dense": "/GPU:1"}}),
         ("train.pinning.layers", "has no effect with train.entrypoint", "tf.device", "train.model")),
    Case("metrics-interval-removed", PROV, {**base(), "tracking": {"metrics_interval_s": 2}},
         ("tracking.metrics_interval_s", "tracking.step_metrics_every_s")),
    Case("entrypoint-module-missing", TRAIN, base(entrypoint="upkg.nope:main"), ("train.entrypoint", "no module"),
         files=USER_FILES),
    Case("entrypoint-not-callable", TRAIN, base(entrypoint="upkg.m:NOT_CALLABLE"), ("train.entrypoint", "not a callable"),
         files=USER_FILES, subprocess=True),
    Case("entrypoint-module-broken", TRAIN, base(entrypoint="upkg.broken:main"), ("train.entrypoint", "does not import"),
         files=USER_FILES, subprocess=True),
    # --- the cluster request -----------------------------------------------------------------
    Case("negative-workers", PROV, cluster(workers=-2), ("cluster.workers", "-2")),
    Case("two-chiefs", PROV, cluster(chief=2), ("cluster.chief", "2")),
    Case("no-replicas", PROV, cluster(chief=0, workers=0), ("cluster.workers", "at least one")),
    Case("ps-without-ps", PROV, {**cluster(workers=1), "train": base(strategy="parameter_server")["train"]},
         ("cluster.ps", "ps task")),
    Case("ps-without-chief", PROV, {**cluster(chief=0, workers=2, ps=1), "train": base(strategy="parameter_server")["train"]},
         ("cluster.chief", "coordinate")),
    Case("evaluator-with-mirrored", PROV, {**cluster(evaluator=1), "train": base(strategy="mirrored")["train"]},
         ("cluster.evaluator", "multi_worker_mirrored")),
    Case("negative-devices", PROV, cluster(devices_per_worker=-1), ("cluster.devices_per_worker", "-1")),
    Case("bad-flavor", PROV, cluster(flavor="helm"), ("cluster.flavor", "helm")),
    Case("privileged-port", PROV, cluster(port=80), ("cluster.port", "80")),
    Case("bad-namespace", PROV, cluster(namespace="Team_A"), ("cluster.namespace", "DNS-1123")),
    # --- the node inventory ------------------------------------------------------------------
    Case("nodes-missing-file", PROV + ["--nodes", "{tmp}/nodes.yaml"], cluster(), ("--nodes", "nodes.yaml")),
    Case("nodes-malformed", PROV + ["--nodes", str(DATA / "nodes-malformed.yaml")], cluster(), ("nodes",)),
    Case("nodes-too-small", PROV + ["--nodes", str(DATA / "nodes-small-gpu.yaml")],
         {**cluster(devices_per_worker=8, emulate=False, gpu_type="A100", image="registry.example.com/pinpoint-gpu:1"),
          "train": base(strategy="mirrored")["train"]},
         ("needs 8",)),
    # --- Kubernetes manifests ------------------------------------------------------------------
    Case("rbac-bad-service-account", PROV + ["--rbac", "Bad_SA"], cluster(), ("--rbac", "'Bad_SA'", "pipeline-runner")),
    # --- pinning -----------------------------------------------------------------------------
    Case("pin-vars-under-mirrored", PROV, base(strategy="mirrored", pinning={"variables": "/GPU:0"}),
         ("train.pinning.variables", "every replica")),
    Case("pin-layers-under-mirrored", PROV, base(strategy="mirrored", pinning={"layers": {"dense_1": "/GPU:0"}}),
         ("train.pinning.layers", "strategy 'none'")),
    Case("pin-missing-gpu-index", PROV, base(pinning={"gradients": "/GPU:7"}), ("train.pinning.gradients", "/GPU:7")),
    Case("pin-malformed-device", PROV, base(pinning={"input": "gpu-0"}), ("train.pinning.input", "device string")),
    Case("pin-layer-two-keys", PROV, base(pinning={"layers": {"dense_*": "/GPU:1", "re:dense_1": "/GPU:0"}}),
         ("train.pinning.layers", "'re:dense_1' and 'dense_*'", "layer 'dense_1'", "disjoint")),
    Case("pin-layer-bad-regex", PROV, base(pinning={"layers": {"re:(": "/GPU:1"}}),
         ("train.pinning.layers", "'re:('", "regular expression")),
    Case("pin-unknown-layer", TRAIN, base(pinning={"layers": {"dense_9": "/GPU:1"}}),
         ("train.pinning.layers", "dense_9"), subprocess=True),
    Case("gpu-spec-without-gpu-hard", TRAIN,
         {**base(pinning={"soft_placement": False}), "cluster": {"devices_per_worker": 2, "emulate": False}},
         ("cluster.device_type", "emulate", "soft_placement"), subprocess=True),
    Case("pin-absent-device-hard", TRAIN, base(pinning={"gradients": "/CPU:5", "soft_placement": False}),
         ("train.pinning.gradients", "/CPU:5", "soft_placement"), subprocess=True),
    # --- data files --------------------------------------------------------------------------
    Case("csv-without-label", TRAIN, base(data="{tmp}/d.csv"), ("train.label_column", "label"),
         files={"d.csv": "a,b,c\n1,2,3\n4,5,6\n"}, subprocess=True),
    Case("npz-missing", TRAIN, base(data="{tmp}/none.npz"), ("train.data", "does not exist"), subprocess=True),
    Case("npz-wrong-keys", TRAIN, base(data="{tmp}/d.npz"), ("train.data",),
         files={"d.npz": {"features": np.zeros((4, 3))}}, subprocess=True),
    # --- user code and streamed data (train.model / train.data callables, file sources) ------
    Case("user-module-missing", TRAIN, base(model="nopkg.models:build"),
         ("train.model", "no module 'nopkg.models'", "train.code_dir"), subprocess=True),
    Case("user-module-import-error", TRAIN, base(model="upkg.broken:build"),
         ("train.model", "does not import", "No module named 'not_installed_lib'"), files=USER_FILES, subprocess=True),
    Case("user-callable-missing", TRAIN, base(model="upkg.m:nope"),
         ("train.model", "no attribute 'nope'", "good_model"), files=USER_FILES, subprocess=True),
    Case("user-callable-raises", TRAIN, base(model="upkg.m:raising_model"),
         ("train.model", "ValueError: filters must be even"), files=USER_FILES, subprocess=True),
    Case("user-model-not-a-model", TRAIN, base(model="upkg.m:not_a_model"),
         ("train.model", "returned a int", "keras.Model"), files=USER_FILES, subprocess=True),
    Case("user-data-not-a-dataset", TRAIN, base(data="upkg.m:not_a_dataset", num_classes=3),
         ("train.data", "returned a list", "tf.data.Dataset"), files=USER_FILES, subprocess=True),
    Case("user-data-not-pairs", TRAIN, base(data="upkg.m:features_only", num_classes=3),
         ("train.data", "float32[3]", "(features, label)"), files=USER_FILES, subprocess=True),
    Case("user-label-dtype-vs-loss", TRAIN, base(data="upkg.m:float_labels", num_classes=3),
         ("train.loss", "float32", "integer class ids"), files=USER_FILES, subprocess=True),
    Case("glob-matches-nothing", TRAIN,
         base(data="tfrecord:shards/*.tfrecord", features={"x": {"shape": [3]}, "label": {"dtype": "int64"}}),
         ("train.data", "no file matches"), subprocess=True),
    Case("record-does-not-parse", TRAIN,
         base(data="tfrecord:{tmp}/d.tfrecord", features={"x": {"shape": [3]}, "label": {"dtype": "int64"}},
              num_classes=2),
         ("train.features", "the first example does not read", "make the spec match the data"),
         files={"d.tfrecord": five_float_records}, subprocess=True),
    Case("empty-image-folder", TRAIN, base(data="images:{tmp}/imgs"), ("train.data", "no images found"),
         files={"imgs/cats/.keep": ""}, subprocess=True),
    Case("model-output-does-not-fit-labels", TRAIN, base(model="upkg.m:per_position_model"),
         ("train.model", "its output does not fit the labels", "num_classes units"), files=USER_FILES,
         subprocess=True),
    Case("user-model-unknown-layer", TRAIN, base(model="upkg.m:good_model", pinning={"layers": {"dense_9": "/GPU:1"}}),
         ("train.pinning.layers.dense_9", "hidden", "head"), files=USER_FILES, subprocess=True),
    # --- found after start-up: MLflow's sender process is already running -----------------
    Case("late-num-classes-unknown", TRAIN, tracked(base(data="upkg.m:int_labels")),
         ("train.num_classes", "got None", "set train.num_classes"), files=USER_FILES, subprocess=True),
    Case("late-user-model-raises", TRAIN, tracked(base(model="upkg.m:raising_model")),
         ("train.model", "ValueError: filters must be even"), files=USER_FILES, subprocess=True),
    Case("late-label-dtype-vs-loss", TRAIN, tracked(base(data="upkg.m:float_labels", num_classes=3)),
         ("train.loss", "float32", "integer class ids"), files=USER_FILES, subprocess=True),
    Case("late-unknown-layer", TRAIN, tracked(base(model="upkg.m:good_model", pinning={"layers": {"dense_9": "/GPU:1"}})),
         ("train.pinning.layers.dense_9", "hidden", "head"), files=USER_FILES, subprocess=True),
    Case("late-absent-device-hard", TRAIN, tracked(base(pinning={"gradients": "/CPU:5", "soft_placement": False})),
         ("train.pinning.gradients", "/CPU:5", "soft_placement"), subprocess=True),
    Case("user-layer-two-keys", TRAIN, base(model="upkg.m:good_model", pinning={"layers": {"h*": "/GPU:1", "re:hid.*": "/GPU:0"}}),
         ("train.pinning.layers", "'re:hid.*' and 'h*'", "layer 'hidden'"), files=USER_FILES, subprocess=True),
    Case("user-layer-pattern-matches-nothing", TRAIN, base(model="upkg.m:good_model", pinning={"layers": {"hiden*": "/GPU:1"}}),
         ("train.pinning.layers", "'hiden*'", "closest: hidden"), files=USER_FILES, subprocess=True),
    # --- CLI arguments -----------------------------------------------------------------------
    Case("unknown-command", ["fly", "{cfg}"], base(), ("invalid choice", "pinpoint --help")),
    Case("missing-config-arg", ["train"], None, ("config: got nothing (required)", "pinpoint train --help")),
    Case("bad-task-arg", TRAIN + ["--task", "boss"], base(), ("--task", "ROLE:INDEX")),
    Case("unknown-flag", TRAIN + ["--bogus"], base(), ("pinpoint: arguments: got unrecognized --bogus", "pinpoint --help")),
    Case("unwritable-out", ["provision", "{cfg}", "--out", "/proc/pinpoint-out"], base(), ("--out", "writable")),
    Case("report-without-train", ["report", "{tmp}/empty"], None, ("placement.json", "run the previous step"), files={"empty/.keep": ""}),
]


def _materialise(case: Case, tmp: Path) -> tuple[list[str], Path]:
    out = tmp / "run"
    cfg = tmp / "config.yaml"
    subs = {"{cfg}": str(cfg), "{out}": str(out), "{tmp}": str(tmp)}

    def sub(s: str) -> str:
        for k, v in subs.items():
            s = s.replace(k, v)
        return s

    for name, content in case.files.items():
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(p)
        elif isinstance(content, dict):
            np.savez(p, **content)
        else:
            p.write_text(str(content))
    if isinstance(case.config, str):
        cfg.write_text(case.config)
    elif case.config is not None:
        cfg.write_text(sub(yaml.safe_dump(case.config)))
    return [sub(a) for a in case.argv], out


# A config value or an argument: "got X"; a run's finding (e.g. feasibility): what was found.
ONE_FORMAT = re.compile(r"^pinpoint: (?P<field>[\w.\-\[\]/<>@]+( [A-Z]+)?): (got .+|(?<=feasibility: ).+); .+$")


def _assert_one_line(rc: int, stderr: str, case: Case, out: Path, report_dir_made: bool = False):
    assert rc != 0, f"{case.id}: exit code 0"
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("pinpoint:")]
    assert len(lines) == 1, f"{case.id}: expected one 'pinpoint:' line, got:\n{stderr}"
    # One format for every error: "pinpoint: <field>: <what was received>; <the fix>".
    assert ONE_FORMAT.match(lines[0]), f"{case.id}: {lines[0]!r} is not 'pinpoint: <field>: got ...; <fix>'"
    assert not lines[0].startswith("pinpoint: pinpoint:"), f"{case.id}: the prefix twice in {lines[0]!r}"
    for needle in case.expect:
        assert needle in lines[0], f"{case.id}: {needle!r} not in {lines[0]!r}"
    if not report_dir_made:
        assert not out.exists() or not any(out.iterdir()), f"{case.id}: partial outputs {list(out.iterdir())}"


IN_PROCESS = [c for c in CASES if not c.subprocess]
SUBPROC = [c for c in CASES if c.subprocess]


def test_the_table_has_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.unit
@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_bad_input_in_process(case, tmp_path, capsys):
    argv, out = _materialise(case, tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    _assert_one_line(rc, err, case, out)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_bad_input_needing_tensorflow(tmp_path):
    """One process per case: a real `pinpoint train` that must refuse before writing anything.
    Two cases at a time. Each is forked from a process with TensorFlow and Pinpoint imported
    (tests/zygote.py, as the traced programs' runs are): a fresh process' run is mostly that
    import, some 8 CPU s a case."""
    from concurrent.futures import ThreadPoolExecutor

    from tests import zygote

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def one(case) -> str | None:
        d = tmp_path / case.id
        d.mkdir()
        argv, out = _materialise(case, d)
        argv = [sys.executable, "-m", "pinpoint.cli", *argv]
        proc = zygote.python(argv, cwd=d, env=env, timeout=300, preload=zygote.PINPOINT)
        try:
            _assert_one_line(proc.returncode, proc.stderr, case, out)
            assert not _processes_mentioning(str(d)), f"{case.id}: a process outlived pinpoint"
        except AssertionError as err:
            return str(err)
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(one, SUBPROC) if f]
    assert not failures, "\n\n".join(failures)


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment or command line holds `text` (the case's folder: a
    tracking URI there reaches the sender process in its environment)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


test_the_table_has_at_least_30_cases = pytest.mark.unit(test_the_table_has_at_least_30_cases)
