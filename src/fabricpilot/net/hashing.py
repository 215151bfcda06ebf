"""The ECMP hash a switch computes, as a reproducible vectorised function.

Switch ASICs hash selected header fields with a CRC and take the result modulo the ECMP group
size. fabricpilot uses CRC-32 (IEEE 802.3, the polynomial of ``zlib.crc32``) over a seed and the
RoCEv2 5-tuple, so anything outside the data plane (a controller choosing source ports so that
flows land on planned paths) can evaluate exactly the choice a switch makes.

RoCEv2 runs over UDP destination port 4791; the UDP source port carries the entropy. NICs
derive it from the queue pair (QP) numbers, in the range 0xC000-0xFFFF (as Linux does from the
flow label); with entropy disabled every QP of a NIC uses one source port.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

ROCE_UDP_PORT = 4791
UDP_PROTO = 17


def _crc_table() -> NDArray[np.uint32]:
    poly = np.uint32(0xEDB88320)
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ poly, table >> 1).astype(np.uint32)
    return table


CRC32_TABLE = _crc_table()


def crc32_words(fields: list[tuple[NDArray[np.integer], int]]) -> NDArray[np.uint32]:
    """CRC-32 of the big-endian concatenation of integer fields, vectorised over rows.

    ``fields`` is a list of ``(values, n_bytes)``. Equal to ``zlib.crc32`` of the same bytes:

    >>> import zlib
    >>> v = crc32_words([(np.array([0x0A000001]), 4), (np.array([4791]), 2)])
    >>> int(v[0]) == zlib.crc32(bytes([10, 0, 0, 1, 0x12, 0xB7]))
    True
    """
    n = len(fields[0][0])
    crc = np.full(n, 0xFFFFFFFF, np.uint32)
    for values, n_bytes in fields:
        v = np.asarray(values).astype(np.uint64)
        for shift in range(8 * (n_bytes - 1), -1, -8):
            byte = ((v >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.uint32)
            crc = CRC32_TABLE[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def gpu_ip(gpu: NDArray[np.integer]) -> NDArray[np.uint32]:
    """IPv4 address of a GPU's NIC: 10.0.0.0/8 plus the GPU id.

    >>> int(gpu_ip(np.array([1]))[0]) == (10 << 24) + 1
    True
    """
    return (np.uint32(10 << 24) | np.asarray(gpu).astype(np.uint32)).astype(np.uint32)


def qp_source_port(
    job: NDArray[np.integer],
    src: NDArray[np.integer],
    dst: NDArray[np.integer],
    qp: NDArray[np.integer],
    *,
    entropy: bool = True,
) -> NDArray[np.uint32]:
    """UDP source port of QP ``qp`` of the connection ``src -> dst`` of job ``job``.

    A connection keeps its QPs (and so its source ports) for the whole job, as NCCL does, so an
    ECMP collision repeats every iteration. Without entropy the port is 4791 for every QP.
    """
    if not entropy:
        return np.full(len(np.asarray(src)), ROCE_UDP_PORT, np.uint32)
    # QP numbers are allocated by the NIC and look arbitrary to the fabric: model them with a
    # non-linear mix (a CRC of structured ids would be linear and collide in patterns).
    u = np.uint64
    h = splitmix64(np.asarray(job).astype(u) ^ (np.asarray(qp).astype(u) << u(32)))
    h = splitmix64(h ^ np.asarray(src).astype(u))
    h = splitmix64(h ^ np.asarray(dst).astype(u))
    return (np.uint32(0xC000) | (h & np.uint64(0x3FFF)).astype(np.uint32)).astype(np.uint32)


def splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The splitmix64 finaliser (Steele et al., OOPSLA 2014): a bijective 64-bit mix.

    >>> hex(int(splitmix64(np.array([0], np.uint64))[0]))
    '0xe220a8397b1dcdaf'
    """
    with np.errstate(over="ignore"):
        z = np.asarray(x, np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def ecmp_hash(
    src_ip: NDArray[np.integer],
    dst_ip: NDArray[np.integer],
    sport: NDArray[np.integer],
    seed: NDArray[np.integer] | int,
    *,
    dport: int = ROCE_UDP_PORT,
    proto: int = UDP_PROTO,
) -> NDArray[np.uint32]:
    """The 5-tuple hash of a switch with hash seed ``seed``: CRC-32 over
    ``seed(4) | src_ip(4) | dst_ip(4) | proto(1) | sport(2) | dport(2)``.

    The next hop is ``ecmp_hash(...) % group_size``.

    >>> import zlib
    >>> h = ecmp_hash(np.array([0x0A000000]), np.array([0x0A000005]), np.array([0xC001]), 7)
    >>> raw = (7).to_bytes(4, "big") + bytes([10, 0, 0, 0, 10, 0, 0, 5, 17, 0xC0, 1, 0x12, 0xB7])
    >>> int(h[0]) == zlib.crc32(raw)
    True
    """
    n = len(np.asarray(src_ip))
    seeds = np.broadcast_to(np.asarray(seed, np.uint64), (n,))
    return crc32_words([
        (seeds, 4), (src_ip, 4), (dst_ip, 4),
        (np.full(n, proto), 1), (sport, 2), (np.full(n, dport), 2),
    ])


def switch_seed(base_seed: int, switch: NDArray[np.integer], per_switch: bool) -> NDArray:
    """Hash seed of each switch: the same everywhere (hash polarisation across tiers is then
    possible, as on fabrics configured that way) or a distinct seed per switch."""
    sw = np.asarray(switch)
    if not per_switch:
        return np.full(len(sw), base_seed & 0xFFFFFFFF, np.uint64)
    return crc32_words([(np.full(len(sw), base_seed), 4), (sw, 4)]).astype(np.uint64)


def switch_hash(
    src_ip: NDArray[np.integer],
    dst_ip: NDArray[np.integer],
    sport: NDArray[np.integer],
    switch: NDArray[np.integer],
    base_seed: int,
    per_switch: bool,
) -> NDArray[np.uint32]:
    """The hash switch ``switch`` resolves its ECMP group with.

    Shared seed: ``ecmp_hash(tuple, base_seed)`` at every switch, so the tiers of a fat-tree
    pick correlated next hops (polarisation). Per-switch: each switch hashes with its own seed
    *and* its own bit window (the CRC rotated by ``seed % 32``), as ASICs offer "hash bit
    selection": a CRC is affine in its input, so a different seed alone would only XOR a
    constant onto every hash and keep the tiers correlated.
    """
    seeds = switch_seed(base_seed, switch, per_switch)
    h = ecmp_hash(src_ip, dst_ip, sport, seeds)
    if not per_switch:
        return h
    rot = (seeds % np.uint64(32)).astype(np.uint32)
    return ((h >> rot) | (h << ((np.uint32(32) - rot) % np.uint32(32)))).astype(np.uint32)
