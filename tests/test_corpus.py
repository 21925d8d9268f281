"""The differential corpus (tests/corpus.py): model families x program shapes x strategies x
dtypes, each program generated, run under `pinpoint trace --gpus 2` and as plain TensorFlow, and
compared op by op, variable by variable and transfer by transfer (tests/differential.py).

The whole matrix is the `corpus` tier (`make test-corpus`); its sample (corpus.SAMPLE) runs with the
integration tier and, on the oldest TensorFlow, in the compat tier. The selected combinations run
once, two at a time (CORPUS_WORKERS), before the first test; each test then reads its
combination's result."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

from tests import corpus, differential

WORKERS = int(os.environ.get("CORPUS_WORKERS", "2"))

# An oracle note of a transfer TensorFlow could not size, and the reasons one may have: a tensor a
# lowered `cond` sends from the branch that did not run has no runtime shape (no data moves).
_UNSIZED = re.compile(r"^oracle: no runtime shape for (\S+) in (\S+)$")
_DEAD_BRANCH = re.compile(r"(^|/)cond(_\d+)?/(then|else)/")


def _uncomparable(cid: str) -> tuple:
    """The skip of a combination the oracle cannot compare on this TensorFlow (none: ())."""
    return (pytest.mark.skip(reason=corpus.UNCOMPARABLE[cid]),) if cid in corpus.UNCOMPARABLE else ()


def _param(cid: str, *marks):
    marks = (*marks, *_uncomparable(cid))
    if cid in corpus.KNOWN:
        marks = (*marks, pytest.mark.xfail(strict=True, raises=AssertionError, reason=corpus.KNOWN[cid]))
    return pytest.param(cid, marks=marks, id=cid)


@pytest.fixture(scope="module")
def matrix(request):
    """Every combination this session selected from this module, run once: id -> Result."""
    ids = []
    for item in request.session.items:
        cid = getattr(item, "callspec", None) and item.callspec.params.get("cid")
        if item.module is request.module and cid and cid not in ids and not item.get_closest_marker("skip"):
            ids.append(cid)
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        results, failed, seconds = corpus.run_matrix(ids, Path(tmp), WORKERS, echo=lambda s: None)
    print(f"\ncorpus: {len(ids)} combinations in {seconds:.0f}s with {WORKERS} workers")
    if os.environ.get("CORPUS_DOCS") == "1":  # the run's table into docs/trace.md (python -m tests.corpus --docs)
        corpus.write_docs(results, failed, seconds, WORKERS)
    return results, failed


def _check(cid: str, matrix) -> None:
    results, failed = matrix
    assert cid not in failed, f"{cid} did not run: {failed[cid]}"
    result = results[cid]
    combo = corpus.COMBINATIONS[cid]
    assert not result.differences, f"Pinpoint and TensorFlow differ:\n{differential.table(result)}"
    # Every transfer sized by TensorFlow, but a dead branch's (its reason in the oracle's note).
    for note in result.notes:
        m = _UNSIZED.match(note)
        if m:
            assert _DEAD_BRANCH.search(m.group(1)), f"{cid}: a transfer TensorFlow could not size: {note}"
    # The training function's ops were compared (an empty comparison would pass silently).
    if combo.parameter_server:
        assert combo.training in result.uncaptured  # the workers' runtimes run it (tests/differential.py)
    else:
        assert result.counts["ops"] > 0, f"no op of {combo.training} compared"


SAMPLE = [_param(cid) for cid in corpus.SAMPLE]
ALL = [_param(cid) for cid in corpus.COMBINATIONS]
DISTRIBUTED = [pytest.param(cid, id=cid, marks=_uncomparable(cid)) for cid, c in corpus.COMBINATIONS.items()
               if c.distributed]
TIMEOUT = pytest.mark.timeout(differential.PROGRAM_TIMEOUT * len(corpus.COMBINATIONS))


@pytest.mark.integration
@TIMEOUT
@pytest.mark.parametrize("cid", SAMPLE)
def test_corpus_sample(cid, matrix):
    _check(cid, matrix)
    # TensorFlow's own view reads the input on every replica (the whole corpus: the test below).
    missing = corpus.missing_inputs(corpus.COMBINATIONS[cid], matrix[0][cid])
    assert not missing, f"{cid}: no input op on {missing} in TensorFlow's view: {dict(matrix[0][cid].input_ops)}"


@pytest.mark.corpus
@TIMEOUT
@pytest.mark.parametrize("cid", ALL)
def test_corpus(cid, matrix):
    _check(cid, matrix)


@pytest.mark.corpus
@TIMEOUT
@pytest.mark.parametrize("cid", DISTRIBUTED)
def test_oracle_reads_input_on_each_replica(cid, matrix):
    """The oracle's own view (TensorFlow's placer log and partition graphs) has the ops reading
    the input batches (an iterator's get-next, a distributed iterator's RemoteCall) on every
    replica's device: the comparison covers the input, not only the model."""
    results, failed = matrix
    if cid in failed:
        if cid in corpus.KNOWN:  # no run to read (its cause: tests/corpus.py, KNOWN)
            pytest.xfail(f"{cid} did not run: {corpus.KNOWN[cid]}")
        pytest.fail(f"{cid} did not run: {failed[cid]}")
    missing = corpus.missing_inputs(corpus.COMBINATIONS[cid], results[cid])
    assert not missing, f"{cid}: no input op on {missing} in TensorFlow's view: {dict(results[cid].input_ops)}"
