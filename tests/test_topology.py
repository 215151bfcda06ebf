"""Topologies: builders, compiled tables, equal-cost paths and JSON import/export.

Every expected number is derived by hand from the topology definitions (leaf-spine spine count
= NIC ports / oversubscription, k-ary fat-tree counts from Al-Fares et al.) or computed
independently with networkx on the plain graph.
"""

from __future__ import annotations

import copy
import doctest
import itertools
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import networkx as nx
import numpy as np
import pytest

from fabricpilot.errors import ScenarioError, TopologyError
from fabricpilot.topology import (
    CompiledTopology,
    LinkKind,
    NodeKind,
    Topology,
    build_topology,
    builders,
    compile_topology,
    compiled,
    equal_cost_paths,
    fat_tree,
    io,
    leaf_spine,
    model,
    paths,
    split_fractions,
    validate_topology,
    walk_paths,
)
from fabricpilot.topology.io import (
    load_topology_json,
    save_topology_json,
    topology_from_dict,
    topology_to_dict,
)
from fabricpilot.topology.paths import path_delay_ns, switch_links_between

# ----------------------------------------------------------------------------- helpers


def kind_of(g: nx.Graph, n: str) -> str:
    return str(g.nodes[n]["kind"])


def nodes_by(g: nx.Graph, **attrs: object) -> list[str]:
    """Nodes whose attributes equal ``attrs`` (kind compared as a string)."""
    out = []
    for n, d in g.nodes(data=True):
        if all((str(d.get(k)) if k == "kind" else d.get(k)) == v for k, v in attrs.items()):
            out.append(n)
    return out


def nic_switch(g: nx.Graph, gpu: int) -> str:
    """The switch GPU ``gpu``'s NIC is cabled to, read off the graph."""
    nics = [v for v in g.neighbors(f"gpu{gpu}") if str(g.edges[f"gpu{gpu}", v]["kind"]) == "nic"]
    assert len(nics) == 1
    return nics[0]


def tier(g: nx.Graph, n: str) -> int:
    """GPUs are tier 0, switches carry their tier; NVSwitches are not expected on fabric paths."""
    d = g.nodes[n]
    if str(d["kind"]) == "gpu":
        return 0
    assert str(d["kind"]) == "switch", n
    return int(d["tier"])


def link_nodes(ct: CompiledTopology, path: tuple[int, ...]) -> tuple[str, ...]:
    """Node names along a path of link ids (checks the links are contiguous)."""
    for a, b in itertools.pairwise(path):
        assert ct.link_dst[a] == ct.link_src[b]
    return (ct.node_names[ct.link_src[path[0]]], *(ct.node_names[ct.link_dst[x]] for x in path))


def fabric_graph(topo: Topology) -> nx.Graph:
    """The graph without NVSwitch nodes (only the network a NIC can use)."""
    g = topo.graph
    return g.subgraph(n for n in g if kind_of(g, n) != "nvswitch").copy()


def is_up_down(tiers: list[int]) -> bool:
    """Tiers strictly rise to a single peak, then strictly fall."""
    peak = tiers.index(max(tiers))
    up, down = tiers[: peak + 1], tiers[peak:]
    return all(a < b for a, b in itertools.pairwise(up)) and all(
        a > b for a, b in itertools.pairwise(down)
    )


@pytest.mark.parametrize("module", [model, builders, compiled, paths, io])
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0


# ------------------------------------------------------------------------- leaf-spine


@pytest.mark.parametrize(
    ("oversubscription", "n_spines"), [(1.0, 16), (2.0, 8), (4.0, 4), (0.5, 32)]
)
def test_leaf_spine_spine_count(oversubscription: float, n_spines: int) -> None:
    # 16 NIC ports per leaf at 400G, uplinks at 400G: spines = 16 / oversubscription
    t = leaf_spine(hosts=32, gpus_per_host=8, nics_per_leaf=16, oversubscription=oversubscription)
    g = t.graph
    spines = nodes_by(g, kind="switch", role="spine")
    assert len(spines) == n_spines
    assert all(g.nodes[s]["tier"] == 2 for s in spines)
    assert t.params["n_spines"] == n_spines


def test_leaf_spine_spine_count_uses_rates() -> None:
    # 16 x 400G down, 800G uplinks, 1:1 -> 16 * 400 / 800 = 8 spines (2 leaves)
    t = leaf_spine(hosts=32, gpus_per_host=1, nics_per_leaf=16, fabric_rate_gbps=800.0)
    assert len(nodes_by(t.graph, role="spine")) == 8


@pytest.mark.parametrize(("per_leaf", "ratio", "spines"), [(16, 1.6, 10), (48, 1.2, 40),
                                                          (16, 3.2, 5), (64, 1.28, 50)])
def test_leaf_spine_decimal_oversubscription(per_leaf: int, ratio: float, spines: int) -> None:
    """A ratio as written: 16 ports at 1.6 : 1 are 10 uplinks (16 / 1.6 = 10 exactly, though
    the binary float 1.6 is not 8/5)."""
    t = leaf_spine(hosts=2 * per_leaf, gpus_per_host=1, nics_per_leaf=per_leaf,
                   oversubscription=ratio, rail_optimized=False)
    assert len(nodes_by(t.graph, role="spine")) == spines


def test_leaf_spine_of_one_leaf_has_no_spines() -> None:
    """One leaf reaches every NIC: no traffic would ever cross a spine, so none is built
    (the parts list of a 16-GPU, one-switch cluster is one switch)."""
    t = leaf_spine(hosts=2, gpus_per_host=8, nics_per_leaf=16, rail_optimized=False)
    assert len(nodes_by(t.graph, role="spine")) == 0
    assert len(nodes_by(t.graph, role="leaf")) == 1
    assert t.params["n_spines"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(oversubscription=3.0),  # 16 / 3
        dict(oversubscription=1.0, fabric_rate_gbps=300.0),  # 16 * 400 / 300
        dict(oversubscription=32.0),  # 0.5 spine
    ],
)
def test_leaf_spine_non_integer_spines_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(TopologyError, match="spines"):
        leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=16, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(oversubscription=0.0), dict(fabric_rate_gbps=0.0),
                                    dict(oversubscription=-1.0)])
