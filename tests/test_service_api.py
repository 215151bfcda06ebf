"""The controller service end to end: tenants declare jobs, telemetry makes a link hot, the
controller reroutes (seen in the paths resource and in /metrics); auth and tenancy; payload
validation; faults; persistence across a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import served, wait_until
from fabricpilot.scenario import default_scenario
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.schemas import IntentIn
from fabricpilot.service.server import build
from fabricpilot.service.state import event_moves

OPS = "operator-token-0123456789"
ACME = "acme-token-0123456789abc"
GLOBEX = "globex-token-0123456789ab"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _tokens() -> TokenRegistry:
    reg = TokenRegistry()
    reg.add(OPS, Principal("ops", "operator"))
    # acme owns hosts 0 and 8 (GPUs 0-7, 64-71): one leaf pair apart, across the spines
    reg.add(ACME, Principal("acme-trainer", "tenant", "acme",
                            frozenset([*range(0, 8), *range(64, 72)])))
    reg.add(GLOBEX, Principal("globex-trainer", "tenant", "globex",
                              frozenset([*range(8, 16), *range(72, 80)])))
    return reg


def _service(state: Path, **kw: object):  # type: ignore[no-untyped-def]
    app, svc, _, _ = build(default_scenario(), "default", state, tokens=_tokens(), twin=False,
                           tick_interval_s=3600.0, **kw)  # ticks only when asked
    return app, svc


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    """A client of the service running on a loopback port."""
    app, _ = _service(tmp_path)
    with served(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c


def _job(task_id: str, gpus: list[int], pattern: str = "allreduce", sla_us: float = 500.0,
         size_bytes: int = 64 << 20) -> dict[str, object]:
    return {"task_id": task_id, "gpus": gpus,
            "calls": [{"pattern": pattern, "size_bytes": size_bytes, "sla_us": sla_us}]}


def _planned_paths(c: httpx.Client | TestClient, task: str, token: str
                   ) -> dict[str, list[list[int]]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        body = c.get(f"/api/v1/jobs/{task}/paths", headers=_auth(token)).json()
        if body["pairs"]:
            return {p["key"]: [q["links"] for q in p["paths"]] for p in body["pairs"]}
        time.sleep(0.05)
    raise AssertionError(f"{task}: never planned")


def _planned_job(c: httpx.Client | TestClient, task: str, token: str) -> dict[str, object]:
    """The job once the control loop's plan that includes its last change is over (its
    path sets are installed during the plan, its ``planned`` and verdict only after it)."""
    return wait_until(lambda: (j := c.get(f"/api/v1/jobs/{task}", headers=_auth(token))
                               .json())["planned"] and j)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_hot_link_reroutes_a_tenant_job(client: httpx.Client) -> None:
    c = client
    assert c.post("/api/v1/jobs", json=_job("acme-ring", [0, 64]),
                  headers=_auth(ACME)).status_code == 201
    assert c.post("/api/v1/jobs", json=_job("globex-ring", [8, 72]),
                  headers=_auth(GLOBEX)).status_code == 201
    _planned_paths(c, "globex-ring", GLOBEX)  # planned after (or with) acme's job
    before = _planned_paths(c, "acme-ring", ACME)
    assert set(before) == {"acme-ring:0->64", "acme-ring:64->0"}
    fabric = {lk["id"]: lk for lk in c.get("/api/v1/fabric", headers=_auth(OPS)).json()["links"]}
    # a ring's one peer gets controller.parts = 16 QPs: on the default fabric's 8 spines two
    # per spine, 8 paths of 50 Gb/s each; a fabric (leaf -> spine) link one of them crosses
    assert len(before["acme-ring:0->64"]) == 8
    hot = next(lk for p in before["acme-ring:0->64"] for lk in p
               if fabric[lk]["kind"] == "fabric")
    reroutes = _metric(c.get("/metrics").text, "fabricpilot_reroutes_total")
    # the switch reports the link full (400 Gb/s for 1 ms = 50 MB) with a 2 MB queue. The
    # map's first sample of a link is taken as is: utilisation 1.0, i.e. 400 Gb/s where the
    # plan put one path (50 Gb/s): 350 Gb/s the plan does not account for. Largest fabric
    # utilisation 1.0 now; with the path's QPs on other spines 350 / 400 = 0.875, below
    # (1 - replan_gain) * 1.0 = 0.9, so the control period re-plans: 7 paths left.
    delta = {"link_id": hot, "interval_ns": 1_000_000, "tx_bytes": 50_000_000,
             "queue_bytes": 2_000_000}
    r = c.post("/api/v1/telemetry", json={"deltas": [delta]}, headers=_auth(OPS))
    assert r.status_code == 202 and r.json() == {"accepted": 1}
    tick = c.post("/api/v1/control/tick", headers=_auth(OPS)).json()
    assert tick["replanned"]
    after = _planned_paths(c, "acme-ring", ACME)
    assert len(after["acme-ring:0->64"]) == 7
    assert not any(hot in p for p in after["acme-ring:0->64"])
    assert after["acme-ring:64->0"] == before["acme-ring:64->0"]  # untouched
    cong = {x["link_id"]: x for x in c.get("/api/v1/congestion", headers=_auth(OPS)).json()}
    assert cong[hot]["utilization"] == 1.0 and cong[hot]["hot"]
    fabric_only = c.get("/api/v1/congestion?kind=fabric", headers=_auth(OPS)).json()
    assert {x["link_id"] for x in fabric_only} == {i for i, lk in fabric.items()
                                                  if lk["kind"] == "fabric"}
    # the congestion table pushed to the switches: 1 / (1 + 4 * (1.0 - 0.5) + 2e6 / 1.5 MiB)
    assert cong[hot]["weight"] == pytest.approx(1 / (3 + 2e6 / (1.5 * 2 ** 20)), rel=1e-12)
    metrics = c.get("/metrics").text
    for path in ("/metrics", "/health"):  # (probes that send HEAD)
        head = c.head(path)
        assert head.status_code == 200 and head.content == b"", path
    assert _metric(metrics, "fabricpilot_reroutes_total") >= reroutes + 1
    assert _metric(metrics, "fabricpilot_replans_total") == 1
    src, dst = fabric[hot]["src"], fabric[hot]["dst"]
    util = [line for line in metrics.splitlines() if line.startswith(
        f'fabricpilot_link_utilization{{dst="{dst}",kind="fabric",link="{hot}",src="{src}"}}')]
    assert len(util) == 1 and float(util[0].rsplit(" ", 1)[1]) > 0.6
    events = c.get("/api/v1/events", headers=_auth(OPS)).json()
    assert events[-1]["kind"] == "replan" and "acme-ring:0->64" in events[-1]["keys"]


def test_a_changed_job_is_planned_by_itself(client: httpx.Client) -> None:
    # one job among two changes: only it is planned, around the other's installed paths
    c = client
    assert c.post("/api/v1/jobs", json=_job("acme-ring", [0, 1, 64, 65]),
                  headers=_auth(ACME)).status_code == 201
    acme = _planned_paths(c, "acme-ring", ACME)
    full = _metric(c.get("/metrics").text, "fabricpilot_plans_total")
    assert c.post("/api/v1/jobs", json=_job("globex-ring", [8, 9, 72, 73]),
                  headers=_auth(GLOBEX)).status_code == 201
    # (two hosts of two GPUs: a ring on each host, each GPU to its rail's GPU of the other)
    assert set(_planned_paths(c, "globex-ring", GLOBEX)) == {
        f"globex-ring:{a}->{b}" for a, b in ((8, 9), (9, 8), (72, 73), (73, 72), (8, 72),
                                             (9, 73), (72, 8), (73, 9))}
    metrics = c.get("/metrics").text
    assert _metric(metrics, "fabricpilot_job_plans_total") == 1
    assert _metric(metrics, "fabricpilot_plans_total") == full
    assert _planned_paths(c, "acme-ring", ACME) == acme
    # withdrawn: its path sets go, the other job's stay as they were
    assert c.delete("/api/v1/jobs/globex-ring", headers=_auth(GLOBEX)).status_code == 204
    deadline = time.monotonic() + 10
    while _metric(c.get("/metrics").text, "fabricpilot_job_plans_total") < 2:
        assert time.monotonic() < deadline, "the withdrawal was never planned"
        time.sleep(0.05)
    assert _metric(c.get("/metrics").text, "fabricpilot_path_sets") == len(acme)
    assert _planned_paths(c, "acme-ring", ACME) == acme


def test_an_l3_job_beside_an_l2_one_is_shown_capped(client: httpx.Client) -> None:
    # acme's ring has no tight SLA (L3); globex declares an 80 us one within a host (L2):
    # from then on acme's pairs carry 80 % of their 400 Gb/s NICs as a cap, and say so
    c = client
    assert c.post("/api/v1/jobs", json=_job("acme-ring", [0, 64]),
                  headers=_auth(ACME)).status_code == 201
    _planned_paths(c, "acme-ring", ACME)
    assert not c.get("/api/v1/jobs/acme-ring", headers=_auth(ACME)).json()["rate_capped"]
    assert c.post("/api/v1/jobs", json=_job("globex-l2", [8, 9], sla_us=80.0),
                  headers=_auth(GLOBEX)).status_code == 201
    deadline = time.monotonic() + 10
    while not c.get("/api/v1/jobs/acme-ring", headers=_auth(ACME)).json()["rate_capped"]:
        assert time.monotonic() < deadline, "the L3 job was never capped"
        time.sleep(0.05)
    pairs = c.get("/api/v1/jobs/acme-ring/paths", headers=_auth(ACME)).json()["pairs"]
    assert [p["rate_cap_gbps"] for p in pairs] == [320.0, 320.0]
    globex = _planned_job(c, "globex-l2", GLOBEX)  # (acme's cap is installed mid-plan)
    assert globex["sla_met"] and not globex["rate_capped"]
    # an L3 job within one host sends over NVLink, not its NICs: nothing to hold it to
    assert c.post("/api/v1/jobs", json=_job("acme-host", [2, 3]),
                  headers=_auth(ACME)).status_code == 201
    nv = _planned_paths(c, "acme-host", ACME)
    links = c.get("/api/v1/fabric", headers=_auth(ACME)).json()["links"]
    kind = {li["id"]: li["kind"] for li in links}
    assert {kind[p[0]] for paths in nv.values() for p in paths} == {"nvlink"}
    pairs = c.get("/api/v1/jobs/acme-host/paths", headers=_auth(ACME)).json()["pairs"]
    assert [p["rate_cap_gbps"] for p in pairs] == [None, None]
    assert not c.get("/api/v1/jobs/acme-host", headers=_auth(ACME)).json()["rate_capped"]


def test_auth_and_tenancy(client: httpx.Client) -> None:
    c = client
    body = _job("acme-a", [0, 1])
    # no token, a bad scheme, an unknown token: 401
    assert c.post("/api/v1/jobs", json=body).status_code == 401
    assert c.get("/api/v1/jobs").status_code == 401
    assert c.post("/api/v1/jobs", json=body,
                  headers={"Authorization": f"Basic {ACME}"}).status_code == 401
    assert c.post("/api/v1/jobs", json=body, headers=_auth("nope-" * 4)).status_code == 401
    assert c.post("/api/v1/jobs", json=body, headers=_auth(ACME)).status_code == 201
    assert c.post("/api/v1/jobs", json=body, headers=_auth(ACME)).status_code == 409
    # another tenant can neither read nor change nor withdraw nor announce on acme's job
    for method, url, js in (("GET", "/api/v1/jobs/acme-a", None),
                            ("GET", "/api/v1/jobs/acme-a/paths", None),
                            ("PUT", "/api/v1/jobs/acme-a", _job("acme-a", [8, 9])),
                            ("DELETE", "/api/v1/jobs/acme-a", None),
                            ("POST", "/api/v1/jobs/acme-a/calls",
                             {"pattern": "allreduce", "size_bytes": 1, "ranks": [0, 1]})):
        r = c.request(method, url, json=js, headers=_auth(GLOBEX))
        assert r.status_code == 403, (method, url, r.text)
    assert [j["task_id"] for j in c.get("/api/v1/jobs", headers=_auth(GLOBEX)).json()] == []
    assert [j["task_id"] for j in c.get("/api/v1/jobs", headers=_auth(ACME)).json()] == \
        ["acme-a"]
    # a tenant token cannot declare for another tenant, nor on GPUs it does not own
    r = c.post("/api/v1/jobs", json={**_job("g1", [8, 9]), "tenant": "acme"},
               headers=_auth(GLOBEX))
    assert r.status_code == 403
    r = c.post("/api/v1/jobs", json=_job("g2", [0, 8]), headers=_auth(GLOBEX))
    assert r.status_code == 403 and "GPU 0" in r.json()["detail"]
    # operator-only resources
    assert c.post("/api/v1/telemetry", json={"deltas": [{"link_id": 0, "interval_ns": 1}]},
                  headers=_auth(ACME)).status_code == 403
    assert c.post("/api/v1/faults", json={"kind": "down", "link_id": 0},
                  headers=_auth(ACME)).status_code == 403
    # the operator sees and may withdraw everything
    assert c.get("/api/v1/jobs/acme-a", headers=_auth(OPS)).json()["tenant"] == "acme"
    assert c.delete("/api/v1/jobs/acme-a", headers=_auth(OPS)).status_code == 204
    assert c.get("/api/v1/jobs/acme-a", headers=_auth(OPS)).status_code == 404
    # an operator's job on GPUs a tenant's job holds: 409
    c.post("/api/v1/jobs", json=_job("acme-b", [2, 3]), headers=_auth(ACME))
    r = c.post("/api/v1/jobs", json={**_job("ops-x", [3, 4]), "tenant": "ops"},
               headers=_auth(OPS))
    assert r.status_code == 409 and "GPU 3" in r.json()["detail"]


def test_tokens_are_not_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app, _ = _service(tmp_path)
    with caplog.at_level("DEBUG"), TestClient(app) as c:
        c.post("/api/v1/jobs", json=_job("acme-l", [0, 1]), headers=_auth(ACME))
        c.get("/api/v1/jobs", headers=_auth("wrong-token-0123456789"))
    text = "\n".join(r.getMessage() + repr(getattr(r, "fields", "")) for r in caplog.records)
    assert "acme-trainer" in text  # requests are logged, by the token's name
    assert ACME not in text and "wrong-token" not in text


def test_validation_and_limits(tmp_path: Path) -> None:
    app, _ = _service(tmp_path, max_body_bytes=4096)
    with TestClient(app) as c:
        r = c.post("/api/v1/jobs", headers=_auth(ACME), json={
            "task_id": "bad id!", "gpus": [0, 0],
            "calls": [{"pattern": "gather", "size_bytes": 0, "sla_us": -1}]})
        assert r.status_code == 422
        locs = {".".join(str(x) for x in e["loc"]) for e in r.json()["detail"]}
        assert {"body.task_id", "body.gpus", "body.calls.0.pattern",
                "body.calls.0.size_bytes", "body.calls.0.sla_us"} <= locs
        r = c.post("/api/v1/jobs", json=_job("x", [0, 999]), headers=_auth(OPS))
        assert r.status_code == 422 and "GPU 999 does not exist" in r.json()["detail"]
        r = c.post("/api/v1/telemetry", headers=_auth(OPS),
                   json={"deltas": [{"link_id": 10 ** 6, "interval_ns": 1}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("deltas.0.link_id")
        big = {**_job("x", list(range(8))), "pad": "x" * 5000}
        r = c.post("/api/v1/jobs", json=big, headers=_auth(OPS))
        assert r.status_code == 413 and "4096 bytes" in r.json()["detail"]
        # a chunked body (no Content-Length) is cut off once it passes the limit, on the
        # routes served directly and on FastAPI's: JSON as well
        for path in ("/api/v1/jobs", "/api/v1/faults"):
            r = c.post(path, content=iter([json.dumps(big).encode()]),
                       headers={**_auth(OPS), "content-type": "application/json"})
            assert r.status_code == 413 and "more than 4096 bytes" in r.json()["detail"]
        assert c.get("/api/v1/jobs", headers=_auth(OPS)).json() == []  # (nothing declared)
        r = c.put("/api/v1/jobs/other", json=_job("x", [0, 1]), headers=_auth(OPS))
        assert r.status_code == 422
        # a key given twice is refused, not read as its last value (top level and nested;
        # a route of FastAPI's and one served directly)
        for path, body in (
                ("/api/v1/jobs", '{"task_id": "dup", "gpus": [0, 1], "gpus": [2, 3], '
                                 '"calls": [{"pattern": "allreduce", "size_bytes": 1024, '
                                 '"sla_us": 500}]}'),
                ("/api/v1/telemetry", '{"deltas": [{"link_id": 1, "interval_ns": 5, '
                                      '"interval_ns": 7}]}'),
                ("/api/v1/faults", '{"kind": "down", "link_id": 3, "link_id": 4}')):
            r = c.post(path, content=body.encode(),
                       headers={**_auth(OPS), "content-type": "application/json"})
            key = "gpus" if "gpus" in body else "interval_ns" if "deltas" in body else "link_id"
            assert r.status_code == 422, (path, r.text)
            assert r.json()["detail"][0]["msg"] == f"JSON object gives key '{key}' twice"
            # without a known token the body is not parsed for that: the caller gets 401
            for auth in ({}, {"authorization": "Bearer not-a-token"}):
                r = c.post(path, content=body.encode(),
                           headers={**auth, "content-type": "application/json"})
                assert r.status_code == 401, (path, auth, r.text)
            # nor for a tenant on a route for operators: it is told the route is not its own
            if path != "/api/v1/jobs":
                r = c.post(path, content=body.encode(),
                           headers={**_auth(ACME), "content-type": "application/json"})
                assert r.status_code == 403 and r.json()["detail"] == "operators only", r.text
        assert c.get("/api/v1/jobs", headers=_auth(OPS)).json() == []
        assert c.get("/api/v1/faults", headers=_auth(OPS)).json() == []



def test_hostile_bodies_get_a_422_and_change_nothing(tmp_path: Path) -> None:
    """Non-finite or huge numbers, booleans or strings for numbers (in lists too), a string
    for a port state, bytes that are not UTF-8, a pair from a GPU to itself: each a 422
    naming the field (never a 500), and the map as it was."""
    app, svc = _service(tmp_path)
    h = {**_auth(OPS), "content-type": "application/json"}
    with TestClient(app, raise_server_exceptions=False) as c:
        cases = [
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[0,1],"calls":[{"pattern":"allreduce",'
                             b'"size_bytes":1,"sla_us":1e309}]}', "body.calls.0.sla_us"),
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[0,1],"calls":[{"pattern":"allreduce",'
                             b'"size_bytes":true,"sla_us":5}]}', "body.calls.0.size_bytes"),
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[0,1],"calls":[{"pattern":"allreduce",'
                             b'"size_bytes":1,"sla_us":5,"pairs":[[1,1]]}]}',
             "body.calls.0.pairs"),
            ("/api/v1/telemetry", b'{"deltas":[{"link_id":1,"interval_ns":1000,'
                                  b'"tx_bytes":NaN}]}', "body.deltas.0.tx_bytes"),
            ("/api/v1/telemetry", b'{"deltas":[{"link_id":1,"interval_ns":1000,'
                                  b'"tx_bytes":1e308}]}', "body.deltas.0.tx_bytes"),
            ("/api/v1/telemetry", b'{"deltas":[{"link_id":1,"interval_ns":1' + b"0" * 400
             + b'}]}', "body.deltas.0.interval_ns"),
            ("/api/v1/faults", b'{"kind":"down","link_id":Infinity}', "body.link_id"),
            # strings and booleans are not read as numbers or states, in lists neither
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[true,1],"calls":[{"pattern":'
                             b'"allreduce","size_bytes":1,"sla_us":5}]}', "body.gpus.0"),
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[0,1],"calls":[{"pattern":"allreduce",'
                             b'"size_bytes":"1000","sla_us":5}]}', "body.calls.0.size_bytes"),
            ("/api/v1/jobs", b'{"task_id":"a","gpus":[0,1],"opt_in":"yes","calls":[{'
                             b'"pattern":"allreduce","size_bytes":1,"sla_us":5}]}',
             "body.opt_in"),
            ("/api/v1/telemetry", b'{"deltas":[{"link_id":1,"interval_ns":1000,'
                                  b'"oper_up":"no"}]}', "body.deltas.0.oper_up"),
            ("/api/v1/jobs", b'{"task_id": "\xff"}', "body"),
        ]
        for url, body, loc in cases:
            r = c.post(url, content=body, headers=h)
            assert r.status_code == 422, (url, body[:60], r.text)
            locs = [".".join(str(x) for x in e["loc"]) for e in r.json()["detail"]]
            assert loc in locs, (body[:60], locs)
        assert c.get("/api/v1/jobs", headers=h).json() == []
        assert c.post("/api/v1/control/tick", headers=h).status_code == 200
    assert max(svc.controller.map.utilization().values()) == 0.0
    assert not svc.controller.map.hot_links()

def test_announce_returns_the_ring_paths(client: httpx.Client) -> None:
    c = client
    c.post("/api/v1/jobs", json=_job("acme-ddp", [0, 1, 64, 65]), headers=_auth(ACME))
    r = c.post("/api/v1/jobs/acme-ddp/calls", headers=_auth(ACME),
               json={"pattern": "allreduce", "size_bytes": 25 << 20, "ranks": [0, 64, 1, 65],
                     "sla_us": 800, "bucket": 0})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["changed_intent"] and got["sla_level"] == "L3" and got["sla_met"]
    # the rings NCCL runs on two hosts of two GPUs: one on each host, one along each rail
    assert [(p["src"], p["dst"]) for p in got["pairs"]] == [
        (0, 1), (1, 0), (64, 65), (65, 64), (0, 64), (1, 65), (64, 0), (65, 1)]
    for p in got["pairs"]:
        assert p["planned"]
        assert abs(sum(q["share"] for q in p["paths"]) - 1.0) < 1e-9
        for q in p["paths"]:
            assert q["nodes"][0] == f"gpu{p['src']}" and q["nodes"][-1] == f"gpu{p['dst']}"
    # the same call again changes nothing
    again = c.post("/api/v1/jobs/acme-ddp/calls", headers=_auth(ACME),
                   json={"pattern": "allreduce", "size_bytes": 25 << 20,
                         "ranks": [0, 64, 1, 65], "sla_us": 800, "bucket": 0}).json()
    assert not again["changed_intent"]
    calls = c.get("/api/v1/jobs/acme-ddp/calls", headers=_auth(ACME)).json()
    assert [(x["size_bytes"], x["ranks"], x["bucket"]) for x in calls] == \
        [(25 << 20, [0, 64, 1, 65], 0)] * 2
    # ranks outside the job
    r = c.post("/api/v1/jobs/acme-ddp/calls", headers=_auth(ACME),
               json={"pattern": "allreduce", "size_bytes": 1, "ranks": [0, 2]})
    assert r.status_code == 422


def _acme_job_and_its_fabric_link(c: httpx.Client) -> tuple[dict[int, dict[str, object]], int]:
    """Job ``acme-f`` (gpu0 <-> gpu64) declared and planned: the fabric's links by id, and
    a switch-to-switch link on its planned gpu0 -> gpu64 path."""
    c.post("/api/v1/jobs", json=_job("acme-f", [0, 64]), headers=_auth(ACME))
    _planned_job(c, "acme-f", ACME)
    before = _planned_paths(c, "acme-f", ACME)
    fabric = {lk["id"]: lk for lk in c.get("/api/v1/fabric", headers=_auth(OPS)).json()["links"]}
    return fabric, next(lk for p in before["acme-f:0->64"] for lk in p
                        if fabric[lk]["kind"] == "fabric")


def test_a_tenant_reads_the_moved_pairs_of_its_own_jobs_only(client: httpx.Client) -> None:
    c = client
    _, dead = _acme_job_and_its_fabric_link(c)
    r = c.post("/api/v1/faults", headers=_auth(OPS), json={"kind": "down", "link_id": dead})
    assert r.status_code == 201, r.text

    def moved(token: str) -> list[str]:
        events = c.get("/api/v1/events", headers=_auth(token)).json()
        heals = [e for e in events if "keys" in e]
        assert heals  # (each caller sees the heal)
        return [k for e in heals for k in e["keys"]]

    assert "acme-f:0->64" in moved(OPS) and "acme-f:0->64" in moved(ACME)
    assert moved(GLOBEX) == []
    # nor how many another tenant's jobs had moved: each count is of the caller's own
    counts = {who: [(e["path_sets"], e["by_task"]) for e in c.get(
        "/api/v1/events", headers=_auth(token)).json() if "by_task" in e]
        for who, token in (("ops", OPS), ("acme", ACME), ("globex", GLOBEX))}
    acme_jobs = {j["task_id"] for j in c.get("/api/v1/jobs", headers=_auth(ACME)).json()}
    assert counts["ops"] and len(counts["ops"]) == len(counts["acme"]) == len(counts["globex"])
    for (n_ops, ops), (n_acme, acme), (n_globex, globex) in zip(
            counts["ops"], counts["acme"], counts["globex"], strict=True):
        assert n_ops == sum(ops.values())
        assert acme == {t: n for t, n in ops.items() if t in acme_jobs}
        assert n_acme == sum(acme.values()) and (n_globex, globex) == (0, {})
    assert any(acme.get("acme-f", 0) >= 1 for _, acme in counts["acme"])


def test_an_event_names_at_most_twenty_moved_pairs_per_job_and_counts_them_all() -> None:
    keys = [f"a:{i}->{i + 1}" for i in range(25)] + ["b:0->1"]
    ev = event_moves(keys)
    assert ev["path_sets"] == 26 and ev["by_task"] == {"a": 25, "b": 1}
    assert ev["keys"] == [*keys[:20], "b:0->1"]


def test_an_operator_moves_a_job_to_another_tenant(client: httpx.Client) -> None:
    c = client
    assert c.post("/api/v1/jobs", json=_job("j", [0, 64]), headers=_auth(ACME)).status_code == 201
    # (its GPUs are its own, not another tenant's: no conflict)
    r = c.put("/api/v1/jobs/j", json={**_job("j", [0, 64]), "tenant": "globex"},
              headers=_auth(OPS))
    assert r.status_code == 200, r.text
    assert r.json()["tenant"] == "globex"
    # now globex's: acme may not use those GPUs, globex may
    r = c.post("/api/v1/jobs", json=_job("a2", [0, 1]), headers=_auth(ACME))
    assert r.status_code == 409 and "GPU 0 is in use by another tenant's job" in r.text
    r = c.post("/api/v1/jobs", json={**_job("g2", [0, 1]), "tenant": "globex"},
               headers=_auth(OPS))
    assert r.status_code == 201, r.text


def test_fault_heals_and_partitions(client: httpx.Client) -> None:
    c = client
    fabric, dead = _acme_job_and_its_fabric_link(c)
    r = c.post("/api/v1/faults", headers=_auth(OPS),
               json={"kind": "down", "endpoints": [fabric[dead]["src"], fabric[dead]["dst"]],
                     "detail": "LOS"})
    assert r.status_code == 201, r.text
    rep = r.json()
    assert rep["link_id"] == dead and rep["affected_path_sets"] >= 1
    assert 0 < rep["sent_ms"] <= rep["replan_ms"]
    metrics = c.get("/metrics").text
    for kind in ("heal", "heal_sent"):
        assert _metric(metrics, f'fabricpilot_planner_seconds_count{{kind="{kind}"}}') == 1
    after = _planned_paths(c, "acme-f", ACME)
    assert all(dead not in p for paths in after.values() for p in paths)
    # the fault log: a tenant reads what failed and when, not the operator's notes nor
    # name (it once read "source": "ops")
    (mine,) = c.get("/api/v1/faults", headers=_auth(ACME)).json()
    (ops,) = c.get("/api/v1/faults", headers=_auth(OPS)).json()
    assert mine["link_id"] == ops["link_id"] == dead and ops["detail"] == "LOS"
    assert ops["source"] == "ops"
    assert mine == {**ops, "detail": None, "source": "operator"}
    # nor in the events: the operator's note is the event's "detail" and its name "by",
    # which a tenant reads as None (it once read both in the event's text)
    (ops_ev,) = [e for e in c.get("/api/v1/events", headers=_auth(OPS)).json()
                 if e["kind"] == "fault-down"]
    (my_ev,) = [e for e in c.get("/api/v1/events", headers=_auth(ACME)).json()
                if e["kind"] == "fault-down"]
    assert ops_ev["detail"] == "LOS" and my_ev["detail"] is None
    assert ops_ev["by"] == "ops" and my_ev["by"] is None
    assert "LOS" not in str(my_ev) and "LOS" not in ops_ev["why"]
    assert "ops" not in str(my_ev).replace("operator", "")
    cong = {x["link_id"]: x for x in c.get("/api/v1/congestion", headers=_auth(OPS)).json()}
    assert cong[dead]["down"] and cong[dead]["weight"] == 0.0
    # gpu0's only NIC link down: its job is partitioned, and says so
    nic = next(lk["id"] for lk in fabric.values() if lk["src"] == "gpu0" and lk["kind"] == "nic")
    rep = c.post("/api/v1/faults", headers=_auth(OPS),
                 json={"kind": "down", "link_id": nic}).json()
    assert "acme-f" in rep["partitioned"]
    job = c.get("/api/v1/jobs/acme-f", headers=_auth(ACME)).json()
    assert not job["sla_met"] and "gpu0 -> gpu64" in job["sla_problem"]


def test_a_verdict_is_given_once_a_plan_has_checked_the_intent(client: httpx.Client) -> None:
    """A 1 us SLA between leaves (L1: one switch) cannot be met: the 201 does not say it
    is met before a plan has checked it (``null``), the plan then says it is not; a job
    that did not opt in is never checked (``null``, and no ``sla_met`` sample)."""
    c = client
    r = c.post("/api/v1/jobs", json=_job("acme-far", [0, 64], sla_us=1.0), headers=_auth(ACME))
    assert r.status_code == 201, r.text
    got = r.json()
    assert got["sla_met"] is (None if not got["planned"] else False)
    job = wait_until(lambda: (j := c.get("/api/v1/jobs/acme-far", headers=_auth(ACME)).json())
                     ["planned"] and j)
    assert job["sla_met"] is False
    assert "(L1): no path from gpu0 to gpu64 within one switch" in job["sla_problem"]
    # no path of its own; the plan keeps room for its ring's two flows (0 -> 64, 64 -> 0)
    assert job["path_sets"] == 0 and job["room_kept"] == 2
    assert c.put("/api/v1/jobs/acme-far", json=job, headers=_auth(ACME)).status_code == 200
    body = {**_job("acme-off", [1, 65], sla_us=1.0), "opt_in": False}
    assert c.post("/api/v1/jobs", json=body, headers=_auth(ACME)).status_code == 201
    job = wait_until(lambda: (j := c.get("/api/v1/jobs/acme-off", headers=_auth(ACME)).json())
                     ["planned"] and j)
    assert job["sla_met"] is None and job["sla_problem"] is None and job["path_sets"] == 0
    assert job["room_kept"] == 0
    text = c.get("/metrics", headers=_auth(OPS)).text
    assert 'fabricpilot_job_sla_met{job="acme-far"' in text
    assert 'job="acme-off"' not in text
    # the per-job series name jobs and tenants: an operator's; without a token (a scrape, a
    # probe) or with a tenant's, the fabric's and the service's alone
    for headers in ({}, _auth(ACME)):
        r = c.get("/metrics", headers=headers)
        assert r.status_code == 200 and "fabricpilot_plans_total" in r.text
        assert "fabricpilot_job_sla_met" not in r.text and "acme" not in r.text
    assert c.get("/metrics", headers=_auth("no-such-token")).status_code == 401


def test_a_job_whose_new_intent_cannot_be_met_keeps_no_path_sets(client: httpx.Client) -> None:
    """Planned under a loose SLA, then replaced by one no path meets: told so, and its
    old path sets are withdrawn (the same state as if it had been declared so at first)."""
    c = client

    def planned(task: str) -> dict[str, object]:
        return wait_until(lambda: (j := c.get(f"/api/v1/jobs/{task}", headers=_auth(ACME))
                                   .json())["planned"] and j)

    assert c.post("/api/v1/jobs", json=_job("acme-x", [0, 64]),
                  headers=_auth(ACME)).status_code == 201
    assert planned("acme-x")["path_sets"] == 2
    assert c.put("/api/v1/jobs/acme-x", json=_job("acme-x", [0, 64], sla_us=1.0),
                 headers=_auth(ACME)).status_code == 200
    job = planned("acme-x")
    assert job["sla_met"] is False and job["path_sets"] == 0
    assert c.get("/api/v1/jobs/acme-x/paths", headers=_auth(ACME)).json()["pairs"] == []


def test_a_fault_report_does_not_wait_for_a_whole_plan(tmp_path: Path) -> None:
    """A fault reported while the control loop computes a whole plan: the plan gives way
    at its next check (nothing installed, its changes stay queued), the fault is healed at
    once, and the changes are planned afterwards, around the dead link."""
    import threading

    from fabricpilot.service.schemas import FaultIn

    _, svc = _service(tmp_path)
    ops = Principal("ops", "operator")
    svc.declare(ops, IntentIn(task_id="ring", gpus=[0, 64], calls=[
        {"pattern": "allreduce", "size_bytes": 64 << 20, "sla_us": 500.0}]), replace_ok=False)
    svc.plan_pending("intents")
    held = dict(svc.dp.installed)
    dead = next(lk for p in held["ring:0->64"].paths for lk in p
                if svc.view.links[lk].kind == "fabric")
    svc.declare(ops, IntentIn(task_id="ring", gpus=[0, 64, 8, 72], calls=[
        {"pattern": "allreduce", "size_bytes": 64 << 20, "sla_us": 500.0}]), replace_ok=True)
    ctl = svc.controller
    started = threading.Event()
    demands = ctl.demands

    def slow_demands(*a, **k):  # type: ignore[no-untyped-def]
        started.set()  # the plan holds the controller's lock from here ...
        wait_until(ctl.interrupt.is_set, 10.0, 0.001)  # ... until a fault report waits for it
        return demands(*a, **k)

    ctl.demands = slow_demands  # type: ignore[method-assign]
    planner = threading.Thread(target=svc.plan_pending, args=("intents",))
    planner.start()
    assert started.wait(10)
    rep = svc.report_fault(ops, FaultIn(kind="down", link_id=dead))
    planner.join(10)
    assert not planner.is_alive()
    assert rep["affected_path_sets"] == 1 and svc.counters.plans_yielded == 1
    assert set(svc.dp.installed) == set(held)  # (the plan installed nothing)
    assert all(dead not in p for p in svc.dp.installed["ring:0->64"].paths)
    assert "ring" in svc._pending and not ctl.interrupt.is_set()
    assert _metric(svc.metrics_text(), "fabricpilot_plans_yielded_total") == 1
    ctl.demands = demands  # type: ignore[method-assign]
    svc.plan_pending("intents")
    assert "ring:8->72" in svc.dp.installed and not svc._pending
    assert all(dead not in p for ps in svc.dp.installed.values() for p in ps.paths)


def _service_with_a_ring(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    """A service (no twin; ``kw`` for :func:`build`) with one planned 2-GPU ring across the
    spines: the service, an operator, the ring's call and a fabric link the ring crosses."""
    from fabricpilot.service.schemas import IntentIn

    _, svc = _service(tmp_path, **kw)
    ops = Principal("ops", "operator")
    ring = {"pattern": "allreduce", "size_bytes": 64 << 20, "sla_us": 500.0}
    svc.declare(ops, IntentIn(task_id="ring", gpus=[0, 64], calls=[ring]), replace_ok=False)
    svc.plan_pending("intents")
    hot = next(lk for p in svc.dp.installed["ring:0->64"].paths for lk in p
               if svc.view.links[lk].kind == "fabric")
    return svc, ops, ring, hot


