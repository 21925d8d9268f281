"""The differential oracle's reading of a lowered cond's branch (tests/differential.py): a cond is
matched to the branch functions tfdbg traced for it, by name scope and call depth, never to an
outer or sibling cond whose scope its name merely ends with."""

from __future__ import annotations

import pytest

from tests import differential
from tests.oracle import BRANCH, SCOPES

pytestmark = pytest.mark.unit

# As tfdbg traced Keras' mirrored mixed-precision `fit` (transformer-fit_data-mirrored-mixed): the
# iterator check `cond` in the traced function, the loss scale's `cond` one call down, and the
# all-gather `cond/adam/cond` inside the loss scale's then-branch. Only the loss scale's else ran.
SHAPES = {
    SCOPES: ["cond@0", "cond@1", "cond_adam_cond@1", "cond_cond@0"],
    f"{BRANCH}cond@0{BRANCH}then{BRANCH}OptionalGetValue:0": [[1, [4, 8]]],
    f"{BRANCH}cond@1{BRANCH}else{BRANCH}Mul:0": [[1, []]],
}


@pytest.mark.parametrize("cond, role, ran", [
    ("cond", "then", True),  # the iterator check, in the traced function
    ("StatefulPartitionedCall/cond", "then", False),  # the loss scale: its else ran
    ("StatefulPartitionedCall/cond", "else", True),
    ("StatefulPartitionedCall/cond/then/_0/cond/adam/cond", "else", False),  # not the loss scale's `cond`
    ("StatefulPartitionedCall/cond/then/_0/cond/adam/cond", "then", False),
])
def test_a_cond_is_read_from_its_own_branch_functions(cond, role, ran):
    assert differential._branch_ran(cond, role, SHAPES) is ran


def test_a_branch_op_is_sized_from_its_own_cond_only():
    assert differential._branch_shapes("cond", "then", "OptionalGetValue:0", SHAPES) == [(1, [4, 8])]
    assert differential._branch_shapes("StatefulPartitionedCall/cond", "then", "OptionalGetValue:0", SHAPES) == []
