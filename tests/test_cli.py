"""The command line as a user meets it: exit codes, one-line errors, reproducible output,
every example scenario runs, and nccl-test prints nccl-tests' layout with consistent numbers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabricpilot.scenario import default_scenario_path
from fabricpilot.workload.plan import Op, busbw_factor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabricpilot", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def small_scenario(tmp_path: Path, **changes: object) -> dict:
    data = {
        "name": "small", "seed": 3, "policies": ["ecmp", "ideal"],
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "jobs": [{"name": "a2a", "gpus": 8, "iterations": 2, "compute_ns": "10us",
                  "collectives": [{"op": "alltoall", "size_bytes": "8MiB"}]}],
        "mice": {"rate_per_s": 100000, "duration_ns": "1ms"},
    }
    data.update(changes)
    return data


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_and_runs(path: Path, tmp_path: Path) -> None:
    assert cli("validate", str(path)).returncode == 0
    res = cli("run", str(path), "--json", str(tmp_path / "s.json"))
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    runs = summary.get("runs", [summary])
    for run in runs:
        assert run["bytes_delivered"] == run["bytes_sent"] > 0
        c = run.get("controller")
        if c:  # a controller-driven run: its rule tables never overflow
            assert c["switch_rules_max"] == max(c["switch_rules"].values(), default=0)
            assert c["switch_rules_max"] <= c["switch_rule_capacity"]
            assert c["qps_steered"] + c["qps_pinned"] + c["qps_unpinned"] > 0
    by_policy = {run["policy"]: run for run in runs}
    # for one job on a symmetric Clos no load balancer beats even spraying (with several
    # jobs a policy may happen to keep them apart better than spraying does)
    if {"ecmp", "ideal"} <= by_policy.keys() and len(runs[0]["jobs"]) == 1:
        for e, i in zip(by_policy["ecmp"]["jobs"], by_policy["ideal"]["jobs"], strict=True):
            assert i["mean_busbw_GBps"] >= e["mean_busbw_GBps"] * (1 - 1e-6)


def test_the_collision_example_collides(tmp_path: Path) -> None:
    """examples/permutation_ecmp_collisions.yaml: a 32-GPU ring whose ranks are shuffled
    over 8 leaves of 8 single-GPU hosts has about 4 members per leaf, nearly each sending
    its one stream off the leaf; 4 flows hashed into 8 uplinks put two on one with
    probability 1 - 8*7*6*5/8^4 = 59 %, so some leaf of the 8 almost surely does (1 - 0.41^8
    > 99.9 %), and a ring runs at the pace of its slowest hop: ECMP at most half of ideal,
    adaptive (which sees its queues) close to it. The AlltoAll's many flows average out."""
    out = tmp_path / "s.json"
    res = cli("run", str(ROOT / "examples" / "permutation_ecmp_collisions.yaml"), "--json",
              str(out))
    assert res.returncode == 0, res.stderr
    runs = {r["policy"]: {j["name"]: j for j in r["jobs"]}
            for r in json.loads(out.read_text())["runs"]}
    assert runs["ecmp"]["ring-allreduce"]["of_ideal"] <= 0.5
    assert runs["adaptive"]["ring-allreduce"]["of_ideal"] >= 0.85
    assert runs["ecmp"]["alltoall"]["of_ideal"] >= 0.95


def test_default_run_json_fields_and_reproducibility(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        res = cli("run", "--policy", "ecmp", "--json", str(out), "--reproducible")
        assert res.returncode == 0, res.stderr
    assert a.read_bytes() == b.read_bytes()
    s = json.loads(a.read_text())
    for key in ("policy", "seed", "sim_time_ns", "wall_time_s", "bytes_sent", "bytes_delivered"):
        assert key in s
    assert s["policy"] == "ecmp" and s["seed"] == 7
    job = s["jobs"][0]
    for key in ("name", "n_gpus", "mean_iteration_ns", "collectives"):
        assert key in job
    # each job's busbw against ideal's (run as the reference): the table's "of ideal"
    for j in s["jobs"]:
        assert j["of_ideal"] == pytest.approx(j["mean_busbw_GBps"] / j["ideal_busbw_GBps"],
                                              rel=1e-5)
    # vision-dp's hosts share their leaves and its rings stay on their rails: no spine, no
    # choice of path, ECMP's time is ideal's; llm-dp's rail rings cross the spines and collide
    assert job["of_ideal"] == pytest.approx(1.0, abs=1e-9)
    assert 0 < s["jobs"][1]["of_ideal"] < 1
    # the mean iteration is the mean of the iterations listed, to 0.1 ns
    its = job["iteration_ns"]
    assert job["mean_iteration_ns"] == pytest.approx(sum(its) / len(its), abs=0.05)
    c = job["collectives"][0]
    for key in ("op", "n_ranks", "size_bytes", "start_ns", "end_ns", "algbw_GBps", "busbw_GBps"):
        assert key in c
    # algbw and busbw follow the nccl-tests definitions from the recorded size and times
    algbw = c["size_bytes"] / (c["end_ns"] - c["start_ns"])
    assert c["algbw_GBps"] == pytest.approx(algbw, rel=1e-5)
    assert c["busbw_GBps"] == pytest.approx(algbw * busbw_factor(Op(c["op"]), c["n_ranks"]),
                                            rel=1e-5)


def test_a_controller_run_with_heals_is_reproducible(tmp_path: Path) -> None:
    """The controller's heal times are wall-clock figures: --reproducible writes them as 0,
    as the wall time, and leaves them off the report (they made two equal runs differ)."""
    outs, pages = [], []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        res = cli("run", str(ROOT / "examples" / "link_failure.yaml"), "-p", "task-aware",
                  "--json", str(out), "--out", str(tmp_path / name), "--reproducible")
        assert res.returncode == 0, res.stderr
        outs.append(out.read_text())
        pages.append((tmp_path / name / "report.html").read_text())
    assert outs[0] == outs[1]
    assert pages[0] == pages[1] and "heals</p>" in pages[0]
    c = json.loads(outs[0])["controller"]
    assert c["heals"] > 0 and c["heal_max_ms"] == c["heal_sent_max_ms"] == 0.0


def test_seed_changes_ecmp_but_same_seed_does_not(tmp_path: Path) -> None:
    data = small_scenario(tmp_path)
    path = write(tmp_path, data)
    outs = []
    for seed, name in ((3, "a"), (3, "b"), (4, "c")):
        out = tmp_path / f"{name}.json"
        assert cli("run", str(path), "-p", "ecmp", "--seed", str(seed), "--json", str(out),
                   "--reproducible").returncode == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_the_ideal_reference_is_shown_when_not_asked_for(tmp_path: Path) -> None:
    """Without `ideal` among the policies it still runs as the reference of the "of ideal"
    column: its busbw is printed, and each fraction is the policy's busbw over it."""
    path = write(tmp_path, small_scenario(tmp_path))
    res = cli("run", str(path), "-p", "ecmp")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("of ideal: "))
    ref = {name: float(v) for name, v in re.findall(r"([\w-]+) ([\d.]+)(?:,|$)", line)}
    rows = [cells for ln in res.stdout.splitlines()  # (the jobs' table: policy 3rd)
            if len(cells := ln.split("│")) == 8 and cells[3].strip() == "ecmp"]
    assert rows and len(ref) == len(rows)
    for (name, busbw_ref), cells in zip(ref.items(), rows, strict=True):
        busbw, frac = float(cells[5]), float(cells[6].strip().rstrip("%"))
        assert frac == pytest.approx(100 * busbw / busbw_ref, abs=0.1), (name, cells)