def test_switches_reporting_less_often_than_the_control_period_are_smoothed_per_report(
        tmp_path: Path) -> None:
    """Switches report every second (``telemetry_interval_s``), control periods come every
    0.2 s: a link the ring crosses reports 50 %, then its zeros once, then nothing; the map
    steps it towards 0 once per second of the clock (0.5 * 0.7 ** k), not once per period."""
    from fabricpilot.service.schemas import PortDeltaIn

    svc, _, _, hot = _service_with_a_ring(tmp_path, telemetry_interval_s=1.0)
    clock = [1e9]
    svc.now_ns = lambda: clock[0]  # type: ignore[method-assign]

    def util() -> float:
        return svc.controller.map.state(hot).utilization

    second = 1_000_000_000
    svc.ingest([PortDeltaIn(link_id=hot, interval_ns=second, tx_bytes=0.5 * 400 * second / 8)])
    svc.run_tick()
    clock[0] = 2e9
    svc.ingest([PortDeltaIn(link_id=hot, interval_ns=second, tx_bytes=0.0)])
    svc.run_tick()
    assert util() == pytest.approx(0.35)
    for t in (2.2e9, 2.4e9, 2.6e9, 2.8e9):  # (per period: 0.35 * 0.7 ** 4 = 0.084)
        clock[0] = t
        svc.run_tick()
        assert util() == pytest.approx(0.35)
    clock[0] = 3e9
    svc.run_tick()
    assert util() == pytest.approx(0.245)


