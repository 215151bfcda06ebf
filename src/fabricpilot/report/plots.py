"""Plots that compare the policies of one run (matplotlib, PNG) and the HTML page that shows
them with the comparison's figures: what ``fabricpilot run --out DIR`` writes next to each
policy's CSV tables (``DIR/report.html``, ``DIR/plots/*.png``).

The data behind each plot comes from a small pure function (``busbw_by_job``,
``ecdf``, ``fabric_utilization``, ``iteration_times``, ``queued_bytes``), so what a
plot shows can be checked without reading pixels.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fabricpilot.report.tables import (
    ABOVE_REFERENCE,
    FABRIC_COLUMNS,
    FAULT_COLUMNS,
    FLUID_COLUMNS,
    above_reference,
    comparison_rows,
    controller_line,
    fabric_cells,
    fault_rows,
    fluid_cells,
    pfc_event_lines,
    run_notes,
)
from fabricpilot.results import RunResult
from fabricpilot.results.io import remove_stale
from fabricpilot.textfiles import written_whole
from fabricpilot.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# one colour per policy, the same in every plot and every report, whatever policies a run
# compares and in whichever order (matplotlib's tab10)
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
_POLICY_ORDER = ("ecmp", "adaptive", "task-aware", "ideal", "sla-aware", "spray", "spray-ooo",
                 "flowlet", "adaptive-split")


# ------------------------------------------------------------------------- the data
def busbw_by_job(results: Sequence[RunResult]) -> dict[str, dict[str, float]]:
    """Per job, per policy: the job's busbw (GB/s, :meth:`RunResult.mean_busbw_GBps`).

    >>> busbw_by_job([])
    {}
    """
    if not results:
        return {}
    return {job.name: {r.policy: r.mean_busbw_GBps(job.name) for r in results}
            for job in results[0].jobs}


def ecdf(values: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The empirical CDF of ``values`` (FCT slowdowns, link utilisations): the sorted values
    and, for each, the fraction at or below it.

    >>> x, y = ecdf(np.array([3.0, 1.0, 2.0, 1.0]))
    >>> x.tolist(), y.tolist()
    ([1.0, 1.0, 2.0, 3.0], [0.25, 0.5, 0.75, 1.0])
    """
    x = np.sort(np.asarray(values, np.float64))
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def fabric_utilization(result: RunResult) -> NDArray[np.float64]:
    """The mean utilisation over the run of every fabric (switch-to-switch) link, sorted;
    of every link if the topology names none so."""
    util = result.link_utilization()
    kinds = np.asarray(result.link_kind)
    fabric = kinds == "fabric"
    return np.sort(util[fabric] if fabric.any() else util)


def iteration_times(result: RunResult) -> dict[str, list[float]]:
    """Per job, its iterations' times in ms, in iteration order."""
    return {job.name: [(i.end_ns - i.start_ns) / 1e6 for i in result.job_iterations(job.name)]
            for job in result.jobs}


def queued_bytes(result: RunResult) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The fluid model's sampled queues in switch buffers: sample times (ms) and the bytes
    queued at each over all switch ports (the NICs' own send queues left out: there the
    model holds what the QPs are about to send); empty arrays for a flow-level run or no
    samples."""
    rep = result.model_report
    if rep is None or not len(rep.timeseries):
        return np.zeros(0), np.zeros(0)
    cols = rep.timeseries.columns()
    link = np.asarray(cols["link"], np.int64)
    at_nic = np.array([_NIC_SEND.match(n) is not None for n in result.link_names], np.bool_)
    keep = ~at_nic[link] if len(at_nic) else np.ones(len(link), np.bool_)
    t = np.asarray(cols["time_ns"], np.float64)
    times, inv = np.unique(t, return_inverse=True)
    total = np.bincount(inv.ravel(), weights=np.where(
        keep, np.asarray(cols["queue_bytes"], np.float64), 0.0), minlength=len(times))
    return times / 1e6, total


_NIC_SEND = re.compile(r"^gpu\d+->")  # a link out of a GPU (its NIC or NVLink port)


# ------------------------------------------------------------------------- the plots
def _figure(width: float = 7.0, height: float = 3.6) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _save(fig: Figure, path: Path) -> Path:
    # (no metadata that changes between runs: equal results give equal files)
    with written_whole(path, "wb") as fh:
        fig.savefig(fh, format="png", metadata={"Software": None})
    return path


def _finish(fig: Figure, ax: Any, xlabel: str, ylabel: str, title: str, path: Path,
            legend_size: int = 8, **legend: Any) -> Path:
    """Label the axes, title, legend and grid of a plot and write it to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=legend_size, **legend)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def policy_color(policy: str) -> str:
    """The colour of ``policy`` in every plot (ECMP blue, adaptive orange, task-aware
    green, ideal red, ...; a policy not listed: the tenth colour).

    >>> policy_color("ecmp"), policy_color("task-aware"), policy_color("mine")
    ('#1f77b4', '#2ca02c', '#17becf')
    """
    return _COLORS[_POLICY_ORDER.index(policy) if policy in _POLICY_ORDER else -1]


