"""The controller in a process of its own (``ControlProcess``, what ``fabricpilot serve``
runs): operations answer as the in-process service does, refusals keep their status and
detail, a child that dies turns every call into 503, and a child that cannot start says why
in one line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port, wait_http
from fabricpilot.scenario.loader import default_scenario
from fabricpilot.service.auth import Principal
from fabricpilot.service.control import ControlError, ControlProcess, ServiceSpec, delta_rows
from fabricpilot.service.schemas import IntentIn, PortDeltaIn
from fabricpilot.service.state import ServiceError

OPS = Principal("ops", "operator")
ACME = Principal("acme-ci", "tenant", "acme")
OTHER = Principal("other-ci", "tenant", "other")


def test_rows_keep_the_delta_field_order() -> None:
    d = PortDeltaIn(link_id=3, interval_ns=1000, tx_bytes=5.0, pause_ns=7.0, rx_bits=9.0)
    assert delta_rows([d]) == [(3, 1000, 5.0, 0.0, 0.0, 0.0, 7.0, 0.0, 0.0, 9.0, None)]
    down = PortDeltaIn(link_id=4, interval_ns=1000, oper_up=False)
    assert delta_rows([down]) == [(4, 1000, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)]


def test_operations_through_a_control_process(tmp_path: Path) -> None:
    control = ControlProcess(ServiceSpec(default_scenario(), "default", tmp_path / "state",
                                         twin=False))
    assert control.restored["jobs"] == 0

    async def run() -> None:
        await control.start()
        body = IntentIn(task_id="ring", gpus=[0, 8, 16, 24], calls=[
            {"pattern": "allreduce", "size_bytes": 1 << 20, "sla_us": 800.0}])
        job = await control.call("declare", ACME, body, replace_ok=False)
        assert (job["task_id"], job["tenant"], job["gpus"]) == ("ring", "acme", [0, 8, 16, 24])
        # refusals come back with the in-process status and detail
        with pytest.raises(ServiceError) as err:
            await control.call("declare", ACME, body, replace_ok=False)
        assert (err.value.status, err.value.detail) == (
            409, "job 'ring' exists (PUT replaces it)")
        with pytest.raises(ServiceError) as err:
            await control.call("job", OTHER, "ring")
        assert err.value.status == 403
        with pytest.raises(ServiceError) as err:
            await control.call("job", OPS, "nope")
        assert (err.value.status, err.value.detail) == (404, "job 'nope' not found")
        # telemetry crosses as rows; a bad link is named
        deltas = [PortDeltaIn(link_id=k, interval_ns=1_000_000, tx_bytes=1e6) for k in range(4)]
        assert await control.call("ingest", deltas) == 4
        with pytest.raises(ServiceError) as err:
            await control.call("ingest", [PortDeltaIn(link_id=10**6, interval_ns=1)])
        assert err.value.status == 422 and "link 1000000 does not exist" in err.value.detail
        # concurrent calls each get their own answer
        got = await asyncio.gather(*(control.call("job", ACME, "ring") for _ in range(50)))
        assert {g["task_id"] for g in got} == {"ring"}
        tick = await control.call("tick_now")
        assert set(tick) == {"replanned", "plan_epoch", "links_down", "links_up",
                             "links_gray", "links_clear"}
        metrics = await control.call("metrics_text")
        assert "fabricpilot_telemetry_deltas_total 4.0" in metrics
        for _ in range(200):  # the control loop plans declared changes every 0.25 s
            if (await control.call("job", ACME, "ring"))["planned"]:
                break
            await asyncio.sleep(0.05)
        paths = await control.call("paths", ACME, "ring", None, None)
        assert len(paths["pairs"]) == 4  # the ring's four neighbour pairs
        # the child dies: every call is a 503, not a hang
        control.process.kill()
        await asyncio.to_thread(control.process.join, 10.0)
        with pytest.raises(ServiceError) as err:
            await asyncio.wait_for(control.call("jobs", OPS), 10.0)
        assert err.value.status == 503
        await control.stop()

    asyncio.run(run())
    assert not control.process.is_alive()


def test_a_control_process_that_cannot_start_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    with pytest.raises(ControlError) as err:
        ControlProcess(ServiceSpec(default_scenario(), "default", blocker / "state",
                                   twin=False))
    msg = str(err.value)
    assert "\n" not in msg and str(blocker / "state") in msg
    assert "cannot create the state directory" in msg


@pytest.mark.parametrize("layout", [[], ["--single-process"]])
def test_serve_in_both_layouts(tmp_path: Path, layout: list[str]) -> None:
    # `fabricpilot serve` (a control process) and `--single-process` answer the same API;
    # /metrics joins the API's and the controller's families; SIGTERM stops both processes;
    # a tenant's GPUs beyond the fabric's 128 (GPUs 0-127) are named at the start
    port = free_port()
    token = "operator-token-0123456789"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"tokens:\n  - {{name: ops, role: operator, token: {token}}}\n"
                      "  - {name: acme, role: tenant, tenant: acme, "
                      "token: acme-token-0123456789, gpus: '0-3, 120-299'}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricpilot", "serve", "--no-twin", "--state-dir",
         str(tmp_path / "state"), "--port", str(port), "--tokens", str(tokens), *layout],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(proc, f"http://127.0.0.1:{port}/health")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                          headers={"Authorization": f"Bearer {token}"}) as c:
            r = c.put("/api/v1/jobs/j1", json={"task_id": "j1", "gpus": [0, 8], "calls": [
                {"pattern": "allreduce", "size_bytes": 1 << 20, "sla_us": 800}]})
            assert r.status_code == 201 and r.json()["gpus"] == [0, 8]  # (a new job)
            assert c.get("/api/v1/jobs/nope").status_code == 404
            assert c.post("/api/v1/telemetry", json={"deltas": [
                {"link_id": 0, "interval_ns": 1000, "tx_bytes": 10}]}).json() == {"accepted": 1}
            metrics = c.get("/metrics").text
        assert "fabricpilot_api_request_seconds_bucket" in metrics
        assert "fabricpilot_planner_seconds_bucket" in metrics
        assert "fabricpilot_telemetry_deltas_total 1.0" in metrics
        children = [p for p in Path("/proc").glob("[0-9]*/stat")
                    if _ppid(p) == proc.pid and "multiprocessing.spawn" in _cmd(p)]
        assert len(children) == (0 if layout else 1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it got
        assert proc.stderr is not None
        # 128-299: 172 of acme's 4 + 180 GPUs
        assert (f"warning: {tokens}: tokens.1.gpus: 172 of acme's 184 GPUs are not in the "
                f"fabric (GPUs 0-127), from GPU 128") in proc.stderr.read().decode()
        deadline = time.monotonic() + 10
        while any(c.exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(c.exists() for c in children)  # the control process went with it
    finally:
        if proc.poll() is None:
            proc.kill()


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _cmd(stat: Path) -> str:
    try:
        return (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_serve_stops_when_its_control_process_dies(tmp_path: Path) -> None:
    # rather than answer 503 forever: a supervisor restarts serve, which restores its state
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricpilot", "serve", "--no-twin", "--state-dir",
         str(tmp_path / "state"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(proc, f"http://127.0.0.1:{port}/health")
        (child,) = [p for p in Path("/proc").glob("[0-9]*/stat")
                    if _ppid(p) == proc.pid and "multiprocessing.spawn" in _cmd(p)]
        os.kill(int(child.parent.name), signal.SIGKILL)
        assert proc.wait(30) == 1
        last = proc.stderr.read().decode().strip().splitlines()[-1]
        assert last == (f"error: the control process exited unexpectedly (exit code -9); "
                        f"serve stopped (start it again: the state in {tmp_path / 'state'}/ "
                        f"is restored)")
    finally:
        if proc.poll() is None:
            proc.kill()
