"""The controller in a process of its own (``ControlProcess``, what ``fabricpilot serve``
runs): operations answer as the in-process service does, refusals keep their status and
detail, a child that dies turns every call into 503, and a child that cannot start says why
in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

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
    assert delta_rows([d]) == [(3, 1000, 5.0, 0.0, 0.0, 0.0, 7.0, 0.0, 0.0, 9.0)]


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
        assert set(tick) == {"replanned", "plan_epoch"}
        metrics = await control.call("metrics_text")
        assert "fabricpilot_telemetry_deltas_total 4.0" in metrics
        for _ in range(200):  # the control loop plans declared changes every 0.25 s
            if (await control.call("job", ACME, "ring"))["planned"]:
                break
            await asyncio.sleep(0.05)
        paths = await control.call("paths", ACME, "ring", None, None)
        assert len(paths["pairs"]) == 4  # the ring's four neighbour pairs
        # the child dies: every call is a 503, not a hang
        control.kill()
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
