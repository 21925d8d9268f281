"""The report's first screen, read back for tests: headless Chromium screenshots report.html at the
window a laptop shows (kept under test-output/report-first-screen/, git-ignored) and the "What to
change" section is parsed for its findings, device boxes, arrows and all-reduce figure. Tests hold
these to figures from placement.json or arithmetic, never to the HTML itself."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test-output" / "report-first-screen"
WINDOW = (1300, 900)  # the first screen
BOX_FILL = (0xE8, 0xF5, 0xE9)  # rundiagram: an accelerator's box
ARROW = (0xC0, 0x39, 0x2B)  # rundiagram: an arrow's head


def chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@dataclass(frozen=True)
class FirstScreen:
    findings: list[tuple[str, str]]  # (kind, evidence)
    nothing: bool  # "Nothing to change." shown
    boxes: dict[str, tuple[int, int]]  # device -> (ops, variables)
    arrows: dict[tuple[str, str], int]  # (from, to) -> bytes per step
    reduced: int | None  # bytes all-reduced per step (all devices)
    screenshot: Path


def screenshot(report: Path, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    png = OUT / f"{name}.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    f"--user-data-dir={OUT / ('.profile-' + name)}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                    f"--screenshot={png}", report.resolve().as_uri()],
                   check=True, capture_output=True, text=True, timeout=120)
    return png


def read_first_screen(report: Path, name: str) -> FirstScreen:
    text = report.read_text()
    section = text[text.index('<section id="change">'):]
    section = section[:section.index("</section>")]
    findings = [(html.unescape(k), html.unescape(re.sub(r"<[^>]+>", "", e))) for k, e in re.findall(
        r'<li class="finding" data-kind="([^"]+)">.*?<span class="evidence">(.*?)</span>', section, re.S)]
    boxes = {html.unescape(d): (int(o), int(v)) for d, o, v in re.findall(
        r'<g class="device" data-device="([^"]+)" data-ops="(\d+)" data-variables="(\d+)">', section)}
    arrows = {(html.unescape(s), html.unescape(d)): int(b) for s, d, b in re.findall(
        r'<g class="arrow" data-from="([^"]+)" data-to="([^"]+)" data-bytes="(\d+)">', section)}
    reduced = re.search(r'<text class="collective" data-bytes="(\d+)"', section)
    return FirstScreen(findings, "Nothing to change." in section, boxes, arrows,
                       int(reduced.group(1)) if reduced else None, screenshot(report, name))


def shows(png: Path, colour: tuple[int, int, int], *, at_least: int = 200) -> bool:
    """At least `at_least` pixels of `colour` in the screenshot (within 3 of each channel)."""
    import matplotlib.image
    import numpy as np

    rgb = (matplotlib.image.imread(str(png))[..., :3] * 255).round()
    return int((np.abs(rgb - np.array(colour)).max(axis=-1) <= 3).sum()) >= at_least


def expected_from_placement(p: dict) -> tuple[dict, dict, int | None]:
    """What the diagram must show, from placement.json: each device's ops per step and variables
    living there, the bytes of each ordered pair, the bytes all-reduced."""
    devices = p.get("devices") or list(p["ops_by_device"])
    boxes = {d: (int(p["ops_by_device"].get(d, 0)),
                 sum(1 for v in p["variables"] if d in v["devices"] and not v.get("freed")))  # freed: gone
             for d in devices}
    arrows = {(s, d): int(c["bytes"]) for s, row in p["transfers"]["matrix"].items() for d, c in row.items()
              if c["bytes"] and s != d}
    coll = [c for c in (p["transfers"].get("collectives") or {}).values() if c["count"]]
    return boxes, arrows, sum(int(c["input_bytes"]) for c in coll) if len(coll) > 1 else None
