"""The service's twin plays the scenario's faults, and the controller learns of them as it
would from switches: a port reported down (healed at the next control period), a link
whose FEC error counters cross the threshold (gray, debounced); both in the fault log as
reported by ``telemetry``, in the events, and off every installed path. Once the gray
failure ends in the twin, its counters stay clean and the link is restored after
``controller.gray_clear_ns``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from conftest import served, wait_until
from fabricpilot.scenario import load_scenario
from fabricpilot.scenario.loader import default_scenario_path
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.server import build

OPS = "operator-token-0123456789"
TENANT = "tenant-token-0123456789abc"


def _twin_service(tmp_path: Path, data: dict[str, Any]) -> tuple[Any, Any]:
    """The service (its app and state) of scenario ``data``, written under ``tmp_path``,
    with its twin at 1 ms of fabric time per second, 50 ms control periods and the
    operator token ``OPS``."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    tokens = TokenRegistry()
    tokens.add(OPS, Principal("ops", "operator"))
    app, svc, _, _ = build(load_scenario(path), str(path), tmp_path / "state", tokens=tokens,
                           twin=True, time_scale=1e-3, tick_interval_s=0.05)
    return app, svc


def test_the_twin_plays_faults_and_the_controller_learns_them(tmp_path: Path) -> None:
    data = yaml.safe_load(default_scenario_path().read_text())
    data["faults"] = {"events": [
        {"kind": "link_down", "link": "leaf0-spine0", "at_ns": "200us"},
        {"kind": "gray", "link": "leaf1-spine1", "at_ns": "200us", "until_ns": "5ms",
         "ber": 2e-5, "drop_probability": 1e-4}]}
    data.setdefault("controller", {})["gray_clear_ns"] = "2ms"
    app, svc = _twin_service(tmp_path, data)
    view = svc.view
    dead = {view.link_between("leaf0", "spine0"), view.link_between("spine0", "leaf0")}
    gray = {view.link_between("leaf1", "spine1"), view.link_between("spine1", "leaf1")}
    planned_on = {lk for ps in svc.dp.installed.values() for p in ps.paths for lk in p}
    assert dead <= planned_on and gray <= planned_on  # (traffic to move)
    with served(app) as url, httpx.Client(base_url=url, timeout=20,
                                          headers={"Authorization": f"Bearer {OPS}"}) as c:
        wait_until(lambda: dead <= svc.controller.down and gray <= svc.controller.degraded,
                   timeout_s=60)
        with svc.lock:
            still = [k for k, ps in svc.dp.installed.items()
                     if any((dead | gray) & set(p) for p in ps.paths)]
        assert still == []
        faults = c.get("/api/v1/faults").json()
        by_kind = {(f["kind"], f["link_id"]) for f in faults if f["source"] == "telemetry"}
        assert {("down", lk) for lk in dead} <= by_kind
        assert {("gray", lk) for lk in gray} <= by_kind
        kinds = {e["kind"] for e in c.get("/api/v1/events").json()}
        assert {"fault-down", "fault-gray", "heal"} <= kinds
        moved = {e["kind"]: e["path_sets"] for e in c.get("/api/v1/events").json()
                 if e["kind"].startswith("fault-")}
        assert moved["fault-down"] > 0 and moved["fault-gray"] > 0
        # the gray failure ends at 5 ms: clean counters for 2 ms restore the link
        wait_until(lambda: not gray & svc.controller.degraded, timeout_s=60)
        with svc.lock:  # (the period that restored them has logged them)
            pass
        faults = c.get("/api/v1/faults").json()
        restored = {f["link_id"] for f in faults
                    if f["source"] == "telemetry" and "restored" in f["detail"]}
        assert restored == gray and dead <= svc.controller.down


