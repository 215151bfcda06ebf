"""The twin in a process of its own (``TwinProcess``, the data plane ``fabricpilot serve``
drives): the same fabric, jobs and rules as the twin in-process, telemetry of real traffic,
fabric time that never runs ahead of its time scale, a clear end when the process goes, and
no process left behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import wait_until
from fabricpilot.balancing.task_aware import job_intents
from fabricpilot.controller.core import Controller
from fabricpilot.controller.southbound import PathSet, PortDelta
from fabricpilot.runner import prepare
from fabricpilot.scenario.loader import default_scenario
from fabricpilot.service.southbound_http import (
    SouthboundError,
    pathset_from_dict,
    pathset_to_dict,
    view_to_dict,
)
from fabricpilot.service.state import TWIN_TENANT, intent_from_dict, intent_to_dict
from fabricpilot.service.twin import PacedTwin, twin_context
from fabricpilot.service.twin_process import TwinProcess
from fabricpilot.workload.plan import busbw_factor

SCALE = 1e-3  # fabric seconds per wall second


def test_the_twin_process_is_the_twin_as_a_data_plane() -> None:
    sc = default_scenario()
    prep = prepare(sc, "default")
    tp = TwinProcess(sc, "default", time_scale=SCALE)
    try:
        t_ready0 = time.monotonic()
        tp.wait_ready()
        # the fabric and the jobs are those of the in-process twin of the same scenario
        here = PacedTwin(twin_context(prep)).fabric()
        assert view_to_dict(tp.fabric()) == view_to_dict(here)
        assert tp.jobs() == [intent_to_dict(i) for i in job_intents(prep.jobs, TWIN_TENANT)]
        # a controller drives it through the DataPlane calls: what it plans is what it holds
        ctl = Controller(tp, prep.controller)
        for d in tp.jobs():
            ctl.declare(intent_from_dict(d))
        report = ctl.plan()
        assert report.installed > 0
        held = {ps.key: ps for ps in tp.rules()}
        assert held == ctl._installed
        # and what it withdraws, it no longer holds
        gone = sorted(held)[:2]
        tp.remove(gone)
        assert {ps.key for ps in tp.rules()} == held.keys() - set(gone)
        time.sleep(1.5)
        deltas: list[PortDelta] = []

        def crossed() -> bool:  # (the twin's process gets little CPU on a loaded machine:
            deltas.extend(tp.telemetry())  # its fabric time may lag the wall clock's far)
            return sum(d.tx_bytes for d in deltas) > 0

        wait_until(crossed, timeout_s=60)  # the jobs' traffic crossed the fabric
        assert deltas and all(isinstance(d, PortDelta) for d in deltas)
        st = tp.status()
        t_status = time.monotonic()
        assert st["running"] and st["error"] is None and st["time_scale"] == SCALE
        # paced: fabric time is at most the wall time since the twin started, scaled (plus
        # one adaptive round of slack), and it has advanced
        fabric_ms = st["fabric_time_ms"]
        assert 0 < fabric_ms <= (t_status - t_ready0) * SCALE * 1e3 + 1.0
        # not stalled: its fabric time goes on (how fast depends on the CPU the machine
        # gives its process: a pace of 1/5 of the wall clock's was missed under load)
        wait_until(lambda: tp.status()["fabric_time_ms"] > fabric_ms, timeout_s=60)
        # a congestion table and a QoS map are accepted
        tp.push_congestion_table({0: 0.5})
        tp.set_qos({26: 3})
    finally:
        tp.close()
    assert tp.process.returncode is not None  # closing the socket ended it
    assert tp.status() == {"running": False, "error": "the twin process was stopped"}
    assert tp.telemetry() == [] and tp.telemetry_failures == 1
    with pytest.raises(SouthboundError, match="stopped"):
        tp.install([next(iter(held.values()))])


def test_the_twin_process_reports_each_jobs_last_collective() -> None:
    """Its status carries, per job, the bus bandwidth and the time of its last collective
    (the service shows both; the time was once dropped on the way out of the process)."""
    sc = default_scenario()
    prep = prepare(sc, "default")
    tp = TwinProcess(sc, "default", time_scale=1e-2)
    try:
        tp.wait_ready()
        deadline = time.monotonic() + 60
        st = tp.status()
        while not st.get("collective_us") and time.monotonic() < deadline:
            time.sleep(0.1)
            st = tp.status()
    finally:
        tp.close()
    times, busbw = st["collective_us"], st["busbw_GBps"]
    assert times and times.keys() == busbw.keys() <= {j.name for j in prep.jobs}
    for job, us in times.items():
        # a collective's busbw and time agree (nccl-tests): busbw = S x factor / time
        plans = next(j for j in prep.jobs if j.name == job).collectives
        assert any(busbw[job] == pytest.approx(
            c.size_bytes * busbw_factor(c.op, c.n_ranks) / (us * 1e3), rel=1e-6)
            for c in plans), (job, us, busbw[job])


def test_a_twin_process_that_dies_is_reported_not_hung_on() -> None:
    sc = default_scenario()
    tp = TwinProcess(sc, "default", time_scale=SCALE)
    try:
        tp.wait_ready()
        tp.process.kill()
        tp.process.wait(10)
        st = tp.status()
        assert st["running"] is False
        assert st["error"] == "the twin process is not running (exit code -9)"
        with pytest.raises(SouthboundError, match="not running"):
            tp.rules()
    finally:
        tp.close()


def test_a_twin_process_that_cannot_start_says_why_in_one_line() -> None:
    tp = TwinProcess(default_scenario(), "default", time_scale=SCALE)
    tp.process.kill()
    with pytest.raises(SouthboundError) as err:
        tp.wait_ready(timeout_s=30)
    assert str(err.value) == "the twin process failed to start: it exited with code -9"


def test_a_twin_process_that_died_is_started_again_with_the_controllers_rules(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The service's twin process is killed: the control loop starts it again (a new run of
    the scenario on the same fabric) and sends it every path set the controller had
    installed, its congestion table and QoS; the restart is counted and in the events. A
    twin that is running is left alone."""
    from fabricpilot.service.control import ServiceSpec
    from fabricpilot.service.server import build_service

    svc = build_service(ServiceSpec(default_scenario(), "default", tmp_path / "state",
                                    twin=True, twin_process=True))
    try:
        tp = svc.remote
        assert isinstance(tp, TwinProcess) and svc.dp.installed
        assert not svc.revive_twin()  # (running)
        first = tp.process.pid
        tp.process.kill()
        tp.process.wait(10)
        assert tp.gone == "the twin process is not running (exit code -9)"
        assert svc.revive_twin()
        assert tp.gone is None and tp.process.pid != first and tp.restarts == 1
        assert {ps.key: ps for ps in tp.rules()} == svc.dp.installed
        assert svc.remote_status["running"] and svc.counters.twin_restarts == 1
        assert svc.events[-1]["kind"] == "twin-restart"
        assert "exit code -9" in svc.events[-1]["why"]
        assert not svc.revive_twin()
    finally:
        svc.stop()
    assert tp.process.returncode is not None


