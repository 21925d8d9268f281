"""Every config field takes effect on the path the config chooses, or is refused in one line.

Paths: Pinpoint's loop with a built-in model, Pinpoint's loop with the user's model, the user's
own code (train.entrypoint). Each field of the schema is written (a value other than its default,
with the fields it needs) on each path, and either:
- refused: one line naming the field and what chose the path (e.g. train.entrypoint), why it has
  no effect and the fix; or
- accepted, and read by the code that runs on that path: an attribute read of the field in
  src/pinpoint (the loop's rooms for the two loop paths, training/entrypoint for the user's code),
  found by walking the source's syntax tree. The validation (config.py) and the MLflow params
  (every field, as written) do not count as reads.
"""

from __future__ import annotations

import ast
import copy
from functools import cache
from pathlib import Path

import pytest

from pinpoint.config import config_from_dict, config_to_yaml
from pinpoint.config_reference import fields
from pinpoint.config_scope import BUILTIN, CHOSEN_BY, ENTRYPOINT, NEEDS, PATHS, USER_MODEL, path_of, refused_on
from pinpoint.errors import ConfigError

pytestmark = pytest.mark.unit
SRC = Path(__file__).resolve().parents[1] / "src" / "pinpoint"

BASE = {"name": "scope", "cluster": {"devices_per_worker": 2}, "train": {"strategy": "none"}}
CHOICE = {BUILTIN: {"model": "mlp"}, USER_MODEL: {"model": "mypkg.model:build"},
          ENTRYPOINT: {"entrypoint": "mypkg.train:main"}}
MWM = {"train": {"strategy": "multi_worker_mirrored"}, "cluster": {"workers": 1}}
# field -> (a value other than its default, the other fields that value needs to be valid).
SAMPLES: dict[str, tuple] = {
    "name": ("other", {}),
    "cluster.chief": (0, {"train": {"strategy": "multi_worker_mirrored"}, "cluster": {"workers": 2}}),
    "cluster.workers": (1, MWM),
    "cluster.ps": (1, {"train": {"strategy": "parameter_server"}, "cluster": {"workers": 1}}),
    "cluster.evaluator": (1, MWM),
    "cluster.devices_per_worker": (3, {}),
    "cluster.device_type": ("CPU", {}),
    "cluster.emulate": (False, {}),
    "cluster.gpu_resource": ("amd.com/gpu", {}),
    "cluster.gpu_type": ("A100", {}),
    "cluster.gpu_memory": ("16GiB", {"placement": {"memory": True}}),
    "cluster.gpu_type_label": ("example.com/gpu", {}),
    "cluster.cpu": ("4", {}),
    "cluster.memory": ("8Gi", {}),
    "cluster.shm_size": ("2Gi", {}),
    "cluster.tolerations": ([{"key": "gpu"}], {}),
    "cluster.node_selector": ({"pool": "gpu"}, {}),
    "cluster.image": ("mine:1", {}),
    "cluster.image_pull_secrets": (["regcred"], {}),
    "cluster.namespace": ("team", {}),
    "cluster.port": (2223, {}),
    "cluster.cluster_domain": ("example.org", {}),
    "cluster.flavor": ("plain", {}),
    "cluster.runs_volume_claim": ("runs", {}),
    "cluster.unschedulable_grace_s": (60.0, {}),
    "cluster.deadline_s": (600, {}),
    "cluster.ttl_after_finished_s": (60, {}),
    "cluster.mlflow_secret": ("other", {}),
    "cluster.gang": ("kueue", {"cluster": {"queue": "q"}}),
    "cluster.queue": ("q", {}),
    "train.strategy": ("one_device", {}),
    "train.pinning.variables": ("/CPU:0", {}),
    "train.pinning.gradients": ("/CPU:0", {}),
    "train.pinning.layers": ({"dense_1": "/GPU:1"}, {}),
    "train.pinning.layers_backward": ("default", {"train": {"pinning": {"layers": {"dense_1": "/GPU:1"}}}}),
    "train.pinning.input": ("/CPU:0", {}),
    "train.pinning.soft_placement": (False, {}),
    "train.pinning.visible_devices": (["/GPU:0"], {}),
    "train.entrypoint": ("mypkg.train:other", {}),
    "train.entrypoint_args": ({"steps": 5}, {}),
    "train.model": ("cnn", {}),
    "train.model_args": ({"filters": 8}, {}),
    "train.code_dir": ("/srv/code", {}),
    "train.data": ("synthetic", {}),
    "train.data_args": ({"n": 1}, {"train": {"data": "mypkg.data:dataset"}}),
    "train.features": ({"x": {"shape": [4]}, "label": {"dtype": "int64"}}, {"train": {"data": "tfrecord:d/*.tfrecord"}}),
    "train.label_column": ("y", {"train": {"data": "data.csv"}}),
    "train.num_classes": (10, {}),
    "train.shuffle_buffer": (100, {"train": {"data": "tfrecord:d/*.tfrecord", "features": {
        "x": {"shape": [4]}, "label": {"dtype": "int64"}}}}),
    "train.loss": ("mse", {}),
    "train.from_logits": (False, {}),
    "train.metrics": (["accuracy"], {}),
    "train.precision": ("mixed_float16", {}),
    "train.synthetic_examples": (100, {"train": {"data": "synthetic"}}),
    "train.batch_size": (32, {}),
    "train.learning_rate": (0.1, {}),
    "train.optimizer": ("adam", {}),
    "train.steps": (10, {}),
    "train.checkpoint_every": (5, {}),
    "train.keep_checkpoints": (2, {}),
    "train.max_restarts": (0, {}),
    "train.collective_timeout_s": (30, MWM),
    "train.seed": (1, {}),
    "train.log_every": (5, {}),
    "train.jit_compile": (False, {}),
    "train.all_reduce": ("ring", {"train": {"strategy": "mirrored"}}),
    "tracking.enabled": (False, {}),
    "tracking.uri": ("http://mlflow:5000", {}),
    "tracking.experiment": ("other", {}),
    "tracking.step_metrics_budget": (50, {}),
    "tracking.step_metrics_every_s": (0.0, {}),
    "tracking.checkpoints_every_s": (0.0, {}),
    "tracking.log_model": (False, {}),
    "placement.enabled": (False, {}),
    "placement.warmup_steps": (2, {}),
    "placement.sample_steps": (2, {}),
    "placement.timing": (True, {}),
    "placement.memory": (True, {}),
}
# The loop's rooms (the two model paths) and the entrypoint's room; every other module is shared.
LOOP_ONLY = ("training/loop/", "training/input/", "training/objectives.py")
ENTRYPOINT_ONLY = ("training/entrypoint/",)
# Not a run's path: validation, the config's own tables and reference, the MLflow params (every
# field as written), the planner and the comparison (they read a run's config to plan or compare).
NOT_A_READ = ("config.py", "config_scope.py", "config_reference.py", "tracking/params.py", "plan/", "compare.py")
SECTIONS = {"cluster": "cluster", "train": "train", "tracking": "tracking", "placement": "placement",
            "pinning": "train.pinning"}
