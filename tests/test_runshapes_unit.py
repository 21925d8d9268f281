"""Shape inference over executed graphs (placement/graphs/shapes.py): the rewrites that give TensorFlow's
import a shape it cannot infer on its own, checked against the shape TensorFlow gives the same
tensor where it can see it."""

from __future__ import annotations

import pytest

from pinpoint.placement.graphs.shapes import batch_size, lookups_as_fill, row_bytes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

STRING, FLOAT, INT64 = 7, 1, 9  # TensorFlow's dtype enums


def _lookup_graph(tf, keys_shape):
    """A graph with a scalar-valued hash table looked up by keys of `keys_shape`; the table's
    handle reaches the lookup as a function argument does in a partition graph (no handle data)."""
    with tf.Graph().as_default() as g:
        keys = tf.compat.v1.placeholder(tf.string, keys_shape, name="keys")
        handle = tf.raw_ops.Placeholder(dtype=tf.resource, name="table")
        default = tf.constant(-1, tf.int64, name="default")
        out = tf.raw_ops.LookupTableFindV2(table_handle=handle, keys=keys, default_value=default, name="lookup")
        tf.identity(out, name="after")
    return g.as_graph_def()


def _shapes(tf, graph_def):
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
    return {op.name: op.outputs[0].shape.as_list() if op.outputs and op.outputs[0].shape.rank is not None
            else None for op in g.get_operations()}


def test_a_lookup_is_shaped_as_its_keys():
    tf = pytest.importorskip("tensorflow")
    graph = _lookup_graph(tf, [8, 3])
    assert _shapes(tf, graph)["after"] is None  # TensorFlow's import alone: no handle data, no shape
    assert lookups_as_fill(graph) == 1
    shapes = _shapes(tf, graph)
    assert shapes["lookup"] == [8, 3] and shapes["after"] == [8, 3]  # one int64 per key: 8 x 3 x 8 B = 192 B
    (node,) = [n for n in graph.node if n.name == "lookup"]
    assert tf.dtypes.as_dtype(node.attr["T"].type) == tf.int64


def test_a_table_of_tensors_is_left_to_tensorflow():
    tf = pytest.importorskip("tensorflow")
    graph = _lookup_graph(tf, [8, 3])
    for n in graph.node:
        if n.name == "default":  # a default of shape [2]: the table's values are vectors
            n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto([-1, -1], tf.int64))
    assert lookups_as_fill(graph) == 0


def test_no_batch_follows_from_the_bytes_of_an_element_holding_strings():
    # 8 rows of 3 strings and a float: the runtime counts each string's contents, so an element's
    # bytes are not a whole number of fixed-size rows.
    assert row_bytes([(STRING, [None, 3]), (FLOAT, [None, 1])]) is None
    assert batch_size([(STRING, [None, 3]), (FLOAT, [None, 1])], [2136]) is None
    assert row_bytes([(INT64, [None, 3]), (FLOAT, [None, 1])]) == 3 * 8 + 4


def test_a_loops_body_has_the_shape_its_variable_entered_with():
    """A v1 while loop over x [32, 8]: TensorFlow's shape function of an Enter that is not a loop
    constant gives an unknown shape, so the body's Relu has none on import. Sized as its first
    iteration (loops=True), the body is x's shape: [32, 8], 1,024 B."""
    tf = pytest.importorskip("tensorflow")
    from pinpoint.placement.graphs.shapes import infer_shapes

    tf.compat.v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as g:
            x = tf.compat.v1.placeholder(tf.float32, [32, 8], name="x")
            tf.compat.v1.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.nn.relu(h, name="body_relu")),
                                    [tf.constant(0), x])
    finally:
        tf.compat.v1.enable_control_flow_v2()
    graph = g.as_graph_def()
    relu = next(n.name for n in graph.node if n.name.endswith("body_relu"))
    assert _shapes(tf, graph)[relu] is None  # TensorFlow's import alone
    shapes, _ = infer_shapes([graph], None, set(), loops=True)
    assert shapes[relu] == [(FLOAT, [32, 8])]