def test_a_change_declared_during_a_control_period_comes_first(tmp_path: Path) -> None:
    """Telemetry shows a link of a job at 95 % (undeclared traffic): a control period weighs
    a whole plan; a job declared while it does makes it give way (nothing installed): the
    job is planned first, and the following period weighs the whole plan again."""
    import threading

    from fabricpilot.service.schemas import IntentIn, PortDeltaIn

    svc, ops, ring, hot = _service_with_a_ring(tmp_path)
    svc.ingest([PortDeltaIn(link_id=hot, interval_ns=1000, tx_bytes=0.95 * 400 * 1000 / 8)])
    ctl = svc.controller
    started = threading.Event()
    weighed: list[int] = []
    demands = ctl.demands

    def slow_demands(*a, **k):  # type: ignore[no-untyped-def]
        weighed.append(1)
        started.set()
        wait_until(ctl.interrupt.is_set, 10.0, 0.001)  # (until a change is declared)
        return demands(*a, **k)

    ctl.demands = slow_demands  # type: ignore[method-assign]
    period = threading.Thread(target=svc.run_tick)
    period.start()
    assert started.wait(10)
    held = dict(svc.dp.installed)
    svc.declare(ops, IntentIn(task_id="ring2", gpus=[8, 72], calls=[ring]), replace_ok=False)
    period.join(10)
    assert not period.is_alive() and svc.counters.plans_yielded == 1
    assert svc.dp.installed == held and not ctl.interrupt.is_set() and "ring2" in svc._pending
    ctl.demands = demands  # type: ignore[method-assign]
    svc.plan_pending("intents")
    assert "ring2:8->72" in svc.dp.installed and not svc._pending
    ctl.demands = slow_demands  # type: ignore[method-assign]
    ctl.interrupt.set()  # (let it pass at once: what counts is that it weighs again)
    svc.run_tick()
    assert len(weighed) == 2 and not ctl.interrupt.is_set()


