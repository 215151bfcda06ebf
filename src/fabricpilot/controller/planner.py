"""Job-aware path planning: a multi-commodity-flow heuristic and its LP / MILP references.

A *demand* is one commodity: the traffic of a job (or a flow group) between two endpoints at a
rate, with a set of candidate paths (link ids) and a weight (its priority or heat). Planning
picks one candidate per demand (``split = 1``; a demand may also be split into equal parts on
several paths) so that no link is over-committed: the objective is the largest link
utilisation ``lambda = max_l (background_l + load_l) / capacity_l``.

* :func:`plan_greedy`: heaviest demands first, each on the candidate that keeps its own
  bottleneck lowest, then a local search that moves demands off the most loaded link while
  that lowers ``lambda``. Vectorised over links; seconds at most for thousands of demands.
* :func:`plan_reference`: the same problem solved exactly with HiGHS (``scipy.optimize``):
  the LP relaxation (demands split freely over their candidates, a lower bound on any plan)
  or the MILP (one path per demand part), for small instances, to report the heuristic's gap.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, linprog, milp


@dataclass(frozen=True, slots=True)
class Demand:
    """Traffic to place: ``rate_gbps`` between two endpoints on one of ``candidates`` (paths
    as tuples of link ids); heavier ``weight`` is placed first."""

    key: str
    rate_gbps: float
    candidates: tuple[tuple[int, ...], ...]
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError(f"demand {self.key!r}: no candidate path")
        if not self.rate_gbps >= 0:
            raise ValueError(f"demand {self.key!r}: rate_gbps must be >= 0")


@dataclass
class Plan:
    """Each demand's paths and shares, the resulting load per link and ``lambda``."""

    paths: dict[str, list[tuple[tuple[int, ...], float]]]
    link_load_gbps: dict[int, float]
    max_utilization: float
    solver: str = "greedy"
    moves: int = 0  # local-search moves after the greedy pass
    extra: dict[str, float] = field(default_factory=dict)


class _Problem:
    """Demands and candidates as arrays: candidate c of demand d is column ``col[d] + c``."""

    def __init__(self, demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None) -> None:
        used = np.unique(np.fromiter(itertools.chain.from_iterable(
            itertools.chain.from_iterable(d.candidates for d in demands)), np.int64))
        links = sorted(set(used.tolist()) | set(capacity))
        missing = [lk for lk in links if lk not in capacity]
        if missing:
            raise ValueError(f"no capacity for links {missing[:5]}")
        self.links = np.array(links, np.int64)
        self.cap = np.array([float(capacity[lk]) for lk in links])
        if (self.cap <= 0).any():
            raise ValueError("link capacities must be > 0")
        bg = background or {}
        self.bg = np.array([float(bg.get(lk, 0.0)) for lk in links])
        self.demands = list(demands)
        self.rate = np.array([d.rate_gbps for d in demands], np.float64)
        self.n_cand = np.array([len(d.candidates) for d in demands], np.int64)
        self.col = np.concatenate(([0], np.cumsum(self.n_cand)[:-1])).astype(np.int64)
        all_paths = [p for dem in demands for p in dem.candidates]
        plen = np.fromiter((len(p) for p in all_paths), np.int64, len(all_paths))
        flat = np.fromiter(itertools.chain.from_iterable(all_paths), np.int64, int(plen.sum()))
        rows = np.searchsorted(self.links, flat)
        cols = np.repeat(np.arange(len(all_paths)), plen)
        n_cols = int(self.n_cand.sum())
        # [links, candidates] incidence
        self.inc = sp.csr_matrix((np.ones(len(rows)), (rows, cols)),
                                 shape=(len(links), n_cols))
        self.inc_csc = self.inc.tocsc()

    def cand_links(self, column: int) -> NDArray[np.int64]:
        s = self.inc_csc
        return s.indices[s.indptr[column]: s.indptr[column + 1]]


