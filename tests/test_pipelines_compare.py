"""The sweep's compare step: the fastest run that obeyed its plan, the chart, one-line errors."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.unit


def _run(root, name, speed, violations, score=None):
    d = root / name
    d.mkdir(parents=True)
    rules = [{"rule": "pinning.variables", "planned": "/GPU:0", "violations_total": violations}]
    score = score if score is not None else (1.0 if violations == 0 else 0.5)
    (d / "placement.json").write_text(json.dumps({"strategy": "none", "conformance": {"score": score, "rules": rules}}))
    (d / "metrics.json").write_text(json.dumps({"examples_per_sec": speed, "final_loss": 0.5}))
    (d / "config.yaml").write_text(f"name: sweep-{name}\ntracking:\n  enabled: false\n")
    return d


def test_fastest_run_that_obeyed_wins_over_a_faster_violator(tmp_path):
    from pinpoint.compare import compare_runs

    slow = _run(tmp_path, "slow-ok", 100.0, 0)
    fast_bad = _run(tmp_path, "fast-bad", 900.0, 3)
    mid = _run(tmp_path, "mid-ok", 400.0, 0)
    result = compare_runs([slow, fast_bad, mid])
    assert result["best"] == str(mid) and result["best_name"] == "mid-ok"
    bad = next(r for r in result["runs"] if r["name"] == "fast-bad")
    assert bad["obeyed"] is False and bad["violations"] == 3


def test_no_run_obeyed(tmp_path):
    from pinpoint.compare import compare_runs

    result = compare_runs([_run(tmp_path, "a", 1.0, 2), _run(tmp_path, "b", 2.0, 1)])
    assert result["best"] is None


def test_compare_command_writes_json_and_chart(tmp_path, capsys):
    from pinpoint.compare import compare_command

    runs = [_run(tmp_path / "sweep", "a", 10.0, 0), _run(tmp_path / "sweep", "b", 20.0, 4)]
    result = compare_command(runs, tmp_path / "sweep")
    assert json.loads((tmp_path / "sweep" / "comparison.json").read_text()) == result
    png = (tmp_path / "sweep" / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "fastest run that obeyed its plan: a" in capsys.readouterr().out


def test_missing_run_folder_is_one_line(tmp_path):
    from pinpoint.compare import compare_runs
    from pinpoint.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compare_runs([tmp_path / "nope"])
    assert "\n" not in str(err.value) and "run the previous step first" in str(err.value)
    with pytest.raises(ConfigError, match="empty list"):
        compare_runs([])
