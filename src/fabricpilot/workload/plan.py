"""Data types a collective generator returns: stages of transfers between GPUs.

A collective is a chain of *stages*. Every transfer of a stage starts when the previous stage
has been delivered in full (a barrier), which is how the synchronised steps of a ring or the
intra-host / inter-host phases of a hierarchical algorithm depend on each other.

Inside a stage, transfers that share a ``group`` id are *coupled*: they are the pipelined
streams of one ring (NCCL moves chunks around the ring, so every hop advances at the pace of the
slowest hop) and the engine gives them one common rate. ``group == -1`` marks an independent
transfer (e.g. one pair of an AlltoAll) that gets its own max-min rate.

``hops`` is how many message latencies (α, the per-message cost of NIC, switches and
propagation) lie on the critical path of the stage: 1 for one step, ``2(n-1)`` for an
AllReduce ring run as concurrent streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray


class Op(StrEnum):
    """Collective operations, named as in NCCL."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"


# nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor(n)
def busbw_factor(op: Op, n_ranks: int) -> float:
    """The nccl-tests bus-bandwidth factor for ``op`` over ``n_ranks`` ranks.

    >>> busbw_factor(Op.ALLREDUCE, 8)
    1.75
    >>> busbw_factor(Op.BROADCAST, 8)
    1.0
    """
    n = n_ranks
    if n <= 1:
        return 0.0 if op is not Op.BROADCAST else 1.0
    if op is Op.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if op in (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLTOALL):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True, slots=True)
class Stage:
    """One barrier-separated phase of a collective: parallel transfers between GPUs.

    ``src``, ``dst``, ``size_bytes`` and ``group`` are equal-length arrays (one row per
    transfer). Sizes are payload bytes (headers are added by the data plane).
    """

    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    size_bytes: NDArray[np.int64]
    group: NDArray[np.int64]
    hops: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        n = len(self.src)
        if not (len(self.dst) == len(self.size_bytes) == len(self.group) == n):
            raise ValueError("stage arrays must have equal length")
        if n and np.any(self.src == self.dst):
            raise ValueError("a transfer must not have src == dst")
        if n and np.any(self.size_bytes < 0):
            raise ValueError("transfer sizes must be >= 0")
        if self.hops < 1:
            raise ValueError("hops must be >= 1")

    @property
    def n_transfers(self) -> int:
        return len(self.src)

    @property
    def total_bytes(self) -> int:
        return int(self.size_bytes.sum())


@dataclass(frozen=True, slots=True)
class CollectivePlan:
    """A collective call as the data plane sees it.

    ``size_bytes`` is nccl-tests' ``S`` for ``op`` (see ``busbw_factor``), so
    ``algbw = size_bytes / time`` and ``busbw = algbw * busbw_factor(op, n_ranks)``.
    """

    op: Op
    ranks: tuple[int, ...]
    size_bytes: int
    algorithm: str
    stages: tuple[Stage, ...] = field(default_factory=tuple)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def total_bytes(self) -> int:
        return sum(s.total_bytes for s in self.stages)
