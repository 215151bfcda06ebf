"""``ideal``: every flow split evenly over all its equal-cost paths, as a fluid.

Each switch divides the flow equally among its ECMP group (perfect per-packet spraying with a
receiver that reorders for free). On a symmetric Clos this is the throughput bound that any
load balancer can reach for permutation and uniform traffic; with asymmetric capacities
(uneven oversubscription, failures) it is "even spraying", not the multipath LP optimum.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.balancing.base import (
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    assemble,
    register_policy,
)
from fabricpilot.topology.paths import intra_host, path_delay_ns, split_fractions, walk_paths


class Ideal:
    """Fluid spraying over every equal-cost path."""

    name = "ideal"

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self._cache: dict[tuple[int, int], tuple[NDArray[np.int32], NDArray[np.float64]]] = {}

    def _split(self, src_sw: int, dst_slot: int) -> tuple[NDArray[np.int32], NDArray]:
        key = (src_sw, dst_slot)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = split_fractions(self.ctx.topology, src_sw, dst_slot)
        return hit

    def weights(self, batch: TransferBatch) -> sp.csr_matrix:
        """One row per transfer: NIC links at 1, fabric links at their spraying share."""
        ct = self.ctx.topology
        n = len(batch)
        nv = intra_host(ct, batch.src, batch.dst)
        first = np.where(nv, ct.gpu_nv_up[batch.src], ct.gpu_up[batch.src])
        last = np.where(nv, ct.gpu_nv_down[batch.dst], ct.gpu_down[batch.dst])
        rows = [np.arange(n), np.arange(n)]
        cols = [first, last]
        data = [np.ones(n), np.ones(n)]
        fabric = np.flatnonzero(~nv)
        if len(fabric):
            src_sw = ct.gpu_leaf[batch.src[fabric]].astype(np.int64)
            dst_slot = ct.leaf_slot[ct.gpu_leaf[batch.dst[fabric]]].astype(np.int64)
            pairs, inv = np.unique(np.stack([src_sw, dst_slot], 1), axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            splits = [self._split(int(a), int(b)) for a, b in pairs]
            lengths = np.array([len(s[0]) for s in splits], np.int64)
            offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            all_links = np.concatenate([s[0] for s in splits] + [np.empty(0, np.int32)])
            all_frac = np.concatenate([s[1] for s in splits] + [np.empty(0)])
            per_row = lengths[inv]
            total = int(per_row.sum())
            row_start = np.repeat(np.cumsum(per_row) - per_row, per_row)
            pos = np.arange(total) - row_start + np.repeat(offsets[inv], per_row)
            rows.append(np.repeat(fabric, per_row))
            cols.append(all_links[pos])
            data.append(all_frac[pos])
        return sp.csr_matrix(
            (np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))),
            shape=(n, ct.n_links),
        )

    def route(self, batch: TransferBatch) -> RoutedBatch:
        ct = self.ctx.topology
        rep = walk_paths(ct, batch.src, batch.dst, lambda s, sw, r: np.zeros(len(r), np.int64))
        delay = path_delay_ns(ct, rep, self.ctx.switch_latency_ns)
        return assemble(batch, self.weights(batch), delay, ct.n_links)


register_policy("ideal")(Ideal)
