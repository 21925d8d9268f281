"""Memory over several measured calls of the same function.

The executor's order changes from call to call, and with it which temporaries are live at once:
one call's peak is one draw. Each measured call gets its own section (placement.memory.section);
the placement keeps the section of the call whose busiest device needs the most (so the fits
verdict and the largest batch come from the high end), and beside it, per device, the least and
the most measured peak over the calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pinpoint.device_names import is_host


def need(section: Mapping) -> tuple[int, int]:
    """What a call's section says its busiest device needs, and all its devices together: the
    predicted peak on a GPU machine (each received tensor a copy), else the measured peak."""
    predicted = (section.get("predicted") or {}).get("devices") or {}
    per = {d: r.get("gpu_machine", 0) for d, r in predicted.items()} or {
        d: m["peak_requested"] for d, m in (section.get("devices") or {}).items() if d.startswith("/")}
    # The GPUs when there are any (the host's memory is not what fits); a CPU-only run's devices else.
    per = {d: b for d, b in per.items() if not is_host(d)} or per
    return max(per.values(), default=0), sum(per.values())


def highest(sections: Sequence[tuple[int, Mapping]]) -> dict:
    """The section to keep of `sections` ((call number, section) per measured call, in call order)
    with its `calls`: the calls measured, the one kept, each device's least and most measured peak."""
    measured = [(n, s) for n, s in sections if s.get("devices")]
    if not measured:
        return dict(sections[0][1])
    # The earliest of equals: a later call adds nothing to its verdict.
    n, kept = max(measured, key=lambda c: (*need(c[1]), -c[0]))
    devices = {}
    for d in kept["devices"]:
        if d.startswith("/"):
            peaks = [s["devices"][d]["peak_requested"] for _, s in measured if d in s["devices"]]
            devices[d] = {"least": min(peaks), "most": max(peaks)}
    return dict(kept) | {"calls": {"measured": [c for c, _ in measured], "kept": n, "devices": devices}}
