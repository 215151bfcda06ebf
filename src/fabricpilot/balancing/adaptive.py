"""``adaptive``: switch-local adaptive routing (the way Spectrum-X / InfiniBand AR and
Broadcom DLB pick a port).

At every switch with several equal-cost next hops, a new flow (each QP of a connection) takes
the eligible port that is least loaded *as that switch sees it*: a port's load is its egress
utilisation (the traffic already on the link plus the flows this switch has just placed on
it) plus its queue (a queue of :data:`QUEUE_NORM_NS` at line rate counts as one fully used
link). Beyond its own ports a switch also knows the load of the links a choice commits the
flow to until the next switch that has a choice (on a leaf-spine: the spine's downlink to
the destination leaf), as CONGA-style path feedback carried back in packets gives a leaf;
the cost of a choice is its most loaded link. Nothing else global is consulted, but the
choice can be steered from outside: a *congestion table* of weights per
link (``set_congestion_table``; 1 = neutral, larger = preferred, 0 = not eligible) divides
each port's load, which is how a controller's hints reach the switches. Ties go to the port
the ECMP hash would pick, so an idle fabric is routed exactly like ECMP.

The choice is made when a flow starts and kept for its life, so a flow never changes path
and nothing is reordered (flowlet and drain-safe switching change paths mid-flow).
"""

from __future__ import annotations

from dataclasses import replace

import numba
import numpy as np
from numpy.typing import NDArray

from fabricpilot.balancing.base import (
    ActiveMembers,
    LinkTelemetry,
    Moves,
    PolicyContext,
    RoutedBatch,
    TelemetryFn,
    TransferBatch,
    assemble,
    entity_of,
    paths_to_weights,
    register_policy,
    split_qps,
)
from fabricpilot.errors import FabricpilotError
from fabricpilot.net.hashing import gpu_ip, qp_source_port, switch_hash
from fabricpilot.topology.compiled import CompiledTopology
from fabricpilot.topology.paths import max_path_links, pad_paths, path_delay_ns, walk_paths

QUEUE_NORM_NS = 10_000.0
MAX_MOVES_PER_ROUND = 256


@numba.njit(cache=True)
def least_loaded(
    segments: NDArray[np.int32],
    group: NDArray[np.int64],
    count: NDArray[np.int64],
    first: NDArray[np.int64],
    load: NDArray[np.float64],
    weight: NDArray[np.float64],
    demand: NDArray[np.float64],
) -> NDArray[np.int64]:
    """For each row ``i`` in order, the index ``j < count[i]`` of its cheapest eligible
    choice: choice ``j`` loads the links ``segments[group[i], j, :]`` (-1 padded), its cost
    is the largest ``load / weight`` among them, and a link of weight 0 makes it ineligible.
    Ties go to the first such choice counting from ``first[i]``. The chosen links' loads grow
    by ``demand[i]`` before the next row chooses (``load`` is updated in place). A row with
    no eligible choice takes ``first[i]``.

    >>> seg = np.array([[[0], [1]]], np.int32)
    >>> least_loaded(seg, np.zeros(3, np.int64), np.array([2, 2, 2]), np.array([0, 0, 1]),
    ...              np.array([0.5, 0.0]), np.ones(2), np.full(3, 1.0)).tolist()
    [1, 0, 1]
    """
    n = group.shape[0]
    out = np.empty(n, np.int64)
    for i in range(n):
        g = group[i]
        k = count[i]
        best = -1
        best_cost = np.inf
        for j in range(k):
            jj = (first[i] + j) % k
            cost = 0.0
            for d in range(segments.shape[2]):
                link = segments[g, jj, d]
                if link < 0:
                    break
                w = weight[link]
                c = load[link] / w if w > 0.0 else np.inf
                if c > cost:
                    cost = c
            if cost < best_cost - 1e-12:
                best_cost = cost
                best = jj
        if best < 0:
            best = first[i] % k
        out[i] = best
        for d in range(segments.shape[2]):
            link = segments[g, best, d]
            if link < 0:
                break
            load[link] += demand[i]
    return out