def plan_greedy(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                background: Mapping[int, float] | None = None, split: int = 1,
                sweeps: int = 2, max_moves: int | None = None) -> Plan:
    """Place every demand (in ``split`` equal parts) on its candidates, heaviest first, each
    part on the candidate whose most loaded link stays lowest (counting only the links that
    differ between its candidates; ties by the sum of squared utilisations); then ``sweeps``
    rounds that take every part out and put it back on its best candidate given all the
    others; then, on instances of at most 2 000 parts (or ``max_moves`` if given), a local
    search that moves parts off the links at ``lambda`` while that lowers ``lambda``, or the
    number of links at it, or the sum of squared utilisations.

    Two 300 Gb/s demands with the same two 400 Gb/s candidate links go one each:

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> p = plan_greedy(d, {0: 400, 1: 400})
    >>> sorted(p.paths["a"] + p.paths["b"]), p.max_utilization
    ([((0,), 1.0), ((1,), 1.0)], 0.75)
    """
    if split < 1:
        raise ValueError("split must be >= 1")
    prob = _Problem(demands, capacity, background)
    load = prob.bg.copy()
    order = sorted(range(len(prob.demands)),
                   key=lambda d: (-prob.demands[d].weight * prob.rate[d], prob.demands[d].key))
    # chosen candidate column of every (demand, part): greedy placement, then re-insertion
    # sweeps (each part taken out and put back on its best candidate given all the others)
    s_csc = prob.inc_csc
    choice = _greedy_kernel(np.array(order, np.int64), prob.col, prob.n_cand, prob.rate,
                            s_csc.indptr.astype(np.int64), s_csc.indices.astype(np.int64),
                            prob.cap, load, split, sweeps)
    moves = 0
    if max_moves is None:
        max_moves = 10_000 if len(prob.demands) * split <= 2_000 else 0

    def score(ld: NDArray[np.float64]) -> tuple[float, int, float]:
        # lambda first; then fewer links at lambda; then a flatter load overall
        u = ld / prob.cap
        lam = float(u.max())
        return (round(lam, 9), int((u >= lam - 1e-9).sum()), float((u * u).sum()))

    current = score(load)
    while moves < max_moves:
        util = load / prob.cap
        hot = set(np.flatnonzero(util >= util.max() - 1e-9).tolist())
        improved = False
        # parts crossing a link at lambda, heaviest first
        for d in order:
            part = prob.rate[d] / split
            for k in range(split):
                cur = int(choice[d, k])
                cur_lk = prob.cand_links(cur)
                if not hot.intersection(cur_lk.tolist()):
                    continue
                for c in range(int(prob.n_cand[d])):
                    col = int(prob.col[d] + c)
                    if col == cur:
                        continue
                    trial = load.copy()
                    trial[cur_lk] -= part
                    trial[prob.cand_links(col)] += part
                    s_trial = score(trial)
                    if s_trial < current:
                        choice[d, k], load, current = col, trial, s_trial
                        improved = True
                        break
                if improved:
                    break
            if improved:
                break
        if not improved:
            break
        moves += 1
    return _plan_from_choice(prob, choice, load, "greedy", moves)


@numba.njit(cache=True)
def _greedy_kernel(order: NDArray[np.int64], col0: NDArray[np.int64],
                   n_cand: NDArray[np.int64], rate: NDArray[np.float64],
                   indptr: NDArray[np.int64], indices: NDArray[np.int64],
                   cap: NDArray[np.float64], load: NDArray[np.float64], split: int,
                   sweeps: int) -> NDArray[np.int64]:
    """Greedy placement and re-insertion sweeps (see :func:`plan_greedy`); ``load`` is
    updated in place. A candidate's cost counts only the links not shared by all of its
    demand's candidates: (largest utilisation after adding the part, sum of squares)."""
    n_links = cap.shape[0]
    mark = np.zeros(n_links, np.int64)
    choice = np.full((len(n_cand), split), -1, np.int64)
    for rnd in range(sweeps + 1):
        for d in order:
            k_c = n_cand[d]
            part = rate[d] / split
            # links on every candidate of d
            for c in range(k_c):
                col = col0[d] + c
                for q in range(indptr[col], indptr[col + 1]):
                    mark[indices[q]] += 1
            for k in range(split):
                if rnd > 0:  # take the part out before placing it again
                    old = choice[d, k]
                    for q in range(indptr[old], indptr[old + 1]):
                        load[indices[q]] -= part
                best = -1
                best_max = np.inf
                best_sq = np.inf
                for c in range(k_c):
                    col = col0[d] + c
                    mx = 0.0
                    sq = 0.0
                    for q in range(indptr[col], indptr[col + 1]):
                        lk = indices[q]
                        if mark[lk] == k_c:
                            continue
                        u = (load[lk] + part) / cap[lk]
                        if u > mx:
                            mx = u
                        sq += u * u
                    if mx < best_max - 1e-12 or (mx <= best_max + 1e-12 and sq < best_sq - 1e-12):
                        best, best_max, best_sq = col, mx, sq
                choice[d, k] = best
                for q in range(indptr[best], indptr[best + 1]):
                    load[indices[q]] += part
            for c in range(k_c):
                col = col0[d] + c
                for q in range(indptr[col], indptr[col + 1]):
                    mark[indices[q]] = 0
    return choice


