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

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
from numpy.typing import NDArray

from fabricpilot.controller.planner import _offsets, _ranges, in_parts
from fabricpilot.controller.southbound import FabricView, PathColumn
from fabricpilot.net.hashing import (
    CRC32_TABLE,
    ROCE_UDP_PORT,
    UDP_PROTO,
    crc32_words,
    gpu_ip,
    switch_seed,
)

PORT_LO, PORT_HI = 0xC000, 0xFFFF  # the RoCE source-port range NICs draw from


# what steering gives: each request's source port (a list, or one array where asked) and
# the explicit rules of the requests that need some (request -> (switch, link) rules)
Steered = tuple[list[int] | NDArray[np.int64], dict[int, tuple[tuple[str, int], ...]]]


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


# candidate tuples a steering table keeps the ids of (by identity, holding the tuple): past
# this many it starts again (tuples of demands long gone would pile up)
_TUPLE_MEMO_MAX = 1 << 16


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


# the largest ECMP group whose members' ports the entropy search indexes by hash value (a
# table of this many values per rotation and size; larger groups: port by port)
_INDEX_MAX_SIZE = 4096


def qp_search_starts(pairs: NDArray[np.int64], n_per_key: NDArray[np.int64],
                     ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Each QP's source and destination GPU and where its port search starts, for keys of
    GPU ``pairs`` (rows: source, destination) with ``n_per_key`` QPs each, in order: QP
    ``q`` of a key starts at ``(src * 1_000_003 + dst) * 64 + q`` (the keys' searches
    spread, and the same in every run).

    >>> src, dst, start = qp_search_starts(np.array([[1, 2], [3, 0]]), np.array([2, 1]))
    >>> src.tolist(), dst.tolist(), start.tolist()
    ([1, 1, 3], [2, 2, 0], [64000320, 64000321, 192000576])
    """
    if pairs.shape != (len(n_per_key), 2):
        raise ValueError("one (source, destination) row per key")
    return _qp_search_starts(np.ascontiguousarray(pairs, np.int64),
                             np.ascontiguousarray(n_per_key, np.int64))


@numba.njit(cache=True, nogil=True)
def _qp_search_starts(pairs: NDArray[np.int64], n_per_key: NDArray[np.int64],
                      ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """:func:`qp_search_starts` (arguments checked)."""
    n_q = 0
    for k in range(len(n_per_key)):
        n_q += n_per_key[k]
    src = np.empty(n_q, np.int64)
    dst = np.empty(n_q, np.int64)
    start = np.empty(n_q, np.int64)
    q = 0
    for k in range(len(n_per_key)):
        a, b = pairs[k, 0], pairs[k, 1]
        base = (a * 1_000_003 + b) * 64
        for i in range(n_per_key[k]):
            src[q] = a
            dst[q] = b
            start[q] = base + i
            q += 1
    return src, dst, start


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
    best = np.empty(n, np.int64)
    n_miss = np.zeros(n, np.int64)
    for r in range(n):
        best[r], n_miss[r] = _scan_ports(r, src, dst, start, mid, c_ptr, c_term, c_rot, c_size,
                                         c_want, a_term, b_term, p_term, max_tries)
    return best, n_miss


@numba.njit(cache=True, nogil=True, inline="always")
def _scan_ports(r: int, src: NDArray, dst: NDArray, start: NDArray, mid: NDArray,
                c_ptr: NDArray, c_term: NDArray, c_rot: NDArray, c_size: NDArray,
                c_want: NDArray, a_term: NDArray, b_term: NDArray, p_term: NDArray,
                max_tries: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """Request ``r`` of :func:`_search_terms`: its port row and misses, port by port."""
    n_ports = p_term.shape[0]
    tries = min(max_tries, n_ports)
    lo, hi = c_ptr[mid[r]], c_ptr[mid[r] + 1]
    best = start[r] % n_ports
    if hi == lo:
        return best, 0
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
            best = i
            if miss == 0:
                break
    return best, best_miss


@numba.njit(cache=True, nogil=True)
def _search_indexed(src: NDArray, dst: NDArray, start: NDArray, mid: NDArray, c_ptr: NDArray,
                    c_term: NDArray, c_rot: NDArray, c_size: NDArray, c_want: NDArray,
                    a_term: NDArray, b_term: NDArray, p_term: NDArray, max_tries: int,
                    c_tab: NDArray, t_order: NDArray, t_start: NDArray,
                    ) -> tuple[NDArray, NDArray]:  # pragma: no cover - compiled
    """:func:`_search_terms`, the same ports, with the ports indexed by hash: a 32-bit hash
    rotated and cut to a power of two (the low bits) is linear in the XOR of its terms, so
    the ports that meet a request's first constraint are those whose own term gives one
    value, ``want ^ g(c_term ^ a_term ^ b_term)``. Table ``c_tab[c]`` (of the constraint's
    rotation and size; -1: none) lists the port rows by that value: value ``v``'s rows,
    ascending, are ``t_order[t, t_start[t, v]:t_start[t, v + 1]]``. The first of them from
    ``start`` on (cyclically, within the tries) that meets the other constraints too is the
    port the scan would stop at; a request with no such port, or a constraint without a
    table, is scanned port by port."""
    n = start.shape[0]
    best = np.empty(n, np.int64)
    n_miss = np.empty(n, np.int64)
    _search_indexed_into(src, dst, start, mid, c_ptr, c_term, c_rot, c_size, c_want, a_term,
                         b_term, p_term, max_tries, c_tab, t_order, t_start, best, n_miss)
    return best, n_miss


@numba.njit(cache=True, nogil=True)
def _search_indexed_into(src: NDArray, dst: NDArray, start: NDArray, mid: NDArray,
                         c_ptr: NDArray, c_term: NDArray, c_rot: NDArray, c_size: NDArray,
                         c_want: NDArray, a_term: NDArray, b_term: NDArray, p_term: NDArray,
                         max_tries: int, c_tab: NDArray, t_order: NDArray, t_start: NDArray,
                         best: NDArray, n_miss: NDArray) -> None:  # pragma: no cover - compiled
    """:func:`_search_indexed`, its results written into ``best`` and ``n_miss`` (one row
    per request: the two halves of a plan's requests write theirs into one array each)."""
    n = start.shape[0]
    n_ports = p_term.shape[0]
    tries = min(max_tries, n_ports)
    for r in range(n):
        lo, hi = c_ptr[mid[r]], c_ptr[mid[r] + 1]
        s0 = start[r] % n_ports
        best[r] = s0
        n_miss[r] = 0
        if hi == lo:
            continue
        found = -1
        indexed = True
        for c in range(lo, hi):
            if c_tab[c] < 0 or c_want[c] < 0 or c_want[c] >= c_size[c]:
                indexed = False
        if indexed:
            ab = np.uint64(a_term[src[r]] ^ b_term[dst[r]])
            t = c_tab[lo]
            h = np.uint64(c_term[lo]) ^ ab
            rot = c_rot[lo]
            if rot:
                h = (h >> np.uint64(rot)) | (h << np.uint64(32 - rot))
            v = np.int64(h & np.uint64(c_size[lo] - 1)) ^ c_want[lo]
            p0, p1 = t_start[t, v], t_start[t, v + 1]
            k = p0 + np.searchsorted(t_order[t, p0:p1], s0)
            for m in range(p1 - p0):
                q = k + m
                if q >= p1:
                    q -= p1 - p0
                i = t_order[t, q]
                if (i - s0) % n_ports >= tries:
                    break
                pt = ab ^ np.uint64(p_term[i])
                ok = True
                for c in range(lo + 1, hi):
                    hc = np.uint64(c_term[c]) ^ pt
                    rc = c_rot[c]
                    if rc:
                        hc = (hc >> np.uint64(rc)) | (hc << np.uint64(32 - rc))
                    if hc & np.uint64(c_size[c] - 1) != np.uint64(c_want[c]):
                        ok = False
                        break
                if ok:
                    found = i
                    break
        if found >= 0:
            best[r] = found
        else:
            best[r], n_miss[r] = _scan_ports(r, src, dst, start, mid, c_ptr, c_term, c_rot,
                                             c_size, c_want, a_term, b_term, p_term,
                                             max_tries)


@numba.njit(cache=True, nogil=True)
def _table_of(rot: NDArray[np.int64], size: NDArray[np.int64], max_size: int,
              ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:  # pragma: no cover - compiled
    """Per constraint (rotation ``rot``, group size ``size``), the number of its port index
    table (-1: a size not a power of two up to ``max_size``, or a rotation outside 0-31),
    the tables numbered by their codes ``rot * (max_size + 1) + size``, ascending; and those
    codes (one pass: the codes met are marked, not sorted)."""
    n_codes = 32 * (max_size + 1)
    seen = np.zeros(n_codes, np.bool_)
    code = np.full(len(size), -1, np.int64)
    for c in range(len(size)):
        sz = size[c]
        if 0 < sz <= max_size and sz & (sz - 1) == 0 and 0 <= rot[c] < 32:
            code[c] = rot[c] * (max_size + 1) + sz
            seen[code[c]] = True
    lut = np.full(n_codes, -1, np.int64)
    n = 0
    for k in range(n_codes):
        if seen[k]:
            lut[k] = n
            n += 1
    combos = np.empty(n, np.int64)
    for k in range(n_codes):
        if seen[k]:
            combos[lut[k]] = k
    for c in range(len(size)):
        if code[c] >= 0:
            code[c] = lut[code[c]]
    return code, combos


def _port_index(p_term: NDArray[np.uint32], rot: int, size: int,
                ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The port rows by the value their term gives at a constraint of rotation ``rot`` and
    size ``size`` (a power of two): ``order[start[v]:start[v + 1]]`` are the rows of value
    ``v``, ascending (:func:`_search_indexed`).

    >>> order, start = _port_index(np.array([5, 2, 7, 4], np.uint32), 0, 4)
    >>> [order[start[v]:start[v + 1]].tolist() for v in range(4)]
    [[3], [0], [1], [2]]
    """
    h = p_term.astype(np.uint64)
    if rot:
        h = (h >> np.uint64(rot)) | (h << np.uint64(32 - rot))
    value = (h & np.uint64(size - 1)).astype(np.int64)
    order = np.argsort(value, kind="stable").astype(np.int64)
    return order, np.searchsorted(value[order], np.arange(size + 1)).astype(np.int64)


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


@numba.njit(cache=True, nogil=True)
def _path_constraints(flat: NDArray, path_ptr: NDArray, path_leaf: NDArray, link_sw: NDArray,
                      grp: NDArray, g_ptr: NDArray, g_links: NDArray, link_grp: NDArray,
                      link_pos: NDArray,
                      ) -> tuple[NDArray, NDArray, NDArray, NDArray]:  # pragma: no cover
    """:func:`constraints` of many paths at once, by index: path ``r`` is ``flat[path_ptr[r]:
    path_ptr[r + 1]]`` (link ids) towards leaf ``path_leaf[r]``; ``link_sw[link]`` is the
    switch a link leaves (-1: none with groups), ``grp[switch, leaf]`` its group (-1: none)
    and group ``g``'s members are ``g_links[g_ptr[g]:g_ptr[g + 1]]``; a link member of one
    group only is its member ``link_pos[link]`` of group ``link_grp[link]`` (-1: of none or
    several: looked for). Returns each path's number of constraints, then per constraint
    its switch, group size and wanted member."""
    n = path_ptr.shape[0] - 1
    count = np.zeros(n, np.int64)
    most = path_ptr[n] - path_ptr[0] if n > 0 else 0  # (a constraint per link at most)
    out_sw = np.empty(most, np.int64)
    out_size = np.empty(most, np.int64)
    out_want = np.empty(most, np.int64)
    q = 0
    for r in range(n):
        leaf = path_leaf[r]
        start = q
        for k in range(path_ptr[r], path_ptr[r + 1]):
            link = flat[k]
            sw = link_sw[link]
            if sw < 0:
                continue
            g = grp[sw, leaf]
            if g < 0:
                continue
            lo, hi = g_ptr[g], g_ptr[g + 1]
            pos = -1
            if link_grp[link] == g:
                pos = link_pos[link]
            else:
                for m in range(lo, hi):
                    if g_links[m] == link:
                        pos = m - lo
                        break
            if hi - lo < 2 and pos >= 0:  # (no choice)
                continue
            out_sw[q] = sw
            out_size[q] = hi - lo
            out_want[q] = pos
            q += 1
        count[r] = q - start
    return count, out_sw[:q], out_size[:q], out_want[:q]


def _link_members(g_ptr: NDArray[np.int64], g_links: NDArray[np.int64], n_links: int,
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Of every link id below ``n_links``, the one group it is a member of (group ``g``'s
    members are ``g_links[g_ptr[g]:g_ptr[g + 1]]``) and its place there; -1 for both if it
    is in none or in several.

    >>> grp, pos = _link_members(np.array([0, 2, 3, 5]), np.array([4, 1, 2, 3, 4]), 6)
    >>> grp.tolist(), pos.tolist()
    ([-1, 0, 1, 2, -1, -1], [-1, 1, 0, 0, -1, -1])
    """
    sizes = g_ptr[1:] - g_ptr[:-1]
    owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    place = np.arange(len(g_links), dtype=np.int64) - np.repeat(g_ptr[:-1], sizes)
    times = np.bincount(g_links, minlength=n_links)
    link_grp = np.full(n_links, -1, np.int64)
    link_pos = np.full(n_links, -1, np.int64)
    once = (times[g_links] == 1) & (g_links < n_links)  # (a link past them: looked for)
    link_grp[g_links[once]] = owner[once]
    link_pos[g_links[once]] = place[once]
    return link_grp, link_pos


def _path_links(paths: list[tuple[int, ...]]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each path's number of links, and all their links in turn.

    >>> [a.tolist() for a in _path_links([(1, 2), (3,)])]
    [[2, 1], [1, 2, 3]]
    """
    per = np.fromiter(map(len, paths), np.int64, len(paths))
    return per, np.fromiter(itertools.chain.from_iterable(paths), np.int64, int(per.sum()))


def _wrapped_links(heads: NDArray[np.int64], mids: list[tuple[int, ...]],
                   tails: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """:func:`_path_links` of the paths ``(heads[i], *mids[i], tails[i])``, without making
    them.

    >>> [a.tolist() for a in _wrapped_links(np.array([1, 5]), [(2, 3), ()], np.array([4, 6]))]
    [[4, 2], [1, 2, 3, 4, 5, 6]]
    """
    m_len, m_flat = _path_links(mids)
    per = m_len + 2
    start = _offsets(per)[:-1]
    flat = np.empty(int(per.sum()), np.int64)
    flat[start] = heads
    flat[start + per - 1] = tails
    flat[_ranges(start + 1, m_len)] = m_flat
    return per, flat


class _CompiledView(NamedTuple):
    """A view as the compiled constraint pass reads it (:meth:`SteeringTable._compiled_view`):
    the switch each link leaves (-1: none with groups), each (switch, leaf)'s ECMP group
    (-1: none), the groups' members (``g_links[g_ptr[g]:g_ptr[g + 1]]``), each GPU's leaf,
    and each link's one group and place there (:func:`_link_members`)."""

    link_sw: NDArray[np.int64]
    grp: NDArray[np.int64]
    g_ptr: NDArray[np.int64]
    g_links: NDArray[np.int64]
    gpu_leaf: NDArray[np.int64]
    link_grp: NDArray[np.int64]
    link_pos: NDArray[np.int64]

    def constraints(self, rows: tuple[NDArray, NDArray, NDArray],
                    ) -> tuple[NDArray, NDArray, NDArray, NDArray]:
        """:func:`_path_constraints` of paths as :func:`_path_rows` gives them (a whole
        plan's in parts on both threads: :func:`~fabricpilot.controller.planner.in_parts`)."""
        flat, ptr, leaf = rows

        def part(lo: int, hi: int) -> tuple[NDArray, NDArray, NDArray, NDArray]:
            return _path_constraints(flat, ptr[lo:hi + 1], leaf[lo:hi], self.link_sw,
                                     self.grp, self.g_ptr, self.g_links, self.link_grp,
                                     self.link_pos)

        got = in_parts(part, len(leaf))
        if len(got) == 1:
            return got[0]
        return tuple(np.concatenate(arrays) for arrays in zip(*got, strict=True))  # type: ignore[return-value]


def _path_rows(paths: Sequence[tuple[int, ...]], dst: NDArray[np.int64],
               compiled: _CompiledView,
               links: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None,
               ) -> tuple[NDArray, NDArray, NDArray] | None:
    """The links of ``paths`` (flat, with offsets; ``links``: :func:`_path_links` of them,
    if made already) and each one's destination leaf, as :func:`_path_constraints` reads
    them; ``None`` if a link or GPU is not in the compiled view (``compiled``, see
    :meth:`SteeringTable._compiled_view`)."""
    link_sw, gpu_leaf = compiled.link_sw, compiled.gpu_leaf
    per, flat = _path_links(paths) if links is None else links
    to = np.array(dst, np.int64)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= len(link_sw)):
        return None
    if len(to) and (int(to.min()) < 0 or int(to.max()) >= len(gpu_leaf)):
        return None
    leaf = gpu_leaf[to]
    if len(leaf) and int(leaf.min()) < 0:
        return None
    return flat, _offsets(per), leaf


def _two_spine_view() -> FabricView:
    """The fabric of the examples: GPU 0 on leaf ``l0`` (link 0), GPU 1 on leaf ``l1`` (link
    5), two spines between them (``l0`` up by links 1 and 2, down to ``l1`` by 3 and 4),
    one ECMP group (``l0``'s uplinks towards ``l1``) and one hash seed for every switch.

    >>> [(lk.src, lk.dst) for lk in _two_spine_view().links.values()][1:3]
    [('l0', 's0'), ('l0', 's1')]
    """
    from fabricpilot.controller.southbound import EcmpSpec, LinkInfo

    links = [LinkInfo(0, "g0", "l0", 100, 1), LinkInfo(1, "l0", "s0", 100, 1),
             LinkInfo(2, "l0", "s1", 100, 1), LinkInfo(3, "s0", "l1", 100, 1),
             LinkInfo(4, "s1", "l1", 100, 1), LinkInfo(5, "l1", "g1", 100, 1)]
    spec = EcmpSpec(0, False, True, {"l0": 0, "s0": 1, "s1": 2}, {("l0", "l1"): (1, 2)},
                    {0: "l0", 1: "l1"})
    return FabricView.from_links(links, {"g0": "gpu", "g1": "gpu"}, {}, {0: "g0", 1: "g1"},
                                 ecmp=spec)


class SteeringTable:
    """What steering needs of one fabric, kept across calls: the hash decisions
    (:func:`constraints`) of every switch path seen, interned (a switch path's id indexes
    flat arrays of its constraints: switch, its hash term and rotation, group size, wanted
    member).

    Constraints depend only on the switch links of a path (the links between its first and
    last link): a switch path's are derived from the first request that uses it, all the new
    ones of a call at once (compiled, over arrays of the view's links and groups). If a
    ``cache`` (``{switch path: constraints}``, shared with :func:`steer`) is given, they are
    taken from it and put in it instead, path by path. A whole plan's paths, mostly new to
    a fresh controller, are steered without interning (:meth:`steer_paths`): deriving the
    constraints of all of them at once costs less than finding which switch paths are
    new."""

    def __init__(self, view: FabricView,
                 cache: dict[tuple[int, ...], list[tuple[str, tuple[int, ...], int]]]
                 | None = None) -> None:
        spec = view.ecmp
        if spec is None:
            raise ValueError("the data plane does not describe its ECMP hash")
        self.view = view
        self.spec = spec
        self.cache = cache
        self.ids: dict[tuple[int, ...], int] = {}
        self.ports, self.port_term = _port_terms(spec.source_port_entropy)
        # (the ports as int objects, one per port: a million QPs' ports share them)
        self._port_ints = self.ports.astype(object)
        # the switches (by index): name, hash term and rotation
        self._sw_names = list(spec.switch_index)
        self._sw_ix = {sw: i for i, sw in enumerate(self._sw_names)}
        seeds = switch_seed(spec.base_seed, np.fromiter(spec.switch_index.values(), np.int64,
                                                        len(spec.switch_index)),
                            spec.per_switch_seed)
        self._sw_term = _switch_terms(seeds)
        self._sw_rot = ((seeds % np.uint64(32)).astype(np.int64) if spec.per_switch_seed
                        else np.zeros(len(seeds), np.int64))
        # per switch path: offsets of its constraints; per constraint: switch, its term and
        # rotation, group size, wanted member (arrays grown in place as paths are added)
        self._arrays = tuple(_Growing(t) for t in (np.int64, np.uint32, np.int64, np.int64,
                                                   np.int64))
        self._arrays[0].extend([0])
        self._c_sw = _Growing(np.int64)
        # candidate tuple (by identity) -> the tuple and its switch paths' ids (-1: not yet)
        self._by_tuple: dict[int, tuple[tuple[tuple[int, ...], ...], NDArray[np.int64]]] = {}
        # (made at first use; () if not compilable)
        self._compiled: _CompiledView | tuple[()] | None = None
        # (rotation, group size) -> the ports by the value their term gives there
        self._port_index: dict[tuple[int, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}

    def compile(self) -> None:
        """Make the arrays of the view that steering reads (done at first use otherwise)."""
        self._compiled_view()

    def _compiled_view(self) -> _CompiledView | None:
        """The view as arrays for :func:`_path_constraints` (link -> switch, (switch, leaf)
        -> group, group members) and GPU -> leaf; ``None`` if link or GPU ids are not small
        non-negative integers (then constraints are derived path by path)."""
        if self._compiled is None:
            self._compiled = ()  # (until made: not compilable)
            spec, links = self.spec, self.view.links
            ids = np.fromiter(links, np.int64, len(links))
            gpus = np.fromiter(spec.gpu_leaf, np.int64, len(spec.gpu_leaf))
            if (not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= 1 << 24
                    or not len(gpus) or int(gpus.min()) < 0 or int(gpus.max()) >= 1 << 24):
                return None
            leaves = {leaf: i for i, leaf in enumerate(dict.fromkeys(
                [*spec.gpu_leaf.values(), *(leaf for _, leaf in spec.groups)]))}
            gpu_leaf = np.full(int(gpus.max()) + 1, -1, np.int64)
            gpu_leaf[gpus] = [leaves[leaf] for leaf in spec.gpu_leaf.values()]
            sw_ix = self._sw_ix
            link_sw = np.full(int(ids.max()) + 1, -1, np.int64)
            link_sw[ids] = [sw_ix.get(li.src, -1) for li in links.values()]
            grp = np.full((len(sw_ix), len(leaves)), -1, np.int64)
            members: dict[tuple[int, ...], int] = {}
            for (sw, leaf), group in spec.groups.items():
                i = sw_ix.get(sw)
                if i is not None:
                    grp[i, leaves[leaf]] = members.setdefault(group, len(members))
            g_ptr = _offsets(np.fromiter(map(len, members), np.int64, len(members)))
            g_links = np.fromiter(itertools.chain.from_iterable(members), np.int64,
                                  int(g_ptr[-1]))
            self._compiled = _CompiledView(link_sw, grp, g_ptr, g_links, gpu_leaf,
                                           *_link_members(g_ptr, g_links, len(link_sw)))
        return self._compiled or None

    def intern(self, paths: list[tuple[int, ...]], dst: list[int] | NDArray[np.int64],
               ) -> NDArray[np.int64]:
        """The switch-path id of every path (``dst``: each path's destination GPU)."""
        return self._intern((p[1:-1] for p in paths), len(paths), paths.__getitem__, dst)

    def intern_candidates(self, tuples: Sequence[tuple[tuple[int, ...], ...]],
                          tup: NDArray[np.int64], cand: NDArray[np.int64],
                          heads: NDArray[np.int64], tails: NDArray[np.int64],
                          dst: NDArray[np.int64]) -> NDArray[np.int64]:
        """The switch-path id of each request ``r``: candidate ``cand[r]`` of candidate tuple
        ``tuples[tup[r]]`` (a tuple of switch paths: the links between a path's first and
        last link), on a path from head link ``heads[r]`` to tail link ``tails[r]`` towards
        GPU ``dst[r]``. The ids are kept per tuple by identity as they are found (a
        controller's candidate tuples live across plans: a re-plan interns no path again),
        and only the candidates some request takes are interned.

        >>> v = _two_spine_view()
        >>> table, spines = SteeringTable(v), ((1, 3), (2, 4))
        >>> def ask(c): return table.intern_candidates(
        ...     [spines], np.zeros(len(c), np.int64), np.array(c), *(np.full(len(c), x)
        ...                                                    for x in (0, 5, 1)))
        >>> ask([1, 1]).tolist(), len(table.ids)  # (one candidate taken: one interned)
        ([0, 0], 1)
        >>> ask([0, 1]).tolist(), table.intern([(0, 1, 3, 5)], [1]).tolist()
        ([1, 0], [1])
        """
        memo = self._by_tuple
        # (the tuples used, ascending, and each request's among them: by counting, not sorting)
        seen = np.bincount(tup, minlength=len(tuples)) > 0
        used = np.flatnonzero(seen)
        at_used = (np.cumsum(seen) - 1)[tup]
        known = []
        for u in used.tolist():
            t = tuples[u]
            hit = memo.get(id(t))
            if hit is None or hit[0] is not t:
                if len(memo) >= _TUPLE_MEMO_MAX:
                    memo.clear()
                hit = memo[id(t)] = (t, np.full(len(t), -1, np.int64))
            known.append(hit[1])
        at = _offsets(np.fromiter(map(len, known), np.int64, len(known)))
        flat = np.concatenate(known) if known else np.zeros(0, np.int64)
        pos = at[at_used] + cand
        ids = flat[pos]
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            new_pos, rep = np.unique(pos[missing], return_index=True)
            reqs = missing[rep]
            r_tup, r_cand = tup[reqs].tolist(), cand[reqs].tolist()
            sw = [tuples[t][c] for t, c in zip(r_tup, r_cand, strict=True)]
            r_head, r_tail = heads[reqs], tails[reqs]
            head, tail = r_head.tolist(), r_tail.tolist()
            got = self._intern(
                iter(sw), len(sw), lambda r: (head[r], *sw[r], tail[r]), dst[reqs],
                lambda rs: _wrapped_links(r_head[rs], [sw[r] for r in rs.tolist()],
                                          r_tail[rs]))
            flat[new_pos] = got
            ids = flat[pos]
            for j in np.unique(np.searchsorted(at, new_pos, side="right") - 1).tolist():
                known[j][:] = flat[at[j]:at[j + 1]]  # (the tuple's ids, in its memo)
        return ids

    def _intern(self, switch_paths: Iterator[tuple[int, ...]], n: int,
                path_of: Callable[[int], tuple[int, ...]], dst: list[int] | NDArray[np.int64],
                links_of: Callable[[NDArray[np.int64]], tuple[NDArray[np.int64],
                                                              NDArray[np.int64]]] | None = None,
                ) -> NDArray[np.int64]:
        """The id of each of the ``n`` switch paths, new ones added with the constraints of
        their first request (``path_of(r)``: request ``r``'s whole path; ``dst[r]``: its
        destination GPU; ``links_of(rs)``, if given: :func:`_path_links` of requests
        ``rs``' paths, made without the paths)."""
        ids_of = self.ids
        n0 = len(ids_of)
        add = ids_of.setdefault  # (a new switch path gets the next id)
        ids = np.fromiter((add(p, len(ids_of)) for p in switch_paths), np.int64, n)
        if len(ids_of) > n0:  # the new ones' constraints, from their first requests
            rows = np.flatnonzero(ids >= n0)
            _, first = np.unique(ids[rows], return_index=True)
            firsts = rows[first]
            try:
                self._add(lambda: [path_of(r) for r in firsts.tolist()],
                          np.asarray(dst, np.int64)[firsts],
                          None if links_of is None else lambda: links_of(firsts))
            except BaseException:
                for m in list(itertools.islice(ids_of, n0, None)):
                    del ids_of[m]
                raise
        return ids

    def _add(self, paths_of: Callable[[], list[tuple[int, ...]]], dst: NDArray[np.int64],
             links_of: Callable[[], tuple[NDArray[np.int64], NDArray[np.int64]]] | None = None,
             ) -> None:
        """Append the constraints of new switch paths (one request each, in id order: the
        whole paths ``paths_of()``, or their links ``links_of()`` where those do)."""
        compiled = self._compiled_view() if self.cache is None else None
        paths: list[tuple[int, ...]] = []
        if compiled is not None and links_of is not None:
            rows = _path_rows(paths, dst, compiled, links_of())
        else:
            paths = paths_of()
            rows = _path_rows(paths, dst, compiled) if compiled is not None else None
        if rows is None and not paths:
            paths = paths_of()
        if compiled is not None and rows is not None:
            count, c_sw, c_size, c_want = compiled.constraints(rows)
        else:  # path by path, through ``cache`` if given
            cache, sw_ix = self.cache, self._sw_ix
            count_l, sw_l, size_l, want_l = [], [], [], []
            for p, d in zip(paths, dst.tolist(), strict=True):
                cons = cache.get(p[1:-1]) if cache is not None else None
                if cons is None:
                    cons = constraints(self.view, d, p)
                    if cache is not None:
                        cache[p[1:-1]] = cons
                count_l.append(len(cons))
                for sw, group, want in cons:
                    sw_l.append(sw_ix[sw])
                    size_l.append(len(group))
                    want_l.append(want)
            count = np.array(count_l, np.int64)
            c_sw, c_size, c_want = (np.array(x, np.int64) for x in (sw_l, size_l, want_l))
        ptr, term, rot, size, want = self._arrays
        ptr.extend(len(term) + np.cumsum(count))
        term.extend(self._sw_term[c_sw])
        rot.extend(self._sw_rot[c_sw])
        size.extend(c_size)
        want.extend(c_want)
        self._c_sw.extend(c_sw)

    def _flat(self) -> tuple[NDArray, ...]:
        """The constraint arrays: offsets per switch path, switch term, rotation, group size
        and wanted member."""
        return tuple(a.values for a in self._arrays)

    def steer(self, src: NDArray[np.int64], dst: NDArray[np.int64], start: NDArray[np.int64],
              mid: NDArray[np.int64], paths: list[tuple[int, ...]], max_tries: int,
              ) -> Steered:
        """Source ports that land requests (``src``, ``dst``, search ``start``, switch-path
        id ``mid`` from :meth:`intern`, full path) on their paths, and the rules still needed
        by the requests that need some (request -> ``(switch, link)`` rules)."""
        return self._search(src, dst, start, mid, paths, max_tries, self._flat(),
                            self._c_sw.values)

    def steer_paths(self, src: NDArray[np.int64], dst: NDArray[np.int64],
                    start: NDArray[np.int64], paths: Sequence[tuple[int, ...]], max_tries: int,
                    as_array: bool = False,
                    ) -> Steered | None:
        """:meth:`steer` of requests whose hash decisions are derived from their own paths
        at once (compiled, over the flattened paths), not looked up per switch path: no
        switch path is interned, so a fresh table costs what a known one does (a whole
        plan's paths, most of them new to a fresh controller). ``None`` if the view is not
        compiled (see :meth:`_compiled_view`) or a path leaves it: :meth:`intern` and
        :meth:`steer` do then. With ``as_array``, the ports come as an integer array (a
        whole plan's million stay one array, not a million ints), else as a list.

        >>> v = _two_spine_view()
        >>> paths = [(0, 1, 3, 5), (0, 2, 4, 5)]
        >>> args = (np.zeros(2, np.int64), np.ones(2, np.int64), np.arange(2), paths, 64)
        >>> SteeringTable(v).steer_paths(*args) == SteeringTable(v).steer(
        ...     *args[:3], SteeringTable(v).intern(paths, [1, 1]), *args[3:])
        True
        """
        compiled = self._compiled_view()
        if compiled is None:
            return None
        # (paths in a column: their links read as they are)
        links = ((paths.lengths(), paths.flat) if isinstance(paths, PathColumn)
                 and not paths.overlaid and int(paths.off[0]) == 0
                 and int(paths.off[-1]) == len(paths.flat) else None)
        rows = _path_rows(paths, dst, compiled, links)
        if rows is None:
            return None
        count, c_sw, c_size, c_want = compiled.constraints(rows)
        arrays = (_offsets(count), self._sw_term[c_sw], self._sw_rot[c_sw], c_size, c_want)
        return self._search(src, dst, start, np.arange(len(paths), dtype=np.int64), paths,
                            max_tries, arrays, c_sw, as_array)

    def _port_tables(self, rot: NDArray[np.int64], size: NDArray[np.int64],
                     ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """The port index tables of :func:`_search_indexed` for constraints of these
        rotations and group sizes: each constraint's table (-1 for a size that is not a
        power of two up to :data:`_INDEX_MAX_SIZE`), and the tables (each made once per
        rotation and size, kept)."""
        c_tab, combos = _table_of(rot, size, _INDEX_MAX_SIZE)
        n_ports = len(self.port_term)
        if not len(combos):
            return c_tab, np.zeros((0, n_ports), np.int64), np.zeros((0, 2), np.int64)
        tables = []
        for cd in combos.tolist():
            key = divmod(cd, _INDEX_MAX_SIZE + 1)
            got = self._port_index.get(key)
            if got is None:
                got = self._port_index[key] = _port_index(self.port_term, *key)
            tables.append(got)
        width = max(len(st) for _, st in tables)
        t_start = np.empty((len(tables), width), np.int64)
        for t, (_, st) in enumerate(tables):
            t_start[t, :len(st)] = st
            t_start[t, len(st):] = st[-1]
        return c_tab, np.stack([o for o, _ in tables]), t_start

    def _search(self, src: NDArray[np.int64], dst: NDArray[np.int64],
                start: NDArray[np.int64], mid: NDArray[np.int64],
                paths: Sequence[tuple[int, ...]],
                max_tries: int, arrays: tuple[NDArray, ...], c_sw: NDArray[np.int64],
                as_array: bool = False,
                ) -> Steered:
        """:meth:`steer` over constraint arrays ``arrays`` (offsets per switch path ``mid``
        indexes, switch term, rotation, group size, wanted member) and each constraint's
        switch ``c_sw``; the ports as an array with ``as_array``, else as a list."""
        ptr, term, rot, size, want = arrays
        s_row, d_row, a_term, b_term = _gpu_rows(src, dst)
        c_tab, t_order, t_start = self._port_tables(rot, size)

        best = np.empty(len(start), np.int64)
        n_miss = np.empty(len(start), np.int64)

        def search_rows(lo: int, hi: int) -> None:
            _search_indexed_into(s_row[lo:hi], d_row[lo:hi], start[lo:hi], mid[lo:hi], ptr,
                                 term, rot, size, want, a_term, b_term, self.port_term,
                                 max_tries, c_tab, t_order, t_start, best[lo:hi],
                                 n_miss[lo:hi])

        # (a whole plan's requests in parts on both threads, each writing its rows of the
        # results)
        in_parts(search_rows, len(start))
        ports = self.ports[best] if as_array else self._port_ints[best].tolist()
        rules: dict[int, tuple[tuple[str, int], ...]] = {}
        rows = np.flatnonzero(n_miss)
        if len(rows):
            missed = _missed(rows, s_row, d_row, best, mid, ptr, term, rot, size, want,
                             a_term, b_term, self.port_term)
            links, names = self.view.links, self._sw_names
            ptr_l = ptr.tolist()
            q = 0
            for r, m in zip(rows.tolist(), mid[rows].tolist(), strict=True):
                n_c = ptr_l[m + 1] - ptr_l[m]
                hit = [c for c in missed[q:q + n_c].tolist() if c >= 0]
                q += n_c
                if hit:
                    path = paths[r]
                    rules[r] = tuple(
                        (sw, next(lk for lk in path if links[lk].src == sw))
                        for sw in (names[int(c_sw[c])] for c in hit))
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
    order, start = _port_index(port_term, 0, 2)
    _table_of(one, one + 2, _INDEX_MAX_SIZE)
    _search_indexed(one, one, one, one, ptr, term, one, one + 2, one, a_term, b_term, port_term,
                    1, one, order[None, :], start[None, :])
    _missed(one, one, one, best, one, ptr, term, one, one + 2, one, a_term, b_term, port_term)
    _path_constraints(one, ptr, one * 0, one * 0, np.zeros((1, 1), np.int64), ptr, one,
                      one - 1, one)
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
    request that could not be steered or pinned actually takes (:func:`hash_paths` of
    one QP)."""
    return hash_paths(view, [src], [dst], [port])[0]


def hash_paths(view: FabricView, src: Sequence[int], dst: Sequence[int],
               port: Sequence[int]) -> list[tuple[int, ...]]:
    """:func:`hash_path` of many QPs (``src[i]``, ``dst[i]``, ``port[i]``), hop by hop for
    all of them at once: one vectorised CRC of each hop's hash prefix instead of one per QP
    and hop."""
    spec = view.ecmp
    if spec is None:
        raise ValueError("the data plane does not describe its ECMP hash")
    n = len(src)
    if not n:
        return []
    gpu_node, links = view.gpu_node, view.links
    cur = [spec.gpu_leaf[a] for a in src]
    last = [spec.gpu_leaf[b] for b in dst]
    paths = [[view.link_between(gpu_node[a], sw)] for a, sw in zip(src, cur, strict=True)]
    src_ip, dst_ip = gpu_ip(np.asarray(src)), gpu_ip(np.asarray(dst))
    ports = np.asarray(port, np.int64)
    todo = [i for i in range(n) if cur[i] != last[i]]
    while todo:
        rows = np.array(todo, np.int64)
        seed = switch_seed(spec.base_seed, np.array([spec.switch_index[cur[i]] for i in todo]),
                           spec.per_switch_seed)
        prefix = crc32_words([(seed, 4), (src_ip[rows], 4), (dst_ip[rows], 4),
                              (np.full(len(rows), UDP_PROTO), 1)]) ^ np.uint32(0xFFFFFFFF)
        rot = (seed % np.uint64(32)).astype(np.int64) if spec.per_switch_seed else \
            np.zeros(len(rows), np.int64)
        for i, pre, r, p in zip(todo, prefix.tolist(), rot.tolist(), ports[rows].tolist(),
                                strict=True):
            group = spec.groups[(cur[i], last[i])]
            h = _switch_hash(np.uint32(pre), np.int64(p), np.int64(r), CRC32_TABLE)
            link = group[int(h) % len(group)]
            paths[i].append(link)
            cur[i] = links[link].dst
        todo = [i for i in todo if cur[i] != last[i]]
    g = view.graph
    return [(*p, int(g[sw][gpu_node[b]]["link_id"]))
            for p, sw, b in zip(paths, last, dst, strict=True)]


def best_hashed_ports(view: FabricView, src: Sequence[int], dst: Sequence[int],
                      first_port: Sequence[int], share_gbps: Sequence[float],
                      load_gbps: dict[int, float], capacity_gbps: Mapping[int, float],
                      avoid: AbstractSet[int] = frozenset(), tries: int = 32,
                      ) -> tuple[list[int], list[tuple[int, ...]]]:
    """Source ports for QPs that can be neither steered onto their planned path nor pinned
    (full rule tables): each follows the hash of its port, so of ``tries`` ports
    (``first_port[i]`` and the next ones, wrapping in the RoCE range) it gets the one whose
    hash path avoids the links ``avoid`` (dead or gray) and loads its busiest link least,
    with ``share_gbps[i]`` added to ``load_gbps`` (ties: the earlier port; NICs without
    source-port entropy: ``first_port[i]`` only). QPs are placed in
    order, each adding its share to ``load_gbps`` (updated in place) for the next. A QP
    whose every port hashes into ``avoid`` gets the least loaded of them. Returns the ports
    and their hash paths.

    A switch link (1) carries 300 of 400 Gb/s and its twin (2) nothing: two QPs of 100 Gb/s
    between the same GPUs both go on link 2 (still the less loaded after the first); with
    link 2 avoided, on link 1.

    >>> from fabricpilot.controller.southbound import EcmpSpec, LinkInfo
    >>> v = FabricView.from_links(
    ...     [LinkInfo(0, "g0", "a", 400, 0, "nic"), LinkInfo(1, "a", "b", 400, 0, "fabric"),
    ...      LinkInfo(2, "a", "b", 400, 0, "fabric"), LinkInfo(3, "b", "g1", 400, 0, "nic")],
    ...     node_kind={"g0": "gpu", "g1": "gpu", "a": "switch", "b": "switch"},
    ...     tier={"a": 1, "b": 1}, gpu_node={0: "g0", 1: "g1"},
    ...     ecmp=EcmpSpec(7, False, True, {"a": 0, "b": 1}, {("a", "b"): (1, 2)},
    ...                   {0: "a", 1: "b"}))
    >>> load = {1: 300.0}
    >>> _, paths = best_hashed_ports(v, [0, 0], [1, 1], [PORT_LO, PORT_LO], [100.0, 100.0],
    ...                              load, {1: 400.0, 2: 400.0})
    >>> [p[1] for p in paths], load[2]
    ([2, 2], 200.0)
    >>> _, paths = best_hashed_ports(v, [0], [1], [PORT_LO], [100.0], {}, {1: 400.0, 2: 400.0},
    ...                              avoid={2})
    >>> paths[0][1]
    1
    """
    n = len(src)
    if not n:
        return [], []
    span = PORT_HI - PORT_LO + 1
    # (NICs that do not let software set the port: the QP keeps the one it has)
    tries = max(int(tries), 1) if view.ecmp is not None and view.ecmp.source_port_entropy else 1
    cand = [[PORT_LO + (int(p) - PORT_LO + j) % span for j in range(tries)] for p in first_port]
    flat = hash_paths(view, [s for s in src for _ in range(tries)],
                      [d for d in dst for _ in range(tries)], [p for c in cand for p in c])
    ports: list[int] = []
    paths: list[tuple[int, ...]] = []
    for i in range(n):
        options = flat[i * tries:(i + 1) * tries]
        share = float(share_gbps[i])
        best, best_key = 0, (True, math.inf)
        for j, path in enumerate(options):
            crosses = not avoid.isdisjoint(path)
            worst = max(((load_gbps.get(lk, 0.0) + share) / capacity_gbps[lk]
                         for lk in path if capacity_gbps.get(lk, 0.0) > 0), default=0.0)
            key = (crosses, worst)
            if key < best_key:
                best, best_key = j, key
        ports.append(cand[i][best])
        paths.append(options[best])
        for lk in options[best]:
            load_gbps[lk] = load_gbps.get(lk, 0.0) + share
    return ports, paths


def rules_per_switch(steerings: list[Steering]) -> Counter[str]:
    """How many explicit rules each switch holds for these steerings.

    >>> rules_per_switch([Steering(1, (("l0", 3),)), Steering(2, (("l0", 4), ("s1", 7)))])
    Counter({'l0': 2, 's1': 1})
    """
    return Counter(sw for s in steerings for sw, _ in s.rules)
