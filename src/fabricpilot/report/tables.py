"""Terminal tables (rich) for comparing policies and for nccl-tests-style sweeps."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from fabricpilot.results import RunResult


def comparison_table(results: Sequence[RunResult], reference: RunResult | None) -> Table:
    """One row per (job, policy): mean iteration time, mean busbw and fraction of ``ideal``.

    ``reference`` is the ``ideal`` run; without it the fraction column shows "-".
    """
    table = Table(title=f"scenario {results[0].scenario!r}, seed {results[0].seed}",
                  title_justify="left")
    for col, just in (("job", "left"), ("GPUs", "right"), ("policy", "left"),
                      ("iteration ms", "right"), ("busbw GB/s", "right"),
                      ("of ideal", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for job in results[0].jobs:
        for k, r in enumerate(results):
            busbw = r.mean_busbw_GBps(job.name)
            frac = "-"
            if reference is not None:
                ref = reference.mean_busbw_GBps(job.name)
                frac = f"{busbw / ref:.1%}" if ref > 0 else "-"
            table.add_row(job.name if k == 0 else "", str(job.n_gpus) if k == 0 else "",
                          r.policy, f"{r.mean_iteration_ns(job.name) / 1e6:.3f}",
                          f"{busbw:.1f}", frac, end_section=k == len(results) - 1)
    return table


def fabric_table(results: Sequence[RunResult]) -> Table:
    """Per policy: simulated time, mice FCT slowdown, fabric utilisation and wall time."""
    table = Table(title="fabric", title_justify="left")
    for col in ("policy", "sim ms", "mice p50 slowdown", "mice p99 slowdown",
                "peak fabric util", "delivered", "wall s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        s = r.summary()
        mice = s["fct_slowdown"]["mice"]
        table.add_row(
            r.policy, f"{r.sim_time_ns / 1e6:.3f}",
            f"{mice['p50']:.2f}" if mice["count"] else "-",
            f"{mice['p99']:.2f}" if mice["count"] else "-",
            f"{s['links']['fabric_peak_utilization']:.0%}",
            f"{r.bytes_delivered / 1e9:.2f} GB", f"{r.wall_time_s:.2f}",
        )
    return table
