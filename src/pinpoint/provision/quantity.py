"""Kubernetes resource quantities ("500m", "4Gi", "1e9") as numbers, and back for messages."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": 1, "m": Decimal("0.001"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_RE = re.compile(r"^([+]?[0-9]*\.?[0-9]+)(?:([eE][-+]?[0-9]+)|(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?$")


def parse_quantity(value: object) -> Decimal:
    """'500m' -> 0.5, '4Gi' -> 4294967296, 8 -> 8; ValueError if malformed."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, (int, float, Decimal)):
        return Decimal(str(value))
    m = _RE.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. '2', '500m', '4Gi')")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
    if m.group(2):
        return number * (Decimal(10) ** int(m.group(2)[1:]))
    return number * Decimal(_SUFFIX[m.group(3) or ""])


def format_bytes(n: Decimal | float) -> str:
    """Bytes as the largest binary unit that keeps the number readable ('4Gi', '1.5Gi')."""
    n = Decimal(n)
    for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        size = Decimal(_SUFFIX[unit])
        if n >= size:
            return f"{(n / size).normalize():f}{unit}"
    return f"{n.normalize():f}"


def format_cpu(n: Decimal | float) -> str:
    n = Decimal(n)
    return f"{n.normalize():f}" if n == n.to_integral_value() or n >= 1 else f"{(n * 1000).normalize():f}m"