def test_leaf_spine_zero_divisor_raises_topology_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(TopologyError):
        leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=16, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(hosts=0), dict(gpus_per_host=0), dict(nics_per_leaf=0)])
def test_leaf_spine_bad_sizes_raise(kwargs: dict[str, int]) -> None:
    params: dict[str, Any] = dict(hosts=4, gpus_per_host=2, nics_per_leaf=4) | kwargs
    with pytest.raises(TopologyError):
        leaf_spine(**params)


def test_leaf_spine_rail_optimised_layout() -> None:
    hosts, gph, npl = 40, 8, 16  # 40 hosts -> 3 host groups of <= 16 hosts, 8 rails each
    t = leaf_spine(hosts=hosts, gpus_per_host=gph, nics_per_leaf=npl)
    g = t.graph
    assert t.n_gpus == hosts * gph == 320
    assert t.n_hosts == hosts
    leaves = nodes_by(g, kind="switch", role="leaf")
    assert len(leaves) == 3 * gph  # ceil(40 / 16) groups x 8 rails
    assert all(g.nodes[s]["tier"] == 1 for s in leaves)
    assert len(nodes_by(g, kind="gpu")) == 320

    leaf_of_key: dict[tuple[int, int], str] = {}
    for gpu in range(t.n_gpus):
        host, rank = divmod(gpu, gph)
        d = g.nodes[f"gpu{gpu}"]
        assert (d["gpu"], d["host"], d["local_rank"], d["rail"]) == (gpu, host, rank, rank)
        leaf = nic_switch(g, gpu)
        key = (host // npl, rank)  # group of 16 hosts, rail
        assert leaf_of_key.setdefault(key, leaf) == leaf  # same group + rail: same leaf
        assert t.gpu_leaf[gpu] == leaf
    assert len(set(leaf_of_key.values())) == len(leaf_of_key) == 3 * gph  # distinct keys
    # every leaf carries a single rail, at most 16 NICs
    for leaf in leaves:
        gpus = [v for v in g.neighbors(leaf) if kind_of(g, v) == "gpu"]
        assert 1 <= len(gpus) <= npl
        assert len({g.nodes[v]["rail"] for v in gpus}) == 1
    # the last group has 40 - 32 = 8 hosts
    assert sorted(Counter(nic_switch(g, i) for i in range(t.n_gpus)).values()) == (
        [8] * gph + [16] * (2 * gph)
    )


def test_leaf_spine_tor_layout() -> None:
    hosts, gph, npl = 8, 4, 16
    t = leaf_spine(hosts=hosts, gpus_per_host=gph, nics_per_leaf=npl, rail_optimized=False)
    g = t.graph
    leaves = nodes_by(g, role="leaf")
    assert len(leaves) == hosts * gph // npl == 2
    for host in range(hosts):
        assert len({nic_switch(g, gpu) for gpu in range(host * gph, (host + 1) * gph)}) == 1
    assert sorted(Counter(nic_switch(g, i) for i in range(t.n_gpus)).values()) == [16, 16]
    with pytest.raises(TopologyError, match="multiple"):
        leaf_spine(hosts=4, gpus_per_host=3, nics_per_leaf=16, rail_optimized=False)


@pytest.mark.parametrize("rail", [True, False])
@pytest.mark.parametrize("oversubscription", [1.0, 2.0])
def test_leaf_spine_full_bipartite(rail: bool, oversubscription: float) -> None:
    t = leaf_spine(hosts=32, gpus_per_host=8, nics_per_leaf=16, rail_optimized=rail,
                   oversubscription=oversubscription)
    g = t.graph
    leaves, spines = nodes_by(g, role="leaf"), nodes_by(g, role="spine")
    assert len(leaves) == 16
    for leaf in leaves:
        ups = {v for v in g.neighbors(leaf) if kind_of(g, v) == "switch"}
        assert ups == set(spines)
    for spine in spines:
        assert set(g.neighbors(spine)) == set(leaves)
    fabric = [e for e in g.edges(data="kind") if str(e[2]) == "fabric"]
    assert len(fabric) == len(leaves) * len(spines)


def test_leaf_spine_link_attributes() -> None:
    t = leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=4, nic_rate_gbps=200.0,
                   fabric_rate_gbps=400.0, nvlink_rate_gbps=900.0, link_delay_ns=250,
                   nvlink_delay_ns=30)
    g = t.graph
    by_kind: dict[str, set[tuple[float, int]]] = {}
    for _, _, d in g.edges(data=True):
        by_kind.setdefault(str(d["kind"]), set()).add((d["rate_gbps"], d["delay_ns"]))
    assert by_kind == {"nic": {(200.0, 250)}, "fabric": {(400.0, 250)}, "nvlink": {(900.0, 30)}}
    # spines = 4 * 200 / 400 = 2
    assert len(nodes_by(g, role="spine")) == 2
    validate_topology(t)


def test_nvlink_only_with_several_gpus_per_host() -> None:
    one = leaf_spine(hosts=8, gpus_per_host=1, nics_per_leaf=4)
    assert not nodes_by(one.graph, kind="nvswitch")
    assert not [e for e in one.graph.edges(data="kind") if str(e[2]) == "nvlink"]

    gph = 4
    many = leaf_spine(hosts=8, gpus_per_host=gph, nics_per_leaf=4)
    g = many.graph
    assert len(nodes_by(g, kind="nvswitch")) == 8
    nv = [(u, v) for u, v, k in g.edges(data="kind") if str(k) == "nvlink"]
    assert len(nv) == 8 * gph  # one NVLink per GPU
    for gpu in range(many.n_gpus):
        nbrs = [v for v in g.neighbors(f"gpu{gpu}") if kind_of(g, v) == "nvswitch"]
        assert nbrs == [f"nvs{gpu // gph}"]
        assert g.degree(f"gpu{gpu}") == 2  # NIC + NVLink


