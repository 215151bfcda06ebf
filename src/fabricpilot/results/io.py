"""Write results: CSV tables (flows, collectives, iterations, links) and the JSON summary."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from fabricpilot.results.run import RunResult

FLOW_COLUMNS = [
    "owner", "iteration", "collective", "stage", "src", "dst", "members", "size_bytes",
    "wire_bytes", "start_ns", "end_send_ns", "deliver_ns", "fct_ns", "alone_fct_ns", "slowdown",
]


def write_tables(result: RunResult, out_dir: str | Path) -> list[Path]:
    """Write ``flows.csv``, ``collectives.csv``, ``iterations.csv`` and ``links.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    owner_names = {i: j.name for i, j in enumerate(result.jobs)} | {-1: "mice"}

    path = out / "flows.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job" if c == "owner" else c for c in FLOW_COLUMNS])
        if result.flows:
            cols = [result.flows[c] for c in FLOW_COLUMNS]
            for row in zip(*cols, strict=True):
                vals: list[Any] = [owner_names[int(row[0])]]
                vals += [int(v) for v in row[1:-1]]
                vals.append(f"{float(row[-1]):.6g}")
                w.writerow(vals)
    written.append(path)

    path = out / "collectives.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "iteration", "index", "op", "algorithm", "n_ranks", "size_bytes",
                    "start_ns", "end_ns", "time_ns", "algbw_GBps", "busbw_GBps"])
        for c in result.collectives:
            w.writerow([c.job, c.iteration, c.index, c.op, c.algorithm, c.n_ranks, c.size_bytes,
                        c.start_ns, c.end_ns, c.time_ns, f"{c.algbw_GBps:.6g}",
                        f"{c.busbw_GBps:.6g}"])
    written.append(path)

    path = out / "iterations.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "iteration", "start_ns", "end_ns", "iteration_ns"])
        for i in sorted(result.iterations, key=lambda i: (i.job, i.iteration)):
            w.writerow([i.job, i.iteration, i.start_ns, i.end_ns, i.end_ns - i.start_ns])
    written.append(path)

    path = out / "links.csv"
    util = result.link_utilization()
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["link", "kind", "rate_gbps", "bytes", "mean_utilization", "peak_utilization"])
        for i in np.flatnonzero(result.link_bytes > 0):
            w.writerow([result.link_names[i], result.link_kind[i],
                        f"{result.link_capacity_gbps[i]:g}", round(result.link_bytes[i]),
                        f"{util[i]:.6g}", f"{result.link_peak_util[i]:.6g}"])
    written.append(path)
    return written


def summary_json(results: list[RunResult], *, include_wall_time: bool = True) -> str:
    """JSON text: one run's summary object, or ``{"runs": [...]}`` for several policies."""
    if len(results) == 1:
        data: Any = results[0].summary(include_wall_time=include_wall_time)
    else:
        data = {"scenario": results[0].scenario, "seed": results[0].seed,
                "runs": [r.summary(include_wall_time=include_wall_time) for r in results]}
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
