"""Results: per-flow, per-collective, per-job and per-link records of a run, the JSON summary
and the CSV tables."""

from fabricpilot.results.io import summary_json, write_tables
from fabricpilot.results.run import RunResult

__all__ = ["RunResult", "summary_json", "write_tables"]
