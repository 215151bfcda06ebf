"""Engine benchmarks: wall time and peak memory of large collectives on this machine.

Each case runs in its own process so that its peak resident memory is its own.

    python benchmarks/run_benchmarks.py              # every case
    python benchmarks/run_benchmarks.py --only a2a   # cases whose name contains "a2a"

Cases: AlltoAll of 256 MiB per GPU on 128, 512 and 1024 GPUs, ring AllReduce of 1 GiB on
1024 and 8192 GPUs, each under ``ecmp``, ``adaptive`` and ``ideal``, on a rail-optimised
non-blocking 400G leaf-spine with 8 GPUs per host. AlltoAll runs both as NCCL does on such
hosts (``pxn``: NVLink to the right rail, then one flow per host pair and rail) and ``flat``
(one flow per GPU pair: n(n-1) flows, the engine's stress case). AllReduce runs as one flat
ring over all GPUs (``ring``), hierarchically (``hierarchical``), over one ring per rail
(``rails``) and over double binary trees per rail (``tree``, what ``auto`` picks at these
scales).
Targets: 1024-GPU AlltoAll <= 60 s and <= 8 GB; 8192-GPU AllReduce <= 30 s.

Fluid model (queues, ECN, DCQCN, PFC; ``fluid-`` cases, ``--only fluid``): 128-GPU AlltoAll
of 64 MiB per GPU (PXN and flat) and a 1024-GPU ring AllReduce of 1 GiB (also 64 MiB, which
shows the cost per simulated millisecond). Target <= 60 s each. The first fluid case after
an install also compiles the model's kernels (~10 s; cached for later runs).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [
    # name, op, gpus, size_bytes, algorithm, rate model
    ("a2a-128-pxn", "alltoall", 128, 256 << 20, "auto", "flow"),
    ("a2a-512-pxn", "alltoall", 512, 256 << 20, "auto", "flow"),
    ("a2a-1024-pxn", "alltoall", 1024, 256 << 20, "auto", "flow"),
    ("a2a-128-flat", "alltoall", 128, 256 << 20, "flat", "flow"),
    ("a2a-512-flat", "alltoall", 512, 256 << 20, "flat", "flow"),
    ("a2a-1024-flat", "alltoall", 1024, 256 << 20, "flat", "flow"),
    ("ar-1024-ring", "allreduce", 1024, 1 << 30, "ring", "flow"),
    ("ar-8192-ring", "allreduce", 8192, 1 << 30, "ring", "flow"),
    ("ar-1024-hier", "allreduce", 1024, 1 << 30, "hierarchical", "flow"),
    ("ar-8192-hier", "allreduce", 8192, 1 << 30, "hierarchical", "flow"),
    ("ar-1024-rails", "allreduce", 1024, 1 << 30, "rails", "flow"),
    ("ar-8192-rails", "allreduce", 8192, 1 << 30, "rails", "flow"),
    ("ar-1024-tree", "allreduce", 1024, 1 << 30, "tree", "flow"),
    ("ar-8192-tree", "allreduce", 8192, 1 << 30, "tree", "flow"),
    ("fluid-a2a-128-pxn", "alltoall", 128, 64 << 20, "auto", "fluid"),
    ("fluid-a2a-128-flat", "alltoall", 128, 64 << 20, "flat", "fluid"),
    ("fluid-ar-1024-64M", "allreduce", 1024, 64 << 20, "ring", "fluid"),
    ("fluid-ar-1024-ring", "allreduce", 1024, 1 << 30, "ring", "fluid"),
]
POLICIES = ("ecmp", "adaptive", "ideal")


def run_case(op: str, gpus: int, size: int, algorithm: str, policy: str,
             model: str = "flow") -> dict[str, object]:
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
    prep = Prepared("bench", 1, ct, [JobSpec("bench", tuple(range(gpus)), (plan,))],
                    rate_model=model)
    res = run_policy(prep, policy)
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
    from fabricpilot.balancing import POLICIES as REGISTERED

    parser.add_argument("--policy", action="append", choices=sorted(REGISTERED),
                        help=f"policies to run (default: {', '.join(POLICIES)})")
    parser.add_argument("--case", nargs=6, help=argparse.SUPPRESS)  # child process
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    args = parser.parse_args()
    if args.case:
        op, gpus, size, algorithm, policy, model = args.case
        print(json.dumps(run_case(op, int(gpus), int(size), algorithm, policy, model)))
        return
    header = (f"{'case':<19} {'policy':<8} {'algorithm':<13} {'flows':>9} {'updates':>7} "
              f"{'sim ms':>8} {'busbw GB/s':>10} {'wall s':>8} {'peak MB':>8}")
    print(header)
    print("-" * len(header))
    print("(updates: the engine's rate recomputations, one per change of the set of flows;\n"
          " peak MB: the case's own process, its peak resident memory)")
    for name, op, gpus, size, algorithm, model in CASES:
        if args.only not in name:
            continue
        # the fluid model follows ECMP's paths; ideal would expand every flow over all paths
        for policy in (args.policy or POLICIES) if model == "flow" else ("ecmp",):
            cmd = [sys.executable, __file__, "--case", op, str(gpus), str(size), algorithm,
                   policy, model]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{name:<19} {policy:<8} did not finish within {args.timeout:.0f} s")
                continue
            if proc.returncode != 0:
                print(f"{name:<19} {policy:<8} FAILED: {proc.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{name:<19} {policy:<8} {r['algorithm']:<13} {r['flows']:>9} "
                  f"{r['rate_updates']:>7} {r['sim_ms']:>8.2f} {r['busbw_GBps']:>10.1f} "
                  f"{r['total_s']:>8.2f} {r['peak_mb']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