def plot_busbw(results: Sequence[RunResult], path: Path) -> Path:
    """Grouped bars: each job's busbw under each policy, labelled to three significant
    figures at most (3.8 and 4.2 GB/s do not both read 4); a job a fault stopped is
    hatched, and labelled "stopped" if it finished no iteration."""
    data = busbw_by_job(results)
    jobs = list(data)
    fig, ax = _figure(max(5.0, 1.2 * len(jobs) * max(len(results), 1) / 2 + 3), 3.8)
    width = 0.8 / max(len(results), 1)
    x = np.arange(len(jobs))
    for k, r in enumerate(results):
        values = [data[j][r.policy] for j in jobs]
        bars = ax.bar(x + (k - (len(results) - 1) / 2) * width, values, width,
                      label=r.policy, color=policy_color(r.policy))
        labels = []
        for bar, j, v in zip(bars, jobs, values, strict=True):
            stopped = j in r.aborted
            if stopped:
                bar.set_hatch("//")
            labels.append("stopped" if stopped and not v > 0 else
                          f"{v:.3g}" if v < 100 else f"{v:.0f}")
        ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
    from matplotlib.patches import Patch

    # (the legend's own patches: a series' first bar may be hatched)
    handles = [Patch(color=policy_color(r.policy), label=r.policy) for r in results]
    if any(j in r.aborted for r in results for j in jobs):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="stopped by a fault"))
    ax.set_xticks(x, jobs)
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("busbw per job")
    ax.legend(handles=handles, fontsize=8, ncols=min(len(handles), 4))
    ax.margins(y=0.15)
    return _save(fig, path)


def plot_slowdowns(results: Sequence[RunResult], path: Path) -> Path | None:
    """The CDF of FCT slowdown per policy: of the mice if there are any, else of the jobs'
    flows; ``None`` (nothing written) if no flow has one."""
    which = "mice" if any(len(r.slowdowns("mice")) for r in results) else "jobs"
    curves = [(r.policy, ecdf(r.slowdowns(which))) for r in results]
    if not any(len(x) for _, (x, _) in curves):
        return None
    fig, ax = _figure()
    for policy, (x, y) in curves:
        if len(x):
            p99 = float(np.quantile(x, 0.99))
            ax.step(x, y, where="post", color=policy_color(policy),
                    label=f"{policy} (p99 {p99:.2f})")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # (1, 2, 5, not 2x10^0)
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(_minor_label(*ax.get_xlim())))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    # (a collective's flows share their NICs: n of them at once are n times slower than
    # alone, under any policy; the mice alone are not)
    title = ("FCT slowdown, mice" if which == "mice" else
             "FCT slowdown, job flows (sharing their NICs: >1 even under ideal)")
    return _finish(fig, ax, "FCT slowdown (FCT / FCT alone)", "fraction of flows", title,
                   path)


def _minor_label(lo: float, hi: float) -> Callable[[float, object], str]:
    """Labels of a log axis's minor ticks from ``lo`` to ``hi``: every one within about a
    decade, only 2 and 5 (x a power of ten) up to three decades, none beyond (the labels
    would run into each other).

    >>> [_minor_label(1, 8)(v, None) for v in (2, 3, 5)]
    ['2', '3', '5']
    >>> [_minor_label(0.9, 1200)(v, None) for v in (20, 30, 500)]
    ['20', '', '500']
    >>> _minor_label(1, 1e5)(20, None)
    ''
    """
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0

    def label(v: float, _: object) -> str:
        if decades <= 1.2:
            return f"{v:g}"
        if decades <= 3.5 and v > 0:
            mantissa = round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6)
            return f"{v:g}" if mantissa in (2.0, 5.0) else ""
        return ""

    return label


