"""What a person reads: report.html (`html`), the summary printed at the end, the charts, the
run diagram, the findings and the MLflow metrics."""
