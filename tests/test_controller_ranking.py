"""Controller intents and SLA-aware path ranking.

Expectations are computed by hand on a 2-leaf / 2-spine leaf-spine (gpu0, gpu1 on leaf0;
gpu2, gpu3 on leaf1; host links 400 Gb/s 100 ns, fabric links 400 Gb/s 1000 ns; every link
in both directions), built with ``FabricView.from_links``.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import networkx as nx
import pytest

from fabricpilot.controller import ranking
from fabricpilot.controller.intents import (
    PATTERNS,
    CommCall,
    Intent,
    count_switches,
    heat_index,
    sla_level,
    topo_distance,
)
from fabricpilot.controller.ranking import (
    CANDIDATE_FACTOR,
    L3_RATE_CAP,
    RankedPath,
    SlaUnmet,
    buffer_penalty,
    delay_penalty,
    in_scope,
    rank_paths,
)
from fabricpilot.controller.southbound import FabricView, LinkInfo

SPINE0_PATH = ["gpu0", "leaf0", "spine0", "leaf1", "gpu2"]
SPINE1_PATH = ["gpu0", "leaf0", "spine1", "leaf1", "gpu2"]


def leaf_spine(fabric_delay_ns: int = 1000) -> FabricView:
    """2 leaves x 2 spines, 2 GPUs per leaf; link ids assigned in order, both directions."""
    pairs: list[tuple[str, str, int, str]] = []
    for g in range(4):
        pairs.append((f"gpu{g}", f"leaf{g // 2}", 100, "nic"))
    for leaf in range(2):
        for spine in range(2):
            pairs.append((f"leaf{leaf}", f"spine{spine}", fabric_delay_ns, "fabric"))
    links: list[LinkInfo] = []
    for a, b, delay, kind in pairs:
        links.append(LinkInfo(len(links), a, b, 400, delay, kind))
        links.append(LinkInfo(len(links), b, a, 400, delay, kind))
    kinds = {f"gpu{g}": "gpu" for g in range(4)}
    kinds |= {n: "switch" for n in ("leaf0", "leaf1", "spine0", "spine1")}
    tier = {"leaf0": 1, "leaf1": 1, "spine0": 2, "spine1": 2}
    return FabricView.from_links(links, kinds, tier, {g: f"gpu{g}" for g in range(4)})


@pytest.fixture
def view() -> FabricView:
    return leaf_spine()


# --- intents -------------------------------------------------------------------------------

def test_heat_index() -> None:
    # size in bytes: 1e6 * 1000 / (50 * 10) = 2e6
    assert heat_index(1_000_000, 50) == 2_000_000.0
    # 4096 * 1000 / (200 * 10) = 2048
    assert heat_index(4096, 200) == pytest.approx(2048.0)
    # tighter SLA -> hotter: halving the SLA doubles the heat
    assert heat_index(1_000_000, 25) == 2 * heat_index(1_000_000, 50)
    with pytest.raises(ValueError, match="sla_us"):
        heat_index(1, 0)


def test_sla_level_boundaries() -> None:
    assert sla_level(0.1) == "L1"
    assert sla_level(49.999) == "L1"
    assert sla_level(50) == "L2"          # 50 <= sla <= 100
    assert sla_level(100) == "L2"
    assert sla_level(100.5) == "L3"
    assert sla_level(1e6) == "L3"
    with pytest.raises(ValueError, match="sla_us"):
        sla_level(-1)


def test_commcall_validation() -> None:
    c = CommCall("allgather", 2_000_000, 120.0, 5_000_000, priority=3)
    # 2e6 * 1000 / (120 * 10) = 1.667e6; 120 > 100 -> L3
    assert c.heat == pytest.approx(2_000_000_000 / 1200)
    assert c.level == "L3"
    with pytest.raises(ValueError, match="pattern") as exc:
        CommCall("gather", 1, 1.0, 0)
    assert all(p in str(exc.value) for p in PATTERNS)
    with pytest.raises(ValueError, match="size_bytes"):
        CommCall("allreduce", 0, 1.0, 0)
    with pytest.raises(ValueError, match="sla_us"):
        CommCall("allreduce", 1, 0.0, 0)
    with pytest.raises(ValueError, match="period_ns"):
        CommCall("allreduce", 1, 1.0, -1)
    assert CommCall("broadcast", 1, 1.0, 0).priority == 0


def test_intent_validation_and_properties() -> None:
    a = CommCall("allreduce", 1_000_000, 80.0, 1_000_000)   # 1e9 / 800 = 1.25e6, L2
    b = CommCall("alltoall", 500_000, 30.0, 1_000_000)      # 5e8 / 300 = 1.667e6, L1
    i = Intent("t1", "acme", (0, 1, 2), (a, b))
    assert i.heat == pytest.approx(1_250_000 + 500_000_000 / 300)
    assert i.strictest_level == "L1"
    assert Intent("t2", "acme", (0,), (a,)).strictest_level == "L2"
    assert i.opt_in is True
    with pytest.raises(ValueError, match="gpus must be non-empty"):
        Intent("t1", "acme", (), (a,))
    with pytest.raises(ValueError, match=r"gpus must not contain duplicates.*\[1\]"):
        Intent("t1", "acme", (0, 1, 1), (a,))
    with pytest.raises(ValueError, match="calls must be non-empty"):
        Intent("t1", "acme", (0,), ())
    with pytest.raises(ValueError, match="task_id"):
        Intent("", "acme", (0,), (a,))
    # (a planned pair's key is "<task>:<src>-><dst>": the job's part must be unambiguous)
    with pytest.raises(ValueError, match="task_id must not contain ':'"):
        Intent("team:a", "acme", (0,), (a,))


def test_topo_distance(view: FabricView) -> None:
    assert topo_distance(view, 0, 0) == 0
    assert topo_distance(view, 0, 1) == 1     # gpu0 -> leaf0 -> gpu1
    assert topo_distance(view, 0, 2) == 3     # gpu0 -> leaf0 -> spine -> leaf1 -> gpu2
    assert topo_distance(view, 3, 0) == 3
    with pytest.raises(ValueError, match="unknown GPU 9"):
        topo_distance(view, 0, 9)


# --- scope ---------------------------------------------------------------------------------

def test_in_scope(view: FabricView) -> None:
    same_leaf = ["gpu0", "leaf0", "gpu1"]
    assert in_scope(view, same_leaf, "L1")          # one switch
    assert in_scope(view, same_leaf, "L2")
    assert in_scope(view, same_leaf, "L3")
    assert not in_scope(view, SPINE0_PATH, "L1")    # three switches
    assert not in_scope(view, SPINE0_PATH, "L2")    # spine0 has tier 2
    assert in_scope(view, SPINE0_PATH, "L3")
    with pytest.raises(ValueError, match="level"):
        in_scope(view, same_leaf, "L4")


def test_in_scope_nvlink() -> None:
    links = [LinkInfo(0, "g0", "nvs", 900, 50, "nvlink"), LinkInfo(1, "nvs", "g1", 900, 50,
                                                                    "nvlink")]
    v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu", "nvs": "nvswitch"}, {},
                              {0: "g0", 1: "g1"})
    assert in_scope(v, ["g0", "nvs", "g1"], "L1")
    assert topo_distance(v, 0, 1) == 1


# --- ranking -------------------------------------------------------------------------------

def test_rank_cross_leaf_l3(view: FabricView) -> None:
    paths = rank_paths(view, 0, 2, 500.0)
    assert isinstance(paths, list)
    assert [list(p.nodes) for p in paths] == [SPINE0_PATH, SPINE1_PATH]  # tie -> node names
    for p in paths:
        # (100 + 1000 + 1000 + 100) / 1000 + 3 switches * 0.6 = 2.2 + 1.8 = 4.0 us
        assert p.delay_us == pytest.approx(4.0)
        # 0.8 * 500 = 400 us >> 1 us per link and no buffer data: score = delay
        assert p.score == pytest.approx(4.0)
        assert p.level_ok
        assert p.rate_cap_fraction == 0.8          # L3
        assert p.links == tuple(view.path_links(list(p.nodes)))
        assert len(p.links) == 4
    assert rank_paths(view, 0, 2, 500.0, k=1) == paths[:1]


def test_rank_buffer_deficit_prefers_other_spine(view: FabricView) -> None:
    up0 = view.link_between("leaf0", "spine0")
    # free 0.75 MB < floor 1.5 MB: exp((1.5e6 - 0.75e6) / 1.5e6 * 5) - 1 = exp(2.5) - 1
    penalty = math.exp(2.5) - 1                    # = 11.18249...
    paths = rank_paths(view, 0, 2, 500.0, free_buffer_bytes={up0: 0.75e6})
    assert isinstance(paths, list)
    assert [list(p.nodes) for p in paths] == [SPINE1_PATH, SPINE0_PATH]
    assert paths[0].score == pytest.approx(4.0)
    assert paths[1].score == pytest.approx(4.0 + penalty)   # 15.1825
    assert paths[1].score == pytest.approx(15.1825, abs=1e-4)
    assert paths[1].delay_us == pytest.approx(4.0)          # delay itself is unchanged
    # plenty of free buffer (>= floor) costs nothing
    flat = rank_paths(view, 0, 2, 500.0, free_buffer_bytes={up0: 1.5e6})
    assert isinstance(flat, list)
    assert [p.score for p in flat] == pytest.approx([4.0, 4.0])


def test_rank_same_leaf_l1(view: FabricView) -> None:
    paths = rank_paths(view, 0, 1, 30.0)
    assert isinstance(paths, list)
    assert len(paths) == 1
    (p,) = paths
    # (100 + 100) / 1000 + 1 switch * 0.6 = 0.8 us; L1 -> no rate cap
    # link ids: gpu0->leaf0 = 0, leaf0->gpu0 = 1, gpu1->leaf0 = 2, leaf0->gpu1 = 3
    assert p == RankedPath(("gpu0", "leaf0", "gpu1"), (0, 3), pytest.approx(0.8),
                           pytest.approx(0.8), True, 1.0)


def test_rank_delay_penalty() -> None:
    links = [LinkInfo(0, "g0", "sw", 400, 100_000, "nic"),
             LinkInfo(1, "sw", "g1", 400, 100, "nic")]
    v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu", "sw": "switch"}, {"sw": 1},
                              {0: "g0", 1: "g1"})
    paths = rank_paths(v, 0, 1, 120.0)
    assert isinstance(paths, list)
    # delay = (100000 + 100) / 1000 + 0.6 = 100.7 us <= 120
    # link 0: 100 us > 0.8 * 120 = 96 -> (100 - 96) * 10 = 40; link 1: 0.1 us -> 0
    assert paths[0].delay_us == pytest.approx(100.7)
    assert paths[0].score == pytest.approx(140.7)


def test_rank_l1_cross_leaf_unmet(view: FabricView) -> None:
    res = rank_paths(view, 0, 2, 30.0)             # 30 < 50 -> L1; any path crosses 3 switches
    assert isinstance(res, SlaUnmet)
    assert "L1" in res.reason
    assert "3 switches" in res.reason
    assert "\n" not in res.reason


def test_rank_l2_cross_leaf_unmet(view: FabricView) -> None:
    res = rank_paths(view, 0, 2, 80.0)             # L2: every gpu0 -> gpu2 path hits a spine
    assert isinstance(res, SlaUnmet)
    assert "L2" in res.reason
    assert "spine0" in res.reason


def test_rank_delay_over_sla_unmet(view: FabricView) -> None:
    res = rank_paths(view, 0, 1, 0.5)              # in scope (L1), but 0.8 us > 0.5 us
    assert isinstance(res, SlaUnmet)
    assert res.reason == "L1: no path within 0.5 us: best is 0.8 us"
    # L3 with slow fabric links: (100 + 60000 + 60000 + 100) / 1000 + 3 * 0.6 = 122.0 us
    slow = leaf_spine(fabric_delay_ns=60_000)
    res = rank_paths(slow, 0, 2, 110.0)
    assert isinstance(res, SlaUnmet)
    assert res.reason == "L3: no path within 110.0 us: best is 122.0 us"
    ok = rank_paths(slow, 0, 2, 130.0)
    assert isinstance(ok, list)
    assert ok[0].delay_us == pytest.approx(122.0)
    # link 60 us <= 0.8 * 130 = 104 -> no delay penalty
    assert ok[0].score == pytest.approx(122.0)


def test_rank_candidate_cap(view: FabricView, monkeypatch: pytest.MonkeyPatch) -> None:
    examined = 0

    def endless(*_args: object, **_kw: object) -> Iterator[list[str]]:
        nonlocal examined
        while True:
            examined += 1
            yield list(SPINE0_PATH)               # never in L1 scope

    monkeypatch.setattr(ranking.nx, "shortest_simple_paths", endless)
    # too few least-delay paths in scope: the general enumeration is used, and capped
    monkeypatch.setattr(ranking, "_least_delay_paths", lambda *a, **k: [list(SPINE0_PATH)])
    res = rank_paths(view, 0, 2, 30.0, k=3)
    assert isinstance(res, SlaUnmet)
    assert examined == 8 * 3


def reference_rank_paths(view: FabricView, src_gpu: int, dst_gpu: int, sla_us: float, *,
                         k: int = 5, switch_latency_us: float = 0.6,
                         free_buffer_bytes: dict[int, float] | None = None,
                         buffer_floor_bytes: float = 1.5e6) -> list[RankedPath] | SlaUnmet:
    """The ranking computed directly with networkx, as ``rank_paths`` did before it ran its
    own Dijkstra: ``all_shortest_paths`` on the scope's subgraph, else Yen's
    ``shortest_simple_paths``; graph reads through the public networkx views."""
    level = sla_level(sla_us)
    src, dst = view.gpu_node[src_gpu], view.gpu_node[dst_gpu]
    free = free_buffer_bytes or {}
    sw_ns = switch_latency_us * 1000.0
    weight = ranking._weight_fn(view, dst, sw_ns)
    cap = L3_RATE_CAP if level == "L3" else 1.0
    g = view.graph

    def build(path: list[str]) -> RankedPath:
        links = tuple(view.path_links(path))
        link_ns = [float(g[a][b]["delay_ns"]) for a, b in pairwise(path)]
        delay_us = (sum(link_ns) + count_switches(view, path) * sw_ns) / 1000.0
        penalty = sum(delay_penalty(ns / 1000.0, sla_us)
                      + buffer_penalty(free.get(lid, math.inf), buffer_floor_bytes)
                      for lid, ns in zip(links, link_ns, strict=True))
        return RankedPath(tuple(path), links, delay_us, delay_us + penalty, True, cap)

    eligible: list[RankedPath] = []
    best_over = None
    sub = g.subgraph(ranking._scope_nodes(view, src, dst, level))
    try:
        least = sorted(nx.all_shortest_paths(sub, src, dst, weight=weight))
        enough = sum(1 for p in least if in_scope(view, p, level)) >= k
        paths: Any = least if enough else nx.shortest_simple_paths(sub, src, dst,
                                                                     weight=weight)
        for examined, path in enumerate(paths, start=1):
            if in_scope(view, path, level):
                rp = build(path)
                if rp.delay_us > sla_us:
                    best_over = rp.delay_us
                    break
                eligible.append(rp)
                if len(eligible) == k:
                    break
            if examined >= CANDIDATE_FACTOR * k:
                break
    except nx.NetworkXNoPath:
        pass
    if eligible:
        return sorted(eligible, key=lambda p: (p.score, len(p.links), p.nodes))
    if best_over is not None:
        return SlaUnmet(f"{level}: no path within {ranking._fmt(sla_us)} us: best is "
                        f"{ranking._fmt(best_over)} us")
    return SlaUnmet(ranking._scope_reason(view, src, dst, level, sla_us, weight))


def clos(leaves: int, spines: int, gpus_per_leaf: int, seed: int,
         cores: int = 0) -> FabricView:
    """A leaf-spine (with ``cores`` tier-3 switches above the spines if > 0) whose links
    have random delays from a small set, so that least-delay paths tie, or are fewer than
    k (then Yen's enumeration is used)."""
    rng = random.Random(seed)
    links: list[LinkInfo] = []

    def both(a: str, b: str, kind: str) -> None:
        delay = rng.choice([100, 100, 200, 700]) if kind == "nic" else \
            rng.choice([1000, 1000, 1000, 1300])
        for x, y in ((a, b), (b, a)):
            links.append(LinkInfo(len(links), x, y, 400, delay, kind))

    kinds: dict[str, str] = {}
    tier: dict[str, int] = {}
    gpu_node = {}
    for lf in range(leaves):
        kinds[f"leaf{lf}"], tier[f"leaf{lf}"] = "switch", 1
        for h in range(gpus_per_leaf):
            g = lf * gpus_per_leaf + h
            kinds[f"gpu{g}"], gpu_node[g] = "gpu", f"gpu{g}"
            both(f"gpu{g}", f"leaf{lf}", "nic")
        for sp in range(spines):
            both(f"leaf{lf}", f"spine{sp}", "fabric")
    for sp in range(spines):
        kinds[f"spine{sp}"], tier[f"spine{sp}"] = "switch", 2
        for c in range(cores):
            both(f"spine{sp}", f"core{c}", "fabric")
    for c in range(cores):
        kinds[f"core{c}"], tier[f"core{c}"] = "switch", 3
    return FabricView.from_links(links, kinds, tier, gpu_node)


@pytest.mark.parametrize(("leaves", "spines", "per_leaf", "cores"),
                         [(20, 16, 8, 0), (4, 3, 3, 2), (3, 2, 2, 0)])
def test_rank_paths_matches_the_networkx_computation(leaves: int, spines: int, per_leaf: int,
                                                      cores: int) -> None:
    # the 196-node fabric of the benchmark (20 leaves, 16 spines, 160 GPUs) and smaller
    # ones with a core tier; random link delays make ties and, sometimes, fewer than k
    # least-delay paths (Yen's enumeration then)
    view = clos(leaves, spines, per_leaf, seed=leaves + cores)
    rng = random.Random(7)
    gpus = sorted(view.gpu_node)
    link_ids = sorted(view.links)
    compared = 0
    for _ in range(25):
        a, b = rng.sample(gpus, 2)
        for sla in (1000.0, 500.0, 100.0, 80.0, 30.0, 2.5, 0.5):
            k = rng.choice([1, 3, 5, 9])
            free = {lk: rng.random() * 3e6 for lk in rng.sample(link_ids, min(25, len(link_ids)))}
            kw: dict[str, Any] = {"k": k, "switch_latency_us": rng.choice([0.6, 0.0]),
                                  "free_buffer_bytes": rng.choice([free, None])}
            got, want = rank_paths(view, a, b, sla, **kw), reference_rank_paths(view, a, b,
                                                                                 sla, **kw)
            assert got == want, (a, b, sla, kw)
            compared += isinstance(got, list)
    assert compared > 20  # not only SLA failures


def test_least_delay_paths_are_networkx_all_shortest_paths() -> None:
    view = clos(4, 3, 2, seed=3, cores=2)
    for a, b in [(0, 7), (1, 2), (0, 1), (5, 3)]:
        src, dst = view.gpu_node[a], view.gpu_node[b]
        scope = ranking._scope_set(view, src, dst, "L3")
        weight = ranking._weight_fn(view, dst, 600.0)
        want = list(nx.all_shortest_paths(view.graph.subgraph(scope), src, dst, weight=weight))
        assert list(ranking._least_delay_paths(view, scope, src, dst, 600.0)) == want
    with pytest.raises(nx.NetworkXNoPath):
        list(ranking._least_delay_paths(view, {"gpu0", "gpu7"}, "gpu0", "gpu7", 600.0))


def test_rank_errors(view: FabricView) -> None:
    with pytest.raises(ValueError, match="k must be"):
        rank_paths(view, 0, 2, 500.0, k=0)
    with pytest.raises(ValueError, match="unknown GPU"):
        rank_paths(view, 0, 7, 500.0)
    with pytest.raises(ValueError, match="share node"):
        rank_paths(view, 0, 0, 500.0)


def test_controller_does_not_import_simulator() -> None:
    code = ("import sys, fabricpilot.controller.ranking, fabricpilot.controller.intents; "
            "print(any(m.startswith(('fabricpilot.dataplane','fabricpilot.balancing',"
            "'fabricpilot.runner','fabricpilot.topology')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