def plot_utilization(results: Sequence[RunResult], path: Path) -> Path:
    """The CDF of the fabric links' mean utilisation per policy: a policy that spreads its
    traffic has a steep curve, one that collides a long tail of hot links."""
    fig, ax = _figure()
    for r in results:
        u, frac = ecdf(fabric_utilization(r))
        if len(u):
            # (the busiest link's mean over the run, not the tables' peak utilisation)
            ax.step(u, frac, where="post", color=policy_color(r.policy),
                    label=f"{r.policy} (busiest link's mean {u[-1]:.0%})")
    from matplotlib.ticker import PercentFormatter

    ax.xaxis.set_major_formatter(PercentFormatter(1.0))  # (in %, as the legend and tables)
    return _finish(fig, ax, "mean utilisation over the run", "fraction of fabric links",
                   "fabric link utilisation", path)


def plot_iterations(results: Sequence[RunResult], path: Path) -> Path | None:
    """Iteration time per iteration, one line per (job, policy); ``None`` (nothing written)
    if no job runs more than one iteration (the busbw plot says it all then)."""
    times = [(r.policy, iteration_times(r)) for r in results]
    if not any(len(v) > 1 for _, t in times for v in t.values()):
        return None
    fig, ax = _figure()
    styles = ("-", "--", ":", "-.")
    jobs = [j.name for j in results[0].jobs]
    markers = ("o", "s", "^", "D")
    for policy, per_job in times:
        for m, job in enumerate(jobs):
            ms = per_job.get(job, [])
            if ms:
                # (a marker of its own per job too: in the legend's short sample a marker
                # hid the dashes that told the jobs apart)
                ax.plot(range(len(ms)), ms, styles[m % len(styles)],
                        marker=markers[m % len(markers)], markersize=3,
                        color=policy_color(policy), label=f"{job}, {policy}")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(fig, ax, "iteration", "iteration time (ms)", "iteration times", path,
                   legend_size=7, ncols=2)


def plot_queues(results: Sequence[RunResult], path: Path) -> Path | None:
    """Bytes queued in the switches against time, per policy (fluid-model runs); ``None``
    (nothing written) if no run sampled any."""
    series = [(r.policy, queued_bytes(r)) for r in results]
    if not any(len(t) for _, (t, _) in series):
        return None
    fig, ax = _figure()
    for policy, (t, q) in series:
        if len(t):
            ax.plot(t, q / 2**20, color=policy_color(policy), label=policy)
    return _finish(fig, ax, "time (ms)", "queued in switches (MiB)", "queues (fluid model)",
                   path)


