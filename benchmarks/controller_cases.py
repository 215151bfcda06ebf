"""The cluster the controller benchmarks plan: a rail-optimised 400G leaf-spine (8 GPUs per
host) shared by jobs of equal size placed at random, half ring AllReduce and half AlltoAll,
all declared to a controller driving the twin."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fabricpilot.controller.core import Controller


def declared_controller(gpus: int, jobs: int, seed: int = 1, placement: str = "hosts"
                        ) -> tuple[Controller, float]:
    """A controller on the twin of ``default_cluster(gpus)`` with ``jobs`` jobs declared
    (not planned yet), and the seconds its construction took. ``placement``: ``"hosts"``,
    each job on whole hosts drawn at random (as a scheduler gives a large training job
    whole nodes; NCCL then runs its AlltoAll in PXN style), or ``"gpus"``, each on GPUs
    drawn at random across the cluster (about one per host: every AlltoAll pair through
    the NICs, the most pairs a job of that size can have)."""
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
    rng = np.random.default_rng(seed)
    if placement == "hosts":
        on_host = np.argsort(ct.gpu_host, kind="stable")  # (GPUs host by host)
        per_host = gpus // (int(ct.gpu_host.max()) + 1)
        rows = on_host.reshape(-1, per_host)
        order = rows[rng.permutation(len(rows))].reshape(-1)
    elif placement == "gpus":
        order = rng.permutation(gpus)
    else:
        raise ValueError(f"placement: {placement!r} is neither 'hosts' nor 'gpus'")
    per = gpus // jobs
    for j in range(jobs):
        ranks = tuple(int(g) for g in order[j * per:(j + 1) * per])
        pattern = "allreduce" if j % 2 == 0 else "alltoall"
        ctl.declare(Intent(f"job{j}", "t", ranks, (CommCall(pattern, 256 << 20, 1000.0, 0),)))
    return ctl, setup

