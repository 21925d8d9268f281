"""One typed model, read everywhere: placement.json is read by placement.model.files (read_placement,
load_placement) and everything else reads placement.model.Placement; the report of a placement and
of a merged cluster stays what it was before the readers took the model (goldens)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pinpoint.placement.analysis.merge import merge_placements
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report.html import render_html

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[1] / "src" / "pinpoint"
DATA = Path(__file__).parent / "data"
READER = SRC / "placement" / "model" / "files.py"  # the one reader of placement.json
DICT_READ = re.compile(r"\bplacement(\.get\(|\[)")
# Regenerate after a deliberate change to the report: render_html(json.loads(sample), None, {}, "sample")
# (and the merged one below) into these files, and say why in the commit.
GOLDEN_SAMPLE = DATA / "golden" / "report-sample.html"
GOLDEN_MERGED = DATA / "golden" / "report-merged.html"


def dict_reads(root: Path) -> list[str]:
    """'file:line' of each `placement.get(` / `placement[` under root, the reader left out."""
    return [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py")) if p != READER
            for i, line in enumerate(p.read_text().splitlines(), 1) if DICT_READ.search(line)]


def test_nothing_in_src_reads_placement_json_as_a_dict():
    assert dict_reads(SRC) == []


def test_the_dict_read_check_sees_one(tmp_path):
    (tmp_path / "m.py").write_text("def f(placement):\n    return placement.get('ops'), placement['devices']\n")
    assert dict_reads(tmp_path) == ["m.py:2"]


def _sample() -> dict:
    return json.loads((DATA / "placement-sample.json").read_text())


def _as_task(content: dict, job: str, index: int) -> Placement:
    """The sample as one task of a cluster: every device under /job:<job>/task:<index>."""
    text = json.dumps(content).replace('"/GPU:', f'"/job:{job}/task:{index}/GPU:')
    text = text.replace('"/CPU:', f'"/job:{job}/task:{index}/CPU:')
    return Placement.from_json(dict(json.loads(text), task=f"{job}:{index}"))


def test_the_model_reads_back_what_it_writes():
    once = Placement.from_json(_sample()).to_json()
    assert Placement.from_json(once).to_json() == once
    merged = merge_placements([_as_task(_sample(), "chief", 0), _as_task(_sample(), "worker", 0)]).to_json()
    assert Placement.from_json(merged).to_json() == merged


def test_the_report_of_a_placement_and_of_a_merged_cluster_is_unchanged():
    assert render_html(_sample(), None, {}, "sample") == GOLDEN_SAMPLE.read_text()
    merged = merge_placements([_as_task(_sample(), "chief", 0), _as_task(_sample(), "worker", 0)])
    assert render_html(merged, None, {}, "merged") == GOLDEN_MERGED.read_text()
