"""fabricpilot.client against a live service: uvicorn on a free loopback port in a background
thread, over the built-in default scenario (128 GPUs, GPU ``i`` on node ``gpu<i>``), with an
operator and two tenant tokens."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import free_port, served
from fabricpilot.client import (
    DEFAULT_URL,
    Client,
    FabricpilotAPIError,
    FabricpilotClientError,
    FabricpilotConnectionError,
)
from fabricpilot.scenario import default_scenario
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.server import build
from fabricpilot.service.state import FabricService

OPS = "operator-token-0123456789"
ACME = "acme-token-0123456789abc"
GLOBEX = "globex-token-0123456789ab"
ACME_GPUS = frozenset(range(32))
GLOBEX_GPUS = frozenset(range(64, 96))


@dataclass
class Live:
    """A running service: its URL and the in-process service object (for the fabric's
    GPU -> node map, which the API does not expose)."""

    url: str
    service: FabricService

    def client(self, token: str | None = OPS, **kw: object) -> Client:
        return Client(self.url, token=token, **kw)  # type: ignore[arg-type]


def _tokens() -> TokenRegistry:
    reg = TokenRegistry()
    reg.add(OPS, Principal("ops", "operator"))
    reg.add(ACME, Principal("acme-trainer", "tenant", "acme", ACME_GPUS))
    reg.add(GLOBEX, Principal("globex-trainer", "tenant", "globex", GLOBEX_GPUS))
    return reg


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    state_dir: Path = tmp_path_factory.mktemp("fabricpilot-state")
    app, service, _, _ = build(default_scenario(), "default", state_dir, tokens=_tokens(),
                               twin=False, tick_interval_s=3600.0)  # ticks only when asked
    with served(app) as url:
        yield Live(url, service)


def _ring(gpus: list[int]) -> list[tuple[int, int]]:
    return [(gpus[i], gpus[(i + 1) % len(gpus)]) for i in range(len(gpus))]


def _allreduce(size_bytes: int = 64 << 20, sla_us: float = 500.0) -> dict[str, object]:
    return {"pattern": "allreduce", "size_bytes": size_bytes, "sla_us": sla_us}


def _check_pair_paths(live: Live, pair: dict[str, object]) -> None:
    """Every path of a pair runs from the src GPU's node to the dst GPU's node along its
    links, and the shares add up to 1."""
    gpu_node = live.service.view.gpu_node
    links = live.service.view.links
    paths = pair["paths"]
    assert isinstance(paths, list) and paths, pair
    for path in paths:
        nodes, link_ids = path["nodes"], path["links"]
        assert nodes[0] == gpu_node[pair["src"]]  # type: ignore[index]
        assert nodes[-1] == gpu_node[pair["dst"]]  # type: ignore[index]
        assert len(nodes) == len(link_ids) + 1
        for i, lk in enumerate(link_ids):
            assert (links[lk].src, links[lk].dst) == (nodes[i], nodes[i + 1])
    assert sum(p["share"] for p in paths) == pytest.approx(1.0)


# ---------------------------------------------------------------- happy paths
def test_health_and_metrics_need_no_token(live: Live) -> None:
    with live.client(token=None) as fp:
        health = fp.health()
        assert health["status"] == "ok" and health["twin"] is None
        assert "fabricpilot" in fp.metrics()


def test_declare_list_announce_paths_withdraw(live: Live) -> None:
    gpus = [0, 1, 8, 16]
    with live.client(ACME) as fp:
        job = fp.declare_job("acme-llm", gpus, [_allreduce()])
        assert (job["task_id"], job["tenant"], job["gpus"]) == ("acme-llm", "acme", gpus)
        assert job["calls"][0]["size_bytes"] == 64 << 20
        assert [j["task_id"] for j in fp.list_jobs()] == ["acme-llm"]
        assert fp.get_job("acme-llm")["sla_level"] == job["sla_level"]

        ranks = [0, 8, 16, 1]
        decision = fp.announce("acme-llm", "allreduce", 4 << 20, ranks, sla_us=400,
                               bucket=3)
        assert decision["size_bytes"] == 4 << 20 and decision["sla_us"] == 400.0
        assert decision["changed_intent"] is True
        pairs = [(p["src"], p["dst"]) for p in decision["pairs"]]
        assert pairs == [(0, 8), (8, 16), (16, 1), (1, 0)] == _ring(ranks)
        for pair in decision["pairs"]:
            assert pair["planned"] is True
            _check_pair_paths(live, pair)

        # the same call again changes nothing
        again = fp.announce("acme-llm", "allreduce", 4 << 20, ranks, sla_us=400, bucket=3)
        assert again["changed_intent"] is False

        calls = fp.calls("acme-llm")
        assert [(c["pattern"], c["size_bytes"], c["ranks"], c["sla_us"], c["bucket"])
                for c in calls] == [("allreduce", 4 << 20, ranks, 400.0, 3)] * 2
        assert len(fp.calls("acme-llm", limit=1)) == 1

        from_8 = fp.paths("acme-llm", src=8)
        assert [(p["src"], p["dst"]) for p in from_8["pairs"]] == [(8, 16)]
        _check_pair_paths(live, from_8["pairs"][0])
        assert [p["paths"] for p in from_8["pairs"]] == [
            p["paths"] for p in decision["pairs"] if p["src"] == 8]
        everything = fp.paths("acme-llm")
        assert {(p["src"], p["dst"]) for p in everything["pairs"]} >= set(pairs)

        # an alltoall over three ranks: every ordered pair
        a2a = fp.announce("acme-llm", "alltoall", 1 << 20, [0, 1, 8])
        assert sorted((p["src"], p["dst"]) for p in a2a["pairs"]) == [
            (0, 1), (0, 8), (1, 0), (1, 8), (8, 0), (8, 1)]
        assert a2a["sla_us"] == 1000.0  # the service's default for announced calls

        fp.withdraw_job("acme-llm")
        with pytest.raises(FabricpilotAPIError) as err:
            fp.get_job("acme-llm")
        assert err.value.status == 404


def test_update_job_replaces_and_declares(live: Live) -> None:
    with live.client(OPS) as fp:
        job = fp.update_job("ops-put", [64, 65], [_allreduce()], tenant="globex")
        assert job["tenant"] == "globex" and job["gpus"] == [64, 65]
        job = fp.update_job("ops-put", [64, 65, 66],
                            [{**_allreduce(1 << 20), "pairs": [(64, 65), (65, 66)]}])
        assert job["tenant"] == "globex"  # kept when an operator does not name one
        assert job["calls"][0]["pairs"] == [[64, 65], [65, 66]]
        with pytest.raises(FabricpilotAPIError) as err:
            fp.declare_job("ops-put", [64], [_allreduce()])
        assert err.value.status == 409 and "exists" in str(err.value)
        fp.withdraw_job("ops-put")


def test_telemetry_congestion_tick_faults_events(live: Live) -> None:
    with live.client(OPS) as fp:
        fp.declare_job("ops-ring", [2, 100], [_allreduce()])
        try:
            decision = fp.announce("ops-ring", "allreduce", 8 << 20, [2, 100])
            path = decision["pairs"][0]["paths"][0]
            hot_link, switch = path["links"][1], path["nodes"][1]  # a fabric link it uses

            # 400 Gb/s for 1 ms carries 50 MB: 45 MB is 90 % load, above the hot threshold
            accepted = fp.post_telemetry([{"link_id": hot_link, "interval_ns": 1_000_000,
                                           "tx_bytes": 45_000_000, "queue_bytes": 1000}],
                                         switch=switch)
            assert accepted == 1
            tick = fp.tick()
            assert set(tick) == {"replanned", "plan_epoch", "links_down", "links_up",
                                 "links_gray", "links_clear"}
            state = {c["link_id"]: c for c in fp.congestion()}[hot_link]
            assert state["utilization"] == pytest.approx(0.9)
            assert state["hot"] is True and state["down"] is False

            # a link the job's paths use now goes down: its path sets are re-placed
            in_use = fp.paths("ops-ring", src=2)["pairs"][0]["paths"][0]["links"]
            down_link = in_use[1]
            fault = fp.report_fault("down", link_id=down_link, detail="optic pulled")
            assert fault["kind"] == "down" and fault["link_id"] == down_link
            assert fault["affected_path_sets"] >= 1
            listed = fp.faults()
            assert any(f["link_id"] == down_link and f["kind"] == "down" for f in listed)
            assert len(fp.faults(limit=1)) == 1
            assert any(e["kind"] == "fault-down" for e in fp.events())
            pairs = fp.paths("ops-ring")["pairs"]
            assert {(p["src"], p["dst"]) for p in pairs} == {(2, 100), (100, 2)}
            for pair in pairs:
                for path in pair["paths"]:
                    assert down_link not in path["links"]
                _check_pair_paths(live, pair)
            assert {c["link_id"]: c for c in fp.congestion()}[down_link]["down"] is True
            # the dead link carries no planned pair of the job any more; a link of its
            # new paths does
            dead = fp.link(down_link)
            assert dead["down"] is True and "ops-ring" not in {j["task_id"] for j in dead["jobs"]}
            on = fp.link(pairs[0]["paths"][0]["links"][1])
            assert any(j["task_id"] == "ops-ring" and j["pairs"] >= 1 for j in on["jobs"])

            link = live.service.view.links[down_link]
            up = fp.report_fault("up", endpoints=(link.src, link.dst))
            assert up["link_id"] == down_link
        finally:
            fp.withdraw_job("ops-ring")


def test_fabric(live: Live) -> None:
    with live.client(ACME) as fp:
        fabric = fp.fabric()
    assert fabric["gpus"] == 128
    kinds = {n["id"]: n["kind"] for n in fabric["nodes"]}
    assert kinds["gpu0"] == "gpu" and kinds["leaf0"] == "switch"
    assert sum(k == "gpu" for k in kinds.values()) == 128
    assert len(fabric["links"]) == len(live.service.view.links)
    link = fabric["links"][0]
    assert {"id", "src", "dst", "kind", "capacity_gbps"} <= set(link)


# ---------------------------------------------------------------- errors
def test_401_missing_and_unknown_token(live: Live) -> None:
    with live.client(token=None) as fp, pytest.raises(FabricpilotAPIError) as err:
        fp.list_jobs()
    assert err.value.status == 401 and err.value.detail == "missing bearer token"
    assert str(err.value) == ("401 Unauthorized: missing bearer token "
                              "(GET /api/v1/jobs)")
    with live.client(token="not-a-real-token-at-all") as fp, \
            pytest.raises(FabricpilotAPIError) as err:
        fp.declare_job("x", [0], [_allreduce()])
    assert err.value.status == 401 and "unknown token" in str(err.value)


def test_403_operators_only_and_other_tenants(live: Live) -> None:
    with live.client(GLOBEX) as globex, live.client(ACME) as acme:
        globex.declare_job("globex-job", [64, 65], [_allreduce()])
        with pytest.raises(FabricpilotAPIError) as err:
            acme.get_job("globex-job")
        assert err.value.status == 403 and "another tenant" in str(err.value)
        with pytest.raises(FabricpilotAPIError) as err:
            acme.announce("globex-job", "allreduce", 1024, [64, 65])
        assert err.value.status == 403
        with pytest.raises(FabricpilotAPIError) as err:
            acme.post_telemetry([{"link_id": 0, "interval_ns": 1000}])
        assert (err.value.status, err.value.detail) == (403, "operators only")
        with pytest.raises(FabricpilotAPIError) as err:
            acme.tick()
        assert err.value.status == 403
        with pytest.raises(FabricpilotAPIError) as err:
            acme.declare_job("acme-steal", [64], [_allreduce()])
        assert err.value.status == 403 and "GPU 64" in str(err.value)
        assert [j["task_id"] for j in acme.list_jobs()] == []
        globex.withdraw_job("globex-job")


def test_404_unknown_job(live: Live) -> None:
    with live.client(OPS) as fp:
        for call in (lambda: fp.get_job("nope"), lambda: fp.paths("nope"),
                     lambda: fp.calls("nope"), lambda: fp.withdraw_job("nope"),
                     lambda: fp.announce("nope", "allreduce", 1, [0, 1])):
            with pytest.raises(FabricpilotAPIError) as err:
                call()
            assert err.value.status == 404
            assert "job 'nope' not found" in str(err.value)


def test_422_field_messages(live: Live) -> None:
    with live.client(OPS) as fp:
        with pytest.raises(FabricpilotAPIError) as err:
            fp.declare_job("bad", [0, 1, 1], [_allreduce(size_bytes=0)])
        e = err.value
        assert e.status == 422
        assert ("gpus", "Value error, duplicate GPU ids: [1]") in e.fields
        assert ("calls.0.size_bytes", "Input should be greater than 0") in e.fields
        assert "calls.0.size_bytes: Input should be greater than 0" in str(e)
        assert "\n" not in str(e)
        assert str(e).startswith("422 Unprocessable Entity: ")

        with pytest.raises(FabricpilotAPIError) as err:
            fp.declare_job("bad id!", [0], [_allreduce()])
        assert err.value.fields[0][0] == "task_id"

        with pytest.raises(FabricpilotAPIError) as err:
            fp.paths("anything", src=-1)
        assert err.value.status == 422 and err.value.fields[0][0] == "query.src"

        # refusals by the service itself: a one-line detail naming the field
        with pytest.raises(FabricpilotAPIError) as err:
            fp.declare_job("too-far", [0, 500], [_allreduce()])
        assert err.value.status == 422 and "gpus: GPU 500 does not exist" in str(err.value)
        fp.declare_job("ok-job", [4, 5], [_allreduce()])
        with pytest.raises(FabricpilotAPIError) as err:
            fp.announce("ok-job", "allreduce", 1024, [4, 6])
        assert err.value.status == 422
        assert "ranks: GPU 6 is not one of the GPUs of job 'ok-job'" in str(err.value)
        with pytest.raises(FabricpilotAPIError) as err:
            fp.post_telemetry([{"link_id": 10**6, "interval_ns": 1000}])
        assert err.value.status == 422 and "deltas.0.link_id" in str(err.value)
        fp.withdraw_job("ok-job")


# ---------------------------------------------------------------- client behaviour
def test_defaults_from_environment(monkeypatch: pytest.MonkeyPatch, live: Live) -> None:
    monkeypatch.delenv("FABRICPILOT_URL", raising=False)
    monkeypatch.delenv("FABRICPILOT_TOKEN", raising=False)
    with Client() as fp:
        assert fp.base_url == DEFAULT_URL and fp.token is None
    monkeypatch.setenv("FABRICPILOT_URL", live.url + "/")
    monkeypatch.setenv("FABRICPILOT_TOKEN", OPS)
    with Client() as fp:
        assert fp.base_url == live.url and fp.token == OPS
        assert isinstance(fp.list_jobs(), list)  # authorised with the env token



def test_unreachable_service_retries_gets_only() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Client(url, token=OPS, get_retries=2, backoff_s=0.01) as fp:
        with pytest.raises(FabricpilotConnectionError) as err:
            fp.list_jobs()
        assert "after 3 attempts" in str(err.value) and url in str(err.value)
        with pytest.raises(FabricpilotConnectionError) as err:
            fp.declare_job("x", [0], [_allreduce()])
        assert "attempts" not in str(err.value)


def test_retry_counts_and_recovery() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if len(seen) <= 2:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=[{"task_id": "t"}])

    with Client("http://fp.test", token=OPS, get_retries=3, backoff_s=0.001,
                transport=httpx.MockTransport(handler)) as fp:
        assert fp.list_jobs() == [{"task_id": "t"}]
    assert seen == ["GET"] * 3

    seen.clear()
    with Client("http://fp.test", token=OPS, get_retries=3, backoff_s=0.001,
                transport=httpx.MockTransport(handler)) as fp, \
            pytest.raises(FabricpilotConnectionError):
        fp.tick()
    assert seen == ["POST"]  # never re-sent


def test_non_json_error_body_and_bearer_header() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == f"Bearer {OPS}"
        return httpx.Response(502, text="Bad Gateway\nupstream down")

    with Client("http://fp.test", token=OPS, transport=httpx.MockTransport(handler)) as fp, \
            pytest.raises(FabricpilotAPIError) as err:
        fp.congestion()
    assert err.value.status == 502
    assert str(err.value) == ("502 Bad Gateway: Bad Gateway upstream down "
                              "(GET /api/v1/congestion)")


def test_a_token_is_stripped_refused_unsendable_and_never_shown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A token read from a secret file ends in a newline: it is stripped, not sent (it
    failed every request, the message quoting the header, token and all). One an HTTP header
    cannot carry is refused at once, saying where, not what; a password in the URL is not
    shown either."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Authorization"])
        return httpx.Response(200, json=[])

    monkeypatch.setenv("FABRICPILOT_TOKEN", f"  {OPS}\n")
    with Client("http://fp.test", transport=httpx.MockTransport(handler)) as fp:
        assert fp.list_jobs() == []
    assert sent == [f"Bearer {OPS}"]
    for bad, what in (("s3cret acme-token", "character 7 of 17 is a space"),
                      ("s3cret\x01acme-token", "character 7 of 17 is a control character"),
                      ("s3cret-ácme-token", "character 8 of 17 is not ASCII")):
        with pytest.raises(FabricpilotClientError) as err:
            Client("http://fp.test", token=bad)
        assert what in str(err.value) and "acme" not in str(err.value)
    url = f"http://ops:hunter2@127.0.0.1:{free_port()}"  # (nothing listens there)
    with Client(url, token=OPS, get_retries=0) as fp, \
            pytest.raises(FabricpilotConnectionError) as conn:
        fp.list_jobs()
    assert "hunter2" not in str(conn.value) and "ops:***@127.0.0.1" in str(conn.value)
    assert "hunter2" not in repr(fp)


def test_what_is_not_the_api_answering_is_a_client_error() -> None:
    """A 200 that is not JSON (a proxy's login page), a redirect, an id naming another
    resource, a body JSON cannot carry, a URL that is not one: each a one-line
    FabricpilotClientError, not httpx's or json's own."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/moved"):
            return httpx.Response(307, headers={"location": "/api/v1/jobs"})
        return httpx.Response(200, text="<html>Sign in</html>")

    with Client("http://fp.test", token=OPS, transport=httpx.MockTransport(handler)) as fp:
        with pytest.raises(FabricpilotAPIError, match="the answer is not JSON: '<html>Sign"):
            fp.congestion()
        with pytest.raises(FabricpilotAPIError, match="307 Temporary Redirect: unexpected "
                                                      "redirect to /api/v1/jobs"):
            fp.get_job("moved")
        for bad in ("", ".", ".."):
            with pytest.raises(FabricpilotClientError, match="not a job's id"):
                fp.withdraw_job(bad)
        with pytest.raises(FabricpilotClientError, match="cannot be sent as JSON"):
            fp.announce("j", "allreduce", 1024, [0, 1], sla_us=float("nan"))
    for url in ("http://127.0.0.1:abc", "http://[::1", "ftp://host", "127.0.0.1:8765"):
        with pytest.raises(FabricpilotClientError, match=r"URL .* is not"):
            Client(url)


