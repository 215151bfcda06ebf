"""Controller benchmarks: planner wall time for many jobs, and SLA-aware ranking per request.

    python benchmarks/run_controller_bench.py            # planner 1024 GPUs / 8 jobs, ranking
    python benchmarks/run_controller_bench.py --large    # also 8192 GPUs / 32 jobs

Planner cases: a rail-optimised 400G leaf-spine (8 GPUs per host), jobs of equal size placed at
random, half ring AllReduce and half AlltoAll, all declared to the controller, which plans them
together (each GPU pair in 4 parts). Targets: <= 1 s each. Ranking: k = 5 SLA-aware paths
between random GPU pairs of a fabric of about 200 switches and hosts; target <= 1 ms per
request (the source reports 8.2 ms at 200 nodes).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def planner_case(gpus: int, jobs: int, seed: int = 1) -> dict[str, float]:
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.intents import CommCall, Intent
    from fabricpilot.nccltests import default_cluster

    ct = default_cluster(gpus)
    twin = TaskAware(PolicyContext(ct, seed, 600))
    t0 = time.perf_counter()
    ctl = Controller(twin)
    setup = time.perf_counter() - t0
    order = np.random.default_rng(seed).permutation(gpus)
    per = gpus // jobs
    for j in range(jobs):
        ranks = tuple(int(g) for g in order[j * per:(j + 1) * per])
        pattern = "allreduce" if j % 2 == 0 else "alltoall"
        ctl.declare(Intent(f"job{j}", "t", ranks, (CommCall(pattern, 256 << 20, 1000.0, 0),)))
    t1 = time.perf_counter()
    rep = ctl.plan()
    plan_s = time.perf_counter() - t1
    return {"setup_s": setup, "plan_s": plan_s, "demands": rep.demands,
            "lambda": rep.plan.max_utilization}


def ranking_case(requests: int = 200, seed: int = 2) -> dict[str, float]:
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
    t = time.perf_counter()
    for a, b in pairs:
        rank_paths(view, int(a), int(b), 500.0)
    per_ms = (time.perf_counter() - t) / requests * 1e3
    return {"nodes": view.graph.number_of_nodes(), "per_request_ms": per_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="also 8192 GPUs / 32 jobs")
    args = parser.parse_args()
    cases = [(1024, 8)] + ([(8192, 32)] if args.large else [])
    print(f"{'planner':<16} {'demands':>8} {'lambda':>7} {'plan s':>8}")
    for gpus, jobs in cases:
        r = planner_case(gpus, jobs)
        print(f"{gpus} GPUs/{jobs} jobs {int(r['demands']):>8} {r['lambda']:>7.2f} "
              f"{r['plan_s']:>8.2f}", flush=True)
    r = ranking_case()
    print(f"ranking: {int(r['nodes'])} switches and hosts, {r['per_request_ms']:.2f} ms per "
          f"request (k = 5)")


if __name__ == "__main__":
    main()
