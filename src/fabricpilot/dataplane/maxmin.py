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
    wt = w.T.tocsr()
    remaining = np.asarray(capacity_gbps, np.float64).copy()
    if remaining.shape != (n_links,):
        raise ValueError("capacity_gbps must have one entry per link (column of weights)")
    has_link = np.diff(w.indptr) > 0
    caps = (np.full(n_flows, np.inf) if rate_cap_gbps is None
            else np.asarray(rate_cap_gbps, np.float64).copy())
    unfrozen = has_link.copy()
    rates[~has_link] = caps[~has_link]
    while unfrozen.any():
        demand = wt @ unfrozen.astype(np.float64)
        loaded = demand > 0
        share = np.full(n_links, np.inf)
        share[loaded] = np.maximum(remaining[loaded], 0.0) / demand[loaded]
        cap_room = np.where(unfrozen, caps - rates, np.inf)
        delta = min(float(share.min()), float(cap_room.min()))
        if not np.isfinite(delta):
            raise ValueError("a flow crosses links of infinite capacity and has no rate cap")
        rates[unfrozen] += delta
        remaining -= demand * delta
        limit = delta * (1.0 + rel_tol) + 1e-12
        saturated = loaded & (share <= limit)
        frozen_now = (w @ saturated.astype(np.float64)) > 0
        frozen_now |= unfrozen & (cap_room <= limit)
        unfrozen &= ~frozen_now
    return rates


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
