"""Reports: terminal tables now; plots and HTML reports build on the same results."""

from fabricpilot.report.tables import (
    comparison_table,
    controller_line,
    fabric_table,
    fault_table,
    format_interference,
    pfc_event_lines,
)

__all__ = [
    "comparison_table",
    "controller_line",
    "fabric_table",
    "fault_table",
    "format_interference",
    "pfc_event_lines",
]
