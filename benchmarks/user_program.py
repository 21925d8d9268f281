"""A user's program, as the overheads section runs it under `python` and under `pinpoint trace`
(issue 50.5): a small tf.function (an `assign_add` and a `reduce_sum`) and an eager `tf.add`,
each timed in blocks of CALLS calls after a warm-up; the best block, in µs per call, is written
to --out as JSON. Nothing of Pinpoint is imported: the process pays what a user's does.

    python benchmarks/user_program.py --calls 20000 --blocks 3 --warmup 2000 --out timing.json

With --together DIR (two processes at once, benchmarks/user_calls.py), after its warm-up the
program writes DIR/ready-NAME, waits for DIR/go (a time on the machine's monotonic clock, which
every process shares) and then calls in phases of --phase-s seconds from that time, the
tf.function and the eager add by turns, so both processes make the same call over the same
seconds; each phase's calls and the CPU time the process spent in it are written.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def best_us(call, calls: int, blocks: int) -> tuple[float, list[float]]:
    """µs per call of the fastest of `blocks` blocks of `calls` calls (a block a slow spell of
    the shared machine or a sampling window hits is not the fastest), and every block's."""
    clock = time.perf_counter
    per = []
    for _ in range(blocks):
        t0 = clock()
        for _ in range(calls):
            call()
        per.append((clock() - t0) / calls * 1e6)
    return min(per), per


def phases(calls: dict, start: float, phase_s: float, n: int) -> list[dict]:
    """From `start` (time.monotonic), `n` rounds of one phase of `phase_s` seconds per entry of
    `calls`: each phase's calls and the CPU seconds the process spent over them (all its threads:
    an executor thread's work is the call's)."""
    clock, cpu = time.monotonic, time.process_time
    while clock() < start:
        time.sleep(max(start - clock(), 0.0))
    out, end = [], start
    for _ in range(n):
        for kind, call in calls.items():
            end += phase_s
            done, c0 = 0, cpu()
            while clock() < end:
                call()
                done += 1
            out.append({"kind": kind, "calls": done, "cpu_s": cpu() - c0})
    return out


def wait_for_go(folder: Path, name: str, timeout_s: float = 300.0) -> float:
    """Say this process is ready (folder/ready-NAME) and wait for folder/go: the start time."""
    (folder / f"ready-{name}").write_text("ready")
    go, until = folder / "go", time.monotonic() + timeout_s
    while not go.is_file():
        if time.monotonic() > until:
            raise SystemExit(f"no {go} within {timeout_s:.0f} s")
        time.sleep(0.005)
    return float(go.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/user_program.py")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2000, help="calls of each before timing (past the quiet window)")
    p.add_argument("--out", required=True)
    p.add_argument("--together", type=Path, help="a folder shared with the other process: call in synchronised phases")
    p.add_argument("--name", default="python", help="this process's name in --together's folder")
    p.add_argument("--phase-s", type=float, default=0.5)
    p.add_argument("--phases", type=int, default=8, help="phases of each call (--together)")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v = tf.Variable(0.0)

    @tf.function
    def step(x):
        v.assign_add(1.0)
        return tf.reduce_sum(x)

    x, a, b = tf.ones([4]), tf.ones([4]), tf.ones([4])
    for _ in range(args.warmup):
        step(x)
        tf.add(a, b)
    if args.together:
        start = wait_for_go(args.together, args.name)
        got = phases({"fn": lambda: step(x), "add": lambda: tf.add(a, b)}, start, args.phase_s, args.phases)
        with open(args.out, "w") as f:
            json.dump({"phases": got, "phase_s": args.phase_s, "warmup": args.warmup}, f)
        return 0
    add_us, add_blocks = best_us(lambda: tf.add(a, b), args.calls, args.blocks)
    fn_us, fn_blocks = best_us(lambda: step(x), args.calls, args.blocks)
    with open(args.out, "w") as f:
        json.dump({"fn_us": fn_us, "add_us": add_us, "fn_blocks": fn_blocks, "add_blocks": add_blocks,
                   "calls": args.calls, "blocks": args.blocks, "warmup": args.warmup}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