def test_faults_played_in_the_twin_process_reach_the_controller(tmp_path: Path) -> None:
    """A link the scenario fails at 200 us of fabric time: the twin process's ports report
    it down, and a controller ticking on its telemetry heals it (no installed path crosses
    it any more)."""
    import yaml

    from fabricpilot.scenario import load_scenario
    from fabricpilot.scenario.loader import default_scenario_path

    data = yaml.safe_load(default_scenario_path().read_text())
    data["faults"] = {"events": [{"kind": "link_down", "link": "leaf0-spine0",
                                  "at_ns": "200us"}]}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(data))
    sc = load_scenario(path)
    tp = TwinProcess(sc, str(path), time_scale=SCALE)
    try:
        tp.wait_ready()
        ctl = Controller(tp, prepare(sc, str(path)).controller)
        for d in tp.jobs():
            ctl.declare(intent_from_dict(d))
        ctl.plan()
        view = tp.fabric()
        dead = {view.link_between("leaf0", "spine0"), view.link_between("spine0", "leaf0")}
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while not dead <= ctl.down and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += ctl.tick(tp.status().get("fabric_time_ms", 0.0) * 1e6).links_down
        assert dead <= ctl.down and sorted(seen) == sorted(dead)
        assert not any(dead & set(p) for ps in tp.rules() for p in ps.paths)
    finally:
        tp.close()


def test_a_fault_drill_reaches_the_twin_process() -> None:
    """A drill sent to the twin process fails the link in its current run: its ports then
    report down; a bad event is a one-line ``ValueError`` naming its field."""
    tp = TwinProcess(default_scenario(), "default", time_scale=SCALE)
    try:
        tp.wait_ready()
        view = tp.fabric()
        cable = {view.link_between("leaf1", "spine2"), view.link_between("spine2", "leaf1")}
        (fault,) = tp.inject_faults([{"kind": "link_down", "link": "leaf1-spine2",
                                      "at_ns": 0}])
        assert fault["id"] == 0 and "leaf1" in fault["label"]
        down: set[int] = set()
        deadline = time.monotonic() + 30
        while not cable <= down and time.monotonic() < deadline:
            time.sleep(0.05)
            down |= {d.link_id for d in tp.telemetry() if d.oper_up is False}
        assert cable <= down
        with pytest.raises(ValueError, match=r"faults\.events\[0\]\.at_ns"):
            tp.inject_faults([{"kind": "link_down", "link": "leaf1-spine2", "at_ns": "soon"}])
    finally:
        tp.close()


