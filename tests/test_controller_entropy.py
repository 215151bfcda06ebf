"""Entropy steering: source ports chosen by the controller land QPs on planned paths, checked
against the twin's own forwarding (``walk_paths`` with the switches' hash), and explicit rules
only where the hash cannot reach, within each switch's rule budget."""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest

from fabricpilot.balancing import EcmpParams, PolicyContext
from fabricpilot.balancing.task_aware import TaskAware, fabric_view
from fabricpilot.controller.core import Controller, pair_of_key
from fabricpilot.controller.entropy import (
    PORT_LO,
    SteerRequest,
    constraints,
    hash_path,
    hash_paths,
    rules_per_switch,
    steer,
)
from fabricpilot.controller.intents import CommCall, Intent
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.southbound import BatchMap, PathSet
from fabricpilot.net.hashing import ROCE_UDP_PORT, gpu_ip, switch_hash
from fabricpilot.topology import compile_topology
from fabricpilot.topology.builders import fat_tree
from fabricpilot.topology.paths import walk_paths

K = 8  # fat-tree: 128 GPUs, 8 pods; 4 aggregations per pod, 4 cores per aggregation


def _ctx(per_switch: bool, entropy: bool = True, rules: int = 4096, parts: int = 4,
         ) -> PolicyContext:
    ct = compile_topology(fat_tree(k=K))
    return PolicyContext(ct, 7, 600, EcmpParams(1, entropy, per_switch),
                         controller=ControllerParams(parts=parts, switch_rule_capacity=rules))


