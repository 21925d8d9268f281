"""docs/config.md, the config reference, is generated from the schema and in step with it (as
docs/trace.md's private-API table is with tfcompat's targets)."""

from pathlib import Path

import pytest

from pinpoint import config_reference
from pinpoint.config_scope import NEEDS, NO_EFFECT

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def test_every_field_of_the_schema_has_a_description_and_no_other():
    schema = [field for field, _ in config_reference.fields()]
    assert sorted(set(schema) ^ set(config_reference.DESCRIPTIONS)) == []
    assert set(NO_EFFECT) | set(NEEDS) <= set(schema)  # a refusal names a field that exists


def test_docs_config_md_is_the_generated_reference():
    """`make config-docs` writes it; after a change of the schema this fails until it is rerun."""
    assert (ROOT / "docs" / "config.md").read_text() == config_reference.render()


def test_every_field_has_its_row():
    rows = [line.split("|")[1].strip().strip("`") for line in (ROOT / "docs" / "config.md").read_text().splitlines()
            if line.startswith("| `")]
    assert rows == [field for field, _ in config_reference.fields()]
    assert "train.log_every" in rows and "tracking.metrics_interval_s" not in rows


def test_the_command_writes_the_file(tmp_path):
    assert config_reference.main([str(tmp_path / "config.md")]) == 0
    assert (tmp_path / "config.md").read_text() == config_reference.render()
