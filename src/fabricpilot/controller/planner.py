"""Job-aware path planning: a multi-commodity-flow heuristic and its LP / MILP references.

A *demand* is one commodity: the traffic of a job (or a flow group) between two endpoints at a
rate, with a set of candidate paths (link ids) and a weight (its priority or heat). Planning
picks one candidate per demand (``split = 1``; a demand may also be split into equal parts on
several paths, unless it is ``whole``) so that no link is over-committed: the objective is
the largest link utilisation ``lambda = max_l (background_l + load_l) / capacity_l``.

* :func:`plan_greedy`: heaviest demands first (those with the same candidate links, as the
  pairs of one leaf pair, one after another), each on the candidate that keeps its own
  bottleneck lowest, then a local search that moves demands off the most loaded link while
  that lowers ``lambda`` (one at a time, or two together where no single move does).
  Compiled (numba) over parts and links; demands whose candidates
  differ only by links common to all of them (the GPUs' own NIC links) share one candidate
  structure, so tens of thousands of demands plan in well under a second.
* :func:`plan_reference`: the same problem solved exactly with HiGHS (``scipy.optimize``):
  the LP relaxation (demands split freely over their candidates, a lower bound on any plan)
  or the MILP (one path per demand part), for small instances, to report the heuristic's gap.

A demand may give the links every candidate starts and ends with once, as ``head`` and
``tail`` (a GPU's uplink and downlink), so that all the demands between the same two switches
can share one ``candidates`` tuple: the planner then reads every shared tuple once.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numba
import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, milp

from fabricpilot.arrays import distinct
from fabricpilot.collector import paused as _gc_paused
from fabricpilot.controller.keys import ChainedKeys, key_rows, unmade
from fabricpilot.controller.keys import made as made_keys
from fabricpilot.controller.southbound import BatchMap, KeyRows

T = TypeVar("T")
_chain = itertools.chain.from_iterable


_TUPLE_NEW = tuple.__new__


class _DemandFields(NamedTuple):
    """The fields of a :class:`Demand`."""

    key: str
    rate_gbps: float
    candidates: tuple[tuple[int, ...], ...]
    weight: float = 1.0
    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()
    whole: bool = False
    priority: int = 0
    parts: int = 0


class Demand(_DemandFields):
    """Traffic to place: ``rate_gbps`` between two endpoints on one of its candidate paths
    (tuples of link ids); heavier ``weight`` is placed first. A plan places a demand in
    equal parts (one QP each): ``parts`` of them, or as many as the plan's ``split`` when
    ``parts`` is 0 (``parts`` must divide ``split``); a ``whole`` demand is one part: all of
    it goes on one candidate (one path, one QP). Demands of a higher ``priority`` are
    planned before any of a lower one, as if those did not exist, and the lower ones
    around them (see :func:`plan_greedy`).

    The candidate paths are ``head + c + tail`` for every ``c`` in ``candidates``; ``head``
    and ``tail`` are empty unless the caller factors out the links all candidates start and
    end with (then ``candidates`` can be one tuple shared by many demands; a link of ``head``
    or ``tail`` should not appear in ``candidates``). :attr:`full_candidates` gives the full
    paths, and a :class:`Plan` always names full paths.

    >>> d = Demand("a", 100, ((5, 6), (7, 8)), head=(1,), tail=(2,))
    >>> d.full_candidates
    ((1, 5, 6, 2), (1, 7, 8, 2))

    A demand is a named tuple (a plan makes one per GPU pair; its fields are read as
    columns): ``d._replace(priority=1)`` gives a changed copy.
    """

    __slots__ = ()

    def __new__(cls, key: str, rate_gbps: float, candidates: tuple[tuple[int, ...], ...],
                weight: float = 1.0, head: tuple[int, ...] = (), tail: tuple[int, ...] = (),
                whole: bool = False, priority: int = 0, parts: int = 0) -> Demand:
        if not candidates:
            raise ValueError(f"demand {key!r}: no candidate path")
        if not rate_gbps >= 0:
            raise ValueError(f"demand {key!r}: rate_gbps must be >= 0")
        if parts < 0:
            raise ValueError(f"demand {key!r}: parts must be >= 0")
        return _TUPLE_NEW(cls, (key, rate_gbps, candidates, weight, head, tail, whole,
                                priority, parts))

    @property
    def full_candidates(self) -> tuple[tuple[int, ...], ...]:
        """The candidate paths with ``head`` and ``tail``: ``head + c + tail``."""
        if not self.head and not self.tail:
            return self.candidates
        return tuple(self.head + c + self.tail for c in self.candidates)


@dataclass(frozen=True)
class DemandColumns:
    """The fields of a list of demands as columns, for a caller that has them so (the
    planner then reads them rather than every demand): ``keys``, ``rate``, ``weight``,
    ``whole``, ``parts`` and ``priority`` per demand; each demand's candidates
    ``tuples[tup[i]]`` (the very tuple object of the demand); its head and tail link, -1
    where it has none (a demand with more than one has no columns). ``by_key``, if known:
    the rows in the order of their keys (as ``sorted`` orders the strings). ``memo``: what
    the planner compiled from these columns, for the next plan of the same columns (a
    controller re-planning jobs that did not change).

    >>> ds = [Demand("a", 100, ((5,), (6,)), 2.0, (1,), (2,)), Demand("b", 50, ((7,),))]
    >>> c = DemandColumns.of(ds)
    >>> c.rate.tolist(), c.tup.tolist(), c.head.tolist(), c.tail.tolist(), c.by_key.tolist()
    ([100.0, 50.0], [0, 1], [1, -1], [2, -1], [0, 1])
    >>> DemandColumns.join([c, c]).tup.tolist()
    [0, 1, 2, 3]
    """

    keys: Sequence[str]  # (a list, or keys made when read: :mod:`..keys`)
    rate: NDArray[np.float64]
    weight: NDArray[np.float64]
    whole: NDArray[np.bool_]
    parts: NDArray[np.int64]
    priority: NDArray[np.int64]
    tuples: list[tuple[tuple[int, ...], ...]]
    tup: NDArray[np.int64]
    head: NDArray[np.int64]
    tail: NDArray[np.int64]
    by_key: NDArray[np.int64] | None = None
    memo: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, demands: Sequence[Demand]) -> DemandColumns | None:
        """The columns of ``demands`` (``None`` if one has more than one head or tail link)."""
        n = len(demands)
        if not n:
            return cls([], *(np.zeros(0, t) for t in (np.float64, np.float64, np.bool_,
                                                        np.int64, np.int64)), [],
                       np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        (keys, rates, cands, weights, heads, tails, wholes, prios, parts) = zip(
            *demands, strict=True)
        ends = []
        for side in (heads, tails):
            if any(len(e) > 1 for e in side):
                return None
            ends.append(np.fromiter((e[0] if e else -1 for e in side), np.int64, n))
        return cls(list(keys), np.array(rates, np.float64), np.array(weights, np.float64),
                   np.fromiter(wholes, np.bool_, n), np.fromiter(parts, np.int64, n),
                   np.fromiter(prios, np.int64, n), list(cands), np.arange(n, dtype=np.int64),
                   ends[0], ends[1], _key_order(keys))

    @classmethod
    def join(cls, parts: Sequence[DemandColumns]) -> DemandColumns:
        """The columns of the demands of ``parts`` in turn (in key order if each part knows
        its own and no two parts' keys interleave: then the parts' orders, one after the
        other, are the order of all).

        >>> a, b = (DemandColumns.of([Demand(k, 1.0, ((5,),)) for k in ks])
        ...         for ks in (["y:2", "y:1"], ["x:9", "x:0"]))
        >>> DemandColumns.join([a, b]).by_key.tolist(), DemandColumns.join([a, a]).by_key
        ([3, 2, 1, 0], None)
        """
        at = _offsets(np.fromiter((len(p.tuples) for p in parts), np.int64, len(parts)))
        cat = np.concatenate
        # (keys not made yet stay so: a plan makes them while its placement runs)
        keys = (ChainedKeys([p.keys for p in parts]) if any(unmade(p.keys) for p in parts)
                else list(_chain(p.keys for p in parts)))
        return cls(keys, cat([p.rate for p in parts]),
                   cat([p.weight for p in parts]), cat([p.whole for p in parts]),
                   cat([p.parts for p in parts]), cat([p.priority for p in parts]),
                   list(_chain(p.tuples for p in parts)),
                   cat([p.tup + at[i] for i, p in enumerate(parts)]),
                   cat([p.head for p in parts]), cat([p.tail for p in parts]),
                   _joined_order(parts))


def _key_order(keys: Sequence[str]) -> NDArray[np.int64]:
    """The positions of ``keys`` in the order ``sorted`` puts them."""
    return np.fromiter(sorted(range(len(keys)), key=keys.__getitem__), np.int64, len(keys))


def _joined_order(parts: Sequence[DemandColumns]) -> NDArray[np.int64] | None:
    """The key order of the demands of ``parts`` in turn, from each part's own (``None``
    if one has none, or the keys of two parts interleave)."""
    spans = []
    start = 0
    for p in parts:
        n = len(p.keys)
        if p.by_key is None or len(p.by_key) != n:
            return None
        if n:
            spans.append((p.keys[int(p.by_key[0])], p.keys[int(p.by_key[-1])], start, p.by_key))
        start += n
    spans.sort(key=lambda sp: sp[0])
    if any(lo[1] >= hi[0] for lo, hi in itertools.pairwise(spans)):
        return None
    if not spans:
        return np.zeros(0, np.int64)
    return np.concatenate([order + at for _, _, at, order in spans]).astype(np.int64)


@dataclass
class Plan:
    """Each demand's paths and shares, the resulting load per link and ``lambda``."""

    # (a mapping: a whole plan's may keep them in columns, see :class:`PathRows`)
    paths: MutableMapping[str, list[tuple[tuple[int, ...], float]]]
    link_load_gbps: dict[int, float]
    max_utilization: float
    solver: str = "greedy"
    moves: int = 0  # local-search moves after the greedy pass
    extra: dict[str, float] = field(default_factory=dict)
    # the candidate structure the plan was made on (for re-placing parts of it later:
    # :func:`replace_parts`), if made by :func:`plan_greedy`
    columns: Columns | None = field(default=None, repr=False, compare=False)
    # the links of each demand's paths as arrays, if made by :func:`plan_greedy` (for
    # indexing the plan by link without reading its paths; a user may drop it); a large
    # plan's are still being made on the planner's worker thread: read by ``link_index``
    key_links: KeyLinks | Future[KeyLinks] | None = field(default=None, repr=False,
                                                          compare=False)
    # where each demand's parts went, if made by :func:`plan_greedy` (for keeping the
    # installed paths in columns; a user may drop it)
    parts: PartChoice | None = field(default=None, repr=False, compare=False)

    def link_index(self) -> KeyLinks | None:
        """``key_links``, waited for if it is still being made."""
        if isinstance(self.key_links, Future):
            self.key_links = self.key_links.result()
        return self.key_links


@dataclass(frozen=True)
class KeyLinks:
    """The demands on every link of a plan's paths, by link: link ``links[i]`` (ascending;
    the links of no path left out) is on a path of demand ``keys[j]`` for each ``j`` in
    ``owner[ptr[i]:ptr[i + 1]]`` (once or more: as many times as it has paths through it,
    or fewer; every link of its paths at least once)."""

    keys: list[str]
    links: NDArray[np.int64]
    ptr: NDArray[np.int64]
    owner: NDArray[np.int64]


@numba.njit(cache=True, nogil=True, inline="always")
def _on_one(choice: NDArray[np.int64], d: int) -> bool:
    """Whether row ``d`` of ``choice`` is all on one candidate (the scan stops at the first
    part on another)."""
    c0, split = choice[d, 0], choice.shape[1]
    j = 1
    while j < split and choice[d, j] == c0:
        j += 1
    return j == split


@numba.njit(cache=True, nogil=True, inline="always")
def _sorted_row(choice: NDArray[np.int64], d: int, row: NDArray[np.int64]) -> None:
    """Row ``d`` of ``choice`` into ``row``, ascending (by insertion: a row is a few
    parts)."""
    for j in range(choice.shape[1]):
        v = np.int64(choice[d, j])
        i = j
        while i > 0 and row[i - 1] > v:
            row[i] = row[i - 1]
            i -= 1
        row[i] = v


