"""Controller benchmarks: planner wall time for many jobs, and SLA-aware ranking per request.

    python benchmarks/run_controller_bench.py            # planner 1024 GPUs / 8 jobs, ranking
    python benchmarks/run_controller_bench.py --large    # also 8192 GPUs / 32 jobs
    python benchmarks/run_controller_bench.py --runs 5   # 1024 GPUs planned by 5 fresh controllers
    python benchmarks/run_controller_bench.py --large --large-runs 3   # 8192 GPUs: 3 as well
    python benchmarks/run_controller_bench.py --release-memory   # C allocator left as it is

Planner cases: a rail-optimised 400G leaf-spine (8 GPUs per host), jobs of equal size, half
ring AllReduce and half AlltoAll, all declared to the controller, which plans them together
(a ring's GPU pairs in 16 QPs each, ``controller.parts``, an AlltoAll's in one: its GPUs
have more than 4 peers). Each size twice: the jobs on whole hosts drawn at random (as a
scheduler places large training jobs; rings per rail, AlltoAll in NCCL's PXN style: 9 728
pairs for 256 GPUs), and on GPUs drawn at random across the cluster (about one per host:
every AlltoAll pair through the NICs, 65 280 for 256 GPUs, the most a job can have).
Targets: <= 1 s each. The time of ``Controller.plan()`` is also split into the
controller's ``demands()``, the planner and the rest (steering, install), and its CPU time
(user, system) and page faults are given: most of a plan's memory is new (its path sets
and records), so where first touching a page is slow (a virtual machine) the system time
and faults say how much of a slow run is the machine's. The process keeps the memory a plan
frees for the next and faults numpy's arrays in small pages
(``collector.keep_freed_memory``), as the service's control process does;
``--release-memory`` leaves the C allocator and numpy as they are. Building the
controller (reading the fabric and making its route tables, as a controller does when it
learns the topology) is timed apart. Then one job
changes (an AllReduce becomes an AlltoAll) and is planned by itself
(``Controller.plan_jobs``): its time, and its lambda against that of every job planned
again. Ranking: k = 5 SLA-aware paths between random GPU pairs of a fabric of
about 200 switches and hosts; target <= 1 ms per request (the source reports 8.2 ms at 200
nodes). Gap: the planner's lambda against HiGHS's optimum on small instances (24 demands
of 50-200 Gb/s between random leaves of a 4-leaf, 4-spine fabric of 400 Gb/s links): the LP
with each demand in 4 parts, the MILP with each demand whole (one QP); target within 5 % of
the LP. With ``--large`` also the MILP gap of 96 whole demands of a quarter the rates (a
finer grain; HiGHS takes some 10 s per instance).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

PLAN_TARGET_S = 1.0  # planner wall time per case (the median over runs)
RANK_TARGET_MS = 1.0  # SLA-aware ranking per request
GAP_TARGET = 0.05  # the planner's largest gap to the LP optimum
# the unit of ``ru_maxrss``: kilobytes on Linux, bytes on macOS
_MAXRSS_BYTES = 1 if sys.platform == "darwin" else 1024


def _timed(into: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding its wall time to ``into[name]`` at every call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into[name] = into.get(name, 0.0) + time.perf_counter() - t

    return wrapper


def planner_case(gpus: int, jobs: int, seed: int = 1, placement: str = "hosts"
                 ) -> dict[str, float]:
    """Wall time of one ``Controller.plan()``, split into the controller's ``demands()``,
    the planner (``plan_greedy``) and the rest (steering the paths, installing them); then
    a re-plan of the same jobs (``replan_s``) and of one changed job by itself."""
    from controller_cases import declared_controller
    from fabricpilot.controller import core

    ctl, setup = declared_controller(gpus, jobs, seed, placement)
    parts: dict[str, float] = {}
    greedy = core.plan_greedy
    core.plan_greedy = _timed(parts, "greedy_s", greedy)  # type: ignore[assignment]
    ctl.demands = _timed(parts, "demands_s", ctl.demands)  # type: ignore[method-assign]
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t1 = time.perf_counter()
        rep = ctl.plan()
        plan_s = time.perf_counter() - t1
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        core.plan_greedy = greedy  # type: ignore[assignment]
    out = {"setup_s": setup, "plan_s": plan_s, "demands": rep.demands,
           "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
           "faults": float(r1.ru_minflt - r0.ru_minflt + r1.ru_majflt - r0.ru_majflt),
           "peak_gb": r1.ru_maxrss * _MAXRSS_BYTES / 1e9,
           "lambda": rep.plan.max_utilization, "demands_s": parts.get("demands_s", 0.0),
           "greedy_s": parts.get("greedy_s", 0.0),
           "rest_s": plan_s - parts.get("demands_s", 0.0) - parts.get("greedy_s", 0.0)}
    # a control period's re-plan: the same jobs on the same links (their demands kept)
    t1 = time.perf_counter()
    ctl.plan()
    out["replan_s"] = time.perf_counter() - t1
    # one job changes (its AllReduce becomes an AlltoAll): planned by itself, then, for
    # the comparison, every job planned again
    from dataclasses import replace

    from fabricpilot.controller.intents import CommCall

    job = ctl.intents["job0"]
    ctl.declare(replace(job, calls=(CommCall("alltoall", 256 << 20, 1000.0, 0),)))
    t1 = time.perf_counter()
    one = ctl.plan_jobs({"job0"})
    out["job_plan_s"] = time.perf_counter() - t1
    assert one is not None
    out["job_demands"] = one.demands
    out["job_lambda"] = one.plan.max_utilization
    out["full_lambda"] = ctl.plan().plan.max_utilization
    return out


def gap_case(instances: int = 20, fine: int = 0) -> dict[str, list[float]]:
    """Relative gap of the planner's lambda to the LP optimum (4 parts per demand) and to
    the MILP optimum (each demand whole), per instance; with ``fine``, also that many
    instances of 96 whole demands at a quarter the rates (``milp_fine``)."""

    from fabricpilot.controller.instances import leaf_spine_demands
    from fabricpilot.controller.planner import gap, plan_greedy, plan_reference

    out: dict[str, list[float]] = {"lp": [], "milp": [], "milp_fine": []}
    with _quiet_stdout():  # (HiGHS's MILP prints progress notes of its own)
        for seed in range(instances):
            demands, cap = leaf_spine_demands(seed)
            out["lp"].append(gap(plan_greedy(demands, cap, split=4),
                                 plan_reference(demands, cap)))
            whole = [d._replace(whole=True) for d in demands]
            out["milp"].append(gap(plan_greedy(whole, cap),
                                   plan_reference(whole, cap, integral=True)))
        for seed in range(fine):
            demands, cap = leaf_spine_demands(seed, n=96)
            whole = [d._replace(rate_gbps=d.rate_gbps / 4, whole=True) for d in demands]
            out["milp_fine"].append(gap(plan_greedy(whole, cap),
                                        plan_reference(whole, cap, integral=True)))
    return out


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Within: what native code writes to the process's stdout is dropped."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def ranking_case(requests: int = 200, seed: int = 2, passes: int = 3) -> dict[str, float]:
    """Mean time per request over ``requests`` random GPU pairs: of the first pass, and the
    best of ``passes`` passes (less sensitive to other load on the machine)."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import fabric_view
    from fabricpilot.controller.ranking import rank_paths
    from fabricpilot.topology import compile_topology, leaf_spine

    # 160 single-GPU hosts on 20 leaves and 16 spines: 196 switches and hosts
    ct = compile_topology(leaf_spine(hosts=160, gpus_per_host=1, nics_per_leaf=8,
                                     rail_optimized=False, oversubscription=0.5))
    view = fabric_view(PolicyContext(ct, 1, 600))
    rng = np.random.default_rng(seed)
    pairs = [tuple(rng.choice(160, 2, replace=False)) for _ in range(requests)]
    rank_paths(view, int(pairs[0][0]), int(pairs[0][1]), 500.0)  # warm caches
    per_ms = []
    for _ in range(passes):
        t = time.perf_counter()
        for a, b in pairs:
            rank_paths(view, int(a), int(b), 500.0)
        per_ms.append((time.perf_counter() - t) / requests * 1e3)
    return {"nodes": view.graph.number_of_nodes(), "per_request_ms": per_ms[0],
            "best_ms": min(per_ms)}


