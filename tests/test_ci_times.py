"""scripts/ci_times.py: a CI run's time per tier, per file and per test, with the TensorFlow
start-ups each test caused (tests/tf_starts.py), from the files the Makefile's tiers leave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ci_times  # noqa: E402

pytestmark = pytest.mark.unit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_a" name="test_one" time="12.5">
<properties><property name="cpu_s" value="20.0" /></properties></testcase>
<testcase classname="tests.test_a" name="test_two[x]" time="2.5"><failure message="boom" /></testcase>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="30.0">
<properties><property name="cpu_s" value="40.0" /></properties></testcase>
<testcase classname="tests.test_b" name="test_four" time="0.1"><skipped message="no" /></testcase>
</testsuite></testsuites>"""


def _ci_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ci"
    folder.mkdir()
    (folder / "integration.xml").write_text(JUNIT)
    (folder / "integration.seconds").write_text("150\n")
    (folder / "integration.tfstarts").write_text(
        "tests/test_b.py::TestGroup::test_three\t11\tpinpoint\n"
        "tests/test_b.py::TestGroup::test_three\t12\toracle.py\n"
        "tests/test_a.py::test_one\t13\tpython\n"
        "\t14\tpytest\n")
    (folder / "unit.seconds").write_text("90\n")
    return folder


def test_a_junit_testcase_is_named_by_its_pytest_node_id():
    assert ci_times.nodeid("tests.test_a", "test_two[x]") == "tests/test_a.py::test_two[x]"
    assert ci_times.nodeid("tests.test_b.TestGroup", "test_three") == "tests/test_b.py::TestGroup::test_three"


def test_the_tables_give_each_tier_file_and_test_its_seconds_and_tensorflow_starts(tmp_path):
    lines = ci_times.report(_ci_folder(tmp_path), slowest=2)
    # unit: a wall time and no JUnit file; integration: 4 tests, 1 failed, 1 skipped, 60 CPU s, 4 starts.
    assert "| unit | 1.5 | 0.0 | 0 | 0 | 0 | 0 | 0 |" in lines
    assert "| integration | 2.5 | 1.0 | 4 | 2 | 1 | 1 | 4 |" in lines
    # per file: test_b.py 30.0 + 0.1 s, 2 starts; test_a.py 12.5 + 2.5 s, 1 start; the collection's start.
    assert "| integration | tests/test_b.py | 2 | 30 | 40 | 2 |" in lines
    assert "| integration | tests/test_a.py | 2 | 15 | 20 | 1 |" in lines
    assert "| integration | (collecting the tests) | 0 | - | - | 1 |" in lines
    slowest = lines[lines.index("## The 2 slowest tests") + 4:][:2]
    assert slowest == ["| integration | tests/test_b.py::TestGroup::test_three | 30.0 | 40.0 | 2 |",
                       "| integration | tests/test_a.py::test_one | 12.5 | 20.0 | 1 |"]


def test_the_output_ends_with_each_tiers_wall_time_each_failure_and_the_totals(tmp_path):
    script = Path(ci_times.__file__)
    out = subprocess.run([sys.executable, str(script), str(_ci_folder(tmp_path))], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[-4:] == ["ci: tier unit took 1.5 min", "ci: tier integration took 2.5 min",
                        "ci: failed in integration: tests/test_a.py::test_two[x]: boom",
                        "ci: 2 passed, 1 failed, 1 skipped"]


def test_a_tiers_part_is_a_tier_of_its_own_after_its_tier(tmp_path):
    folder = _ci_folder(tmp_path)
    (folder / "integration-b.seconds").write_text("60\n")
    (folder / "slow.seconds").write_text("30\n")
    assert ci_times.closing(folder)[:-2] == [
        "ci: tier unit took 1.5 min", "ci: tier integration took 2.5 min", "ci: tier integration-b took 1.0 min",
        "ci: tier slow took 0.5 min"]


def test_the_docs_table_is_written_between_its_markers(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(f"before\n{ci_times.BEGIN}\nold\n{ci_times.END}\nafter\n")
    ci_times.write_docs(_ci_folder(tmp_path), doc, "A fresh clone of abc1234.")
    assert doc.read_text() == (f"before\n{ci_times.BEGIN}\nA fresh clone of abc1234.\n\n"
                               "| tier | wall min | CPU min | tests | passed | failed | skipped | TF starts |\n"
                               "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
                               "| unit | 1.5 | 0.0 | 0 | 0 | 0 | 0 | 0 |\n"
                               "| integration | 2.5 | 1.0 | 4 | 2 | 1 | 1 | 4 |\n"
                               f"{ci_times.END}\nafter\n")


def test_a_process_that_imports_tensorflow_is_charged_to_the_running_test(tmp_path):
    """tests/tf_starts.py as the venv's .pth runs it: one line per process, at its first import of
    `tensorflow` (a stand-in package here, so that no TensorFlow starts in the unit tier)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("")
    log = tmp_path / "starts"
    hook = Path(__file__).with_name("tf_starts.py")
    code = (f"exec(compile(open({str(hook)!r}).read(), 'tf_starts', 'exec'), {{}}); "
            "import tensorflow, importlib, os; importlib.reload(tensorflow); print(os.getpid())")
    env = {**os.environ, "PINPOINT_TF_STARTS": str(log), "PYTEST_CURRENT_TEST": "tests/test_x.py::test_y (call)",
           "PYTHONPATH": str(tmp_path)}
    # -S: no site-packages, so the venv's own .pth (make's) does not install the hook a second time.
    proc = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert log.read_text() == f"tests/test_x.py::test_y\t{proc.stdout.strip()}\t-c\n"


def test_the_whole_runs_wall_time_closes_the_tier_table(tmp_path):
    folder = _ci_folder(tmp_path)
    (folder / "run.seconds").write_text("300\n")
    rows = ci_times.tier_rows(folder)
    # 5.0 min wall; CPU 0.0 + 1.0 min; 4 tests, 2 passed, 1 failed, 1 skipped, 4 starts over both tiers.
    assert rows[-1] == ("the whole run", "5.0", "1.0", 4, 2, 1, 1, 4)
