"""Entropy steering: land a queue pair on a planned path by choosing its UDP source port.

A switch holds a few thousand forwarding rules, far fewer than the QPs of a large AlltoAll, so
the controller steers mainly *without* rules: every switch resolves its ECMP group with a hash
of the RoCEv2 5-tuple (:mod:`fabricpilot.net.hashing`), the only free field of that tuple is
the UDP source port of the QP (NICs let software set it per QP, e.g.
``mlx5dv_modify_qp_udp_sport``), so the controller searches the RoCE port range for a port
whose hash picks the planned next hop at every switch of the path. Where no port reaches the
path (hash polarisation across tiers, a path outside the ECMP groups, entropy disabled on the
NICs) it installs explicit 5-tuple rules at the switches where the hash disagrees, within each
switch's rule budget; a path that would overflow a switch's table is not pinned and follows its
hash.

The hash a switch applies, with its seed and the order of its ECMP group members, is read from
the data plane (:class:`~fabricpilot.controller.southbound.EcmpSpec`), never assumed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import itemgetter

import numba
import numpy as np
from numpy.typing import NDArray

from fabricpilot.controller.southbound import FabricView
from fabricpilot.net.hashing import (
    CRC32_TABLE,
    ROCE_UDP_PORT,
    UDP_PROTO,
    crc32_words,
    gpu_ip,
    switch_seed,
)

PORT_LO, PORT_HI = 0xC000, 0xFFFF  # the RoCE source-port range NICs draw from


@dataclass(frozen=True, slots=True)
class SteerRequest:
    """Put the QP of GPU ``src`` -> ``dst`` on ``path`` (link ids, GPU to GPU); ``start``
    spreads the search so that equal requests get different ports."""

    src: int
    dst: int
    path: tuple[int, ...]
    start: int = 0


@dataclass(frozen=True, slots=True)
class Steering:
    """A request's outcome: the source port, and the explicit rules ``(switch, link)`` it
    needs where the hash of that port leaves the path (empty: entropy alone steers it)."""

    port: int
    rules: tuple[tuple[str, int], ...]


def constraints(view: FabricView, dst: int, path: tuple[int, ...]
                ) -> list[tuple[str, tuple[int, ...], int]]:
    """The hash decisions along ``path``: ``(switch, group, index)`` for every switch whose
    ECMP group towards ``dst``'s leaf has a choice, with the index of the path's next link in
    that group (-1 if the link is not a member: only a rule can take it).

    >>> from fabricpilot.controller.southbound import EcmpSpec, LinkInfo
    >>> links = [LinkInfo(0, "g0", "l0", 100, 1), LinkInfo(1, "l0", "s0", 100, 1),
    ...          LinkInfo(2, "l0", "s1", 100, 1), LinkInfo(3, "s1", "l1", 100, 1),
    ...          LinkInfo(4, "l1", "g1", 100, 1)]
    >>> spec = EcmpSpec(0, False, True, {"l0": 0, "s1": 1}, {("l0", "l1"): (1, 2),
    ...                 ("s1", "l1"): (3,)}, {0: "l0", 1: "l1"})
    >>> v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu"}, {}, {0: "g0", 1: "g1"},
    ...                           ecmp=spec)
    >>> constraints(v, 1, (0, 2, 3, 4))
    [('l0', (1, 2), 1)]
    """
    spec = view.ecmp
    if spec is None:
        raise ValueError("the data plane does not describe its ECMP hash")
    leaf = spec.gpu_leaf[dst]
    out = []
    for link in path:
        sw = view.links[link].src
        group = spec.groups.get((sw, leaf))
        if group is None or (len(group) < 2 and link in group):
            continue
        out.append((sw, group, group.index(link) if link in group else -1))
    return out


@numba.njit(cache=True, nogil=True)
def _crc_bytes(crc: np.uint32, value: np.uint64, n_bytes: int, table: NDArray) -> np.uint32:
    for k in range(n_bytes - 1, -1, -1):
        byte = np.uint32((value >> np.uint64(8 * k)) & np.uint64(0xFF))
        crc = table[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc


@numba.njit(cache=True, nogil=True)
def _switch_hash(prefix: np.uint32, port: np.int64, rot: np.int64, table: NDArray) -> np.uint32:
    crc = _crc_bytes(prefix, np.uint64(port), 2, table)
    h = _crc_bytes(crc, np.uint64(ROCE_UDP_PORT), 2, table) ^ np.uint32(0xFFFFFFFF)
    if rot:
        h = (h >> np.uint32(rot)) | (h << np.uint32(32 - rot))
    return h


def _crc_register(init: int, n_rows: int, fields: list[tuple[NDArray[np.integer] | int, int]],
                  ) -> NDArray[np.uint32]:
    """The CRC-32 register (before the final inversion) after the big-endian bytes of
    ``fields`` (``(values, n_bytes)``; a value may be a scalar), starting from ``init``, for
    ``n_rows`` rows. The register is linear in its start and in the bytes: from 0, the
    register of a concatenation is the XOR of the registers of each field alone (the other
    fields zero), which :class:`SteeringTable` uses to split the switches' hash by field.

    >>> a = _crc_register(0, 1, [(np.array([7]), 2), (0, 1)])
    >>> b = _crc_register(0, 1, [(0, 2), (np.array([9]), 1)])
    >>> int(a[0] ^ b[0]) == int(_crc_register(0, 1, [(np.array([7]), 2), (np.array([9]), 1)])[0])
    True
    """
    crc = np.full(n_rows, init, np.uint32)
    for values, n_bytes in fields:
        v = np.broadcast_to(np.asarray(values).astype(np.uint64), (n_rows,))
        for shift in range(8 * (n_bytes - 1), -1, -8):
            byte = ((v >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.uint32)
            crc = CRC32_TABLE[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc


# The hash of a switch for a QP is the CRC-32 of seed (4 bytes) | src_ip (4) | dst_ip (4) |
# proto (1) | source port (2) | destination port (2), inverted, then (per-switch seeds)
# rotated. As the register is linear, it is the XOR of four terms: the switch's (its seed,
# with the constant fields and the start value), the source GPU's, the destination GPU's and
# the source port's, each with every other field zero.
_SEED, _IP, _PROTO, _PORT = 4, 4, 1, 2


def _switch_terms(seeds: NDArray[np.uint64]) -> NDArray[np.uint32]:
    """The switch term of the hash: seed and constant fields from the CRC start value, with
    the final inversion."""
    return _crc_register(0xFFFFFFFF, len(seeds), [
        (seeds, _SEED), (0, 2 * _IP), (UDP_PROTO, _PROTO), (0, _PORT),
        (ROCE_UDP_PORT, _PORT)]) ^ np.uint32(0xFFFFFFFF)


def _gpu_terms(n_gpus: int) -> tuple[NDArray[np.uint32], NDArray[np.uint32]]:
    """The source and destination terms of the hash of GPUs ``0 .. n_gpus - 1``."""
    ip = gpu_ip(np.arange(n_gpus, dtype=np.int64))
    src = _crc_register(0, n_gpus, [(0, _SEED), (ip, _IP), (0, _IP + _PROTO + 2 * _PORT)])
    dst = _crc_register(0, n_gpus, [(0, _SEED + _IP), (ip, _IP), (0, _PROTO + 2 * _PORT)])
    return src, dst


_PORT_TERMS: dict[bool, tuple[NDArray[np.int64], NDArray[np.uint32]]] = {}
_GPU_TERMS: list[tuple[NDArray[np.uint32], NDArray[np.uint32]]] = []
_DENSE_GPUS = 1 << 22  # GPU ids up to this index the GPU terms directly


def _port_terms(entropy: bool) -> tuple[NDArray[np.int64], NDArray[np.uint32]]:
    """The source ports a QP may use (the RoCE range, or the fixed RoCE port when the NICs'
    entropy is off) and each one's term of the hash (cached)."""
    hit = _PORT_TERMS.get(entropy)
    if hit is None:
        ports = (np.arange(PORT_LO, PORT_HI + 1, dtype=np.int64) if entropy
                 else np.array([ROCE_UDP_PORT], np.int64))
        terms = _crc_register(0, len(ports), [(0, _SEED + 2 * _IP + _PROTO), (ports, _PORT),
                                              (0, _PORT)])
        hit = _PORT_TERMS[entropy] = (ports, terms)
    return hit


