"""``explicit``: flows follow paths given from outside (a controller's installed paths, or a
test's); pairs without one fall back to ECMP.

Paths are link-id sequences from the source GPU to the destination GPU. Any sequence of
adjacent links is accepted, including ones ECMP would never choose (detours, loops across
tiers), which is how a misconfiguration or a bad reroute is reproduced.
"""

from __future__ import annotations

import itertools

import numpy as np

from fabricpilot.balancing.base import (
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    assemble,
    paths_to_weights,
    split_qps,
)
from fabricpilot.balancing.ecmp import ecmp_paths
from fabricpilot.errors import TopologyError
from fabricpilot.topology.paths import max_path_links, path_delay_ns


class ExplicitPaths:
    """Route (src, dst) pairs on given link paths; ECMP for the rest."""

    name = "explicit"
    column_of_link = None
    static = True

    def __init__(self, ctx: PolicyContext, paths: dict[tuple[int, int], list[int]]) -> None:
        ct = ctx.topology
        self.ctx = ctx
        self.paths: dict[tuple[int, int], list[int]] = {}
        for (src, dst), links in paths.items():
            if not links:
                raise TopologyError(f"empty path for gpu{src} -> gpu{dst}")
            if ct.link_src[links[0]] != src or ct.link_dst[links[-1]] != dst:
                raise TopologyError(f"path for gpu{src} -> gpu{dst} does not join them")
            for a, b in itertools.pairwise(links):
                if ct.link_dst[a] != ct.link_src[b]:
                    raise TopologyError(f"path for gpu{src} -> gpu{dst}: "
                                        f"{ct.link_name(a)} does not lead to {ct.link_name(b)}")
            self.paths[(src, dst)] = list(links)
        self.width = max([max_path_links(ct), *(len(p) for p in self.paths.values())])

    def route(self, batch: TransferBatch) -> RoutedBatch:
        ct = self.ctx.topology
        sub, qp = split_qps(batch, self.ctx.ecmp.qps_per_connection)
        out = np.full((len(sub), self.width), -1, np.int32)
        default = ecmp_paths(self.ctx, sub, qp)
        out[:, : default.shape[1]] = default
        for i, (s, d) in enumerate(zip(sub.src.tolist(), sub.dst.tolist(), strict=True)):
            path = self.paths.get((s, d))
            if path is not None:
                out[i] = -1
                out[i, : len(path)] = path
        delay = path_delay_ns(ct, out, self.ctx.switch_latency_ns)
        return assemble(sub, paths_to_weights(out, ct.n_links), delay, out)
