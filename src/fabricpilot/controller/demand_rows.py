"""A plan's demands held in columns: each made a :class:`~fabricpilot.controller.planner.Demand`
only when read.

A job's AlltoAll over GPUs scattered across a large fabric has tens of thousands of GPU pairs,
and a plan of every job a million. The controller makes their fields as columns
(:class:`~fabricpilot.controller.planner.DemandColumns`), which is all the planner reads; the
containers here give the same demands as a ``key -> demand`` table and as a list, making
each demand the first time it is read:

- :class:`DemandRows`: the demands of a call's pairs, in order (a sequence);
- :class:`DemandTable`: those demands by key (a job's demands, as the controller keeps them);
- :class:`JobDemands`: every job's demands by key (a dict of them would be a million entries
  more), with what was set or deleted since kept beside them;
- :class:`ChainedDemands`: every job's demands, job after job, as one sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from fabricpilot.controller.keys import (
    BULK_KEYS,
    PairRows,
    RowIndex,
    key_index,
    key_rows,
    made,
    part_item,
    part_offsets,
)
from fabricpilot.controller.planner import Demand, DemandColumns, _demand_of
from fabricpilot.controller.southbound import OverlayMap

_ABSENT = object()


def _at(i: int, n: int) -> int:
    """Place ``i`` of a sequence of ``n`` (a negative one from the end); ``IndexError``
    outside.

    >>> _at(-1, 3), _at(2, 3)
    (2, 2)
    """
    if not -n <= i < n:
        raise IndexError(f"demand {i} of {n}")
    return i % n


class _Demands(Sequence[Demand]):
    """A sequence of demands read one at a time (:meth:`_item` of a place from 0); a slice
    is a list of them."""

    __slots__ = ()

    def _item(self, i: int) -> Demand:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> Demand: ...

    @overload
    def __getitem__(self, i: slice) -> list[Demand]: ...

    def __getitem__(self, i: int | slice) -> Demand | list[Demand]:
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(len(self)))]
        return self._item(_at(i, len(self)))


class DemandRows(_Demands):
    """The demands of ``columns`` (a call's pairs, made at once), demand ``i`` with head
    link tuple ``heads[i]`` and tail ``tails[i]``, each made when first read (and kept: a
    demand read twice is the same object).

    >>> cols = DemandColumns.of([Demand("j:0->1", 100.0, ((5,), (6,)), 2.0, (1,), (2,))])
    >>> rows = DemandRows(cols, [(1,)], [(2,)])
    >>> rows[0] == Demand("j:0->1", 100.0, ((5,), (6,)), 2.0, (1,), (2,)), rows[0] is rows[0]
    (True, True)
    """

    __slots__ = ("_all", "_made", "columns", "heads", "tails")

    def __init__(self, columns: DemandColumns, heads: Sequence[tuple[int, ...]],
                 tails: Sequence[tuple[int, ...]]) -> None:
        if not len(heads) == len(tails) == len(columns.keys):
            raise ValueError("a demand's head and tail links for each of its columns' rows")
        self.columns = columns
        self.heads = heads
        self.tails = tails
        self._made: dict[int, Demand] = {}
        self._all: list[Demand] | None = None

    def __len__(self) -> int:
        return len(self.columns.keys)

    def _item(self, i: int) -> Demand:
        if self._all is not None:
            return self._all[i]
        d = self._made.get(i)
        if d is None:
            c = self.columns
            d = self._made[i] = _demand_of((
                c.keys[i], float(c.rate[i]), c.tuples[int(c.tup[i])], float(c.weight[i]),
                self.heads[i], self.tails[i], bool(c.whole[i]), int(c.priority[i]),
                int(c.parts[i])))
        return d

    def __iter__(self) -> Iterator[Demand]:
        return iter(self.all())

    def all(self) -> list[Demand]:
        """Every demand, in order (made in one pass the first time; those read before are
        kept)."""
        if self._all is None:
            c = self.columns
            made = list(map(_demand_of, zip(
                c.keys, c.rate.tolist(), map(c.tuples.__getitem__, c.tup.tolist()),
                c.weight.tolist(), self.heads, self.tails, c.whole.tolist(),
                c.priority.tolist(), c.parts.tolist(), strict=True)))
            for i, d in self._made.items():
                made[i] = d
            self._all = made
            self._made = {}
        return self._all


class DemandTable(Mapping[str, Demand]):
    """The demands ``rows`` by key: key ``keys[i]`` is ``rows[i]``'s (``row_of``: each key's
    row). Read as the dict of them would be; ``values()`` is ``rows`` itself.

    >>> cols = DemandColumns.of([Demand("j:0->1", 1.0, ((5,),)), Demand("j:1->0", 2.0, ((6,),))])
    >>> t = DemandTable(DemandRows(cols, [(), ()], [(), ()]))
    >>> t["j:1->0"].rate_gbps, "j:0->2" in t, list(t), len(t.values())
    (2.0, False, ['j:0->1', 'j:1->0'], 2)
    """

    __slots__ = ("_row_of", "rows")

    def __init__(self, rows: DemandRows) -> None:
        self.rows = rows
        self._row_of: Mapping[str, int] | None = None

    @property
    def row_of(self) -> Mapping[str, int]:
        """Each key's row (made when first read, or by :meth:`JobDemands.index`: a whole
        plan makes them while its placement runs)."""
        if self._row_of is None:
            self._row_of = key_index(self.rows.columns.keys)
        return self._row_of

    @property
    def for_many(self) -> bool:
        """Whether :attr:`row_of` is a dict (:meth:`rows_for_many` made it, or the keys are
        not a call's pairs)."""
        return isinstance(self._row_of, dict)

    def rows_for_many(self) -> Mapping[str, int]:
        """:attr:`row_of`, for many keys looked up at once: a dict (a table of pairs'
        rows, :class:`~fabricpilot.controller.keys.PairRows`, is replaced by the dict of
        its keys, kept from then on)."""
        rows = self._row_of
        if rows is None:  # (no table made first only to be replaced)
            rows = self._row_of = key_rows(self.rows.columns.keys)
        elif isinstance(rows, PairRows):
            rows = self._row_of = rows.as_dict()
        return rows

    @property
    def keys_(self) -> Sequence[str]:
        """The keys, in the rows' order."""
        return self.rows.columns.keys

    def __getitem__(self, key: str) -> Demand:
        return self.rows[self.row_of[key]]

    def get(self, key: str, default: Any = None) -> Any:
        r = self.row_of.get(key)
        return default if r is None else self.rows[r]

    def __contains__(self, key: object) -> bool:
        return key in self.row_of

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    def values(self) -> DemandRows:  # type: ignore[override]
        return self.rows

    def items(self) -> Iterator[tuple[str, Demand]]:  # type: ignore[override]
        """Each key and its demand, in order (every demand made in one pass)."""
        return zip(self.keys_, self.rows.all(), strict=True)


def _task(key: str) -> str:
    """The job of a demand's key (``task:source->destination``)."""
    return key.partition(":")[0]


class JobDemands(OverlayMap[Demand]):
    """Every job's demands by key: per job, its table (its keys all ``task:...``), in the
    order the jobs were added, with the keys set or deleted since kept beside them (an
    :class:`~fabricpilot.controller.southbound.OverlayMap`). Read, changed and iterated as
    the dict of every job's demands would be: the jobs' keys in order (a key set again keeps
    its place), then the keys added since.

    >>> m = JobDemands()
    >>> m.add_job("a", {"a:0->1": Demand("a:0->1", 1.0, ((5,),))})
    >>> m.add_job("b", {"b:0->1": Demand("b:0->1", 2.0, ((5,),))})
    >>> m["b:0->1"].rate_gbps, len(m), "a:1->0" in m
    (2.0, 2, False)
    >>> del m["a:0->1"]; m["c:0->1"] = m["b:0->1"]; m["b:0->1"] = m["c:0->1"]._replace(weight=3)
    >>> list(m), m["b:0->1"].weight, len(m)
    (['b:0->1', 'c:0->1'], 3, 2)
    """

    __slots__ = ("tables",)

    def __init__(self) -> None:
        super().__init__(0)
        self.tables: dict[str, Mapping[str, Demand]] = {}

    def add_job(self, task: str, demands: Mapping[str, Demand]) -> None:
        """Add job ``task``'s demands (none added before, none set since: a plan's bulk)."""
        if task in self.tables or self._over or self._gone:
            raise ValueError(f"job {task!r}: its demands are added once, before any change")
        self.tables[task] = demands
        self._len += len(demands)

    def _base(self, key: str) -> Any:
        table = self.tables.get(_task(key))
        if table is None:
            return _ABSENT
        d = table.get(key, _ABSENT)
        if d is _ABSENT or (self._gone and key in self._gone):
            return _ABSENT
        return d

    def _in_base(self, key: str) -> bool:
        table = self.tables.get(_task(key))
        return table is not None and key in table

    def _base_keys(self) -> Iterable[str]:
        return itertools.chain.from_iterable(list(self.tables.values()))

    def _in_base_many(self, keys: list[str]) -> list[bool]:
        """:meth:`_in_base` of each of ``keys``; many at once through each job's dict of
        its keys (:meth:`DemandTable.rows_for_many`)."""
        if len(keys) < BULK_KEYS:
            return list(map(self._in_base, keys))
        tables = self.tables
        out = []
        task, rows = None, None
        for k in keys:  # (inline, not through a generator: a few ms per 65 280 keys)
            t = _task(k)
            if t != task:
                task, table = t, tables.get(t)
                rows = (table.rows_for_many() if isinstance(table, DemandTable)
                        else table)
            out.append(rows is not None and k in rows)
        return out

    def __getitem__(self, key: str) -> Demand:
        d = self._over.get(key, _ABSENT)
        if d is _ABSENT:
            d = self._base(key)
            if d is _ABSENT:
                raise KeyError(key)
        return d  # type: ignore[no-any-return]

    def get(self, key: str, default: Any = None) -> Any:
        d = self._over.get(key, _ABSENT)
        if d is _ABSENT:
            d = self._base(key)
        return default if d is _ABSENT else d

    def __contains__(self, key: object) -> bool:
        if key in self._over:
            return True
        return isinstance(key, str) and self._base(key) is not _ABSENT

    def values(self) -> Any:  # (a view of every value, in key order)
        if self._over or self._gone:
            return super().values()
        return ChainedDemands([t.values() for t in self.tables.values()])

    def update(self, other: Any = (), /, **kw: Demand) -> None:
        """As a dict's (a job's demands at once: each key looked up once)."""
        items: list[tuple[str, Demand]] = list(other.items() if hasattr(other, "items")
                                               else other)
        items.extend(kw.items())
        over, gone = self._over, self._gone
        # (the keys new to the table: neither set since nor a live key of a job)
        based = self._in_base_many([k for k, _ in items])
        new = [k for (k, _), b in zip(items, based, strict=True)
               if k not in over and (k in gone or not b)]
        if len(new) > 1:
            new = list(dict.fromkeys(new))  # (a key given twice counts once)
        over.update(items)
        self._len += len(new)

    def __repr__(self) -> str:
        return f"JobDemands({len(self)} demands of {len(self.tables)} jobs)"

    def unindexed(self) -> list[DemandTable]:
        """The jobs' tables whose index of their keys (:attr:`DemandTable.row_of`) is not
        made yet."""
        return [t for t in self.tables.values()
                if isinstance(t, DemandTable) and t._row_of is None]

    def index(self) -> None:
        """Make every job's index of its keys (:attr:`DemandTable.row_of`) now."""
        for table in self.unindexed():
            table.row_of  # noqa: B018 (made when read)

    def rows_of(self, keys: list[str]) -> JobRows | None:
        """Each of ``keys``'s row, found through the jobs' tables, if ``keys`` are the jobs'
        keys one after the other (none set or deleted since, each job's a
        :class:`DemandTable`); else ``None``."""
        tables = self.tables
        if (self._over or self._gone or len(keys) != self._len
                or not all(isinstance(t, DemandTable) for t in tables.values())):
            return None
        off = 0  # (job by job: each job's keys against its stretch of ``keys``)
        for table in tables.values():
            job_keys = made(table.keys_)  # type: ignore[attr-defined]
            n = len(job_keys)
            if keys[off:off + n] != (job_keys if isinstance(job_keys, list)
                                     else list(job_keys)):
                return None
            off += n
        return JobRows(tables)  # type: ignore[arg-type]


class JobRows(RowIndex):
    """Each key's row in the keys of ``tables`` one after the other: its job's first row
    plus its row in its job's table (no index of every key made).

    >>> cols = DemandColumns.of([Demand(k, 1.0, ((5,),)) for k in ("a:1", "a:2", "b:1")])
    >>> rows = DemandRows(cols, [()] * 3, [()] * 3)
    >>> a, b = (DemandTable(DemandRows(DemandColumns.of(rows[s]), [()] * n, [()] * n))
    ...         for s, n in ((slice(0, 2), 2), (slice(2, 3), 1)))
    >>> r = JobRows({"a": a, "b": b})
    >>> r["b:1"], r.get("a:2"), r.get("c:1"), "a:3" in r, 3 in r, list(r), len(r)
    (2, 1, None, False, False, ['a:1', 'a:2', 'b:1'], 3)
    """

    __slots__ = ("_len", "jobs")

    def __init__(self, tables: Mapping[str, DemandTable]) -> None:
        # per job: its first row and its table
        self.jobs: dict[str, tuple[int, DemandTable]] = {}
        off = 0
        for task, table in tables.items():
            self.jobs[task] = (off, table)
            off += len(table)
        self._len = off

    def get(self, key: object, default: Any = None) -> Any:
        hit = self.jobs.get(_task(key)) if isinstance(key, str) else None
        if hit is None:
            return default
        r = hit[1].row_of.get(key)
        return default if r is None else hit[0] + r

    def get_many(self, keys: Sequence[str]) -> list[int | None]:
        """Each of ``keys``'s row (``None``: none), as ``map(self.get, keys)``; many at
        once (:data:`~fabricpilot.controller.keys.BULK_KEYS`) through the dicts of their
        jobs' keys (:meth:`DemandTable.rows_for_many`: a job planned by itself looks its
        65 280 keys up several times over, where a parsed key costs several times a dict's
        lookup).

        >>> t = [DemandTable(DemandRows(DemandColumns.of([Demand(k, 1.0, ((5,),))]), [()],
        ...                             [()])) for k in ("a:1", "b:1")]
        >>> JobRows({"a": t[0], "b": t[1]}).get_many(["b:1", "a:2", "c:1", "a:1"])
        [1, None, None, 0]
        """
        if len(keys) < BULK_KEYS:
            return list(map(self.get, keys))
        jobs = self.jobs
        out: list[int | None] = []
        task, first, rows = None, 0, None
        for k in keys:  # (as JobDemands._in_base_many walks them: a job's run at a time)
            t = _task(k)
            if t != task:
                task, hit = t, jobs.get(t)
                rows = None if hit is None else hit[1].rows_for_many()
                first = 0 if hit is None else hit[0]
            r = None if rows is None else rows.get(k)
            out.append(None if r is None else first + r)
        return out

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(t for _, t in self.jobs.values())

    def __len__(self) -> int:
        return self._len


class ChainedDemands(_Demands):
    """Sequences of demands, one after the other, as one (none copied; a demand read is
    read from its own sequence).

    >>> c = ChainedDemands([[Demand("a", 1.0, ((5,),))], [], [Demand("b", 2.0, ((5,),))]])
    >>> len(c), c[1].key, c[-1].key, [d.key for d in c], [d.key for d in c[:1]]
    (2, 'b', 'b', ['a', 'b'], ['a'])
    """

    __slots__ = ("_off", "parts")

    def __init__(self, parts: Iterable[Sequence[Demand] | Iterable[Demand]]) -> None:
        self.parts: list[Sequence[Demand]] = [
            p if isinstance(p, Sequence) else list(p) for p in parts]
        self._off = part_offsets(self.parts)

    def __len__(self) -> int:
        return self._off[-1]

    def _item(self, i: int) -> Demand:
        return part_item(self.parts, self._off, i)

    def __iter__(self) -> Iterator[Demand]:
        return itertools.chain.from_iterable(self.parts)

