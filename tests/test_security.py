"""Security properties that do not depend on a running cluster."""

import subprocess
from pathlib import Path

import pytest

from pinpoint.errors import ConfigError
from pinpoint.runfolder import inside

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_mlflow_ui_binds_to_localhost_only():
    out = subprocess.run(["make", "-n", "mlflow-ui"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--host 127.0.0.1" in out
    assert "0.0.0.0" not in out


@pytest.mark.unit
@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "a/../../../tmp"])
def test_paths_cannot_escape_the_run_folder(tmp_path, rel):
    with pytest.raises(ConfigError, match="escapes the run folder"):
        inside(tmp_path / "run", rel)


@pytest.mark.unit
def test_paths_inside_are_allowed(tmp_path):
    assert inside(tmp_path, "checkpoints/ckpt-1.index") == (tmp_path / "checkpoints/ckpt-1.index").resolve()


@pytest.mark.unit
def test_symlink_out_of_the_run_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "link").symlink_to(tmp_path)
    with pytest.raises(ConfigError):
        inside(run, "link/secret")


@pytest.mark.integration
def test_library_never_imports_kfp():
    code = (
        "import sys, pkgutil, importlib, pinpoint\n"
        "for m in pkgutil.walk_packages(pinpoint.__path__, 'pinpoint.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m == 'kfp' or m.startswith('kfp.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([str(ROOT / ".venv/bin/python"), "-c", code], check=True, cwd=ROOT, timeout=300)


@pytest.mark.unit
def test_no_module_reads_environment_at_import_time():
    # A crude but effective check: os.environ / getenv only inside functions.
    offenders = []
    for path in (ROOT / "src" / "pinpoint").rglob("*.py"):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if ("os.environ" in line or "getenv(" in line) and not line.startswith((" ", "\t", "#")):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}")
    assert not offenders, offenders


@pytest.mark.unit
def test_atomic_writes_leave_no_temp_and_honour_umask(tmp_path):
    import os
    import stat

    from pinpoint.runfolder import atomic_write_json

    old = os.umask(0o022)
    try:
        p = atomic_write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert [f.name for f in tmp_path.iterdir()] == ["a.json"]