def test_the_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FABRICPILOT_TIMEOUT_S`` bounds each request (a hook's declare against a hung
    controller waits that long, not 30 s); an argument wins; a bad value says so."""
    assert Client("http://fp.test").timeout_s == 30.0
    monkeypatch.setenv("FABRICPILOT_TIMEOUT_S", "2.5")
    assert Client("http://fp.test").timeout_s == 2.5
    assert Client("http://fp.test", timeout_s=7).timeout_s == 7
    monkeypatch.setenv("FABRICPILOT_TIMEOUT_S", "soon")
    with pytest.raises(FabricpilotClientError, match="FABRICPILOT_TIMEOUT_S='soon'"):
        Client("http://fp.test")


def test_a_read_timeout_is_not_reported_as_unreachable() -> None:
    """Connected but no answer in time (a controller busy planning, or hung): the message
    says so, with the timeout, instead of 'cannot reach'."""
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with Client("http://fp.test", token=OPS, timeout_s=2.5,
                transport=httpx.MockTransport(handler)) as fp, \
            pytest.raises(FabricpilotConnectionError) as err:
        fp.list_jobs()
    assert str(err.value) == ("the fabricpilot controller at http://fp.test did not answer "
                              "within 2.5 s (GET /api/v1/jobs): ReadTimeout")
