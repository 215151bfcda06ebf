"""The data plane outlives its controller: with the twin in its own process (``fabricpilot
twin``) driven over the HTTP southbound, a controller killed with SIGKILL leaves the twin
training on the rules it holds (fail-static); the restarted controller reads those rules
back and sends nothing it does not have to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from conftest import free_port, wait_http, wait_until

OPS = "operator-token-0123456789"
SOUTH = "southbound-token-01234567"



def test_fail_static_and_resync(tmp_path: Path) -> None:
    (tmp_path / "south.token").write_text(SOUTH)
    (tmp_path / "tokens.yaml").write_text(
        f"tokens:\n  - {{name: ops, role: operator, token: {OPS}}}\n")
    twin_port, ctl_port = free_port(), free_port()
    twin_url, ctl_url = f"http://127.0.0.1:{twin_port}", f"http://127.0.0.1:{ctl_port}"
    twin = subprocess.Popen(
        [sys.executable, "-m", "fabricpilot", "twin", "--port", str(twin_port),
         "--time-scale", "1e-2", "--token-file", str(tmp_path / "south.token")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    serve_cmd = [sys.executable, "-m", "fabricpilot", "serve", "--port", str(ctl_port),
                 "--state-dir", str(tmp_path / "state"), "--tokens",
                 str(tmp_path / "tokens.yaml"), "--dataplane", twin_url,
                 "--dataplane-token-file", str(tmp_path / "south.token"),
                 "--tick-interval", "3600"]
    ctl = None
    try:
        wait_http(twin, f"{twin_url}/health")
        # the southbound wants its token
        assert httpx.get(f"{twin_url}/southbound/v1/rules").status_code == 401
        ctl = subprocess.Popen(serve_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_http(ctl, f"{ctl_url}/health")
        ops = {"Authorization": f"Bearer {OPS}"}
        jobs = httpx.get(f"{ctl_url}/api/v1/jobs", headers=ops).json()
        assert {j["task_id"] for j in jobs} == {"llm-dp", "vision-dp", "moe-ep"}  # the twin's
        used = {g for j in jobs for g in j["gpus"]}
        free = [g for g in range(128) if g not in used][:4]
        r = httpx.post(f"{ctl_url}/api/v1/jobs", headers=ops, json={
            "task_id": "extra", "gpus": free,
            "calls": [{"pattern": "alltoall", "size_bytes": 1 << 24, "sla_us": 900}]})
        assert r.status_code == 201
        paths = wait_until(lambda: httpx.get(f"{ctl_url}/api/v1/jobs/extra/paths",
                                        headers=ops).json()["pairs"])
        assert len(paths) == 12  # every ordered pair of 4 GPUs
        held = httpx.get(f"{twin_url}/health").json()
        assert held["rules"] >= 12 and held["running"]

        os.kill(ctl.pid, signal.SIGKILL)
        ctl.wait(10)
        # fail-static: the twin keeps training on the rules it holds
        done = held["collectives"]
        after = wait_until(lambda: (h := httpx.get(f"{twin_url}/health").json())["collectives"]
                      > done + 2 and h)
        assert after["running"] and after["error"] is None
        assert after["rules"] == held["rules"] and after["installs"] == held["installs"]

        # (this time with the address the twin prints, /southbound/v1 included)
        serve_cmd[serve_cmd.index(twin_url)] = f"{twin_url}/southbound/v1"
        ctl = subprocess.Popen(serve_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_http(ctl, f"{ctl_url}/health")
        restored = httpx.get(f"{ctl_url}/health").json()["restored"]
        # the rules came back from the switches; none had to be sent again
        assert restored["held_by_dataplane"] == held["rules"] and restored["path_sets"] == 0
        assert httpx.get(f"{twin_url}/health").json()["installs"] == held["installs"]
        again = httpx.get(f"{ctl_url}/api/v1/jobs/extra/paths", headers=ops).json()["pairs"]
        assert again == paths
    finally:
        for p in (ctl, twin):
            if p is not None:
                p.kill()
                p.wait(10)