@numba.njit(cache=True, nogil=True)
def _slot_runs_of(choice: NDArray[np.int64],
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """:attr:`PartChoice.slot_runs` of the rows ``choice`` (at least one), row by row: a
    row all on one candidate is one slot; another is sorted (a copy) and counted run by
    run."""
    n, split = choice.shape
    count = np.empty(n, np.int64)
    row = np.empty(split, np.int64)
    total = 0
    for d in range(n):
        k = 1
        if not _on_one(choice, d):
            _sorted_row(choice, d, row)
            k = 1
            for j in range(1, split):
                if row[j] != row[j - 1]:
                    k += 1
        count[d] = k
        total += k
    cand = np.empty(total, np.int64)
    runs = np.empty(total, np.int64)
    at = 0
    for d in range(n):
        if count[d] == 1:
            cand[at] = choice[d, 0]
            runs[at] = split
            at += 1
            continue
        _sorted_row(choice, d, row)
        cand[at] = row[0]
        runs[at] = 1
        for j in range(1, split):
            if row[j] == row[j - 1]:
                runs[at] += 1
            else:
                at += 1
                cand[at] = row[j]
                runs[at] = 1
        at += 1
    return count, cand, runs


@dataclass(frozen=True)
class PartChoice:
    """Where a plan put every demand's parts, as the planner compiled them, in the plan's
    order: ``demands[i]``'s parts went to its candidates ``choice[i]``; it has group
    ``grp[i]`` and unique candidate tuple ``tup[i]`` (``tuples[tup[i]]``) of the plan's
    :class:`Columns`; ``plain[i]``: its tuple is regular and its candidate paths strictly
    increasing (its paths are then listed in candidate order), with one head link
    ``head[i]`` and one tail link ``tail[i]``. The share of ``m`` parts is ``acc[m]`` (as
    the plan adds them up); ``rank[i]`` is the demand's place in key order; ``rate`` and
    ``weight``: the demands' rates and weights."""

    demands: Sequence[Demand]
    grp: NDArray[np.int64]
    tup: NDArray[np.int64]
    tuples: list[tuple[tuple[int, ...], ...]]
    plain: NDArray[np.bool_]
    head: NDArray[np.int64]
    tail: NDArray[np.int64]
    choice: NDArray[np.integer]
    acc: tuple[float, ...]
    rank: NDArray[np.int64]
    rate: NDArray[np.float64]
    weight: NDArray[np.float64]

    @functools.cached_property
    def slot_runs(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Each demand's slots (the distinct candidates of its part choices, ascending: its
        paths, in order): how many it has, and of every slot, demand by demand, its
        candidate and how many of the demand's ``split`` choices are on it; made once (the
        choices of a plan do not change). Only the demands with choices on several
        candidates are sorted (most are whole: every choice on one).

        >>> z = np.zeros(1)
        >>> pc = PartChoice([], z, z, [], z, z, z, np.array([[2, 0, 2], [1, 1, 1]]), (), z,
        ...                 z, z)
        >>> [a.tolist() for a in pc.slot_runs]
        [[2, 1], [0, 2, 1], [1, 2, 3]]
        """
        choice = self.choice
        if not len(choice):
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return _slot_runs_of(np.ascontiguousarray(choice))


class LinkValues(Mapping[int, float]):
    """A read-only mapping link id -> value (Gb/s) held as arrays: ``ids`` ascending and
    distinct, ``values`` aligned. :func:`plan_greedy` reads the arrays as they are (a
    capacity and a background over the same ``ids`` object need no conversion).

    >>> c = LinkValues(np.array([3, 7]), np.array([400.0, 100.0]))
    >>> c[7], dict(c), 5 in c
    (100.0, {3: 400.0, 7: 100.0}, False)
    """

    def __init__(self, ids: NDArray[np.int64], values: NDArray[np.float64]) -> None:
        self.ids = ids
        self.values = values

    def __getitem__(self, link: int) -> float:
        i = int(np.searchsorted(self.ids, link))
        if i < len(self.ids) and int(self.ids[i]) == link:
            return float(self.values[i])
        raise KeyError(link)

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids.tolist())

    def __len__(self) -> int:
        return len(self.ids)


class _Problem:
    """Demands and candidates as arrays: candidate c of demand d is column ``col[d] + c``
    (every candidate a column of its own; for the LP / MILP references)."""

    def __init__(self, demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None) -> None:
        self.demands = list(demands)
        self.cands = [d.full_candidates for d in self.demands]
        used = distinct(np.fromiter(_chain(_chain(self.cands)), np.int64))
        links = sorted(set(used.tolist()) | set(capacity))
        missing = [lk for lk in links if lk not in capacity]
        if missing:
            raise ValueError(f"no capacity for links {missing[:5]}")
        self.links = np.array(links, np.int64)
        self.cap = np.array([float(capacity[lk]) for lk in links])
        if (self.cap <= 0).any():
            raise ValueError("link capacities must be > 0")
        bg = background or {}
        self.bg = np.array([float(bg.get(lk, 0.0)) for lk in links])
        self.rate = np.array([d.rate_gbps for d in self.demands], np.float64)
        self.n_cand = np.array([len(c) for c in self.cands], np.int64)
        self.col = np.concatenate(([0], np.cumsum(self.n_cand)[:-1])).astype(np.int64)
        all_paths = [p for cands in self.cands for p in cands]
        plen = np.fromiter((len(p) for p in all_paths), np.int64, len(all_paths))
        flat = np.fromiter(_chain(all_paths), np.int64, int(plen.sum()))
        rows = np.searchsorted(self.links, flat)
        cols = np.repeat(np.arange(len(all_paths)), plen)
        n_cols = int(self.n_cand.sum())
        # [links, candidates] incidence
        self.inc = sp.csr_matrix((np.ones(len(rows)), (rows, cols)),
                                 shape=(len(links), n_cols))


# ------------------------------------------------------------------------- array helpers
def _ranges(starts: NDArray[np.int64], lens: NDArray[np.int64]) -> NDArray[np.int64]:
    """The concatenated ranges ``starts[i], ..., starts[i] + lens[i] - 1``.

    >>> _ranges(np.array([5, 0, 10]), np.array([2, 0, 3])).tolist()
    [5, 6, 10, 11, 12]
    """
    return _ranges_of(np.asarray(starts, np.int64), np.asarray(lens, np.int64))


@numba.njit(cache=True, nogil=True)
def _ranges_of(starts: NDArray[np.int64], lens: NDArray[np.int64]) -> NDArray[np.int64]:
    """:func:`_ranges` (int64 arguments), written in one pass."""
    total = 0
    for i in range(len(lens)):
        total += lens[i]
    out = np.empty(total, np.int64)
    k = 0
    for i in range(len(lens)):
        s = starts[i]
        for j in range(lens[i]):
            out[k] = s + j
            k += 1
    return out


def copy_ranges(dst: NDArray[np.int64], dst_starts: NDArray[np.int64],
                src: NDArray[np.int64], src_starts: NDArray[np.int64],
                lens: NDArray[np.int64]) -> None:
    """``dst[_ranges(dst_starts, lens)] = src[_ranges(src_starts, lens)]`` without the index
    arrays: each range copied as it is (``IndexError`` if one reaches past either end).

    >>> dst = np.zeros(5, np.int64)
    >>> copy_ranges(dst, np.array([3, 0]), np.array([7, 8, 9]), np.array([0, 1]),
    ...             np.array([2, 2]))
    >>> dst.tolist()
    [8, 9, 0, 7, 8]
    """
    dst_starts, src_starts, lens = (np.asarray(a, np.int64) for a in (dst_starts, src_starts,
                                                                      lens))
    if len(lens) and (int(lens.min()) < 0 or int((dst_starts + lens).max()) > len(dst)
                      or int((src_starts + lens).max()) > len(src)
                      or int(dst_starts.min()) < 0 or int(src_starts.min()) < 0):
        raise IndexError("a range reaches past the end of its array")
    _copy_ranges(dst, dst_starts, src, src_starts, lens)


@numba.njit(cache=True, nogil=True)
def _copy_ranges(dst: NDArray[np.int64], dst_starts: NDArray[np.int64],
                 src: NDArray[np.int64], src_starts: NDArray[np.int64],
                 lens: NDArray[np.int64]) -> None:
    """:func:`copy_ranges` (arguments checked)."""
    for i in range(len(lens)):
        a = dst_starts[i]
        b = src_starts[i]
        for j in range(lens[i]):
            dst[a + j] = src[b + j]


def _offsets(lens: NDArray[np.int64]) -> NDArray[np.int64]:
    """Start offsets of consecutive segments of the given lengths, and the total at the end.

    >>> _offsets(np.array([2, 0, 3])).tolist()
    [0, 2, 2, 5]
    """
    out = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def _link_rows(ids: NDArray[np.int64], links: NDArray[np.int64]) -> NDArray[np.int32]:
    """Row (position in the sorted ``links``) of every link id; ``ValueError`` naming the
    first missing ids if some are not in ``links``.

    >>> _link_rows(np.array([30, 10, 30]), np.array([10, 20, 30])).tolist()
    [2, 0, 2]
    >>> _link_rows(np.array([7, 10]), np.array([10, 20]))
    Traceback (most recent call last):
    ...
    ValueError: no capacity for links [7]
    """
    if len(ids) == 0:
        return np.zeros(0, np.int32)
    lo, hi = int(ids.min()), int(ids.max())
    top = max(hi, int(links[-1])) if len(links) else hi
    if len(links) and lo >= 0 and int(links[0]) >= 0 and top <= 8 * len(links) + (1 << 20):
        lut = np.full(top + 1, -1, np.int32)
        lut[links] = np.arange(len(links), dtype=np.int32)
        rows = _lookup(ids, lut)
        bad = rows < 0 if rows[-1] == -2 else None
        rows = rows[:-1]
        if bad is not None:
            bad = bad[:-1]
    else:
        pos = np.searchsorted(links, ids)
        clipped = np.minimum(pos, max(len(links) - 1, 0))
        bad = ((pos >= len(links)) | (links[clipped] != ids)) if len(links) else \
            np.ones(len(ids), bool)
        rows = clipped.astype(np.int32)
        if not bad.any():
            bad = None
    if bad is not None:
        raise ValueError(f"no capacity for links {distinct(ids[bad])[:5].tolist()}")
    return rows


@numba.njit(cache=True, nogil=True)
def _lookup(ids: NDArray[np.int64], lut: NDArray[np.int32]) -> NDArray[np.int32]:
    """``lut[ids]`` with one more entry at the end: ``-2`` if some id maps to ``-1``, else 0.

    >>> _lookup(np.array([2, 0]), np.array([5, -1, 7], np.int32)).tolist()
    [7, 5, 0]
    """
    out = np.empty(ids.shape[0] + 1, np.int32)
    flag = 0
    for i in range(ids.shape[0]):
        r = lut[ids[i]]
        out[i] = r
        if r < 0:
            flag = -2
    out[ids.shape[0]] = flag
    return out


_H1 = np.uint64(0x100000001B3)
_H2 = np.uint64(0x9E3779B97F4A7C15)
_H0 = np.uint64(0xCBF29CE484222325)


@numba.njit(cache=True, nogil=True)
def _scan_tuples(crow: NDArray[np.int32], pstart: NDArray[np.int64], ustart: NDArray[np.int64],
                 plen: NDArray[np.int64]) -> tuple[NDArray[np.bool_], NDArray[np.int64],
                                                   NDArray[np.int64], NDArray[np.int64],
                                                   NDArray[np.uint64], NDArray[np.uint64],
                                                   NDArray[np.bool_]]:
    """One pass over tuples of candidate paths (tuple ``u`` holds paths ``ustart[u]`` to
    ``ustart[u + 1] - 1``; path ``p``'s link rows are ``crow[pstart[p]:pstart[p + 1]]``).
    Per tuple: ``ok`` (all paths of one length <= 62, and a link at the same position on
    every path appears nowhere else on them), the path ``length``, ``mask`` (bit ``j``: the
    same link at position ``j`` on every path), ``n_fixed`` (bits in ``mask``), two hashes
    of the other positions, and ``ordered`` (paths strictly increasing).

    Two paths ``(5, 1, 2, 9)`` and ``(5, 3, 4, 9)``: positions 0 and 3 are common.

    >>> crow = np.array([5, 1, 2, 9, 5, 3, 4, 9], np.int32)
    >>> ok, ln, mask, nf, _, _, ordered = _scan_tuples(crow, np.array([0, 4, 8]),
    ...                                                np.array([0, 2]), np.array([4, 4]))
    >>> ok.tolist(), ln.tolist(), mask.tolist(), nf.tolist(), ordered.tolist()
    ([True], [4], [9], [2], [True])
    """
    n_u = ustart.shape[0] - 1
    ok = np.zeros(n_u, np.bool_)
    length = np.zeros(n_u, np.int64)
    mask = np.zeros(n_u, np.int64)
    n_fixed = np.zeros(n_u, np.int64)
    h1 = np.zeros(n_u, np.uint64)
    h2 = np.zeros(n_u, np.uint64)
    ordered = np.zeros(n_u, np.bool_)
    for u in range(n_u):
        p0 = ustart[u]
        k = ustart[u + 1] - p0
        ln = plen[p0]
        length[u] = ln
        uniform = True
        for p in range(p0 + 1, p0 + k):
            if plen[p] != ln:
                uniform = False
                break
        if not uniform or ln > 62:
            continue
        base = pstart[p0]
        m = 0
        nf = 0
        for j in range(ln):
            x = crow[base + j]
            same = True
            for c in range(1, k):
                if crow[base + c * ln + j] != x:
                    same = False
                    break
            if same:
                m |= 1 << j
                nf += 1
        good = True
        for j in range(ln):
            if (m >> j) & 1:
                x = crow[base + j]
                for c in range(k):
                    for i in range(ln):
                        if i != j and crow[base + c * ln + i] == x:
                            good = False
        inc = True
        for c in range(1, k):
            diff = 0
            for j in range(ln):
                a = crow[base + (c - 1) * ln + j]
                b = crow[base + c * ln + j]
                if a != b:
                    diff = 1 if a < b else -1
                    break
            if diff <= 0:
                inc = False
                break
        x1 = _H0
        x2 = np.uint64(0)
        for c in range(k):
            for j in range(ln):
                if not (m >> j) & 1:
                    v = np.uint64(crow[base + c * ln + j]) + np.uint64(1)
                    x1 = (x1 ^ v) * _H1
                    x2 = (x2 + v) * _H2
                    x2 ^= x2 >> np.uint64(29)
        ok[u] = good
        mask[u] = m
        n_fixed[u] = nf
        h1[u] = x1
        h2[u] = x2
        ordered[u] = inc
    return ok, length, mask, n_fixed, h1, h2, ordered


@numba.njit(cache=True, nogil=True)
def _same_rest(crow: NDArray[np.int32], pstart: NDArray[np.int64], ustart: NDArray[np.int64],
               length: NDArray[np.int64], mask: NDArray[np.int64], us: NDArray[np.int64],
               reps: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Whether tuple ``us[i]`` has the same links as tuple ``reps[i]`` at the positions
    outside their (equal) ``mask``, path by path (their lengths and path counts are equal).

    >>> crow = np.array([5, 1, 9, 6, 1, 8, 6, 2, 8], np.int32)
    >>> _same_rest(crow, np.arange(0, 10, 3), np.array([0, 1, 2, 3]), np.array([3, 3, 3]),
    ...            np.array([5, 5, 5]), np.array([1, 2]), np.array([0, 0])).tolist()
    [True, False]
    """
    out = np.ones(us.shape[0], np.bool_)
    for i in range(us.shape[0]):
        u, r = us[i], reps[i]
        if u == r:
            continue
        ln = length[u]
        m = mask[u]
        bu, br = pstart[ustart[u]], pstart[ustart[r]]
        for q in range((ustart[u + 1] - ustart[u]) * ln):
            if not (m >> (q % ln)) & 1 and crow[bu + q] != crow[br + q]:
                out[i] = False
                break
    return out


@numba.njit(cache=True, nogil=True)
def _fill_groups(crow: NDArray[np.int32], pstart: NDArray[np.int64], ustart: NDArray[np.int64],
                 length: NDArray[np.int64], mask: NDArray[np.int64], rep_u: NDArray[np.int64],
                 g_col0: NDArray[np.int64], c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64],
                 n_links: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Write every group's columns (the links of its representative tuple ``rep_u[g]``
    outside ``mask``, each column sorted) into ``c_idx``; return per group whether it is
    regular (no link twice on a column, none on all of its columns) and whether its columns
    are link-disjoint.

    >>> crow = np.array([5, 2, 1, 9, 5, 3, 4, 9], np.int32)
    >>> c_idx = np.zeros(4, np.int64)
    >>> ok, disjoint = _fill_groups(crow, np.array([0, 4, 8]), np.array([0, 2]),
    ...                             np.array([4]), np.array([9]), np.array([0]),
    ...                             np.array([0]), np.array([0, 2, 4]), c_idx, 10)
    >>> c_idx.tolist(), ok.tolist(), disjoint.tolist()
    ([1, 2, 3, 4], [True], [True])
    """
    n_g = rep_u.shape[0]
    ok = np.ones(n_g, np.bool_)
    disjoint = np.ones(n_g, np.bool_)
    cnt = np.zeros(n_links, np.int64)
    for g in range(n_g):
        u = rep_u[g]
        p0 = ustart[u]
        k = ustart[u + 1] - p0
        ln = length[u]
        m = mask[u]
        base = pstart[p0]
        for c in range(k):
            lo = c_ptr[g_col0[g] + c]
            q = lo
            for j in range(ln):
                if not (m >> j) & 1:
                    x = crow[base + c * ln + j]
                    b = q - 1
                    while b >= lo and c_idx[b] > x:  # insertion sort
                        c_idx[b + 1] = c_idx[b]
                        b -= 1
                    c_idx[b + 1] = x
                    q += 1
            for a in range(lo + 1, q):
                if c_idx[a] == c_idx[a - 1]:
                    ok[g] = False
        q0, q1 = c_ptr[g_col0[g]], c_ptr[g_col0[g] + k]
        for q in range(q0, q1):
            cnt[c_idx[q]] += 1
        for q in range(q0, q1):
            if cnt[c_idx[q]] > 1:
                disjoint[g] = False
                if k > 1 and cnt[c_idx[q]] >= k:
                    ok[g] = False
        for q in range(q0, q1):
            cnt[c_idx[q]] = 0
    return ok, disjoint


@numba.njit(cache=True, nogil=True)
def _fill_fixed(crow: NDArray[np.int32], pstart: NDArray[np.int64], ustart: NDArray[np.int64],
                length: NDArray[np.int64], mask: NDArray[np.int64], us: NDArray[np.int64],
                ptr: NDArray[np.int64], out: NDArray[np.int64]) -> None:
    """Write the links at the ``mask`` positions of tuple ``us[i]`` (its first path) into
    ``out[ptr[us[i]]:]``.

    >>> out = np.zeros(2, np.int64)
    >>> _fill_fixed(np.array([5, 2, 9], np.int32), np.array([0, 3]), np.array([0, 1]),
    ...             np.array([3]), np.array([5]), np.array([0]), np.array([0, 2]), out)
    >>> out.tolist()
    [5, 9]
    """
    for i in range(us.shape[0]):
        u = us[i]
        base = pstart[ustart[u]]
        q = ptr[u]
        for j in range(length[u]):
            if (mask[u] >> j) & 1:
                out[q] = crow[base + j]
                q += 1


@numba.njit(cache=True, nogil=True)
def _fill_demand_fixed(ds: NDArray[np.int64], fix_ptr: NDArray[np.int64],
                       hptr: NDArray[np.int64], hrow: NDArray[np.int64],
                       u_of: NDArray[np.int64], ufix_ptr: NDArray[np.int64],
                       ufix_idx: NDArray[np.int64], tptr: NDArray[np.int64],
                       trow: NDArray[np.int64], out: NDArray[np.int64]) -> None:
    """Write the fixed links of each demand ``ds[i]`` into ``out[fix_ptr[d]:]``: its head
    links, the fixed links of its candidate tuple ``u_of[d]``, its tail links.

    >>> out = np.zeros(4, np.int64)
    >>> _fill_demand_fixed(np.array([0]), np.array([0, 4]), np.array([0, 1]), np.array([7]),
    ...                    np.array([0]), np.array([0, 2]), np.array([3, 4]),
    ...                    np.array([0, 1]), np.array([8]), out)
    >>> out.tolist()
    [7, 3, 4, 8]
    """
    for i in range(ds.shape[0]):
        d = ds[i]
        q = fix_ptr[d]
        for x in range(hptr[d], hptr[d + 1]):
            out[q] = hrow[x]
            q += 1
        u = u_of[d]
        for x in range(ufix_ptr[u], ufix_ptr[u + 1]):
            out[q] = ufix_idx[x]
            q += 1
        for x in range(tptr[d], tptr[d + 1]):
            out[q] = trow[x]
            q += 1


@numba.njit(cache=True, nogil=True)
def _ends_may_repeat(factored: NDArray[np.int64], hptr: NDArray[np.int64],
                     hrow: NDArray[np.int64], tptr: NDArray[np.int64], trow: NDArray[np.int64],
                     c_idx: NDArray[np.int64], ufix_idx: NDArray[np.int64],
                     n_links: int) -> bool:
    """Whether a head or tail link of the demands ``factored`` may be repeated on one of
    their paths (:func:`_repeated_links` says which): some head or tail link is also on a
    column or among a tuple's fixed links, or a demand has more than one head or tail link
    or the same link as both. False is exact (none is); a leaf-spine's NIC links are never
    on a switch path.

    >>> one, two = np.array([0]), np.array([0, 1])
    >>> _ends_may_repeat(one, two, np.array([7]), two, np.array([8]), np.array([1, 2]),
    ...                  np.zeros(0, np.int64), 10)
    False
    >>> _ends_may_repeat(one, two, np.array([7]), two, np.array([8]), np.array([1, 7]),
    ...                  np.zeros(0, np.int64), 10)
    True
    """
    on_path = np.zeros(n_links, np.bool_)
    for q in range(c_idx.shape[0]):
        on_path[c_idx[q]] = True
    for q in range(ufix_idx.shape[0]):
        on_path[ufix_idx[q]] = True
    for i in range(factored.shape[0]):
        d = factored[i]
        h0, h1, t0, t1 = hptr[d], hptr[d + 1], tptr[d], tptr[d + 1]
        if h1 - h0 > 1 or t1 - t0 > 1:
            return True
        if h1 > h0 and on_path[hrow[h0]]:
            return True
        if t1 > t0 and (on_path[trow[t0]] or (h1 > h0 and hrow[h0] == trow[t0])):
            return True
    return False


# ----------------------------------------------------------------------- the commodities
# what a plan of the same columns compiles anew (:class:`_Commodities`): the demands (read
# one by one as the caller has them) and the links' capacity and background
_PER_PLAN = frozenset({"demands", "cap", "bg", "memo"})


class _TupleShapes(NamedTuple):
    """The candidate structure of unique candidate tuples (:func:`_tuple_shapes`): their
    paths' link rows (path ``ustart[u] + c`` is candidate ``c`` of tuple ``u``, its rows
    ``crow[pstart[p]:pstart[p] + plen[p]]``; ``u_len``: a regular tuple's path length, -1
    for the others), each tuple's group (-1: irregular), whether
    its paths are in increasing order, and per group its columns
    (``g_ncand`` from column ``g_col0``; column ``c``'s links ``c_idx[c_ptr[c]:c_ptr[c + 1]]``,
    ``c_len`` of them), whether they are link-disjoint, and each tuple's fixed links (rows
    ``ufix_idx[ufix_ptr[u]:ufix_ptr[u + 1]]``, ``ufix_len`` of them)."""

    crow: NDArray[np.int32]
    pstart: NDArray[np.int64]
    ustart: NDArray[np.int64]
    plen: NDArray[np.int64]
    u_len: NDArray[np.int64]
    u_grp: NDArray[np.int64]
    ordered: NDArray[np.bool_]
    g_ncand: NDArray[np.int64]
    g_col0: NDArray[np.int64]
    c_len: NDArray[np.int64]
    c_ptr: NDArray[np.int64]
    c_idx: NDArray[np.int64]
    g_disjoint: NDArray[np.bool_]
    ufix_len: NDArray[np.int64]
    ufix_ptr: NDArray[np.int64]
    ufix_idx: NDArray[np.int64]
    n_groups: int


def _unique_shapes(tuples: list[tuple[tuple[int, ...], ...]], links: NDArray[np.int64],
                   aggregate: bool) -> tuple[NDArray[np.int64], list[tuple[tuple[int, ...],
                                                                            ...]],
                                             _TupleShapes]:
    """The distinct ``tuples`` by identity (:func:`_unique_objects`) and their structure
    (:func:`_tuple_shapes`)."""
    u_tup, uobj = _unique_objects(tuples)
    return u_tup, uobj, _tuple_shapes(uobj, links, aggregate)


def _tuple_shapes(uobj: Sequence[tuple[tuple[int, ...], ...]], links: NDArray[np.int64],
                  aggregate: bool) -> _TupleShapes:
    """The candidate structure of the unique candidate tuples ``uobj`` over ``links``
    (sorted link ids; see :class:`_Commodities`): regular tuples (paths of one length, no
    link repeated) have their links at the positions where all paths agree fixed and the
    rest, path by path, as their group's columns (with ``aggregate``, tuples of the same
    columns share a group); a tuple whose columns share a link, or repeat one, has none."""
    n_u = len(uobj)
    n_links = len(links)
    ku, plen, flat = _flat_tuples(uobj)  # type: ignore[arg-type]
    crow = _link_rows(flat, links)
    del flat
    pstart = _offsets(plen)   # link offset of every path of the unique tuples
    ustart = _offsets(ku)     # path offset of every unique tuple
    ok, length, mask, n_fixed, h1, h2, ordered = _scan_tuples(crow, pstart, ustart, plen)
    reg_u = np.flatnonzero(ok)
    u_grp = np.full(n_u, -1, np.int64)
    if aggregate and len(reg_u):
        by = np.lexsort((reg_u, h2[reg_u], h1[reg_u], mask[reg_u], length[reg_u],
                         ku[reg_u]))
        su = reg_u[by]
        new = np.ones(len(su), bool)
        new[1:] = ((h1[su[1:]] != h1[su[:-1]]) | (h2[su[1:]] != h2[su[:-1]])
                   | (mask[su[1:]] != mask[su[:-1]]) | (length[su[1:]] != length[su[:-1]])
                   | (ku[su[1:]] != ku[su[:-1]]))
        cls = np.cumsum(new) - 1
        rep_u = su[new]
        same = _same_rest(crow, pstart, ustart, length, mask, su, rep_u[cls])
        if not same.all():  # a hash collision: those tuples get groups of their own
            cls[~same] = len(rep_u) + np.arange(int((~same).sum()))
            rep_u = np.concatenate((rep_u, su[~same]))
        u_grp[su] = cls
    else:
        rep_u = reg_u
        u_grp[reg_u] = np.arange(len(reg_u))
    g_ncand = ku[rep_u]
    g_col0 = _offsets(g_ncand)[:-1]
    c_len = np.repeat(length[rep_u] - n_fixed[rep_u], g_ncand)
    c_ptr = _offsets(c_len)
    c_idx = np.zeros(int(c_ptr[-1]), np.int64)
    g_ok, g_disjoint = _fill_groups(crow, pstart, ustart, length, mask, rep_u, g_col0,
                                    c_ptr, c_idx, n_links)
    if not g_ok.all():  # a link on all columns, or twice on one: the exact route
        u_grp[np.isin(u_grp, np.flatnonzero(~g_ok))] = -1
    ufix_len = np.where(u_grp >= 0, n_fixed, 0)
    ufix_ptr = _offsets(ufix_len)
    ufix_idx = np.zeros(int(ufix_ptr[-1]), np.int64)
    _fill_fixed(crow, pstart, ustart, length, mask, np.flatnonzero(u_grp >= 0), ufix_ptr,
                ufix_idx)
    return _TupleShapes(crow, pstart, ustart, plen, np.where(ok, length, -1), u_grp, ordered,
                        g_ncand, g_col0, c_len, c_ptr, c_idx, g_disjoint, ufix_len, ufix_ptr,
                        ufix_idx, len(rep_u))


class _Commodities:
    """Demands as compiled arrays, with the candidates of demands that differ only by the
    links common to all of them stored once.

    Every demand ``d`` has *fixed* links (``fix_idx[fix_ptr[d]:fix_ptr[d + 1]]``: the links
    on all of its candidates, which carry its whole rate wherever it goes) and belongs to a
    *group* ``grp[d]`` whose ``g_ncand[g]`` candidates hold the rest: candidate ``c`` of
    group ``g`` is column ``g_col0[g] + c`` with links ``c_idx[c_ptr[col]:c_ptr[col + 1]]``
    (rows, ascending), in the order of the demand's own candidates. Demand ``d``'s candidate
    ``c`` is thus the union of its fixed links and column ``g_col0[grp[d]] + c``, exactly
    as a set (paths are sets of links, as in the load they add). With ``aggregate`` the
    demands with the same remainder share one group; without, each demand has its own.
    ``g_disjoint[g]``: the group's columns share no link. ``ordered[d]``: ``d``'s candidate
    paths are strictly increasing.
    """

    def __init__(self, demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None, aggregate: bool = True,
                 columns: DemandColumns | None = None,
                 idle: Iterator[None] | None = None) -> None:
        # (``idle``: steps of the caller's work, taken while this waits for the worker)
        # (with columns, the demands are read only one by one: a sequence that makes each
        # when read is kept as it is)
        self.demands: Sequence[Demand] = (
            demands if columns is not None and aggregate and isinstance(demands, Sequence)
            and len(demands) == len(columns.keys) else list(demands))
        n = len(self.demands)
        # capacity (and background) as arrays over the links, read as they are if given so
        cap_arrays = capacity if isinstance(capacity, LinkValues) else None
        self.links = (cap_arrays.ids.astype(np.int64) if cap_arrays is not None
                      else np.array(sorted(capacity), np.int64))
        n_links = len(self.links)
        # (the same columns over the same links compiled before: their arrays as they were)
        kept = columns.memo.get("commodities") if columns is not None and aggregate else None
        # (and the memo of those columns, where a plan of them keeps what it made of them)
        self.memo = columns.memo if columns is not None and aggregate else None
        if (isinstance(kept, tuple) and len(kept[0]) == n_links
                and np.array_equal(kept[0], self.links)):
            self.__dict__.update(kept[1])
            self._capacity_arrays(capacity, cap_arrays, background)
            return
        # (the demands in key order, if the caller knows it)
        self.by_key = columns.by_key if columns is not None and aggregate else None
        shapes: Future[tuple[NDArray[np.int64], list[tuple[tuple[int, ...], ...]],
                             _TupleShapes]] | None = None
        if columns is not None and aggregate:  # the demands' fields as the caller had them
            keys: Sequence[str] = columns.keys
            rates, weights = columns.rate, columns.weight
            wholes, prios, parts_l = columns.whole, columns.priority, columns.parts
            # unique candidate tuples (by identity: demands may share one) and their shapes,
            # a large plan's on the worker thread while the demands' columns are read here
            if n >= _BACKGROUND_ROWS:
                shapes = _WORKER.submit(_unique_shapes, columns.tuples, self.links, aggregate)
            else:
                u_tup, uobj, sh = _unique_shapes(columns.tuples, self.links, aggregate)
            h_has, t_has = columns.head >= 0, columns.tail >= 0
            hl, tl = h_has.astype(np.int64), t_has.astype(np.int64)
            # (as a rule every demand has both: the columns themselves, none picked out)
            end_links = (np.concatenate((columns.head, columns.tail))
                         if h_has.all() and t_has.all() else
                         np.concatenate((columns.head[h_has], columns.tail[t_has])))
            del h_has, t_has
        else:
            # the demands' fields as columns (a demand is a tuple: one transposition, in C)
            (keys, rates, cands, weights, heads, tails, wholes, prios, parts_l) = (
                zip(*self.demands, strict=True) if n else ((),) * len(Demand._fields))
            # unique candidate tuples (by identity: demands may share one)
            if aggregate:
                u_of, uobj = _unique_objects(cands)
            else:
                u_of, uobj = np.arange(n, dtype=np.int64), cands
            hl = np.fromiter(map(len, heads), np.int64, n)
            tl = np.fromiter(map(len, tails), np.int64, n)
            end_links = np.fromiter(itertools.chain(_chain(heads), _chain(tails)), np.int64,
                                    int(hl.sum() + tl.sum()))
        n_h = int(hl.sum())
        try:
            e_rows = _link_rows(end_links, self.links)
        except ValueError:
            if shapes is not None:
                shapes.result()
            raise
        # each demand's head and tail link when it has exactly one (-1 otherwise)
        # (whether they are all of its head and tail links: a demand's are then read from
        # them, with its candidates, without making the demand)
        self.ends_exact = columns is not None and aggregate
        if self.ends_exact:  # (the columns': at most one each, -1 none)
            assert columns is not None
            self.head1 = columns.head.astype(np.int64, copy=False)
            self.tail1 = columns.tail.astype(np.int64, copy=False)
        else:
            self.head1 = np.full(n, -1, np.int64)
            self.tail1 = np.full(n, -1, np.int64)
            one_h, one_t = np.flatnonzero(hl == 1), np.flatnonzero(tl == 1)
            self.head1[one_h] = end_links[_offsets(hl)[one_h]]
            self.tail1[one_t] = end_links[n_h + _offsets(tl)[one_t]]
        del end_links
        self._capacity_arrays(capacity, cap_arrays, background)
        # (the columns' arrays as they are, where they are of these types: read only)
        self.rate = np.asarray(rates, np.float64)
        self.weight = np.asarray(weights, np.float64)
        self.whole = np.asarray(wholes, np.bool_)
        self.parts = np.asarray(parts_l, np.int64)
        self.priority = np.asarray(prios, np.int64)
        self.keys: Sequence[str] = keys
        del rates, weights, wholes, prios, parts_l
        hrow = e_rows[:n_h].astype(np.int64)
        trow = e_rows[n_h:].astype(np.int64)
        if shapes is not None:
            _steps_until(shapes, idle)
            u_tup, uobj, sh = shapes.result()
        if columns is not None and aggregate:
            u_of = u_tup[columns.tup] if n else np.zeros(0, np.int64)
        else:
            sh = _tuple_shapes(uobj, self.links, aggregate)
        u_grp, ordered = sh.u_grp, sh.ordered
        g_ncand, g_col0, c_len, c_ptr, c_idx = (sh.g_ncand, sh.g_col0, sh.c_len, sh.c_ptr,
                                                sh.c_idx)
        g_disjoint, ufix_len, ufix_ptr, ufix_idx = (sh.g_disjoint, sh.ufix_len, sh.ufix_ptr,
                                                    sh.ufix_idx)
        n_groups = sh.n_groups
        self.u_obj, self.u_grp = uobj, u_grp  # unique candidate tuples and their groups
        self.u_of = u_of  # each demand's unique tuple
        # the unique tuples' paths as link rows: path ``ustart[u] + c`` is candidate ``c``
        # of tuple ``u``, its rows ``crow[pstart[p]:pstart[p] + plen[p]]``
        self.crow, self.pstart, self.ustart, self.plen = sh.crow, sh.pstart, sh.ustart, sh.plen
        # (a regular tuple's path length, -1 for the others: its candidate ``c``'s links
        # start at its first path's plus ``c`` times that)
        self.u_len = sh.u_len
        self.ufix_ptr, self.ufix_idx = ufix_ptr, ufix_idx

        # ---- demands: regular ones take their tuple's group; head / tail links join the
        # fixed links, unless they are repeated on a path (then the exact route below)
        grp = u_grp[u_of] if n else np.zeros(0, np.int64)
        irregular = grp < 0
        hptr, tptr = _offsets(hl), _offsets(tl)
        factored = np.flatnonzero(((hl + tl) > 0) & ~irregular)
        if len(factored) and _ends_may_repeat(factored, hptr, hrow, tptr, trow, c_idx,
                                              ufix_idx, n_links):
            by_grp = np.argsort(grp[factored], kind="stable")  # (numpy's sort is the faster)
            irregular[factored[_repeated_links(factored, by_grp, grp, hptr, hrow, tptr, trow,
                                               u_of, ufix_ptr, ufix_idx, g_col0, g_ncand,
                                               c_ptr, c_idx, n_links)]] = True
        reg = np.flatnonzero(~irregular)
        if len(reg) == n:  # (as a rule: every demand)
            flen = hl + ufix_len[u_of] + tl if n else np.zeros(0, np.int64)
        else:
            flen = np.zeros(n, np.int64)
            flen[reg] = hl[reg] + ufix_len[u_of[reg]] + tl[reg]
        self.ordered = (ordered[u_of] & ~irregular) if n else np.zeros(0, bool)
        # ---- irregular demands (paths of several lengths, a link twice on a path): sets
        irr = np.flatnonzero(irregular).tolist()
        irr_fixed: list[list[int]] = []
        if irr:
            row_of = dict(zip(self.links.tolist(), range(n_links), strict=True))
            seen: dict[tuple[tuple[int, ...], ...], int] = {}
            extra_ncand: list[int] = []
            extra_len: list[int] = []
            extra_idx: list[int] = []
            extra_disjoint: list[bool] = []
            for d in irr:
                dem = self.demands[d]
                sets = [frozenset(row_of[lk] for lk in itertools.chain(dem.head, p, dem.tail))
                        for p in dem.candidates]
                both = frozenset.intersection(*sets)
                rest_key = tuple(tuple(sorted(s - both)) for s in sets)
                g = seen.get(rest_key) if aggregate else None
                if g is None:
                    g = n_groups
                    n_groups += 1
                    if aggregate:
                        seen[rest_key] = g
                    extra_ncand.append(len(rest_key))
                    extra_len.extend(map(len, rest_key))
                    flat = list(_chain(rest_key))
                    extra_idx.extend(flat)
                    extra_disjoint.append(len(set(flat)) == len(flat))
                grp[d] = g
                irr_fixed.append(sorted(both))
                flen[d] = len(both)
            g_ncand = np.concatenate((g_ncand, np.array(extra_ncand, np.int64)))
            g_col0 = _offsets(g_ncand)[:-1]
            c_len = np.concatenate((c_len, np.array(extra_len, np.int64)))
            c_ptr = _offsets(c_len)
            c_idx = np.concatenate((c_idx, np.array(extra_idx, np.int64)))
            g_disjoint = np.concatenate((g_disjoint, np.array(extra_disjoint, bool)))
        self.grp = grp.astype(np.int64)
        self.fix_ptr = _offsets(flen)
        self.fix_idx = np.zeros(int(self.fix_ptr[-1]), np.int64)
        _fill_demand_fixed(reg, self.fix_ptr, hptr, hrow, u_of, ufix_ptr, ufix_idx, tptr, trow,
                           self.fix_idx)
        for d, fixed_d in zip(irr, irr_fixed, strict=True):
            self.fix_idx[self.fix_ptr[d]:self.fix_ptr[d + 1]] = fixed_d
        self.g_ncand = g_ncand.astype(np.int64)
        # the smallest integer type that holds every candidate index (and -1): a plan's
        # choices are a row of slots per demand, read in passes over all of them
        most = int(self.g_ncand.max()) if len(self.g_ncand) else 0
        self.choice_dtype = next(t for t in (np.int8, np.int16, np.int32, np.int64)
                                 if most <= np.iinfo(t).max)
        self.g_col0 = g_col0.astype(np.int64)
        self.g_disjoint = g_disjoint.astype(np.bool_)
        self.c_ptr = c_ptr
        self.c_idx = c_idx.astype(np.int64, copy=False)
        self.n_groups = n_groups
        if columns is not None and aggregate:  # (for a plan of the same columns: all but
            columns.memo["commodities"] = (  # the demands and the links' values)
                self.links, {k: v for k, v in vars(self).items() if k not in _PER_PLAN})

    def _capacity_arrays(self, capacity: Mapping[int, float], cap_arrays: LinkValues | None,
                         background: Mapping[int, float] | None) -> None:
        """The links' capacity ``cap`` and background ``bg`` as arrays over ``links``."""
        if cap_arrays is not None:
            self.cap = cap_arrays.values.astype(np.float64)
        else:
            self.cap = np.array([float(capacity[lk]) for lk in self.links.tolist()])
        if (self.cap <= 0).any():
            raise ValueError("link capacities must be > 0")
        if (cap_arrays is not None and isinstance(background, LinkValues)
                and background.ids is cap_arrays.ids):
            self.bg = background.values.astype(np.float64)
        elif not background:
            self.bg = np.zeros(len(self.links))
        else:
            self.bg = np.array([float(background.get(lk, 0.0)) for lk in self.links.tolist()])

    def n_parts(self, split: int) -> NDArray[np.int64]:
        """Every demand's number of parts in a plan of ``split`` parts per demand: 1 if
        ``whole``, else its ``parts`` or, if 0, ``split``; each divides ``split``."""
        n = np.where(self.whole, 1, np.where(self.parts > 0, self.parts, split))
        # (which counts divide ``split``, looked up; a count above it does not)
        divides = np.zeros(split + 2, np.bool_)
        divides[1:split + 1] = split % np.arange(1, split + 1) == 0
        bad = np.flatnonzero(~divides[np.minimum(n, split + 1)])
        if len(bad):
            d = self.demands[int(bad[0])]
            raise ValueError(f"demand {d.key!r}: parts {d.parts} must divide split {split}")
        return n.astype(np.int64)


