"""The partition graphs of a function another runtime of this process ran: a parameter_server
closure, which a worker's runtime instantiates and partitions (the coordinator's run metadata holds
none of it). TensorFlow writes them where TF_DUMP_GRAPH_PREFIX says, read once when it first
instantiates a function, so `pinpoint trace --memory` sets it before the program starts.

TensorFlow's dumper writes a graph at each stage of a function's instantiation, as
`<name>.<order>.<group>.<stage>.pbtxt`. A multi-device function's graph is partitioned per device
(`<fn>_partition__<device>`); each part on another task becomes a component function
(`<fn>_partitioned_<id>_<k>`; TensorFlow 2.16 names it `<fn>_<id>_<k>`), instantiated and
partitioned there in turn. What ran is each part's
graph after its partition passes: the caller's own part of `<fn>`, and each component's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pinpoint.device_names import parse_name

PREFIX_ENV = "TF_DUMP_GRAPH_PREFIX"


# Only the partitions' graphs: a function's whole graph at every stage would cost the run seconds.
FILTER = "_partition"


FINAL = ".main.after_partition_passes.pbtxt"


def dump_env(directory: Path) -> dict[str, str]:
    """The environment that makes TensorFlow write the partitions' graphs into `directory`."""
    return {PREFIX_ENV: str(directory), "TF_DUMP_GRAPH_NAME_FILTER": FILTER, "TF_DUMP_GRAPH_GROUPS": "main"}


def dump_dir() -> Path | None:
    """Where this process' TensorFlow writes its graphs (None: it writes none)."""
    d = os.environ.get(PREFIX_ENV)
    return Path(d) if d and os.environ.get("TF_DUMP_GRAPH_NAME_FILTER") == FILTER else None


def _final(directory: Path, name: str) -> dict[str, Path]:
    """device (the file's spelling) -> the latest final graph of `name`'s partition there."""
    out: dict[str, Path] = {}
    pattern = re.compile(re.escape(name) + r"_partition__(.+)\.(\d+)" + re.escape(FINAL) + "$")
    for p in sorted(directory.glob(f"{name}_partition__*{FINAL}"), key=lambda p: p.name):
        m = pattern.match(p.name)
        if m:
            out[m.group(1)] = p
    return out


def _read(path: Path):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    g = graph_pb2.GraphDef()
    text_format.Parse(path.read_text(), g)
    return g


def _device(g) -> str:
    return next((n.device for n in g.node if n.device), "")


def remote_partitions(directory: Path, function: str, caller: str) -> tuple[list, str | None]:
    """(the graphs that ran for one call of `function` made on device `caller`, or [] and why not).
    With several workers each instantiates the function: the caller's own part is its task's, and
    each instantiation makes its own components, the same graphs under another id."""
    own = list(map(_read, _final(directory, function).values()))
    graphs = [g for g in own if parse_name(_device(g))[:2] == parse_name(caller)[:2]]
    # A component is `<fn>_partitioned_<id>_<k>` (TensorFlow 2.16: `<fn>_<id>_<k>`).
    component = re.compile(re.escape(function) + r"_(?:partitioned_)?(\d+)_\d+_partition__")
    parts = [(m.group(1), p) for p in sorted(directory.glob(f"{function}_*{FINAL}")) if (m := component.match(p.name))]
    by_id: dict[str, dict[str, Path]] = {}
    for key, p in parts:  # (sorted: a later stage's file replaces an earlier one's)
        by_id.setdefault(key, {})[p.name.rsplit(".", 4)[0].replace(key, "", 1)] = p
    read = {key: [_read(p) for _, p in sorted(files.items())] for key, files in by_id.items()}
    if len({_signature(gs) for gs in read.values()}) > 1:
        return [], f"{function} was instantiated {len(read)} times; which one ran the measured call is not known"
    graphs.extend(next(iter(read.values()), []))
    if not graphs:
        return [], f"TensorFlow wrote no partition graph of {function} into {directory}"
    return graphs, None


def tasks_of(directory: Path, function: str, caller: str) -> int:
    """How many tasks of `caller`'s job instantiated `function` (each wrote its own part)."""
    own = map(_read, _final(directory, function).values())
    return len({parse_name(_device(g))[:2] for g in own if parse_name(_device(g))[0] == parse_name(caller)[0]})


def _signature(graphs: list) -> tuple:
    """What tells two instantiations of a component apart: their nodes (name, op, device)."""
    return tuple(sorted((n.name, n.op, n.device) for g in graphs for n in g.node))


__all__ = ["FILTER", "PREFIX_ENV", "dump_dir", "dump_env", "remote_partitions", "tasks_of"]
