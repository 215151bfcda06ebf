"""``spray-ooo`` and ``spray``: per-packet spraying over every equal-cost path.

Every switch sends consecutive packets of a flow round-robin over its equal-cost next hops,
so a flow is spread evenly over all its paths (the load of :mod:`~fabricpilot.balancing.ideal`).
What that costs depends on the receiving NIC:

* ``spray-ooo``: a NIC that places packets out of order (direct data placement, as the NICs of
  spraying fabrics do) loses nothing: the same rates as ``ideal``; packets that arrive before
  earlier ones are still counted as reorder events.
* ``spray``: a standard RoCE NIC accepts packets only in order. A packet that arrives before
  its predecessor is dropped and NAKed; the sender goes back N and resends everything from the
  missing packet. When paths differ in delay by more than a packet time this repeats all the
  time: retransmissions eat the links and goodput collapses, the pathology the field warns
  about (with equal delays nothing is reordered and it behaves like ``spray-ooo``).

The cost is derived per pair of leaves from the delays of the paths between them
(:func:`go_back_n`, a packet-level calculation of a sprayed flow at its NIC's line rate, with
the NAK returning over the fastest path): the flow's wire bytes grow by the resent share and
its reorder events are counted. Queueing is not part of those delays in the flow-level model.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from fabricpilot.balancing.base import (
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    entity_of,
    register_policy,
)
from fabricpilot.balancing.ideal import Ideal
from fabricpilot.topology.compiled import CompiledTopology
from fabricpilot.topology.paths import intra_host

MTU_WIRE_BYTES = 4096 + 58 + 20  # payload + RoCEv2 headers + preamble/IFG


def go_back_n(delays_ns: list[float], packet_ns: float, nak_ns: float,
              useful: int = 2000) -> tuple[float, float]:
    """Sprayed flow, go-back-N receiver: packets leave every ``packet_ns`` on paths taken
    round-robin (one-way ``delays_ns``); a packet that arrives before the expected one is
    dropped and counted as a reorder event, and the first of them NAKs the expected packet
    (one NAK per loss episode), which reaches the sender ``nak_ns`` later; the sender then
    resends from it. Returns (goodput efficiency = packets delivered in order / packets sent,
    reorder events per delivered packet), measured over ``useful`` delivered packets.

    Equal delays, or a spread below one packet time, keep everything in order:

    >>> go_back_n([1000.0, 1000.0], 10.0, 1000.0)
    (1.0, 0.0)
    >>> go_back_n([1000.0, 1008.0], 10.0, 1000.0)
    (1.0, 0.0)

    Two paths 15 ns apart, a packet every 10 ns, NAKs back in 5 ns: packet 2 overtakes packet
    1 and is dropped, its NAK rewinds the sender to packet 1 (already delivered by then, so it
    is sent twice); packets 2 and 3 follow, then packet 4 overtakes 3 the same way. Four
    packets delivered cost eight sends and two reorder events:

    >>> go_back_n([0.0, 15.0], 10.0, 5.0, useful=4)
    (0.5, 0.5)
    """
    k = len(delays_ns)
    if k <= 1 or max(delays_ns) - min(delays_ns) <= packet_ns:
        return 1.0, 0.0
    arrivals: list[tuple[float, int, int]] = []  # (time, order, psn)
    naks: list[tuple[float, int]] = []           # (time at the sender, psn to resend from)
    expected = 0
    delivered = 0
    reorder = 0
    nak_open = False
    next_psn = 0
    slot = 0
    order = 0
    while delivered < useful:
        t = slot * packet_ns
        # everything that happens before this send: arrivals at the receiver, NAKs at the
        # sender (in time order; the heaps keep each in order, arrivals first on ties)
        while arrivals and arrivals[0][0] <= t:
            at, _, psn = heapq.heappop(arrivals)
            if psn == expected:
                expected += 1
                delivered += 1
                nak_open = False
            elif psn > expected:
                reorder += 1
                if not nak_open:
                    nak_open = True
                    heapq.heappush(naks, (at + nak_ns, expected))
        while naks and naks[0][0] <= t:
            _, psn = heapq.heappop(naks)
            next_psn = psn
        heapq.heappush(arrivals, (t + delays_ns[slot % k], order, next_psn))
        order += 1
        next_psn += 1
        slot += 1
    return delivered / slot, reorder / delivered


class SprayOoo(Ideal):
    """Per-packet spraying, out-of-order-capable NIC (see the module docstring)."""

    name = "spray-ooo"
    receiver_in_order = False
    # a fabric that sprays is no bound under faults: its switches keep spraying onto a dead
    # link until they learn of it, as every switch does (``ideal`` moves at once)
    instant_reroute = False

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._gbn: dict[tuple[int, int], tuple[float, float]] = {}

    def set_topology(self, ct: CompiledTopology) -> None:
        """As :meth:`Ideal.set_topology`; the costs per leaf pair are found again (the
        live paths' delays may differ)."""
        super().set_topology(ct)
        self._gbn.clear()

    def _leaf_pair_cost(self, src_sw: int, dst_slot: int, line_gbps: float
                        ) -> tuple[float, float]:
        """(efficiency, reorder events per packet) of a sprayed flow between two leaves."""
        key = (src_sw, dst_slot)
        hit = self._gbn.get(key)
        if hit is None:
            ct = self.ctx.topology
            paths = self._switch_paths(src_sw, dst_slot)
            valid = paths >= 0
            delay = (np.where(valid, ct.delay_ns[np.where(valid, paths, 0)], 0).sum(axis=1)
                     + valid.sum(axis=1) * self.ctx.switch_latency_ns).astype(float)
            packet_ns = MTU_WIRE_BYTES * 8 / line_gbps
            eff, per_packet = go_back_n(sorted(delay.tolist()), packet_ns, float(delay.min()))
            if not self.receiver_in_order:
                # placed out of order: nothing is resent, the reordering itself is the same
                eff = 1.0
            hit = self._gbn[key] = (eff, per_packet)
        return hit

    def route(self, batch: TransferBatch) -> RoutedBatch:
        routed = super().route(batch)
        ct = self.ctx.topology
        n = len(batch)
        eff = np.ones(n)
        per_packet = np.zeros(n)
        fabric = np.flatnonzero(~intra_host(ct, batch.src, batch.dst))
        if len(fabric):
            key = np.stack([ct.gpu_leaf[batch.src[fabric]],
                            ct.leaf_slot[ct.gpu_leaf[batch.dst[fabric]]],
                            ct.gpu_up[batch.src[fabric]]], 1).astype(np.int64)
            pairs, inv = np.unique(key, axis=0, return_inverse=True)
            cost = np.array([self._leaf_pair_cost(int(a), int(b), float(ct.rate_gbps[c]))
                             for a, b, c in pairs.tolist()])
            eff[fabric] = cost[inv.reshape(-1), 0]
            per_packet[fabric] = cost[inv.reshape(-1), 1]
        # rows: one per coupled group (its slowest stream) or independent transfer
        entity, n_rows = entity_of(batch.group)
        factor = np.ones(n_rows)
        np.maximum.at(factor, entity, 1.0 / eff)
        events = np.zeros(n_rows)
        np.maximum.at(events, entity, per_packet)
        return replace(routed, wire_factor=factor, reorder_per_packet=events)


class Spray(SprayOoo):
    """Per-packet spraying, standard in-order RoCE NIC with go-back-N."""

    name = "spray"
    receiver_in_order = True


register_policy("spray-ooo")(SprayOoo)
register_policy("spray")(Spray)
