"""Link health: gray-failure detection from error counters, with debounce.

A gray link stays up but corrupts bits; the early sign is the FEC-corrected error rate in
the port counters, and the frames FEC could not correct (lost: a link that loses packets
with no rise in corrected errors shows there alone). Counters are noisy, so one bad sample
must not move traffic: a link is *confirmed* degraded only after ``count`` detections
(samples above a threshold) within ``window_ns``, or ``count`` in a row (no sample of it at
or below the thresholds between them: a switch that reports less often than the window
allows still gets a steadily bad link confirmed). ``count = 1`` disables the debounce. Once
repaired, a link is *clean* again after its samples have stayed at or below the thresholds
for a soak time (:meth:`GrayDetector.clean`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fabricpilot.controller.southbound import PortDelta


@dataclass
class Debouncer:
    """Confirms a key after ``count`` observations within ``window_ns``, or ``count`` in a
    row (:meth:`clear` says a key was seen fine in between).

    >>> d = Debouncer(count=3, window_ns=500)
    >>> [d.observe(7, t) for t in (0, 100, 700)]  # (in a row, 700 ns apart in all)
    [False, False, True]
    >>> d.observe(8, 0), d.observe(8, 300); d.clear(8); d.observe(8, 1000)
    (False, False)
    False
    """

    count: int = 3
    window_ns: float = 500e6
    _seen: dict[int, deque[float]] = field(default_factory=dict)
    # key -> observations since it was last seen fine (or confirmed)
    streaks: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"debounce count must be >= 1, got {self.count}")
        if self.window_ns <= 0:
            raise ValueError(f"debounce window must be > 0, got {self.window_ns}")

    def observe(self, key: int, now_ns: float) -> bool:
        """Record one detection of ``key``; True when it is confirmed (the ``count``-th
        within the window, or in a row; the history is then cleared so the next
        confirmation needs ``count`` fresh detections)."""
        q = self._seen.setdefault(key, deque())
        q.append(now_ns)
        while q and q[0] <= now_ns - self.window_ns:
            q.popleft()
        streak = self.streaks[key] = self.streaks.get(key, 0) + 1
        if len(q) >= self.count or streak >= self.count:
            q.clear()
            del self.streaks[key]
            return True
        return False

    def clear(self, key: int) -> None:
        """``key`` was seen fine: its detections in a row start again (those within the
        window still count)."""
        self.streaks.pop(key, None)


UNCORRECTED_THRESHOLD = 1e-12
"""Uncorrectable frames per bit received above which a sample is a detection: a healthy
400G link loses well under one frame in a second (0.4 at this rate), a gray one that drops
one packet in 10 000 at line rate some 1 200."""


@dataclass
class GrayDetector:
    """Flags links whose FEC-corrected error rate exceeds ``threshold`` (per bit received),
    or whose uncorrectable frames exceed ``uncorrected_threshold`` per bit received,
    debounced (:class:`Debouncer`). Each port delta that carries error counters
    (``rx_bits > 0``) is one sample.

    >>> g = GrayDetector(1e-6, Debouncer(2, 1e6))
    >>> g.update([PortDelta(3, 1000, fec_corrected=5, rx_bits=1e6)], 0)  # 5e-6: detection 1
    []
    >>> g.update([PortDelta(3, 1000, fec_corrected=5, rx_bits=1e6)], 1000)
    [3]
    >>> g.detections
    2

    Clean since the first sample at or below the threshold that no detection followed:

    >>> g.update([PortDelta(3, 1000, fec_corrected=0, rx_bits=1e6)], 2000)
    []
    >>> g.clean([3], 2500, soak_ns=1000), g.clean([3], 3000, soak_ns=1000)
    ([], [3])

    Frames lost alone (no corrected errors), 2 in 4e11 bits, 5e-12:

    >>> GrayDetector(1e-6, Debouncer(1, 1e6)).update(
    ...     [PortDelta(4, 1000, fec_uncorrected=2, rx_bits=4e11)], 0)
    [4]
    """

    threshold: float = 1e-6
    debounce: Debouncer = field(default_factory=Debouncer)
    uncorrected_threshold: float = UNCORRECTED_THRESHOLD
    detections: int = 0
    per_link: dict[int, int] = field(default_factory=dict)  # detections of each link
    # link -> the first sample at or below the threshold since its last detection
    clean_since: dict[int, float] = field(default_factory=dict)

    def update(self, deltas: list[PortDelta], now_ns: float) -> list[int]:
        """Links confirmed degraded by this batch of deltas (sorted)."""
        out = []
        clean = self.clean_since
        streaks = self.debounce.streaks
        for d in deltas:
            if d.rx_bits <= 0:
                continue
            if (d.fec_corrected / d.rx_bits > self.threshold
                    or d.fec_uncorrected / d.rx_bits > self.uncorrected_threshold):
                self.detections += 1
                self.per_link[d.link_id] = self.per_link.get(d.link_id, 0) + 1
                clean.pop(d.link_id, None)
                if self.debounce.observe(d.link_id, now_ns):
                    out.append(d.link_id)
            else:
                if streaks:  # (a clean sample breaks a run of detections)
                    streaks.pop(d.link_id, None)
                if d.link_id not in clean:
                    clean[d.link_id] = now_ns
        return sorted(out)

    def clean(self, links: set[int] | list[int], now_ns: float, soak_ns: float) -> list[int]:
        """Those of ``links`` whose samples have all been at or below the threshold for at
        least ``soak_ns`` (sorted)."""
        since = self.clean_since
        return sorted(lk for lk in links if lk in since and now_ns - since[lk] >= soak_ns)
