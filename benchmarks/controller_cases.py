"""The cluster the controller benchmarks plan: a rail-optimised 400G leaf-spine (8 GPUs per
host) shared by jobs of equal size placed at random, half ring AllReduce and half AlltoAll,
all declared to a controller driving the twin."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

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

