"""Shared helpers for the test suite."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from fabricpilot.results import RunResult
from fabricpilot.runner import Prepared, run_policy
from fabricpilot.topology import CompiledTopology
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec
from fabricpilot.workload.plan import CollectivePlan, Op, Stage


def p2p_job(name: str, pairs: list[tuple[int, int]], size_bytes: int, **kw: object) -> JobSpec:
    """A job whose only 'collective' is a set of independent point-to-point transfers of
    ``size_bytes`` each (one stage); ``kw`` go to :class:`JobSpec`."""
    src = np.array([a for a, _ in pairs])
    dst = np.array([b for _, b in pairs])
    stage = Stage(src, dst, np.full(len(pairs), size_bytes), np.full(len(pairs), -1))
    plan = CollectivePlan(Op.ALLTOALL, tuple(sorted({*src.tolist(), *dst.tolist()})),
                          size_bytes, "p2p", (stage,))
    return JobSpec(name, plan.ranks, (plan,), **kw)  # type: ignore[arg-type]


def run_one(
    ct: CompiledTopology,
    op: str,
    ranks: np.ndarray | list[int],
    size_bytes: int,
    policy: str = "ideal",
    **kw: object,
) -> RunResult:
    """Run a single collective over ``ranks`` and return the result."""
    plan = build_collective(op, np.asarray(ranks), size_bytes,
                            gpus_per_host=ct.topo.gpus_per_host, **kw)  # type: ignore[arg-type]
    job = JobSpec("job", tuple(int(r) for r in ranks), (plan,))
    return run_policy(Prepared("test", 1, ct, [job]), policy)


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port in a background thread (its
    lifespan on: the service's control loop runs); yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the service did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(proc: Any, url: str, timeout_s: float = 60.0) -> None:
    """Wait until ``url`` answers 200; fail with the process's stderr if it exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{url} did not come up")



def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (children, their children, ...): pid -> command line."""
    from pathlib import Path

    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        for p in frontier:
            try:
                found[p] = (Path(f"/proc/{p}/cmdline").read_bytes()
                            .replace(b"\0", b" ").decode())
            except OSError:
                found[p] = ""
    return found


def wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    """Wait until none of ``pids`` runs (zombies count as gone); return those still there."""
    from pathlib import Path

    def alive(p: int) -> bool:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def wait_until(pred: Any, timeout_s: float = 30.0, poll_s: float = 0.1) -> Any:
    """Poll ``pred()`` until it returns something true, and return that;
    ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError("condition not reached")
