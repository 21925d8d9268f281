"""How the differential runner recovers when the oracle's process crashes (tests/differential.py,
run_program). The processes are a fake: each scripted run writes what the real one would have
written before it crashed, so the runner's choice of the next run is what is checked. The real
runs are the integration and corpus tiers'."""

from __future__ import annotations

import pytest

from tests import differential

pytestmark = pytest.mark.unit

SEGV = -11


def _runner(monkeypatch, tmp_path, script):
    """run_program with `script`'s runs of the oracle, in order: (mode run, exit status, files it
    leaves). Pinpoint's run exits 0. Returns the modes the runner asked for and their log modes."""
    asked: list[tuple[str, str]] = []
    runs = iter(script)

    def fake_processes(cmds, work, env, mode="w"):
        codes = {}
        for key, cmd in cmds.items():
            if key == "pinpoint":
                codes[key] = 0
                continue
            expected, code, files = next(runs)
            assert cmd[2] == expected, f"run {len(asked) + 1}: the runner ran {cmd[2]}, not {expected}"
            asked.append((cmd[2], mode))
            for name, text in files.items():
                (work / name).write_text(text.format(work=work))
            codes[key] = code
        return codes

    monkeypatch.setattr(differential, "_run_processes", fake_processes)
    monkeypatch.setattr(differential, "compare_saved", lambda name, work, training: differential.Result(name))
    program = tmp_path / "program.py"
    program.write_text("")
    (tmp_path / "tfdbg").mkdir()
    differential.run_program("p", tmp_path, path=program, training="step", cluster=False)
    return asked


def test_a_crash_while_the_dump_is_named_runs_the_shapes_again(monkeypatch, tmp_path):
    # CI, TensorFlow 2.16: the process died writing the dump's name; the name is written whole or
    # not at all, so the runner sees no name and runs the shapes again, not a read of ''.
    asked = _runner(monkeypatch, tmp_path, [
        ("both", SEGV, {"oracle.json": "{{}}", "shapes.json.dump.part": ""}),
        ("shapes", 0, {"shapes.json": "{{}}"}),
    ])
    assert asked == [("both", "w"), ("shapes", "a")]


def test_a_crash_after_the_dump_is_named_reads_it_in_a_fresh_process(monkeypatch, tmp_path):
    asked = _runner(monkeypatch, tmp_path, [
        ("both", SEGV, {"oracle.json": "{{}}", "shapes.json.dump": "{work}/tfdbg"}),
        ("read", 0, {"shapes.json": "{{}}"}),
    ])
    assert asked == [("both", "w"), ("read", "a")]


def test_a_read_that_fails_is_followed_by_a_new_shapes_run(monkeypatch, tmp_path):
    asked = _runner(monkeypatch, tmp_path, [
        ("both", SEGV, {"oracle.json": "{{}}", "shapes.json.dump": "{work}/tfdbg"}),
        ("read", 1, {"oracle.log": "ValueError: a torn dump\n"}),
        ("shapes", 0, {"shapes.json": "{{}}"}),
    ])
    assert asked == [("both", "w"), ("read", "a"), ("shapes", "a")]


def test_a_crash_before_the_placement_is_written_runs_both_again(monkeypatch, tmp_path):
    asked = _runner(monkeypatch, tmp_path, [
        ("both", SEGV, {}),
        ("both", 0, {"oracle.json": "{{}}", "shapes.json": "{{}}"}),
    ])
    assert asked == [("both", "w"), ("both", "w")]


def test_a_program_error_is_not_run_again_and_names_each_run(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError) as e:
        _runner(monkeypatch, tmp_path, [("both", 1, {"oracle.log": "NameError: name 'x' is not defined\n"})])
    assert str(e.value).splitlines()[0] == ("p: the oracle run failed with NameError: name 'x' is not defined "
                                            "(its runs, mode and exit status: both 1)")