# candidate tuples whose links :func:`_flat_tuples` keeps (by identity, the tuple with
# them): a controller's tuples are shared by the pairs of a leaf pair and live across
# plans; a memo past this many starts again
_FLAT_MAX = 1 << 16
_flat_memo: dict[int, tuple[tuple[tuple[int, ...], ...], NDArray[np.int64],
                            NDArray[np.int64]]] = {}


def flatten_paths(tuples: Sequence[tuple[tuple[int, ...], ...]],
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Of every tuple of paths its path count, of every path its length, and every link,
    in order (in C: no Python loop over paths).

    >>> ku, plen, flat = flatten_paths([((1, 2), (3,)), ((4,),)])
    >>> ku.tolist(), plen.tolist(), flat.tolist()
    ([2, 1], [2, 1, 1], [1, 2, 3, 4])
    """
    ku = np.fromiter(map(len, tuples), np.int64, len(tuples))
    plen = np.fromiter(map(len, _chain(tuples)), np.int64, int(ku.sum()))
    return ku, plen, np.fromiter(_chain(_chain(tuples)), np.int64, int(plen.sum()))


def remember_flat(paths: tuple[tuple[int, ...], ...], rows: NDArray[np.int64]) -> None:
    """Keep ``rows`` (one row of link ids per path, all of one length) as the flattened
    links of the tuple ``paths`` made from them, so that no plan flattens the tuple again
    (:func:`_flat_tuples`). ``ValueError`` if they do not match.

    >>> rows = np.array([[1, 2], [3, 4]])
    >>> t = tuple(map(tuple, rows.tolist()))
    >>> remember_flat(t, rows)
    >>> [a.tolist() for a in _flat_tuples([t])]
    [[2], [2, 2], [1, 2, 3, 4]]
    """
    remember_flat_rows([paths], rows)


def remember_flat_rows(tuples: Sequence[tuple[tuple[int, ...], ...]],
                       rows: NDArray[np.int64]) -> None:
    """:func:`remember_flat` of several tuples at once: ``rows`` (all of one length) are
    the paths of ``tuples`` one after the other (each tuple's its own number of them).
    ``ValueError`` if they do not match.

    >>> rows = np.array([[1, 2], [3, 4], [5, 6]])
    >>> a, b = ((1, 2), (3, 4)), ((5, 6),)
    >>> remember_flat_rows([a, b], rows)
    >>> [x.tolist() for x in _flat_tuples([b, a])]
    [[1, 2], [2, 2, 2], [5, 6, 1, 2, 3, 4]]
    """
    counts = np.fromiter(map(len, tuples), np.int64, len(tuples))
    width = rows.shape[1] if rows.ndim == 2 else -1
    if width < 0 or int(counts.sum()) != len(rows) or any(
            len(t[0]) != width for t in tuples if t):
        raise ValueError("the rows are not the paths' links")
    memo = _flat_memo
    if len(memo) + len(tuples) > _FLAT_MAX:
        memo.clear()
    flat = rows.astype(np.int64).ravel()
    lens = np.full(int(counts.max()) if len(counts) else 0, width, np.int64)
    at = _offsets(counts).tolist()
    for t, lo, hi in zip(tuples, at, at[1:], strict=False):
        memo[id(t)] = (t, lens[:hi - lo], flat[lo * width:hi * width])


def _flat_tuples(tuples: list[tuple[tuple[int, ...], ...]],
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """:func:`flatten_paths`, each tuple's lengths and links kept by identity (views of
    the arrays they were first flattened into) when there are at most :data:`_FLAT_MAX`
    tuples: flattening the same tuples again, plan after plan, cost a tenth of a job's
    plan.

    >>> ku, plen, flat = _flat_tuples([((1, 2), (3,)), ((4,),)])
    >>> ku.tolist(), plen.tolist(), flat.tolist()
    ([2, 1], [2, 1, 1], [1, 2, 3, 4])
    """
    n_u = len(tuples)
    if not n_u or n_u > _FLAT_MAX:
        return flatten_paths(tuples)
    memo = _flat_memo
    hits = list(map(memo.get, map(id, tuples)))
    new = [i for i, (hit, tup) in enumerate(zip(hits, tuples, strict=True))
           if hit is None or hit[0] is not tup]
    if new:
        fresh = tuples if len(new) == n_u else [tuples[i] for i in new]
        k_new, plen, flat = flatten_paths(fresh)
        if len(memo) + len(new) > _FLAT_MAX:
            memo.clear()
        p_at = _offsets(k_new).tolist()
        l_at = _offsets(plen).tolist()
        for j, (i, tup) in enumerate(zip(new, fresh, strict=True)):
            lo, hi = p_at[j], p_at[j + 1]
            hits[i] = memo[id(tup)] = (tup, plen[lo:hi], flat[l_at[lo]:l_at[hi]])
        if fresh is tuples:  # (all new: flattened as they are)
            return k_new, plen, flat
    ku = np.fromiter(map(len, tuples), np.int64, n_u)
    return (ku, np.concatenate([h[1] for h in hits]),  # type: ignore[index]
            np.concatenate([h[2] for h in hits]))  # type: ignore[index]


def _unique_objects(objs: list[tuple[tuple[int, ...], ...]],
                    ) -> tuple[NDArray[np.int64], list[tuple[tuple[int, ...], ...]]]:
    """Distinct objects by identity, in order of first appearance, and each one's index.

    >>> a = ((1,),)
    >>> b = tuple(list(a))          # equal to a, but another object
    >>> idx, objs = _unique_objects([a, b, a])
    >>> idx.tolist(), objs[0] is a, objs[1] is b
    ([0, 1, 0], True, True)
    """
    if not objs:
        return np.zeros(0, np.int64), []
    ids = np.fromiter(map(id, objs), np.uint64, len(objs))
    by = np.argsort(ids, kind="stable")
    new = np.ones(len(by), bool)
    new[1:] = ids[by[1:]] != ids[by[:-1]]
    cls = np.cumsum(new) - 1             # class of by[i], classes in order of id
    first = by[new]                      # first occurrence of every class (stable sort)
    perm = np.argsort(first, kind="stable")
    rank = np.empty(len(first), np.int64)
    rank[perm] = np.arange(len(first))   # classes renumbered by first occurrence
    label = np.empty(len(by), np.int64)
    label[by] = rank[cls]
    return label, [objs[i] for i in first[perm].tolist()]


@numba.njit(cache=True, nogil=True)
def _repeated_links(factored: NDArray[np.int64], by_grp: NDArray[np.int64],
                    grp: NDArray[np.int64],
                    hptr: NDArray[np.int64], hrow: NDArray[np.int64], tptr: NDArray[np.int64],
                    trow: NDArray[np.int64], u_of: NDArray[np.int64],
                    ufix_ptr: NDArray[np.int64], ufix_idx: NDArray[np.int64],
                    g_col0: NDArray[np.int64], g_ncand: NDArray[np.int64],
                    c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64],
                    n_links: int) -> NDArray[np.bool_]:
    """For the demands ``factored`` (with a head or a tail; ascending; ``by_grp`` sorts them
    by group, stably): whether one of their head / tail links is repeated: twice among
    their fixed links (head, tail and the links their candidate tuple has at one position
    on every path), or on one of their group's columns (then the exact route places them).

    Demand 0 (head link 7, tail link 8) in a group whose two columns are links 1 and 7:

    >>> one = np.array([0]); zero = np.array([0, 0])
    >>> _repeated_links(one, zero[:1], np.array([0]), np.array([0, 1]), np.array([7]),
    ...                 np.array([0, 1]), np.array([8]), np.array([0]), zero, np.zeros(0, np.int64),
    ...                 np.array([0]), np.array([2]), np.array([0, 1, 2]), np.array([1, 7]),
    ...                 10).tolist()
    [True]
    """
    out = np.zeros(factored.shape[0], np.bool_)
    mark = np.full(n_links, -1, np.int64)  # mark[l] == g: l on a column of group g
    seen = np.full(n_links, -1, np.int64)  # seen[l] == d: l among d's fixed links
    g_prev = -1
    for i in by_grp:
        d = factored[i]
        g = grp[d]
        if g != g_prev:
            for q in range(c_ptr[g_col0[g]], c_ptr[g_col0[g] + g_ncand[g]]):
                mark[c_idx[q]] = g
            g_prev = g
        u = u_of[d]
        bad = False
        for q in range(ufix_ptr[u], ufix_ptr[u + 1]):
            seen[ufix_idx[q]] = d
        for q in range(hptr[d], hptr[d + 1]):
            lk = hrow[q]
            bad |= mark[lk] == g or seen[lk] == d
            seen[lk] = d
        for q in range(tptr[d], tptr[d + 1]):
            lk = trow[q]
            bad |= mark[lk] == g or seen[lk] == d
            seen[lk] = d
        out[i] = bad
    return out


# ------------------------------------------------------------------------------- greedy
def plan_greedy(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                background: Mapping[int, float] | None = None, split: int = 1,
                sweeps: int = 2, max_moves: int | None = None, restarts: int | None = None,
                aggregate: bool = True, checkpoint: Callable[[], None] | None = None,
                stop: NDArray[np.bool_] | None = None,
                columns: DemandColumns | None = None, columnar: bool = False,
                meanwhile: Callable[[], None] | Iterator[None] | None = None) -> Plan:
    """Place every demand (in ``split`` equal parts, or its own ``parts``) on its candidates,
    heaviest first (of one weight, those whose candidates differ by the same links, as the
    pairs of one leaf pair, one after another: in the order their first comes in key order,
    each in key order), each part on the candidate whose most loaded link stays lowest
    (counting only the links that differ between its candidates; ties by the sum of
    squared utilisations); then ``sweeps`` rounds that take every part out and put it back
    on its best candidate given all the others (stopping early once a round moves nothing;
    as many as fit in 8 M link loads scored, none on instances with more parts and
    candidates, where the parts are small against the links); then, on instances of at most
    2 000 parts (or ``max_moves`` if given), a local search that moves parts off the links at
    ``lambda`` while that lowers ``lambda``, or the number of links at it, or the sum of
    squared utilisations: a part at a time or, when no single part can, two (one off a link
    at ``lambda``, another off a link the first move took to the top; bin packing of whole
    demands often needs that: 300 + 200 + 200 | 300 + 200 becomes 300 + 300 | 200 + 200 + 200).
    Where the local search runs, the demands have one priority and ``lambda`` is above what
    their fixed links force, the whole of it runs again from up to ``restarts`` shuffled
    orders (default 32; in all at most 1 000 parts re-placed: fewer on larger instances, none
    above 1 000 parts), and a plan of lower ``lambda`` replaces the first (:func:`_restarts`).

    Demands whose candidates differ only by links common to all of them (a GPU pair's NIC
    links) are planned as one commodity (``aggregate``): its candidate structure is stored
    and read once, and its parts are still every demand's own parts, each no bigger than
    ``rate / split`` and placed in the same order, so the plan is the same as without
    aggregation; the paths are given per demand.

    ``columns``, if given, are the demands' fields as columns (:class:`DemandColumns`, in
    the order of ``demands``): a caller that made the demands from arrays saves the planner
    reading every demand again.

    ``meanwhile``, if given, is called once on the caller's thread while the (first)
    placement runs on the planner's worker thread: work of the caller's that does not need
    the plan (the compiled placement holds no interpreter lock, so the two run at once on
    two cores). Its exception, if any, is raised once the placement is done. Given as an
    iterator of steps (each a few ms of work), its first steps are taken while the
    candidates' structure is compiled on the worker thread, if the demands are read
    before that is done, and the next ones while the placement runs; those left when it
    is done are not taken (work a head start, which the caller does when it needs it).

    ``checkpoint``, if given, is called between the stages (compiled candidates,
    placement, local search): it may raise to abandon the plan. ``stop``, if given, is a
    one-element flag the placement reads before each demand: set (from another thread), the
    placement stops there, ``checkpoint`` is called and, if it does not raise,
    :class:`PlanStopped` is raised.

    Demands of several ``priority`` values are planned in tiers, highest first: a tier's
    placement, sweeps and (top tier only) local search run as if the lower tiers did not
    exist; a lower tier is then placed around the load above it, and a part of it costs
    first how far it takes a link carrying higher-priority traffic beyond 100 % (or beyond
    what that traffic alone loads it to): a lower priority overloads links free of
    higher-priority traffic before any that carry it. ``plan.extra`` then gives each tier's
    lambda (``lambda_priority_<p>``: the most loaded link it crosses, all tiers counted).

    Two 300 Gb/s demands with the same two 400 Gb/s candidate links go one each:

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> p = plan_greedy(d, {0: 400, 1: 400})
    >>> sorted(p.paths["a"] + p.paths["b"]), p.max_utilization
    ([((0,), 1.0), ((1,), 1.0)], 0.75)

    Link 0 carries a 200 Gb/s demand of priority 1; a 400 Gb/s one may take link 0 or 2,
    where a 300 Gb/s one runs (all links 400 Gb/s). Alone, lambda is lowest with both on
    link 0 (150 %, against 175 % on link 2); with the first one of a higher priority, its
    link stays at 50 % and the lower ones take the overload:

    >>> d = [Demand("hi", 200, ((0,),)), Demand("x", 400, ((0,), (2,))),
    ...      Demand("z", 300, ((2,),))]
    >>> caps = {0: 400, 1: 400, 2: 400}
    >>> plan_greedy(d, caps).paths["x"]
    [((0,), 1.0)]
    >>> d[0] = Demand("hi", 200, ((0,),), priority=1)
    >>> p = plan_greedy(d, caps)
    >>> p.paths["x"], p.max_utilization
    ([((2,), 1.0)], 1.75)
    >>> p.extra["lambda_priority_1"], p.extra["lambda_priority_0"]
    (0.5, 1.75)
    """
    if split < 1:
        raise ValueError("split must be >= 1")
    if restarts is not None and restarts < 0:
        raise ValueError("restarts must be >= 0")
    if columns is not None and (len(columns.keys) != len(demands) or (len(demands) and (
            columns.keys[0] != demands[0].key or columns.keys[-1] != demands[-1].key))):
        raise ValueError("columns: not those of the demands")
    with _gc_paused():  # no reference cycles are made: spare the collector's passes
        return _plan_greedy(demands, capacity, background, split, sweeps, max_moves,
                            _RESTARTS if restarts is None else restarts, aggregate,
                            checkpoint or _go_on, _NEVER if stop is None else stop, columns,
                            columnar, meanwhile)


class PlanStopped(RuntimeError):
    """:func:`plan_greedy` was stopped by its ``stop`` flag."""


def _go_on() -> None:
    """A checkpoint that never stops a plan."""


_NEVER = np.zeros(1, np.bool_)  # a stop flag never set


def _plan_greedy(demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None, split: int, sweeps: int,
                 max_moves: int | None, restarts: int, aggregate: bool,
                 checkpoint: Callable[[], None], stop: NDArray[np.bool_],
                 columns: DemandColumns | None = None, columnar: bool = False,
                 meanwhile: Callable[[], None] | Iterator[None] | None = None) -> Plan:
    """:func:`plan_greedy` (arguments checked)."""
    steps = _work_steps(meanwhile)
    com = _Commodities(demands, capacity, background, aggregate, columns, steps)
    nparts = com.n_parts(split)
    checkpoint()
    n = len(com.demands)
    load = com.bg.copy()
    # (the keys' order, as Python sorts them: no fixed-width copy of every key is made)
    keys = com.keys
    by_key = (com.by_key if com.by_key is not None and len(com.by_key) == n
              else _key_order(keys))
    # (the order of the same columns compiled as in the last plan of them: as it was then)
    last = com.memo.get("order") if com.memo is not None else None
    if isinstance(last, tuple) and last[0] is com.grp and len(last[1]) == n:
        order = last[1].copy()
    else:
        neg = -com.weight * com.rate
        order = _stable_order(neg, by_key) if n else by_key
        if n:  # (within a weight: the demands of one candidate structure together)
            order = _class_runs(order, neg, _structure_classes(com), com.grp)
        if com.memo is not None:
            com.memo["order"] = (com.grp, order.copy())
    made: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = []

    def link_groups(rounds: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The groups per link (:func:`_link_groups`) a placement of ``rounds`` re-insertion
        sweeps reads; made once, and only if one does (a placement without sweeps does
        not read them)."""
        if not rounds:
            return np.zeros(len(com.links) + 1, np.int64), np.zeros(0, np.int64)
        if not made:
            made.append(_link_groups(com.g_col0, com.g_ncand, com.c_ptr, com.c_idx,
                                     len(com.links)))
        return made[0]

    if max_moves is None:
        max_moves = 10_000 if int(nparts.sum()) <= 2_000 else 0
    no_limit = np.full(len(com.links), np.inf)
    prio = com.priority
    multi = bool(n) and bool((prio != prio[0]).any())
    tiers = np.unique(prio)[::-1] if multi else prio[:1]
    # (one tier: the placement's own choices, every demand's row; several: each tier's rows)
    choice = np.full((n if multi else 0, split), -1, com.choice_dtype)
    moves = 0
    carried = []  # (several priorities) per tier, the links it put traffic on
    for i, tier in enumerate(tiers.tolist()):  # highest first, each around those above it
        sub = order[prio[order] == tier] if multi else order
        limit = _tier_limits(load, com.bg, com.cap) if i else no_limit
        before = load.copy() if multi else load
        rounds = _sweeps_within(com, sub, nparts, sweeps)
        args = (com, sub, nparts, load, split, rounds, *link_groups(rounds), stop, limit, i > 0)
        if steps is not None:  # (the placement on the worker thread, the rest of it here)
            placing = _WORKER.submit(_place_in, *args)
            try:
                if callable(meanwhile):  # (called once, to its end)
                    for _ in steps:
                        pass
                else:  # (steps until the placement is done; the rest left undone)
                    _steps_until(placing, steps)
            finally:
                got = placing.result()
            steps = None
        else:
            got = _place_in(*args)
        if multi:
            choice[sub] = got[sub]
        else:
            choice = got
        placed = choice[sub] if multi else choice
        if int(placed.min()) < 0:  # (stopped part way: parts left unplaced)
            checkpoint()
            raise PlanStopped("the placement was stopped")
        checkpoint()
        if i == 0:  # (below the top tier, a move may not trade a link's limit for lambda)
            moves = _local_search(com, sub, choice, load, nparts, split, max_moves)
        if multi:
            carried.append(load - before > 1e-9)
    if max_moves and restarts and not multi and n:
        choice, load, moves = _restarts(com, order, nparts, split, sweeps, max_moves, restarts,
                                        *link_groups(_sweeps_within(com, order, nparts,
                                                                    sweeps)),
                                        stop, no_limit, checkpoint, (choice, load, moves))
    checkpoint()
    plan = _package(com, choice, load, "greedy", moves, stop, columnar)
    if plan is None:  # (stopped while writing the paths)
        checkpoint()
        raise PlanStopped("the plan was stopped")
    if multi:  # each tier's lambda: the most used link it crosses
        util = load / com.cap
        for tier, on in zip(tiers.tolist(), carried, strict=True):
            plan.extra[f"lambda_priority_{tier}"] = float(util[on].max()) if on.any() else 0.0
    rank = np.empty(n, np.int64)
    rank[by_key] = np.arange(n, dtype=np.int64)
    tup = com.u_of if n else np.zeros(0, np.int64)
    plain = (com.ordered & (com.u_grp[tup] >= 0) & (com.head1 >= 0) & (com.tail1 >= 0)
             if n else np.zeros(0, np.bool_))
    plan.parts = PartChoice(com.demands, com.grp, tup.astype(np.int64), com.u_obj, plain,
                            com.head1, com.tail1, choice, tuple(_shares(split)), rank,
                            com.rate, com.weight)
    return plan


