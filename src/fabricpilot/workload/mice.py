"""Mice: small latency-sensitive messages (RPCs, control traffic) arriving as a Poisson process.

They share the fabric with the elephant collectives, and their flow completion time (slowdown)
is what a balancing policy must not ruin.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fabricpilot.arrays import distinct

__all__ = ["MiceArrivals", "poisson_mice"]


@dataclass(frozen=True, slots=True)
class MiceArrivals:
    """Arrivals of small messages, one row each, sorted by ``time_ns``.

    ``time_ns`` (int64 ns), ``src`` and ``dst`` (int64 GPU ids, ``src != dst``) and
    ``size_bytes`` (int64) are equal-length arrays.
    """

    time_ns: NDArray[np.int64]
    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    size_bytes: NDArray[np.int64]

    def __post_init__(self) -> None:
        n = len(self.time_ns)
        if not (len(self.src) == len(self.dst) == len(self.size_bytes) == n):
            raise ValueError("mice arrays must have equal length")
        if n and np.any(np.diff(self.time_ns) < 0):
            raise ValueError("mice arrival times must be sorted")
        if n and np.any(self.src == self.dst):
            raise ValueError("a mouse must not have src == dst")

    def __len__(self) -> int:
        return len(self.time_ns)

    @property
    def total_bytes(self) -> int:
        return int(self.size_bytes.sum())


def poisson_mice(
    gpus: Sequence[int] | NDArray[np.integer],
    *,
    rate_per_s: float,
    size_bytes: int,
    start_ns: int,
    duration_ns: int,
    rng: np.random.Generator,
) -> MiceArrivals:
    """Poisson arrivals of ``size_bytes`` messages between distinct random GPUs of ``gpus``.

    ``rate_per_s`` is the aggregate arrival rate (messages per second over all of ``gpus``).
    Inter-arrival times are exponential with mean ``1e9 / rate_per_s`` ns; arrivals fall in
    ``[start_ns, start_ns + duration_ns)`` (times floored to whole ns). For each arrival the
    source is uniform over ``gpus`` and the destination uniform over the other GPUs.
    Deterministic for a given ``rng`` state.

    >>> m = poisson_mice([0, 1, 2, 3], rate_per_s=1e6, size_bytes=4096, start_ns=1000,
    ...                  duration_ns=100_000, rng=np.random.default_rng(1))
    >>> 50 < len(m) < 150, bool(np.all(m.src != m.dst)), int(m.size_bytes[0])
    (True, True, 4096)
    """
    pool = np.asarray(gpus)
    if pool.ndim != 1 or (pool.size and not np.issubdtype(pool.dtype, np.integer)):
        raise ValueError("gpus must be a 1-D sequence of integer GPU ids")
    pool = pool.astype(np.int64)
    if len(distinct(pool)) != len(pool):
        raise ValueError("gpus must be distinct")
    rate = float(rate_per_s)
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate_per_s must be a finite number >= 0, got {rate_per_s!r}")
    size = operator.index(size_bytes)
    if size < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size}")
    start = operator.index(start_ns)
    duration = operator.index(duration_ns)
    if duration < 0:
        raise ValueError(f"duration_ns must be >= 0, got {duration}")

    empty = np.empty(0, dtype=np.int64)
    if rate == 0 or duration == 0:
        return MiceArrivals(empty, empty.copy(), empty.copy(), empty.copy())
    if len(pool) < 2:
        raise ValueError("mice need at least 2 GPUs to pick distinct src and dst")

    mean_gap_ns = 1e9 / rate
    expected = duration / mean_gap_ns
    # enough exponentials that the sum overshoots the window with overwhelming probability;
    # extend in the rare case it does not
    batch = int(expected + 8.0 * math.sqrt(expected) + 16)
    offsets = np.cumsum(rng.exponential(mean_gap_ns, size=batch))
    while offsets[-1] < duration:
        more = np.cumsum(rng.exponential(mean_gap_ns, size=batch)) + offsets[-1]
        offsets = np.concatenate([offsets, more])
    offsets = offsets[offsets < duration]
    n = len(offsets)
    time_ns = start + np.floor(offsets).astype(np.int64)

    m = len(pool)
    si = rng.integers(0, m, size=n)
    di = rng.integers(0, m - 1, size=n)
    di += di >= si  # uniform over the other m-1 GPUs
    return MiceArrivals(
        time_ns=time_ns,
        src=pool[si],
        dst=pool[di],
        size_bytes=np.full(n, size, dtype=np.int64),
    )
