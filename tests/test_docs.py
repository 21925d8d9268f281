"""What README.md, docs/ and the Makefile say about the code, checked against the code."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str, cwd: Path = REPO) -> str:
    proc = subprocess.run(["make", "-s", "--no-print-directory", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _make_var(name: str, *args: str) -> str:
    """A Makefile variable's value as make computes it (nothing runs)."""
    return _make("--eval", "print-%: ; @echo $($*)", f"print-{name}", *args).strip()


def test_readme_lists_the_targets_make_help_prints():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Make targets \(`make help`\)\n\n```\n(.*?)```\n", readme, re.S)
    assert block, "README.md has no '## Make targets (`make help`)' block"
    assert block.group(1) == _make("help")


@pytest.mark.parametrize("line", ["name: demo-x", 'name: "demo-x"', "name: 'demo-x'  # quoted", "name:   demo-x # c"])
def test_make_run_dir_is_runs_slash_the_configs_name_bare_or_quoted(line, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{line}\ntrain: {{steps: 3}}\n")
    assert _make_var("RUN_DIR", f"CONFIG={cfg}") == "runs/demo-x"


def test_one_python_version_in_pyproject_readme_ruff_and_the_image():
    """tracking/uri.py imports tomllib (3.11+): pyproject may not promise 3.10."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lowest = re.match(r">=(\d+\.\d+)", pyproject["project"]["requires-python"]).group(1)
    assert lowest == "3.11"
    assert f"Python {lowest}" in (REPO / "README.md").read_text()
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")
    assert f"ARG BASE_IMAGE=python:{lowest}." in (REPO / "docker" / "Dockerfile.cpu").read_text()


def test_kubernetes_docs_count_the_api_attempts_as_the_client_makes_them():
    from pinpoint.k8s.launch import LaunchOptions

    attempts = LaunchOptions().retry_attempts  # what the launch step's KubeApi is given
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    assert f"get {attempts} attempts in all (the\n  first and {attempts - 1} retries)" in docs


def test_make_images_builds_the_gpu_image_only_when_asked():
    build = (REPO / "docker" / "build.sh").read_text()
    assert 'IMAGES=${IMAGES:-cpu${GPU:+ gpu}}' in build  # cpu, plus gpu when GPU is set
    recipe = _make("-n", "images", "GPU=1")
    assert recipe.startswith('GPU="1" ') and recipe.rstrip().endswith("bash docker/build.sh")
    assert not _make("-n", "images").startswith("GPU")
    readme = (REPO / "README.md").read_text()
    assert "builds the CPU and GPU" not in readme and "`make images GPU=1` also the GPU image" in readme


def _tier_expressions() -> list[str]:
    """The marker expressions `make test` runs, as the TIER function composes them."""
    make = (REPO / "Makefile").read_text()
    (template,) = re.findall(r'^TIER = .*-m "([^"]*)"', make, re.M)
    tiers = re.findall(r'^\t@\$\(TIER\) "([^"]+)"', make, re.M)
    assert {"unit", "integration and not slow", "slow"} <= set(tiers)
    return [template.replace("$$m", t) for t in set(tiers)]


@pytest.mark.parametrize("marks", [{"gpu", "integration"}, {"gpu", "unit"}, {"gpu", "slow"}, {"gpu", "integration", "slow"}])
def test_every_tier_deselects_the_gpu_tests_by_marker(marks):
    for expr in _tier_expressions():
        assert not Expression.compile(expr).evaluate(lambda m: m in marks), (expr, marks)
    # ... and keeps the rest of its tier.
    kept = [e for e in _tier_expressions() if Expression.compile(e).evaluate(lambda m: m in marks - {"gpu"})]
    assert kept, marks


def test_make_test_gpu_selects_the_gpu_marker():
    assert ' -m gpu tests' in _make("-n", "test-gpu")


def test_the_gpu_tests_have_no_skip_of_their_own():
    """Deselected by marker, not skipped after importing TensorFlow once per case."""
    text = (REPO / "tests" / "test_fidelity.py").read_text()
    assert "pytest.skip(" not in text