def _structure_classes(com: _Commodities) -> NDArray[np.int64]:
    """Per group of ``com``, a class shared by the groups whose columns hold the same links
    in the same order (:func:`_group_hashes`): the candidates of one leaf pair, with or
    without aggregation (without, every demand is a group of its own).

    >>> com = _Commodities([Demand("a", 1, ((0, 1), (0, 2))), Demand("b", 1, ((3, 1), (3, 2))),
    ...                     Demand("c", 1, ((0, 2), (0, 1)))], {k: 9 for k in range(4)},
    ...                    None, aggregate=False)
    >>> _structure_classes(com).tolist()
    [0, 0, 1]
    """
    hashes = _group_hashes(com.g_col0, com.g_ncand, com.c_ptr, com.c_idx)
    # (classes numbered by their first group: the same numbers whatever the hash values)
    _, first, inv = np.unique(hashes, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first), dtype=np.int64)
    return rank[inv.ravel()]


@numba.njit(cache=True, nogil=True)
def _group_hashes(g_col0: NDArray[np.int64], g_ncand: NDArray[np.int64],
                  c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64]) -> NDArray[np.uint64]:
    """A 64-bit FNV-1a hash of every group's columns: their number, and each column's
    length and link rows in order."""
    prime = np.uint64(1099511628211)
    out = np.empty(g_ncand.shape[0], np.uint64)
    for g in range(g_ncand.shape[0]):
        h = np.uint64(14695981039346656037)
        h = (h ^ np.uint64(g_ncand[g])) * prime
        for col in range(g_col0[g], g_col0[g] + g_ncand[g]):
            h = (h ^ np.uint64(c_ptr[col + 1] - c_ptr[col])) * prime
            for q in range(c_ptr[col], c_ptr[col + 1]):
                h = (h ^ np.uint64(c_idx[q])) * prime
        out[g] = h
    return out


def _stable_order(neg: NDArray[np.float64], by_key: NDArray[np.int64]) -> NDArray[np.int64]:
    """``by_key`` sorted by ``neg`` (stable: within equal values, as ``by_key`` lists
    them): ``by_key[np.argsort(neg[by_key], kind="stable")]``, by runs where ``neg`` in
    that order takes few values in long runs (a job's demands, in key order, share their
    weight and rate: a run per job), each run moved whole.

    >>> _stable_order(np.array([-1.0, -2, -2, -1, -3]), np.array([4, 0, 3, 1, 2])).tolist()
    [4, 1, 2, 0, 3]
    """
    vals = neg[by_key]
    n = len(vals)
    starts = np.flatnonzero(vals[1:] != vals[:-1]) + 1
    if len(starts) > n // 64:  # (short runs: a sort of the values)
        return by_key[np.argsort(vals, kind="stable")]
    starts = np.concatenate((np.zeros(1, np.int64), starts))
    lens = np.diff(np.append(starts, n))
    runs = np.argsort(vals[starts], kind="stable")  # (equal values: in their order)
    return by_key[_ranges(starts[runs], lens[runs])]


@numba.njit(cache=True, nogil=True)
def _class_runs(order: NDArray[np.int64], neg: NDArray[np.float64],
                g_cls: NDArray[np.int64], grp: NDArray[np.int64]) -> NDArray[np.int64]:
    """``order`` with, within each run of equal ``neg`` (as the demands ``order`` lists
    come, one run per weight), the demands of each class together (a demand's class:
    ``g_cls`` of its group ``grp``): the classes in the order they first come, each class's
    demands in their order.

    >>> _class_runs(np.arange(6), np.array([-2.0, -2, -2, -2, -1, -1]),
    ...             np.array([5, 3]), np.array([0, 1, 0, 1, 1, 0])).tolist()
    [0, 2, 1, 3, 4, 5]
    """
    n = order.shape[0]
    out = np.empty(n, np.int64)
    n_cls = 0
    for g in range(g_cls.shape[0]):
        n_cls = max(n_cls, g_cls[g] + 1)
    stamp = np.full(n_cls, -1, np.int64)  # (the run in which a class last came)
    slot = np.zeros(n_cls, np.int64)      # (its place among the classes of that run)
    at = np.zeros(n_cls, np.int64)        # (per place: its count, then where it writes)
    s = 0
    while s < n:
        e = s
        while e < n and neg[order[e]] == neg[order[s]]:
            e += 1
        m = 0
        for i in range(s, e):
            c = g_cls[grp[order[i]]]
            if stamp[c] != s:
                stamp[c] = s
                slot[c] = m
                at[m] = 0
                m += 1
            at[slot[c]] += 1
        acc = s
        for j in range(m):
            t = at[j]
            at[j] = acc
            acc += t
        for i in range(s, e):
            j = slot[g_cls[grp[order[i]]]]
            out[at[j]] = order[i]
            at[j] += 1
        s = e
    return out


def _place_in(com: _Commodities, order: NDArray[np.int64], nparts: NDArray[np.int64],
              load: NDArray[np.float64], split: int, sweeps: int, lg_ptr: NDArray[np.int64],
              lg_idx: NDArray[np.int64], stop: NDArray[np.bool_], limit: NDArray[np.float64],
              protect: bool) -> NDArray[np.int64]:
    """:func:`_place` of the demands ``order`` of ``com`` (``load`` updated in place), their
    fields read in that order (:func:`_in_order`)."""
    return _place(order, *_in_order(order, com.grp, com.rate, nparts, com.fix_ptr,
                                    com.fix_idx),
                  com.g_col0, com.g_ncand, com.g_disjoint, com.c_ptr, com.c_idx, com.cap, load,
                  split, sweeps, lg_ptr, lg_idx, stop, limit, protect,
                  np.full((len(com.grp), split), -1, com.choice_dtype))


@numba.njit(cache=True, nogil=True)
def _in_order(order: NDArray[np.int64], grp: NDArray[np.int64], rate: NDArray[np.float64],
              nparts: NDArray[np.int64], fix_ptr: NDArray[np.int64], fix_idx: NDArray[np.int64],
              ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64],
                         NDArray[np.int64], NDArray[np.int64]]:
    """The group, rate, parts and fixed links (offsets, links) of the demands ``order``, in
    that order: a placement reads them one after the other, not a million scattered reads
    (the order groups the demands by candidate structure, not by their place).

    >>> g, r, n, fp, fi = _in_order(np.array([1, 0]), np.array([5, 6]), np.array([1.0, 2.0]),
    ...                             np.array([1, 2]), np.array([0, 1, 3]), np.array([7, 8, 9]))
    >>> g.tolist(), r.tolist(), n.tolist(), fp.tolist(), fi.tolist()
    ([6, 5], [2.0, 1.0], [2, 1], [0, 2, 3], [8, 9, 7])
    """
    m = order.shape[0]
    grp_o = np.empty(m, np.int64)
    rate_o = np.empty(m, np.float64)
    nparts_o = np.empty(m, np.int64)
    fix_ptr_o = np.empty(m + 1, np.int64)
    fix_ptr_o[0] = 0
    for i in range(m):
        d = order[i]
        grp_o[i] = grp[d]
        rate_o[i] = rate[d]
        nparts_o[i] = nparts[d]
        fix_ptr_o[i + 1] = fix_ptr_o[i] + fix_ptr[d + 1] - fix_ptr[d]
    fix_idx_o = np.empty(fix_ptr_o[m], np.int64)
    for i in range(m):
        d = order[i]
        at = fix_ptr_o[i]
        for q in range(fix_ptr[d], fix_ptr[d + 1]):
            fix_idx_o[at] = fix_idx[q]
            at += 1
    return grp_o, rate_o, nparts_o, fix_ptr_o, fix_idx_o


def _fixed_lambda(com: _Commodities) -> float:
    """A lower bound on any plan's ``lambda``: the most used link under the background and
    every demand's fixed links (those on all of its candidates: its whole rate crosses them
    wherever its parts go).

    >>> com = _Commodities([Demand("a", 100, ((0, 1), (0, 2)))], {0: 400, 1: 400, 2: 400},
    ...                    {1: 40})
    >>> _fixed_lambda(com)
    0.25
    """
    fixed = np.bincount(com.fix_idx, weights=np.repeat(com.rate, np.diff(com.fix_ptr)),
                        minlength=len(com.links))
    util = (com.bg + fixed) / com.cap
    return float(util.max()) if len(util) else 0.0


