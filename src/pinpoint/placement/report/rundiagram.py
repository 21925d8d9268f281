"""The run at a glance: each device a box (its ops per step, the variables living there, its busy
share of the step when the run was timed), an arrow per ordered device pair sized by the bytes
crossing it per step (the transfers matrix), and a dashed link between the devices that
all-reduce together (the bytes reduced per step). Inline SVG, drawn from the placement alone: the
report stays one static file. Hosts (CPU devices) in the top row, the others below."""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

from pinpoint.device_names import is_host
from pinpoint.placement.model.placement import Placement
from pinpoint.placement.report.summary import human_bytes

BOX_W, BOX_H, GAP, MARGIN, ROW_GAP = 170, 74, 120, 24, 150


MAX_STROKE = 12.0


COLLECTIVE_H = 24  # the all-reduce curve's depth under the boxes


@dataclass(frozen=True)
class DeviceBox:
    device: str
    ops: int
    variables: int
    busy: float | None  # share of the step, when timed
    x: float
    y: float


@dataclass(frozen=True)
class Arrow:
    source: str
    to: str
    bytes: int
    count: int


def boxes(p: Placement) -> list[DeviceBox]:
    """One box per device of the run, hosts in the top row."""
    devices = list(p.devices) or list(p.ops_by_device)
    hosts = [d for d in devices if is_host(d) and d not in p.device_aliases]
    rows = [r for r in (hosts, [d for d in devices if d not in hosts]) if r]
    if not rows:
        return []  # a program that ran no op on any device (nothing captured)
    width = max(len(r) for r in rows) * (BOX_W + GAP) - GAP
    step_ms = p.timing.step_ms if p.timing else None
    out = []
    for i, row in enumerate(rows):
        left = MARGIN + (width - (len(row) * (BOX_W + GAP) - GAP)) / 2
        for j, d in enumerate(row):
            t = p.timing.devices.get(d) if p.timing else None
            busy = t.busy_ms / step_ms if t is not None and step_ms else None
            out.append(DeviceBox(d, int(p.ops_by_device.get(d, 0) or 0), sum(1 for v in p.variables if d in v.devices and not v.freed),
                                 busy, left + j * (BOX_W + GAP), MARGIN + i * (BOX_H + ROW_GAP)))
    return out


def arrows(p: Placement) -> list[Arrow]:
    """Every ordered device pair with bytes crossing per step, largest first."""
    return sorted((Arrow(s, d, int(c.bytes), int(c.count)) for s, row in p.transfers.matrix.items()
                   for d, c in row.items() if c.bytes and s != d), key=lambda a: (-a.bytes, a.source, a.to))


def _stroke(b: float, largest: float) -> float:
    return 1.5 + (MAX_STROKE - 1.5) * math.sqrt(b / largest) if largest else 1.5


def _edge(a: DeviceBox, b: DeviceBox, offset: float) -> tuple[float, float, float, float]:
    """A line between the two boxes' borders, moved `offset` to its left (the two directions of a
    pair side by side)."""
    ax, ay, bx, by = a.x + BOX_W / 2, a.y + BOX_H / 2, b.x + BOX_W / 2, b.y + BOX_H / 2
    dx, dy = bx - ax, by - ay
    n = math.hypot(dx, dy) or 1.0
    ux, uy = dx / n, dy / n
    px, py = -uy * offset, ux * offset
    # leave each box at its border (a box's half extent along the direction)
    ta = min(BOX_W / 2 / abs(ux) if ux else math.inf, BOX_H / 2 / abs(uy) if uy else math.inf) + 4
    return ax + ux * ta + px, ay + uy * ta + py, bx - ux * (ta + 6) + px, by - uy * (ta + 6) + py


def _label_at(x1: float, y1: float, x2: float, y2: float, away: float) -> tuple[float, float]:
    """Where an arrow's label goes: 40% along it, `away` to its left (two directions of a pair
    label on their own sides)."""
    dx, dy = x2 - x1, y2 - y1
    n = math.hypot(dx, dy) or 1.0
    return x1 + 0.4 * dx - dy / n * away, y1 + 0.4 * dy + dx / n * away + 4


