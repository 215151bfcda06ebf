"""The controller: declared intents in, planned path sets out, through a data plane.

:class:`Controller` keeps the jobs' intents, turns each call into demands between GPU pairs
(the pairs the job declared, or the pattern's pairs over its GPUs in rank order), gives every
demand its equal-cost shortest paths as candidates, plans all opted-in jobs together
(:func:`~fabricpilot.controller.planner.plan_greedy`, each demand in ``parts`` equal parts:
one per QP of the connection) and installs the result as :class:`PathSet` rules keyed
``"<task>:<src>-><dst>"``. Heavier (hotter) jobs are placed first. It reads and acts only
through a :class:`~fabricpilot.controller.southbound.DataPlane`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
import time
import weakref
from collections import Counter
from collections.abc import (
    Callable,
    Container,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from fabricpilot.arrays import distinct, distinct_ids, ids_inverse
from fabricpilot.controller import entropy, planner
from fabricpilot.controller.congestion import CongestionMap
from fabricpilot.controller.demand_rows import DemandRows, DemandTable, JobDemands, JobRows
from fabricpilot.controller.entropy import (
    SteeringTable,
    SteerRequest,
    best_hashed_ports,
    steer,
)
from fabricpilot.controller.health import Debouncer, GrayDetector
from fabricpilot.controller.intents import LEVELS, CommCall, Intent
from fabricpilot.controller.keys import PairKeys, key_steps, unmade
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.patterns import (
    alltoall_pairs,
    pair_qps,
    pair_shares,
    pattern_pairs,
)
from fabricpilot.controller.planner import (
    Columns,
    Demand,
    DemandColumns,
    KeyLinks,
    LinkValues,
    PartChoice,
    PathRows,
    Plan,
    _demand,
    _demand_of,
    _gc_paused,
    _offsets,
    _ranges,
    compile_columns,
    flatten_paths,
    plan_greedy,
    replace_parts,
)
from fabricpilot.controller.ranking import in_scope, path_delay_us
from fabricpilot.controller.slots import DeadShares, SlotTable, WholeMoves
from fabricpilot.controller.southbound import (
    BatchMap,
    DataPlane,
    FabricView,
    PathColumn,
    PathSet,
    PathSetBatch,
    PortDelta,
    as_list,
    get_all,
)


class _Made(NamedTuple):
    """A job's demands as :meth:`Controller.demands` made them, and for what."""

    intent: Intent
    made_for: tuple[bool, frozenset[int], int]  # (L1/L2 declared, links avoided, parts)
    demands: Mapping[str, Demand]  # (of a job whose SLA is unmet: its reservations)
    unmet: str | None  # why the job gets no path, if so: its SLA cannot be met
    cut: str | None  # ... or it is cut off
    only_l3: frozenset[str]  # its pairs held to l3_rate_cap though it has L1/L2 calls
    # its demands' fields as columns, in order (None: not made, or not expressible so)
    columns: DemandColumns | None = None
    # (with ``columns``: each demand's GPUs, source and destination, as rows)
    ends_array: NDArray[np.int64] | None = None


class _Weights(Mapping[str, float]):
    """The weight of every demand of a ``key -> demand`` dict, read from the demand (a view:
    planning makes one demand per GPU pair, and no second table of them).

    >>> w = _Weights({"a": Demand("a", 1.0, ((1,),), weight=3.0)})
    >>> w["a"], w.get("b", 0.0), len(w)
    (3.0, 0.0, 1)
    """

    __slots__ = ("_demand",)

    def __init__(self, demand: Mapping[str, Demand]) -> None:
        self._demand = demand

    def __getitem__(self, key: str) -> float:
        return self._demand[key].weight

    def __iter__(self) -> Iterator[str]:
        return iter(self._demand)

    def __len__(self) -> int:
        return len(self._demand)


_chain = itertools.chain.from_iterable
_KEY = operator.attrgetter("key")
_PATHS = operator.attrgetter("paths")
_RULES = operator.attrgetter("rules")
# (no path set: what a batch of only kept rows takes its new sets from)
_NO_SETS = PathSetBatch([], np.zeros(1, np.int64), PathColumn(np.zeros(0, np.int64),
                                                              np.zeros(1, np.int64)),
                        [], [], [], [])
_HEAD, _TAIL, _CANDIDATES = (operator.attrgetter(f) for f in ("head", "tail", "candidates"))
# a GPU node's ends: (bit mask of their switches' components, component bit -> its ends as
# (switch, link id, (link id,)))
_EndInfo = tuple[int, dict[int, tuple[tuple[str, int, tuple[int]], ...]]]


def _kept_sets(keys: Sequence[str],
               shares_of: Sequence[list[tuple[tuple[int, ...], float]]],
               caps: Sequence[float], installed: Mapping[str, PathSet],
               skip: Container[str] = (),
               ) -> list[PathSet | None]:
    """Per key, the installed set that already holds the planned ``shares_of`` (its paths and
    weights in order, each path steered by its port alone: no rule) with the same rate cap,
    else ``None`` (also for the keys ``skip``). Where the installed sets are as steering made
    them (not a heal's, not left to the hash: ``skip``), steering the key again would give
    such a set its ports once more: a re-plan keeps it (its QPs keep their ports, nothing
    is sent) and steers only the others.

    >>> held = {"a": PathSet("a", ((1, 2),), (1.0,), (7,), ((),)),
    ...         "b": PathSet("b", ((3,),), (1.0,), (8,), ((("s1", 1),),))}
    >>> got = _kept_sets(["a", "b", "c"], [[((1, 2), 1.0)], [((3,), 1.0)], [((4,), 1.0)]],
    ...                  [math.inf] * 3, held)
    >>> [got[0] is held["a"], got[1], got[2]]
    [True, None, None]
    >>> _kept_sets(["a"], [[((1, 2), 0.5), ((5,), 0.5)]], [math.inf], held)
    [None]
    >>> _kept_sets(["a"], [[((1, 2), 1.0)]], [math.inf], held, skip={"a"})
    [None]
    """
    out: list[PathSet | None] = get_all(installed, keys)
    for i, (old, shares, cap) in enumerate(zip(out, shares_of, caps, strict=True)):
        if old is None:
            continue
        _, paths, weights, ports, rules, old_cap = old
        if old_cap != cap or len(ports) != len(shares):
            out[i] = None
        elif len(shares) == 1:  # (most keys: one path)
            if shares[0] != (paths[0], weights[0]) or rules[0]:
                out[i] = None
        elif (any(rules) or len(paths) != len(shares)
              or shares != list(zip(paths, weights, strict=True))):
            out[i] = None
    if skip:
        out = [None if k in skip else s for k, s in zip(keys, out, strict=True)]
    return out


def _kept_rows(keys: Sequence[str],
               shares_of: Sequence[list[tuple[tuple[int, ...], float]]],
               caps: Sequence[float], installed: BatchMap[PathSet],
               skip: Container[str] = (),
               ) -> NDArray[np.int64]:
    """:func:`_kept_sets` of installed sets held as one batch (none set since: see
    :class:`~fabricpilot.controller.southbound.BatchMap`), read from the batch's columns:
    per key, the row of the batch whose set would be kept, -1 where none would (no set
    is made).

    >>> b = PathSetBatch(["a", "b"], np.array([0, 1, 2]), [(1, 2), (3,)], [1.0, 1.0],
    ...                  [7, 8], [(), (("s1", 1),)], [math.inf] * 2)
    >>> _kept_rows(["b", "a", "c"], [[((3,), 1.0)], [((1, 2), 1.0)], [((4,), 1.0)]],
    ...            [math.inf] * 3, BatchMap(b, b.__getitem__)).tolist()
    [-1, 0, -1]
    """
    batch = installed.batch
    n = len(keys)
    if len(batch.keys) == n and not installed.changed and batch.keys == keys:
        at: list[int] = list(range(n))  # (the same keys in the same order: row i is key i)
    else:
        row = installed.row
        at = [-1 if r is None else r for r in map(row, keys)]
    bounds = batch.first.tolist()
    paths, weights, rules, old_caps = batch.paths, batch.weights, batch.rules, batch.caps
    out = np.full(n, -1, np.int64)
    for i, (r, shares, cap) in enumerate(zip(at, shares_of, caps, strict=True)):
        if r < 0 or old_caps[r] != cap:
            continue
        lo, hi = bounds[r], bounds[r + 1]
        if hi - lo != len(shares):
            continue
        if hi - lo == 1:  # (most keys: one path)
            if shares[0] != (paths[lo], weights[lo]) or rules[lo]:
                continue
        elif (any(rules[lo:hi])
              or shares != list(zip(paths[lo:hi], weights[lo:hi], strict=True))):
            continue
        out[i] = r
    if skip:
        off = [i for i, k in enumerate(keys) if k in skip]
        if off:
            out[off] = -1
    return out


def _qp_columns(rows: PathRows) -> tuple[NDArray[np.int64], PathColumn, NDArray[np.float64]]:
    """A plan's paths in columns (:class:`~fabricpilot.controller.planner.PathRows`) as its
    QPs' (a key's paths in its order, a QP each): each key's number of QPs, the QPs' paths
    and their shares.

    >>> rows = planner.PathRows(["a", "b", "c"], np.array([7, 1, 9, 2, 3, 4, 8, 2]),
    ...                         np.array([0, 3, 6, 8]), 1.0, {1: [((2,), 0.5), ((3, 4), 0.5)]})
    >>> n, col, w = _qp_columns(rows)
    >>> n.tolist(), list(col), w.tolist()
    ([1, 2, 1], [(7, 1, 9), (2,), (3, 4), (8, 2)], [1.0, 0.5, 0.5, 1.0])
    """
    n = len(rows.keys)
    n_per_key = np.ones(n, np.int64)
    rest = rows.rest
    if not len(rest):  # (every key one path: the rows' own links)
        return n_per_key, PathColumn(rows.flat, rows.off), np.full(n, float(rows.whole))
    if isinstance(rest, planner.RestPaths):  # (in arrays already: no list read)
        r_at, r_len, r_weights = rest.rows, rest.q_len, rest.q_share
        n_per_key[r_at] = rest.count
    else:
        r_rows = sorted(rest)
        r_at = np.array(r_rows, np.int64)
        n_per_key[r_at] = [len(rest[r]) for r in r_rows]
        r_len = np.fromiter((len(p) for r in r_rows for p, _ in rest[r]), np.int64,
                            int(n_per_key[r_at].sum()))
        r_weights = np.array([w for r in r_rows for _, w in rest[r]], np.float64)
    is_rest = np.zeros(n, np.bool_)
    is_rest[r_at] = True
    q_off, weights, bad = planner.qp_offsets(rows.off, float(rows.whole), n_per_key, is_rest,
                                             r_len, r_weights)
    if bad >= 0:
        raise ValueError(f"row {bad} of the plan's paths: its links are not its paths'")
    return n_per_key, PathColumn(rows.flat, q_off), weights


def _column_take(col: PathColumn, at: NDArray[np.int64]) -> PathColumn:
    """The paths ``at`` of ``col`` (none set since), as a column of their own.

    >>> col = PathColumn(np.array([1, 2, 3, 4, 5]), np.array([0, 2, 3, 5]))
    >>> list(_column_take(col, np.array([2, 0])))
    [(4, 5), (1, 2)]
    """
    lens = (col.off[1:] - col.off[:-1])[at]
    return PathColumn(col.flat[_ranges(col.off[:-1][at], lens)], _offsets(lens))


def _kept_columns(keys: list[str], n_per_key: NDArray[np.int64], col: PathColumn,
                  weights: NDArray[np.float64], caps: Sequence[float],
                  installed: BatchMap[PathSet], skip: Container[str],
                  at: NDArray[np.int64] | None = None) -> NDArray[np.int64] | None:
    """:func:`_kept_rows` of a plan in columns (each key's QP count, the QPs' paths and
    shares, in the order of the keys), compared column to column, no set or path made:
    of keys whose installed sets are rows ``at`` of the installed batch (-1: a key set or
    deleted since, or not installed), or, without ``at``, of keys that are those of the
    installed batch, in its order, none changed since (else ``None``).

    >>> b = PathSetBatch(["a", "b", "c"], np.array([0, 1, 2, 3]),
    ...                  PathColumn(np.array([1, 2, 3, 4]), np.array([0, 2, 3, 4])),
    ...                  [1.0, 1.0, 1.0], [7, 8, 9], [(), (("s", 3),), ()], [math.inf] * 3)
    >>> new = PathColumn(np.array([1, 2, 3, 5]), np.array([0, 2, 3, 4]))
    >>> _kept_columns(["a", "b", "c"], np.ones(3, np.int64), new, np.ones(3), [math.inf] * 3,
    ...               BatchMap(b, b.__getitem__), ()).tolist()
    [0, -1, -1]
    """
    batch = installed.batch
    n = len(n_per_key)
    if not isinstance(batch, PathSetBatch) or (at is None and (
            installed.changed or not (batch.keys is keys or batch.keys == keys)
            or len(batch.first) != n + 1)):
        return None
    old = batch.paths
    if not isinstance(old, PathColumn) or old.overlaid or col.overlaid:
        return None
    if at is None:
        at = np.arange(n, dtype=np.int64)
    elif len(at) != n:
        return None
    if not len(batch.keys):
        return np.full(n, -1, np.int64)
    rules = batch.rules
    keep = planner.same_qps(
        np.asarray(at, np.int64), np.asarray(n_per_key, np.int64), batch.first,
        np.array(batch.caps, np.float64), np.array(caps, np.float64), old.off, old.flat,
        col.off, col.flat, np.asarray(batch.weights, np.float64), np.asarray(weights, np.float64),
        np.fromiter(map(bool, rules), np.bool_, len(rules)))
    if skip:
        off = [i for i, k in enumerate(keys) if k in skip]
        if off:
            keep[off] = False
    return np.where(keep, at, -1)


def _merged_batch(old: PathSetBatch, rows: NDArray[np.int64], fresh: PathSetBatch,
                  keys: list[str], caps: list[float]) -> PathSetBatch:
    """The batch of ``keys`` (rate caps ``caps``) whose key ``i`` has the set of row
    ``rows[i]`` of ``old`` (kept: the same object, if made), or where that is -1, the next
    set of ``fresh``, in order; ``old`` itself if it is that batch.

    >>> old = PathSetBatch(["a", "b"], np.array([0, 1, 3]), [(1,), (2,), (3,)],
    ...                    [1.0, 0.5, 0.5], [7, 8, 9], [(), (), ()], [math.inf] * 2)
    >>> new = PathSetBatch(["c"], np.array([0, 1]), [(4,)], [1.0], [5], [()], [2.0])
    >>> a = old[0]  # (made before: kept as it is)
    >>> m = _merged_batch(old, np.array([1, -1, 0]), new, ["b", "c", "a"],
    ...                   [math.inf, 2.0, math.inf])
    >>> [(s.key, s.paths, s.ports, s.rate_cap_gbps) for s in m]
    [('b', ((2,), (3,)), (8, 9), inf), ('c', ((4,),), (5,), 2.0), ('a', ((1,),), (7,), inf)]
    >>> none = PathSetBatch([], np.zeros(1, np.int64), [], [], [], [], [])
    >>> m[2] is a, _merged_batch(old, np.array([0, 1]), none, old.keys, old.caps) is old
    (True, True)
    """
    n = len(keys)
    if (not len(fresh) and len(rows) == len(old) and (rows == np.arange(n)).all()
            and (keys is old.keys or keys == old.keys) and list(caps) == list(old.caps)):
        return old
    kept = rows >= 0
    j = np.cumsum(~kept) - 1  # (each fresh key's place in ``fresh``)
    o_count = np.diff(old.first)
    f_count = np.diff(fresh.first)
    count = np.where(kept, o_count[np.where(kept, rows, 0)] if len(old) else 0,
                     f_count[np.where(kept, 0, j)] if len(fresh) else 0)
    start = np.where(kept, old.first[:-1][np.where(kept, rows, 0)] if len(old) else 0,
                     (fresh.first[:-1][np.where(kept, 0, j)] if len(fresh) else 0)
                     + len(old.paths))
    first = np.zeros(n + 1, np.int64)
    np.cumsum(count, out=first[1:])
    at_arr = _ranges(start, count)
    at = at_arr.tolist()

    def pick(col_old: Sequence[Any], col_new: Sequence[Any]) -> Sequence[Any]:
        """The entries ``at`` of the two columns one after the other: an array if each is
        an array (as a whole plan's shares and ports are) or empty (as the columns of
        :data:`_NO_SETS`, whose rows are none), else a list."""
        arrays = [c for c in (col_old, col_new) if isinstance(c, np.ndarray)]
        if arrays and all(isinstance(c, np.ndarray) or not len(c) for c in (col_old, col_new)):
            dtype = arrays[0].dtype
            return np.concatenate((np.asarray(col_old, dtype), np.asarray(col_new, dtype)))[at_arr]
        return list(map((*as_list(col_old), *as_list(col_new)).__getitem__, at))

    paths: Sequence[tuple[int, ...]]
    if (isinstance(old.paths, PathColumn) and isinstance(fresh.paths, PathColumn)
            and not old.paths.overlaid and not fresh.paths.overlaid):
        # (both in columns: the links of the QPs taken, one after the other)
        both = PathColumn(np.concatenate((old.paths.flat, fresh.paths.flat)),
                          np.concatenate((old.paths.off[:-1],
                                          fresh.paths.off + len(old.paths.flat))))
        paths = _column_take(both, at_arr)
    else:
        paths = pick(old.paths, fresh.paths)
    made_old, made_new = old.made, fresh.made
    made = [made_old[r] if r >= 0 else made_new[k]
            for r, k in zip(rows.tolist(), j.tolist(), strict=True)]
    return PathSetBatch(keys, first, paths, pick(old.weights, fresh.weights),
                        pick(old.ports, fresh.ports), pick(old.rules, fresh.rules), caps, made)


def _changed_sets(sets: Iterable[PathSet], installed: Mapping[str, PathSet]
                  ) -> Sequence[PathSet]:
    """The sets of ``sets`` that ``installed`` does not hold as they are (their key absent or
    held with another field).

    >>> old = PathSet("a", ((1,),), (1.0,))
    >>> [s.key for s in _changed_sets([PathSet("a", ((1,),), (1.0,)),
    ...                                PathSet("b", ((1,),), (1.0,)),
    ...                                PathSet("a", ((2,),), (1.0,))], {"a": old})]
    ['b', 'a']
    """
    if not installed:  # (all of them; a batch stays one)
        return sets if isinstance(sets, PathSetBatch) else list(sets)
    sets = list(sets)
    return [r for r, old in zip(sets, get_all(installed, map(_KEY, sets)), strict=True)
            if old != r]


def _changed_rows(new: PathSetBatch, idx: NDArray[np.int64], at: NDArray[np.int64],
                  installed: BatchMap[PathSet]) -> tuple[NDArray[np.int64], int] | None:
    """:func:`_changed_sets` of the sets at rows ``idx`` of batch ``new``, read column to
    column against the batch the installed sets are held in: ``at[i]`` is the row of that
    batch that holds the set of key ``idx[i]`` (-1: none, or one set or deleted since).
    Gives the rows of ``idx`` whose set ``installed`` does not hold as it is, and how many
    of the keys of ``idx`` it holds; ``None`` if either batch's paths are no column. Keys
    with no row, and sets with an explicit rule on either side, are compared as sets.

    >>> old = PathSetBatch(["a", "b", "c"], np.array([0, 1, 2, 3]),
    ...                    PathColumn(np.array([1, 2, 3]), np.array([0, 1, 2, 3])),
    ...                    [1.0] * 3, [7, 8, 9], [(), (), (("s", 1),)], [math.inf] * 3)
    >>> held = BatchMap(old, old.__getitem__)
    >>> new = PathSetBatch(["a", "b", "c", "d"], np.array([0, 1, 2, 3, 4]),
    ...                    PathColumn(np.array([1, 2, 3, 4]), np.array([0, 1, 2, 3, 4])),
    ...                    [1.0] * 4, [7, 5, 9, 6], [(), (), (("s", 1),), ()], [math.inf] * 4)
    >>> rows, n_held = _changed_rows(new, np.arange(4), np.array([0, 1, 2, -1]), held)
    >>> rows.tolist(), n_held  # (b: another port; c: the same, rule and all; d: new)
    ([1, 3], 3)
    """
    old = installed.batch
    if not len(idx):
        return np.zeros(0, np.int64), 0
    if (not isinstance(old, PathSetBatch) or not isinstance(old.paths, PathColumn)
            or not isinstance(new.paths, PathColumn) or old.paths.overlaid
            or new.paths.overlaid):
        return None
    n_new = (new.first[1:] - new.first[:-1])[idx]
    qp = _ranges(new.first[:-1][idx], n_new)  # (the QPs of the keys compared, in order)
    col = _column_take(new.paths, qp)
    o_ruled = np.fromiter(map(bool, old.rules), np.bool_, len(old.rules))
    n_ruled = np.fromiter(map(bool, new.rules), np.bool_, len(new.rules))[qp]
    same = planner.same_qps(
        at, n_new, old.first, np.array(old.caps, np.float64),
        np.array(new.caps, np.float64)[idx], old.paths.off, old.paths.flat, col.off, col.flat,
        np.array(old.weights, np.float64), np.array(new.weights, np.float64)[qp], o_ruled)
    # (the same QPs, links and shares: the same ports too, QP by QP)
    k_same = np.flatnonzero(same)
    cnt = n_new[k_same]
    bounds = _offsets(n_new)  # (each compared key's QPs in ``qp``)
    o_qp = _ranges(old.first[:-1][at[k_same]], cnt)
    n_qp = _ranges(bounds[:-1][k_same], cnt)
    other = np.asarray(old.ports, np.int64)[o_qp] != np.asarray(new.ports, np.int64)[qp][n_qp]
    other |= n_ruled[n_qp]  # (a rule now where there was none: sent)
    same[k_same[np.unique(np.repeat(np.arange(len(k_same)), cnt)[other])]] = False
    # (no row, or a rule on either side: as sets)
    n_cum = np.concatenate(([0], np.cumsum(n_ruled)))
    ruled_new = n_cum[bounds[1:]] - n_cum[bounds[:-1]]
    o_cum = np.concatenate(([0], np.cumsum(o_ruled)))
    has = at >= 0
    o_cnt = np.zeros(len(idx), np.int64)
    o_cnt[has] = o_cum[old.first[at[has] + 1]] - o_cum[old.first[at[has]]]
    loose = np.flatnonzero(~has | (has & ~same & ((ruled_new > 0) | (o_cnt > 0))))
    changed = ~same
    held = int(has.sum())
    if len(loose):
        idx_l = idx[loose].tolist()
        olds = get_all(installed, [new.keys[i] for i in idx_l])
        changed[loose] = [o is None or o != new[i] for o, i in zip(olds, idx_l, strict=True)]
        held += sum(o is not None for o, h in zip(olds, has[loose].tolist(), strict=True)
                    if not h)
    return np.flatnonzero(changed), held


def _merge_pieces(paths: Sequence[tuple[int, ...]], weights: Sequence[float],
                  ports: Sequence[int], rules: Sequence[tuple[tuple[str, int], ...]],
                  dead: list[int], picks: list[list[int]], cands: tuple[tuple[int, ...], ...],
                  head: tuple[int, ...], tail: tuple[int, ...], taken: list[int],
                  ) -> tuple[list[tuple[int, ...]], list[float], list[int],
                             list[tuple[tuple[str, int], ...]], list[int]]:
    """A path set's slots once its dead shares have moved. The share of slot ``dead[i]``
    goes to candidates ``picks[i]`` (one candidate then -2s: whole; else in equal pieces),
    each piece's path ``head + cands[c] + tail`` joining the share already on it, else
    taking the dead share's slot (its first new path) or a new slot at the end; emptied
    slots go. A new path's port is -1 (to steer) and it has no rule; every piece's
    candidate links are appended to ``taken``. Returns the paths, weights, ports, rules
    and the slots of the new paths.

    Slot 0 (candidate (5,)) is dead and moves to candidate (6,), which slot 1 has: the
    two shares merge into one slot, and nothing is new:

    >>> _merge_pieces([(1, 5, 2), (1, 6, 2)], [0.5, 0.5], [7, 8], [(), ()], [0], [[1, -2]],
    ...               ((5,), (6,), (9,)), (1,), (2,), [])
    ([(1, 6, 2)], [1.0], [8], [()], [])

    Spread in two pieces over candidates (6,) and (9,): half joins slot 1, half a new path
    in the dead share's slot:

    >>> _merge_pieces([(1, 5, 2), (1, 6, 2)], [0.5, 0.5], [7, 8], [(), ()], [0], [[1, 2]],
    ...               ((5,), (6,), (9,)), (1,), (2,), [])
    ([(1, 9, 2), (1, 6, 2)], [0.25, 0.75], [-1, 8], [(), ()], [0])

    Both slots dead (gray links: no path avoids them all), slot 0's share placed on slot
    1's candidate and slot 1's on (9,): slot 1 keeps its path (and port) with slot 0's
    share, its own share takes a new slot:

    >>> _merge_pieces([(1, 5, 2), (1, 6, 2)], [0.5, 0.5], [7, 8], [(), ()], [0, 1],
    ...               [[1, -2], [2, -2]], ((5,), (6,), (9,)), (1,), (2,), [])
    ([(1, 6, 2), (1, 9, 2)], [0.5, 0.5], [8, -1], [(), ()], [1])
    """
    ps, ws, pts, rls = list(paths), list(weights), list(ports), list(rules)
    own = [ws[j] for j in dead]  # (a piece may join a dead slot not moved yet: it stays)
    joined: set[int] = set()  # slots a piece joined
    merged = False
    fresh: list[int] = []  # the slots of new paths
    for row, j, w_own in zip(picks, dead, own, strict=True):
        pieces = row if row[-1] >= 0 else row[:1]  # (whole: one piece, then -2s)
        w = w_own / len(pieces)
        ws[j] -= w_own  # (the dead share's slot, for its first new path, unless joined)
        free = j not in joined
        for c in pieces:
            mid = cands[c]
            taken.extend(mid)
            p = head + mid + tail
            if p in ps:  # (a live share's path, or one a dead share took just now)
                at = ps.index(p)
                ws[at] += w
                joined.add(at)
            elif free:
                ps[j], ws[j], pts[j], rls[j] = p, w, -1, ()
                fresh.append(j)
                free = False
            else:
                fresh.append(len(ps))
                ps.append(p)
                ws.append(w)
                pts.append(-1)
                rls.append(())
        merged |= free
    if merged:  # the emptied slots go
        keep = [j for j, w in enumerate(ws) if w > 0.0]
        ps, ws = [ps[j] for j in keep], [ws[j] for j in keep]
        pts, rls = [pts[j] for j in keep], [rls[j] for j in keep]
        fresh = [j for j, port in enumerate(pts) if port < 0]
    return ps, ws, pts, rls, fresh


