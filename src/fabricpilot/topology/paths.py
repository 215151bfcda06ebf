"""Path algorithms over a :class:`CompiledTopology`: pure functions of arrays.

* :func:`walk_paths` routes many GPU pairs at once, hop by hop, asking a ``choose`` callback
  which member of each switch's ECMP group to take (ECMP hashing, random, adaptive...).
* :func:`equal_cost_paths` enumerates every up-down path between two GPUs.
* :func:`split_fractions` gives the share of a flow on each link when every switch splits it
  evenly over its ECMP group (perfect spraying: the ``ideal`` load balancer).

Traffic between two GPUs of one host uses the host's NVLink domain, never the fabric.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from fabricpilot.errors import TopologyError
from fabricpilot.topology.compiled import LINK_KIND_CODES, CompiledTopology
from fabricpilot.topology.model import LinkKind

# choose(step, switch_idx, rows) -> uint32/uint64 hash per row; taken modulo the group size.
ChooseFn = Callable[[int, NDArray[np.int32], NDArray[np.int64]], NDArray[np.integer]]


def max_path_links(ct: CompiledTopology) -> int:
    """Upper bound on the number of links of any path (NIC up + switch hops + NIC down)."""
    return int(ct.hop_distance.max(initial=0)) + 2


def intra_host(ct: CompiledTopology, src: NDArray[np.int64], dst: NDArray[np.int64]) -> NDArray:
    """True where ``src`` and ``dst`` share a host with an NVLink domain."""
    return (ct.gpu_host[src] == ct.gpu_host[dst]) & (ct.gpu_nv_up[src] >= 0)


def pair_delay_ns(ct: CompiledTopology, src: NDArray[np.int64], dst: NDArray[np.int64],
                  switch_latency_ns: int) -> NDArray[np.int64]:
    """One-way delay (:func:`path_delay_ns`) of a shortest path of each GPU pair: over NVLink
    within a host, else NIC, the switch hops between the two leaves and NIC, each fabric hop
    at the fabric's slowest link delay (exact where those are equal, as on the builders'
    fabrics).

    >>> from fabricpilot.topology import compile_topology, leaf_spine
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=2))
    >>> # NVLink 2 x 50 + NVSwitch; NICs 2 x 100 + leaf; + 2 x (100 + 600) via a spine
    >>> pair_delay_ns(ct, np.array([0, 0, 0]), np.array([1, 2, 6]), 600).tolist()
    [700, 800, 2200]
    """
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    nic = ct.delay_ns[ct.gpu_up[src]].astype(np.int64) + ct.delay_ns[ct.gpu_down[dst]]
    fabric = ct.link_kind == LINK_KIND_CODES[LinkKind.FABRIC]
    hop_ns = int(ct.delay_ns[fabric].max(initial=0))
    hops = ct.hop_distance[ct.gpu_leaf[src], ct.leaf_slot[ct.gpu_leaf[dst]]].astype(np.int64)
    out = nic + hops * (hop_ns + int(switch_latency_ns)) + int(switch_latency_ns)
    nv = intra_host(ct, src, dst)
    if nv.any():
        up, down = ct.gpu_nv_up[src[nv]], ct.gpu_nv_down[dst[nv]]
        out[nv] = ct.delay_ns[up].astype(np.int64) + ct.delay_ns[down] + int(switch_latency_ns)
    return out


def walk_paths(
    ct: CompiledTopology,
    src: NDArray[np.int64],
    dst: NDArray[np.int64],
    choose: ChooseFn,
) -> NDArray[np.int32]:
    """Route each (src, dst) GPU pair; returns link ids ``[n_pairs, max_path_links]``, -1 padded.

    At every switch with several equal-cost next hops, ``choose(step, switch, rows)`` returns an
    integer per pair and the pair takes next hop ``value % group_size``: this is exactly how an
    ECMP group resolves a hash, so a hash function plugged in here reproduces a switch.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> p = walk_paths(ct, np.array([0]), np.array([3]), lambda s, sw, r: np.zeros(len(r)))
    >>> [ct.link_name(int(x)) for x in p[0] if x >= 0]
    ['gpu0->leaf0', 'leaf0->spine0', 'spine0->leaf1', 'leaf1->gpu3']
    """
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    n = len(src)
    out = np.full((n, max_path_links(ct)), -1, np.int32)
    if n == 0:
        return out
    nv = intra_host(ct, src, dst)
    out[nv, 0] = ct.gpu_nv_up[src[nv]]
    out[nv, 1] = ct.gpu_nv_down[dst[nv]]
    rows = np.flatnonzero(~nv)
    out[rows, 0] = ct.gpu_up[src[rows]]
    cur = ct.gpu_leaf[src[rows]].astype(np.int32)
    tgt = ct.leaf_slot[ct.gpu_leaf[dst[rows]]]
    step = 0
    while len(rows):
        arrived = ct.hop_distance[cur, tgt] == 0
        if arrived.any():
            done = rows[arrived]
            out[done, step + 1] = ct.gpu_down[dst[done]]
            rows, cur, tgt = rows[~arrived], cur[~arrived], tgt[~arrived]
            if not len(rows):
                break
        count = ct.nh_count[cur, tgt]
        if (count == 0).any():
            bad = int(rows[np.argmax(count == 0)])
            raise TopologyError(f"no path from gpu{src[bad]} to gpu{dst[bad]}")
        pick = (np.asarray(choose(step, cur, rows)).astype(np.uint64) % count.astype(np.uint64))
        link = ct.nh_link[cur, tgt, pick.astype(np.int64)]
        out[rows, step + 1] = link
        cur = ct.switch_of_node[ct.link_dst[link]]
        step += 1
    return out


def pad_paths(paths: NDArray[np.int32], width: int) -> NDArray[np.int32]:
    """Link-id paths padded with -1 to ``width`` columns (unchanged if already that wide).

    >>> pad_paths(np.array([[3, 4]], np.int32), 4).tolist()
    [[3, 4, -1, -1]]
    """
    if paths.shape[1] == width:
        return paths
    out = np.full((len(paths), width), -1, np.int32)
    out[:, : paths.shape[1]] = paths
    return out


def switch_links_between(ct: CompiledTopology, leaf_a: int, leaf_b: int) -> NDArray[np.int64]:
    """The switch links (ids, ascending) of every fewest-hop path of the intact fabric from
    leaf switch ``leaf_a`` to leaf switch ``leaf_b`` (none if they are one): ``u -> v`` is on
    one when ``d(a, u) + 1 + d(v, b) == d(a, b)`` (cables run both ways: ``d(a, u) = d(u,
    a)``).

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(leaf_spine(hosts=6, gpus_per_host=1, nics_per_leaf=2))
    >>> [ct.link_name(int(x)) for x in switch_links_between(ct, int(ct.gpu_leaf[0]),
    ...                                                     int(ct.gpu_leaf[2]))]
    ['leaf0->spine0', 'leaf0->spine1', 'spine0->leaf1', 'spine1->leaf1']
    """
    if leaf_a == leaf_b:
        return np.zeros(0, np.int64)
    u = ct.switch_of_node[ct.link_src]
    v = ct.switch_of_node[ct.link_dst]
    hd = ct.hop_distance
    d_u, d_v = hd[u, ct.leaf_slot[leaf_a]], hd[v, ct.leaf_slot[leaf_b]]  # (-1: no way there)
    on = (u >= 0) & (v >= 0) & (d_u >= 0) & (d_v >= 0)
    return np.flatnonzero(on & (d_u + 1 + d_v == hd[leaf_a, ct.leaf_slot[leaf_b]]))


def equal_cost_paths(ct: CompiledTopology, src_gpu: int, dst_gpu: int) -> list[tuple[int, ...]]:
    """Every equal-cost (up-down) path from ``src_gpu`` to ``dst_gpu``, as tuples of link ids.

    >>> from fabricpilot.topology.builders import fat_tree
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(fat_tree(k=4))
    >>> len(equal_cost_paths(ct, 0, 15))  # other pod: (k/2)^2 paths
    4
    """
    if src_gpu == dst_gpu:
        raise TopologyError("source and destination GPU are the same")
    s, d = np.array([src_gpu]), np.array([dst_gpu])
    if intra_host(ct, s, d)[0]:
        return [(int(ct.gpu_nv_up[src_gpu]), int(ct.gpu_nv_down[dst_gpu]))]
    tgt = int(ct.leaf_slot[ct.gpu_leaf[dst_gpu]])
    paths: list[tuple[int, ...]] = []

    def dfs(switch: int, prefix: tuple[int, ...]) -> None:
        if ct.hop_distance[switch, tgt] == 0:
            paths.append((*prefix, int(ct.gpu_down[dst_gpu])))
            return
        for link in ct.nh_link[switch, tgt, : ct.nh_count[switch, tgt]]:
            dfs(int(ct.switch_of_node[ct.link_dst[link]]), (*prefix, int(link)))

    dfs(int(ct.gpu_leaf[src_gpu]), (int(ct.gpu_up[src_gpu]),))
    return paths


def split_fractions(
    ct: CompiledTopology, src_switch: int, dst_slot: int
) -> tuple[NDArray[np.int32], NDArray[np.float64]]:
    """Links between two leaves and the share of a flow on each, when every switch splits the
    flow evenly over its ECMP group (perfect per-packet spraying, as a fluid).

    On a symmetric Clos this spreads a flow evenly over all equal-cost paths.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> links, frac = split_fractions(ct, int(ct.gpu_leaf[0]), int(ct.leaf_slot[ct.gpu_leaf[3]]))
    >>> sorted(frac.tolist())
    [0.5, 0.5, 0.5, 0.5]
    """
    load: dict[int, float] = {}
    frontier = {src_switch: 1.0}
    while frontier:
        nxt: dict[int, float] = {}
        for sw, share in frontier.items():
            if ct.hop_distance[sw, dst_slot] == 0:
                continue
            count = int(ct.nh_count[sw, dst_slot])
            part = share / count
            for link in ct.nh_link[sw, dst_slot, :count].tolist():
                load[link] = load.get(link, 0.0) + part
                nxt_sw = int(ct.switch_of_node[ct.link_dst[link]])
                nxt[nxt_sw] = nxt.get(nxt_sw, 0.0) + part
        frontier = nxt
    links = np.fromiter(load.keys(), np.int32, len(load))
    order = np.argsort(links)
    return links[order], np.fromiter(load.values(), np.float64, len(load))[order]


def path_delay_ns(
    ct: CompiledTopology, paths: NDArray[np.int32], switch_latency_ns: int
) -> NDArray[np.int64]:
    """One-way delay of each padded path: propagation of its links plus a switch latency at
    every switch traversed (links - 1 switches; the NVSwitch counts as one)."""
    valid = paths >= 0
    prop = np.where(valid, ct.delay_ns[np.where(valid, paths, 0)], 0).sum(axis=1)
    hops = np.maximum(valid.sum(axis=1) - 1, 0)
    return (prop + hops * int(switch_latency_ns)).astype(np.int64)


def symmetric_link_groups(ct: CompiledTopology, seed: int = 12345) -> NDArray[np.int32]:
    """Group switch-to-switch links that carry identical load under even ECMP spraying.

    Two links are interchangeable for a fluid that every switch splits evenly over its ECMP
    group when, for every (source leaf, destination leaf) pair, the pair's share on both links
    is the same, i.e. their columns in any flow x link weight matrix are equal. Their capacity
    constraints are then identical and can be merged into one (weights and capacities added).
    This turns the ``S`` uplinks of a leaf (or the ``S`` spine links into a leaf) into one
    trunk, so the ideal policy's rows shrink from ``2 + 2S`` to 4 non-zeros on a leaf-spine.

    The test uses two random projections of each column over all leaf pairs, computed by
    dynamic programming over the ECMP DAG toward each destination; links with equal
    projections and equal capacity share a group. NIC and NVLink links stay alone.

    Returns the group id of every link (``0..n_groups-1``).

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> from fabricpilot.topology.compiled import compile_topology
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> # 8 NIC links + 2 trunks: leaf0's uplinks and the spine links into leaf1 carry exactly
    >>> # the flows leaf0 -> leaf1, so all four share one column (and likewise the other way)
    >>> int(symmetric_link_groups(ct).max()) + 1
    10
    """
    rng = np.random.default_rng(seed)
    n_sw, n_t = ct.nh_count.shape
    sw_links = np.flatnonzero((ct.switch_of_node[ct.link_src] >= 0)
                              & (ct.switch_of_node[ct.link_dst] >= 0))
    su = ct.switch_of_node[ct.link_src[sw_links]]
    sv = ct.switch_of_node[ct.link_dst[sw_links]]
    dist = ct.hop_distance
    closer = dist[sv] == dist[su] - 1  # [E, T]
    leaf_sw = np.flatnonzero(ct.leaf_slot >= 0)
    cnt = np.maximum(ct.nh_count, 1).astype(np.float64)
    sigs = []
    for _ in range(2):
        r_src = rng.random(n_t) + 0.5
        r_dst = rng.random(n_t) + 0.5
        arrive = np.zeros((n_sw, n_t))
        arrive[leaf_sw, :] = r_src[ct.leaf_slot[leaf_sw]][:, None]
        arrive[leaf_sw, ct.leaf_slot[leaf_sw]] = 0.0
        per_link = np.zeros(closer.shape)
        for d in range(int(dist.max(initial=0)), 0, -1):
            e_idx, t_idx = np.nonzero(closer & (dist[su] == d))
            u = su[e_idx]
            part = arrive[u, t_idx] / cnt[u, t_idx]
            per_link[e_idx, t_idx] = part
            np.add.at(arrive, (sv[e_idx], t_idx), part)
        sigs.append(per_link @ r_dst)
    groups = np.arange(ct.n_links, dtype=np.int64)
    if len(sw_links):
        scale = max(float(np.abs(sigs[0]).max()), float(np.abs(sigs[1]).max()), 1e-300)
        key = np.stack([np.round(sigs[0] / scale, 9), np.round(sigs[1] / scale, 9),
                        ct.rate_gbps[sw_links]], 1)
        _, inv = np.unique(key, axis=0, return_inverse=True)
        groups[sw_links] = ct.n_links + inv.reshape(-1)
    _, dense = np.unique(groups, return_inverse=True)
    return dense.reshape(-1).astype(np.int32)
