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


def _node(name, op, inputs=(), **attrs):
    return {"name": name, "op": op, "device": "/CPU:1", "inputs": list(inputs), **attrs}


def _send(name, tensor, frm, to, tensor_name):
    return _node(name, "_Send", [tensor], send_device=frm, recv_device=to, tensor_name=tensor_name)


def test_the_shapes_run_instruments_the_sources_of_transfers_through_what_hands_them_on():
    from tests.oracle import sent_tensors

    gpu0 = [_node("dense/MatMul", "MatMul", ["x", "w"]), _node("dense/Identity", "Identity", ["dense/MatMul"]),
            _send("send_a", "dense/Identity:0", "/CPU:1", "/CPU:2", "edge_a"),
            _node("local", "Relu", ["dense/MatMul"]), _send("send_local", "local", "/CPU:1", "/CPU:1", "edge_l"),
            _node("cond/output/_1", "Merge", ["cond/then/_0/add", "cond/else/_1/zeros", "^ctrl"]),
            _send("send_c", "cond/output/_1", "/CPU:1", "/CPU:0", "edge_c")]
    gpu1 = [_node("recv_a", "_Recv", send_device="/CPU:1", recv_device="/CPU:2", tensor_name="edge_a"),
            _send("send_b", "recv_a", "/CPU:2", "/CPU:0", "edge_b")]
    found = sent_tensors({"functions": [{"partitions": [[gpu0, gpu1]]}]})
    # A same-device send carries nothing; the receive is followed to its sender's input.
    assert found == {"dense/Identity", "dense/MatMul", "recv_a", "cond/output/_1", "cond/then/_0/add",
                     "cond/else/_1/zeros"}
