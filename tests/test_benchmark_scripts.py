"""The controller benchmark script runs and says where it stands against each target (its
timings are its own business: nothing here depends on this machine's speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "run_controller_bench.py"


def test_the_controller_benchmark_reports_each_target() -> None:
    res = subprocess.run([sys.executable, str(BENCH), "--runs", "1"], capture_output=True,
                         text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # 1024 GPUs, 8 jobs of 128. On whole hosts (16 of 8 GPUs each): four ring AllReduce
    # jobs on their rails (an NVLink ring per host and a ring per rail: 128 + 128 pairs
    # each) and four PXN AlltoAll jobs (16 * 8 * 7 NVLink pairs and 8 rails * 16 * 15:
    # 2816 each): 4 * 256 + 4 * 2816 = 12288. Scattered (hosts uneven): a pair per GPU
    # for a ring, 128 * 127 for an AlltoAll: 4 * 128 + 4 * 16256 = 65536.
    assert re.search(r"^1024 GPUs/8 jobs\s+12288\s", out, re.M), out
    assert re.search(r"^1024 GPUs/8 jobs\s+65536\s", out, re.M), out
    for placement in ("hosts", "gpus"):
        assert re.search(rf"1024 GPUs / 8 jobs on {placement}: plan [\d.]+ s against the "
                         r"target of 1 s: (met|missed)", out), out
    assert re.search(r"one job changed: planned by itself \(2816 demands\)", out), out
    # each plan's CPU time and the memory it touched first, a line per run of both cases
    cpu = re.findall(r"^  plan CPU: ([\d.]+) s user, ([\d.]+) s system; (\d+) page faults "
                     r"\(memory touched the first time\); process peak ([\d.]+) GB$", out, re.M)
    assert len(cpu) == 2, out
    for user, _, faults, peak in cpu:
        # (a plan of 12 288 pairs or more makes megabytes of new objects: pages are touched)
        assert float(user) > 0 and int(faults) > 0 and float(peak) > 0
    assert re.search(r"one job changed: planned by itself \(16256 demands\)", out), out
    assert re.search(r"telemetry: 1024 GPUs, \d+ links: a control period with every port "
                     r"reporting folded into the congestion map in [\d.]+ ms, an idle one "
                     r"\(every port fading\) in [\d.]+ ms", out), out
    assert re.search(r"ranking: 196 switches and hosts, [\d.]+ ms per request .*target <= "
                     r"1 ms: (met|missed)\)", out), out
    # (the planner's gap to the LP optimum does not depend on the machine: within 5 %)
    assert re.search(r"planner gap to the LP optimum, 4 parts per demand \(20 instances\): "
                     r"mean [\d.]+ %, max [\d.]+ % \(target <= 5 %: met\)", out), out


def test_the_controller_benchmark_refuses_a_bad_run_count() -> None:
    res = subprocess.run([sys.executable, str(BENCH), "--runs", "0"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2
    assert "--runs must be at least 1" in res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, str(BENCH), "--large-runs", "0"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2 and "--large-runs must be at least 1" in res.stderr


def test_the_failure_benchmark_places_jobs_both_ways() -> None:
    failure = BENCH.with_name("run_failure_bench.py")
    res = subprocess.run([sys.executable, str(failure), "--runs", "1", "--repeat", "2",
                          "--placement", "both"], capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr
    # the same 1024-GPU cases as the planner's (pairs counted in the test above)
    for where, pairs in (("scattered GPUs", 65536), ("whole hosts", 12288)):
        assert re.search(rf"^failure 1024 GPUs / 8 jobs on {where}: plan [\d.]+ s \({pairs} "
                         r"demands\); the hottest cable fails .* median of 2 failures [\d.]+ ms "
                         r".*\(target <= 10 ms\)$", res.stdout, re.M), res.stdout
    bad = subprocess.run([sys.executable, str(failure), "--placement", "racks"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "invalid choice: 'racks'" in bad.stderr
