"""One class per Kubernetes flavour (pinpoint.provision.flavours): the registry matches the names
config.py admits, each class's pod count is its manifests' tasks, and no module outside the
classes switches on a flavour's name or workload kind."""

import ast
from pathlib import Path

import pytest
import yaml

from pinpoint.config import FLAVORS
from pinpoint.provision.flavours import BY_KIND, FLAVOURS
from pinpoint.provision.manifests import build_manifests
from pinpoint.provision.spec import build_tasks
from tests.conftest import make_config

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src" / "pinpoint"
SCHEMAS = HERE.parent.parent / "shared" / "schemas"
# The modules that may name flavours and kinds in comparisons: the classes and their registry.
FLAVOUR_MODULES = {"flavour.py", "flavours.py", "tfjob.py", "plain.py", "jobset.py", "trainjob.py"}


def test_the_registry_has_one_class_per_config_flavour():
    assert list(FLAVOURS) == list(FLAVORS)
    assert [f.name for f in FLAVOURS.values()] == list(FLAVORS)
    assert sorted(BY_KIND) == ["Job", "JobSet", "TFJob", "TrainJob"]
    assert {k: f.kind for k, f in BY_KIND.items()} == {k: k for k in BY_KIND}


CHIEF, WORKERS, EVALUATOR = 1, 3, 1


def _workloads(flavor: str) -> tuple[list[dict], int]:
    """The flavour's workload documents for CHIEF + WORKERS + EVALUATOR tasks, and the tasks."""
    cfg = make_config("job", train={"strategy": "multi_worker_mirrored"},
                      cluster={"flavor": flavor, "chief": CHIEF, "workers": WORKERS, "evaluator": EVALUATOR,
                               "emulate": True, "runs_volume_claim": "runs-rwx"})
    tasks = build_tasks(cfg)
    docs = [d for docs in build_manifests(cfg, tasks).values() for d in docs if d["kind"] == FLAVOURS[flavor].kind]
    return docs, len(tasks)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_flavours_pod_count_is_its_manifests_tasks(flavor):
    docs, tasks = _workloads(flavor)
    assert sum(FLAVOURS[flavor].pod_count(d) for d in docs) == tasks == CHIEF + WORKERS + EVALUATOR


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_flavours_api_is_the_api_version_its_manifests_write(flavor):
    _, group, version = FLAVOURS[flavor].api
    docs, _ = _workloads(flavor)
    assert {d["apiVersion"] for d in docs} == {f"{group}/{version}"}


@pytest.mark.parametrize("flavor", ["tfjob", "jobset", "trainjob"])
def test_a_custom_flavours_api_is_its_crds(flavor):
    """What the launch step's client calls the kind (KubeApi.KINDS) is what the real CRD serves."""
    resource, group, version = FLAVOURS[flavor].api
    file = f"{group}_{resource}.yaml"
    path = next(p for p in (HERE / "data" / "provision" / file, SCHEMAS / file) if p.is_file())
    crd = yaml.safe_load(path.read_text())["spec"]
    assert (crd["group"], crd["names"]["plural"], crd["names"]["kind"]) == (group, resource, FLAVOURS[flavor].kind)
    assert version in [v["name"] for v in crd["versions"] if v["served"]]


def _switches(path: Path) -> list[str]:
    """Comparisons of a constant flavour name or workload kind (`x == "plain"`, `kind in ("JobSet", ...)`)."""
    names = set(FLAVOURS) | set(BY_KIND)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        consts = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
        if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_flavour_switch_outside_the_flavour_classes():
    outside = [p for p in sorted(SRC.rglob("*.py"))
               if not (p.parent.name == "provision" and p.name in FLAVOUR_MODULES)]
    assert [s for p in outside for s in _switches(p)] == []


def test_the_switch_check_sees_a_switch(tmp_path):
    """Negative control: the two shapes a switch takes are reported."""
    module = tmp_path / "launch.py"
    module.write_text('if cfg.cluster.flavor == "plain":\n    pass\nx = kind in ("TFJob", "JobSet")\n')
    assert _switches(module) == ["launch.py:1: cfg.cluster.flavor == 'plain'",
                                 "launch.py:3: kind in ('TFJob', 'JobSet')"]
