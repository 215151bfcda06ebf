"""Reports: terminal tables now; plots and HTML reports build on the same results."""

from fabricpilot.report.tables import (
    ABOVE_REFERENCE,
    above_reference,
    comparison_table,
    controller_line,
    fabric_table,
    fault_table,
    format_interference,
    pfc_event_lines,
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
]
