"""report: how runs are shown, as text, tables, plots and the HTML card. It imports `measure` and `spec` only and
never runs anything: the bench's records come in as arguments (bench imports report, not the other way)."""