def test_declarations_cannot_starve_the_control_loop(tmp_path: Path) -> None:
    """Three control periods in a row give way to a job declared while they weigh a whole
    plan; the fourth weighs its plan to the end (the job declared meanwhile waits, still
    pending), and the count starts again: the fifth gives way again."""
    import threading

    from fabricpilot.service.schemas import IntentIn, PortDeltaIn
    from fabricpilot.service.state import PERIOD_YIELDS_MAX

    svc, ops, ring, hot = _service_with_a_ring(tmp_path)
    ctl = svc.controller
    demands = ctl.demands
    started, declared = threading.Event(), threading.Event()

    def slow_demands(*a, **k):  # type: ignore[no-untyped-def]
        started.set()
        assert declared.wait(10)  # (until the test has declared a job)
        return demands(*a, **k)

    def period_with_a_declaration(i: int) -> None:
        svc.ingest([PortDeltaIn(link_id=hot, interval_ns=1000,
                                tx_bytes=0.95 * 400 * 1000 / 8)])
        started.clear()
        declared.clear()
        ctl.demands = slow_demands  # type: ignore[method-assign]
        period = threading.Thread(target=svc.run_tick)
        period.start()
        assert started.wait(10)
        svc.declare(ops, IntentIn(task_id=f"job{i}", gpus=[8 + i, 72 + i], calls=[ring]),
                    replace_ok=False)
        declared.set()
        period.join(20)
        assert not period.is_alive()
        ctl.demands = demands  # type: ignore[method-assign]

    for i in range(PERIOD_YIELDS_MAX):
        period_with_a_declaration(i)
        assert svc.counters.plans_yielded == i + 1 and f"job{i}" in svc._pending
        svc.plan_pending("intents")
    period_with_a_declaration(PERIOD_YIELDS_MAX)  # weighed to the end
    assert svc.counters.plans_yielded == PERIOD_YIELDS_MAX
    assert f"job{PERIOD_YIELDS_MAX}" in svc._pending and not ctl.interrupt.is_set()
    svc.plan_pending("intents")
    period_with_a_declaration(PERIOD_YIELDS_MAX + 1)  # gives way again
    assert svc.counters.plans_yielded == PERIOD_YIELDS_MAX + 1


def test_who_is_on_a_link(client: httpx.Client) -> None:
    """An operator asks who a link carries: per job, the GPU pairs with a path through it
    and the Gb/s planned on it, which the paths resource and the NIC rate (400 Gb/s; a ring
    of two GPUs sends each pair the whole NIC rate) give independently."""
    c = client
    c.post("/api/v1/jobs", json=_job("acme-l", [0, 64]), headers=_auth(ACME))
    c.post("/api/v1/jobs", json=_job("globex-l", [8, 72]), headers=_auth(GLOBEX))
    _planned_paths(c, "acme-l", ACME)
    _planned_paths(c, "globex-l", GLOBEX)
    body = {t: c.get(f"/api/v1/jobs/{t}/paths", headers=_auth(tok)).json()
            for t, tok in (("acme-l", ACME), ("globex-l", GLOBEX))}
    fabric = {lk["id"]: lk for lk in c.get("/api/v1/fabric", headers=_auth(OPS)).json()["links"]}
    first = body["acme-l"]["pairs"][0]["paths"][0]["links"]
    up = next(lk for lk in first if fabric[lk]["kind"] == "fabric")
    want: dict[str, list[float]] = {}
    for task, b in body.items():
        for pair in b["pairs"]:
            share = sum(q["share"] for q in pair["paths"] if up in q["links"])
            if share:
                acc = want.setdefault(task, [0, 0.0])
                acc[0] += 1
                acc[1] += 400.0 * share
    r = c.get(f"/api/v1/fabric/links/{up}", headers=_auth(OPS))
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["src"], got["dst"], got["kind"]) == (fabric[up]["src"], fabric[up]["dst"],
                                                     "fabric")
    assert {j["task_id"]: j["pairs"] for j in got["jobs"]} == {t: v[0] for t, v in want.items()}
    assert {j["task_id"]: j["planned_gbps"] for j in got["jobs"]} == pytest.approx(
        {t: v[1] for t, v in want.items()})
    assert got["jobs"][0]["tenant"] == ("acme" if want["acme-l"][1] >= want.get(
        "globex-l", [0, 0.0])[1] else "globex")
    assert got["planned_gbps"] == pytest.approx(sum(v[1] for v in want.values()))
    assert not got["down"] and not got["gray"]
    # operators only; an unknown link is named
    assert c.get(f"/api/v1/fabric/links/{up}", headers=_auth(ACME)).status_code == 403
    r = c.get("/api/v1/fabric/links/999999", headers=_auth(OPS))
    assert r.status_code == 404 and r.json()["detail"] == "link 999999 not found"


