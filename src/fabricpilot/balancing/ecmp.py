"""``ecmp``: per-flow hashing of the RoCEv2 5-tuple at every switch.

Each connection is split over ``qps_per_connection`` queue pairs; each QP has its own UDP
source port (when ``source_port_entropy`` is on) and so its own hash. Every switch on the way
picks ``ecmp_hash(5-tuple, seed) % group_size`` among its equal-cost next hops, exactly as an
ASIC does, so the choice can be reproduced outside the data plane.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fabricpilot.balancing.base import (
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    assemble,
    paths_to_weights,
    register_policy,
    split_qps,
)
from fabricpilot.net.hashing import gpu_ip, qp_source_port, switch_hash
from fabricpilot.topology.paths import path_delay_ns, walk_paths


def ecmp_paths(
    ctx: PolicyContext, batch: TransferBatch, qp: NDArray[np.int64]
) -> NDArray[np.int32]:
    """The path (padded link ids) ECMP gives each row of ``batch`` (one row per QP)."""
    ct = ctx.topology
    src_ip, dst_ip = gpu_ip(batch.src), gpu_ip(batch.dst)
    sport = qp_source_port(batch.job, batch.src, batch.dst, qp,
                           entropy=ctx.ecmp.source_port_entropy)

    def choose(step: int, switch: NDArray[np.int32], rows: NDArray[np.int64]) -> NDArray:
        return switch_hash(src_ip[rows], dst_ip[rows], sport[rows], switch, ctx.seed,
                           ctx.ecmp.per_switch_seed)

    return walk_paths(ct, batch.src, batch.dst, choose)


class Ecmp:
    """Static per-flow (per-QP) ECMP hashing."""

    name = "ecmp"
    static = True
    column_of_link = None

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def route(self, batch: TransferBatch) -> RoutedBatch:
        sub, qp = split_qps(batch, self.ctx.ecmp.qps_per_connection)
        paths = ecmp_paths(self.ctx, sub, qp)
        ct = self.ctx.topology
        delay = path_delay_ns(ct, paths, self.ctx.switch_latency_ns)
        return assemble(sub, paths_to_weights(paths, ct.n_links), delay, paths)


register_policy("ecmp")(Ecmp)