def _gpu_rows(src: NDArray[np.int64], dst: NDArray[np.int64]
              ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.uint32],
                         NDArray[np.uint32]]:
    """Rows of the sources and destinations into their hash terms, and the terms: the GPU id
    itself (terms cached and grown as needed) unless ids are negative or very large."""
    hi = int(max(src.max(), dst.max())) + 1 if len(src) else 1
    lo = int(min(src.min(), dst.min())) if len(src) else 0
    if lo >= 0 and hi <= _DENSE_GPUS:
        if not _GPU_TERMS or len(_GPU_TERMS[0][0]) < hi:
            _GPU_TERMS[:] = [_gpu_terms(max(hi, 2 * len(_GPU_TERMS[0][0]) if _GPU_TERMS
                                            else hi))]
        a, b = _GPU_TERMS[0]
        return src, dst, a, b
    ids, inv = np.unique(np.concatenate((src, dst)), return_inverse=True)
    ip = gpu_ip(ids)
    n = len(ids)
    a = _crc_register(0, n, [(0, _SEED), (ip, _IP), (0, _IP + _PROTO + 2 * _PORT)])
    b = _crc_register(0, n, [(0, _SEED + _IP), (ip, _IP), (0, _PROTO + 2 * _PORT)])
    inv = inv.reshape(-1).astype(np.int64)
    return inv[:len(src)], inv[len(src):], a, b


