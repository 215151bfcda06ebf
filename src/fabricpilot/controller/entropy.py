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


@numba.njit(cache=True)
def _crc_bytes(crc: np.uint32, value: np.uint64, n_bytes: int, table: NDArray) -> np.uint32:
    for k in range(n_bytes - 1, -1, -1):
        byte = np.uint32((value >> np.uint64(8 * k)) & np.uint64(0xFF))
        crc = table[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc


@numba.njit(cache=True)
def _switch_hash(prefix: np.uint32, port: np.int64, rot: np.int64, table: NDArray) -> np.uint32:
    crc = _crc_bytes(prefix, np.uint64(port), 2, table)
    h = _crc_bytes(crc, np.uint64(ROCE_UDP_PORT), 2, table) ^ np.uint32(0xFFFFFFFF)
    if rot:
        h = (h >> np.uint32(rot)) | (h << np.uint32(32 - rot))
    return h


@numba.njit(cache=True)
def _search(prefix: NDArray, rot: NDArray, size: NDArray, want: NDArray, ptr: NDArray,
            start: NDArray, ports: NDArray, max_tries: int, table: NDArray,
            ) -> tuple[NDArray, NDArray]:  # pragma: no cover - compiled
    """For each request, the port (from ``ports``, tried from ``start`` on) whose hashes
    match the most constraints (it stops at the first that matches them all), and for each
    constraint whether that port misses it."""
    n = len(start)
    best_port = np.empty(n, np.int64)
    missed = np.zeros(len(prefix), np.bool_)
    n_ports = len(ports)
    tries = min(max_tries, n_ports)
    for r in range(n):
        lo, hi = ptr[r], ptr[r + 1]
        best_port[r] = ports[start[r] % n_ports]
        best_miss = hi - lo + 1
        if hi == lo:
            continue
        for t in range(tries):
            port = ports[(start[r] + t) % n_ports]
            miss = 0
            for c in range(lo, hi):
                h = _switch_hash(prefix[c], port, rot[c], table)
                if want[c] < 0 or h % np.uint32(size[c]) != np.uint32(want[c]):
                    miss += 1
            if miss < best_miss:
                best_miss = miss
                best_port[r] = port
                if miss == 0:
                    break
        for c in range(lo, hi):
            h = _switch_hash(prefix[c], best_port[r], rot[c], table)
            missed[c] = want[c] < 0 or h % np.uint32(size[c]) != np.uint32(want[c])
    return best_port, missed


def steer(view: FabricView, requests: list[SteerRequest], *, max_tries: int = 1024,
          cache: dict[tuple[int, ...], list[tuple[str, tuple[int, ...], int]]] | None = None,
          ) -> list[Steering]:
    """Source ports that land each request on its path, and the rules still needed.

    Each request tries up to ``max_tries`` ports of the RoCE range (there is only one when
    the NICs' entropy is off), keeping the port that leaves the fewest switches disagreeing;
    a rule is needed at each of those (and at every switch whose group does not contain the
    path's link). Constraints depend only on the switch links of the path, so they are
    derived once per switch path (and kept in ``cache`` across calls if one is given).
    """
    spec = view.ecmp
    if spec is None:
        raise ValueError("the data plane does not describe its ECMP hash")
    ports = (np.arange(PORT_LO, PORT_HI + 1, dtype=np.int64) if spec.source_port_entropy
             else np.array([ROCE_UDP_PORT], np.int64))
    by_path = cache if cache is not None else {}
    cons = []
    for q in requests:
        # only switch-to-switch links are hash decisions: the GPU's own links are not, so
        # paths between the same leaves share their constraints
        mid = q.path[1:-1]
        c = by_path.get(mid)
        if c is None:
            c = by_path[mid] = constraints(view, q.dst, q.path)
        cons.append(c)
    counts = np.array([len(c) for c in cons], np.int64)
    ptr = np.zeros(len(requests) + 1, np.int64)
    ptr[1:] = np.cumsum(counts)
    flat = [x for c in cons for x in c]
    m = len(flat)
    sw_idx = np.array([spec.switch_index[sw] for sw, _, _ in flat], np.int64)
    seeds = switch_seed(spec.base_seed, sw_idx, spec.per_switch_seed)
    src = np.repeat(np.array([q.src for q in requests], np.int64), counts)
    dst = np.repeat(np.array([q.dst for q in requests], np.int64), counts)
    # CRC register after seed | src_ip | dst_ip | proto (before the final inversion)
    prefix = (crc32_words([(seeds, 4), (gpu_ip(src), 4), (gpu_ip(dst), 4),
                           (np.full(m, UDP_PROTO), 1)]) ^ np.uint32(0xFFFFFFFF)
              ) if m else np.zeros(0, np.uint32)
    rot = ((seeds % np.uint64(32)).astype(np.int64) if spec.per_switch_seed
           else np.zeros(m, np.int64))
    size = np.array([len(g) for _, g, _ in flat], np.int64)
    want = np.array([w for *_, w in flat], np.int64)
    start = np.array([q.start for q in requests], np.int64)
    port, missed = _search(prefix.astype(np.uint32), rot, size, want, ptr, start, ports,
                           max_tries, CRC32_TABLE)
    rules: dict[int, list[tuple[str, int]]] = {}  # only the requests that need some
    owner = np.repeat(np.arange(len(requests)), counts)
    for c in np.flatnonzero(missed).tolist():
        r = int(owner[c])
        sw = flat[c][0]
        rules.setdefault(r, []).append(
            (sw, next(lk for lk in requests[r].path if view.links[lk].src == sw)))
    return [Steering(p, tuple(rules[r]) if r in rules else ())
            for r, p in enumerate(port.tolist())]


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
