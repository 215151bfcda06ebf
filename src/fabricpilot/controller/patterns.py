"""The GPU pairs a collective call exchanges data between, and the QPs each pair gets.

:func:`pattern_pairs` gives a pattern's pairs over a job's GPUs (NCCL's rings per rail on
multi-GPU hosts, its double binary trees, every ordered pair of an AlltoAll) with the share
of the sender's NIC each uses; :func:`pair_shares` those shares for pairs a job declared
itself; :func:`pair_qps` how many QPs (plan parts) a pair is spread over. Pure functions on
GPU ids: the controller turns their pairs into demands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray


def pattern_pairs(pattern: str, gpus: tuple[int, ...],
                  host_of: Mapping[int, int] | None = None, algorithm: str = ""
                  ) -> list[tuple[int, int, float]]:
    """GPU pairs a collective exchanges data between, with the share of the sender's NIC
    each pair uses while the call runs: a ring (each GPU to the next, all of its NIC) for
    allreduce, allgather, reducescatter and broadcast; every ordered pair (the NIC shared by
    ``n - 1`` peers; with ``host_of``, by the peers on other hosts, NVLink by those on the
    sender's own: :func:`pair_shares`) for alltoall, unless NCCL runs it in PXN style
    (below).

    With ``host_of`` (GPU -> host) and a job holding the same number ``g > 1`` of GPUs on
    each of ``h >= 2`` hosts, a ring collective's pairs are those of NCCL's rings on such
    hosts (one ring per rail, each carrying ``1/g`` of the data; the hierarchical AllReduce
    uses the same pairs): each host's GPUs in a ring over NVLink (in GPU id order), and
    every GPU to the GPU of the same position on the next host (hosts in order of first
    appearance), all of its NIC each. One ring over the GPUs in rank order would instead
    send each host's whole traffic through one NIC, which NCCL does not.

    >>> pattern_pairs("allreduce", (4, 7, 9))
    [(4, 7, 1.0), (7, 9, 1.0), (9, 4, 1.0)]
    >>> pattern_pairs("alltoall", (0, 1, 2))[:2]
    [(0, 1, 0.5), (0, 2, 0.5)]
    >>> rails = pattern_pairs("allgather", (8, 9, 0, 1), {0: 0, 1: 0, 8: 1, 9: 1})
    >>> [(a, b) for a, b, _ in rails]  # (within each host, then along each rail)
    [(8, 9), (9, 8), (0, 1), (1, 0), (8, 0), (9, 1), (0, 8), (1, 9)]

    With ``host_of`` and such a job, an AlltoAll's pairs are those of NCCL's PXN (what NCCL
    does on rail-optimised hosts unless ``NCCL_P2P_PXN_LEVEL=0``; the twin's ``auto``, see
    :func:`~fabricpilot.workload.collectives.hierarchical_alltoall`): each GPU to the other
    GPUs of its host over NVLink (sharing it), and to the GPU of the same position on every
    other host (its rail; sharing its NIC with ``h - 1`` peers), which forwards what the
    rest of its host owes that peer. ``algorithm="flat"`` keeps every ordered pair through
    the NICs (PXN off):

    >>> pattern_pairs("alltoall", (0, 1, 8, 9), {0: 0, 1: 0, 8: 1, 9: 1})
    [(0, 1, 1.0), (1, 0, 1.0), (8, 9, 1.0), (9, 8, 1.0), (0, 8, 1.0), (1, 9, 1.0), \
(8, 0, 1.0), (9, 1, 1.0)]
    >>> len(pattern_pairs("alltoall", (0, 1, 8, 9), {0: 0, 1: 0, 8: 1, 9: 1}, "flat"))
    12

    ``algorithm="tree"`` (an AllReduce): the pairs of NCCL's double binary trees instead of
    the rings, over the hosts along each rail (over the GPUs in rank order, one tree node
    each, where the hosts are not even), both ways, with the NVLink rings within the
    hosts; each GPU's NIC shared by its tree transfers (:func:`pair_shares`; 2 -> 1 and
    1 -> 2 carry one transfer of each tree):

    >>> sorted(pattern_pairs("allreduce", (0, 1, 2, 3), algorithm="tree"))[:4]
    [(0, 1, 0.5), (0, 2, 0.5), (1, 0, 0.25), (1, 2, 0.5)]
    """
    n = len(gpus)
    if n < 2:
        return []
    if algorithm == "tree" and pattern == "allreduce":
        return pair_shares(_tree_transfers(gpus, host_of), host_of)
    if pattern == "alltoall":
        a, b, share = alltoall_pairs(gpus, host_of, algorithm)
        return list(zip(a.tolist(), b.tolist(), share.tolist(), strict=True))
    rows = _host_rows(gpus, host_of) if host_of is not None else None
    if rows is None:
        return [(gpus[i], gpus[(i + 1) % n], 1.0) for i in range(n)]
    h, g = len(rows), len(rows[0])
    intra = [(row[k], row[(k + 1) % g], 1.0) for row in rows for k in range(g)]
    rails = [(rows[a][k], rows[(a + 1) % h][k], 1.0) for a in range(h) for k in range(g)]
    return intra + rails


def alltoall_pairs(gpus: tuple[int, ...], host_of: Mapping[int, int] | None = None,
                   algorithm: str = "") -> tuple[NDArray[np.int64], NDArray[np.int64],
                                                 NDArray[np.float64]]:
    """The pairs of an AlltoAll over ``gpus`` as :func:`pattern_pairs` gives them, in its
    order, as arrays: senders, receivers and the share of the sender's NIC (or NVLink) each
    pair uses (a job's AlltoAll has tens of thousands of pairs: made at once).

    >>> a, b, share = alltoall_pairs((0, 1, 8, 9), {0: 0, 1: 0, 8: 1, 9: 1}, "flat")
    >>> a.tolist()[:3], b.tolist()[:3], share.tolist()[:3]  # (NVLink its own, NIC shared)
    ([0, 0, 0], [1, 8, 9], [1.0, 0.5, 0.5])
    """
    g_arr = np.asarray(gpus, np.int64)
    n = len(g_arr)
    if n < 2:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0, np.float64)
    rows = _host_rows(gpus, host_of) if host_of and algorithm != "flat" else None
    if rows is not None:  # (NCCL's PXN: within the hosts, then along the rails)
        # (as pair_shares gives them: NVLink shared by g - 1 peers, the NIC by h - 1)
        grid = np.array(rows, np.int64)
        h, g = grid.shape
        i, j = np.nonzero(~np.eye(g, dtype=np.bool_))  # (each row: i, then j != i)
        # (along the rails: sender host, position, then receiver host)
        sa, k, sb = np.nonzero(np.broadcast_to(~np.eye(h, dtype=np.bool_)[:, None, :],
                                               (h, g, h)))
        a = np.concatenate((grid[:, i].ravel(), grid[sa, k]))
        b = np.concatenate((grid[:, j].ravel(), grid[sb, k]))
        share = np.concatenate((np.full(h * len(i), 1.0 / (g - 1)),
                                np.full(len(sa), 1.0 / (h - 1))))
        return a, b, share
    # every ordered pair: each GPU to every other, in the job's order
    i, j = np.nonzero(~np.eye(n, dtype=np.bool_))
    a, b = g_arr[i], g_arr[j]
    if not host_of:
        return a, b, np.full(len(a), 1.0 / (n - 1))
    # (pair_shares's, per GPU: its host's other GPUs share its NVLink, the rest its NIC)
    hosts = np.array([host_of.get(x, -1 - x) for x in gpus], np.int64)
    _, at, count = np.unique(hosts, return_inverse=True, return_counts=True)
    c = count[at.ravel()]
    near, far = 1.0 / np.maximum(c - 1, 1), 1.0 / np.maximum(n - c, 1)
    return a, b, np.where(hosts[i] == hosts[j], near[i], far[i])


def pattern_transfers(pattern: str, gpus: tuple[int, ...],
                      host_of: Mapping[int, int] | None = None, algorithm: str = ""
                      ) -> list[tuple[int, int]]:
    """The GPU pairs of :func:`pattern_pairs`, each as many times as the call sends on it at
    once (a tree AllReduce's pairs that both trees use: twice): what a call declares as
    ``pairs`` to be planned as the pattern would be.

    >>> pattern_transfers("allreduce", (0, 1, 2, 3), algorithm="tree").count((1, 2))
    2
    """
    if algorithm == "tree" and pattern == "allreduce" and len(gpus) >= 2:
        return _tree_transfers(gpus, host_of)
    return [(a, b) for a, b, _ in pattern_pairs(pattern, gpus, host_of, algorithm)]


def _tree_transfers(gpus: tuple[int, ...], host_of: Mapping[int, int] | None
                    ) -> list[tuple[int, int]]:
    """The transfers of a tree AllReduce (see :func:`pattern_pairs`)."""
    from fabricpilot.workload.collectives import rail_trees  # (NCCL's tree shape)

    rows = _host_rows(gpus, host_of) if host_of else None
    if rows is None:
        rows = [[g] for g in gpus]
    g = len(rows[0])
    pairs = [(row[k], row[(k + 1) % g]) for row in rows for k in range(g)] if g > 1 else []
    src, dst, _ = rail_trees(np.array(rows, np.int64))
    return pairs + list(zip(src.tolist(), dst.tolist(), strict=True))


def pair_shares(pairs: Sequence[tuple[int, int]], host_of: Mapping[int, int] | None = None
                ) -> list[tuple[int, int, float]]:
    """Each GPU pair of a call, once, with the share of its sender's NIC it uses while the
    call runs: a sender's transfers to other hosts share its NIC equally, and those to its
    own host (``host_of``: GPU -> host; over NVLink, not the NIC) share its NVLink equally.
    A pair listed ``k`` times carries ``k`` of its sender's transfers at once (as the two
    trees of a tree AllReduce may use one pair). Without ``host_of`` every GPU is a host of
    its own. So the rail peer of a ring on multi-GPU hosts gets all of its NIC, as
    :func:`pattern_pairs` gives it, not a half shared with its NVLink peer.

    >>> pair_shares([(0, 1), (0, 2), (0, 3)])
    [(0, 1, 0.3333333333333333), (0, 2, 0.3333333333333333), (0, 3, 0.3333333333333333)]
    >>> pair_shares([(0, 1), (0, 2), (0, 3)], {0: 0, 1: 0, 2: 1, 3: 1})
    [(0, 1, 1.0), (0, 2, 0.5), (0, 3, 0.5)]
    >>> pair_shares([(0, 2), (0, 3), (0, 2)])  # (0 -> 2 twice)
    [(0, 2, 0.6666666666666666), (0, 3, 0.3333333333333333)]
    """
    times = Counter(pairs)
    if len(times) == len(pairs) and not host_of:  # (the common case: each pair once)
        fan = Counter(a for a, _ in pairs)
        return [(a, b, 1.0 / fan[a]) for a, b in pairs]
    host = host_of or {}
    kind = {(a, b): (a, host.get(a, -1 - a) == host.get(b, -1 - b)) for a, b in times}
    fan2: Counter[tuple[int, bool]] = Counter()
    for pair, k in times.items():
        fan2[kind[pair]] += k
    return [(a, b, k / fan2[kind[(a, b)]]) for (a, b), k in times.items()]


def _host_rows(gpus: tuple[int, ...], host_of: Mapping[int, int]
               ) -> list[list[int]] | None:
    """``gpus`` by host (hosts in order of first appearance, each host's GPUs in id order),
    if the job holds the same number > 1 of GPUs on each of at least two hosts; else None.

    >>> _host_rows((9, 1, 8, 0), {0: 0, 1: 0, 8: 1, 9: 1})
    [[8, 9], [0, 1]]
    >>> _host_rows((0, 1, 8), {0: 0, 1: 0, 8: 1}) is None  # (2 GPUs on one host, 1 on another)
    True
    """
    by_host: dict[int, list[int]] = {}
    for gpu in gpus:
        by_host.setdefault(host_of.get(gpu, -1 - gpu), []).append(gpu)
    rows = [sorted(r) for r in by_host.values()]
    if len(rows) < 2 or len(rows[0]) < 2 or any(len(r) != len(rows[0]) for r in rows):
        return None
    return rows


# a GPU with at least this many peers in a call sends one QP to each (see pair_qps)
WHOLE_PEERS = 4


def pair_qps(share: Any, parts: int) -> Any:
    """The QPs (plan parts) of a GPU pair using ``share`` of its sender's NIC in a call. A
    GPU with at least ``min(parts, WHOLE_PEERS)`` peers (4) sends one QP to each, as in an
    AlltoAll: its traffic is spread over that many QPs already, each at most a quarter of
    the NIC, which the planner packs within about 1 % of the LP optimum, and more QPs per
    peer would only add DCQCN flows to every incast (more queue at the receivers) and NIC
    state. A GPU with fewer peers spreads its traffic over at
    least ``parts`` QPs (``parts * share`` for this peer, rounded up to a divisor of
    ``parts``: a plan splits every pair into ``parts`` equal slots): a ring's one peer gets
    them all, so that its NIC's worth of traffic can be spread over as many paths as a
    perfectly balanced plan would use. ``share`` may be an array.

    >>> [int(pair_qps(1 / peers, 16)) for peers in (1, 2, 3, 4, 7, 255)]
    [16, 8, 8, 1, 1, 1]
    >>> pair_qps(np.array([1.0, 0.5, 1 / 3, 0.25]), 4).tolist()
    [4, 2, 2, 1]
    >>> pair_qps(np.array([1.0, 0.5]), 2).tolist()
    [2, 1]
    """
    divisors = np.array([q for q in range(1, parts + 1) if parts % q == 0], np.int64)
    share = np.asarray(share, np.float64)
    at = np.minimum(np.searchsorted(divisors, share * parts - 1e-9), len(divisors) - 1)
    return np.where(share * min(parts, WHOLE_PEERS) <= 1.0 + 1e-9, 1, divisors[at])
