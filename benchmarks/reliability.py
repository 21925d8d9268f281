"""Reliability table for RESULTS.md from the fault suite's runs/reliability.json.

`make test` and `make test-faults` write one row per injected fault there (pytest
--reliability-out); `python -m benchmarks.reliability`
prints (or with --out, writes) the markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.table import markdown_table

DEFAULT_IN = Path(__file__).resolve().parents[1] / "runs" / "reliability.json"
HEADERS = ["fault injected", "strategy", "injected at step", "recovered", "restarts",
           "detected after (s)", "resumed from step", "steps redone", "metrics lost", "total (s)"]


def _dash(v):
    return "-" if v is None else v


def reliability_table(rows: list[dict]) -> str:
    """The markdown table; a final line sums faults, recoveries and metrics lost."""
    body = []
    for r in rows:
        recovered = "yes" if r.get("recovered") else f"no ({r['outcome']})" if r.get("outcome") else "no"
        body.append([
            r["fault"], r["strategy"], _dash(r.get("injected_at_step")), recovered, r.get("restarts", 0),
            _dash(r.get("detected_after_s")), _dash(r.get("resumed_from_step")), _dash(r.get("steps_redone")),
            r.get("metrics_lost", 0), _dash(r.get("total_s")),
        ])
    table = markdown_table(HEADERS, body, align=["l", "l"] + ["r"] * (len(HEADERS) - 2))
    injected = sum(int(r.get("injected", 1)) for r in rows)
    recovered = sum(1 for r in rows if r.get("recovered"))
    lost = sum(int(r.get("metrics_lost", 0)) for r in rows)
    return table + (
        f"\n{injected} fault(s) injected, {recovered} recovered through a whole-group restart from the "
        f"last checkpoint, the rest failed within a bounded time with a one-line message; "
        f"metrics lost: {lost}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", type=Path, default=DEFAULT_IN)
    p.add_argument("--out", type=Path, help="write the table here instead of stdout")
    args = p.parse_args(argv)
    if not args.input.is_file():
        print(f"reliability: '{args.input}' not found; run `make test-faults` first", file=sys.stderr)
        return 2
    text = reliability_table(json.loads(args.input.read_text()))
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
