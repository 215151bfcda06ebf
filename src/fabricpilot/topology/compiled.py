"""The topology compiled into arrays: directed links, GPU attachment and ECMP next-hop tables.

Every undirected link ``(u, v)`` becomes two directed links (full duplex). Link ids are dense
integers, so link state everywhere else (capacity, load, counters) is a numpy array indexed by
link id.

The next-hop table is what a switch's ECMP group holds: for switch ``u`` and destination leaf
``t``, the neighbours of ``u`` one hop closer to ``t`` (by hop count over the switch graph). In a
Clos network these shortest paths are exactly the up-down paths. Neighbours are listed in
stable (link id) order, so a hash modulo the group size is a reproducible next-hop choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.sparse.csgraph import shortest_path

from fabricpilot.arrays import distinct
from fabricpilot.errors import TopologyError
from fabricpilot.topology.model import LinkKind, NodeKind, Topology, gpu_name, validate_topology

LINK_KIND_CODES: dict[str, int] = {LinkKind.NIC: 0, LinkKind.FABRIC: 1, LinkKind.NVLINK: 2}


@dataclass(frozen=True)
class CompiledTopology:
    """Array form of a :class:`Topology` (see module docstring)."""

    topo: Topology
    node_names: tuple[str, ...]
    node_index: dict[str, int]
    link_src: NDArray[np.int32]      # node index
    link_dst: NDArray[np.int32]
    rate_gbps: NDArray[np.float64]
    delay_ns: NDArray[np.int64]
    link_kind: NDArray[np.int8]      # LINK_KIND_CODES
    link_id: dict[tuple[int, int], int]
    # GPUs
    gpu_host: NDArray[np.int32]
    gpu_up: NDArray[np.int32]        # link gpu -> leaf
    gpu_down: NDArray[np.int32]      # link leaf -> gpu
    gpu_leaf: NDArray[np.int32]      # switch index of the GPU's leaf
    gpu_nv_up: NDArray[np.int32]     # link gpu -> nvswitch, -1 if the host has none
    gpu_nv_down: NDArray[np.int32]
    # switches
    switch_node: NDArray[np.int32]   # switch index -> node index
    switch_of_node: NDArray[np.int32]  # node index -> switch index or -1
    switch_tier: NDArray[np.int32]
    leaf_slot: NDArray[np.int32]     # switch index -> destination slot (tier-1 only) or -1
    nh_count: NDArray[np.int32]      # [switch, dst slot] -> size of the ECMP group
    nh_link: NDArray[np.int32]       # [switch, dst slot, i] -> link id of next hop i, -1 pad
    hop_distance: NDArray[np.int32]  # [switch, dst slot] -> hops to that leaf

    @property
    def n_links(self) -> int:
        return len(self.link_src)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_host)

    @property
    def n_switches(self) -> int:
        return len(self.switch_node)

    def link_name(self, link: int) -> str:
        return f"{self.node_names[self.link_src[link]]}->{self.node_names[self.link_dst[link]]}"


def compile_topology(topo: Topology) -> CompiledTopology:
    """Compile ``topo`` into arrays and ECMP tables.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> int(ct.nh_count[ct.gpu_leaf[0], ct.leaf_slot[ct.gpu_leaf[2]]])  # 2 spines to choose from
    2
    """
    validate_topology(topo)
    g = topo.graph
    gpus = [gpu_name(i) for i in range(topo.n_gpus)]
    switches = topo.switches
    others = sorted(n for n in g.nodes if g.nodes[n]["kind"] == NodeKind.NVSWITCH)
    names = tuple(gpus + switches + others)
    index = {n: i for i, n in enumerate(names)}

    edges = sorted((min(index[u], index[v]), max(index[u], index[v])) for u, v in g.edges)
    n_links = 2 * len(edges)
    src = np.empty(n_links, np.int32)
    dst = np.empty(n_links, np.int32)
    rate = np.empty(n_links, np.float64)
    delay = np.empty(n_links, np.int64)
    kind = np.empty(n_links, np.int8)
    link_id: dict[tuple[int, int], int] = {}
    for i, (a, b) in enumerate(edges):
        attrs = g.edges[names[a], names[b]]
        for j, (x, y) in enumerate(((a, b), (b, a))):
            lid = 2 * i + j
            src[lid], dst[lid] = x, y
            rate[lid] = float(attrs["rate_gbps"])
            delay[lid] = int(attrs["delay_ns"])
            kind[lid] = LINK_KIND_CODES[attrs["kind"]]
            link_id[(x, y)] = lid

    n_gpus = len(gpus)
    n_sw = len(switches)
    switch_node = np.array([index[s] for s in switches], np.int32)
    switch_of_node = np.full(len(names), -1, np.int32)
    switch_of_node[switch_node] = np.arange(n_sw, dtype=np.int32)
    tier = np.array([int(g.nodes[s]["tier"]) for s in switches], np.int32)

    gpu_host = np.array([int(g.nodes[n]["host"]) for n in gpus], np.int32)
    leaf_names = topo.gpu_leaf
    gpu_leaf_node = np.array([index[n] for n in leaf_names], np.int32)
    gpu_up = np.array([link_id[(i, int(gpu_leaf_node[i]))] for i in range(n_gpus)], np.int32)
    gpu_down = np.array([link_id[(int(gpu_leaf_node[i]), i)] for i in range(n_gpus)], np.int32)
    gpu_nv_up = np.full(n_gpus, -1, np.int32)
    gpu_nv_down = np.full(n_gpus, -1, np.int32)
    for i, n in enumerate(gpus):
        for v in g.neighbors(n):
            if g.edges[n, v]["kind"] == LinkKind.NVLINK:
                gpu_nv_up[i] = link_id[(i, index[v])]
                gpu_nv_down[i] = link_id[(index[v], i)]

    # ECMP tables over the switch graph.
    leaf_switches = distinct(switch_of_node[gpu_leaf_node])
    leaf_slot = np.full(n_sw, -1, np.int32)
    leaf_slot[leaf_switches] = np.arange(len(leaf_switches), dtype=np.int32)
    nh_count, nh_link, hop_distance = ecmp_tables(src, dst, switch_of_node, leaf_switches,
                                                  np.ones(len(src), bool))
    if (hop_distance[leaf_switches] < 0).any():
        raise TopologyError("the switch graph is not connected: some leaves cannot reach others")

    return CompiledTopology(
        topo=topo, node_names=names, node_index=index, link_src=src, link_dst=dst,
        rate_gbps=rate, delay_ns=delay, link_kind=kind, link_id=link_id,
        gpu_host=gpu_host, gpu_up=gpu_up, gpu_down=gpu_down,
        gpu_leaf=switch_of_node[gpu_leaf_node], gpu_nv_up=gpu_nv_up, gpu_nv_down=gpu_nv_down,
        switch_node=switch_node, switch_of_node=switch_of_node, switch_tier=tier,
        leaf_slot=leaf_slot, nh_count=nh_count, nh_link=nh_link, hop_distance=hop_distance,
    )


def ecmp_tables(
    src: NDArray[np.int32],
    dst: NDArray[np.int32],
    switch_of_node: NDArray[np.int32],
    leaf_switches: NDArray[np.int32],
    alive: NDArray[np.bool_],
) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
    """ECMP groups over the switch links that are ``alive``: ``(nh_count, nh_link,
    hop_distance)`` indexed ``[switch, destination slot]`` (``hop_distance`` -1 and an empty
    group where a leaf cannot be reached). A switch link u -> v is a next hop of u towards
    leaf t iff ``dist(v, t) == dist(u, t) - 1``; members are kept in link-id order."""
    n_sw = int(switch_of_node.max()) + 1 if len(switch_of_node) else 0
    is_sw_link = (switch_of_node[src] >= 0) & (switch_of_node[dst] >= 0) & alive
    sw_links = np.flatnonzero(is_sw_link).astype(np.int32)
    su = switch_of_node[src[sw_links]]
    sv = switch_of_node[dst[sw_links]]
    # (hops from every switch to each leaf: from the leaf over the links reversed, as a
    # link may be down in one direction only)
    rev = sp.csr_matrix((np.ones(len(sw_links)), (sv, su)), shape=(n_sw, n_sw))
    dist = shortest_path(rev, unweighted=True, directed=True, indices=leaf_switches)  # [T, S]
    dist_to = dist.T  # [S, T]
    n_t = len(leaf_switches)
    # (a link is a next hop towards a leaf where it gets one hop closer: found in blocks of
    # links, so that no links x leaves array is ever made whole; a first pass counts each
    # group's members, and what the tables will take is checked before they are made)
    block = max(1, _CELLS_PER_BLOCK // max(n_t, 1))

    def next_hops(lo: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(group key, link row) of every next hop among switch links ``lo`` on."""
        hi = min(lo + block, len(sw_links))
        e, t = np.nonzero(dist_to[sv[lo:hi]] == (dist_to[su[lo:hi]] - 1))
        e = e.astype(np.int64) + lo
        return su[e].astype(np.int64) * n_t + t, e

    counts = np.zeros(n_sw * n_t, np.int64)
    for lo in range(0, len(sw_links), block):
        counts += np.bincount(next_hops(lo)[0], minlength=n_sw * n_t)
    max_deg = max(int(counts.max()) if len(counts) else 0, 1)
    _check_table_memory(n_sw, n_t, max_deg)
    nh_link = np.full((n_sw * n_t, max_deg), -1, np.int32)
    filled = np.zeros(n_sw * n_t, np.int64)  # members placed so far, per group
    for lo in range(0, len(sw_links), block):  # (blocks in link-id order: so are members)
        key, e = next_hops(lo)
        order = np.argsort(key, kind="stable")  # (within a group: by link id)
        key, e = key[order], e[order]
        first = np.searchsorted(key, key)  # (each key's first row in this block)
        pos = filled[key] + np.arange(len(key)) - first
        nh_link[key, pos] = sw_links[e]
        filled += np.bincount(key, minlength=n_sw * n_t)
    nh_link = nh_link.reshape(n_sw, n_t, max_deg)
    nh_count = counts.reshape(n_sw, n_t).astype(np.int32)
    hop_distance = np.where(np.isinf(dist_to), -1, dist_to).astype(np.int32)
    return nh_count, nh_link, hop_distance


