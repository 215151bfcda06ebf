"""Collective generators: what an NCCL-style collective asks the fabric to carry.

Every generator is a pure function of the ranks (global GPU ids, in ring order) and the
nccl-tests size ``S`` (see ``fabricpilot.workload.plan.busbw_factor`` for what ``S`` means per
operation). It returns a tuple of ``Stage`` (barrier-separated phases); ``build_collective``
wraps them in a ``CollectivePlan``.

GPU ids are global ints. With ``gpus_per_host`` ``g``, GPU ``x`` sits on host ``x // g`` with
local rank ``x % g`` (on rail-optimised hosts the local rank is also the rail).

Two modes for rings:

* ``"stream"``: one stage in which every neighbour pair of the ring streams its whole share at
  once; the transfers share one coupled ``group`` (the ring advances at the pace of its slowest
  hop) and ``hops`` carries the latency term (e.g. ``2(n-1)`` for AllReduce).
* ``"steps"``: the textbook synchronised algorithm, one stage per ring step, chunks of
  ``ceil(S/n)``, independent transfers, ``hops == 1``.

Sizes are rounded up to whole bytes with ``ceil`` on the exact rational value, so the bytes a
rank sends are never below the textbook cost. The arrays of the returned stages are read-only:
the stages of a ``steps`` ring share them (2(n-1) copies of an 8192-rank ring would not fit).

Construction is vectorised with numpy: no Python loop per transfer, only loops over ring steps
(which build ``Stage`` objects around shared arrays).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fabricpilot.workload.plan import CollectivePlan, Op, Stage

__all__ = [
    "ALGORITHMS",
    "MODES",
    "LinkCosts",
    "allreduce_estimates_ns",
    "alltoall",
    "broadcast",
    "btree_parents",
    "build_collective",
    "dtree_parents",
    "hierarchical_allreduce",
    "hierarchical_alltoall",
    "host_matrix",
    "rail_rings",
    "rail_trees",
    "rails_collective",
    "ring_allgather",
    "ring_allreduce",
    "ring_reducescatter",
    "tree_allreduce",
]

ALGORITHMS: tuple[str, ...] = ("auto", "ring", "rails", "hierarchical", "tree", "flat")
MODES: tuple[str, ...] = ("stream", "steps")

Ranks = Sequence[int] | NDArray[np.integer]

# Explicit algorithms each operation supports (``auto`` is resolved to one of these).
_SUPPORTED: dict[Op, tuple[str, ...]] = {
    Op.ALLREDUCE: ("ring", "rails", "hierarchical", "tree"),
    Op.REDUCESCATTER: ("ring", "rails"),
    Op.ALLGATHER: ("ring", "rails"),
    Op.BROADCAST: ("ring", "rails"),
    Op.ALLTOALL: ("flat", "hierarchical"),
}


def supported_algorithms(op: Op) -> tuple[str, ...]:
    """The algorithms ``op`` can be built with, besides ``"auto"``.

    >>> supported_algorithms(Op.BROADCAST)
    ('ring', 'rails')
    """
    return _SUPPORTED[op]


# --------------------------------------------------------------------------- helpers


def _ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, exact for any size (no float rounding)."""
    return -(-a // b)


def _ranks_array(ranks: Ranks | ArrayLike) -> NDArray[np.int64]:
    """Validate ``ranks`` (1-D, integral, >= 0, distinct) and return them as int64."""
    arr = np.asarray(ranks)
    if arr.ndim != 1:
        raise ValueError(f"ranks must be a 1-D sequence of GPU ids, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("ranks must not be empty")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ranks must be integer GPU ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=True)  # ours: the stages built from it are read-only
    if np.any(arr < 0):
        raise ValueError("GPU ids in ranks must be >= 0")
    uniq, counts = np.unique(arr, return_counts=True)
    if len(uniq) != len(arr):
        dups = uniq[counts > 1][:5].tolist()
        raise ValueError(f"ranks must be distinct; repeated GPU ids: {dups}")
    return arr


def _size(size_bytes: int) -> int:
    """Validate a byte count (integral, >= 0) and return it as a Python int."""
    try:
        s = operator.index(size_bytes)
    except TypeError:
        raise ValueError(f"size_bytes must be an integer, got {size_bytes!r}") from None
    if s < 0:
        raise ValueError(f"size_bytes must be >= 0, got {s}")
    return s


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def _full(n: int, value: int) -> NDArray[np.int64]:
    return np.full(n, value, dtype=np.int64)


def _frozen(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """Mark every array of ``stages`` read-only (step stages share their arrays)."""
    for st in stages:
        for a in (st.src, st.dst, st.size_bytes, st.group):
            a.setflags(write=False)
    return stages


def _ordered_pairs(m: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """All ordered pairs ``(i, j)``, ``i != j``, of ``range(m)``, without an ``m x m`` mask.

    >>> [a.tolist() for a in _ordered_pairs(3)]
    [[0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]]
    """
    if m < 2:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    idx = np.arange(m * (m - 1), dtype=np.int64)
    i = idx // (m - 1)
    k = idx % (m - 1)
    j = k + (k >= i)
    return i, j


def _ring_stages(
    src: NDArray[np.int64],
    dst: NDArray[np.int64],
    *,
    share_num: int,
    chunk: int,
    steps: int,
    group: NDArray[np.int64],
    mode: str,
    label: str,
) -> tuple[Stage, ...]:
    """Stages of one or more parallel rings (``src[i] -> dst[i]`` are the ring hops).

    ``stream``: one stage where each hop carries ``share_num`` bytes (already rounded), coupled
    by ``group``, ``hops == steps``. ``steps``: ``steps`` stages of ``chunk`` bytes, group -1.
    """
    t = len(src)
    if mode == "stream":
        return _frozen((
            Stage(src=src, dst=dst, size_bytes=_full(t, share_num), group=group,
                  hops=steps, label=label),
        ))
    sizes = _full(t, chunk)
    indep = _full(t, -1)
    return _frozen(tuple(
        Stage(src=src, dst=dst, size_bytes=sizes, group=indep, hops=1,
              label=f"{label} step {k + 1}/{steps}")
        for k in range(steps)
    ))


def host_matrix(ranks: Ranks, gpus_per_host: int) -> NDArray[np.int64]:
    """Arrange a job's GPUs as an ``(h, g_local)`` matrix: one row per host, one column per slot.

    Hosts (rows) are ordered by first appearance in ``ranks``; within a host, GPUs are sorted by
    local rank, so column ``k`` holds the ``k``-th lowest local rank of every host (the same rail
    on every host when the job uses the same local ranks everywhere). Raises ``ValueError`` when
    the hosts do not all hold the same number of the job's GPUs.

    >>> host_matrix([5, 4, 0, 1], gpus_per_host=4).tolist()
    [[4, 5], [0, 1]]
    """
    arr = _ranks_array(ranks)
    g = operator.index(gpus_per_host)
    if g < 1:
        raise ValueError(f"gpus_per_host must be >= 1, got {g}")
    hosts = arr // g
    uniq, first, inverse, counts = np.unique(
        hosts, return_index=True, return_inverse=True, return_counts=True
    )
    # position of each host in order of first appearance
    order = np.argsort(first, kind="stable")
    pos_of_uniq = np.empty(len(uniq), dtype=np.int64)
    pos_of_uniq[order] = np.arange(len(uniq), dtype=np.int64)
    host_pos = pos_of_uniq[inverse.reshape(-1)]
    if np.any(counts != counts[0]):
        detail = ", ".join(
            f"host {int(uniq[i])}: {int(counts[i])}" for i in order[:8]
        )
        more = ", ..." if len(uniq) > 8 else ""
        raise ValueError(
            "hierarchical algorithms need the job to use the same number of GPUs on every "
            f"host it spans (gpus_per_host={g}); got {detail}{more}"
        )
    sort = np.lexsort((arr, host_pos))
    return arr[sort].reshape(len(uniq), int(counts[0]))


# --------------------------------------------------------------------------- rings


def ring_allreduce(ranks: Ranks, size_bytes: int, *, mode: str = "stream") -> tuple[Stage, ...]:
    """Ring AllReduce of ``size_bytes`` (``S``, bytes per rank) over ``ranks`` in ring order.

    ``stream``: one stage, ``ranks[i] -> ranks[i+1]`` each carrying ``ceil(2(n-1)S/n)``, all in
    coupled group 0, ``hops = 2(n-1)``. ``steps``: ``2(n-1)`` stages (ReduceScatter then
    AllGather) of ``ceil(S/n)`` per transfer, independent, ``hops = 1``. One rank: no stages.

    >>> (st,) = ring_allreduce([0, 1, 2, 3], 1000)
    >>> st.dst.tolist(), st.size_bytes.tolist(), st.hops
    ([1, 2, 3, 0], [1500, 1500, 1500, 1500], 6)
    >>> len(ring_allreduce([0, 1, 2, 3], 1000, mode="steps"))
    6
    """
    _check_mode(mode)
    arr = _ranks_array(ranks)
    s = _size(size_bytes)
    n = len(arr)
    if n == 1:
        return ()
    return _ring_stages(
        arr, np.roll(arr, -1), share_num=_ceil_div(2 * (n - 1) * s, n),
        chunk=_ceil_div(s, n), steps=2 * (n - 1), group=_full(n, 0), mode=mode,
        label="ring-allreduce",
    )


def ring_reducescatter(
    ranks: Ranks, size_bytes: int, *, mode: str = "stream"
) -> tuple[Stage, ...]:
    """Ring ReduceScatter; ``size_bytes`` is ``S`` = per-rank output × n (nccl-tests).

    ``stream``: one coupled stage, ``ceil((n-1)S/n)`` per hop, ``hops = n-1``. ``steps``:
    ``n-1`` stages of ``ceil(S/n)``.

    >>> (st,) = ring_reducescatter([0, 1, 2, 3], 1000)
    >>> st.size_bytes.tolist(), st.hops
    ([750, 750, 750, 750], 3)
    """
    return _ring_half(ranks, size_bytes, mode=mode, label="ring-reducescatter")


def ring_allgather(ranks: Ranks, size_bytes: int, *, mode: str = "stream") -> tuple[Stage, ...]:
    """Ring AllGather; ``size_bytes`` is ``S`` = per-rank input × n (nccl-tests).

    Same traffic as ``ring_reducescatter``: ``stream`` is one coupled stage of
    ``ceil((n-1)S/n)`` per hop with ``hops = n-1``; ``steps`` is ``n-1`` stages of ``ceil(S/n)``.

    >>> stages = ring_allgather([7, 3, 5], 300, mode="steps")
    >>> len(stages), stages[0].src.tolist(), stages[0].dst.tolist(), stages[0].size_bytes.tolist()
    (2, [7, 3, 5], [3, 5, 7], [100, 100, 100])
    """
    return _ring_half(ranks, size_bytes, mode=mode, label="ring-allgather")


def _ring_half(ranks: Ranks, size_bytes: int, *, mode: str, label: str) -> tuple[Stage, ...]:
    _check_mode(mode)
    arr = _ranks_array(ranks)
    s = _size(size_bytes)
    n = len(arr)
    if n == 1:
        return ()
    return _ring_stages(
        arr, np.roll(arr, -1), share_num=_ceil_div((n - 1) * s, n),
        chunk=_ceil_div(s, n), steps=n - 1, group=_full(n, 0), mode=mode, label=label,
    )


def broadcast(ranks: Ranks, size_bytes: int, root: int = 0) -> tuple[Stage, ...]:
    """Pipelined chain Broadcast of ``S`` bytes from ``ranks[root]`` (``root`` is an index).

    The chain follows the ring order starting at the root: ``n-1`` transfers of ``S`` bytes,
    coupled (group 0), ``hops = n-1``.

    >>> (st,) = broadcast([0, 1, 2, 3], 64, root=2)
    >>> st.src.tolist(), st.dst.tolist(), st.size_bytes.tolist(), st.hops
    ([2, 3, 0], [3, 0, 1], [64, 64, 64], 3)
    """
    arr = _ranks_array(ranks)
    s = _size(size_bytes)
    n = len(arr)
    r = operator.index(root)
    if not 0 <= r < n:
        raise ValueError(f"root must be an index into ranks (0..{n - 1}), got {r}")
    if n == 1:
        return ()
    chain = np.roll(arr, -r)
    return _frozen((
        Stage(src=chain[:-1].copy(), dst=chain[1:].copy(), size_bytes=_full(n - 1, s),
              group=_full(n - 1, 0), hops=n - 1, label="chain-broadcast"),
    ))


# --------------------------------------------------------------------------- rail rings


def rail_rings(m: NDArray[np.int64], root: int | None = None
               ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                          NDArray[np.bool_]]:
    """The transfers of ``g`` rings over a ``(h, g)`` host matrix (see ``host_matrix``), one
    per rail, as NCCL runs a collective in channels on rail-optimised hosts.

    Ring ``c`` visits the hosts in row order and, on every host, its GPUs from slot ``c``
    on (``c, c+1, ..., c-1``, NVLink). It leaves a host from the rail ``c`` GPU, which
    sends to the rail ``c`` GPU of the next host: the last GPU of the host's order first
    hands its data over NVLink to the rail's GPU (PXN), so every inter-host hop stays on
    its rail and each NIC carries the inter-host hop of one ring. Per host a ring thus has
    ``g - 1`` ring hops, one hand-over hop and one inter-host hop; the hand-over carries
    what the ring hop out of the host would (``h = 1``: the rings stay within the host, no
    hand-over). With ``root`` (an index into the ring order of ring 0's host matrix, i.e.
    ``m.reshape(-1)``), each ring is a chain from that GPU instead (Broadcast): the ring
    order from the root, without the hop back to it (nor a hand-over to the root, which has
    the data: it sends on its own).

    Returns ``src``, ``dst``, the ring (``0..g-1``) of every transfer and whether it is one
    of the ring's logical hops (``False``: a hand-over). Each ring carries its hops in ring
    order.

    >>> m = np.array([[0, 1], [2, 3]])
    >>> src, dst, ring, logical = rail_rings(m)
    >>> list(zip(src.tolist(), dst.tolist()))[:6]  # ring 0, hand-overs 1 -> 0 and 3 -> 2
    [(0, 1), (1, 0), (0, 2), (2, 3), (3, 2), (2, 0)]
    >>> ring.tolist()[5:7], logical.tolist()[:3]
    ([0, 1], [True, False, True])
    """
    h, g = m.shape
    n = h * g
    root_gpu = -1 if root is None else int(m.reshape(-1)[root])
    at = np.arange(n, dtype=np.int64)
    leaves = (at % g == g - 1) & (h > 1)  # a ring's hop out of its host
    parts: list[tuple[NDArray[np.int64], ...]] = []
    for c in range(g):  # (one ring per rail: no loop per transfer)
        order = np.roll(m, -c, axis=1)  # each host's GPUs from slot c on
        seq = order.reshape(-1)
        rail = order[at // g, 0]  # the rail c GPU of each hop's host
        hand = leaves & (seq != rail) & (rail != root_gpu)
        if root is None:
            keep = at
        else:  # a chain from the root: the ring's hops from it on, but the last
            start = int(np.flatnonzero(seq == root_gpu)[0])
            keep = (start + at[:-1]) % n
        first = seq[keep]
        src = np.where(leaves, rail, seq)[keep]
        dst = np.roll(seq, -1)[keep]
        hk = hand[keep]
        count = 1 + hk.astype(np.int64)  # a hand-over, then the hop
        pos = np.cumsum(count) - 1
        t_src = np.empty(int(count.sum()), np.int64)
        t_dst = np.empty_like(t_src)
        logical = np.zeros(len(t_src), np.bool_)
        t_src[pos], t_dst[pos], logical[pos] = src, dst, True
        t_src[pos[hk] - 1], t_dst[pos[hk] - 1] = first[hk], rail[keep][hk]
        parts.append((t_src, t_dst, np.full(len(t_src), c, np.int64), logical))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))


def rails_collective(op: Op, ranks: Ranks, size_bytes: int, gpus_per_host: int, *,
                     mode: str = "stream", root: int = 0) -> tuple[Stage, ...]:
    """``op`` (AllReduce, ReduceScatter, AllGather or Broadcast) run over ``g`` rail rings
    (``rail_rings``; ``g`` job GPUs per host), each ring carrying ``1/g`` of ``S``, as NCCL
    spreads a ring collective over channels: a ring hop carries ``ceil(f * S / (n g))``
    bytes, ``f`` being ``2(n-1)`` for AllReduce, ``n-1`` for ReduceScatter / AllGather and
    ``n`` for Broadcast (each chain hop forwards all of its ring's ``S / g``), with ``hops``
    the ring's steps (``2(n-1)``, ``n-1``, ``n-1``). Each GPU's NIC thus carries ``1/g`` of
    what a single ring's inter-host hop would. ``root`` is an index into ``ranks`` (Broadcast
    only).

    >>> (st,) = rails_collective(Op.ALLGATHER, range(4), 800, gpus_per_host=2)
    >>> st.n_transfers, st.size_bytes.tolist()[:2], st.hops
    (12, [300, 300], 3)
    """
    _check_mode(mode)
    m = host_matrix(ranks, gpus_per_host)
    s = _size(size_bytes)
    h, g = m.shape
    n = h * g
    if n == 1:
        return ()
    if op is Op.BROADCAST:
        arr = _ranks_array(ranks)
        r = operator.index(root)
        if not 0 <= r < n:
            raise ValueError(f"root must be an index into ranks (0..{n - 1}), got {r}")
        at = int(np.flatnonzero(m.reshape(-1) == arr[r])[0])
        src, dst, ring, _ = rail_rings(m, at)
        share = _ceil_div(s, g)
        return _ring_stages(src, dst, share_num=share, chunk=share, steps=n - 1, group=ring,
                            mode="stream", label="rails-broadcast")
    steps = 2 * (n - 1) if op is Op.ALLREDUCE else n - 1
    if op not in (Op.ALLREDUCE, Op.REDUCESCATTER, Op.ALLGATHER):
        raise ValueError(f"{op.value} does not run over rings")
    src, dst, ring, _ = rail_rings(m)
    return _ring_stages(src, dst, share_num=_ceil_div(steps * s, n * g),
                        chunk=_ceil_div(s, n * g), steps=steps, group=ring, mode=mode,
                        label=f"rails-{op.value}")


# --------------------------------------------------------------------------- alltoall


def alltoall(ranks: Ranks, size_bytes: int) -> tuple[Stage, ...]:
    """Flat AlltoAll: every ordered pair ``i != j`` sends ``ceil(S/n)`` (``S`` bytes per rank).

    One stage of ``n(n-1)`` independent transfers (group -1), ``hops = 1``.

    >>> (st,) = alltoall([0, 1, 2, 3], 400)
    >>> st.n_transfers, set(st.size_bytes.tolist()), st.hops
    (12, {100}, 1)
    """
    arr = _ranks_array(ranks)
    s = _size(size_bytes)
    n = len(arr)
    if n == 1:
        return ()
    i, j = _ordered_pairs(n)
    t = len(i)
    return _frozen((
        Stage(src=arr[i], dst=arr[j], size_bytes=_full(t, _ceil_div(s, n)), group=_full(t, -1),
              hops=1, label="alltoall"),
    ))


def hierarchical_alltoall(
    ranks: Ranks, size_bytes: int, gpus_per_host: int, *, pipelined: bool = True
) -> tuple[Stage, ...]:
    """AlltoAll in NCCL PXN style on rail-optimised hosts (``S`` bytes per rank).

    With ``h`` hosts of ``g`` job GPUs each (``n = h g``, chunk ``c = ceil(S/n)``), see
    ``host_matrix`` for the (host, slot) layout:

    * stage A (intra-host, NVLink): ``(a, r) -> (a, r')`` for ``r' != r`` carries the chunks
      ``(a, r)`` owes local slot ``r'`` of *every* host: ``h c`` bytes; skipped if ``g == 1``;
    * stage B (inter-host, same rail): ``(a, r) -> (b, r)`` for ``b != a`` carries the chunks
      every GPU of host ``a`` owes ``(b, r)``: ``g c`` bytes; skipped if ``h == 1``.

    All transfers are independent (group -1). NCCL pipelines the two: a chunk goes on by
    rail as soon as it has come over NVLink, so both run at once (``pipelined``, one stage
    of two message latencies, ``hops = 2``, as ``collective`` plans it: its time is the
    slower of the NVLink and the rail traffic, not their sum); unpipelined they are two
    stages of one latency each (``pxn-intra``, then ``pxn-rail``).

    >>> a, b = hierarchical_alltoall(range(8), 800, gpus_per_host=4, pipelined=False)
    >>> a.n_transfers, int(a.size_bytes[0]), b.n_transfers, int(b.size_bytes[0])
    (24, 200, 8, 400)
    >>> (both,) = hierarchical_alltoall(range(8), 800, gpus_per_host=4)
    >>> both.n_transfers, both.hops, both.label
    (32, 2, 'pxn')
    """
    m = host_matrix(ranks, gpus_per_host)
    s = _size(size_bytes)
    h, g = m.shape
    n = h * g
    if n == 1:
        return ()
    c = _ceil_div(s, n)
    stages: list[Stage] = []
    if g > 1:
        pi, pj = _ordered_pairs(g)
        src = m[:, pi].reshape(-1)
        dst = m[:, pj].reshape(-1)
        stages.append(Stage(src=src, dst=dst, size_bytes=_full(len(src), h * c),
                            group=_full(len(src), -1), hops=1, label="pxn-intra"))
    if h > 1:
        qi, qj = _ordered_pairs(h)
        src = m[qi, :].reshape(-1)
        dst = m[qj, :].reshape(-1)
        stages.append(Stage(src=src, dst=dst, size_bytes=_full(len(src), g * c),
                            group=_full(len(src), -1), hops=1, label="pxn-rail"))
    if pipelined and len(stages) == 2:
        a, b = stages
        stages = [Stage(src=np.concatenate([a.src, b.src]), dst=np.concatenate([a.dst, b.dst]),
                        size_bytes=np.concatenate([a.size_bytes, b.size_bytes]),
                        group=np.concatenate([a.group, b.group]), hops=2, label="pxn")]
    return _frozen(tuple(stages))


# --------------------------------------------------------------------------- hierarchical AR


def hierarchical_allreduce(
    ranks: Ranks, size_bytes: int, gpus_per_host: int, *, mode: str = "stream"
) -> tuple[Stage, ...]:
    """Hierarchical AllReduce: intra-host ReduceScatter, per-rail AllReduce, intra-host AllGather.

    ``S`` is bytes per rank; ``h`` hosts with ``g`` job GPUs each (see ``host_matrix``).

    * A: per host, a ring ReduceScatter of ``S`` over its ``g`` GPUs: ``ceil((g-1)S/g)`` per
      hop, one coupled group per host (group id = host position), ``hops = g-1``; skipped if
      ``g == 1``.
    * B: per slot ``r`` (a rail), a ring AllReduce of ``S/g`` bytes per rank over the ``h``
      hosts. ``stream``: ``ceil(2(h-1)S/(g h))`` per hop, one coupled group per rail (group id =
      slot), ``hops = 2(h-1)``; ``steps``: ``2(h-1)`` stages of ``ceil(S/(g h))``, independent.
      Skipped if ``h == 1``.
    * C: per host, a ring AllGather, the mirror of A.

    A and C are the same in both modes (NVLink streams); ``mode`` applies to the inter-host
    stage B only.

    >>> a, b, c = hierarchical_allreduce(range(8), 800, gpus_per_host=4)
    >>> int(a.size_bytes[0]), a.hops, int(b.size_bytes[0]), b.hops, b.n_transfers
    (600, 3, 200, 2, 8)
    """
    _check_mode(mode)
    m = host_matrix(ranks, gpus_per_host)
    s = _size(size_bytes)
    h, g = m.shape
    rail: tuple[Stage, ...] = ()
    if h > 1:
        src = m.reshape(-1)
        dst = np.roll(m, -1, axis=0).reshape(-1)
        grp = np.tile(np.arange(g, dtype=np.int64), h)
        rail = _ring_stages(
            src, dst, share_num=_ceil_div(2 * (h - 1) * s, g * h),
            chunk=_ceil_div(s, g * h), steps=2 * (h - 1), group=grp, mode=mode,
            label="rail-allreduce",
        )
    return _around_hosts(m, s, rail)


def _around_hosts(m: NDArray[np.int64], s: int, middle: tuple[Stage, ...]
                  ) -> tuple[Stage, ...]:
    """``middle`` (the inter-host stages of a hierarchical AllReduce of ``s`` bytes per rank
    over the host matrix ``m``) between an intra-host ring ReduceScatter and the mirror
    AllGather: ``ceil((g-1)s/g)`` per NVLink hop, one coupled group per host, ``hops = g-1``
    (none if ``g == 1``)."""
    h, g = m.shape
    if g == 1:
        return _frozen(middle)
    src = m.reshape(-1)
    dst = np.roll(m, -1, axis=1).reshape(-1)
    grp = np.repeat(np.arange(h, dtype=np.int64), g)
    size = _full(len(src), _ceil_div((g - 1) * s, g))
    return _frozen((
        Stage(src=src, dst=dst, size_bytes=size, group=grp, hops=g - 1,
              label="intra-reducescatter"),
        *middle,
        Stage(src=src, dst=dst, size_bytes=size, group=grp, hops=g - 1,
              label="intra-allgather"),
    ))


# --------------------------------------------------------------------------- trees


def btree_parents(n: int) -> NDArray[np.int64]:
    """The parent of each position ``0..n-1`` in NCCL's binary tree (``-1``: the root, 0).

    Position ``r`` with lowest set bit ``b`` hangs under ``(r ^ b) | (b << 1)``, or
    ``r ^ b`` where that is out of range: odd positions are leaves, and the root has one
    child, the largest power of two below ``n``, atop a tree at most ``ceil(log2 n)`` deep.

    >>> btree_parents(14).tolist()  # (0 - 8; 8 - 4, 12; 4 - 2, 6; 12 - 10, 13; ...)
    [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12]
    """
    r = np.arange(n, dtype=np.int64)
    parent = np.full(n, -1, np.int64)
    rest = r[1:]
    low = rest & -rest
    up = (rest ^ low) | (low << 1)
    parent[1:] = np.where(up < n, up, rest ^ low)
    return parent


def dtree_parents(n: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """NCCL's double binary tree over positions ``0..n-1``: :func:`btree_parents`, and the
    same tree mirrored (``r -> n-1-r``, ``n`` even; root ``n-1``) or shifted by one (``n``
    odd; root 1), so that a position interior to one tree is a leaf of the other (but for
    position 0 when ``n`` is odd) and every position sends and receives at most four of the
    two trees' transfers.

    >>> [p.tolist() for p in dtree_parents(4)]
    [[-1, 2, 0, 2], [1, 3, 1, -1]]
    >>> [p.tolist() for p in dtree_parents(3)]
    [[-1, 2, 0], [1, -1, 0]]
    """
    p0 = btree_parents(n)
    r = np.arange(n, dtype=np.int64)
    if n % 2 == 0:
        q = p0[n - 1 - r]
        p1 = np.where(q >= 0, n - 1 - q, -1)
    else:
        q = p0[(r - 1) % n]
        p1 = np.where(q >= 0, (q + 1) % n, -1)
    return p0, p1


def _tree_depth(parent: NDArray[np.int64]) -> int:
    """The most edges from any position up to the root of a parent array.

    >>> _tree_depth(btree_parents(14))
    4
    """
    depth = 0
    cur = parent.copy()
    while (cur >= 0).any():
        depth += 1
        cur = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
    return depth


def rail_trees(m: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """The transfers of one double binary tree pair per rail (column of the ``(h, g)`` host
    matrix ``m``, ``h >= 2``) over the hosts, in both directions (reduce up, broadcast down):
    ``src``, ``dst`` (rail-major: the first ``4(h-1)`` are rail 0's) and the hops of the
    pipeline (up the deeper tree and down again).

    >>> src, dst, hops = rail_trees(np.arange(4).reshape(4, 1))  # (NCCL's 4-rank trees)
    >>> sorted(zip(src.tolist(), dst.tolist()))[:6], hops
    ([(0, 1), (0, 2), (1, 0), (1, 2), (1, 2), (1, 3)], 4)
    """
    h, _ = m.shape
    trees = dtree_parents(h)
    child = np.concatenate([np.flatnonzero(p >= 0) for p in trees])
    parent = np.concatenate([p[p >= 0] for p in trees])
    up_pos = np.concatenate([child, parent])  # (reduce: child -> parent; then the reverse)
    down_pos = np.concatenate([parent, child])
    src = m[up_pos].T.reshape(-1)
    dst = m[down_pos].T.reshape(-1)
    return src, dst, 2 * max(_tree_depth(p) for p in trees)


def tree_allreduce(ranks: Ranks, size_bytes: int, gpus_per_host: int = 1
                   ) -> tuple[Stage, ...]:
    """Tree AllReduce: intra-host ReduceScatter, per rail a pipelined double binary tree
    AllReduce over the hosts, intra-host AllGather (the shape of NCCL's NVLS tree, with
    NVLink rings where NVLS reduces in the NVSwitch; with one GPU per host, NCCL's tree
    over the ranks).

    ``S`` is bytes per rank; ``h`` hosts with ``g`` job GPUs each (see ``host_matrix``).
    The intra-host stages are those of ``hierarchical_allreduce``. Each rail's GPUs then
    hold ``S/g`` to AllReduce across the hosts, half on each tree of :func:`dtree_parents`
    (over host positions): every tree edge carries ``ceil(S/(2g))`` up (reduce) and as much
    down (broadcast), all at once, as the chunks of the pipeline do; a rail's transfers are
    one coupled group (group id = rail), ``hops = 2 x`` the deeper tree's depth (a chunk's
    way up and down again), against a ring's ``2(h-1)``. A GPU sends and receives at most
    four of them (``2S/g``), as much as a ring's ``2(h-1)/h S/g`` to within ``1/h``: trees
    trade a little bandwidth for latency logarithmic in the hosts.

    >>> a, b, c = tree_allreduce(range(32), 800, gpus_per_host=4)  # (8 hosts)
    >>> b.label, b.n_transfers, int(b.size_bytes[0]), b.hops  # (4 rails x 2 trees x 7 x 2)
    ('rail-tree-allreduce', 112, 100, 6)
    """
    m = host_matrix(ranks, gpus_per_host)
    s = _size(size_bytes)
    h, g = m.shape
    middle: tuple[Stage, ...] = ()
    if h > 1:
        src, dst, hops = rail_trees(m)
        per_rail = len(src) // g
        middle = (Stage(src=src, dst=dst, size_bytes=_full(len(src), _ceil_div(s, 2 * g)),
                        group=np.repeat(np.arange(g, dtype=np.int64), per_rail), hops=hops,
                        label="rail-tree-allreduce"),)
    return _around_hosts(m, s, middle)


# --------------------------------------------------------------------------- auto: AllReduce


@dataclass(frozen=True)
class LinkCosts:
    """What ``auto`` weighs an AllReduce's algorithms by, from the fabric: the NIC and NVLink
    rates (Gb/s) and ``latency_ns(src, dst)``, one message's latency (the α of one ring
    step) over the slowest of the GPU pairs ``src[i] -> dst[i]``."""

    nic_gbps: float
    nvlink_gbps: float
    latency_ns: Callable[[NDArray[np.int64], NDArray[np.int64]], float]


def allreduce_estimates_ns(m: NDArray[np.int64], size_bytes: int, costs: LinkCosts
                           ) -> dict[str, float]:
    """α-β estimates of an AllReduce of ``size_bytes`` per rank over the ``(h, g)`` host
    matrix ``m`` (``g > 1`` GPUs on each of ``h > 1`` hosts), as NCCL's tuner weighs its
    algorithms, with the twin's stage timing (``hops`` latencies, then the bytes at the
    slowest hop's rate; congestion aside):

    * ``rails``: ``2(n-1)`` steps of the rail rings' slowest step latency; each NIC carries
      ``2(n-1)/(n g) S`` and each GPU's NVLink port ``2(n-1)/n S`` (a hop of every ring);
    * ``hierarchical``: two NVLink stages of ``g-1`` steps and ``(g-1)/g S`` each, then the
      rail stage of ``2(h-1)`` steps carrying ``2(h-1)/(h g) S`` per NIC;
    * ``tree``: the same NVLink stages, then the rail trees (``tree_allreduce``): twice the
      deeper tree's depth in steps, and ``S/(2g)`` on each of a GPU's (at most four) tree
      transfers, which share its NIC.

    A ring's latency grows with its GPUs, the hierarchical one's rail stage with the hosts,
    the trees' with the logarithm of the hosts: rails win on few hosts and large messages,
    trees on many hosts or small messages (on two hosts trees and the hierarchical rail
    ring are the same cost).

    >>> flat = lambda src, dst: 2000.0  # every message 2 us
    >>> c = LinkCosts(400.0, 3600.0, flat)
    >>> e = allreduce_estimates_ns(np.arange(64).reshape(8, 8), 1 << 28, c)
    >>> round(e["rails"]), round(e["hierarchical"])  # (2 x 63 x 2 us + 1.32 ms, ...)
    (1573206, 2274321)
    >>> e = allreduce_estimates_ns(np.arange(8192).reshape(1024, 8), 1 << 30, c)
    >>> e["rails"] > e["hierarchical"] > e["tree"]
    True
    """
    h, g = m.shape
    n = h * g
    bits = 8.0 * size_bytes
    nic, nvl = costs.nic_gbps, costs.nvlink_gbps  # (Gb/s: bits per ns)
    src, dst, _, logical = rail_rings(m)
    host = np.empty(int(m.max()) + 1, np.int64)
    host[m.reshape(-1)] = np.repeat(np.arange(h), g)
    on_host = host[src] == host[dst]
    inter = ~on_host  # (the rail pairs: the hierarchical rail stage's too)
    step_ns = costs.latency_ns(src[logical], dst[logical])
    rails = 2 * (n - 1) * step_ns + max(2 * (n - 1) / (n * g) * bits / nic,
                                        2 * (n - 1) / n * bits / nvl)
    rail_ns = costs.latency_ns(src[inter], dst[inter])
    nv_ns = costs.latency_ns(src[on_host], dst[on_host])
    intra = 2 * ((g - 1) * nv_ns + (g - 1) / g * bits / nvl)
    hier = intra + 2 * (h - 1) * rail_ns + 2 * (h - 1) / (h * g) * bits / nic
    t_src, t_dst, t_hops = rail_trees(m)
    fan = max(int(np.bincount(t_src).max()), int(np.bincount(t_dst).max()))
    tree = (intra + t_hops * costs.latency_ns(t_src, t_dst)
            + fan * bits / (2 * g) / nic)
    return {"rails": float(rails), "hierarchical": float(hier), "tree": float(tree)}


# --------------------------------------------------------------------------- entry point


def _resolve_auto(op: Op, arr: NDArray[np.int64], gpus_per_host: int,
                  size_bytes: int = 0, costs: LinkCosts | None = None) -> str:
    """``auto``: on multi-GPU hosts holding the same number of the job's GPUs each, across
    hosts, PXN for AlltoAll, rail rings for AllGather / ReduceScatter / Broadcast, and for
    AllReduce the fastest of rail rings, hierarchical and trees by
    ``allreduce_estimates_ns`` given the fabric's ``costs`` (hierarchical without them);
    with one GPU on each of several hosts and ``costs``, AllReduce the faster of the ring
    and trees (as NCCL on single-GPU nodes); else ring / flat."""
    flat_name = "flat" if op is Op.ALLTOALL else "ring"
    g = max(gpus_per_host, 1)
    _, counts = np.unique(arr // g, return_counts=True)
    spans_hosts = len(counts) >= 2
    multi_gpu_host = bool(np.any(counts > 1))
    equal = bool(np.all(counts == counts[0]))
    if op is Op.ALLREDUCE and costs is not None and spans_hosts and not multi_gpu_host:
        # one GPU per host: the ring over the ranks (the rail ring of one rail) or trees
        est = allreduce_estimates_ns(host_matrix(arr, g), size_bytes, costs)
        return "tree" if est["tree"] < est["hierarchical"] else "ring"
    if gpus_per_host <= 1:
        return flat_name
    if spans_hosts and multi_gpu_host and equal:
        if op is Op.ALLREDUCE and costs is not None:  # (the fastest by an α-β estimate)
            est = allreduce_estimates_ns(host_matrix(arr, gpus_per_host), size_bytes, costs)
            return min(est, key=est.__getitem__)
        return "hierarchical" if op in (Op.ALLREDUCE, Op.ALLTOALL) else "rails"
    return flat_name


def build_collective(
    op: Op | str,
    ranks: Ranks,
    size_bytes: int,
    *,
    gpus_per_host: int = 1,
    algorithm: str = "auto",
    mode: str = "stream",
    root: int = 0,
    costs: LinkCosts | None = None,
) -> CollectivePlan:
    """Build the ``CollectivePlan`` of one collective call.

    ``size_bytes`` is nccl-tests' ``S`` for ``op``. ``algorithm``: ``"ring"`` (AllReduce,
    ReduceScatter, AllGather, Broadcast: one ring over the ranks in order), ``"rails"`` (the
    same, over one ring per rail, see ``rails_collective``), ``"flat"`` (AlltoAll),
    ``"hierarchical"`` (AllReduce, AlltoAll; PXN for the latter), ``"tree"`` (AllReduce:
    double binary trees across the hosts, see ``tree_allreduce``) or ``"auto"``: when
    ``gpus_per_host > 1``, the job spans >= 2 hosts, some host holds > 1 of its GPUs and every
    host holds the same number (what the hierarchical and rail algorithms need), PXN for
    AlltoAll, rails for AllGather / ReduceScatter / Broadcast and for AllReduce the fastest
    of rails, hierarchical and tree by an α-β estimate from ``costs`` (the fabric's rates
    and latencies, :class:`LinkCosts`; hierarchical without them); with one GPU on each of
    several hosts and ``costs``, AllReduce the faster of ring and tree; else ring / flat.
    ``mode`` (``"stream"`` / ``"steps"``) applies to rings; AlltoAll, Broadcast and the tree
    AllReduce have a single form. ``CollectivePlan.algorithm`` records what was used:
    ``ring``, ``ring-steps``, ``rails``, ``rails-steps``, ``hierarchical``,
    ``hierarchical-steps``, ``tree``, ``flat`` or ``pxn``.

    >>> p = build_collective("allreduce", range(16), 1 << 20, gpus_per_host=8)
    >>> p.algorithm, [s.label for s in p.stages]
    ('hierarchical', ['intra-reducescatter', 'rail-allreduce', 'intra-allgather'])
    >>> build_collective("alltoall", [0, 1, 2, 3], 400).algorithm
    'flat'
    >>> build_collective("allgather", range(16), 1 << 20, gpus_per_host=8).algorithm
    'rails'
    """
    try:
        op = Op(op)
    except ValueError:
        allowed = ", ".join(o.value for o in Op)
        raise ValueError(f"unknown collective op {op!r}; expected one of {allowed}") from None
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    _check_mode(mode)
    arr = _ranks_array(ranks)
    s = _size(size_bytes)
    g = operator.index(gpus_per_host)
    if g < 1:
        raise ValueError(f"gpus_per_host must be >= 1, got {g}")

    algo = _resolve_auto(op, arr, g, s, costs) if algorithm == "auto" else algorithm
    if algo not in _SUPPORTED[op]:
        raise ValueError(
            f"algorithm {algo!r} is not available for {op.value}; "
            f"use one of auto, {', '.join(_SUPPORTED[op])}"
        )

    stages: tuple[Stage, ...]
    steps_suffix = "-steps" if mode == "steps" else ""
    if op is Op.ALLREDUCE and algo == "ring":
        stages, used = ring_allreduce(arr, s, mode=mode), "ring" + steps_suffix
    elif algo == "rails":
        stages = rails_collective(op, arr, s, g, mode=mode, root=root)
        used = "rails" + (steps_suffix if op is not Op.BROADCAST else "")
    elif op is Op.ALLREDUCE and algo == "tree":
        stages, used = tree_allreduce(arr, s, g), "tree"
    elif op is Op.ALLREDUCE:
        stages = hierarchical_allreduce(arr, s, g, mode=mode)
        used = "hierarchical" + steps_suffix
    elif op is Op.REDUCESCATTER:
        stages, used = ring_reducescatter(arr, s, mode=mode), "ring" + steps_suffix
    elif op is Op.ALLGATHER:
        stages, used = ring_allgather(arr, s, mode=mode), "ring" + steps_suffix
    elif op is Op.BROADCAST:
        stages, used = broadcast(arr, s, root=root), "ring"
    elif algo == "flat":
        stages, used = alltoall(arr, s), "flat"
    else:
        stages, used = hierarchical_alltoall(arr, s, g), "pxn"
    return CollectivePlan(
        op=op, ranks=tuple(int(x) for x in arr), size_bytes=s, algorithm=used, stages=stages
    )