def test_build_topology_registry() -> None:
    t = build_topology("fat_tree", k=4)
    assert t.n_gpus == 16
    with pytest.raises(TopologyError, match="allowed: fat_tree, leaf_spine"):
        build_topology("torus", k=4)


# --------------------------------------------------------------------------- fat-tree


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fat_tree_counts(k: int) -> None:
    t = fat_tree(k=k)
    g = t.graph
    half = k // 2
    assert t.n_gpus == len(nodes_by(g, kind="gpu")) == k**3 // 4
    assert len(t.switches) == 5 * k * k // 4
    cores, aggs, edges = nodes_by(g, role="core"), nodes_by(g, role="agg"), nodes_by(g, role="edge")
    assert (len(cores), len(aggs), len(edges)) == (k * k // 4, k * k // 2, k * k // 2)
    assert {g.nodes[n]["tier"] for n in cores} == {3}
    assert {g.nodes[n]["tier"] for n in aggs} == {2}
    assert {g.nodes[n]["tier"] for n in edges} == {1}
    for e in edges:
        kinds = Counter(kind_of(g, v) for v in g.neighbors(e))
        assert kinds == {"gpu": half, "switch": half}  # k/2 NIC ports, k/2 uplinks
        pod = g.nodes[e]["pod"]
        assert all(g.nodes[v]["pod"] == pod for v in g.neighbors(e) if kind_of(g, v) == "switch")
    for a in aggs:
        nbrs = list(g.neighbors(a))
        assert Counter(g.nodes[v]["role"] for v in nbrs) == {"edge": half, "core": half}
    for c in cores:
        pods = [g.nodes[v]["pod"] for v in g.neighbors(c)]
        assert sorted(pods) == list(range(k))  # exactly one agg per pod
        assert all(g.nodes[v]["role"] == "agg" for v in g.neighbors(c))
    # non-blocking: every edge-to-agg and agg-to-core cut has k^3/4 links
    fabric = [1 for *_, kd in g.edges(data="kind") if str(kd) == "fabric"]
    assert len(fabric) == 2 * k**3 // 4


@pytest.mark.parametrize("k", [3, 5, 0, -2])
def test_fat_tree_bad_k_raises(k: int) -> None:
    with pytest.raises(TopologyError, match="even"):
        fat_tree(k=k)


def test_fat_tree_bad_gpus_per_host() -> None:
    with pytest.raises(TopologyError, match="multiple of gpus_per_host"):
        fat_tree(k=4, gpus_per_host=3)  # 16 NICs
    with pytest.raises(TopologyError, match="k/2"):
        fat_tree(k=8, gpus_per_host=8)  # k/2 = 4 is not a multiple of 8


@pytest.mark.parametrize(("k", "gph"), [(8, 4), (8, 2), (4, 2), (12, 2), (12, 3)])
def test_fat_tree_rail_optimised(k: int, gph: int) -> None:
    t = fat_tree(k=k, gpus_per_host=gph)
    g = t.graph
    half = k // 2
    per_pod = half * half
    hosts_per_pod = per_pod // gph
    for gpu in range(t.n_gpus):
        host, rail = divmod(gpu, gph)
        pod = gpu // per_pod
        local_host = host - pod * hosts_per_pod
        edge = nic_switch(g, gpu)
        assert g.nodes[edge]["pod"] == pod == g.nodes[f"gpu{gpu}"]["pod"]
        p, e = (int(x) for x in edge.removeprefix("edge").split("_"))
        assert p == pod
        assert e % gph == rail  # the edge of rail r has index = r (mod gpus_per_host)
        # groups of k/2 hosts share the edge of each rail
        assert e == (local_host // half) * gph + rail
    # hosts never span pods
    for host in range(t.n_hosts):
        assert len({g.nodes[f"gpu{i}"]["pod"] for i in range(host * gph, (host + 1) * gph)}) == 1
    # every edge holds k/2 NICs of one rail
    for edge in nodes_by(g, role="edge"):
        gpus = [v for v in g.neighbors(edge) if kind_of(g, v) == "gpu"]
        assert len(gpus) == half
        assert len({g.nodes[v]["rail"] for v in gpus}) == 1


def test_fat_tree_k8_gph4_rail_r_on_edge_r() -> None:
    t = fat_tree(k=8, gpus_per_host=4)
    for gpu in range(t.n_gpus):
        pod, rail = gpu // 16, gpu % 4
        assert t.gpu_leaf[gpu] == f"edge{pod}_{rail}"


def test_fat_tree_link_attributes() -> None:
    t = fat_tree(k=4, gpus_per_host=2, nic_rate_gbps=100.0, fabric_rate_gbps=200.0,
                 nvlink_rate_gbps=1800.0, link_delay_ns=500, nvlink_delay_ns=20)
    seen = {(str(d["kind"]), d["rate_gbps"], d["delay_ns"]) for *_, d in t.graph.edges(data=True)}
    assert seen == {("nic", 100.0, 500), ("fabric", 200.0, 500), ("nvlink", 1800.0, 20)}


# ---------------------------------------------------------------------- compiled tables


def test_compiled_link_table() -> None:
    t = fat_tree(k=4, gpus_per_host=2)
    ct = compile_topology(t)
    g = t.graph
    assert ct.n_links == 2 * g.number_of_edges()
    assert ct.n_gpus == 16 and ct.n_switches == 20
    assert ct.node_names[:16] == tuple(f"gpu{i}" for i in range(16))
    seen = set()
    for lid in range(ct.n_links):
        u, v = ct.node_names[ct.link_src[lid]], ct.node_names[ct.link_dst[lid]]
        d = g.edges[u, v]
        assert ct.rate_gbps[lid] == d["rate_gbps"] and ct.delay_ns[lid] == d["delay_ns"]
        assert ct.link_kind[lid] == {"nic": 0, "fabric": 1, "nvlink": 2}[str(d["kind"])]
        assert ct.link_id[(int(ct.link_src[lid]), int(ct.link_dst[lid]))] == lid
        # the reverse direction is the twin link
        twin = lid ^ 1
        assert (ct.link_src[twin], ct.link_dst[twin]) == (ct.link_src[lid], ct.link_dst[lid])[::-1]
        seen.add((u, v))
    assert len(seen) == ct.n_links
    for gpu in range(16):
        assert ct.link_name(int(ct.gpu_up[gpu])) == f"gpu{gpu}->{t.gpu_leaf[gpu]}"
        assert ct.link_name(int(ct.gpu_down[gpu])) == f"{t.gpu_leaf[gpu]}->gpu{gpu}"
        assert ct.link_name(int(ct.gpu_nv_up[gpu])) == f"gpu{gpu}->nvs{gpu // 2}"
        assert ct.link_name(int(ct.gpu_nv_down[gpu])) == f"nvs{gpu // 2}->gpu{gpu}"
    assert (compile_topology(fat_tree(k=4)).gpu_nv_up == -1).all()


def test_compiled_hop_distance_matches_networkx() -> None:
    t = fat_tree(k=4)
    ct = compile_topology(t)
    sw = nx.Graph(t.graph.subgraph(t.switches))
    for s, name in enumerate(t.switches):
        lengths = nx.single_source_shortest_path_length(sw, name)
        for leaf_name in nodes_by(t.graph, role="edge"):
            leaf = t.switches.index(leaf_name)
            assert ct.hop_distance[s, ct.leaf_slot[leaf]] == lengths[leaf_name]


# ------------------------------------------------------------------ equal-cost paths

LEAF_SPINE = dict(hosts=32, gpus_per_host=8, nics_per_leaf=16)


def check_paths_against_networkx(topo: Topology, ct: CompiledTopology, fg: nx.Graph,
                                 a: int, b: int) -> list[tuple[int, ...]]:
    got = equal_cost_paths(ct, a, b)
    node_paths = [link_nodes(ct, p) for p in got]
    assert len(set(node_paths)) == len(node_paths)  # no duplicates
    expected = {tuple(p) for p in nx.all_shortest_paths(fg, f"gpu{a}", f"gpu{b}")}
    assert set(node_paths) == expected
    length = nx.shortest_path_length(fg, f"gpu{a}", f"gpu{b}")
    for p, nodes in zip(got, node_paths, strict=True):
        assert len(p) == length
        assert nodes[0] == f"gpu{a}" and nodes[-1] == f"gpu{b}"
        assert is_up_down([tier(topo.graph, n) for n in nodes])
    return got


@pytest.mark.parametrize("oversubscription", [1.0, 2.0])
def test_equal_cost_paths_leaf_spine(oversubscription: float) -> None:
    t = leaf_spine(**LEAF_SPINE, oversubscription=oversubscription)
    n_spines = int(16 / oversubscription)
    ct = compile_topology(t)
    fg = fabric_graph(t)
    rng = np.random.default_rng(1)
    pairs = [(0, 8), (0, 1), (5, 13), (0, 128), (7, 255)]  # same leaf, other rails, other group
    pairs += [tuple(int(x) for x in rng.choice(t.n_gpus, 2, replace=False)) for _ in range(40)]
    counts = Counter()
    for a, b in pairs:
        if a // 8 == b // 8:
            continue  # same host: NVLink, checked below
        got = check_paths_against_networkx(t, ct, fg, a, b)
        same_leaf = (a // 8 // 16, a % 8) == (b // 8 // 16, b % 8)
        assert len(got) == (1 if same_leaf else n_spines)
        assert len(got[0]) == (2 if same_leaf else 4)
        counts[same_leaf] += 1
    assert counts[True] >= 1 and counts[False] >= 1


def test_equal_cost_paths_tor_same_leaf() -> None:
    t = leaf_spine(hosts=8, gpus_per_host=1, nics_per_leaf=4, rail_optimized=False)
    ct = compile_topology(t)
    assert [link_nodes(ct, p) for p in equal_cost_paths(ct, 0, 3)] == [("gpu0", "leaf0", "gpu3")]
    assert len(equal_cost_paths(ct, 0, 4)) == 4


@pytest.mark.parametrize(("k", "all_pairs"), [(4, True), (6, False), (8, False)])
def test_equal_cost_paths_fat_tree(k: int, all_pairs: bool) -> None:
    t = fat_tree(k=k)
    ct = compile_topology(t)
    fg = fabric_graph(t)
    half = k // 2
    if all_pairs:
        pairs = list(itertools.permutations(range(t.n_gpus), 2))
    else:
        rng = np.random.default_rng(k)
        pairs = [tuple(int(x) for x in rng.choice(t.n_gpus, 2, replace=False))
                 for _ in range(60)]
        pairs += [(0, 1), (0, half), (0, half * half)]  # same edge, same pod, other pod
    categories = Counter()
    for a, b in pairs:
        # with one GPU per host (no rails) GPU i sits on edge (i // (k/2)) of pod i // (k/2)^2
        same_edge = a // half == b // half
        same_pod = a // (half * half) == b // (half * half)
        expected = 1 if same_edge else half if same_pod else half * half
        got = check_paths_against_networkx(t, ct, fg, a, b)
        assert len(got) == expected
        assert len(got[0]) == (2 if same_edge else 4 if same_pod else 6)
        categories[expected] += 1
    assert set(categories) == {1, half, half * half}


def test_equal_cost_paths_rail_fat_tree_k8() -> None:
    # same rail in a pod: one edge; different rail, same pod: k/2 aggs; other pod: (k/2)^2
    t = fat_tree(k=8, gpus_per_host=4)
    ct = compile_topology(t)
    fg = fabric_graph(t)
    assert len(check_paths_against_networkx(t, ct, fg, 0, 4)) == 1  # host 0 / 1, rail 0
    assert len(check_paths_against_networkx(t, ct, fg, 0, 5)) == 4  # rail 0 -> rail 1
    assert len(check_paths_against_networkx(t, ct, fg, 0, 16)) == 16  # next pod, rail 0
    assert len(check_paths_against_networkx(t, ct, fg, 3, 127)) == 16


@pytest.mark.parametrize("topo", [
    leaf_spine(hosts=4, gpus_per_host=8, nics_per_leaf=4),
    leaf_spine(hosts=4, gpus_per_host=4, nics_per_leaf=16, rail_optimized=False),
    fat_tree(k=4, gpus_per_host=2),
])
def test_intra_host_uses_nvlink(topo: Topology) -> None:
    ct = compile_topology(topo)
    gph = topo.gpus_per_host
    for host in range(topo.n_hosts):
        for a, b in itertools.permutations(range(host * gph, (host + 1) * gph), 2):
            got = equal_cost_paths(ct, a, b)
            assert len(got) == 1 and len(got[0]) == 2
            assert link_nodes(ct, got[0]) == (f"gpu{a}", f"nvs{host}", f"gpu{b}")
            assert ct.link_kind[list(got[0])].tolist() == [2, 2]
            walked = walk_paths(ct, np.array([a]), np.array([b]),
                                lambda s, sw, r: np.zeros(len(r)))[0]
            assert tuple(int(x) for x in walked if x >= 0) == got[0]


def test_equal_cost_paths_same_gpu_raises() -> None:
    ct = compile_topology(fat_tree(k=4))
    with pytest.raises(TopologyError, match="same"):
        equal_cost_paths(ct, 3, 3)


def test_disconnected_switch_graph_raises() -> None:
    g = nx.Graph()
    for i in range(2):
        g.add_node(f"gpu{i}", kind=NodeKind.GPU, gpu=i, host=i)
        g.add_node(f"leaf{i}", kind=NodeKind.SWITCH, tier=1, role="leaf")
        g.add_edge(f"gpu{i}", f"leaf{i}", kind=LinkKind.NIC, rate_gbps=1.0, delay_ns=0)
    with pytest.raises(TopologyError, match="not connected"):
        compile_topology(Topology(g))


# ---------------------------------------------------------------------------- walk_paths


def walked(ct: CompiledTopology, src: list[int], dst: list[int], choose: Any) -> list[tuple]:
    out = walk_paths(ct, np.array(src), np.array(dst), choose)
    return [tuple(int(x) for x in row if x >= 0) for row in out]


@pytest.mark.parametrize("topo", [
    leaf_spine(**LEAF_SPINE),
    leaf_spine(**LEAF_SPINE, oversubscription=2.0, rail_optimized=False),
    fat_tree(k=8),
    fat_tree(k=8, gpus_per_host=4),
])
def test_walk_paths_constant_and_random_choices(topo: Topology) -> None:
    ct = compile_topology(topo)
    rng = np.random.default_rng(7)
    src = rng.integers(0, topo.n_gpus, 300)
    dst = (src + rng.integers(1, topo.n_gpus, 300)) % topo.n_gpus
    allowed = [set(equal_cost_paths(ct, int(a), int(b))) for a, b in zip(src, dst, strict=True)]
    for i in (0, 1, 3, 17, 2**31 + 5):
        got = walked(ct, src.tolist(), dst.tolist(), lambda s, sw, r, i=i: np.full(len(r), i))
        assert all(p in ok for p, ok in zip(got, allowed, strict=True))
    for _ in range(3):
        got = walked(ct, src.tolist(), dst.tolist(),
                     lambda s, sw, r: rng.integers(0, 2**32, len(r), dtype=np.uint64))
        assert all(p in ok for p, ok in zip(got, allowed, strict=True))


@pytest.mark.parametrize(("topo", "a", "b", "n_paths"), [
    (leaf_spine(**LEAF_SPINE), 0, 9, 16),
    (fat_tree(k=8), 0, 127, 16),
    (fat_tree(k=8), 0, 5, 4),
    (fat_tree(k=6), 1, 50, 9),
])
def test_walk_paths_reaches_every_path(topo: Topology, a: int, b: int, n_paths: int) -> None:
    ct = compile_topology(topo)
    radix = ct.nh_link.shape[2]  # the largest ECMP group
    steps = int(ct.hop_distance.max())
    n = radix**steps
    # row r takes member (r // radix^step) % group at every step: all combinations appear
    got = walked(ct, [a] * n, [b] * n, lambda s, sw, r: r // radix**s)
    expected = set(equal_cost_paths(ct, a, b))
    assert len(expected) == n_paths
    assert set(got) == expected


def test_walk_paths_empty_batch() -> None:
    ct = compile_topology(fat_tree(k=4))
    out = walk_paths(ct, np.array([], np.int64), np.array([], np.int64),
                     lambda s, sw, r: np.zeros(len(r)))
    assert out.shape == (0, 6)  # k-ary fat-tree: at most 2 NIC links + 4 fabric hops


def test_path_delay() -> None:
    t = leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=4, link_delay_ns=100,
                   nvlink_delay_ns=50)
    ct = compile_topology(t)
    p = walk_paths(ct, np.array([0, 0, 0]), np.array([1, 2, 3]),
                   lambda s, sw, r: np.zeros(len(r)))
    # gpu0->gpu1: NVLink x2 + one NVSwitch; gpu0->gpu2: same leaf (rail 0): 2 links, 1 switch;
    # gpu0->gpu3: rail 0 -> rail 1 through a spine: 4 links, 3 switches
    assert path_delay_ns(ct, p, 1000).tolist() == [2 * 50 + 1000, 2 * 100 + 1000,
                                                   4 * 100 + 3 * 1000]


# ------------------------------------------------------------------------ split_fractions


def fractions(ct: CompiledTopology, a: int, b: int) -> dict[tuple[str, str], float]:
    links, frac = split_fractions(ct, int(ct.gpu_leaf[a]), int(ct.leaf_slot[ct.gpu_leaf[b]]))
    assert (np.diff(links) > 0).all()
    return {(ct.node_names[ct.link_src[x]], ct.node_names[ct.link_dst[x]]): float(f)
            for x, f in zip(links.tolist(), frac.tolist(), strict=True)}


def check_conservation(frac: dict[tuple[str, str], float], src_leaf: str, dst_leaf: str) -> None:
    out_of: Counter[str] = Counter()
    into: Counter[str] = Counter()
    for (u, v), f in frac.items():
        out_of[u] += f
        into[v] += f
    assert out_of[src_leaf] == pytest.approx(1.0)
    assert into[dst_leaf] == pytest.approx(1.0)
    assert into[src_leaf] == 0 and out_of[dst_leaf] == 0
    for sw in set(out_of) | set(into):
        if sw not in (src_leaf, dst_leaf):
            assert into[sw] == pytest.approx(out_of[sw]), sw


@pytest.mark.parametrize("oversubscription", [1.0, 2.0, 4.0])
def test_split_fractions_leaf_spine(oversubscription: float) -> None:
    t = leaf_spine(**LEAF_SPINE, oversubscription=oversubscription)
    n_spines = int(16 / oversubscription)
    ct = compile_topology(t)
    frac = fractions(ct, 0, 9)  # rail 0 -> rail 1
    src_leaf, dst_leaf = t.gpu_leaf[0], t.gpu_leaf[9]
    spines = nodes_by(t.graph, role="spine")
    expected = {(src_leaf, s): 1 / n_spines for s in spines}
    expected |= {(s, dst_leaf): 1 / n_spines for s in spines}
    assert frac.keys() == expected.keys()
    assert frac == pytest.approx(expected)
    check_conservation(frac, src_leaf, dst_leaf)
    assert fractions(ct, 0, 8) == {}  # same leaf: no fabric link


@pytest.mark.parametrize("k", [4, 6, 8])
def test_split_fractions_fat_tree(k: int) -> None:
    t = fat_tree(k=k)
    ct = compile_topology(t)
    half = k // 2
    g = t.graph
    a, b = 0, t.n_gpus - 1  # pod 0 -> pod k-1
    frac = fractions(ct, a, b)
    src_edge, dst_edge = t.gpu_leaf[a], t.gpu_leaf[b]
    by_roles: dict[tuple[str, str], list[float]] = {}
    for (u, v), f in frac.items():
        by_roles.setdefault((g.nodes[u]["role"], g.nodes[v]["role"]), []).append(f)
    assert by_roles.keys() == {("edge", "agg"), ("agg", "core"), ("core", "agg"), ("agg", "edge")}
    assert by_roles[("edge", "agg")] == pytest.approx([1 / half] * half)
    assert by_roles[("agg", "core")] == pytest.approx([1 / half**2] * half**2)
    assert by_roles[("core", "agg")] == pytest.approx([1 / half**2] * half**2)
    assert by_roles[("agg", "edge")] == pytest.approx([1 / half] * half)
    assert all(g.nodes[u]["pod"] == 0 for (u, v) in frac if g.nodes[u]["role"] == "edge")
    check_conservation(frac, src_edge, dst_edge)

    # same pod, other edge: k/2 aggs, 1/(k/2) on each of the 2 * k/2 links
    same_pod = fractions(ct, 0, half)
    assert len(same_pod) == 2 * half
    assert list(same_pod.values()) == pytest.approx([1 / half] * (2 * half))
    check_conservation(same_pod, t.gpu_leaf[0], t.gpu_leaf[half])


# ----------------------------------------------------------------------------- JSON io


ROUND_TRIP = [
    leaf_spine(hosts=4, gpus_per_host=4, nics_per_leaf=4),
    leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=4, rail_optimized=False,
               oversubscription=2.0),
    fat_tree(k=4, gpus_per_host=2),
]


def _attrs(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if k == "kind" else v) for k, v in d.items()}


@pytest.mark.parametrize("topo", ROUND_TRIP)
def test_json_round_trip(topo: Topology, tmp_path: Path) -> None:
    path = tmp_path / "topo.json"
    save_topology_json(topo, path)
    back = load_topology_json(path)
    g, h = topo.graph, back.graph
    assert (back.name, back.gpus_per_host, back.params) == (topo.name, topo.gpus_per_host,
                                                            topo.params)
    assert set(g.nodes) == set(h.nodes)
    assert {n: _attrs(d) for n, d in g.nodes(data=True)} == {
        n: _attrs(d) for n, d in h.nodes(data=True)}
    assert {frozenset((u, v)): _attrs(d) for u, v, d in g.edges(data=True)} == {
        frozenset((u, v)): _attrs(d) for u, v, d in h.edges(data=True)}
    assert nx.is_isomorphic(g, h, node_match=lambda x, y: _attrs(x) == _attrs(y),
                            edge_match=lambda x, y: _attrs(x) == _attrs(y))
    assert isinstance(h.nodes["gpu0"]["kind"], NodeKind)
    assert isinstance(h.edges["gpu0", topo.gpu_leaf[0]]["kind"], LinkKind)

    a, b = compile_topology(topo), compile_topology(back)
    assert a.node_names == b.node_names
    assert a.link_id == b.link_id
    for field in ("link_src", "link_dst", "rate_gbps", "delay_ns", "link_kind", "gpu_up",
                  "gpu_down", "gpu_leaf", "gpu_nv_up", "switch_tier", "leaf_slot", "nh_count",
                  "nh_link", "hop_distance"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    # exporting again gives the same document
    assert topology_to_dict(back) == json.loads(path.read_text())


def test_json_round_trip_keeps_switch_order_large_fat_tree() -> None:
    topo = fat_tree(k=22)
    back = topology_from_dict(json.loads(json.dumps(topology_to_dict(topo))))
    assert back.switches == topo.switches


def small_doc() -> dict[str, Any]:
    """A valid document: 2 hosts x 2 GPUs, rail-optimised, 2 leaves, 2 spines."""
    return topology_to_dict(leaf_spine(hosts=2, gpus_per_host=2, nics_per_leaf=2))


def json_error(tmp_path: Path, doc: dict[str, Any] | str) -> ScenarioError:
    path = tmp_path / "bad_topo.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ScenarioError) as info:
        load_topology_json(path)
    err = info.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    assert err.source == str(path)
    if err.field:
        assert msg == f"{path}: {err.field}: {err.problem}"
    return err


def test_small_doc_is_valid(tmp_path: Path) -> None:
    doc = small_doc()
    assert len(doc["links"]) == 4 + 2 * 2 + 4  # NICs, leaf-spine, NVLinks
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(doc))
    assert load_topology_json(path).n_gpus == 4


def _link_index(doc: dict[str, Any], a: str, b: str) -> int:
    return next(i for i, x in enumerate(doc["links"]) if {x["a"], x["b"]} == {a, b})


def test_json_unknown_node_in_link(tmp_path: Path) -> None:
    doc = small_doc()
    i = _link_index(doc, "leaf0", "spine1")
    doc["links"][i]["b"] = "spine9"
    err = json_error(tmp_path, doc)
    assert err.field == f"links[{i}].b"
    assert "spine9" in err.problem and "unknown node" in err.problem


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("rate_gbps", -400.0, "below the smallest rate a scenario takes (1 Mbps)"),
    ("rate_gbps", 0, "below the smallest rate"),
    ("rate_gbps", 1e-9, "below the smallest rate"),  # (as a scenario's rates: 1 Mb/s at least)
    ("rate_gbps", 2e6, "less than or equal to 1000000"),
    ("rate_gbps", True, "must be a number (got True; a topology file gives rates in Gb/s"),
    ("rate_gbps", "400", "must be a number (got '400'"),
    ("rate_gbps", "400Gbps", "must be a number (got '400Gbps'; a topology file gives rates "
                             "in Gb/s, delays in ns)"),
    ("delay_ns", -1, "greater than or equal to 0"),
    ("delay_ns", "100", "must be a whole number (got '100'"),
    ("delay_ns", 100.5, "must be a whole number (got 100.5"),
])
def test_json_bad_link_number(tmp_path: Path, key: str, value: object, problem: str) -> None:
    doc = small_doc()
    doc["links"][2][key] = value
    err = json_error(tmp_path, doc)
    assert err.field == f"links[2].{key}"
    assert problem in err.problem