def onward_segments(ct: CompiledTopology, switch: NDArray[np.int32],
                    tgt: NDArray[np.int64]) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """For each (switch, target leaf slot): its equal-cost next-hop links, each followed by
    the links the path must take after it until the next switch with a choice (or the
    destination leaf). Returns ``[rows, max group, depth]`` link ids (-1 padded) and the
    group sizes.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> seg, n = onward_segments(ct, np.array([ct.gpu_leaf[0]], np.int32),
    ...                          np.array([ct.leaf_slot[ct.gpu_leaf[3]]]))
    >>> [[ct.link_name(int(x)) for x in c if x >= 0] for c in seg[0, : n[0]]]
    [['leaf0->spine0', 'spine0->leaf1'], ['leaf0->spine1', 'spine1->leaf1']]
    """
    count = ct.nh_count[switch, tgt].astype(np.int64)
    first = ct.nh_link[switch, tgt].astype(np.int32)            # [rows, max group]
    depth = max_path_links(ct)
    seg = np.full((*first.shape, depth), -1, np.int32)
    seg[..., 0] = np.where(np.arange(first.shape[1])[None, :] < count[:, None], first, -1)
    link = seg[..., 0]
    tgt2 = np.broadcast_to(tgt[:, None], link.shape)
    for d in range(1, depth):
        ok = link >= 0
        nxt = np.where(ok, ct.switch_of_node[ct.link_dst[np.maximum(link, 0)]], -1)
        ok &= nxt >= 0
        safe = np.maximum(nxt, 0)
        ok &= (ct.hop_distance[safe, tgt2] > 0) & (ct.nh_count[safe, tgt2] == 1)
        link = np.where(ok, ct.nh_link[safe, tgt2, 0], -1).astype(np.int32)
        if not ok.any():
            break
        seg[..., d] = link
    return seg, count