def test_a_fault_drill_in_the_twin_is_healed_from_telemetry(tmp_path: Path) -> None:
    """The default scenario (no faults): an operator fails leaf2-spine3 in the twin for 2 ms
    of fabric time. The controller is not told; it finds the ports down in the telemetry,
    heals, and brings the cable back once the twin reports it up. A bad event is a 422
    naming its field, a tenant gets 403, and a service without a twin answers 501."""
    from fabricpilot.scenario import default_scenario

    tokens = TokenRegistry()
    tokens.add(OPS, Principal("ops", "operator"))
    tokens.add(TENANT, Principal("acme", "tenant", "acme"))
    app, svc, _, _ = build(default_scenario(), "default", tmp_path / "state", tokens=tokens,
                           twin=True, time_scale=1e-3, tick_interval_s=0.05)
    view = svc.view
    cable = {view.link_between("leaf2", "spine3"), view.link_between("spine3", "leaf2")}
    with served(app) as url, httpx.Client(base_url=url, timeout=20,
                                          headers={"Authorization": f"Bearer {OPS}"}) as c:
        drill = {"events": [{"kind": "link_down", "link": "leaf2-spine3", "at_ns": 0,
                             "until_ns": "2ms"}]}
        r = c.post("/api/v1/twin/faults", json=drill)
        assert r.status_code == 201, r.text
        (fault,) = r.json()["faults"]
        assert "leaf2" in fault["label"] and "spine3" in fault["label"]
        # the twin's own view: its switches see the cable's two ports down
        wait_until(lambda: c.get("/health").json()["twin"]["ports_down"] == 2, 60, 0.02)
        wait_until(lambda: cable <= svc.controller.down, timeout_s=60)
        wait_until(lambda: not cable & svc.controller.down, timeout_s=60)

        def logged() -> set[tuple[str, int]]:  # (written once the period is over)
            return {(f["kind"], f["link_id"]) for f in c.get("/api/v1/faults").json()
                    if f["source"] == "telemetry"}

        wait_until(lambda: {(k, lk) for k in ("down", "up") for lk in cable} <= logged(),
                   timeout_s=10)
        assert any(e["kind"] == "drill" for e in c.get("/api/v1/events").json())
        bad = c.post("/api/v1/twin/faults", json={"events": [{"kind": "link_down",
                                                               "link": "leaf2-spine99",
                                                               "at_ns": 0}]})
        assert bad.status_code == 422 and "faults.events[0].link" in bad.json()["detail"]
        tenant = c.post("/api/v1/twin/faults", json=drill,
                        headers={"Authorization": f"Bearer {TENANT}"})
        assert tenant.status_code == 403
    app2, _, _, _ = build(default_scenario(), "default", tmp_path / "state2", tokens=tokens,
                          twin=False, tick_interval_s=3600.0)
    with served(app2) as url, httpx.Client(base_url=url, timeout=20,
                                           headers={"Authorization": f"Bearer {OPS}"}) as c:
        r = c.post("/api/v1/twin/faults", json=drill)
        assert r.status_code == 501 and "only the twin" in r.json()["detail"]


def test_a_link_the_controller_knew_down_before_a_restart_comes_back_with_the_twin(
        tmp_path: Path) -> None:
    """The twin's ports say leaf2-spine3 is down (an open-ended drill) and the controller
    logs the cable down from the telemetry. The service stops and starts again on the same
    state directory with a fresh twin, where every link is up: no port says it changed, but
    the twin's first report gives every port's state, so the controller brings the cable
    back (logged up, from the telemetry) instead of keeping it out of service for good."""
    from fabricpilot.scenario import default_scenario

    tokens = TokenRegistry()
    tokens.add(OPS, Principal("ops", "operator"))
    state = tmp_path / "state"

    def logged(c: httpx.Client) -> list[tuple[str, int]]:
        return [(f["kind"], f["link_id"]) for f in c.get("/api/v1/faults").json()
                if f["source"] == "telemetry"]

    app, svc, _, _ = build(default_scenario(), "default", state, tokens=tokens, twin=True,
                           time_scale=1e-3, tick_interval_s=0.05)
    view = svc.view
    cable = {view.link_between("leaf2", "spine3"), view.link_between("spine3", "leaf2")}
    with served(app) as url, httpx.Client(base_url=url, timeout=20,
                                          headers={"Authorization": f"Bearer {OPS}"}) as c:
        r = c.post("/api/v1/twin/faults", json={"events": [
            {"kind": "link_down", "link": "leaf2-spine3", "at_ns": 0}]})
        assert r.status_code == 201, r.text
        wait_until(lambda: {("down", lk) for lk in cable} <= set(logged(c)), 60, 0.02)
    app2, svc2, _, _ = build(default_scenario(), "default", state, tokens=tokens, twin=True,
                             time_scale=1e-3, tick_interval_s=0.05)
    assert cable <= svc2.controller.down  # (as it was left)
    with served(app2) as url, httpx.Client(base_url=url, timeout=20,
                                           headers={"Authorization": f"Bearer {OPS}"}) as c:
        wait_until(lambda: not cable & svc2.controller.down, 60, 0.02)
        wait_until(lambda: {("up", lk) for lk in cable} <= set(logged(c)), 10, 0.02)
        assert all(lk["down"] is False for lk in (
            c.get(f"/api/v1/fabric/links/{lk}").json() for lk in cable))


