"""Kernels that may run at once, held together: the prediction's high side.

A convolution's input and filter gradients read the same gradient. The executor runs them at once
when a thread is free, and then their workspaces are held together; in another call one waits for
the other. On a CPU each workspace is large (an im2col buffer sized by the host's cache), so
which draw a call gets moves its peak by tens of percent. `co_started` is the call with each such
pair started together, each kernel as long as it ran: a prediction at another batch takes the higher
of it and the call's own order, so it does not depend on the draw the measured call got.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

from pinpoint.placement.graphs.ops import CONV_GRADIENT_RE, without_mkl


def co_started(replay):
    """(the replay with each group of convolution gradients that became ready together on one
    device started at the earliest one's start, each as long as it ran; how many kernels moved)."""
    once = Counter(name for name, _, _ in replay.order)
    span = {name: (s, e) for name, s, e in replay.order if once[name] == 1}  # (a loop's body: left as it ran)
    nodes = {n.name: n for n in replay.nodes}

    known: dict[str, int] = {}

    def made(name: str) -> int:
        # When a node's output was ready: its kernel's end; an op the executor ran inline, its inputs'
        # (walked without recursion; a loop's back edge, met again on the way, adds nothing).
        if name in span:
            return span[name][1]
        if name in known:
            return known[name]
        best, seen, todo = 0, {name}, [name]
        while todo:
            n = nodes.get(todo.pop())
            for src, _ in n.inputs if n is not None else ():
                if src in span:
                    best = max(best, span[src][1])
                elif src in known:
                    best = max(best, known[src])
                elif src not in seen:
                    seen.add(src)
                    todo.append(src)
        known[name] = best
        return best

    together = defaultdict(list)  # (when its last input was ready, device) -> kernels
    for n in replay.nodes:
        if n.name in span and replay.temps.get(n.name) and CONV_GRADIENT_RE.match(without_mkl(n.op)):
            ready = max((made(src) for src, _ in n.inputs), default=0)
            together[(ready, replay.devices.get(n.name, ""))].append(n.name)
    start = {}
    for names in together.values():
        first = min(span[name][0] for name in names)
        start |= {name: first for name in names if span[name][0] > first}
    order = tuple((name, start[name], start[name] + e - s) if name in start else (name, s, e)
                  for name, s, e in replay.order)
    return replace(replay, order=order), len(start)


def moved_or_none(replay):
    """(`co_started`'s replay, or None when no kernel moved: the same replay, not run twice; how many moved)."""
    together, moved = co_started(replay)
    return (together if moved else None), moved