def test_json_smallest_and_whole_numbers_load(tmp_path: Path) -> None:
    """1 Mb/s (the floor), an integer rate and a delay of 0 are fine."""
    doc = small_doc()
    doc["links"][2]["rate_gbps"] = 1e-3
    doc["links"][3]["rate_gbps"] = 400
    doc["links"][3]["delay_ns"] = 0
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(doc))
    assert load_topology_json(path).n_gpus == 4


@pytest.mark.parametrize("swap", [False, True])
def test_json_duplicate_link(tmp_path: Path, swap: bool) -> None:
    doc = small_doc()
    dup = copy.deepcopy(doc["links"][1])
    if swap:
        dup["a"], dup["b"] = dup["b"], dup["a"]
    doc["links"].append(dup)
    err = json_error(tmp_path, doc)
    n = len(doc["links"]) - 1
    assert err.field == f"links[{n}]"
    assert "duplicate link" in err.problem


def test_json_missing_and_wrong_format(tmp_path: Path) -> None:
    doc = small_doc()
    del doc["format"]
    err = json_error(tmp_path, doc)
    assert err.field == "format"
    assert "required" in err.problem.lower()
    doc["format"] = "fabricpilot-topology/2"
    err = json_error(tmp_path, doc)
    assert (err.field, err.problem) == (
        "format", "must be 'fabricpilot-topology/1' (got 'fabricpilot-topology/2')")


