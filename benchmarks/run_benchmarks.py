"""Engine benchmarks: wall time and peak memory of large collectives on this machine.

Each case runs in its own process so that its peak resident memory is its own.

    python benchmarks/run_benchmarks.py              # every case
    python benchmarks/run_benchmarks.py --only a2a   # cases whose name contains "a2a"

Cases (the foundation issue's list): AlltoAll of 256 MiB per GPU on 128, 512 and 1024 GPUs,
ring AllReduce of 1 GiB on 1024 and 8192 GPUs, each under ``ecmp`` and ``ideal``, on a
rail-optimised non-blocking 400G leaf-spine with 8 GPUs per host. AlltoAll runs both as NCCL
does on such hosts (``pxn``: NVLink to the right rail, then one flow per host pair and rail)
and ``flat`` (one flow per GPU pair: n(n-1) flows, the engine's stress case). AllReduce runs
as one flat ring over all GPUs (``ring``) and hierarchically (``hierarchical``).
Targets: 1024-GPU AlltoAll <= 60 s and <= 8 GB; 8192-GPU AllReduce <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [
    # name, op, gpus, size_bytes, algorithm
    ("a2a-128-pxn", "alltoall", 128, 256 << 20, "auto"),
    ("a2a-512-pxn", "alltoall", 512, 256 << 20, "auto"),
    ("a2a-1024-pxn", "alltoall", 1024, 256 << 20, "auto"),
    ("a2a-128-flat", "alltoall", 128, 256 << 20, "flat"),
    ("a2a-512-flat", "alltoall", 512, 256 << 20, "flat"),
    ("a2a-1024-flat", "alltoall", 1024, 256 << 20, "flat"),
    ("ar-1024-ring", "allreduce", 1024, 1 << 30, "ring"),
    ("ar-8192-ring", "allreduce", 8192, 1 << 30, "ring"),
    ("ar-1024-hier", "allreduce", 1024, 1 << 30, "auto"),
    ("ar-8192-hier", "allreduce", 8192, 1 << 30, "auto"),
]
POLICIES = ("ecmp", "ideal")


def run_case(op: str, gpus: int, size: int, algorithm: str, policy: str) -> dict[str, object]:
    """Build the cluster, the collective and run it; returns the figures (in this process)."""
    import numpy as np

    from fabricpilot.nccltests import default_cluster
    from fabricpilot.runner import Prepared, run_policy
    from fabricpilot.workload.collectives import build_collective
    from fabricpilot.workload.jobs import JobSpec

    t0 = time.perf_counter()
    ct = default_cluster(gpus)
    plan = build_collective(op, np.arange(gpus), size, gpus_per_host=8, algorithm=algorithm)
    setup = time.perf_counter() - t0
    res = run_policy(Prepared("bench", 1, ct, [JobSpec("bench", tuple(range(gpus)), (plan,))]),
                     policy)
    c = res.collectives[0]
    return {
        "algorithm": plan.algorithm, "flows": len(res.flows["members"]),
        "rate_updates": res.n_rate_updates, "sim_ms": res.sim_time_ns / 1e6,
        "busbw_GBps": c.busbw_GBps, "setup_s": setup, "run_s": res.wall_time_s,
        "total_s": time.perf_counter() - t0,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--policy", action="append", choices=POLICIES)
    parser.add_argument("--case", nargs=5, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.case:
        op, gpus, size, algorithm, policy = args.case
        print(json.dumps(run_case(op, int(gpus), int(size), algorithm, policy)))
        return
    header = (f"{'case':<15} {'policy':<6} {'algorithm':<13} {'flows':>9} {'updates':>7} "
              f"{'busbw GB/s':>10} {'wall s':>8} {'peak MB':>8}")
    print(header)
    print("-" * len(header))
    for name, op, gpus, size, algorithm in CASES:
        if args.only not in name:
            continue
        for policy in args.policy or POLICIES:
            cmd = [sys.executable, __file__, "--case", op, str(gpus), str(size), algorithm,
                   policy]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{name:<15} {policy:<6} FAILED: {proc.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{name:<15} {policy:<6} {r['algorithm']:<13} {r['flows']:>9} "
                  f"{r['rate_updates']:>7} {r['busbw_GBps']:>10.1f} {r['total_s']:>8.2f} "
                  f"{r['peak_mb']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
