"""report: how runs are shown. Number and verdict formats (fmt), tables (table), plots (plots), the HTML card (card).

Imports `measure` and `spec` only; it formats what the engine measured and never runs anything.
"""
