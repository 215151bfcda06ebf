"""A per-link congestion map built from southbound counter deltas.

:class:`CongestionMap` turns :class:`~fabricpilot.controller.southbound.PortDelta` samples into
smoothed per-link state (:class:`LinkState`: utilization, queue depth, drop / ECN rates, PFC
pause fraction, FEC error rates) with an EWMA (a batch is one reporting interval; a link
left out of it is unchanged since its last delta), flags hot links and derives the per-link weight
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

import itertools
import operator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fabricpilot.controller.southbound import FabricView, PortDelta

__all__ = ["CongestionMap", "LinkState"]

_COUNTER_NAMES = ("link_id", "interval_ns", "tx_bytes", "queue_bytes", "drops", "ecn_marks",
                  "pause_ns", "fec_corrected", "fec_uncorrected", "rx_bits")
_COUNTERS = operator.attrgetter(*_COUNTER_NAMES)  # a PortDelta's counters, as one tuple


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
        # the state as arrays, one row per link (in the view's order), one column per field
        # of LinkState: batches of deltas are folded in with vector arithmetic
        self._ids = np.fromiter(self._capacity_gbps, np.int64, len(self._capacity_gbps))
        self._row = {lid: i for i, lid in enumerate(self._capacity_gbps)}
        self._lookup = np.full(int(self._ids.max()) + 1 if len(self._ids) else 0, -1, np.int64)
        self._lookup[self._ids] = np.arange(len(self._ids))
        self._cap = np.fromiter(self._capacity_gbps.values(), np.float64, len(self._ids))
        self._arr = np.zeros((len(self._ids), len(_FIELDS)))
        self._seen = np.zeros(len(self._ids), bool)
        self._last = np.zeros_like(self._arr)  # (each link's last sample, as reported)
        # links whose state has not reached their last sample yet (the others stay put)
        self._moving = np.zeros(len(self._ids), bool)

    def _check_link(self, link_id: int) -> None:
        if link_id not in self._capacity_gbps:
            raise KeyError(f"unknown link id {link_id}")

    def _samples(self, deltas: list[PortDelta]) -> tuple[NDArray[np.int64], NDArray]:
        """Rows of the deltas' links, and the instantaneous (unsmoothed) state each delta
        describes: one row per delta, one column per field of :class:`LinkState`."""
        n = len(deltas)
        width = len(_COUNTER_NAMES)
        raw = np.fromiter(itertools.chain.from_iterable(map(_COUNTERS, deltas)), np.float64,
                          n * width).reshape(n, width)

        def col(name: str) -> NDArray[np.float64]:
            return raw[:, _COUNTER_NAMES.index(name)]

        ids = col("link_id").astype(np.int64)
        interval = col("interval_ns")
        known = (ids >= 0) & (ids < len(self._lookup))
        rows = np.where(known, self._lookup[np.where(known, ids, 0)], -1)
        if (rows < 0).any():
            raise KeyError(f"unknown link id {int(ids[np.argmax(rows < 0)])}")
        if (interval <= 0).any():
            i = int(np.argmax(interval <= 0))
            raise ValueError(f"link {int(ids[i])}: interval_ns must be positive, got "
                             f"{deltas[i].interval_ns}")
        cap = self._cap[rows]
        if (cap <= 0).any():
            raise ValueError(f"link {int(ids[np.argmax(cap <= 0)])}: capacity_gbps must be "
                             "positive")
        rx_bits = col("rx_bits")
        has_rx = rx_bits > 0
        safe_rx = np.where(has_rx, rx_bits, 1.0)
        out = np.empty((n, len(_FIELDS)))
        # Gb/s * ns = bits, so this is bits sent / bits the link could have sent
        out[:, 0] = col("tx_bytes") * 8.0 / (cap * interval)
        out[:, 1] = col("queue_bytes")
        # count / (interval_ns / 1e9), written to keep integer-valued inputs exact
        out[:, 2] = col("drops") * 1e9 / interval
        out[:, 3] = col("ecn_marks") * 1e9 / interval
        out[:, 4] = np.clip(col("pause_ns") / interval, 0.0, 1.0)
        out[:, 5] = np.where(has_rx, col("fec_corrected") / safe_rx, 0.0)
        out[:, 6] = np.where(has_rx, col("fec_uncorrected") / safe_rx, 0.0)
        return rows, out

    def update(self, deltas: list[PortDelta], elapsed: bool | int | None = None) -> None:
        """Fold one batch of counter deltas, one reporting interval, into the smoothed state.

        Switches send only what changed: a link left out of a batch is taken as unchanged
        since its last delta, and its state takes one more step towards that sample (a link
        that went idle reports its zeros once, and its state then fades to zero rather than
        holding what it last had). ``elapsed`` says whether an interval went by (default:
        whether there are deltas), or how many: an empty batch of an interval that went by
        (nothing changed anywhere) still moves every link a step, and one with
        ``elapsed=False`` (0) moves none. With ``k > 1`` intervals every link first takes
        the ``k - 1`` steps of the intervals without news (towards a fixed sample, ``k``
        steps leave ``(1 - alpha) ** k`` of the way, taken at once), then the batch is
        folded in as one interval. Links never reported stay at zero.

        All deltas are validated before any state changes: an unknown link id raises
        :class:`KeyError`, a non-positive ``interval_ns`` (or a link with non-positive
        capacity) raises :class:`ValueError`; both name the link. Several deltas of one link
        in a batch are folded in their order, as if they came one by one.

        A link at 50 % reports 0 once, then nothing for two intervals:

        >>> from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta
        >>> view = FabricView.from_links(
        ...     [LinkInfo(0, "a", "b", 400, 100), LinkInfo(1, "b", "a", 400, 100)],
        ...     node_kind={"a": "switch", "b": "switch"}, tier={}, gpu_node={})
        >>> cm = CongestionMap(view)
        >>> cm.update([PortDelta(0, 1_000_000, tx_bytes=25_000_000)])
        >>> cm.update([PortDelta(0, 1_000_000)])  # 0.7 * 0.5
        >>> cm.update([PortDelta(1, 1_000_000)]); round(cm.state(0).utilization, 6)
        0.245
        >>> cm.update([], elapsed=True); round(cm.state(0).utilization, 6)  # 0.7 ** 3 * 0.5
        0.1715
        >>> cm.update([]); round(cm.state(0).utilization, 6)  # (no interval went by)
        0.1715
        >>> cm.update([], elapsed=2); round(cm.state(0).utilization, 6)  # 0.7 ** 5 * 0.5
        0.084035
        """
        steps = int(bool(deltas)) if elapsed is None else int(elapsed)
        if steps < 0:
            raise ValueError(f"elapsed must be at least 0 intervals, got {elapsed}")
        reported = np.zeros(len(self._ids), bool)  # (the links this batch has a delta of)
        if not deltas:
            if steps:
                self._step_unreported(reported, steps)
            return
        rows, samples = self._samples(deltas)
        if steps > 1:  # (the intervals before this batch, in which nothing changed)
            self._step_unreported(reported, steps - 1)
        a = self.alpha
        # k-th delta of its link in this batch: round k folds in every link's k-th delta
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        first = np.r_[True, sorted_rows[1:] != sorted_rows[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(rows)), 0))
        rank = np.empty(len(rows), np.int64)
        rank[order] = np.arange(len(rows)) - start
        for k in range(int(rank.max()) + 1):
            pick = rank == k
            r, x = rows[pick], samples[pick]
            seen = self._seen[r]
            self._arr[r] = np.where(seen[:, None], a * x + (1.0 - a) * self._arr[r], x)
            self._seen[r] = True
            self._last[r] = x
        self._moving[rows] = True
        if steps:
            reported[rows] = True
            self._step_unreported(reported)

    def _step_unreported(self, reported: NDArray[np.bool_], steps: int = 1) -> None:
        """``steps`` EWMA steps (at once) of every link reported before but not in this
        batch (``reported``), towards its last sample (unchanged since: only changes are
        sent). A link within 1e-12 of that sample (relative to it, or absolute below 1)
        takes it and is left alone from then on, so a period costs only the links still on
        their way."""
        rows = np.flatnonzero(self._moving & ~reported)
        if len(rows):
            # (the weight left on the state after the steps: one step's exactly as folding)
            a = self.alpha if steps == 1 else 1.0 - (1.0 - self.alpha) ** steps
            last = self._last[rows]
            now = a * last + (1.0 - a) * self._arr[rows]
            there = (np.abs(now - last) <= 1e-12 * np.maximum(np.abs(last), 1.0)).all(axis=1)
            now[there] = last[there]
            self._arr[rows] = now
            self._moving[rows[there]] = False

    def state(self, link_id: int) -> LinkState:
        """A copy of the smoothed state of ``link_id`` (all zero before its first sample)."""
        self._check_link(link_id)
        return self._get(link_id)

    def utilization(self) -> dict[int, float]:
        """Smoothed utilization of every link of the view, by link id."""
        return dict(zip(self._capacity_gbps, self._arr[:, 0].tolist(), strict=True))

    def utilization_array(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The links of the view (ids, in its order) and their smoothed utilization, as
        arrays (copies): :meth:`utilization` for a caller that computes over all links.

        >>> from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta
        >>> view = FabricView.from_links(
        ...     [LinkInfo(3, "a", "b", 400, 100), LinkInfo(1, "b", "a", 400, 100)],
        ...     node_kind={"a": "switch", "b": "switch"}, tier={}, gpu_node={})
        >>> cm = CongestionMap(view)
        >>> cm.update([PortDelta(1, 1_000_000, tx_bytes=25_000_000)])
        >>> [a.tolist() for a in cm.utilization_array()]
        [[3, 1], [0.0, 0.5]]
        """
        return self._ids.copy(), self._arr[:, 0].copy()

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
        st = self._arr
        hot = ((st[:, 0] >= self.hot_utilization) | (st[:, 1] >= self.hot_queue_bytes)
               | (st[:, 4] >= self.hot_pause_fraction))
        return sorted(self._ids[hot].tolist())

    def weight(self, link_id: int, expected_gbps: float = 0.0) -> float:
        """Adaptive-routing weight of ``link_id`` (see :meth:`congestion_table`); with
        ``expected_gbps``, as if that much of its smoothed load were not there (load a plan
        keeps room for: the weight must not steer that traffic away from its room).

        >>> from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta
        >>> view = FabricView.from_links([LinkInfo(0, "a", "b", 400, 100)],
        ...                              node_kind={"a": "switch", "b": "switch"}, tier={},
        ...                              gpu_node={})
        >>> cm = CongestionMap(view)
        >>> cm.update([PortDelta(0, 1_000_000, tx_bytes=45_000_000)])  # (360 Gb/s: 0.9)
        >>> round(cm.weight(0), 6), cm.weight(0, expected_gbps=300.0)  # 1 / (1 + 4 * 0.4)
        (0.384615, 1.0)
        """
        self._check_link(link_id)
        st = self._get(link_id)
        utilization = max(st.utilization - expected_gbps / self._capacity_gbps[link_id], 0.0)
        penalty = (4.0 * max(utilization - 0.5, 0.0)
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
        st = self._arr
        penalty = (4.0 * np.maximum(st[:, 0] - 0.5, 0.0) + st[:, 1] / self.hot_queue_bytes
                   + 10.0 * st[:, 4])
        return dict(zip(self._capacity_gbps, (1.0 / (1.0 + penalty)).tolist(), strict=True))

    def _get(self, link_id: int) -> LinkState:
        return LinkState(*self._arr[self._row[link_id]].tolist())