def telemetry_case(gpus: int, periods: int = 20, seed: int = 3) -> dict[str, float]:
    """The congestion map of ``default_cluster(gpus)``'s fabric, per control period
    (medians over ``periods``, in ms): folding a report from every port (each at a random
    load), and an idle period after it (nothing reported: every port fades one step towards
    its last delta). The reports are made before the clock starts, as a southbound hands
    them over."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import fabric_view
    from fabricpilot.controller.congestion import CongestionMap
    from fabricpilot.controller.southbound import PortDelta
    from fabricpilot.nccltests import default_cluster

    view = fabric_view(PolicyContext(default_cluster(gpus), seed, 600))
    cm = CongestionMap(view)
    interval_ns = 10_000
    links = sorted(view.links)
    cap = [view.links[lk].capacity_gbps for lk in links]
    rng = np.random.default_rng(seed)
    busy, idle = [], []
    for _ in range(periods):
        load = rng.random(len(links)).tolist()
        report = [PortDelta(lk, interval_ns, tx_bytes=u * c * interval_ns / 8.0)
                  for lk, u, c in zip(links, load, cap, strict=True)]
        t = time.perf_counter()
        cm.update(report)
        busy.append(time.perf_counter() - t)
        t = time.perf_counter()
        cm.update([], elapsed=True)
        idle.append(time.perf_counter() - t)
    return {"links": len(links), "busy_ms": statistics.median(busy) * 1e3,
            "idle_ms": statistics.median(idle) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="also 8192 GPUs / 32 jobs")
    parser.add_argument("--runs", type=int, default=3,
                        help="fresh controllers per case up to 1024 GPUs")
    parser.add_argument("--large-runs", type=int, default=1,
                        help="fresh controllers per 8192-GPU case (each takes 10-30 s)")
    parser.add_argument("--release-memory", action="store_true",
                        help="leave the C allocator as it is (freed blocks handed back to "
                             "the system) and numpy asking for huge pages, not as the "
                             "service's control process sets them")
    args = parser.parse_args()
    for flag, n in (("--runs", args.runs), ("--large-runs", args.large_runs)):
        if n < 1:
            parser.error(f"{flag} must be at least 1")
    if not args.release_memory:  # (as the service's control process, which plans)
        from fabricpilot.collector import keep_freed_memory

        kept = keep_freed_memory()
        print("memory freed by a plan kept for the next, arrays faulted in small pages (as "
              f"the service's control process does): {'yes' if kept else 'no (not glibc)'}")
    cases = [(1024, 8, "hosts"), (1024, 8, "gpus")]
    if args.large:
        cases += [(8192, 32, "hosts"), (8192, 32, "gpus")]
    print(f"{'planner':<18} {'demands':>8} {'lambda':>7} {'plan s':>8}   of which: "
          f"{'demands()':>9} {'planner':>8} {'steer+install':>13}")
    for gpus, jobs, placement in cases:
        plans, replans = [], []
        print(f"jobs on {'whole hosts' if placement == 'hosts' else 'scattered GPUs'}:")
        for _ in range(args.runs if gpus <= 1024 else args.large_runs):
            r = planner_case(gpus, jobs, placement=placement)
            plans.append(r["plan_s"])
            replans.append(r["replan_s"])
            print(f"{gpus} GPUs/{jobs} jobs {int(r['demands']):>8} {r['lambda']:>7.2f} "
                  f"{r['plan_s']:>8.2f}   {'':9} {r['demands_s']:>9.2f} {r['greedy_s']:>8.2f} "
                  f"{r['rest_s']:>13.2f}", flush=True)
            print(f"  controller built in {r['setup_s']:.2f} s (the fabric read, its route "
                  f"tables made; not in the plan)", flush=True)
            print(f"  plan CPU: {r['user_s']:.2f} s user, {r['sys_s']:.2f} s system; "
                  f"{int(r['faults'])} page faults (memory touched the first time); "
                  f"process peak {r['peak_gb']:.2f} GB", flush=True)
            print(f"  re-planned (same jobs, same links): {r['replan_s']:.2f} s", flush=True)
            print(f"  one job changed: planned by itself ({int(r['job_demands'])} demands) in "
                  f"{r['job_plan_s'] * 1e3:.0f} ms, lambda {r['job_lambda']:.2f} (all jobs "
                  f"planned again: {r['full_lambda']:.2f})", flush=True)
        if len(plans) > 1:
            print(f"  plan over {len(plans)} runs: min {min(plans):.2f} s, median "
                  f"{statistics.median(plans):.2f} s; re-plan: min "
                  f"{min(replans):.2f} s, median {statistics.median(replans):.2f} s", flush=True)
        median = statistics.median(plans)
        print(f"  {gpus} GPUs / {jobs} jobs on {placement}: plan {median:.2f} s against the "
              f"target of "
              f"{PLAN_TARGET_S:g} s: {'met' if median <= PLAN_TARGET_S else 'missed'}",
              flush=True)
    for gpus in (1024, 8192) if args.large else (1024,):
        t = telemetry_case(gpus)
        print(f"telemetry: {gpus} GPUs, {int(t['links'])} links: a control period with every "
              f"port reporting folded into the congestion map in {t['busy_ms']:.2f} ms, an "
              f"idle one (every port fading) in {t['idle_ms']:.2f} ms", flush=True)
    r = ranking_case()
    print(f"ranking: {int(r['nodes'])} switches and hosts, {r['per_request_ms']:.2f} ms per "
          f"request (k = 5; best of 3 passes {r['best_ms']:.2f} ms; target <= "
          f"{RANK_TARGET_MS:g} ms: {'met' if r['per_request_ms'] <= RANK_TARGET_MS else 'missed'})")
    g = gap_case(fine=5 if args.large else 0)
    for name, what in (("lp", "the LP optimum, 4 parts per demand"),
                       ("milp", "the MILP optimum, each demand whole"),
                       ("milp_fine", "the MILP optimum, 96 whole demands of 12.5-50 Gb/s")):
        v = g[name]
        if v:
            print(f"planner gap to {what} ({len(v)} instances): mean "
                  f"{100 * statistics.mean(v):.1f} %, max {100 * max(v):.1f} %"
                  + (f" (target <= {100 * GAP_TARGET:g} %: "
                     f"{'met' if max(v) <= GAP_TARGET else 'missed'})" if name == "lp" else ""))


if __name__ == "__main__":
    main()
