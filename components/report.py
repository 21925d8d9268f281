"""kfp component: report.html and charts from a trained run folder (pinpoint.placement.report.html)."""

from kfp.dsl import HTML, Artifact, Input, Output


def report(
    run_dir: str,
    parent_run_id: str,
    placement: Input[Artifact],
    report_html: Output[HTML],
):
    """Write run_dir/report.html (and charts); expose the HTML as the step's output."""
    import shutil
    from pathlib import Path

    from pinpoint.runfolder import REPORT_HTML
    from pinpoint.steps.report import report_command

    out = Path(run_dir)
    run_step(report_command, out, parent_run_id=parent_run_id or None)
    shutil.copyfile(out / REPORT_HTML, report_html.path)
