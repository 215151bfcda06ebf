"""The flow-level engine against analytic numbers: busbw bounds, the α-β model, the
oversubscription ratio, balls-into-bins ECMP collisions, conservation and determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import run_one
from fabricpilot.balancing import PolicyContext, TransferBatch, make_policy
from fabricpilot.dataplane import Engine, FabricParams, max_min_rates
from fabricpilot.runner import prepare, run_policy
from fabricpilot.scenario import default_scenario
from fabricpilot.topology import compile_topology, fat_tree, leaf_spine
from fabricpilot.topology.paths import symmetric_link_groups
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec

FP = FabricParams()
EFF = 4096 / (4096 + 58 + 20)  # the stated header model: RoCEv2 headers + preamble/IFG


def wire(payload: int) -> int:
    return payload + math.ceil(payload / 4096) * 78


@pytest.mark.parametrize("policy", ["ecmp", "ideal"])
def test_ring_allreduce_large_message_reaches_link_rate(policy: str) -> None:
    # 16 GPUs, one per host, all on one leaf: a non-blocking fabric for a ring.
    ct = compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=16))
    res = run_one(ct, "allreduce", np.arange(16), 1 << 30, policy)
    bound = 400 / 8 * EFF  # GB/s
    busbw = res.collectives[0].busbw_GBps
    assert busbw <= bound
    assert busbw == pytest.approx(bound, rel=0.03)


def test_ring_allreduce_across_spines_with_ideal_reaches_link_rate() -> None:
    ct = compile_topology(leaf_spine(hosts=64, gpus_per_host=1, nics_per_leaf=8,
                                     rail_optimized=False))
    ranks = np.arange(0, 64, 8)  # one GPU per leaf: every ring hop crosses a spine
    busbw = run_one(ct, "allreduce", ranks, 1 << 30, "ideal").collectives[0].busbw_GBps
    assert busbw == pytest.approx(400 / 8 * EFF, rel=0.03)


@pytest.mark.parametrize("mode", ["steps", "stream"])
def test_small_allreduce_follows_alpha_beta(mode: str) -> None:
    # one GPU per leaf and a single spine: every hop is GPU-leaf-spine-leaf-GPU
    n, size = 8, 64 * 1024
    ct = compile_topology(leaf_spine(hosts=n, gpus_per_host=1, nics_per_leaf=1,
                                     link_delay_ns=100))
    alpha = 4 * 100 + 3 * FP.switch_latency_ns + FP.nic_latency_ns  # path + per-message cost
    steps = 2 * (n - 1)
    if mode == "steps":  # 2(n-1) dependent steps of S/n
        expected = steps * (alpha + math.ceil(wire(size // n) * 8 / 400))
    else:  # pipelined: 2(n-1) latencies + the stream's bytes once
        expected = steps * alpha + math.ceil(wire(math.ceil(steps * size / n)) * 8 / 400)
    res = run_one(ct, "allreduce", np.arange(n), size, "ecmp", mode=mode)
    assert res.collectives[0].time_ns == pytest.approx(expected, abs=steps)


def test_stream_and_step_modes_agree_for_large_messages() -> None:
    ct = compile_topology(leaf_spine(hosts=8, gpus_per_host=1, nics_per_leaf=8))
    t = [run_one(ct, "allreduce", np.arange(8), 256 << 20, "ideal", mode=m).collectives[0]
         .time_ns for m in ("steps", "stream")]
    assert t[0] == pytest.approx(t[1], rel=0.005)


def _alltoall_busbw(oversubscription: float) -> tuple[float, float]:
    # 32 leaves x 4 NICs (one GPU per host), AlltoAll over all 128 GPUs: 124 of every 127
    # peers sit behind another leaf, so the leaf uplinks carry almost all the traffic.
    ct = compile_topology(leaf_spine(hosts=128, gpus_per_host=1, nics_per_leaf=4,
                                     oversubscription=oversubscription, rail_optimized=False))
    size = 128 * 64 * 1024
    res = run_one(ct, "alltoall", np.arange(128), size, "ideal")
    # cut bound: a leaf's cross-spine bytes over its uplink capacity
    cross_wire = 4 * 124 * wire(size // 128)
    t_cut_ns = cross_wire * 8 / (4 / oversubscription * 400)
    return res.collectives[0].busbw_GBps, t_cut_ns / res.collectives[0].time_ns


def test_two_to_one_oversubscription_halves_cross_spine_alltoall() -> None:
    full, _ = _alltoall_busbw(1.0)
    half, cut_ratio = _alltoall_busbw(2.0)
    assert half / full == pytest.approx(0.5, rel=0.05)
    # at 2:1 the uplinks are the bottleneck: the run meets the cut bound (within latency)
    assert cut_ratio == pytest.approx(1.0, rel=0.02)


def _ecmp_rates(ct, src, dst, seed):  # type: ignore[no-untyped-def]
    n = len(src)
    pol = make_policy("ecmp", PolicyContext(ct, seed, 600))
    routed = pol.route(TransferBatch(src, dst, np.full(n, 10**6), np.full(n, -1),
                                     np.zeros(n, np.int64)))
    return max_min_rates(routed.weights, ct.rate_gbps) / 400


def test_ecmp_leaf_shift_permutation_matches_balls_into_bins() -> None:
    # m flows per leaf hash onto m uplinks; with a leaf-shift permutation the downlinks see
    # the same sets, so a flow gets 1/(flows on its uplink): expected mean = 1 - (1 - 1/m)^m.
    m, leaves = 16, 64
    ct = compile_topology(leaf_spine(hosts=m * leaves, gpus_per_host=1, nics_per_leaf=m,
                                     rail_optimized=False))
    src = np.arange(m * leaves)
    dst = (src + m) % (m * leaves)
    means = [_ecmp_rates(ct, src, dst, seed).mean() for seed in range(4)]
    expected = 1 - (1 - 1 / m) ** m
    # per seed: mean of 64 leaves' distinct-bin fractions; sd(distinct bins)/m/sqrt(64) ~ 0.009
    assert np.mean(means) == pytest.approx(expected, abs=0.02)
    ideal = make_policy("ideal", PolicyContext(ct, 0, 600))
    routed = ideal.route(TransferBatch(src, dst, np.full(len(src), 10**6),
                                       np.full(len(src), -1), np.zeros(len(src), np.int64)))
    cap = np.bincount(ideal.column_of_link, weights=ct.rate_gbps)
    assert max_min_rates(routed.weights, cap).mean() / 400 == pytest.approx(1.0)


def _binomial_pmf(n: int, p: float) -> np.ndarray:
    return np.array([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])


def test_ecmp_random_permutation_falls_in_the_collision_model_range() -> None:
    # Upper bound: a leaf's throughput <= the number of distinct uplinks its m flows hash
    # onto, E = m (1 - (1 - 1/m)^m). Lower bound: a max-min rate is at least the equal share
    # of its most loaded link, min(1/(1+X), 1/(1+Y)) with X, Y ~ Bin(m-1, 1/m) the other
    # flows on its uplink and downlink (taken independent).
    m, leaves = 16, 64
    ct = compile_topology(leaf_spine(hosts=m * leaves, gpus_per_host=1, nics_per_leaf=m,
                                     rail_optimized=False))
    rng = np.random.default_rng(3)
    n = m * leaves
    src = np.arange(n)
    dst = rng.permutation(n)
    cross = (src // m) != (dst // m)
    rates = _ecmp_rates(ct, src[cross & (src != dst)], dst[cross & (src != dst)], 11)
    pmf = _binomial_pmf(m - 1, 1 / m)
    inv = 1 / (1 + np.arange(m))
    lower = sum(pmf[x] * pmf[y] * min(inv[x], inv[y]) for x in range(m) for y in range(m))
    upper = 1 - (1 - 1 / m) ** m
    assert lower - 0.02 <= rates.mean() <= upper + 0.02
    assert rates.mean() < 0.8  # well below ideal's 1.0


def test_ideal_column_merging_does_not_change_rates() -> None:
    ct = compile_topology(fat_tree(k=8))
    rng = np.random.default_rng(0)
    src = rng.integers(0, ct.n_gpus, 400)
    dst = (src + rng.integers(1, ct.n_gpus, 400)) % ct.n_gpus
    batch = TransferBatch(src, dst, np.full(400, 1000), np.full(400, -1),
                          np.zeros(400, np.int64))
    pol = make_policy("ideal", PolicyContext(ct, 0, 600))
    merged = max_min_rates(pol.route(batch).weights,
                           np.bincount(pol.column_of_link, weights=ct.rate_gbps))
    # the same policy without merging: every link its own column
    pol.column_of_link = np.arange(ct.n_links, dtype=np.int32)
    pol._cache.clear()
    plain = max_min_rates(pol.route(batch).weights, ct.rate_gbps)
    np.testing.assert_allclose(merged, plain, rtol=1e-9)
    assert int(symmetric_link_groups(ct).max()) + 1 < ct.n_links


@pytest.fixture(scope="module")
def default_runs():  # type: ignore[no-untyped-def]
    prep = prepare(default_scenario(), "default")
    return prep, {p: run_policy(prep, p) for p in ("ecmp", "ideal")}


def test_default_scenario_conserves_bytes_and_completes(default_runs) -> None:  # type: ignore[no-untyped-def]
    prep, runs = default_runs
    # bytes the workload asks for, computed from the plans and the mice, not from the run
    expected = sum(j.iterations * sum(p.total_bytes for p in j.collectives) for j in prep.jobs)
    expected += int(prep.mice.size_bytes.sum())
    ct = prep.topology
    first_links = np.concatenate([ct.gpu_up, ct.gpu_nv_up[ct.gpu_nv_up >= 0]])
    for res in runs.values():
        assert res.bytes_sent == expected
        assert res.bytes_delivered == expected
        f = res.flows
        assert np.all(f["deliver_ns"] <= res.sim_time_ns)
        # every wire byte leaves its source GPU over exactly one NIC or NVLink port
        wire_total = float((f["members"] * f["wire_bytes"]).sum())
        assert res.link_bytes[first_links].sum() == pytest.approx(wire_total, rel=1e-9)
        n_coll = sum(j.iterations * len(j.collectives) for j in prep.jobs)
        assert len(res.collectives) == n_coll
        assert np.all(res.link_peak_util <= 1 + 1e-9)


def test_a_flows_alone_fct_is_that_of_its_nics_whatever_the_policy(default_runs) -> None:  # type: ignore[no-untyped-def]
    """The metrics of docs/model.md: slowdown = FCT / (propagation + wire bytes / bottleneck rate)
    alone on the empty fabric. llm-dp's AllReduce runs one ring per rail over its 8 hosts
    of 8 GPUs: 64 hops and 8 hand-overs each, 72 members, whose slowest alone is a hop
    between hosts, from and to a 400 Gb/s NIC (a GPU's NVLink port, 3600 Gb/s, carries
    one hop of each of the 8 rings: 450 Gb/s each). So alone each ring runs at 400 Gb/s
    under any policy; ECMP hashing two rings' hops onto one spine link slows the flow,
    which its slowdown shows (it was once taken as the flow's own rate alone). Under
    ``ideal`` the only other load on their links is the mice, a few 16 KiB flows."""
    prep, runs = default_runs
    llm = next(i for i, j in enumerate(prep.jobs) if j.name == "llm-dp")
    worst = {}
    for policy, res in runs.items():
        f = res.flows
        ring = (f["owner"] == llm) & (f["members"] == 72)
        assert ring.any()
        alone = f["latency_ns"][ring] + np.ceil(f["wire_bytes"][ring] * 8 / 400.0)
        assert np.array_equal(f["alone_fct_ns"][ring], alone.astype(np.int64))
        worst[policy] = float(f["slowdown"][ring].max())
    assert worst["ideal"] == pytest.approx(1.0, abs=5e-3)
    assert worst["ecmp"] > 1.1  # (two rings' hops on one 400G spine link for a while)


def test_links_csv_lists_every_link_idle_ones_too(default_runs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv

    from fabricpilot.results.io import write_tables

    prep, runs = default_runs
    write_tables(runs["ecmp"], tmp_path)
    with (tmp_path / "links.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == prep.topology.n_links
    # (ECMP leaves some fabric links of the default scenario idle: they are listed, at 0)
    idle = [r for r in rows if int(r["bytes"]) == 0]
    assert idle and all(float(r["peak_utilization"]) == 0 for r in idle)
    assert sum(int(r["bytes"]) for r in rows) == pytest.approx(
        runs["ecmp"].link_bytes.sum(), abs=len(rows))


def test_ideal_is_at_least_ecmp_on_the_default_scenario(default_runs) -> None:  # type: ignore[no-untyped-def]
    _, runs = default_runs
    for job in runs["ideal"].jobs:
        assert runs["ideal"].mean_busbw_GBps(job.name) >= \
            runs["ecmp"].mean_busbw_GBps(job.name) * (1 - 1e-9)


def test_completion_tolerance_bounds_the_error_and_saves_updates() -> None:
    # ECMP spreads an AlltoAll's completion times; batching near-simultaneous completions
    # must not move any collective by more than the tolerance.
    ct = compile_topology(leaf_spine(hosts=64, gpus_per_host=1, nics_per_leaf=8,
                                     rail_optimized=False))
    plan = build_collective("alltoall", np.arange(64), 64 << 20)
    job = JobSpec("a2a", tuple(range(64)), (plan,))
    outs = {}
    for eps in (0.0, 1e-3):
        pol = make_policy("ecmp", PolicyContext(ct, 5, 600))
        outs[eps] = Engine(ct, pol, [job], batch_rel_eps=eps).run()
    exact, fast = outs[0.0], outs[1e-3]
    assert fast.collectives[0].time_ns == pytest.approx(exact.collectives[0].time_ns, rel=1e-3)
    fct = {e: o.flows["deliver_ns"] - o.flows["start_ns"] for e, o in outs.items()}
    assert np.all(np.abs(fct[1e-3] - fct[0.0]) <= 2e-3 * fct[0.0] + 2)
    assert fast.n_rate_updates < 0.75 * exact.n_rate_updates


def test_a_run_ends_with_its_traffic_not_with_a_policy_round() -> None:
    """Policies that move flows in periodic rounds (adaptive, task-aware) schedule the next
    round while flows are active; once the last byte has arrived the run is over: its
    simulated time is that of the last delivery (as under ECMP, which has no rounds), not of
    a round still to come."""
    ct = compile_topology(leaf_spine(hosts=8, gpus_per_host=1, nics_per_leaf=4,
                                     rail_optimized=False))
    ends = {}
    for policy in ("ecmp", "adaptive", "task-aware"):
        res = run_one(ct, "alltoall", list(range(8)), 1 << 20, policy)
        last = int(res.flows["deliver_ns"].max())
        assert res.sim_time_ns == last
        ends[policy] = last
    assert len(set(ends.values())) == 1  # (no collision here: the same traffic everywhere)


@pytest.mark.parametrize("mtu_bytes", [4096, 1024])
def test_nvlink_transfers_carry_no_ethernet_framing(tmp_path, mtu_bytes: int) -> None:  # type: ignore[no-untyped-def]
    """One host of 8 GPUs, a 256 MiB ring AllReduce over NVLink (3600 Gb/s per GPU): each
    GPU sends 2 (n-1)/n x 256 MiB = 469 762 048 bytes, nothing but payload (no preamble,
    IFG, IP/UDP/RoCE headers: they are Ethernet's), so the transfer takes 1.0439 ms at
    450 GB/s plus the steps' latency, whatever the RoCE MTU (with the framing it took
    1.088 ms, and 1.147 ms at a 1 KiB MTU)."""
    import yaml

    from fabricpilot.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "nvl", "seed": 1,
        "topology": {"kind": "leaf_spine", "hosts": 1, "gpus_per_host": 8,
                     "nics_per_leaf": 8, "rail_optimized": False},
        "fabric": {"mtu_bytes": mtu_bytes},
        "jobs": [{"name": "a", "gpus": 8, "collectives": [
            {"op": "allreduce", "size_bytes": 256 << 20, "algorithm": "ring"}]}]}))
    r = run_policy(prepare(load_scenario(path), str(path)), "ecmp")
    (c,) = r.collectives
    wire_ns = 2 * 7 / 8 * (256 << 20) * 8 / 3600
    latency_ns = (c.end_ns - c.start_ns) - wire_ns
    assert 0 <= latency_ns < 30_000  # (14 steps of a few microseconds at most)
    assert sum(int(b) for b in r.flows["wire_bytes"]) == sum(
        int(b) for b in r.flows["size_bytes"])
