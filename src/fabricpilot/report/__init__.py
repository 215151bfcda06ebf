"""Reports: terminal tables (:mod:`~fabricpilot.report.tables`), and plots with an HTML page
(:mod:`~fabricpilot.report.plots`, written by ``run --out``), from the same results."""

from fabricpilot.report.tables import (
    ABOVE_REFERENCE,
    above_reference,
    comparison_table,
    controller_line,
    fabric_table,
    fault_table,
    format_interference,
    pfc_event_lines,
    run_notes,
)

__all__ = [
    "ABOVE_REFERENCE",
    "above_reference",
    "comparison_table",
    "controller_line",
    "fabric_table",
    "fault_table",
    "format_interference",
    "pfc_event_lines",
    "run_notes",
]
