"""The installed path sets of a whole plan, in columns: what a failure re-plan reads first.

A failure re-plan (:meth:`~fabricpilot.controller.core.Controller.on_links_changed`) starts
by finding, among the GPU pairs on a dead link, the shares (path slots) that cross it. Read
from the pairs' path sets and demands, that is a few microseconds of Python per pair,
spent mostly waiting on memory: at thousands of GPUs the sets are spread over dictionaries
of a million pairs. :class:`SlotTable` keeps, per path set of a plan (a *row*, in the plan's
order), its planner group and candidate tuple (in the plan's
:class:`~fabricpilot.controller.planner.Columns`), its rate, weight and GPUs, and per slot
its candidate and share, so that :meth:`SlotTable.dead_shares` finds the shares on dead
links with array operations, and the new sets are made from the rows. Most dead shares go
whole to a candidate their pair does not use yet (:meth:`SlotTable.whole`): those sets are
made together (:meth:`SlotTable.move_whole`), with the links each key leaves and takes read
from the candidates' columns, not from its paths.

A row describes its key's installed set until anything else changes that set or the key's
demand (a job planned again, a set adopted or forgotten, a heal that merged or split
shares): the controller marks it stale then (:meth:`SlotTable.mark_stale`), and a heal reads
such a key the slow way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fabricpilot.controller.keys import get_many, key_rows
from fabricpilot.controller.planner import Columns, PartChoice, _ranges
from fabricpilot.controller.southbound import PathSet, PathSetBatch


@dataclass
class DeadShares:
    """The shares of some rows that cross avoided links, in the order of the rows asked for,
    then slot order: share ``i`` is slot ``slot[i]`` (its place in its path set) of the
    ``pos[i]``-th row asked for, ``gbps[i]`` of its demand's rate, of group ``grp[i]`` and
    unique tuple ``tup[i]``, its demand's weight ``weight[i]``; its candidate's links (those
    whose load moves with it, rows of the columns' links) are ``links[ptr[i]:ptr[i + 1]]``."""

    pos: NDArray[np.int64]
    slot: NDArray[np.int64]
    grp: NDArray[np.int64]
    tup: NDArray[np.int64]
    gbps: NDArray[np.float64]
    weight: NDArray[np.float64]
    links: NDArray[np.int64]
    ptr: NDArray[np.int64]


class RowSets:
    """The path set of each row of a table: the plan's (a sequence not changed here: the
    batch a data plane may hold too), or the one a row has had since (``rows[r] = s``).

    >>> rows = RowSets([PathSet("a", ((1,),), (1.0,))])
    >>> rows[0] = PathSet("a", ((2,),), (1.0,)); rows[0].paths, len(rows)
    (((2,),), 1)
    """

    __slots__ = ("_plan", "_since")

    def __init__(self, plan: Sequence[PathSet]) -> None:
        self._plan = plan
        self._since: dict[int, PathSet] = {}

    def __getitem__(self, row: int) -> PathSet:
        s = self._since.get(row)
        return self._plan[row] if s is None else s

    def __setitem__(self, row: int, s: PathSet) -> None:
        self._since[row] = s

    def __len__(self) -> int:
        return len(self._plan)


@dataclass
class SlotTable:
    """Per row (an installed path set of a plan): its key, the set it describes, whether it
    is ``stale``, its place in key order (``rank``), its demand's group ``grp`` and unique
    tuple ``tup`` in the plan's columns (candidates ``tuples[tup]``), rate, weight, source
    and destination GPU; its slots ``first[r] .. first[r] + count[r] - 1``, each with its
    candidate (index in the demand's candidates) and share."""

    keys: list[str]
    row_of: Mapping[str, int]
    sets: RowSets | list[PathSet]
    stale: NDArray[np.bool_]
    rank: NDArray[np.int64]
    grp: NDArray[np.int64]
    tup: NDArray[np.int64]
    tuples: list[tuple[tuple[int, ...], ...]]
    rate: NDArray[np.float64]
    weight: NDArray[np.float64]
    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    first: NDArray[np.int64]
    count: NDArray[np.int64]
    cand: NDArray[np.int64]
    share: NDArray[np.float64]

    @classmethod
    def of(cls, parts: PartChoice, sets: Sequence[PathSet], src: NDArray[np.int64],
           dst: NDArray[np.int64], keys: list[str] | None = None) -> SlotTable | None:
        """The table of a plan's path sets: ``sets[i]`` is the set of ``parts.demands[i]``
        (source GPU ``src[i]``, destination ``dst[i]``), with the plan's paths in the
        plan's order; ``None`` if the sets are not in that order. The rows whose demand is
        not :attr:`PartChoice.plain` are stale from the start. ``keys``: the demands' keys
        in order, if the caller has that list already (the table keeps it).

        Two demands of two parts on candidates ``(5,)`` and ``(6,)`` (head link 1, tail
        link 2): ``a`` has a part on each, ``b`` both on the second:

        >>> from fabricpilot.controller.planner import Demand
        >>> ds = [Demand("a", 2.0, ((5,), (6,)), 1.0, (1,), (2,)),
        ...       Demand("b", 1.0, ((5,), (6,)), 1.0, (1,), (2,))]
        >>> parts = PartChoice(ds, np.array([0, 0]), np.array([0, 0]), [((5,), (6,))],
        ...                    np.array([True, True]), np.array([1, 1]), np.array([2, 2]),
        ...                    np.array([[1, 0], [1, 1]]), (0.0, 0.5, 1.0), np.array([0, 1]),
        ...                    np.array([2.0, 1.0]), np.array([1.0, 1.0]))
        >>> sets = [PathSet("a", ((1, 5, 2), (1, 6, 2)), (0.5, 0.5)),
        ...         PathSet("b", ((1, 6, 2),), (1.0,))]
        >>> t = SlotTable.of(parts, sets, np.array([0, 0]), np.array([3, 3]))
        >>> [(k, t.slots(r)[0].tolist(), t.slots(r)[1].tolist())
        ...  for r, k in enumerate(t.keys)]
        [('a', [0, 1], [0.5, 0.5]), ('b', [1], [1.0])]
        """
        dem = parts.demands
        n = len(dem)
        if len(sets) != n:
            return None
        if isinstance(sets, PathSetBatch):  # (read from the batch: no set made)
            ends = [sets.keys[0], sets.keys[-1]] if n else []
        else:
            ends = [s.key for s in (*sets[:1], *sets[-1:])]
        if ends != [d.key for d in (*dem[:1], *dem[-1:])]:
            return None
        if keys is None:
            keys = [d.key for d in dem]
        count, cand, runs = parts.slot_runs  # (runs: the parts on each slot)
        first = np.zeros(n, np.int64)
        np.cumsum(count[:-1], out=first[1:])
        # (a batch of these keys in this order knows each one's row already)
        row_of = (sets.row_of if isinstance(sets, PathSetBatch) and sets.keys == keys
                  else key_rows(keys))
        return cls(keys, row_of, RowSets(sets),
                   ~parts.plain, parts.rank, parts.grp, parts.tup, parts.tuples,
                   parts.rate, parts.weight, src, dst, first, count, cand,
                   np.asarray(parts.acc, np.float64)[runs])

    def slots(self, row: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """A row's slots: their candidates and shares."""
        lo, hi = int(self.first[row]), int(self.first[row] + self.count[row])
        return self.cand[lo:hi], self.share[lo:hi]

    def mark_stale(self, keys: Iterable[str]) -> None:
        """These keys' sets or demands changed otherwise than by :meth:`moved`."""
        rows = [r for r in get_many(self.row_of, keys) if r is not None]
        if rows:
            self.stale[rows] = True

    def dead_shares(self, rows: NDArray[np.int64], cols: Columns,
                    avoid: NDArray[np.bool_]) -> DeadShares:
        """The shares of ``rows`` (not stale) that cross a link in ``avoid`` (by row of
        ``cols.links``): through their candidate's column or the links every candidate of
        its tuple has."""
        n_s = self.count[rows]
        slots = _ranges(self.first[rows], n_s)
        s_pos = np.repeat(np.arange(len(rows), dtype=np.int64), n_s)
        grp, tup = self.grp[rows], self.tup[rows]
        col = cols.g_col0[grp][s_pos] + self.cand[slots]
        c_len = cols.c_ptr[col + 1] - cols.c_ptr[col]
        c_links = cols.c_idx[_ranges(cols.c_ptr[col], c_len)]
        hit = np.bincount(np.repeat(np.arange(len(slots)), c_len),
                          weights=avoid[c_links].astype(np.float64), minlength=len(slots)) > 0
        f_len = cols.ufix_ptr[tup + 1] - cols.ufix_ptr[tup]
        f_links = cols.ufix_idx[_ranges(cols.ufix_ptr[tup], f_len)]
        fixed_hit = np.bincount(np.repeat(np.arange(len(rows)), f_len),
                                weights=avoid[f_links].astype(np.float64),
                                minlength=len(rows)) > 0
        dead = np.flatnonzero(hit | fixed_hit[s_pos])
        pos = s_pos[dead]
        d_slots = slots[dead]
        # each dead share's links: its tuple's fixed links, then its column's
        d_col, d_tup = col[dead], tup[pos]
        d_flen, d_clen = f_len[pos], c_len[dead]
        ptr = np.zeros(len(dead) + 1, np.int64)
        np.cumsum(d_flen + d_clen, out=ptr[1:])
        links = np.empty(int(ptr[-1]), np.int64)
        links[_ranges(ptr[:-1], d_flen)] = cols.ufix_idx[_ranges(cols.ufix_ptr[d_tup], d_flen)]
        links[_ranges(ptr[:-1] + d_flen, d_clen)] = cols.c_idx[
            _ranges(cols.c_ptr[d_col], d_clen)]
        return DeadShares(pos, d_slots - self.first[rows][pos], grp[pos], d_tup,
                          self.rate[rows][pos] * self.share[d_slots], self.weight[rows][pos],
                          links, ptr)

    def moved(self, row: int, slot: int, cand: int, now: PathSet) -> None:
        """Slot ``slot`` of row ``row`` went whole to candidate ``cand``: the key's set is
        ``now``."""
        self.cand[self.first[row] + slot] = cand
        self.sets[row] = now

    def whole(self, rows: NDArray[np.int64], grp: NDArray[np.int64],
              cand: NDArray[np.int64], cols: Columns) -> NDArray[np.bool_]:
        """Which of these moves (the one dead share of row ``rows[i]``, of group ``grp[i]``,
        going whole to candidate ``cand[i]``) leave the row's other slots as they are: the
        row has no slot on that candidate yet, and its group's candidates share no link
        (so the key leaves exactly the old candidate's column and takes the new one's).

        >>> t = SlotTable(["a"], {"a": 0}, [], np.zeros(1, np.bool_), np.zeros(1, np.int64),
        ...               np.zeros(1, np.int64), np.zeros(1, np.int64), [], np.ones(1),
        ...               np.ones(1), np.zeros(1, np.int64), np.ones(1, np.int64),
        ...               np.zeros(1, np.int64), np.array([2]), np.array([0, 1]),
        ...               np.array([0.5, 0.5]))
        >>> cols = type("C", (), {"g_disjoint": np.array([True])})
        >>> t.whole(np.array([0, 0]), np.array([0, 0]), np.array([1, 2]), cols).tolist()
        [False, True]
        """
        cnt = self.count[rows]
        own = np.repeat(np.arange(len(rows), dtype=np.int64), cnt)
        same = self.cand[_ranges(self.first[rows], cnt)] == cand[own]
        has = np.bincount(own, weights=same.astype(np.float64), minlength=len(rows)) > 0
        return ~has & cols.g_disjoint[grp]

    def move_whole(self, rows: NDArray[np.int64], slot: NDArray[np.int64],
                   grp: NDArray[np.int64], cand: NDArray[np.int64],
                   cols: Columns) -> WholeMoves:
        """The sets of rows whose slot ``slot[i]`` goes whole to candidate ``cand[i]`` (moves
        :meth:`whole` allows): each key's paths with that slot's path replaced, and the
        links the keys leave and take (the old and new candidates' columns)."""
        keys_t, sets_t, tuples = self.keys, self.sets, self.tuples
        rows_l = rows.tolist()
        olds = [sets_t[r] for r in rows_l]
        new: list[tuple[int, ...]] = []
        for old, j, u, c in zip(olds, slot.tolist(), self.tup[rows].tolist(), cand.tolist(),
                                strict=True):
            was = old.paths[j]
            new.append((was[0], *tuples[u][c], was[-1]))  # (a plain row: one head, one tail)
        g0 = cols.g_col0[grp]
        left, left_of = _column_links(cols, g0 + self.cand[self.first[rows] + slot])
        taken, taken_of = _column_links(cols, g0 + cand)
        return WholeMoves(rows, slot, cand, [keys_t[r] for r in rows_l], olds, None, new,
                          left, left_of, taken, taken_of)

    def moved_whole(self, moves: WholeMoves, sets: list[PathSet]) -> None:
        """The moves of :meth:`move_whole` are installed: ``sets``, in their order."""
        self.cand[self.first[moves.rows] + moves.slot] = moves.cand
        sets_t = self.sets
        for r, s in zip(moves.rows.tolist(), sets, strict=True):
            sets_t[r] = s


@dataclass
class WholeMoves:
    """Slots of table rows that go whole to another candidate (:meth:`SlotTable.move_whole`):
    row ``rows[i]`` (key ``keys[i]``, installed set ``olds[i]``) has slot ``slot[i]`` on
    candidate ``cand[i]`` now, its new path ``new[i]``, all its paths ``paths[i]`` (made
    with the new sets, or by :meth:`all_paths`); the keys leave links ``left`` (key
    ``left_of``, index in these) and take ``taken`` (``taken_of``)."""

    rows: NDArray[np.int64]
    slot: NDArray[np.int64]
    cand: NDArray[np.int64]
    keys: list[str]
    olds: list[PathSet]
    paths: list[tuple[tuple[int, ...], ...]] | None
    new: list[tuple[int, ...]]
    left: NDArray[np.int64]
    left_of: NDArray[np.int64]
    taken: NDArray[np.int64]
    taken_of: NDArray[np.int64]

    def all_paths(self) -> list[tuple[tuple[int, ...], ...]]:
        """Each key's paths, its moved slot's replaced by the new one."""
        if self.paths is None:
            self.paths = [(*o.paths[:j], p, *o.paths[j + 1:])
                          for o, j, p in zip(self.olds, self.slot.tolist(), self.new,
                                             strict=True)]
        return self.paths


def _column_links(cols: Columns, col: NDArray[np.int64]
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The links of columns ``col`` of ``cols`` (link ids), and the index in ``col`` of
    each."""
    lens = cols.c_ptr[col + 1] - cols.c_ptr[col]
    return (cols.links[cols.c_idx[_ranges(cols.c_ptr[col], lens)]],
            np.repeat(np.arange(len(col), dtype=np.int64), lens))
