"""TensorFlow's op vocabulary has one home (placement/graphs/ops.py): no other module spells a send,
a receive or a collective, the sets that differ for one concept keep the relations their comments
state, and every op they name is one TensorFlow registers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pinpoint.placement.graphs import ops

SRC = Path(__file__).resolve().parents[1] / "src" / "pinpoint"
HOME = SRC / "placement" / "graphs" / "ops.py"
# An op type spelled as a string: a send or receive, or a collective's name or pattern. tfcompat/
# names TensorFlow's Python classes (CollectiveAllReduce...), not op types, and prose has spaces.
SPELLED = re.compile(r"^(_(Host)?(Send|Recv)|_?Nccl\w*|Collective(Reduce|Gather|Bcast|AllToAll|Permute)\w*)$|Collective\\w|Nccl\\w")


def _spellings(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == HOME or "tfcompat" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        found += [f"{path.relative_to(root)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and " " not in n.value and SPELLED.search(n.value)]
    return found


@pytest.mark.unit
def test_no_module_but_the_vocabulary_spells_a_send_a_receive_or_a_collective():
    assert _spellings(SRC) == []


@pytest.mark.unit
def test_the_spelling_check_sees_one(tmp_path):
    (tmp_path / "m.py").write_text('RECV = "_Recv"\nC = re.compile(r"^Collective\\w+$")\nT = "see _Recv here"\n')
    assert _spellings(tmp_path) == ["m.py:1 '_Recv'", "m.py:2 '^Collective\\\\w+$'"]


@pytest.mark.unit
def test_the_narrower_sets_sit_inside_the_wider_ones():
    assert ops.ITERATOR_GET_NEXT < ops.INPUT_SOURCES < ops.PREFETCHED
    assert ops.INPUT_SOURCES < ops.INPUT_ALLOCATORS
    assert all(ops.INPUT_RE.search(op) for op in ops.PREFETCHED | ops.INPUT_ALLOCATORS)
    assert ops.REASSOCIATED < ops.BROADCAST < ops.CWISE
    assert ops.TRANSPORT < ops.BOOKKEEPING < ops.NOT_COMPUTE
    assert ops.CONTROL_FLOW == ops.LOOP_FRAME | ops.MERGES | ops.SWITCHES


# Each op: (matched by UPDATE_RE, DENSE_UPDATE_RE, SPARSE_UPDATE_RE, SPARSE_ACCESS_RE). An update is
# dense or sparse; a gather is no update but, like a sparse one, puts its variable in copy-on-read
# mode (training_op_helpers.h's EnsureSparseVariableAccess); a plain read does not.
UPDATES = {"AssignVariableOp": (True, True, False, False), "AssignAddVariableOp": (True, True, False, False),
           "ResourceApplyAdam": (True, True, False, False),
           "ResourceSparseApplyAdagrad": (True, False, True, True), "ResourceScatterAdd": (True, False, True, True),
           "ResourceScatterNdUpdate": (True, False, True, True),
           "ResourceGather": (False, False, False, True), "ResourceGatherNd": (False, False, False, True),
           "ReadVariableOp": (False, False, False, False), "VarHandleOp": (False, False, False, False)}


@pytest.mark.unit
@pytest.mark.parametrize("op", sorted(UPDATES))
def test_an_update_is_dense_or_sparse_and_a_sparse_access_is_named(op):
    patterns = (ops.UPDATE_RE, ops.DENSE_UPDATE_RE, ops.SPARSE_UPDATE_RE, ops.SPARSE_ACCESS_RE)
    assert tuple(bool(p.match(op)) for p in patterns) == UPDATES[op]


# Each op: (COLLECTIVE_RE: time and memory; COLLECTIVE_TRAFFIC_RE: bytes, once per exchange;
# REDUCING_COLLECTIVE_RE: a new buffer the size of the input).
COLLECTIVES = {"CollectiveReduceV2": (True, True, True), "CollectiveGatherV2": (True, True, True),
               "CollectiveBcastSendV2": (True, True, False), "CollectiveBcastRecvV2": (True, True, False),
               "NcclAllReduce": (True, True, True), "_NcclReduceSend": (True, True, False),
               "_NcclReduceRecv": (True, False, False), "_NcclBroadcastRecv": (True, False, False),
               "MatMul": (False, False, False)}


@pytest.mark.unit
@pytest.mark.parametrize("op", sorted(COLLECTIVES))
def test_which_collective_each_rule_counts(op):
    got = tuple(bool(p.match(op)) for p in (ops.COLLECTIVE_RE, ops.COLLECTIVE_TRAFFIC_RE, ops.REDUCING_COLLECTIVE_RE))
    assert got == COLLECTIVES[op]


@pytest.mark.unit
@pytest.mark.parametrize(("inp", "parsed"), [("a/b", ("a/b", 0)), ("a/b:2", ("a/b", 2)), ("^a/b", ("a/b", 0))])
def test_a_node_input_parses_to_its_op_and_output(inp, parsed):
    assert ops.tensor(inp) == parsed


@pytest.mark.integration
def test_every_op_the_vocabulary_names_is_registered_with_tensorflow():
    """TensorFlow's own op registry: a misspelt member would match nothing, silently."""
    from pinpoint.tfcompat.api import op_def

    names = set().union(*(v for k, v in vars(ops).items() if k.isupper() and isinstance(v, frozenset)))
    names |= UPDATES.keys() | COLLECTIVES.keys()
    assert sorted(n for n in names if op_def(n) is None) == []
