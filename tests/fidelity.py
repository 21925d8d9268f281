"""The emulation fidelity matrix (tests/fidelity.yaml) and the docs table generated from it.

`python -m tests.fidelity --write` (or `make docs`) rewrites the table in docs/placement.md
between its markers; tests/test_fidelity.py fails when the two differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "tests" / "fidelity.yaml"
DOC = REPO / "docs" / "placement.md"
BEGIN = "<!-- fidelity table: generated from tests/fidelity.yaml by `make docs`; do not edit -->"
END = "<!-- end of fidelity table -->"


def load() -> dict:
    return yaml.safe_load(MATRIX.read_text())


def _scenario(name: str, scenarios: dict) -> str:
    spec = scenarios.get(name)
    if spec is None:
        return name
    if "config" in spec:
        train = yaml.safe_load((REPO / spec["config"]).read_text())["train"]
        return _scenario(name, {name: {"strategy": train["strategy"], "pinning": {
            k: v for k, v in (train.get("pinning") or {}).items() if k != "soft_placement"}}}) + f" ({spec['config']})"
    parts = [spec["strategy"]]
    for rule, dev in (spec.get("pinning") or {}).items():
        if isinstance(dev, dict):
            parts.append(f"{rule}: " + ", ".join(f"{k} {v}" for k, v in dev.items()))
        else:
            parts.append(f"{rule} {dev}")
    if spec.get("jit_compile"):
        parts.append("XLA")
    return ", ".join(parts)


def render(matrix: dict | None = None) -> str:
    """The markdown table, one row per matrix row."""
    matrix = matrix or load()
    lines = ["| scenario | figure | same as a GPU machine | why | checked |", "|---|---|---|---|---|"]
    for row in matrix["rows"]:
        checked = "yes (test_fidelity)" if row.get("check") else "see why"
        same = "yes" if row["same"] else "**no**"
        why = row["why"].replace("|", "\\|")
        lines.append(f"| {_scenario(row['scenario'], matrix['scenarios'])} | {row['figure']} | {same} | {why} | {checked} |")
    return "\n".join(lines)


def section(text: str) -> str:
    """The generated block as it stands in a document (between the markers)."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write(doc: Path = DOC) -> bool:
    text = doc.read_text()
    new = text[: text.index(BEGIN) + len(BEGIN)] + "\n" + render() + "\n" + text[text.index(END):]
    if new != text:
        doc.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC.relative_to(REPO)}")
    args = ap.parse_args(argv)
    if args.write:
        print(f"{DOC.relative_to(REPO)}: " + ("table updated" if write() else "table already current"))
    else:
        print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
