"""Declarative topology builders: parameters in, a plain :class:`Topology` out.

Each builder places GPUs on hosts (``gpus_per_host`` per host, each host with an NVLink
domain), cables every GPU's NIC to a tier-1 switch and builds the switch tiers above.
``rail_optimized`` cables NIC ``i`` of every host to the leaf of rail ``i`` (the layout of
large GPU clusters: same-rank GPUs of different hosts are one switch hop apart); otherwise all
NICs of a host share a leaf (a classic top-of-rack layout).

``BUILDERS`` maps a topology ``kind`` to its builder, in the style of Mininet's ``TOPOS``.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import networkx as nx

from fabricpilot.errors import TopologyError
from fabricpilot.topology.model import LinkKind, NodeKind, Topology, gpu_name, nvswitch_name

MAX_GPUS = 1 << 17  # the largest fabric built: 131072 GPUs (NICs)
MAX_SPINES = 4096

def _add_hosts(
    g: nx.Graph,
    n_gpus: int,
    gpus_per_host: int,
    nvlink_rate_gbps: float,
    nvlink_delay_ns: int,
) -> None:
    for gpu in range(n_gpus):
        host, local = divmod(gpu, gpus_per_host)
        g.add_node(gpu_name(gpu), kind=NodeKind.GPU, gpu=gpu, host=host, local_rank=local,
                   rail=local)
        if gpus_per_host > 1:
            nvs = nvswitch_name(host)
            if nvs not in g:
                g.add_node(nvs, kind=NodeKind.NVSWITCH, host=host)
            g.add_edge(gpu_name(gpu), nvs, kind=LinkKind.NVLINK, rate_gbps=nvlink_rate_gbps,
                       delay_ns=nvlink_delay_ns)


def decimal_fraction(x: float) -> Fraction:
    """The fraction a number means as written (its shortest decimal form), not the binary
    float's exact value: 1.6 is 8/5, so 16 ports at 1.6 : 1 make a whole 10 uplinks.

    >>> decimal_fraction(1.6), Fraction(1.6) == Fraction(8, 5)
    (Fraction(8, 5), False)
    """
    return Fraction(repr(float(x)))


def leaf_spine(
    *,
    hosts: int,
    gpus_per_host: int = 8,
    nics_per_leaf: int = 16,
    oversubscription: float = 1.0,
    rail_optimized: bool = True,
    nic_rate_gbps: float = 400.0,
    fabric_rate_gbps: float = 400.0,
    nvlink_rate_gbps: float = 3600.0,
    link_delay_ns: int = 100,
    nvlink_delay_ns: int = 50,
    name: str | None = None,
) -> Topology:
    """Two-tier leaf-spine: every leaf has one uplink to every spine.

    Each leaf has ``nics_per_leaf`` NIC ports; the number of spines is chosen so that a leaf's
    downlink : uplink capacity is ``oversubscription`` : 1.

    >>> t = leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=4)
    >>> t.n_gpus, len(t.switches)
    (8, 6)
    """
    if hosts < 1 or gpus_per_host < 1 or nics_per_leaf < 1:
        raise TopologyError("hosts, gpus_per_host and nics_per_leaf must be >= 1")
    if not (oversubscription > 0 and nic_rate_gbps > 0 and fabric_rate_gbps > 0):
        raise TopologyError("oversubscription and link rates must be > 0")
    spines = Fraction(nics_per_leaf) * decimal_fraction(nic_rate_gbps) / (
        decimal_fraction(oversubscription) * decimal_fraction(fabric_rate_gbps)
    )
    if spines.denominator != 1 or spines < 1:
        raise TopologyError(
            f"nics_per_leaf * nic_rate / (oversubscription * fabric_rate) = {float(spines):g} "
            "must be a whole number of spines >= 1"
        )
    n_spines = int(spines)
    n_gpus = hosts * gpus_per_host
    if n_gpus > MAX_GPUS or n_spines > MAX_SPINES:
        raise TopologyError(f"{n_gpus} GPUs and {n_spines} spines: at most {MAX_GPUS} GPUs "
                            f"and {MAX_SPINES} spines")
    g = nx.Graph()
    _add_hosts(g, n_gpus, gpus_per_host, nvlink_rate_gbps, nvlink_delay_ns)

    leaf_of: list[int] = []
    for gpu in range(n_gpus):
        host, local = divmod(gpu, gpus_per_host)
        if rail_optimized:
            leaf_of.append((host // nics_per_leaf) * gpus_per_host + local)
        else:
            if nics_per_leaf % gpus_per_host:
                raise TopologyError("nics_per_leaf must be a multiple of gpus_per_host")
            leaf_of.append(gpu // nics_per_leaf)
    n_leaves = max(leaf_of) + 1
    if n_leaves == 1:  # (one leaf reaches every NIC: spines would carry nothing)
        n_spines = 0
    for leaf in range(n_leaves):
        g.add_node(f"leaf{leaf}", kind=NodeKind.SWITCH, tier=1, role="leaf")
    for spine in range(n_spines):
        g.add_node(f"spine{spine}", kind=NodeKind.SWITCH, tier=2, role="spine")
        for leaf in range(n_leaves):
            g.add_edge(f"leaf{leaf}", f"spine{spine}", kind=LinkKind.FABRIC,
                       rate_gbps=fabric_rate_gbps, delay_ns=link_delay_ns)
    for gpu, leaf in enumerate(leaf_of):
        g.add_edge(gpu_name(gpu), f"leaf{leaf}", kind=LinkKind.NIC, rate_gbps=nic_rate_gbps,
                   delay_ns=link_delay_ns)
    params = dict(kind="leaf_spine", hosts=hosts, gpus_per_host=gpus_per_host,
                  nics_per_leaf=nics_per_leaf, oversubscription=oversubscription,
                  rail_optimized=rail_optimized, n_leaves=n_leaves, n_spines=n_spines)
    return Topology(g, name or f"leaf-spine-{n_gpus}", gpus_per_host, params)


def fat_tree(
    *,
    k: int,
    gpus_per_host: int = 1,
    rail_optimized: bool = True,
    nic_rate_gbps: float = 400.0,
    fabric_rate_gbps: float = 400.0,
    nvlink_rate_gbps: float = 3600.0,
    link_delay_ns: int = 100,
    nvlink_delay_ns: int = 50,
    name: str | None = None,
) -> Topology:
    """Three-tier k-ary fat-tree (Al-Fares et al., SIGCOMM 2008): k pods of k/2 edge and k/2
    aggregation switches, (k/2)^2 cores, k^3/4 NICs; non-blocking.

    >>> t = fat_tree(k=4)
    >>> t.n_gpus, len(t.switches)
    (16, 20)
    """
    if k < 2 or k % 2:
        raise TopologyError(f"fat-tree k must be even and >= 2, got {k}")
    half = k // 2
    n_gpus = k**3 // 4
    if n_gpus > MAX_GPUS:
        raise TopologyError(f"a fat-tree of k = {k} has {n_gpus} NICs: at most {MAX_GPUS}")
    if n_gpus % gpus_per_host:
        raise TopologyError(f"k^3/4 = {n_gpus} NICs is not a multiple of gpus_per_host")
    if gpus_per_host > 1 and half % gpus_per_host:
        raise TopologyError("a fat-tree with multi-GPU hosts needs k/2 to be a multiple of "
                            "gpus_per_host (a host's NICs fit one edge group)")
    g = nx.Graph()
    _add_hosts(g, n_gpus, gpus_per_host, nvlink_rate_gbps, nvlink_delay_ns)
    for c in range(half * half):
        g.add_node(f"core{c}", kind=NodeKind.SWITCH, tier=3, role="core")
    per_pod = half * half
    for p in range(k):
        for j in range(half):
            agg = f"agg{p}_{j}"
            g.add_node(agg, kind=NodeKind.SWITCH, tier=2, role="agg", pod=p)
            for c in range(half):
                g.add_edge(agg, f"core{j * half + c}", kind=LinkKind.FABRIC,
                           rate_gbps=fabric_rate_gbps, delay_ns=link_delay_ns)
        for e in range(half):
            edge = f"edge{p}_{e}"
            g.add_node(edge, kind=NodeKind.SWITCH, tier=1, role="edge", pod=p)
            for j in range(half):
                g.add_edge(edge, f"agg{p}_{j}", kind=LinkKind.FABRIC,
                           rate_gbps=fabric_rate_gbps, delay_ns=link_delay_ns)
    for gpu in range(n_gpus):
        pod, slot = divmod(gpu, per_pod)
        if rail_optimized and gpus_per_host > 1:
            local_host, rail = divmod(slot, gpus_per_host)
            edge = (local_host // half) * gpus_per_host + rail
        else:
            edge = slot // half
        g.nodes[gpu_name(gpu)]["pod"] = pod
        g.add_edge(gpu_name(gpu), f"edge{pod}_{edge}", kind=LinkKind.NIC,
                   rate_gbps=nic_rate_gbps, delay_ns=link_delay_ns)
    params = dict(kind="fat_tree", k=k, gpus_per_host=gpus_per_host,
                  rail_optimized=rail_optimized)
    return Topology(g, name or f"fat-tree-k{k}", gpus_per_host, params)


BUILDERS: dict[str, Callable[..., Topology]] = {
    "leaf_spine": leaf_spine,
    "fat_tree": fat_tree,
}


def build_topology(kind: str, **params: object) -> Topology:
    """Build a topology by registry name; unknown names are rejected with the allowed list."""
    try:
        builder = BUILDERS[kind]
    except KeyError:
        raise TopologyError(
            f"unknown topology kind {kind!r} (allowed: {', '.join(sorted(BUILDERS))})"
        ) from None
    return builder(**params)