def test_a_drill_goes_on_in_the_next_runs_for_what_is_left_of_it(tmp_path: Path) -> None:
    """The twin's runs of the default scenario last ~20 ms of fabric time (routing
    converges around a dead link within 1 ms here, so that a run ends). A drill injected
    at time T (the twin's clock) holds leaf2-spine3 down until T + 60 ms, lays a gray
    failure on leaf0-spine0 with no end, and fails leaf1-spine1 from T + 30 ms to
    T + 32 ms. A run starting at S later than T plays what is left, times from S: the cable
    down until T + 60 ms - S (while that is > 0); the leaf1 fault at T + 30 ms - S if not
    started yet (else the rest of it); the open-ended gray failure ends with its run. Once
    every part is over the drill is forgotten."""
    from fabricpilot.runner import prepare
    from fabricpilot.service.twin_process import host_twin

    data = yaml.safe_load(default_scenario_path().read_text())
    data["faults"] = {"convergence_delay_ns": "1ms"}
    path = tmp_path / "fast_convergence.yaml"
    path.write_text(yaml.safe_dump(data))
    host = host_twin(prepare(load_scenario(path), str(path)), time_scale=1.0)
    runner = host.runner
    runner.start()
    try:
        drill = [
            {"kind": "link_down", "link": "leaf2-spine3", "at_ns": 0, "until_ns": "60ms"},
            {"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "ber": 2e-5,
             "drop_probability": 1e-4},
            {"kind": "link_down", "link": "leaf1-spine1", "at_ns": "30ms", "until_ns": "32ms"}]

        def inject() -> list[dict[str, Any]] | None:
            try:
                return runner.inject(drill)
            except ValueError:  # (between two runs)
                return None

        got = wait_until(inject, 60, 0.005)
        with runner.lock:
            t_ns = runner.run_start_ns + round(got[0]["at_ms"] * 1e6)
        seen: dict[float, list[tuple[str, int, int | None]]] = {}  # run start -> drill faults

        def drill_faults() -> bool:
            with runner.lock:
                eng, start = runner._engine, runner.run_start_ns
                # (a later run under way: not the drill's own run, nor between two runs)
                if (runner._running and eng is not None and start > t_ns
                        and start not in seen):
                    seen[start] = [(r.label, r.start_ns, r.end_ns) for r in eng.fault_records]
            return bool(seen) and max(seen) - t_ns > 62e6

        wait_until(drill_faults, 300, 0.005)
        for start, faults in seen.items():
            elapsed = start - t_ns
            want = []
            if elapsed < 60e6:
                want.append(("leaf2", 0, round(60e6 - elapsed)))
            if elapsed < 30e6:
                want.append(("leaf1", round(30e6 - elapsed), round(32e6 - elapsed)))
            elif elapsed < 32e6:
                want.append(("leaf1", 0, round(32e6 - elapsed)))
            assert [(lab.split("<->")[0].split()[-1], a, b) for lab, a, b in faults] == want
        assert runner._drills == []
    finally:
        runner.stop()