def _restarts(com: _Commodities, order: NDArray[np.int64], nparts: NDArray[np.int64],
              split: int, sweeps: int, max_moves: int, restarts: int,
              lg_ptr: NDArray[np.int64],
              lg_idx: NDArray[np.int64], stop: NDArray[np.bool_], no_limit: NDArray[np.float64],
              checkpoint: Callable[[], None],
              first: tuple[NDArray[np.int64], NDArray[np.float64], int],
              ) -> tuple[NDArray[np.int64], NDArray[np.float64], int]:
    """The placement, sweeps and local search again from up to ``restarts`` shuffled
    orders of the demands (the same shuffles in every run), as many as re-place at most
    :data:`_RESTART_PARTS` parts in all; the first plan with a lower ``lambda`` than
    ``first`` (``(choice, load, moves)``) replaces it, and so on. None when ``first`` is at
    the fixed links' bound (:func:`_fixed_lambda`): no order can do better there. Heaviest
    first is a good order, not the best one for whole demands: packing 50, 100 and 200 Gb/s
    flows into 400 Gb/s links, a shuffled order often finds the optimum the heaviest-first
    order and single or paired moves from it miss."""
    choice, load, moves = first
    lam = float((load / com.cap).max())
    bound = _fixed_lambda(com)
    if lam <= bound + 1e-9:
        return first
    rounds = _sweeps_within(com, order, nparts, sweeps)
    rng = np.random.default_rng(0)
    for _ in range(min(restarts, _RESTART_PARTS // max(int(nparts[order].sum()), 1))):
        checkpoint()
        shuffled = rng.permutation(order)
        load_r = com.bg.copy()
        got = _place_in(com, shuffled, nparts, load_r, split, rounds, lg_ptr, lg_idx, stop,
                        no_limit, False)
        if int(got.min()) < 0:  # (stopped part way)
            checkpoint()
            raise PlanStopped("the placement was stopped")
        moves_r = _local_search(com, shuffled, got, load_r, nparts, split, max_moves)
        lam_r = float((load_r / com.cap).max())
        if lam_r < lam - 1e-9:
            choice, load, moves, lam = got, load_r, moves_r, lam_r
            if lam <= bound + 1e-9:
                break
    return choice, load, moves


def _sweeps_within(com: _Commodities, order: NDArray[np.int64], nparts: NDArray[np.int64],
                   sweeps: int) -> int:
    """How many of ``sweeps`` re-insertion rounds of the demands ``order`` (of ``nparts``
    parts each) fit in :data:`_SWEEP_BUDGET` link loads scored: a round scores every part
    on every candidate of its demand's group (each column's links)."""
    if not sweeps or not len(order):
        return sweeps
    col_links = com.c_ptr[com.g_col0 + com.g_ncand] - com.c_ptr[com.g_col0]
    if len(order) == len(com.grp):  # (every demand, each once: in any order)
        per_round = int((nparts * col_links[com.grp]).sum())
    else:
        per_round = int((nparts[order] * col_links[com.grp[order]]).sum())
    return min(sweeps, _SWEEP_BUDGET // max(per_round, 1))


def _tier_limits(load: NDArray[np.float64], bg: NDArray[np.float64],
                 cap: NDArray[np.float64]) -> NDArray[np.float64]:
    """The utilisation a lower priority tier may take each link to: where the tiers above
    placed traffic (``load`` beyond the background ``bg``), 1 or the utilisation they left
    if higher; elsewhere no limit (``inf``).

    >>> _tier_limits(np.array([50.0, 0.0, 120.0]), np.zeros(3), np.array([100.0] * 3)).tolist()
    [1.0, inf, 1.2]
    """
    return np.where(load - bg > 1e-9, np.maximum(load / cap, 1.0), np.inf)


def _link_groups(g_col0: NDArray[np.int64], g_ncand: NDArray[np.int64],
                 c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64], n_links: int,
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per link row, the groups with a column on it (CSR: groups of row ``r`` are
    ``idx[ptr[r]:ptr[r + 1]]``, ascending, each once).

    Group 0 has columns (row 0) and (row 1), group 1 (row 1, row 2) and (row 3):

    >>> ptr, idx = _link_groups(np.array([0, 2]), np.array([2, 2]), np.array([0, 1, 2, 4, 5]),
    ...                         np.array([0, 1, 1, 2, 3]), 4)
    >>> ptr.tolist(), idx.tolist()
    ([0, 1, 3, 4, 5], [0, 0, 1, 1, 1])
    """
    col_grp = np.repeat(np.arange(len(g_ncand), dtype=np.int64), g_ncand)
    entry_grp = np.repeat(col_grp, np.diff(c_ptr))
    pairs = distinct(c_idx.astype(np.int64) * max(len(g_ncand), 1) + entry_grp)
    links, groups = np.divmod(pairs, max(len(g_ncand), 1))
    ptr = np.zeros(n_links + 1, np.int64)
    np.cumsum(np.bincount(links, minlength=n_links), out=ptr[1:])
    return ptr, groups.astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _place(order: NDArray[np.int64], grp: NDArray[np.int64], rate: NDArray[np.float64],
           nparts: NDArray[np.int64], fix_ptr: NDArray[np.int64], fix_idx: NDArray[np.int64],
           g_col0: NDArray[np.int64], g_ncand: NDArray[np.int64],
           g_disjoint: NDArray[np.bool_], c_ptr: NDArray[np.int64],
           c_idx: NDArray[np.int64], cap: NDArray[np.float64], load: NDArray[np.float64],
           split: int, sweeps: int, lg_ptr: NDArray[np.int64], lg_idx: NDArray[np.int64],
           stop: NDArray[np.bool_], limit: NDArray[np.float64], protect: bool,
           choice: NDArray[np.integer],
           ) -> NDArray[np.integer]:
    """Greedy placement and re-insertion sweeps (see :func:`plan_greedy`) of the demands
    ``order``, whose ``grp``, ``rate``, ``nparts`` and fixed links (``fix_ptr``,
    ``fix_idx``) are given in that order (:func:`_in_order`); ``load`` is updated in place;
    fills and returns ``choice`` (by demand, all -1, of an integer type that holds the most
    candidates a demand has): every slot's candidate (within its
    demand: a demand of ``nparts`` parts has ``split / nparts`` slots in a row per part,
    which get the part's candidate; -1 for the demands not in ``order``).

    With ``protect``, a candidate's cost starts with how far it takes a link above its
    ``limit`` (the most over all its columns; links without a limit have ``inf``): the
    demands of a lower priority go above the limits of links that carry a higher one's
    only where no candidate avoids it.
    A candidate's cost counts only the links not shared by all of its demand's candidates
    (the group's columns): (largest utilisation after adding the part, sum of squares). Between two
    parts of one demand, and two demands of one group and part rate placed one after the
    other, only the columns whose load changed are costed again when the group's columns
    are link-disjoint (the others' costs are unchanged), and the cheapest is found again
    along their paths in a tournament over the candidates (:func:`_tree_build`; as
    :func:`_cheapest` would find it, in a handful of comparisons rather than one per
    candidate: a leaf pair has 64 spine paths in a large fabric).

    From the second sweep on, a demand is skipped when no part has moved on its group's
    columns since it was last placed (``lg_ptr`` / ``lg_idx``: the groups whose columns
    hold each link, :func:`_link_groups`): its parts would find the same loads and stay
    where they are. A sweep that moves little (the usual last one) costs that little.

    ``stop[0]`` set (from another thread) ends the placement before the next demand, with
    the remaining parts unplaced (-1)."""
    # change tracking from the first sweep: a counter of moves, per group the count when
    # a part last moved on one of its columns, per demand the count when it was placed
    moves = 0
    g_moved = np.zeros(g_ncand.shape[0], np.int64)
    d_seen = np.full(order.shape[0], -1, np.int64)
    k_max = 1
    for g in range(g_ncand.shape[0]):
        k_max = max(k_max, g_ncand[g])
    c_mx = np.empty(k_max)
    c_sq = np.empty(k_max)
    c_ex = np.zeros(k_max)
    # (the tournament over the candidates: ``tree[1]`` the cheapest, see _tree_build)
    width = 1
    while width < k_max:
        width *= 2
    tree = np.full(2 * width, -1, np.int64)
    # c_mx / c_sq / c_ex hold the costs of a part of rate prev_part on the columns of group
    # prev_g (when ``cached``), but for the columns dirty_a and dirty_b, whose loads changed
    cached = False
    dirty_a = -1
    dirty_b = -1
    prev_g = -1
    prev_part = 0.0
    for rnd in range(sweeps + 1):
        moved = False
        cached = False
        for i in range(order.shape[0]):
            if stop[0]:
                return choice
            d = order[i]
            g = grp[i]
            if rnd > 1 and g_moved[g] <= d_seen[i]:
                continue  # (nothing moved on its columns since: its parts would stay)
            if rnd > 0:
                d_seen[i] = moves
            k_c = g_ncand[g]
            n_parts, blk, part, col0, f0, f1 = _parts_of(i, nparts, split, rate, grp, g_col0,
                                                         fix_ptr)
            if g != prev_g or part != prev_part:
                cached = False  # (the costs held are another group's or another rate's)
            prev_g = g
            prev_part = part
            for k in range(n_parts):
                old = choice[d, k * blk]
                if rnd > 0:  # take the part out before placing it again
                    for q in range(f0, f1):
                        load[fix_idx[q]] -= part
                    for q in range(c_ptr[col0 + old], c_ptr[col0 + old + 1]):
                        load[c_idx[q]] -= part
                    dirty_b = old
                best = 0
                if k_c > 1:
                    if cached:  # (only the columns whose load changed)
                        if dirty_a >= 0:
                            _cost_into(dirty_a, col0, c_ptr, c_idx, load, cap, part, protect,
                                       limit, c_mx, c_sq, c_ex)
                            _tree_update(tree, width, dirty_a, c_mx, c_sq, c_ex)
                        if dirty_b >= 0 and dirty_b != dirty_a:
                            _cost_into(dirty_b, col0, c_ptr, c_idx, load, cap, part, protect,
                                       limit, c_mx, c_sq, c_ex)
                            _tree_update(tree, width, dirty_b, c_mx, c_sq, c_ex)
                    else:
                        for c in range(k_c):
                            _cost_into(c, col0, c_ptr, c_idx, load, cap, part, protect,
                                       limit, c_mx, c_sq, c_ex)
                        _tree_build(tree, width, k_c, c_mx, c_sq, c_ex)
                    best = tree[1]
                    cached = g_disjoint[g]
                if best != old:
                    moved = True
                    if rnd > 0:  # the groups on the columns it left and took
                        moves += 1
                        for col in (col0 + old, col0 + best):
                            for q in range(c_ptr[col], c_ptr[col + 1]):
                                lk = c_idx[q]
                                for h in range(lg_ptr[lk], lg_ptr[lk + 1]):
                                    g_moved[lg_idx[h]] = moves
                choice[d, k * blk:(k + 1) * blk] = best
                for q in range(f0, f1):
                    load[fix_idx[q]] += part
                for q in range(c_ptr[col0 + best], c_ptr[col0 + best + 1]):
                    load[c_idx[q]] += part
                dirty_a = best
                dirty_b = -1
        if rnd > 0 and not moved:
            break
    return choice


@numba.njit(cache=True, nogil=True, inline="always")
def _cost_into(c: int, col0: int, c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64],
               load: NDArray[np.float64], cap: NDArray[np.float64], part: float, protect: bool,
               limit: NDArray[np.float64], c_mx: NDArray[np.float64],
               c_sq: NDArray[np.float64], c_ex: NDArray[np.float64]) -> None:
    """Candidate ``c``'s cost for a part of rate ``part`` (:func:`_place`): into ``c_mx[c]``
    the largest utilisation of its columns' links after adding the part, ``c_sq[c]`` the
    sum of their squares, ``c_ex[c]`` (with ``protect``) how far it takes one above its
    ``limit``, else 0."""
    mx = 0.0
    sq = 0.0
    ex = 0.0
    for q in range(c_ptr[col0 + c], c_ptr[col0 + c + 1]):
        lk = c_idx[q]
        u = (load[lk] + part) / cap[lk]
        if u > mx:
            mx = u
        sq += u * u
        if protect and u - limit[lk] > ex:
            ex = u - limit[lk]
    c_mx[c] = mx
    c_sq[c] = sq
    c_ex[c] = ex


@numba.njit(cache=True, nogil=True, inline="always")
def _cheapest(k_c: int, c_mx: NDArray[np.float64], c_sq: NDArray[np.float64],
              c_ex: NDArray[np.float64]) -> int:
    """The first of the candidates ``0 .. k_c - 1`` with the lowest cost: by ``c_ex``, then
    ``c_mx``, then ``c_sq`` (each within 1e-12; see :func:`_cost_into`): of peaks 0.5,
    0.4 and 0.4 and squares 1.0, 0.3 and 0.2, candidate 2."""
    best = -1
    best_ex = np.inf
    best_max = np.inf
    best_sq = np.inf
    for c in range(k_c):
        ex = c_ex[c]
        mx = c_mx[c]
        sq = c_sq[c]
        if ex < best_ex - 1e-12 or (ex <= best_ex + 1e-12 and (
                mx < best_max - 1e-12 or (mx <= best_max + 1e-12 and sq < best_sq - 1e-12))):
            best, best_ex, best_max, best_sq = c, ex, mx, sq
    return best


@numba.njit(cache=True, nogil=True, inline="always")
def _cheaper(b: int, a: int, c_mx: NDArray[np.float64], c_sq: NDArray[np.float64],
             c_ex: NDArray[np.float64]) -> bool:
    """Whether candidate ``b`` (-1: none) is cheaper than ``a`` (-1: none; ``a`` before
    ``b``), as :func:`_cheapest` compares them: by ``c_ex``, then ``c_mx``, then ``c_sq``,
    each lower by more than 1e-12 (within it, the first stays)."""
    if b < 0:
        return False
    if a < 0:
        return True
    ex, mx, sq = c_ex[b], c_mx[b], c_sq[b]
    a_ex, a_mx, a_sq = c_ex[a], c_mx[a], c_sq[a]
    return ex < a_ex - 1e-12 or (ex <= a_ex + 1e-12 and (
        mx < a_mx - 1e-12 or (mx <= a_mx + 1e-12 and sq < a_sq - 1e-12)))


@numba.njit(cache=True, nogil=True)
def _tree_build(tree: NDArray[np.int64], width: int, k_c: int, c_mx: NDArray[np.float64],
                c_sq: NDArray[np.float64], c_ex: NDArray[np.float64]) -> None:
    """A tournament over candidates ``0 .. k_c - 1`` (``width``: a power of two at least
    ``k_c``): leaf ``width + c`` holds candidate ``c`` (-1 past ``k_c``), every node the
    winner of its two children (:func:`_cheaper`: the left one, of the lower candidates,
    unless the right is cheaper), so ``tree[1]`` is what :func:`_cheapest` finds: of peaks
    0.5, 0.4 and 0.4 and squares 1.0, 0.3 and 0.2, candidate 2.

    >>> tree = np.zeros(8, np.int64)
    >>> mx, sq = np.array([0.5, 0.4, 0.4]), np.array([1.0, 0.3, 0.2])
    >>> _tree_build(tree, 4, 3, mx, sq, np.zeros(3))
    >>> int(tree[1]), tree[4:].tolist()
    (2, [0, 1, 2, -1])
    >>> mx[2] = 0.6; _tree_update(tree, 4, 2, mx, sq, np.zeros(3)); int(tree[1])
    1
    """
    for c in range(width):
        tree[width + c] = c if c < k_c else -1
    for i in range(width - 1, 0, -1):
        a = tree[2 * i]
        b = tree[2 * i + 1]
        tree[i] = b if _cheaper(b, a, c_mx, c_sq, c_ex) else a


@numba.njit(cache=True, nogil=True)
def _tree_update(tree: NDArray[np.int64], width: int, c: int, c_mx: NDArray[np.float64],
                 c_sq: NDArray[np.float64], c_ex: NDArray[np.float64]) -> None:
    """The tournament of :func:`_tree_build` after candidate ``c``'s cost changed: the
    matches on its way to the top played again."""
    i = (width + c) >> 1
    while i >= 1:
        a = tree[2 * i]
        b = tree[2 * i + 1]
        tree[i] = b if _cheaper(b, a, c_mx, c_sq, c_ex) else a
        i >>= 1


def _local_search(com: _Commodities, order: NDArray[np.int64], choice: NDArray[np.int64],
                  load: NDArray[np.float64], nparts: NDArray[np.int64], split: int,
                  max_moves: int) -> int:
    """First-improvement moves of single parts off the links at ``lambda`` (``choice`` and
    ``load`` are updated in place); returns the number of moves. A move is kept if it
    lowers (``lambda`` to 9 decimals, the number of links at ``lambda``, the sum of squared
    utilisations), in that order (:func:`_local_search_kernel`)."""
    return int(_local_search_kernel(order, choice, load, com.cap, com.rate, nparts,
                                    com.grp, com.g_ncand, com.g_col0, com.fix_ptr, com.fix_idx,
                                    com.c_ptr, com.c_idx, split, max_moves, _PAIR_BUDGET))


@numba.njit(cache=True, nogil=True)
def _block_sum(a: NDArray[np.float64], lo: int, n: int) -> float:
    """numpy's sum of a block of at most 128 float64 (:func:`_pairwise_sum`)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    m = n - (n % 8)
    while i < m:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@numba.njit(cache=True, nogil=True)
def _pairwise_sum(a: NDArray[np.float64], lo: int, n: int) -> float:
    """``a[lo:lo + n].sum()`` exactly as numpy adds a contiguous float64 array (pairwise
    summation: blocks of at most 128 added by 8 accumulators, the halves of a longer range
    -- the first a multiple of 8 -- added recursively), so compiled code compares sums bit
    for bit with numpy. The recursion runs on an explicit stack (a recursive function
    cannot be cached by numba).

    >>> a = np.random.default_rng(0).random(1000)
    >>> bool(_pairwise_sum(a, 0, 1000) == a.sum())
    True
    """
    if n <= 128:
        return _block_sum(a, lo, n)
    s_lo = np.empty(64, np.int64)
    s_n = np.empty(64, np.int64)
    s_stage = np.empty(64, np.int64)  # 0: not split yet; 1: left half pending; 2: right
    s_left = np.empty(64)
    top = 0
    s_lo[0], s_n[0], s_stage[0] = lo, n, 0
    while True:
        m = s_n[top]
        if m > 128 and s_stage[top] == 0:  # split: the left half first
            half = m // 2
            half -= half % 8
            s_stage[top] = 1
            top += 1
            s_lo[top], s_n[top], s_stage[top] = s_lo[top - 1], half, 0
            continue
        v = _block_sum(a, s_lo[top], m)
        top -= 1
        while True:  # hand v to the range it is a half of
            if top < 0:
                return v
            if s_stage[top] == 1:  # the left half: keep it, sum the right one
                s_left[top] = v
                s_stage[top] = 2
                half = s_n[top] // 2
                half -= half % 8
                top += 1
                s_lo[top] = s_lo[top - 1] + half
                s_n[top] = s_n[top - 1] - half
                s_stage[top] = 0
                break
            v = s_left[top] + v
            top -= 1


@numba.njit(cache=True, nogil=True)
def _round9_key(x: float) -> float:
    """The integer ``N`` (as a float) with ``round(x, 9) == N / 1e9`` in Python: ``x * 1e9``
    taken exactly (Dekker's two-product) and rounded half to even, as Python rounds the
    exact binary value. Two values compare under ``round(., 9)`` as their keys do.

    >>> [_round9_key(v) for v in (0.1234567894, 0.1234567896)]
    [123456789.0, 123456790.0]
    >>> [_round9_key(v) for v in (1 / 1024, 3 / 1024)]  # exact ties 976562.5, 2929687.5
    [976562.0, 2929688.0]
    """
    neg = x < 0.0
    if neg:
        x = -x
    p = x * 1e9
    c = 134217729.0 * x  # Veltkamp split of x (1e9 splits as 1e9 + 0)
    xh = c - (c - x)
    xl = x - xh
    err = (xh * 1e9 - p) + xl * 1e9  # x * 1e9 == p + err exactly
    fl = np.floor(p)
    t = ((p - fl) - 0.5) + err
    if t > 0.0:
        n = fl + 1.0
    elif t < 0.0:
        n = fl
    else:
        n = fl if fl % 2.0 == 0.0 else fl + 1.0
    return -n if neg else n


@numba.njit(cache=True, nogil=True)
def _score(ld: NDArray[np.float64], cap: NDArray[np.float64], u: NDArray[np.float64],
           sq_buf: NDArray[np.float64]) -> tuple[float, int, float]:
    """(``lambda`` to 9 decimals as :func:`_round9_key`, links within 1e-9 of it, sum of
    squared utilisations); ``u`` and ``sq_buf`` are scratch arrays."""
    lam = -np.inf
    for i in range(ld.shape[0]):
        u[i] = ld[i] / cap[i]
        if u[i] > lam:
            lam = u[i]
    at = 0
    for i in range(ld.shape[0]):
        if u[i] >= lam - 1e-9:
            at += 1
        sq_buf[i] = u[i] * u[i]
    return _round9_key(lam), at, _pairwise_sum(sq_buf, 0, ld.shape[0])


@numba.njit(cache=True, nogil=True)
def _move_part(trial: NDArray[np.float64], part: float, f0: int, f1: int,
               fix_idx: NDArray[np.int64], a0: int, a1: int, b0: int, b1: int,
               c_idx: NDArray[np.int64]) -> None:
    """Take ``part`` off the fixed links ``fix_idx[f0:f1]`` and the column links
    ``c_idx[a0:a1]`` of ``trial``, then put it on the fixed links again and on
    ``c_idx[b0:b1]`` (the steps numpy would take, in that order)."""
    for q in range(f0, f1):
        trial[fix_idx[q]] -= part
    for q in range(a0, a1):
        trial[c_idx[q]] -= part
    for q in range(f0, f1):
        trial[fix_idx[q]] += part
    for q in range(b0, b1):
        trial[c_idx[q]] += part


@numba.njit(cache=True, nogil=True)
def _crosses(mask: NDArray[np.bool_], f0: int, f1: int, fix_idx: NDArray[np.int64], a0: int,
             a1: int, c_idx: NDArray[np.int64]) -> bool:
    """Whether a fixed link ``fix_idx[f0:f1]`` or a column link ``c_idx[a0:a1]`` is in
    ``mask``."""
    hit = False
    for q in range(f0, f1):
        hit |= mask[fix_idx[q]]
    for q in range(a0, a1):
        hit |= mask[c_idx[q]]
    return hit


@numba.njit(cache=True, nogil=True)
def _mark_top(u: NDArray[np.float64], top: NDArray[np.bool_]) -> None:
    """``top[i]``: whether ``u[i]`` is within 1e-9 of the largest of ``u``."""
    mx = -np.inf
    for i in range(u.shape[0]):
        if u[i] > mx:
            mx = u[i]
    for i in range(u.shape[0]):
        top[i] = u[i] >= mx - 1e-9


@numba.njit(cache=True, nogil=True)
def _lower(a: tuple[float, int, float], b: tuple[float, int, float]) -> bool:
    """Whether score ``a`` (:func:`_score`) is lower than ``b``, in order of its terms."""
    return a[0] < b[0] or (a[0] == b[0] and (a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])))


@numba.njit(cache=True, nogil=True)
def _parts_of(d: int, nparts: NDArray[np.int64], split: int, rate: NDArray[np.float64],
              grp: NDArray[np.int64], g_col0: NDArray[np.int64], fix_ptr: NDArray[np.int64],
              ) -> tuple[int, int, float, int, int, int]:
    """Demand ``d``'s parts: how many, the slots per part, a part's rate, its group's first
    column and the range of its fixed links."""
    n = nparts[d]
    return n, split // n, rate[d] / n, g_col0[grp[d]], fix_ptr[d], fix_ptr[d + 1]


@numba.njit(cache=True, nogil=True)
def _take(choice: NDArray[np.int64], d: int, k: int, c: int, n_parts: int) -> None:
    """Demand ``d``'s part ``k`` of ``n_parts`` (its slots) to candidate ``c``."""
    blk = choice.shape[1] // n_parts
    choice[d, k * blk:(k + 1) * blk] = c


@numba.njit(cache=True, nogil=True)
def _second_move(trial: NDArray[np.float64], trial2: NDArray[np.float64],
                 best: tuple[float, int, float], d: int, k: int, order: NDArray[np.int64],
                 choice: NDArray[np.int64],
                 cap: NDArray[np.float64], rate: NDArray[np.float64],
                 nparts: NDArray[np.int64], grp: NDArray[np.int64],
                 g_ncand: NDArray[np.int64], g_col0: NDArray[np.int64],
                 fix_ptr: NDArray[np.int64], fix_idx: NDArray[np.int64],
                 c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64], split: int,
                 top: NDArray[np.bool_], u: NDArray[np.float64], sq_buf: NDArray[np.float64],
                 budget: NDArray[np.int64]) -> tuple[int, int, int, float, int, float]:
    """After demand ``d``'s part ``k`` moved (the load ``trial``; ``top``: its links at
    lambda), the first other part on a link of ``top`` and candidate of its own whose move
    scores lower than ``best``: ``(demand, part, candidate, score)`` with the load in
    ``trial2``; demand -1 if none (or ``budget[0]`` trial link loads ran out: then -2)."""
    n_links = trial.shape[0]
    for d2 in order:
        n2, blk2, part2, col2, e0, e1 = _parts_of(d2, nparts, split, rate, grp, g_col0,
                                                  fix_ptr)
        for k2 in range(n2):
            if d2 == d and k2 == k:
                continue  # (the part moved)
            cur2 = choice[d2, k2 * blk2]
            b0, b1 = c_ptr[col2 + cur2], c_ptr[col2 + cur2 + 1]
            if not _crosses(top, e0, e1, fix_idx, b0, b1, c_idx):
                continue
            for c2 in range(g_ncand[grp[d2]]):
                if c2 == cur2:
                    continue
                if budget[0] < n_links:
                    return -2, 0, 0, 0.0, 0, 0.0
                budget[0] -= n_links
                trial2[:] = trial
                _move_part(trial2, part2, e0, e1, fix_idx, b0, b1, c_ptr[col2 + c2],
                           c_ptr[col2 + c2 + 1], c_idx)
                sc = _score(trial2, cap, u, sq_buf)
                if _lower(sc, best):
                    return d2, k2, c2, sc[0], sc[1], sc[2]
    return -1, 0, 0, 0.0, 0, 0.0


@numba.njit(cache=True, nogil=True)
def _local_search_kernel(order: NDArray[np.int64], choice: NDArray[np.int64],
                         load: NDArray[np.float64], cap: NDArray[np.float64],
                         rate: NDArray[np.float64], nparts: NDArray[np.int64],
                         grp: NDArray[np.int64], g_ncand: NDArray[np.int64],
                         g_col0: NDArray[np.int64], fix_ptr: NDArray[np.int64],
                         fix_idx: NDArray[np.int64],
                         c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64], split: int,
                         max_moves: int, pair_budget: int) -> int:
    """:func:`_local_search`: parts crossing a link at ``lambda`` in ``order`` (heaviest
    demands first; a demand has ``nparts`` parts); each is tried on the demand's other
    candidates in turn, the first trial load that scores lower is kept and the scan starts
    again. A trial load is the current one with the part taken off its links and put on
    the candidate's, in that order (so the floating-point values are those of the same
    steps in numpy).

    When no single move scores lower, pairs are tried (an ejection chain of two): a part
    at ``lambda`` moved as above, then another part crossing a link at the trial's
    ``lambda`` moved to one of its own candidates (:func:`_second_move`); the first pair
    that scores lower than the current load is kept. At most ``pair_budget`` trial link
    loads are scored in pairs in all (the search ends when they run out)."""
    n_links = load.shape[0]
    u = np.empty(n_links)
    sq_buf = np.empty(n_links)
    trial = np.empty(n_links)
    trial2 = np.empty(n_links)
    hot = np.empty(n_links, np.bool_)
    top = np.empty(n_links, np.bool_)
    budget = np.full(1, pair_budget, np.int64)
    cur = _score(load, cap, u, sq_buf)
    moves = 0
    while moves < max_moves:
        for i in range(n_links):
            u[i] = load[i] / cap[i]
        _mark_top(u, hot)
        improved = False
        for phase in range(2):  # single moves, then (none lower) pairs
            for d in order:
                n_parts, blk, part, col0, f0, f1 = _parts_of(d, nparts, split, rate, grp,
                                                             g_col0, fix_ptr)
                for k in range(n_parts):
                    if phase == 1 and k > 0 and choice[d, k * blk] == choice[d, (k - 1) * blk]:
                        continue  # (the same part again: its pairs were tried)
                    was = choice[d, k * blk]
                    a0, a1 = c_ptr[col0 + was], c_ptr[col0 + was + 1]
                    if not _crosses(hot, f0, f1, fix_idx, a0, a1, c_idx):
                        continue
                    for c in range(g_ncand[grp[d]]):
                        if c == was:
                            continue
                        trial[:] = load
                        _move_part(trial, part, f0, f1, fix_idx, a0, a1, c_ptr[col0 + c],
                                   c_ptr[col0 + c + 1], c_idx)
                        sc = _score(trial, cap, u, sq_buf)
                        if phase == 0:
                            if _lower(sc, cur):
                                _take(choice, d, k, c, n_parts)
                                cur = sc
                                load[:] = trial
                                improved = True
                                break
                            continue
                        _mark_top(u, top)  # (u: the trial's utilisations)
                        d2, k2, c2, lam2, at2, sq2 = _second_move(
                            trial, trial2, cur, d, k, order, choice, cap, rate, nparts, grp,
                            g_ncand, g_col0, fix_ptr, fix_idx, c_ptr, c_idx, split, top, u,
                            sq_buf, budget)
                        if d2 == -2:
                            return moves
                        if d2 >= 0:
                            _take(choice, d, k, c, n_parts)
                            _take(choice, d2, k2, c2, nparts[d2])
                            cur = (lam2, at2, sq2)
                            load[:] = trial2
                            improved = True
                            break
                    if improved:
                        break
                if improved:
                    break
            if improved:
                break
        if not improved:
            break
        moves += 1
    return moves


def _package(com: _Commodities, choice: NDArray[np.int64], load: NDArray[np.float64],
             solver: str, moves: int, stop: NDArray[np.bool_] = _NEVER,
             columnar: bool = False) -> Plan | None:
    """The plan: every demand's full paths with their shares (parts on the same path add
    up, in path order), the load per link (background excluded) and ``lambda``; ``None`` if
    ``stop[0]`` was set meanwhile. ``columnar``: the paths kept in columns (:class:`PathRows`,
    read as a mapping), not made per demand."""
    split = choice.shape[1]
    acc = _shares(split)
    com.keys = made_keys(com.keys)  # (here, before the worker thread reads them too)
    # (a large plan's link index is made by a compiled pass on the worker thread while the
    # caller writes the paths: the worker is then free again when they are steered)
    # (the same columns compiled alike and placed alike as in the last plan of them: the
    # same index, as that plan made it)
    last = com.memo.get("key_links") if com.memo is not None else None
    if (isinstance(last, tuple) and last[1] is com.grp and last[0].shape == choice.shape
            and np.array_equal(last[0], choice)):
        key_links = last[2]
    else:
        key_links = (_WORKER.submit(_key_links, com, choice)
                     if len(choice) >= _BACKGROUND_ROWS else _key_links(com, choice))
        if com.memo is not None:
            com.memo["key_links"] = (choice.copy(), com.grp, key_links)
    paths: MutableMapping[str, list[tuple[tuple[int, ...], float]]]
    if columnar:
        rows = _path_rows(com, choice, acc, stop)
        if rows is None:
            return None
        paths = BatchMap(rows, rows.value)
    else:
        paths = {}
        if not _fill_paths(com, choice, paths, acc, stop):
            return None
    util = load / com.cap
    return Plan(paths, dict(zip(com.links.tolist(), (load - com.bg).tolist(), strict=True)),
                float(util.max()) if len(util) else 0.0, solver, moves,
                columns=Columns.of(com), key_links=key_links)


def _shares(split: int) -> list[float]:
    """``acc[m]``: the share of ``m`` of ``split`` parts, added up part by part (as a plan
    adds up the parts of a demand on one path).

    >>> _shares(4)
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    inc = 1.0 / split
    acc = [0.0]
    for _ in range(split):
        acc.append(acc[-1] + inc)
    return acc


def _key_links(com: _Commodities, choice: NDArray[np.int64]) -> KeyLinks:
    """The demands on every link of their paths under ``choice`` (a path is the demand's
    fixed links and its part's column's, as a set), by link.

    Demand 0 (fixed link 9) has parts on columns 0 (link 5), 1 (links 6, 7) and 0 again;
    demand 1 (no fixed link) on column 1:

    >>> com = _Commodities([Demand("a", 1.0, ((9, 5), (9, 6, 7))),
    ...                     Demand("b", 1.0, ((5,), (6, 7)))], dict.fromkeys(range(5, 10), 1.0),
    ...                    None)
    >>> kl = _key_links(com, np.array([[0, 0, 1, 0], [1, 1, 1, 1]]))
    >>> kl.links.tolist(), kl.ptr.tolist(), kl.owner.tolist()
    ([5, 6, 7, 9], [0, 2, 4, 6, 7], [0, 0, 0, 1, 0, 1, 0])
    """
    # (each demand's first column's links, gathered at once: the pass below then reads
    # them in order rather than a million columns scattered over memory)
    first = com.g_col0[com.grp] + choice[:, 0] if len(choice) else np.zeros(0, np.int64)
    lo = com.c_ptr[first]
    n_first = com.c_ptr[first + 1] - lo
    ptr, owner = _key_link_csr(choice, com.n_parts(choice.shape[1]), com.grp, com.g_col0,
                               com.c_ptr, com.c_idx, com.fix_ptr, com.fix_idx, len(com.links),
                               _offsets(n_first), com.c_idx[_ranges(lo, n_first)])
    used = np.flatnonzero(ptr[1:] > ptr[:-1])
    return KeyLinks(_key_list(com.keys), com.links[used], np.r_[ptr[used], ptr[-1]], owner)


@numba.njit(cache=True, nogil=True)
def _key_link_csr(choice: NDArray[np.int64], nparts: NDArray[np.int64], grp: NDArray[np.int64],
                  g_col0: NDArray[np.int64], c_ptr: NDArray[np.int64],
                  c_idx: NDArray[np.int64], fix_ptr: NDArray[np.int64],
                  fix_idx: NDArray[np.int64], n_rows: int, first_ptr: NDArray[np.int64],
                  first_idx: NDArray[np.int64],
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """:func:`_key_links` by link row (a counting sort): the demands on row ``r`` are
    ``owner[ptr[r]:ptr[r + 1]]``, in this order: every demand on it by a fixed link
    (``fix_idx``), demand by demand, then, demand by demand, each on it by the column of a
    run of equal slots in its row of ``choice`` (a part's slots, or a whole demand's; a
    demand of ``nparts`` parts has its slots in that many blocks of equal slots, so only
    the first slot of each block is read). The links of each demand's first block's column
    are given (``first_idx[first_ptr[d]:first_ptr[d + 1]]``); the other blocks' (a demand
    split over several columns) are read here."""
    n, split = choice.shape
    ptr = np.zeros(n_rows + 1, np.int64)
    for x in range(fix_idx.shape[0]):
        ptr[fix_idx[x] + 1] += 1
    for x in range(first_idx.shape[0]):
        ptr[first_idx[x] + 1] += 1
    for d in range(n):
        blk = split // nparts[d]
        if blk == split:
            continue
        col0 = g_col0[grp[d]]
        for k in range(blk, split, blk):
            if choice[d, k] != choice[d, k - blk]:
                col = col0 + choice[d, k]
                for x in range(c_ptr[col], c_ptr[col + 1]):
                    ptr[c_idx[x] + 1] += 1
    for r in range(n_rows):
        ptr[r + 1] += ptr[r]
    at = ptr[:-1].copy()
    owner = np.empty(ptr[n_rows], np.int64)
    for d in range(n):
        for x in range(fix_ptr[d], fix_ptr[d + 1]):
            r = fix_idx[x]
            owner[at[r]] = d
            at[r] += 1
    for d in range(n):
        for x in range(first_ptr[d], first_ptr[d + 1]):
            r = first_idx[x]
            owner[at[r]] = d
            at[r] += 1
        blk = split // nparts[d]
        if blk == split:
            continue
        col0 = g_col0[grp[d]]
        for k in range(blk, split, blk):
            if choice[d, k] != choice[d, k - blk]:
                col = col0 + choice[d, k]
                for x in range(c_ptr[col], c_ptr[col + 1]):
                    r = c_idx[x]
                    owner[at[r]] = d
                    at[r] += 1
    return ptr, owner


# link loads the re-insertion sweeps of one placement may score, in all (some 0.08 s): where
# a round would score more, the parts are many and small against the links and a round
# re-places them where they were (1024 GPUs / 8 jobs: 8.7 M per round, two rounds changed
# the sum of squared utilisations by 3e-6 of it and neither lambda; 8192 GPUs: 135 M per
# round, lambda 0.998 with or without them)
_SWEEP_BUDGET = 8_000_000
# plans of this many demands or more make their link index (:func:`_key_links`) on the
# worker thread (a pass that takes tens of milliseconds there; below, the thread's
# hand-over would cost more than it gives)
_BACKGROUND_ROWS = 1 << 16
# the rows of a part :func:`in_parts` hands to one thread or the other (a few ms of a
# compiled pass: the most one thread waits for the other at the end)
_PART_ROWS = 1 << 16


def _new_worker() -> ThreadPoolExecutor:
    """The planner's worker thread (started at its first task)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="fabricpilot-planner")