def _set_load(sets: Sequence[PathSet], rate_gbps: dict[str, float]) -> dict[int, float]:
    """Load per link (Gb/s) of path sets whose keys carry ``rate_gbps``.

    >>> _set_load([PathSet("a", ((0, 1), (0, 2)), (0.5, 0.5))], {"a": 100.0})
    {0: 100.0, 1: 50.0, 2: 50.0}
    """
    load: dict[int, float] = {}
    for s in sets:
        total = sum(s.weights)
        for path, w in zip(s.paths, s.weights, strict=True):
            for lk in path:
                load[lk] = load.get(lk, 0.0) + rate_gbps[s.key] * w / total
    return load


_SCOPE = {"L1": "one switch", "L2": "its leaves and pods (no spine: the top tier)"}


_PENDING: set[int] = set()  # (a heal's link-index change not known yet: replaced, never read)
# a key a heal moves: (key, its installed set, its dead slots, its group, its demand's head,
# tail, candidates and rate, its source and destination GPU, its slot table row or -1)
_Moving = tuple[str, PathSet, list[int], int, tuple[int, ...], tuple[int, ...],
                tuple[tuple[int, ...], ...], float, int, int, int]


def _whole_sets(moved: WholeMoves, ports: list[int], steered: bool, any_rules: bool,
                ) -> list[PathSet]:
    """The path sets of slots moved whole (:meth:`SlotTable.move_whole`): each key's set
    with the moved slot's new path and, if ``steered``, its new source port ``ports[i]``
    (and no explicit rule, if ``any_rules`` says a set may have some). The keys' paths are
    made on the way (``moved.paths``)."""
    if not steered:
        paths = moved.all_paths()
        return [PathSet(k, ps, old.weights, (), (), old.rate_cap_gbps)
                for k, ps, old in zip(moved.keys, paths, moved.olds, strict=True)]
    out = []
    paths = []
    for k, p, old, j, port in zip(moved.keys, moved.new, moved.olds, moved.slot.tolist(),
                                  ports, strict=True):
        ps = old.paths
        ps = (p,) if len(ps) == 1 else (*ps[:j], p, *ps[j + 1:])
        paths.append(ps)
        pts, rls = old.ports, old.rules
        if any_rules and rls[j]:
            rls = (*rls[:j], (), *rls[j + 1:])
        out.append(PathSet(k, ps, old.weights,
                           (port,) if len(pts) == 1 else (*pts[:j], port, *pts[j + 1:]), rls,
                           old.rate_cap_gbps))
    moved.paths = paths
    return out


def _switch_path_ids(table: SteeringTable, parts: PartChoice | None,
                     paths: list[tuple[int, ...]], dst: NDArray[np.int64],
                     n_per_key: NDArray[np.int64]) -> NDArray[np.int64]:
    """The steering table's switch-path id of every path of a plan (``paths``: each
    demand's in turn, ``n_per_key`` of them; ``dst``: their destination GPUs). For the
    demands whose part choices say what their paths are (:attr:`PartChoice.plain`: path
    ``head + tuples[tup][c] + tail`` for each candidate ``c`` chosen, in order), the ids
    are those of their candidates' switch paths, kept per candidate tuple (each interned
    once for the controller's life: :meth:`SteeringTable.intern_candidates`), not found
    path by path."""
    n = len(n_per_key)
    if parts is None or len(parts.demands) != n or not n or not parts.plain.any():
        return table.intern(paths, dst)
    count, cand, _ = parts.slot_runs  # (each demand's candidates in order, as its paths)
    if not np.array_equal(count, n_per_key):
        return table.intern(paths, dst)
    row = np.repeat(np.arange(n, dtype=np.int64), n_per_key)
    plain = np.flatnonzero(parts.plain[row])
    of = row[plain]  # (the demand of each such path)
    ids = np.empty(len(paths), np.int64)
    ids[plain] = table.intern_candidates(parts.tuples, parts.tup[of], cand[plain],
                                         parts.head[of], parts.tail[of], dst[plain])
    other = np.flatnonzero(~parts.plain[row])
    if len(other):
        ids[other] = table.intern([paths[r] for r in other.tolist()], dst[other])
    return ids


_RETIRED_MAX = 64  # heals whose replaced records wait for a control period to be freed
# entries an identity-keyed memo (candidate tuple -> its links, its scope) holds before it
# starts again: each holds its tuple alive, and tuples of demands long gone would pile up
# in a controller that runs for weeks (a memo of tuples that are alive refills as used)
_MEMO_MAX = 1 << 16
# switch paths the route tables make as tuples for the pairs of switches GPUs send into and
# are reached from, at most (some 70 bytes each: a 2-tier fabric of 128 leaves and 16
# spines has 260 000, the 8192-GPU one of 1024 hosts a million; larger fabrics make theirs
# as calls meet them)
_ROUTE_PATHS_MAX = 1 << 21
# (first, last) switch codes whose place among those paths a table holds, at most (4 bytes
# each: a fabric of 1 152 switches, 1.3 million)
_ROUTE_CODES_MAX = 1 << 23


def _row_tuples(rows: NDArray[np.int64], ints: NDArray[np.object_]) -> list[tuple[int, ...]]:
    """The rows of link ids ``rows`` as tuples (a column's ids zipped row by row: each made
    once, no list between), their ids the very objects of ``ints`` (one per id, indexed by
    it) where it holds them all: a million paths share their links' ints rather than each
    holding new ones.

    >>> ints = np.arange(5).astype(object)
    >>> _row_tuples(np.array([[3, 1], [0, 4]]), ints), _row_tuples(np.array([[7]]), ints)
    ([(3, 1), (0, 4)], [(7,)])
    >>> _row_tuples(np.zeros((2, 0), np.int64), ints)
    [(), ()]
    """
    if not rows.shape[1]:
        return [()] * rows.shape[0]
    if rows.size and int(rows.min()) >= 0 and int(rows.max()) < len(ints):
        return list(zip(*ints[rows.T].tolist(), strict=True))
    return list(zip(*rows.T.tolist(), strict=True))


def _pair_columns(pairs: list[tuple[int, int, float]]
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """GPU pairs ``(source, destination, share)`` as columns.

    >>> [c.tolist() for c in _pair_columns([(0, 1, 0.5), (1, 0, 1.0)])]
    [[0, 1], [1, 0], [0.5, 1.0]]
    """
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    a, b, share = zip(*pairs, strict=True)
    return np.array(a, np.int64), np.array(b, np.int64), np.array(share, np.float64)


class _CallDemands(NamedTuple):
    """The demands of a call's pairs made all at once: their :attr:`rows` (each made when
    read from the rows' columns), and their pairs' GPUs as rows (:attr:`ends`: source,
    destination)."""

    rows: DemandRows
    ends: NDArray[np.int64]


@dataclass
class _GpuEnds:
    """Per GPU id, its ends as a call whose GPUs all have ends in one switch component
    reads them: ``node`` (the index of its node), ``ok`` (one end each way in the
    component and at most one other component each way), ``sw[0]`` / ``sw[1]`` its first
    and last switch there (codes of ``switches``), ``heads`` / ``tails`` the 1-tuples of
    the links it leaves by and is entered by (their ids: ``links``), and each way its other
    component's bit (``other``, -1: none) with the switch and link of its one end there
    (``osw``, -1: none; ``o_heads``, ``o_tails``; ``o_links``)."""

    node: NDArray[np.int64]
    ok: NDArray[np.bool_]
    other: NDArray[np.int64]
    sw: NDArray[np.int64]
    osw: NDArray[np.int64]
    heads: NDArray[np.object_]
    tails: NDArray[np.object_]
    o_heads: NDArray[np.object_]
    o_tails: NDArray[np.object_]
    switches: list[str]
    links: NDArray[np.int64]  # (out, in)
    o_links: NDArray[np.int64]  # (out, in; -1: none)
    # the fewest-hop switch paths of each (first, last) switch pair met, by its code
    # (``first * len(switches) + last``): those of ``Controller._switch_paths``
    mids: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # (each GPU id as text, for rule keys)
    _name_rank: NDArray[np.int64] | None = None
    # those the route tables made (Controller._end_switch_paths), in code order (the
    # tuples, their codes, whether each has a path), and each code's place among them (-1:
    # not made there; None: no such table)
    route_mids: NDArray[np.object_] = field(default_factory=lambda: np.zeros(0, object))
    route_codes: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    route_has: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    route_at: NDArray[np.int32] | None = None

    def pair_order(self, a: NDArray[np.int64], b: NDArray[np.int64]
                   ) -> NDArray[np.int64] | None:
        """The order in which the keys ``f"{task}:{names[a[i]]}->{names[b[i]]}"`` of GPU
        pairs (each pair once) sort, as :func:`sorted` orders the strings: by source name,
        then destination name, when no name has a character before ``-`` (``None`` if one
        has). A name that is another's beginning then sorts first in both.

        >>> t = _GpuEnds(*(np.zeros(0),) * 9, [], np.zeros(0), np.zeros(0),
        ...              names=["0", "1", "10", "2"])
        >>> a, b = np.array([3, 2, 1, 1]), np.array([0, 1, 2, 3])
        >>> keys = [f"j:{t.names[x]}->{t.names[y]}" for x, y in zip(a, b)]
        >>> t.pair_order(a, b).tolist() == sorted(range(4), key=keys.__getitem__)
        True
        """
        names = self.names
        if self._name_rank is None:
            if any(not nm or min(nm) <= "-" for nm in names):
                return None
            rank = np.empty(len(names), np.int64)
            rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
            self._name_rank = rank
        rank = self._name_rank
        # (each pair once: the codes are distinct, and any sort orders them alike)
        if len(names) <= 1 << 16:  # (by destination, then source, each a radix sort of
            lo = rank[b].astype(np.uint16)  # 16-bit ranks: half a sort of the codes)
            by_lo = np.argsort(lo, kind="stable")
            return by_lo[np.argsort(rank[a].astype(np.uint16)[by_lo], kind="stable")].astype(
                np.int64, copy=False)
        return np.argsort(rank[a] * len(names) + rank[b], kind="stable").astype(np.int64)


@dataclass
class _SetEdits:
    """What a heal changes in the moving keys' sets (see ``Controller._edit_sets``)."""

    # each moved key's set now: (key, paths, weights, ports, rules); a new path's port -1
    now: list[tuple[str, Any, Any, Any, Any]] = field(default_factory=list)
    # the new paths to steer: (the ports list of its set, slot, path, source GPU,
    # destination GPU, where its port search starts: as a plan's)
    new: list[tuple[list[int], int, tuple[int, ...], int, int, int]] = field(
        default_factory=list)
    # the link index's changes: (key, links it leaves, links it takes)
    moves: list[tuple[str, set[int], set[int]]] = field(default_factory=list)
    # those found once the paths are out: (index in moves, old path, new path)
    lazy: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)  # the candidate links of new shares
    # slot table rows whose slot moved whole: (row, slot, candidate, index in now)
    moved_rows: list[tuple[int, int, int, int]] = field(default_factory=list)
    # the links whose load changed (arrays of link ids)
    touched: list[NDArray[np.int64]] = field(default_factory=list)


def mice_links(view: FabricView, spines: int) -> frozenset[int]:
    """The links of the first ``spines`` top-tier switches of ``view`` (in its node order):
    those kept for mice, off every planned path. ``ValueError`` if that would leave planned
    traffic no top-tier switch.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "leaf0", "spine0", 400, 100), LinkInfo(1, "leaf0", "spine1", 400, 100)]
    >>> v = FabricView.from_links(links, dict.fromkeys(["leaf0", "spine0", "spine1"], "switch"),
    ...                           {"leaf0": 1, "spine0": 2, "spine1": 2}, {})
    >>> sorted(mice_links(v, 1)), mice_links(v, 0)
    ([0], frozenset())
    """
    if spines <= 0:
        return frozenset()
    tier = dict(view.graph.nodes(data="tier", default=0))
    top = max(tier.values(), default=0)
    tops = [n for n, t in tier.items() if t == top]
    if spines >= len(tops):  # (one top-tier switch: kept for mice, nothing else is left)
        noun = "switch" if len(tops) == 1 else "switches"
        raise ValueError(f"mice_spines: {spines} of the fabric's {len(tops)} top-tier {noun} "
                         f"would leave none for planned traffic (at most {len(tops) - 1})")
    kept = set(tops[:spines])
    return frozenset(lk for lk, info in view.links.items()
                     if info.src in kept or info.dst in kept)