def test_json_syntax_error(tmp_path: Path) -> None:
    text = '{\n "format": "fabricpilot-topology/1",\n "name": "x",,\n}\n'
    err = json_error(tmp_path, text)
    assert err.field == "line 3"
    assert "invalid JSON" in err.problem


@pytest.mark.parametrize(("mutate", "field", "needle"), [
    (lambda d: d["nodes"].append(copy.deepcopy(d["nodes"][0])), "nodes[{last}].id", "duplicate"),
    (lambda d: d["nodes"][0].update(kind="router"), "nodes[0].kind",
     "must be 'gpu', 'nvswitch' or 'switch' (got 'router')"),
    (lambda d: d["links"][0].update(colour="red"), "links[0].colour", ""),
    (lambda d: d["links"][0].update(kind="copper"), "links[0].kind", ""),
    (lambda d: d.update(gpus_per_host=0), "gpus_per_host", ""),
    (lambda d: d.update(extra=1), "extra", ""),
])
def test_json_bad_fields(tmp_path: Path, mutate: Any, field: str, needle: str) -> None:
    doc = small_doc()
    mutate(doc)
    err = json_error(tmp_path, doc)
    assert err.field == field.format(last=len(doc["nodes"]) - 1)
    assert needle in err.problem


def test_json_topology_invariants(tmp_path: Path) -> None:
    # each named by the node that breaks it
    doc = small_doc()
    at = [n["id"] for n in doc["nodes"]].index
    doc["links"] = [x for x in doc["links"] if {x["a"], x["b"]} != {"gpu0", "leaf0"}]
    err = json_error(tmp_path, doc)
    assert err.field == f"nodes[{at('gpu0')}]"
    assert err.problem == "GPU 'gpu0' has 0 NIC links; a GPU has one, to its leaf"
    doc = small_doc()
    doc["nodes"] = [n for n in doc["nodes"] if n["id"] != "gpu3"]
    doc["links"] = [x for x in doc["links"] if "gpu3" not in (x["a"], x["b"])]
    doc["nodes"][at("gpu2")]["gpu"] = 5
    err = json_error(tmp_path, doc)
    assert err.field == f"nodes[{at('gpu2')}].gpu"
    assert err.problem == "5, but the 3 GPUs are numbered 0..2 without gaps"
    doc = small_doc()
    doc["nodes"][at("gpu2")]["gpu"] = 1
    err = json_error(tmp_path, doc)
    assert (err.field, err.problem) == (f"nodes[{at('gpu2')}].gpu",
                                        f"GPU id 1 again (nodes[{at('gpu1')}] has it)")