_CELLS_PER_BLOCK = 1 << 24  # (links x leaves compared at once in ecmp_tables)


def _check_table_memory(n_switches: int, n_leaves: int, max_group: int) -> None:
    """``TopologyError`` if the ECMP tables (switches x leaves x the largest group, int32,
    and the same again while they are read) need more memory than this machine has
    available: a one-line refusal rather than an allocation error or the kernel's OOM
    killer minutes into the build."""
    need = 2 * n_switches * n_leaves * max_group * 4
    avail = _available_bytes()
    if avail is not None and need > avail:
        raise TopologyError(
            f"its ECMP tables ({n_switches} switches x {n_leaves} leaves x groups of up to "
            f"{max_group} links) need about {need / 2**30:.1f} GiB, and this machine has "
            f"{avail / 2**30:.1f} GiB available: use fewer, larger leaves (nics_per_leaf) "
            f"or fewer GPUs")


def _available_bytes() -> int | None:
    """Memory the kernel says can be had without swapping (``MemAvailable``), or ``None``
    where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def with_local_repair(ct: CompiledTopology, dead: NDArray[np.bool_]) -> CompiledTopology:
    """The topology once every switch has dropped its own ports on the links ``dead`` (a
    mask over link ids) from its ECMP groups, where a group keeps another next hop
    (hardware fast failover at loss of signal, before routing converges); a group whose
    every next hop died keeps them (the switch has no other way: its traffic still goes
    into them until routing converges upstream). Nothing else changes: distances, the other
    switches' groups.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> leaf0, leaf1 = (int(ct.gpu_leaf[g]) for g in (0, 2))
    >>> slot0, slot1 = int(ct.leaf_slot[leaf0]), int(ct.leaf_slot[leaf1])
    >>> up = int(ct.nh_link[leaf0, slot1, 0])  # leaf0's uplink to a spine
    >>> spine = int(ct.switch_of_node[ct.link_dst[up]])
    >>> down_link = int(ct.nh_link[spine, slot0, 0])  # that spine's only link to leaf0
    >>> dead = np.zeros(ct.n_links, bool); dead[[up, down_link]] = True
    >>> rep = with_local_repair(ct, dead)
    >>> int(rep.nh_count[leaf0, slot1]), int(rep.nh_link[leaf0, slot1, 0]) != up
    (1, True)
    >>> int(rep.nh_count[spine, slot0]), int(rep.nh_link[spine, slot0, 0]) == down_link
    (1, True)
    >>> int(rep.nh_count[leaf1, slot0])  # (leaf1 still sends to leaf0 through that spine)
    2
    """
    dead = np.asarray(dead, bool)
    nh, count = ct.nh_link, ct.nh_count
    width = nh.shape[2]
    member = np.arange(width) < count[..., None]
    is_dead = member & dead[np.maximum(nh, 0)]
    live = member & ~is_dead
    n_live = live.sum(axis=-1)
    fix = is_dead.any(axis=-1) & (n_live > 0)
    if not fix.any():
        return ct
    # the live next hops first, in their order; the rest padded with -1
    order = np.argsort(~live, axis=-1, kind="stable")
    packed = np.where(np.arange(width) < n_live[..., None],
                      np.take_along_axis(nh, order, axis=-1), -1).astype(nh.dtype)
    return replace(ct, nh_link=np.where(fix[..., None], packed, nh),
                   nh_count=np.where(fix, n_live, count).astype(count.dtype))


def with_links_down(ct: CompiledTopology, down: NDArray[np.bool_]) -> CompiledTopology:
    """The topology as routing sees it once it has converged around the links ``down``
    (a mask over link ids): the same links and ids, ECMP groups rebuilt without them.
    Groups of a switch that lost every way to a leaf are empty (:func:`walk_paths` then
    reports no path); the widths of ``nh_link`` and the path width stay those of the
    intact fabric, so paths computed before and after line up.

    >>> from fabricpilot.topology.builders import leaf_spine
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> leaf0, leaf1 = (int(ct.gpu_leaf[g]) for g in (0, 2))
    >>> slot1 = int(ct.leaf_slot[leaf1])
    >>> int(ct.nh_count[leaf0, slot1])
    2
    >>> down = np.zeros(ct.n_links, bool)
    >>> down[int(ct.nh_link[leaf0, slot1, 0])] = True
    >>> cut = with_links_down(ct, down)
    >>> survivor = int(ct.nh_link[leaf0, slot1, 1])
    >>> int(cut.nh_count[leaf0, slot1]), int(cut.nh_link[leaf0, slot1, 0]) == survivor
    (1, True)
    """
    leaf_switches = np.flatnonzero(ct.leaf_slot >= 0).astype(np.int32)
    leaf_switches = leaf_switches[np.argsort(ct.leaf_slot[leaf_switches])]
    count, link, dist = ecmp_tables(ct.link_src, ct.link_dst, ct.switch_of_node, leaf_switches,
                                    ~np.asarray(down, bool))
    width = ct.nh_link.shape[2]
    padded = np.full(ct.nh_link.shape, -1, np.int32)
    padded[:, :, : min(width, link.shape[2])] = link[:, :, :width]
    # a longer detour than the intact fabric's longest path would not fit its path width
    dist = np.where(dist > ct.hop_distance.max(initial=0), -1, dist)
    count = np.where(dist < 0, 0, count).astype(np.int32)
    return replace(ct, nh_count=count, nh_link=padded, hop_distance=dist)
