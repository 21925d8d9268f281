"""PNG charts of a placement (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pinpoint.placement.model.placement import Placement, as_placement
from pinpoint.placement.report.summary import human_bytes

TOP_OP_TYPES = 22


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Lay out, write the PNG and free the figure (Agg figures live until closed)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(dev: str, physical: Mapping[str, str]) -> str:
    phys = physical.get(dev, dev)
    # the job/task prefix is the same as the spec name's: show only the local physical device
    return f"{dev}\n(= {phys[phys.rfind('/') + 1:]})" if phys != dev else dev


def ops_heatmap(placement: Placement, path: Path) -> Path | None:
    """Device x op-type heatmap of ops per step (the most frequent op types, the rest as 'other')."""
    types = placement.op_types_by_device
    if not types:
        return None
    plt = _plt()
    import numpy as np

    devices = list(types)
    totals: dict[str, float] = {}
    for counts in types.values():
        for t, n in counts.items():
            totals[t] = totals.get(t, 0) + n
    ranked = sorted(totals, key=lambda t: (-totals[t], t))
    shown = ranked[:TOP_OP_TYPES]
    other = ranked[TOP_OP_TYPES:]
    cols = shown + (["(other)"] if other else [])
    data = np.zeros((len(devices), len(cols)))
    for i, d in enumerate(devices):
        for j, t in enumerate(shown):
            data[i, j] = types[d].get(t, 0)
        if other:
            data[i, -1] = sum(types[d].get(t, 0) for t in other)
    phys = placement.physical_devices
    fig, ax = plt.subplots(figsize=(max(7, 0.5 * len(cols) + 2.5), 1.0 + 0.7 * len(devices)))
    masked = np.ma.masked_equal(data, 0)
    im = ax.imshow(masked, aspect="auto", cmap="YlOrRd", vmin=0)
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(devices)), [_label(d, phys) for d in devices], fontsize=8)
    for i in range(len(devices)):
        for j in range(len(cols)):
            if data[i, j]:
                v = data[i, j]
                ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=7,
                        color="white" if v > data.max() * 0.6 else "black")
    ax.set_title("Ops per step by device and op type (from the executed partition graphs)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, label="ops per step")
    return _save(plt, fig, path)


def transfer_matrix(placement: Placement, path: Path) -> Path | None:
    """Source x destination device matrix of bytes per step (cell text: bytes and count)."""
    matrix = placement.transfers.matrix
    devices = list(placement.devices)
    for s, row in matrix.items():
        for d in [s, *row]:
            if d not in devices:
                devices.append(d)
    if not matrix or not devices:
        return None
    plt = _plt()
    import numpy as np

    n = len(devices)
    data = np.zeros((n, n))
    counts = np.zeros((n, n))
    for s, row in matrix.items():
        for d, cell in row.items():
            data[devices.index(s), devices.index(d)] = cell.bytes
            counts[devices.index(s), devices.index(d)] = cell.count
    phys = placement.physical_devices
    size = 2.2 + 1.1 * n
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(np.ma.masked_equal(data, 0), cmap="Blues", vmin=0)
    labels = [_label(d, phys) for d in devices]
    ax.set_xticks(range(n), labels, fontsize=8, rotation=30, ha="right")
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("destination (receives)")
    ax.set_ylabel("source (sends)")
    peak = data.max() or 1
    for i in range(n):
        for j in range(n):
            if counts[i, j]:
                ax.text(j, i, f"{human_bytes(data[i, j])}\n{counts[i, j]:g} transfer{'' if counts[i, j] == 1 else 's'}", ha="center",
                        va="center", fontsize=8, color="white" if data[i, j] > 0.6 * peak else "black")
            elif i == j:
                ax.text(j, i, "-", ha="center", va="center", fontsize=8, color="grey")
    per = placement.transfers.per_step
    ax.set_title(f"Cross-device transfers per step: {per.count} "
                 f"({human_bytes(per.bytes)})", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="bytes per step")
    return _save(plt, fig, path)


def ops_per_device(placement: Placement, path: Path) -> Path | None:
    """Stacked bars: forward/other ops and backward-pass (gradient) ops per device."""
    ops = placement.ops_by_device
    if not ops:
        return None
    plt = _plt()
    grads = placement.gradients.ops_by_device or {}
    phys = placement.physical_devices
    devices = list(ops)
    g = [grads.get(d, 0) for d in devices]
    rest = [ops[d] - grads.get(d, 0) for d in devices]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(devices) + 2), 3.6))
    x = range(len(devices))
    ax.bar(x, rest, color="#4c78a8", label="forward, update and other ops")
    ax.bar(x, g, bottom=rest, color="#f58518", label="backward pass (gradients)")
    for i, d in enumerate(devices):
        ax.text(i, ops[d], f"{ops[d]:g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [_label(d, phys) for d in devices], fontsize=8)
    ax.set_ylabel("ops per step")
    ax.set_title("Ops per step by device", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(y=0.15)
    return _save(plt, fig, path)


def conformance(placement: Placement, path: Path) -> Path | None:
    """Horizontal bars: each rule's score; red below 1."""
    rules = [r for r in placement.conformance.rules if r.score is not None]
    if not rules:
        return None
    plt = _plt()
    names = [(f"[{r.task}] " if r.task else "") + f"{r.rule} -> {r.planned}" for r in rules]
    scores = [r.score for r in rules]
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.42 * len(rules)))
    colors = ["#54a24b" if s >= 1.0 else "#e45756" for s in scores]
    y = range(len(rules))
    ax.barh(list(y), scores, color=colors)
    for i, r in enumerate(rules):
        ax.text(min(r.score, 1.0) + 0.01, i, f"{r.score:.2f}  ({r.relevant - r.violations_total}/{r.relevant})",
                va="center", fontsize=8)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("fraction of relevant ops on the planned device")
    ax.set_title("Plan conformance by rule", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return _save(plt, fig, path)


def variable_bytes(placement: Placement, path: Path) -> Path | None:
    """Bytes of variable storage per device (every component counted where it lives)."""
    per: dict[str, float] = {}
    for v in placement.variables:
        if v.freed:
            continue  # storage no longer held at the end
        for c in v.components:
            dev = c.get("device") or "?"
            if c.get("task") and not dev.startswith("/job:"):
                dev = f"[{c['task']}] {dev}"
            per[dev] = per.get(dev, 0) + (v.bytes or 0)
    if not per:
        return None
    plt = _plt()
    phys = placement.physical_devices
    devices = list(per)
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(devices) + 2), 3.2))
    ax.bar(range(len(devices)), [per[d] for d in devices], color="#72b7b2")
    for i, d in enumerate(devices):
        ax.text(i, per[d], human_bytes(per[d]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(devices)), [_label(d, phys) for d in devices], fontsize=8)
    ax.set_ylabel("bytes")
    ax.set_title("Variable storage by device", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(y=0.15)
    return _save(plt, fig, path)


def time_per_device(placement: Placement, path: Path) -> Path | None:
    """placement.timing: one stacked bar per device over the timed window (compute, transfers, idle)."""
    timing = placement.timing
    devs = timing.devices if timing is not None else {}
    wall = (timing.wall_ms if timing is not None else 0) or 0
    if not devs or not wall:
        return None
    plt = _plt()
    phys = placement.physical_devices
    devices = list(devs)
    compute = [devs[d].compute_ms for d in devices]
    moved = [devs[d].transfer_ms for d in devices]
    idle = [max(0.0, wall - devs[d].busy_ms) for d in devices]
    fig, ax = plt.subplots(figsize=(9.5, 1.4 + 0.55 * len(devices)))
    y = list(range(len(devices)))
    ax.barh(y, compute, color="#4c78a8", label="compute")
    ax.barh(y, moved, left=compute, color="#f58518", label="transfers (_Send/_Recv, collectives)")
    ax.barh(y, idle, left=[c + m for c, m in zip(compute, moved)], color="#e0e0e0", label="idle")
    for i, d in enumerate(devices):
        ax.text(wall * 1.01, i, f"busy {devs[d].busy_ms:.3f} ms", va="center", fontsize=8)
    ax.set_yticks(y, [_label(d, phys).replace("\n", " ") for d in devices], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, wall * 1.3)
    ax.set_xlabel("ms of the timed window")
    steps = timing.steps
    ax.set_title(f"Time per device over {len(steps)} timed step(s), {wall:.3f} ms wall", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.spines[["top", "right"]].set_visible(False)
    return _save(plt, fig, path)


MEMORY_KINDS = ("activation", "gradient", "optimizer", "optimizer update", "variable", "input", "collective buffer",
                "temporary", "outside the step")


def memory_peaks(placement: Placement, path: Path) -> Path | None:
    """placement.memory: one bar per device at its peak, stacked by what the live bytes hold (the
    largest live allocations by kind; the rest of the peak as 'smaller allocations')."""
    devs = {d: m for d, m in ((placement.memory.devices if placement.memory else None) or {}).items() if d.startswith("/")}
    if not devs:
        return None
    plt = _plt()
    phys = placement.physical_devices
    devices = list(devs)
    fig, ax = plt.subplots(figsize=(9.5, 1.4 + 0.55 * len(devices)))
    y = list(range(len(devices)))
    left = [0.0] * len(devices)
    cmap = plt.get_cmap("tab10")
    for k, kind in enumerate((*MEMORY_KINDS, "smaller allocations")):
        widths = []
        for d in devices:
            top = sum(x["requested"] for x in devs[d]["at_peak"] if x["kind"] == kind)
            rest = devs[d]["peak_requested"] - sum(x["requested"] for x in devs[d]["at_peak"])
            widths.append((rest if kind == "smaller allocations" else top) / 2**20)
        if any(widths):
            ax.barh(y, widths, left=left, color="#c8c8c8" if kind == "smaller allocations" else cmap(k), label=kind)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, d in enumerate(devices):
        ax.text(left[i] * 1.01, i, f"{human_bytes(devs[d]['peak_requested'])} "
                f"({human_bytes(devs[d]['peak_allocated'])} allocated)", va="center", fontsize=8)
    ax.set_yticks(y, [_label(d, phys).replace("\n", " ") for d in devices], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.45 or 1)
    ax.set_xlabel("MiB live at the device's peak (requested)")
    ax.set_title("Memory per device at its peak, by what it holds", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.spines[["top", "right"]].set_visible(False)
    return _save(plt, fig, path)


def memory_timeline(placement: Placement, path: Path) -> Path | None:
    """placement.memory: each device's live bytes over the profiled call, its peak marked."""
    devs = {d: m for d, m in ((placement.memory.devices if placement.memory else None) or {}).items()
            if d.startswith("/") and m.get("timeline")}
    if not devs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 3.2))
    # From the first live byte: a first call spends most of its time tracing, allocating nothing.
    top = max(m["peak_requested"] for m in devs.values())
    busy = [t for m in devs.values() for t, b in m["timeline"] if b > 0.05 * top]
    if busy:
        end = max(t for m in devs.values() for t, _ in m["timeline"])
        ax.set_xlim(min(busy) - 0.02 * (end - min(busy)), end + 0.02 * (end - min(busy)))
    for d, m in devs.items():
        ts, bs = zip(*m["timeline"], strict=True)
        line, = ax.step(ts, [b / 2**20 for b in bs], where="post", label=d, linewidth=1.2)
        ax.plot([m["peak_time_us"]], [m["peak_requested"] / 2**20], "o", color=line.get_color(), markersize=4)
    ax.set_xlabel("µs into the profiled call")
    ax.set_ylabel("MiB live (requested)")
    ax.set_title("Memory per device over the profiled call (dots: each device's peak)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.spines[["top", "right"]].set_visible(False)
    return _save(plt, fig, path)


def plan_timeline(check: dict, path: Path) -> Path | None:
    """plan_check.json's simulated step of the run's placement and of the plan, one panel each:
    a bar per task (a group's forward or backward pass) on its device, from start to end."""
    timelines = {name: rows for name, rows in (check.get("timeline") or {}).items() if rows}
    if not timelines:
        return None
    plt = _plt()
    devices = sorted({r["device"] for rows in timelines.values() for r in rows})
    groups = sorted({r["group"] for rows in timelines.values() for r in rows})
    colors = {g: plt.get_cmap("tab20")(i % 20) for i, g in enumerate(groups)}
    end = max(r["end_us"] for rows in timelines.values() for r in rows)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(9.5, 0.8 + (0.5 * len(devices) + 0.6) * len(timelines)),
                             squeeze=False, sharex=True)
    for ax, (name, rows) in zip(axes[:, 0], timelines.items()):
        for r in rows:
            y = devices.index(r["device"])
            ax.barh(y, r["end_us"] - r["start_us"], left=r["start_us"], color=colors[r["group"]],
                    edgecolor="white", hatch="//" if r["pass"] == "backward" else None)
        last = max(r["end_us"] for r in rows)
        ax.set_yticks(range(len(devices)), devices, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.02)
        ax.set_title(f"{name}: simulated step {last / 1e3:.3f} ms (compute; hatched: backward)", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel("µs into the step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[g]) for g in groups]
    fig.legend(handles, groups, fontsize=8, loc="upper right", ncol=1)
    fig.subplots_adjust(right=0.8)
    return _save(plt, fig, path)


CHARTS = {
    "ops_heatmap.png": ops_heatmap,
    "transfer_matrix.png": transfer_matrix,
    "ops_per_device.png": ops_per_device,
    "conformance.png": conformance,
    "variable_bytes.png": variable_bytes,
    "time_per_device.png": time_per_device,
    "memory_peaks.png": memory_peaks,
    "memory_timeline.png": memory_timeline,
}


def write_charts(placement: Placement | Mapping[str, Any], folder: Path) -> dict[str, Path]:
    """Write every applicable chart into folder; return {file name: path}. A chart of an earlier
    placement written into the same folder that does not apply to this one is removed (only
    Pinpoint's own chart names are touched), so the folder shows this placement only."""
    placement = as_placement(placement) or Placement()
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, fn in CHARTS.items():
        tmp = folder / f".{name}.tmp.png"
        p = fn(placement, tmp)
        if p is not None:
            final = folder / name
            tmp.replace(final)  # atomic: a reader never sees half a PNG
            out[name] = final
        else:
            tmp.unlink(missing_ok=True)
            (folder / name).unlink(missing_ok=True)
    return out