def _twin_path(ctx: PolicyContext, src: int, dst: int, port: int) -> tuple[int, ...]:
    """The path the twin's switches give a QP with this source port (no rules)."""
    s, d = np.array([src]), np.array([dst])

    def choose(step: int, switch: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return switch_hash(gpu_ip(s[rows]), gpu_ip(d[rows]), np.array([port] * len(rows)),
                           switch, ctx.seed, ctx.ecmp.per_switch_seed)

    p = walk_paths(ctx.topology, s, d, choose)[0]
    return tuple(int(x) for x in p if x >= 0)


def _paths_and_detour(ctx: PolicyContext, step: int, mul: int, add: int, k: int
                      ) -> tuple[list[tuple[int, ...]], list[int]]:
    """Paths and their destination GPUs: the first ``k`` inter-pod candidates from every
    ``step``-th GPU ``g`` of 128 to GPU ``(g * mul + add) % 128``, then gpu0 -> gpu4 (same
    pod, another edge) up to a core and back, through an aggregation whose group towards
    edge0_1 does not hold its core uplink."""
    view = fabric_view(ctx)
    paths: list[tuple[int, ...]] = []
    dst: list[int] = []
    for g in range(0, 128, step):
        h = (g * mul + add) % 128
        for p in _inter_pod_candidates(ctx, g, h)[:k]:
            paths.append(p)
            dst.append(h)
    hops = ["gpu0", "edge0_0", "agg0_0", "core0", "agg0_0", "edge0_1", "gpu4"]
    paths.append(tuple(view.link_between(a, b) for a, b in pairwise(hops)))
    dst.append(4)
    return paths, dst


def _inter_pod_candidates(ctx: PolicyContext, src: int, dst: int) -> list[tuple[int, ...]]:
    ctl = Controller(TaskAware(ctx), ctx.controller)
    return ctl.candidates(src, dst)


def test_per_switch_seeds_every_planned_path_is_reached_by_a_port() -> None:
    ctx = _ctx(per_switch=True)
    view = fabric_view(ctx)
    cands = _inter_pod_candidates(ctx, 0, 127)
    assert len(cands) == (K // 2) ** 2  # 4 aggregations x 4 cores
    rng = np.random.default_rng(3)
    reqs = [SteerRequest(0, 127, p, int(rng.integers(1 << 20))) for p in cands]
    for g in rng.choice(128, 40, replace=False).tolist():
        h = int((g + 64) % 128)
        cs = _inter_pod_candidates(ctx, g, h)
        reqs.append(SteerRequest(g, h, cs[int(rng.integers(len(cs)))], g))
    got = steer(view, reqs)
    for q, s in zip(reqs, got, strict=True):
        assert s.rules == ()
        assert PORT_LO <= s.port <= 0xFFFF
        assert _twin_path(ctx, q.src, q.dst, s.port) == q.path
        assert hash_path(view, q.src, q.dst, s.port) == q.path


def test_a_shared_seed_polarises_tiers_and_rules_fill_the_gap() -> None:
    """One seed everywhere: the edge and the aggregation switch hash the same 5-tuple to the
    same value and both groups have 4 members, so the core a QP reaches is fixed by the
    aggregation it took: of the 16 paths between pods, entropy reaches exactly 4 (one per
    aggregation); each of the other 12 needs exactly one rule."""
    ctx = _ctx(per_switch=False)
    view = fabric_view(ctx)
    cands = _inter_pod_candidates(ctx, 0, 127)
    got = steer(view, [SteerRequest(0, 127, p, i) for i, p in enumerate(cands)])
    n_rules = sorted(len(s.rules) for s in got)
    assert n_rules == [0] * 4 + [1] * 12
    for p, s in zip(cands, got, strict=True):
        if not s.rules:
            assert _twin_path(ctx, 0, 127, s.port) == p


def test_without_nic_entropy_only_the_hash_path_needs_no_rule() -> None:
    ctx = _ctx(per_switch=True, entropy=False)
    view = fabric_view(ctx)
    cands = _inter_pod_candidates(ctx, 5, 100)
    got = steer(view, [SteerRequest(5, 100, p) for p in cands])
    assert {s.port for s in got} == {ROCE_UDP_PORT}
    free = [p for p, s in zip(cands, got, strict=True) if not s.rules]
    assert free == [_twin_path(ctx, 5, 100, ROCE_UDP_PORT)]
    # every rule sits on a switch of its path whose hash disagrees
    for p, s in zip(cands, got, strict=True):
        for sw, link in s.rules:
            assert view.links[link].src == sw and link in p


def test_constraints_skip_single_member_groups() -> None:
    ctx = _ctx(per_switch=True)
    view = fabric_view(ctx)
    path = _inter_pod_candidates(ctx, 0, 127)[0]
    # edge -> aggregation (4 choices) and aggregation -> core (4); downward groups have one
    assert [len(g) for _, g, _ in constraints(view, 127, path)] == [4, 4]
    # same edge switch: no hash decision at all
    assert constraints(view, 1, _inter_pod_candidates(ctx, 0, 1)[0]) == []


def _alltoall_controller(ctx: PolicyContext) -> tuple[TaskAware, Controller]:
    twin = TaskAware(ctx)
    ctl = Controller(twin, ctx.controller)
    gpus = tuple(range(0, 128, 2))  # 64 GPUs spread over all pods
    ctl.declare(Intent("a2a", "t", gpus, (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
    return twin, ctl


def test_the_rule_budget_is_respected_and_what_does_not_fit_follows_its_hash() -> None:
    cap = 20
    ctx = _ctx(per_switch=True, entropy=False, rules=cap)
    twin, ctl = _alltoall_controller(ctx)
    rep = ctl.plan()
    # entropy off: each pair's hash path needs no rule, every other path does; the plan
    # that narrows the demands that did not fit to their hash path won here
    assert rep.pinned > 0
    assert 0 < rep.max_switch_rules <= cap
    assert twin.switch_rules() == rules_per_switch_of(twin)
    assert max(twin.switch_rules().values()) <= cap
    view = fabric_view(ctx)
    qps = []
    for rule, _ in twin._rules.values():
        a, b = (int(x) for x in rule.key.split(":")[1].split("->"))
        for path, port, pinned in zip(rule.paths, rule.ports, rule.rules, strict=True):
            if not pinned:  # not pinned: the installed path is the hash path of its port
                assert path == _twin_path(ctx, a, b, port) == hash_path(view, a, b, port)
                qps.append((a, b, port, path))
    # the hash paths of many QPs at once, hop by hop: the same paths
    src, dst, ports, paths = zip(*qps, strict=True)
    assert len(qps) > 10 and hash_paths(view, src, dst, ports) == list(paths)


def rules_per_switch_of(twin: TaskAware) -> dict[str, int]:
    from fabricpilot.controller.entropy import Steering

    return rules_per_switch([Steering(0, pinned) for r, _ in twin._rules.values()
                             for pinned in r.rules])


def test_with_entropy_a_large_alltoall_needs_no_rules() -> None:
    ctx = _ctx(per_switch=True)
    _, ctl = _alltoall_controller(ctx)
    rep = ctl.plan()
    assert rep.pinned == rep.unpinned == 0 and rep.switch_rules == {}
    assert rep.steered == sum(len(s) for s in rep.plan.paths.values())


def test_the_twin_rejects_a_rule_table_overflow() -> None:
    ctx = _ctx(per_switch=True, rules=2)
    twin = TaskAware(ctx)
    leaf = str(ctx.topology.node_names[int(ctx.topology.switch_node[0])])
    rules = tuple(((leaf, 0),) for _ in range(3))
    with pytest.raises(ValueError, match=f"switch {leaf}: rule table full \\(3 rules > "
                                         "capacity 2\\)"):
        twin.install([PathSet("j:0->1", ((0,),) * 3, (1.0,) * 3, (1, 2, 3), rules)])
    twin.install([PathSet("j:0->1", ((0,),) * 2, (1.0,) * 2, (1, 2), rules[:2])])
    assert twin.switch_rules() == {leaf: 2}
    # replacing a key's set frees its old rules first
    twin.install([PathSet("j:0->1", ((0,),) * 2, (1.0,) * 2, (1, 2), rules[:2])])
    assert twin.switch_rules() == {leaf: 2}


def test_the_twin_frees_a_withdrawn_sets_rules_at_once_and_its_flows_after_the_latency(
        ) -> None:
    ctx = _ctx(per_switch=True, rules=2)
    twin = TaskAware(ctx)
    twin.job_names = ["j"]
    leaf = str(ctx.topology.node_names[int(ctx.topology.switch_node[0])])
    rules = (((leaf, 0),), ((leaf, 0),))
    twin._ahead = True  # (as the plan made before a run: in effect at once, at time 0)
    twin.install([PathSet("j:0->1", ((0, 1), (0, 1)), (0.5, 0.5), (), rules)])
    twin._ahead = False
    assert twin.switch_rules() == {leaf: 2}
    late = float(ctx.controller.control_latency_ns)

    def first_hops(now: float) -> list[int]:
        got = twin.repath(np.array([0]), np.array([0]), np.array([1]), np.array([0]), now)
        return got[0][:2].tolist()

    assert first_hops(0.0) == [0, 1]  # (rules only: the set's paths)
    twin.remove(["j:0->1", "j:5->6"])  # (at time 0; a key not held is ignored)
    assert twin.switch_rules() == {}  # freed at once: another set fits
    # its flows keep the set's paths until the withdrawal takes effect
    assert first_hops(late - 1) == [0, 1]
    assert first_hops(late) != [0, 1] and "j:0->1" not in twin._rules
    # installed again, removed again before it took effect, installed once more: its
    # rules are counted once
    twin.install([PathSet("j:0->1", ((0, 1), (0, 1)), (0.5, 0.5), (), rules)])
    twin.remove(["j:0->1"])
    twin.install([PathSet("j:0->1", ((0, 1), (0, 1)), (0.5, 0.5), (), rules)])
    assert twin.switch_rules() == {leaf: 2}
    assert first_hops(4 * late) == [0, 1]


def test_the_twin_forwards_planned_qps_on_the_planned_paths() -> None:
    """End to end on the default scenario: every path of every installed set is what the
    twin's forwarding (hash of the port, plus pinned rules) resolves it to."""
    from fabricpilot.runner import prepare
    from fabricpilot.scenario.loader import default_scenario

    prep = prepare(default_scenario())
    twin = TaskAware(PolicyContext(prep.topology, prep.seed, 600, prep.ecmp))
    rep = twin.attach_jobs(prep.jobs)
    assert rep.steered > 0
    for rule, _ in twin._rules.values():
        a, b = (int(x) for x in rule.key.split(":")[1].split("->"))
        for path, port in zip(rule.paths, rule.ports, strict=True):
            assert _twin_path(twin.ctx, a, b, port) == path
    assert len(twin._rules) == rep.path_sets


def test_spilled_demands_are_replanned_on_entropy_paths_only_if_that_loads_less() -> None:
    """With full rule tables the controller also tries a plan that keeps the spilled demands
    on paths entropy reaches, and installs whichever loads the fabric less once every QP is
    on the path it really takes: never worse than planning once."""
    from fabricpilot.controller.core import _set_load
    from fabricpilot.controller.planner import plan_greedy

    ctx = _ctx(per_switch=False, rules=32)
    twin, ctl = _alltoall_controller(ctx)
    rep = ctl.plan()
    assert rep.unpinned > 0
    demands = ctl.demands()
    rate = {d.key: d.rate_gbps for d in demands}
    once = plan_greedy(demands, ctl._capacity(), split=ctl.parts)
    sets_once, _ = ctl.steer_plan(once, ctl._weight)
    installed = [r for r, _ in twin._rules.values()]
    assert (ctl._fabric_lambda(_set_load(installed, rate), {})
            <= ctl._fabric_lambda(_set_load(sets_once, rate), {}) + 1e-9)
    # a demand narrowed to entropy paths keeps only paths that need no rule
    d = demands[0]
    out = ctl._entropy_only(demands, {d.key})
    narrowed = out[0]
    assert out[1:] == demands[1:]  # (only the demands asked for)
    a, b = pair_of_key(d.key)
    got = steer(fabric_view(ctx), [SteerRequest(a, b, p) for p in narrowed.full_candidates])
    assert all(not s.rules for s in got)
    assert set(narrowed.full_candidates) <= set(d.full_candidates)
    # narrowed together (one steering of all their candidates) as each one alone
    some = demands[:12]
    together = ctl._entropy_only(some, {x.key for x in some})
    assert together == [ctl._entropy_only([x], {x.key})[0] for x in some]
    assert any(t != x for t, x in zip(together, some, strict=True))


def test_a_failure_resteers_only_the_paths_that_changed() -> None:
    """After a link fails, a re-placed path set keeps the source port of every path it
    already had; new paths get ports whose hash (checked by the twin) lands on them."""
    ctx = _ctx(per_switch=True, parts=8)
    # a ring of 8 GPUs in different pods: one peer each, so each pair is planned in the 8
    # parts' QPs (up to 8 of its 16 paths)
    ctl = Controller(TaskAware(ctx), ctx.controller)
    ctl.declare(Intent("ring", "t", tuple(range(0, 128, 16)),
                       (CommCall("allreduce", 64 << 20, 1000.0, 0),)))
    ctl.plan()
    assert max(len(s.paths) for s in ctl._installed.values()) > 1
    before = dict(ctl._installed)
    load = ctl.current.link_load_gbps
    fabric = [lk for lk, li in ctl.view.links.items() if li.kind == "fabric"]
    hot = max(fabric, key=lambda lk: (load.get(lk, 0.0), -lk))
    heal = ctl.on_links_changed([hot], [])
    assert heal.affected > 0
    kept = fresh = 0
    for key, old in before.items():
        new = ctl._installed[key]
        if new is old:
            continue
        a, b = (int(x) for x in key.split(":")[1].split("->"))
        for path, port in zip(new.paths, new.ports, strict=True):
            assert hot not in path
            if path in old.paths:
                assert port == old.ports[old.paths.index(path)]
                kept += 1
            else:
                assert _twin_path(ctx, a, b, port) == path
                fresh += 1
    assert kept > 0 and fresh > 0


@pytest.mark.parametrize("per_switch", [False, True])
def test_the_hash_split_by_field_is_the_switches_hash(per_switch: bool) -> None:
    """The CRC is linear: the hash of a port at a switch is the XOR of a term of the switch,
    of each GPU and of the port (then rotated as the switch does), exactly."""
    from fabricpilot.controller.entropy import (
        _gpu_terms,
        _port_terms,
        _switch_hash,
        _switch_terms,
    )
    from fabricpilot.net.hashing import CRC32_TABLE, UDP_PROTO, crc32_words, switch_seed

    rng = np.random.default_rng(5)
    n = 300
    sw = rng.integers(0, 400, n)
    src, dst = rng.integers(0, 2000, n), rng.integers(0, 2000, n)
    ports, p_term = _port_terms(True)
    row = rng.integers(0, len(ports), n)
    seeds = switch_seed(77, sw, per_switch)
    rot = (seeds % np.uint64(32)).astype(np.int64) if per_switch else np.zeros(n, np.int64)
    a_term, b_term = _gpu_terms(2000)
    split = (_switch_terms(seeds) ^ a_term[src] ^ b_term[dst] ^ p_term[row]).astype(np.uint64)
    r = rot.astype(np.uint64)
    split = np.where(rot > 0, (split >> r) | (split << (np.uint64(32) - r)), split)
    prefix = crc32_words([(seeds, 4), (gpu_ip(src), 4), (gpu_ip(dst), 4),
                          (np.full(n, UDP_PROTO), 1)]) ^ np.uint32(0xFFFFFFFF)
    for i in range(n):
        want = _switch_hash(np.uint32(prefix[i]), np.int64(ports[row[i]]), np.int64(rot[i]),
                            CRC32_TABLE)
        assert int(split[i]) == int(want)


def test_a_kept_steering_table_steers_as_a_fresh_one() -> None:
    """A table kept across calls (the controller's) gives the same ports and rules as
    ``steer`` with nothing cached, and caches exactly what :func:`constraints` gives."""
    from fabricpilot.controller.entropy import SteeringTable

    ctx = _ctx(per_switch=False, rules=32)
    view = fabric_view(ctx)
    cache: dict = {}
    table = SteeringTable(view, cache)
    rng = np.random.default_rng(11)
    for _ in range(3):  # later calls meet switch paths the table already holds
        reqs = []
        for g in rng.choice(128, 30, replace=False).tolist():
            h = int((g + int(rng.integers(1, 128))) % 128)
            cs = _inter_pod_candidates(ctx, g, h)
            reqs += [SteerRequest(g, h, p, int(rng.integers(1 << 16))) for p in cs[:5]]
        assert steer(view, reqs, table=table) == steer(view, reqs)
    for q in reqs:
        assert cache[q.path[1:-1]] == constraints(view, q.dst, q.path)


def test_a_table_derives_the_constraints_of_many_new_paths_at_once() -> None:
    """A table with no cache derives the constraints of a call's new switch paths together
    (compiled over the view's arrays): path by path, they are what :func:`constraints`
    gives (switch, group size, wanted member), including a link outside its switch's group
    (wanted member -1: only a rule takes it) and a path met twice in one call."""
    from fabricpilot.controller.entropy import SteeringTable

    ctx = _ctx(per_switch=True)
    view = fabric_view(ctx)
    paths, dst = _paths_and_detour(ctx, 9, 5, 17, 6)
    detour = paths[-1]
    paths.append(detour)
    dst.append(4)
    table = SteeringTable(view)
    ids = table.intern(paths, dst).tolist()
    assert ids[-1] == ids[-2] and len(table.ids) == len(set(ids))
    ptr, _, _, size, want = table._flat()
    c_sw = table._c_sw.values
    for m, p, d in zip(ids, paths, dst, strict=True):
        got = [(table._sw_names[int(c_sw[c])], int(size[c]), int(want[c]))
               for c in range(int(ptr[m]), int(ptr[m + 1]))]
        assert got == [(sw, len(grp), w) for sw, grp, w in constraints(view, d, p)]
    assert ("agg0_0", 1, -1) in [(table._sw_names[int(c_sw[c])], int(size[c]), int(want[c]))
                                 for c in range(int(ptr[ids[-1]]), int(ptr[ids[-1] + 1]))]
    # a second call adds only the switch paths it has not met
    n = len(table.ids)
    assert table.intern(paths[:3], dst[:3]).tolist() == ids[:3] and len(table.ids) == n
    # a link the view lacks: named (the path-by-path way), and nothing of the call is kept
    bad = (detour[0], 10**6, detour[-1])
    with pytest.raises(KeyError, match=str(10**6)):
        table.intern([paths[0], bad], [dst[0], 4])
    assert len(table.ids) == n and (10**6,) not in table.ids


def test_the_compiled_constraints_look_a_link_up_as_scanning_its_group_would() -> None:
    """A link member of one group only is found at its place there without a scan: the
    constraints of many paths are the same with the lookup and with every link scanned for
    (a fat-tree's paths, a detour through a group that lacks the link among them)."""
    from fabricpilot.controller.entropy import SteeringTable, _path_constraints, _path_rows

    ctx = _ctx(per_switch=True)
    view = fabric_view(ctx)
    paths, dst = _paths_and_detour(ctx, 5, 7, 29, 8)
    compiled = SteeringTable(view)._compiled_view()
    assert compiled is not None
    link_sw, grp, g_ptr, g_links, _, l_grp, l_pos = compiled
    assert (l_grp >= 0).sum() > 0
    for g in range(len(g_ptr) - 1):  # (the lookup names the link's place in its group)
        members = g_links[g_ptr[g]:g_ptr[g + 1]]
        for i, lk in enumerate(members.tolist()):
            assert l_grp[lk] in (g, -1) and (l_grp[lk] == -1 or l_pos[lk] == i)
    rows = _path_rows(paths, np.array(dst), compiled)
    assert rows is not None
    fast = _path_constraints(*rows, link_sw, grp, g_ptr, g_links, l_grp, l_pos)
    scan = _path_constraints(*rows, link_sw, grp, g_ptr, g_links, np.full_like(l_grp, -1),
                             l_pos)
    assert all(a.tolist() == b.tolist() for a, b in zip(fast, scan, strict=True))
    assert int(fast[0].sum()) > len(paths)


def test_qp_search_starts_spread_each_keys_qps() -> None:
    # QP i of a key of GPUs (a, b) starts its port search at (a * 1_000_003 + b) * 64 + i
    from fabricpilot.controller.entropy import qp_search_starts

    rng = np.random.default_rng(4)
    pairs = rng.integers(0, 8192, (200, 2))
    n_per_key = rng.integers(0, 17, 200)
    src, dst, start = qp_search_starts(pairs, n_per_key)
    want = [((int(a) * 1_000_003 + int(b)) * 64 + i, int(a), int(b))
            for (a, b), n in zip(pairs, n_per_key, strict=True) for i in range(int(n))]
    assert list(zip(start.tolist(), src.tolist(), dst.tolist(), strict=True)) == want
    with pytest.raises(ValueError, match=r"one \(source, destination\) row per key"):
        qp_search_starts(pairs[:3], n_per_key)


@pytest.mark.parametrize(("per_switch", "entropy", "rules"),
                         [(True, True, 4096), (False, True, 32), (True, False, 20)])
def test_a_whole_plan_is_steered_as_interning_its_switch_paths_would(
        monkeypatch, per_switch: bool, entropy: bool, rules: int) -> None:
    """A whole plan's hash decisions derived from its paths at once (no switch path
    interned) give every QP the port and the rules that interning each switch path gives
    (a view steering cannot read as arrays): with per-switch seeds, with one seed for every
    switch (tiers polarised: rules fill the gap, 32 a switch) and without NIC entropy
    (the hash path alone needs no rule, 20 a switch), where some paths do not fit the
    rule budget and follow their hash; in a re-plan of the same jobs, and when the job
    changes and is planned by itself (the paths it keeps keep their ports)."""
    from fabricpilot.controller.entropy import SteeringTable

    def installed(ctl: Controller) -> dict:
        return {k: (s.paths, s.ports, s.rules) for k, s in ctl._installed.items()}

    got = []
    for arrays in (True, False):
        if not arrays:
            monkeypatch.setattr(SteeringTable, "steer_paths", lambda *a, **k: None)
        _, ctl = _alltoall_controller(_ctx(per_switch, entropy, rules))
        first = ctl.plan()
        once = installed(ctl)
        ctl.plan(background={})
        # the job changed, planned by itself: the paths it keeps keep their ports, the
        # others are steered as a plan's (from their paths at once, or interned)
        job = ctl.intents["a2a"]
        ctl.declare(dataclasses.replace(job, calls=(CommCall("alltoall", 96 << 20, 1000.0, 0),
                                                   CommCall("allreduce", 1 << 30, 1000.0, 0))))
        ctl.plan_jobs({"a2a"})
        got.append((once, installed(ctl), first.pinned, first.unpinned))
    assert got[0] == got[1]
    once, _, pinned, unpinned = got[0]
    assert len(once) == 64 * 63
    # the cases differ as described: with per-switch seeds and entropy, no rule and no
    # path left to its hash; else some of each (the budgets are too small for all)
    assert (pinned > 0) == (unpinned > 0) == (not per_switch or not entropy)


@pytest.mark.parametrize(("per_switch", "rules"), [(True, 4096), (False, 32)])
def test_a_plans_port_search_in_parts_finds_the_ports_of_one_pass(
        monkeypatch, per_switch: bool, rules: int) -> None:
    """A large plan's hash constraints and port search run in parts that this thread and
    the planner's worker thread take in turn: the same ports, rules and paths as one pass
    (a plan past the threshold made small here), with per-switch seeds and with one seed
    for every switch (some QPs missing their path: rules and paths left to the hash)."""
    from fabricpilot.controller import entropy, planner

    parted = []

    def counted(fn, n):  # type: ignore[no-untyped-def]
        calls = []  # (the rows of each pass: one, or the parts)

        def rows(lo, hi):  # type: ignore[no-untyped-def]
            calls.append((lo, hi))
            return fn(lo, hi)

        out = planner.in_parts(rows, n)
        calls.sort()  # (each row in one part: the parts tile 0:n)
        assert calls[0][0] == 0 and calls[-1][1] == n
        assert all(a[1] == b[0] for a, b in pairwise(calls))
        parted.append(len(calls) > 1)
        return out

    monkeypatch.setattr(entropy, "in_parts", counted)
    monkeypatch.setattr(planner, "_PART_ROWS", 1000)
    got = []
    for rows in (1 << 30, 64):
        monkeypatch.setattr(planner, "_BACKGROUND_ROWS", rows)
        _, ctl = _alltoall_controller(_ctx(per_switch, True, rules))
        report = ctl.plan()
        got.append(({k: (s.paths, s.ports, s.rules) for k, s in ctl._installed.items()},
                    report.pinned, report.unpinned))
    assert got[0] == got[1] and len(got[0][0]) == 64 * 63
    assert parted[0] is False and parted[-1] is True
    assert (got[0][1] > 0) == (not per_switch)


@pytest.mark.parametrize(("per_switch", "entropy", "rules"),
                         [(True, True, 4096), (False, True, 32), (True, False, 20)])
def test_a_replan_steers_only_the_pairs_whose_paths_moved(
        monkeypatch, per_switch: bool, entropy: bool, rules: int) -> None:
    """A whole re-plan keeps the installed set of every pair whose planned paths it holds
    as steering made it (no rule, none left to the hash; the same weights and rate cap):
    the QPs keep their ports and nothing is sent for them. Only the other pairs are
    steered, and the sets are those a controller planning from scratch with the same
    background installs (ports, rules and all), in each of the three configurations."""
    from fabricpilot.controller.entropy import SteeringTable

    def installed(ctl: Controller) -> dict:
        return {k: (s.paths, s.weights, s.ports, s.rules, s.rate_cap_gbps)
                for k, s in ctl._installed.items()}

    def fresh(background: dict[int, float]) -> dict:
        _, other = _alltoall_controller(_ctx(per_switch, entropy, rules))
        other.plan(background=background)
        return installed(other)

    steered: list[int] = []
    real = SteeringTable.steer_paths

    def spy(self, src, dst, start, paths, tries, **kw):  # type: ignore[no-untyped-def]
        steered.append(len(paths))
        return real(self, src, dst, start, paths, tries, **kw)

    monkeypatch.setattr(SteeringTable, "steer_paths", spy)
    _, ctl = _alltoall_controller(_ctx(per_switch, entropy, rules))
    first = ctl.plan(background={})
    before = dict(ctl._installed)
    as_steered = {k for k, s in before.items() if not any(s.rules) and k not in first.spilled}
    # (the configurations as described: rules and QPs left to the hash but with per-switch
    # seeds and NIC entropy; some sets kept in every one)
    assert (len(as_steered) == len(before)) == (per_switch and entropy) and as_steered
    # the same jobs on the same links: every set as steering made it kept, none sent
    steered.clear()
    again = ctl.plan(background={})
    assert again.installed == 0
    assert all(ctl._installed[k] is before[k] for k in as_steered)
    if per_switch and entropy:
        assert steered == []  # (every set kept: nothing left to steer)
    assert installed(ctl) == fresh({})
    # a fabric link under undeclared load: the pairs on it move; the QPs of pairs whose
    # paths did not change keep their sets, and the rest is as steering from scratch
    on = Counter(lk for s in before.values() for p in s.paths for lk in p[1:-1])
    hot = on.most_common(1)[0][0]
    background = {hot: 0.9 * ctl.view.links[hot].capacity_gbps}
    steered.clear()
    ctl.plan(background=background)
    moved = [k for k, s in ctl._installed.items() if s is not before.get(k)]
    assert 0 < len(moved) < len(before)
    if per_switch and entropy:  # (one steering pass: of the moved pairs' QPs alone)
        assert steered == [sum(len(ctl._installed[k].paths) for k in moved)]
    assert installed(ctl) == fresh(background)


def test_a_replan_that_keeps_sets_still_withdraws_the_pairs_it_drops(monkeypatch) -> None:
    """A job withdrawn, then a whole re-plan: the withdrawn job's pairs are withdrawn from
    the data plane and the controller's records, the other job's sets are kept where its
    paths stay (only the others are sent), and the sets are those of a controller that
    planned that job alone from scratch; the job declared again, those of one that planned
    both."""

    def installed(ctl: Controller) -> dict:
        return {k: (s.paths, s.weights, s.ports, s.rules) for k, s in ctl._installed.items()}

    def fresh(*intents: Intent) -> dict:
        _, other = _alltoall_controller(ctx)
        for i in intents:
            other.declare(i)
        other.plan(background={})
        return installed(other)

    ctx = _ctx(per_switch=True)
    twin, ctl = _alltoall_controller(ctx)
    ring = Intent("ring", "t", tuple(range(1, 128, 8)),
                  (CommCall("allreduce", 256 << 20, 1000.0, 0),))
    ctl.declare(ring)
    ctl.plan(background={})
    before = dict(ctl._installed)
    ring_keys = sorted(k for k in before if k.startswith("ring:"))
    assert len(ring_keys) == 16
    removed: list[str] = []
    real = twin.remove
    monkeypatch.setattr(twin, "remove", lambda keys: removed.extend(keys) or real(keys))
    ctl.withdraw("ring")
    rep = ctl.plan(background={})
    assert sorted(removed) == ring_keys
    assert installed(ctl) == fresh()
    same = [k for k, s in ctl._installed.items() if s is before[k]]
    assert 0 < len(same) < len(ctl._installed)
    assert rep.installed == len(ctl._installed) - len(same)
    ctl.declare(ring)
    ctl.plan(background={})
    assert installed(ctl) == fresh(ring)


def test_a_replan_steers_again_the_sets_steering_did_not_make() -> None:
    """A set installed since the last whole plan by other means (a heal keeps the ports of
    the paths a pair still has, wherever they sit in its set) may hold a port that steering
    would not give: here another port whose hash takes the same path. The next whole plan
    keeps no such set: its sets are those of a controller planning from scratch, and a
    heal after it leaves no path on the dead link."""

    def installed(ctl: Controller) -> dict:
        return {k: (s.paths, s.weights, s.ports, s.rules) for k, s in ctl._installed.items()}

    ctx = _ctx(per_switch=True)
    _, ctl = _alltoall_controller(ctx)
    ctl.plan(background={})
    scratch = installed(ctl)
    key = next(k for k, s in ctl._installed.items() if len(s.paths[0]) == 6)
    old = ctl._installed[key]
    a, b = pair_of_key(key)
    other = next(p for p in range(49152, 65536)
                 if p != old.ports[0] and _twin_path(ctx, a, b, p) == old.paths[0])
    ctl._record([old._replace(ports=(other,))])  # (as a heal that kept a QP's port)
    again = ctl.plan(background={})
    assert installed(ctl) == scratch and again.installed == 1  # (that set, re-steered)
    # a heal, then a whole plan: again as from scratch with the link down
    down = next(lk for lk in old.paths[0][1:-1])
    assert ctl.on_links_changed([down], [])
    ctl.plan(background={})
    _, fresh = _alltoall_controller(ctx)
    fresh.on_links_changed([down], [])
    fresh.plan(background={})
    assert installed(ctl) == installed(fresh)
    assert all(down not in p for s in ctl._installed.values() for p in s.paths)


def test_a_whole_plan_after_a_heal_keeps_the_sets_the_heal_left(monkeypatch) -> None:
    """A heal changes the sets of the pairs on the dead cable, and the installed sets, still
    one batch, know which. The next whole plan steers those again (and the pairs whose
    planned paths changed), keeps the others as they are, and sends only the sets that
    differ from the installed ones: the sets of a controller that planned from scratch
    with the cable down."""
    from fabricpilot.controller import core

    def installed(ctl: Controller) -> dict:
        return {k: (s.paths, s.weights, s.ports, s.rules) for k, s in ctl._installed.items()}

    ctx = _ctx(per_switch=True)
    _, ctl = _alltoall_controller(ctx)
    ctl.plan(background={})
    load, view = ctl.current.link_load_gbps, ctl.view
    hot = max((lk for lk, li in view.links.items() if li.kind == "fabric"),
              key=lambda lk: (load.get(lk, 0.0), -lk))
    cable = [hot, view.link_between(view.links[hot].dst, view.links[hot].src)]
    assert ctl.on_links_changed(cable, []).installed > 0
    assert isinstance(ctl._installed, BatchMap)
    healed = set(ctl._installed.changed_keys())
    held = installed(ctl)
    assert healed and all(cable[0] not in p for k in healed for p in held[k][0])
    compared: list[set[str]] = []
    real = core._changed_rows
    monkeypatch.setattr(core, "_changed_rows", lambda sets, idx, at, old: compared.append(
        {sets.keys[i] for i in idx.tolist()}) or real(sets, idx, at, old))
    rep = ctl.plan(background={})
    (steered,) = compared  # (the sets made anew: only those are compared and sent)
    _, fresh = _alltoall_controller(ctx)
    fresh.on_links_changed(cable, [])
    fresh.plan(background={})
    now = installed(ctl)
    assert now == installed(fresh)
    assert healed <= steered and len(steered) < len(held)
    assert all(now[k] == held[k] for k in set(held) - steered)
    assert rep.installed == sum(now[k] != held.get(k) for k in now) > 0


def test_a_plan_interns_the_switch_paths_of_its_tuples_once(monkeypatch) -> None:
    """On a view steering cannot read as arrays, steering a whole plan interns each switch
    path its pairs take once (the pairs of a leaf pair share them), not every path, and a
    re-plan none; yet every path gets the id of its own switch path, as interning it alone
    would give."""
    from fabricpilot.controller import core
    from fabricpilot.controller.entropy import SteeringTable

    ctx = _ctx(per_switch=True)
    _, ctl = _alltoall_controller(ctx)
    monkeypatch.setattr(SteeringTable, "steer_paths", lambda *a, **k: None)
    seen: dict = {}
    interned: list[int] = []
    real_ids, real_intern = core._switch_path_ids, SteeringTable._intern

    def spy_ids(table, parts, paths, dst, n_per_key):  # type: ignore[no-untyped-def]
        ids = real_ids(table, parts, paths, dst, n_per_key)
        seen.update(table=table, parts=parts, paths=list(paths), ids=ids)
        return ids

    def spy_intern(self, switch_paths, n, *args):  # type: ignore[no-untyped-def]
        interned.append(n)
        return real_intern(self, switch_paths, n, *args)

    monkeypatch.setattr(core, "_switch_path_ids", spy_ids)
    monkeypatch.setattr(SteeringTable, "_intern", spy_intern)
    ctl.plan()
    paths, ids = seen["paths"], seen["ids"].tolist()
    parts = seen["parts"]
    assert parts is not None and parts.plain.all()
    by_id = {i: sw for sw, i in seen["table"].ids.items()}
    assert [by_id[i] for i in ids] == [p[1:-1] for p in paths]
    # 64 GPUs: 4032 pairs, one QP each (an AlltoAll); each switch path a pair takes
    # interned once (fewer than the paths), no candidate no pair takes
    assert len({p[:1] + p[-1:] for p in paths}) == len(paths) == 64 * 63
    assert sum(interned) == len({p[1:-1] for p in paths}) < len(paths)
    interned.clear()
    ctl.plan(background={})  # (the same jobs again)
    assert interned == [] and seen["ids"].tolist() == ids


def test_qps_left_to_their_hash_leave_a_failed_link_and_are_counted() -> None:
    """A polarised fat tree with 64 rules per switch: QPs whose planned path needed a rule
    no switch had room for follow the hash of their port. When a link their hash path
    crosses fails, the heal moves the planned paths off it and gives those QPs a port whose
    hash avoids it: no installed path crosses the dead link, and every QP not pinned still
    goes exactly where the twin's switches hash its port."""
    ctx = _ctx(per_switch=False, rules=32)
    twin, ctl = _alltoall_controller(ctx)
    ctl.plan()
    assert ctl.left_to_hash  # the tables are full: some QPs follow their hash
    view = fabric_view(ctx)
    # a fabric link that a QP left to its hash crosses (both directions fail)
    hashed = [p for k in ctl.left_to_hash for p, rl in zip(
        ctl._installed[k].paths, ctl._installed[k].rules, strict=True) if not rl]
    link = next(lk for p in hashed for lk in p[1:-1])
    back = view.link_between(view.links[link].dst, view.links[link].src)
    ctl.on_links_changed([link, back], [])
    dead = {link, back}
    for rule, _ in twin._rules.values():
        a, b = (int(x) for x in rule.key.split(":")[1].split("->"))
        for path, port, pinned in zip(rule.paths, rule.ports, rule.rules, strict=True):
            assert dead.isdisjoint(path), rule.key
            if not pinned:
                assert path == _twin_path(ctx, a, b, port), rule.key
    assert {k: r for k, (r, _) in twin._rules.items()} == ctl._installed
    # what the run reports: the QPs of the sets held now, each counted once
    twin.controller = ctl  # (as a run attaches it)
    stats = twin.stats()
    total = sum(len(r.paths) for r, _ in twin._rules.values())
    pinned = sum(1 for r, _ in twin._rules.values() for rl in r.rules if rl)
    assert stats["qps_pinned"] == pinned
    assert stats["qps_unpinned"] == sum(ctl.left_to_hash.values()) > 0
    assert stats["qps_steered"] + stats["qps_pinned"] + stats["qps_unpinned"] == total


@pytest.mark.parametrize("seed", range(6))
def test_the_indexed_port_search_finds_the_ports_the_scan_finds(seed: int) -> None:
    # random requests over random constraints (several per switch path, rotated or not,
    # group sizes powers of two or not, some wanted members out of range, few or many
    # tries, starts past the port range): the search through the ports indexed by hash
    # value gives the port and misses the port-by-port scan gives, request by request
    from fabricpilot.controller import entropy

    rng = np.random.default_rng(seed)
    for _ in range(40):
        n_ports = int(rng.choice([1, 2, 7, 64, 300, 1024]))
        p_term = rng.integers(0, 2**32, n_ports, dtype=np.uint64).astype(np.uint32)
        n_c = rng.integers(0, 4, int(rng.integers(1, 6)))
        ptr = np.concatenate(([0], np.cumsum(n_c))).astype(np.int64)
        size = rng.choice([1, 2, 3, 4, 8, 6, 16, 64, 5000, 8192], int(ptr[-1])).astype(np.int64)
        rot = rng.choice([0, 0, 3, 17, 31], len(size)).astype(np.int64)
        want = np.array([int(rng.integers(-1, s + 1)) if rng.random() < 0.2
                         else int(rng.integers(0, s)) for s in size.tolist()], np.int64)
        term = rng.integers(0, 2**32, len(size), dtype=np.uint64).astype(np.uint32)
        a_term, b_term = (rng.integers(0, 2**32, 5, dtype=np.uint64).astype(np.uint32)
                          for _ in range(2))
        src, dst = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
        start = rng.integers(0, 5 * n_ports, 200)
        mid = rng.integers(0, len(n_c), 200)
        tries = int(rng.choice([1, 3, 50, 4096]))
        args = (src, dst, start, mid, ptr, term, rot, size, want, a_term, b_term, p_term, tries)
        holder = type("Ports", (), {})()
        holder.port_term, holder._port_index = p_term, {}
        tables = entropy.SteeringTable._port_tables(holder, rot, size)  # type: ignore[arg-type]
        scan = entropy._search_terms(*args)
        indexed = entropy._search_indexed(*args, *tables)
        assert scan[0].tolist() == indexed[0].tolist()
        assert scan[1].tolist() == indexed[1].tolist()


def test_the_port_index_lists_each_hash_value_s_ports_in_order() -> None:
    # by hand: terms 5, 2, 7, 4 at a group of 4 (no rotation): values 1, 2, 3, 0; rotated
    # by one bit, term 2 (0b10) gives 1 and term 4 (0b100) gives 2 (the low bits after)
    from fabricpilot.controller.entropy import _port_index

    order, start = _port_index(np.array([5, 2, 7, 4], np.uint32), 0, 4)
    assert [order[start[v]:start[v + 1]].tolist() for v in range(4)] == [[3], [0], [1], [2]]
    order, start = _port_index(np.array([2, 4], np.uint32), 1, 4)
    assert [order[start[v]:start[v + 1]].tolist() for v in range(4)] == [[], [0], [1], []]


def test_each_constraint_finds_the_table_of_its_rotation_and_size() -> None:
    # random rotations and group sizes against the codes sorted by numpy: tables numbered
    # by code, -1 for a size that is not a power of two up to the largest indexed
    from fabricpilot.controller.entropy import _INDEX_MAX_SIZE, _table_of

    rng = np.random.default_rng(4)
    rot = rng.integers(0, 32, 5000)
    size = rng.choice([0, 1, 2, 3, 4, 6, 64, 4096, 8192, 100], 5000)
    tab, combos = _table_of(rot, size, _INDEX_MAX_SIZE)
    ok = (size > 0) & ((size & (size - 1)) == 0) & (size <= _INDEX_MAX_SIZE)
    codes = rot * (_INDEX_MAX_SIZE + 1) + size
    want_combos, inv = np.unique(codes[ok], return_inverse=True)
    assert combos.tolist() == want_combos.tolist()
    assert tab[ok].tolist() == inv.tolist() and (tab[~ok] == -1).all()
