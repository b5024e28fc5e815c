"""report: how runs are shown. Number and verdict formats (fmt), tables (table), plots (plots), the HTML card (card),
the bench, sweep, tune and doctor text (text).

Imports `measure` and `spec` only; it formats what the engine and the bench measured and never runs anything
(the bench's records come in as arguments: bench imports report, not the other way).
"""
