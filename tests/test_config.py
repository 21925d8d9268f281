"""Config validation: the demo config loads, and bad values give one line naming field and fix."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pinpoint.config import config_from_dict, load_config
from pinpoint.errors import ConfigError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def test_demo_config_loads():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.name == "demo"
    assert cfg.train.strategy == "mirrored"
    assert cfg.replica_devices() == ["/GPU:0", "/GPU:1"]
    assert cfg.cluster.emulate is True


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "examples").glob("*/config.yaml")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_config_is_valid(path):
    data = yaml.safe_load(path.read_text())
    if "name" not in data or "nodes" in data:
        pytest.skip("not a run config (e.g. a node inventory)")
    load_config(path)


def test_config_is_frozen():
    cfg = config_from_dict({"name": "x"})
    with pytest.raises(ValidationError, match="frozen"):
        cfg.name = "y"  # type: ignore[misc]


def test_digest_is_stable_and_sensitive():
    a = config_from_dict({"name": "x", "train": {"steps": 10}})
    b = config_from_dict({"name": "x", "train": {"steps": 10}})
    c = config_from_dict({"name": "x", "train": {"steps": 11}})
    assert a.digest() == b.digest() != c.digest()


BAD = [
    ({"name": "x", "train": {"strategy": "mirorred"}}, "train.strategy", "mirorred"),
    ({"name": "x", "train": {"stratgy": "mirrored"}}, "train.stratgy", "unknown key"),
    ({"name": "Bad_Name"}, "name", "DNS-1123"),
    ({"name": "x", "train": {"steps": -5}}, "train.steps", "-5"),
    ({"name": "x", "train": {"batch_size": "many"}}, "train.batch_size", "many"),
    ({"name": "x", "cluster": {"workers": -1}}, "cluster.workers", "-1"),
    ({"name": "x", "cluster": {"chief": 2}}, "cluster.chief", "2"),
    ({"name": "x", "train": {"strategy": "mirrored", "pinning": {"variables": "/GPU:0"}}},
     "train.pinning.variables", "every replica"),
    ({"name": "x", "train": {"strategy": "central_storage", "pinning": {"gradients": "/GPU:0"}}},
     "train.pinning.gradients", "use strategy 'none'"),
    ({"name": "x", "train": {"strategy": "mirrored", "pinning": {"layers": {"dense_1": "/GPU:1"}}}},
     "train.pinning.layers", "model parallelism"),
    ({"name": "x", "cluster": {"devices_per_worker": 2},
      "train": {"strategy": "none", "pinning": {"gradients": "/GPU:5"}}}, "train.pinning.gradients", "/GPU:0../GPU:1"),
    ({"name": "x", "train": {"pinning": {"input": "gpu0"}}}, "train.pinning.input", "device string"),
    ({"name": "x", "train": {"strategy": "parameter_server"}}, "cluster.ps", "ps task"),
    ({"name": "x", "cluster": {"chief": 0, "workers": 2, "ps": 1}, "train": {"strategy": "parameter_server"}},
     "cluster.chief", "coordinate"),
    ({"name": "x", "cluster": {"evaluator": 1}, "train": {"strategy": "mirrored"}}, "cluster.evaluator", "evaluator"),
    ({"name": "x", "cluster": {"chief": 0, "workers": 0}}, "cluster.workers", "at least one"),
    ({"name": "x", "cluster": {"workers": 2}, "train": {"strategy": "mirrored"}}, "cluster.workers", "one process"),
    ({"name": "x", "cluster": {"ps": 1}, "train": {"strategy": "mirrored"}}, "cluster.ps", "does not use"),
    ({"name": "x", "train": {"data": "data.parquet"}}, "train.data", "parquet:GLOB"),
    ({"name": "x", "cluster": {"namespace": "Team_A"}}, "cluster.namespace", "DNS-1123"),
    ({"name": "x", "cluster": {"port": 80}}, "cluster.port", "80"),
    ({"name": "x", "cluster": {"flavor": "helm"}}, "cluster.flavor", "helm"),
    ({"name": "x", "train": {"learning_rate": 0}}, "train.learning_rate", "0"),
    ({"cluster": {}}, "name", "got nothing (a required key)"),
    ({"name": "x", "placement": {"enabled": False, "memory": True}}, "placement.memory", "placement.enabled: true"),
    ({"name": "x", "cluster": {"gpu_memory": "16GiB"}}, "cluster.gpu_memory", "set placement.memory: true"),
    ({"name": "x", "cluster": {"gpu_memory": "16 gigs"}, "placement": {"memory": True}}, "cluster.gpu_memory",
     "pass a size with a unit"),
    ({"name": "x", "placement": {"enabled": False, "timing": True}}, "placement.timing", "placement.enabled: true"),
]


@pytest.mark.parametrize("data,field,hint", BAD, ids=[b[1] + ":" + b[2][:12] for b in BAD])
def test_bad_values_give_one_line_naming_field(data, field, hint):
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{field}: got "), msg  # 'field: got X; do Y'
    assert hint in msg


def test_malformed_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\ntrain: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML at line"):
        load_config(p)


def test_yaml_is_loaded_safely(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(p)


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no/such.yaml")


# ---- train.all_reduce ---------------------------------------------------------------------------

def _all_reduce(choice, strategy="mirrored", **cluster):
    c = {"chief": 1, "workers": 1 if strategy == "multi_worker_mirrored" else 0, "devices_per_worker": 2}
    c.update(cluster)
    return {"name": "x", "cluster": c, "train": {"strategy": strategy, "all_reduce": choice}}


ALL_REDUCE_REFUSED = [
    (_all_reduce("ring", "central_storage"), "strategy 'central_storage' does not all-reduce"),
    (_all_reduce("reduce_to_host", "one_device"), "strategy 'one_device' does not all-reduce"),
    (_all_reduce("ring", "none"), "use strategy mirrored or multi_worker_mirrored"),
    (_all_reduce("hierarchical_copy", "multi_worker_mirrored"), "collectives only"),
    (_all_reduce("reduce_to_host", "multi_worker_mirrored"), "collectives only"),
    (_all_reduce("nccl"), "NCCL needs real GPUs; emulated GPUs are CPU devices: use ring"),
    (_all_reduce("nccl", "multi_worker_mirrored"), "NCCL needs real GPUs"),
    (_all_reduce("nccl", emulate=False, device_type="CPU"), "NCCL needs GPUs and the replicas are CPUs"),
    (_all_reduce("hierarchical_copy", devices_per_worker=3), "drops the last one of 3"),
    (_all_reduce("all_gather"), "all_gather"),
]


@pytest.mark.parametrize("data,hint", ALL_REDUCE_REFUSED,
                         ids=[f"{d['train']['strategy']}-{d['train']['all_reduce']}-{i}"
                              for i, (d, _) in enumerate(ALL_REDUCE_REFUSED)])
def test_all_reduce_tensorflow_cannot_run_is_refused_in_one_line(data, hint):
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("train.all_reduce: got ")
    assert hint in msg, msg


@pytest.mark.parametrize("data", [
    _all_reduce("ring"), _all_reduce("reduce_to_host"), _all_reduce("hierarchical_copy"),
    _all_reduce("hierarchical_copy", devices_per_worker=4), _all_reduce("nccl", emulate=False),
    _all_reduce("ring", "multi_worker_mirrored"), _all_reduce("nccl", "multi_worker_mirrored", emulate=False),
    _all_reduce("auto", "parameter_server", workers=1, ps=1, devices_per_worker=1),
], ids=lambda d: f"{d['train']['strategy']}-{d['train']['all_reduce']}-{d['cluster']['devices_per_worker']}")
def test_all_reduce_combinations_tensorflow_can_run_load(data):
    assert config_from_dict(data).train.all_reduce == data["train"]["all_reduce"]


def test_all_reduce_defaults_to_auto():
    assert config_from_dict({"name": "x"}).train.all_reduce == "auto"


# ---- train.pinning.layers on parameter servers ---------------------------------------------------

PS_CLUSTER = {"chief": 1, "workers": 1, "ps": 2}


@pytest.mark.unit
@pytest.mark.parametrize("cfg,line", [
    ({"name": "x", "cluster": {"devices_per_worker": 2},
      "train": {"strategy": "none", "pinning": {"layers": {"dense_1": "/job:ps/task:0/CPU:0"}}}},
     "train.pinning.layers.dense_1: got '/job:ps/task:0/CPU:0'; a /job:ps device holds variables under strategy "
     "parameter_server only, not 'none'; pin to a device of this task or use strategy parameter_server"),
    ({"name": "x", "cluster": PS_CLUSTER,
      "train": {"strategy": "parameter_server", "pinning": {"layers": {"head": "/job:ps/task:2/CPU:0"}}}},
     "train.pinning.layers.head: got '/job:ps/task:2/CPU:0'; the cluster has 2 ps task(s) (cluster.ps), so use "
     "/job:ps/task:0../job:ps/task:1"),
    ({"name": "x", "cluster": PS_CLUSTER,
      "train": {"strategy": "parameter_server", "pinning": {"layers": {"head": "/CPU:0"}}}},
     "train.pinning.layers.head: got '/CPU:0'; parameter_server places a layer's variables on a ps task and runs "
     "the layer on the worker; pin to '/job:ps/task:K/CPU:0'"),
])
def test_ps_layer_pins_refused_in_one_line(cfg, line):
    with pytest.raises(ConfigError) as err:
        config_from_dict(cfg)
    assert str(err.value) == line


@pytest.mark.unit
def test_ps_layer_pins_accepted_under_parameter_server():
    cfg = config_from_dict({"name": "x", "cluster": PS_CLUSTER, "train": {
        "strategy": "parameter_server", "pinning": {"layers": {"dense_1": "/job:ps/task:1/CPU:0"}}}})
    assert dict(cfg.train.pinning.layers) == {"dense_1": "/job:ps/task:1/CPU:0"}
