"""Under `pinpoint trace` the program has run when Pinpoint reads it: a part Pinpoint fails to read
costs that part, named in the first note, never placement.json nor the program's exit code. The
failures are injected (monkeypatch) into the real analysis: no program run can be made to fail it
on purpose, and a bug that does would be fixed, not kept as a test."""

from __future__ import annotations

import pytest

from pinpoint.device_names import DeviceMap
from pinpoint.placement import Placement
from pinpoint.trace import analysis, created
from pinpoint.trace.recorder import Recorder

pytestmark = pytest.mark.unit


# The trace's own note for a program that ran no function (as the empty recorder here).
NO_FUNCTION = "the program ran no tf.function and no Session.run: only its eager ops are shown"


def _boom(*_args, **_kwargs):
    raise IndexError("list index out of range")


def _placement() -> Placement:
    content = analysis.trace_placement(Recorder("/device:CPU:0"), DeviceMap.of(), program="guide.py", notes=["mine"])
    return Placement.from_json(content)


def test_a_part_that_fails_becomes_the_first_note_and_the_rest_is_kept(monkeypatch):
    monkeypatch.setattr(created, "creation_rows", _boom)  # the variables' part fails
    p = _placement()
    assert p.notes[0].startswith("Pinpoint could not read its captured calls, variables and memory after the "
                                 "program ended (IndexError: list index out of range, at test_trace_unread.py:")
    assert p.notes[1:] == ("mine", NO_FUNCTION)
    assert p.program == "guide.py"


def test_when_even_the_functions_fail_the_program_and_its_notes_are_written(monkeypatch):
    monkeypatch.setattr(created, "creation_rows", _boom)
    monkeypatch.setattr(analysis, "eager_section", _boom)
    p = _placement()
    assert [n.split(" after ")[0] for n in p.notes[:2]] == [
        "Pinpoint could not read its captured calls, variables and memory",
        "Pinpoint could not read its functions and eager ops"]
    assert (p.program, p.functions or (), p.notes[2:]) == ("guide.py", (), ("mine",))


def test_nothing_failing_leaves_no_note():
    assert _placement().notes == ("mine", NO_FUNCTION)