def _worker_after_fork() -> None:
    """A forked child has none of its parent's threads: it gets a worker of its own."""
    global _WORKER
    _WORKER = _new_worker()


_WORKER = _new_worker()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_worker_after_fork)


def _steps_until(future: Future[Any], steps: Iterator[None] | None) -> None:
    """Take ``steps`` (the caller's work, each a few ms) one after the other until
    ``future`` is done (or they are).

    >>> from concurrent.futures import Future
    >>> f, done = Future(), []
    >>> def steps():
    ...     done.append(1); yield
    ...     f.set_result("ready"); done.append(2); yield
    ...     done.append(3); yield
    >>> it = steps()
    >>> _steps_until(f, it), done
    (None, [1, 2])
    >>> next(it), done
    (None, [1, 2, 3])
    """
    if steps is not None:
        while not future.done() and next(steps, _DONE) is not _DONE:
            pass


def _work_steps(work: Callable[[], None] | Iterator[None] | None) -> Iterator[None] | None:
    """``work`` as steps: a callable is one step, an iterator its own.

    >>> list(_work_steps(lambda: print("done")))
    done
    [None]
    """
    if work is None or not callable(work):
        return work

    def one() -> Iterator[None]:
        work()
        yield

    return one()


_DONE = object()


def in_parts(fn: Callable[[int, int], T], n: int) -> list[T]:
    """``fn(lo, hi)`` over rows ``0:n`` in parts of :data:`_PART_ROWS`, taken one at a time
    by this thread and the planner's worker thread at once (``fn`` a compiled pass over
    its rows that holds no GIL), for ``n`` of at least :data:`_BACKGROUND_ROWS`: whichever
    is free takes the next part, so a worker still busy with other work (a plan's link
    index) leaves the parts to this thread, and this one waits at most for the part the
    worker has in hand. Returns the parts' results in row order (one part, ``fn(0, n)``,
    when ``n`` is smaller).

    >>> in_parts(lambda lo, hi: hi - lo, 10)
    [10]
    >>> got = in_parts(lambda lo, hi: (lo, hi), 3 * _PART_ROWS + 5)
    >>> len(got), got[0], got[-1] == (3 * _PART_ROWS, 3 * _PART_ROWS + 5)
    (4, (0, 65536), True)
    """
    if n < _BACKGROUND_ROWS:
        return [fn(0, n)]
    bounds = [*range(0, n, _PART_ROWS), n]
    out: list[Any] = [None] * (len(bounds) - 1)
    todo = iter(range(len(out)))
    lock = threading.Lock()

    def take() -> int | None:
        with lock:
            return next(todo, None)

    def run() -> None:
        while (i := take()) is not None:
            out[i] = fn(bounds[i], bounds[i + 1])

    other = _WORKER.submit(run)
    try:
        run()
    except BaseException:
        with lock:  # (no part left for the worker: it stops after the one it has)
            for _ in todo:
                pass
        other.cancel()
        raise
    if not other.cancel():  # (started: wait for the part it has in hand)
        other.result()
    return out


# trial link loads (links x trials) the local search may score in pairs, in all
_PAIR_BUDGET = 5_000_000

# plans from shuffled orders tried by default on instances the local search runs on (see
# _restarts), and the parts they may re-place in all: the local search of each costs about
# as much as the first one's (a 2:1 fabric's 1 920 parts: 27 ms), so only small instances,
# where parts are coarse against the links and packing them is what sets lambda, get them
_RESTARTS = 32
_RESTART_PARTS = 1_000

_WARM: list[bool] = []


def warm_up() -> None:
    """Load the planner's compiled kernels (from numba's cache, or compile them) with a tiny
    plan, once per process, so that the first real plan does not pay for it.

    >>> warm_up()
    """
    if _WARM:
        return
    shared = ((2, 3), (4, 5))
    plan_greedy([Demand("a", 1.0, shared, 2.0, (0,), (1,)),
                 Demand("b", 1.0, shared, 1.0, (6,), (7,), whole=True),
                 Demand("c", 1.0, ((2, 3), (4,)))],
                {lk: 10.0 for lk in range(8)}, split=2, max_moves=1)
    one = np.zeros(1, np.int64)
    no = np.zeros(8, np.bool_)
    _replace_parts(one, one, one, np.ones(1), one, one + 1, np.array([0, 1]), one,
                   np.zeros(2, np.int64), np.zeros(0, np.int64), np.ones(8), np.zeros(8),
                   no, no, 2, 0.0)
    _WARM.append(True)


# a demand from its fields as one tuple, in C, without its checks
_demand_of = functools.partial(_TUPLE_NEW, Demand)


def _demand(key: str, rate_gbps: float, candidates: tuple[tuple[int, ...], ...],
            weight: float, head: tuple[int, ...], tail: tuple[int, ...],
            whole: bool = False, priority: int = 0, parts: int = 0) -> Demand:
    """``Demand(key, rate_gbps, candidates, weight, head, tail, whole, priority, parts)``
    without its checks, for callers that made sure ``candidates`` is not empty, ``rate_gbps
    >= 0`` and ``parts >= 0`` (:data:`_demand_of` makes one of a tuple of its fields).

    >>> _demand("a", 1.0, ((1,),), 2.0, (0,), ()) == Demand("a", 1.0, ((1,),), 2.0, (0,))
    True
    """
    return _demand_of((key, rate_gbps, candidates, weight, head, tail, whole, priority,
                       parts))