def test_state_survives_a_restart(tmp_path: Path) -> None:
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        c.post("/api/v1/jobs", json=_job("acme-r", [0, 64, 1]), headers=_auth(ACME))
        c.post("/api/v1/jobs", json=_job("globex-r", [8, 72], "alltoall"),
               headers=_auth(GLOBEX))
        for t, tok in (("acme-r", ACME), ("globex-r", GLOBEX)):
            _planned_job(c, t, tok)  # (the jobs read below say so: planned, their verdict)
        paths = {t: _planned_paths(c, t, tok) for t, tok in (("acme-r", ACME),
                                                           ("globex-r", GLOBEX))}
        c.post("/api/v1/faults", headers=_auth(OPS), json={"kind": "gray", "link_id": 300})
        jobs = c.get("/api/v1/jobs", headers=_auth(OPS)).json()
        events = c.get("/api/v1/events", headers=_auth(OPS)).json()
        assert any(e["kind"] == "fault-gray" for e in events)
    app2, svc2 = _service(tmp_path)
    assert svc2.restored["jobs"] == len(jobs) and svc2.restored["faults"] == 1
    with TestClient(app2) as c:
        assert c.get("/api/v1/jobs", headers=_auth(OPS)).json() == jobs
        for t, tok in (("acme-r", ACME), ("globex-r", GLOBEX)):
            assert _planned_paths(c, t, tok) == paths[t]
        assert 300 in svc2.controller.degraded
        # the timeline of reroutes, heals and faults is back too (then the restart's own)
        again = c.get("/api/v1/events", headers=_auth(OPS)).json()
        assert again[:len(events)] == events


def test_withdrawn_path_sets_do_not_come_back_after_a_restart(tmp_path: Path) -> None:
    """A job shrunk from the ring 0 -> 64 -> 1 -> 0 to 0 <-> 64: the switches no longer hold
    the paths of 64 -> 1 and 1 -> 0, and a restart must not install them again."""
    app, svc = _service(tmp_path)
    with TestClient(app) as c:
        c.post("/api/v1/jobs", json=_job("acme-s", [0, 64, 1]), headers=_auth(ACME))
        before = _planned_paths(c, "acme-s", ACME)
        r = c.put("/api/v1/jobs/acme-s", json=_job("acme-s", [0, 64]), headers=_auth(ACME))
        assert r.status_code == 200, r.text
        # (read once its plan is over: the plan withdraws the pairs the job no longer has
        # before it installs the new ones, so a read in between sees neither)
        _planned_job(c, "acme-s", ACME)
        after = _planned_paths(c, "acme-s", ACME)
    assert set(after) == {"acme-s:0->64", "acme-s:64->0"}
    withdrawn = before.keys() - after.keys()
    assert withdrawn == {"acme-s:64->1", "acme-s:1->0"}
    assert set(svc.store.paths()) == set(svc.dp.installed) == set(after)

    app2, svc2 = _service(tmp_path)
    assert set(svc2.store.paths()) == set(after)
    with TestClient(app2) as c:
        assert _planned_paths(c, "acme-s", ACME) == after
    assert not withdrawn & set(svc2.dp.installed)


def test_ports_reported_down_are_known_as_such_after_a_restart(tmp_path: Path) -> None:
    """A link its switch reported down (telemetry) and one an operator reported down; after
    a restart both are still down, and the switches then saying both ports are up brings
    back the first only: the operator's report stands until an operator says otherwise."""
    from fabricpilot.service.schemas import FaultIn, PortDeltaIn

    svc, ops, _, hot = _service_with_a_ring(tmp_path)
    other = next(lk for lk, li in svc.view.links.items() if li.kind == "fabric" and lk != hot)
    svc.ingest([PortDeltaIn(link_id=hot, interval_ns=1000, oper_up=False)])
    assert svc.tick_now()["links_down"] == [hot]
    svc.report_fault(ops, FaultIn(kind="down", link_id=other))
    assert {hot, other} <= svc.controller.down
    _, svc2 = _service(tmp_path)
    assert {hot, other} <= svc2.controller.down
    svc2.ingest([PortDeltaIn(link_id=lk, interval_ns=1000, oper_up=True) for lk in (hot, other)])
    assert svc2.tick_now()["links_up"] == [hot]
    assert hot not in svc2.controller.down and other in svc2.controller.down
    ups = [f["link_id"] for f in svc2.faults(ops, 100)
           if f["kind"] == "up" and f["source"] == "telemetry"]
    assert ups == [hot]


def test_each_link_seen_down_counts_the_path_sets_moved_off_it(tmp_path: Path) -> None:
    """Two links of the ring seen down in one control period, one on each direction's
    paths: each fault's event counts the one path set that crossed it (not the period's
    two), the heal's counts both."""
    from fabricpilot.service.schemas import PortDeltaIn

    svc, _, _, hot = _service_with_a_ring(tmp_path)
    back = next(lk for p in svc.dp.installed["ring:64->0"].paths for lk in p
                if svc.view.links[lk].kind == "fabric")
    before = dict(svc.dp.installed)
    crossing = {lk: {k for k, ps in before.items() if any(lk in p for p in ps.paths)}
                for lk in (hot, back)}
    assert crossing == {hot: {"ring:0->64"}, back: {"ring:64->0"}}
    svc.ingest([PortDeltaIn(link_id=lk, interval_ns=1000, oper_up=False) for lk in (hot, back)])
    assert sorted(svc.tick_now()["links_down"]) == sorted([hot, back])
    events = list(svc.events)
    downs = [e for e in events if e["kind"] == "fault-down"]
    assert [e["path_sets"] for e in downs] == [1, 1]
    (heal,) = [e for e in events if e["kind"] == "heal"]
    assert heal["path_sets"] == 2 and set(heal["keys"]) == {"ring:0->64", "ring:64->0"}


def test_a_jobs_paths_come_in_pair_order_encoded_as_read(tmp_path: Path) -> None:
    """``GET .../paths``: the body the controller's side encodes is the pairs' records, in
    (source, destination) order by number (GPU 2 before GPU 10), filtered by src / dst."""
    app, svc = _service(tmp_path)
    gpus = [0, 2, 10, 64, 66, 70]
    ops = Principal("ops", "operator")
    with TestClient(app) as c:
        r = c.post("/api/v1/jobs", headers=_auth(OPS),
                   json=_job("a2a", gpus, "alltoall", size_bytes=1 << 20))
        assert r.status_code == 201, r.text
        # (the control loop plans it: planning here as well found nothing to plan when the
        # loop had taken the job but not yet planned it)
        assert svc.wait_planned(timeout_s=30)
        body = c.get("/api/v1/jobs/a2a/paths", headers=_auth(OPS))
        assert body.headers["content-type"] == "application/json"
        got = body.json()
        assert got == svc.paths(ops, "a2a")
        ends = [(x["src"], x["dst"]) for x in got["pairs"]]
        assert ends == [(a, b) for a in gpus for b in gpus if a != b]  # (sorted already)
        assert all(x["planned"] and x["paths"] for x in got["pairs"])
        one = c.get("/api/v1/jobs/a2a/paths?src=10", headers=_auth(OPS)).json()
        assert [(x["src"], x["dst"]) for x in one["pairs"]] == [(10, b) for b in gpus
                                                                if b != 10]
        both = c.get("/api/v1/jobs/a2a/paths?src=2&dst=66", headers=_auth(OPS)).json()
        assert [(x["src"], x["dst"]) for x in both["pairs"]] == [(2, 66)]
        assert c.get("/api/v1/jobs/nope/paths", headers=_auth(OPS)).status_code == 404
        r = c.get("/api/v1/jobs/a2a/paths?src=2&dst=999", headers=_auth(OPS))
        assert r.status_code == 422 and r.json()["detail"] == (
            "dst: GPU 999 is not one of a2a's GPUs")


def test_openapi_lists_every_resource(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for route, methods in {"/api/v1/jobs": {"get", "post"},
                           "/api/v1/jobs/{task_id}": {"get", "put", "delete"},
                           "/api/v1/jobs/{task_id}/calls": {"get", "post"},
                           "/api/v1/jobs/{task_id}/paths": {"get"},
                           "/api/v1/telemetry": {"post"}, "/api/v1/faults": {"get", "post"},
                           "/api/v1/congestion": {"get"}, "/api/v1/fabric": {"get"},
                           "/api/v1/fabric/links/{link_id}": {"get"},
                           "/health": {"get"}, "/metrics": {"get"}}.items():
        assert methods <= set(paths[route]), route
    # request bodies are the validated models, and each route that takes one says which
    assert "IntentIn" in spec["components"]["schemas"]
    for route, method, model in (("/api/v1/jobs", "post", "IntentIn"),
                                 ("/api/v1/jobs/{task_id}", "put", "IntentIn"),
                                 ("/api/v1/jobs/{task_id}/calls", "post", "AnnounceIn"),
                                 ("/api/v1/telemetry", "post", "TelemetryIn"),
                                 ("/api/v1/faults", "post", "FaultIn"),
                                 ("/api/v1/twin/faults", "post", "TwinFaultsIn")):
        body = paths[route][method]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}, route
        assert model in spec["components"]["schemas"]
    assert spec["components"]["schemas"]["CallIn"]["properties"]["size_bytes"][
        "exclusiveMinimum"] == 0


def test_a_port_posted_down_is_healed_at_once(tmp_path: Path) -> None:
    """Control periods every hour: a switch posting a port down still gets it healed within
    seconds (the loop runs a period at once), and the same report again, or a port that
    says up as it always did, does not make it run again."""
    svc, _, _, hot = _service_with_a_ring(tmp_path)
    svc.start()
    try:
        from fabricpilot.service.schemas import PortDeltaIn

        periods = svc.controller.tick
        calls: list[int] = []
        svc.controller.tick = lambda *a: calls.append(1) or periods(*a)  # type: ignore[method-assign]
        svc.ingest([PortDeltaIn(link_id=hot, interval_ns=1000, oper_up=False)])
        wait_until(lambda: hot in svc.controller.down, timeout_s=10, poll_s=0.01)
        with svc.lock:  # (the period that healed it is over)
            assert all(hot not in p for ps in svc.dp.installed.values() for p in ps.paths)
        n = len(calls)
        other = next(lk for lk, li in svc.view.links.items() if li.kind == "fabric" and lk != hot)
        svc.ingest([PortDeltaIn(link_id=hot, interval_ns=1000, oper_up=False),
                    PortDeltaIn(link_id=other, interval_ns=1000, oper_up=True)])
        time.sleep(0.5)
        assert len(calls) == n
    finally:
        svc.stop()


def test_a_body_nested_too_deeply_gets_a_422(tmp_path: Path) -> None:
    """JSON's parser recurses per nesting level: 1 100 levels (a 2 kB body) passed its
    limit and the server answered a plain-text 500."""
    app, _ = _service(tmp_path)
    deep = b'{"task_id":' + b"[" * 1100 + b"]" * 1100 + b"}"
    with TestClient(app, raise_server_exceptions=False) as c:
        for url in ("/api/v1/jobs", "/api/v1/faults", "/api/v1/telemetry"):
            r = c.post(url, content=deep, headers={**_auth(OPS),
                                                   "content-type": "application/json"})
            assert r.status_code == 422, (url, r.text)
            assert r.json()["detail"][0]["type"] == "json_invalid"