def test_a_path_sets_rate_cap_crosses_the_southbound_as_json() -> None:
    import json
    import math

    capped = PathSet("j:0->1", ((1, 2),), (1.0,), (4791,), ((),), 320.0)
    free = PathSet("j:1->0", ((3, 4), (5, 6)), (0.5, 0.5))
    for ps, cap in ((capped, 320.0), (free, None)):
        d = json.loads(json.dumps(pathset_to_dict(ps), allow_nan=False))
        assert d["rate_cap_gbps"] == cap
        assert pathset_from_dict(d) == ps
    old = pathset_to_dict(free)
    del old["rate_cap_gbps"]  # (from a peer that predates caps: none)
    assert pathset_from_dict(old).rate_cap_gbps == math.inf


def test_the_http_southbound_installs_and_withdraws_path_sets(
        caplog: pytest.LogCaptureFixture) -> None:
    import itertools
    import json
    import math
    import threading

    from conftest import served
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.service.southbound_http import RemoteDataPlane, RuleTable, dataplane_app

    prep = prepare(default_scenario(), "default")
    table = RuleTable(TaskAware(twin_context(prep)), threading.RLock())
    view = table.dp.fabric()

    def path(*nodes: str) -> tuple[int, ...]:
        return tuple(view.graph[a][b]["link_id"] for a, b in itertools.pairwise(nodes))

    # gpu0 and gpu8 (rail 0 of hosts 0 and 1) share leaf0; gpu1 and gpu9 leaf1
    up, down = path("gpu0", "leaf0", "spine0", "leaf1", "gpu1"), path("gpu1", "leaf1")
    via = [path("gpu1", "leaf1", f"spine{s}", "leaf0", "gpu0") for s in (0, 1)]
    leaf0 = view.links[up[1]].src
    sets = [PathSet("j:0->1", (up,), (1.0,), (4791,), (((leaf0, up[1]),),)),
            PathSet("j:1->0", tuple(via), (0.5, 0.5))]
    with served(dataplane_app(table, token="t0k")) as url:
        remote = RemoteDataPlane(url, token="t0k")
        remote.install(sets)
        assert remote.rules() == sets
        remote.remove(["j:0->1", "j:9->8"])  # (a key not held is ignored)
        assert remote.rules() == sets[1:] and list(table.rules) == ["j:1->0"]
        r = remote.http.post("/rules/remove", json={"keys": "j:1->0"})
        assert r.status_code == 422 and "list of path-set keys" in r.text
        # malformed bodies: one-line 422s naming the problem, nothing applied (they were
        # 500s with a traceback, or applied: a DSCP of 99, a priority of 42)
        n_links = len(view.links)
        good = pathset_to_dict(sets[0])
        for url_path, sent, problem in (
                ("/rules", [{}], "body[0].key: missing"),
                ("/rules", [7], "body[0]: expected an object, got int"),
                ("/rules", [{**good, "paths": [[n_links]]}],
                 f"body[0].paths[0][0]: link {n_links} does not exist"),
                ("/rules", [{**good, "paths": []}], "body[0].paths: expected a non-empty"),
                ("/rules", [{**good, "paths": [[True, up[1]]]}],
                 "body[0].paths[0][0]: True is not a link id"),
                ("/rules", [{**good, "paths": [[up[0], down[0]]]}],
                 f"body[0].paths[0][1]: link {down[0]} starts at gpu1, not at leaf0"),
                ("/rules", [{**good, "paths": [list(path("gpu0", "leaf0", "spine0", "leaf0",
                                                          "spine0"))]}],
                 "body[0].paths[0]: a link appears twice"),
                ("/rules", [{**good, "key": 123}], "body[0].key: expected a non-empty string"),
                ("/rules", [{**good, "extra": 1}], "body[0].extra: unknown field"),
                ("/rules", [{**good, "weights": [-1.0]}],
                 "body[0].weights[0]: a weight is a finite number >= 0, got -1.0"),
                ("/rules", [{**good, "weights": [0]}], "body[0].weights: all 0"),
                ("/rules", [{**good, "weights": [0.5, 0.5]}],
                 "body[0].weights: expected a list of 1 numbers"),
                ("/rules", [{**good, "ports": [70000]}],
                 "body[0].ports[0]: 70000 is not a UDP port"),
                ("/rules", [{**good, "rules": [[["nosuchswitch", up[1]]]]}],
                 "body[0].rules[0][0]: 'nosuchswitch' is not a switch"),
                ("/rules", [{**good, "rules": [[[leaf0, up[0]]]]}],
                 f"body[0].rules[0][0]: link {up[0]} leaves gpu0, not {leaf0}"),
                ("/rules", [{**good, "rules": [[[leaf0, via[0][1]]]]}],
                 f"body[0].rules[0][0]: link {via[0][1]} is not on paths[0]"),
                ("/rules", [{**good, "rate_cap_gbps": -5}],
                 "body[0].rate_cap_gbps: expected null or a rate > 0"),
                ("/congestion-table", [1, 2], "expected an object link id -> weight"),
                ("/congestion-table", {"x": 1}, "'x' is not a link id"),
                ("/congestion-table", {str(n_links): 1}, f"link {n_links} does not exist"),
                ("/congestion-table", {"0": -5}, "a weight is a number >= 0, got -5"),
                ("/qos", {"99": 1}, "'99' is not a DSCP value (0-63)"),
                ("/qos", {"26": 42}, "42 is not a priority (0-7)"),
                ("/qos", {"\u00b2": 1}, "'\u00b2' is not a DSCP value (0-63)")):
            r = remote.http.post(url_path, json=sent)
            assert r.status_code == 422 and problem in r.json()["detail"], (url_path, r.text)
        # a NaN weight (not JSON, but Python's json reads it) is refused too
        r = remote.http.post("/rules", content=json.dumps([{**good, "weights": [math.nan]}]))
        assert r.status_code == 422 and "weights[0]: a weight is a finite number" in r.text
        assert remote.rules() == sets[1:]  # (none of them applied)
        r = remote.http.post("/qos", content=b"{nope")
        assert r.status_code == 422 and r.json()["detail"] == "body: not JSON"
        r = remote.http.post("/rules/remove", json=["nope", "j:1->0", "j:1->0"])
        assert r.json() == {"removed": 1}  # (only what it held, once)
        remote.install(sets[1:])
        bad = RemoteDataPlane(url, token="t0k")
        bad.http.headers["Authorization"] = "Bearer wrong"
        with pytest.raises(SouthboundError, match="remove refused: 401"):
            bad.remove(["j:1->0"])
        assert list(table.rules) == ["j:1->0"]
        # a set held from another agent that is not one on this fabric is left out of
        # what a controller reads back, with a warning, rather than stopping it
        table.rules["x:0->1"] = PathSet("x:0->1", ((n_links,),), (1.0,))
        with caplog.at_level("WARNING", logger="fabricpilot.service"):
            assert remote.rules() == sets[1:]
        assert any(getattr(r, "fields", {}).get("key") == "'x:0->1'"
                   and "does not exist" in r.fields["error"] for r in caplog.records)


