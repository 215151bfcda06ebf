"""An nccl-tests-style sweep: one collective over all GPUs, message size doubling from min to
max, printed as nccl-tests prints it (size, count, type, redop, root, time, algbw, busbw).

Sizes and counts follow nccl-tests (type ``float``, 4 bytes): the size is bytes per rank for
AllReduce / AlltoAll / Broadcast, total bytes for AllGather / ReduceScatter, rounded down to
whole elements, and to a multiple of ``n_ranks * 4`` where the op splits the buffer across
ranks; the count is the elements of the call's count argument: the whole buffer for
AllReduce / Broadcast, one rank's part for AllGather / ReduceScatter, one peer's for AlltoAll
(``size / 4 / n_ranks``). At least one element (per rank, where split) is run.

>>> nccl_size_and_count(Op.ALLGATHER, 1 << 30, 16)
(1073741824, 16777216)
>>> nccl_size_and_count(Op.ALLREDUCE, 1001, 16)
(1000, 250)
>>> nccl_size_and_count(Op.ALLGATHER, 1, 8)
(32, 1)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fabricpilot.balancing import EcmpParams
from fabricpilot.dataplane import FabricParams
from fabricpilot.errors import FabricpilotError, TopologyError
from fabricpilot.runner import Prepared, link_costs, run_policy
from fabricpilot.textfiles import written_whole
from fabricpilot.topology import CompiledTopology, compile_topology, leaf_spine
from fabricpilot.topology.builders import decimal_fraction
from fabricpilot.units import format_bytes
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec
from fabricpilot.workload.plan import Op

TYPE_BYTES = 4
_SPLIT_OPS = {Op.ALLTOALL, Op.ALLGATHER, Op.REDUCESCATTER}


def nccl_size_and_count(op: Op, size_bytes: int, n_ranks: int) -> tuple[int, int]:
    """The size (bytes) an nccl-tests row of ``op`` over ``n_ranks`` runs for a requested
    ``size_bytes``, and its count column (see the module docstring)."""
    unit = TYPE_BYTES * (n_ranks if op in _SPLIT_OPS else 1)
    size = max(size_bytes // unit, 1) * unit
    return size, size // unit


def rounding_note(op: Op, sizes: list[int], n_ranks: int) -> str | None:
    """The sizes of a sweep that do not run as asked (rounded to whole elements per rank,
    as nccl-tests does; one that rounds below one element runs at one), as a line for
    under the table, or ``None`` if every size runs as asked.

    >>> rounding_note(Op.ALLGATHER, [1, 16, 64, 100, 256], 16)
    '# Sizes run as whole floats per rank (as nccl-tests): 1, 16, 100 B as 64 B'
    >>> rounding_note(Op.ALLREDUCE, [4, 8], 16) is None
    True
    """
    ran: dict[int, list[int]] = {}
    for size in sizes:
        s, _ = nccl_size_and_count(op, size, n_ranks)
        if s != size:
            ran.setdefault(s, []).append(size)
    if not ran:
        return None
    return "# Sizes run as whole floats per rank (as nccl-tests): " + "; ".join(
        f"{', '.join(map(str, asked))} B as {s} B" for s, asked in ran.items())


@dataclass(frozen=True, slots=True)
class SweepRow:
    size_bytes: int
    count: int
    redop: str
    root: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str = ""  # (what ran: auto's pick, as ``CollectivePlan.algorithm``)


def default_cluster(n_gpus: int, gpus_per_host: int = 8, rate_gbps: float = 400.0,
                    oversubscription: float = 1.0) -> CompiledTopology:
    """A rail-optimised non-blocking leaf-spine sized for ``n_gpus`` (leaves of up to 64
    NIC ports, the largest divisor of the host count)."""
    if n_gpus < 2:
        raise FabricpilotError(f"--gpus: must be >= 2, got {n_gpus}")
    if n_gpus % gpus_per_host:
        raise FabricpilotError(f"--gpus: {n_gpus} GPUs do not fill hosts of {gpus_per_host} "
                               f"(--gpus-per-host): give a multiple of {gpus_per_host}, or "
                               f"--gpus-per-host {math.gcd(n_gpus, gpus_per_host)}")
    hosts = n_gpus // gpus_per_host
    per_leaf = max(d for d in range(1, min(hosts, 64) + 1) if hosts % d == 0)
    if hosts > 64 and per_leaf < 8:  # (a prime number of hosts: leaves of one port)
        fits = [h * gpus_per_host for h in (_near_hosts(hosts, -1), _near_hosts(hosts, 1))]
        raise FabricpilotError(
            f"--gpus: {hosts} hosts of {gpus_per_host} GPUs fill no leaves of 8 to 64 ports "
            f"(the largest divisor of {hosts} up to 64 is {per_leaf}): give "
            f"{fits[0]} or {fits[1]} GPUs, or a scenario file with the leaves you mean")
    if oversubscription > 1 and (per_leaf / decimal_fraction(oversubscription)).denominator != 1:
        raise FabricpilotError(f"--oversubscription: must divide the leaf port count "
                               f"({per_leaf}), got {oversubscription!r}")
    try:
        topo = leaf_spine(hosts=hosts, gpus_per_host=gpus_per_host, nics_per_leaf=per_leaf,
                          oversubscription=oversubscription, nic_rate_gbps=rate_gbps,
                          fabric_rate_gbps=rate_gbps)
    except (ValueError, TopologyError) as err:  # (the spines the ratio asks for)
        raise FabricpilotError(f"--oversubscription: {oversubscription!r} with {per_leaf} "
                               f"ports per leaf: {err}") from None
    return compile_topology(topo)


def _near_hosts(hosts: int, step: int) -> int:
    """The nearest host count from ``hosts`` in direction ``step`` (+1 or -1) that fills
    leaves of 8 to 64 ports (has a divisor there).

    >>> _near_hosts(67, -1), _near_hosts(67, 1)
    (66, 68)
    """
    h = hosts + step
    while not any(h % d == 0 for d in range(8, 65)):
        h += step
    return h


def sweep_sizes(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """Sizes min, min*f, ... <= max (like ``-b -e -f``).

    >>> sweep_sizes(1024, 8192, 2)
    [1024, 2048, 4096, 8192]
    """
    if min_bytes <= 0:
        raise FabricpilotError(f"--min-bytes: must be > 0, got {min_bytes}")
    if max_bytes < min_bytes:
        raise FabricpilotError(f"--max-bytes: must be >= --min-bytes ({min_bytes}), got "
                               f"{max_bytes}")
    if step_factor < 2:
        raise FabricpilotError(f"--step-factor: must be >= 2, got {step_factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= step_factor
    return sizes


def run_sweep(
    topology: CompiledTopology,
    op: str,
    sizes: list[int],
    policy: str,
    *,
    n_gpus: int | None = None,
    algorithm: str = "auto",
    seed: int = 1,
    fabric: FabricParams | None = None,
    ecmp: EcmpParams | None = None,
    on_size: Callable[[SweepRow], None] | None = None,
) -> list[SweepRow]:
    """Run ``op`` over the first ``n_gpus`` GPUs for every size; one engine run per size.
    Sizes that round to one already run (below one element per rank) are run once: the
    same row again would count twice in the average busbw."""
    the_op = Op(op)
    n = n_gpus or topology.n_gpus
    if n > topology.n_gpus:
        raise FabricpilotError(f"{n} GPUs requested but the cluster has {topology.n_gpus}")
    ranks = np.arange(n, dtype=np.int64)
    costs = link_costs(topology, fabric or FabricParams())
    rows = []
    done: set[int] = set()
    for size in sizes:
        s, count = nccl_size_and_count(the_op, size, n)
        if s in done:
            continue
        done.add(s)
        plan = build_collective(the_op, ranks, s, gpus_per_host=topology.topo.gpus_per_host,
                                algorithm=algorithm, costs=costs)
        job = JobSpec(op, tuple(range(n)), (plan,))
        prep = Prepared(f"nccl-test-{op}", seed, topology, [job],
                        fabric=fabric or FabricParams(), ecmp=ecmp or EcmpParams())
        res = run_policy(prep, policy)
        c = res.collectives[0]
        row = SweepRow(
            size_bytes=s, count=count,
            redop="sum" if the_op in (Op.ALLREDUCE, Op.REDUCESCATTER) else "none",
            root=0 if the_op is Op.BROADCAST else -1,
            time_us=c.time_ns / 1e3, algbw_GBps=c.algbw_GBps, busbw_GBps=c.busbw_GBps,
            algorithm=plan.algorithm)
        rows.append(row)
        if on_size is not None:
            on_size(row)
    return rows


HEADER = (
    "#                                                              out-of-place"
    "                       in-place          \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
    "     (us)  (GB/s)  (GB/s)       "
)


def format_row(row: SweepRow) -> str:
    """One line in nccl-tests' layout, out-of-place then in-place columns (``#wrong`` is
    N/A: the twin moves no data). An in-place call puts the same traffic on the fabric, so
    its columns repeat the out-of-place ones.

    >>> format_row(SweepRow(1048576, 262144, "sum", -1, 48.0, 21.85, 38.23)).split()[5:]
    ['48.00', '21.85', '38.23', 'N/A', '48.00', '21.85', '38.23', 'N/A']
    """
    measured = (f"{_time_text(row.time_us):>8} {row.algbw_GBps:>7.2f} {row.busbw_GBps:>7.2f} "
                f"{'N/A':>6}")
    return (f"{row.size_bytes:>12} {row.count:>13} {'float':>9} {row.redop:>7} {row.root:>7} "
            f"{measured} {measured}")


def _time_text(time_us: float) -> str:
    """A time as nccl-tests prints it: two decimals below 100 us, one below 10 ms, none
    from there.

    >>> _time_text(48.0), _time_text(368.04), _time_text(23331.04)
    ('48.00', '368.0', '23331')
    """
    if time_us >= 10_000.0:
        return f"{time_us:.0f}"
    return f"{time_us:.1f}" if time_us >= 100.0 else f"{time_us:.2f}"


def average_busbw(rows: list[SweepRow]) -> float:
    return float(np.mean([r.busbw_GBps for r in rows])) if rows else 0.0


SWEEP_CSV_COLUMNS = ("size_bytes", "count", "redop", "root", "time_us", "algbw_GBps",
                     "busbw_GBps", "algorithm")


def algorithm_ranges(rows: list[SweepRow]) -> str:
    """Which algorithm ran at which sizes, consecutive sizes of one algorithm together.

    >>> rows = [SweepRow(s, 0, "sum", -1, 1.0, 1.0, 1.0, a) for s, a in
    ...         ((1 << 20, "tree"), (4 << 20, "tree"), (16 << 20, "rails"))]
    >>> algorithm_ranges(rows)
    'tree 1.0 MiB - 4.0 MiB, rails 16.0 MiB'
    """
    spans: list[list[Any]] = []
    for r in rows:
        if spans and spans[-1][0] == r.algorithm:
            spans[-1][2] = r.size_bytes
        else:
            spans.append([r.algorithm, r.size_bytes, r.size_bytes])
    return ", ".join(f"{a} {format_bytes(lo)}" + (f" - {format_bytes(hi)}" if hi != lo else "")
                     for a, lo, hi in spans)


def write_sweep_csv(rows: list[SweepRow], path: Path) -> None:
    """The sweep as CSV: one row per size under :data:`SWEEP_CSV_COLUMNS`."""
    with written_whole(path, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(SWEEP_CSV_COLUMNS)
        for r in rows:
            w.writerow([r.size_bytes, r.count, r.redop, r.root, f"{r.time_us:.6g}",
                        f"{r.algbw_GBps:.6g}", f"{r.busbw_GBps:.6g}", r.algorithm])
