"""A resource input followed back to the variable handle it carries, through the constructs a cond,
a loop, a cross-device edge and a functional call leave in the executed partition graphs."""

from __future__ import annotations

import re

import pytest

from pinpoint.placement.graphs.resources import DT_RESOURCE, ResourceTracer, Source

pytestmark = pytest.mark.unit
FLOAT = 1


def GraphDef():
    # Imported here, not at the top: the import starts TensorFlow, and every pytest session (every
    # tier, every xdist worker) collects this file.
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef()


def graph(*nodes):
    g = GraphDef()
    for name, op, inputs, attrs in nodes:
        n = g.node.add(name=name, op=op)
        n.input.extend(inputs)
        for key, value in attrs.items():
            if key == "index":
                n.attr[key].i = value
            elif key in ("T", "tensor_type"):
                n.attr[key].type = value
            elif key in ("then_branch", "else_branch", "f", "body"):
                n.attr[key].func.name = value
            else:
                n.attr[key].s = value.encode()
    return g


def res(name, op, inputs, **attrs):
    """A node whose type attr says it carries a resource (as TensorFlow's would)."""
    return name, op, inputs, {"T": DT_RESOURCE, **attrs}


def arg(name, index=0):
    return name, "_Arg", [], {"index": index}


def test_a_lowered_cond_and_loop_lead_back_to_the_argument():
    g = graph(arg("h"), arg("p", 1),
              res("sw", "Switch", ["h", "p"]), res("id", "Identity", ["sw:1"]),
              ("upd", "AssignVariableOp", ["id", "x"], {}),
              res("enter", "Enter", ["h"]), res("merge", "Merge", ["enter", "next"]),
              res("sw2", "Switch", ["merge", "p"]), res("body", "Identity", ["sw2:1"]),
              res("next", "NextIteration", ["body"]),
              ("upd2", "AssignAddVariableOp", ["body", "x"], {}))
    t = ResourceTracer([("f", GraphDef(), [g])], {"h": object()})
    assert t.source("id", 0) == Source(arg="h")
    assert t.source("body", 0) == Source(arg="h")


def test_a_float_switch_is_not_followed():
    g = graph(arg("h"), ("sw", "Switch", ["h", "p"], {"T": FLOAT}))
    assert ResourceTracer([("f", GraphDef(), [g])], {"h": 1}).source("sw:1", 0) is None


def test_identity_n_follows_the_input_of_its_output():
    g = graph(arg("a"), arg("b", 1), ("idn", "IdentityN", ["a", "b"], {}))
    t = ResourceTracer([("f", GraphDef(), [g])], {"a": 1, "b": 2})
    assert (t.source("idn:0", 0), t.source("idn:1", 0)) == (Source(arg="a"), Source(arg="b"))


def test_a_recv_leads_to_its_send_on_the_other_device():
    edge = {"tensor_name": "edge_7_h", "send_device": "/CPU:1", "recv_device": "/CPU:2"}
    sender = graph(arg("h"), ("send", "_Send", ["h"], dict(edge, T=DT_RESOURCE)))
    receiver = graph(("recv", "_Recv", [], dict(edge, tensor_type=DT_RESOURCE)))
    t = ResourceTracer([("f", GraphDef(), [sender, receiver])], {"h": 1})
    assert t.source("recv", 1) == Source(arg="h")


def test_a_branch_functions_argument_is_the_if_ops_input():
    """An If the runtime did not lower: its branch function's _Arg i is the If's input i + 1."""
    caller = graph(arg("h"), ("pred", "Const", [], {}),
                   ("if", "If", ["pred", "h"], {"then_branch": "then_fn", "else_branch": "else_fn"}))
    branch = graph(arg("branch_h"), ("upd", "AssignVariableOp", ["branch_h", "x"], {}))
    var = graph(("v", "VarHandleOp", [], {"shared_name": "shared_v"}), ("call", "PartitionedCall", ["v"], {"f": "g"}))
    callee = graph(arg("g_h"))
    t = ResourceTracer([("top", GraphDef(), [caller, var]), ("then_fn", GraphDef(), [branch]),
                        ("g", GraphDef(), [callee])], {"h": 1})
    assert t.source("branch_h", 2) == Source(arg="h")
    assert t.source("g_h", 3) == Source(shared_name="shared_v")


def test_an_update_inside_a_callee_whose_graphs_were_not_recorded_is_read_off_its_function_def():
    """A `_noinline` call: grappler renames the callee it specializes; its FunctionDef (in the
    pre-optimization graph's library) says which argument it updates, through an identity and a
    nested call."""
    pre = GraphDef()
    inner = pre.library.function.add()
    inner.signature.name = "inner"
    inner.signature.input_arg.add(name="r")
    inner.node_def.add(name="upd", op="AssignAddVariableOp", input=["r", "r"])
    outer = pre.library.function.add()
    outer.signature.name = "__inference_bump_1"
    for name in ("x", "h"):
        outer.signature.input_arg.add(name=name)
    outer.node_def.add(name="id", op="Identity", input=["h"])
    outer.node_def.add(name="upd", op="AssignVariableOp", input=["id:output:0", "x"])
    call = outer.node_def.add(name="call", op="PartitionedCall", input=["id:output:0"])
    call.attr["f"].func.name = "inner"
    caller = graph(arg("x"), arg("h", 1),
                   ("sp", "StatefulPartitionedCall", ["x", "h"], {"f": "__inference_bump_1_specialized_for_sp_at_top"}))
    t = ResourceTracer([("top", pre, [caller])], {"h": 1})
    (inp, count), = t.call_updates(caller.node[2], re.compile(r"^Assign(Add)?VariableOp$"))
    assert (inp, count, t.source(inp, 0)) == ("h", 2, Source(arg="h"))
