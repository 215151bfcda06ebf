"""The planner's heuristic against HiGHS optima on small instances, and hand-checked cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fabricpilot.controller.planner import Demand, gap, plan_greedy, plan_reference


def leaf_spine_demands(seed: int, leaves: int = 4, spines: int = 4, n: int = 24,
                       ) -> tuple[list[Demand], dict[int, float]]:
    """Demands between random leaf pairs; candidate k goes up to spine k and down. Link ids:
    up(leaf, spine) = leaf * spines + spine, down(spine, leaf) = offset + ..."""
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


@pytest.mark.parametrize("seed", range(6))
def test_greedy_with_four_parts_is_within_5_percent_of_the_lp_optimum(seed: int) -> None:
    # each demand in 4 equal parts (one per QP of a connection, steered separately)
    demands, cap = leaf_spine_demands(seed)
    lp = plan_reference(demands, cap)
    g = plan_greedy(demands, cap, split=4)
    assert lp.max_utilization <= g.max_utilization + 1e-9
    assert gap(g, lp) <= 0.05
    for d in demands:
        assert sum(share for _, share in g.paths[d.key]) == pytest.approx(1.0)
        assert all(path in d.candidates for path, _ in g.paths[d.key])


@pytest.mark.parametrize("seed", range(3))
def test_whole_demands_lie_between_the_lp_and_milp_bounds(seed: int) -> None:
    demands, cap = leaf_spine_demands(seed)
    g = plan_greedy(demands, cap)
    exact = plan_reference(demands, cap, integral=True)
    lp = plan_reference(demands, cap)
    # LP <= MILP <= greedy; every demand placed whole, on one of its own candidates
    assert lp.max_utilization <= exact.max_utilization + 1e-9
    assert exact.max_utilization <= g.max_utilization + 1e-9
    for d in demands:
        (path, share), = g.paths[d.key]
        assert share == 1.0 and path in d.candidates


def test_loads_add_up_to_the_placed_rates() -> None:
    demands, cap = leaf_spine_demands(1)
    g = plan_greedy(demands, cap, split=2)
    load = dict.fromkeys(cap, 0.0)
    for d in demands:
        for path, share in g.paths[d.key]:
            for lk in path:
                load[lk] += d.rate_gbps * share
    assert g.link_load_gbps == pytest.approx(load)
    assert g.max_utilization == pytest.approx(max(v / cap[k] for k, v in load.items()))


def test_background_and_splitting_by_hand() -> None:
    # one 600 Gb/s demand, two 400 Gb/s links, link 0 already carries 100: whole it must
    # take link 1 (600 / 400 = 1.5); in two halves 300 each: link 1 takes one (300/400) and
    # link 0 the other ((100 + 300)/400 = 1.0)
    d = [Demand("x", 600, ((0,), (1,)))]
    cap = {0: 400.0, 1: 400.0}
    whole = plan_greedy(d, cap, background={0: 100})
    assert whole.paths["x"] == [((1,), 1.0)] and whole.max_utilization == 1.5
    halves = plan_greedy(d, cap, background={0: 100}, split=2)
    assert halves.max_utilization == 1.0
    assert sorted(halves.paths["x"]) == [((0,), 0.5), ((1,), 0.5)]
    # the LP spreads freely: (100 + x) = (600 - x) -> x = 250, lambda = 350 / 400
    assert plan_reference(d, cap, background={0: 100}).max_utilization == pytest.approx(0.875)


def test_bad_demands_are_rejected() -> None:
    with pytest.raises(ValueError, match="no candidate"):
        Demand("x", 1.0, ())
    with pytest.raises(ValueError, match="no capacity for links"):
        plan_greedy([Demand("x", 1.0, ((7,),))], {0: 1.0})