def test_every_body_route_reads_its_body_alike(tmp_path: Path) -> None:
    """The six routes that take a body read it the same way, whatever its Content-Type
    (``curl -d`` sends a form type): JSON nested 600 levels (within what the duplicate-key
    check parses, past what the route's parser takes) and bytes that are not UTF-8 get a
    422 at ``loc ["body"]``, not echoed; a JSON body sent as a form is read as JSON. (The
    fault and call routes once had FastAPI parse them: a 500 from the nesting, a 400 from the
    bytes, a refusal of the form type.)"""
    app, _ = _service(tmp_path)
    deep = b"[" * 600 + b"]" * 600
    routes = (("POST", "/api/v1/jobs", OPS), ("PUT", "/api/v1/jobs/j", OPS),
              ("POST", "/api/v1/telemetry", OPS), ("POST", "/api/v1/faults", OPS),
              ("POST", "/api/v1/twin/faults", OPS), ("POST", "/api/v1/jobs/j/calls", ACME))
    with TestClient(app, raise_server_exceptions=False) as c:
        for method, url, who in routes:
            for body in (b'{"detail":' + deep + b"}", b'{"kind":"down","detail":"\xff"}'):
                r = c.request(method, url, content=body, headers={
                    **_auth(who), "content-type": "application/json"})
                assert r.status_code == 422, (url, body[:20], r.text)
                assert r.json()["detail"][0]["type"] == "json_invalid", (url, r.text)
                assert [e["loc"] for e in r.json()["detail"]] == [["body"]], (url, r.text)
                assert "input" not in r.json()["detail"][0]
        form = {"content-type": "application/x-www-form-urlencoded"}
        r = c.post("/api/v1/faults", content=b'{"kind":"gray","link_id":1}',
                   headers={**_auth(OPS), **form})
        assert r.status_code == 201, r.text
        r = c.post("/api/v1/jobs", content=json.dumps(_job("formed", [0, 64])).encode(),
                   headers={**_auth(ACME), **form})
        assert r.status_code == 201, r.text
        r = c.post("/api/v1/jobs/formed/calls", headers={**_auth(ACME), **form},
                   content=b'{"pattern":"alltoall","size_bytes":4096,"ranks":[0,64]}')
        assert r.status_code == 200, r.text


def test_an_integral_float_past_a_bound_names_the_bound(client: httpx.Client) -> None:
    """``1e20`` bytes is an integer past the 2**50 limit: the 422 says so, as it does for
    2**50 + 1 (not "Unable to parse input string as an integer")."""
    c = client
    for size in ("1e20", "1e30", str((1 << 50) + 1)):
        body = ('{"task_id":"big","gpus":[0,64],"calls":[{"pattern":"allreduce",'
                f'"size_bytes":{size},"sla_us":500}}]}}')
        r = c.post("/api/v1/jobs", content=body.encode(), headers={
            **_auth(ACME), "content-type": "application/json"})
        assert r.status_code == 422, r.text
        err = r.json()["detail"][0]
        assert err["type"] == "less_than_equal", err
        assert err["loc"] == ["body", "calls", 0, "size_bytes"]


def test_a_withdrawn_jobs_calls_are_gone_with_it(tmp_path: Path) -> None:
    """A job declared again under a withdrawn task id, here by another tenant, lists none
    of the withdrawn job's announced calls (they named the other tenant's GPUs)."""
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        assert c.post("/api/v1/jobs", json=_job("shared-id", [0, 64]),
                      headers=_auth(ACME)).status_code == 201
        r = c.post("/api/v1/jobs/shared-id/calls", headers=_auth(ACME), json={
            "pattern": "alltoall", "size_bytes": 12345, "ranks": [0, 64], "bucket": 7})
        assert r.status_code == 200, r.text
        assert len(c.get("/api/v1/jobs/shared-id/calls", headers=_auth(ACME)).json()) == 1
        assert c.delete("/api/v1/jobs/shared-id", headers=_auth(ACME)).status_code == 204
        assert c.post("/api/v1/jobs", json=_job("shared-id", [8, 72]),
                      headers=_auth(GLOBEX)).status_code == 201
        assert c.get("/api/v1/jobs/shared-id/calls", headers=_auth(GLOBEX)).json() == []
        job = c.get("/api/v1/jobs/shared-id", headers=_auth(GLOBEX)).json()
        assert [call["size_bytes"] for call in job["calls"]] == [64 << 20]


def test_a_job_declared_again_keeps_only_the_announced_calls_it_gives(tmp_path: Path
                                                                        ) -> None:
    """A ``PUT`` gives the job its calls: announced calls it gives back (a GET put back)
    keep their bucket, the others go from ``GET .../calls`` as from the plan, and stay
    gone after a restart."""
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        assert c.post("/api/v1/jobs", json=_job("a1", [0, 1, 64, 65]),
                      headers=_auth(ACME)).status_code == 201
        for bucket, size in ((7, 1000), (8, 2000), (7, 3000)):  # (bucket 7 announced twice)
            r = c.post("/api/v1/jobs/a1/calls", headers=_auth(ACME), json={
                "pattern": "allreduce", "size_bytes": size, "ranks": [0, 1, 64, 65],
                "bucket": bucket})
            assert r.status_code == 200, r.text
        logged = c.get("/api/v1/jobs/a1/calls", headers=_auth(ACME)).json()
        assert [(x["bucket"], x["size_bytes"]) for x in logged] == [(7, 1000), (8, 2000),
                                                                   (7, 3000)]
        # (the first announcement over the whole job replaced the AllReduce declared
        # without pairs, as a framework's placeholder is)
        job = c.get("/api/v1/jobs/a1", headers=_auth(ACME)).json()
        assert sorted(x["size_bytes"] for x in job["calls"]) == [2000, 3000]
        # the GET body put back as it is (its read-back fields ignored): both announced
        # calls it holds keep their buckets (bucket 7's first one, replaced, is gone)
        r = c.put("/api/v1/jobs/a1", headers=_auth(ACME), json=job)
        assert r.status_code == 200, r.text
        assert [(x["bucket"], x["size_bytes"]) for x in c.get(
            "/api/v1/jobs/a1/calls", headers=_auth(ACME)).json()] == [(8, 2000), (7, 3000)]
        again = c.get("/api/v1/jobs/a1", headers=_auth(ACME)).json()
        assert again["calls"] == job["calls"] and again["gpus"] == job["gpus"]
        # (any other unknown field is still refused)
        r = c.put("/api/v1/jobs/a1", headers=_auth(ACME), json={**job, "sla_mett": True})
        assert r.status_code == 422 and "sla_mett" in r.text
        # put back without bucket 8's call: bucket 7's current announcement stays
        kept = [x for x in job["calls"] if x["size_bytes"] != 2000]
        r = c.put("/api/v1/jobs/a1", headers=_auth(ACME),
                  json={"task_id": "a1", "gpus": job["gpus"], "calls": kept})
        assert r.status_code == 200, r.text
        logged = c.get("/api/v1/jobs/a1/calls", headers=_auth(ACME)).json()
        assert [(x["bucket"], x["size_bytes"]) for x in logged] == [(7, 3000)]
        # bucket 7 announced again replaces its call (the job does not grow)
        r = c.post("/api/v1/jobs/a1/calls", headers=_auth(ACME), json={
            "pattern": "allreduce", "size_bytes": 4000, "ranks": [0, 1, 64, 65], "bucket": 7})
        assert r.status_code == 200 and r.json()["changed_intent"] is True
        job = c.get("/api/v1/jobs/a1", headers=_auth(ACME)).json()
        assert sorted(x["size_bytes"] for x in job["calls"]) == [4000]
        # on other GPUs with a call of its own: nothing announced is left
        r = c.put("/api/v1/jobs/a1", json=_job("a1", [0, 64]), headers=_auth(ACME))
        assert r.status_code == 200, r.text
        assert c.get("/api/v1/jobs/a1/calls", headers=_auth(ACME)).json() == []
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        assert c.get("/api/v1/jobs/a1/calls", headers=_auth(ACME)).json() == []
        job = c.get("/api/v1/jobs/a1", headers=_auth(ACME)).json()
        assert [x["size_bytes"] for x in job["calls"]] == [64 << 20]


def test_an_announcement_replaces_the_call_declared_without_pairs(tmp_path: Path) -> None:
    """A framework declares its job with one AllReduce of a guessed size and no pairs (the
    PyTorch hook: 25 MiB) and then announces its real buckets over the whole job: the
    first announcement replaces the guess (one call of the same pattern over the same
    ranks), the next ones add calls. Once the guess is gone, an announcement over part of
    the job adds a call; one of another pattern replaces nothing."""
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        body = {"task_id": "ddp", "gpus": [0, 1, 64, 65], "calls": [
            {"pattern": "allreduce", "size_bytes": 25 << 20, "sla_us": 1000.0},
            {"pattern": "alltoall", "size_bytes": 1 << 20, "sla_us": 1000.0}]}
        assert c.put("/api/v1/jobs/ddp", json=body, headers=_auth(ACME)).status_code == 201

        def sizes() -> list[tuple[str, int]]:
            job = c.get("/api/v1/jobs/ddp", headers=_auth(ACME)).json()
            return sorted((x["pattern"], x["size_bytes"]) for x in job["calls"])

        def announce(size: int, bucket: int, ranks: list[int]) -> None:
            r = c.post("/api/v1/jobs/ddp/calls", headers=_auth(ACME), json={
                "pattern": "allreduce", "size_bytes": size, "ranks": ranks, "bucket": bucket})
            assert r.status_code == 200, r.text

        announce(4096, 0, [0, 1, 64, 65])
        assert sizes() == [("allreduce", 4096), ("alltoall", 1 << 20)]
        announce(512, 1, [0, 1, 64, 65])
        assert sizes() == [("allreduce", 512), ("allreduce", 4096), ("alltoall", 1 << 20)]
        announce(100, 2, [0, 64])  # (part of the job: added)
        assert sizes() == [("allreduce", 100), ("allreduce", 512), ("allreduce", 4096),
                           ("alltoall", 1 << 20)]


def test_an_announcement_without_an_sla_keeps_the_jobs_sla_and_priority(
        tmp_path: Path) -> None:
    """The PyTorch hook announces its buckets without an SLA or a priority. A bucket that
    replaces the job's declared AllReduce takes that call's SLA (60 us: L2) and priority
    (5), as do the buckets after it; one of a pattern the job never declared takes the
    default (1 ms, L3) and priority 0; an SLA given is the SLA. (Every bucket once came
    in at 1 ms and priority 0: the job's L2 SLA and priority lost at its first bucket.)"""
    app, svc = _service(tmp_path)
    with TestClient(app) as c:
        body = {"task_id": "ddp", "gpus": [0, 1, 64, 65], "calls": [
            {"pattern": "allreduce", "size_bytes": 25 << 20, "sla_us": 60.0,
             "priority": 5}]}
        assert c.put("/api/v1/jobs/ddp", json=body, headers=_auth(ACME)).status_code == 201
        for pattern, size, bucket, sla, level in (("allreduce", 4096, 0, None, "L2"),
                                                  ("allreduce", 512, 1, None, "L2"),
                                                  ("allgather", 512, 0, None, "L3"),
                                                  ("allreduce", 256, 2, 30.0, "L1")):
            r = c.post("/api/v1/jobs/ddp/calls", headers=_auth(ACME), json={
                "pattern": pattern, "size_bytes": size, "ranks": [0, 1, 64, 65],
                "bucket": bucket, **({"sla_us": sla} if sla else {})})
            assert r.status_code == 200, r.text
            assert r.json()["sla_level"] == level, (pattern, bucket, r.text[:300])
    calls = {(c.pattern, c.size_bytes): (c.sla_us, c.priority)
             for c in svc.intents["ddp"].calls}
    assert calls == {("allreduce", 4096): (60.0, 5), ("allreduce", 512): (60.0, 5),
                     ("allgather", 512): (1000.0, 0), ("allreduce", 256): (30.0, 5)}
    svc.store.close()
    # restarted, the service knows which call is which bucket (priority included): the
    # same bucket announced again changes nothing
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        r = c.post("/api/v1/jobs/ddp/calls", headers=_auth(ACME), json={
            "pattern": "allreduce", "size_bytes": 512, "ranks": [0, 1, 64, 65], "bucket": 1})
        assert r.status_code == 200 and r.json()["changed_intent"] is False, r.text[:300]


