"""Terminal tables (rich) for comparing policies and for nccl-tests-style sweeps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table

from fabricpilot.results import RunResult
from fabricpilot.units import format_bytes


def comparison_table(results: Sequence[RunResult], reference: RunResult | None) -> Table:
    """One row per (job, policy): mean iteration time, mean busbw and fraction of ``ideal``.

    ``reference`` is the ``ideal`` run; without it the fraction column shows "-". A job
    stopped before it finished one iteration (cut off by faults) shows "stopped"; one
    stopped later, the figures of the iterations it finished, "then stopped". When any
    run carries interference ratios (``run --interference``) an "interference" column
    follows: busbw alone / busbw shared, see :func:`format_interference`.
    """
    table = Table(title=escape(f"scenario {results[0].scenario!r}, seed {results[0].seed}"),
                  title_justify="left")
    header, rows = comparison_rows(results, reference)
    for col in header:
        table.add_column(col, justify="left" if col in ("job", "policy") else "right")
    for cells, last in rows:  # (names are the scenario's text, not markup)
        table.add_row(*map(escape, cells), end_section=last)
    return table


def comparison_rows(results: Sequence[RunResult], reference: RunResult | None,
                    ) -> tuple[list[str], list[tuple[list[str], bool]]]:
    """The comparison's columns and rows (:func:`comparison_table`, the HTML report): per
    row its cells and whether it is a job's last."""
    with_ratio = any(r.interference for r in results)
    header = ["job", "GPUs", "policy", "iteration ms", "busbw GB/s", "of ideal"]
    header += ["interference"] if with_ratio else []
    rows = []
    for job in results[0].jobs:
        for k, r in enumerate(results):
            busbw = r.mean_busbw_GBps(job.name)
            frac = "-"
            if reference is not None:
                ref = reference.mean_busbw_GBps(job.name)
                frac = f"{busbw / ref:.1%}" if ref > 0 else "-"
            iteration_ns = r.mean_iteration_ns(job.name)
            stopped = job.name in r.aborted and not iteration_ns > 0  # (no iteration done)
            # (stopped later: the figures of the iterations it finished, and a mark)
            then = " then stopped" if job.name in r.aborted and not stopped else ""
            cells = [job.name if k == 0 else "", str(job.n_gpus) if k == 0 else "",
                     r.policy, "stopped" if stopped else f"{iteration_ns / 1e6:.3f}{then}",
                     "-" if stopped else f"{busbw:.1f}", "-" if stopped else frac]
            if with_ratio:
                cells.append(format_interference(r.interference.get(job.name)))
            rows.append((cells, k == len(results) - 1))
    return header, rows


def above_reference(results: Sequence[RunResult], reference: RunResult | None,
                    margin: float = 0.01) -> list[str]:
    """``"<job> under <policy> (<fraction>)"`` for every job whose busbw under a policy
    passes ``reference``'s (``ideal``) by more than ``margin``: the comparison table's
    fractions above 100 %, which :data:`ABOVE_REFERENCE` explains."""
    if reference is None:
        return []
    out = []
    for job in results[0].jobs:
        ref = reference.mean_busbw_GBps(job.name)
        for r in results:
            busbw = r.mean_busbw_GBps(job.name)
            if r is not reference and ref > 0 and busbw > ref * (1 + margin):
                out.append(f"{job.name} under {r.policy} ({busbw / ref:.1%})")
    return out


ABOVE_REFERENCE = (
    "ideal spreads every flow evenly over every path: the best for the fabric as a whole, "
    "not a bound for each job (a job can gain when collisions slow the others down) nor, "
    "under the fluid model, against congestion control (spraying sends every flow through "
    "every spine's queue, where more of it is marked)")


def format_interference(ratio: float | None) -> str:
    """An interference ratio as the tables show it; "-" when it was not measured or there
    was nothing to measure (``nan``: no busbw alone or shared).

    >>> format_interference(1.23456), format_interference(None), format_interference(math.nan)
    ('1.235x', '-', '-')
    """
    return "-" if ratio is None or math.isnan(ratio) else f"{ratio:.3f}x"


FLUID_COLUMNS = ("ECN marks", "pause ms", "storms", "deadlocks", "drops", "retx")


