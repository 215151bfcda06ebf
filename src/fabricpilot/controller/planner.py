"""Job-aware path planning: a multi-commodity-flow heuristic and its LP / MILP references.

A *demand* is one commodity: the traffic of a job (or a flow group) between two endpoints at a
rate, with a set of candidate paths (link ids) and a weight (its priority or heat). Planning
picks one candidate per demand (``split = 1``; a demand may also be split into equal parts on
several paths) so that no link is over-committed: the objective is the largest link
utilisation ``lambda = max_l (background_l + load_l) / capacity_l``.

* :func:`plan_greedy`: heaviest demands first, each on the candidate that keeps its own
  bottleneck lowest, then a local search that moves demands off the most loaded link while
  that lowers ``lambda``. Compiled (numba) over parts and links; demands whose candidates
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

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

_chain = itertools.chain.from_iterable


@dataclass(frozen=True, slots=True)
class Demand:
    """Traffic to place: ``rate_gbps`` between two endpoints on one of its candidate paths
    (tuples of link ids); heavier ``weight`` is placed first.

    The candidate paths are ``head + c + tail`` for every ``c`` in ``candidates``; ``head``
    and ``tail`` are empty unless the caller factors out the links all candidates start and
    end with (then ``candidates`` can be one tuple shared by many demands; a link of ``head``
    or ``tail`` should not appear in ``candidates``). :attr:`full_candidates` gives the full
    paths, and a :class:`Plan` always names full paths.

    >>> d = Demand("a", 100, ((5, 6), (7, 8)), head=(1,), tail=(2,))
    >>> d.full_candidates
    ((1, 5, 6, 2), (1, 7, 8, 2))
    """

    key: str
    rate_gbps: float
    candidates: tuple[tuple[int, ...], ...]
    weight: float = 1.0
    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError(f"demand {self.key!r}: no candidate path")
        if not self.rate_gbps >= 0:
            raise ValueError(f"demand {self.key!r}: rate_gbps must be >= 0")

    @property
    def full_candidates(self) -> tuple[tuple[int, ...], ...]:
        """The candidate paths with ``head`` and ``tail``: ``head + c + tail``."""
        if not self.head and not self.tail:
            return self.candidates
        return tuple(self.head + c + self.tail for c in self.candidates)


@dataclass
class Plan:
    """Each demand's paths and shares, the resulting load per link and ``lambda``."""

    paths: dict[str, list[tuple[tuple[int, ...], float]]]
    link_load_gbps: dict[int, float]
    max_utilization: float
    solver: str = "greedy"
    moves: int = 0  # local-search moves after the greedy pass
    extra: dict[str, float] = field(default_factory=dict)


class _Problem:
    """Demands and candidates as arrays: candidate c of demand d is column ``col[d] + c``
    (every candidate a column of its own; for the LP / MILP references)."""

    def __init__(self, demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None) -> None:
        self.demands = list(demands)
        self.cands = [d.full_candidates for d in self.demands]
        used = np.unique(np.fromiter(_chain(_chain(self.cands)), np.int64))
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
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    return (np.repeat(starts - (ends - lens), lens) + np.arange(total)).astype(np.int64)