TYPED = {"ClusterConfig": "cluster", "TrainConfig": "train", "PinningConfig": "train.pinning",
         "TrackingConfig": "tracking", "PlacementConfig": "placement"}  # a parameter annotated so
ROOTS = ("cfg", "config")  # how the code names the whole config


def schema_fields() -> list[str]:
    return [field for field, _ in fields()]


def _nested(field: str, value) -> dict:
    *parents, leaf = field.split(".")
    out = {leaf: value}
    for part in reversed(parents):
        out = {part: out}
    return out


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def _config(path: str, field: str, *, companions: bool) -> dict:
    value, needs = SAMPLES[field]
    # train.entrypoint written on a model path chooses the entrypoint path (the model left unwritten).
    choice = {} if field == "train.entrypoint" else CHOICE[path]
    data = _merge(BASE, {"train": choice})
    if companions:
        data = _merge(data, needs)
    return _merge(data, _nested(field, value))


def _function_reads(fn: ast.AST) -> set[str]:
    """Dotted config fields read in one function: `cfg.train.steps`, or `t.steps` after `t = cfg.train`."""
    alias = {}
    for arg in fn.args.args + fn.args.kwonlyargs if isinstance(fn, ast.FunctionDef) else ():
        kind = ast.unparse(arg.annotation).strip("'\"") if arg.annotation else ""
        if kind in TYPED:
            alias[arg.arg] = TYPED[kind]
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
            if isinstance(node.value, ast.Tuple):
                pairs += [p for t in node.targets if isinstance(t, ast.Tuple) for p in zip(t.elts, node.value.elts)]
            for target, value in pairs:
                if isinstance(target, ast.Name) and isinstance(value, ast.Attribute) and value.attr in SECTIONS:
                    alias[target.id] = SECTIONS[value.attr]
    reads = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr in SECTIONS:
            reads.add(f"{SECTIONS[owner.attr]}.{node.attr}")
        elif isinstance(owner, ast.Name) and owner.id in alias:
            reads.add(f"{alias[owner.id]}.{node.attr}")
        elif isinstance(owner, ast.Name) and owner.id in ROOTS or (isinstance(owner, ast.Attribute)
                                                                  and owner.attr in ("_cfg", "cfg")):
            reads.add(node.attr)
    return reads


