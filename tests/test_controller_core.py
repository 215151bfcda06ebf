"""The controller against a fake data plane (no simulator): intents in, path sets out; and the
twin's task-aware policy on the default scenario."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fabricpilot.controller.core import Controller, pattern_pairs, rule_key
from fabricpilot.controller.intents import CommCall, Intent
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.southbound import FabricView, LinkInfo, PathSet, PortDelta


class FakeDataPlane:
    """Two leaves (two GPUs each) and two spines, 400 Gb/s everywhere; records what it is
    told to install."""

    def __init__(self) -> None:
        links: list[LinkInfo] = []
        kind = {f"gpu{i}": "gpu" for i in range(4)} | {
            n: "switch" for n in ("leaf0", "leaf1", "spine0", "spine1")}
        tier = {"leaf0": 1, "leaf1": 1, "spine0": 2, "spine1": 2}

        def both(a: str, b: str) -> None:
            for x, y in ((a, b), (b, a)):
                links.append(LinkInfo(len(links), x, y, 400.0, 100,
                                      "host" if "gpu" in x + y else "fabric"))

        for g in range(4):
            both(f"gpu{g}", f"leaf{g // 2}")
        for lf in range(2):
            for sp in range(2):
                both(f"leaf{lf}", f"spine{sp}")
        self.view = FabricView.from_links(links, kind, tier, {g: f"gpu{g}" for g in range(4)})
        self.installed: list[PathSet] = []

    def fabric(self) -> FabricView:
        return self.view

    def telemetry(self) -> list[PortDelta]:
        return []

    def install(self, rules: list[PathSet]) -> None:
        self.installed += rules

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        pass

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        pass


def test_two_jobs_crossing_the_same_leaves_get_disjoint_spines() -> None:
    dp = FakeDataPlane()
    ctl = Controller(dp, ControllerParams(parts=1))
    # job a: gpu0 -> gpu2 and back; job b: gpu1 -> gpu3 and back (a 2-GPU "ring" each)
    ctl.declare(Intent("a", "t1", (0, 2), (CommCall("allreduce", 1 << 30, 500.0, 0),)))
    ctl.declare(Intent("b", "t2", (1, 3), (CommCall("allreduce", 1 << 30, 500.0, 0),)))
    report = ctl.plan()
    assert report.demands == 4 and report.path_sets == 4
    # each direction of the leaf0 <-> leaf1 crossing has two flows at line rate and two
    # spines: the plan puts them on different spines, so no fabric link carries more than
    # one; the NIC links are at exactly 1.0 either way
    assert report.plan.max_utilization == pytest.approx(1.0)
    spine_of = {}
    for rule in dp.installed:
        (path,) = rule.paths
        names = [dp.view.link(lk).dst for lk in path]
        spine_of[rule.key] = next(n for n in names if n.startswith("spine"))
    assert spine_of[rule_key("a", 0, 2)] != spine_of[rule_key("b", 1, 3)]
    assert spine_of[rule_key("a", 2, 0)] != spine_of[rule_key("b", 3, 1)]


def test_opted_out_jobs_and_same_node_pairs_get_no_rules() -> None:
    dp = FakeDataPlane()
    ctl = Controller(dp)
    ctl.declare(Intent("canary", "t", (0, 2), (CommCall("alltoall", 1 << 20, 500.0, 0),),
                       opt_in=False))
    ctl.declare(Intent("b", "t", (1, 3), (CommCall("broadcast", 1 << 20, 500.0, 0,
                                                   pairs=((1, 3), (3, 3))),)))
    ctl.plan()
    assert [r.key for r in dp.installed] == [rule_key("b", 1, 3)]
    # four parts by default (one per QP), on the two spine paths: two each
    (rule,) = dp.installed
    assert sorted(rule.weights) == [0.5, 0.5] and len(rule.paths) == 2


def test_pattern_pairs() -> None:
    assert pattern_pairs("allgather", (3, 1)) == [(3, 1, 1.0), (1, 3, 1.0)]
    assert len(pattern_pairs("alltoall", tuple(range(5)))) == 20
    assert pattern_pairs("allreduce", (7,)) == []


def test_the_controller_imports_no_simulator_code() -> None:
    code = ("import sys, fabricpilot.controller.core, fabricpilot.controller.planner, "
            "fabricpilot.controller.congestion; print(sorted(m for m in sys.modules if "
            "m.startswith(('fabricpilot.dataplane', 'fabricpilot.balancing', "
            "'fabricpilot.runner', 'fabricpilot.topology'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_task_aware_reaches_the_bound_on_the_default_scenario() -> None:
    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario.loader import default_scenario

    prep = prepare(default_scenario())
    ideal, ta = run_policy(prep, "ideal"), run_policy(prep, "task-aware")
    for job in prep.jobs:
        assert ta.mean_busbw_GBps(job.name) >= 0.95 * ideal.mean_busbw_GBps(job.name)
    assert ta.summary()["reorder_events"] == 0


def test_jobs_that_do_not_declare_are_left_to_the_switches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from fabricpilot.balancing import PolicyContext, make_policy
    from fabricpilot.runner import prepare
    from fabricpilot.scenario import load_scenario
    from fabricpilot.scenario.loader import default_scenario_path

    data = yaml.safe_load(default_scenario_path().read_text())
    data["jobs"][0]["declare_intent"] = False     # a canary run: this job stays on its own
    data["jobs"][1]["sla_us"] = 80                 # L2
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    prep = prepare(load_scenario(path), str(path))
    pol = make_policy("task-aware", PolicyContext(prep.topology, 1, 600))
    pol.attach_jobs(prep.jobs)  # type: ignore[attr-defined]
    ctl = pol.controller  # type: ignore[attr-defined]
    names = [j.name for j in prep.jobs]
    assert not ctl.intents[names[0]].opt_in
    assert ctl.intents[names[1]].strictest_level == "L2"
    keys = {k.split(":", 1)[0] for k in pol._rules}  # type: ignore[attr-defined]
    assert names[0] not in keys and names[1] in keys


def test_twin_telemetry_reports_link_bytes_as_deltas() -> None:
    from fabricpilot.balancing import PolicyContext, make_policy
    from fabricpilot.balancing.base import LinkTelemetry
    from fabricpilot.controller.congestion import CongestionMap
    from fabricpilot.topology import compile_topology, leaf_spine

    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    pol = make_policy("task-aware", PolicyContext(ct, 1, 600))
    now = {"t": 0.0}
    load = np.zeros(ct.n_links)
    load[3] = 200.0                                   # one link at half of 400 Gb/s
    queue = np.zeros(ct.n_links)
    queue[5] = 1000.0
    pol.bind(lambda: LinkTelemetry(load, queue, load, now["t"]))  # type: ignore[attr-defined]
    assert pol.telemetry() == []                      # no interval yet  # type: ignore[attr-defined]
    now["t"] = 1_000_000.0                            # 1 ms later
    deltas = {d.link_id: d for d in pol.telemetry()}  # type: ignore[attr-defined]
    assert set(deltas) == {3, 5}
    # 200 Gb/s for 1 ms = 25 MB; the congestion map reads it back as 50% utilisation
    assert deltas[3].tx_bytes == pytest.approx(25e6) and deltas[3].interval_ns == 1_000_000
    cmap = CongestionMap(pol.fabric())                # type: ignore[attr-defined]
    cmap.update(list(deltas.values()))
    assert cmap.state(3).utilization == pytest.approx(0.5)
    assert cmap.state(5).queue_bytes == 1000.0
