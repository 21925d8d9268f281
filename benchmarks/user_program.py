"""A user's program, as the overheads section runs it under `python` and under `pinpoint trace`
(issue 50.5): a small tf.function (an `assign_add` and a `reduce_sum`) and an eager `tf.add`,
each timed in blocks of CALLS calls after a warm-up; the best block, in µs per call, is written
to --out as JSON. Nothing of Pinpoint is imported: the process pays what a user's does.

    python benchmarks/user_program.py --calls 20000 --blocks 3 --warmup 2000 --out timing.json
"""

from __future__ import annotations

import argparse
import json
import os
import time


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/user_program.py")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2000, help="calls of each before timing (past the quiet window)")
    p.add_argument("--out", required=True)
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
    add_us, add_blocks = best_us(lambda: tf.add(a, b), args.calls, args.blocks)
    fn_us, fn_blocks = best_us(lambda: step(x), args.calls, args.blocks)
    with open(args.out, "w") as f:
        json.dump({"fn_us": fn_us, "add_us": add_us, "fn_blocks": fn_blocks, "add_blocks": add_blocks,
                   "calls": args.calls, "blocks": args.blocks, "warmup": args.warmup}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