def test_json_not_an_object_and_missing_file(tmp_path: Path) -> None:
    err = json_error(tmp_path, "[1, 2]")
    assert err.field == ""
    missing = tmp_path / "nope.json"
    with pytest.raises(ScenarioError, match="file not found") as info:
        load_topology_json(missing)
    assert str(info.value) == f"{missing}: file not found"


def test_routing_around_a_link_down_in_one_direction_only() -> None:
    """A cable that fails one way (spine0 -> leaf1 down, leaf1 -> spine0 up) on a 2-leaf,
    2-spine fabric: spine0 can no longer reach leaf1 in two hops, only leaf0 -> spine1 ->
    leaf1 is left from leaf0 (hand count), while leaf1 still reaches leaf0 through both
    spines. Every switch that can reach a leaf has a next hop towards it, so spraying and
    path walks never meet an empty group where the distance says there is a way."""
    from fabricpilot.topology.compiled import with_links_down
    from fabricpilot.topology.paths import equal_cost_paths, split_fractions

    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    names = ct.node_names
    sw = {names[n]: int(ct.switch_of_node[n]) for n in range(len(names))
          if ct.switch_of_node[n] >= 0}
    link = {(names[int(ct.link_src[i])], names[int(ct.link_dst[i])]): i
            for i in range(ct.n_links)}
    down = np.zeros(ct.n_links, bool)
    down[link["spine0", "leaf1"]] = True
    cut = with_links_down(ct, down)
    slot0, slot1 = (int(ct.leaf_slot[sw[f"leaf{i}"]]) for i in (0, 1))
    # towards leaf1: leaf0 goes by spine1 only; spine0 has no way within the fabric's depth
    hops = cut.nh_link[sw["leaf0"], slot1, :cut.nh_count[sw["leaf0"], slot1]].tolist()
    assert hops == [link["leaf0", "spine1"]]
    assert cut.nh_count[sw["spine0"], slot1] == 0 and cut.hop_distance[sw["spine0"], slot1] == -1
    # towards leaf0: both spines still (leaf1 -> spine0 is up)
    assert int(cut.nh_count[sw["leaf1"], slot0]) == 2
    reach = cut.hop_distance > 0
    assert (cut.nh_count[reach] > 0).all()
    links, frac = split_fractions(cut, sw["leaf0"], slot1)
    assert dict(zip(links.tolist(), frac.tolist(), strict=True)) == {
        link["leaf0", "spine1"]: 1.0, link["spine1", "leaf1"]: 1.0}
    src, dst = (next(g for g in range(ct.n_gpus) if int(ct.gpu_leaf[g]) == sw[leaf])
                for leaf in ("leaf0", "leaf1"))
    assert [p[1:-1] for p in equal_cost_paths(cut, src, dst)] == [
        (link["leaf0", "spine1"], link["spine1", "leaf1"])]