def _box_svg(b: DeviceBox, physical: str) -> str:
    lines = [f"{b.ops} ops / step", f"{b.variables} variable(s)"]
    lines.append(f"busy {100 * b.busy:.0f}% of the step" if b.busy is not None else "busy: not timed")
    text = "".join(f'<text x="{b.x + 10:.0f}" y="{b.y + 38 + 14 * i:.0f}" font-size="11">{escape(t)}</text>'
                   for i, t in enumerate(lines))
    name = b.device + (f" = {physical}" if physical != b.device and not physical.startswith("/job:") else "")
    fill = "#eef3f8" if is_host(b.device) and "=" not in name else "#e8f5e9"
    return (f'<g class="device" data-device="{escape(b.device)}" data-ops="{b.ops}" data-variables="{b.variables}">'
            f'<rect x="{b.x:.0f}" y="{b.y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" '
            f'stroke="#243447"/><text x="{b.x + 10:.0f}" y="{b.y + 20:.0f}" font-size="13" font-weight="600">'
            f"{escape(name)}</text>{text}</g>")


def run_diagram(p: Placement) -> str:
    """The SVG of the run (an empty string when the placement names no device)."""
    bx = boxes(p)
    if not bx:
        return ""
    at = {b.device: b for b in bx}
    arr = [a for a in arrows(p) if a.source in at and a.to in at]
    largest = max((a.bytes for a in arr), default=0)
    parts = []
    for a in arr:
        both = any(r.source == a.to and r.to == a.source for r in arr)
        x1, y1, x2, y2 = _edge(at[a.source], at[a.to], 10 if both else 0)
        w = _stroke(a.bytes, largest)
        mx, my = _label_at(x1, y1, x2, y2, 14 + w / 2)
        parts.append(f'<g class="arrow" data-from="{escape(a.source)}" data-to="{escape(a.to)}" data-bytes="{a.bytes}">'
                     f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#c0392b" '
                     f'stroke-opacity="0.75" stroke-width="{w:.1f}" marker-end="url(#head)"/>'
                     f'<text x="{mx:.0f}" y="{my:.0f}" font-size="11" fill="#8e2a1f" text-anchor="middle">{human_bytes(a.bytes)}</text></g>')
    parts += _collectives(p, at)
    parts += [_box_svg(b, p.physical_devices.get(b.device, b.device)) for b in bx]
    width = max(b.x for b in bx) + BOX_W + MARGIN
    height = max(b.y for b in bx) + BOX_H + MARGIN + 16 + (COLLECTIVE_H + 20 if p.transfers.collectives else 0)
    legend = (f'<text x="{MARGIN}" y="{height - 8:.0f}" font-size="11" fill="#555">arrow: bytes crossing per step '
              "(width ~ its square root); dashed: all-reduce</text>")
    width = max(width, 420)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="run-diagram" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica,Arial,sans-serif"><defs>'
            '<marker id="head" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="14" markerHeight="14" '
            'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c0392b"/></marker></defs>'
            + "".join(parts) + legend + "</svg>")


def _collectives(p: Placement, at: dict[str, DeviceBox]) -> list[str]:
    """A dashed curve under the devices that ran collectives, labelled with the bytes reduced."""
    devs = [d for d, c in p.transfers.collectives.items() if c.count and d in at]
    if len(devs) < 2:
        return []
    out = []
    total = sum(int(p.transfers.collectives[d].input_bytes) for d in devs)
    for a, b in zip(devs, devs[1:], strict=False):
        x1, x2, y = at[a].x + BOX_W / 2, at[b].x + BOX_W / 2, max(at[a].y, at[b].y) + BOX_H
        out.append(f'<path d="M{x1:.0f},{y:.0f} Q{(x1 + x2) / 2:.0f},{y + 2 * COLLECTIVE_H:.0f} {x2:.0f},{y:.0f}" '
                   'fill="none" stroke="#2e6da4" stroke-width="3" stroke-dasharray="6 4"/>')
    a, b = at[devs[0]], at[devs[-1]]
    out.append(f'<text class="collective" data-bytes="{total}" x="{(a.x + b.x + BOX_W) / 2:.0f}" '
               f'y="{max(a.y, b.y) + BOX_H + COLLECTIVE_H + 16:.0f}" font-size="11" fill="#2e6da4" '
               f'text-anchor="middle">all-reduce: {human_bytes(total)} reduced per step</text>')
    return out
