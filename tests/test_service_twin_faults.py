"""The service's twin plays the scenario's faults, and the controller learns of them as it
would from switches: a port reported down (healed at the next control period), a link
whose FEC error counters cross the threshold (gray, debounced); both in the fault log as
reported by ``telemetry``, in the events, and off every installed path. Once the gray
failure ends in the twin, its counters stay clean and the link is restored after
``controller.gray_clear_ns``."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from conftest import served, wait_until
from fabricpilot.scenario import load_scenario
from fabricpilot.scenario.loader import default_scenario_path
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.server import build

OPS = "operator-token-0123456789"
TENANT = "tenant-token-0123456789abc"


def test_the_twin_plays_faults_and_the_controller_learns_them(tmp_path: Path) -> None:
    data = yaml.safe_load(default_scenario_path().read_text())
    data["faults"] = {"events": [
        {"kind": "link_down", "link": "leaf0-spine0", "at_ns": "200us"},
        {"kind": "gray", "link": "leaf1-spine1", "at_ns": "200us", "until_ns": "5ms",
         "ber": 2e-5, "drop_probability": 1e-4}]}
    data.setdefault("controller", {})["gray_clear_ns"] = "2ms"
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(data))
    tokens = TokenRegistry()
    tokens.add(OPS, Principal("ops", "operator"))
    app, svc, _, _ = build(load_scenario(path), str(path), tmp_path / "state", tokens=tokens,
                           twin=True, time_scale=1e-3, tick_interval_s=0.05)
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
