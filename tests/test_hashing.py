"""ECMP hashing and the ``ecmp`` / ``ideal`` policies.

Hashes are checked against ``zlib.crc32`` of hand-assembled header bytes; next-hop choices
against the hash taken modulo the group size by hand; ideal weights against flow counts.
"""

from __future__ import annotations

import doctest
import itertools
import zlib
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chi2

from fabricpilot.balancing import (
    POLICIES,
    EcmpParams,
    PolicyContext,
    TransferBatch,
    UnknownPolicyError,
    base,
    make_policy,
)
from fabricpilot.balancing.ideal import Ideal
from fabricpilot.net import hashing
from fabricpilot.net.hashing import (
    ROCE_UDP_PORT,
    crc32_words,
    ecmp_hash,
    gpu_ip,
    qp_source_port,
    splitmix64,
    switch_hash,
    switch_seed,
)
from fabricpilot.topology import (
    CompiledTopology,
    Topology,
    compile_topology,
    equal_cost_paths,
    fat_tree,
    leaf_spine,
)

MASK64 = (1 << 64) - 1


def be(value: int, n_bytes: int) -> bytes:
    return int(value).to_bytes(n_bytes, "big")


def header(seed: int, src_ip: int, dst_ip: int, sport: int, dport: int = 4791,
           proto: int = 17) -> bytes:
    """``seed(4) | src_ip(4) | dst_ip(4) | proto(1) | sport(2) | dport(2)``."""
    return (be(seed, 4) + be(src_ip, 4) + be(dst_ip, 4) + be(proto, 1) + be(sport, 2)
            + be(dport, 2))


