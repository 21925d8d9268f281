"""Other orders the executor may run a call in: the prediction's high side.

The executor hands a kernel whose inputs are ready to the thread that readied it, or to its pool,
where it waits while every thread is busy. Which kernels overlap, and how long a buffer lives, is a
draw that changes from call to call and from batch to batch, and a peak moves with it by tens of
percent. A prediction at another batch takes the highest of the call's own order and these:

- `co_started`: a convolution's input and filter gradients read the same gradient; started together
  their workspaces are held at once (on a CPU each is an im2col buffer sized by the host's cache).
- `held_longest`: every kernel that reads computed data started as soon as its inputs were ready
  (`started_when_ready`), and every weight gradient run as late as its readers let it (`deferred`):
  the backward pass goes on from the input gradient while the queued weight gradient holds the
  layer's input and gradient.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

from pinpoint.placement.graphs.ops import CONV_GRADIENT_RE, STATE_SOURCES, without_mkl


def co_started(replay):
    """(the replay with each group of convolution gradients that became ready together on one
    device started at the earliest one's start, each as long as it ran; how many kernels moved)."""
    span = _spans(replay)  # (a loop's body: left as it ran)
    made = _made(replay, span)
    together = defaultdict(list)  # (when its last input was ready, device) -> kernels
    for n in replay.nodes:
        if n.name in span and replay.temps.get(n.name) and CONV_GRADIENT_RE.match(without_mkl(n.op)):
            ready = _ready(n, made)
            together[(ready, replay.devices.get(n.name, ""))].append(n.name)
    start = {}
    for names in together.values():
        first = min(span[name][0] for name in names)
        start |= {name: first for name in names if span[name][0] > first}
    return _moved(replay, span, start), len(start)


def variants(replay) -> tuple[tuple, dict[str, int]]:
    """(the other orders to replay: `co_started`'s and `held_longest`'s, each where a kernel moved
    (the same order is not replayed twice); how many kernels each moved)."""
    together, co = co_started(replay)
    longest, held = held_longest(replay)
    return tuple(r for r, n in ((together, co), (longest, held)) if n), {"co_started": co, "held_longest": held}


def held_longest(replay):
    """(`deferred` of `started_when_ready`: each buffer held as long as the graph lets it; how many
    kernels moved)."""
    early, n = started_when_ready(replay)
    late, m = deferred(early)
    return late, n + m


def started_when_ready(replay):
    """(the replay with each kernel that reads what another kernel computed started when its inputs
    were ready in the call, each as long as it ran: what a free thread does; how many moved). An
    output made sooner is held longer. A kernel that reads only the step's state (variables,
    constants: an optimizer's slot times its decay) stays where it ran: moved to the call's start it
    would hold every such temporary through the step, an order the calls measured did not draw."""
    span = _spans(replay)
    made = _made(replay, span)
    ops = {n.name: n.op for n in replay.nodes}
    start = {}
    for n in replay.nodes:
        if n.name in span and any(src in span and ops.get(src) not in STATE_SOURCES for src, _ in n.inputs):
            ready = _ready(n, made)
            if ready < span[n.name][0]:
                start[n.name] = ready
    return _moved(replay, span, start), len(start)


def deferred(replay):
    """(the replay with each weight gradient run as late as its readers let it; how many moved).

    Of the kernels that became ready at the same moment on one device (a layer's input and weight
    gradients read the gradient that just arrived), those with a shorter path of kernels below them
    than a sibling's (the weight gradients: the optimizer reads them; the backward pass goes on from
    the input gradient) end where their first reading kernel starts, back to back in the order they
    ran, each as long as it ran, never earlier than they did: what the pool does with a queued kernel
    while every thread is busy."""
    span = _spans(replay)
    made = _made(replay, span)
    readers: dict[str, list[str]] = defaultdict(list)
    for n in replay.nodes:
        for src, _ in n.inputs:
            readers[src].append(n.name)
    below = _kernels_below(replay, span, readers)
    groups = defaultdict(list)  # (when its inputs were all ready, device) -> kernels
    for n in replay.nodes:
        if n.name in span and span[n.name][1] > span[n.name][0]:
            ready = _ready(n, made)
            groups[(ready, replay.devices.get(n.name, ""))].append(n.name)
    late = defaultdict(list)  # the start of a first reading kernel -> the kernels to end there
    for names in groups.values():
        most = max(below[name] for name in names)
        for name in names:
            first = _first_reader(name, span, readers) if below[name] < most else None
            if first is not None and first > span[name][1]:
                late[first].append(name)
    start = {}
    for end, names in late.items():
        for name in sorted(names, key=lambda n: span[n][0], reverse=True):
            s, e = span[name]
            start[name] = end = max(s, end - (e - s))
    start = {name: t for name, t in start.items() if t > span[name][0]}
    return _moved(replay, span, start), len(start)


def _spans(replay) -> dict[str, tuple[int, int]]:
    """Each kernel that ran once: (start, end). A loop's body's kernels are left as they ran."""
    once = Counter(name for name, _, _ in replay.order)
    return {name: (s, e) for name, s, e in replay.order if once[name] == 1}


def _moved(replay, span, start: dict[str, int]):
    """The replay with the kernels of `start` started then, each as long as it ran."""
    order = tuple((name, start[name], start[name] + e - s) if name in start else (name, s, e)
                  for name, s, e in replay.order)
    return replace(replay, order=order)


def _made(replay, span):
    """name -> when its output was ready: its kernel's end; an op the executor ran inline, its
    inputs' (walked without recursion; a loop's back edge, met again on the way, adds nothing)."""
    nodes = {n.name: n for n in replay.nodes}
    known: dict[str, int] = {}

    def made(name: str) -> int:
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

    return made


def _ready(node, made) -> int:
    """When the last of `node`'s inputs was ready (`_made`); 0 for a node without inputs."""
    return max((made(src) for src, _ in node.inputs), default=0)


def _kernels_below(replay, span, readers) -> dict[str, int]:
    """node -> the most kernels on a path of readers from it (itself not counted; a loop's back
    edge, met on the way, ends the path)."""
    below: dict[str, int] = {}
    for root in (n.name for n in replay.nodes):
        if root in below:
            continue
        stack, on_path = [(root, iter(readers.get(root, ())))], {root}
        while stack:
            name, it = stack[-1]
            r = next(it, None)
            if r is None:
                stack.pop()
                on_path.discard(name)
                below[name] = max((below.get(x, 0) + (x in span) for x in readers.get(name, ()) if x not in on_path),
                                  default=0)
            elif r not in below and r not in on_path:
                on_path.add(r)
                stack.append((r, iter(readers.get(r, ()))))
    return below


def _first_reader(name: str, span, readers) -> int | None:
    """The earliest start of a kernel reading `name`'s output, through the ops run inline."""
    seen, todo, first = {name}, list(readers.get(name, ())), None
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        if r in span:
            first = span[r][0] if first is None else min(first, span[r][0])
        else:
            todo.extend(readers.get(r, ()))
    return first

