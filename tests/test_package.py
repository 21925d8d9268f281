"""The package a user installs, and the TensorFlow it installs beside.

The wheel `python -m build` makes holds every module, template and entry point of the source
tree; installed alone into a fresh virtualenv (dependencies from requirements.lock, the wheel
itself not editable, run from outside the checkout) it runs `pinpoint trace` on a program, a
train.entrypoint config and `pinpoint run`. pyproject.toml declares the ranges of versions.py, the
locks are the ends of the range, and a TensorFlow outside it is refused at start in one line."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import pinpoint
from pinpoint.placement.model.files import read_placement
from pinpoint.versions import CHECKED, SUPPORTED, VersionError, check_version, distribution, installed
from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# What a build needs: the sdist is made from these, the wheel from the sdist.
SOURCES = ("pyproject.toml", "README.md", "src", "components", "pipelines")
PACKAGE_ROOTS = {"pinpoint": REPO / "src" / "pinpoint", "components": REPO / "components",
                 "pipelines": REPO / "pipelines"}
_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def _source_files() -> set[str]:
    """Every file of the packages as its path inside a wheel (pinpoint/placement/report/templates/x.j2)."""
    files = set()
    for top, root in PACKAGE_ROOTS.items():
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc" \
                    and not (top != "pinpoint" and path.suffix == ".yaml"):  # `make compile`'s output
                files.add("/".join((top, *rel.parts)))
    return files


def _declared_entry_points() -> dict[str, dict[str, str]]:
    groups = {"console_scripts": dict(PYPROJECT["project"]["scripts"])}
    groups.update({g: dict(eps) for g, eps in PYPROJECT["project"]["entry-points"].items()})
    return groups


def _lock_version(lock: Path, name: str) -> Version:
    (pin,) = re.findall(rf"^{re.escape(name)}==(\S+)", lock.read_text(), flags=re.M)
    return Version(pin)


# --- the supported range ------------------------------------------------------------------------


@pytest.mark.unit
def test_pyproject_declares_the_ranges_versions_py_supports():
    declared = {r.name: r.specifier for r in map(Requirement, PYPROJECT["project"]["dependencies"])}
    assert {name: declared[distribution(name)] for name in SUPPORTED} == {n: SpecifierSet(s) for n, s in SUPPORTED.items()}
    # Ranges, not pins: no declared dependency (nor an extra's) names one exact version.
    extras = [r for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in map(Requirement, reqs)]
    assert [r.name for r in [*map(Requirement, PYPROJECT["project"]["dependencies"]), *extras]
            if any(c.operator == "==" for c in r.specifier)] == []


@pytest.mark.unit
@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-compat.txt"])
def test_each_lock_installs_versions_inside_the_range(lock):
    assert {name: SpecifierSet(spec).contains(_lock_version(REPO / lock, distribution(name)))
            for name, spec in SUPPORTED.items()} == dict.fromkeys(SUPPORTED, True)


@pytest.mark.unit
def test_the_two_locks_are_the_two_ends_of_the_tensorflow_range():
    """make test runs the newest minor the range admits, make test-compat the oldest."""
    spec = SpecifierSet(SUPPORTED["tensorflow"])
    (low,) = [Version(s.version) for s in spec if s.operator == ">="]
    (high,) = [Version(s.version) for s in spec if s.operator == "<"]
    newest, oldest = (_lock_version(REPO / f, "tensorflow") for f in ("requirements.lock", "requirements-compat.txt"))
    assert (oldest.major, oldest.minor) == (low.major, low.minor)
    assert (newest.major, newest.minor + 1) == (high.major, high.minor)


@pytest.mark.unit
def test_the_install_page_states_the_range_and_the_versions_of_both_ends():
    readme = " ".join((REPO / "docs" / "install.md").read_text().split())
    assert "TensorFlow `{tensorflow}`, Keras `{keras}`, MLflow `{mlflow}`".format(**SUPPORTED) in readme
    for lock in ("requirements.lock", "requirements-compat.txt"):
        tf, keras, mlflow = (_lock_version(REPO / lock, n) for n in ("tensorflow", "keras", "mlflow-skinny"))
        assert f"TensorFlow {tf} with Keras {keras}" in readme and f"MLflow {mlflow}" in readme


@pytest.mark.unit
@pytest.mark.parametrize("version", ["2.16.0", "2.16.2", "2.21.0", "2.21.1rc0"])
def test_a_tensorflow_inside_the_range_passes(version):
    check_version("tensorflow", version)


@pytest.mark.unit
@pytest.mark.parametrize("version", ["2.15.1", "2.22.0", "2.22.0rc0", "3.0.0"])
def test_a_tensorflow_outside_the_range_is_refused_in_one_line(version):
    with pytest.raises(VersionError) as err:
        check_version("tensorflow", version)
    assert str(err.value) == (f"tensorflow: got {version}; Pinpoint supports tensorflow>=2.16,<2.22 — install a "
                              f'version in that range (pip install "tensorflow>=2.16,<2.22")')


@pytest.mark.unit
def test_keras_2_and_a_missing_keras_are_refused():
    with pytest.raises(VersionError, match=r'^keras: got 2\.15\.0; Pinpoint supports keras>=3\.15,<4 '):
        check_version("keras", "2.15.0")
    with pytest.raises(VersionError, match=r"^keras: got nothing \(not installed\); "):
        check_version("keras", None)


@pytest.mark.unit
def test_tensorflow_installed_as_tensorflow_cpu_is_found_and_checked(monkeypatch):
    """The CPU-only distribution imports as `tensorflow` too: its version is the one checked."""
    from pinpoint import versions

    dists = {"tensorflow-cpu": "2.15.0", "keras": "3.15.1"}  # a FAKE installed set (metadata only)

    def version(name):
        if name not in dists:
            raise metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(versions.metadata, "version", version)
    assert installed("tensorflow") == "2.15.0"
    with pytest.raises(VersionError, match=r"^tensorflow: got 2\.15\.0; "):
        versions.check_supported()


def _shadow_tensorflow(root: Path, version: str) -> dict[str, str]:
    """An environment whose `tensorflow` distribution metadata says `version`: a FAKE dist-info
    (metadata only) on PYTHONPATH, found before the real one in site-packages."""
    info = root / f"tensorflow-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorflow\nVersion: {version}\n")
    return {**os.environ, "PYTHONPATH": str(root)}


@pytest.mark.unit
def test_pinpoint_refuses_an_old_tensorflow_at_start_before_any_work(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the program ran')\n")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "trace", "--no-tracking", "--out", str(out),
                           str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=_shadow_tensorflow(tmp_path / "shadow", "2.15.1"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ('pinpoint: tensorflow: got 2.15.1; Pinpoint supports tensorflow>=2.16,<2.22 — install '
                           'a version in that range (pip install "tensorflow>=2.16,<2.22")\n')
    assert not out.exists()


@pytest.mark.unit
def test_version_prints_pinpoints_tensorflows_keras_and_mlflows_versions(tmp_path):
    """Also with a TensorFlow outside the range: --version reports, it does not refuse."""
    proc = subprocess.run([sys.executable, "-m", "pinpoint.cli", "--version"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=_shadow_tensorflow(tmp_path / "shadow", "2.15.1"))
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        f"pinpoint {pinpoint.__version__}",
        f"tensorflow 2.15.1 (supported: {SUPPORTED['tensorflow']})",
        f"keras {metadata.version('keras')} (supported: {SUPPORTED['keras']})",
        f"mlflow {metadata.version('mlflow-skinny')} (supported: {SUPPORTED['mlflow']})",
    ]


@pytest.mark.unit
def test_this_environment_is_inside_the_range():
    """The check every command runs passes here (else every CLI test would fail on it first)."""
    assert {name: installed(name) for name in CHECKED} == {name: metadata.version(name) for name in CHECKED}
    for name in CHECKED:
        check_version(name, installed(name))


# --- the wheel ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """`python -m build` on a copy of the sources (the build writes egg-info and build/ beside
    them): an sdist, then the wheel from that sdist."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=_NOT_SOURCE)
        else:
            shutil.copy2(path, src / name)
    # --no-isolation: the build backend from requirements.lock (setuptools), nothing downloaded.
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (sdist,) = (root / "dist").glob("*.tar.gz")
    (wheel,) = (root / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_wheel_holds_every_module_template_and_package(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    expected = _source_files()
    assert sorted(expected - names) == []
    # Every package under src/pinpoint by name (pinpoint.trace was once missing from a hand list).
    packages = {str(p.parent.relative_to(REPO / "src")) for p in (REPO / "src" / "pinpoint").rglob("__init__.py")}
    assert sorted(p for p in packages if f"{p}/__init__.py" not in names) == []
    assert {"pinpoint/trace/__init__.py", "pinpoint/placement/report/templates/report.html.j2"} <= names
    # Nothing else: no tests, benchmarks or examples in the package.
    assert sorted(n for n in names - expected if not n.startswith("pinpoint-")) == []


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_wheel_declares_every_entry_point_and_the_ranges(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        dist_info = f"pinpoint-{pinpoint.__version__}.dist-info"
        eps = configparser.ConfigParser(delimiters=("=",))
        eps.optionxform = str  # entry-point names are case-sensitive
        eps.read_string(wheel.read(f"{dist_info}/entry_points.txt").decode())
        meta = wheel.read(f"{dist_info}/METADATA").decode()
        names = set(wheel.namelist())
    found = {g: {k: v.strip() for k, v in eps[g].items()} for g in eps.sections()}
    assert found == _declared_entry_points()
    # Each entry point's module is in the wheel.
    modules = {v.split(":")[0] for group in found.values() for v in group.values()}
    assert sorted(m for m in modules if f"{m.replace('.', '/')}.py" not in names) == []
    requires = {r.name: r.specifier for r in map(Requirement, re.findall(r"^Requires-Dist: (.*)$", meta, flags=re.M))
                if r.marker is None}
    assert {name: requires[distribution(name)] for name in SUPPORTED} == {n: SpecifierSet(s) for n, s in SUPPORTED.items()}
    assert re.search(r"^Version: (.*)$", meta, flags=re.M).group(1) == pinpoint.__version__


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_sdist_holds_the_sources_the_wheel_is_built_from(built):
    import tarfile

    with tarfile.open(built["sdist"]) as sdist:
        prefix = f"pinpoint-{pinpoint.__version__}/"
        names = {n.removeprefix(prefix) for n in sdist.getnames()}
    expected = {f"src/{f}" if f.startswith("pinpoint/") else f for f in _source_files()}
    assert sorted(expected - names) == []
    assert {"pyproject.toml", "README.md"} <= names


# --- a fresh virtualenv with only the wheel -----------------------------------------------------


def _in_venv(venv: Path, *args, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a command of the venv as its user would: its bin/ first on PATH, no PYTHONPATH, from a
    folder outside the checkout (so nothing imports from the source tree)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PINPOINT_VERBOSE")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fresh_venv_with_only_the_wheel_runs_trace_an_entrypoint_config_and_run(built, tmp_path):
    venv = tmp_path / "venv"
    uv = Path(sys.executable).parent / "uv"  # make setup installs it beside the interpreter
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    for args in (["-r", str(REPO / "requirements.lock")], ["--no-deps", str(built["wheel"])]):
        proc = subprocess.run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *args],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
    work = tmp_path / "work"
    work.mkdir()

    # Installed, not editable: every package imports from the venv's site-packages.
    where = _ok(_in_venv(venv, "python", "-c", "import pinpoint.trace, components, pipelines; "
                         "print(pinpoint.trace.__file__, components.__file__, pipelines.__file__)", cwd=work))
    site = str(venv / "lib")
    assert [f.startswith(site) for f in where.split()] == [True, True, True]
    assert _ok(_in_venv(venv, "pinpoint", "--version", cwd=work)).splitlines()[:2] == [
        f"pinpoint {pinpoint.__version__}",
        f"tensorflow {_lock_version(REPO / 'requirements.lock', 'tensorflow')} (supported: {SUPPORTED['tensorflow']})"]

    # 1. pinpoint trace on a program (a module of a copied example: the cwd is its code folder):
    # model.fit under MirroredStrategy() finds the 2 emulated GPUs and mirrors every weight on them.
    shutil.copytree(REPO / "examples" / "keras_fit", work / "keras_fit", ignore=_NOT_SOURCE)
    _ok(_in_venv(venv, "pinpoint", "trace", "--gpus", "2", "--no-tracking", "--out", str(tmp_path / "trace"),
                 "-m", "fit_example.train", "--epochs", "1", "--steps-per-epoch", "5", "--batch-size", "32",
                 cwd=work / "keras_fit"))
    p = read_placement(tmp_path / "trace")
    assert (p["strategy"], p["devices"]) == ("mirrored", ["/CPU:0", "/GPU:0", "/GPU:1"])
    assert {v["name"]: [c["device"] for c in v["components"]] for v in p["variables"]
            if v["name"].startswith("digits_mlp/")} == dict.fromkeys(
        ["digits_mlp/hidden/kernel", "digits_mlp/hidden/bias", "digits_mlp/logits/kernel", "digits_mlp/logits/bias"],
        ["/GPU:0", "/GPU:1"])
    assert (tmp_path / "trace" / "report.html").is_file()

    # 2. A train.entrypoint config (the custom loop: one replica, the head pinned to /GPU:1 by its code).
    shutil.copytree(REPO / "examples" / "custom_loop", work / "custom_loop", ignore=_NOT_SOURCE)
    config = work / "custom_loop" / "config.yaml"
    text = re.sub(r"^  entrypoint_args: .*$", "  entrypoint_args: {steps: 20, batch_size: 32, save_every: 10}",
                  config.read_text(), flags=re.M)
    config.write_text(re.sub(r"^  enabled: true", "  enabled: false", text, flags=re.M))
    _ok(_in_venv(venv, "pinpoint", "train", str(config), "--out", str(tmp_path / "train"), cwd=work))
    p = read_placement(tmp_path / "train")
    assert (p["training_function"], p["functions"][0]["calls"]) == ("train_step", 20)
    assert {v["name"]: v["devices"] for v in p["variables"]}["head/kernel"] == ["/GPU:1"]

    # 3. pinpoint run: the pipeline through kfp.local (its commands come from the pipelines package's
    # entry points), the local MLflow store in the cwd; mirrored on the 2 emulated GPUs.
    demo = work / "demo.yaml"
    text = (REPO / "configs" / "demo.yaml").read_text()
    for key, value in (("name", "wheel-run"), ("  steps", "20"), ("  checkpoint_every", "10")):
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
    demo.write_text(text)
    out = _ok(_in_venv(venv, "pinpoint", "run", str(demo), "--runs-root", str(tmp_path / "runs"), cwd=work,
                       timeout=1500))
    run_dir = tmp_path / "runs" / "wheel-run"
    assert f"Run folder: {run_dir}" in out.splitlines()
    p = read_placement(run_dir)
    assert (p["strategy"], p["devices"]) == ("mirrored", ["/CPU:0", "/GPU:0", "/GPU:1"])
    # The mlp's three dense kernels (dense_1, dense_2, head), each one component per emulated GPU.
    kernels = [v for v in p["variables"] if v["name"].endswith("kernel")]
    assert [[c["device"] for c in v["components"]] for v in kernels] == [["/GPU:0", "/GPU:1"]] * 3
    assert sorted(f.name for f in run_dir.iterdir() if f.name in {"cluster_spec.json", "metrics.json", "report.html"}) \
        == ["cluster_spec.json", "metrics.json", "report.html"]