def plot_sweep(sizes_bytes: Sequence[int], busbw_GBps: Sequence[float],
               algbw_GBps: Sequence[float], title: str, path: Path,
               nic_GBps: float | None = None) -> Path:
    """An nccl-tests sweep: busbw and algbw against the message size (log scale), with the
    NIC rate for reference if given (not a bound: a hierarchical algorithm moves part of the
    bytes over NVLink)."""
    from matplotlib.ticker import FuncFormatter

    fig, ax = _figure()
    ax.plot(sizes_bytes, busbw_GBps, marker="o", markersize=3, color=_color(0), label="busbw")
    ax.plot(sizes_bytes, algbw_GBps, marker="s", markersize=3, color=_color(1), ls="--",
            label="algbw")
    if nic_GBps is not None:
        ax.axhline(nic_GBps, color="#555555", lw=0.8, ls=":", label=f"NIC rate ({nic_GBps:g} GB/s)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(int(v))))
    ax.tick_params(axis="x", labelsize=7)
    return _finish(fig, ax, "message size", "GB/s", title, path)


# ------------------------------------------------------------------------- the page
PLOT_FILES = ("busbw.png", "slowdown_cdf.png", "link_utilization.png", "iterations.png",
              "queues.png")
"""Every plot :func:`write_report` may write under ``plots/`` (not all of them always)."""


def write_report(results: Sequence[RunResult], reference: RunResult | None,
                 out_dir: str | Path, *, include_wall_time: bool = True) -> list[Path]:
    """Write ``plots/*.png`` and ``report.html`` under ``out_dir``: the plots above and the
    comparison's figures (per job and policy: iteration time, busbw, fraction of
    ``reference``'s busbw; per policy: simulated time, mice slowdown, peak fabric
    utilisation, bytes delivered, faults). ``include_wall_time=False`` leaves out the
    wall-clock figures (a controller's heal times), as the JSON summary does, so that
    equal seeds give byte-identical pages. A plot of an earlier run this one does not
    make is removed. Returns the files written."""
    out = Path(out_dir)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    made = [plot_busbw(results, plots / "busbw.png"),
            plot_slowdowns(results, plots / "slowdown_cdf.png"),
            plot_utilization(results, plots / "link_utilization.png"),
            plot_iterations(results, plots / "iterations.png"),
            plot_queues(results, plots / "queues.png")]
    images = [p for p in made if p is not None]
    remove_stale(plots, PLOT_FILES, images)  # (an earlier run's queues.png, say)
    page = out / "report.html"
    with written_whole(page, encoding="utf-8") as fh:
        fh.write(_page(results, reference, images, out, include_wall_time))
    return [*images, page]


def _page(results: Sequence[RunResult], reference: RunResult | None, images: list[Path],
          out: Path, wall_clock: bool = True) -> str:
    e = html.escape
    first = results[0]
    header, comparison = comparison_rows(results, reference)
    rows = [_tr(cells) for cells, _ in comparison]
    fabric = [_tr([*fabric_cells(r), str(len(r.faults)), str(len(r.aborted))])
              for r in results]
    faults = _faults_html(results)
    fluid = (f'<table>{_tr(["policy", *FLUID_COLUMNS], "th")}'
             + "".join(_tr([r.policy, *fluid_cells(r)]) for r in results) + "</table>"
             if any(r.model == "fluid" for r in results) else "")
    notes = "".join(f"<p>{e(line)}</p>" for line in run_notes(results))
    events = pfc_event_lines(results)
    storms = ("<h3>PFC storms and deadlocks</h3><ul>"
              + "".join(f"<li>{e(line)}</li>" for line in events) + "</ul>" if events else "")
    controllers = "".join(f"<p>{e(controller_line(r, wall_clock))}</p>" for r in results
                          if r.controller)
    figures = "\n".join(
        f'<figure><img src="{e(p.relative_to(out).as_posix())}" alt="{e(p.stem)}"></figure>'
        for p in images)
    tables = ", ".join(f'<a href="{e(r.policy)}/">{e(r.policy)}</a>' for r in results)
    if reference is not None and all(r is not reference for r in results):
        # (run as the reference only: its figures, to check the fractions by)
        ref = ", ".join(f"{j} {reference.mean_busbw_GBps(j):.1f}"
                        for j in (job.name for job in reference.jobs))
        shown_ref = f"<p>ideal (run as the reference only), busbw GB/s: {e(ref)}.</p>"
    else:
        shown_ref = ""
    above = above_reference(results, reference)
    note = (f"<p>Above ideal: {e(', '.join(above))}; {e(ABOVE_REFERENCE)}.</p>"
            if above else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>fabricpilot: {e(first.scenario)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
figure {{ display: inline-block; margin: 0.5em; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>scenario {e(first.scenario)}, seed {first.seed}</h1>
<p>Policies: {e(", ".join(r.policy for r in results))}. Fractions are of
{"the <code>ideal</code> run's busbw" if reference is not None else "nothing (no ideal run)"}.
CSV tables per policy: {tables}.</p>
{shown_ref}
<h2>jobs</h2>
<table>{_tr(header, "th")}
{"".join(rows)}
</table>
{note}
<h2>fabric</h2>
<table>{_tr([*FABRIC_COLUMNS, "faults", "jobs stopped"], "th")}
{"".join(fabric)}
</table>
{fluid}
{notes}
{controllers}
{storms}
{faults}
<h2>plots</h2>
{figures}
</body></html>
"""


def _tr(cells: Sequence[str], tag: str = "td") -> str:
    """One HTML table row of ``cells`` (escaped)."""
    return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"


def _faults_html(results: Sequence[RunResult]) -> str:
    """The faults' figures per policy (:func:`~fabricpilot.report.tables.fault_rows`, as the
    CLI's fault table), or nothing."""
    if not any(r.faults for r in results):
        return ""
    rows, labels = fault_rows(results)
    legend = html.escape("; ".join(f"#{k}: {v}" for k, v in labels.items()))
    return (f"<h2>faults (times in ms after the fault)</h2>\n<table>{_tr(FAULT_COLUMNS, 'th')}\n"
            f"{''.join(_tr(c) for c in rows)}\n</table>\n<p>{legend}</p>\n")
