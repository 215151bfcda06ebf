"""``ideal``: every flow split evenly over all its equal-cost paths, as a fluid.

Each switch divides the flow equally among its ECMP group (perfect per-packet spraying with a
receiver that reorders for free). On a symmetric Clos this is the throughput bound that any
load balancer can reach for permutation and uniform traffic; with asymmetric capacities
(uneven oversubscription, failures) it is "even spraying", not the multipath LP optimum.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.balancing.base import (
    MemberRoutes,
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    assemble,
    entity_of,
    register_policy,
    stream_index,
)
from fabricpilot.topology.compiled import CompiledTopology
from fabricpilot.topology.paths import (
    intra_host,
    max_path_links,
    path_delay_ns,
    split_fractions,
    symmetric_link_groups,
    walk_paths,
)


class Ideal:
    """Fluid spraying over every equal-cost path.

    Links that carry identical load under spraying (the uplinks of a leaf, the spine links
    into a leaf, ...) are merged into one rate-model column (``column_of_link``), which keeps
    the rows short on large fabrics without changing any rate (see
    :func:`~fabricpilot.topology.paths.symmetric_link_groups`).
    """

    name = "ideal"
    static = True
    instant_reroute = True  # the bound: it sprays over whatever links are up, at once
    # a stream's paths that die leave it, its live paths take their share (the fault
    # engine's rerouting: see FaultsMixin._spread_off)
    sprays = True

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        # links interchangeable under spraying share a column, unless faults may break the
        # symmetry (then one column per link)
        self.column_of_link = (np.arange(ctx.topology.n_links, dtype=np.int32) if ctx.faults
                               else symmetric_link_groups(ctx.topology))
        self._cache: dict[tuple[int, int], tuple[NDArray[np.int32], NDArray[np.float64]]] = {}
        self._paths_cache: dict[tuple[int, int], NDArray[np.int32]] = {}

    def set_topology(self, ct: CompiledTopology) -> None:
        """Spray over the ECMP groups of ``ct`` from now on (links went down or up)."""
        self.ctx = replace(self.ctx, topology=ct)
        self._cache.clear()
        self._paths_cache.clear()

    def _split(self, src_sw: int, dst_slot: int) -> tuple[NDArray[np.int32], NDArray]:
        """Columns (not links) between two leaves and the flow's summed share on each."""
        key = (src_sw, dst_slot)
        hit = self._cache.get(key)
        if hit is None:
            links, frac = split_fractions(self.ctx.topology, src_sw, dst_slot)
            cols, inv = np.unique(self.column_of_link[links], return_inverse=True)
            hit = self._cache[key] = (cols.astype(np.int32),
                                      np.bincount(inv.reshape(-1), weights=frac))
        return hit

    def weights(self, batch: TransferBatch) -> sp.csr_matrix:
        """One row per transfer over rate-model columns: NIC links at 1, fabric columns at the
        flow's spraying share."""
        ct = self.ctx.topology
        col = self.column_of_link
        n_cols = int(col.max()) + 1
        n = len(batch)
        nv = intra_host(ct, batch.src, batch.dst)
        first = np.where(nv, ct.gpu_nv_up[batch.src], ct.gpu_up[batch.src])
        last = np.where(nv, ct.gpu_nv_down[batch.dst], ct.gpu_down[batch.dst])
        rows = [np.arange(n), np.arange(n)]
        cols = [col[first], col[last]]
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
            shape=(n, n_cols),
        )

    def route(self, batch: TransferBatch) -> RoutedBatch:
        ct = self.ctx.topology
        rep = walk_paths(ct, batch.src, batch.dst, lambda s, sw, r: np.zeros(len(r), np.int64))
        delay = path_delay_ns(ct, rep, self.ctx.switch_latency_ns)
        routed = assemble(batch, self.weights(batch), delay)
        if not self.ctx.member_routes:
            return routed
        entity, _ = entity_of(batch.group)
        return replace(routed, routes=self.spray_routes(batch, entity))

    def _switch_paths(self, src_sw: int, dst_slot: int) -> NDArray[np.int32]:
        """Every equal-cost switch-level path between two leaves, ``[paths, hops]``."""
        key = (src_sw, dst_slot)
        hit = self._paths_cache.get(key)
        if hit is None:
            ct = self.ctx.topology
            found: list[list[int]] = []

            def dfs(sw: int, prefix: list[int]) -> None:
                if ct.hop_distance[sw, dst_slot] == 0:
                    found.append(prefix)
                    return
                for link in ct.nh_link[sw, dst_slot, : ct.nh_count[sw, dst_slot]].tolist():
                    dfs(int(ct.switch_of_node[ct.link_dst[link]]), [*prefix, link])

            dfs(src_sw, [])
            width = max((len(p) for p in found), default=0)
            hit = np.full((len(found), width), -1, np.int32)
            for i, p in enumerate(found):
                hit[i, : len(p)] = p
            self._paths_cache[key] = hit
        return hit

    def spray_routes(self, batch: TransferBatch, entity: NDArray[np.int64]) -> MemberRoutes:
        """Each transfer as one stream (one QP) spread evenly over all its equal-cost
        paths."""
        ct = self.ctx.topology
        width = max_path_links(ct)
        stream = stream_index(entity)
        rows, streams, shares, paths = [], [], [], []
        nv = intra_host(ct, batch.src, batch.dst)
        for i in range(len(batch)):
            s, d = int(batch.src[i]), int(batch.dst[i])
            if nv[i]:
                p = np.full((1, width), -1, np.int32)
                p[0, :2] = (ct.gpu_nv_up[s], ct.gpu_nv_down[d])
            else:
                sw = self._switch_paths(int(ct.gpu_leaf[s]), int(ct.leaf_slot[ct.gpu_leaf[d]]))
                k = max(len(sw), 1)
                p = np.full((k, width), -1, np.int32)
                p[:, 0] = ct.gpu_up[s]
                hops = sw.shape[1] if len(sw) else 0
                if hops:
                    p[:, 1 : 1 + hops] = sw
                p[:, 1 + hops] = ct.gpu_down[d]
            rows.append(np.full(len(p), entity[i]))
            streams.append(np.full(len(p), stream[i]))
            shares.append(np.full(len(p), 1.0 / len(p)))
            paths.append(p)
        return MemberRoutes(np.concatenate(rows), np.concatenate(streams),
                            np.concatenate(shares), np.concatenate(paths), sprayed=True)


register_policy("ideal")(Ideal)
