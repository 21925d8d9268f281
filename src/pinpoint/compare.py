"""Compare trained run folders (a placement sweep): speed, loss, and whether each run obeyed
its plan (placement conformance), then pick the fastest run that did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinpoint.errors import ConfigError
from pinpoint.placement import Placement, load_placement
from pinpoint.runfolder import METRICS, PLACEMENT, atomic_write_json, ensure_dir, read_json

COMPARISON_JSON = "comparison.json"
COMPARISON_PNG = "comparison.png"


def _speed(metrics: dict) -> float | None:
    """metrics.json's steady-state examples/sec (the training engine writes it)."""
    value = metrics.get("examples_per_sec")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _obeyed(placement: Placement, min_score: float) -> tuple[bool, float | None, int]:
    """(obeyed, conformance score, violations). No rules at all (nothing planned) counts as obeyed."""
    violations = sum(int(r.violations_total or 0) for r in placement.conformance.rules)
    score = placement.conformance.score
    obeyed = violations == 0 or (score is not None and float(score) >= min_score)
    return obeyed, (float(score) if score is not None else None), violations


def compare_runs(run_dirs: list[Path], *, min_score: float = 1.0) -> dict[str, Any]:
    """One row per run, and `best`: the fastest run folder whose placement obeyed its plan."""
    if not run_dirs:
        raise ConfigError("run_dirs: got an empty list; the sweep produced no runs to compare")
    rows = []
    for d in run_dirs:
        d = Path(d)
        placement = load_placement(d / PLACEMENT, detail=False, field="run_dirs")
        metrics = read_json(d / METRICS, field="run_dirs")
        obeyed, score, violations = _obeyed(placement, min_score)
        rows.append(
            {
                "name": d.name,
                "run_dir": str(d),
                "strategy": placement.strategy,
                "examples_per_sec": _speed(metrics),
                "final_loss": metrics.get("final_loss"),
                "conformance": score,
                "violations": violations,
                "obeyed": obeyed,
            }
        )
    eligible = [r for r in rows if r["obeyed"] and r["examples_per_sec"] is not None]
    best = max(eligible, key=lambda r: r["examples_per_sec"]) if eligible else None
    return {"runs": rows, "best": best["run_dir"] if best else None, "best_name": best["name"] if best else None}


def plot_comparison(result: dict, path: Path) -> Path:
    """Bar chart of throughput per run: green obeyed its plan, red did not; the winner outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["runs"]
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows)), 3.6), dpi=100)
    speeds = [r["examples_per_sec"] or 0.0 for r in rows]
    colors = ["#2e7d32" if r["obeyed"] else "#c62828" for r in rows]
    bars = ax.bar([r["name"] for r in rows], speeds, color=colors)
    for bar, r in zip(bars, rows):
        if r["run_dir"] == result["best"]:
            bar.set_edgecolor("black")
            bar.set_linewidth(2.5)
        score = "n/a" if r["conformance"] is None else f"{r['conformance']:.2f}"
        ax.annotate(f"conf. {score}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("examples / s")
    ax.set_title("Placement sweep: throughput per variant")
    ax.legend(
        handles=[Patch(color="#2e7d32", label="obeyed its plan"), Patch(color="#c62828", label="violated it"),
                 Patch(facecolor="white", edgecolor="black", linewidth=2.5, label="fastest that obeyed")],
        fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
    )
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


def compare_command(run_dirs: list[Path], out_dir: Path, *, parent_run_id: str | None = None) -> dict:
    """Write out_dir/comparison.json and comparison.png; log them to MLflow under the parent run."""
    out = ensure_dir(out_dir, field="out_dir")
    result = compare_runs([Path(d) for d in run_dirs])
    atomic_write_json(out / COMPARISON_JSON, result)
    plot_comparison(result, out / COMPARISON_PNG)
    _track(result, out, parent_run_id)
    if result["best"] is None:
        print("pinpoint: no run obeyed its plan; see comparison.json for the violations")
    else:
        print(f"fastest run that obeyed its plan: {result['best_name']} ({result['best']})")
    return result


def _track(result: dict, out: Path, parent_run_id: str | None) -> None:
    from pinpoint.config import load_config
    from pinpoint.runfolder import CONFIG_FILE

    first = Path(result["runs"][0]["run_dir"]) / CONFIG_FILE
    if not first.is_file():
        return
    cfg = load_config(first).model_copy(update={"name": out.name})
    from pinpoint.tracking import open_step_run

    with open_step_run(cfg, "compare", out, parent_run_id=parent_run_id) as run:
        for r in result["runs"]:
            if r["examples_per_sec"] is not None:
                run.log_metrics({f"{r['name']}.examples_per_sec": r["examples_per_sec"]})
        run.set_tags({"pinpoint.best_run": result["best_name"] or ""})
        run.log_artifact(out / COMPARISON_JSON)
        run.log_artifact(out / COMPARISON_PNG)
