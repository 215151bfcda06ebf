"""A per-link congestion map built from southbound counter deltas.

:class:`CongestionMap` turns :class:`~fabricpilot.controller.southbound.PortDelta` samples into
smoothed per-link state (:class:`LinkState`: utilization, queue depth, drop / ECN rates, PFC
pause fraction, FEC error rates) with an EWMA, flags hot links and derives the per-link weight
table pushed to switches for local adaptive routing. It only uses the southbound interface and
imports nothing from the simulator.

>>> from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta
>>> view = FabricView.from_links(
...     [LinkInfo(0, "leaf0", "spine0", 400, 100), LinkInfo(1, "spine0", "leaf0", 400, 100)],
...     node_kind={"leaf0": "switch", "spine0": "switch"},
...     tier={"leaf0": 1, "spine0": 2}, gpu_node={})
>>> cm = CongestionMap(view)
>>> # 400 Gb/s for 1 ms carries 50_000_000 bytes: sending 25_000_000 bytes is 50 % load.
>>> cm.update([PortDelta(0, 1_000_000, tx_bytes=25_000_000)])
>>> cm.utilization()
{0: 0.5, 1: 0.0}
>>> cm.update([PortDelta(0, 1_000_000, tx_bytes=50_000_000)])  # 0.3 * 1.0 + 0.7 * 0.5
>>> round(cm.state(0).utilization, 6)
0.65
>>> cm.hot_links()
[]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fabricpilot.controller.southbound import FabricView, PortDelta

__all__ = ["CongestionMap", "LinkState"]


@dataclass
class LinkState:
    """Smoothed state of one link.

    ``utilization`` is the fraction of capacity used (may exceed 1 with bursts / miscounted
    capacities), ``queue_bytes`` the egress queue depth, ``drop_rate`` and ``ecn_rate`` drops /
    ECN marks per second, ``pause_fraction`` the share of time under PFC pause (0..1),
    ``fec_error_rate`` FEC-corrected errors per received bit and ``uncorrectable_rate``
    uncorrectable errors per received bit (both 0 when no bits were received).
    """

    utilization: float = 0.0
    queue_bytes: float = 0.0
    drop_rate: float = 0.0
    ecn_rate: float = 0.0
    pause_fraction: float = 0.0
    fec_error_rate: float = 0.0
    uncorrectable_rate: float = 0.0


_FIELDS: tuple[str, ...] = (
    "utilization", "queue_bytes", "drop_rate", "ecn_rate", "pause_fraction",
    "fec_error_rate", "uncorrectable_rate",
)


class CongestionMap:
    """EWMA-smoothed congestion state of every link of a :class:`FabricView`.

    ``alpha`` is the weight of the newest sample (``new = alpha * sample + (1 - alpha) * old``;
    a link's first sample is taken as is). A link is *hot* when its smoothed utilization
    reaches ``hot_utilization``, its queue reaches ``hot_queue_bytes`` or its pause fraction
    reaches ``hot_pause_fraction`` (each boundary counts as hot).
    """

    def __init__(self, view: FabricView, alpha: float = 0.3, hot_utilization: float = 0.8,
                 hot_queue_bytes: float = 1.5 * 2**20, hot_pause_fraction: float = 0.01) -> None:
        """Track every link of ``view``; raise :class:`ValueError` on invalid parameters."""
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if hot_queue_bytes <= 0:
            raise ValueError(f"hot_queue_bytes must be positive, got {hot_queue_bytes}")
        self.view = view
        self.alpha = float(alpha)
        self.hot_utilization = float(hot_utilization)
        self.hot_queue_bytes = float(hot_queue_bytes)
        self.hot_pause_fraction = float(hot_pause_fraction)
        self._capacity_gbps: dict[int, float] = {
            lid: float(li.capacity_gbps) for lid, li in view.links.items()
        }
        self._state: dict[int, LinkState] = {}

    def _check_link(self, link_id: int) -> None:
        if link_id not in self._capacity_gbps:
            raise KeyError(f"unknown link id {link_id}")

    def _sample(self, d: PortDelta) -> LinkState:
        """The instantaneous (unsmoothed) state one delta describes."""
        interval = float(d.interval_ns)
        capacity = self._capacity_gbps[d.link_id]
        rx_bits = float(d.rx_bits)
        return LinkState(
            # Gb/s * ns = bits, so this is bits sent / bits the link could have sent.
            utilization=d.tx_bytes * 8.0 / (capacity * interval),
            queue_bytes=float(d.queue_bytes),
            # count / (interval_ns / 1e9), written to keep integer-valued inputs exact.
            drop_rate=d.drops * 1e9 / interval,
            ecn_rate=d.ecn_marks * 1e9 / interval,
            pause_fraction=min(max(d.pause_ns / interval, 0.0), 1.0),
            fec_error_rate=d.fec_corrected / rx_bits if rx_bits > 0 else 0.0,
            uncorrectable_rate=d.fec_uncorrected / rx_bits if rx_bits > 0 else 0.0,
        )

    def update(self, deltas: list[PortDelta]) -> None:
        """Fold one batch of counter deltas into the smoothed state.

        All deltas are validated before any state changes: an unknown link id raises
        :class:`KeyError`, a non-positive ``interval_ns`` (or a link with non-positive
        capacity) raises :class:`ValueError`; both name the link. Links without a delta in
        the batch keep their state.
        """
        for d in deltas:
            self._check_link(d.link_id)
            if d.interval_ns <= 0:
                raise ValueError(
                    f"link {d.link_id}: interval_ns must be positive, got {d.interval_ns}")
            if self._capacity_gbps[d.link_id] <= 0:
                raise ValueError(f"link {d.link_id}: capacity_gbps must be positive")
        a = self.alpha
        for d in deltas:
            sample = self._sample(d)
            old = self._state.get(d.link_id)
            if old is None:
                self._state[d.link_id] = sample
                continue
            for name in _FIELDS:
                setattr(old, name, a * getattr(sample, name) + (1.0 - a) * getattr(old, name))

    def state(self, link_id: int) -> LinkState:
        """A copy of the smoothed state of ``link_id`` (all zero before its first sample)."""
        self._check_link(link_id)
        st = self._state.get(link_id)
        return LinkState() if st is None else replace(st)

    def utilization(self) -> dict[int, float]:
        """Smoothed utilization of every link of the view, by link id."""
        return {lid: self._get(lid).utilization for lid in self._capacity_gbps}

    def free_buffer_bytes(self, link_id: int, buffer_bytes: float) -> float:
        """Buffer left on ``link_id``'s egress port: ``max(buffer_bytes - queue_bytes, 0)``."""
        self._check_link(link_id)
        return max(float(buffer_bytes) - self._get(link_id).queue_bytes, 0.0)

    def is_hot(self, link_id: int) -> bool:
        """Whether ``link_id`` reaches any hot threshold (utilization, queue or pause)."""
        self._check_link(link_id)
        st = self._get(link_id)
        return (st.utilization >= self.hot_utilization
                or st.queue_bytes >= self.hot_queue_bytes
                or st.pause_fraction >= self.hot_pause_fraction)

    def hot_links(self) -> list[int]:
        """Sorted ids of the links that reach any hot threshold."""
        return sorted(lid for lid in self._capacity_gbps if self.is_hot(lid))

    def weight(self, link_id: int) -> float:
        """Adaptive-routing weight of ``link_id`` (see :meth:`congestion_table`)."""
        self._check_link(link_id)
        st = self._get(link_id)
        penalty = (4.0 * max(st.utilization - 0.5, 0.0)
                   + st.queue_bytes / self.hot_queue_bytes
                   + 10.0 * st.pause_fraction)
        return 1.0 / (1.0 + penalty)

    def congestion_table(self) -> dict[int, float]:
        """Per-link weights for switch-local adaptive routing (1 neutral, towards 0 avoided).

        For every link::

            w = 1 / (1 + 4 * max(utilization - 0.5, 0)
                       + queue_bytes / hot_queue_bytes + 10 * pause_fraction)

        so an idle link (and any link up to 50 % load with an empty queue and no pause)
        weighs exactly 1.0, and the weight falls as load, queue and pause grow.

        >>> from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta
        >>> view = FabricView.from_links(
        ...     [LinkInfo(0, "a", "b", 400, 100), LinkInfo(1, "b", "a", 400, 100)],
        ...     node_kind={"a": "switch", "b": "switch"}, tier={}, gpu_node={})
        >>> cm = CongestionMap(view)
        >>> # link 0: utilization 1.0 and a 0.75 MiB queue (half of the 1.5 MiB threshold)
        >>> cm.update([PortDelta(0, 1_000_000, tx_bytes=50_000_000, queue_bytes=786_432)])
        >>> t = cm.congestion_table()  # link 0: 1 / (1 + 4 * 0.5 + 0.5 + 0) = 2 / 7
        >>> round(t[0], 6), t[1]
        (0.285714, 1.0)
        """
        return {lid: self.weight(lid) for lid in self._capacity_gbps}

    def _get(self, link_id: int) -> LinkState:
        st = self._state.get(link_id)
        return LinkState() if st is None else st
