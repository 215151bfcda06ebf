"""sla-aware: L1 / L2 jobs never get paths outside their scope, an impossible SLA is reported
(never silently served by a worse path), and jobs without an SLA are left to the switches."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import p2p_job
from fabricpilot.balancing import PolicyContext, make_policy
from fabricpilot.balancing.sla_aware import SlaAware
from fabricpilot.dataplane import Engine
from fabricpilot.topology import compile_topology, leaf_spine
from fabricpilot.workload.jobs import JobSpec


def p2p(name: str, pairs: list[tuple[int, int]], sla_us: float | None) -> JobSpec:
    return p2p_job(name, pairs, 1 << 20, sla_us=sla_us)


def test_levels_scope_paths_and_impossible_slas_are_reported() -> None:
    # 4 leaves of 4 single-GPU hosts, 4 spines
    ct = compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=4,
                                     rail_optimized=False))
    jobs = [
        p2p("l1-local", [(0, 1), (2, 3)], 30.0),      # same leaf: one switch, L1 is possible
        p2p("l1-remote", [(4, 8)], 30.0),             # other leaf: needs a spine, L1 is not
        p2p("l2-remote", [(5, 9)], 80.0),             # L2 may not cross a spine either
        p2p("l3", [(6, 10), (7, 11)], 500.0),         # any path
        p2p("none", [(12, 0)], None),                 # no SLA: switch-local adaptive routing
    ]
    pol = make_policy("sla-aware", PolicyContext(ct, 1, 600))
    assert isinstance(pol, SlaAware)
    pol.attach_jobs(jobs)
    out = Engine(ct, pol, jobs).run()
    assert len(out.collectives) == len(jobs)          # every job still completes
    names = [ct.link_name(i) for i in range(ct.n_links)]
    tier = {ct.node_names[int(ct.switch_node[s])]: int(ct.switch_tier[s])
            for s in range(len(ct.switch_node))}
    for (j, _src, _dst), links in pol.chosen.items():
        switches = {names[lk].split("->")[1] for lk in links[:-1]}
        if jobs[j].sla_us is not None and jobs[j].sla_us < 50:
            assert len(switches) == 1                 # L1: a single switch
        elif jobs[j].sla_us is not None and jobs[j].sla_us <= 100:
            assert all(tier[sw] < 2 for sw in switches)  # L2: no spine
    placed = {pol.job_names[j] for j, _, _ in pol.chosen}
    assert placed == {"l1-local", "l3"}
    # the two remote L1 / L2 pairs are reported, each with the level and why
    report = pol.report()
    assert len(report) == 2
    assert report[0].startswith("l1-remote: gpu4 -> gpu8: L1")
    assert report[1].startswith("l2-remote: gpu5 -> gpu9: L2")
    assert "spine" in report[1]


def test_the_cli_reports_unmet_slas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    import yaml

    data = {
        "name": "sla", "seed": 1, "policies": ["sla-aware"],
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "rail_optimized": False, "nics_per_leaf": 4},
        "jobs": [{"name": "tight", "gpus": 8, "placement": "contiguous", "sla_us": 20,
                  "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    res = subprocess.run([sys.executable, "-m", "fabricpilot", "run", str(path), "--policy",
                          "sla-aware", "--json", str(tmp_path / "s.json")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # (one job: its ring pairs across leaves are several lines of sla_unmet, one job)
    assert "sla-aware: 1 job with an SLA no path meets, e.g. tight: " in res.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["sla_unmet"] and all(s.startswith("tight: ") for s in summary["sla_unmet"])


def test_the_sla_levels_example() -> None:
    # examples/sla_levels.yaml: the L1 ring at ideal; the L2 ring across two leaves told
    # (every path between leaves crosses a spine) by both policies, and near ideal all the
    # same: a spine can carry it while the training jobs share the other three (its
    # flows adapt under sla-aware; task-aware keeps that room for them in its plan); the
    # two L3 all-to-alls held to 80 % of their NICs while the L1 / L2 jobs run: 80 % of
    # ideal's busbw
    from pathlib import Path

    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "examples" / "sla_levels.yaml"
    prep = prepare(load_scenario(path), str(path))
    ideal = run_policy(prep, "ideal")
    for policy in ("sla-aware", "task-aware"):
        run = run_policy(prep, policy)
        ratio = {j.name: run.mean_busbw_GBps(j.name) / ideal.mean_busbw_GBps(j.name)
                 for j in prep.jobs}
        assert ratio["inference"] == pytest.approx(1.0, abs=0.002)
        assert ratio["retrieval"] >= 0.95
        assert ratio["train-a"] == pytest.approx(0.8, abs=0.005)
        assert ratio["train-b"] == pytest.approx(0.8, abs=0.005)
        assert run.sla_unmet and all(line.startswith("retrieval: ") for line in run.sla_unmet)
        if policy == "task-aware":  # (its ring's two pairs, gpu4 -> gpu8 and back)
            assert run.controller is not None and run.controller["pairs_room_kept"] == 2


def test_an_l3_sender_is_held_on_its_nic_not_on_nvlink() -> None:
    """Beside an L1 job, an L3 job's sender is held to 80 % of its 400G NIC, shared by
    what it sends through it. GPU 0 sends 64 MiB to its host's GPU 1 (NVLink) and 64 MiB to
    GPU 2 on another host: only the second crosses the NIC, so it runs at 320 Gb/s, and the
    job takes 1 / 0.8 = 1.25 x as long as with no L1 job (counting the NVLink transfer as
    a NIC peer held it to 160 Gb/s: 2.5 x)."""
    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=2, nics_per_leaf=4,
                                     rail_optimized=True))
    assert ct.gpu_host[0] == ct.gpu_host[1] != ct.gpu_host[2]
    assert ct.gpu_leaf[4] == ct.gpu_leaf[6]  # (the L1 pair: one switch)
    assert ct.gpu_leaf[4] != ct.gpu_leaf[7] and ct.gpu_host[4] != ct.gpu_host[7]
    took = []
    for l1_pair in (None, (4, 6), (4, 7)):
        jobs = [p2p_job("l3", [(0, 1), (0, 2)], 64 << 20, sla_us=500.0)]
        if l1_pair is not None:
            jobs.append(p2p_job("l1", [l1_pair], 1 << 10, sla_us=30.0))
        pol = make_policy("sla-aware", PolicyContext(ct, 1, 600))
        pol.attach_jobs(jobs)
        out = Engine(ct, pol, jobs).run()
        took.append(next(c.end_ns - c.start_ns for c in out.collectives if c.job == "l3"))
    assert took[1] / took[0] == pytest.approx(1.25, rel=5e-3)
    # an L1 pair across leaves (every path crosses a spine) is served by no path: it is
    # reported, and holds no one
    assert took[2] == took[0]
    assert isinstance(pol, SlaAware) and pol.report()[0].startswith("l1: gpu4 -> gpu7: L1")


@pytest.mark.parametrize(("switch_ns", "sla_us", "met"), [
    (10_000, 8.0, False),   # 0.2 us of links + 10 us in the leaf = 10.2 us > 8
    (10_000, 12.0, True),   # 10.2 <= 12
    (100, 0.5, True),       # 0.2 + 0.1 = 0.3 us <= 0.5 (0.8 us at the default 600 ns)
    (100, 0.25, False),     # 0.3 > 0.25
])
def test_an_sla_is_weighed_with_the_fabrics_own_switch_latency(
        switch_ns: int, sla_us: float, met: bool) -> None:
    """Both SLA policies count the scenario's switch latency, not a default: an L1 pair
    under one leaf (two 100 ns links, one switch) takes 0.2 us + one switch latency."""
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.intents import CommCall, Intent

    ct = compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=4,
                                     rail_optimized=False))
    assert ct.gpu_leaf[0] == ct.gpu_leaf[1]
    pol = make_policy("sla-aware", PolicyContext(ct, 1, switch_ns))
    assert isinstance(pol, SlaAware)
    jobs = [p2p("l1", [(0, 1)], sla_us)]
    pol.attach_jobs(jobs)
    Engine(ct, pol, jobs).run()
    assert (pol.report() == []) is met
    if not met:
        assert f"best is {0.2 + switch_ns / 1000:g} us" in pol.report()[0]
    ctl = Controller(TaskAware(PolicyContext(ct, 1, switch_ns)))
    ctl.declare(Intent("l1", "t", (0, 1), (CommCall("broadcast", 1 << 20, sla_us, 0),)))
    ctl.plan()
    assert ("l1" not in ctl.sla_unmet) is met
    if not met:
        assert f"the fastest takes {0.2 + switch_ns / 1000:.3g} us" in ctl.sla_unmet["l1"]


def test_l2_crosses_tors_within_a_pod_of_a_fat_tree_but_no_core() -> None:
    """k = 4 fat-tree: GPUs 0 and 2 sit under the two edge switches (ToRs) of pod 0, joined
    by the pod's aggregation switches (tier 2): an L2 job between them is served, on a
    path through an aggregation switch; GPUs 0 and 4 are in different pods, joined only
    through a core (tier 3, the spine of this fabric): an L2 job there is told so, by both
    SLA policies."""
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.intents import CommCall, Intent
    from fabricpilot.topology import fat_tree

    ct = compile_topology(fat_tree(k=4))
    name = ct.node_names
    edge = {g: name[int(ct.switch_node[ct.gpu_leaf[g]])] for g in (0, 2, 4)}
    assert edge == {0: "edge0_0", 2: "edge0_1", 4: "edge1_0"}
    jobs = [p2p("pod", [(0, 2)], 80.0), p2p("cross", [(1, 4)], 80.0)]
    pol = make_policy("sla-aware", PolicyContext(ct, 1, 600))
    assert isinstance(pol, SlaAware)
    pol.attach_jobs(jobs)
    Engine(ct, pol, jobs).run()
    (links,) = [lk for (j, _, _), lk in pol.chosen.items() if j == 0]
    hops = [ct.link_name(lk).split("->")[1] for lk in links[:-1]]
    assert hops[0] == "edge0_0" and hops[1].startswith("agg0_") and hops[2] == "edge0_1"
    (why,) = pol.report()
    assert why.startswith("cross: gpu1 -> gpu4: L2") and "(tier 3)" in why
    ctl = Controller(TaskAware(PolicyContext(ct, 1, 600)))
    for task, pair in (("pod", (0, 2)), ("cross", (1, 4))):
        ctl.declare(Intent(task, "t", pair, (CommCall("broadcast", 1 << 20, 80.0, 0),)))
    ctl.plan()
    assert set(ctl.sla_unmet) == {"cross"}
    nodes = {ctl.view.links[lk].dst for ps in ctl._installed.values() for p in ps.paths
             for lk in p}
    assert any(n.startswith("agg0_") for n in nodes)
    assert not any(n.startswith("core") for n in nodes)


def test_a_link_seen_down_is_left_out_of_the_ranking(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """k = 4 fat-tree, an L2 job between the two edges of pod 0 (1 ms of compute between
    its 16 MB AllReduces). edge0_0 <-> agg0_0, on its ranked path, goes down at 600 us,
    between two collectives, seen 100 us later, for 50 ms; routing converges only after
    200 ms. The next collective's flows are ranked on what is left (through agg0_1: still
    in the pod) and the job loses nothing: every iteration as long as under `ideal`. (The
    ranking once kept the dead path: the next collective stalled until the repair.) Back
    up, the link is ranked again."""
    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import load_scenario

    path = tmp_path / "ft.yaml"
    path.write_text("""
