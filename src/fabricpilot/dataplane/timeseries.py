"""Per-port time series of a fluid run, in bounded memory.

Every ``interval_ns`` the model appends one sample: for each link that carried bytes, held a
queue or was paused, its queue depth and pause state at that instant, and its utilisation and
ECN marks over the interval. A long run at a fine interval could need gigabytes, so the store
keeps at most ``max_rows`` (link, time) rows: when it would hold more, the interval doubles and
every two consecutive samples merge into one (utilisation averaged over both spans, marks
added, queue and pause state taken from the later instant). The series stays evenly spaced,
covers the whole run and says which interval it ended with; nothing is silently cut off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fabricpilot.arrays import distinct

COLUMNS = ("time_ns", "link", "queue_bytes", "utilization", "ecn_marks", "paused")


@dataclass
class _Sample:
    time_ns: int
    span_ns: float
    link: NDArray[np.int64]
    queue_bytes: NDArray[np.float64]
    utilization: NDArray[np.float64]
    ecn_marks: NDArray[np.float64]
    paused: NDArray[np.bool_]

    @property
    def rows(self) -> int:
        return len(self.link)


def merge(a: _Sample, b: _Sample) -> _Sample:
    """One sample covering ``a`` then ``b``: utilisation is span-weighted, marks add, queue
    and pause state are ``b``'s (a link absent from ``b`` was idle at its instant).

    >>> a = _Sample(10, 10.0, np.array([1, 2]), np.array([5.0, 7.0]), np.array([1.0, 0.5]),
    ...             np.array([1.0, 0.0]), np.array([True, False]))
    >>> b = _Sample(20, 10.0, np.array([2]), np.array([3.0]), np.array([0.25]),
    ...             np.array([2.0]), np.array([False]))
    >>> m = merge(a, b)
    >>> m.time_ns, m.link.tolist(), m.queue_bytes.tolist(), m.utilization.tolist()
    (20, [1, 2], [0.0, 3.0], [0.5, 0.375])
    >>> m.ecn_marks.tolist(), m.paused.tolist()
    ([1.0, 2.0], [False, False])
    """
    links = distinct(np.concatenate((a.link, b.link)))
    ia = np.searchsorted(links, a.link)
    ib = np.searchsorted(links, b.link)
    n = len(links)
    span = a.span_ns + b.span_ns
    util = np.zeros(n)
    util[ia] += a.utilization * a.span_ns
    util[ib] += b.utilization * b.span_ns
    marks = np.zeros(n)
    marks[ia] += a.ecn_marks
    marks[ib] += b.ecn_marks
    queue = np.zeros(n)
    queue[ib] = b.queue_bytes
    paused = np.zeros(n, bool)
    paused[ib] = b.paused
    return _Sample(b.time_ns, span, links, queue, util / max(span, 1e-9), marks, paused)


@dataclass
class TimeSeries:
    """Samples of per-link state, at most ``max_rows`` rows (see the module docstring)."""

    interval_ns: float
    max_rows: int
    _samples: list[_Sample] = field(default_factory=list)
    _rows: int = 0
    _pending: _Sample | None = None  # samples gathered towards the current interval

    def append(self, time_ns: int, span_ns: float, link: NDArray[np.int64],
               queue_bytes: NDArray[np.float64], utilization: NDArray[np.float64],
               ecn_marks: NDArray[np.float64], paused: NDArray[np.bool_],
               base_interval_ns: float) -> None:
        """Add the sample taken at ``time_ns`` covering the last ``span_ns``.

        ``base_interval_ns`` is the model's sampling period; after k doublings only every
        2**k-th sample is kept, merged with the ones before it.
        """
        s = _Sample(int(time_ns), float(span_ns), link.astype(np.int64),
                    queue_bytes.astype(np.float64), utilization.astype(np.float64),
                    ecn_marks.astype(np.float64), paused.astype(bool))
        self._pending = s if self._pending is None else merge(self._pending, s)
        if self._pending.span_ns + 1e-6 < self.interval_ns and self.interval_ns > base_interval_ns:
            return
        s, self._pending = self._pending, None
        self._samples.append(s)
        self._rows += s.rows
        while self._rows > self.max_rows and len(self._samples) > 1:
            self._halve()

    def _halve(self) -> None:
        """Double the interval: merge samples pairwise (an odd last one waits for its pair)."""
        self.interval_ns *= 2
        old = self._samples
        merged = [merge(old[i], old[i + 1]) for i in range(0, len(old) - 1, 2)]
        if len(old) % 2:  # nothing is pending here: append() just committed it
            self._pending = old[-1]
        self._samples = merged
        self._rows = sum(s.rows for s in merged)

    def finish(self) -> None:
        """Keep a sample still waiting for its partner (the run's last, shorter interval)."""
        if self._pending is not None:
            self._samples.append(self._pending)
            self._rows += self._pending.rows
            self._pending = None

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def rows(self) -> int:
        return self._rows

    def columns(self) -> dict[str, NDArray]:
        """The series as flat columns (:data:`COLUMNS`), one row per (sample, link)."""
        s = self._samples
        if not s:
            return {c: np.zeros(0) for c in COLUMNS}
        return {
            "time_ns": np.concatenate([np.full(x.rows, x.time_ns, np.int64) for x in s]),
            "link": np.concatenate([x.link for x in s]),
            "queue_bytes": np.concatenate([x.queue_bytes for x in s]),
            "utilization": np.concatenate([x.utilization for x in s]),
            "ecn_marks": np.concatenate([x.ecn_marks for x in s]),
            "paused": np.concatenate([x.paused for x in s]),
        }
