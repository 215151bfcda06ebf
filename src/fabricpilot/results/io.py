"""Write results: CSV tables (flows, collectives, iterations, links; with interference ratios
also interference; with the fluid model also timeseries and ports) and the JSON summary."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fabricpilot.dataplane.qos import N_PRIORITIES
from fabricpilot.results.run import RunResult
from fabricpilot.textfiles import written_whole

FLOW_COLUMNS = [
    "owner", "iteration", "collective", "stage", "src", "dst", "members", "size_bytes",
    "wire_bytes", "start_ns", "end_send_ns", "deliver_ns", "fct_ns", "alone_fct_ns", "slowdown",
    "retx_bytes", "reorder_events",
]
TIMESERIES_COLUMNS = ["time_ns", "link", "queue_bytes", "utilization", "ecn_marks", "paused"]
INTERFERENCE_COLUMNS = ["job", "busbw_GBps", "alone_busbw_GBps", "interference"]
PORT_COLUMNS = ["link", "priority", "pause_ns", "pause_frames", "ecn_marks", "drops_bytes"]


TABLE_FILES = ("flows.csv", "collectives.csv", "iterations.csv", "links.csv",
               "interference.csv", "timeseries.csv", "ports.csv")
"""Every file :func:`write_tables` may write (the last three not always)."""


def write_tables(result: RunResult, out_dir: str | Path) -> list[Path]:
    """Write ``flows.csv``, ``collectives.csv``, ``iterations.csv`` and ``links.csv``; with
    interference ratios also ``interference.csv``; with a fluid-model report also
    ``timeseries.csv`` (if it sampled anything) and ``ports.csv``; any of those an earlier
    run left there and this one does not write is removed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    owner_names = {i: j.name for i, j in enumerate(result.jobs)} | {-1: "mice"}

    path = out / "flows.csv"
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job" if c == "owner" else c for c in FLOW_COLUMNS])
        if result.flows:
            n = len(result.flows["owner"])
            retx = result.flows.get("retx_bytes", np.zeros(n))
            reorder = result.flows.get("reorder_events", np.zeros(n, np.int64))
            cols = [result.flows[c] for c in FLOW_COLUMNS[:-2]] + [retx, reorder]
            for row in zip(*cols, strict=True):
                vals: list[Any] = [owner_names[int(row[0])]]
                vals += [int(v) for v in row[1:-3]]
                vals.append(f"{float(row[-3]):.6g}")
                vals.append(round(float(row[-2])))
                vals.append(int(row[-1]))
                w.writerow(vals)
    written.append(path)

    path = out / "collectives.csv"
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "iteration", "index", "op", "algorithm", "n_ranks", "size_bytes",
                    "start_ns", "end_ns", "time_ns", "algbw_GBps", "busbw_GBps"])
        for c in result.collectives:
            w.writerow([c.job, c.iteration, c.index, c.op, c.algorithm, c.n_ranks, c.size_bytes,
                        c.start_ns, c.end_ns, c.time_ns, f"{c.algbw_GBps:.6g}",
                        f"{c.busbw_GBps:.6g}"])
    written.append(path)

    path = out / "iterations.csv"
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "iteration", "start_ns", "end_ns", "iteration_ns"])
        for i in sorted(result.iterations, key=lambda i: (i.job, i.iteration)):
            w.writerow([i.job, i.iteration, i.start_ns, i.end_ns, i.end_ns - i.start_ns])
    written.append(path)

    path = out / "links.csv"
    util = result.link_utilization()
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["link", "kind", "rate_gbps", "bytes", "mean_utilization", "peak_utilization"])
        for i in range(len(result.link_bytes)):  # (idle links too: where a policy left
            # capacity unused is part of its picture)
            w.writerow([result.link_names[i], result.link_kind[i],
                        f"{result.link_capacity_gbps[i]:g}", round(result.link_bytes[i]),
                        f"{util[i]:.6g}", f"{result.link_peak_util[i]:.6g}"])
    written.append(path)

    if result.interference:
        path = out / "interference.csv"
        _write_interference(result, path)
        written.append(path)

    report = result.model_report
    if report is not None and len(report.timeseries):
        path = out / "timeseries.csv"
        _write_timeseries(result, path)
        written.append(path)
    if report is not None and report.port_pause_ns is not None:
        path = out / "ports.csv"
        _write_ports(result, path)
        written.append(path)
    remove_stale(out, TABLE_FILES, written)
    return written


