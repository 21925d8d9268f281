"""Markdown tables (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def _cell(value) -> str:
    # A pipe would split the cell; a newline would end the row.
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence], align: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured markdown table; align holds 'l' or 'r' per column (default: l then r)."""
    if not headers:
        raise ValueError("markdown_table: needs at least one column")
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"markdown_table: row {list(r)!r} has {len(r)} cells, expected {len(headers)}")
    align = list(align) if align else ["l"] + ["r"] * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