def _offsets(lens: NDArray[np.int64]) -> NDArray[np.int64]:
    """Start offsets of consecutive segments of the given lengths, and the total at the end.

    >>> _offsets(np.array([2, 0, 3])).tolist()
    [0, 2, 2, 5]
    """
    out = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def _group_rows(a: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Identical rows of an integer matrix: ``(first, label)`` with ``first`` the index of
    each distinct row's first occurrence (in order of first occurrence) and ``label[i]`` the
    position in ``first`` of row ``i``'s class. Rows are hashed, and the hashes checked.

    >>> first, label = _group_rows(np.array([[1, 2], [3, 4], [1, 2], [3, 5]]))
    >>> first.tolist(), label.tolist()
    ([0, 1, 3], [0, 1, 0, 2])
    """
    m = a.shape[0]
    if m == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if a.shape[1] == 0:
        return np.zeros(1, np.int64), np.zeros(m, np.int64)
    rng = np.random.default_rng(0x5EED)
    mult = rng.integers(1, 1 << 62, (a.shape[1], 2), dtype=np.int64) | 1
    with np.errstate(over="ignore"):
        h = a.astype(np.int64) @ mult  # wraps modulo 2**64: a hash per row
    by = np.lexsort((np.arange(m), h[:, 1], h[:, 0]))
    hs = h[by]
    new = np.ones(m, bool)
    new[1:] = (hs[1:] != hs[:-1]).any(axis=1)
    cls = np.cumsum(new) - 1
    first_sorted = by[new]  # smallest index of each hash class (ties sorted by index)
    label = np.empty(m, np.int64)
    label[by] = cls
    if not (a == a[first_sorted[label]]).all():  # a hash collision: exact but slower
        _, first_sorted, label = np.unique(a, axis=0, return_index=True, return_inverse=True)
        label = label.reshape(-1)
    rank = np.empty(len(first_sorted), np.int64)
    perm = np.argsort(first_sorted, kind="stable")
    rank[perm] = np.arange(len(first_sorted))
    return first_sorted[perm].astype(np.int64), rank[label]


def _link_rows(ids: NDArray[np.int64], links: NDArray[np.int64]) -> NDArray[np.int64]:
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
        return np.zeros(0, np.int64)
    lo, hi = int(ids.min()), int(ids.max())
    if len(links) and lo >= 0 and int(links[0]) >= 0 and hi <= 8 * len(links) + (1 << 20):
        lut = np.full(max(hi, int(links[-1])) + 1, -1, np.int64)
        lut[links] = np.arange(len(links))
        rows = lut[ids]
        bad = rows < 0
    else:
        rows = np.searchsorted(links, ids).astype(np.int64)
        clipped = np.minimum(rows, max(len(links) - 1, 0))
        bad = (rows >= len(links)) | (links[clipped] != ids) if len(links) else \
            np.ones(len(ids), bool)
        rows = clipped
    if bad.any():
        raise ValueError(f"no capacity for links {np.unique(ids[bad])[:5].tolist()}")
    return rows


# ----------------------------------------------------------------------- the commodities
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
    """

    def __init__(self, demands: Sequence[Demand], capacity: Mapping[int, float],
                 background: Mapping[int, float] | None, aggregate: bool = True) -> None:
        self.demands = list(demands)
        n = len(self.demands)
        self.links = np.array(sorted(capacity), np.int64)
        n_links = len(self.links)
        cands = [d.candidates for d in self.demands]
        heads = [d.head for d in self.demands]
        tails = [d.tail for d in self.demands]
        # unique candidate tuples (by identity: demands may share one)
        if aggregate:
            u_of, uobj = _unique_objects(cands)
        else:
            u_of, uobj = np.arange(n, dtype=np.int64), cands
        n_u = len(uobj)
        ku = np.fromiter(map(len, uobj), np.int64, n_u)
        plen = np.fromiter(map(len, _chain(uobj)), np.int64, int(ku.sum()))
        hl = np.fromiter(map(len, heads), np.int64, n)
        tl = np.fromiter(map(len, tails), np.int64, n)
        n_c, n_h, n_t = int(plen.sum()), int(hl.sum()), int(tl.sum())
        ids = np.fromiter(itertools.chain(_chain(_chain(uobj)), _chain(heads), _chain(tails)),
                          np.int64, n_c + n_h + n_t)
        rows = _link_rows(ids, self.links)
        self.cap = np.array([float(capacity[lk]) for lk in self.links.tolist()])
        if (self.cap <= 0).any():
            raise ValueError("link capacities must be > 0")
        bg = background or {}
        self.bg = np.array([float(bg.get(lk, 0.0)) for lk in self.links.tolist()])
        self.rate = np.array([d.rate_gbps for d in self.demands], np.float64)
        self.weight = np.array([d.weight for d in self.demands], np.float64)
        crow, hrow, trow = rows[:n_c], rows[n_c:n_c + n_h], rows[n_c + n_h:]
        pstart = _offsets(plen)   # link offset of every path of the unique tuples
        ustart = _offsets(ku)     # path offset of every unique tuple

        # ---- regular unique tuples: all paths of one length; fixed = positions where all
        # candidates agree, the rest (per candidate) shared by all tuples with the same rest
        u_grp = np.full(n_u, -1, np.int64)
        ufix_len = np.zeros(n_u, np.int64)
        fix_blocks: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = []
        grp_blocks: list[NDArray[np.int64]] = []  # (groups, k, width) sorted rows
        n_groups = 0
        if n_u:
            lmin = np.minimum.reduceat(plen, ustart[:-1]) if len(plen) else np.zeros(0)
            lmax = np.maximum.reduceat(plen, ustart[:-1]) if len(plen) else np.zeros(0)
            uniform = lmin == lmax
            shape_code = ku * (int(lmax.max()) + 1) + lmin
            for code in np.unique(shape_code[uniform]).tolist():
                sel = np.flatnonzero(uniform & (shape_code == code))
                k, ln = int(ku[sel[0]]), int(lmin[sel[0]])
                lo = pstart[ustart[sel]]
                arr = crow[lo[:, None] + np.arange(k * ln)].reshape(len(sel), k, ln)
                common = (arr == arr[:, :1, :]).all(axis=1) if ln else np.zeros((len(sel), 0),
                                                                              bool)
                pats, pat_of = _group_rows(common.astype(np.int64))
                for j, pi in enumerate(pats.tolist()):
                    inside = pat_of == j
                    usel, a = sel[inside], arr[inside]
                    pat = common[pi]
                    fixed, rest = a[:, 0, pat], a[:, :, ~pat]
                    # a link twice on a path (not a simple path): leave to the exact route
                    bad = np.zeros(len(usel), bool)
                    for x in range(fixed.shape[1]):
                        bad |= (rest == fixed[:, x, None, None]).any(axis=(1, 2))
                        for y in range(x + 1, fixed.shape[1]):
                            bad |= fixed[:, x] == fixed[:, y]
                    usel, fixed, rest = usel[~bad], fixed[~bad], rest[~bad]
                    if not len(usel):
                        continue
                    first, label = _group_rows(rest.reshape(len(usel), -1))
                    reps = np.sort(rest[first], axis=2)
                    ok = _regular_groups(reps)
                    new_id = np.where(ok, np.cumsum(ok) - 1 + n_groups, -1)
                    u_grp[usel] = new_id[label]
                    n_groups += int(ok.sum())
                    grp_blocks.append(reps[ok])
                    good = new_id[label] >= 0
                    ufix_len[usel[good]] = fixed.shape[1]
                    fix_blocks.append((usel[good], fixed[good]))
        ufix_ptr = _offsets(ufix_len)
        ufix_idx = np.zeros(int(ufix_ptr[-1]), np.int64)
        for usel, fixed in fix_blocks:
            ufix_idx[_ranges(ufix_ptr[usel], ufix_len[usel])] = fixed.reshape(-1)
        g_ncand = np.array([b.shape[1] for b in grp_blocks for _ in range(b.shape[0])],
                           np.int64)
        c_len = np.concatenate([np.full(b.shape[0] * b.shape[1], b.shape[2], np.int64)
                                for b in grp_blocks] or [np.zeros(0, np.int64)])
        c_parts: list[NDArray[np.int64]] = [b.reshape(-1) for b in grp_blocks]

        # ---- demands: regular ones take their tuple's group; head / tail links join the
        # fixed links, unless they are repeated on a path (then the exact route below)
        grp = u_grp[u_of] if n else np.zeros(0, np.int64)
        irregular = grp < 0
        hptr, tptr = _offsets(hl), _offsets(tl)
        factored = np.flatnonzero(((hl + tl) > 0) & ~irregular)
        if len(factored):
            irregular[_repeated_links(factored, grp, hl, tl, hptr, tptr, hrow, trow, u_of,
                                      ufix_ptr, ufix_idx, g_ncand, c_len, c_parts,
                                      n_links)] = True
        reg = np.flatnonzero(~irregular)
        flen = np.zeros(n, np.int64)
        flen[reg] = hl[reg] + ufix_len[u_of[reg]] + tl[reg]
        # ---- irregular demands (paths of several lengths, a link twice on a path): sets
        irr = np.flatnonzero(irregular).tolist()
        irr_fixed: list[list[int]] = []
        if irr:
            row_of = dict(zip(self.links.tolist(), range(n_links), strict=True))
            seen: dict[tuple[tuple[int, ...], ...], int] = {}
            extra_ncand: list[int] = []
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
                    c_parts.append(np.fromiter(_chain(rest_key), np.int64))
                    c_len = np.concatenate((c_len, np.fromiter(map(len, rest_key), np.int64,
                                                               len(rest_key))))
                grp[d] = g
                irr_fixed.append(sorted(both))
                flen[d] = len(both)
            g_ncand = np.concatenate((g_ncand, np.array(extra_ncand, np.int64)))
        self.grp = grp.astype(np.int64)
        self.fix_ptr = _offsets(flen)
        self.fix_idx = np.zeros(int(self.fix_ptr[-1]), np.int64)
        start = self.fix_ptr[reg]
        self.fix_idx[_ranges(start, hl[reg])] = hrow[_ranges(hptr[reg], hl[reg])]
        ul = ufix_len[u_of[reg]]
        self.fix_idx[_ranges(start + hl[reg], ul)] = ufix_idx[_ranges(ufix_ptr[u_of[reg]], ul)]
        self.fix_idx[_ranges(start + hl[reg] + ul, tl[reg])] = \
            trow[_ranges(tptr[reg], tl[reg])]
        for d, fixed_d in zip(irr, irr_fixed, strict=True):
            self.fix_idx[self.fix_ptr[d]:self.fix_ptr[d + 1]] = fixed_d
        self.g_ncand = g_ncand
        self.g_col0 = _offsets(g_ncand)[:-1]
        self.c_ptr = _offsets(c_len)
        self.c_idx = (np.concatenate(c_parts) if c_parts else np.zeros(0)).astype(np.int64)
        self.n_groups = n_groups

    def links_of(self, d: int, c: int) -> NDArray[np.int64]:
        """Rows of the links of demand ``d``'s candidate ``c`` (fixed ones first)."""
        col = int(self.g_col0[self.grp[d]]) + c
        return np.concatenate((self.fix_idx[self.fix_ptr[d]:self.fix_ptr[d + 1]],
                               self.c_idx[self.c_ptr[col]:self.c_ptr[col + 1]]))


def _unique_objects(objs: list[tuple[tuple[int, ...], ...]],
                    ) -> tuple[NDArray[np.int64], list[tuple[tuple[int, ...], ...]]]:
    """Distinct objects by identity, in order of first appearance, and each one's index.

    >>> a, b = ((1,),), ((1,),)
    >>> idx, objs = _unique_objects([a, b, a])
    >>> idx.tolist(), objs[0] is a, objs[1] is b
    ([0, 1, 0], True, True)
    """
    if not objs:
        return np.zeros(0, np.int64), []
    ids = np.fromiter(map(id, objs), np.uint64, len(objs))
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    perm = np.argsort(first, kind="stable")
    rank = np.empty(len(first), np.int64)
    rank[perm] = np.arange(len(first))
    return rank[inv.reshape(-1)], [objs[i] for i in first[perm].tolist()]


def _regular_groups(reps: NDArray[np.int64]) -> NDArray[np.bool_]:
    """For candidate structures ``reps[g]`` (``k`` candidates of ``w`` links, each sorted):
    whether each is free of a link repeated on one candidate and of a link on all of them
    (either goes to the exact route).

    >>> _regular_groups(np.array([[[1, 2], [3, 4]], [[1, 2], [1, 3]], [[1, 1], [3, 4]]]))
    array([ True, False, False])
    """
    ok = ~(reps[..., 1:] == reps[..., :-1]).any(axis=(1, 2))
    if reps.shape[1] > 1:
        for j in range(reps.shape[2]):
            on_all = (reps == reps[:, :1, j, None]).any(axis=2).all(axis=1)
            ok &= ~on_all
    return ok


def _repeated_links(factored: NDArray[np.int64], grp: NDArray[np.int64],
                    hl: NDArray[np.int64], tl: NDArray[np.int64], hptr: NDArray[np.int64],
                    tptr: NDArray[np.int64], hrow: NDArray[np.int64], trow: NDArray[np.int64],
                    u_of: NDArray[np.int64], ufix_ptr: NDArray[np.int64],
                    ufix_idx: NDArray[np.int64], g_ncand: NDArray[np.int64],
                    c_len: NDArray[np.int64], c_parts: list[NDArray[np.int64]],
                    n_links: int) -> NDArray[np.int64]:
    """The demands among ``factored`` (with a head or a tail) whose head / tail links are
    repeated: among their fixed links, or on one of their group's candidates."""
    n_g = len(g_ncand)
    c_idx = np.concatenate(c_parts) if c_parts else np.zeros(0, np.int64)
    col_grp = np.repeat(np.arange(n_g), g_ncand)
    g_codes = np.unique(np.repeat(col_grp, c_len[:len(col_grp)]) * n_links + c_idx)
    ht_d = np.concatenate((np.repeat(factored, hl[factored]), np.repeat(factored, tl[factored])))
    ht_rows = np.concatenate((hrow[_ranges(hptr[factored], hl[factored])],
                              trow[_ranges(tptr[factored], tl[factored])]))
    bad = ht_d[np.isin(grp[ht_d] * n_links + ht_rows, g_codes)]
    ul = ufix_ptr[u_of[factored] + 1] - ufix_ptr[u_of[factored]]
    all_d = np.concatenate((ht_d, np.repeat(factored, ul)))
    all_rows = np.concatenate((ht_rows, ufix_idx[_ranges(ufix_ptr[u_of[factored]], ul)]))
    codes = np.sort(all_d * n_links + all_rows)
    dup = codes[1:][codes[1:] == codes[:-1]] // n_links
    return np.unique(np.concatenate((bad, dup))).astype(np.int64)


# ------------------------------------------------------------------------------- greedy
def plan_greedy(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                background: Mapping[int, float] | None = None, split: int = 1,
                sweeps: int = 2, max_moves: int | None = None,
                aggregate: bool = True) -> Plan:
    """Place every demand (in ``split`` equal parts) on its candidates, heaviest first, each
    part on the candidate whose most loaded link stays lowest (counting only the links that
    differ between its candidates; ties by the sum of squared utilisations); then ``sweeps``
    rounds that take every part out and put it back on its best candidate given all the
    others (stopping early once a round moves nothing); then, on instances of at most
    2 000 parts (or ``max_moves`` if given), a local search that moves parts off the links at
    ``lambda`` while that lowers ``lambda``, or the number of links at it, or the sum of
    squared utilisations.

    Demands whose candidates differ only by links common to all of them (a GPU pair's NIC
    links) are planned as one commodity (``aggregate``): its candidate structure is stored
    once, and its parts are still every demand's own parts, each no bigger than
    ``rate / split`` and placed in the same order, so the plan is the same as without
    aggregation; the paths are given per demand.

    Two 300 Gb/s demands with the same two 400 Gb/s candidate links go one each:

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> p = plan_greedy(d, {0: 400, 1: 400})
    >>> sorted(p.paths["a"] + p.paths["b"]), p.max_utilization
    ([((0,), 1.0), ((1,), 1.0)], 0.75)
    """
    if split < 1:
        raise ValueError("split must be >= 1")
    com = _Commodities(demands, capacity, background, aggregate)
    n = len(com.demands)
    load = com.bg.copy()
    keys = [d.key for d in com.demands]
    by_key = np.array(sorted(range(n), key=keys.__getitem__), np.int64)
    neg = -com.weight * com.rate
    order = by_key[np.argsort(neg[by_key], kind="stable")] if n else by_key
    choice = _place(order, com.grp, com.rate, com.fix_ptr, com.fix_idx, com.g_col0,
                    com.g_ncand, com.c_ptr, com.c_idx, com.cap, load, split, sweeps)
    if max_moves is None:
        max_moves = 10_000 if n * split <= 2_000 else 0
    moves = _local_search(com, order, choice, load, split, max_moves) if n else 0
    return _package(com, choice, load, "greedy", moves)


@numba.njit(cache=True)
def _place(order: NDArray[np.int64], grp: NDArray[np.int64], rate: NDArray[np.float64],
           fix_ptr: NDArray[np.int64], fix_idx: NDArray[np.int64], g_col0: NDArray[np.int64],
           g_ncand: NDArray[np.int64], c_ptr: NDArray[np.int64], c_idx: NDArray[np.int64],
           cap: NDArray[np.float64], load: NDArray[np.float64], split: int,
           sweeps: int) -> NDArray[np.int64]:
    """Greedy placement and re-insertion sweeps (see :func:`plan_greedy`); ``load`` is
    updated in place; returns every part's candidate (within its demand). A candidate's
    cost counts only the links not shared by all of its demand's candidates (the group's
    columns): (largest utilisation after adding the part, sum of squares)."""
    choice = np.full((grp.shape[0], split), -1, np.int64)
    for rnd in range(sweeps + 1):
        moved = False
        for d in order:
            g = grp[d]
            k_c = g_ncand[g]
            col0 = g_col0[g]
            part = rate[d] / split
            f0, f1 = fix_ptr[d], fix_ptr[d + 1]
            for k in range(split):
                old = choice[d, k]
                if rnd > 0:  # take the part out before placing it again
                    for q in range(f0, f1):
                        load[fix_idx[q]] -= part
                    for q in range(c_ptr[col0 + old], c_ptr[col0 + old + 1]):
                        load[c_idx[q]] -= part
                best = 0
                if k_c > 1:
                    best = -1
                    best_max = np.inf
                    best_sq = np.inf
                    for c in range(k_c):
                        mx = 0.0
                        sq = 0.0
                        for q in range(c_ptr[col0 + c], c_ptr[col0 + c + 1]):
                            lk = c_idx[q]
                            u = (load[lk] + part) / cap[lk]
                            if u > mx:
                                mx = u
                            sq += u * u
                        if mx < best_max - 1e-12 or (mx <= best_max + 1e-12
                                                     and sq < best_sq - 1e-12):
                            best, best_max, best_sq = c, mx, sq
                if best != old:
                    moved = True
                choice[d, k] = best
                for q in range(f0, f1):
                    load[fix_idx[q]] += part
                for q in range(c_ptr[col0 + best], c_ptr[col0 + best + 1]):
                    load[c_idx[q]] += part
        if rnd > 0 and not moved:
            break
    return choice


def _local_search(com: _Commodities, order: NDArray[np.int64], choice: NDArray[np.int64],
                  load: NDArray[np.float64], split: int, max_moves: int) -> int:
    """First-improvement moves of single parts off the links at ``lambda`` (``choice`` and
    ``load`` are updated in place); returns the number of moves."""
    cap = com.cap

    def score(ld: NDArray[np.float64]) -> tuple[float, int, float]:
        # lambda first; then fewer links at lambda; then a flatter load overall
        u = ld / cap
        lam = float(u.max())
        return (round(lam, 9), int((u >= lam - 1e-9).sum()), float((u * u).sum()))

    moves = 0
    current = score(load)
    order_l = order.tolist()
    while moves < max_moves:
        util = load / cap
        hot = set(np.flatnonzero(util >= util.max() - 1e-9).tolist())
        improved = False
        # parts crossing a link at lambda, heaviest first
        for d in order_l:
            part = com.rate[d] / split
            k_c = int(com.g_ncand[com.grp[d]])
            for k in range(split):
                cur = int(choice[d, k])
                cur_lk = com.links_of(d, cur)
                if not hot.intersection(cur_lk.tolist()):
                    continue
                for c in range(k_c):
                    if c == cur:
                        continue
                    trial = load.copy()
                    trial[cur_lk] -= part
                    trial[com.links_of(d, c)] += part
                    s_trial = score(trial)
                    if s_trial < current:
                        choice[d, k], current = c, s_trial
                        load[:] = trial
                        improved = True
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
             solver: str, moves: int) -> Plan:
    """The plan: every demand's full paths with their shares (parts on the same path add
    up), the load per link (background excluded) and ``lambda``."""
    split = choice.shape[1]
    inc = 1.0 / split
    acc = [0.0]
    for _ in range(split):
        acc.append(acc[-1] + inc)
    whole = acc[split]
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    if len(com.demands):
        srt = np.sort(choice, axis=1)
        single = (srt[:, 0] == srt[:, -1]).tolist()
        first = srt[:, 0].tolist()
        rows = choice.tolist()
        for d, dem in enumerate(com.demands):
            cands, head, tail = dem.candidates, dem.head, dem.tail
            if single[d]:
                c = cands[first[d]]
                paths[dem.key] = [(head + c + tail if head or tail else c, whole)]
                continue
            shares: dict[tuple[int, ...], float] = {}
            for ci in rows[d]:
                c = cands[ci]
                p = head + c + tail if head or tail else c
                shares[p] = shares.get(p, 0.0) + inc
            paths[dem.key] = sorted(shares.items())
    util = load / com.cap
    return Plan(paths, dict(zip(com.links.tolist(), (load - com.bg).tolist(), strict=True)),
                float(util.max()) if len(util) else 0.0, solver, moves)