class Adaptive:
    """Least-loaded next hop per flow at every switch, from local port state and an optional
    congestion table (see the module docstring)."""

    name = "adaptive"
    static = False
    column_of_link = None

    table_version = 0  # bumped by every pushed congestion table

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        ct = ctx.topology
        p = ctx.adaptive
        self.rebalance_interval_ns = float(p.rebalance_interval_ns)
        self.drain_safe = p.drain_safe
        self.hysteresis = p.hysteresis
        self._telemetry: TelemetryFn | None = None
        self.congestion_table = np.ones(ct.n_links)
        # which GPU a host link belongs to (-1: not a host link), to read a path's ends
        self._gpu_of_up = np.full(ct.n_links, -1, np.int64)
        self._gpu_of_up[ct.gpu_up] = np.arange(len(ct.gpu_up))
        self._gpu_of_down = np.full(ct.n_links, -1, np.int64)
        self._gpu_of_down[ct.gpu_down] = np.arange(len(ct.gpu_down))

    def bind(self, telemetry: TelemetryFn) -> None:
        self._telemetry = telemetry

    def set_congestion_table(self, weights: NDArray[np.float64]) -> None:
        """Weights per link id pushed from outside: a port's load is divided by its weight
        (1 neutral, 0 = never chosen while another port is eligible)."""
        w = np.asarray(weights, np.float64)
        if w.shape != (self.ctx.topology.n_links,):
            raise FabricpilotError(
                f"congestion table: expected {self.ctx.topology.n_links} link weights, "
                f"got shape {w.shape}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise FabricpilotError("congestion table: weights must be finite and >= 0")
        self.congestion_table = w.copy()
        self.table_version += 1

    def port_load(self, tel: LinkTelemetry) -> NDArray[np.float64]:
        """Each port's load as its switch sees it, in links: the larger of its utilisation and
        the demand of the flows on it (over-committed: a standing queue), plus its queue."""
        rate = self.ctx.topology.rate_gbps
        drain_ns = tel.queue_bytes * 8.0 / rate
        return np.maximum(tel.load_gbps, tel.demand_gbps) / rate + drain_ns / QUEUE_NORM_NS

    def _load_now(self) -> NDArray[np.float64]:
        if self._telemetry is None:
            return np.zeros(self.ctx.topology.n_links)
        return self.port_load(self._telemetry()).copy()

    def _walk(self, src: NDArray[np.int64], dst: NDArray[np.int64], sport: NDArray[np.int64],
              load: NDArray[np.float64], demand_gbps: NDArray[np.float64] | None = None,
              ) -> NDArray[np.int32]:
        """Paths for (src, dst) pairs chosen hop by hop, least loaded first (``load`` in links,
        updated as flows are placed with ``demand_gbps`` each, by default their NIC's rate);
        ties go to the ECMP hash of the 5-tuple."""
        ctx = self.ctx
        ct = ctx.topology
        src_ip, dst_ip = gpu_ip(src), gpu_ip(dst)
        nic_gbps = ct.rate_gbps[ct.gpu_up[src]] if demand_gbps is None else demand_gbps

        def choose(step: int, switch: NDArray[np.int32], rows: NDArray[np.int64]) -> NDArray:
            tgt = ct.leaf_slot[ct.gpu_leaf[dst[rows]]].astype(np.int64)
            count = ct.nh_count[switch, tgt].astype(np.int64)
            h = switch_hash(src_ip[rows], dst_ip[rows], sport[rows], switch, ctx.seed,
                            ctx.ecmp.per_switch_seed)
            pick = (h.astype(np.uint64) % np.maximum(count, 1).astype(np.uint64)).astype(np.int64)
            m = np.flatnonzero(count > 1)
            if len(m):
                # the choices depend only on (switch, target): work on the distinct pairs
                slots = ct.nh_count.shape[1]
                pair, grp = np.unique(switch[m].astype(np.int64) * slots + tgt[m],
                                      return_inverse=True)
                seg, _ = onward_segments(ct, (pair // slots).astype(np.int32), pair % slots)
                grp = grp.reshape(-1)
                demand = nic_gbps[rows[m]] / ct.rate_gbps[seg[grp, 0, 0]]
                pick[m] = least_loaded(seg, grp, count[m], pick[m], load,
                                       self.congestion_table, demand)
            return pick

        return walk_paths(ct, src, dst, choose)

    def _qps(self, batch: TransferBatch) -> tuple[TransferBatch, NDArray[np.int64]]:
        """The batch split into QPs (``ecmp.qps_per_connection``) and each QP's UDP source
        port (the 5-tuple whose ECMP hash breaks ties)."""
        sub, qp = split_qps(batch, self.ctx.ecmp.qps_per_connection)
        return sub, qp_source_port(sub.job, sub.src, sub.dst, qp,
                                   entropy=self.ctx.ecmp.source_port_entropy)

    def repath(self, job: NDArray[np.int64], src: NDArray[np.int64], dst: NDArray[np.int64],
               stream: NDArray[np.int64], qp: NDArray[np.int64] | None = None
               ) -> NDArray[np.int32]:
        """Paths for streams whose path died (after the routing protocol converged): the
        least-loaded walk over the groups that remain, as a new flow would get (``qp``,
        a member's place among its stream's members, is unused: a stream here is one QP
        on one path)."""
        sport = qp_source_port(np.asarray(job, np.int64), np.asarray(src, np.int64),
                               np.asarray(dst, np.int64), np.asarray(stream, np.int64),
                               entropy=self.ctx.ecmp.source_port_entropy)
        return self._walk(np.asarray(src, np.int64), np.asarray(dst, np.int64), sport,
                          self._load_now())

    def _routed(self, batch: TransferBatch, paths: NDArray[np.int32],
                **extra: object) -> RoutedBatch:
        """Rate-model rows for ``batch`` on one path per transfer."""
        ct = self.ctx.topology
        delay = path_delay_ns(ct, paths, self.ctx.switch_latency_ns)
        routed = assemble(batch, paths_to_weights(paths, ct.n_links), delay, paths)
        return replace(routed, **extra) if extra else routed  # type: ignore[arg-type]

    def route(self, batch: TransferBatch) -> RoutedBatch:
        sub, sport = self._qps(batch)
        return self._routed(sub, self._walk(sub.src, sub.dst, sport, self._load_now()))

    def rebalance(self, members: ActiveMembers) -> Moves:
        """Re-place the streams whose path crosses an over-committed link (demand above one
        link): each takes the least-loaded path given everything else (as a new flow would)
        and moves only if that path is lighter than its old one by ``hysteresis``. Moved
        streams wait for their old path to drain (``drain_safe``) unless told otherwise.

        This is local: a leaf cannot move the streams of other leaves, so a collision whose
        every alternative is taken stays until flows end (a global planner can do better).
        """
        ct = self.ctx.topology
        path = members.path
        valid = path >= 0
        safe = np.where(valid, path, 0)
        empty = Moves(np.zeros(0, np.int64), np.zeros((0, path.shape[1]), np.int32),
                      self.drain_safe)
        load = self._load_now()
        w = self.congestion_table
        link_cost = np.where(w > 0, load / np.maximum(w, 1e-300), np.inf)
        hot = link_cost > 1.0 + 1e-6
        # nothing over-committed, or no link light enough to be worth a move: nothing to do
        if not hot.any() or link_cost.min() > link_cost[hot].max() - self.hysteresis:
            return empty
        cost = np.where(valid, link_cost[safe], 0.0).max(axis=1, initial=0.0)
        src = self._gpu_of_up[safe[:, 0]]
        last = np.maximum(valid.sum(axis=1) - 1, 0)
        dst = self._gpu_of_down[safe[np.arange(len(path)), last]]
        cand = np.flatnonzero(~members.hold & (members.share >= 1 - 1e-9) & (src >= 0)
                              & (dst >= 0) & (cost > 1.0 + 1e-6))
        if not len(cand):
            return empty
        # the worst first, and a bounded number per round (each move costs a rate update)
        cand = cand[np.argsort(-cost[cand], kind="stable")[: MAX_MOVES_PER_ROUND]]
        # a stream's demand: its NIC's rate shared among the streams leaving that NIC
        per_nic = np.bincount(src[src >= 0], minlength=len(ct.gpu_up))
        own = ct.rate_gbps[ct.gpu_up[src[cand]]] / np.maximum(per_nic[src[cand]], 1)
        old = path[cand]
        _add_load(load, old, -own, ct.rate_gbps)
        new = self._walk(src[cand], dst[cand], cand.astype(np.int64), load,
                         demand_gbps=own)
        nv = new >= 0
        link_cost = np.where(w > 0, load / np.maximum(w, 1e-300), np.inf)
        new_cost = np.where(nv, link_cost[np.where(nv, new, 0)], 0.0).max(axis=1)
        width = max(new.shape[1], old.shape[1])
        changed = (pad_paths(new, width) != pad_paths(old, width)).any(axis=1)
        move = changed & (new_cost < cost[cand] - self.hysteresis)
        if not move.any():
            return empty
        return Moves(cand[move], new[move], self.drain_safe)


def _add_load(load: NDArray[np.float64], paths: NDArray[np.int32], gbps: NDArray[np.float64],
              rate_gbps: NDArray[np.float64]) -> None:
    """Add ``gbps`` (per path; negative to remove) to the load, in links, of each path's links."""
    for h in range(paths.shape[1]):
        on = paths[:, h] >= 0
        np.add.at(load, paths[on, h], gbps[on] / rate_gbps[paths[on, h]])


register_policy("adaptive")(Adaptive)


def reserved_links(ct: CompiledTopology, spines: int, setting: str) -> NDArray[np.bool_]:
    """Per link, whether it touches one of the first ``spines`` top-tier switches (in the
    topology's switch order): the links kept for mice. ``setting`` names the scenario field
    in the error raised when that would leave the elephants no top-tier switch."""
    top = int(ct.switch_tier.max()) if len(ct.switch_tier) else 0
    n_top = int((ct.switch_tier == top).sum())
    if n_top > 1 and spines >= n_top:
        raise FabricpilotError(
            f"{setting}: {spines} of the fabric's {n_top} top-tier switches would leave none "
            f"for the elephants (at most {n_top - 1})")
    chosen = np.flatnonzero(ct.switch_tier == top)[:spines]
    node_is_reserved = np.zeros(len(ct.node_names), bool)
    node_is_reserved[ct.switch_node[chosen]] = True
    return node_is_reserved[ct.link_src] | node_is_reserved[ct.link_dst]


def split_tables(table: NDArray[np.float64], reserved: NDArray[np.bool_],
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A congestion table split for mice (only the ``reserved`` links) and for elephants
    (all but those): a link excluded from a table weighs 0.

    >>> m, e = split_tables(np.array([1.0, 0.5, 1.0]), np.array([True, False, False]))
    >>> m.tolist(), e.tolist()
    ([1.0, 0.0, 0.0], [0.0, 0.5, 1.0])
    """
    return np.where(reserved, table, 0.0), np.where(reserved, 0.0, table)


def walk_split(policy: Adaptive, batch: TransferBatch, sport: NDArray[np.int64],
               mouse: NDArray[np.bool_], reserved: NDArray[np.bool_]) -> NDArray[np.int32]:
    """``policy``'s switch-local adaptive paths for ``batch`` (source ports ``sport``): the
    ``mouse`` transfers among the ``reserved`` links only, the others among the rest (its
    pushed congestion table split for each, then put back)."""
    load = policy._load_now()
    paths = np.full((len(batch), max_path_links(policy.ctx.topology)), -1, np.int32)
    pushed = policy.congestion_table
    try:
        for sel, table in zip((mouse, ~mouse), split_tables(pushed, reserved), strict=True):
            idx = np.flatnonzero(sel)
            if len(idx):
                policy.congestion_table = table
                got = policy._walk(batch.src[idx], batch.dst[idx], sport[idx], load)
                paths[idx] = pad_paths(got, paths.shape[1])
    finally:
        policy.congestion_table = pushed
    return paths


def on_links(path: NDArray[np.int32], mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per path (link ids, -1 padded), whether it crosses a link of ``mask``.

    >>> on_links(np.array([[0, 2], [1, -1]], np.int32), np.array([False, False, True])).tolist()
    [True, False]
    """
    valid = path >= 0
    return (mask[np.where(valid, path, 0)] & valid).any(axis=1)


class AdaptiveSplit(Adaptive):
    """Adaptive routing with mice kept on reserved spines, off the elephants' paths.

    A transfer smaller than :attr:`mice_bytes` (by its declared size) is a mouse. The first
    :attr:`reserved_spines` switches of the top tier carry only mice: mice choose among them
    (least loaded), elephants among the others, so a mouse never queues behind an elephant
    inside the fabric; the host links stay shared. Elephants give up that share of the
    bisection. Under the fluid model, giving the mice a higher-priority class
    (``mice.traffic_class``) protects them on the host links too.
    """

    name = "adaptive-split"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        ct = ctx.topology
        self.mice_bytes = ctx.adaptive.mice_bytes
        self.reserved_spines = ctx.adaptive.reserved_spines
        if ctx.adaptive.mice_by not in ("size", "bytes_seen"):
            raise FabricpilotError(
                f"adaptive.mice_by: must be 'size' or 'bytes_seen' (got {ctx.adaptive.mice_by!r})")
        # bytes_seen: every flow starts as a mouse and is promoted once it has sent mice_bytes
        self.watches_bytes_sent = ctx.adaptive.mice_by == "bytes_seen"
        self.reserved_link = reserved_links(ct, self.reserved_spines, "adaptive.reserved_spines")

    def _tables(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Congestion tables for mice and for elephants (the pushed table, split)."""
        return split_tables(self.congestion_table, self.reserved_link)

    def route(self, batch: TransferBatch) -> RoutedBatch:
        sub, sport = self._qps(batch)
        mouse = (sub.size_bytes < self.mice_bytes) | self.watches_bytes_sent
        return self._routed(sub, walk_split(self, sub, sport, mouse, self.reserved_link))

    def rebalance(self, members: ActiveMembers) -> Moves:
        # elephants only (mice are short), and only among the elephants' spines
        pushed = self.congestion_table
        try:
            self.congestion_table = self._tables()[1]
            on_reserved = on_links(members.path, self.reserved_link)
            if self.watches_bytes_sent and members.sent_bytes is not None:
                grown = np.flatnonzero(on_reserved & ~members.hold
                                       & (members.sent_bytes >= self.mice_bytes)
                                       & (members.share >= 1 - 1e-9))
                if len(grown):
                    return self._promote(members, grown)
            mv = super().rebalance(ActiveMembers(members.row, members.path, members.share,
                                                 members.hold | on_reserved))
        finally:
            self.congestion_table = pushed
        return mv

    def _promote(self, members: ActiveMembers, idx: NDArray[np.int64]) -> Moves:
        """Move streams that have outgrown the mice class onto the elephants' spines."""
        p = members.path[idx]
        valid = p >= 0
        last = valid.sum(axis=1) - 1
        src = self._gpu_of_up[p[:, 0]]
        dst = self._gpu_of_down[p[np.arange(len(idx)), last]]
        ok = (src >= 0) & (dst >= 0)
        idx, src, dst = idx[ok], src[ok], dst[ok]
        new = self._walk(src, dst, idx.astype(np.int64), self._load_now())
        return Moves(idx, new, self.drain_safe)


register_policy("adaptive-split")(AdaptiveSplit)


class Flowlet(Adaptive):
    """Adaptive routing per flowlet: a connection changes path only after an idle gap.

    A connection (job, source, destination, QP) may take a new path only when it has been
    idle for at least :attr:`gap_ns` since its last byte; a flow that starts sooner
    continues on its connection's path. RDMA elephants seldom pause, so within one long
    transfer nothing moves; between the steps of a collective or the iterations of a job,
    connections do pause.

    A switch whose new path is faster than the old one by more than the gap lets the new
    flowlet's first packets arrive before the old one's last: ``(d_old - d_new - gap)`` of
    line-rate sending, in packets, counted as reorder events. A gap threshold above every path
    delay difference makes that impossible.
    """

    name = "flowlet"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.gap_ns = ctx.adaptive.flowlet_gap_ns
        self.rebalance_interval_ns = float("inf")  # paths change at flowlet boundaries only
        # connection -> [path (link ids), time its last byte was sent (inf: still sending)]
        self._conn: dict[tuple[int, int, int], tuple[NDArray[np.int32], float]] = {}
        self._routable_of: tuple[CompiledTopology, NDArray[np.bool_]] | None = None

    def _routable(self, ct: CompiledTopology) -> NDArray[np.bool_]:
        """Per link: whether a flowlet may go on using it (routing has not given it up: a
        switch link is in some ECMP group of ``ct``; links to and from GPUs always are). A
        flowlet whose path crosses a link routing gave up takes a new path however soon
        it starts: its old one leads nowhere."""
        if self._routable_of is None or self._routable_of[0] is not ct:
            ok = (ct.switch_of_node[ct.link_src] < 0) | (ct.switch_of_node[ct.link_dst] < 0)
            held = ct.nh_link[ct.nh_link >= 0]
            ok[held] = True
            self._routable_of = (ct, ok)
        return self._routable_of[1]

    def flows_done(self, job: NDArray[np.int64], src: NDArray[np.int64],
                   dst: NDArray[np.int64], end_ns: int) -> None:
        for key in zip(job.tolist(), src.tolist(), dst.tolist(), strict=True):
            hit = self._conn.get(key)
            if hit is not None:
                self._conn[key] = (hit[0], float(end_ns))

    def route(self, batch: TransferBatch) -> RoutedBatch:
        ctx = self.ctx
        ct = ctx.topology
        sub, sport = self._qps(batch)
        tel = self._telemetry() if self._telemetry is not None else None
        now = tel.now_ns if tel is not None else 0.0
        load = self.port_load(tel).copy() if tel is not None else np.zeros(ct.n_links)
        paths = self._walk(sub.src, sub.dst, sport, load)
        lat = ctx.switch_latency_ns
        new_delay = path_delay_ns(ct, paths, lat)
        events = np.zeros(len(sub), np.int64)
        line = ct.rate_gbps[ct.gpu_up[sub.src]]
        routable = self._routable(ct)
        for i, key in enumerate(zip(sub.job.tolist(), sub.src.tolist(), sub.dst.tolist(),
                                    strict=True)):
            hit = self._conn.get(key)
            if hit is not None:
                old, last_ns = hit
                gap = now - last_ns
                alive = bool(routable[old[old >= 0]].all())
                if gap < self.gap_ns and alive:
                    # too soon: the flowlet continues on its path (which may be longer or
                    # shorter than this batch's: through a core, or within a pod)
                    if len(old) > paths.shape[1]:
                        paths = np.pad(paths, ((0, 0), (0, len(old) - paths.shape[1])),
                                       constant_values=-1)
                    paths[i, :len(old)] = old
                    paths[i, len(old):] = -1
                elif alive and not np.array_equal(old, paths[i]):
                    # (a new path: the old flowlet's last packets may arrive after the new
                    # one's first; off a path routing gave up, none of them arrives)
                    d_old = float(path_delay_ns(ct, old[None, :], lat)[0])
                    ahead_ns = d_old - float(new_delay[i]) - gap
                    if ahead_ns > 0:
                        sent = ahead_ns * line[i] / 8.0
                        packets = -(-int(sub.size_bytes[i]) // 4096)
                        events[i] = min(packets, int(np.ceil(sent / 4096)))
            self._conn[key] = (paths[i].copy(), np.inf)
        entity, n_rows = entity_of(sub.group)
        per_row = np.zeros(n_rows, np.int64)
        np.add.at(per_row, entity, events)
        return self._routed(sub, paths, reorder_events=per_row)


register_policy("flowlet")(Flowlet)
