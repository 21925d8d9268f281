"""Where a CI run's time went: per tier, per test file and the slowest tests, with the TensorFlow
start-ups each caused.

Reads what the Makefile's test tiers leave in one folder (test-output/ci by default):
`<tier>.xml` (pytest's JUnit XML), `<tier>.tfstarts` (tests/tf_starts.py: one line a process that
imported TensorFlow) and `<tier>.seconds` (its wall time, start to end, as `make` ran it).

    python scripts/ci_times.py [DIR]            # the tables, then each tier's wall time
    python scripts/ci_times.py DIR --docs FILE  # the tier table into FILE between its markers

The last lines printed are each tier's wall time and one `ci: N passed, N failed, N skipped`.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

# The tiers and the parts CI runs apart (.ci/run: the `test` stream's, then the `corpus` stream's),
# in this order; a part of a tier (`integration-b`) follows its tier.
TIERS = ("unit", "integration", "slow", "images", "corpus", "differential", "compat")
BEGIN = "<!-- ci times: written by `python scripts/ci_times.py DIR --docs docs/development.md`; do not edit -->"
END = "<!-- end of ci times -->"


@dataclass(frozen=True)
class Case:
    tier: str
    nodeid: str
    seconds: float
    outcome: str  # passed, failed, skipped (xfail counts as skipped, as pytest's JUnit writes it)
    cpu: float  # CPU seconds of the test and the processes it waited for (tests/conftest.py: cpu_s)
    message: str = ""  # a failure's or error's message, as pytest's JUnit gives it

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


def nodeid(classname: str, name: str) -> str:
    """pytest's node id from a JUnit testcase: `tests.test_x.TestY` + `test_z[p]` ->
    `tests/test_x.py::TestY::test_z[p]` (the module is the last dotted part starting `test`)."""
    parts = classname.split(".")
    cut = max((i for i, p in enumerate(parts) if p.startswith(("test_", "conftest"))), default=len(parts) - 1)
    return "/".join(parts[:cut + 1]) + ".py::" + "::".join([*parts[cut + 1:], name])


def read_cases(folder: Path, tier: str) -> list[Case]:
    path = folder / f"{tier}.xml"
    if not path.exists():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        failure = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if failure is not None:
            outcome, message = "failed", failure.get("message", "")
        elif tc.find("skipped") is not None:
            outcome = "skipped"
        cpu = next((float(p.get("value")) for p in tc.iter("property") if p.get("name") == "cpu_s"), 0.0)
        cases.append(Case(tier, nodeid(tc.get("classname", ""), tc.get("name", "")), float(tc.get("time", 0)),
                          outcome, cpu, message))
    return cases


def read_starts(folder: Path, tier: str) -> Counter:
    """TensorFlow start-ups by test id ('' for one while no test ran: collecting the tests)."""
    path = folder / f"{tier}.tfstarts"
    starts: Counter = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            starts[line.split("\t", 1)[0]] += 1
    return starts


def tiers(folder: Path) -> list[str]:
    """The tiers that left a file in `folder`, TIERS' order first, a tier's parts after it."""
    names = {p.name.split(".", 1)[0] for p in folder.iterdir() if p.suffix in (".xml", ".seconds", ".tfstarts")}
    names.discard("run")  # .ci/run's own wall time

    def order(name: str) -> tuple:
        base = name.split("-", 1)[0]
        return (TIERS.index(base) if base in TIERS else len(TIERS), name)

    return sorted(names, key=order)


def read_walls(folder: Path) -> dict[str, float]:
    """Each tier's wall time in seconds, from its `<tier>.seconds`."""
    return {tier: float((folder / f"{tier}.seconds").read_text()) for tier in tiers(folder)
            if (folder / f"{tier}.seconds").exists()}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def _table(head: tuple, rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def tier_rows(folder: Path) -> list[tuple]:
    walls = read_walls(folder)
    rows, cpu = [], 0.0
    for tier in tiers(folder):
        cases, starts = read_cases(folder, tier), read_starts(folder, tier)
        if not cases and tier not in walls:
            continue
        count = Counter(c.outcome for c in cases)
        tier_cpu = sum(c.cpu for c in cases)
        cpu += tier_cpu
        rows.append((tier, _minutes(walls[tier]) if tier in walls else "-", _minutes(tier_cpu),
                     len(cases), count["passed"], count["failed"], count["skipped"], sum(starts.values())))
    whole = folder / "run.seconds"  # .ci/run's own wall time, both streams and the set-up
    if whole.exists() and rows:
        rows.append(("the whole run", _minutes(float(whole.read_text())), _minutes(cpu),
                     *(sum(r[i] for r in rows) for i in range(3, 8))))
    return rows


TIER_HEAD = ("tier", "wall min", "CPU min", "tests", "passed", "failed", "skipped", "TF starts")


def report(folder: Path, slowest: int = 20) -> list[str]:
    names = tiers(folder)
    cases = [c for tier in names for c in read_cases(folder, tier)]
    starts = {tier: read_starts(folder, tier) for tier in names}
    out = ["## Per tier", "", *_table(TIER_HEAD, tier_rows(folder)), ""]

    by_file: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in cases:
        by_file[(c.tier, c.file)].append(c)
    file_starts: Counter = Counter()
    for tier, counter in starts.items():
        for test, n in counter.items():
            file_starts[(tier, test.split("::", 1)[0])] += n
    rows = sorted(((tier, f, len(cs), f"{sum(c.seconds for c in cs):.0f}", f"{sum(c.cpu for c in cs):.0f}",
                    file_starts[(tier, f)]) for (tier, f), cs in by_file.items()), key=lambda r: -float(r[3]))
    rows += [(tier, "(collecting the tests)", 0, "-", "-", counter[""]) for tier, counter in starts.items()
             if counter[""]]
    out += ["## Per test file (seconds in tests, set-up and tear-down included)", "",
            *_table(("tier", "file", "tests", "seconds", "CPU s", "TF starts"), rows), ""]

    top = sorted(cases, key=lambda c: -c.seconds)[:slowest]
    out += [f"## The {slowest} slowest tests", "",
            *_table(("tier", "test", "seconds", "CPU s", "TF starts"),
                    [(c.tier, c.nodeid, f"{c.seconds:.1f}", f"{c.cpu:.1f}", starts[c.tier][c.nodeid]) for c in top]),
            ""]
    return out


def closing(folder: Path) -> list[str]:
    """Each tier's wall time, each failed test with its message's first line (a reader who sees only
    the end of the output still learns what failed), then the totals in the one line any CI reader
    understands."""
    walls = read_walls(folder)  # in tiers' order
    lines = [f"ci: tier {tier} took {_minutes(seconds)} min" for tier, seconds in walls.items()]
    cases = [c for tier in tiers(folder) for c in read_cases(folder, tier)]
    for c in cases:
        if c.outcome == "failed":
            first = next((line.strip() for line in c.message.splitlines() if line.strip()), "")
            lines.append(f"ci: failed in {c.tier}: {c.nodeid}: {first[:300]}")
    count = Counter(c.outcome for c in cases)
    lines.append(f"ci: {count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped")
    return lines


def write_docs(folder: Path, doc: Path, label: str) -> None:
    """The tier table into `doc` between BEGIN and END, headed by `label` (what was run)."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"ci_times: {doc} has no {BEGIN!r} ... {END!r} markers; add them where the table goes")
    table = "\n".join([label, "", *_table(TIER_HEAD, tier_rows(folder))])
    head, rest = text.split(BEGIN, 1)
    doc.write_text(f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default="test-output/ci", type=Path)
    p.add_argument("--docs", type=Path, help="write the tier table into this page instead of printing")
    p.add_argument("--label", default="", help="the line above the table (which run it was)")
    p.add_argument("--slowest", type=int, default=20)
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        print(f"ci_times: {args.folder} is not a folder; pass the folder the test tiers wrote (test-output/ci)",
              file=sys.stderr)
        return 2
    if args.docs:
        write_docs(args.folder, args.docs, args.label)
        return 0
    print("\n".join(report(args.folder, args.slowest) + closing(args.folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