def _fill_paths(com: _Commodities, choice: NDArray[np.int64],
                paths: dict[str, list[tuple[tuple[int, ...], float]]], acc: list[float],
                stop: NDArray[np.bool_] = _NEVER) -> bool:
    """Every demand's full paths and shares into ``paths`` (``acc[m]``: the share of ``m``
    parts, added up part by part, as the parts' shares would be). Returns ``False`` if
    ``stop[0]`` was set meanwhile (read every few thousand demands; ``paths`` then
    incomplete)."""
    split = choice.shape[1]
    n = len(com.demands)
    if not n:
        return True
    whole = acc[split]
    # the common case, all at once: one path, with one head and one tail link; each
    # demand's paths are ``[(path, whole)]``, listed per path length, then the others'
    one_path, fast, rest_idx = _path_kinds(com, choice)
    made: list[list[tuple[tuple[int, ...], float]]] = []
    order: list[NDArray[np.int64]] = []
    for idx, full in _single_paths(com, fast, choice[fast, 0]):
        order.append(idx)
        made.extend(map(list, zip(zip(map(tuple, full.tolist()), itertools.repeat(whole)))))
    # the others one by one (their rows only: a plan's choice has n * split entries)
    order.append(rest_idx)
    if not _rest_paths(com, choice, rest_idx, one_path, acc, stop, made):
        return False
    # (back in the demands' order, unless they were made in it, as on a plan of one kind)
    at = np.concatenate(order)
    if not (at == np.arange(n)).all():
        inv = np.empty(n, np.int64)
        inv[at] = np.arange(n, dtype=np.int64)
        made = list(map(made.__getitem__, inv.tolist()))
    paths.update(zip(com.keys, made, strict=True))
    return True


def _path_kinds(com: _Commodities, choice: NDArray[np.int64]
                ) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.int64]]:
    """Which demands have all their parts on one candidate; those of them with one head
    and one tail link (each one path, made all at once: the common case); and the others
    (listed one by one; a row of one candidate needs no sorting there).

    >>> com = type("C", (), {"head1": np.array([4, 5, -1]), "tail1": np.array([6, 7, 8])})
    >>> [a.tolist() for a in _path_kinds(com, np.array([[0, 0], [0, 1], [1, 1]]))]
    [[True, False, True], [0], [1, 2]]
    """
    return _path_kinds_of(np.ascontiguousarray(choice), com.head1, com.tail1)


@numba.njit(cache=True, nogil=True)
def _path_kinds_of(choice: NDArray[np.int64], head1: NDArray[np.int64],
                   tail1: NDArray[np.int64],
                   ) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.int64]]:
    """:func:`_path_kinds` in one pass over the rows (a row's scan stops at its first
    part on another candidate)."""
    n = choice.shape[0]
    one_path = np.empty(n, np.bool_)
    is_fast = np.empty(n, np.bool_)
    n_fast = 0
    for d in range(n):
        same = _on_one(choice, d)
        one_path[d] = same
        is_fast[d] = same and head1[d] >= 0 and tail1[d] >= 0
        n_fast += is_fast[d]
    fast = np.empty(n_fast, np.int64)
    rest = np.empty(n - n_fast, np.int64)
    i = k = 0
    for d in range(n):
        if is_fast[d]:
            fast[i] = d
            i += 1
        else:
            rest[k] = d
            k += 1
    return one_path, fast, rest