def fewest_hop_paths_from(source: int, indptr: NDArray[np.int64], head: NDArray[np.int64],
                          link: NDArray[np.int64],
                          ) -> list[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """Every fewest-hop path from node ``source`` to every node it reaches, as link ids, in
    a directed graph given as compressed rows (the links out of node ``u`` are
    ``indptr[u]:indptr[u + 1]``; link ``e`` leads to node ``head[e]`` and has id
    ``link[e]``). Per hop count from 1: ``(last node of each path, paths)``, one path of
    that many links per row, rows grouped by last node (ascending) and sorted within a
    group as tuples sort. A path branches wherever a node has several links in from the
    nodes one hop closer, so a leaf pair of a leaf-spine gets one two-hop path per spine.

    Node 0 reaches nodes 1 and 2 (links 10, 11), both reach node 3 (links 12, 13):

    >>> by_hops = fewest_hop_paths_from(0, np.array([0, 2, 3, 4, 4]), np.array([1, 2, 3, 3]),
    ...                                 np.array([10, 11, 12, 13]))
    >>> [(ends.tolist(), paths.tolist()) for ends, paths in by_hops]
    [([1, 2], [[10], [11]]), ([3, 3], [[10, 12], [11, 13]])]
    """
    reached = np.zeros(len(indptr) - 1, np.bool_)
    reached[source] = True
    ends = np.array([source], np.int64)
    paths = np.zeros((1, 0), np.int64)
    out: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = []
    while True:
        # every path extends along every link out of its last node to a node not reached
        # (the links found once per last node: many paths end at each, as a leaf pair's
        # one per spine, and the last hop reaches no node at all)
        last, at = np.unique(ends, return_inverse=True)
        lo = indptr[last]
        n_out = indptr[last + 1] - lo
        edges = _ranges(lo, n_out)
        of_node = np.repeat(np.arange(len(last)), n_out)
        fresh = ~reached[head[edges]]
        edges, of_node = edges[fresh], of_node[fresh]
        if not len(edges):
            return out
        n_fresh = np.bincount(of_node, minlength=len(last))
        per_path = n_fresh[at.ravel()]
        owner = np.repeat(np.arange(len(ends)), per_path)
        edges = edges[_ranges(_offsets(n_fresh)[at.ravel()], per_path)]
        ends = head[edges]
        paths = np.concatenate((paths[owner], link[edges][:, None]), axis=1)
        reached[ends] = True
        by = np.lexsort((*paths.T[::-1], ends))
        ends, paths = ends[by], paths[by]
        out.append((ends, paths))


def rule_key(task_id: str, src: int, dst: int) -> str:
    """The match key of a planned pair: ``"<task>:<src>-><dst>"``."""
    return f"{task_id}:{src}->{dst}"


def task_of_key(key: str) -> str:
    """The job a :func:`rule_key` belongs to (a task id has no ':').

    >>> task_of_key(rule_key("job-a", 12, 7))
    'job-a'
    """
    return key.partition(":")[0]


def pair_of_key(key: str) -> tuple[int, int]:
    """The GPU pair (source, destination) a :func:`rule_key` names.

    >>> pair_of_key(rule_key("job-a", 12, 7))
    (12, 7)
    """
    a, _, b = key.rpartition(":")[2].partition("->")
    return int(a), int(b)


def _pair_rows(keys: Iterable[str], n: int) -> NDArray[np.int64]:
    """The GPU pairs of ``n`` rule keys as rows (source, destination).

    >>> _pair_rows([rule_key("j", 1, 2), rule_key("j", 3, 0)], 2).tolist()
    [[1, 2], [3, 0]]
    """
    return np.fromiter(_chain(map(pair_of_key, keys)), np.int64, 2 * n).reshape(n, 2)


@dataclass
class PlanReport:
    """What the last planning round did: the plan, how many path sets and demands, and how
    the paths are held: by source-port entropy alone (``steered``), with explicit rules
    (``pinned``; ``switch_rules`` counts them per switch) or, where a switch's rule table
    was full, left to the hash of their port (``unpinned``)."""

    plan: Plan
    path_sets: int
    demands: int
    steered: int = 0
    pinned: int = 0
    unpinned: int = 0
    switch_rules: dict[str, int] = field(default_factory=dict)

    installed: int = 0  # path sets sent (the ones that changed)
    # keys with paths left to their hash (a full rule table): how many of their QPs
    spilled: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def max_switch_rules(self) -> int:
        return max(self.switch_rules.values(), default=0)


@dataclass
class HealReport:
    """One reaction to failed or degraded links: its cause, the path sets re-placed and
    sent, and the controller's wall time for it (seconds): ``wall_s`` until it was done
    (the new paths sent and the controller's own records of them updated), ``sent_s``
    until the new paths were handed to the data plane (what the traffic waits for; the
    records follow)."""

    cause: str
    affected: int
    installed: int
    wall_s: float
    plan: PlanReport | None = None
    sent_s: float = 0.0


@dataclass
class TickReport:
    """What one control period saw and did: whether it installed a new plan, the hot links,
    the background load it planned around and the largest link utilisation before and
    after (the new plan's, installed or not)."""

    replanned: bool
    hot_links: list[int]
    background_gbps: dict[int, float]
    lambda_before: float = 0.0
    lambda_after: float = 0.0
    plan: PlanReport | None = None
    # the new plan gave way to urgent work (:attr:`Controller.interrupt`) before it was
    # weighed: the next period weighs one again
    interrupted: bool = False
    # no new plan computed: the last one weighed (not installed; its lambda is
    # ``lambda_after``) was made on the same plan, jobs, links and nearly the same background
    skipped: bool = False
    # what the period's telemetry told and the controller acted on (healed): ports their
    # switches reported gone down or back up, links confirmed gray by their error counters
    links_down: list[int] = field(default_factory=list)
    links_up: list[int] = field(default_factory=list)
    links_gray: list[int] = field(default_factory=list)
    # gray links whose error counters stayed clean for ``gray_clear_ns``: restored
    links_clear: list[int] = field(default_factory=list)
    # the heals of the ports reported down or up, and of the links found gray, if any
    port_heal: HealReport | None = None
    gray_heal: HealReport | None = None


class PlanInterrupted(RuntimeError):
    """A whole plan gave way to urgent work (:attr:`Controller.interrupt` was set while it
    was computed): nothing of it was installed, and the controller is as it was before."""


class Interrupt:
    """A request from another thread that a whole plan being computed give way, e.g. to a
    failure's heal waiting for the controller: :meth:`set` it before waiting, and the plan
    stops at its next check (between jobs while finding demands, before each demand the
    planner places, between the planner's and the steering's stages), installs nothing and
    raises :class:`PlanInterrupted`;
    :meth:`clear` it once the urgent work has the controller.

    >>> flag = Interrupt(); flag.set(); flag.is_set(), bool(flag.flag[0])
    (True, True)
    """

    def __init__(self) -> None:
        self.flag = np.zeros(1, np.bool_)  # (the planner's compiled placement reads it)

    def set(self) -> None:
        self.flag[0] = True

    def clear(self) -> None:
        self.flag[0] = False

    def is_set(self) -> bool:
        return bool(self.flag[0])


# changes of a key index deferred (see _KeysByLink.defer): links sorted, the index in the
# keys of each, the keys, whether they take or leave the links
_Batch = tuple[NDArray[np.int64], NDArray[np.int64], list[str], bool]
_LAZY_MAX = 4_000_000  # deferred (link, key) changes held at most


def _set_links(sets: Sequence[PathSet]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every link use of the paths of ``sets``: ``sets[owner[i]]`` has a path through link
    ``flat[i]`` (a link once per path that crosses it).

    >>> flat, owner = _set_links([PathSet("a", ((1, 2), (3, 2)), (0.5, 0.5)),
    ...                           PathSet("b", ((4,),), (1.0,))])
    >>> flat.tolist(), owner.tolist()
    ([1, 2, 3, 2, 4], [0, 0, 0, 0, 1])
    """
    per_key, per_path, flat = flatten_paths(list(map(_PATHS, sets)))
    owner = np.repeat(np.repeat(np.arange(len(sets), dtype=np.int64), per_key), per_path)
    return flat, owner


class _KeysByLink(Mapping[int, set[str]]):
    """The keys of the installed path sets per link they use (a link met once stays, even
    when its set becomes empty). Built in bulk from path sets (:meth:`of`: their links
    sorted once, the set of a link made when it is read), then changed key by key with
    :meth:`add` and :meth:`discard`, as the set of each link would be.

    >>> idx = _KeysByLink.of([PathSet("a", ((1, 2),), (1.0,)), PathSet("b", ((2,),), (1.0,))])
    >>> sorted(idx[2]), sorted(idx)
    (['a', 'b'], [1, 2])
    >>> idx.discard(2, "a"); idx.add(3, "b")
    >>> sorted(idx[2]), idx[3], idx.get(4, set())
    (['b'], {'b'}, set())
    """

    def __init__(self, links: NDArray[np.int64] | None = None,
                 ptr: NDArray[np.int64] | None = None, owner: NDArray[np.int64] | None = None,
                 keys: list[str] | None = None) -> None:
        self._ptr = ptr if ptr is not None else np.zeros(1, np.int64)
        self._owner = owner if owner is not None else np.zeros(0, np.int64)  # by link
        self._keys = keys or []
        self._row: dict[int, int] = ({} if links is None else
                                     dict(zip(links.tolist(), range(len(links)), strict=True)))
        self._edits: dict[int, dict[str, bool]] = {}  # link -> key -> there (last change)
        # link -> batches of changes not applied to its edits yet (see defer), in order
        self._lazy: dict[int, list[_Batch]] = {}
        self._lazy_n = 0  # (entries they hold)

    @classmethod
    def of(cls, sets: list[PathSet]) -> _KeysByLink:
        """The index of ``sets`` (keys assumed distinct)."""
        return cls.of_links([r.key for r in sets], *_set_links(sets))

    @classmethod
    def of_links(cls, keys: list[str], flat: NDArray[np.int64], owner: NDArray[np.int64],
                 ) -> _KeysByLink:
        """The index of keys by their links: ``keys[owner[i]]`` uses link ``flat[i]``
        (repeats allowed).

        >>> idx = _KeysByLink.of_links(["a", "b"], np.array([2, 1, 2, 2]), np.array([0, 0, 1, 0]))
        >>> sorted(idx[2]), sorted(idx)
        (['a', 'b'], [1, 2])
        """
        if not len(flat):
            return cls()
        # one sort of every (link, key) use: radix for 16-bit link ids
        by_link = (np.argsort(flat.astype(np.uint16), kind="stable")
                   if int(flat.min()) >= 0 and int(flat.max()) < 1 << 16 else np.argsort(flat))
        srt = flat[by_link]
        first = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]])
        return cls(srt[first], np.r_[first, len(srt)].astype(np.int64), owner[by_link], keys)

    def __getitem__(self, link: int) -> set[str]:
        self._fold(link)
        row = self._row.get(link)
        edits = self._edits.get(link)
        if row is None:
            if edits is None:
                raise KeyError(link)
            out: set[str] = set()
        else:
            keys = self._keys
            out = {keys[i] for i in self._owner[self._ptr[row]:self._ptr[row + 1]].tolist()}
        if edits:
            for key, there in edits.items():
                if there:
                    out.add(key)
                else:
                    out.discard(key)
        return out

    def __contains__(self, link: object) -> bool:
        return link in self._row or link in self._edits or link in self._lazy

    def __iter__(self) -> Iterator[int]:
        self.fold_all()
        yield from self._row
        yield from (lk for lk in self._edits if lk not in self._row)

    def __len__(self) -> int:
        self.fold_all()
        return len(self._row) + sum(1 for lk in self._edits if lk not in self._row)

    def add(self, link: int, key: str) -> None:
        """``key`` uses ``link`` (the link is added if new)."""
        self._fold(link)
        self._edits.setdefault(link, {})[key] = True

    def move(self, key: str, gone: set[int], new: set[int]) -> None:
        """``key`` no longer uses the links ``gone`` (:meth:`discard` each) and now uses
        ``new`` (:meth:`add` each)."""
        row, edits, lazy = self._row, self._edits, self._lazy
        for link in gone:
            if lazy and link in lazy:
                self._fold(link)
            if link not in row and link not in edits:
                raise KeyError(link)
            edits.setdefault(link, {})[key] = False
        for link in new:
            if lazy and link in lazy:
                self._fold(link)
            edits.setdefault(link, {})[key] = True

    def defer(self, keys: list[str], links: NDArray[np.int64], of: NDArray[np.int64],
              there: bool) -> None:
        """``keys[of[i]]`` now uses (``there``) or no longer uses link ``links[i]``: as
        :meth:`add` or :meth:`discard` of each, applied to a link when it is next read or
        changed. (A heal moves hundreds of keys off and onto a few hundred links, most of
        which nobody reads before the next whole plan: their edits are not made key by key
        while the switches wait.)

        >>> idx = _KeysByLink.of([PathSet("a", ((1, 2),), (1.0,)), PathSet("b", ((2,),), (1.0,))])
        >>> idx.defer(["a", "b"], np.array([2, 2, 1]), np.array([0, 1, 0]), False)
        >>> idx.defer(["b"], np.array([3, 1]), np.array([0, 0]), True)
        >>> idx[2], idx[1], idx[3], 3 in idx, sorted(idx)
        (set(), {'b'}, {'b'}, True, [1, 2, 3])
        """
        if not len(links):
            return
        srt = np.argsort(links, kind="stable")
        lk_s = links[srt]
        batch = (lk_s, of[srt], keys, there)
        lazy = self._lazy
        for lk in lk_s[np.flatnonzero(np.r_[True, lk_s[1:] != lk_s[:-1]])].tolist():
            got = lazy.get(lk)
            if got is None:
                lazy[lk] = [batch]
            else:
                got.append(batch)
        self._lazy_n += len(lk_s)
        if self._lazy_n > _LAZY_MAX:  # (bounded: the batches' arrays are kept until applied)
            self.fold_all()

    def _fold(self, link: int) -> None:
        """Apply the deferred changes of ``link``, if it has some."""
        batches = self._lazy.pop(link, None)
        if batches is None:
            return
        e = self._edits.setdefault(link, {})
        for lk_s, own, keys, there in batches:
            lo, hi = np.searchsorted(lk_s, [link, link + 1]).tolist()
            e.update(dict.fromkeys([keys[i] for i in own[lo:hi].tolist()], there))
            self._lazy_n -= hi - lo

    def fold_all(self) -> None:
        """Apply every deferred change (see :meth:`defer`)."""
        for link in list(self._lazy):
            self._fold(link)

    def rows_on(self, link: int, row_of: Mapping[str, int]) -> tuple[NDArray[np.int64],
                                                                      list[str]]:
        """The keys on ``link`` as positions in the list the index was built from (in no
        order, possibly repeated), found through ``row_of`` (key -> that position) for the
        keys added since; and the keys added since that ``row_of`` does not know.

        >>> idx = _KeysByLink.of([PathSet("a", ((1, 2),), (1.0,)), PathSet("b", ((2,),), (1.0,))])
        >>> idx.discard(2, "a"); idx.add(2, "c"); idx.add(1, "b")
        >>> rows, unknown = idx.rows_on(2, {"a": 0, "b": 1})
        >>> sorted(rows.tolist()), unknown
        ([1], ['c'])
        >>> sorted(idx.rows_on(1, {"a": 0, "b": 1})[0].tolist())
        [0, 1]
        """
        self._fold(link)
        row = self._row.get(link)
        bulk = (self._owner[self._ptr[row]:self._ptr[row + 1]] if row is not None
                else np.zeros(0, np.int64))
        edits = self._edits.get(link)
        if not edits:
            return bulk, []
        gone, added, unknown = [], [], []
        for key, there in edits.items():
            r = row_of.get(key)
            if there:
                if r is None:
                    unknown.append(key)
                else:
                    added.append(r)
            elif r is not None:
                gone.append(r)
        if gone:
            bulk = bulk[~np.isin(bulk, gone)]
        return np.concatenate((bulk, np.array(added, np.int64))), unknown

    def discard(self, link: int, key: str) -> None:
        """``key`` no longer uses ``link``; ``KeyError`` if the link is not indexed."""
        if link not in self:
            raise KeyError(link)
        self._fold(link)
        self._edits.setdefault(link, {})[key] = False


# the demands of a whole plan as demands() made them: the list, their columns and each
# one's GPUs as rows (source, destination), if made so
_MadeColumns = tuple[Sequence[Demand], DemandColumns, NDArray[np.int64] | None]


class Controller:
    """Plans paths for declared jobs and installs them through a data plane."""

    def __init__(self, dataplane: DataPlane, params: ControllerParams | None = None, *,
                 nic_gbps: float | None = None) -> None:
        self.dp = dataplane
        self.view: FabricView = dataplane.fabric()
        self.params = params or ControllerParams()
        every = self.params.telemetry_interval_ns
        if every is not None and not (math.isfinite(every) and every > 0):
            raise ValueError(f"telemetry_interval_ns must be a positive number of ns, got "
                             f"{every}")
        self.parts = self.params.parts
        self.sla_unmet: dict[str, str] = {}  # task -> why its SLA cannot be met
        self.map = CongestionMap(self.view)
        self.down: set[int] = set()       # links reported down
        self.degraded: set[int] = set()   # links confirmed gray: planned traffic avoids them
        self.partitioned: dict[str, str] = {}  # task -> the pair left without a path
        self.gray = GrayDetector(self.params.fec_threshold,
                                 Debouncer(self.params.debounce_count,
                                           self.params.debounce_window_ns))
        self.heals: list[HealReport] = []
        self._demand: MutableMapping[str, Demand] = {}
        self.current: Plan | None = None
        self._installed: MutableMapping[str, PathSet] = {}
        self._on_link = _KeysByLink()  # link -> keys of installed sets using it
        self._rules_held: Counter[str] = Counter()  # explicit rules per switch, installed
        self._live_cache: dict[tuple, tuple[tuple, tuple]] = {}
        self._live_for: frozenset[int] = frozenset()  # the links the cache's filtering avoids
        # the L1/L2 jobs the last demands() planned (while there is one, L3 jobs are capped)
        self._strict_tasks: frozenset[str] = frozenset()
        # the jobs whose pairs' senders are held to the rate planned for them (l3_rate_cap),
        # and of the jobs with L3 and L1/L2 calls, the pairs only their L3 calls use
        self._capped_tasks: frozenset[str] = frozenset()
        self._capped_keys: dict[str, frozenset[str]] = {}
        # per job whose SLA no path meets: the keys of the demands that keep room for its
        # traffic in the plan (planned, never installed: see _reservations)
        self._reserved: dict[str, frozenset[str]] = {}
        # (their load per link, for the plan it was read from: see _room_gbps)
        self._room: tuple[Plan, dict[str, frozenset[str]], dict[int, float]] | None = None
        self.replans = 0
        # set from another thread: a whole plan being computed gives way (see Interrupt);
        # checked only inside plans that may give way (``_yielding``)
        self.interrupt = Interrupt()
        self._may_yield = False
        # the last whole plan weighed and not installed: on what (the plan, the intents, the
        # background) and its lambda (see _weighed_alike)
        self._weighed: tuple[Plan, dict[str, Intent], dict[int, float], float] | None = None
        # links went down or gray since the last whole plan: the next control period weighs
        # a whole plan again once (a heal is local); links back up (since when, in ns: None
        # until known) are weighed so once they stay up the hold-down
        # (a link back carries nothing until a plan gives it traffic)
        self._links_changed = False
        # the planned load (Gb/s per link) in force while the telemetry the map last folded
        # was counted (the plan as of the control period before), which the measured load
        # is compared with; and the plan's load as of the last period (None: none yet)
        self._load_measured: dict[int, float] | None = None
        # the congestion map's links (ids, in its order), whether each is a fabric link and
        # its capacity (Gb/s): see _map_links
        self._fabric_rows: tuple[NDArray[np.int64], NDArray[np.bool_],
                                 NDArray[np.float64]] | None = None
        self._load_at_tick: dict[int, float] | None = None
        self._tick_ns: float | None = None  # (the time of the last control period given one)
        # with a telemetry interval: the end of the last interval the map has stepped through
        self._interval_end_ns: float | None = None
        self._up_since: dict[int, float | None] = {}
        # the last operational state each port's switch reported (PortDelta.oper_up)
        self._port_up: dict[int, bool] = {}
        self._seen: dict[str, Any] = {}  # what the control period under way saw and did
        self._gray_by_counters: set[int] = set()  # gray links the error counters confirmed
        self.intents: dict[str, Intent] = {}
        self._paths: dict[tuple[str, str], list[tuple[int, ...]]] = {}
        self._sw_paths: dict[tuple[str, str], tuple[tuple[int, ...], ...]] = {}
        # per first switch expanded, its switch paths to every switch it reaches as rows
        # (see _expand), and the switch graph as compressed rows (nodes, node -> index,
        # indptr, head, link id)
        self._reach: dict[str, dict[str, tuple[NDArray[np.int64],
                                               NDArray[np.bool_] | None]]] = {}
        self._csr: tuple[list[str], dict[str, int], NDArray[np.int64], NDArray[np.int64],
                         NDArray[np.int64]] | None = None
        self._ends_cache: dict[tuple[str, bool], list[tuple[str, int]]] = {}
        self._kind: dict[str, str | None] = dict(self.view.graph.nodes(data="kind"))
        self._nic_cache: dict[int, float] = {}
        # GPU node -> its ends out of it / into it by switch component (see _end_info)
        self._ends_out: dict[str, _EndInfo] = {}
        self._ends_in: dict[str, _EndInfo] = {}
        self._steering: SteeringTable | None = None
        self._cap_cache: dict[int, float] | None = None
        self._cap_values: LinkValues | None = None  # the same as arrays (_link_values)
        self._cap_array: NDArray[np.float64] | None = None  # capacity by link id (dense)
        self._fabric_cap: NDArray[np.float64] | None = None  # the same, inf if not fabric
        # the plan's load by link id (dense), kept equal to ``current.link_load_gbps``
        self._load_rows: NDArray[np.float64] | None = None
        # keys whose installed paths are not the plan's (a path left to its hash)
        self._spilled: dict[str, int] = {}  # key -> its QPs left to the hash
        # every installed set is as a whole plan's steering made it, but for the keys the
        # batch they are held in says changed since (_note_sets_changed): a re-plan may keep
        # them (steer_plan)
        self._steered_whole = False
        # the last plan steered with kept sets, and the places of the sets made anew in its
        # list (the others are the installed sets themselves)
        self._made_at: tuple[weakref.ref[Plan], list[int], NDArray[np.int64] | None
                             ] | None = None
        # installed path sets forgotten since the data plane was last told (see _forget)
        self._forgotten: list[str] = []
        # what heals replaced in the records (old paths and path sets), one entry per heal:
        # freed at the next control period or plan (:meth:`_release`), not while a burst of
        # failures is being healed (freeing them reads as much cold memory as making them)
        self._retired: list[object] = []
        # the installed sets of the last whole plan, in columns (what a heal reads first),
        # and the GPUs of the pairs of the plan steered last (to make it)
        self._slots: SlotTable | None = None
        # (the plan by weak reference: a plan weighed and not installed is not kept)
        self._steered_ends: tuple[weakref.ref[Plan], NDArray[np.int64]] | None = None
        self._scoped_cache: dict[tuple[int, str], tuple[tuple, tuple]] = {}
        g = self.view.graph
        self._switch_graph = g.subgraph(
            [n for n, k in g.nodes(data="kind") if k != "gpu"]).copy()
        self._nic_gbps = nic_gbps
        # links into or out of a GPU (its NIC's): a demand's head and tail are of these
        self._gpu_links = frozenset(lk for u, v, lk in g.edges(data="link_id")
                                    if g.nodes[u].get("kind") == "gpu"
                                    or g.nodes[v].get("kind") == "gpu")
        self._component = {n: i for i, c in enumerate(
            nx.weakly_connected_components(self._switch_graph)) for n in c}
        # per node, the link id from each node with a link into it
        self._in_link: dict[str, dict[str, int]] = {}
        for u, v, lk in g.edges(data="link_id"):
            self._in_link.setdefault(v, {})[u] = int(lk)
        self._mice_links = mice_links(self.view, self.params.mice_spines)
        # (first, last) switches -> every switch path, those through mice spines too (for a
        # pair whose other paths are all down), where they differ from _sw_paths
        self._sw_paths_all: dict[tuple[str, str], tuple[tuple[int, ...], ...]] = {}
        # per job, its demands as demands() last made them and for what (a re-plan of the
        # same jobs on the same links reuses them)
        self._made: dict[str, _Made] = {}
        # per job, its demands as the current plan placed them (keys in the plan's order;
        # held by reference: made when it was planned, so a later demands() for a changed
        # intent leaves them be): where plan_jobs finds a job's keys among the plan's
        # without reading every key (a key a heal cut off is gone from the plan, not here)
        self._planned: dict[str, Mapping[str, Demand]] = {}
        # the last whole demands() made: its list, their fields as columns and their pairs'
        # GPUs as rows (None: not known), for the plan (see _solve)
        self._demand_cols: _MadeColumns | None = None
        # every job's demand columns in the last whole plan, and them joined
        self._joined: tuple[list[DemandColumns], DemandColumns] | None = None
        # no candidate path is slower than this (ns): an SLA at least this long needs no
        # path's delay checked. A fewest-hop path climbs to the top tier and back, with an
        # NVLink hop at each end at most: 2 x tiers + 4 links, a switch between two
        hops = 2 * max((int(t) for _, t in g.nodes(data="tier") if t is not None),
                       default=1) + 4
        self._slowest_path_ns = (hops * max((li.delay_ns for li in self.view.links.values()),
                                            default=0.0)
                                 + (hops - 1) * self.view.switch_latency_ns)
        # the compiled kernels, once per process: not in the first plan or re-plan
        planner.warm_up()
        entropy.warm_up()
        self._prepare_routes()

    def _prepare_routes(self) -> None:
        """The fabric's route tables, made once as the controller reads the topology (as a
        controller computes its routes when it learns the fabric, not in the first plan or
        heal that needs them): every GPU's NIC rate, its ends by switch component
        (:meth:`_end_info`), the fewest-hop switch paths from every switch a GPU sends into
        (:meth:`_expand`) with their hop counts, every GPU's ends in the component all GPUs
        reach (:meth:`_gpu_ends`), the hosts (:attr:`host_of`), the links' capacities (also
        in the congestion map's order: :meth:`_map_links`) and the ECMP groups the entropy
        steering reads. The view is fixed for the controller's
        life; links down or gray are avoided per demand, not by changing these."""
        graph = self.view.graph
        # (a GPU the view names but the graph lacks has no ends: its pairs fail as they did)
        gpus = {g: node for g, node in self.view.gpu_node.items() if node in graph}
        # every GPU's NIC rate, by GPU id (NaN: no GPU has the id, or it sends on no link)
        self._nic_rates: NDArray[np.float64] = np.full(
            max(self.view.gpu_node, default=-1) + 1, np.nan)
        sends = [g for g, node in gpus.items() if graph.succ[node]]
        self._nic_rates[sends] = [self._nic(g) for g in sends]
        firsts: dict[str, None] = {}
        # every GPU's switch components with ends both ways, as a bit mask
        self._gpu_masks: dict[int, int] = {}
        self._gpu_ends_of: dict[int, _GpuEnds] = {}  # (made per component: _gpu_ends)
        for g, node in gpus.items():
            into = self._end_info(node, False)
            out = self._end_info(node, True)
            self._gpu_masks[g] = out[0] & into[0]
            for by_comp in out[1].values():
                firsts.update((sw, None) for sw, _, _ in by_comp)
        for sw in firsts:
            if sw not in self._reach:
                self._expand(sw)
        # the hops of the fewest-hop switch paths from each of them to every switch it
        # reaches (and 0 to itself)
        self._hops: dict[tuple[str, str], int] = {
            (first, last): int(rows.shape[1])
            for first in firsts for last, (rows, _) in self._reach[first].items()}
        self._hops.update(((sw, sw), 0) for sw in firsts)
        # every GPU's ends in the component all GPUs reach (a fabric's leaves and spines)
        common = functools.reduce(operator.and_, self._gpu_masks.values(), -1)
        if common > 0 and not common & (common - 1):
            self._end_switch_paths(self._gpu_ends(common))
        # the links' capacities as the planner and the heals read them, and the fabric's
        # ECMP groups as the entropy steering reads them
        self._link_values()
        if len(self._dense_capacity()):
            self._fabric_caps()
        self._map_links(self.map.utilization_array()[0])  # (and as background_gbps reads them)
        if self.view.ecmp is not None:
            self._steering_table().compile()
        self.host_of  # noqa: B018 (the hosts, as the patterns of every call read them)

    def _end_switch_paths(self, t: _GpuEnds) -> None:
        """The fewest-hop switch paths of every (first, last) pair of the switches GPUs send
        into and are reached from in ``t``'s component, made as :meth:`_call_demands` reads
        them (``t.mids``), if they number at most :data:`_ROUTE_PATHS_MAX` paths: part of
        the route tables, not of the first plan that meets them (a call over GPUs scattered
        across a rail-optimised fabric meets nearly every leaf pair; a fabric with more
        paths than that makes them as calls meet them)."""
        names = t.switches
        firsts = np.unique(t.sw[0, t.ok]).tolist()
        lasts = np.unique(t.sw[1, t.ok]).tolist()
        n_paths = 0
        for f in firsts:
            reach = self._reach.get(names[f])
            if reach is None:
                return  # (a first switch the route tables lack: made when met)
            n_paths += sum(len(hit[0]) for hit in map(reach.get, (names[x] for x in lasts))
                           if hit is not None)
            if n_paths > _ROUTE_PATHS_MAX:
                return
        n_last = max(len(names), 1)
        codes = [f * n_last + x for f in firsts for x in lasts]  # (ascending)
        made = self._switch_paths_of([(names[c // n_last], names[c % n_last]) for c in codes])
        t.mids.update(zip(codes, made, strict=True))
        if n_last * n_last <= _ROUTE_CODES_MAX:  # (and each code's place among them)
            t.route_mids = np.fromiter(made, object, len(made))  # (each tuple as it is)
            t.route_codes = np.array(codes, np.int64)
            t.route_has = np.fromiter(map(bool, made), np.bool_, len(made))
            t.route_at = np.full(n_last * n_last, -1, np.int32)
            t.route_at[codes] = np.arange(len(codes), dtype=np.int32)

    # --------------------------------------------------------------- intents
    @functools.cached_property
    def host_of(self) -> dict[int, int]:
        """The host of every GPU that shares one with others, as the fabric shows it: GPUs
        joined over NVLink to one NVSwitch are one host (numbered in order of first GPU)."""
        g = self.view.graph
        host: dict[str, int] = {}
        out: dict[int, int] = {}
        for gpu, node in sorted(self.view.gpu_node.items()):
            if node not in g:
                continue
            for peer, attrs in g[node].items():
                if attrs.get("kind") == "nvlink" and g.nodes[peer].get("kind") != "gpu":
                    out[gpu] = host.setdefault(peer, len(host))
                    break
        return out

    def declare(self, intent: Intent) -> None:
        """Add or replace a job's intent (it is planned at the next :meth:`plan`)."""
        self.intents[intent.task_id] = intent

    def adopt(self, sets: list[PathSet]) -> None:
        """Take note that the data plane already holds these path sets (e.g. switches that
        kept their rules while the controller restarted): the next plan sends only the sets
        that differ from them."""
        if self._slots is not None:
            self._slots.mark_stale(ps.key for ps in sets)
        self._installed.update({ps.key: ps for ps in sets})
        self._note_sets_changed()

    def withdraw(self, task_id: str) -> None:
        self.intents.pop(task_id, None)
        self._made.pop(task_id, None)

    # --------------------------------------------------------------- planning
    def candidates(self, src_gpu: int, dst_gpu: int) -> list[tuple[int, ...]]:
        """Every fewest-hop path between two GPUs, as link ids, sorted. GPUs do not forward
        traffic, so a path leaves its GPU into a switch and stays on switches: the
        switch-level shortest paths are computed once per pair of first and last switches."""
        a, b = self.view.gpu_node[src_gpu], self.view.gpu_node[dst_gpu]
        hit = self._paths.get((a, b))
        if hit is None:
            combos = self._combos(a, b)
            hit = [(up, *m, down) for up, mids, down in combos for m in mids]
            if len(combos) > 1:
                hit.sort()
            self._paths[(a, b)] = hit
        return hit

    def _ends(self, node: str, out: bool) -> list[tuple[str, int]]:
        """``(switch, link id)`` a GPU node leaves by (``out``) or is entered from."""
        hit = self._ends_cache.get((node, out))
        if hit is None:
            g, kind = self.view.graph, self._kind
            adj = g.succ[node] if out else g.pred[node]  # (link data by neighbour, in order)
            hit = [(s, int(d["link_id"])) for s, d in adj.items() if kind.get(s) != "gpu"]
            self._ends_cache[(node, out)] = hit
        return hit

    def _combos(self, a: str, b: str, mice: bool = False,
                ) -> list[tuple[int, tuple[tuple[int, ...], ...], int]]:
        """``(uplink, sorted switch paths, downlink)`` of the (first, last) switch pairs
        at the fewest hops between GPU nodes ``a`` and ``b`` (with ``mice``, through the
        spines kept for mice too)."""
        combos: list[tuple[int, tuple[tuple[int, ...], ...], int]] = []
        best = -1
        for first, up in self._ends(a, True):
            for last, down in self._ends(b, False):
                mids = self._switch_paths(first, last)
                if mice:
                    mids = self._sw_paths_all.get((first, last), mids)
                if not mids:
                    continue
                n = len(mids[0])
                if best < 0 or n < best:
                    best, combos = n, [(up, mids, down)]
                elif n == best:
                    combos.append((up, mids, down))
        return combos

    def _switch_paths(self, first: str, last: str) -> tuple[tuple[int, ...], ...]:
        """Fewest-hop switch paths between two switches, as link ids, sorted (cached; one
        breadth-first search per first switch, none between switches that cannot reach
        each other, such as two NVSwitches)."""
        key = (first, last)
        hit = self._sw_paths.get(key)
        if hit is None:
            if first == last:
                hit = ((),)
            else:
                rows = self._rows(first, last)
                hit = () if rows is None else self._as_paths(key, *rows)
            self._sw_paths[key] = hit
        return hit

    def _switch_paths_of(self, pairs: list[tuple[str, str]]
                         ) -> list[tuple[tuple[int, ...], ...]]:
        """:meth:`_switch_paths` of each (first, last) switch pair of ``pairs``; the pairs
        met for the first time whose paths all avoid the mice's spines (or none are kept)
        made together: one conversion of their link rows to tuples, per path length
        (a call over scattered GPUs meets thousands of leaf pairs at once)."""
        got = list(map(self._sw_paths.get, pairs))
        by_len: dict[int, tuple[list[int], list[NDArray[np.int64]]]] = {}
        first_at: dict[tuple[str, str], int] = {}  # (a pair asked twice: made once)
        again: list[int] = []
        for j, hit in enumerate(got):
            if hit is not None:
                continue
            if first_at.setdefault(pairs[j], j) != j:
                again.append(j)
                continue
            first, last = pairs[j]
            rows = self._rows(first, last) if first != last else None
            if rows is None or rows[1] is not None:  # (by itself: its own way)
                got[j] = self._switch_paths(first, last)
                continue
            at, arrays = by_len.setdefault(rows[0].shape[1], ([], []))
            at.append(j)
            arrays.append(rows[0])
        ints = self._link_ints
        for at, arrays in by_len.values():
            rows_all = np.concatenate(arrays)
            flat = _row_tuples(rows_all, ints)
            ends = _offsets(np.fromiter(map(len, arrays), np.int64, len(arrays))).tolist()
            made = [tuple(flat[lo:hi]) for lo, hi in itertools.pairwise(ends)]
            planner.remember_flat_rows(made, rows_all)  # (a plan reads them as arrays)
            for j, hit in zip(at, made, strict=True):
                got[j] = self._sw_paths[pairs[j]] = hit
        for j in again:
            got[j] = got[first_at[pairs[j]]]
        return got  # type: ignore[return-value]

    def _rows(self, first: str, last: str
              ) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None] | None:
        """The fewest-hop switch paths between two different switches as rows of link ids
        (with which avoid the mice's spines; see :meth:`_expand`), ``None`` if none."""
        if self._component[first] != self._component[last]:
            return None
        found = self._reach.get(first)
        if found is None:
            found = self._expand(first)
        return found.get(last)

    def _hop_count(self, first: str, last: str) -> int:
        """The links of the fewest-hop switch paths from ``first`` to ``last`` (those of
        :meth:`_switch_paths`, without making them), -1 if there are none."""
        hit = self._sw_paths.get((first, last))
        if hit is not None:
            return len(hit[0]) if hit else -1
        if first == last:
            return 0
        rows = self._rows(first, last)
        return -1 if rows is None else int(rows[0].shape[1])

    def _as_paths(self, key: tuple[str, str], paths: NDArray[np.int64],
                  off: NDArray[np.bool_] | None) -> tuple[tuple[int, ...], ...]:
        """The switch paths ``paths`` (rows of link ids, sorted) of the switch pair ``key``
        as tuples; where some of them (``off``) avoid the spines kept for mice, those alone
        (and all of them in ``_sw_paths_all``)."""
        hit = tuple(_row_tuples(paths, self._link_ints))
        if off is not None:
            n_off = int(off.sum())
            if 0 < n_off < len(hit):
                self._sw_paths_all[key] = hit
                hit = tuple(p for p, o in zip(hit, off.tolist(), strict=True) if o)
                paths = paths[off]
        planner.remember_flat(hit, paths)  # (a plan reads them as arrays)
        return hit

    def _expand(self, first: str) -> dict[str, tuple[NDArray[np.int64], NDArray[np.bool_] | None]]:
        """The switch paths from ``first`` to every switch it reaches (all at once: a
        leaf's paths to every other leaf cost about what one pair's did path by path), as
        rows of link ids per last switch, with which of them avoid the spines kept for mice
        (``None`` if none are kept); made into tuples when a pair asks
        (:meth:`_switch_paths`: a rail-optimised fabric's traffic meets few of its leaf
        pairs)."""
        if self._csr is None:
            g = self._switch_graph
            nodes = list(g)
            index = {n: i for i, n in enumerate(nodes)}
            tails, heads, ids = [], [], []
            for u, v, lk in g.edges(data="link_id"):
                tails.append(index[u])
                heads.append(index[v])
                ids.append(int(lk))
            by = np.argsort(np.array(tails, np.int64), kind="stable")
            indptr = _offsets(np.bincount(np.array(tails, np.int64), minlength=len(nodes)))
            self._csr = (nodes, index, indptr, np.array(heads, np.int64)[by],
                         np.array(ids, np.int64)[by])
        nodes, index, indptr, head, link = self._csr
        mice = (np.fromiter(self._mice_links, np.int64, len(self._mice_links))
                if self._mice_links else None)
        found: dict[str, tuple[NDArray[np.int64], NDArray[np.bool_] | None]] = {}
        for ends, paths in fewest_hop_paths_from(index[first], indptr, head, link):
            node_ix, starts = np.unique(ends, return_index=True)
            bounds = [*starts.tolist(), len(paths)]
            off = ~np.isin(paths, mice).any(axis=1) if mice is not None else None
            for v, i, j in zip(node_ix.tolist(), bounds, bounds[1:], strict=False):
                found[nodes[v]] = (paths[i:j], None if off is None else off[i:j])
        self._reach[first] = found
        return found

    def _nic(self, gpu: int) -> float:
        """The rate of a GPU's NIC: its link into the fabric (not NVLink)."""
        if self._nic_gbps is not None:
            return self._nic_gbps
        hit = self._nic_cache.get(gpu)
        if hit is None:
            kind = self._kind
            out = self.view.graph.succ[self.view.gpu_node[gpu]]
            nic = [d["capacity_gbps"] for v, d in out.items() if kind.get(v) == "switch"]
            hit = self._nic_cache[gpu] = max(nic or [d["capacity_gbps"] for d in out.values()])
        return hit

    def _scoped(self, mids: tuple[tuple[int, ...], ...], up: int, down: int,
                level: str) -> tuple[tuple[int, ...], ...]:
        """The switch paths whose full path is in the level's scope (cached: the scope of a
        path depends on its switches only)."""
        if level == "L3":
            return mids
        key = (id(mids), level)
        hit = self._scoped_cache.get(key)
        if hit is None or hit[0] is not mids:
            if len(self._scoped_cache) >= _MEMO_MAX:
                self._scoped_cache.clear()
            hit = self._scoped_cache[key] = (mids, tuple(
                m for m in mids if in_scope(self.view, self._path_nodes((up, *m, down)),
                                            level)))
        return hit[1]

    def _path_nodes(self, path: tuple[int, ...]) -> list[str]:
        return [self.view.links[path[0]].src] + [self.view.links[lk].dst for lk in path]

    def _end_info(self, node: str, out: bool) -> _EndInfo:
        """A GPU node's ends (:meth:`_ends`) by the weakly connected component of their
        switch (switch paths exist only within one): a bit mask of the components, and per
        component bit its ends as ``(switch, link id, (link id,))`` (cached)."""
        cache = self._ends_out if out else self._ends_in
        hit = cache.get(node)
        if hit is None:
            mask = 0
            by_bit: dict[int, list[tuple[str, int, tuple[int]]]] = {}
            for sw, lk in self._ends(node, out):
                bit = 1 << self._component[sw]
                mask |= bit
                by_bit.setdefault(bit, []).append((sw, lk, (lk,)))
            hit = cache[node] = (mask, {bit: tuple(e) for bit, e in by_bit.items()})
        return hit

    def _gpu_ends(self, fabric: int) -> _GpuEnds:
        """The ends of every GPU as :meth:`_call_demands` reads them for a call whose GPUs
        all have ends in switch component ``fabric`` (a one-bit mask; made once per
        component)."""
        hit = self._gpu_ends_of.get(fabric)
        if hit is not None:
            return hit
        gpus = self.view.gpu_node
        n_g = max(gpus, default=-1) + 1
        graph = self.view.graph
        switches: dict[str, int] = {}
        nodes: dict[str, int] = {}
        t = _GpuEnds(np.full(n_g, -1, np.int64), np.zeros(n_g, np.bool_),
                     np.full((2, n_g), -1, np.int64), np.zeros((2, n_g), np.int64),
                     np.full((2, n_g), -1, np.int64), np.empty(n_g, object),
                     np.empty(n_g, object), np.empty(n_g, object), np.empty(n_g, object), [],
                     np.full((2, n_g), -1, np.int64), np.full((2, n_g), -1, np.int64))
        for g, node in gpus.items():
            t.node[g] = nodes.setdefault(node, len(nodes))
            if node not in graph:
                continue  # (no ends: its pairs one by one)
            infos = self._end_info(node, True), self._end_info(node, False)
            if not all(mask & fabric for mask, _ in infos):
                continue  # (no end in the component: its pairs one by one)
            ends_f = [by_comp[fabric] for _, by_comp in infos]
            others = [mask ^ fabric for mask, _ in infos]
            if any(len(e) != 1 for e in ends_f) or any(o & (o - 1) for o in others):
                continue  # (its pairs: one by one)
            t.ok[g] = True
            (first, t.links[0, g], t.heads[g]), = ends_f[0]
            (last, t.links[1, g], t.tails[g]), = ends_f[1]
            t.sw[0, g] = switches.setdefault(first, len(switches))
            t.sw[1, g] = switches.setdefault(last, len(switches))
            t.other[0, g], t.other[1, g] = (o.bit_length() - 1 for o in others)
            o_ends = [infos[side][1].get(others[side], ()) for side in (0, 1)]
            if len(o_ends[0]) == 1 and len(o_ends[1]) == 1:
                (o_first, t.o_links[0, g], t.o_heads[g]), = o_ends[0]
                (o_last, t.o_links[1, g], t.o_tails[g]), = o_ends[1]
                t.osw[0, g] = switches.setdefault(o_first, len(switches))
                t.osw[1, g] = switches.setdefault(o_last, len(switches))
        t.switches.extend(switches)
        t.names.extend(map(str, range(n_g)))
        self._gpu_ends_of[fabric] = t
        return t

    def demands(self, only: set[str] | None = None) -> Sequence[Demand]:
        """One demand per (job, GPU pair) of the opted-in jobs, weighted by the job's heat
        (of the jobs ``only``, if given: the other jobs' demands are kept as they were).

        A pair's candidates are its fewest-hop paths within the scope of its call's SLA level
        (L1: one switch, L2: no spine; see :func:`~fabricpilot.controller.ranking.in_scope`);
        a job with a pair that has none is told why (:attr:`sla_unmet`) and gets no path:
        its demands only keep room for its traffic (:meth:`_reservations`). While an L1/L2
        job is planned (declared, its SLA met and its
        GPUs reachable), L3 demands are planned at ``l3_rate_cap`` of their rate, leaving the
        rest of every link to the stricter jobs; an L1/L2 job no path serves holds no one.
        """
        # (every job's demands, by key: as tables of jobs for a whole plan, each job's demands
        # made when read; as a dict of them for a plan of some jobs)
        out: MutableMapping[str, Demand] = JobDemands() if only is None else {}
        add_job: Callable[[str, Mapping[str, Demand]], None] = (
            out.add_job if isinstance(out, JobDemands) else lambda _, d: out.update(d.items()))
        col_parts: list[DemandColumns | None] = []  # (per job in ``out``: its columns)
        end_parts: list[NDArray[np.int64]] = []  # (and its pairs' GPUs, with columns)
        gpu_node = self.view.gpu_node
        opted = [i for i in self.intents.values() if i.opt_in]
        # (both are found again below: a job is cut off only while its links are down)
        # (the verdicts are made apart and published at the end: a reader meanwhile, as the
        # service's API, sees those of the last plan, not a half-made set)
        sla_unmet: dict[str, str]
        partitioned: dict[str, str]
        reserved: dict[str, frozenset[str]]
        if only is None:
            sla_unmet, partitioned, reserved = {}, {}, {}
            self._capped_keys = {}
        else:
            opted = [i for i in opted if i.task_id in only]
            self._capped_keys = dict(self._capped_keys)
            sla_unmet, partitioned = dict(self.sla_unmet), dict(self.partitioned)
            reserved = {t: keys for t, keys in self._reserved.items() if t not in only}
            for task in only:
                sla_unmet.pop(task, None)
                partitioned.pop(task, None)
                self._capped_keys.pop(task, None)
        # the jobs with an L1/L2 call first: whether any of them is planned says whether
        # the L3 jobs after them are capped (a planned job with L1/L2 and L3 calls is
        # itself such a job, so its own L3 calls are planned capped)
        opted.sort(key=lambda i: all(c.level == "L3" for c in i.calls))
        n_strict = sum(1 for i in opted if any(c.level != "L3" for c in i.calls))
        strict = n_strict > 0
        ends_out, ends_in = self._ends_out, self._ends_in
        sw_paths = self._sw_paths
        nic_fixed = self._nic_gbps
        nic_rate = self._nic_cache
        avoid = frozenset(self._shunned())
        parts = self.parts
        qps_of: dict[float, int] = {}  # a pair's share of its NIC -> its QPs
        made_before = self._made
        strict_tasks: frozenset[str] | None = None
        for n_done, intent in enumerate(opted):
            self._check()
            if n_done == n_strict:  # (the L1/L2 jobs done: the L3-only ones capped or not)
                strict_tasks = self._strict_met(sla_unmet, partitioned)
                strict = bool(strict_tasks)
            task = intent.task_id
            was = made_before.get(task)
            if was is not None and was.intent is intent and was.made_for == (strict, avoid,
                                                                              parts):
                # the same intent on the same fabric: its demands as they were made
                pending, unmet, cut, only_l3 = was.demands, was.unmet, was.cut, was.only_l3
                if only_l3:
                    self._capped_keys[task] = only_l3
                if unmet is not None:
                    sla_unmet[task] = unmet
                    if cut is None:
                        reserved[task] = frozenset(pending)
                if cut is not None:
                    partitioned[task] = cut
                if cut is None:
                    add_job(task, pending)
                    col_parts.append(was.columns)
                    if was.ends_array is not None:
                        end_parts.append(was.ends_array)
                continue
            pending: dict[str, Demand] = {}
            cols_made: DemandColumns | None = None
            ends_rows: NDArray[np.int64] | None = None
            heat = intent.heat  # the same for every demand of the job
            calls = intent.calls
            levels = {c.level for c in calls}
            # a job with L3 and L1/L2 calls (while capping): the pairs of each kind
            mixed = strict and "L3" in levels and len(levels) > 1
            by_kind: tuple[set[str], set[str]] = (set(), set())  # (L3, L1/L2)
            # calls of several levels: the strictest first, and a pair keeps the scope of the
            # strictest call that uses it (whichever call's demand is the larger)
            scope_of: dict[str, CommCall] | None = None
            if len(levels) > 1:
                calls = tuple(sorted(calls, key=lambda c: LEVELS.index(c.level)))
                scope_of = {}
            for call in calls:
                # (the call's pairs, as columns where made so)
                cols, pairs = self._call_pairs(intent, call, columns=not mixed)
                if mixed and pairs is not None:
                    by_kind[call.level != "L3"].update(rule_key(task, a, b) for a, b, _ in pairs)
                cap = self.params.l3_rate_cap if strict and call.level == "L3" else 1.0
                level = call.level
                prio = call.priority
                # the common case, every pair at once (then only the others one by one;
                # all of them if a stricter call gave some pair its scope already)
                made = None
                if (not (call.pairs or pending or scope_of) and level == "L3"
                        and call.sla_us * 1000.0 >= self._slowest_path_ns):
                    made = self._call_demands(task, cols if cols is not None
                                              else _pair_columns(pairs or []), cap, heat, prio,
                                              avoid)
                if isinstance(made, _CallDemands):  # (every pair: all at once)
                    if len(calls) == 1:  # (the job's demands are the call's: by key, each
                        pending = DemandTable(made.rows)  # made when read)
                        cols_made = made.rows.columns
                        ends_rows = made.ends
                    else:
                        pending.update(zip(made.rows.columns.keys, made.rows.all(),
                                           strict=True))
                    continue
                if pairs is None:
                    pairs = list(zip(*(c.tolist() for c in cols or ()), strict=True))
                for i, (a, b, share) in enumerate(pairs):
                    if made is not None:
                        d = made[i]
                        if d is not None:
                            pending[d.key] = d
                            continue
                    na, nb = gpu_node[a], gpu_node[b]
                    if a == b or na == nb:
                        continue
                    key = f"{task}:{a}->{b}"  # rule_key(task, a, b)
                    # (the call whose scope the pair keeps: the one an unmet scope blames)
                    scoped = call if scope_of is None else scope_of.setdefault(key, call)
                    lv = scoped.level
                    if nic_fixed is None:
                        nic = nic_rate.get(a)
                        if nic is None:
                            nic = self._nic(a)
                    else:
                        nic = nic_fixed
                    rate = nic * share * cap
                    qps = qps_of.get(share)
                    if qps is None:  # (a call's pairs share a few shares: one each)
                        qps = qps_of[share] = int(pair_qps(share, parts))
                    whole = qps == 1
                    prev = pending.get(key)
                    pp = prio
                    if prev is not None:  # the same pair in several calls: its largest
                        # demand, at the highest priority of those calls
                        pp = max(pp, prev.priority)
                        if prev.rate_gbps >= rate:
                            if prev.priority < pp:
                                pending[key] = prev._replace(priority=pp)
                            continue
                    # the common case: one (first, last) switch pair; the NIC links
                    # as head and tail and one shared tuple of switch paths (those
                    # that avoid dead and gray links, if the NIC links do)
                    ia = ends_out.get(na)
                    if ia is None:
                        ia = self._end_info(na, True)
                    ib = ends_in.get(nb)
                    if ib is None:
                        ib = self._end_info(nb, False)
                    # an SLA some path might not meet: each candidate's delay checked (the
                    # general way)
                    timed = scoped.sla_us * 1000.0 < self._slowest_path_ns
                    common = 0 if timed else ia[0] & ib[0]
                    one = None
                    if common and not common & (common - 1):
                        # one component in common (ends elsewhere have no switch path)
                        # with one end of each in it: the only combination
                        xa, xb = ia[1][common], ib[1][common]
                        if len(xa) == 1 and len(xb) == 1:
                            one = xa[0], xb[0]
                    if one is not None and avoid and not (
                            avoid.isdisjoint(one[0][2]) and avoid.isdisjoint(one[1][2])):
                        one = None  # (a NIC link down or gray: the general way)
                    if one is not None:
                        (first, up, head), (last, down, tail) = one
                        mids = sw_paths.get((first, last))
                        if mids is None:
                            mids = self._switch_paths(first, last)
                        if avoid and mids:  # (none left: the general way reports it)
                            mids = self._live_mids(mids, avoid)
                        if mids and lv != "L3":
                            mids = self._scoped(mids, up, down, lv)
                        if mids:  # (the checked constructor raises on a bad rate)
                            pending[key] = (
                                _demand(key, rate, mids, heat, head, tail, whole, pp, qps)
                                if rate >= 0 else
                                Demand(key, rate, mids, heat, head, tail, whole, pp, qps))
                            continue
                    elif common:  # (none in common: no combination)
                        combos = self._combos(na, nb)
                        if len(combos) == 1 and avoid:  # (the end links alive: the
                            up, mids, down = combos[0]  # switch paths that avoid links)
                            combos = ([(up, self._live_mids(mids, avoid), down)]
                                      if up not in avoid and down not in avoid else [])
                        if len(combos) == 1:
                            up, mids, down = combos[0]
                            mids = self._scoped(mids, up, down, lv)
                            if mids:
                                pending[key] = Demand(key, rate, mids, heat, (up,),
                                                      (down,), whole, pp, qps)
                                continue
                    cands = self.candidates(a, b)
                    if avoid:
                        if (self._sw_paths_all and cands
                                and all(not self.down.isdisjoint(p) for p in cands)):
                            # (every path off the mice's spines down: through them, then)
                            cands = sorted((up, *m, down) for up, mids, down
                                           in self._combos(na, nb, mice=True) for m in mids)
                        live = [p for p in cands if avoid.isdisjoint(p)]
                        if cands and all(not self.down.isdisjoint(p) for p in cands):
                            partitioned[task] = (
                                f"gpu{a} -> gpu{b}: every path crosses a link that is down")
                        cands = live or [p for p in cands if self.down.isdisjoint(p)]
                    if lv != "L3":
                        cands = [p for p in cands
                                 if in_scope(self.view, self._path_nodes(p), lv)]
                    if not cands and task in partitioned:
                        break
                    if not cands:
                        sla_unmet[task] = (
                            f"{scoped.pattern} at {scoped.sla_us:g} us ({lv}): no path "
                            f"from gpu{a} to gpu{b} within {_SCOPE[lv]}")
                        break
                    if timed:  # (as the SLA-aware ranking: a slower path is no candidate)
                        delays = [path_delay_us(self.view, p) for p in cands]
                        cands = [p for p, us in zip(cands, delays, strict=True)
                                 if us <= scoped.sla_us]
                        if not cands:
                            sla_unmet[task] = (
                                f"{scoped.pattern} at {scoped.sla_us:g} us ({lv}): no path "
                                f"from gpu{a} to gpu{b} within {scoped.sla_us:g} us: the "
                                f"fastest takes {min(delays):.3g} us")
                            break
                    pending[key] = Demand(key, rate, tuple(cands), weight=heat, whole=whole,
                                          priority=pp, parts=qps)
            unmet, cut = sla_unmet.get(task), partitioned.get(task)
            if unmet is not None and cut is None:  # (room kept for its traffic instead)
                pending = self._reservations(intent, avoid)
                cols_made = ends_rows = None
                by_kind = (set(), set())
            only_l3 = (frozenset((by_kind[0] - by_kind[1]).intersection(pending))
                       if by_kind[0] else frozenset())
            if only_l3:
                self._capped_keys[task] = only_l3
            # (the ends of the pairs made all at once, if no other call added any; else
            # read from the keys, each of which names its pair)
            if ends_rows is not None and (len(ends_rows) != len(pending) or len(calls) != 1):
                ends_rows = None
            if cut is None and (cols_made is None or len(cols_made.keys) != len(pending)):
                cols_made = DemandColumns.of(list(pending.values()))
                ends_rows = None
            if cols_made is not None and ends_rows is None:
                ends_rows = _pair_rows(pending, len(pending))
            made_before[task] = _Made(intent, (strict, avoid, parts), pending, unmet, cut,
                                      only_l3, cols_made, ends_rows)
            if cut is None:
                if unmet is not None:
                    reserved[task] = frozenset(pending)
                add_job(task, pending)
                col_parts.append(cols_made)
                if ends_rows is not None:
                    end_parts.append(ends_rows)
        # (the L3-only jobs after them change no L1/L2 job's verdict)
        self._strict_tasks = (self._strict_met(sla_unmet, partitioned) if strict_tasks is None
                              else strict_tasks)
        strict = self._strict_planned
        # the jobs whose GPU pairs are held to their planned rate at the senders (steer_plan)
        self._capped_tasks = frozenset(
            i.task_id for i in self.intents.values()
            if i.opt_in and all(c.level == "L3" for c in i.calls)) if strict else frozenset()
        self.sla_unmet, self.partitioned = sla_unmet, partitioned
        self._reserved = reserved
        made_list: Sequence[Demand] = (out.values() if isinstance(out, JobDemands)
                                       else list(out.values()))
        self._demand_cols = None
        if only is None:
            self._demand = out  # (not changed here after)
            # (the demands' fields as columns, for the planner: if every job's are known)
            if col_parts and all(c is not None for c in col_parts):
                # (every job's columns as in the last plan: the columns joined then, with
                # what the planner compiled from them)
                last = self._joined
                if last is not None and len(last[0]) == len(col_parts) and all(
                        map(operator.is_, last[0], col_parts)):
                    cols = last[1]
                else:
                    cols = DemandColumns.join(col_parts)  # type: ignore[arg-type]
                    self._joined = (col_parts, cols)  # type: ignore[assignment]
                if len(cols.keys) == len(made_list):
                    self._demand_cols = (made_list, cols, np.concatenate(end_parts)
                                         if len(end_parts) == len(col_parts) else None)
        else:
            self._demand.update(out)
            if self._slots is not None:  # (their demands changed)
                self._slots.mark_stale(out)
        return made_list

    @property
    def _strict_planned(self) -> bool:
        """Whether the last demands() planned an L1/L2 job (L3 jobs are capped then)."""
        return bool(self._strict_tasks)

    def _strict_met(self, sla_unmet: Mapping[str, str], partitioned: Mapping[str, str]
                    ) -> frozenset[str]:
        """The declared jobs with an L1/L2 call that are planned: opted in, their SLA met
        (not in ``sla_unmet``) and their GPUs reachable (not in ``partitioned``)."""
        return frozenset(i.task_id for i in self.intents.values()
                         if i.opt_in and i.task_id not in sla_unmet
                         and i.task_id not in partitioned
                         and any(c.level != "L3" for c in i.calls))

    def room_kept(self, task: str) -> int:
        """How many GPU pairs of job ``task`` the last plan kept room for: the job's SLA is
        unmet (:attr:`sla_unmet`), so it has no path, and its flows go where the switches
        route them (see :meth:`_reservations`); 0 for any other job."""
        return len(self._reserved.get(task, ()))

    def _call_pairs(self, intent: Intent, call: CommCall, columns: bool = True,
                    ) -> tuple[tuple[NDArray[np.int64], NDArray[np.int64],
                                     NDArray[np.float64]] | None,
                               list[tuple[int, int, float]] | None]:
        """The GPU pairs of a call of ``intent`` (source, destination, share of the
        source's NIC): its explicit pairs, or those of its pattern; an AlltoAll's many pairs
        as columns, if ``columns`` (then ``(columns, None)``, else ``(None, pairs)``)."""
        if call.pairs:
            return None, pair_shares(call.pairs, self.host_of)
        if call.pattern == "alltoall" and columns:  # (its many pairs: at once)
            return alltoall_pairs(intent.gpus, self.host_of, call.algorithm), None
        return None, pattern_pairs(call.pattern, intent.gpus, self.host_of, call.algorithm)

    @property
    def reserved_keys(self) -> frozenset[str]:
        """The GPU pairs of the jobs whose SLA no path meets that the last plan kept room
        for (:meth:`_reservations`): in the plan and its load, never installed."""
        return frozenset().union(*self._reserved.values())

    def _reservations(self, intent: Intent, avoid: frozenset[int]) -> dict[str, Demand]:
        """Demands that keep room in the plan for the traffic of a job whose SLA no path
        meets (:attr:`sla_unmet`). The job is told so and gets no path: its flows go where
        the switches' own adaptive routing sends them, across the fabric all the same. So
        each of its GPU pairs is planned as an L3 pair would be (any fewest-hop path that
        avoids ``avoid``, if one does; not rate-capped: it is no L3 job), at the largest
        demand and highest priority of the calls that use it, and whole: the switches'
        routing puts a flow on one path, so room split over several would fit no flow. Its
        weight is 0, the lightest: the flows go into what the planned jobs leave, so the
        room is placed after them, and the planner's sweeps then make it fit beside them
        (placed first, on an empty fabric, it took paths the flows need not take and
        the planned jobs gave those up). The plan never installs these
        (:meth:`steer_plan`), and switch-local adaptive routing finds the room they leave.
        A pair with no path has no reservation.

        >>> from fabricpilot.controller.southbound import LinkInfo
        >>> class DP:
        ...     def fabric(self): return FabricView.from_links(
        ...         [LinkInfo(0, "g0", "a", 100, 1, "nic"), LinkInfo(1, "a", "s", 100, 1),
        ...          LinkInfo(2, "s", "b", 100, 1), LinkInfo(3, "b", "g1", 100, 1, "nic")],
        ...         {"g0": "gpu", "g1": "gpu", "a": "switch", "b": "switch", "s": "switch"},
        ...         {}, {0: "g0", 1: "g1"})
        >>> ctl = Controller(DP())
        >>> far = Intent("far", "t", (0, 1), (CommCall("broadcast", 1 << 20, 8.0, 0,
        ...                                             pairs=((0, 1),)),))
        >>> [(d.key, d.rate_gbps, d.full_candidates, d.whole, d.weight)
        ...  for d in ctl._reservations(far, frozenset()).values()]
        [('far:0->1', 100.0, ((0, 1, 2, 3),), True, 0.0)]
        """
        task, heat = intent.task_id, intent.heat
        gpu_node = self.view.gpu_node
        out: dict[str, Demand] = {}
        for call in intent.calls:
            cols, pairs = self._call_pairs(intent, call)
            # (the common case, every pair at once, as an L3 call's)
            called = self._call_demands(task, cols if cols is not None else _pair_columns(
                pairs or []), 1.0, heat, call.priority, avoid)
            made = called.rows if isinstance(called, _CallDemands) else called
            if pairs is None:
                pairs = list(zip(*(c.tolist() for c in cols or ()), strict=True))
            for i, (a, b, share) in enumerate(pairs):
                d = made[i] if made is not None else None
                if d is None:
                    if a == b or gpu_node[a] == gpu_node[b]:
                        continue
                    cands = self.candidates(a, b)
                    if avoid:
                        cands = ([p for p in cands if avoid.isdisjoint(p)]
                                 or [p for p in cands if self.down.isdisjoint(p)])
                    if not cands:
                        continue
                    d = Demand(rule_key(task, a, b), self._nic(a) * share, tuple(cands),
                               weight=0.0, whole=True, priority=call.priority, parts=1)
                else:
                    d = d._replace(weight=0.0, whole=True, parts=1)
                prev = out.get(d.key)
                if prev is not None:  # (the same pair in several calls)
                    top = max(prev.priority, d.priority)
                    d = (prev if prev.rate_gbps >= d.rate_gbps else d)._replace(priority=top)
                out[d.key] = d
        return out

    def _call_demands(self, task: str, pairs: tuple[NDArray[np.int64], NDArray[np.int64],
                                                    NDArray[np.float64]],
                      rate_cap: float, heat: float, priority: int = 0,
                      avoid: frozenset[int] = frozenset()) -> list[Demand | None]:
        """The demands of a call's GPU pairs (as columns: sources, destinations, shares of
        the source's NIC; each pair once) at ``rate_cap`` of their rate, weight ``heat`` and
        ``priority``, made together, of the pairs that are :meth:`demands`'s common case: two
        GPUs of different hosts with one NIC each (one end in the component of switches all
        the call's GPUs reach, and at most one other component, as an NVLink domain, which
        the two do not share), a fewest-hop path between their switches (level L3: no
        scope). With links to ``avoid`` (down or gray), the switch paths are those that
        :meth:`_live_mids` keeps, and a pair whose end link (NIC or NVLink) is avoided, or
        that no live switch path serves, is left to be made by itself. Per pair, in order:
        its demand, or ``None`` (it is made by itself)."""
        a, b, share = pairs
        out: list[Demand | None] = [None] * len(a)
        if not len(a):
            return out
        # the component of switches all the call's GPUs have ends in (``fabric``: one)
        masks = self._gpu_masks
        gpus = distinct_ids(np.concatenate((a, b))).tolist()
        try:
            fabric = functools.reduce(operator.and_, map(masks.__getitem__, gpus))
        except KeyError:  # (a GPU the fabric lacks: one by one, which says so)
            return out
        if not fabric or fabric & (fabric - 1):
            return out
        t = self._gpu_ends(fabric)
        g_node, g_ok, g_other, g_sw, g_osw = t.node, t.ok, t.other, t.sw, t.osw
        heads, tails, o_heads, o_tails = t.heads, t.tails, t.o_heads, t.o_tails
        first_of = last_of = t.switches
        o_a, o_b = g_other[0, a], g_other[1, b]
        both = g_ok[a] & g_ok[b] & (g_node[a] != g_node[b])
        fast = both & ((o_a < 0) | (o_a != o_b))
        n_last = max(len(last_of), 1)

        hops = self._hops

        def hop_counts(code: NDArray[np.int64]) -> NDArray[np.int64]:
            """The hops of the fewest-hop switch paths of each (first, last) switch pair
            ``code`` names (-1: none)."""
            uniq, inv = np.unique(code, return_inverse=True)
            pairs = [(first_of[c // n_last], last_of[c % n_last]) for c in uniq.tolist()]
            return np.array([hops[p] if p in hops else self._hop_count(*p) for p in pairs],
                            np.int64)[inv.ravel()]

        # the (first, last) switch pair of each pair
        code = g_sw[0, a] * n_last + g_sw[1, b]
        # pairs of one host (NVLink and NICs both reach): by the fewer hops, as _combos
        # chooses (the other way alone if one has no path; both, if alike: one by one)
        near = both & (o_a >= 0) & (o_a == o_b) & (g_osw[0, a] >= 0) & (g_osw[1, b] >= 0)
        if near.any():
            i_near = np.flatnonzero(near)
            o_code = g_osw[0, a[i_near]] * n_last + g_osw[1, b[i_near]]
            f_n, o_n = (hop_counts(c) for c in (code[i_near], o_code))
            way = np.where((o_n < 0) | ((f_n >= 0) & (f_n < o_n)), 0,
                           np.where((f_n < 0) | (o_n < f_n), 1, -1))
            fast[i_near[way == 0]] = True  # (through the NICs)
            other = i_near[way == 1]  # (through the other component: NVLink)
            code[other] = o_code[way == 1]
            fast[other] = True
        else:
            other = np.zeros(0, np.int64)
        # the switch paths of each (first, last) switch pair met, in code order
        mids_of, inv, has_u = self._mids_of_codes(t, code[fast])
        if avoid:  # (the paths that avoid them; none left: by itself, which says why)
            mids_of = [self._live_mids(m, avoid) if m else m for m in mids_of]
            has_u = np.fromiter(map(bool, mids_of), np.bool_, len(mids_of))
        nic_fixed = self._nic_gbps
        nic = np.full(len(a), nic_fixed) if nic_fixed is not None else self._nic_rates[a]
        rates = nic * share * rate_cap
        qps = pair_qps(share, self.parts)
        idx = np.flatnonzero(fast)
        has = has_u[inv.ravel()]
        ok = has & (rates[idx] >= 0)  # (no path, a bad rate: by itself, which says why)
        # (the links each pair leaves and enters by: its NICs', or, through NVLink, those
        # of its GPUs' ends there)
        h_link, t_link = t.links[0, a[idx]], t.links[1, b[idx]]
        if len(other):  # (the pairs through NVLink, among those of ``idx``)
            nvl = np.zeros(len(a), np.bool_)
            nvl[other] = True
            by_nvl: NDArray[np.bool_] | None = nvl[idx]
        else:
            by_nvl = None
        if by_nvl is not None:
            h_link[by_nvl] = t.o_links[0, a[idx[by_nvl]]]
            t_link[by_nvl] = t.o_links[1, b[idx[by_nvl]]]
        if avoid:  # (an end link avoided: by itself, on its whole paths)
            avoided = np.fromiter(avoid, np.int64, len(avoid))
            ok &= ~(np.isin(h_link, avoided) | np.isin(t_link, avoided))
        idx, inv = idx[ok], inv.ravel()[ok]
        h_link, t_link = h_link[ok], t_link[ok]
        ia, ib = a[idx], b[idx]
        ha, tb = heads[ia], tails[ib]
        if by_nvl is not None:
            by_nvl = by_nvl[ok]
            ha[by_nvl] = o_heads[ia[by_nvl]]
            tb[by_nvl] = o_tails[ib[by_nvl]]
        q_idx = qps[idx]
        # (as rule_key writes them; made when read whole: a whole plan makes them while
        # its placement runs)
        keys = PairKeys(f"{task}:", t.names, ia, ib)
        r_idx = rates[idx]
        if len(idx) == len(out):  # (every pair, as a rule: their columns, each demand made
            n = len(idx)          # when read)
            cols = DemandColumns(
                keys, r_idx, np.full(n, float(heat)), q_idx == 1, q_idx.astype(np.int64),
                np.full(n, int(priority), np.int64), mids_of, inv.astype(np.int64), h_link,
                t_link, t.pair_order(ia, ib))
            return _CallDemands(DemandRows(cols, ha, tb), np.column_stack((a[idx], b[idx])))
        if len(q_idx) and (q_idx == q_idx[0]).all():  # (one value for a call's pairs, as a
            q_list = itertools.repeat(int(q_idx[0]))  # rule)
            wholes = itertools.repeat(bool(q_idx[0] == 1))
        else:
            q_list, wholes = q_idx.tolist(), (q_idx == 1).tolist()
        made = list(map(_demand_of, zip(keys, r_idx.tolist(),
                                        map(mids_of.__getitem__, inv.tolist()),
                                        itertools.repeat(heat),
                                        ha.tolist(), tb.tolist(), wholes,
                                        itertools.repeat(priority), q_list, strict=False)))
        for i, d in zip(idx.tolist(), made, strict=True):
            out[i] = d
        return out

    def _mids_of_codes(self, t: _GpuEnds, codes: NDArray[np.int64],
                       ) -> tuple[list[tuple[tuple[int, ...], ...]], NDArray[np.int64],
                                  NDArray[np.bool_]]:
        """The distinct (first, last) switch pairs of ``codes`` (of ``t``), ascending, as
        their fewest-hop switch paths, each code's place among them (as
        ``np.unique(codes, return_inverse=True)`` gives them) and whether each has a path:
        found by their places in the route tables (:meth:`_end_switch_paths`: no sort of
        the codes), the few codes outside them (as pairs of one host over NVLink) by a
        sort, and through the memo ``t.mids``."""
        route_at = t.route_at
        if route_at is None or not len(codes):
            uniq, inv = ids_inverse(codes)
            mids_of = self._mids_memo(t, uniq.tolist())
            return mids_of, inv, np.fromiter(map(bool, mids_of), np.bool_, len(mids_of))
        at = route_at[codes].astype(np.int64)
        miss = np.flatnonzero(at < 0)
        met = np.zeros(len(t.route_mids), np.bool_)
        met[at[at >= 0] if len(miss) else at] = True
        places = np.flatnonzero(met)
        mids_of = (t.route_mids if len(places) == len(met) else t.route_mids[places]).tolist()
        has = t.route_has[places]
        place_of = np.cumsum(met) - 1
        if not len(miss):
            return mids_of, place_of[at], has
        # the codes outside them, ascending, and where each comes among those in them
        extra, inv_x = ids_inverse(codes[miss])
        x_mids = self._mids_memo(t, extra.tolist())
        met_codes = t.route_codes[places]
        into = np.searchsorted(met_codes, extra)
        new_x = into + np.arange(len(extra), dtype=np.int64)  # (their places in all)
        inv = np.empty(len(codes), np.int64)
        hit = np.flatnonzero(at >= 0)
        routed = place_of[at[hit]]
        inv[hit] = (np.arange(len(places), dtype=np.int64)
                    + np.searchsorted(extra, met_codes))[routed]
        inv[miss] = new_x[inv_x]
        out: list[tuple[tuple[int, ...], ...]] = []
        lo = 0
        for k, m in zip(into.tolist(), x_mids, strict=True):
            out.extend(mids_of[lo:k])
            out.append(m)
            lo = k
        out.extend(mids_of[lo:])
        has_all = np.insert(has, into, np.fromiter(map(bool, x_mids), np.bool_, len(x_mids)))
        return out, inv, has_all

    def _mids_memo(self, t: _GpuEnds, codes: list[int]) -> list[tuple[tuple[int, ...], ...]]:
        """The fewest-hop switch paths of each (first, last) switch pair ``codes`` name
        (of ``t``), through the memo ``t.mids`` (those not met before made together)."""
        memo = t.mids
        n_last = max(len(t.switches), 1)
        mids_of = list(map(memo.get, codes))
        new = list(itertools.compress(range(len(mids_of)),  # (those not met before)
                                      map(operator.is_, mids_of, itertools.repeat(None))))
        if new:
            names = t.switches
            made_mids = self._switch_paths_of([(names[codes[i] // n_last],
                                                names[codes[i] % n_last]) for i in new])
            for i, m in zip(new, made_mids, strict=True):
                mids_of[i] = memo[codes[i]] = m
        return mids_of

    def _capacity(self) -> dict[int, float]:
        """Capacity (Gb/s) of every link of the view (a copy of a cached table)."""
        return dict(self._link_capacity())

    def _link_capacity(self) -> dict[int, float]:
        """Capacity (Gb/s) of every link of the view (cached; not to be modified)."""
        if self._cap_cache is None:
            self._cap_cache = {lid: li.capacity_gbps for lid, li in self.view.links.items()}
        return self._cap_cache

    def _link_values(self) -> LinkValues:
        """Capacity (Gb/s) of every link of the view as arrays, by ascending link id (as the
        planner reads it; cached)."""
        if self._cap_values is None:
            cap = self._link_capacity()
            ids = np.array(sorted(cap), np.int64)
            self._cap_values = LinkValues(ids, np.array([float(cap[lk]) for lk in ids.tolist()]))
        return self._cap_values

    def _capacity_of(self, ids: NDArray[np.int64], ids_l: list[int]) -> NDArray[np.float64]:
        """Capacities (Gb/s) of the links ``ids`` (``ids_l`` as a list), as floats."""
        arr = self._dense_capacity()
        if len(ids) and len(arr) and int(ids[0]) >= 0 and int(ids[-1]) < len(arr):
            out = arr[ids]
            if not np.isnan(out).any():
                return out
        cap = self._link_capacity()
        return np.array([float(cap[lk]) for lk in ids_l], np.float64)

    def _dense_capacity(self) -> NDArray[np.float64]:
        """Capacity (Gb/s) indexed by link id, NaN where no link has the id (cached; empty
        if the ids are too sparse for that)."""
        if self._cap_array is not None:
            return self._cap_array
        cap = self._link_capacity()
        ids = np.fromiter(cap, np.int64, len(cap))
        top = int(ids.max()) if len(ids) else -1
        if len(ids) and (int(ids.min()) < 0 or top >= 4 * len(ids) + 1024):
            arr = np.zeros(0)
        else:
            arr = np.full(top + 1, np.nan)
            arr[ids] = np.fromiter(cap.values(), np.float64, len(cap))
        self._cap_array = arr
        return arr

    @functools.cached_property
    def _link_ints(self) -> NDArray[np.object_]:
        """One int object per link id, indexed by it (as :meth:`_dense_capacity`; empty if
        the ids are too sparse): the links of the switch paths made of rows
        (:func:`_row_tuples`)."""
        return np.arange(len(self._dense_capacity())).astype(object)

    def _steering_table(self) -> SteeringTable:
        """The steering table of the view (made at first use; it keeps the hash decisions
        of every switch path steered)."""
        if self._steering is None or self._steering.view is not self.view:
            self._steering = SteeringTable(self.view)
        return self._steering

    def plan(self, background: dict[int, float] | None = None, *,
             may_yield: bool = False) -> PlanReport:
        """Plan every opted-in job together, steer the planned paths and install them.
        ``background`` is load (Gb/s per link) the plan must route around; by default the
        measured load the installed plan does not account for (:meth:`background_gbps`),
        as a control period's re-plan has it, so that a plan made for a declaration does
        not put pairs on a link the congestion map shows hot (the next period would move
        them off again). With ``may_yield``, the plan gives way if :attr:`interrupt` is
        set before it installs anything (:class:`PlanInterrupted`; the controller is left
        as it was)."""
        if background is None:
            background = self.background_gbps()
        # many long-lived objects and no reference cycles: spare the collector its passes
        with _gc_paused(promote=True):
            self._release()
            kept = self._kept()
            try:
                with self._yielding(may_yield):
                    demands = self.demands()
                    solved = self._solve(demands, background)
            except PlanInterrupted:
                self._restore(kept)
                raise
            return self._install(*solved, len(demands), background)

    @property
    def capped_tasks(self) -> frozenset[str]:
        """The jobs whose GPU pairs' senders are held to ``l3_rate_cap`` of their NICs
        while an L1 / L2 job is planned: every pair of a job whose calls are all L3, the
        pairs only the L3 calls of a job with L1 / L2 calls use (see :meth:`capped_keys`);
        as of the last plan."""
        return self._capped_tasks.union(self._capped_keys)

    def capped_keys(self, task: str) -> frozenset[str] | None:
        """The keys of a job's pairs held to ``l3_rate_cap``: ``None`` for all of them (its
        calls all L3 while an L1 / L2 job is planned), else those only its L3 calls use
        (none: an empty set)."""
        if task in self._capped_tasks:
            return None
        return self._capped_keys.get(task, frozenset())

    @property
    def _weight(self) -> _Weights:
        """Each planned GPU pair's weight (its job's heat), from its demand."""
        return _Weights(self._demand)

    def _kept(self) -> tuple[Any, ...]:
        """What computing a whole plan changes before it installs (see :meth:`_restore`):
        the demands the installed plan was made of and what they said."""
        return (self._demand, self._strict_tasks, self._capped_tasks, self._capped_keys,
                self.sla_unmet, self.partitioned, self._reserved)

    def _restore(self, kept: tuple[Any, ...]) -> None:
        """Back to ``kept`` (:meth:`_kept`): a whole plan computed was not installed."""
        (self._demand, self._strict_tasks, self._capped_tasks, self._capped_keys,
         self.sla_unmet, self.partitioned, self._reserved) = kept

    @contextlib.contextmanager
    def _yielding(self, may_yield: bool = True) -> Iterator[None]:
        """Within: :meth:`_check` raises :class:`PlanInterrupted` if :attr:`interrupt` is set
        (when ``may_yield``)."""
        self._may_yield = may_yield
        try:
            yield
        finally:
            self._may_yield = False

    def _check(self) -> None:
        """Give way (:class:`PlanInterrupted`) if this plan may and :attr:`interrupt` is
        set."""
        if self._may_yield and self.interrupt.is_set():
            raise PlanInterrupted("the plan gave way to urgent work")

    def plan_jobs(self, tasks: set[str]) -> PlanReport | None:
        """Re-plan only the jobs ``tasks`` (declared, changed or withdrawn since the last
        plan) against the rest of the installed plan, which stays as it is: their old paths
        are taken out of the load, their demands now are placed on what is left (and around
        the measured load no plan accounts for: :meth:`background_gbps`), steered and
        installed. The cost grows with those jobs' demands, not with the fabric's.

        Returns ``None`` (nothing done: call :meth:`plan`) when there is no plan yet, or
        when the jobs may change what every job's plan depends on (L3 demands are capped
        only while an L1/L2 job is planned: the jobs include one with L1/L2 calls, or one
        that was, and no other holds the cap either way).
        The next control period that finds a hot link re-plans everything.
        """
        if self.current is None:
            return None
        others = self._strict_tasks - tasks
        touched = any(i.opt_in and any(c.level != "L3" for c in i.calls)
                      for t in tasks if (i := self.intents.get(t)) is not None)
        if not others and (touched or self._strict_planned):
            return None
        old = self._planned_keys(tasks)
        if any(k not in self._demand for k in old):  # (a plan older than the demands)
            return None
        with _gc_paused(promote=True):
            return self._plan_jobs(tasks, old)

    def _planned_keys(self, tasks: set[str]) -> list[str]:
        """The keys of jobs ``tasks`` in the current plan (pairs it has paths or room for),
        read from what each job's demands were when they were planned, not from every key
        of the plan: the cost grows with those jobs' pairs."""
        assert self.current is not None
        paths = self.current.paths
        return [k for t in sorted(tasks) for k in self._planned.get(t, ()) if k in paths]

    def _ends_made(self, tasks: set[str]) -> tuple[list[str], NDArray[np.int64]] | None:
        """The keys of the demands of job ``tasks`` (one job) and their pairs' GPUs as rows,
        as :meth:`demands` made them at once (``None`` if it did not, or for several jobs):
        steering reads the pairs' GPUs from them rather than from each key."""
        if len(tasks) != 1:
            return None
        made = self._made.get(next(iter(tasks)))
        if made is None or made.columns is None or made.ends_array is None:
            return None
        return made.columns.keys, made.ends_array

    def _note_planned(self, tasks: Iterable[str] | None = None) -> None:
        """Note the demands of ``tasks`` (all jobs, if ``None``) as the plan now has them:
        as :meth:`demands` last made them."""
        made = self._made
        if tasks is None:
            self._planned = {t: m.demands for t, m in made.items()}
            return
        for t in tasks:
            m = made.get(t)
            if m is None:
                self._planned.pop(t, None)
            else:
                self._planned[t] = m.demands

    def _plan_jobs(self, tasks: set[str], old: list[str]) -> PlanReport:
        """:meth:`plan_jobs` of ``tasks``, whose planned keys are ``old``."""
        plan = self.current
        assert plan is not None
        load = plan.link_load_gbps
        self._take_out(old)  # out with their old paths
        fresh = self.demands(only=tasks)
        self._note_planned(tasks)
        kept = set(map(_KEY, fresh))
        self._forget_all([k for k in old if k not in kept])
        self._withdraw_forgotten()  # (before the new sets: their rules free room)
        columns = plan.columns
        if not fresh:
            report = PlanReport(plan, 0, 0)
        else:
            sets, report = self._place_around(fresh, self._links_of(fresh), measured=True,
                                              ends=self._ends_made(tasks))
            installed = self._installed
            changed = _changed_sets(sets, installed)
            self.dp.install(changed)
            self._record(sets)
            report.installed = len(changed)
            # the jobs' candidates join the plan's compiled ones (a failure under them is
            # healed as under the rest of the plan)
            if columns is not None and report.plan.columns is not None:
                # (a link the plan's columns lack: failures there take the general way)
                with contextlib.suppress(ValueError):
                    columns = columns.merged(report.plan.columns)
        self.current = replace(plan, max_utilization=self._fabric_lambda(load, {}),
                               columns=columns)
        self._sync_load_rows()
        report.plan = self.current
        report.demands = len(fresh)
        return report

    def resume(self) -> PlanReport | None:
        """After a restart: take the path sets the data plane holds (:meth:`adopt`) as the
        plan of every job they fully cover, on live candidates of its demands now, so that
        a restart moves no traffic; plan the other jobs by themselves (:meth:`plan_jobs`).
        Returns ``None`` (nothing done: call :meth:`plan`) if no job is covered.

        Plans made one job at a time differ from one plan of every job, so a restarted
        controller planning from scratch would move flows the switches carry well.
        """
        with _gc_paused(promote=True):
            demands = self.demands()
            held = self._installed
            avoid = self._shunned()
            covered: dict[str, bool] = {}
            for d in demands:
                task = task_of_key(d.key)
                ps = held.get(d.key)
                covered[task] = covered.get(task, True) and ps is not None and all(
                    avoid.isdisjoint(p) for p in ps.paths) and set(ps.paths) <= set(
                    d.full_candidates)
            if not any(covered.values()):
                return None
            rate = {d.key: d.rate_gbps for d in demands}
            keys = [d.key for d in demands if covered[task_of_key(d.key)]]
            sets = [held[k] for k in keys]
            paths = {ps.key: list(zip(ps.paths, ps.weights, strict=True)) for ps in sets}
            load: dict[int, float] = {}
            for k, shares in paths.items():
                for p, w in shares:
                    for lk in p:
                        load[lk] = load.get(lk, 0.0) + rate[k] * w
            self._record_all(sets)  # (adopted sets of no demand now are forgotten)
            # (compiled as a plan would be: a failure under it is healed the same way)
            self.current = Plan(paths, load, self._fabric_lambda(load, {}), solver="resumed",
                                columns=compile_columns(demands, self._link_capacity()))
            self._note_planned()
            self._spilled = {}  # (the plan is the held sets' paths)
            self._sync_load_rows()
        rest = {t for t, ok in covered.items() if not ok}
        if not rest:
            return PlanReport(self.current, len(self._installed), len(demands))
        report = self.plan_jobs(rest)
        return self.plan() if report is None else report

    def _place_around(self, demands: list[Demand], used: set[int],
                      merge: Callable[[dict[str, list[tuple[tuple[int, ...], float]]]],
                                      dict[str, list[tuple[tuple[int, ...], float]]]]
                      | None = None, placed: tuple[Plan, list[int], LinkValues] | None = None,
                      measured: bool = False,
                      ends: tuple[list[str], NDArray[np.int64]] | None = None, **greedy: int
                      ) -> tuple[list[PathSet], PlanReport]:
        """Place ``demands`` around the current plan's load, on the links ``used`` (those
        their candidates can take), steer them and add them to the plan (paths and load);
        the path sets are returned, not yet installed. ``merge`` turns the placed demands'
        paths into the plan's path sets (by default they are the same); ``greedy``: options
        of :func:`plan_greedy`. ``placed``: that placement, made already (its plan, and the
        links and load :meth:`_around` gave it). ``measured``: around the measured load the
        plan does not account for too (:meth:`background_gbps`; not added to the plan).
        ``ends``: keys and their pairs' GPUs as rows, for steering (see :meth:`steer_plan`)."""
        plan = self.current
        assert plan is not None
        load = plan.link_load_gbps
        if placed is not None:
            sub, ids_l, bg = placed
        else:
            ids_l, cap, bg = self._around(used)
            around = bg
            seen = self.background_gbps() if measured else {}
            if seen:
                get = seen.get
                around = LinkValues(bg.ids, bg.values + np.array([get(lk, 0.0)
                                                                  for lk in ids_l]))
            sub = plan_greedy(demands, cap, background=around, meanwhile=self._index_work(),
                              **{"split": self.parts, **greedy})
            self._index_jobs()
        before = bg.values
        if merge is not None:
            sub = replace(sub, paths=merge(sub.paths))
        sets, report = self._steer_in(sub, ends)
        added = sub.link_load_gbps
        if len(added) == len(ids_l) and list(added) == ids_l:  # the plan's links, in order
            load.update(zip(ids_l, (before + np.fromiter(added.values(), np.float64,
                                                          len(ids_l))).tolist(), strict=True))
        else:  # pragma: no cover - the planner gives every capacity link, in order
            for lk, v in added.items():
                load[lk] = load.get(lk, 0.0) + v
        return sets, report

    def _around(self, used: set[int]) -> tuple[list[int], LinkValues, LinkValues]:
        """The links ``used`` (ascending), their capacity and the current plan's load on
        them: what a placement around the plan reads."""
        assert self.current is not None
        ids = np.fromiter(used, np.int64, len(used))
        ids.sort()
        ids_l = ids.tolist()
        get = self.current.link_load_gbps.get
        before = np.array([get(lk, 0.0) for lk in ids_l], np.float64)
        return ids_l, LinkValues(ids, self._capacity_of(ids, ids_l)), LinkValues(ids, before)

    def _steer_in(self, sub: Plan, ends: tuple[list[str], NDArray[np.int64]] | None = None
                  ) -> tuple[list[PathSet], PlanReport]:
        """Steer the path sets of ``sub`` (a path a key already has keeps its port; ``ends``
        as :meth:`steer_plan` reads them) and put its paths in the current plan (its load is
        the caller's to add)."""
        plan = self.current
        assert plan is not None
        held = +self._rules_held  # (the rules held but those of the sets replaced)
        if held:
            held -= Counter(sw for old in get_all(self._installed, sub.paths) if old is not None
                            for pinned in old.rules for sw, _ in pinned)
        sets, report = self.steer_plan(sub, self._weight, held, reuse=True, ends=ends)
        plan.paths.update(sub.paths)
        for k in sub.paths:
            self._spilled.pop(k, None)
        self._spilled |= report.spilled
        return sets, report

    def _sync_load_rows(self) -> None:
        """Make the dense copy of the plan's load (by link id) from its dict again (none if
        there is no plan or the link ids are not dense)."""
        self._load_rows = None
        cap = self._dense_capacity()
        if self.current is None or not len(cap):
            return
        load = self.current.link_load_gbps
        ids = np.fromiter(load, np.int64, len(load))
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(cap)):
            return
        rows = np.zeros(len(cap))
        rows[ids] = np.fromiter(load.values(), np.float64, len(ids))
        self._load_rows = rows

    def _forget(self, key: str) -> None:
        """Drop an installed path set the plan no longer has (its job withdrawn, or the
        pair gone from its calls)."""
        self._forget_all([key])

    def _forget_all(self, keys: list[str]) -> None:
        """:meth:`_forget` of every key of ``keys`` (the link index's edits deferred, in
        one batch: a job withdrawn may have had a million pairs)."""
        if self._slots is not None:
            self._slots.mark_stale(keys)
        installed = self._installed
        gone = [k for k in keys if k in installed]
        olds = (installed.pop_all(gone) if isinstance(installed, BatchMap)
                else list(map(installed.pop, gone)))
        if gone:
            self._forgotten.extend(gone)  # (withdrawn from the data plane with the next
            # sets sent: see _withdraw_forgotten)
            held = self._rules_held
            for old in filter(any, map(_RULES, olds)):
                held.subtract(sw for pinned in old for sw, _ in pinned)
            flat, owner = _set_links(olds)
            self._on_link.defer(gone, flat, owner, False)
        for table in (self._demand, self._spilled):
            pop = table.pop
            for k in keys:
                pop(k, None)

    def _withdraw_forgotten(self) -> None:
        """Withdraw from the data plane the path sets forgotten since it was last told
        (:meth:`_forget`): their pairs' traffic goes back to the switches' own forwarding
        and their rules free room."""
        if self._forgotten:
            keys, self._forgotten = self._forgotten, []
            self.dp.remove(keys)

    def _solve(self, demands: Sequence[Demand], background: dict[int, float] | None
               ) -> tuple[Plan, Sequence[PathSet], PlanReport]:
        """Plan and steer (:meth:`_plan_whole`, then :meth:`_steer_whole`)."""
        return self._steer_whole(*self._plan_whole(demands, background), demands, background)

    def _plan_whole(self, demands: Sequence[Demand], background: dict[int, float] | None,
                    ) -> tuple[Plan, _MadeColumns | None]:
        """The planner's plan of ``demands`` (every opted-in job's), and the demand columns
        :meth:`demands` made them with, if it did (for :meth:`_steer_whole`)."""
        made = self._demand_cols
        self._demand_cols = None
        if made is not None and made[0] is not demands:
            made = None
        plan = plan_greedy(demands, self._link_values(), background=background,
                           split=self.parts, checkpoint=self._check,
                           stop=self.interrupt.flag if self._may_yield else None,
                           columns=made[1] if made is not None else None, columnar=True,
                           meanwhile=self._index_work(made[1].keys if made is not None
                                                      else None))
        self._index_jobs()
        return plan, made

    def _index_work(self, keys: Sequence[str] | None = None) -> Iterator[None] | None:
        """What to do while the planner's worker thread compiles the candidates and places
        the demands, if anything, in steps of a few ms, as far as the placement leaves time
        (the planner drops the steps left; see :meth:`_index_jobs`): make the demands'
        keys (``keys``, if not made yet: :mod:`~fabricpilot.controller.keys`), a call's at a
        time; then, a job at a time, the dict of each job's keys (a heal looks a few hundred
        keys up, which the dict finds in a third of the time a table of the job's pairs
        does; 6 ms per 65 280 keys)."""
        table = self._demand
        jobs = table if isinstance(table, JobDemands) else None
        if not unmade(keys) and (jobs is None or all(
                t.for_many for t in jobs.tables.values() if isinstance(t, DemandTable))):
            return None

        def work() -> Iterator[None]:
            if keys is not None:
                yield from key_steps(keys)
            if jobs is not None:
                for job in jobs.tables.values():
                    if isinstance(job, DemandTable):
                        job.rows_for_many()
                        yield

        return work()

    def _index_jobs(self) -> None:
        """The jobs' key indexes a plan's :meth:`_index_work` did not make before its
        placement was done, as tables of their pairs (a few ms in all: a heal does not make
        them)."""
        if isinstance(self._demand, JobDemands):
            self._demand.index()

    def _steer_whole(self, plan: Plan, made: _MadeColumns | None, demands: Sequence[Demand],
                     background: dict[int, float] | None,
                     ) -> tuple[Plan, Sequence[PathSet], PlanReport]:
        """Steer a whole plan (:meth:`_plan_whole`). If some planned paths could be neither
        reached by entropy nor pinned (full rule tables), plan again with those demands
        restricted to the paths entropy reaches, which frees rules for the others, and keep
        whichever of the two loads the fabric less once every path is the one its QP really
        takes."""
        cap = self._link_values()
        check = self._check
        stop = self.interrupt.flag if self._may_yield else None
        sets, report = self.steer_plan(plan, self._weight,
                                       ends=(made[1].keys, made[2]) if made is not None
                                       and made[2] is not None else None)
        check()
        if not report.spilled:
            return plan, sets, report
        narrowed = self._entropy_only(demands, report.spilled)
        plan2 = plan_greedy(narrowed, cap, background=background, split=self.parts,
                            checkpoint=check, stop=stop)
        sets2, report2 = self.steer_plan(plan2, self._weight)
        check()
        rate = {d.key: d.rate_gbps for d in demands}
        bg = background or {}
        if (self._fabric_lambda(_set_load(sets2, rate), bg)
                <= self._fabric_lambda(_set_load(sets, rate), bg)):
            return plan2, sets2, report2
        return plan, sets, report

    def _entropy_only(self, demands: Sequence[Demand], keys: set[str]) -> Sequence[Demand]:
        """``demands``, those of ``keys`` with only the candidates some source port reaches
        without a rule (all of them if none is); their candidates are steered together."""
        todo = [i for i, d in enumerate(demands) if d.key in keys]
        requests: list[SteerRequest] = []
        fulls = []
        for i in todo:
            d = demands[i]
            a, b = pair_of_key(d.key)
            fulls.append(full := d.full_candidates)
            requests.extend(SteerRequest(a, b, p, c) for c, p in enumerate(full))
        if not requests:
            return demands
        got = iter(steer(self.view, requests, max_tries=self.params.steer_tries,
                         table=self._steering_table()))
        out = list(demands)
        for i, full in zip(todo, fulls, strict=True):
            free = tuple(p for p in full if not next(got).rules)
            if free:
                out[i] = demands[i]._replace(candidates=free, head=(), tail=())
        return out

    def _install(self, plan: Plan, sets: Sequence[PathSet], report: PlanReport, n_demands: int,
                 background: dict[int, float] | None = None) -> PlanReport:
        """Install a whole plan's sets and make it the current plan, its lambda that of the
        fabric links (with ``background``), as heals and plans of single jobs give it (the
        planner's, over every link it was given, NIC links too, stays in ``extra``)."""
        plan.extra["lambda_all_links"] = plan.max_utilization
        plan.max_utilization = self._fabric_lambda(plan.link_load_gbps, background or {})
        installed = self._installed
        made_at, self._made_at = self._made_at, None
        changed: Sequence[PathSet] | None = None
        held = -1
        fresh = made_at[1] if made_at is not None and made_at[0]() is plan else None
        if (isinstance(sets, PathSetBatch) and isinstance(installed, BatchMap)
                and len(installed)):
            # (the sets made anew, or all: compared column to column with the installed
            # batch, the changed ones sent as a batch of their own)
            at = made_at[2] if fresh is not None and made_at is not None else None
            if at is None:
                at = self._batch_rows(sets.keys, installed)
            idx = (np.array(fresh, np.int64) if fresh is not None
                   else np.arange(len(sets), dtype=np.int64))
            got = _changed_rows(sets, idx, at[idx], installed)
            if got is not None:
                rows = idx[got[0]]
                if len(rows) != len(sets):
                    sets_keys, caps = sets.keys, sets.caps
                    changed = _merged_batch(
                        sets, rows, _NO_SETS, [sets_keys[i] for i in rows.tolist()],
                        [caps[i] for i in rows.tolist()])
                else:
                    changed = sets
                if fresh is not None:
                    held = len(sets) - len(fresh) + got[1]
        if changed is None and fresh is not None:
            # (steering kept the other sets: the installed ones themselves, unchanged)
            made = [sets[i] for i in fresh]
            changed = _changed_sets(made, installed)
            # (the installed keys the plan has: the kept ones, and the made ones installed
            # before; all of them, if as many as the installed keys)
            held = len(sets) - len(made) + sum(1 for r in made if r.key in installed)
        elif changed is None:
            changed = _changed_sets(sets, installed)
        # the sets of pairs this plan no longer has (jobs gone or not planned now) are
        # withdrawn first: their rules free room for the new ones
        if installed and held != len(installed):
            planned = set(sets.keys if isinstance(sets, PathSetBatch) else map(_KEY, sets))
            self._forgotten.extend(k for k in installed if k not in planned)
        self._withdraw_forgotten()
        self.dp.install(changed)
        # (the plan's own link arrays index the sets, if every path is the plan's: no path
        # was left to its hash, and every key of the plan has a set, none kept as room; they
        # are dropped then, being the plan's paths' only)
        links, plan.key_links = plan.link_index(), None
        if len(sets) != len(plan.paths):
            links = None
        self._record_all(sets, rules=report.pinned > 0,
                         links=links if not report.unpinned else None)
        self._steered_whole = True
        parts, plan.parts = plan.parts, None  # (the table keeps what it needs of it)
        steered, self._steered_ends = self._steered_ends, None
        if (parts is not None and links is not None and not report.unpinned
                and steered is not None and steered[0]() is plan):
            ends = steered[1]
            if isinstance(sets, PathSetBatch) and isinstance(self._demand, JobDemands):
                # (the batch's keys are every job's, job after job, as a rule: each one's
                # row found through its job's table, no index of a million keys made)
                found = self._demand.rows_of(sets.keys)
                if found is not None:
                    sets.use_rows(found)
            self._slots = SlotTable.of(parts, sets, ends[:, 0], ends[:, 1], keys=links.keys)
        rows = plan.paths.batch if isinstance(plan.paths, BatchMap) else None
        if isinstance(rows, PathRows) and isinstance(sets, PathSetBatch) and (
                rows.keys is sets.keys or rows.keys == sets.keys):
            rows.share_rows(sets)  # (the plan's keys are the batch's: one row index)
        self.current = plan
        self._note_planned()
        self._links_changed = False
        self._spilled = dict(report.spilled)
        self._sync_load_rows()
        report.demands = n_demands
        report.installed = len(changed)
        return report

    def _shunned(self) -> set[int]:
        """The links planned traffic keeps off unless it has no other way: dead, gray, and
        back up since a known time but not yet for ``link_up_holddown_ns`` (a flapping link
        would lose what a plan or a heal put on it at its next down; a link back at a time
        not known, with no clock, is given back at the next control period)."""
        return self.down | self.degraded | {
            lk for lk, since in self._up_since.items() if since is not None}

    def _live(self, d: Demand, avoid: frozenset[int]) -> Demand | None:
        """``d`` on its candidates that avoid ``avoid`` (gray links too, unless only paths
        through them remain), or ``None`` if every candidate crosses a dead link. Demands
        sharing a candidate tuple share the filtering (cached per tuple and link set)."""
        if not avoid.isdisjoint(d.head) or not avoid.isdisjoint(d.tail):
            full = d.full_candidates
            live = tuple(p for p in full if avoid.isdisjoint(p)) or tuple(
                p for p in full if self.down.isdisjoint(p))
            return (Demand(d.key, d.rate_gbps, live, d.weight, whole=d.whole,
                           priority=d.priority, parts=d.parts) if live else None)
        live = self._live_mids(d.candidates, avoid)
        if not live:
            return None
        # (d was checked when made, and its live candidates are not empty)
        return _demand(d.key, d.rate_gbps, live, d.weight, d.head, d.tail, d.whole,
                       d.priority, d.parts)

    def _live_mids(self, mids: tuple[tuple[int, ...], ...], avoid: frozenset[int]
                   ) -> tuple[tuple[int, ...], ...]:
        """The switch paths of ``mids`` that avoid ``avoid`` (if none does, those that avoid
        the dead links: a gray link beats none), ``()`` if every one crosses a dead link;
        cached per tuple for the links avoided now, so that demands sharing a tuple share its
        filtering (and one object: the planner reads a tuple once)."""
        if avoid is not self._live_for and avoid != self._live_for:  # (other links now)
            self._live_cache.clear()
            self._live_for = avoid
        key = (id(mids), avoid)
        hit = self._live_cache.get(key)
        if hit is None or hit[0] is not mids:
            live = tuple(p for p in mids if avoid.isdisjoint(p)) or tuple(
                p for p in mids if self.down.isdisjoint(p))
            if len(live) == len(mids):  # (none avoided: the tuple itself, which the
                live = mids             # caches by identity and the plan's columns know)
            hit = self._live_cache[key] = (mids, live)
        return hit[1]

    def _take_out(self, keys: list[str]) -> None:
        """Take the planned paths of ``keys`` (each with a demand) out of the current plan,
        and their load out of its load."""
        assert self.current is not None
        load, paths, demand = self.current.link_load_gbps, self.current.paths, self._demand
        if not keys:
            return
        shares = (paths.pop_all(keys) if isinstance(paths, BatchMap)
                  else list(map(paths.pop, keys)))
        n_sh = np.fromiter(map(len, shares), np.int64, len(keys))
        ps, ws = zip(*_chain(shares), strict=True) if int(n_sh.sum()) else ((), ())
        plen, links = flatten_paths([ps])[1:]
        rate = np.fromiter((demand[k].rate_gbps for k in keys), np.float64, len(keys))
        out = np.repeat(np.repeat(rate, n_sh) * np.array(ws, np.float64), plen)
        ids, at = np.unique(links, return_inverse=True)
        ids_l = ids.tolist()
        now = np.array(list(map(load.__getitem__, ids_l)), np.float64)
        np.subtract.at(now, at, out)  # (in order, as one link at a time: the same sums)
        load.update(zip(ids_l, now.tolist(), strict=True))

    def _links_of(self, demands: list[Demand]) -> set[int]:
        """The links the candidates of ``demands`` can take (each candidate tuple read once:
        a job's pairs of one leaf pair share theirs)."""
        used = set(_chain(map(_HEAD, demands)))
        used.update(_chain(map(_TAIL, demands)))
        tuples = list({id(c): c for c in map(_CANDIDATES, demands)}.values())
        if tuples:  # (flattened as the planner flattens them, kept for it by identity)
            used.update(distinct(planner._flat_tuples(tuples)[2]).tolist())
        return used

    def _record(self, sets: Sequence[PathSet]) -> None:
        """Remember installed path sets, indexed by link, with their explicit rules (the
        link index's edits deferred, in two batches: the links of the sets replaced out,
        then those of the new ones in)."""
        keys = list(map(_KEY, sets))
        if self._slots is not None:
            self._slots.mark_stale(keys)
        installed = self._installed
        self._note_sets_changed()
        olds = get_all(installed, keys)
        held = self._rules_held
        # (a set without a rule changes no count)
        for old in filter(any, map(_RULES, filter(None, olds))):
            held.subtract(sw for pinned in old for sw, _ in pinned)
        for rules in filter(any, map(_RULES, sets)):
            held.update(sw for pinned in rules for sw, _ in pinned)
        replaced = [i for i, old in enumerate(olds) if old is not None]
        if replaced:
            flat, owner = _set_links([olds[i] for i in replaced])  # type: ignore[misc]
            self._on_link.defer(keys, flat, np.array(replaced, np.int64)[owner], False)
        self._on_link.defer(keys, *_set_links(sets), True)
        installed.update(zip(keys, sets, strict=True))

    def _record_moves(self, sets: list[PathSet],
                      moves: list[tuple[str, set[int], set[int]]]) -> None:
        """:meth:`_record` of sets already installed whose links changed as ``moves`` say
        (key, links it no longer uses, links it now uses; in the order of ``sets``)."""
        installed, move = self._installed, self._on_link.move
        self._note_sets_changed()
        held = self._rules_held
        some_held = bool(+held)  # (none held: no old set has a rule)
        for r, (key, gone, taken) in zip(sets, moves, strict=True):
            move(key, gone, taken)
            if some_held:
                old = installed[key]
                if any(old.rules):
                    held.subtract(sw for pinned in old.rules for sw, _ in pinned)
            if any(r.rules):
                held.update(sw for pinned in r.rules for sw, _ in pinned)
            installed[key] = r

    def _note_sets_changed(self) -> None:
        """Take note that installed sets were set or deleted other than by a whole plan's
        steering (a heal, a job planned by itself, sets adopted). Held as one batch, the
        installed sets know which keys changed since (:meth:`BatchMap.changed_keys`), and a
        re-plan still keeps the others (:meth:`steer_plan`): a heal at 8192 GPUs would
        otherwise have the next plan steer and compare a million sets again. Held as a
        dict, they do not: no set is kept until the next whole plan."""
        if not isinstance(self._installed, BatchMap):
            self._steered_whole = False

    def _record_all(self, sets: Sequence[PathSet], rules: bool = True,
                    links: KeyLinks | None = None) -> None:
        """Remember ``sets`` as all the installed path sets (forgetting the others), as
        :meth:`_record` does from empty, in bulk: the keys per link are indexed by one sort.
        ``rules=False`` says that no set has an explicit rule; ``links``, if given, are the
        links of the sets' paths (read from them otherwise)."""
        if isinstance(sets, PathSetBatch):  # (held as the batch: its sets made as read)
            self._installed = BatchMap(sets, sets.__getitem__)
            self._rules_held = Counter(sets.rule_switches()) if rules else Counter()
        else:
            self._installed = dict(zip(map(_KEY, sets), sets, strict=True))
            self._rules_held = (Counter(sw for sw, _ in _chain(_chain(r.rules for r in sets)))
                                if rules else Counter())
        self._steered_whole = False  # (a whole plan's install says so after)
        self._slots = None  # (a whole plan's sets make one: see _install)
        self._on_link = (_KeysByLink.of(sets) if links is None else
                         _KeysByLink(links.links, links.ptr, links.owner, links.keys))

    def link_users(self, link: int) -> dict[str, tuple[int, float]]:
        """Who the installed plan puts on ``link``: per job, the GPU pairs with a path
        through it and the Gb/s planned on it (each pair's rate times the shares of its
        paths that cross it), heaviest first. What to ask before draining a link.

        >>> from fabricpilot.controller.intents import CommCall
        >>> from fabricpilot.controller.southbound import LinkInfo
        >>> class DP:
        ...     def fabric(self): return FabricView.from_links(
        ...         [LinkInfo(0, "g0", "s", 100, 1, "nic"), LinkInfo(1, "s", "g1", 100, 1, "nic")],
        ...         {"g0": "gpu", "g1": "gpu", "s": "switch"}, {}, {0: "g0", 1: "g1"})
        ...     def install(self, rules): pass
        >>> ctl = Controller(DP())
        >>> ctl.declare(Intent("j", "t", (0, 1), (CommCall("broadcast", 1 << 20, 500.0, 0,
        ...                                                  pairs=((0, 1),)),)))
        >>> _ = ctl.plan()
        >>> ctl.link_users(1), ctl.link_users(5)
        ({'j': (1, 100.0)}, {})
        """
        out: dict[str, list[float]] = {}
        for key in self._on_link.get(link, set()):
            ps, d = self._installed.get(key), self._demand.get(key)
            if ps is None:
                continue
            share = sum(w for p, w in zip(ps.paths, ps.weights, strict=True) if link in p)
            if not share:
                continue
            task = task_of_key(key)
            acc = out.setdefault(task, [0, 0.0])
            acc[0] += 1
            acc[1] += share * (d.rate_gbps if d is not None else 0.0)
        return {t: (int(n), gbps) for t, (n, gbps) in
                sorted(out.items(), key=lambda kv: (-kv[1][1], kv[0]))}

    def background_gbps(self, floor: float = 0.05) -> dict[int, float]:
        """Measured load the current plan does not account for, on the fabric links (the
        switch-to-switch links a plan can route around): the smoothed utilisation of the
        congestion map times capacity, less the load planned while it was measured (the
        plan in force since the control period before: a plan installed since then, for a
        declaration, is not in the counters yet), where that exceeds ``floor`` of the link
        (traffic of jobs that did not declare, mice, or declared jobs sending more than they
        said). A saturated link shows at most its capacity, so this is a lower bound there;
        the re-plan is still triggered, by the link it saturates.

        >>> from fabricpilot.controller.southbound import LinkInfo, PortDelta
        >>> class DP:
        ...     def fabric(self): return FabricView.from_links(
        ...         [LinkInfo(0, "a", "b", 400, 1)], {"a": "switch", "b": "switch"}, {}, {})
        >>> ctl = Controller(DP())
        >>> ctl.map.update([PortDelta(0, 1000, tx_bytes=25_000)])  # 200 Gb/s
        >>> ctl.background_gbps()
        {0: 200.0}
        """
        planned = (self._load_measured if self._load_measured is not None else
                   self.current.link_load_gbps if self.current else {})
        ids, util = self.map.utilization_array()
        fabric, cap = self._map_links(ids)
        # (an idle link has no load beyond the plan's, if the floor is not below zero)
        at = np.flatnonzero(fabric & (util > 0.0) if floor >= 0 else fabric)
        at_l = ids[at].tolist()
        extra = util[at] * cap[at] - np.fromiter(map(planned.get, at_l, itertools.repeat(0.0)),
                                                 np.float64, len(at_l))
        keep = np.flatnonzero(extra > floor * cap[at])
        return dict(zip(ids[at[keep]].tolist(), extra[keep].tolist(), strict=True))

    def _map_links(self, ids: NDArray[np.int64]) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
        """Of the congestion map's links ``ids`` (in its order), which are fabric links and
        their capacities (Gb/s) (made once)."""
        if self._fabric_rows is None or not np.array_equal(self._fabric_rows[0], ids):
            links, ids_l = self.view.links, ids.tolist()
            self._fabric_rows = (ids, np.array([links[lk].kind == "fabric" for lk in ids_l],
                                               np.bool_),
                                 np.array([float(links[lk].capacity_gbps) for lk in ids_l],
                                          np.float64))
        return self._fabric_rows[1], self._fabric_rows[2]

    def _fabric_caps(self) -> NDArray[np.float64]:
        """Capacity (Gb/s) by link id, infinite for links that are not fabric links (made
        once; the dense capacity must exist)."""
        if self._fabric_cap is None:
            cap = self._dense_capacity()
            fabric = np.zeros(len(cap), bool)
            fabric[[lk for lk, li in self.view.links.items() if li.kind == "fabric"]] = True
            self._fabric_cap = np.where(fabric, cap, np.inf)
        return self._fabric_cap

    def _fabric_lambda(self, load: Mapping[int, float], bg: Mapping[int, float]) -> float:
        """Largest utilisation of a fabric link under ``load`` plus ``bg`` (Gb/s)."""
        cap = self._dense_capacity()
        if len(cap) and not bg:  # (vectorised: a plan's load covers every link)
            ids = np.fromiter(load, np.int64, len(load))
            if not len(ids):
                return 0.0
            if int(ids.min()) >= 0 and int(ids.max()) < len(cap):
                vals = np.fromiter(load.values(), np.float64, len(ids))
                return max(float((vals / self._fabric_caps()[ids]).max()), 0.0)
        links = self.view.links
        return max(((bg.get(lk, 0.0) + load.get(lk, 0.0)) / links[lk].capacity_gbps
                    for lk in set(bg) | set(load) if links[lk].kind == "fabric"), default=0.0)

    # --------------------------------------------------------------- failures
    def on_links_changed(self, down: list[int], up: list[int],
                         now_ns: float | None = None) -> HealReport:
        """Links went down (or came back): the switches get the congestion table with the
        dead links excluded at once, and the QPs whose path crosses one move: each share on
        a dead path goes to its least loaded live candidate (of the candidates the plan was
        compiled on: :attr:`Plan.columns`), against the load of everything else, spread over
        ``parts`` paths if moving it whole would load a link past the plan's lambda; the
        other QPs of the pair keep their path and source port, and only the new paths are
        steered. The rest of the plan stays: the cost grows with the traffic on the failed
        link, not with the fabric. A pair left without a path reports its job
        :attr:`partitioned`; when links come back, such jobs are planned again
        (:meth:`plan_jobs`), and the others get traffic on them from a whole plan weighed
        once they have stayed up ``link_up_holddown_ns`` (see :meth:`tick`), counted from
        ``now_ns`` (the clock :meth:`tick` is given) if known, else from the next period."""
        self.down |= set(down)
        self.down -= set(up)
        for lk in down:
            self._up_since.pop(lk, None)
        self._up_since.update(dict.fromkeys(up, now_ns))
        self._links_changed |= bool(down)
        # the links back: the switches may use them again (they excluded them while
        # down), in the heal's one table push
        report = self._heal("down" if down else "up", set(up) - self.down)
        self._move_room()
        # jobs cut off may have a path again: plan them (those still cut stay reported)
        if (up and self.partitioned and self.current is not None
                and self.plan_jobs(set(self.partitioned)) is None):
            self.plan()
        return report

    def on_links_degraded(self, links: list[int]) -> HealReport:
        """Gray links confirmed: planned traffic moves off them before they fail (they stay
        usable for everything else, at a low congestion-table weight)."""
        self.degraded |= set(links)
        self._links_changed = True
        report = self._heal("gray")
        self._move_room()
        return report

    def restore_links(self, down: set[int], degraded: set[int], *,
                      ports_down: set[int] | frozenset[int] = frozenset(),
                      gray_by_counters: set[int] | frozenset[int] = frozenset()) -> None:
        """Take back the link state an earlier run of the controller knew (after a restart,
        before the first plan): the links ``down`` and gray (``degraded``), those of them
        their switches reported down (``ports_down``: a port reported up again brings such
        a link back) and those gray by their error counters (``gray_by_counters``:
        restored by clean counters, with ``gray_clear_ns``). The others stay as they are
        until an operator says otherwise."""
        self.down = set(down)
        self.degraded = set(degraded)
        self._port_up = dict.fromkeys(ports_down & self.down, False)
        self._gray_by_counters = set(gray_by_counters) & self.degraded

    def on_links_restored(self, links: list[int]) -> None:
        """Gray links repaired (their error counters clean again): usable as any link, at
        their congestion-table weight, from the next table pushed. A link change: a control
        period weighs a whole plan (if a fabric link is hot), which may give them planned
        traffic again."""
        self.degraded.difference_update(links)
        self._gray_by_counters.difference_update(links)
        self._links_changed = True

    def _table(self, links: set[int] | None = None) -> dict[int, float]:
        """The congestion table (of ``links`` only, if given): the map's weights, gray
        links at most 0.05, dead links 0, and links back up 0 until they have stayed up
        ``link_up_holddown_ns`` (the switches' own adaptation must not pull traffic back
        onto a flapping link either: the tables pushed after the hold-down give it)."""
        table = (self.map.congestion_table() if links is None
                 else {lk: self.map.weight(lk) for lk in links})
        # (the room kept for jobs whose SLA is unmet: their own load does not count there,
        # or the switches would route them out of it)
        for lk, gbps in self._room_gbps().items():
            if lk in table:
                table[lk] = self.map.weight(lk, gbps)
        held = set(self._up_since)
        gray, dead = ((self.degraded, self.down | held) if links is None
                      else (self.degraded & links, (self.down | held) & links))
        for lk in gray:
            table[lk] = min(table.get(lk, 1.0), 0.05)
        for lk in dead:
            table[lk] = 0.0
        return table

    def _room_gbps(self) -> dict[int, float]:
        """Per link, the load (Gb/s) the current plan keeps room for on it for jobs whose
        SLA is unmet (:meth:`_reservations`); made once per plan."""
        plan = self.current
        if not self._reserved or plan is None:
            return {}
        hit = self._room
        if hit is not None and hit[0] is plan and hit[1] is self._reserved:
            return hit[2]
        room: dict[int, float] = {}
        paths, demand = plan.paths, self._demand
        for key in self.reserved_keys:
            d, shares = demand.get(key), paths.get(key)
            if d is None or shares is None:
                continue
            for path, w in shares:
                for lk in path:
                    room[lk] = room.get(lk, 0.0) + d.rate_gbps * w
        self._room = (plan, self._reserved, room)
        return room

    def _move_room(self) -> None:
        """After a heal: the room kept for jobs whose SLA is unmet (:meth:`_reservations`)
        on links now dead or gray goes to live candidates, placed around the rest of the
        plan as :meth:`plan_jobs` places a job, so that the plan's load says where that
        traffic can go now (the switches route it off those links at once); a pair with
        no live path keeps no room."""
        plan = self.current
        if not self._reserved or plan is None:
            return
        avoid = frozenset(self._shunned())
        paths, demand = plan.paths, self._demand
        # (a kept pair no longer planned has nothing to move)
        moving = sorted(k for k in self.reserved_keys if k in paths and k in demand and any(
            not avoid.isdisjoint(p) for p, _ in paths[k]))
        if not moving:
            return
        self._take_out(moving)
        fresh = [live for live in (self._live(demand[k], avoid) for k in moving)
                 if live is not None]
        if fresh:
            self._place_around(fresh, self._links_of(fresh))
        plan.max_utilization = self._fabric_lambda(plan.link_load_gbps, {})
        self._room = None  # (the plan is the same object, its room elsewhere now)
        self._sync_load_rows()

    def _heal(self, cause: str, back: set[int] | frozenset[int] = frozenset()
              ) -> HealReport:
        """Move the planned shares on a dead or gray link (see :meth:`on_links_changed`);
        ``back``: links that came back, whose entries the table pushed first carries too."""
        t0 = time.perf_counter()
        with _gc_paused():  # a collection over the whole plan would cost more than this
            return self._heal_from(cause, t0, back)

    def _heal_from(self, cause: str, t0: float, back: set[int] | frozenset[int] = frozenset()
                   ) -> HealReport:
        """:meth:`_heal`, started at ``t0`` (``time.perf_counter``)."""
        # the switches exclude dead links (and shun gray ones) at once, and take back the
        # links up again: only those entries
        self.dp.push_congestion_table(self._table(self.down | self.degraded | back))
        avoid = self._shunned()
        if self.current is None:
            return HealReport(cause, 0, 0, time.perf_counter() - t0)
        plan = self.current
        cols, rows = plan.columns, self._load_rows
        in_columns = (cols is not None and rows is not None and len(cols.links) == len(rows)
                      and int(cols.links[-1]) == len(rows) - 1)  # (link ids 0 .. n - 1: rows)
        # the keys on the links avoided: as rows of the slot table if it knows them all
        t_rows = self._affected_rows(avoid) if in_columns else None
        affected = ([] if t_rows is not None else
                    sorted(set().union(*(self._on_link.get(lk, set()) for lk in avoid))))
        if not (len(t_rows) if t_rows is not None else affected):
            # (no planned path on them; QPs left to their hash may be)
            rehashed = self._rehash_spilled(set())
            if rehashed:
                self.dp.install(rehashed)
                self._record(rehashed)
            rep = HealReport(cause, len(rehashed), len(rehashed), time.perf_counter() - t0)
            self.heals.append(rep)
            return rep
        if in_columns:
            assert cols is not None and rows is not None
            fast = self._heal_in_columns(cause, t0, affected, t_rows, cols, rows)
            if fast is not None:
                return fast
            if t_rows is not None:  # (the general way reads the keys)
                affected = sorted(set().union(*(self._on_link.get(lk, set())
                                                for lk in avoid)))
        load = plan.link_load_gbps  # updated in place: out with the dead paths, in with new
        avoid_key = frozenset(avoid)
        isdisjoint = avoid_key.isdisjoint
        parts: list[Demand] = []  # one per share of a path set on a dead path
        kept: dict[str, list[tuple[tuple[int, ...], float]]] = {}  # key -> its live shares
        moved: dict[str, list[float]] = {}  # key -> the weights of its dead shares, in order
        movers: list[Demand] = []  # (the demands of the keys with a share moving)
        paths = plan.paths
        live_cache = self._live_cache
        for k in affected:
            d = self._demand.get(k)
            if d is None:  # (a job no longer planned, e.g. cut off: its sets stay as they are)
                continue
            rate = d.rate_gbps
            shares = paths[k]
            # _live(d, avoid_key), its common case inline: NIC links alive, tuple filtered
            hit = (live_cache.get((id(d.candidates), avoid_key))
                   if isdisjoint(d.head) and isdisjoint(d.tail) else None)
            if hit is not None and hit[0] is d.candidates and hit[1]:
                cands, head, tail = hit[1], d.head, d.tail
            else:
                live = self._live(d, avoid_key)
                if live is None:  # out of the plan, all its load out: reported
                    for p, w in shares:
                        out = rate * w
                        for lk in p:
                            load[lk] -= out
                    self._cut_off(k)
                    continue
                cands, head, tail = live.candidates, live.head, live.tail
            # only the shares on a dead path move (the others keep their path and QP):
            # each is placed whole on a live candidate, as a demand of its own
            live_shares, dead = [], []
            for p, w in shares:
                if isdisjoint(p):
                    live_shares.append((p, w))
                    continue
                dead.append(w)
                out = rate * w
                for lk in p:
                    load[lk] -= out
            if not dead:  # (indexed on a dead link by a path it no longer has)
                continue
            kept[k] = live_shares
            moved[k] = dead
            for j, w in enumerate(dead):
                parts.append(_demand(f"{k}\x1f{j}", rate * w, cands, d.weight, head, tail,
                                     priority=d.priority))
            movers.append(d)
        # the links of all their candidates (a superset of the live ones' links: those of a
        # tuple are kept across failures, and a dead link among them is harmless)
        used = self._links_of(movers)

        # a share moves whole unless that would load a link well beyond the plan's lambda
        # (at least 100 %): then it goes as ``parts`` equal QPs (as the compiled way does)
        parts, pieces, placed = self._spread_parts(
            parts, used, max(1.0, plan.max_utilization) + self.params.heal_spread_over)

        def merge(placed: dict[str, list[tuple[tuple[int, ...], float]]]
                  ) -> dict[str, list[tuple[tuple[int, ...], float]]]:
            """Each moved key's live shares and its dead shares' new paths, merged."""
            out = {}
            for k, dead_w in moved.items():
                acc = dict(kept[k])
                for j, w in enumerate(dead_w):
                    part = f"{k}\x1f{j}"
                    n = pieces.get(part, 1)
                    for q in range(n):
                        for p, f in placed[part if n == 1 else f"{part}\x1e{q}"]:
                            acc[p] = acc.get(p, 0.0) + w * f / n
                out[k] = sorted(acc.items())
            return out

        # only the links the moved shares can use; one greedy pass and one sweep (an
        # emergency answer: the next control period may improve it)
        sets, report = self._place_around(parts, used, merge, placed, split=1, sweeps=1,
                                          max_moves=0)
        rep = self._healed(cause, t0, len(affected), sets, report)
        self._sync_load_rows()
        return rep

    def _spread_parts(self, parts: list[Demand], used: set[int], limit: float
                      ) -> tuple[list[Demand], dict[str, int],
                                 tuple[Plan, list[int], LinkValues] | None]:
        """The heal's ``parts`` (shares of dead paths), each that, moved whole (one greedy
        pass against the plan's load, on the links ``used``), would take a link its
        candidates choose between above ``limit`` (utilisation) replaced by ``parts`` equal
        pieces (keys ``<part key>\x1e<q>``); the pieces per part so replaced; and, if none
        was, that pass (its plan, links and load before: the heal's placement itself,
        for :meth:`_place_around`)."""
        n = self.parts
        if n <= 1 or not parts or self.current is None:
            return parts, {}, None
        ids_l, cap, bg = self._around(used)
        trial = plan_greedy(parts, cap, background=bg, split=1, sweeps=1, max_moves=0)
        added = trial.link_load_gbps
        util = (bg.values + np.array([added.get(lk, 0.0) for lk in ids_l])) / np.where(
            cap.values > 0, cap.values, np.inf)
        fixed = {lk for d in parts for lk in (*d.head, *d.tail)}  # (every candidate's)
        over = {lk for lk, u in zip(ids_l, util.tolist(), strict=True)
                if u > limit and lk not in fixed}
        if not over:
            return parts, {}, (trial, ids_l, bg)
        out: list[Demand] = []
        pieces: dict[str, int] = {}
        for d in parts:
            ((path, _),) = trial.paths[d.key]
            if over.isdisjoint(path):
                out.append(d)
                continue
            pieces[d.key] = n
            out.extend(_demand(f"{d.key}\x1e{q}", d.rate_gbps / n, d.candidates, d.weight,
                               d.head, d.tail, priority=d.priority) for q in range(n))
        return out, pieces, None

    def _cut_off(self, key: str) -> None:
        """The pair ``key`` has no live path left: out of the plan (its load is out
        already) and its job reported :attr:`partitioned`."""
        assert self.current is not None
        a, b = pair_of_key(key)
        self.partitioned[task_of_key(key)] = (
            f"gpu{a} -> gpu{b}: every path crosses a link that is down")
        del self.current.paths[key]
        self._forget(key)

    def _healed(self, cause: str, t0: float, affected: int, sets: list[PathSet],
                report: PlanReport, dense: bool = False,
                record: Callable[[], None] | None = None) -> HealReport:
        """Install a heal's path sets and report it (its wall time from ``t0``); once the
        new paths are out, ``record`` the controller's records of them (:meth:`_record` of
        the sets if not given); then, as bookkeeping, bring the plan's lambda up to date
        (from the dense copy of the load if ``dense``: it is the plan's load now)."""
        rehashed = self._rehash_spilled({s.key for s in sets})
        self.dp.install(sets + rehashed)
        sent_s = time.perf_counter() - t0
        self._withdraw_forgotten()  # (pairs cut off: after the new paths are out)
        if record is None:
            self._record(sets)
        else:
            record()
        self._record(rehashed)
        rep = HealReport(cause, affected, len(sets), time.perf_counter() - t0, report, sent_s)
        self.heals.append(rep)
        plan = self.current
        assert plan is not None
        rows = self._load_rows
        lam = (max(float((rows / self._fabric_caps()).max()), 0.0)
               if dense and rows is not None and len(rows) else
               self._fabric_lambda(plan.link_load_gbps, {}))
        self.current = replace(plan, max_utilization=lam)
        report.plan = self.current
        return rep

    @property
    def left_to_hash(self) -> Mapping[str, int]:
        """The installed path sets with QPs left to their hash (a full rule table: the path
        planned needed a rule no switch had room for), and how many QPs each (read-only)."""
        return MappingProxyType(self._spilled)

    def _rehash_spilled(self, skip: set[str]) -> list[PathSet]:
        """The installed sets (but those of ``skip``, which a heal replaces) with QPs left
        to their hash (a full rule table) whose hash path crosses a link now dead or gray:
        those QPs get a source port whose hash path avoids it (of ``spill_port_tries``, the
        one loading the fabric least; :func:`best_hashed_ports`). The heal of the planned
        paths does not see them: their plan's path is not the one their QPs take."""
        avoid = self._shunned()
        if not avoid or not self._spilled or self.view.ecmp is None:
            return []
        installed, demand = self._installed, self._demand
        todo: list[tuple[str, int, float]] = []  # (key, QP, its Gb/s)
        for k in sorted(self._spilled):
            ps = installed.get(k)
            if k in skip or ps is None or not ps.ports:
                continue
            total = sum(ps.weights)
            rate = demand[k].rate_gbps if k in demand else 0.0
            for i, path in enumerate(ps.paths):
                if not (ps.rules and ps.rules[i]) and not avoid.isdisjoint(path):
                    todo.append((k, i, rate * ps.weights[i] / total if total else 0.0))
        if not todo:
            return []
        load = dict(self.current.link_load_gbps) if self.current is not None else {}
        for k, i, gbps in todo:
            for lk in installed[k].paths[i]:
                if lk in load:
                    load[lk] -= gbps
        ends = [pair_of_key(k) for k, _, _ in todo]
        ports, paths = best_hashed_ports(
            self.view, [a for a, _ in ends], [b for _, b in ends],
            [installed[k].ports[i] for k, i, _ in todo],
            [g for _, _, g in todo], load, self._link_capacity(), avoid,
            tries=self.params.spill_port_tries)
        edits: dict[str, tuple[list[tuple[int, ...]], list[int]]] = {}
        for (k, i, _), port, path in zip(todo, ports, paths, strict=True):
            ps = installed[k]
            new_paths, new_ports = edits.setdefault(k, (list(ps.paths), list(ps.ports)))
            new_paths[i], new_ports[i] = path, port
        return [installed[k]._replace(paths=tuple(ps_), ports=tuple(pt))
                for k, (ps_, pt) in edits.items()]

    def _affected_rows(self, avoid: set[int]) -> NDArray[np.int64] | None:
        """The keys on the links ``avoid`` as rows of the slot table, in key order, if it
        knows them all and no GPU link is avoided (the table's shares are those of the
        candidates: a dead head or tail link is read from the sets); ``None`` otherwise."""
        slots, idx = self._slots, self._on_link
        if (slots is None or idx._keys is not slots.keys  # (the index counts in its rows)
                or not avoid.isdisjoint(self._gpu_links)):
            return None
        found = []
        for lk in avoid:
            rows, unknown = idx.rows_on(lk, slots.row_of)
            if unknown:
                return None
            found.append(rows)
        rows = distinct(np.concatenate(found)) if found else np.zeros(0, np.int64)
        return rows[np.argsort(slots.rank[rows], kind="stable")]

    def _heal_in_columns(self, cause: str, t0: float, affected: list[str],
                         t_rows: NDArray[np.int64] | None, cols: Columns,
                         rows: NDArray[np.float64]) -> HealReport | None:
        """:meth:`_heal_from` on the candidate structure the plan was made on: each share
        on a dead path is placed again by :func:`replace_parts` (one compiled pass over its
        candidates, dead ones masked) against the dense load, nothing compiled again; the
        other shares keep their path and QP, only the new paths are steered (if the data
        plane forwards path sets by rules alone, the sets carry no ports). Returns ``None``,
        having changed nothing, if an affected demand is not in ``cols`` (planned by itself
        since), has a dead NIC link or a path left to its hash: the general way does
        those. The keys are ``affected`` (in key order), or if ``t_rows`` is given, those
        rows of the slot table (in key order): the table gives the shares of the rows it
        still describes, the others are read from their sets."""
        plan = self.current
        assert plan is not None
        n_keys = len(t_rows) if t_rows is not None else len(affected)
        down = np.zeros(len(rows), np.bool_)
        down[list(self.down)] = True
        avoid_rows = down.copy()
        avoid_rows[list(self._shunned())] = True
        found = self._dead_shares(affected, t_rows, cols, avoid_rows)
        if found is None:
            return None
        read, (f_pos, f_rows), sh = found
        left, per_mid = sh.links, np.diff(sh.ptr)
        # each share's load out of the dense copy
        np.add.at(rows, left, np.repeat(-sh.gbps, per_mid))
        # heaviest first (as a plan places parts), ties in key order
        order = np.argsort(-sh.weight * sh.gbps, kind="stable")
        # a share moves whole unless that would load a link well beyond the plan's lambda
        # (at least 100 %): then it goes as ``parts`` equal QPs, each to its least loaded path
        limit = max(1.0, plan.max_utilization) + self.params.heal_spread_over
        placed = replace_parts(cols, sh.grp, sh.tup, sh.gbps, order, self._dense_capacity(),
                               rows, down, avoid_rows, spread=self.parts, limit=limit)
        # each moving key's shares are a run of sh (key order, then slot order)
        run0 = (np.flatnonzero(np.r_[True, sh.pos[1:] != sh.pos[:-1]]) if len(sh.pos)
                else np.zeros(0, np.int64))
        run_n, run_pos = np.diff(np.r_[run0, len(sh.pos)]), sh.pos[run0]
        at = np.searchsorted(run_pos, f_pos)
        f_s0, f_n = run0[at], run_n[at]
        # most keys of the table have one dead share, which goes whole to a candidate they
        # do not use yet: those sets are made in columns, the others key by key
        to = placed[f_s0, 0]
        whole = (f_n == 1) & (to >= 0)
        if placed.shape[1] > 1:
            whole &= placed[f_s0, 1] < 0
        slots = self._slots
        moved: WholeMoves | None = None
        if whole.any():
            assert slots is not None
            whole[whole] = slots.whole(f_rows[whole], sh.grp[f_s0[whole]], to[whole], cols)
            w = np.flatnonzero(whole)
            moved = slots.move_whole(f_rows[w], sh.slot[f_s0[w]], sh.grp[f_s0[w]], to[w], cols)
        rest = np.flatnonzero(~whole)
        s0_read = run0[np.searchsorted(run_pos, np.array([i for i, _ in read], np.int64))]
        todo = [*zip(s0_read.tolist(), [e for _, e in read], strict=True),
                *zip(f_s0[rest].tolist(), self._table_moving(f_rows[rest], f_s0[rest],
                                                             f_n[rest], sh), strict=True)]
        todo.sort(key=lambda e: e[0])  # (runs are in key order)
        edits = self._edit_sets(todo, placed.tolist(), cols.g_disjoint.tolist(), rows)
        # links whose load changed: the plan's dict takes their dense value
        edits.touched = [left, *edits.touched, *([moved.taken] if moved is not None else [])]
        steered = self.view.ecmp is not None
        ports: list[int] = []
        rules: dict[int, tuple[tuple[str, int], ...]] = {}
        if steered and (edits.new or moved is not None):
            ports, rules = self._steer_new(edits.new, moved)
        if rules:  # a new path needs a rule: steer_plan weighs the switches' rule budgets
            self._settle_load(edits)
            now = {k: list(zip(ps, ws, strict=True)) for k, ps, ws, _, _ in edits.now}
            if moved is not None:
                now.update((k, list(zip(ps, old.weights, strict=True)))
                           for k, ps, old in zip(moved.keys, moved.all_paths(), moved.olds,
                                                 strict=True))
            sets, report = self._steer_in(Plan(now, {}, 0.0))
            return self._healed(cause, t0, n_keys, sets, report)
        sets = []
        n_paths = pinned = 0
        any_rules = bool(+self._rules_held)
        installed = self._installed  # (the sets being replaced: their rate caps stay)
        for k, ps, ws, pts, rls in edits.now:
            sets.append(PathSet(k, ps, ws, tuple(pts), rls,
                                getattr(installed.get(k), "rate_cap_gbps", math.inf)))
            n_paths += len(ps)
            if any_rules:
                pinned += sum(1 for r in rls if r)
        whole_sets: list[PathSet] = []
        if moved is not None:
            assert slots is not None
            whole_sets = _whole_sets(moved, ports, steered, any_rules)
            n_paths += int(slots.count[moved.rows].sum())
            if any_rules:
                pinned += sum(1 for r in _chain(s.rules for s in whole_sets) if r)
        report = (PlanReport(plan, len(sets) + len(whole_sets), 0, n_paths - pinned, pinned,
                             0)
                  if steered
                  else PlanReport(plan, len(sets) + len(whole_sets), 0))  # (as steer_plan
        # reports rules alone)
        rep = self._healed(cause, t0, n_keys, sets + whole_sets, report, dense=True,
                           record=functools.partial(self._settle_sets, edits, sets, moved,
                                                    whole_sets))
        report.switch_rules = dict(+self._rules_held)
        return rep

    def _dead_shares(self, affected: list[str], t_rows: NDArray[np.int64] | None,
                     cols: Columns, avoid_rows: NDArray[np.bool_],
                     ) -> tuple[list[tuple[int, _Moving]],
                                tuple[NDArray[np.int64], NDArray[np.int64]],
                                DeadShares] | None:
        """The shares on a dead path of the keys a heal reads (``affected``, or the slot
        table's rows ``t_rows``; see :meth:`_heal_in_columns`): of each key with one that
        is read from its set, its position (among the keys read) and entry, in key order;
        of those the table describes, their positions and rows, in key order; and every
        such share, in key then slot order, with its candidate links (those whose load it
        moves). ``None`` if a key does not qualify (nothing is changed)."""
        avoid = frozenset(self._shunned())
        isdisjoint = avoid.isdisjoint
        demand, find, installed, spilled = (
            self._demand, cols.tuple_of.get, self._installed, self._spilled)
        slots = self._slots
        fresh: NDArray[np.int64] | None = None  # positions of the rows the table describes
        if t_rows is not None:
            assert slots is not None
            stale = slots.stale[t_rows]
            fresh = np.flatnonzero(~stale)
            keys_t = slots.keys
            read = list(zip(np.flatnonzero(stale).tolist(),
                            [keys_t[r] for r in t_rows[stale].tolist()], strict=True))
        else:
            read = list(enumerate(affected))
        # the keys read from their sets
        todo: list[tuple[int, _Moving]] = []  # (position, key's entry)
        cols_p: list[tuple[int, int, int, int, float, float]] = []  # (position, slot, group,
        # tuple, Gb/s, weight) of each share
        mids: list[tuple[int, ...]] = []  # each share's candidate links (its load moves)
        for i, k in read:
            d = demand.get(k)
            if d is None:  # (a job no longer planned, e.g. cut off: its sets stay as they are)
                continue
            cands, head, tail = d.candidates, d.head, d.tail
            hit = find(id(cands))
            if (hit is None or hit[0] is not cands or k in spilled
                    or not isdisjoint(head) or not isdisjoint(tail)):
                return None
            old = installed[k]  # (its paths and weights are the plan's: not spilled)
            ps = old.paths
            live = list(map(isdisjoint, ps))
            n_dead = len(ps) - sum(live)
            if not n_dead:
                continue
            dead = ([live.index(False)] if n_dead == 1 else
                    [j for j, ok in enumerate(live) if not ok])
            # (a demand's paths are its head, a candidate and its tail: a share that moves
            # changes the load of its candidate's links only)
            rate, ws, g, u, nh, nt = d.rate_gbps, old.weights, hit[1], hit[2], len(head), len(tail)
            a, b = pair_of_key(k)
            todo.append((i, (k, old, dead, g, head, tail, cands, rate, a, b, -1)))
            for j in dead:
                p = ps[j]
                mids.append(p[nh:len(p) - nt])
                cols_p.append((i, j, g, u, rate * ws[j], d.weight))
        per = np.fromiter(map(len, mids), np.int64, len(mids))
        by_col = list(zip(*cols_p, strict=True)) or [()] * 6
        read_sh = DeadShares(*(np.array(c, np.int64) for c in by_col[:4]),
                             *(np.array(c, np.float64) for c in by_col[4:]),
                             np.fromiter(_chain(mids), np.int64, int(per.sum())), _offsets(per))
        none = np.zeros(0, np.int64)
        if fresh is None or not len(fresh):
            return todo, (none, none), read_sh
        assert slots is not None and t_rows is not None
        # the rows the table describes: their shares at once (their entries are made once
        # their shares are placed: most move whole, see SlotTable.whole)
        tab = slots.dead_shares(t_rows[fresh], cols, avoid_rows)
        tab.pos = fresh[tab.pos]
        f_pos = (tab.pos[np.flatnonzero(np.r_[True, tab.pos[1:] != tab.pos[:-1]])]
                 if len(tab.pos) else none)
        moving = (f_pos, t_rows[f_pos])
        if not len(read_sh.pos):
            return todo, moving, tab
        # both kinds: in key order, then slot order
        order = np.lexsort((np.r_[read_sh.slot, tab.slot], np.r_[read_sh.pos, tab.pos]))
        lens = np.r_[np.diff(read_sh.ptr), np.diff(tab.ptr)][order]
        starts = np.r_[read_sh.ptr[:-1], len(read_sh.links) + tab.ptr[:-1]][order]
        links = np.r_[read_sh.links, tab.links][_ranges(starts, lens)]
        both = DeadShares(*(np.r_[getattr(read_sh, f), getattr(tab, f)][order]
                            for f in ("pos", "slot", "grp", "tup", "gbps", "weight")),
                          links, _offsets(lens))
        return todo, moving, both

    def _table_moving(self, rows: NDArray[np.int64], s0: NDArray[np.int64],
                      n_dead: NDArray[np.int64], sh: DeadShares) -> list[_Moving]:
        """The entries of moving keys the slot table describes (rows ``rows``, their
        ``n_dead`` dead shares from ``s0`` in ``sh``), as :meth:`_dead_shares` makes those of
        keys read from their sets."""
        if not len(rows):
            return []
        slots = self._slots
        assert slots is not None
        slot_l, s0_l = sh.slot.tolist(), s0.tolist()
        keys_t, sets_t, tuples = slots.keys, slots.sets, slots.tuples
        out: list[_Moving] = []
        for r, lo, n, g, u, rate, a, b in zip(
                rows.tolist(), s0_l, n_dead.tolist(), sh.grp[s0].tolist(),
                slots.tup[rows].tolist(), slots.rate[rows].tolist(),
                slots.src[rows].tolist(), slots.dst[rows].tolist(), strict=True):
            old = sets_t[r]
            p0 = old.paths[0]  # (a plain row: one head link, one tail link)
            out.append((keys_t[r], old, slot_l[lo:lo + n], g, p0[:1], p0[-1:], tuples[u], rate,
                        a, b, r))
        return out

    def _edit_sets(self, todo: list[tuple[int, _Moving]], choice: list[list[int]],
                   disjoint: list[bool], rows: NDArray[np.float64]) -> _SetEdits:
        """Each moving key's set once its dead shares have gone where ``choice`` says (per
        share, from :func:`replace_parts`; ``todo``: each key's entry after the index of
        its first share, its others following): a dead share's slot takes its
        new path (or its weight joins the share already on that path; spread in pieces, it
        may add slots); a key left with no live candidate is cut off (its load out of the
        dense ``rows``). ``disjoint``: per group, its columns share no link."""
        steered = self.view.ecmp is not None
        ed = _SetEdits()
        now, new, moves, lazy, taken = ed.now, ed.new, ed.moves, ed.lazy, ed.taken
        d_link: list[int] = []  # dense-load changes of pairs cut off, applied at once
        d_gbps: list[float] = []
        for i, (k, old, dead, g, head, tail, cands, rate, a, b, row) in todo:
            picks = choice[i:i + len(dead)]
            first = picks[0]
            if first[0] < 0:  # every candidate crosses a dead link: out of the plan
                for j, (p, w) in enumerate(zip(old.paths, old.weights, strict=True)):
                    # (the dead shares' candidate links are out already)
                    gone = p if j not in dead else head + tail
                    d_link.extend(gone)
                    d_gbps.extend([-rate * w] * len(gone))
                self._cut_off(k)
                continue
            base = (a * 1_000_003 + b) * 64  # (where a port search starts: as a plan's)
            ps = old.paths
            if len(picks) == 1 and (len(first) == 1 or first[1] < 0):
                # the common case, one dead share moving whole to a path the pair does not
                # use yet: its slot changes, the rest of the set stays as it is
                mid = cands[first[0]]  # (the kernel added its links to the dense load)
                p = head + mid + tail
                if p not in ps:
                    j = dead[0]
                    taken.extend(mid)
                    was = ps[j]
                    if disjoint[g]:
                        # (link-disjoint columns: two candidates share only the tuple's
                        # fixed links, head and tail, which every path of the set has; so
                        # no other path has a link of the old path that the new one lacks,
                        # nor one of the new path that the old one lacks: the links it
                        # leaves and takes are those the two paths do not share, found
                        # once the new paths are out)
                        lazy.append((len(moves), was, p))
                        moves.append((k, _PENDING, _PENDING))
                    else:
                        rest = ps[:j] + ps[j + 1:]
                        moves.append((k, set(was).difference(p, *rest),
                                      set(p).difference(was, *rest)))
                    ps = (*ps[:j], p, *ps[j + 1:])
                    if row >= 0:
                        ed.moved_rows.append((row, j, first[0], len(now)))
                    if not steered:
                        now.append((k, ps, old.weights, (), ()))
                        continue
                    pts = list(old.ports)
                    pts[j] = -1
                    rls = old.rules
                    if rls[j]:
                        rls = (*rls[:j], (), *rls[j + 1:])
                    new.append((pts, j, p, a, b, base + j))
                    now.append((k, ps, old.weights, pts, rls))
                    continue
            # (the kernel added the new paths' candidate links to the dense load)
            ps_l, ws, pts, rls, fresh = _merge_pieces(
                ps, old.weights, old.ports if steered else [0] * len(ps),
                old.rules if steered else [()] * len(ps), dead, picks, cands, head, tail,
                taken)
            # the index: the links the key leaves and takes (candidate links only: its
            # head and tail stay)
            was_l, now_l = set(_chain(ps)), set(_chain(ps_l))
            moves.append((k, was_l - now_l, now_l - was_l))
            for j in fresh if steered else ():
                new.append((pts, j, ps_l[j], a, b, base + j))
            now.append((k, tuple(ps_l), tuple(ws), pts, tuple(rls)) if steered
                       else (k, tuple(ps_l), tuple(ws), (), ()))
        ed.touched.append(np.array(taken, np.int64))
        if d_link:  # (cut off)
            cut = np.array(d_link, np.int64)
            np.add.at(rows, cut, np.array(d_gbps, np.float64))
            ed.touched.append(cut)
        return ed

    def _steer_new(self, new: list[tuple[list[int], int, tuple[int, ...], int, int, int]],
                   whole: WholeMoves | None = None,
                   ) -> tuple[list[int], dict[int, tuple[tuple[str, int], ...]]]:
        """Steer a heal's new paths: those of ``new`` (``(ports list, slot, path, source
        GPU, destination GPU, where the port search starts)``; each one's port goes into its
        slot of its list), then those of ``whole`` (their ports returned, in order); and the
        rules still needed, by index among all of them."""
        table = self._steering_table()
        n_path = [n[2] for n in new]
        src = np.array([n[3] for n in new], np.int64)
        dst = np.array([n[4] for n in new], np.int64)
        start = np.array([n[5] for n in new], np.int64)
        mids = table.intern(n_path, dst)
        if whole is not None and len(whole.rows):
            slots = self._slots
            assert slots is not None
            a, b = slots.src[whole.rows], slots.dst[whole.rows]
            n_path += whole.new
            src, dst = np.r_[src, a], np.r_[dst, b]
            # (where a port search starts: as a plan's)
            start = np.r_[start, (a * 1_000_003 + b) * 64 + whole.slot]
            # a slot moved whole takes candidate ``cand`` of its row's tuple: its switch
            # path is that candidate's, interned once per (tuple, candidate) met
            code = slots.tup[whole.rows] * (int(whole.cand.max()) + 1) + whole.cand
            _, first, inv = np.unique(code, return_index=True, return_inverse=True)
            reps = first.tolist()
            w_ids = table.intern([whole.new[r] for r in reps], b[first])[inv.ravel()]
            mids = np.r_[mids, w_ids]
        got, rules = table.steer(src, dst, start, mids, n_path, self.params.steer_tries)
        for (pts, j, *_), port in zip(new, got, strict=False):
            pts[j] = port
        return got[len(new):], rules

    def _settle_load(self, edits: _SetEdits) -> None:
        """The plan's load of each link a heal changed: its dense value."""
        assert self.current is not None and self._load_rows is not None
        changed = distinct(np.concatenate(edits.touched))
        self.current.link_load_gbps.update(zip(
            changed.tolist(), self._load_rows[changed].tolist(), strict=True))

    def _settle_sets(self, edits: _SetEdits, sets: list[PathSet], whole: WholeMoves | None,
                     whole_sets: list[PathSet]) -> None:
        """The plan's records of a heal, once its new paths are out: its paths, its load, the
        slot table and the links each moved key leaves and takes; ``sets`` are those of
        ``edits``, ``whole_sets`` those of ``whole`` (slots moved whole, in columns)."""
        assert self.current is not None
        self._settle_load(edits)
        paths = self.current.paths
        # (the replaced paths, and the old sets ``edits`` and ``whole`` hold, are retired)
        gone: list[object] = [edits, whole]
        for r in sets:
            gone.append(paths.get(r.key))
            paths[r.key] = list(zip(r.paths, r.weights, strict=True))
        self._retire(gone)
        moves = edits.moves
        for i, was, p in edits.lazy:
            o, n = set(was), set(p)
            moves[i] = (moves[i][0], o - n, n - o)
        slots = self._slots
        if slots is not None:  # (the rows of the other keys no longer describe their sets)
            for row, j, c, at in edits.moved_rows:
                slots.moved(row, j, c, sets[at])
            kept = {at for *_, at in edits.moved_rows}
            slots.mark_stale(r.key for at, r in enumerate(sets) if at not in kept)
        self._record_moves(sets, moves)
        if whole is None:
            return
        assert slots is not None
        gone.extend(map(paths.__getitem__, whole.keys))
        paths.update(zip(whole.keys, map(list, map(zip, whole.all_paths(),
                                                   (old.weights for old in whole.olds))),
                         strict=True))
        slots.moved_whole(whole, whole_sets)
        # the link index: each key leaves its old candidate's column, takes the new one's
        # (applied to a link when it is next read)
        self._on_link.defer(whole.keys, whole.left, whole.left_of, False)
        self._on_link.defer(whole.keys, whole.taken, whole.taken_of, True)
        held = self._rules_held
        if +held:  # (a slot moved whole drops its old path's rules, if any)
            for old, j in zip(whole.olds, whole.slot.tolist(), strict=True):
                if j < len(old.rules) and old.rules[j]:
                    held.subtract(sw for sw, _ in old.rules[j])
        self._installed.update(zip(whole.keys, whole_sets, strict=True))
        self._note_sets_changed()

    def tick(self, now_ns: float | None = None) -> TickReport:
        """One control period, "global view + local response": fold the telemetry deltas
        into the congestion map, push the map as the switches' congestion table (they adapt
        locally until the next plan), and re-plan around the load the plan does not account
        for, or that links going down, gray or back up left (a heal moves only the QPs on
        the failed link; a link back carries nothing until a plan gives it traffic): once
        after such a change (a link back up once it has stayed up ``link_up_holddown_ns``,
        from the time :meth:`on_links_changed` was given, else from the first period),
        and while there is background. A new plan is computed only if
        some fabric link, with the plan's load and the background, reaches the map's hot
        utilisation (80 %); it is installed only if it
        lowers the largest fabric-link utilisation (background included) by at least
        ``replan_gain`` of the current one (weighed on its planned paths first: a plan that
        does not is not steered; then on the paths steering kept), and only the
        path sets that changed are sent: small fluctuations never move traffic, and a plan
        never flaps back, since it is compared against itself at the next tick. A plan
        weighed and not installed is not computed again while the plan, the jobs and the
        links stay as they were and no link's background moves by more than
        ``replan_background_tolerance`` of its capacity: a hot link no plan can relieve
        costs one plan, not one per period."""
        with _gc_paused():
            self._seen = {}
            try:
                return replace(self._tick(now_ns), **self._seen)
            finally:
                self._release()
                # (the plan the next period's counters are counted under)
                self._load_at_tick = (dict(self.current.link_load_gbps)
                                      if self.current is not None else None)

    def _intervals_gone(self, reported: bool, now_ns: float | None) -> int:
        """How many reporting intervals the control period at ``now_ns`` ends (the links
        the telemetry leaves out take a step towards their last delta per interval). Without
        a ``telemetry_interval_ns`` a period is one interval when something was reported or
        its clock has moved (a period with nothing reported is an interval in which nothing
        changed); with one, the intervals of that length that ended since the last counted
        (the first period with a clock starts them), so that switches reporting less or
        more often than the control period smooth as often as they report."""
        every = self.params.telemetry_interval_ns
        if now_ns is None:
            return int(reported)
        if every is None:
            return int(reported or self._tick_ns is None or now_ns > self._tick_ns)
        end = self._interval_end_ns
        if end is None:
            self._interval_end_ns = now_ns
            return 0
        # (a period within a ppm of an interval's end ends it)
        gone = max(math.floor((now_ns - end) / every + 1e-6), 0)
        self._interval_end_ns = end + gone * every
        return gone

    def _release(self) -> None:
        """Free what the heals since the last call replaced (:attr:`_retired`)."""
        self._retired.clear()

    def _retire(self, gone: list[object]) -> None:
        """Keep what a heal replaced until :meth:`_release`; past ``_RETIRED_MAX`` heals
        without a control period, the oldest heal's is freed now."""
        if len(self._retired) >= _RETIRED_MAX:
            del self._retired[0]
        self._retired.append(gone)

    def port_changes(self, deltas: list[PortDelta]) -> tuple[list[int], list[int]]:
        """The links whose switch reports, in ``deltas``, the port gone down (and that are
        not known down) or back up (and that are known down): a change from the state it
        reported last (up if it never did). Reporting a state again changes nothing, so a
        link an operator reported down stays down while its switch keeps saying up.

        >>> from fabricpilot.controller.southbound import LinkInfo, PortDelta
        >>> class DP:
        ...     def fabric(self): return FabricView.from_links(
        ...         [LinkInfo(0, "a", "b", 400, 1), LinkInfo(1, "b", "a", 400, 1)],
        ...         {"a": "switch", "b": "switch"}, {}, {})
        >>> ctl = Controller(DP())
        >>> ctl.port_changes([PortDelta(0, 1000, oper_up=False), PortDelta(1, 1000)])
        ([0], [])
        >>> ctl.down.add(0); ctl.down.add(1)  # (as on_links_changed does)
        >>> ctl.port_changes([PortDelta(0, 1000, oper_up=False), PortDelta(1, 1000, oper_up=True)])
        ([], [])
        >>> ctl.port_changes([PortDelta(0, 1000, oper_up=True)])
        ([], [0])
        """
        last = self._port_up
        down: set[int] = set()
        up: set[int] = set()
        for d in [d for d in deltas if d.oper_up is not None]:  # (few say)
            state = bool(d.oper_up)
            if last.get(d.link_id, True) is state:
                continue
            last[d.link_id] = state
            if not state and d.link_id not in self.down:
                down.add(d.link_id)
            elif state and d.link_id in self.down:
                up.add(d.link_id)
        return sorted(down), sorted(up - down)

    def reports_port_change(self, deltas: list[PortDelta]) -> bool:
        """Whether some delta reports a port state other than the last its switch reported
        (what :meth:`port_changes` looks at, without remembering anything): worth a
        control period now rather than at the next interval."""
        last = self._port_up
        return any(last.get(d.link_id, True) is not bool(d.oper_up)
                   for d in deltas if d.oper_up is not None)

    def _tick(self, now_ns: float | None) -> TickReport:
        """:meth:`tick`."""
        deltas = self.dp.telemetry()
        self.map.update(deltas, elapsed=self._intervals_gone(bool(deltas), now_ns))
        if now_ns is not None:
            self._tick_ns = now_ns
        if deltas:  # (counted under the plan in force since the period before)
            self._load_measured = self._load_at_tick
        # ports their switches report gone down or back: healed as a fault report would be
        down, up = self.port_changes(deltas)
        if down or up:
            self._seen.update(links_down=down, links_up=up,
                              port_heal=self.on_links_changed(down, up, now_ns))
        if now_ns is not None:  # error counters: gray links, debounced
            gray = [lk for lk in self.gray.update(deltas, now_ns) if lk not in self.degraded]
            if gray:
                self._gray_by_counters.update(gray)
                self._seen.update(links_gray=gray, gray_heal=self.on_links_degraded(gray))
            soak = self.params.gray_clear_ns
            if soak < math.inf and self._gray_by_counters & self.degraded:
                clear = self.gray.clean(self._gray_by_counters & self.degraded, now_ns, soak)
                if clear:
                    self._seen["links_clear"] = clear
                    self.on_links_restored(clear)
        # (links changed since the last plan: weighed once, background or not; links back
        # up given to the switches' tables once they have stayed up long enough)
        changed, self._links_changed = self._links_changed, False
        if self._up_since:
            changed |= self._held_down_long_enough(now_ns)
        self.dp.push_congestion_table(self._table())
        hot = self.map.hot_links()
        bg = self.background_gbps()
        if self.current is None or not (bg or changed):
            return TickReport(False, hot, bg)
        before = self._fabric_lambda(self.current.link_load_gbps, bg)
        if before < self.map.hot_utilization:
            # no fabric link is (or, with the plan's load, would be) hot: nothing for a new
            # plan to fix, so none is computed
            return TickReport(False, hot, bg, before, before)
        if not changed and self._weighed_alike(bg):  # (it would lose again)
            assert self._weighed is not None
            return TickReport(False, hot, bg, before, self._weighed[3], skipped=True)
        self._weighed = None
        # (the demands the installed plan was made of stay, unless the new plan is installed:
        # a failure under it is healed on them)
        kept = self._kept()
        gain = (1.0 - self.params.replan_gain) * before
        try:
            with self._yielding():  # (urgent work waiting: weighed again next period)
                demands = self.demands()
                planned, made = self._plan_whole(demands, bg)
                # (weighed on the planned paths first: a plan that does not gain enough
                # is not steered)
                plan = planned
                after = self._fabric_lambda(plan.link_load_gbps, bg)
                if after <= gain:
                    plan, sets, report = self._steer_whole(plan, made, demands, bg)
        except PlanInterrupted:
            self._restore(kept)
            self._links_changed |= changed
            return TickReport(False, hot, bg, before, interrupted=True)
        if plan is not planned:  # (steering planned again around full rule tables)
            after = self._fabric_lambda(plan.link_load_gbps, bg)
        if after > gain:
            self._restore(kept)
            self._weighed = (self.current, dict(self.intents), bg, after)
            return TickReport(False, hot, bg, before, after)
        report = self._install(plan, sets, report, len(demands), bg)
        self.replans += 1
        return TickReport(True, hot, bg, before, after, report)

    def _weighed_alike(self, bg: dict[int, float]) -> bool:
        """Whether the last whole plan weighed and not installed was made on the installed
        plan, the intents as they are and a background (Gb/s per link) that ``bg`` differs
        from by at most ``replan_background_tolerance`` of any link's capacity."""
        if self._weighed is None:
            return False
        plan, intents, bg0, _ = self._weighed
        now = self.intents
        if (plan is not self.current or intents.keys() != now.keys()
                or any(now[k] is not v for k, v in intents.items())):
            return False
        tol, links = self.params.replan_background_tolerance, self.view.links
        return all(abs(bg.get(lk, 0.0) - bg0.get(lk, 0.0)) <= tol * links[lk].capacity_gbps
                   for lk in bg.keys() | bg0.keys())

    def _held_down_long_enough(self, now_ns: float | None) -> bool:
        """Whether a link back up has now stayed up ``link_up_holddown_ns`` (it is then
        forgotten); a link whose time up is not known is stamped by the first call that
        sees it up (no clock: at once)."""
        hold = self.params.link_up_holddown_ns
        ready = []
        for lk, since in self._up_since.items():
            if since is None:  # (first seen up now)
                since = self._up_since[lk] = now_ns
            if since is None or now_ns is None or now_ns - since >= hold:
                ready.append(lk)
        for lk in ready:
            del self._up_since[lk]
        return bool(ready)

    def _rate_caps(self, keys: list[str],
                   shares: Iterable[list[tuple[tuple[int, ...], float]]]) -> Iterator[float]:
        """The sending NIC's rate cap of each key's set: ``l3_rate_cap`` of the NIC if the
        pair is held to it (its job's calls all L3, or only L3 calls of its job use it, while
        an L1 / L2 job is declared: :meth:`capped_keys`) and one of its planned paths
        (``shares``, per key) leaves by the NIC (not NVLink), else none (``inf``)."""
        capped, some = self._capped_tasks, self._capped_keys
        if not capped and not some:
            return itertools.repeat(math.inf, len(keys))
        demand, links = self._demand, self.view.links
        frac = self.params.l3_rate_cap

        def cap(k: str, planned: list[tuple[tuple[int, ...], float]]) -> float:
            if k not in demand:
                return math.inf
            task = task_of_key(k)
            if task not in capped and k not in some.get(task, ()):
                return math.inf
            by_nic = any(links[p[0]].kind == "nic" for p, _ in planned)
            return frac * self._nic(pair_of_key(k)[0]) if by_nic else math.inf

        return map(cap, keys, shares)

    def _plan_columns(self, plan: Plan, reuse: bool
                      ) -> tuple[NDArray[np.int64], PathColumn, NDArray[np.float64]] | None:
        """A whole plan's QPs in columns (:func:`_qp_columns`), where its paths are kept so
        (:class:`~fabricpilot.controller.planner.PathRows`, none changed) and every key is
        steered as it is: no pair capped (no L1 / L2 job), none of room kept, hashes
        exposed; else ``None``."""
        paths = plan.paths
        if reuse or not isinstance(paths, BatchMap) or paths.changed:
            return None
        rows = paths.batch
        if (not isinstance(rows, PathRows) or self.view.ecmp is None or self._capped_tasks
                or self._capped_keys):
            return None
        if self._reserved and not self.reserved_keys.isdisjoint(rows.keys):
            return None
        return _qp_columns(rows)

    def _batch_rows(self, keys: list[str], installed: BatchMap[PathSet]) -> NDArray[np.int64]:
        """Each key's row in the installed batch whose set it holds (-1: a key set or
        deleted since, or not installed). Where both the batch's keys and ``keys`` are
        the jobs' keys job after job (:class:`JobRows`), a job of the same demands has its
        rows in one block; the others' keys are looked up one by one."""
        batch = installed.batch
        n = len(keys)
        old = batch.row_of if isinstance(batch, PathSetBatch) else None
        new = self._demand.rows_of(keys) if isinstance(self._demand, JobDemands) else None
        if not isinstance(old, JobRows) or new is None:
            row = installed.row
            return np.fromiter((-1 if r is None else r for r in map(row, keys)), np.int64, n)
        at = np.full(n, -1, np.int64)
        get = old.get
        for task, (off, table) in new.jobs.items():
            hit = old.jobs.get(task)
            m = len(table)
            if hit is not None and (hit[1] is table or (  # (the same demands, or demands
                    len(hit[1]) == m and hit[1].keys_ == table.keys_)):  # of the same keys)
                at[off:off + m] = np.arange(hit[0], hit[0] + m, dtype=np.int64)
            else:
                at[off:off + m] = np.fromiter((get(k, -1) for k in table), np.int64, m)
        # (the keys set or deleted since: their sets are not the batch's)
        changed = [r for r in map(new.get, installed.changed_keys()) if r is not None]
        at[changed] = -1
        return at

    def steer_plan(self, plan: Plan, weight: Mapping[str, float],
                   installed_rules: Counter[str] | None = None, reuse: bool = False,
                   ends: tuple[list[str], NDArray[np.int64]] | None = None,
                   ) -> tuple[Sequence[PathSet], PlanReport]:
        """Path sets for a plan, each path steered by a QP source port
        (:mod:`~fabricpilot.controller.entropy`) and pinned by explicit rules where the hash
        cannot reach it. Rules go to the heaviest demands first while every switch on the
        way has room (``switch_rule_capacity``); a path that does not fit follows the hash
        of its port, and the path set says so (it carries the path actually taken). With
        ``reuse``, a path a key already has keeps its port (only new paths are steered).
        ``ends``, if given, is a list of keys and their pairs' GPUs as rows (source,
        destination), read where it names the plan's keys in order (else they are looked
        up key by key)."""
        self._check()
        self._made_at = None
        # (a whole plan in columns: its QPs read from them, no path made)
        cols = self._plan_columns(plan, reuse)
        shares_of: list[list[tuple[tuple[int, ...], float]]] | None = None
        caps: Iterable[float]
        if cols is not None:
            keys = plan.paths.batch.keys  # type: ignore[attr-defined]
            n_per_key, col, q_weights = cols
            caps = itertools.repeat(math.inf, len(keys))  # (no pair is capped)
        else:
            keys = list(plan.paths)
            shares_of = list(plan.paths.values())
            if self._reserved:  # (room kept for jobs whose SLA is unmet: never installed)
                reserved = self.reserved_keys
                if not reserved.isdisjoint(keys):
                    keys = [k for k in keys if k not in reserved]
                    shares_of = list(map(plan.paths.__getitem__, keys))
            caps = self._rate_caps(keys, shares_of)
            if self.view.ecmp is None:  # a data plane that forwards path sets by rules alone
                sets = [PathSet(key, tuple(p for p, _ in shares), tuple(w for _, w in shares),
                                rate_cap_gbps=limit)
                        for key, shares, limit in zip(keys, shares_of, caps, strict=True)]
                return sets, PlanReport(plan, len(sets), 0)
        if ends is not None and len(ends[1]) == len(keys) and ends[0] == keys:
            rows = ends[1]
        else:
            rows = _pair_rows(keys, len(keys))
        self._steered_ends = (weakref.ref(plan), rows)
        # (a whole plan: the keys whose installed sets hold their planned paths keep them,
        # steered as they are; the steering table is the one that steered them)
        kept: list[PathSet | None] | None = None
        # (or, where the installed sets are one batch: the rows of it kept, -1 where none)
        kept_rows: NDArray[np.int64] | None = None
        rows_at: NDArray[np.int64] | None = None  # (each key's row in that batch, if read)
        n_kept = 0
        all_keys, all_caps = keys, caps
        if not reuse and self._steered_whole and self._steering is not None:
            caps = all_caps = list(caps)
            installed = self._installed
            if isinstance(installed, BatchMap) and isinstance(installed.batch, PathSetBatch):
                # (keys other than the batch's, as when a job left or joined, each found in
                # it; a key deleted or set since is steered again: its port is found again,
                # and its set, if the same, is not sent)
                same = not installed.changed and (installed.batch.keys is keys
                                                  or installed.batch.keys == keys)
                rows_at = (np.arange(len(keys), dtype=np.int64) if same
                           else self._batch_rows(keys, installed) if cols is not None
                           else None)
                found = (_kept_columns(keys, n_per_key, col, q_weights, caps, installed,
                                       self._spilled, None if same else rows_at)
                         if cols is not None else None)
                if found is None:
                    if shares_of is None:
                        shares_of = list(plan.paths.values())
                    found = _kept_rows(keys, shares_of, caps, installed, self._spilled)
                kept_rows = found
                fresh_at = np.flatnonzero(kept_rows < 0).tolist()
                batch = installed.batch
                n_kept = int((batch.first[1:] - batch.first[:-1])[kept_rows[kept_rows >= 0]]
                             .sum())  # (their QPs)
            else:
                if shares_of is None:
                    shares_of = list(plan.paths.values())
                kept = _kept_sets(keys, shares_of, caps, installed, self._spilled)
                fresh_at = [i for i, s in enumerate(kept) if s is None]
                n_kept = sum(len(s.paths) for s in kept if s is not None)  # (their QPs)
            if len(fresh_at) == len(keys):  # (none kept)
                kept = kept_rows = None
            else:
                fresh_rows = np.array(fresh_at, np.int64)
                keys = [keys[i] for i in fresh_at]
                if cols is not None:
                    q_at = _ranges(_offsets(n_per_key)[fresh_rows], n_per_key[fresh_rows])
                    col, q_weights = _column_take(col, q_at), q_weights[q_at]
                    n_per_key = n_per_key[fresh_rows]
                else:
                    assert shares_of is not None
                    shares_of = [shares_of[i] for i in fresh_at]
                caps = [caps[i] for i in fresh_at]
                rows = rows[fresh_rows]
        paths: Sequence[tuple[int, ...]]
        all_weights: Sequence[float] | NDArray[np.float64]  # (a whole plan's: its column)
        if cols is not None:  # (the QPs' paths and shares stay in their columns)
            paths = all_paths = col
            all_weights = q_weights
        else:
            assert shares_of is not None
            n_per_key = np.fromiter(map(len, shares_of), np.int64, len(keys))
            pairs = list(_chain(shares_of))
            all_paths, all_weights = zip(*pairs, strict=True) if pairs else ((), ())
            paths = list(all_paths)
        n_req = len(paths)
        first = _offsets(n_per_key)
        # (and where each QP's port search starts: spread, and the same in every run)
        src, dst, start = entropy.qp_search_starts(rows, n_per_key)
        # request -> the (port, rules) its path already has
        known: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}
        if reuse:
            r = 0
            for old, shares in zip(get_all(self._installed, keys), shares_of, strict=True):
                if old is not None and old.ports:
                    for i, (p, _) in enumerate(shares):
                        if p in old.paths:
                            j = old.paths.index(p)
                            known[r + i] = (old.ports[j], old.rules[j])
                r += len(shares)
        table = self._steering_table()
        tries = self.params.steer_tries
        rules: list[tuple[tuple[str, int], ...]] = [()] * n_req
        got_rules: dict[int, tuple[tuple[str, int], ...]] = {}
        ports: list[int] | NDArray[np.int64]  # (a whole plan's as one array)
        if not n_req:
            ports = []
        elif known:
            fresh = np.array([r for r in range(n_req) if r not in known], np.int64)
            f_paths = [paths[r] for r in fresh.tolist()]
            f_src, f_dst, f_start = src[fresh], dst[fresh], start[fresh]
            f_got = table.steer_paths(f_src, f_dst, f_start, f_paths, tries)
            f_ports, f_rules = f_got if f_got is not None else table.steer(
                f_src, f_dst, f_start, table.intern(f_paths, f_dst), f_paths, tries)
            ports = [0] * n_req
            for r, port in zip(fresh.tolist(), f_ports, strict=True):
                ports[r] = port
            fresh_l = fresh.tolist()
            for k, rl in f_rules.items():
                rules[fresh_l[k]] = rl
            for r, (port, rl) in known.items():
                ports[r] = port
                rules[r] = rl
        else:
            # (a whole plan's hash decisions derived from its paths at once; a view steering
            # cannot read as arrays, path by path)
            # (the ports as one array: a batch keeps them so)
            got = table.steer_paths(src, dst, start, paths, tries, as_array=True)
            if got is None:
                mids = (_switch_path_ids(table, plan.parts, paths, dst, n_per_key)
                        if kept is None else table.intern(paths, dst))
                self._check()
                got = table.steer(src, dst, start, mids, paths, tries)
            ports, got_rules = got
            self._check()
            for r, rl in got_rules.items():
                rules[r] = rl
        used: Counter[str] = Counter(installed_rules or {})  # rules other sets hold
        unpinned = 0
        spilled: dict[str, int] = {}
        cap = self.view.rule_capacity
        needy = [r for r, rl in enumerate(rules) if rl] if known else sorted(
            r for r, rl in got_rules.items() if rl)
        if needy:
            owner = np.repeat(np.arange(len(keys)), n_per_key)
            key_of = {r: keys[int(owner[r])] for r in needy}
            hashed: list[int] = []  # (they take the path their port hashes to)
            for r in sorted(needy, key=lambda r: (-weight.get(key_of[r], 0.0), r)):
                need = Counter(sw for sw, _ in rules[r])
                if all(used[sw] + n <= cap for sw, n in need.items()):
                    used.update(need)
                else:
                    unpinned += 1
                    spilled[key_of[r]] = spilled.get(key_of[r], 0) + 1
                    rules[r] = ()
                    hashed.append(r)
            # each follows the hash of its port: of a few ports, the one whose hash path
            # avoids dead and gray links and loads the fabric least (the load of the plan
            # this one goes into, its spilled shares moved to their hash paths in turn)
            load = dict(plan.link_load_gbps if plan.link_load_gbps or self.current is None
                        else self.current.link_load_gbps)
            share = []
            demand = self._demand
            for r in hashed:
                d = demand.get(key_of[r])
                total = sum(all_weights[int(first[owner[r]]):int(first[owner[r] + 1])])
                gbps = (d.rate_gbps * all_weights[r] / total) if d is not None and total else 0.0
                share.append(gbps)
                for lk in paths[r]:
                    if lk in load:
                        load[lk] -= gbps
            new_ports, new_paths = best_hashed_ports(
                self.view, src[hashed].tolist(), dst[hashed].tolist(),
                [int(ports[r]) for r in hashed], share, load, self._link_capacity(),
                self._shunned(), tries=self.params.spill_port_tries)
            for r, port, p in zip(hashed, new_ports, new_paths, strict=True):
                ports[r] = port
                paths[r] = p
        if unpinned and not isinstance(paths, PathColumn):
            all_paths = tuple(paths)
        sets: Sequence[PathSet] = PathSetBatch(keys, first, all_paths, all_weights, ports,
                                               rules, list(caps))
        if reuse:  # (a few keys: their sets made now)
            sets = list(sets)
        elif kept is not None:  # (the kept sets and the new ones, in the plan's order)
            for i, made in zip(fresh_at, sets, strict=True):
                kept[i] = made
            sets = kept  # type: ignore[assignment]
            self._made_at = (weakref.ref(plan), fresh_at, None)
        elif kept_rows is not None:  # (the same, as one batch of the kept rows and new ones)
            assert isinstance(self._installed, BatchMap)
            sets = _merged_batch(self._installed.batch, kept_rows, sets,  # type: ignore[arg-type]
                                 all_keys, all_caps)
            # (with each key's row in the installed batch, where known: see _install)
            self._made_at = (weakref.ref(plan), fresh_at, rows_at)
        elif rows_at is not None:  # (none kept: every set made anew, the rows read kept)
            self._made_at = (weakref.ref(plan), list(range(len(keys))), rows_at)
        pinned = len(needy) - unpinned
        return sets, PlanReport(plan, len(sets), 0, n_req + n_kept - pinned - unpinned, pinned,
                                unpinned, dict(used), spilled=spilled)
