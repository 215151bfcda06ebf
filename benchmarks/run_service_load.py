"""Loopback load test of the controller service: concurrent clients posting intents and
telemetry for a bounded time.

    python benchmarks/run_service_load.py                  # 60 s, twin running, 64 clients
    python benchmarks/run_service_load.py --rate 2000      # the same, 2,000 requests/s offered
    python benchmarks/run_service_load.py --seconds 10 --no-twin

It starts ``fabricpilot serve`` on 127.0.0.1 (a fresh state directory, a token file with one
operator and 8 tenants), then runs ``--clients`` keep-alive HTTP/1.1 connections from
``--procs`` load processes for ``--seconds``. Each request is, in turn, a tenant's intent
update (``PUT /api/v1/jobs/{id}``, a ring AllReduce over the tenant's GPUs -- 16 each
without the twin, the GPUs the twin's jobs leave free with it -- whose size changes each
time, so every one is a real change to plan) or a switch's telemetry batch (``POST
/api/v1/telemetry``, 32 port deltas). It prints the throughput, latency percentiles and the
errors (any status other than 200 / 202, or a broken connection), and the CPU time of the
API process, of its control process and of the twin's process. Targets: >= 2,000 requests/s
on a 2-core machine, p99 <= 50 ms, 0 errors. ``--single-process`` serves with the controller
in the API's process, for comparison.

Without ``--rate`` every client sends its next request as soon as the last is answered
(closed loop): the throughput is the service's capacity, and the latency is mostly the
queue the 64 clients keep at it (p50 = clients / throughput). ``--rate R`` offers R
requests/s on a fixed schedule (open loop): each latency counts from the request's
scheduled send time, so the figure is the latency at that load, a service that falls behind
shows it in full, and the throughput shows whether it kept up.

The load generator is a minimal asyncio HTTP client (no library overhead), so the figure is
the service's, not the client's; it still shares the machine's cores with the service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

OPS = "bench-operator-token-0123456789"
TENANTS = 8


def _tenant_token(i: int) -> str:
    return f"bench-tenant-{i}-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(method: str, path: str, token: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


async def _read_response(reader: asyncio.StreamReader) -> int:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


def _requests(cid: int, n_links: int, tenant_gpus: list[list[int]]
              ) -> tuple[list[bytes], list[bytes]]:
    """Client ``cid``'s requests, encoded up front (the generator then spends its CPU on the
    wire only): 64 intent updates of one of its tenant's jobs and 64 telemetry batches."""
    tenant = cid % len(tenant_gpus)
    gpus = tenant_gpus[tenant]
    rng = np.random.default_rng(cid)
    task = f"t{tenant}-job{cid % 4}"
    intents = [_request("PUT", f"/api/v1/jobs/{task}", _tenant_token(tenant), {
        "task_id": task, "gpus": gpus,
        "calls": [{"pattern": "allreduce", "size_bytes": (1 << 20) * (1 + k),
                   "sla_us": 800.0}]}) for k in range(64)]
    batches = [_request("POST", "/api/v1/telemetry", OPS, {"deltas": [
        {"link_id": int(lk), "interval_ns": 1_000_000,
         "tx_bytes": float(rng.uniform(0, 4e7)), "queue_bytes": 0.0}
        for lk in rng.choice(n_links, 32, replace=False)]}) for _ in range(64)]
    return intents, batches


