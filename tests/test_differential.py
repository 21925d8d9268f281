"""Pinpoint checked against TensorFlow itself: each program in tests/programs/ runs under
`pinpoint trace --gpus 2` and as plain TensorFlow on the same logical devices (tests/oracle.py);
every op's and variable's device and every transfer's bytes must agree (tests/differential.py).
A difference fails with the table of differing rows."""

from __future__ import annotations

import pytest
from packaging.version import Version

from pinpoint.versions import installed
from tests import differential

# A program's processes at once, each limited to its time (tests/differential.py, PROGRAM_TIMEOUT).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(differential.PROGRAM_TIMEOUT)]

# Differences Pinpoint still makes, each named exactly (the error they fail with, the reason);
# strict: the test fails once Pinpoint is fixed, and the entry must go.
KNOWN: dict[str, tuple[type, str]] = {}
# Differences of the oracle, not of Pinpoint, on an older TensorFlow of the supported range (where
# `make test-compat` leaves the program out; run by hand there, it fails this way).
if Version(installed("tensorflow")) < Version("2.17"):
    KNOWN["parameter_server"] = (AssertionError, (
        "TensorFlow 2.16's log lines carry no thread id, so the oracle cannot leave out the eager ops a "
        "ClusterCoordinator's threads sent to the workers (AnonymousIteratorV3, MakeIterator) or the calls of "
        "worker_fn the workers' runtimes logged; Pinpoint's side is what it is on 2.21"))


# The programs the compat tier runs on the oldest TensorFlow (docs/development.md, "What the compat
# tier covers"): each exercises what differs between versions beyond the corpus' sample there: string
# kernels under soft placement, an assignment across devices, eager ops one by one, Keras' lazy
# build, evaluate and predict, tf.data pinned to the host, strategies made in turn. The others are
# close twins of the corpus sample's programs, or (parameter_server) not comparable on 2.16; they
# run on the newest TensorFlow only.
COMPAT = {"string_ops_soft_placement", "variable_cpu_assign_gpu", "eager_split_loop", "subclass_lazy_build",
          "evaluate_predict", "pipeline_on_cpu_fit", "strategies_in_turn"}


def _param(name: str):
    marks = [] if name in COMPAT else [pytest.mark.newest]
    if name in KNOWN:
        raises, reason = KNOWN[name]
        marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("program", [_param(n) for n in sorted(differential.TRAINING)])
def test_pinpoint_agrees_with_tensorflow(program, tmp_path):
    result = differential.run_program(program, tmp_path)
    assert not result.differences, f"Pinpoint and TensorFlow differ:\n{differential.table(result)}"
    # The training function's ops were compared (an empty comparison would pass silently).
    if program in differential.REMOTE_TRAINING:
        # Its graphs are the workers' (tests/differential.py): both sides agree it was not captured.
        assert differential.TRAINING[program] in result.uncaptured
    elif differential.TRAINING[program]:
        assert result.counts["ops"] > 0, f"no op of {differential.TRAINING[program]} compared"