@numba.njit(cache=True, nogil=True)
def _search_terms(src: NDArray, dst: NDArray, start: NDArray, mid: NDArray, c_ptr: NDArray,
                  c_term: NDArray, c_rot: NDArray, c_size: NDArray, c_want: NDArray,
                  a_term: NDArray, b_term: NDArray, p_term: NDArray, max_tries: int,
                  ) -> tuple[NDArray, NDArray]:  # pragma: no cover - compiled
    """For each request, the row (in the port list) of the port (tried from ``start`` on)
    whose hashes match the most of its switch path's constraints (it stops at the first
    that matches them all), and how many that port misses (more than the constraints when
    no port was tried). The hash of port row ``i`` at constraint ``c`` is ``c_term[c] ^
    a_term[src] ^ b_term[dst] ^ p_term[i]``, then rotated by ``c_rot[c]`` as
    :func:`_switch_hash` does (in 64 bits)."""
    n = start.shape[0]
    n_ports = p_term.shape[0]
    tries = min(max_tries, n_ports)
    best = np.empty(n, np.int64)
    n_miss = np.zeros(n, np.int64)
    for r in range(n):
        lo, hi = c_ptr[mid[r]], c_ptr[mid[r] + 1]
        best[r] = start[r] % n_ports
        if hi == lo:
            continue
        ab = np.uint64(a_term[src[r]] ^ b_term[dst[r]])
        best_miss = hi - lo + 1
        for t in range(tries):
            i = (start[r] + t) % n_ports
            pt = ab ^ np.uint64(p_term[i])
            miss = 0
            for c in range(lo, hi):
                if c_want[c] < 0:
                    miss += 1
                    continue
                h = np.uint64(c_term[c]) ^ pt
                rot = c_rot[c]
                if rot:
                    h = (h >> np.uint64(rot)) | (h << np.uint64(32 - rot))
                size = c_size[c]
                if size & (size - 1) == 0:  # a power of two: the remainder is the low bits
                    if h & np.uint64(size - 1) != np.uint64(c_want[c]):
                        miss += 1
                elif h % np.uint64(size) != np.uint64(c_want[c]):
                    miss += 1
            if miss < best_miss:
                best_miss = miss
                best[r] = i
                if miss == 0:
                    break
        n_miss[r] = best_miss
    return best, n_miss


@numba.njit(cache=True, nogil=True)
def _missed(rows: NDArray, src: NDArray, dst: NDArray, best: NDArray, mid: NDArray,
            c_ptr: NDArray, c_term: NDArray, c_rot: NDArray, c_size: NDArray,
            c_want: NDArray, a_term: NDArray, b_term: NDArray, p_term: NDArray,
            ) -> NDArray:  # pragma: no cover - compiled
    """For requests ``rows``: every constraint of theirs (request by request, in order)
    that the chosen port misses, as its index in the constraint arrays, or -1 for one it
    meets."""
    total = 0
    for k in range(rows.shape[0]):
        m = mid[rows[k]]
        total += c_ptr[m + 1] - c_ptr[m]
    out = np.full(total, -1, np.int64)
    q = 0
    for k in range(rows.shape[0]):
        r = rows[k]
        pt = np.uint64(a_term[src[r]] ^ b_term[dst[r]]) ^ np.uint64(p_term[best[r]])
        for c in range(c_ptr[mid[r]], c_ptr[mid[r] + 1]):
            h = np.uint64(c_term[c]) ^ pt
            rot = c_rot[c]
            if rot:
                h = (h >> np.uint64(rot)) | (h << np.uint64(32 - rot))
            if c_want[c] < 0 or h % np.uint64(c_size[c]) != np.uint64(c_want[c]):
                out[q] = c
            q += 1
    return out