def _plan_from_choice(prob: _Problem, choice: NDArray[np.int64], load: NDArray[np.float64],
                      solver: str, moves: int) -> Plan:
    split = choice.shape[1]
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for d, dem in enumerate(prob.demands):
        shares: dict[tuple[int, ...], float] = {}
        for k in range(split):
            p = dem.candidates[int(choice[d, k] - prob.col[d])]
            shares[p] = shares.get(p, 0.0) + 1.0 / split
        paths[dem.key] = sorted(shares.items())
    util = load / prob.cap
    return Plan(paths, {int(lk): float(v) for lk, v in zip(prob.links, load - prob.bg,
                                                          strict=True)},
                float(util.max()) if len(util) else 0.0, solver, moves)


def plan_reference(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                   background: Mapping[int, float] | None = None, integral: bool = False,
                   split: int = 1, time_limit_s: float = 60.0) -> Plan:
    """The optimum ``lambda`` by HiGHS: the LP (``integral=False``: each demand spread freely
    over its candidates) or the MILP (each of ``split`` equal parts of a demand on one
    candidate). Variables: one share per candidate, then ``lambda``; constraints: shares of a
    demand sum to 1 and every link's load is at most ``lambda x capacity``.

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> plan_reference(d, {0: 400, 1: 400}).max_utilization
    0.75
    >>> round(plan_reference([Demand("a", 600, ((0,), (1,)))], {0: 400, 1: 400},
    ...                      integral=True).max_utilization, 6)
    1.5
    """
    prob = _Problem(demands, capacity, background)
    n_cols = int(prob.n_cand.sum())
    n_d = len(prob.demands)
    # x (candidate shares) then lambda; minimise lambda
    c = np.zeros(n_cols + 1)
    c[-1] = 1.0
    rate_of_col = np.repeat(prob.rate, prob.n_cand)
    # link rows: sum_c rate_c x_c - lambda cap_l <= -bg_l
    a_link = sp.hstack([prob.inc @ sp.diags(rate_of_col), sp.csr_matrix(-prob.cap[:, None])])
    demand_of_col = np.repeat(np.arange(n_d), prob.n_cand)
    a_dem = sp.hstack([sp.csr_matrix((np.ones(n_cols), (demand_of_col, np.arange(n_cols))),
                                     shape=(n_d, n_cols)), sp.csr_matrix((n_d, 1))])
    if not integral:
        res = linprog(c, A_ub=a_link.tocsr(), b_ub=-prob.bg, A_eq=a_dem.tocsr(),
                      b_eq=np.ones(n_d), bounds=[(0, None)] * (n_cols + 1), method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP reference failed: {res.message}")
        x = res.x[:-1]
        solver = "lp"
    else:
        # shares in units of 1/split: integer counts summing to split
        cons = [LinearConstraint(a_link.tocsr() @ sp.diags(np.r_[np.full(n_cols, 1 / split),
                                                                   1.0]),
                                 -np.inf, -prob.bg),
                LinearConstraint(a_dem.tocsr(), split, split)]
        integrality = np.r_[np.ones(n_cols), 0]
        res = milp(c, constraints=cons, integrality=integrality,
                   bounds=Bounds(np.zeros(n_cols + 1), np.r_[np.full(n_cols, split), np.inf]),
                   options={"time_limit": time_limit_s, "disp": False})
        if res.x is None:
            raise RuntimeError(f"MILP reference failed: {res.message}")
        x = np.round(res.x[:-1]) / split
        solver = "milp"
    load = prob.bg + prob.inc @ (rate_of_col * x)
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for d, dem in enumerate(prob.demands):
        shares = x[prob.col[d]: prob.col[d] + prob.n_cand[d]]
        paths[dem.key] = [(p, float(s)) for p, s in zip(dem.candidates, shares, strict=True)
                          if s > 1e-9]
    util = load / prob.cap
    return Plan(paths, {int(lk): float(v) for lk, v in zip(prob.links, load - prob.bg,
                                                          strict=True)},
                float(util.max()), solver)


def gap(heuristic: Plan, reference: Plan) -> float:
    """Relative excess of the heuristic's ``lambda`` over the reference's.

    >>> gap(Plan({}, {}, 1.05), Plan({}, {}, 1.0))
    0.05
    """
    return round((heuristic.max_utilization - reference.max_utilization)
                 / max(reference.max_utilization, 1e-12), 12)