def test_a_process_groups_announcement_replaces_the_guess_over_the_whole_job(
        tmp_path: Path) -> None:
    """DDP over two process groups (data parallelism across two hosts, one group per rail:
    {0, 64} and {1, 65}): the job is declared with the hook's 25 MiB AllReduce guess over
    all four GPUs, an AllReduce no group runs (its ring would cross the rails). The first
    group's announcement replaces it; the second group's adds its own call. The plan then
    holds the two groups' rail pairs only: 0 <-> 64 and 1 <-> 65, no pair across the
    rails, where the guess had 0 -> 1 and 64 -> 65 (NVLink) too."""
    app, svc = _service(tmp_path)
    with TestClient(app) as c:
        body = {"task_id": "tp-dp", "gpus": [0, 1, 64, 65], "calls": [
            {"pattern": "allreduce", "size_bytes": 25 << 20, "sla_us": 1000.0}]}
        assert c.put("/api/v1/jobs/tp-dp", json=body, headers=_auth(ACME)).status_code == 201

        def announce(ranks: list[int]) -> None:
            r = c.post("/api/v1/jobs/tp-dp/calls", headers=_auth(ACME), json={
                "pattern": "allreduce", "size_bytes": 4096, "ranks": ranks, "bucket": 0})
            assert r.status_code == 200, r.text

        announce([0, 64])
        job = c.get("/api/v1/jobs/tp-dp", headers=_auth(ACME)).json()
        assert [(x["size_bytes"], sorted(map(tuple, x["pairs"]))) for x in job["calls"]] == [
            (4096, [(0, 64), (64, 0)])]
        announce([1, 65])
        job = c.get("/api/v1/jobs/tp-dp", headers=_auth(ACME)).json()
        assert sorted(tuple(p) for x in job["calls"] for p in x["pairs"]) == [
            (0, 64), (1, 65), (64, 0), (65, 1)]
    planned = {k.split(":")[1] for k in svc.dp.installed if k.startswith("tp-dp:")}
    assert planned == {"0->64", "64->0", "1->65", "65->1"}


def test_announced_calls_stop_at_the_most_a_job_may_declare(tmp_path: Path) -> None:
    """A job holds at most 256 calls (what a PUT may give): the 257th announced is refused
    with 409 (its AlltoAlls leave no AllReduce for it to replace), and what GET shows can
    be PUT back."""
    app, _ = _service(tmp_path)
    calls = [{"pattern": "alltoall", "size_bytes": 1000 + i, "sla_us": 500.0}
             for i in range(256)]
    with TestClient(app) as c:
        body = {"task_id": "full", "gpus": [0, 64], "calls": calls}
        assert c.post("/api/v1/jobs", json=body, headers=_auth(ACME)).status_code == 201
        r = c.post("/api/v1/jobs/full/calls", headers=_auth(ACME), json={
            "pattern": "allreduce", "size_bytes": 5000, "ranks": [0, 64], "bucket": 1})
        assert r.status_code == 409, r.text
        assert "256" in r.json()["detail"]
        job = c.get("/api/v1/jobs/full", headers=_auth(ACME)).json()
        assert len(job["calls"]) == 256
        back = {"task_id": "full", "gpus": job["gpus"], "calls": job["calls"]}
        assert c.put("/api/v1/jobs/full", json=back, headers=_auth(ACME)).status_code == 200


def test_every_route_is_measured_by_its_template(client: httpx.Client) -> None:
    c = client
    assert c.post("/api/v1/jobs", json=_job("acme-m", [0, 64]),
                  headers=_auth(ACME)).status_code == 201
    assert c.put("/api/v1/jobs/acme-m", json=_job("acme-m", [0, 1]),
                 headers=_auth(ACME)).status_code == 200
    assert c.post("/api/v1/telemetry", headers=_auth(OPS), json={
        "deltas": [{"link_id": 1, "interval_ns": 1000}]}).status_code == 202
    text = c.get("/metrics").text
    for method, route, status in (("POST", "/api/v1/jobs", 201),
                                  ("PUT", "/api/v1/jobs/{task_id}", 200),
                                  ("POST", "/api/v1/telemetry", 202)):
        name = (f'fabricpilot_api_request_seconds_count{{method="{method}",route="{route}",'
                f'status="{status}"}}')
        assert _metric(text, name) == 1.0, name
    assert 'route="<unmatched>",status="201"' not in text