def test_out_dir_writes_tables(tmp_path: Path) -> None:
    path = write(tmp_path, small_scenario(tmp_path))
    assert cli("run", str(path), "--out", str(tmp_path / "t")).returncode == 0
    for policy in ("ecmp", "ideal"):
        for table in ("flows", "collectives", "iterations", "links"):
            lines = (tmp_path / "t" / policy / f"{table}.csv").read_text().splitlines()
            assert len(lines) > 1
    flows = (tmp_path / "t" / "ecmp" / "flows.csv").read_text().splitlines()
    assert flows[0].startswith("job,iteration")
    # 2 iterations x 8*7 AlltoAll pairs + the mice (1 ms at 100k/s: ~100)
    assert 2 * 56 + 50 < len(flows) - 1 < 2 * 56 + 160
    # the plots and the page that shows them, with every policy and only files that exist
    page = (tmp_path / "t" / "report.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert {"plots/busbw.png", "plots/slowdown_cdf.png", "plots/link_utilization.png",
            "plots/iterations.png"} <= set(images)
    for image in images:
        assert (tmp_path / "t" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert '<a href="ecmp/">' in page and '<a href="ideal/">' in page


def _bad(tmp_path: Path, mutate) -> Path:  # type: ignore[no-untyped-def]
    data = small_scenario(tmp_path)
    mutate(data)
    return write(tmp_path, data, "bad.yaml")


BAD_CASES = {
    "unknown key": (lambda d: d["topology"].update(rate_gpbs=400), "topology.rate_gpbs"),
    "wrong unit": (lambda d: d["topology"].update(link_delay_ns="5Gbps"),
                   "topology.link_delay_ns"),
    "negative size": (lambda d: d["jobs"][0]["collectives"][0].update(size_bytes=-5),
                      "jobs[0].collectives[0].size_bytes"),
    "gpu does not exist": (lambda d: d["jobs"][0].update(placement="explicit", gpus=2,
                                                         gpu_ids=[0, 99]),
                           "jobs[0].gpu_ids[1]"),
    "job larger than cluster": (lambda d: d["jobs"][0].update(gpus=9), "jobs[0].gpus"),
    "unknown policy": (lambda d: d.update(policies=["ecmp", "magic"]), "policies[1]"),
    # beyond what the engine's integers hold, or what a laptop can build or run
    "time beyond int64": (lambda d: d["jobs"][0].update(compute_ns=2**63),
                          "jobs[0].compute_ns"),
    "size beyond float": (lambda d: d["jobs"][0]["collectives"][0].update(
        size_bytes=10**400), "jobs[0].collectives[0].size_bytes"),
    "ten million hosts": (lambda d: d["topology"].update(hosts=10**7), "topology.hosts"),
    "a million spines": (lambda d: d["topology"].update(fabric_rate_gbps=0.0009765625),
                         "topology.fabric_rate_gbps"),
    "1e13 mice": (lambda d: d["mice"].update(rate_per_s=1e13, duration_ns="1s"),
                  "mice.rate_per_s"),
    "a window under one packet": (lambda d: d.update(fabric={"model": "fluid",
                                                             "fluid": {"window_bytes": 1}}),
                                  "fabric.fluid.window_bytes"),
    "a billion QPs": (lambda d: d.update(ecmp={"qps_per_connection": 10**9}),
                      "ecmp.qps_per_connection"),
    "a key with a newline": (lambda d: d.update({"bad\nkey": 1}), "'bad\\nkey'"),
    # each within its own limit, together beyond a run's 1e15 ns (the engine overflowed)
    "iterations x compute_ns": (lambda d: d["jobs"][0].update(iterations=10_000,
                                                              compute_ns="1e15"),
                                "jobs[0].compute_ns"),
    "a trillion iterations": (lambda d: d["jobs"][0].update(iterations=10**12),
                              "jobs[0].iterations"),
    "a rate under 1 Mbps": (lambda d: d["topology"].update(nic_rate_gbps="1bps"),
                            "topology.nic_rate_gbps"),
    # booleans are not counts (they were read as 1)
    "a boolean retry count": (lambda d: d.update(faults={"rdma_retry_count": True}),
                              "faults.rdma_retry_count"),
    "a boolean row count": (lambda d: d.update(fabric={"model": "fluid", "fluid": {
        "max_timeseries_rows": True}}), "fabric.fluid.max_timeseries_rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_scenarios_fail_with_one_line(case: str, command: str, tmp_path: Path) -> None:
    mutate, field = BAD_CASES[case]
    path = _bad(tmp_path, mutate)
    res = cli(command, str(path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "bad.yaml" in lines[0] and field in lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "task-aware"])
def test_a_run_past_the_engines_clock_is_one_line(tmp_path: Path, policy: str) -> None:
    """1000 TiB at 1 Mb/s: each value within its limits, the run's end past 2^63 ns (8e9
    s for a single TiB's 8.8e12 bits at 1e6 b/s). One line naming the scenario and job
    before any run, under every policy (one that steps through time periodically once
    ran for hours instead), not an OverflowError's traceback."""
    data = small_scenario(tmp_path)
    data.pop("mice")
    data["topology"].update(nic_rate_gbps="1Mbps", fabric_rate_gbps="1Mbps")
    data["jobs"][0]["collectives"][0]["size_bytes"] = "1000TiB"
    res = cli("run", str(write(tmp_path, data)), "-p", policy)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "s.yaml: jobs[0]: " in lines[0]
    assert "days of simulated time" in lines[0]
    assert "beyond the twin's 1e15 ns (11.6 days)" in lines[0]
    res = cli("validate", str(write(tmp_path, data)))
    assert res.returncode == 2 and "days of simulated time" in res.stderr


@pytest.mark.parametrize("args, problem", [
    (["run", "--seed", "abc"], "fabricpilot run: Invalid value for '--seed'"),
    (["run", "--bogus"], "fabricpilot run: No such option: --bogus"),
    (["validate"], "fabricpilot validate: Missing argument 'SCENARIO'."),
    (["validate", "a.yaml", "b.yaml"], "fabricpilot validate: Got unexpected extra argument"),
    (["nosuch"], "fabricpilot: No such command 'nosuch'."),
    # an option missing its value is found before the command's context exists: the
    # command is still named (it said "fabricpilot")
    (["run", "--json"], "fabricpilot run: Option '--json' requires an argument."),
    (["topology", "export", "--scenario"],
     "fabricpilot topology export: Option '--scenario' requires an argument."),
])
def test_usage_errors_are_one_line(args: list[str], problem: str) -> None:
    """The CLI library's own errors (options, arguments, commands) are one line too, as
    every other input error, not a framed box of several lines."""
    res = cli(*args)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {problem}"), res.stderr
    assert lines[0].endswith("--help)")


def test_missing_file_and_bad_flags(tmp_path: Path) -> None:
    res = cli("run", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "nope.yaml" in res.stderr and "not found" in res.stderr
    res = cli("run", "--policy", "magic")
    assert res.returncode == 2 and "magic" in res.stderr
    res = cli("nccl-test", "--min-bytes", "1ms")
    assert res.returncode == 2 and "--min-bytes" in res.stderr


@pytest.mark.parametrize("args, flag", [
    (["run", "--out", ""], "--out"),
    (["run", "--json", " "], "--json"),
    (["nccl-test", "--out="], "--out"),
    (["topology", "export", ""], "path"),
])
def test_an_empty_output_path_is_refused_not_read_as_here(tmp_path: Path, args: list[str],
                                                         flag: str) -> None:
    # (an unset shell variable: the outputs would land in the current folder)
    res = subprocess.run([sys.executable, "-m", "fabricpilot", *args], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "empty path" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, flag", [
    (["--gpus-per-host", "0"], "--gpus-per-host"),
    (["--min-bytes", "1e400"], "--min-bytes"),
    (["--rate-gbps", "inf"], "--rate-gbps"),
    (["--algorithm", "bogus"], "--algorithm"),
    (["--seed", "-1"], "--seed"),
    (["--min-bytes", "2M", "--max-bytes", "1M"], "--max-bytes"),
    (["--rate-gbps", "1e-9"], "--rate-gbps"),
    (["--min-bytes", "1.5"], "--min-bytes"),
    (["--oversubscription", "0.5"], "--oversubscription"),
    (["--oversubscription", "2.0000000001"], "--oversubscription"),
    (["--op", "broadcast", "--algorithm", "hierarchical"], "--algorithm"),
    (["--gpus", "1"], "--gpus"),
    (["--gpus", "12"], "--gpus"),
])
def test_nccl_test_bad_flags_fail_with_one_line(args: list[str], flag: str) -> None:
    res = cli("nccl-test", "--gpus", "16", "--min-bytes", "1M", "--max-bytes", "2M", *args)
    assert res.returncode == 2 and res.stdout == ""  # (nothing printed before the error)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}:"), res.stderr


def test_nccl_test_a_gpu_count_out_of_range_is_given_back_in_digits() -> None:
    res = cli("nccl-test", "--gpus", "999999999")
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: --gpus: must be >= 2 and <= 131072, got 999999999")


def test_nccl_test_gpus_that_do_not_fill_hosts_say_what_would() -> None:
    res = cli("nccl-test", "--gpus", "4")
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: --gpus: 4 GPUs do not fill hosts of 8 (--gpus-per-host): give a multiple "
        "of 8, or --gpus-per-host 4")


def test_nccl_test_a_prime_host_count_says_what_would_fill_leaves() -> None:
    """67 hosts (a prime) have no divisor from 8 to 64 ports a leaf: 67 one-port leaves
    per rail is no cluster anyone builds. 66 (6 x 11) and 68 (4 x 17) hosts are next."""
    res = cli("nccl-test", "--gpus", "536")
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: --gpus: 67 hosts of 8 GPUs fill no leaves of 8 to 64 ports (the largest "
        "divisor of 67 up to 64 is 1): give 528 or 544 GPUs, or a scenario file with the "
        "leaves you mean")


def test_nccl_test_a_decimal_oversubscription_that_divides_the_ports() -> None:
    """64 ports per leaf at 3.2 : 1 are 20 uplinks (64 / 3.2 = 20 exactly as written)."""
    res = cli("nccl-test", "--gpus", "512", "--min-bytes", "1M", "--max-bytes", "1M",
              "--oversubscription", "3.2")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("args, flag", [
    (["serve", "--no-twin", "--max-body", "-1"], "--max-body"),
    (["serve", "--no-twin", "--max-body", "1PB"], "--max-body"),
    (["serve", "--no-twin", "--tick-interval", "nan"], "--tick-interval"),
    (["serve", "--no-twin", "--telemetry-interval", "0"], "--telemetry-interval"),
    (["serve", "--telemetry-interval", "1"], "--telemetry-interval"),  # (the twin reports)
    (["serve", "--no-twin", "--port", "99999"], "--port"),
    (["serve", "--time-scale", "inf"], "--time-scale"),
    (["serve", "--no-twin", "--time-scale", "5"], "--time-scale"),  # (no twin to pace)
    (["serve", "--dataplane", "http://127.0.0.1:1", "--time-scale", "5"], "--time-scale"),
    (["serve", "--no-twin", "--dataplane-token-file", "t.txt"], "--dataplane-token-file"),
    (["twin", "--time-scale", "nan"], "--time-scale"),
    (["twin", "--port", "-5"], "--port"),
])
def test_service_flags_are_checked_before_anything_starts(args: list[str], flag: str,
                                                          tmp_path: Path) -> None:
    res = cli(*args, *(["--state-dir", str(tmp_path)] if args[0] == "serve" else []))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith(f"error: {flag}:"), res.stderr


def test_a_state_dir_that_is_a_file_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    res = cli("serve", "--no-twin", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {tmp_path / 'state'}: the state directory exists and is not a directory")


def test_a_port_in_use_or_a_bad_host_is_one_line_before_anything_starts(
        tmp_path: Path) -> None:
    """``serve`` and ``twin`` bind before they build or print anything: a port another
    server holds, or a host that does not resolve, is one line and exit 2 (it printed the
    address it would serve on, then uvicorn's own error, exit 3)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for args in (["twin", "--port", port],
                     ["serve", "--no-twin", "--state-dir", str(tmp_path / "s"), "--port", port]):
            res = cli(*args)
            assert res.returncode == 2 and res.stdout == "", (args, res.stdout)
            assert res.stderr.strip().splitlines() == [
                f"error: --host, --port: cannot listen on 127.0.0.1:{port}: "
                "Address already in use"], res.stderr
    assert not (tmp_path / "s").exists()  # (nothing made: refused first)
    res = cli("twin", "--host", "bad..host")
    assert res.returncode == 2 and res.stderr.startswith("error: --host: cannot resolve "
                                                         "'bad..host'"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_outputs_that_cannot_be_written_fail_before_the_run(tmp_path: Path) -> None:
    """A path through a file, a directory for the JSON file, a file for the tables' folder:
    one line at once (not a traceback after the whole simulation), nothing half written."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    path = write(tmp_path, small_scenario(tmp_path))
    for args, flag in ((["--json", str(tmp_path / "afile" / "x.json")], "--json"),
                       (["--json", str(tmp_path / "adir")], "--json"),
                       (["--out", str(tmp_path / "afile")], "--out")):
        res = cli("run", str(path), *args)
        assert res.returncode == 2 and res.stdout == "", res.stdout
        assert res.stderr.startswith(f"error: {flag}: ") and "Traceback" not in res.stderr
    if Path("/proc/self").is_dir():  # (writable by its permission bits, for root: a
        # file cannot be made there)
        for flag in ("--json", "--out"):
            res = cli("run", str(path), flag, "/proc/x")
            assert res.returncode == 2 and res.stdout == "", res.stdout
            assert res.stderr.startswith(f"error: {flag}: /proc/x: /proc is not writable")
    res = cli("run", str(path), "--seed", "-1")
    assert res.returncode == 2 and "--seed" in res.stderr
    res = cli("run", str(path), "-p", "ecmp", "-p", "ecmp")
    assert res.returncode == 2
    assert res.stderr.strip() == "error: --policy: policy 'ecmp' given twice"
    res = cli("topology", "export", str(tmp_path / "adir"))
    assert res.returncode == 2 and "is a directory" in res.stderr


def test_outputs_that_would_overwrite_an_input_or_each_other_fail_before_the_run(
        tmp_path: Path) -> None:
    """The JSON summary onto the scenario, the topology export onto its own scenario, the
    summary onto a file ``--out`` writes or onto the ``--out`` folder itself: one line, exit
    2, before anything runs, and the files as they were."""
    path = write(tmp_path, small_scenario(tmp_path))
    text = path.read_text()
    out = tmp_path / "out"
    hard = tmp_path / "hard.json"  # (another name of the scenario's own file)
    os.link(path, hard)
    for args, start in (
            (["run", str(path), "--json", str(path)], "error: --json: "),
            (["run", str(path), "--json", str(hard)], "error: --json: "),
            (["topology", "export", str(hard), "--scenario", str(path)],
             "error: topology export: "),
            (["topology", "export", str(path), "--scenario", str(path)],
             "error: topology export: "),
            (["run", str(path), "--json", str(out / "report.html"), "--out", str(out)],
             "error: --json: "),
            (["run", str(path), "--json", str(out / "ecmp" / "flows.csv"), "--out", str(out)],
             "error: --json: "),
            (["run", str(path), "--json", str(out), "--out", str(out)], "error: --json, --out: "),
            # (a table of a policy not run: --out removes it once the runs are done)
            (["run", str(path), "-p", "ecmp", "--json", str(out / "adaptive" / "links.csv"),
              "--out", str(out)], "error: --json: "),
            # (the scenario where the output goes: `topology export SCENARIO`)
            (["topology", "export", str(path)], "error: topology export: "),
            (["run", str(path), "--out", str(tmp_path), "-p", "ecmp"], None)):
        res = cli(*args)
        if start is None:  # (a folder holding the scenario, which it does not overwrite)
            assert res.returncode == 0, res.stderr
            continue
        assert res.returncode == 2 and res.stdout == "", (args, res.stdout)
        assert res.stderr.startswith(start) and res.stderr.count("\n") == 1, res.stderr
        assert any(w in res.stderr for w in ("overwrit", "both name", "would be lost")), \
            res.stderr
    assert path.read_text() == text
    exported = tmp_path / "t.json"  # (an earlier export is replaced)
    assert cli("topology", "export", str(exported)).returncode == 0
    assert cli("topology", "export", str(exported), "--scenario", str(path)).returncode == 0
    assert not out.exists()
    # the scenario inside a policy's folder of --out: refused too
    inside = tmp_path / "o2" / "ecmp" / "s.yaml"
    inside.parent.mkdir(parents=True)
    inside.write_text(text)
    res = cli("run", str(inside), "--out", str(tmp_path / "o2"))
    assert res.returncode == 2 and res.stderr.startswith("error: --out: "), res.stderr
    # beside --out's files, the summary is fine
    res = cli("run", str(path), "--json", str(out / "summary.json"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "summary.json").read_text())["runs"]


@pytest.mark.parametrize("where", ["name", "job", "policy", "flag", "path"])
def test_text_in_square_brackets_is_printed_as_given(where: str, tmp_path: Path) -> None:
    """Names and paths are the user's text, not console markup: ``[/]`` crashed the printer
    (a traceback) and ``[bold]`` vanished from the message."""
    data = small_scenario(tmp_path)
    args: list[str] = []
    if where == "name":
        data["name"] = "[/]x[bold]"
    elif where == "job":
        data["jobs"][0]["name"] = "[/]j[bold]"
    elif where == "policy":
        data["policies"] = ["[/]p"]
    path = write(tmp_path, data)
    if where == "flag":
        args = ["run", str(path), "-p", "[/]p"]
    elif where == "path":
        args = ["validate", str(tmp_path / "no[bold]such.yaml")]
    else:
        args = ["run", str(path), "-p", "ecmp"] if where != "policy" else ["validate", str(path)]
    res = cli(*args)
    assert "Traceback" not in res.stderr, res.stderr
    if where in ("name", "job"):
        assert res.returncode == 0, res.stderr
        assert ("[/]x[bold]" if where == "name" else "[/]j[bold]") in res.stdout
    else:
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert ("no[bold]such.yaml" if where == "path" else "'[/]p'") in res.stderr


def test_a_policy_setting_the_fabric_cannot_meet_names_file_and_field(tmp_path: Path) -> None:
    """Found by ``validate``, and by ``run`` before any policy runs (not when the one that
    uses it starts, the others' results lost). A setting of ``adaptive-split`` alone stops
    only a run of it: elsewhere it is a warning (the controller's serves the service too)."""
    for setting, policy, start, stops in (
            ({"adaptive": {"reserved_spines": 100}}, "adaptive-split",
             "adaptive.reserved_spines: 100 of the fabric's 4 ", False),
            ({"controller": {"mice_spines": 4}}, "task-aware",
             "controller.mice_spines: 4 of the fabric's 4 ", True)):
        path = write(tmp_path, small_scenario(tmp_path, **setting))
        for args in (("validate", str(path)), ("run", str(path), "-p", "ecmp"),
                     ("run", str(path), "-p", "ecmp", "-p", policy)):
            res = cli(*args)
            assert "Traceback" not in res.stderr
            if stops or policy in args:
                assert res.returncode == 2
                assert res.stdout == "", res.stdout  # (nothing ran)
                (line,) = res.stderr.strip().splitlines()
                assert line.startswith(f"error: {path}: {start}")
            else:
                assert res.returncode == 0, res.stderr
                assert res.stderr.startswith(f"warning: {path}: {start}")
                assert "adaptive-split refuses it (at most 3)" in res.stderr


def test_a_topology_exported_to_dash_goes_to_stdout(tmp_path: Path) -> None:
    # `-` is standard output, as for `run --json -`: the JSON alone, no file named "-"
    res = subprocess.run([sys.executable, "-m", "fabricpilot", "topology", "export", "-"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == ""
    assert not (tmp_path / "-").exists()
    out = tmp_path / "topo.json"
    assert cli("topology", "export", str(out)).returncode == 0
    assert json.loads(res.stdout) == json.loads(out.read_text())


def test_a_topology_file_given_as_a_scenario_says_how_a_scenario_names_it(
        tmp_path: Path) -> None:
    out = tmp_path / "topo.json"
    assert cli("topology", "export", str(out)).returncode == 0
    res = cli("validate", str(out))
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {out}: a topology file, not a scenario: a scenario names it as topology: "
        "{kind: file, path: ...}")


def test_a_topology_file_is_checked_field_by_field(tmp_path: Path) -> None:
    out = tmp_path / "topo.json"
    assert cli("topology", "export", str(out)).returncode == 0
    good = json.loads(out.read_text())
    gpu = next(i for i, n in enumerate(good["nodes"]) if n["kind"] == "gpu")
    sw = next(i for i, n in enumerate(good["nodes"]) if n["kind"] == "switch")
    fabric = next(i for i, lk in enumerate(good["links"]) if lk["kind"] == "fabric")
    nic = next(i for i, lk in enumerate(good["links"]) if lk["kind"] == "nic")
    cases = [
        (lambda t: t["nodes"][gpu].update(gpu="abc"), f"nodes[{gpu}].gpu"),
        (lambda t: t["nodes"][gpu].pop("host"), f"nodes[{gpu}]"),
        (lambda t: t["nodes"][sw].update(tier="x"), f"nodes[{sw}].tier"),
        (lambda t: t.update(gpus_per_host=3), "gpus_per_host"),
        (lambda t: t["links"][0].update(rate_gbps=float("inf")), "links[0].rate_gbps"),
        # a misspelt key, a key of another kind of node, a rail that is not a number, a
        # link to itself, an NVLink between hosts: each was accepted without a word
        (lambda t: t["nodes"][gpu].update(rial=7), f"nodes[{gpu}].rial"),
        (lambda t: t["nodes"][sw].update(gpu=50), f"nodes[{sw}]"),
        (lambda t: t["nodes"][gpu].update(rail="x"), f"nodes[{gpu}].rail"),
        (lambda t: t["links"].append({**t["links"][0], "b": t["links"][0]["a"]}),
         f"links[{len(good['links'])}]"),
        (lambda t: t["links"].append({"a": "gpu0", "b": "gpu8", "kind": "nvlink",
                                      "rate_gbps": 3600.0, "delay_ns": 0}),
         f"links[{len(good['links'])}]"),
        # a link whose kind does not fit its ends: an NVLink to a spine (the task-aware
        # controller then crashed on it, losing the other policies' results), NIC links
        # between switches (the fabric's utilisation read 0 %), a fabric link to a GPU
        (lambda t: t["links"].append({"a": "gpu0", "b": "spine1", "kind": "nvlink",
                                      "rate_gbps": 400.0, "delay_ns": 100}),
         f"links[{len(good['links'])}].kind: nvlink links join a GPU to a GPU or an "
         "NVSwitch of its host; this one joins a gpu and a switch (gpu0-spine1)"),
        (lambda t: [lk.update(kind="nic") for lk in t["links"] if lk["kind"] == "fabric"],
         f"links[{fabric}].kind: nic links join a GPU to a switch; this one joins a switch "
         "and a switch"),
        (lambda t: [lk.update(kind="fabric") for lk in t["links"] if lk["kind"] == "nic"],
         f"links[{nic}].kind: fabric links join two switches; this one joins a gpu and a "
         "switch"),
        # a GPU cabled to a spine (the SLA levels and the leaves' ECMP read tier 1 as the
        # GPUs' leaves), a switch cabled to nothing: both were accepted without a word
        (lambda t: t["links"][nic].update(b="spine1") if t["links"][nic]["a"].startswith("gpu")
         else t["links"][nic].update(a="spine1"),
         f"links[{nic}]: a NIC link to spine1, a tier-2 switch: GPUs are cabled to tier-1 "
         "switches (leaves)"),
        (lambda t: t["nodes"].append({"id": "spare0", "kind": "switch", "tier": 2}),
         f"nodes[{len(good['nodes'])}]: switch 'spare0' has no links"),
        # tiers that do not fit the cabling (spines called tier 7, a switch above the
        # spines that reaches no leaf through them): accepted, then read as the SLA
        # levels' scope and the mice's spines
        (lambda t: [n.update(tier=7) for n in t["nodes"] if n["id"].startswith("spine")],
         f"links[{fabric}]: {good['links'][fabric]['a']} (tier 1) and "
         f"{good['links'][fabric]['b']} (tier 7): a fabric link joins a switch to one a tier "
         "above it (a Clos)"),
        (lambda t: (t["nodes"].extend([{"id": "spare0", "kind": "switch", "tier": 2},
                                       {"id": "top0", "kind": "switch", "tier": 3}]),
                    t["links"].append({"a": "spare0", "b": "top0", "kind": "fabric",
                                       "rate_gbps": 400.0, "delay_ns": 100})),
         f"nodes[{len(good['nodes'])}].tier: 2, but switch 'spare0' has no link to a tier-1 "
         "switch below it"),
    ]
    for mutate, field in cases:
        topo = json.loads(out.read_text())
        mutate(topo)
        (tmp_path / "bad.json").write_text(json.dumps(topo))
        data = yaml.safe_load(default_scenario_path().read_text())
        data["topology"] = {"kind": "file", "path": str(tmp_path / "bad.json")}
        res = cli("validate", str(write(tmp_path, data, "from_file.yaml")))
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert f"bad.json: {field}" in res.stderr, res.stderr
    # a key given twice in an object (json keeps the last without a word)
    (tmp_path / "bad.json").write_text(out.read_text().replace(
        '"format":', '"name": "twice", "format":', 1))
    res = cli("validate", str(write(tmp_path, data, "from_file.yaml")))
    assert res.returncode == 2 and "bad.json: invalid JSON: an object gives key 'name' " \
        "twice" in res.stderr, res.stderr
    (tmp_path / "bad.json").write_bytes(b"\x80\x81binary")
    res = cli("validate", str(write(tmp_path, data, "from_file.yaml")))
    assert res.returncode == 2 and "not a UTF-8 text file" in res.stderr
    # JSON nested past the parser's stack, a host id past int32, a 5 000-digit integer:
    # one line each, not a traceback
    deep = "[" * 100_000 + "]" * 100_000
    big_host = json.loads(out.read_text())
    big_host["nodes"][gpu]["host"] = 2**31
    digits = out.read_text().replace('"gpus_per_host": 8', '"gpus_per_host": ' + "9" * 5000)
    for text, problem in ((deep, "invalid JSON: nested too deeply"),
                          (json.dumps(big_host), f"nodes[{gpu}].host: Input should be less "
                                                 "than 131072"),
                          (digits, "invalid JSON: an integer of 5000 digits (at most 4300)")):
        (tmp_path / "bad.json").write_text(text)
        res = cli("validate", str(write(tmp_path, data, "from_file.yaml")))
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert problem in res.stderr, res.stderr


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes")
def test_files_that_are_not_regular_files_are_refused(tmp_path: Path) -> None:
    """A named pipe would block the reader forever, /dev/zero fill the memory: refused,
    one line, before any read."""
    import os

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a named pipe"), (Path("/dev/zero"), "a character device")):
        if not path.exists():
            continue
        res = cli("validate", str(path))
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip() == f"error: {path}: not a regular file ({kind})"
    res = cli("twin", "--token-file", str(fifo))
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: --token-file: {fifo}: not a regular file (a named pipe)"
    binary = tmp_path / "bin.tok"
    binary.write_bytes(bytes(range(128, 256)))
    res = cli("twin", "--token-file", str(binary))
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: --token-file: {binary}: not a UTF-8 text file"


def test_a_token_file_refuses_a_key_given_twice_and_a_token_shared(tmp_path: Path) -> None:
    """YAML keeps the last of a repeated key: ``role: tenant ... role: operator`` made a
    tenant's token an operator's. And two entries with one token left one of them (the
    last) its only principal. Two callers of one name (logs and events could not tell
    them apart) and an operator given a tenant (which it would not be held to) are as
    wrong. Each refused, naming the place."""
    from fabricpilot.service.auth import AuthConfigError, TokenRegistry

    operator = "  - {name: o, role: operator, token: aaaaaaaaaaaaaaaaaaaa}\n"
    for name, entries, problem in (
            ("dup.yaml", "  - {name: t, role: tenant, tenant: a, token: aaaaaaaaaaaaaaaaaaaa, "
                         "role: operator}\n",
             r"dup.yaml: invalid YAML at line 2, column \d+: duplicate key 'role'"),
            ("shared.yaml", operator + "  - {name: t, role: tenant, tenant: a, "
                                       "token: aaaaaaaaaaaaaaaaaaaa}\n",
             r"shared.yaml: tokens.1: gives the same token as 'o'"),
            ("named.yaml", operator + "  - {name: o, role: tenant, tenant: a, "
                                      "token: bbbbbbbbbbbbbbbbbbbb}\n",
             r"named.yaml: tokens.1.name: 'o' is also tokens.0's name \(a name is one "
             r"caller's\)"),
            ("optenant.yaml", "  - {name: o, role: operator, tenant: a, "
                              "token: aaaaaaaaaaaaaaaaaaaa}\n",
             r"^[^ ]*optenant.yaml: tokens.0: an operator token takes no tenant: \(an "
             r"operator acts for every tenant\)$"),
            ("neither.yaml", "  - {name: o, role: operator}\n",
             r"^[^ ]*neither.yaml: tokens.0: give exactly one of token or sha256$")):
        (tmp_path / name).write_text("tokens:\n" + entries)
        with pytest.raises(AuthConfigError, match=problem):
            TokenRegistry.from_file(tmp_path / name)
    ok = tmp_path / "ok.yaml"
    ok.write_text("tokens:\n  - {name: o, role: operator, token: aaaaaaaaaaaaaaaaaaaa}\n"
                  "  - {name: t, role: tenant, tenant: a, token: bbbbbbbbbbbbbbbbbbbb}\n")
    reg = TokenRegistry.from_file(ok)
    assert reg.resolve("b" * 20).role == "tenant"  # type: ignore[union-attr]
    assert reg.resolve("a" * 20).role == "operator"  # type: ignore[union-attr]


def test_nccl_test_table(tmp_path: Path) -> None:
    res = cli("nccl-test", "--op", "alltoall", "--gpus", "32", "--min-bytes", "1M",
              "--max-bytes", "8M", "--policy", "ideal")
    assert res.returncode == 0, res.stderr
    rows = [ln.split() for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    for (size, count, dtype, _redop, root, time_us, algbw, busbw, _wrong,
         *in_place) in rows:
        # (in place: the same traffic, the same figures, as nccl-tests' columns 10-13)
        assert in_place == [time_us, algbw, busbw, "N/A"]
        # (nccl-tests' count for AlltoAll: one peer's elements, size / 4 / ranks)
        assert int(count) == int(size) // 4 // 32 and dtype == "float" and root == "-1"
        assert float(algbw) == pytest.approx(int(size) / (float(time_us) * 1e3), rel=0.01)
        assert float(busbw) == pytest.approx(float(algbw) * 31 / 32, rel=0.01)
    assert "Avg bus bandwidth" in res.stdout


@pytest.mark.parametrize(("op", "asked", "n", "size", "count"), [
    # nccl-tests: count = the call's count argument (AllGatherGetCollByteCount & co.)
    ("allreduce", 1001, 16, 1000, 250),  # whole elements
    ("allreduce", 1, 16, 4, 1),  # (at least one element)
    ("broadcast", 1 << 20, 8, 1 << 20, 1 << 18),
    ("allgather", 1 << 30, 16, 1 << 30, 1 << 24),  # total size, one rank's count
    ("reducescatter", 1000, 3, 996, 83),
    ("alltoall", 1 << 20, 32, 1 << 20, 1 << 13),  # one peer's count
    ("allgather", 1, 8, 32, 1),
])
def test_nccl_test_sizes_and_counts_are_nccl_tests(op: str, asked: int, n: int, size: int,
                                                    count: int) -> None:
    from fabricpilot.nccltests import nccl_size_and_count

    assert nccl_size_and_count(Op(op), asked, n) == (size, count)


def test_json_to_stdout_leaves_the_tables_to_stderr(tmp_path: Path) -> None:
    """``--json -`` (for ``| jq``): stdout is the summary alone, the same as ``--json FILE``
    writes, and the tables go to stderr (it wrote a file named '-')."""
    path = write(tmp_path, small_scenario(tmp_path))
    piped = cli("run", str(path), "-p", "ecmp", "--json", "-", "--reproducible")
    assert piped.returncode == 0, piped.stderr
    assert not (ROOT / "-").exists()
    filed = cli("run", str(path), "-p", "ecmp", "--json", str(tmp_path / "s.json"),
                "--reproducible")
    assert json.loads(piped.stdout) == json.loads((tmp_path / "s.json").read_text())
    assert "policy" in piped.stderr and "busbw GB/s" in piped.stderr
    assert "summary written" in filed.stdout and "summary written" not in piped.stderr


def test_nccl_test_says_when_policy_and_oversubscription_cannot_matter() -> None:
    """8 single-GPU hosts fit one leaf: no pair crosses a spine, so an oversubscribed or
    adaptive fabric gives ECMP's figures; said so on stderr, the sweep printed as ever."""
    res = cli("nccl-test", "--gpus", "8", "--gpus-per-host", "1", "--oversubscription", "2",
              "-b", "1M", "-e", "1M")
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == (
        "warning: nccl-test: the 8 hosts share one leaf per rail, so no traffic crosses a "
        "spine: --policy and --oversubscription change nothing (more than 64 hosts have "
        "spines)")
    assert "switches: 1 tier-1)" in res.stdout
    quiet = cli("nccl-test", "--gpus", "8", "--gpus-per-host", "1", "-b", "1M", "-e", "1M")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_nccl_test_out_writes_the_sweep_as_printed(tmp_path: Path) -> None:
    res = cli("nccl-test", "--op", "allgather", "--gpus", "16", "-b", "1M", "-e", "4M",
              "--out", str(tmp_path / "sweep"))
    assert res.returncode == 0, res.stderr
    printed = [ln.split() for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    lines = (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()
    assert lines[0] == "size_bytes,count,redop,root,time_us,algbw_GBps,busbw_GBps,algorithm"
    written = [ln.split(",") for ln in lines[1:]]
    assert [w[0] for w in written] == [p[0] for p in printed] == ["1048576", "2097152",
                                                                  "4194304"]
    for w, p in zip(written, printed, strict=True):
        # busbw = algbw x (n-1)/n for AllGather, the same figures as the table's
        assert float(w[6]) == pytest.approx(float(w[5]) * 15 / 16, rel=1e-5)
        assert float(w[6]) == pytest.approx(float(p[7]), abs=0.01)
        assert w[7] == "rails"  # (auto on 2 hosts of 8: one ring per rail)
    assert "# Algorithm            : rails 1.0 MiB - 4.0 MiB" in res.stdout
    assert (tmp_path / "sweep" / "busbw.png").read_bytes()[:4] == b"\x89PNG"
    bad = cli("nccl-test", "--gpus", "16", "-b", "1M", "-e", "1M",
              "--out", str(tmp_path / "sweep" / "sweep.csv"))
    assert bad.returncode != 0 and "--out" in bad.stderr and "is a file" in bad.stderr


def test_topology_export_round_trips_through_a_scenario(tmp_path: Path) -> None:
    out = tmp_path / "topo.json"
    assert cli("topology", "export", str(out)).returncode == 0
    data = yaml.safe_load(default_scenario_path().read_text())
    data["topology"] = {"kind": "file", "path": str(out)}
    path = write(tmp_path, data, "from_file.yaml")
    res = cli("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert "128 GPUs" in res.stdout


def test_what_stands_where_out_writes_is_refused_before_the_runs(tmp_path: Path) -> None:
    """A file where a policy's folder or plots/ goes, a folder where report.html or a table
    goes: refused at once, with nothing run (they were found after every run, and the
    tables and report of the policies after that were never written)."""
    path = write(tmp_path, small_scenario(tmp_path))
    for n, (make, what) in enumerate((
            (lambda o: (o / "ecmp").touch(), "ecmp is a file, where the folder ecmp/ goes"),
            (lambda o: (o / "plots").touch(), "plots is a file, where the folder plots/ goes"),
            (lambda o: (o / "report.html").mkdir(),
             "report.html is a directory, where the file report.html goes"),
            (lambda o: (o / "ideal" / "links.csv").mkdir(parents=True),
             "ideal/links.csv is a directory, where the file links.csv goes"))):
        out = tmp_path / f"o{n}"
        out.mkdir()
        make(out)
        res = cli("run", str(path), "--out", str(out))
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert f"--out: {out}/{what}" in res.stderr, res.stderr
        assert "scenario 'small'" not in res.stdout  # (nothing ran)


def test_out_writes_only_the_files_its_check_knows(tmp_path: Path) -> None:
    """The names the check above guards are those the writers write (fluid model and
    interference included, so every table is there)."""
    from fabricpilot.report.plots import PLOT_FILES
    from fabricpilot.results.io import TABLE_FILES

    data = small_scenario(tmp_path)
    data["fabric"] = {"model": "fluid"}
    res = cli("run", str(write(tmp_path, data)), "--out", str(tmp_path / "o"),
              "--interference")
    assert res.returncode == 0, res.stderr
    tables = {p.name for p in (tmp_path / "o").glob("*/*.csv")}
    assert tables == set(TABLE_FILES), tables
    assert {p.name for p in (tmp_path / "o" / "plots").iterdir()} <= set(PLOT_FILES)


def test_one_line_messages_stay_one_line_whatever_the_path(tmp_path: Path) -> None:
    """A message naming a long path is printed as one line (a terminal wraps it; a pipe
    or a log keeps it whole): wrapped at 80 columns, "128 GPUs" once came out as
    "128\nGPUs" under a long temporary directory."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    path = write(deep, yaml.safe_load(default_scenario_path().read_text()), "s.yaml")
    res = cli("validate", str(path))
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    assert line.startswith(f"{path}: ok (") and "128 GPUs on 16 hosts" in line
    out = tmp_path / ("t" * 120) / "topo.json"
    res = cli("topology", "export", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"topology written to {out}"]


def test_fractions_above_ideal_are_named() -> None:
    """The comparison's fractions above 100 % (ideal is no bound per job, nor against congestion
    under the fluid model) are listed, beyond a 1 % margin; the reference itself never."""
    from types import SimpleNamespace

    from fabricpilot.report import above_reference

    def run(policy: str, busbw: dict[str, float]) -> SimpleNamespace:
        return SimpleNamespace(policy=policy, jobs=[SimpleNamespace(name=j) for j in busbw],
                               mean_busbw_GBps=busbw.__getitem__)

    ideal = run("ideal", {"a": 10.0, "b": 20.0, "c": 0.0})
    ecmp = run("ecmp", {"a": 21.3, "b": 20.1, "c": 5.0})  # b: within 1 %; c: no reference
    assert above_reference([ecmp, ideal], ideal) == ["a under ecmp (213.0%)"]  # type: ignore[list-item]
    assert above_reference([ecmp], None) == []  # type: ignore[list-item]


def _ecmp_and_a_failing_adaptive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 error: Exception) -> tuple[Any, Path, Path]:
    """``run -p ecmp -p adaptive --json --out`` in process, adaptive's run raising
    ``error``: the result, the --out folder and the JSON file."""
    from typer.testing import CliRunner

    from fabricpilot import runner
    from fabricpilot.cli import app

    real = runner.run_policy

    def failing(prep, name, **kw):  # type: ignore[no-untyped-def]
        if name == "adaptive":
            raise error
        return real(prep, name, **kw)

    monkeypatch.setattr(runner, "run_policy", failing)
    path = write(tmp_path, small_scenario(tmp_path))
    out, js = tmp_path / "o", tmp_path / "s.json"
    res = CliRunner().invoke(app, ["run", str(path), "-p", "ecmp", "-p", "adaptive",
                                   "--json", str(js), "--out", str(out)])
    return res, out, js


def test_a_policy_that_fails_on_a_defect_loses_no_other_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that raises on a defect (not bad input) is reported in one line naming its
    traceback's file, exit 2; the other policies' tables, JSON and report are still
    written (a crash of one policy once lost every policy's results)."""
    res, out, js = _ecmp_and_a_failing_adaptive(tmp_path, monkeypatch,
                                                ValueError("3 is not in list"))
    assert res.exit_code == 2, res.output
    trace = out / "adaptive" / "traceback.txt"
    assert (f"error: policy adaptive failed: ValueError: 3 is not in list (traceback in "
            f"{trace})") in res.output
    assert "ValueError: 3 is not in list" in trace.read_text()
    assert json.loads(js.read_text())["policy"] == "ecmp"
    assert (out / "ecmp" / "flows.csv").exists() and (out / "report.html").exists()


def test_a_policy_whose_run_cannot_go_on_loses_no_other_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that stops on the simulation's own terms (a livelock, a deadlock left alone)
    is that policy's outcome: one line naming it, exit 2, and the other policies' JSON,
    tables and report written."""
    from typer.testing import CliRunner

    from fabricpilot import runner
    from fabricpilot.cli import app
    from fabricpilot.errors import SimulationError

    real = runner.run_policy
    res, out, js = _ecmp_and_a_failing_adaptive(
        tmp_path, monkeypatch, SimulationError("flows are active but none can make progress"))
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1] == (
        "error: policy adaptive: flows are active but none can make progress")
    assert json.loads(js.read_text())["policy"] == "ecmp"
    assert (out / "ecmp" / "flows.csv").exists() and (out / "report.html").exists()
    # the same in a job's run alone (--interference): the shared runs' results stand
    real_alone = runner.interference

    def stuck_alone(prep, name, shared, **kw):  # type: ignore[no-untyped-def]
        if name == "adaptive":
            raise SimulationError("flows are active but none can make progress")
        return real_alone(prep, name, shared, **kw)

    monkeypatch.setattr(runner, "run_policy", real)
    monkeypatch.setattr(runner, "interference", stuck_alone)
    js.unlink()
    path = tmp_path / "s.yaml"  # (the helper's scenario)
    res = CliRunner().invoke(app, ["run", str(path), "-p", "ecmp", "-p", "adaptive",
                                   "--interference", "--json", str(js)])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1] == (
        "error: policy adaptive, a job alone: flows are active but none can make progress")
    runs = {r["policy"]: r for r in json.loads(js.read_text())["runs"]}
    assert set(runs) == {"ecmp", "adaptive"}
    assert all("interference" in j for j in runs["ecmp"]["jobs"])
    assert not any("interference" in j for j in runs["adaptive"]["jobs"])


def test_nccl_test_runs_a_size_that_rounds_to_one_run_already_once(tmp_path: Path) -> None:
    """AllGather on 16 GPUs takes at least one element per rank (64 B): -b 1 -e 256 asks
    for 1, 2, 4 ... 256 B, of which 1-64 B all round to 64 B. Each size is a row once
    (the same row seven times counted seven times in the average), and the table says
    which sizes ran as another (16 x 4 B floats: 64 B)."""
    res = cli("nccl-test", "--op", "allgather", "--gpus", "16", "-b", "1", "-e", "256")
    assert res.returncode == 0, res.stderr
    sizes = [int(line.split()[0]) for line in res.stdout.splitlines()
             if line.strip() and not line.startswith("#")]
    assert sizes == [64, 128, 256]
    assert ("# Sizes run as whole floats per rank (as nccl-tests): 1, 2, 4, 8, 16, 32 B as "
            "64 B\n") in res.stdout


def test_nccl_test_says_which_algorithm_ran_at_which_sizes() -> None:
    """auto's AllReduce on 64 GPUs (8 hosts of 8): trees for small messages, where the
    rings' 2 x 63 message latencies dominate, the rail rings for large ones, where the
    trees' sequential NVLink stages do (the alpha-beta estimate's pick, see
    ``allreduce_estimates_ns``: tree at 1 MiB, rails at 256 MiB)."""
    res = cli("nccl-test", "--op", "allreduce", "--gpus", "64", "-b", "1M", "-e", "256M",
              "-f", "16", "--policy", "ideal")
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("# Algorithm")]
    spans = line.split(":", 1)[1].strip().split(", ")
    assert spans[0].startswith("tree 1.0 MiB") and spans[-1].endswith("rails 256.0 MiB")


def test_a_reader_that_leaves_early_loses_no_file(tmp_path: Path) -> None:
    """``fabricpilot run ... | head -1``: the tables go nowhere once the reader has left,
    the run still writes its --json and --out and exits 0 (it used to exit 1 at the
    first line lost, before writing either)."""
    path = write(tmp_path, small_scenario(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricpilot", "run", str(path), "-p", "ecmp", "--json",
         str(tmp_path / "s.json"), "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # (printed before the runs)
    proc.stdout.close()
    assert proc.wait(300) == 0, proc.stderr.read()
    assert first.startswith("small:")
    assert json.loads((tmp_path / "s.json").read_text())["policy"] == "ecmp"
    assert (tmp_path / "out" / "report.html").is_file()
    assert (tmp_path / "out" / "ecmp" / "flows.csv").is_file()


def test_out_into_a_used_folder_keeps_nothing_stale(tmp_path: Path) -> None:
    """A second run into the same --out: the first run's interference.csv and the tables
    of a policy the second does not run are gone (they would read as the second run's);
    a file of the user's in that folder stays, and so does its folder until it is empty."""
    path = write(tmp_path, small_scenario(tmp_path))
    out = tmp_path / "out"
    first = cli("run", str(path), "-p", "ecmp", "-p", "ideal", "--interference", "--out",
                str(out))
    assert first.returncode == 0, first.stderr
    assert (out / "ecmp" / "interference.csv").is_file()
    (out / "ideal" / "notes.txt").write_text("mine")
    second = cli("run", str(path), "-p", "ecmp", "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert not (out / "ecmp" / "interference.csv").exists()
    assert (out / "ecmp" / "flows.csv").is_file()
    assert sorted(p.name for p in (out / "ideal").iterdir()) == ["notes.txt"]
    (out / "ideal" / "notes.txt").unlink()
    third = cli("run", str(path), "-p", "ecmp", "--out", str(out))
    assert third.returncode == 0, third.stderr
    assert not (out / "ideal").exists()  # (nothing of the user's left in it)
    fourth = cli("run", str(path), "-p", "ecmp", "-p", "ideal", "--out", str(out))
    assert fourth.returncode == 0 and (out / "ideal" / "flows.csv").is_file()
    fifth = cli("run", str(path), "-p", "ideal", "--out", str(out))
    assert fifth.returncode == 0 and not (out / "ecmp").exists()


def test_outputs_are_written_whole_through_links_and_with_the_usual_mode(
        tmp_path: Path) -> None:
    """A summary goes to a temporary file renamed over the old one once whole (so a disk
    that fills up leaves the earlier summary, not half a new one): the rename leaves no
    temporary file behind, writes through a symbolic link rather than replacing it, and
    gives the file the mode any new file gets (not a temporary file's 0600)."""
    path = write(tmp_path, small_scenario(tmp_path))
    real = tmp_path / "results" / "summary.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    res = cli("run", str(path), "-p", "ecmp", "--json", str(link))
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and json.loads(real.read_text())["policy"] == "ecmp"
    assert sorted(p.name for p in real.parent.iterdir()) == ["summary.json"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert real.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_output_that_fails_after_the_runs_is_one_line(tmp_path: Path) -> None:
    """A summary that cannot be written once the runs are done (a full disk): exit 2 and
    one line on stderr; no empty line before it (the progress bar's last frame left one
    where stderr is not a terminal)."""
    path = write(tmp_path, small_scenario(tmp_path))
    res = cli("run", str(path), "-p", "ecmp", "--json", "/dev/full")
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "error: --json: cannot write /dev/full: No space left on device"], res.stderr
