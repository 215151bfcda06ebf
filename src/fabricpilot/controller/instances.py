"""Random planning instances, for the planner's references, tests and benchmarks."""

from __future__ import annotations

import itertools

import numpy as np

from fabricpilot.controller.planner import Demand


def leaf_spine_demands(seed: int, leaves: int = 4, spines: int = 4, n: int = 24,
                       ) -> tuple[list[Demand], dict[int, float]]:
    """``n`` demands of 50, 100 or 200 Gb/s (heat 1-3) between random leaf pairs of a
    leaf-spine of 400 Gb/s links, and the links' capacities. Candidate ``k`` of a demand goes
    up to spine ``k`` and down; link ids: up(leaf, spine) = ``leaf * spines + spine``, then
    down(spine, leaf) = ``leaves * spines + spine * leaves + leaf``.

    >>> demands, cap = leaf_spine_demands(0, n=2)
    >>> len(demands), len(demands[0].candidates), len(cap), set(cap.values())
    (2, 4, 32, {400.0})
    """
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
    capacity = {lk: 400.0 for lk in itertools.chain(up.values(), down.values())}
    return demands, capacity