@numba.njit(cache=True, nogil=True)
def same_qps(at: NDArray[np.int64], n_per_key: NDArray[np.int64], o_first: NDArray[np.int64],
             o_caps: NDArray[np.float64], caps: NDArray[np.float64], o_off: NDArray[np.int64],
             o_flat: NDArray[np.integer], off: NDArray[np.int64], flat: NDArray[np.integer],
             o_weights: NDArray[np.float64], weights: NDArray[np.float64],
             o_ruled: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per key ``k`` of a plan (its QPs ``first[k]:first[k + 1]``, ``first`` the running sum
    of ``n_per_key``; QP ``q``'s links ``flat[off[q]:off[q + 1]]``, share ``weights[q]``;
    rate cap ``caps[k]``), whether it is set ``at[k]`` of an installed batch as it is (-1:
    none): as many QPs, the same cap, and QP by QP the same links and share, none pinned
    by an explicit rule (``o_ruled``). The batch's columns are the ``o_`` ones alike.

    >>> one = np.array([0, 1]); w = np.ones(1); no = np.zeros(1, np.bool_)
    >>> same_qps(np.array([0]), np.array([1]), one, w, w, np.array([0, 2]), np.array([4, 5]),
    ...          np.array([0, 2]), np.array([4, 5]), w, w, no).tolist()
    [True]
    >>> same_qps(np.array([0]), np.array([1]), one, w, w, np.array([0, 2]), np.array([4, 5]),
    ...          np.array([0, 2]), np.array([4, 6]), w, w, no).tolist()
    [False]
    """
    n = len(at)
    keep = np.zeros(n, np.bool_)
    q = 0  # (the key's first QP in the plan)
    for k in range(n):
        cnt = n_per_key[k]
        r = at[k]
        q0 = q
        q += cnt
        if r < 0 or o_first[r + 1] - o_first[r] != cnt or o_caps[r] != caps[k]:
            continue
        same = True
        for j in range(cnt):
            oq, nq = o_first[r] + j, q0 + j
            lo, hi, lo2 = o_off[oq], o_off[oq + 1], off[nq]
            if (o_ruled[oq] or o_weights[oq] != weights[nq]
                    or off[nq + 1] - lo2 != hi - lo):
                same = False
                break
            for i in range(hi - lo):
                if o_flat[lo + i] != flat[lo2 + i]:
                    same = False
                    break
            if not same:
                break
        keep[k] = same
    return keep


@numba.njit(cache=True, nogil=True)
def qp_offsets(off: NDArray[np.int64], whole: float, n_per_key: NDArray[np.int64],
               is_rest: NDArray[np.bool_], r_len: NDArray[np.int64],
               r_weights: NDArray[np.float64],
               ) -> tuple[NDArray[np.int64], NDArray[np.float64], int]:
    """Where each QP's path starts in the links of a plan's :class:`PathRows` (rows at
    ``off``) and its share, key by key: a key not ``is_rest`` has one QP, its row, with
    share ``whole``; a key ``is_rest`` has ``n_per_key[k]`` QPs, whose paths fill its row
    one after the other, with the next lengths of ``r_len`` and shares of ``r_weights``.
    Also the first key ``is_rest`` whose paths' lengths do not add up to its row's (-1:
    none).

    >>> q_off, w, bad = qp_offsets(np.array([0, 2, 5, 6]), 1.0, np.array([1, 2, 1]),
    ...                            np.array([False, True, False]), np.array([1, 2]),
    ...                            np.array([0.5, 0.5]))
    >>> q_off.tolist(), w.tolist(), bad
    ([0, 2, 3, 5, 6], [1.0, 0.5, 0.5, 1.0], -1)
    """
    n = len(n_per_key)
    n_q = 0
    for k in range(n):
        n_q += n_per_key[k]
    q_off = np.empty(n_q + 1, np.int64)
    weights = np.empty(n_q, np.float64)
    q_off[0] = off[0]
    q = r = 0
    bad = -1
    for k in range(n):
        if is_rest[k]:
            for _ in range(n_per_key[k]):
                q_off[q + 1] = q_off[q] + r_len[r]
                weights[q] = r_weights[r]
                q += 1
                r += 1
            if q_off[q] != off[k + 1] and bad < 0:
                bad = k
                q_off[q] = off[k + 1]
        else:
            q_off[q + 1] = off[k + 1]
            weights[q] = whole
            q += 1
    return q_off, weights, bad


class RestPaths(Mapping[int, list[tuple[tuple[int, ...], float]]]):
    """The paths and shares of a plan's demands not of one path with one head and one tail
    link, by row, kept as arrays (:class:`PathRows` ``rest``, as :func:`_path_rows` makes
    it): the rows, ascending; each one's number of QPs (``count``); every QP's path length
    (``q_len``) and share (``q_share``), row after row; the paths' links are the rows'
    links of the plan (``flat[off[r]:off[r + 1]]``, one path after the other). A row's
    list is made when read (once: every read gives the same list).

    >>> rest = RestPaths(np.array([1]), np.array([2]), np.array([1, 2]), np.array([0.5, 0.5]),
    ...                  np.array([7, 1, 9, 2, 3, 4]), np.array([0, 3, 6]))
    >>> rest[1], rest.get(0), list(rest), len(rest), rest[1] is rest[1]
    ([((2,), 0.5), ((3, 4), 0.5)], None, [1], 1, True)
    """

    __slots__ = ("_first", "_flat", "_made", "_off", "count", "q_len", "q_share", "rows")

    def __init__(self, rows: NDArray[np.int64], count: NDArray[np.int64],
                 q_len: NDArray[np.int64], q_share: NDArray[np.float64],
                 flat: NDArray[np.int64], off: NDArray[np.int64]) -> None:
        self.rows = rows
        self.count = count
        self.q_len = q_len
        self.q_share = q_share
        self._flat, self._off = flat, off
        self._first = _offsets(count)  # (each row's first QP)
        self._made: dict[int, list[tuple[tuple[int, ...], float]]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.tolist())

    def __getitem__(self, row: int) -> list[tuple[tuple[int, ...], float]]:
        got = self._made.get(row)
        if got is not None:
            return got
        j = int(np.searchsorted(self.rows, row))
        if j == len(self.rows) or int(self.rows[j]) != row:
            raise KeyError(row)
        lo, hi = int(self._first[j]), int(self._first[j + 1])
        links = self._flat[int(self._off[row]):int(self._off[row + 1])].tolist()
        ends = np.cumsum(self.q_len[lo:hi]).tolist()
        got = self._made[row] = [
            (tuple(links[a:b]), share) for a, b, share in
            zip([0, *ends[:-1]], ends, self.q_share[lo:hi].tolist(), strict=True)]
        return got


class PathRows:
    """A plan's paths in columns, demand by demand in the plan's order (``keys``): a demand
    of one path with one head and one tail link (most) has its path as the links
    ``flat[off[i]:off[i + 1]]``, with share ``whole``; the others' paths and shares are
    listed in ``rest`` (by row), and their rows of ``flat`` hold those paths' links one path
    after the other (``flat`` is every QP's path, in order). A plan reads them through a
    :class:`~fabricpilot.controller.southbound.BatchMap` (:attr:`Plan.paths`), a demand's
    list made when read.

    >>> rows = PathRows(["a", "b"], np.array([7, 1, 9, 2, 3]), np.array([0, 3, 5]), 1.0,
    ...                 {1: [((2,), 0.5), ((3,), 0.5)]})
    >>> rows.value(0), rows.value(1), rows.row_of["b"], len(rows), rows.value(0) is rows.value(0)
    ([((7, 1, 9), 1.0)], [((2,), 0.5), ((3,), 0.5)], 1, 2, True)
    """

    __slots__ = ("_made", "_row_of", "flat", "keys", "off", "rest", "whole")

    def __init__(self, keys: list[str], flat: NDArray[np.int64], off: NDArray[np.int64],
                 whole: float, rest: Mapping[int, list[tuple[tuple[int, ...], float]]],
                 ) -> None:
        self.keys = keys
        self.flat = flat
        self.off = off
        self.whole = whole
        self.rest = rest
        self._row_of: Mapping[str, int] | None = None
        self._made: list[list[tuple[tuple[int, ...], float]] | None] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def row_of(self) -> Mapping[str, int]:
        """Each key's row (made when first asked)."""
        if self._row_of is None:
            self._row_of = key_rows(self.keys)
        return self._row_of

    def share_rows(self, other: KeyRows) -> None:
        """Take the row index of ``other``, whose keys are these, in this order."""
        self._row_of = other.row_of

    def value(self, row: int) -> list[tuple[tuple[int, ...], float]]:
        """Demand ``row``'s paths and shares (made once: every read gives the same list)."""
        got = self.rest.get(row)
        if got is None:
            made = self._made
            if made is None:
                made = self._made = [None] * len(self.keys)
            got = made[row]
            if got is None:
                got = made[row] = [(tuple(self.flat[int(self.off[row]):int(self.off[row + 1])]
                                          .tolist()), self.whole)]
        return got


def _path_rows(com: _Commodities, choice: NDArray[np.int64], acc: list[float],
               stop: NDArray[np.bool_] = _NEVER) -> PathRows | None:
    """:func:`_fill_paths` in columns: the paths of the demands of one path (with one head
    and one tail link) as link rows, no tuple made; the others' as lists. ``None`` if
    ``stop[0]`` was set meanwhile."""
    split = choice.shape[1]
    n = len(com.demands)
    one_path, fast, rest_idx = _path_kinds(com, choice)
    if com.ends_exact and (com.ordered[rest_idx] | one_path[rest_idx]).all():
        # (each the runs of its sorted row, in increasing path order: their QPs in arrays,
        # compiled, each demand's list made when read)
        if stop[0]:
            return None
        count, row_len, q_len, q_share, r_flat = _rest_qps(
            rest_idx, np.ascontiguousarray(choice), com.u_of, com.ustart, com.pstart,
            com.plen, com.crow, com.links, com.head1, com.tail1, np.array(acc, np.float64))
        flat, off = _single_rows(n, fast, choice[fast, 0], com.ustart, com.u_of, com.plen,
                                 com.pstart, com.crow, com.links, com.head1, com.tail1,
                                 rest_idx, row_len, r_flat, com.u_len)
        return PathRows(_key_list(com.keys), flat, off, acc[split],
                        RestPaths(rest_idx, count, q_len, q_share, flat, off))
    made: list[list[tuple[tuple[int, ...], float]]] = []
    if not _rest_paths(com, choice, rest_idx, one_path, acc, stop, made):
        return None
    # (their paths' links too, in their rows: the QPs' paths read as they are)
    r_paths = [p for m in made for p, _ in m]
    r_len = np.fromiter(map(len, r_paths), np.int64, len(r_paths))
    r_flat = np.fromiter(_chain(r_paths), np.int64, int(r_len.sum()))
    n_paths = np.fromiter(map(len, made), np.int64, len(made))
    row_len = (np.add.reduceat(r_len, _offsets(n_paths)[:-1]) if len(made)
               else np.zeros(0, np.int64))  # (every rest demand has a path)
    flat, off = _single_rows(n, fast, choice[fast, 0], com.ustart, com.u_of, com.plen,
                             com.pstart, com.crow, com.links, com.head1, com.tail1,
                             rest_idx, row_len, r_flat, com.u_len)
    return PathRows(_key_list(com.keys), flat, off, acc[split],
                    dict(zip(rest_idx.tolist(), made, strict=True)))


def _key_list(keys: Sequence[str]) -> list[str]:
    """``keys`` as a list: the list itself if it is one (keys are never changed in place),
    else a list of them."""
    return keys if isinstance(keys, list) else list(keys)


@numba.njit(cache=True, nogil=True)
def _rest_qps(rest_idx: NDArray[np.int64], choice: NDArray[np.integer],
              u_of: NDArray[np.int64], ustart: NDArray[np.int64], pstart: NDArray[np.int64],
              plen: NDArray[np.int64], crow: NDArray[np.int32], links: NDArray[np.int64],
              head1: NDArray[np.int64], tail1: NDArray[np.int64], acc: NDArray[np.float64],
              ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                         NDArray[np.float64], NDArray[np.int64]]:
    """The QPs of demands ``rest_idx`` as :func:`_rest_paths` lists those of ordered
    tuples: per run of a demand's sorted row of candidates (a candidate and its ``m``
    parts), one QP on its path (head link if any, the candidate's links, tail link if
    any) with share ``acc[m]``. Per demand its QP count and links; per QP its path length
    and share; the links of every path, one after the other."""
    n_r = rest_idx.shape[0]
    split = choice.shape[1]
    srt = np.empty((n_r, split), np.int64)
    count = np.zeros(n_r, np.int64)
    row_len = np.zeros(n_r, np.int64)
    n_q = 0
    for j in range(n_r):
        d = rest_idx[j]
        for i in range(split):
            srt[j, i] = choice[d, i]
        srt[j].sort()
        ends = (head1[d] >= 0) + (tail1[d] >= 0)
        for i in range(split):
            if i == 0 or srt[j, i] != srt[j, i - 1]:
                count[j] += 1
                row_len[j] += plen[ustart[u_of[d]] + srt[j, i]] + ends
        n_q += count[j]
    q_len = np.empty(n_q, np.int64)
    q_share = np.empty(n_q, np.float64)
    flat = np.empty(row_len.sum(), np.int64)
    q = o = 0
    for j in range(n_r):
        d = rest_idx[j]
        i = 0
        while i < split:
            c = srt[j, i]
            m = 1
            while i + m < split and srt[j, i + m] == c:
                m += 1
            p = ustart[u_of[d]] + c
            start = o
            if head1[d] >= 0:
                flat[o] = head1[d]
                o += 1
            for x in range(pstart[p], pstart[p] + plen[p]):
                flat[o] = links[crow[x]]
                o += 1
            if tail1[d] >= 0:
                flat[o] = tail1[d]
                o += 1
            q_len[q] = o - start
            q_share[q] = acc[m]
            q += 1
            i += m
    return count, row_len, q_len, q_share, flat


def _rest_paths(com: _Commodities, choice: NDArray[np.int64], rest_idx: NDArray[np.int64],
                one_path: NDArray[np.bool_], acc: list[float], stop: NDArray[np.bool_],
                made: list[list[tuple[tuple[int, ...], float]]]) -> bool:
    """The paths and shares of demands ``rest_idx`` (not of one path with one head and one
    tail link), appended to ``made`` in that order; ``False`` if ``stop[0]`` was set
    meanwhile."""
    inc = acc[1]
    whole = acc[choice.shape[1]]
    srt = np.sort(choice[rest_idx], axis=1)
    single = one_path[rest_idx].tolist()
    ordered = com.ordered[rest_idx]
    distinct = ((srt[:, 1:] != srt[:, :-1]).all(axis=1) & ordered).tolist()
    rows, ordered_l, todo = srt.tolist(), ordered.tolist(), rest_idx.tolist()
    demands = com.demands
    exact = com.ends_exact
    if exact:  # (each demand's fields from the columns: no demand made)
        objs = com.u_obj
        u_of = com.u_of[rest_idx].tolist()
        h1, t1 = com.head1[rest_idx].tolist(), com.tail1[rest_idx].tolist()
    add = made.append
    for lo in range(0, len(todo), _FILL_CHUNK):
        if stop[0]:
            return False
        for j in range(lo, min(lo + _FILL_CHUNK, len(todo))):
            one = single[j]
            if exact:
                cands, h, t = objs[u_of[j]], h1[j], t1[j]
                head = (h,) if h >= 0 else ()
                tail = (t,) if t >= 0 else ()
            else:
                dem = demands[todo[j]]
                cands, head, tail = dem.candidates, dem.head, dem.tail
            row = rows[j]
            dist = distinct[j]
            if head or tail:  # full paths: head + candidate + tail
                if one:
                    add([(head + cands[row[0]] + tail, whole)])
                    continue
                if dist:
                    add([(head + cands[c] + tail, inc) for c in row])
                    continue
                cands = {c: head + cands[c] + tail for c in row}  # type: ignore[assignment]
            if one:
                add([(cands[row[0]], whole)])
            elif dist:  # candidates in increasing order, parts on different ones
                add([(cands[c], inc) for c in row])
            elif ordered_l[j]:  # runs of the sorted row, in increasing path order
                runs = []
                prev, m = row[0], 1
                for c in row[1:]:
                    if c == prev:
                        m += 1
                    else:
                        runs.append((cands[prev], acc[m]))
                        prev, m = c, 1
                runs.append((cands[prev], acc[m]))
                add(runs)
            else:
                shares: dict[tuple[int, ...], float] = {}
                for c in row:
                    shares[cands[c]] = shares.get(cands[c], 0.0) + inc
                add(sorted(shares.items()))
    return not stop[0]


@numba.njit(cache=True, nogil=True)
def _single_rows(n: int, idx: NDArray[np.int64], cand: NDArray[np.int64],
                 ustart: NDArray[np.int64], u_of: NDArray[np.int64], plen: NDArray[np.int64],
                 pstart: NDArray[np.int64], crow: NDArray[np.int32], links: NDArray[np.int64],
                 head1: NDArray[np.int64], tail1: NDArray[np.int64],
                 rest_idx: NDArray[np.int64], rest_len: NDArray[np.int64],
                 rest_flat: NDArray[np.int64], u_len: NDArray[np.int64],
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The paths of :func:`_single_paths` written one after the other in demand order:
    ``flat[off[d]:off[d + 1]]`` is demand ``d``'s path (head link, candidate ``cand[i]``'s
    links, tail link) for ``d = idx[i]``; for ``d = rest_idx[j]`` the next ``rest_len[j]``
    links of ``rest_flat`` (its paths' links, one path after the other); empty for the
    other demands of the ``n``. A candidate of a tuple whose paths are all ``u_len`` long
    has its links at its first path's plus that many per candidate before it (not read
    from the paths' offsets, scattered over memory)."""
    at = np.empty(len(idx), np.int64)  # (where each one's candidate's links start)
    off = np.zeros(n + 1, np.int64)
    for i in range(len(idx)):
        d = idx[i]
        u = u_of[d]
        k = u_len[u]
        if k >= 0:
            at[i] = pstart[ustart[u]] + cand[i] * k
        else:
            p = ustart[u] + cand[i]
            k = plen[p]
            at[i] = pstart[p]
        off[d + 1] = k + 2
    for j in range(len(rest_idx)):
        off[rest_idx[j] + 1] = rest_len[j]
    for d in range(n):
        off[d + 1] += off[d]
    flat = np.empty(off[n], np.int64)
    for i in range(len(idx)):
        d = idx[i]
        o = off[d]
        k = off[d + 1] - o - 2
        a = at[i]
        flat[o] = head1[d]
        for j in range(k):
            flat[o + 1 + j] = links[crow[a + j]]
        flat[o + 1 + k] = tail1[d]
    at = 0
    for j in range(len(rest_idx)):
        o = off[rest_idx[j]]
        for k in range(rest_len[j]):
            flat[o + k] = rest_flat[at + k]
        at += rest_len[j]
    return flat, off


def _single_paths(com: _Commodities, idx: NDArray[np.int64], cand: NDArray[np.int64],
                  ) -> Iterator[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """The full paths (head link, candidate ``cand[i]``'s links, tail link) of demands
    ``idx``, each of one head and one tail link, as link id rows: per path length, the
    demands of that length and their paths."""
    if not len(idx):
        return
    path = com.ustart[com.u_of[idx]] + cand
    length = com.plen[path]
    for n_links in np.unique(length).tolist():
        sel = np.flatnonzero(length == n_links)
        rows = com.crow[com.pstart[path[sel]][:, None] + np.arange(n_links)]
        d = idx[sel]
        yield d, np.column_stack((com.head1[d], com.links[rows], com.tail1[d]))


_FILL_CHUNK = 4096  # demands between two reads of a stop flag


@dataclass(frozen=True)
class Columns:
    """The candidate structure of a plan's demands, as the planner compiled it: every
    regular candidate tuple (by identity) with its group and its index among the unique
    tuples; a group's candidates are columns of link rows (rows of ``links``), the links
    every candidate of a tuple has are its fixed rows (see :class:`_Commodities`).
    Kept with a plan so that a few of its demands can be placed again
    (:func:`replace_parts`) without compiling their candidates again."""

    links: NDArray[np.int64]
    tuple_of: dict[int, tuple[tuple[tuple[int, ...], ...], int, int]]  # id -> (obj, g, u)
    g_col0: NDArray[np.int64]
    g_ncand: NDArray[np.int64]
    c_ptr: NDArray[np.int64]
    c_idx: NDArray[np.int64]
    ufix_ptr: NDArray[np.int64]
    ufix_idx: NDArray[np.int64]
    g_disjoint: NDArray[np.bool_]  # per group: its columns share no link

    @classmethod
    def of(cls, com: _Commodities) -> Columns:
        """The structure of ``com``'s regular tuples."""
        u_grp = com.u_grp.tolist()
        tuple_of = {id(t): (t, g, u) for u, (t, g) in enumerate(zip(com.u_obj, u_grp,
                                                                    strict=True)) if g >= 0}
        return cls(com.links, tuple_of, com.g_col0, com.g_ncand, com.c_ptr, com.c_idx,
                   com.ufix_ptr, com.ufix_idx, com.g_disjoint)

    def find(self, candidates: tuple[tuple[int, ...], ...]) -> tuple[int, int] | None:
        """``(group, unique tuple)`` of a candidate tuple the plan was made on, else None."""
        hit = self.tuple_of.get(id(candidates))
        return (hit[1], hit[2]) if hit is not None and hit[0] is candidates else None

    def merged(self, other: Columns) -> Columns:
        """These columns and the tuples of ``other`` (compiled over another set of links,
        e.g. a plan of a few jobs) that they lack, on this one's links; ``self`` if
        ``other`` adds none. ``ValueError`` if ``other`` uses a link this one does not have.

        >>> a = plan_greedy([Demand("a", 1.0, ((0,), (1,)))], {0: 4.0, 1: 4.0, 2: 4.0})
        >>> d = Demand("b", 1.0, ((1,), (2,)))
        >>> both = a.columns.merged(plan_greedy([d], {1: 4.0, 2: 4.0}).columns)
        >>> g, u = both.find(d.candidates)
        >>> [int(both.c_idx[both.c_ptr[both.g_col0[g] + c]]) for c in range(2)]  # links 1, 2
        [1, 2]
        """
        fresh = [(t, g, u) for key, (t, g, u) in other.tuple_of.items()
                 if self.tuple_of.get(key, (None,))[0] is not t]
        if not fresh:
            return self
        rows_of = np.searchsorted(self.links, other.links)
        if (rows_of >= len(self.links)).any() or (self.links[np.minimum(
                rows_of, len(self.links) - 1)] != other.links).any():
            raise ValueError("the other columns use links these do not have")
        groups = distinct(np.array([g for _, g, _ in fresh], np.int64))
        g_new = np.full(len(other.g_ncand), -1, np.int64)
        g_new[groups] = len(self.g_ncand) + np.arange(len(groups))
        # the fresh groups' columns, in order, appended
        ncand = other.g_ncand[groups]
        cols = _ranges(other.g_col0[groups], ncand)
        col_len = other.c_ptr[cols + 1] - other.c_ptr[cols]
        c_idx = rows_of[other.c_idx[_ranges(other.c_ptr[cols], col_len)]]
        n_cols = len(self.c_ptr) - 1
        g_col0 = n_cols + _offsets(ncand)[:-1]
        # the fresh tuples' fixed links, appended
        us = np.array([u for _, _, u in fresh], np.int64)
        fix_len = other.ufix_ptr[us + 1] - other.ufix_ptr[us]
        ufix_idx = rows_of[other.ufix_idx[_ranges(other.ufix_ptr[us], fix_len)]]
        n_u = len(self.ufix_ptr) - 1
        tuple_of = dict(self.tuple_of)
        for i, (t, g, _) in enumerate(fresh):
            tuple_of[id(t)] = (t, int(g_new[g]), n_u + i)
        return Columns(self.links, tuple_of,
                       np.concatenate((self.g_col0, g_col0)),
                       np.concatenate((self.g_ncand, ncand)),
                       np.concatenate((self.c_ptr, self.c_ptr[-1] + np.cumsum(col_len))),
                       np.concatenate((self.c_idx, c_idx)),
                       np.concatenate((self.ufix_ptr, self.ufix_ptr[-1] + np.cumsum(fix_len))),
                       np.concatenate((self.ufix_idx, ufix_idx)),
                       np.concatenate((self.g_disjoint, other.g_disjoint[groups])))


def compile_columns(demands: Sequence[Demand], capacity: Mapping[int, float]) -> Columns:
    """The candidate structure of ``demands`` over the links of ``capacity`` (as
    :func:`plan_greedy` compiles it), for a plan made otherwise (e.g. resumed from the path
    sets the switches hold).

    >>> d = Demand("a", 1.0, ((0,), (1,)))
    >>> compile_columns([d], {0: 4.0, 1: 4.0}).find(d.candidates)
    (0, 0)
    """
    return Columns.of(_Commodities(demands, capacity, None))


def replace_parts(cols: Columns, group: NDArray[np.int64], tup: NDArray[np.int64],
                  rate: NDArray[np.float64], order: NDArray[np.int64],
                  cap: NDArray[np.float64], load: NDArray[np.float64],
                  down: NDArray[np.bool_], avoid: NDArray[np.bool_], *, spread: int = 1,
                  limit: float = np.inf) -> NDArray[np.int64]:
    """Place parts of planned demands again, one pass, in ``order``: part ``i`` (``rate[i]``
    Gb/s, of a demand whose candidates are group ``group[i]``, unique tuple ``tup[i]`` of
    ``cols``) goes on the candidate whose most loaded link stays lowest (ties: the smaller
    sum of squared utilisations), as :func:`plan_greedy` places a part, among the candidates
    with no link in ``avoid`` (by row), or if none is left, none in ``down``. A part that
    would take a link above ``limit`` (utilisation) is split into ``spread`` equal pieces,
    each placed so in turn. ``load`` (by row, with every other part already in it) is
    updated in place with the parts' column and fixed links.

    Returns, per part, the candidate index of each of its ``spread`` pieces (one piece: the
    part went whole, and the others are -2), or -1 everywhere if every candidate has a
    ``down`` link.

    Two parts of 100 Gb/s, candidates (link 0) and (link 1), link 1 down:

    >>> d = [Demand("a", 1.0, ((0,), (1,)))]
    >>> p = plan_greedy(d, {0: 400.0, 1: 400.0})
    >>> g, u = p.columns.find(d[0].candidates)
    >>> load = np.zeros(2); dead = np.array([False, True])
    >>> replace_parts(p.columns, np.array([g, g]), np.array([u, u]), np.array([100.0, 100.0]),
    ...               np.array([0, 1]), np.array([400.0, 400.0]), load, dead, dead).tolist()
    [[0], [0]]
    >>> load.tolist()
    [200.0, 0.0]

    With nothing down, link 0 at 350 Gb/s and link 1 at 300, a 100 Gb/s part would take
    link 1 to 100 %; with ``limit`` 0.9 it goes in two 50 Gb/s pieces, one on each link:

    >>> load = np.array([350.0, 300.0]); ok = np.array([False, False])
    >>> replace_parts(p.columns, np.array([g]), np.array([u]), np.array([100.0]),
    ...               np.array([0]), np.array([400.0, 400.0]), load, ok, ok, spread=2,
    ...               limit=0.9).tolist()
    [[1, 0]]
    >>> load.tolist()
    [400.0, 350.0]
    """
    if spread < 1:
        raise ValueError("spread must be >= 1")
    return _replace_parts(order, group, tup, rate, cols.g_col0, cols.g_ncand, cols.c_ptr,
                          cols.c_idx, cols.ufix_ptr, cols.ufix_idx, cap, load, down, avoid,
                          spread, limit)


@numba.njit(cache=True, nogil=True)
def _best_column(g: int, u: int, part: float, mask: NDArray[np.bool_],
                 g_col0: NDArray[np.int64], g_ncand: NDArray[np.int64],
                 c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64],
                 ufix_ptr: NDArray[np.int64], ufix_idx: NDArray[np.int64],
                 cap: NDArray[np.float64], load: NDArray[np.float64],
                 ) -> tuple[int, float]:  # pragma: no cover - compiled
    """The candidate of group ``g`` (tuple ``u``) with no link in ``mask`` whose most loaded
    link, with ``part`` added, is lowest (ties: the smaller sum of squares), and that
    utilisation; -1 if none."""
    for q in range(ufix_ptr[u], ufix_ptr[u + 1]):
        if mask[ufix_idx[q]]:
            return -1, np.inf
    col0 = g_col0[g]
    best = -1
    best_max = np.inf
    best_sq = np.inf
    for c in range(g_ncand[g]):
        mx = 0.0
        sq = 0.0
        dead = False
        for q in range(c_ptr[col0 + c], c_ptr[col0 + c + 1]):
            lk = c_idx[q]
            if mask[lk]:
                dead = True
                break
            x = (load[lk] + part) / cap[lk]
            if x > mx:
                mx = x
            sq += x * x
        if dead:
            continue
        if mx < best_max - 1e-12 or (mx <= best_max + 1e-12 and sq < best_sq - 1e-12):
            best, best_max, best_sq = c, mx, sq
    return best, best_max


@numba.njit(cache=True, nogil=True)
def _replace_parts(order: NDArray[np.int64], group: NDArray[np.int64], tup: NDArray[np.int64],
                   rate: NDArray[np.float64], g_col0: NDArray[np.int64],
                   g_ncand: NDArray[np.int64], c_ptr: NDArray[np.int64],
                   c_idx: NDArray[np.int64], ufix_ptr: NDArray[np.int64],
                   ufix_idx: NDArray[np.int64], cap: NDArray[np.float64],
                   load: NDArray[np.float64], down: NDArray[np.bool_], avoid: NDArray[np.bool_],
                   spread: int, limit: float) -> NDArray[np.int64]:  # pragma: no cover
    """:func:`replace_parts`."""
    choice = np.full((order.shape[0], spread), -2, np.int64)
    for i in order:
        g = group[i]
        u = tup[i]
        part = rate[i]
        # the avoided links first, then only the dead ones
        mask = avoid
        best, best_max = _best_column(g, u, part, avoid, g_col0, g_ncand, c_ptr, c_idx,
                                      ufix_ptr, ufix_idx, cap, load)
        if best < 0:
            mask = down
            best, best_max = _best_column(g, u, part, down, g_col0, g_ncand, c_ptr, c_idx,
                                          ufix_ptr, ufix_idx, cap, load)
        if best < 0:
            choice[i, :] = -1
            continue
        pieces = spread if spread > 1 and best_max > limit else 1
        piece = part / pieces
        for k in range(pieces):
            if pieces > 1:
                best, _ = _best_column(g, u, piece, mask, g_col0, g_ncand, c_ptr, c_idx,
                                       ufix_ptr, ufix_idx, cap, load)
            choice[i, k] = best
            col = g_col0[g] + best
            for q in range(c_ptr[col], c_ptr[col + 1]):
                load[c_idx[q]] += piece
            for q in range(ufix_ptr[u], ufix_ptr[u + 1]):
                load[ufix_idx[q]] += piece
    return choice


# ---------------------------------------------------------------------------- references
def plan_reference(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                   background: Mapping[int, float] | None = None, integral: bool = False,
                   split: int = 1, time_limit_s: float = 60.0) -> Plan:
    """The optimum ``lambda`` by HiGHS: the LP (``integral=False``: each demand spread freely
    over its candidates) or the MILP (each of ``split`` equal parts of a demand on one
    candidate; all of a ``whole`` demand on one). Variables: one share per candidate, then
    ``lambda``; constraints: shares of a demand sum to 1 and every link's load is at most
    ``lambda x capacity``.

    Demands of several ``priority`` values are solved tier by tier as :func:`plan_greedy`
    plans them, highest first, each with the tiers above as background: a lower tier first
    minimises ``E``, how far it takes any link carrying higher-priority traffic beyond its
    limit (100 %, or what that traffic loads it to), then ``lambda`` with ``E`` at that
    minimum. ``plan.extra`` gives each tier's ``lambda_priority_<p>`` (the most loaded link
    its paths cross) and ``excess_priority_<p>`` (``E``).

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> plan_reference(d, {0: 400, 1: 400}).max_utilization
    0.75
    >>> round(plan_reference([Demand("a", 600, ((0,), (1,)))], {0: 400, 1: 400},
    ...                      integral=True).max_utilization, 6)
    1.5

    A 200 Gb/s demand of priority 1 fixed on link 0, a 400 Gb/s one on link 0 or 2 and a
    300 Gb/s one on link 2: the LP may split the 400 but keeps link 0 at 100 % (200 of
    it there, 200 on link 2), so the lower tier's lambda is 1.25, not the 1.125 of both
    tiers as one:

    >>> d = [Demand("hi", 200, ((0,),), priority=1), Demand("x", 400, ((0,), (2,))),
    ...      Demand("z", 300, ((2,),))]
    >>> p = plan_reference(d, {0: 400, 2: 400})
    >>> [(q, round(s, 6)) for q, s in p.paths["x"]]
    [((0,), 0.5), ((2,), 0.5)]
    >>> {k: round(v, 6) for k, v in p.extra.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'lambda_priority_1': 1.0, 'excess_priority_1': 0.0, 'lambda_priority_0': 1.25,
     'excess_priority_0': 0.0}
    """
    tiers = sorted({d.priority for d in demands}, reverse=True)
    if len(tiers) <= 1:
        return _reference(_Problem(demands, capacity, background), integral, split,
                          time_limit_s)
    bg = dict(background or {})
    above = dict(bg)  # background and the load of the tiers placed so far
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    crossed: dict[int, set[int]] = {}
    extra: dict[str, float] = {}
    for i, tier in enumerate(tiers):
        prob = _Problem([d for d in demands if d.priority == tier], capacity, above)
        limit = None
        if i:  # links the tiers above put traffic on: at most max(1, their utilisation)
            hi = np.array([above.get(lk, 0.0) - bg.get(lk, 0.0) for lk in prob.links.tolist()])
            limit = np.where(hi > 1e-9, np.maximum(prob.bg / prob.cap, 1.0), np.inf)
        got = _reference(prob, integral, split, time_limit_s, limit)
        paths.update(got.paths)
        for lk, v in got.link_load_gbps.items():
            above[lk] = above.get(lk, 0.0) + v
        crossed[tier] = {lk for shares in got.paths.values() for p, _ in shares for lk in p}
        extra[f"excess_priority_{tier}"] = got.extra.get("excess", 0.0)
    util = {lk: above.get(lk, 0.0) / float(capacity[lk]) for lk in above}
    for tier in tiers:
        extra[f"lambda_priority_{tier}"] = max((util[lk] for lk in crossed[tier]), default=0.0)
    order = [f"{k}_priority_{t}" for t in tiers for k in ("lambda", "excess")]
    load = {lk: v - bg.get(lk, 0.0) for lk, v in above.items()}
    return Plan(paths, load, max(util.values(), default=0.0), got.solver,
                extra={k: extra[k] for k in order})


def _reference(prob: _Problem, integral: bool, split: int, time_limit_s: float,
               limit: NDArray[np.float64] | None = None) -> Plan:
    """:func:`plan_reference` of one tier: ``prob``'s background as fixed load; with
    ``limit`` (per link row, ``inf``: none), ``E`` is minimised first (``extra["excess"]``)
    and then held while ``lambda`` is."""
    n_cols = int(prob.n_cand.sum())
    n_d = len(prob.demands)
    rate_of_col = np.repeat(prob.rate, prob.n_cand)
    flow = prob.inc @ sp.diags(rate_of_col)  # [links, candidates]: Gb/s at share 1
    demand_of_col = np.repeat(np.arange(n_d), prob.n_cand)
    a_dem = sp.csr_matrix((np.ones(n_cols), (demand_of_col, np.arange(n_cols))),
                          shape=(n_d, n_cols))
    parts = np.array([1 if d.whole else d.parts or split for d in prob.demands], np.float64)
    per_col = np.repeat(parts, prob.n_cand) if integral else np.ones(n_cols)
    # (with integral shares in units of 1 / the demand's parts: counts summing to its parts)
    scale = sp.diags(1 / per_col)
    dem_total = parts if integral else np.ones(n_d)

    def solve(c: NDArray[np.float64], a_ub: sp.csr_matrix, b_ub: NDArray[np.float64],
              what: str) -> NDArray[np.float64]:
        """min c.(x, t) with x the shares (or part counts), t one more variable >= 0."""
        a_eq = sp.hstack([a_dem, sp.csr_matrix((n_d, 1))]).tocsr()
        upper = np.r_[per_col if integral else np.full(n_cols, np.inf), np.inf]
        res = milp(c, constraints=[LinearConstraint(a_ub, -np.inf, b_ub),
                                   LinearConstraint(a_eq, dem_total, dem_total)],
                   integrality=np.r_[np.full(n_cols, int(integral)), 0],
                   bounds=Bounds(np.zeros(n_cols + 1), upper),
                   options={"time_limit": time_limit_s, "disp": False})
        if res.x is None:
            raise RuntimeError(f"{what} reference failed: {res.message}")
        return np.asarray(res.x)

    what = "MILP" if integral else "LP"
    c = np.zeros(n_cols + 1)
    c[-1] = 1.0
    excess = 0.0
    prot_a = prot_b = None
    if limit is not None and np.isfinite(limit).any():
        rows = np.flatnonzero(np.isfinite(limit))
        # protected links: load - E cap <= limit cap - background
        prot = (flow[rows] @ scale).tocsr()
        prot_b = limit[rows] * prob.cap[rows] - prob.bg[rows]
        first = solve(c, sp.hstack([prot, sp.csr_matrix(-prob.cap[rows][:, None])]).tocsr(),
                      prot_b, what)
        excess = float(first[-1])
        prot_a = sp.hstack([prot, sp.csr_matrix((len(rows), 1))]).tocsr()
        prot_b = prot_b + (excess + 1e-9) * prob.cap[rows]
    # link rows: load - lambda cap <= -background (and the protected rows at E)
    a_ub = sp.hstack([flow @ scale, sp.csr_matrix(-prob.cap[:, None])]).tocsr()
    b_ub = -prob.bg
    if prot_a is not None and prot_b is not None:
        a_ub, b_ub = sp.vstack([a_ub, prot_a]).tocsr(), np.r_[b_ub, prot_b]
    x = solve(c, a_ub, b_ub, what)[:-1]
    x = np.round(x) / per_col if integral else x
    load = prob.bg + prob.inc @ (rate_of_col * x)
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for d, dem in enumerate(prob.demands):
        shares = x[prob.col[d]: prob.col[d] + prob.n_cand[d]]
        paths[dem.key] = [(p, float(s)) for p, s in zip(prob.cands[d], shares, strict=True)
                          if s > 1e-9]
    util = load / prob.cap
    return Plan(paths, {int(lk): float(v) for lk, v in zip(prob.links, load - prob.bg,
                                                          strict=True)},
                float(util.max()), "milp" if integral else "lp",
                extra={"excess": excess} if limit is not None else {})


def gap(heuristic: Plan, reference: Plan) -> float:
    """Relative excess of the heuristic's ``lambda`` over the reference's.

    >>> gap(Plan({}, {}, 1.05), Plan({}, {}, 1.0))
    0.05
    """
    return round((heuristic.max_utilization - reference.max_utilization)
                 / max(reference.max_utilization, 1e-12), 12)