@cache
def reads_on(path: str) -> frozenset[str]:
    skip = NOT_A_READ + (LOOP_ONLY if path == ENTRYPOINT else ENTRYPOINT_ONLY)
    found = set()
    for file in SRC.rglob("*.py"):
        rel = file.relative_to(SRC).as_posix()
        if rel.startswith(skip):
            continue
        tree = ast.parse(file.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found |= _function_reads(fn)
    return frozenset(found)


def test_every_field_has_a_sample():
    assert sorted(set(schema_fields()) ^ set(SAMPLES)) == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("field", schema_fields())
def test_a_field_takes_effect_on_the_path_or_is_refused_in_one_line(field, path):
    refused = refused_on(field, path)
    try:
        cfg = config_from_dict(_config(path, field, companions=not refused))
    except ConfigError as err:
        line = str(err)
        assert "\n" not in line and line.startswith(f"{field}: got "), line
        assert CHOSEN_BY[path] in line, f"refused, but not for the path ({CHOSEN_BY[path]}): {line}"
        assert refused or field == "cluster.evaluator", f"refused outside config_scope.NO_EFFECT: {line}"
        return
    assert not refused, f"{field} has no effect on the {path} path, yet it was accepted"
    if field == "train.entrypoint" and path != ENTRYPOINT:
        assert path_of(cfg.train) == ENTRYPOINT  # it chooses the path
        return
    assert field in reads_on(path), f"{field} is accepted on the {path} path but no code of that path reads it"


def test_the_issue_example_fails_in_one_line_naming_both_fields():
    """Issue 50's new user: an entrypoint, a model and a layer pin of their own model."""
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "fit", "train": {"strategy": "none", "entrypoint": "fit_example.train:main",
                                                   "model": "cnn", "pinning": {"layers": {"my_dense": "/GPU:1"}}}})
    assert str(err.value) == ("train.pinning.layers: got {'my_dense': '/GPU:1'}; has no effect with "
                              "train.entrypoint (your code builds the model and places its ops); put tf.device in "
                              "your code, or remove it; train.model has no effect there either")
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "fit", "train": {"strategy": "none", "entrypoint": "fit_example.train:main",
                                                   "pinning": {"layers": {"my_dense": "/GPU:1"}}}})
    assert str(err.value) == ("train.pinning.layers: got {'my_dense': '/GPU:1'}; has no effect with "
                              "train.entrypoint (your code builds the model and places its ops); put tf.device in "
                              "your code, or remove it")


def test_defaults_never_written_are_not_refused_and_survive_the_round_trip():
    """An entrypoint config states no model, steps or seed: their defaults are not refused, and the
    config written for the tasks (config_to_yaml) reloads as the same config, still accepted."""
    import yaml

    cfg = config_from_dict(_merge(BASE, {"train": CHOICE[ENTRYPOINT]}))
    again = config_from_dict(yaml.safe_load(config_to_yaml(cfg)))
    assert (again.digest(), again.train.model_fields_set) == (cfg.digest(), {"strategy", "entrypoint"})


@pytest.mark.parametrize("field", sorted(NEEDS))
def test_a_field_whose_condition_does_not_hold_is_refused_in_one_line(field):
    """Written without what it needs (its sample's other fields), on the path where it would act."""
    try:
        config_from_dict(_config(BUILTIN, field, companions=False))
    except ConfigError as err:
        assert str(err).startswith(f"{field}: got ") and f"has no effect {NEEDS[field].condition}; " in str(err)
    else:
        raise AssertionError(f"{field} was accepted without its condition ({NEEDS[field].condition})")


def test_the_removed_cadence_setting_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "tracking": {"metrics_interval_s": 2}})
    assert str(err.value) == ("tracking.metrics_interval_s: got 2; removed: step metrics reach MLflow at most once "
                              "per tracking.step_metrics_every_s, the one cadence setting; set that instead")


def test_the_read_check_sees_a_read_and_misses_none():
    """Negative control of the syntax walk: `t.steps` after `t = cfg.train` is a read of
    train.steps; a local named like a field is not."""
    tree = ast.parse("def f(cfg):\n    t = cfg.train\n    steps = 3\n    return t.steps, cfg.tracking.uri, steps\n")
    assert _function_reads(tree.body[0]) == {"train", "tracking", "train.steps", "tracking.uri"}