def test_a_controller_connecting_over_http_reads_every_ports_state_first() -> None:
    """A twin serving the southbound over HTTP outlives its controllers. The first read of a
    controller that connects (``RemoteDataPlane``) asks for every port's state, so one that
    restarted knowing a link down learns it is up again although no port changed; later
    reads give the changes only (the port still down, in every report). ``sync`` other
    than true / false is a 422."""
    import threading

    import numpy as np

    from conftest import served
    from fabricpilot.balancing.base import LinkTelemetry
    from fabricpilot.service.southbound_http import RemoteDataPlane, RuleTable, dataplane_app

    twin = PacedTwin(twin_context(prepare(default_scenario(), "default")))
    n = twin.ctx.topology.n_links
    clock = [0.0]

    def tel() -> LinkTelemetry:
        clock[0] += 1_000.0
        return LinkTelemetry(np.zeros(n), np.zeros(n), np.zeros(n), now_ns=clock[0])

    twin.bind(tel)
    twin.on_links_changed(0.0, [4], [])
    first = twin.telemetry()  # (an earlier controller's read: every port, once)
    assert len(first) == n
    with served(dataplane_app(RuleTable(twin, threading.RLock()), token="t0k")) as url:
        remote = RemoteDataPlane(url, token="t0k")
        said = {d.link_id: d.oper_up for d in remote.telemetry()}
        assert said == {i: i != 4 for i in range(n)}
        assert {d.link_id: d.oper_up for d in remote.telemetry()} == {4: False}
        r = remote.http.get("/telemetry", params={"sync": "yes"})
        assert r.status_code == 422 and "sync: expected true or false" in r.text