name: ft-l2-fault
seed: 1
topology: {kind: fat_tree, k: 4, gpus_per_host: 1}
jobs:
  - {name: pod, gpus: 2, placement: explicit, gpu_ids: [0, 2], sla_us: 80, compute_ns: 1ms,
     iterations: 4, collectives: [{op: allreduce, size_bytes: 16MB}]}
faults:
  events: [{kind: link_down, link: edge0_0-agg0_0, at_ns: 600us, until_ns: 50ms}]
""")
    prep = prepare(load_scenario(path), str(path))
    ideal, sla = run_policy(prep, "ideal"), run_policy(prep, "sla-aware")
    assert sla.mean_busbw_GBps("pod") == pytest.approx(ideal.mean_busbw_GBps("pod"), rel=1e-6)
    (fault,) = sla.faults
    assert fault["job_stall_us"] == {} and fault["bytes_lost"] == 0
    # the ranking itself: agg0_0 first while it is up, agg0_1 while edge0_0's link to it
    # is down (ties go by node names), agg0_0 again once it is back
    ct = prep.topology
    pol = make_policy("sla-aware", PolicyContext(ct, 1, 600))
    assert isinstance(pol, SlaAware)
    pol.attach_jobs([p2p("pod", [(0, 2)], 80.0)])
    names = {ct.link_name(i): i for i in range(ct.n_links)}
    dead = [names["edge0_0->agg0_0"], names["agg0_0->edge0_0"]]

    def via() -> str:
        (links,) = [pol._ranked(0, 0, 2, None)]
        assert links is not None
        return ct.link_name(links[1]).split("->")[1]

    assert via() == "agg0_0"
    pol.on_links_changed(0.0, dead, [])
    assert via() == "agg0_1"
    moved = pol.repath(np.array([0]), np.array([0]), np.array([2]), np.array([0]))
    assert [ct.link_name(lk).split("->")[1] for lk in moved[0] if lk >= 0][1] == "agg0_1"
    pol.on_links_changed(1.0, [], dead)
    assert via() == "agg0_0"