def splitmix64_ref(x: int) -> int:
    """splitmix64 finaliser (Steele, Lea, Flood 2014) on Python ints."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def batch(src: list[int] | np.ndarray, dst: list[int] | np.ndarray, *, size: int = 1 << 20,
          group: list[int] | None = None, job: list[int] | np.ndarray | None = None
          ) -> TransferBatch:
    n = len(src)
    return TransferBatch(
        np.asarray(src, np.int64), np.asarray(dst, np.int64), np.full(n, size, np.int64),
        np.asarray(group if group is not None else [-1] * n, np.int64),
        np.asarray(job if job is not None else [0] * n, np.int64),
    )


def ctx(ct: CompiledTopology, seed: int = 1, **ecmp: object) -> PolicyContext:
    return PolicyContext(topology=ct, seed=seed, switch_latency_ns=500,
                         ecmp=EcmpParams(**ecmp))  # type: ignore[arg-type]


def row_links(w: sp.csr_matrix, i: int) -> dict[int, float]:
    row = w.getrow(i)
    return dict(zip(row.indices.tolist(), row.data.tolist(), strict=True))


@pytest.mark.parametrize("module", [hashing, base])
def test_doctests(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- CRC


def test_crc32_words_matches_zlib() -> None:
    rng = np.random.default_rng(11)
    widths = [1, 2, 3, 4, 8, 2, 4]
    n = 64
    cols = [rng.integers(0, 1 << (8 * w) if w < 8 else 1 << 63, n, dtype=np.uint64)
            for w in widths]
    got = crc32_words([(c, w) for c, w in zip(cols, widths, strict=True)])
    assert got.dtype == np.uint32
    for i in range(n):
        raw = b"".join(be(c[i], w) for c, w in zip(cols, widths, strict=True))
        assert int(got[i]) == zlib.crc32(raw)


def test_crc32_known_vector() -> None:
    # the CRC-32 check value: crc32(b"123456789") = 0xCBF43926
    digits = np.array([[ord(c) for c in "123456789"]])
    got = crc32_words([(digits[:, i], 1) for i in range(9)])
    assert int(got[0]) == 0xCBF43926


def test_ecmp_hash_matches_zlib() -> None:
    rng = np.random.default_rng(3)
    n = 50
    src = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    dst = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    sport = rng.integers(0, 1 << 16, n, dtype=np.uint64)
    seeds = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    per_row = ecmp_hash(src, dst, sport, seeds)
    scalar = ecmp_hash(src, dst, sport, 0xDEADBEEF)
    other = ecmp_hash(src, dst, sport, 5, dport=1234, proto=6)
    for i in range(n):
        assert int(per_row[i]) == zlib.crc32(header(seeds[i], src[i], dst[i], sport[i]))
        assert int(scalar[i]) == zlib.crc32(header(0xDEADBEEF, src[i], dst[i], sport[i]))
        assert int(other[i]) == zlib.crc32(header(5, src[i], dst[i], sport[i], 1234, 6))


def test_gpu_ip() -> None:
    assert gpu_ip(np.array([0, 1, 300])).tolist() == [0x0A000000, 0x0A000001, 0x0A00012C]


def test_splitmix64_reference() -> None:
    xs = [0, 1, 2**63, MASK64, 0x0123456789ABCDEF]
    got = splitmix64(np.array(xs, np.uint64))
    assert [int(v) for v in got] == [splitmix64_ref(x) for x in xs]
    assert splitmix64_ref(0) == 0xE220A8397B1DCDAF  # first output of SplitMix64 seeded with 0


# ------------------------------------------------------------------------ source ports


def test_qp_source_port_range_and_entropy() -> None:
    rng = np.random.default_rng(5)
    n = 5000
    job, src, dst = (rng.integers(0, 1000, n) for _ in range(3))
    qp = rng.integers(0, 8, n)
    ports = qp_source_port(job, src, dst, qp)
    assert ports.dtype == np.uint32
    assert ports.min() >= 0xC000 and ports.max() <= 0xFFFF
    # 14 bits of entropy: 5000 draws hit far more than half the ports of a tiny range
    assert len(np.unique(ports)) > 4000
    # low bits look uniform: each of the 16 residues near 5000 / 16
    counts = np.bincount(ports % 16, minlength=16)
    assert chi2_stat(counts) < chi2.ppf(0.999, 15)
    # a connection keeps its ports: same inputs, same port
    np.testing.assert_array_equal(ports, qp_source_port(job, src, dst, qp))
    # the QPs of one connection get different ports (with overwhelming probability)
    per_conn = qp_source_port(np.zeros(8), np.full(8, 3), np.full(8, 9), np.arange(8))
    assert len(set(per_conn.tolist())) == 8
    # mice use job -1: still in range
    mice = qp_source_port(np.full(4, -1), np.arange(4), np.arange(4) + 1, np.zeros(4))
    assert ((mice >= 0xC000) & (mice <= 0xFFFF)).all()


def test_qp_source_port_without_entropy() -> None:
    ports = qp_source_port(np.arange(10), np.arange(10), np.arange(10) + 1, np.arange(10),
                           entropy=False)
    assert ports.tolist() == [4791] * 10 == [ROCE_UDP_PORT] * 10


# ------------------------------------------------------------------------- switch seeds


def test_switch_seed_shared() -> None:
    sw = np.arange(80)
    assert switch_seed(42, sw, False).tolist() == [42] * 80
    assert switch_seed((7 << 32) + 9, sw, False).tolist() == [9] * 80  # 4-byte seed field


def test_switch_seed_per_switch() -> None:
    sw = np.arange(80)  # the 80 switches of a k=8 fat-tree
    seeds = switch_seed(42, sw, True)
    assert len(set(seeds.tolist())) == 80
    assert seeds.tolist() == [zlib.crc32(be(42, 4) + be(s, 4)) for s in range(80)]
    assert switch_seed(43, sw, True).tolist() != seeds.tolist()


# ------------------------------------------------------------------ ECMP on a leaf-spine


def chi2_stat(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture(scope="module")
def ls16() -> CompiledTopology:
    """256 GPUs, 16 rail leaves, 16 spines."""
    return compile_topology(leaf_spine(hosts=32, gpus_per_host=8, nics_per_leaf=16))


def random_cross_leaf(ct: CompiledTopology, n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, ct.n_gpus, 4 * n)
    dst = rng.integers(0, ct.n_gpus, 4 * n)

    def leaf(g: np.ndarray) -> np.ndarray:
        return (g // 8 // 16) * 8 + g % 8  # rail leaf: (host // 16) * 8 + local rank

    keep = np.flatnonzero((leaf(src) != leaf(dst)) & (src // 8 != dst // 8))[:n]
    assert len(keep) == n
    return src[keep], dst[keep], rng.integers(0, 1 << 20, n)


def spine_of_rows(ct: CompiledTopology, w: sp.csr_matrix) -> list[int]:
    out = []
    for i in range(w.shape[0]):
        names = [ct.node_names[ct.link_dst[x]] for x in row_links(w, i)]
        spines = [s for s in names if s.startswith("spine")]
        assert len(spines) == 1
        out.append(int(spines[0].removeprefix("spine")))
    return out


def test_ecmp_hash_uniform_over_16_next_hops() -> None:
    rng = np.random.default_rng(2024)
    n = 4096
    src = gpu_ip(rng.integers(0, 1 << 16, n))
    dst = gpu_ip(rng.integers(0, 1 << 16, n))
    sport = qp_source_port(rng.integers(0, 100, n), src, dst, rng.integers(0, 8, n))
    for seed in (0, 1, 0xFFFFFFFF):
        counts = np.bincount(ecmp_hash(src, dst, sport, seed) % 16, minlength=16)
        assert chi2_stat(counts) < chi2.ppf(0.999, 15)


@pytest.mark.parametrize("per_switch_seed", [False, True])
def test_ecmp_policy_picks_hash_mod_16(ls16: CompiledTopology, per_switch_seed: bool) -> None:
    n = 4096
    src, dst, job = random_cross_leaf(ls16, n, seed=9)
    seed = 77
    pol = make_policy("ecmp", ctx(ls16, seed, per_switch_seed=per_switch_seed))
    routed = pol.route(batch(src, dst, job=job))
    assert len(routed) == n
    spines = spine_of_rows(ls16, routed.weights)
    # by hand: the leaf hashes the 5-tuple with its seed and takes spine (hash % 16); the
    # leaf's switch index is its leaf number (switches are ordered leaf0..leaf15, spines after)
    sport = qp_source_port(job, src, dst, np.zeros(n, np.int64))
    for i in range(n):
        s, d = int(src[i]), int(dst[i])
        leaf = (s // 8 // 16) * 8 + s % 8
        sw_seed = zlib.crc32(be(seed, 4) + be(leaf, 4)) if per_switch_seed else seed
        h = zlib.crc32(header(sw_seed, 0x0A000000 + s, 0x0A000000 + d, int(sport[i])))
        if per_switch_seed:  # each switch also reads its own bit window: rotate right
            r = sw_seed % 32
            h = ((h >> r) | (h << (32 - r))) & 0xFFFFFFFF
        assert spines[i] == h % 16
    counts = np.bincount(spines, minlength=16)
    assert chi2_stat(counts) < chi2.ppf(0.999, 15)


def test_ecmp_without_entropy_pins_every_qp_of_a_connection(ls16: CompiledTopology) -> None:
    src, dst, job = random_cross_leaf(ls16, 200, seed=4)
    b = batch(src, dst, job=job)
    pinned = make_policy("ecmp", ctx(ls16, qps_per_connection=4, source_port_entropy=False))
    spines = np.array(spine_of_rows(ls16, pinned.route(b).weights)).reshape(200, 4)
    assert (spines == spines[:, :1]).all()
    # and the one port is 4791: spine = crc32(header with sport 4791) % 16
    for i in range(200):
        h = zlib.crc32(header(1, 0x0A000000 + int(src[i]), 0x0A000000 + int(dst[i]), 4791))
        assert spines[i, 0] == h % 16
    spread = make_policy("ecmp", ctx(ls16, qps_per_connection=4))
    spines = np.array(spine_of_rows(ls16, spread.route(b).weights)).reshape(200, 4)
    # 4 QPs on 16 spines all colliding has probability 1/16^3 per connection
    assert (spines != spines[:, :1]).any(axis=1).mean() > 0.9


def fat_tree_paths_used(per_switch_seed: bool, src_hi: int) -> set[tuple[str, str]]:
    """(agg, core) pairs ECMP uses for 2000 random flows from GPUs ``0..src_hi-1`` (pod 0 of a
    k=8 fat-tree) to the other pods."""
    ct = compile_topology(fat_tree(k=8))
    rng = np.random.default_rng(8)
    src = rng.integers(0, src_hi, 2000)
    dst = rng.integers(16, 128, 2000)
    b = batch(src, dst, job=rng.integers(0, 1000, 2000))
    w = make_policy("ecmp", ctx(ct, 3, per_switch_seed=per_switch_seed)).route(b).weights
    used = set()
    for i in range(len(src)):
        names = [ct.node_names[ct.link_dst[x]] for x in sorted(row_links(w, i))]
        agg = next(n for n in names if n.startswith("agg0_"))
        core = next(n for n in names if n.startswith("core"))
        used.add((agg, core))
    return used


def test_ecmp_shared_seed_polarises_fat_tree() -> None:
    # k=8: the edge picks agg0_j with j = h % 4 and that agg picks core j * 4 + c with
    # c = h % 4 for the same h, so c == j: only cores 0, 5, 10, 15 carry cross-pod traffic
    expected = {(f"agg0_{j}", f"core{5 * j}") for j in range(4)}
    assert fat_tree_paths_used(False, src_hi=16) == expected
    assert fat_tree_paths_used(False, src_hi=4) == expected  # one source edge


def test_ecmp_per_switch_seed_all_pod_sources() -> None:
    # with per-switch seeds the 4 edges of pod 0 use different (agg, core) pairings
    assert len(fat_tree_paths_used(True, src_hi=16)) > 4


def test_ecmp_per_switch_seed_uses_every_path_from_one_edge() -> None:
    # the documented purpose of per_switch_seed: no polarisation across tiers, so 2000 random
    # flows from one edge to other pods use all (k/2)^2 = 16 (agg, core) pairs
    assert len(fat_tree_paths_used(True, src_hi=4)) == 16


# ---------------------------------------------------------------- ideal vs ECMP weights


TOPOLOGIES = [
    leaf_spine(hosts=8, gpus_per_host=4, nics_per_leaf=4),  # 8 rail leaves, 4 spines
    leaf_spine(hosts=8, gpus_per_host=2, nics_per_leaf=4, rail_optimized=False,
               oversubscription=2.0),  # 4 ToR leaves, 2 spines
    fat_tree(k=4, gpus_per_host=2),
]


def random_batch(topo: Topology, n: int, seed: int) -> TransferBatch:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, topo.n_gpus, n)
    dst = (src + rng.integers(1, topo.n_gpus, n)) % topo.n_gpus
    return batch(src, dst, job=rng.integers(0, 5, n))


def columns(policy: object, ct: CompiledTopology) -> np.ndarray:
    """Link id -> rate-model column of ``policy`` (links themselves unless it merges some)."""
    col = getattr(policy, "column_of_link", None)
    return np.arange(ct.n_links) if col is None else np.asarray(col)


def to_columns(link_weights: dict[int, float], col: np.ndarray) -> dict[int, float]:
    out: Counter[int] = Counter()
    for link, w in link_weights.items():
        out[int(col[link])] += w
    return dict(out)


def spray_by_hand(ct: CompiledTopology, topo: Topology, s: int, d: int) -> dict[int, float]:
    """Per-link share of one transfer on a two-tier leaf-spine under even spraying: NVLink
    inside a host, NIC links at 1, 1/S on each of the S uplinks and S downlinks."""
    g = topo.graph
    gph = topo.gpus_per_host
    if s // gph == d // gph:
        return {int(ct.gpu_nv_up[s]): 1.0, int(ct.gpu_nv_down[d]): 1.0}
    out = {int(ct.gpu_up[s]): 1.0, int(ct.gpu_down[d]): 1.0}
    ls, ld = topo.gpu_leaf[s], topo.gpu_leaf[d]
    if ls != ld:
        spines = [v for v in g.neighbors(ls) if g.nodes[v].get("role") == "spine"]
        for sp_name in spines:
            out[ct.link_id[(ct.node_index[ls], ct.node_index[sp_name])]] = 1 / len(spines)
            out[ct.link_id[(ct.node_index[sp_name], ct.node_index[ld])]] = 1 / len(spines)
    return out


@pytest.mark.parametrize("topo", TOPOLOGIES[:2])
def test_ideal_uplink_weights_count_flows(topo: Topology) -> None:
    ct = compile_topology(topo)
    g = topo.graph
    b = random_batch(topo, 400, seed=1)
    pol = Ideal(ctx(ct))
    col = columns(pol, ct)
    w = pol.weights(b)
    assert w.shape == (400, int(col.max()) + 1)
    col_sum = np.asarray(w.sum(axis=0)).ravel()
    gph = topo.gpus_per_host
    leaf_of = [topo.gpu_leaf[i] for i in range(topo.n_gpus)]
    crossing = [(leaf_of[s], leaf_of[d]) for s, d in zip(b.src.tolist(), b.dst.tolist(),
                                                        strict=True)
                if s // gph != d // gph and leaf_of[s] != leaf_of[d]]
    assert crossing  # the batch does cross the spine
    leaving, arriving = Counter(a for a, _ in crossing), Counter(z for _, z in crossing)
    for leaf in (n for n, r in g.nodes(data="role") if r == "leaf"):
        up = [ct.link_id[(ct.node_index[leaf], ct.node_index[s])] for s in g.neighbors(leaf)
              if g.nodes[s].get("role") == "spine"]
        for links, count in ((up, leaving[leaf]), ([x ^ 1 for x in up], arriving[leaf])):
            cols = sorted({int(c) for c in col[links]})
            # the columns of a leaf's uplinks (downlinks) hold exactly those links
            assert sorted(np.flatnonzero(np.isin(col, cols)).tolist()) == sorted(links)
            assert col_sum[cols].sum() == pytest.approx(count)

    # every row, by hand: NIC (or NVLink) links at 1, 1/S on each uplink and downlink
    per_link_total: Counter[int] = Counter()
    for i, (s, d) in enumerate(zip(b.src.tolist(), b.dst.tolist(), strict=True)):
        expected = spray_by_hand(ct, topo, s, d)
        per_link_total.update(expected)
        got = row_links(w, i)
        want = to_columns(expected, col)
        assert got.keys() == want.keys()
        assert [got[c] for c in sorted(got)] == pytest.approx([want[c] for c in sorted(want)])
    # links merged into one column carry the same load and have the same capacity
    for c in np.unique(col):
        members = np.flatnonzero(col == c)
        assert len({round(per_link_total[int(x)], 9) for x in members}) == 1
        assert len(set(ct.rate_gbps[members].tolist())) == 1


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_ideal_weights_equal_path_average(topo: Topology) -> None:
    # spraying evenly at every switch of a symmetric Clos = averaging over all equal-cost paths
    ct = compile_topology(topo)
    b = random_batch(topo, 60, seed=2)
    pol = Ideal(ctx(ct))
    col = columns(pol, ct)
    w = pol.weights(b)
    for i, (s, d) in enumerate(zip(b.src.tolist(), b.dst.tolist(), strict=True)):
        paths = equal_cost_paths(ct, s, d)
        avg: Counter[int] = Counter()
        for p in paths:
            for x in p:
                avg[x] += 1 / len(paths)
        got, want = row_links(w, i), to_columns(avg, col)
        assert got.keys() == want.keys()
        assert [got[c] for c in sorted(got)] == pytest.approx([want[c] for c in sorted(want)])


@pytest.mark.parametrize("topo", [*TOPOLOGIES, leaf_spine(hosts=2, gpus_per_host=1,
                                                              nics_per_leaf=1),
                                  fat_tree(k=6)])
def test_ideal_merged_columns_are_interchangeable(topo: Topology) -> None:
    # links sharing a column must carry the same share of every leaf-to-leaf flow (computed
    # here as the average over the pair's equal-cost paths) and have the same capacity
    ct = compile_topology(topo)
    col = columns(Ideal(ctx(ct)), ct)
    assert len(col) == ct.n_links
    first_gpu: dict[str, int] = {}
    for gpu in range(topo.n_gpus):
        first_gpu.setdefault(topo.gpu_leaf[gpu], gpu)
    merged = [np.flatnonzero(col == c) for c in np.unique(col)]
    merged = [m for m in merged if len(m) > 1]
    for m in merged:
        assert (ct.link_kind[m] == 1).all()  # only fabric links are merged
        assert len(set(ct.rate_gbps[m].tolist())) == 1
    for a, b in itertools.permutations(first_gpu.values(), 2):
        paths = equal_cost_paths(ct, a, b)
        share = np.zeros(ct.n_links)
        for p in paths:
            share[list(p)] += 1 / len(paths)
        for m in merged:
            assert share[m] == pytest.approx(np.full(len(m), share[m[0]]))


@pytest.mark.parametrize("topo", TOPOLOGIES)
@pytest.mark.parametrize("qps", [1, 3])
def test_ecmp_weights_are_one_path(topo: Topology, qps: int) -> None:
    ct = compile_topology(topo)
    b = random_batch(topo, 150, seed=3)
    pol = make_policy("ecmp", ctx(ct, qps_per_connection=qps))
    assert getattr(pol, "column_of_link", None) is None  # columns are links
    routed = pol.route(b)
    w = routed.weights
    assert w.shape == (150 * qps, ct.n_links)
    assert set(np.unique(w.data).tolist()) == {1.0}
    for i in range(w.shape[0]):
        s, d = int(b.src[i // qps]), int(b.dst[i // qps])
        assert (int(routed.src[i]), int(routed.dst[i])) == (s, d)
        links = frozenset(row_links(w, i))
        assert links in {frozenset(p) for p in equal_cost_paths(ct, s, d)}
    np.testing.assert_array_equal(routed.members, np.ones(150 * qps))
    # QP sizes add up to the transfer size
    assert routed.size_bytes.reshape(150, qps).sum(axis=1).tolist() == [1 << 20] * 150


def test_ring_group_rows_add_member_paths() -> None:
    topo = TOPOLOGIES[0]
    ct = compile_topology(topo)
    ring = [0, 5, 10, 15, 20, 25]
    src, dst = ring, ring[1:] + ring[:1]
    b = batch([*src, 1], [*dst, 2], group=[0] * 6 + [-1])
    for name in ("ideal", "ecmp"):
        pol = make_policy(name, ctx(ct))
        routed = pol.route(b)
        assert len(routed) == 2
        assert routed.members.tolist() == [6, 1]
        assert (routed.src.tolist(), routed.dst.tolist()) == ([0, 1], [5, 2])
        single = pol.route(batch(src, dst))
        np.testing.assert_allclose(routed.weights.getrow(0).toarray(),
                                   single.weights.sum(axis=0))
    # ideal: each ring member crossing the spine puts 1 unit on its source leaf's uplinks
    pol = make_policy("ideal", ctx(ct))
    col = columns(pol, ct)
    w = pol.route(b).weights.getrow(0).toarray().ravel()
    g = topo.graph
    leaf_spine_links = [ct.link_id[(ct.node_index[u], ct.node_index[v])]
                        for u, v in itertools.permutations(g.nodes, 2)
                        if g.nodes[u].get("role") == "leaf" and g.nodes[v].get("role") == "spine"
                        and g.has_edge(u, v)]
    cols = sorted({int(c) for c in col[leaf_spine_links]})
    assert sorted(np.flatnonzero(np.isin(col, cols)).tolist()) == sorted(leaf_spine_links)
    # hand count: rail leaves (h // 4) * 4 + r; all six hops change host and leaf
    assert w[cols].sum() == pytest.approx(6.0)


def test_unknown_policy() -> None:
    assert {"ecmp", "ideal"} <= set(POLICIES)
    ct = compile_topology(fat_tree(k=4))
    with pytest.raises(UnknownPolicyError, match=r"known: .*ecmp.*ideal"):
        make_policy("conga", ctx(ct))


def test_a_shared_seed_relabels_next_hops_but_keeps_collisions() -> None:
    """CRC-32 is affine: ``crc(seed | t) ^ crc(seed' | t)`` is the same for every tuple
    ``t`` of one length, so with one seed for all switches a new seed XORs one constant
    onto every hash, and on a group of 16 next hops the flows that share a next hop stay
    together (docs/model.md says so). Per-switch seeds (own bit window) regroup them."""
    rng = np.random.default_rng(0)
    n = 2000
    src = rng.integers(0, 1 << 32, n)
    dst = rng.integers(0, 1 << 32, n)
    sport = rng.integers(0xC000, 0x10000, n)
    sw = np.zeros(n, np.int64)

    def groups(seed: int, per_switch: bool) -> set[frozenset[int]]:
        hop = switch_hash(src, dst, sport, sw, seed, per_switch) % 16
        return {frozenset(np.flatnonzero(hop == h).tolist()) for h in range(16)}

    a = switch_hash(src, dst, sport, sw, 7, False)
    b = switch_hash(src, dst, sport, sw, 8, False)
    assert len(set((a ^ b).tolist())) == 1
    assert groups(7, False) == groups(8, False)
    assert groups(7, True) != groups(8, True)
