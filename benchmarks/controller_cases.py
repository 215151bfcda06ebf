"""The cluster the controller benchmarks plan: a rail-optimised 400G leaf-spine (8 GPUs per
host) shared by jobs of equal size placed at random, half ring AllReduce and half AlltoAll,
all declared to a controller driving the twin."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fabricpilot.controller.core import Controller


def declared_controller(gpus: int, jobs: int, seed: int = 1) -> tuple[Controller, float]:
    """A controller on the twin of ``default_cluster(gpus)`` with ``jobs`` jobs declared
    (not planned yet), and the seconds its construction took."""
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
    return ctl, setup


def small_leaf_spine(seed: int, leaves: int = 4, spines: int = 4, n: int = 24,
                     ) -> tuple[list[Any], dict[int, float]]:
    """``n`` demands of 50, 100 or 200 Gb/s between random leaf pairs of a leaf-spine with
    400 Gb/s links, heat 1-3; candidate k goes up to spine k and down (link ids: up(leaf,
    spine) = leaf * spines + spine, then the down links)."""
    import itertools

    from fabricpilot.controller.planner import Demand

    rng = np.random.default_rng(seed)
    up = {(lf, s): lf * spines + s for lf in range(leaves) for s in range(spines)}
    off = leaves * spines
    down = {(s, lf): off + s * leaves + lf for s in range(spines) for lf in range(leaves)}
    demands = []
    for i in range(n):
        a, b = rng.choice(leaves, 2, replace=False)
        rate = float(rng.choice([50, 100, 200]))
        cands = tuple((up[(int(a), s)], down[(s, int(b))]) for s in range(spines))
        demands.append(Demand(f"d{i}", rate, cands, weight=float(rng.integers(1, 4))))
    return demands, {lk: 400.0 for lk in itertools.chain(up.values(), down.values())}
