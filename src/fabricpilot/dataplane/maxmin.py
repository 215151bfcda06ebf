"""Max-min fair rates by progressive filling, vectorised over a sparse flow x link matrix.

Each row of ``weights`` is a flow; ``weights[f, l]`` is how many units of link ``l``'s capacity
one unit of the flow's rate uses. A plain flow on one path has weight 1 on each of its links; a
flow sprayed evenly over 4 paths has weight 1/4 on each spine link; a ring of ``m`` coupled
streams (one common rate) has weight ``c`` on a link that ``c`` of its streams cross.

Progressive filling (Bertsekas & Gallager, *Data Networks*, §6.5.2): raise every unfrozen
flow's rate by the same amount until some link (or a flow's own rate cap) saturates; freeze the
flows crossing it; repeat. Each round costs two sparse mat-vecs, and the number of rounds is the
number of distinct bottleneck levels, not the number of flows.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray


def max_min_rates(
    weights: sp.csr_matrix,
    capacity_gbps: NDArray[np.float64],
    rate_cap_gbps: NDArray[np.float64] | None = None,
    *,
    rel_tol: float = 1e-9,
) -> NDArray[np.float64]:
    """Max-min fair rate of every flow (row of ``weights``) under link capacities.

    ``rate_cap_gbps`` optionally caps individual flows (e.g. a rate limit); flows that cross
    no link and have no cap get ``inf``.

    The fill is incremental: all unfrozen flows share one rising ``level``; a round costs
    O(links) plus the non-zeros of the flows it freezes, so a solve costs O(nnz + rounds x
    links) instead of O(rounds x nnz).

    Two flows on one 100 Gb/s link get 50 each:

    >>> w = sp.csr_matrix(np.array([[1.0], [1.0]]))
    >>> max_min_rates(w, np.array([100.0])).tolist()
    [50.0, 50.0]

    The textbook case: links A (10) and B (4); flow 0 on A, flow 1 on A and B, flow 2 on B.
    B's fair share 2 freezes flows 1 and 2; flow 0 takes the rest of A:

    >>> w = sp.csr_matrix(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]))
    >>> max_min_rates(w, np.array([10.0, 4.0])).tolist()
    [8.0, 2.0, 2.0]
    """
    w = sp.csr_matrix(weights)
    n_flows, n_links = w.shape
    rates = np.zeros(n_flows)
    if n_flows == 0:
        return rates
    remaining = np.asarray(capacity_gbps, np.float64).copy()
    if remaining.shape != (n_links,):
        raise ValueError("capacity_gbps must have one entry per link (column of weights)")
    wt = w.T.tocsr()
    has_link = np.diff(w.indptr) > 0
    caps = (np.full(n_flows, np.inf) if rate_cap_gbps is None
            else np.asarray(rate_cap_gbps, np.float64))
    rates[~has_link] = caps[~has_link]
    frozen = ~has_link
    demand = np.asarray(wt @ has_link.astype(np.float64)).ravel()
    scale = np.maximum(demand, 1.0)  # residues below rel_tol * scale are rounding noise
    # flows with a finite cap, in order of their cap
    capped = np.flatnonzero(has_link & np.isfinite(caps))
    capped = capped[np.argsort(caps[capped], kind="stable")]
    next_cap = 0
    level = 0.0
    n_left = int(has_link.sum())
    while n_left > 0:
        live = np.flatnonzero(demand > rel_tol * scale)
        if len(live) == 0:
            raise ValueError("unfrozen flows remain but no link constrains them")
        share = np.maximum(remaining[live], 0.0) / demand[live]
        delta = float(share.min())
        while next_cap < len(capped) and frozen[capped[next_cap]]:
            next_cap += 1
        if next_cap < len(capped):
            delta = min(delta, float(caps[capped[next_cap]]) - level)
        if not np.isfinite(delta):
            raise ValueError("a flow crosses links of infinite capacity and has no rate cap")
        delta = max(delta, 0.0)
        level += delta
        remaining[live] -= demand[live] * delta
        sat_links = live[share <= delta * (1.0 + rel_tol) + 1e-12]
        # flows crossing a saturated link, plus flows that reached their cap
        starts, stops = wt.indptr[sat_links], wt.indptr[sat_links + 1]
        cand = wt.indices[_ranges(starts, stops)]
        while next_cap < len(capped) and caps[capped[next_cap]] <= level * (1.0 + rel_tol):
            cand = np.append(cand, capped[next_cap])
            next_cap += 1
        new = np.sort(cand[~frozen[cand]])
        if len(new) > 1:
            new = new[np.concatenate(([True], new[1:] != new[:-1]))]
        frozen[new] = True
        rates[new] = level
        n_left -= len(new)
        # withdraw the frozen flows' demand from their links
        idx = _ranges(w.indptr[new], w.indptr[new + 1])
        demand -= np.bincount(w.indices[idx], weights=w.data[idx], minlength=n_links)
        demand[sat_links] = 0.0
    return rates


def _ranges(starts: NDArray[np.integer], stops: NDArray[np.integer]) -> NDArray[np.int64]:
    """Concatenation of ``arange(a, b)`` for every pair, vectorised.

    >>> _ranges(np.array([0, 5]), np.array([2, 8])).tolist()
    [0, 1, 5, 6, 7]
    """
    lengths = (stops - starts).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(starts.astype(np.int64) - np.cumsum(lengths) + lengths, lengths)
    return np.arange(total, dtype=np.int64) + offsets


def alone_rate_gbps(weights: sp.csr_matrix, capacity_gbps: NDArray[np.float64]) -> NDArray:
    """Rate each flow would get alone on an empty fabric: ``min over its links of c_l / w_l``.

    >>> w = sp.csr_matrix(np.array([[1.0, 0.5], [0.0, 2.0]]))
    >>> alone_rate_gbps(w, np.array([100.0, 100.0])).tolist()
    [100.0, 50.0]
    """
    w = sp.csr_matrix(weights)
    out = np.full(w.shape[0], np.inf)
    nonempty = np.diff(w.indptr) > 0
    if not nonempty.any():
        return out
    ratio = np.asarray(capacity_gbps, np.float64)[w.indices] / w.data
    starts = w.indptr[:-1][nonempty]
    out[nonempty] = np.minimum.reduceat(ratio, starts)
    return out
