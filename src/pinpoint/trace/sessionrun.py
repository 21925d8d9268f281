"""tf.compat.v1 sessions: the first `Session.run` of each fetch/feed signature asks the runtime
for its partition graphs (RunOptions.output_partition_graphs) and its step stats (the shapes
the nodes really produced). Under emulation the graph's unrequested ops are placed as on a GPU
machine first: this edits the user's graph, before the session sends it to the runtime."""

from __future__ import annotations

from pinpoint.placement import CapturedGraphs
from pinpoint.tfcompat.api import device_of, set_op_device
from pinpoint.tfcompat.graphs import output_shapes
from pinpoint.trace.functions import FunctionRecord
from pinpoint.trace.shapes import run_shapes


class SessionRuns:
    """The replacement of BaseSession.run's work: records into `functions` (by signature) and
    keeps the graph's variables with `finder`; `graph_placement` (distribute.emulation.GpuPlacement)
    under emulation, else None."""

    def __init__(self, functions: dict, finder, graph_placement=None) -> None:
        self.functions = functions
        self.finder = finder
        self.graph_placement = graph_placement
        self._placed_graphs: set[int] = set()
        self.run_graphs: set[int] = set()  # ids of the graphs a Session ran

    def run(self, run, sess, fetches, feed_dict):
        """`run(sess, fetches, feed_dict, options, run_metadata)` is BaseSession.run itself."""
        import tensorflow as tf

        self.run_graphs.add(id(sess.graph))
        key = f"Session.run({fetch_names(fetches)})"
        r = self.functions.get(key)
        if r is not None:
            r.calls += 1
            return run(sess, fetches, feed_dict, None, None)
        graph = sess.graph
        self._place(graph)
        options = tf.compat.v1.RunOptions(output_partition_graphs=True,
                                          trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        md = tf.compat.v1.RunMetadata()
        out = run(sess, fetches, feed_dict, options, md)
        cap = CapturedGraphs(step=0)
        cap.functions.append((key, graph.as_graph_def(), list(md.partition_graphs)))
        for op in graph.get_operations():
            cap.shapes.setdefault(op.name, output_shapes(op))
        run_shapes(md.step_stats, cap)
        self.functions[key] = FunctionRecord(key, key, calls=1, capture=cap, kind="Session.run")
        for v in graph.get_collection("variables"):
            self.finder.keep(v)
        return out

    def _place(self, graph) -> None:
        """Under emulation, the graph's unrequested ops on the device a GPU machine would choose
        (before the session sends the graph to the runtime: its first run extends it)."""
        if self.graph_placement is None or id(graph) in self._placed_graphs:
            return
        self._placed_graphs.add(id(graph))
        for op in graph.get_operations():
            if not device_of(op):
                device = self.graph_placement.unrequested(op)
                if device:
                    set_op_device(op, device)


def fetch_names(fetches) -> str:
    import tensorflow as tf

    names = []
    for f in tf.nest.flatten(fetches):
        names.append(getattr(f, "name", None) or str(f))
    text = ", ".join(names)
    return text if len(text) <= 120 else text[:117] + "..."