def test_ecmp_tables_come_out_the_same_in_any_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables are built over blocks of links (no links x leaves array made whole, which
    took 16 GiB at 131 072 GPUs): blocks of a link or two give the same groups, in the
    same order, as one block, also with links down."""
    from fabricpilot.topology import compiled

    ct = compiled.compile_topology(fat_tree(k=4))
    leaves = np.flatnonzero(ct.leaf_slot >= 0).astype(np.int32)
    leaves = leaves[np.argsort(ct.leaf_slot[leaves])]
    alive = np.ones(ct.n_links, bool)
    alive[np.random.default_rng(0).choice(ct.n_links, 5, replace=False)] = False
    whole = compiled.ecmp_tables(ct.link_src, ct.link_dst, ct.switch_of_node, leaves, alive)
    monkeypatch.setattr(compiled, "_CELLS_PER_BLOCK", 9)
    small = compiled.ecmp_tables(ct.link_src, ct.link_dst, ct.switch_of_node, leaves, alive)
    for a, b in zip(whole, small, strict=True):
        assert a.shape == b.shape and (a == b).all()


def test_ecmp_tables_larger_than_memory_are_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fabricpilot.topology import compiled

    monkeypatch.setattr(compiled, "_available_bytes", lambda: 100)  # (the tables: 128 B)
    with pytest.raises(TopologyError) as err:
        compiled.compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    msg = str(err.value)
    assert "\n" not in msg and "need about 0.0 GiB, and this machine has 0.0 GiB" in msg


def test_switch_links_between_are_those_of_every_equal_cost_path() -> None:
    """On a k=4 fat-tree (a host of 2 GPUs per edge switch, 4 GPUs per pod), two edges in
    two pods have (k/2)^2 = 4 paths over 2 + 4 + 4 + 2 = 12 switch links (edge -> its 2
    aggs, their 4 uplinks to the cores, the cores' 4 links down to the other pod's 2 aggs,
    those -> edge); two edges of one pod have 2 paths over 4; an edge and itself none. For
    every pair of GPUs, they are the switch links of its equal-cost paths."""
    ct = compile_topology(fat_tree(k=4, gpus_per_host=2, rail_optimized=False))
    edge = ct.gpu_leaf.tolist()

    def between(a: int, b: int) -> set[int]:
        return set(switch_links_between(ct, edge[a], edge[b]).tolist())

    assert (len(between(0, 15)), len(between(0, 2)), len(between(0, 1))) == (12, 4, 0)
    nics = set(ct.gpu_up.tolist()) | set(ct.gpu_down.tolist())
    for a, b in itertools.permutations(range(ct.n_gpus), 2):
        if ct.gpu_host[a] == ct.gpu_host[b]:
            continue  # (NVLink)
        want = {lk for p in equal_cost_paths(ct, a, b) for lk in p} - nics
        assert between(a, b) == want, (a, b)