# ---------------------------------------------------------------------------- references
def plan_reference(demands: Sequence[Demand], capacity: Mapping[int, float], *,
                   background: Mapping[int, float] | None = None, integral: bool = False,
                   split: int = 1, time_limit_s: float = 60.0) -> Plan:
    """The optimum ``lambda`` by HiGHS: the LP (``integral=False``: each demand spread freely
    over its candidates) or the MILP (each of ``split`` equal parts of a demand on one
    candidate). Variables: one share per candidate, then ``lambda``; constraints: shares of a
    demand sum to 1 and every link's load is at most ``lambda x capacity``.

    >>> d = [Demand("a", 300, ((0,), (1,))), Demand("b", 300, ((0,), (1,)))]
    >>> plan_reference(d, {0: 400, 1: 400}).max_utilization
    0.75
    >>> round(plan_reference([Demand("a", 600, ((0,), (1,)))], {0: 400, 1: 400},
    ...                      integral=True).max_utilization, 6)
    1.5
    """
    prob = _Problem(demands, capacity, background)
    n_cols = int(prob.n_cand.sum())
    n_d = len(prob.demands)
    # x (candidate shares) then lambda; minimise lambda
    c = np.zeros(n_cols + 1)
    c[-1] = 1.0
    rate_of_col = np.repeat(prob.rate, prob.n_cand)
    # link rows: sum_c rate_c x_c - lambda cap_l <= -bg_l
    a_link = sp.hstack([prob.inc @ sp.diags(rate_of_col), sp.csr_matrix(-prob.cap[:, None])])
    demand_of_col = np.repeat(np.arange(n_d), prob.n_cand)
    a_dem = sp.hstack([sp.csr_matrix((np.ones(n_cols), (demand_of_col, np.arange(n_cols))),
                                     shape=(n_d, n_cols)), sp.csr_matrix((n_d, 1))])
    if not integral:
        res = linprog(c, A_ub=a_link.tocsr(), b_ub=-prob.bg, A_eq=a_dem.tocsr(),
                      b_eq=np.ones(n_d), bounds=[(0, None)] * (n_cols + 1), method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP reference failed: {res.message}")
        x = res.x[:-1]
        solver = "lp"
    else:
        # shares in units of 1/split: integer counts summing to split
        cons = [LinearConstraint(a_link.tocsr() @ sp.diags(np.r_[np.full(n_cols, 1 / split),
                                                                   1.0]),
                                 -np.inf, -prob.bg),
                LinearConstraint(a_dem.tocsr(), split, split)]
        integrality = np.r_[np.ones(n_cols), 0]
        res = milp(c, constraints=cons, integrality=integrality,
                   bounds=Bounds(np.zeros(n_cols + 1), np.r_[np.full(n_cols, split), np.inf]),
                   options={"time_limit": time_limit_s, "disp": False})
        if res.x is None:
            raise RuntimeError(f"MILP reference failed: {res.message}")
        x = np.round(res.x[:-1]) / split
        solver = "milp"
    load = prob.bg + prob.inc @ (rate_of_col * x)
    paths: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for d, dem in enumerate(prob.demands):
        shares = x[prob.col[d]: prob.col[d] + prob.n_cand[d]]
        paths[dem.key] = [(p, float(s)) for p, s in zip(prob.cands[d], shares, strict=True)
                          if s > 1e-9]
    util = load / prob.cap
    return Plan(paths, {int(lk): float(v) for lk, v in zip(prob.links, load - prob.bg,
                                                          strict=True)},
                float(util.max()), solver)


def gap(heuristic: Plan, reference: Plan) -> float:
    """Relative excess of the heuristic's ``lambda`` over the reference's.

    >>> gap(Plan({}, {}, 1.05), Plan({}, {}, 1.0))
    0.05
    """
    return round((heuristic.max_utilization - reference.max_utilization)
                 / max(reference.max_utilization, 1e-12), 12)