def test_a_client_that_goes_before_its_body_is_whole_is_no_server_error(
        client: httpx.Client) -> None:
    """A client that closes its connection halfway through a body gets no answer (no one
    is left to read it); the service logs and counts the request as 499, as proxies log
    a request their client closed, not as a 500 with a traceback (operators' 5xx alerts
    would fire for a client's hang-up). The service answers the next request as usual."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(str(client.base_url))
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/telemetry HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + OPS.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                     b'{"deltas": [')
    name = ('fabricpilot_api_request_seconds_count{method="POST",route="<unmatched>",'
            'status="499"}')
    deadline = time.monotonic() + 10
    while name not in (text := client.get("/metrics").text):
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.05)
    assert _metric(text, name) == 1.0
    assert 'status="500"' not in text
    assert client.post("/api/v1/telemetry", headers=_auth(OPS), json={
        "deltas": [{"link_id": 1, "interval_ns": 1000}]}).status_code == 202


def test_a_405_allows_every_method_of_its_path(client: httpx.Client) -> None:
    c = client
    for method, url, allow in (("PATCH", "/api/v1/jobs", "GET, POST"),
                               ("POST", "/api/v1/jobs/x", "DELETE, GET, PUT"),
                               ("DELETE", "/api/v1/faults", "GET, POST"),
                               ("POST", "/health", "GET, HEAD")):
        r = c.request(method, url, headers=_auth(OPS))
        assert r.status_code == 405, (method, url, r.text)
        assert r.headers["allow"] == allow, (method, url)


def test_a_body_that_is_not_json_is_not_echoed(client: httpx.Client) -> None:
    c = client
    for body in (b"kind=up&link_id=600", b'{"kind":"up","link_id":1,"detail":"\xff"}'):
        r = c.post("/api/v1/faults", content=body, headers={
            **_auth(OPS), "content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 422, r.text
        assert [e["loc"] for e in r.json()["detail"]] == [["body"]]
        assert all("input" not in e for e in r.json()["detail"])
    r = c.post("/api/v1/jobs/x/calls", content=b"{nope", headers={
        **_auth(OPS), "content-type": "application/json"})
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["body"]]
    assert "input" not in r.json()["detail"][0]


def test_telemetry_that_no_port_can_count_is_refused(tmp_path: Path) -> None:
    """Bytes a link cannot carry in the interval, a pause longer than the interval, more
    ECN-marked packets than twice the smallest frames (64 B + 20 B of preamble and gap) the
    line rate sends, more corrected bit errors than bits received, more uncorrectable
    frames than 64-byte frames in them: 422 naming the delta's field, and the congestion
    map as it was. A port at its line rate (the link's Gb/s x the interval's ns / 8 bytes)
    is accepted."""
    app, svc = _service(tmp_path)
    gbps = svc.view.links[1].capacity_gbps
    line_rate_bytes = gbps * 1000 / 8  # in 1 000 ns
    h = _auth(OPS)
    with TestClient(app) as c:
        for delta, field in (({"tx_bytes": 2.01 * line_rate_bytes}, "deltas.0.tx_bytes"),
                             ({"rx_bits": 2.01 * 8 * line_rate_bytes}, "deltas.0.rx_bits"),
                             ({"pause_ns": 1001}, "deltas.0.pause_ns"),
                             ({"tx_bytes": 1e21, "pause_ns": 1e21}, "deltas.0.pause_ns"),
                             ({"ecn_marks": 2.01 * line_rate_bytes / 84},
                              "deltas.0.ecn_marks"),
                             ({"rx_bits": 1e5, "fec_corrected": 1.01e5},
                              "deltas.0.fec_corrected"),
                             ({"fec_uncorrected": 1e20}, "deltas.0.fec_uncorrected"),
                             ({"rx_bits": 512e3, "fec_uncorrected": 1001},
                              "deltas.0.fec_uncorrected")):
            r = c.post("/api/v1/telemetry", headers=h, json={"deltas": [
                {"link_id": 1, "interval_ns": 1000, **delta}]})
            assert r.status_code == 422, (delta, r.text)
            assert r.json()["detail"].startswith(field), r.text
        assert c.post("/api/v1/control/tick", headers=h).status_code == 200
        assert max(svc.controller.map.utilization().values()) == 0.0
        r = c.post("/api/v1/telemetry", headers=h, json={"deltas": [
            {"link_id": 1, "interval_ns": 1000, "tx_bytes": line_rate_bytes,
             "pause_ns": 1000, "ecn_marks": line_rate_bytes / 84, "rx_bits": 512e3,
             "fec_corrected": 512e3, "fec_uncorrected": 1000}]})
        assert r.status_code == 202, r.text


def test_telemetry_drops_queues_and_switches_no_port_could_report_are_refused(
        tmp_path: Path) -> None:
    """A port drops at most what arrives at its switch: twice the smallest frames (64 B)
    that all the switch's inbound links carry in the interval; a queue holds at most
    64 GiB (beyond any switch's buffer); a batch that names its switch names a node of the
    fabric, and each of its ports is a link leaving it. Each such delta once went in and
    held its link hot until the next report (1e20 drops and a 1e20-byte queue)."""
    app, svc = _service(tmp_path)
    link = next(lk for lk in svc.view.links.values() if lk.kind == "fabric")
    inbound_gbps = sum(c for _, _, c in svc.view.graph.in_edges(link.src,
                                                                data="capacity_gbps"))
    most_drops = 2 * inbound_gbps * 1000 / 512  # (in 1 000 ns)
    h = _auth(OPS)
    other = next(n for n in svc.view.graph if n != link.src)
    with TestClient(app) as c:
        for body, problem in (
                ({"deltas": [{"drops": 1.01 * most_drops}]},
                 f"deltas.0.drops: {1.01 * most_drops:g} packets dropped in 1000 ns is more "
                 f"than twice the smallest frames the {inbound_gbps:g} Gb/s into {link.src} "
                 "bring"),
                ({"deltas": [{"queue_bytes": 1e20}]},
                 "deltas.0.queue_bytes: 1e+20 bytes is more than any switch buffers (at most "
                 "6.87195e+10)"),
                ({"switch": "nosuchswitch", "deltas": [{}]},
                 "switch: no node 'nosuchswitch' in the fabric"),
                ({"switch": other, "deltas": [{}]},
                 f"deltas.0.link_id: link {link.link_id} leaves {link.src}, not {other!r} "
                 "(the batch's switch)"),
                ({"switch": "x" * 100, "deltas": [{}]},
                 f"switch: no node '{'x' * 40}...' (100 characters) in the fabric")):
            body["deltas"] = [{"link_id": link.link_id, "interval_ns": 1000, **d}
                              for d in body["deltas"]]
            r = c.post("/api/v1/telemetry", headers=h, json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["detail"] == problem
        assert c.post("/api/v1/control/tick", headers=h).status_code == 200
        assert svc.controller.map.hot_links() == []
        r = c.post("/api/v1/telemetry", headers=h, json={"switch": link.src, "deltas": [
            {"link_id": link.link_id, "interval_ns": 1000, "drops": most_drops,
             "queue_bytes": 2**36}]})
        assert r.status_code == 202, r.text


def test_a_long_value_refused_is_not_echoed_whole(tmp_path: Path) -> None:
    """A refusal quotes what it refuses: a megabyte-long node name comes back as its first
    40 characters and its length, not as a megabyte of answer."""
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        r = c.post("/api/v1/faults", headers=_auth(OPS), json={
            "kind": "down", "endpoints": ["x" * 1_000_000, "leaf0"]})
        assert r.status_code == 422, r.text[:300]
        assert len(r.content) < 300 and "(1000000 characters)" in r.json()["detail"], r.text


def test_a_withdrawn_twin_job_stays_withdrawn_after_a_restart(tmp_path: Path) -> None:
    """The twin's scenario jobs declare themselves at a start; one an operator withdrew
    does not, until it is declared again."""
    ops = Principal("ops", "operator")

    def start() -> object:
        return build(default_scenario(), "default", tmp_path, tokens=_tokens(), twin=True,
                     tick_interval_s=3600.0)[1]

    svc = start()
    assert "vision-dp" in svc.intents  # type: ignore[attr-defined]
    body = svc.job(ops, "vision-dp")  # type: ignore[attr-defined]
    svc.withdraw(ops, "vision-dp")  # type: ignore[attr-defined]
    svc.store.close()  # type: ignore[attr-defined]
    svc = start()
    assert "vision-dp" not in svc.intents  # type: ignore[attr-defined]
    assert "llm-dp" in svc.intents  # type: ignore[attr-defined]
    svc.declare(ops, IntentIn(task_id="vision-dp", tenant="twin", gpus=body["gpus"],  # type: ignore[attr-defined]
                              calls=body["calls"]), replace_ok=False)
    svc.store.close()  # type: ignore[attr-defined]
    assert "vision-dp" in start().intents  # type: ignore[attr-defined]


def test_the_plan_epoch_goes_on_across_a_restart(tmp_path: Path) -> None:
    """Clients tell plans apart by their epoch: a restart (whose first plan takes back the
    switches' path sets) counts on from the last one, it does not start again at 1."""
    app, _ = _service(tmp_path)
    with TestClient(app) as c:
        c.post("/api/v1/jobs", json=_job("acme-e", [0, 64]), headers=_auth(ACME))
        _planned_paths(c, "acme-e", ACME)
        c.put("/api/v1/jobs/acme-e", json=_job("acme-e", [0, 1]), headers=_auth(ACME))
        wait_until(lambda: c.get("/api/v1/jobs/acme-e", headers=_auth(ACME)).json()["planned"])
        before = c.get("/health").json()["plan_epoch"]
    assert before >= 3  # (the start's plan, then one per declaration)
    app2, _ = _service(tmp_path)
    with TestClient(app2) as c:
        assert c.get("/health").json()["plan_epoch"] == before + 1  # (the restart's plan)


def test_put_says_whether_it_created_the_job(client: httpx.Client) -> None:
    c = client
    r = c.put("/api/v1/jobs/acme-p", json=_job("acme-p", [0, 64]), headers=_auth(ACME))
    assert r.status_code == 201, r.text
    assert r.json()["task_id"] == "acme-p"
    r = c.put("/api/v1/jobs/acme-p", json=_job("acme-p", [0, 1]), headers=_auth(ACME))
    assert r.status_code == 200, r.text
    assert r.json()["gpus"] == [0, 1]
    spec = c.get("/openapi.json").json()
    assert {"200", "201"} <= set(spec["paths"]["/api/v1/jobs/{task_id}"]["put"]["responses"])


def test_the_spec_documents_the_errors_the_routes_answer(tmp_path: Path) -> None:
    """Each error a route really answers is among the responses the OpenAPI spec gives it,
    with a body schema that fits it (a one-line ``detail`` or FastAPI's list)."""
    app, _ = _service(tmp_path, max_body_bytes=4096)
    with TestClient(app) as c:
        spec = c.get("/openapi.json").json()
        c.post("/api/v1/jobs", json=_job("acme-d", [0, 64]), headers=_auth(ACME))
        cases = [
            ("get", "/api/v1/jobs", "/api/v1/jobs", {}, None),
            ("get", "/api/v1/jobs/{task_id}", "/api/v1/jobs/acme-d", _auth(GLOBEX), None),
            ("get", "/api/v1/jobs/{task_id}", "/api/v1/jobs/nope", _auth(OPS), None),
            ("post", "/api/v1/jobs", "/api/v1/jobs", _auth(ACME), _job("acme-d", [0, 64])),
            ("post", "/api/v1/jobs", "/api/v1/jobs", _auth(ACME), _job("x", [0] + [1] * 2000)),
            ("put", "/api/v1/jobs/{task_id}", "/api/v1/jobs/y", _auth(OPS), _job("y", [999])),
            ("post", "/api/v1/telemetry", "/api/v1/telemetry", _auth(ACME),
             {"deltas": [{"link_id": 1, "interval_ns": 1000}]}),
            ("post", "/api/v1/faults", "/api/v1/faults", _auth(OPS),
             {"kind": "down", "link_id": 10**6}),
            ("get", "/api/v1/fabric/links/{link_id}", "/api/v1/fabric/links/1",
             _auth(ACME), None),
        ]
        seen = set()
        for method, template, url, headers, body in cases:
            r = c.request(method.upper(), url, headers=headers, json=body)
            assert r.status_code >= 400, (url, r.status_code)
            seen.add(r.status_code)
            responses = spec["paths"][template][method]["responses"]
            assert str(r.status_code) in responses, (method, url, r.status_code)
            schema = responses[str(r.status_code)]["content"]["application/json"]["schema"]
            refs = [s.get("$ref", "") for s in schema.get("anyOf", [schema])]
            detail = r.json()["detail"]
            want = "Error" if isinstance(detail, str) else "HTTPValidationError"
            assert any(ref.endswith("/" + want) for ref in refs), (url, want, refs)
    assert {401, 403, 404, 409, 413, 422} <= seen


def test_a_pair_given_twice_carries_two_transfers(tmp_path: Path) -> None:
    """A call whose pairs list 0 -> 64 twice and 0 -> 65 once (GPUs on two hosts of acme's):
    GPU 0 sends three transfers at once through its 400 Gb/s NIC, two of them to GPU 64, so
    that pair is planned at 2/3 of it and 0 -> 65 at 1/3. What is read back is what was
    declared, duplicates too, so a job read back can be declared again as it was."""
    app, svc = _service(tmp_path)
    job = {"task_id": "acme-tree", "gpus": [0, 64, 65],
           "calls": [{"pattern": "allreduce", "size_bytes": 1 << 20, "sla_us": 500.0,
                      "pairs": [[0, 64], [0, 65], [0, 64]]}]}
    with TestClient(app) as c:
        assert c.post("/api/v1/jobs", json=job, headers=_auth(ACME)).status_code == 201
        got = c.get("/api/v1/jobs/acme-tree", headers=_auth(ACME)).json()
        assert got["calls"][0]["pairs"] == [[0, 64], [0, 65], [0, 64]]
        # (the control loop hands the declaration to the controller and plans it)
        wait_until(lambda: c.get("/api/v1/jobs/acme-tree", headers=_auth(ACME)).json()["planned"])
        with svc.lock:
            rates = {k: d.rate_gbps for k, d in svc.controller._demand.items()}
        assert rates == pytest.approx({"acme-tree:0->64": 400 * 2 / 3,
                                       "acme-tree:0->65": 400 / 3})
        again = {k: got[k] for k in ("task_id", "gpus", "calls")}
        assert c.put("/api/v1/jobs/acme-tree", json=again, headers=_auth(ACME)).status_code == 200


def test_an_allreduce_announced_as_trees_is_planned_on_the_trees_pairs(tmp_path: Path
                                                                       ) -> None:
    """An AllReduce over four single-GPU hosts (GPUs 0, 8, 16, 24 in rank order) announced
    with ``algorithm: tree`` is planned on the pairs of NCCL's double binary tree of four
    ranks, both ways: tree 1 -> 2, 0 -> 2, 3 -> 2 and its mirror 0 -> 1, 1 -> 3, 2 -> 1,
    ten directed pairs, where the ring has four (0 -> 8 -> 16 -> 24 -> 0). A tree of
    another collective is refused in one line (422)."""
    app, _ = _service(tmp_path)
    gpus = [0, 8, 16, 24]
    with TestClient(app) as c:
        r = c.post("/api/v1/jobs", json=_job("ops-tree", gpus), headers=_auth(OPS))
        assert r.status_code == 201, r.text
        body = {"pattern": "allreduce", "size_bytes": 1 << 20, "ranks": gpus, "bucket": 0}
        ring = c.post("/api/v1/jobs/ops-tree/calls", json=body, headers=_auth(OPS)).json()
        tree = c.post("/api/v1/jobs/ops-tree/calls", json={**body, "algorithm": "tree"},
                      headers=_auth(OPS)).json()
        edges = [(1, 2), (0, 2), (3, 2), (0, 1), (1, 3)]
        want = {(gpus[a], gpus[b]) for x, y in edges for a, b in ((x, y), (y, x))}
        assert {(p["src"], p["dst"]) for p in tree["pairs"]} == want and len(want) == 10
        assert {(p["src"], p["dst"]) for p in ring["pairs"]} == {
            (0, 8), (8, 16), (16, 24), (24, 0)}
        assert all(p["planned"] for p in tree["pairs"])
        calls = c.get("/api/v1/jobs/ops-tree/calls", headers=_auth(OPS)).json()
        assert [x.get("algorithm", "") for x in calls] == ["", "tree"]
        bad = c.post("/api/v1/jobs/ops-tree/calls", headers=_auth(OPS),
                     json={**body, "pattern": "alltoall", "algorithm": "tree"})
        assert bad.status_code == 422 and "'tree' runs an allreduce" in bad.text
        bad = c.post("/api/v1/jobs/ops-tree/calls", headers=_auth(OPS),
                     json={**body, "algorithm": "flat"})
        assert bad.status_code == 422 and "'flat' runs an alltoall" in bad.text
    # a service started again on the same state has the announced trees as they were
    _, again = _service(tmp_path)
    (call,) = [c for c in again.controller.intents["ops-tree"].calls if c.algorithm]
    assert call.algorithm == "tree" and set(call.pairs) == want