def test_a_port_down_and_back_between_two_reads_is_still_reported() -> None:
    """The service's controller learns of links from the twin's telemetry alone: a cable
    that goes down and comes back between two reads (a flap, a short drill, a twin
    catching up on its schedule) says it went down in the next report and that it is back
    in the one after, as switches report a link-down event however short; a port still
    down says so in every report, and nothing is said once all is reported. The first
    report, and the first after a controller asks (``sync_ports``), gives every port."""
    import numpy as np

    from fabricpilot.balancing.base import LinkTelemetry
    from fabricpilot.runner import prepare
    from fabricpilot.scenario import default_scenario
    from fabricpilot.service.twin import PacedTwin, twin_context

    twin = PacedTwin(twin_context(prepare(default_scenario())))
    n = twin.ctx.topology.n_links
    clock = [0.0]
    twin.bind(lambda: LinkTelemetry(np.zeros(n), np.zeros(n), np.zeros(n), now_ns=clock[0]))

    def report() -> dict[int, bool | None]:
        clock[0] += 1_000.0
        return {d.link_id: d.oper_up for d in twin.telemetry() if d.oper_up is not None}

    # the first report gives every port's state, as a telemetry subscription's first does
    twin.on_links_changed(0.0, [3], [])
    assert report() == {i: i != 3 for i in range(n)}
    twin.on_links_changed(0.0, [], [3])
    assert report() == {3: True}
    twin.on_links_changed(0.0, [5, 6], [])
    twin.on_links_changed(0.0, [], [5, 6])  # back before anyone read the ports
    twin.on_links_changed(0.0, [9], [])  # down and still down
    assert report() == {5: False, 6: False, 9: False}
    assert report() == {5: True, 6: True, 9: False}
    twin.on_links_changed(0.0, [], [9])
    assert report() == {9: True}
    assert report() == {}
    twin.on_links_changed(0.0, [7], [])
    twin.sync_ports()  # (a controller connecting asks for every port's state again)
    assert report() == {i: i != 7 for i in range(n)}
    assert report() == {7: False}


def test_a_drill_asked_for_between_two_runs_waits_for_the_next() -> None:
    """Between two runs of the scenario (no engine running) a drill waits for the next run
    to start and plays in it, instead of failing; with no run to come (the twin stopped)
    it fails at once with a one-line error."""
    import threading
    import time

    import pytest

    from fabricpilot.runner import prepare
    from fabricpilot.service.twin_process import host_twin

    path = default_scenario_path()
    runner = host_twin(prepare(load_scenario(path), str(path)), time_scale=1.0).runner
    drill = [{"kind": "link_down", "link": "leaf2-spine3", "at_ns": 0, "until_ns": "1ms"}]
    with pytest.raises(ValueError, match="between two runs of its scenario"):
        runner.inject(drill)  # (never started: nothing to wait for)
    runner.start()
    try:
        wait_until(lambda: runner._running, 60, 0.005)
        got: list[Any] = []
        with runner.lock:  # as between two runs: no run going, the lock free
            runner._running = False
        asker = threading.Thread(target=lambda: got.append(runner.inject(drill)))
        asker.start()
        time.sleep(0.2)
        assert not got and asker.is_alive()  # (waiting)
        with runner.lock:  # the next run starts
            runner._running = True
            eng = runner._engine
        asker.join(10)
        assert len(got) == 1 and got[0][0]["label"].startswith("link leaf2<->spine3 down")
        assert eng is not None and any(r.label == got[0][0]["label"]
                                       for r in eng.fault_records)
    finally:
        runner.stop()
    with pytest.raises(ValueError, match="between two runs of its scenario"):
        runner.inject(drill)


def test_a_twin_of_the_fluid_model_runs_and_refuses_drills(tmp_path: Path) -> None:
    """A scenario of the fluid model (queues, ECN, PFC) serves with its twin: the twin's
    runs play no faults (the fluid model has none), where they once played an empty fault
    timeline that the fluid model refused, so the twin died before its first run. Its
    jobs train and their telemetry reaches the congestion map; a fault drill is a 422
    saying why."""
    data = yaml.safe_load(default_scenario_path().read_text())
    data.setdefault("fabric", {})["model"] = "fluid"
    app, svc = _twin_service(tmp_path, data)
    with served(app) as url, httpx.Client(base_url=url, timeout=20,
                                          headers={"Authorization": f"Bearer {OPS}"}) as c:
        wait_until(lambda: c.get("/health").json()["twin"]["fabric_time_ms"] > 0.5,
                   timeout_s=60)
        assert c.get("/health").json()["twin"]["error"] is None
        wait_until(lambda: max(svc.controller.map.utilization().values()) > 0, timeout_s=60)
        r = c.post("/api/v1/twin/faults", json={"events": [
            {"kind": "link_down", "link": "leaf2-spine3", "at_ns": 0}]})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == (
            "fault drill: the twin runs the fluid model, which plays no faults (they are "
            "modelled by the flow-level model: fabric.model: flow)")
