"""kfp component: compare the sweep's variants and pick the fastest run that obeyed its plan."""

from typing import List

from kfp.dsl import Artifact, Output


def compare_runs(
    run_dirs: List[str],
    out_dir: str,
    parent_run_id: str,
    comparison: Output[Artifact],
    chart: Output[Artifact],
) -> str:
    """Write out_dir/comparison.json and comparison.png; return the winning run folder."""
    import shutil
    from pathlib import Path

    from pinpoint.compare import COMPARISON_JSON, COMPARISON_PNG, compare_command

    result = run_step(compare_command, [Path(d) for d in run_dirs], Path(out_dir), parent_run_id=parent_run_id or None)
    shutil.copyfile(Path(out_dir) / COMPARISON_JSON, comparison.path)
    shutil.copyfile(Path(out_dir) / COMPARISON_PNG, chart.path)
    comparison.metadata["best"] = result.get("best") or ""
    return result.get("best") or ""