def fabric_table(results: Sequence[RunResult]) -> RenderableType:
    """Per policy: simulated time, mice FCT slowdown, fabric utilisation and wall time.

    When a run used the fluid model, the fluid columns follow: ECN marks, PFC pause time
    (summed over paused ports and priorities, ms), pause storms, deadlocks, dropped and
    retransmitted bytes. They go in a second table of the same rows ("-" for flow-model
    runs) so that both stay readable in 110 columns.
    """
    table = Table(title="fabric", title_justify="left")
    for col in (*FABRIC_COLUMNS, "wall s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    fluid = Table(title="fabric, fluid model", title_justify="left")
    for col in ("policy", *FLUID_COLUMNS):
        fluid.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        s = r.summary()
        table.add_row(*fabric_cells(r, s), f"{r.wall_time_s:.2f}")
        fluid.add_row(r.policy, *fluid_cells(r, s))
    if any(r.model == "fluid" for r in results):
        return Group(table, fluid)
    return table


def fluid_cells(r: RunResult, summary: dict[str, Any] | None = None) -> list[str]:
    """A run's cells under :data:`FLUID_COLUMNS` ("-" for a flow-model run)."""
    if r.model != "fluid":
        return ["-"] * len(FLUID_COLUMNS)
    s = r.summary(include_wall_time=False) if summary is None else summary
    return [f"{s['ecn_marks']:,}", f"{s['pfc_pause_ns_total'] / 1e6:.3f}",
            str(s["pfc_storms"]), str(s["deadlocks"]), format_bytes(s["drops_bytes"]),
            format_bytes(s["retransmitted_bytes"])]


def run_notes(results: Sequence[RunResult]) -> list[str]:
    """The lines under the tables, per run: jobs stopped (and why), mice cut off, jobs
    whose SLA no path meets (the pause storms and deadlocks: :func:`pfc_event_lines`)."""
    out = []
    for r in results:
        out += [f"{r.policy}: job {job} stopped: {why}" for job, why in r.aborted.items()]
        if r.mice_cut_off:
            out.append(f"{r.policy}: {r.mice_cut_off} mice cut off (no path left between "
                       f"their GPUs), never delivered")
    for r in results:
        if r.sla_unmet:  # (per job, or per GPU pair of a job: counted by job)
            jobs = {line.split(":", 1)[0] for line in r.sla_unmet}
            n = len(jobs)
            out.append(f"{r.policy}: {n} job{'s' * (n != 1)} with an SLA no path meets, "
                       f"e.g. {r.sla_unmet[0]}")
    return out


FABRIC_COLUMNS = ("policy", "sim ms", "mice p50 slowdown", "mice p99 slowdown",
                  "peak fabric util", "delivered")


def fabric_cells(r: RunResult, summary: dict[str, Any] | None = None) -> list[str]:
    """A run's cells under :data:`FABRIC_COLUMNS` (``summary``: its :meth:`RunResult.summary`,
    if already made)."""
    s = r.summary(include_wall_time=False) if summary is None else summary
    mice = s["fct_slowdown"]["mice"]
    return [r.policy, f"{r.sim_time_ns / 1e6:.3f}",
            f"{mice['p50']:.2f}" if mice["count"] else "-",
            f"{mice['p99']:.2f}" if mice["count"] else "-",
            "-" if (peak := s["links"]["fabric_peak_utilization"]) is None else f"{peak:.0%}",
            # (binary, as the bytes lost, dropped and resent beside it)
            f"{r.bytes_delivered / 2**30:.2f} GiB"]


def pfc_event_lines(results: Sequence[RunResult], limit: int = 10) -> list[str]:
    """Short lines on the pause storms and deadlocks of each run (at most ``limit`` per run,
    then ``... and N more``), e.g. ``ecmp: pause storm at 1.234 ms: leaf0->spine1 prio 3
    (4 hops)``."""
    out = []
    for r in results:
        events = r.model_report.events if r.model_report is not None else []
        for e in events[:limit]:
            where = ", ".join(e.ports)
            if e.kind == "storm":
                what = f"pause storm at {e.time_ns / 1e6:.3f} ms: {where} ({e.hops} hops)"
            else:
                cleared = ", cleared by the PFC watchdog" if e.cleared_by_watchdog else ""
                what = f"PFC deadlock at {e.time_ns / 1e6:.3f} ms: {where}{cleared}"
            out.append(f"{r.policy}: {what}")
        if len(events) > limit:
            out.append(f"{r.policy}: ... and {len(events) - limit} more")
    return out


def controller_line(r: RunResult, wall_clock: bool = True) -> str:  # (or its fields)
    """One line on what a controller-driven policy did (``RunResult.controller``). Heal
    times are the controller's own wall-clock time (how long it took to compute and send
    the new paths on this machine), not simulated time; ``wall_clock=False`` leaves them
    out (a reproducible report).

    >>> from types import SimpleNamespace
    >>> c = {"qps_steered": 90, "qps_pinned": 6, "qps_unpinned": 0, "switch_rules_max": 4,
    ...      "switch_rule_capacity": 4096, "control_periods": 12, "replans": 1,
    ...      "fuse_trips": 0}
    >>> print(controller_line(SimpleNamespace(policy="task-aware", controller=c)))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips

    With heals (failed or gray links), how many and the slowest, and gray links found (per
    direction: a cable gray both ways is two):

    >>> c |= {"heals": 2, "heal_max_ms": 3.25, "heal_sent_max_ms": 2.5,
    ...       "gray_links_confirmed": 2, "gray_false_alarms": 0, "gray_links_restored": 2}
    >>> print(controller_line(SimpleNamespace(policy="task-aware", controller=c)))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips; 2 heals (the slowest 3.25 ms of wall time, its new paths sent after 2.50 ms);
    gray link directions: 2 confirmed, 0 false alarms, 2 restored
    >>> print(controller_line(SimpleNamespace(policy="task-aware", controller=c), False))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips; 2 heals; gray link directions: 2 confirmed, 0 false alarms, 2 restored

    GPU pairs held to a rate at their senders (an L3 job while an L1 / L2 job is planned):

    >>> c = {k: v for k, v in c.items() if not k.startswith(("heal", "gray"))}
    >>> print(controller_line(SimpleNamespace(policy="task-aware",
    ...                                       controller=c | {"pairs_rate_capped": 12})))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips; 12 GPU pairs rate-capped at their senders

    Room kept in the plan for the flows of a job no path within its SLA serves:

    >>> print(controller_line(SimpleNamespace(policy="task-aware",
    ...                                       controller=c | {"pairs_room_kept": 2})))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips; room kept for 2 GPU pairs of jobs whose SLA is unmet (no path: the switches
    route them)

    With jobs of several priorities, the plan's lambda per priority tier:

    >>> c |= {"lambda_by_priority": {7: 0.5, 0: 2.25}}
    >>> print(controller_line(SimpleNamespace(policy="task-aware", controller=c)))
    ... # doctest: +NORMALIZE_WHITESPACE
    task-aware controller: 90 QPs steered by source port, 6 pinned by rules (at most 4 rules
    on a switch, capacity 4096), 0 left to the hash; 12 control periods, 1 re-plan, 0 fuse
    trips; planned lambda by priority 7: 0.50, 0: 2.25
    """
    c = r.controller
    plural = "" if c["replans"] == 1 else "s"
    line = (f"{r.policy} controller: {c['qps_steered']} QPs steered by source port, "
            f"{c['qps_pinned']} pinned by rules (at most {c['switch_rules_max']} rules on a "
            f"switch, capacity {c['switch_rule_capacity']}), {c['qps_unpinned']} left to the "
            f"hash; {c['control_periods']} control periods, {c['replans']} re-plan{plural}, "
            f"{c['fuse_trips']} fuse trips")
    if c.get("pairs_rate_capped"):
        line += f"; {c['pairs_rate_capped']} GPU pairs rate-capped at their senders"
    if c.get("pairs_room_kept"):
        n = c["pairs_room_kept"]
        line += (f"; room kept for {n} GPU pair{'' if n == 1 else 's'} of jobs whose SLA is "
                 f"unmet (no path: the switches route them)")
    if c.get("lambda_by_priority"):
        line += "; planned lambda by priority " + ", ".join(
            f"{p}: {lam:.2f}" for p, lam in c["lambda_by_priority"].items())
    if c.get("heals"):
        line += f"; {c['heals']} heal{'' if c['heals'] == 1 else 's'}"
        if wall_clock:
            line += (f" (the slowest {c['heal_max_ms']:.2f} ms of wall time, its new paths "
                     f"sent after {c.get('heal_sent_max_ms', 0.0):.2f} ms)")
    if c.get("gray_links_confirmed") or c.get("gray_false_alarms"):
        # (counted per link direction: each has its own FEC counters, and a gray cable
        # may corrupt one way only)
        line += (f"; gray link directions: {c['gray_links_confirmed']} confirmed, "
                 f"{c['gray_false_alarms']} false alarms, "
                 f"{c.get('gray_links_restored', 0)} restored")
    return line


def _ms(us: object) -> str:
    """A time given in us, in ms to the us (``-`` for none): ``_ms(200100.0)`` is
    ``'200.100'``."""
    return "-" if us is None else f"{float(us) / 1e3:,.3f}"  # type: ignore[arg-type]


def _jobs_hit(fault: dict[str, Any]) -> str:
    """The jobs whose traffic a fault reached, each it cut off marked so (``-`` for none).

    >>> _jobs_hit({"jobs_hit": ["b", "a"], "partitioned": ["b"]})
    'a, b (cut off)'
    >>> _jobs_hit({"jobs_hit": [], "partitioned": []})
    '-'
    """
    cut = set(fault["partitioned"])
    names = sorted(set(fault["jobs_hit"]) | cut)
    return ", ".join(f"{n} (cut off)" if n in cut else n for n in names) or "-"


FAULT_COLUMNS = ("policy", "fault", "detected", "rerouted", "recovery", "lost", "resent",
                 "worst stall", "GPU-s lost", "jobs hit")


def fault_rows(results: Sequence[RunResult]) -> tuple[list[list[str]], dict[object, str]]:
    """Per policy and fault, the cells under :data:`FAULT_COLUMNS`; and each fault's label
    by id (said to have had no effect if it came after every run ended)."""
    rows: list[list[str]] = []
    labels: dict[object, str] = {}
    end_ns = max((x.sim_time_ns for x in results), default=0)
    for r in results:
        for f in r.faults:
            labels[f["fault_id"]] = str(f["label"])
            if float(f["at_ms"]) * 1e6 >= end_ns:  # type: ignore[arg-type]
                labels[f["fault_id"]] = f"{f['label']} (after every run ended: no effect)"
            stall = f["job_stall_us"]
            worst = max(stall.values(), default=0.0)  # type: ignore[union-attr]
            rows.append([r.policy, f"#{f['fault_id']}", _ms(f["detection_us"]),
                         _ms(f["reroute_us"]), _ms(f["recovery_us"]),
                         format_bytes(float(f["bytes_lost"])),  # type: ignore[arg-type]
                         format_bytes(float(f["bytes_retx"])),  # type: ignore[arg-type]
                         _ms(worst), f"{float(f['gpu_seconds_lost']):.4f}",  # type: ignore[arg-type]
                         _jobs_hit(f)])
    return rows, labels


def fault_table(results: Sequence[RunResult], width: int | None = None
                ) -> RenderableType | None:
    """Per policy and fault: when it was detected, rerouted and recovered (ms after the
    fault, to the us), bytes lost into dead links and resent, the longest job stall, the
    GPU time lost and the jobs whose traffic it reached (those it cut off marked so); the
    faults are listed under the table. ``None`` when no run had faults. A console
    ``width`` too narrow for every figure whole gets one line per policy and fault
    instead (``figure value, ...``): a figure is never cut short."""
    if not any(r.faults for r in results):
        return None
    rows, labels = fault_rows(results)
    caption = "; ".join(f"#{k}: {v}" for k, v in labels.items())
    # (no padding at the table's edges: the room goes to the jobs' names, which fold onto
    # the next line where they do not fit; the figures never wrap)
    t = Table(title="faults (times in ms after the fault)", title_justify="left",
              pad_edge=False)
    for col in FAULT_COLUMNS:
        t.add_column(_FAULT_HEADERS.get(col, col),
                     justify="left" if col in ("policy", "fault", "jobs hit") else "right",
                     no_wrap=col != "jobs hit", overflow="fold")
    for cells in rows:
        t.add_row(*map(escape, cells))
    t.caption = escape(caption)
    t.caption_justify = "left"
    if width is None or _min_width(t) <= width:
        return t
    lines = [f"{escape(r[0])} {escape(r[1])}: "
             + ", ".join(f"{col} {escape(v)}" for col, v in zip(FAULT_COLUMNS[2:-1], r[2:-1],
                                                                strict=True))
             + f"; jobs hit: {escape(r[-1])}" for r in rows]
    return Group("[b]faults[/b] (times in ms after the fault)", *lines, escape(caption))


_FAULT_HEADERS = {"worst stall": "worst\nstall", "GPU-s lost": "GPU-s\nlost"}
_JOBS_MIN_WIDTH = 8  # (the jobs' names fold, but not to a few letters a line)


def _min_width(table: Table) -> int:
    """The narrowest ``table`` (of columns that do not wrap but its last, which folds) can
    be drawn without cutting a cell short."""
    widths = []
    for col in table.columns:
        cells = [str(c) for c in col.cells] + str(col.header).split("\n")
        widths.append(_JOBS_MIN_WIDTH if not col.no_wrap else max(map(len, cells)))
    # each column padded by 1 on both sides but the outer two, and a border between all
    return sum(widths) + 2 * len(widths) - 2 + len(widths) + 1
