"""A real ``fabricpilot serve`` process killed with SIGKILL mid-run comes back with every job,
path set and fault it had told its clients about."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import descendants, free_port, wait_gone, wait_http

OPS = "operator-token-0123456789"
ACME = "acme-token-0123456789abc"



def _start(state: Path, tokens: Path, port: int) -> subprocess.Popen[bytes]:
    # the twin runs the default scenario's jobs; control periods are far apart so that
    # nothing but the API changes the plan during the test
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricpilot", "serve", "--state-dir", str(state), "--tokens",
         str(tokens), "--port", str(port), "--tick-interval", "3600", "--time-scale", "1e-3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_http(proc, f"http://127.0.0.1:{port}/health")
    return proc


def _paths(c: httpx.Client, task: str) -> dict[str, list[list[int]]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        body = c.get(f"/api/v1/jobs/{task}/paths").json()
        if body["pairs"]:
            return {p["key"]: [q["links"] for q in p["paths"]] for p in body["pairs"]}
        time.sleep(0.1)
    raise AssertionError(f"{task} never planned")


def test_kill_9_and_restart(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"""tokens:
  - {{name: ops, role: operator, token: {OPS}}}
  - {{name: acme, role: tenant, tenant: acme, token: {ACME}}}
""")
    state = tmp_path / "state"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(state, tokens, port)
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ACME}"},
                          timeout=30) as c:
            jobs = c.get("/api/v1/jobs").json()
            assert jobs == []  # the twin's jobs are not acme's
            used = {g for j in httpx.get(f"{base}/api/v1/jobs", headers={
                "Authorization": f"Bearer {OPS}"}).json() for g in j["gpus"]}
            free = [g for g in range(128) if g not in used]
            for i, pattern in enumerate(("allreduce", "alltoall")):
                r = c.post("/api/v1/jobs", json={
                    "task_id": f"acme-{i}", "gpus": free[4 * i:4 * i + 4],
                    "calls": [{"pattern": pattern, "size_bytes": 1 << 26, "sla_us": 900}]})
                assert r.status_code == 201, r.text
            r = c.post("/api/v1/jobs/acme-0/calls", json={
                "pattern": "allreduce", "size_bytes": 4 << 20, "ranks": free[:4], "bucket": 3})
            assert r.status_code == 200
            before_jobs = {j["task_id"]: j["calls"] for j in c.get("/api/v1/jobs").json()}
            before = {t: _paths(c, t) for t in before_jobs}
        fault = httpx.post(f"{base}/api/v1/faults", json={"kind": "gray", "link_id": 520},
                           headers={"Authorization": f"Bearer {OPS}"})
        assert fault.status_code == 201
        health = httpx.get(f"{base}/health").json()
        assert health["twin"]["running"]  # killed mid-run of the twin
        below = descendants(proc.pid)  # the control process and the twin's
        sets = [line for line in httpx.get(f"{base}/metrics").text.splitlines()
                if line.startswith("fabricpilot_path_sets ")]
        assert any("fabricpilot.service.twin_process" in cmd for cmd in below.values())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        # each process exits when its parent's end of the socket closes: no orphan
        assert wait_gone(list(below)) == []
        proc = _start(state, tokens, port)  # (the killed one's lock on the state died with it)
        # a second service on the same state directory is refused, naming the holder
        second = subprocess.run(
            [sys.executable, "-m", "fabricpilot", "serve", "--state-dir", str(state),
             "--tokens", str(tokens), "--port", str(free_port())],
            capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"error: {state}: in use by another fabricpilot service (pid {proc.pid}); "
            "give each service its own --state-dir"]
        health = httpx.get(f"{base}/health").json()
        restored = health["restored"]
        assert (restored["jobs"], restored["faults"]) == (2, 1)
        # at least every path set the two jobs had (the twin's jobs' are stored too)
        assert restored["path_sets"] >= sum(map(len, before.values()))
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ACME}"},
                          timeout=30) as c:
            after_jobs = {j["task_id"]: j["calls"] for j in c.get("/api/v1/jobs").json()}
            assert after_jobs == before_jobs
            assert {t: _paths(c, t) for t in after_jobs} == before
            calls = c.get("/api/v1/jobs/acme-0/calls").json()
            assert [(x["size_bytes"], x["bucket"]) for x in calls] == [(4 << 20, 3)]
            faults = c.get("/api/v1/faults").json()
            assert [(f["kind"], f["link_id"]) for f in faults] == [("gray", 520)]
            cong = {x["link_id"]: x for x in c.get("/api/v1/congestion").json()}
            assert cong[520]["gray"]
        # every job's path sets, the twin's included, were taken back as the plan: the
        # restart planned nothing (a restart moves no traffic)
        assert restored["path_sets"] == float(sets[0].split()[1])
        metrics = httpx.get(f"{base}/metrics").text.splitlines()
        assert "fabricpilot_plans_total 0.0" in metrics
    finally:
        proc.kill()
        proc.wait(10)


def test_an_unreadable_operator_token_is_one_line(tmp_path: Path) -> None:
    """``operator.token`` that cannot be read (here a directory): a one-line error naming
    the file, not a traceback."""
    state = tmp_path / "state"
    (state / "operator.token").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "fabricpilot", "serve", "--state-dir",
                        str(state), "--port", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {state}/operator.token: cannot read the operator token: is a directory, "
        "not a file"]


@pytest.mark.parametrize("content, message", [
    ("tokens: []", "tokens: List should have at least 1 item"),
    ("", "expected a mapping with a 'tokens' list, got an empty file"),
    ("- a", "expected a mapping with a 'tokens' list, got a list"),
    ("tokens:\n  - {name: a, role: king, token: 0123456789abcdef}", "tokens.0.role"),
    ("tokens:\n  - {name: a, role: tenant, token: 0123456789abcdef}", "needs tenant"),
])
def test_bad_token_file_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    tokens = tmp_path / "t.yaml"
    tokens.write_text(content)
    r = subprocess.run([sys.executable, "-m", "fabricpilot", "serve", "--state-dir",
                        str(tmp_path / "s"), "--tokens", str(tokens), "--port", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tokens) in lines[0] and message in lines[0], r.stderr


@pytest.mark.parametrize("table, row, sql, why", [
    ("jobs", "task_id 'acme-0'", "UPDATE jobs SET intent = '{\"task_id\": ' ", "Expecting value"),
    ("jobs", "task_id 'acme-0'", "UPDATE jobs SET intent = '{\"task_id\": \"acme-0\"}'",
     "KeyError: 'calls'"),
    ("paths", "key 'acme-0:0->1'",
     "INSERT INTO paths VALUES ('acme-0:0->1', 'acme-0', '{\"key\": 3}')", "KeyError"),
])
def test_a_damaged_row_is_one_line_naming_file_table_and_row(
        tmp_path: Path, table: str, row: str, sql: str, why: str) -> None:
    """A row of the state database that cannot be read back (hand-edited, a foreign
    writer): ``serve`` says which file, table and row, and stops; no traceback."""
    import sqlite3

    from fabricpilot.service.server import DB_NAME
    from fabricpilot.service.store import Store

    state = tmp_path / "state"
    state.mkdir()
    db = state / DB_NAME
    store = Store(db)
    store.put_job("acme-0", "acme", {
        "task_id": "acme-0", "tenant": "acme", "gpus": [0, 1], "opt_in": True,
        "calls": [{"pattern": "allreduce", "size_bytes": 1024, "sla_us": 500.0,
                   "period_ns": 0, "pairs": [[0, 1], [1, 0]]}]})
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    line = _serve_refuses(state)
    assert f"{db}: table {table}, {row}: damaged row (" in line and why in line, line


def _serve_refuses(state: Path) -> str:
    """The one line ``serve`` on ``state`` stops with (exit status 2)."""
    r = subprocess.run([sys.executable, "-m", "fabricpilot", "serve", "--no-twin",
                        "--state-dir", str(state), "--port", str(free_port())],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("table, row, why", [
    ("jobs", "task_id 'acme-0'", "GPU 200 is not in it (GPUs 0..127)"),
    ("paths", "key 'acme-0:0->1'", "paths[0][0]: link 99999 does not exist"),
    ("faults", "link_id 99999", "link 99999 is not in it"),
])
def test_a_state_directory_of_another_fabric_is_one_line(
        tmp_path: Path, table: str, row: str, why: str) -> None:
    """State written for a larger fabric (a GPU, a link the default 128-GPU one lacks):
    ``serve`` names the file, table and row and why they do not fit, and stops."""
    from fabricpilot.service.server import DB_NAME
    from fabricpilot.service.store import Store

    state = tmp_path / "state"
    state.mkdir()
    db = state / DB_NAME
    store = Store(db)
    gpus = [0, 200] if table == "jobs" else [0, 1]
    store.put_job("acme-0", "acme", {
        "task_id": "acme-0", "tenant": "acme", "gpus": gpus, "opt_in": True,
        "calls": [{"pattern": "allreduce", "size_bytes": 1024, "sla_us": 500.0,
                   "period_ns": 0}]})
    if table == "paths":
        store.put_paths([("acme-0:0->1", "acme-0", {
            "key": "acme-0:0->1", "paths": [[99999]], "weights": [1.0], "ports": [],
            "rules": [], "rate_cap_gbps": None})])
    if table == "faults":
        store.add_fault(0.0, "down", 99999, "", "ops")
    store.close()
    line = _serve_refuses(state)
    assert f"{db}: table {table}, {row}: not of this fabric ({why}): a state directory of " \
        "another fabric?" in line, line
