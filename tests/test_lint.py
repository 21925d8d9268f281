"""`make lint` stays clean: ruff on the code, hadolint on the Dockerfiles."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Integration tier: ruff over the whole tree and hadolint take longer than a unit test should.
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_make_lint_passes():
    proc = subprocess.run(["bash", "docker/lint.sh"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hadolint OK" in proc.stdout + proc.stderr