async def _client(port: int, cid: int, requests: tuple[list[bytes], list[bytes]],
                  start: float, until: float, lat: list[float], errors: list[str],
                  interval_s: float = 0.0) -> None:
    """One keep-alive connection from ``start`` to ``until`` (``time.monotonic``): back to
    back (``interval_s = 0``), or one request every ``interval_s`` on a fixed schedule, its
    latency counted from its scheduled time (so a slow answer also counts against the
    requests it held up). Latencies are signed by kind: intents > 0, telemetry < 0."""
    intents, batches = requests
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if interval_s > 0:  # scheduled clients start spread over one interval
        start += interval_s * ((cid * 0.618034) % 1.0)
    await asyncio.sleep(max(start - time.monotonic(), 0.0))
    i = 0
    while time.monotonic() < until:
        req = intents[(i // 2) % 64] if i % 2 == 0 else batches[(i // 2) % 64]
        if interval_s > 0:
            t0 = start + i * interval_s
            ahead = t0 - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        else:
            t0 = time.monotonic()
        try:
            writer.write(req)
            await writer.drain()
            status = await _read_response(reader)
        except (ConnectionError, asyncio.IncompleteReadError) as err:
            errors.append(f"connection: {err}")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            continue
        lat.append((time.monotonic() - t0) * (1 if i % 2 == 0 else -1))
        if status not in (200, 201, 202):  # (201: the first PUT of a job declares it)
            errors.append(f"status {status}")
        i += 1
    writer.close()


def _load_proc(port: int, first: int, n: int, start: float, until: float, n_links: int,
               tenant_gpus: list[list[int]], out: mp.Queue, interval_s: float) -> None:
    lat: list[float] = []
    errors: list[str] = []
    requests = [_requests(first + k, n_links, tenant_gpus) for k in range(n)]

    async def main() -> None:
        await asyncio.gather(*(_client(port, first + k, requests[k], start, until, lat,
                                       errors, interval_s)
                               for k in range(n)))

    asyncio.run(main())
    out.put((lat, errors))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s children (the service's control process) and of their
    children (the twin's process)."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        me = int(stat.parent.name)
        parent[me] = int(fields[1])
        cpu[me] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = {p for p, pp in parent.items() if pp == pid}
    grandchildren = {p for p, pp in parent.items() if pp in children}
    return sum(cpu[p] for p in children), sum(cpu[p] for p in grandchildren)


def _start_service(state: Path, port: int, twin: bool, single: bool
                   ) -> subprocess.Popen[bytes]:
    tokens = state.parent / "tokens.yaml"
    lines = ["tokens:", f"  - {{name: ops, role: operator, token: {OPS}}}"]
    lines += [f"  - {{name: t{i}, role: tenant, tenant: t{i}, token: {_tenant_token(i)}}}"
              for i in range(TENANTS)]
    tokens.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "fabricpilot", "serve", "--state-dir", str(state),
           "--tokens", str(tokens), "--port", str(port), "--log-level", "WARNING"]
    if not twin:
        cmd.append("--no-twin")
    if single:
        cmd.append("--single-process")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the service did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--procs", type=int, default=1, help="load-generating processes")
    ap.add_argument("--twin", action=argparse.BooleanOptionalAction, default=True,
                    help="run the default scenario's jobs on the twin meanwhile")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="offered requests/s, spread evenly over the clients on a fixed "
                         "schedule (open loop; latency from each request's scheduled "
                         "time); 0: every client sends back to back (closed loop)")
    ap.add_argument("--single-process", action="store_true",
                    help="serve with the controller in the API's process")
    args = ap.parse_args()
    if args.rate < 0:
        ap.error(f"--rate: must be >= 0 requests/s, got {args.rate:g}")
    if args.seconds <= 0 or args.clients < 1 or not 1 <= args.procs <= args.clients:
        ap.error("--seconds must be > 0, --clients >= 1 and --procs within 1..clients")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        proc = _start_service(state, port, args.twin, args.single_process)
        try:
            ops = {"Authorization": f"Bearer {OPS}"}
            fabric = httpx.get(f"http://127.0.0.1:{port}/api/v1/fabric", headers=ops).json()
            n_links = len(fabric["links"])
            # each tenant's jobs get GPUs of their own, among those the twin's jobs leave
            used = {g for j in httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs",
                                         headers=ops).json() for g in j["gpus"]}
            free = [g for g in range(fabric["gpus"]) if g not in used]
            per = max(2, min(16, len(free) // TENANTS))
            tenant_gpus = [free[k * per:(k + 1) * per] for k in range(len(free) // per)]
            tenant_gpus = tenant_gpus[:TENANTS]
            # every client is set up and connected before the common start
            start = time.monotonic() + 3.0
            until = start + args.seconds
            q: mp.Queue = mp.Queue()
            share = [args.clients // args.procs + (k < args.clients % args.procs)
                     for k in range(args.procs)]
            procs = [mp.Process(target=_load_proc,
                                args=(port, sum(share[:k]), share[k], start, until, n_links,
                                      tenant_gpus, q,
                                      args.clients / args.rate if args.rate > 0 else 0.0))
                     for k in range(args.procs)]
            for p in procs:
                p.start()
            time.sleep(max(start - time.monotonic(), 0.0))
            cpu0 = _cpu_s(proc.pid)
            child0, twin0 = _descendants_cpu_s(proc.pid)
            results = [q.get() for _ in procs]
            wall = time.monotonic() - start
            server_cpu_s = _cpu_s(proc.pid) - cpu0
            child1, twin1 = _descendants_cpu_s(proc.pid)
            control_cpu_s, twin_cpu_s = child1 - child0, twin1 - twin0
            for p in procs:
                p.join()
            health = httpx.get(f"http://127.0.0.1:{port}/health").json()
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(20)
    signed = np.array([x for r in results for x in r[0]]) * 1e3
    lat = np.abs(signed)
    put_ms, tel_ms = signed[signed > 0], -signed[signed < 0]
    errors = [e for r in results for e in r[1]]
    def metric(prefix: str) -> float:
        return next((float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith(prefix)), 0.0)

    plans = metric("fabricpilot_plans_total") + metric("fabricpilot_job_plans_total")
    plan_s = metric('fabricpilot_planner_seconds_sum{kind="plan"}')
    tick_s = metric('fabricpilot_planner_seconds_sum{kind="tick"}')
    rps = len(lat) / wall
    mode = (f"open loop at {args.rate:,.0f} requests/s offered" if args.rate > 0
            else "closed loop")
    print(f"service load test ({mode}): {args.clients} clients x {args.seconds:g} s, twin "
          f"{'on' if args.twin else 'off'}, {len(tenant_gpus)} tenants' jobs of "
          f"{len(tenant_gpus[0])} GPUs")
    print(f"  requests      {len(lat):,} ({rps:,.0f} /s; target >= 2,000)")
    print(f"  latency ms    p50 {np.percentile(lat, 50):.2f}  p90 {np.percentile(lat, 90):.2f}"
          f"  p99 {np.percentile(lat, 99):.2f} (target <= 50)  max {lat.max():.1f}")
    print(f"  by kind, p50 / p99 ms: intent updates {np.percentile(put_ms, 50):.2f} / "
          f"{np.percentile(put_ms, 99):.2f}, telemetry batches "
          f"{np.percentile(tel_ms, 50):.2f} / {np.percentile(tel_ms, 99):.2f}")
    print(f"  service CPU   API process {server_cpu_s:.1f} s, control process "
          f"{control_cpu_s:.1f} s, of {wall:.1f} s wall "
          f"({(server_cpu_s + control_cpu_s) / max(len(lat), 1) * 1e6:.0f} us per request, "
          "planning included)" + (f"; twin process {twin_cpu_s:.1f} s" if twin_cpu_s
                                  else ""))
    print(f"  errors        {len(errors)}" + (f" (e.g. {errors[0]})" if errors else ""))
    print(f"  plans         {plans:.0f} (intent updates batched per plan: "
          f"{len(lat) / 2 / max(plans, 1):.0f}); planning {plan_s:.1f} s, control periods "
          f"(telemetry folded in) {tick_s:.1f} s of the service's CPU")
    print(f"  twin          {health.get('twin')}")


if __name__ == "__main__":
    main()