def remove_stale(folder: Path, names: Sequence[str], written: Sequence[Path]) -> None:
    """Remove the files named ``names`` in ``folder`` that this run did not write (an
    earlier run's ``interference.csv`` or fluid tables would read as this one's); no other
    file is touched."""
    keep = {p.name for p in written}
    for name in names:
        if name not in keep:
            (folder / name).unlink(missing_ok=True)


def _write_interference(result: RunResult, path: Path) -> None:
    """One row per job with a measured interference ratio: its busbw in this run (shared),
    alone (ratio x shared) and the ratio; a job with no busbw in either run has no ratio
    (an empty cell), and its busbw alone is 0."""
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(INTERFERENCE_COLUMNS)
        for job in result.jobs:
            ratio = result.interference.get(job.name)
            if ratio is None:
                continue
            shared = result.mean_busbw_GBps(job.name)
            if math.isnan(ratio):  # (no busbw alone nor shared: nothing to compare)
                w.writerow([job.name, f"{shared:.6g}", "0", ""])
                continue
            # (a job with busbw alone but none shared: its ratio is inf, its busbw alone is
            # not kept by the ratio)
            alone = f"{ratio * shared:.6g}" if shared > 0 else ""
            w.writerow([job.name, f"{shared:.6g}", alone, f"{ratio:.6g}"])


def _write_timeseries(result: RunResult, path: Path) -> None:
    """One row per (sample time, active link) of the fluid model's samples."""
    assert result.model_report is not None
    cols = result.model_report.timeseries.columns()
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TIMESERIES_COLUMNS)
        for t, link, queue, util, marks, paused in zip(
            *(cols[c] for c in TIMESERIES_COLUMNS), strict=True
        ):
            w.writerow([int(t), result.link_names[int(link)], round(float(queue)),
                        f"{float(util):.6g}", f"{float(marks):.6g}", int(bool(paused))])


def _write_ports(result: RunResult, path: Path) -> None:
    """One row per (link, priority) with any pause, ECN mark or drop."""
    rep = result.model_report
    assert rep is not None
    n = len(result.link_names)

    def arr(a: Any) -> np.ndarray:
        return np.zeros((n, N_PRIORITIES)) if a is None else np.asarray(a)

    pause_ns, frames = arr(rep.port_pause_ns), arr(rep.port_pause_frames)
    marks, drops = arr(rep.port_ecn_marks), arr(rep.port_drops_bytes)
    any_value = (pause_ns > 0) | (frames > 0) | (marks > 0) | (drops > 0)
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(PORT_COLUMNS)
        for link, prio in zip(*np.nonzero(any_value), strict=True):
            w.writerow([result.link_names[link], int(prio), round(float(pause_ns[link, prio])),
                        int(frames[link, prio]), f"{float(marks[link, prio]):.6g}",
                        round(float(drops[link, prio]))])


def summary_json(results: list[RunResult], *, include_wall_time: bool = True,
                 reference: RunResult | None = None) -> str:
    """JSON text: one run's summary object, or ``{"runs": [...]}`` for several policies.
    With a ``reference`` run (``ideal``, as the CLI compares against), every job also gets
    ``ideal_busbw_GBps`` (the reference's) and ``of_ideal`` (its own ``mean_busbw_GBps``
    over that; ``null`` when the reference moved nothing or the job was stopped before it
    finished an iteration), the table's "of ideal"."""
    runs = [r.summary(include_wall_time=include_wall_time) for r in results]
    if reference is not None:
        for r, run in zip(results, runs, strict=True):
            for job in run["jobs"]:
                ref = reference.mean_busbw_GBps(job["name"])
                job["ideal_busbw_GBps"] = float(f"{ref:.6g}")
                none = "stopped" in job and not job["iterations"]  # (the table's "-")
                job["of_ideal"] = (float(f"{r.mean_busbw_GBps(job['name']) / ref:.6g}")
                                   if ref > 0 and not none else None)
    if len(results) == 1:
        data: Any = runs[0]
    else:
        data = {"scenario": results[0].scenario, "seed": results[0].seed, "runs": runs}
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
