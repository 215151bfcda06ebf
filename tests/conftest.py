"""Shared helpers for the test suite."""

from __future__ import annotations

import numpy as np

from fabricpilot.results import RunResult
from fabricpilot.runner import Prepared, run_policy
from fabricpilot.topology import CompiledTopology
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec


def run_one(
    ct: CompiledTopology,
    op: str,
    ranks: np.ndarray | list[int],
    size_bytes: int,
    policy: str = "ideal",
    **kw: object,
) -> RunResult:
    """Run a single collective over ``ranks`` and return the result."""
    plan = build_collective(op, np.asarray(ranks), size_bytes,
                            gpus_per_host=ct.topo.gpus_per_host, **kw)  # type: ignore[arg-type]
    job = JobSpec("job", tuple(int(r) for r in ranks), (plan,))
    return run_policy(Prepared("test", 1, ct, [job]), policy)