class _Growing:
    """A 1-d array that grows at its end, its buffer doubled when full (appending ``k``
    values costs ``O(k)`` amortised, not a copy of the whole array).

    >>> a = _Growing(np.int64)
    >>> a.extend([1, 2]); a.extend(np.array([3])); a.values.tolist(), len(a)
    ([1, 2, 3], 3)
    """

    __slots__ = ("_buf", "_n")

    def __init__(self, dtype: type) -> None:
        self._buf = np.zeros(16, dtype)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def values(self) -> NDArray:
        """The array (a view of the buffer: valid until the next :meth:`extend`)."""
        return self._buf[:self._n]

    def extend(self, values: NDArray | list[int]) -> None:
        """Append ``values``."""
        v = np.asarray(values, self._buf.dtype)
        end = self._n + len(v)
        if end > len(self._buf):  # (room for half as much again: a bulk start has some)
            buf = np.empty(max(end + end // 2, 2 * len(self._buf)), self._buf.dtype)
            buf[:self._n] = self._buf[:self._n]
            self._buf = buf
        self._buf[self._n:end] = v
        self._n = end


class SteeringTable:
    """What steering needs of one fabric, kept across calls: the hash decisions
    (:func:`constraints`) of every switch path seen, interned (a switch path's id indexes
    flat arrays of its constraints) and each constraint's switch term of the hash.

    Constraints depend only on the switch links of a path (the links between its first and
    last link): a switch path's are derived from the first request that uses it and kept in
    ``cache`` (``{switch path: constraints}``, shared with :func:`steer` if given)."""

    def __init__(self, view: FabricView,
                 cache: dict[tuple[int, ...], list[tuple[str, tuple[int, ...], int]]]
                 | None = None) -> None:
        spec = view.ecmp
        if spec is None:
            raise ValueError("the data plane does not describe its ECMP hash")
        self.view = view
        self.spec = spec
        self.cache = cache if cache is not None else {}
        self.ids: dict[tuple[int, ...], int] = {}
        self.ports, self.port_term = _port_terms(spec.source_port_entropy)
        # hash decisions (switch, group, wanted member), by id; the ids of those given by
        # value (from ``cache``) and of the link each is towards a leaf (-1: none)
        self._dec: list[tuple[str, tuple[int, ...], int]] = []
        self._dec_by_value: dict[tuple[str, tuple[int, ...], int], int] = {}
        self._dec_of_link: dict[tuple[int, str], int] = {}
        self._ptr: list[int] = [0]   # switch path id -> its first constraint
        self._cons: list[int] = []   # constraint -> its decision
        # as arrays, extended as decisions and switch paths are added: per decision (switch
        # term, rotation, group size, wanted member), then per constraint the same, with the
        # offsets of the switch paths
        self._dec_arrays = tuple(_Growing(t) for t in (np.uint32, np.int64, np.int64, np.int64))
        self._arrays = tuple(_Growing(t) for t in (np.int64, np.uint32, np.int64, np.int64,
                                                   np.int64))
        self._arrays[0].extend([0])

    def _decision(self, link: int, leaf: str) -> int:
        """The id of the hash decision ``link`` is towards ``leaf`` (see :func:`constraints`),
        -1 if it is none (cached)."""
        key = (link, leaf)
        hit = self._dec_of_link.get(key)
        if hit is None:
            sw = self.view.links[link].src
            group = self.spec.groups.get((sw, leaf))
            if group is None or (len(group) < 2 and link in group):
                hit = -1
            else:
                hit = len(self._dec)
                self._dec.append((sw, group, group.index(link) if link in group else -1))
            self._dec_of_link[key] = hit
        return hit

    def _decision_id(self, dec: tuple[str, tuple[int, ...], int]) -> int:
        """The id of a hash decision ``(switch, group, wanted member)`` given by value (a
        constraint of ``cache``)."""
        hit = self._dec_by_value.get(dec)
        if hit is None:
            hit = self._dec_by_value[dec] = len(self._dec)
            self._dec.append(dec)
        return hit

    def intern(self, paths: list[tuple[int, ...]], dst: list[int] | NDArray[np.int64],
               ) -> NDArray[np.int64]:
        """The switch-path id of every path (``dst``: each path's destination GPU)."""
        get = self.ids.get
        mids = [p[1:-1] for p in paths]
        ids = [get(m, -1) for m in mids]
        if ids and min(ids) < 0:
            new = [r for r, i in enumerate(ids) if i < 0]
            # new switch path -> its first request (the last value a key is given, backwards)
            first = dict(zip(reversed([mids[r] for r in new]), reversed(new), strict=True))
            for m, r in sorted(first.items(), key=itemgetter(1)):  # in the order first met
                self._add(m, dst[r], paths[r])
            if 4 * len(new) < len(ids):  # (a few new: those looked up again)
                for r in new:
                    ids[r] = get(mids[r])
            else:
                ids = [get(m) for m in mids]
        return np.array(ids, np.int64)

    def _add(self, mid: tuple[int, ...], dst: int | np.integer, path: tuple[int, ...]) -> int:
        """Intern a new switch path: its constraints from ``cache``, or derived from
        ``path`` (as :func:`constraints`, link by link) and put in ``cache``."""
        cons = self.cache.get(mid)
        if cons is None:
            leaf = self.spec.gpu_leaf[int(dst)]
            of_link = self._dec_of_link
            dec = []
            for link in path:
                d = of_link.get((link, leaf))
                if d is None:
                    d = self._decision(link, leaf)
                if d >= 0:
                    dec.append(d)
            decisions = self._dec
            self.cache[mid] = [decisions[d] for d in dec]
        else:
            dec = [self._decision_id(c) for c in cons]
        self._cons.extend(dec)
        self._ptr.append(len(self._cons))
        i = self.ids[mid] = len(self._ptr) - 2
        return i

    def _flat(self) -> tuple[NDArray, ...]:
        """The constraint arrays: offsets per switch path, switch term, rotation, group size
        and wanted member (extended with the decisions and switch paths added since; the
        arrays grow in place, so a few new switch paths cost what they add, not a copy)."""
        ptr, term, rot, size, want = self._arrays
        if len(ptr) == len(self._ptr):
            return tuple(a.values for a in self._arrays)
        d_term, d_rot, d_size, d_want = self._dec_arrays
        if len(d_term) < len(self._dec):
            spec = self.spec
            new = self._dec[len(d_term):]
            index = spec.switch_index
            seeds = switch_seed(spec.base_seed, np.array([index[sw] for sw, _, _ in new],
                                                         np.int64), spec.per_switch_seed)
            d_term.extend(_switch_terms(seeds))
            d_rot.extend((seeds % np.uint64(32)).astype(np.int64) if spec.per_switch_seed
                         else np.zeros(len(seeds), np.int64))
            d_size.extend([len(g) for _, g, _ in new])
            d_want.extend([w for _, _, w in new])
        cons = np.array(self._cons[len(term):], np.int64)
        ptr.extend(self._ptr[len(ptr):])
        term.extend(d_term.values[cons])
        rot.extend(d_rot.values[cons])
        size.extend(d_size.values[cons])
        want.extend(d_want.values[cons])
        return tuple(a.values for a in self._arrays)

    def steer(self, src: NDArray[np.int64], dst: NDArray[np.int64], start: NDArray[np.int64],
              mid: NDArray[np.int64], paths: list[tuple[int, ...]], max_tries: int,
              ) -> tuple[list[int], dict[int, tuple[tuple[str, int], ...]]]:
        """Source ports that land requests (``src``, ``dst``, search ``start``, switch-path
        id ``mid`` from :meth:`intern`, full path) on their paths, and the rules still needed
        by the requests that need some (request -> ``(switch, link)`` rules)."""
        ptr, term, rot, size, want = self._flat()
        s_row, d_row, a_term, b_term = _gpu_rows(src, dst)
        best, n_miss = _search_terms(s_row, d_row, start, mid, ptr, term, rot, size, want,
                                     a_term, b_term, self.port_term, max_tries)
        ports = self.ports[best].tolist()
        rules: dict[int, tuple[tuple[str, int], ...]] = {}
        rows = np.flatnonzero(n_miss)
        if len(rows):
            missed = _missed(rows, s_row, d_row, best, mid, ptr, term, rot, size, want,
                             a_term, b_term, self.port_term)
            links = self.view.links
            q = 0
            for r, m in zip(rows.tolist(), mid[rows].tolist(), strict=True):
                n_c = self._ptr[m + 1] - self._ptr[m]
                hit = [c for c in missed[q:q + n_c].tolist() if c >= 0]
                q += n_c
                if hit:
                    path = paths[r]
                    rules[r] = tuple(
                        (sw, next(lk for lk in path if links[lk].src == sw))
                        for sw in (self._dec[self._cons[c]][0] for c in hit))
        return ports, rules


_WARM: list[bool] = []


def warm_up() -> None:
    """Load the steering kernels (from numba's cache, or compile them) once per process, so
    that neither the first plan nor a failure re-plan pays for it.

    >>> warm_up()
    """
    if _WARM:
        return
    _, port_term = _port_terms(False)
    one = np.zeros(1, np.int64)
    term = _switch_terms(np.zeros(1, np.uint64))
    a_term, b_term = _gpu_terms(1)
    ptr = np.array([0, 1], np.int64)
    best, _ = _search_terms(one, one, one, one, ptr, term, one, one + 2, one, a_term, b_term,
                            port_term, 1)
    _missed(one, one, one, best, one, ptr, term, one, one + 2, one, a_term, b_term, port_term)
    _WARM.append(True)


def steer(view: FabricView, requests: list[SteerRequest], *, max_tries: int = 1024,
          cache: dict[tuple[int, ...], list[tuple[str, tuple[int, ...], int]]] | None = None,
          table: SteeringTable | None = None) -> list[Steering]:
    """Source ports that land each request on its path, and the rules still needed.

    Each request tries up to ``max_tries`` ports of the RoCE range (there is only one when
    the NICs' entropy is off), keeping the port that leaves the fewest switches disagreeing;
    a rule is needed at each of those (and at every switch whose group does not contain the
    path's link). Constraints depend only on the switch links of the path, so they are
    derived once per switch path (and kept in ``cache`` across calls if one is given, or in
    ``table``, a :class:`SteeringTable` of this view, which also keeps their arrays).
    """
    if table is None:
        table = SteeringTable(view, cache)
    paths = [q.path for q in requests]
    dst_l = [q.dst for q in requests]
    mid = table.intern(paths, dst_l)
    src = np.array([q.src for q in requests], np.int64)
    dst = np.array(dst_l, np.int64)
    start = np.array([q.start for q in requests], np.int64)
    ports, rules = table.steer(src, dst, start, mid, paths, max_tries)
    return [Steering(p, rules.get(r, ())) for r, p in enumerate(ports)]


def hash_path(view: FabricView, src: int, dst: int, port: int) -> tuple[int, ...]:
    """The path the switches' hashes give a QP with source ``port`` (no rules): what a
    request that could not be steered or pinned actually takes."""
    spec = view.ecmp
    if spec is None:
        raise ValueError("the data plane does not describe its ECMP hash")
    g = view.graph
    a, b = view.gpu_node[src], view.gpu_node[dst]
    leaf = spec.gpu_leaf[dst]
    first = spec.gpu_leaf[src]
    path = [view.link_between(a, first)]
    cur = first
    while cur != leaf:
        group = spec.groups[(cur, leaf)]
        seed = switch_seed(spec.base_seed, np.array([spec.switch_index[cur]]),
                           spec.per_switch_seed)
        prefix = crc32_words([(seed, 4), (gpu_ip(np.array([src])), 4),
                              (gpu_ip(np.array([dst])), 4), (np.array([UDP_PROTO]), 1)])
        rot = int(seed[0] % 32) if spec.per_switch_seed else 0
        h = _switch_hash(np.uint32(prefix[0] ^ np.uint32(0xFFFFFFFF)), np.int64(port),
                         np.int64(rot), CRC32_TABLE)
        link = group[int(h) % len(group)]
        path.append(link)
        cur = view.links[link].dst
    path.append(int(g[leaf][b]["link_id"]))
    return tuple(path)


def rules_per_switch(steerings: list[Steering]) -> Counter[str]:
    """How many explicit rules each switch holds for these steerings.

    >>> rules_per_switch([Steering(1, (("l0", 3),)), Steering(2, (("l0", 4), ("s1", 7)))])
    Counter({'l0': 2, 's1': 1})
    """
    return Counter(sw for s in steerings for sw, _ in s.rules)
