"""Time to answer at scale: one `pinpoint train` of a real model with placement on, measured.

Adds to the Pinpoint record: ops per step, the seconds `build_placement` took (the analysis of
the captured step, after training) and writing the two placement files, their sizes in MB, the
process's peak RSS and how much the analysis raised it. With `open_report`: the seconds
`pinpoint report` took to write report.html, its size, and the time Chromium (headless) takes
to load it (`open_report_ms`, the median of 3: a page outside the report, with a script, loads it
in an iframe and notes the iframe's load event; the report itself has no script). The analysis is timed by wrapping
`pinpoint.placement.analysis.build.build_placement` and `pinpoint.placement.model.files.write_placement` in
this process (the trainer imports them when it needs them)."""

from __future__ import annotations

import re
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


CHROMIUM = "chromium"
OPENER = """<!DOCTYPE html><html><head><script>var t0 = performance.now();</script></head><body>
<iframe style="width:1300px;height:900px" src="report.html"
 onload="document.title = 'LOADED ' + (performance.now() - t0).toFixed(1)"></iframe></body></html>
"""


def open_report_ms(run_dir: Path, times: int = 3) -> list[float]:
    """Milliseconds from navigation to report.html's load event in headless Chromium, each time."""
    exe = shutil.which(CHROMIUM)
    if exe is None:
        return None
    opener = run_dir / "open-report.html"
    opener.write_text(OPENER)
    found = []
    for _ in range(times):
        p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", opener.as_uri()],
                           capture_output=True, text=True, timeout=120, check=False)
        m = re.search(r"LOADED ([0-9.]+)", p.stdout)
        if m:
            found.append(float(m.group(1)))
    opener.unlink()
    return found


PLAN_TIMES = 3


def _planning(run: Path, devices: int) -> dict[str, Any]:
    """Issue 33's planning time on this real capture: `pinpoint plan`'s work (read the run folder,
    search, predict every placement), timed PLAN_TIMES times in this process."""
    from pinpoint.plan.build import plan_graph
    from pinpoint.plan.command import plan_run
    from pinpoint.plan.links import LinkModel

    times, graph = [], None
    for _ in range(PLAN_TIMES):
        t0 = time.perf_counter()
        graph = plan_graph(run)
        plan_run(graph, source_run=str(run), devices=devices, objective="balance", links=LinkModel())
        times.append(time.perf_counter() - t0)
    return {"plan_s_runs": times, "plan_s": statistics.median(times), "plan_ops": sum(g.ops for g in graph.groups),
            "plan_groups": len(graph.groups)}


def measure(spec: dict) -> dict[str, Any]:
    from benchmarks.pinpoint_run import pinpoint_train
    from pinpoint.placement.analysis import build as analyze
    from pinpoint.placement.model import files

    timed: dict[str, float] = {"analysis_s": 0.0, "write_s": 0.0, "rss_before_analysis_mb": 0.0,
                               "rss_after_analysis_mb": 0.0}

    def wrap(module, name, key, rss=False):
        original = getattr(module, name)

        def timed_call(*args, **kwargs):
            if rss:
                timed["rss_before_analysis_mb"] = _rss_mb()
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timed[key] += time.perf_counter() - t0
                if rss:
                    timed["rss_after_analysis_mb"] = _rss_mb()

        setattr(module, name, timed_call)

    wrap(analyze, "build_placement", "analysis_s", rss=True)
    wrap(files, "write_placement", "write_s")
    rec = pinpoint_train(spec)
    out = Path(spec["out"])
    placement = files.read_placement(out, detail=True)
    main, ops = out / "placement.json", files.ops_path(out / "placement.json")
    rec.update(
        ops_per_step=sum((placement.get("ops_by_device") or {}).values()),
        ops_listed=len(placement.get("ops") or []),
        variables=len(placement.get("variables") or []),
        analysis_s=timed["analysis_s"],
        write_s=timed["write_s"],
        placement_json_mb=main.stat().st_size / 1e6,
        placement_ops_mb=ops.stat().st_size / 1e6 if ops.is_file() else 0.0,
        peak_rss_mb=_rss_mb(),
        analysis_rss_growth_mb=timed["rss_after_analysis_mb"] - timed["rss_before_analysis_mb"],
    )
    if spec.get("plan_devices"):
        rec.update(_planning(out, int(spec["plan_devices"])))
    if spec.get("open_report"):
        from pinpoint.placement.report.html import write_report

        t0 = time.perf_counter()
        html, _, _ = write_report(out)
        report_s = time.perf_counter() - t0
        opened = open_report_ms(out)
        rec.update(report_s=report_s, report_mb=html.stat().st_size / 1e6, open_report_runs_ms=opened,
                   open_report_ms=statistics.median(opened) if opened else None)
    return rec
