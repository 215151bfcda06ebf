"""Adaptive routing against outcomes derived by hand: pigeonhole placement where ECMP collides,
the congestion table steering ports, drain-safe moves costing exactly one old-path delay and
never reordering, and immediate moves onto a faster path reordering by the bytes that overtake.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import p2p_job
from fabricpilot.balancing import PolicyContext, make_policy
from fabricpilot.balancing.adaptive import Adaptive, Flowlet, least_loaded, onward_segments
from fabricpilot.balancing.base import ActiveMembers, Moves
from fabricpilot.dataplane import Engine, FabricParams
from fabricpilot.errors import FabricpilotError
from fabricpilot.topology import compile_topology, leaf_spine
from fabricpilot.workload.jobs import JobSpec

WIRE = (4096 + 78) / 4096
LINE_GBPS = 400.0


def p2p(pairs: list[tuple[int, int]], size: int) -> JobSpec:
    return p2p_job("p2p", pairs, size)


def run(ct, jobs, policy):  # type: ignore[no-untyped-def]
    pol = policy if not isinstance(policy, str) else make_policy(policy, PolicyContext(ct, 1, 600))
    return Engine(ct, pol, jobs).run()


@pytest.fixture(scope="module")
def tor():  # type: ignore[no-untyped-def]
    # 8 leaves of 8 single-GPU hosts, 8 spines: a leaf's 8 flows fit its 8 uplinks exactly
    return compile_topology(leaf_spine(hosts=64, gpus_per_host=1, nics_per_leaf=8,
                                       rail_optimized=False))


def test_one_leaf_to_eight_leaves_takes_eight_uplinks(tor) -> None:  # type: ignore[no-untyped-def]
    # hosts 0..7 (leaf 0) each send to a different leaf: 8 flows, 8 uplinks, no shared
    # downlink; every flow can run at line rate only if the uplinks are all different
    pairs = [(i, 8 * (i + 1) % 64 + i) for i in range(7)] + [(7, 15)]
    size = 32 << 20
    ad = run(tor, [p2p(pairs, size)], "adaptive")
    ec = run(tor, [p2p(pairs, size)], "ecmp")
    alone_ns = size * WIRE * 8 / LINE_GBPS
    f = ad.flows
    assert np.all(f["end_send_ns"] - f["start_ns"] == pytest.approx(alone_ns, rel=1e-3))
    # ECMP (seeded hash) puts at least two of them on one uplink: the slowest takes 2x
    e = ec.flows
    assert (e["end_send_ns"] - e["start_ns"]).max() == pytest.approx(2 * alone_ns, rel=1e-3)
    assert ad.flows["reorder_events"].sum() == 0


def test_a_lone_flow_on_an_idle_fabric_takes_the_ecmp_path(tor) -> None:  # type: ignore[no-untyped-def]
    ctx = PolicyContext(tor, 1, 600, member_routes=True)
    from fabricpilot.balancing.base import TransferBatch

    b = TransferBatch(*(np.array([x]) for x in (3, 42, 1 << 20, -1, 0)))
    ad = make_policy("adaptive", ctx).route(b)
    ec = make_policy("ecmp", ctx).route(b)
    assert ad.routes is not None and ec.routes is not None
    assert ad.routes.path.tolist() == ec.routes.path.tolist()


def test_congestion_table_steers_and_excludes_ports() -> None:
    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    pol = make_policy("adaptive", PolicyContext(ct, 1, 600))
    assert isinstance(pol, Adaptive)
    names = [ct.link_name(i) for i in range(ct.n_links)]
    table = np.ones(ct.n_links)
    table[[i for i, n in enumerate(names) if "spine0" in n]] = 0.0  # spine0 out of service
    pol.set_congestion_table(table)
    out = run(ct, [p2p([(0, 2), (1, 3)], 8 << 20)], pol)
    # both flows on spine1: they share leaf0->spine1 and run at half rate
    assert out.link_bytes[names.index("leaf0->spine0")] == 0
    alone_ns = (8 << 20) * WIRE * 8 / LINE_GBPS
    f = out.flows
    assert np.all(f["end_send_ns"] - f["start_ns"] == pytest.approx(2 * alone_ns, rel=1e-3))
    with pytest.raises(FabricpilotError, match="expected 16 link weights"):
        pol.set_congestion_table(np.ones(3))
    with pytest.raises(FabricpilotError, match=">= 0"):
        pol.set_congestion_table(-table)


class _OpenLater(Adaptive):
    """Starts with spine0 forbidden (both flows collide on spine1), then the table is
    reset at the first rebalance: one flow should move to spine0."""

    def __init__(self, ctx: PolicyContext, drain_safe: bool) -> None:
        super().__init__(ctx)
        names = [ctx.topology.link_name(i) for i in range(ctx.topology.n_links)]
        table = np.ones(ctx.topology.n_links)
        table[[i for i, n in enumerate(names) if "spine0" in n]] = 0.0
        self.set_congestion_table(table)
        self.drain_safe = drain_safe
        self.moved: list[Moves] = []

    def rebalance(self, members: ActiveMembers) -> Moves:
        self.congestion_table = np.ones(self.ctx.topology.n_links)
        mv = super().rebalance(members)
        if len(mv.member):
            self.moved.append(mv)
        return mv


def _two_spines(spine0_delay_ns: int):  # type: ignore[no-untyped-def]
    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    for i in range(ct.n_links):
        if "spine0" in ct.link_name(i):
            ct.delay_ns[i] = spine0_delay_ns
    return ct


def test_drain_safe_move_costs_one_old_path_delay_and_never_reorders() -> None:
    ct = _two_spines(100)
    pol = _OpenLater(PolicyContext(ct, 1, 600), drain_safe=True)
    size = 16 << 20
    out = run(ct, [p2p([(0, 2), (1, 3)], size)], pol)
    assert len(pol.moved) == 1 and len(pol.moved[0].member) == 1
    t_move = pol.rebalance_interval_ns
    # old path: 4 links of 100 ns and 3 switches of 600 ns
    drain = 4 * 100 + 3 * 600
    wire = size * WIRE
    rate = LINE_GBPS / 8  # bytes per ns
    # both at half rate until the move; then the one that stays runs alone at line rate while
    # the moved one waits for its old path to drain; then both at line rate
    left = wire - rate / 2 * t_move
    stay_end = t_move + left / rate
    move_end = t_move + drain + left / rate
    end = sorted((out.flows["end_send_ns"] - out.flows["start_ns"]).tolist())
    assert end[0] == pytest.approx(stay_end, abs=2)
    assert end[1] == pytest.approx(move_end, abs=2)
    assert out.flows["reorder_events"].sum() == 0


def test_an_immediate_move_to_a_faster_path_reorders_the_bytes_that_overtake() -> None:
    # spine1 (where both flows start) is slow: 5 us per link; spine0 is 100 ns per link
    ct = _two_spines(100)
    for i in range(ct.n_links):
        if "spine1" in ct.link_name(i):
            ct.delay_ns[i] = 5_000
    pol = _OpenLater(PolicyContext(ct, 1, 600), drain_safe=False)
    out = run(ct, [p2p([(0, 2), (1, 3)], 16 << 20)], pol)
    assert len(pol.moved) == 1
    # packets sent on the new path during the delay difference arrive before those still on
    # the old one; the paths differ in their two spine links: (2 x 5000 - 2 x 100) ns at half
    # line rate, in 4096 B packets
    ahead_bytes = (2 * 5_000 - 2 * 100) * (LINE_GBPS / 2) / 8
    assert out.flows["reorder_events"].sum() == math.ceil(ahead_bytes / 4096)


def test_least_loaded_fills_the_emptiest_first_and_skips_excluded_ports() -> None:
    seg = np.array([[[0], [1], [2]]], np.int32)  # one group of three single-link choices
    load = np.array([0.0, 0.5, 0.0])
    weight = np.array([1.0, 1.0, 0.0])  # port 2 excluded
    pick = least_loaded(seg, np.zeros(4, np.int64), np.full(4, 3), np.zeros(4, np.int64), load,
                        weight, np.ones(4))
    # 0 (load 0) -> 1 (0.5 < 1) -> 0 (1 <= 1.5, first from 0) -> 1
    assert pick.tolist() == [0, 1, 0, 1]
    assert load.tolist() == [2.0, 2.5, 0.0]


def test_onward_segments_follow_the_path_to_the_next_choice() -> None:
    from fabricpilot.topology import fat_tree

    ct = compile_topology(fat_tree(k=4))
    src, dst = 0, 15
    leaf = ct.gpu_leaf[src]
    seg, n = onward_segments(ct, np.array([leaf], np.int32),
                             np.array([ct.leaf_slot[ct.gpu_leaf[dst]]]))
    # from an edge switch towards another pod: 2 aggregation uplinks, and each aggregation
    # switch has a choice of core again, so a segment is one link
    assert n.tolist() == [2]
    assert [(s >= 0).sum() for s in seg[0, :2]] == [1, 1]


def test_adaptive_routes_under_the_fluid_model() -> None:
    from fabricpilot.dataplane import FluidRateModel

    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    pol = make_policy("adaptive", PolicyContext(ct, 1, 600, member_routes=True))
    model = FluidRateModel(ct, FabricParams())
    out = Engine(ct, pol, [p2p([(0, 2), (1, 3)], 4 << 20)], rate_model=model).run()
    alone_ns = (4 << 20) * WIRE * 8 / LINE_GBPS
    f = out.flows
    # two flows from one leaf to another over two spines: one each, both near line rate
    assert np.all(f["end_send_ns"] - f["start_ns"] <= 1.05 * alone_ns)


@pytest.mark.parametrize("oversubscription", [1, 2])
def test_permutation_and_alltoall_reach_the_spraying_bound(oversubscription: int) -> None:
    # 8 leaves x 8 single-GPU hosts, 8 (1:1) or 4 (2:1) spines. `ideal` (even spraying) is the
    # throughput bound on a symmetric Clos; ECMP loses to hash collisions, adaptive must not
    ct = compile_topology(leaf_spine(hosts=64, gpus_per_host=1, nics_per_leaf=8,
                                     rail_optimized=False, oversubscription=oversubscription))
    rng = np.random.default_rng(3)
    dsts = rng.permutation(64)
    perm = [(i, int(d)) for i, d in enumerate(dsts) if i // 8 != d // 8]  # all off-leaf
    from fabricpilot.workload.collectives import build_collective

    a2a = build_collective("alltoall", np.arange(64), 64 << 20, gpus_per_host=1)
    runs = {p: (run(ct, [p2p(perm, 64 << 20)], p), run(ct, [JobSpec("a", a2a.ranks, (a2a,))], p))
            for p in ("ecmp", "adaptive", "ideal")}

    def mean_rate(out) -> float:  # type: ignore[no-untyped-def]
        f = out.flows
        return float(np.mean(f["wire_bytes"] * 8 / (f["end_send_ns"] - f["start_ns"])))

    ideal_perm, ideal_a2a = runs["ideal"]
    ratio = {p: (mean_rate(o[0]) / mean_rate(ideal_perm),
                 ideal_a2a.collectives[0].time_ns / o[1].collectives[0].time_ns)
             for p, o in runs.items()}
    assert ratio["adaptive"][0] >= 0.9 and ratio["adaptive"][1] >= 0.9
    assert ratio["ecmp"][0] <= 0.75 and ratio["ecmp"][1] <= 0.9
    for o in runs["adaptive"]:
        assert o.flows["reorder_events"].sum() == 0


def test_mice_split_cuts_mice_tail_at_the_cost_of_one_spine() -> None:
    from pathlib import Path

    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import load_scenario

    path = Path(__file__).parent.parent / "examples" / "mice_elephants.yaml"
    prep = prepare(load_scenario(path), str(path))
    plain, split = run_policy(prep, "adaptive"), run_policy(prep, "adaptive-split")
    p99 = {r.policy: r.summary()["fct_slowdown"]["mice"]["p99"] for r in (plain, split)}
    assert p99["adaptive-split"] <= 0.6 * p99["adaptive"]
    # the AlltoAll is bound by the 2:1 uplinks; giving one spine of four to the mice leaves
    # the elephants 3 uplinks instead of 4: its time grows by 4/3
    t = [r.collectives[0].time_ns for r in (plain, split)]
    assert t[1] / t[0] == pytest.approx(4 / 3, rel=0.02)
    # the reserved spine carries exactly the mice that cross leaves (two spine links each),
    # and no elephant byte
    names = split.link_names
    spine0 = [i for i, n in enumerate(names) if "spine0" in n]
    f = split.flows
    leaf = prep.topology.gpu_leaf
    cross_mice = (f["owner"] == -1) & (leaf[f["src"]] != leaf[f["dst"]])
    assert split.link_bytes[spine0].sum() == pytest.approx(2 * f["wire_bytes"][cross_mice].sum())


def test_task_aware_keeps_the_mice_spine_the_scenario_reserves() -> None:
    # examples/mice_elephants.yaml with controller.mice_spines: 1: the controller plans no
    # QP through spine0 and the switches route the mice there, so the mice and the AlltoAll
    # fare as under adaptive-split (the AlltoAll at 3/4 of its time with four uplinks);
    # without the setting the plan takes all four spines and the mice fare as under adaptive
    from dataclasses import replace
    from pathlib import Path

    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import load_scenario

    path = Path(__file__).parent.parent / "examples" / "mice_elephants.yaml"
    prep = prepare(load_scenario(path), str(path))
    assert prep.controller.mice_spines == 1
    runs = {p: run_policy(prep, p) for p in ("adaptive", "adaptive-split", "task-aware")}
    p99 = {p: r.summary()["fct_slowdown"]["mice"]["p99"] for p, r in runs.items()}
    assert p99["task-aware"] <= 0.6 * p99["adaptive"]
    assert p99["task-aware"] == pytest.approx(p99["adaptive-split"], rel=0.05)
    t = {p: r.collectives[0].time_ns for p, r in runs.items()}
    assert t["task-aware"] / t["adaptive"] == pytest.approx(4 / 3, rel=0.02)
    ta = runs["task-aware"]
    spine0 = [i for i, n in enumerate(ta.link_names) if "spine0" in n]
    f = ta.flows
    leaf = prep.topology.gpu_leaf
    cross_mice = (f["owner"] == -1) & (leaf[f["src"]] != leaf[f["dst"]])
    assert ta.link_bytes[spine0].sum() == pytest.approx(2 * f["wire_bytes"][cross_mice].sum())
    free = replace(prep, controller=replace(prep.controller, mice_spines=0))
    open_p99 = run_policy(free, "task-aware").summary()["fct_slowdown"]["mice"]["p99"]
    assert open_p99 >= 0.9 * p99["adaptive"]


class _Alternate(Flowlet):
    """Flowlet switching where the first flowlet may only use spine1 and later ones only
    spine0 (a congestion table pushed in between), with a given gap threshold."""

    def __init__(self, ctx: PolicyContext, gap_ns: int) -> None:
        super().__init__(ctx)
        self.gap_ns = gap_ns
        self._names = [ctx.topology.link_name(i) for i in range(ctx.topology.n_links)]
        self._calls = 0

    def route(self, batch):  # type: ignore[no-untyped-def]
        avoid = "spine0" if self._calls == 0 else "spine1"
        self.congestion_table = np.array([0.0 if avoid in n else 1.0 for n in self._names])
        self._calls += 1
        return super().route(batch)


@pytest.mark.parametrize(("gap_threshold_ns", "idle_ns", "switches", "reorders"), [
    (1_000, 2_000, True, True),      # allowed to switch inside the delay difference: reorders
    (20_000, 2_000, False, False),   # threshold above the difference: stays on its path
    (20_000, 30_000, True, False),   # switches, but after the old path has drained
])
def test_flowlets_reorder_only_when_the_gap_is_below_the_delay_difference(
        gap_threshold_ns: int, idle_ns: int, switches: bool, reorders: bool) -> None:
    from fabricpilot.workload.mice import MiceArrivals

    ct = _two_spines(100)
    for i in range(ct.n_links):
        if "spine1" in ct.link_name(i):
            ct.delay_ns[i] = 5_000
    size = 1 << 20
    send_ns = math.ceil(size * WIRE * 8 / LINE_GBPS)
    # two messages on one connection: the second starts idle_ns after the first's last byte
    mice = MiceArrivals(np.array([0, send_ns + idle_ns]), np.array([0, 0]), np.array([2, 2]),
                        np.array([size, size]))
    pol = _Alternate(PolicyContext(ct, 1, 600), gap_threshold_ns)
    out = Engine(ct, pol, [], mice=mice).run()
    spine0 = [i for i, n in enumerate(out_names(ct)) if "spine0" in n]
    moved = bool(out.link_bytes[spine0].sum() > 0)
    assert moved == switches
    events = int(out.flows["reorder_events"].sum())
    if reorders:
        # the paths differ by 2 x (5000 - 100) ns; the new flowlet's packets sent in that
        # time minus the idle gap, at line rate, overtake the old one's tail
        ahead = (2 * (5_000 - 100) - idle_ns) * LINE_GBPS / 8
        assert events == math.ceil(ahead / 4096)
    else:
        assert events == 0


def out_names(ct) -> list[str]:  # type: ignore[no-untyped-def]
    return [ct.link_name(i) for i in range(ct.n_links)]


def test_fluid_moves_wait_for_the_old_path_to_drain() -> None:
    from fabricpilot.dataplane import FluidRateModel

    def go(interval: float):  # type: ignore[no-untyped-def]
        ct = _two_spines(100)
        from fabricpilot.balancing.base import AdaptiveParams

        ctx = PolicyContext(ct, 1, 600, member_routes=True,
                            adaptive=AdaptiveParams(rebalance_interval_ns=interval))
        pol = _OpenLater(ctx, drain_safe=True)
        model = FluidRateModel(ct, FabricParams())
        return Engine(ct, pol, [p2p([(0, 2), (1, 3)], 16 << 20)], rate_model=model).run(), pol

    moved, pol = go(50_000)
    stuck, _ = go(float("inf"))
    assert len(pol.moved) == 1 and moved.path_moves == 1 and stuck.path_moves == 0
    assert moved.flows["reorder_events"].sum() == 0
    names = out_names(_two_spines(100))
    up = {s: names.index(f"leaf0->{s}") for s in ("spine0", "spine1")}
    wire = moved.flows["wire_bytes"]
    # every byte crosses exactly one spine: after the move, the moved stream's later bytes
    # take spine0 (the stuck pair never does)
    assert moved.link_bytes[up["spine0"]] + moved.link_bytes[up["spine1"]] == \
        pytest.approx(wire.sum(), rel=1e-9)
    assert 0 < moved.link_bytes[up["spine0"]] < wire.max()
    assert stuck.link_bytes[up["spine0"]] == 0
    # DCQCN's rate cuts outlive the collision: with the paper's additive increase the moved
    # stream stays near the rate it was cut to, so moving alone does not finish it sooner
    t_moved, t_stuck = moved.collectives[0].time_ns, stuck.collectives[0].time_ns
    assert t_moved == pytest.approx(t_stuck, rel=0.05)


def test_bytes_seen_promotes_every_cross_leaf_elephant_once() -> None:
    from pathlib import Path

    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import load_scenario

    path = Path(__file__).parent.parent / "examples" / "mice_elephants.yaml"
    sc = load_scenario(path)
    sc = sc.model_copy(update={"adaptive": sc.adaptive.model_copy(update={"mice_by":
                                                                            "bytes_seen"})})
    prep = prepare(sc, str(path))
    r = run_policy(prep, "adaptive-split")
    # every flow starts as a mouse on the reserved spine; each AlltoAll flow that leaves its
    # leaf (32 GPUs x 24 peers on other leaves) outgrows 64 KiB and moves once, drain-safe;
    # the 16 KiB mice never do
    assert r.path_moves == 32 * 24
    assert r.summary()["reorder_events"] == 0
    assert r.collectives[0].time_ns > 0


class _Watch(Adaptive):
    """Adaptive routing that keeps the telemetry of its first rebalance and its moves."""

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []
        self.moves = 0

    def rebalance(self, members: ActiveMembers) -> Moves:
        if not self.seen and self._telemetry is not None:
            tel = self._telemetry()
            self.seen.append((tel.load_gbps.copy(), tel.demand_gbps.copy()))
        mv = super().rebalance(members)
        self.moves += len(mv.member)
        return mv


def test_a_tree_rows_demand_is_what_its_gpus_nics_let_it_send() -> None:
    """A tree AllReduce over 16 single-GPU hosts (4 leaves of 4, 4 spines) runs as one
    coupled row whose GPUs send up to 4 of its transfers each: the row moves at 400 / 4 =
    100 Gb/s per transfer, and that is what each transfer would send if nothing else held
    it back. The switches' view of demand is then the load itself, and adaptive routing
    has no reason to move anything. (Counting each transfer at its NIC's 400 Gb/s put the
    demand above the load on every busy link: standing queues where there are none.)"""
    from fabricpilot.workload.collectives import build_collective

    ct = compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=4,
                                     rail_optimized=False))
    plan = build_collective("allreduce", range(16), 64 << 20, algorithm="tree")
    (stage,) = plan.stages
    assert np.bincount(stage.src).max() == 4  # (a GPU interior to one tree: 3 + 1 sends)
    pol = _Watch(PolicyContext(ct, 1, 600))
    run(ct, [JobSpec("tree", plan.ranks, (plan,))], pol)
    load, demand = pol.seen[0]
    busy = load > 0
    assert busy.sum() > 0
    np.testing.assert_allclose(demand[busy], load[busy], rtol=1e-9)
    nic_up = ct.gpu_up[np.argmax(np.bincount(stage.src))]
    assert load[nic_up] == pytest.approx(LINE_GBPS)  # (4 transfers at 100 Gb/s)
    assert pol.moves == 0
