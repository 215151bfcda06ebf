"""Failures in the twin: link and switch down, flaps, gray links, partitions; the routing
baseline against the controller's healing. Expected figures are derived by hand from the
rates, delays and sizes of each scenario."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fabricpilot.runner import Prepared, prepare, run_policy
from fabricpilot.scenario import load_scenario

NIC_GBPS = 400.0
DETECT_NS = 100_000
CONVERGE_NS = 5_000_000
CONTROL_NS = 10_000  # the controller's default control-channel latency
RTO_NS = 4_000_000  # RoCE retransmission timeout (the default)


def _scenario(tmp_path: Path, jobs: list[dict[str, Any]], events: list[dict[str, Any]],
              controller: dict[str, Any] | None = None, **faults: Any) -> Prepared:
    data = {
        "name": "faults", "seed": 3,
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 2, "rail_optimized": False},
        "controller": {"parts": 1, **(controller or {})},
        "jobs": jobs,
        "faults": {"detection_delay_ns": DETECT_NS, "convergence_delay_ns": CONVERGE_NS,
                   "events": events, **faults},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return prepare(load_scenario(path), str(path))


RING = {"name": "ring", "gpus": 8, "placement": "contiguous", "iterations": 1,
        "compute_ns": 100_000, "collectives": [{"op": "allreduce", "size_bytes": 256 << 20}]}
A2A = {"name": "a2a", "gpus": 8, "placement": "contiguous", "iterations": 1,
       "compute_ns": 100_000, "collectives": [{"op": "alltoall", "size_bytes": 64 << 20}]}
DOWN = {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_000_000}


def _coll_ns(prep: Prepared, policy: str) -> int:
    (c,) = run_policy(prep, policy).collectives
    return c.end_ns - c.start_ns


@pytest.fixture(scope="module")
def ring_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ring")
    hit = _scenario(tmp, [RING], [DOWN])
    late = _scenario(tmp, [RING], [{**DOWN, "at_ns": 900_000_000}])  # after the run
    return {"hit": {p: run_policy(hit, p) for p in ("ecmp", "task-aware", "ideal")},
            "clean": {p: _coll_ns(late, p) for p in ("ecmp", "task-aware", "ideal")}}


def test_ring_link_failure_routing_baseline(ring_runs: dict[str, Any]) -> None:
    """ECMP keeps hashing onto the dead link until routing converges: every stream on it
    sends 400 Gb/s into nothing for detection + convergence = 5.1 ms. Its lost packets are
    resent when its retransmission timer fires: 4 ms after the loss, then every 4 ms, so at
    8 ms; the whole ring (as slow as its slowest stream) stalls those 8 ms."""
    r = ring_runs["hit"]["ecmp"]
    (f,) = r.faults
    assert f["detection_us"] == pytest.approx(DETECT_NS / 1e3)
    assert f["reroute_us"] == pytest.approx((DETECT_NS + CONVERGE_NS) / 1e3)
    moved = f["streams_moved"]
    assert moved >= 1
    lost = moved * NIC_GBPS / 8 * 1e9 * (DETECT_NS + CONVERGE_NS) * 1e-9
    assert f["bytes_lost"] == pytest.approx(lost, rel=1e-6)
    assert f["bytes_retx"] == pytest.approx(lost, rel=1e-6)
    stall_ns = 2 * RTO_NS  # ceil(5.1 ms / 4 ms) timeouts
    (c,) = r.collectives
    assert c.end_ns - c.start_ns == pytest.approx(ring_runs["clean"]["ecmp"] + stall_ns,
                                                  abs=2_000)
    assert f["recovery_us"] == pytest.approx(stall_ns / 1e3)
    assert f["job_stall_us"] == {"ring": pytest.approx(stall_ns / 1e3)}
    assert f["gpu_seconds_lost"] == pytest.approx(8 * stall_ns * 1e-9)
    assert r.bytes_delivered == r.bytes_sent


def test_ring_link_failure_controller_heals_within_the_control_latency(
        ring_runs: dict[str, Any]) -> None:
    """The controller is told at detection and pushes new paths; they take effect 10 us
    later. Bytes go into the dead link only before detection (the affected streams pause
    until the push is in effect): lost = streams on the link x 50 GB/s x 100 us."""
    r = ring_runs["hit"]["task-aware"]
    (f,) = r.faults
    assert f["reroute_us"] == pytest.approx((DETECT_NS + CONTROL_NS) / 1e3)
    assert f["recovery_us"] - f["detection_us"] <= 1_000 + CONTROL_NS / 1e3
    lost = f["streams_moved"] * NIC_GBPS / 8 * 1e9 * DETECT_NS * 1e-9
    assert f["bytes_lost"] == pytest.approx(lost, rel=1e-6)
    (c,) = r.collectives
    assert c.end_ns - c.start_ns == pytest.approx(
        ring_runs["clean"]["task-aware"] + DETECT_NS + CONTROL_NS, abs=2_000)
    assert r.bytes_delivered == r.bytes_sent
    assert r.summary()["reorder_events"] == 0


def test_ideal_reroutes_at_the_fault_instant(ring_runs: dict[str, Any]) -> None:
    r = ring_runs["hit"]["ideal"]
    (f,) = r.faults
    assert f["bytes_lost"] == 0 and f["reroute_us"] == 0.0
    (c,) = r.collectives
    # one spine is left to leaf0, and the ring needs one uplink and one downlink there
    assert c.end_ns - c.start_ns == ring_runs["clean"]["ideal"]


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "flowlet", "task-aware", "ideal"])
def test_alltoall_link_failure_every_flow_completes(tmp_path: Path, policy: str) -> None:
    prep = _scenario(tmp_path, [A2A], [DOWN])
    r = run_policy(prep, policy)
    assert r.bytes_delivered == r.bytes_sent > 0
    (f,) = r.faults
    if policy == "task-aware":
        assert f["recovery_us"] - f["detection_us"] <= 1_000 + CONTROL_NS / 1e3
    elif policy in ("ecmp", "adaptive"):
        assert f["reroute_us"] == pytest.approx((DETECT_NS + CONVERGE_NS) / 1e3)
        assert f["bytes_lost"] > 0


@pytest.mark.parametrize("events", [
    # two links, then their switch (the links stay down until the switch comes back)
    [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": 500_000},
     {"kind": "link_down", "link": "leaf1-spine0", "at_ns": 800_000},
     {"kind": "switch_down", "switch": "spine0", "at_ns": 1_200_000, "until_ns": 3_000_000}],
    # a flapping link: down 200 us, up 300 us, three times
    [{"kind": "flap", "link": "leaf2-spine1", "at_ns": 1_000_000, "down_ns": 200_000,
      "up_ns": 300_000, "count": 3}],
], ids=["links-then-switch", "flap"])
def test_several_faults_each_get_their_numbers(tmp_path: Path,
                                               events: list[dict[str, Any]]) -> None:
    ring = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 2, 4, 6]}
    a2a = {**A2A, "gpus": 4, "placement": "explicit", "gpu_ids": [1, 3, 5, 7]}
    prep = _scenario(tmp_path, [ring, a2a], events)
    for policy in ("ecmp", "task-aware"):
        r = run_policy(prep, policy)
        assert r.bytes_delivered == r.bytes_sent > 0  # nothing lost for good
        assert not r.aborted
        assert [f["fault_id"] for f in r.faults] == list(range(len(events)))
        for f in r.faults:
            assert f["detection_us"] == pytest.approx(DETECT_NS / 1e3)
            if policy == "task-aware":
                assert f["reroute_us"] == pytest.approx((DETECT_NS + CONTROL_NS) / 1e3)


def test_a_failure_that_cuts_a_gpu_off_is_reported_not_hung(tmp_path: Path) -> None:
    """gpu0's only NIC link dies: the ring job has no path left. It is stopped and named;
    the other job (on leaves 2-3) finishes."""
    far = {**A2A, "name": "far", "gpus": 4, "placement": "explicit", "gpu_ids": [4, 5, 6, 7]}
    near = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 1, 2, 3]}
    prep = _scenario(tmp_path, [near, far],
                     [{"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 200_000}])
    for policy in ("ecmp", "task-aware"):
        r = run_policy(prep, policy)
        (f,) = r.faults
        assert f["partitioned"] == ["ring"]
        assert "ring" in r.aborted and "no path" in r.aborted["ring"]
        assert f["recovery_us"] is None  # (a job stopped never recovers)
        assert [c.job for c in r.collectives] == ["far"]
        assert r.summary()["aborted_jobs"] == r.aborted



@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "spray", "task-aware", "ideal"])
def test_a_job_cut_off_for_a_while_is_named_so_whatever_the_policy(tmp_path: Path,
                                                                  policy: str) -> None:
    """gpu0's only NIC link is down from 1 to 3 ms, back before routing would converge
    (5 ms): the ring's streams from gpu0 have no path at all meanwhile, under any policy,
    so the fault cut the job off, and says so (those without a controller learnt no more
    than that their packets were lost, and named it among the jobs hit only). Nothing of
    it could move: the fault has no reroute time under any policy (task-aware and ideal
    gave the time they reacted, or the repair's)."""
    down = {"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 1_000_000,
            "until_ns": 3_000_000}
    r = run_policy(_scenario(tmp_path, [RING], [down]), policy)
    (f,) = r.faults
    assert f["partitioned"] == ["ring"] and not r.aborted
    assert f["job_stall_us"]["ring"] >= 2000.0
    assert f["reroute_us"] is None and f["streams_moved"] == 0


@pytest.mark.parametrize("policy", ["ideal", "spray", "ecmp", "task-aware"])
def test_a_stage_that_starts_with_no_path_left_stops_its_job_or_waits(tmp_path: Path,
                                                                       policy: str) -> None:
    """Both spines die before the job starts: routing (converged at once for ``ideal``)
    finds no path for the job's first stage. Down for good, the job is stopped and named as
    the faults' partition (it was a traceback for the policies that route on the converged
    view); repaired at 8 ms, it waits for the repair and then moves every byte.

    The faults recover when the job moves again, never before (an idle network is no sign
    of health: they were said to recover as soon as they were routed around, the job cut
    off): at the repair for ``ideal``; once the controller knows of it and its paths are
    in (detection, control latency) for ``task-aware``; once routing has converged on it
    for the others. A job stopped never recovers."""
    spines = [{"kind": "switch_down", "switch": f"spine{i}", "at_ns": 0} for i in (0, 1)]
    job = {**A2A, "compute_ns": 50_000}
    r = run_policy(_scenario(tmp_path, [job], spines), policy)
    assert "a2a" in r.aborted and "has no path left" in r.aborted["a2a"]
    assert "a2a" in {j for f in r.faults for j in f["partitioned"]}
    assert r.collectives == []
    assert [f["recovery_us"] for f in r.faults] == [None, None]
    back = [{**ev, "until_ns": 8_000_000} for ev in spines]
    r = run_policy(_scenario(tmp_path, [job], back), policy)
    assert not r.aborted and r.bytes_delivered == r.bytes_sent > 0
    (c,) = r.collectives
    assert c.end_ns > 8_000_000  # (it could not move before the repair)
    lag_ns = {"ideal": 0, "task-aware": DETECT_NS + CONTROL_NS}.get(policy,
                                                                   DETECT_NS + CONVERGE_NS)
    for f in r.faults:
        assert f["recovery_us"] == pytest.approx((8_000_000 + lag_ns) / 1e3)

def _gray_run(tmp_path: Path, policy: str, controller: dict[str, Any] | None = None,
              **faults: Any) -> tuple[Any, Any]:
    from fabricpilot.runner import _simulate

    prep = _scenario(tmp_path, [RING], faults.pop("events", []), controller, **faults)
    out, pol, _ = _simulate(prep, policy)
    return out, pol


def test_a_gray_link_is_acted_on_after_exactly_k_detections(tmp_path: Path) -> None:
    """BER 1e-5 > 1e-6 on both directions of leaf0-spine0 from t = 0. Counters are read
    every 1 ms; with the default debounce (3 within 500 ms) the controller acts on the
    third sample of each direction, about 3 ms in, and moves planned traffic off."""
    gray = [{"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "ber": 1e-5}]
    out, pol = _gray_run(tmp_path, "task-aware", events=gray)
    acts = pol.gray_actions
    assert len(acts) == 2 and all(real and k == 3 for _, _, real, k in acts)
    assert {lk for _, lk, _, _ in acts} == set(pol.ctx.topology.link_id[pair] for pair in (
        (pol.ctx.topology.node_index["leaf0"], pol.ctx.topology.node_index["spine0"]),
        (pol.ctx.topology.node_index["spine0"], pol.ctx.topology.node_index["leaf0"])))
    t = acts[0][0]
    assert 3_000_000 <= t <= 3_000_000 + 200_000 + 50_000  # third sample, one period late
    (f,) = out.faults
    assert f.detected_ns == t and f.rerouted_ns is not None
    assert pol.controller.degraded == {lk for _, lk, _, _ in acts}
    # the routing baseline never sees it
    out_e, _ = _gray_run(tmp_path, "ecmp", events=gray)
    assert out_e.faults[0].detected_ns is None


def test_a_gray_link_that_only_loses_frames_is_found_by_its_uncorrectable_errors(
        tmp_path: Path) -> None:
    """A loss of 1 packet in 1 000 on leaf0-spine0 with no bit error rate given: no rise in
    corrected errors, but the frames FEC could not correct (some 12 per 1 ms sample at
    400 Gb/s, 3e-8 per bit, above 1e-12): the controller acts on the third sample of a
    direction that carries the ring, about 3 ms in, and moves it off (it was invisible:
    the ring lost 1 packet in 1 000 and went back N for each to the end)."""
    gray = [{"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "drop_probability": 1e-3}]
    out, pol = _gray_run(tmp_path, "task-aware", events=gray)
    acts = pol.gray_actions
    assert acts and all(real and k == 3 for _, _, real, k in acts)
    (f,) = out.faults
    assert 3_000_000 <= f.detected_ns <= 3_000_000 + 200_000 + 50_000
    assert f.rerouted_ns is not None and pol.controller.degraded
    out_e, _ = _gray_run(tmp_path, "ecmp", events=gray)  # (no controller: never found)
    assert out_e.faults[0].detected_ns is None


def test_a_lossy_gray_link_costs_go_back_n_resends_without_a_controller(
        tmp_path: Path) -> None:
    """A loss in 10 000 packets on a link of the 8-GPU ring: go-back-N resends the lost
    packet and the ``W`` sent after it in one round trip of the hop (each ring hop is a QP:
    ``W`` = 400 Gb/s x 2 x the hop's one-way latency / 4096 B, 78 packets here, not the
    ring's 14 hops of it): a packet delivered costs ``(1 + p W) / (1 - p)`` sent, so of the
    bytes crossing the link ``p (1 + W) / (1 + p W)`` are resends (0.79 %), and ``p`` of
    them are lost on it (counted as lost: the packets the link drops)."""
    gray = [{"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "ber": 1e-5,
             "drop_probability": 1e-4}]
    out, pol = _gray_run(tmp_path, "ecmp", events=gray)
    (f,) = out.faults
    assert f.bytes_retx > 0
    assert f.detected_ns is None  # nothing reroutes: a gray link drops silently
    assert f.jobs_hit == ["ring"] and f.summary()["jobs_hit"] == ["ring"]  # (stalled: none)
    ct = pol.ctx.topology
    on = sum(out.link_bytes[ct.link_id[(ct.node_index[a], ct.node_index[b])]]
             for a, b in (("leaf0", "spine0"), ("spine0", "leaf0")))
    hop_ns = float(out.flows["latency_ns"].max()) / (2 * (8 - 1))  # (the ring's 14 steps)
    w = NIC_GBPS * 2 * hop_ns / (8 * 4096)
    assert f.bytes_retx / on == pytest.approx(1e-4 * (1 + w) / (1 + 1e-4 * w), rel=1e-3)
    assert f.bytes_lost / on == pytest.approx(1e-4, rel=1e-3)


def test_a_stream_sprayed_partly_into_a_dead_link_is_charged_the_share_it_loses(
        tmp_path: Path) -> None:
    """spine0 -> leaf0 down from 1 to 3 ms (one direction; routing converges only after
    5 ms): the ring's hop into leaf0 comes from another leaf, sprayed over both spines by
    ``spray-ooo``, so half its bytes go into the dead link and it moves at half speed for
    2 ms: 1 ms lost, 8 GPUs x 1 ms = 0.008 GPU-s (it was charged as stalled the 2 ms)."""
    down = {**DOWN, "link": "spine0->leaf0", "until_ns": 3_000_000}
    r = run_policy(_scenario(tmp_path, [RING], [down]), "spray-ooo")
    (f,) = r.faults
    assert f["job_stall_us"] == {"ring": pytest.approx(1000.0)}
    assert f["gpu_seconds_lost"] == pytest.approx(0.008)


@pytest.mark.parametrize("second", [
    {"kind": "link_down", "link": "leaf0-spine0"},
    {"kind": "switch_down", "switch": "spine0"}])
def test_a_stall_under_overlapping_faults_is_charged_to_the_first_then_the_next(
        tmp_path: Path, second: dict[str, Any]) -> None:
    """leaf0-spine0 down from 1 to 3 ms, and again (or its spine) from 2 to 4 ms: ECMP's
    streams on it stall from 1 to 4 ms (back before routing converges: the outage is the
    cost). 1-3 ms are charged to the first fault, which began first, 3-4 ms to the second,
    once the first is over; so are the bytes lost on that link, 2:1 (a switch down also
    loses bytes on its other links, its own). The link's owner was the last fault to take
    it down, so the second was charged from 2 ms on (1 and 2 ms)."""
    first = {**DOWN, "until_ns": 3_000_000}
    r = run_policy(_scenario(tmp_path, [RING], [first, {**second, "at_ns": 2_000_000,
                                                          "until_ns": 4_000_000}]), "ecmp")
    a, b = r.faults
    assert a["job_stall_us"] == {"ring": 2000.0} and b["job_stall_us"] == {"ring": 1000.0}
    if second["kind"] == "link_down":
        assert a["bytes_lost"] == pytest.approx(2 * b["bytes_lost"], rel=1e-6)


@pytest.mark.parametrize("policy", ["ecmp", "task-aware"])
def test_a_gray_link_that_loses_every_packet_stalls_and_then_stops_its_job(
        tmp_path: Path, policy: str) -> None:
    """A gray link of drop 1 on leaf0-spine0 (a black hole: the link state shows nothing,
    and without a BER no corrected error either) under the ring's two streams crossing that
    cable (one each way), at 400 Gb/s = 50 bytes/ns each. Cleared at 3 ms, it costs exactly
    its 2 ms (nothing gets through; once packets do, go-back-N resends at once): 2 x 50 x
    2e6 = 200 MB lost. For good, under ECMP the job is hung: stopped after 100 ms with no
    progress and nothing to come but the policy's rounds (10 GB lost), or, with 7 retries of
    4 ms, when its QP errors out 8 x 4 = 32 ms after the loss began (3.2 GB). The controller
    finds it by the frames lost (the third 1 ms sample, about 3 ms in) and moves the ring
    off: it finishes, stalled from 1 ms to then. Its useful share used to be 1 / (2 + W),
    so the job went on at a crawl for ever, then the run failed."""
    gray = {"kind": "gray", "link": "leaf0-spine0", "at_ns": 1_000_000, "drop_probability": 1}
    clean = _coll_ns(_scenario(tmp_path, [RING], [{**gray, "at_ns": 900_000_000}]), policy)
    r = run_policy(_scenario(tmp_path, [RING], [{**gray, "until_ns": 3_000_000}]), policy)
    (c,) = r.collectives
    (f,) = r.faults
    assert c.end_ns - c.start_ns == clean + 2_000_000
    assert f["job_stall_us"] == {"ring": 2000.0} and f["bytes_lost"] == 2 * 50 * 2_000_000
    assert not r.aborted and f["partitioned"] == []
    for extra, hung_ns, why in (
            ({}, 100_000_000, "every packet lost on gray link leaf0->spine0 (drop 1) for "
                              "100 ms, and nothing to clear it or move the stream"),
            ({"rdma_retry_count": 7}, 8 * RTO_NS,
             "RDMA retries exhausted (7 every 4 ms) while its path lost every packet")):
        r = run_policy(_scenario(tmp_path, [RING], [gray], **extra), policy)
        (f,) = r.faults
        if policy == "task-aware":
            (c,) = r.collectives
            assert not r.aborted and 3_000_000 <= f["detection_us"] * 1e3 + 1_000_000 <= 4e6
            assert f["job_stall_us"]["ring"] == pytest.approx(f["reroute_us"], abs=1.0)
            continue
        assert r.collectives == [] and why in r.aborted["ring"]
        assert f["partitioned"] == ["ring"] and f["job_stall_us"] == {"ring": hung_ns / 1e3}
        assert f["bytes_lost"] == 2 * 50 * hung_ns


@pytest.mark.parametrize(("spike_ber", "count", "alarms"), [
    (5e-7, 1, 0),   # noise below the threshold: never acted on, even undebounced
    (5e-6, 3, 0),   # noise above it, debounced: 0.003 expected (see below)
    (5e-6, 1, 5),   # debounce off: every spike moves traffic off a healthy link
])
def test_noisy_counters_and_the_debounce(tmp_path: Path, spike_ber: float, count: int,
                                         alarms: int) -> None:
    """Each port's 1 ms sample spikes with probability 0.01. Over the 9 samples of the run
    and 32 directed links: 2.9 spikes expected, all false alarms without a debounce (this
    seed draws 5); with 3-in-500-ms, C(9, 3) 1e-6 x 32 = 0.003 expected."""
    out, pol = _gray_run(tmp_path, "task-aware",
                         noise={"spike_probability": 0.01, "spike_ber": spike_ber},
                         debounce={"count": count, "window_ns": 500_000_000})
    assert not out.faults
    assert len(pol.gray_actions) == alarms
    assert all(not real for _, _, real, _ in pol.gray_actions)
    assert pol.stats()["gray_false_alarms"] == alarms


def test_faults_need_the_flow_model(tmp_path: Path) -> None:
    import subprocess
    import sys

    data = yaml.safe_load(Path("examples/link_failure.yaml").read_text())
    data["fabric"] = {"model": "fluid"}
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "fabricpilot", "validate", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: {path}: faults: faults are modelled by the flow-level model: set "
        "fabric.model: flow (got fluid)"]


def test_random_faults_run_and_are_deterministic(tmp_path: Path) -> None:
    """Cables fail with a 2 ms MTBF over a 3 ms horizon (16 fabric cables: ~24 failures
    expected), each down 300 us: every one is reported, the same for the same seed."""
    prep = _scenario(tmp_path, [A2A], [], random={"link_mtbf_ns": 2_000_000,
                                                  "repair_ns": 300_000,
                                                  "horizon_ns": 3_000_000})
    assert len(prep.faults.faults) > 5
    a, b = run_policy(prep, "task-aware"), run_policy(prep, "task-aware")
    assert a.faults == b.faults and len(a.faults) == len(prep.faults.faults)
    # every failure is repaired: jobs cut off for a while wait, and everything arrives
    assert not a.aborted and a.bytes_delivered == a.bytes_sent


def test_a_job_cut_off_until_a_repair_waits_for_it(tmp_path: Path) -> None:
    """gpu0's NIC link is down from 200 us to 1.2 ms: the ring cannot move (a ring is as
    fast as its slowest stream) for that 1 ms and then finishes; nothing is stopped."""
    near = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 1, 2, 3]}
    events = [{"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 200_000,
               "until_ns": 1_200_000}]
    clean = _coll_ns(_scenario(tmp_path, [near], [{**events[0], "at_ns": 900_000_000,
                                                    "until_ns": 901_000_000}]), "task-aware")
    r = run_policy(_scenario(tmp_path, [near], events), "task-aware")
    assert not r.aborted and r.bytes_delivered == r.bytes_sent
    (f,) = r.faults
    assert f["partitioned"] == ["ring"]
    (c,) = r.collectives
    # stalled from the fault to the repair's detection plus the control latency
    assert c.end_ns - c.start_ns == pytest.approx(
        clean + 1_000_000 + DETECT_NS + CONTROL_NS, abs=5_000)


@pytest.mark.parametrize("policy", ["ideal", "task-aware"])
def test_a_later_fault_is_not_named_for_a_job_another_fault_cut_off(tmp_path: Path,
                                                                    policy: str) -> None:
    """gpu0's NIC link is down from 200 us to 3 ms: the ring on gpus 0-3 (all on leaf0 and
    leaf1) is cut off by it alone. leaf3-spine1 dies at 500 us under the all-to-all on gpus
    4-7: it never carried the ring, so it must not be named as cutting the ring off (it
    was, when the ring's cut streams were counted again under every later fault). (ECMP
    is left out: its routing converges after the repair, so it never sees the ring cut.)"""
    near = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 1, 2, 3]}
    far = {**A2A, "gpus": 4, "placement": "explicit", "gpu_ids": [4, 5, 6, 7]}
    events = [{"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 200_000,
               "until_ns": 3_000_000},
              {"kind": "link_down", "link": "leaf3-spine1", "at_ns": 500_000}]
    r = run_policy(_scenario(tmp_path, [near, far], events), policy)
    assert not r.aborted and r.bytes_delivered == r.bytes_sent
    first, second = r.faults
    assert first["partitioned"] == ["ring"]
    assert "ring" not in second["partitioned"]
    # whose traffic each reached: the ring's NIC link, the all-to-all's leaf3 uplinks
    # (its leaf2 <-> leaf3 pairs spread over both spines)
    assert first["jobs_hit"] == ["ring"] and second["jobs_hit"] == ["a2a"]


def test_a_job_waits_for_routing_to_converge_on_a_repaired_link(tmp_path: Path) -> None:
    """gpu1's NIC link is down from 0.2 to 6.2 ms and leaf0-spine0 from 1.2 to 2.2 ms. When
    routing converges on the spine link (6.3 ms) every repair has happened, but routing
    still avoids gpu1's link until it converges on its repair (11.3 ms): the ring waits for
    that (it was stopped as cut off for good), then moves every byte."""
    near = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 1, 2, 3]}
    events = [{"kind": "link_down", "link": "gpu1-leaf0", "at_ns": 200_000,
               "until_ns": 6_200_000},
              {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_200_000,
               "until_ns": 2_200_000}]
    r = run_policy(_scenario(tmp_path, [near], events), "ecmp")
    assert not r.aborted and r.bytes_delivered == r.bytes_sent > 0
    (c,) = r.collectives
    assert c.end_ns > 6_200_000 + DETECT_NS + CONVERGE_NS


@pytest.mark.parametrize("policy", ["ideal", "ecmp", "task-aware"])
def test_a_stream_cut_off_goes_on_once_a_new_path_is_found(tmp_path: Path,
                                                           policy: str) -> None:
    """gpu0's NIC link is down from 0.2 to 1 ms, so the ring is cut off; meanwhile
    leaf0-spine0 dies for good, under streams that could not be moved then (their GPU had
    no link). Once gpu0 is back, those streams get new paths and the ring goes on (a cut-off
    stream given a new path stayed paused: the run ended in "flows are active but none can
    make progress")."""
    near = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 1, 2, 3]}
    events = [{"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 200_000,
               "until_ns": 1_000_000},
              {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 500_000}]
    r = run_policy(_scenario(tmp_path, [near], events), policy)
    assert not r.aborted and r.bytes_delivered == r.bytes_sent > 0
    (c,) = r.collectives
    assert c.end_ns > 1_000_000


def _leaf3_gone_with_mice() -> dict[str, Any]:
    """A job on gpus 0 and 2, Poisson mice between all 8 GPUs (one host each, two hosts
    per leaf) for 20 us, and leaf3 (gpus 6 and 7) dying for good at 0."""
    return {
        "name": "mice", "seed": 149,
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 2, "rail_optimized": False},
        "jobs": [{"name": "j0", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
                  "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}],
        "mice": {"rate_per_s": 1_000_000, "size_bytes": "64KiB", "duration_ns": "20us"},
        "faults": {"events": [{"kind": "switch_down", "switch": "leaf3", "at_ns": 0}]},
    }


@pytest.mark.parametrize("policy", ["ecmp", "ideal", "adaptive", "task-aware"])
def test_mice_to_a_leaf_that_is_gone_are_cut_off_not_hung(tmp_path: Path,
                                                           policy: str) -> None:
    """leaf3 (gpus 6 and 7) dies for good at 0 while mice flow between all 8 GPUs: the
    mice to or from it are dropped and counted (the run ended in a traceback or in "flows
    are active but none can make progress"); the job on gpus 0 and 2 finishes, and the
    bytes not delivered are exactly those of the mice cut off in flight."""
    data = _leaf3_gone_with_mice()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    prep = prepare(load_scenario(path), str(path))
    to_leaf3 = int(np.isin(prep.mice.src, [6, 7]).sum() + np.isin(prep.mice.dst, [6, 7]).sum()
                   - (np.isin(prep.mice.src, [6, 7]) & np.isin(prep.mice.dst, [6, 7])).sum())
    assert to_leaf3 > 0
    r = run_policy(prep, policy)
    assert not r.aborted and len(r.collectives) == 1
    assert r.mice_cut_off == to_leaf3 and r.summary()["mice_cut_off"] == to_leaf3
    in_flight = (r.bytes_sent - r.bytes_delivered) // (64 << 10)
    assert r.bytes_sent - r.bytes_delivered == in_flight * (64 << 10)
    assert 0 <= in_flight <= to_leaf3  # (the others had no path when they came: never sent)
    # leaf3 back at 3 ms: every mouse is delivered, those to or from it after the repair,
    # their FCT counted from when they came (they waited for a path)
    data["faults"]["events"][0]["until_ns"] = 3_000_000
    path.write_text(yaml.safe_dump(data))
    r = run_policy(prepare(load_scenario(path), str(path)), policy)
    assert r.mice_cut_off == 0 and r.bytes_sent == r.bytes_delivered
    fl = r.flows
    mice = (fl["owner"] == -1) & (np.isin(fl["src"], [6, 7]) | np.isin(fl["dst"], [6, 7]))
    assert mice.sum() == to_leaf3
    assert (fl["start_ns"][mice] < 20_000).all() and (fl["deliver_ns"][mice] > 3_000_000).all()


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "sla-aware", "ideal", "task-aware"])
def test_a_job_starting_on_a_gpu_link_down_for_good_is_stopped(tmp_path: Path,
                                                               policy: str) -> None:
    """gpu0's own link dies at 0 and routing has converged on it when the job (gpu0 and
    gpu2) starts at 1 ms: no path avoids that link, so the job is stopped and the fault
    names it. Its first streams crossed the dead link with nobody to move them: ECMP ended
    in "no progress", adaptive routing ran forever, ideal delivered every byte through it."""
    job = {"name": "j0", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
           "start_ns": 1_000_000, "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}
    prep = _scenario(tmp_path, [job], [{"kind": "link_down", "link": "leaf0-gpu0",
                                        "at_ns": 0}],
                     detection_delay_ns=0, convergence_delay_ns=0)
    r = run_policy(prep, policy)
    assert r.aborted["j0"] in {"gpu0 -> gpu2 has no path left",  # (both ways are cut)
                               "gpu2 -> gpu0 has no path left"}
    assert r.collectives == [] and r.bytes_delivered == 0
    (f,) = r.faults
    assert f["partitioned"] == ["j0"]


@pytest.mark.parametrize("policy", ["ecmp", "ideal", "task-aware"])
def test_a_stopped_ring_names_a_pair_that_is_cut(tmp_path: Path, policy: str) -> None:
    """leaf2 (gpus 4 and 5) dies for good under an 8-GPU ring: the reason names a pair with
    one end there (it named the ring row's first pair, gpu0 -> gpu1, which was not cut)."""
    prep = _scenario(tmp_path, [RING], [{"kind": "switch_down", "switch": "leaf2",
                                         "at_ns": 200_000}])
    r = run_policy(prep, policy)
    why = r.aborted["ring"]
    a, b = (int(x.removeprefix("gpu")) for x in why.split(" has ")[0].split(" -> "))
    assert {a, b} & {4, 5}, why


@pytest.mark.parametrize("policy", ["ideal", "ecmp", "task-aware"])
def test_a_job_held_for_a_repair_that_does_not_help_is_stopped(tmp_path: Path,
                                                               policy: str) -> None:
    """gpu0's own link dies for good while leaf0 -> spine0 is down until 3.294 ms: the job
    (gpu0 -> gpu1) waits for that repair, which does not give it a path; it is then stopped
    (the repair's own instant still counted as a repair to come: "no progress")."""
    job = {"name": "j2", "gpus": 2, "placement": "contiguous", "iterations": 1,
           "collectives": [{"op": "reducescatter", "size_bytes": 16669}]}
    events = [{"kind": "link_down", "link": "leaf0->spine0", "at_ns": 0,
               "until_ns": 3_294_000},
              {"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 0}]
    r = run_policy(_scenario(tmp_path, [job], events), policy)
    assert r.aborted["j2"] in {"gpu0 -> gpu1 has no path left",  # (both ways are cut)
                               "gpu1 -> gpu0 has no path left"}
    assert "j2" in r.faults[1]["partitioned"]


def test_a_flapping_link_under_the_controller_costs_what_one_failure_does(
        tmp_path: Path) -> None:
    """A link flaps 5 times (down 500 us, up 800 us) under task-aware: every up is shorter
    than the hold-down (1 ms), so from the first detection the link carries nothing planned
    until the flap is over: only the first down loses bytes, exactly what the same link
    down for good loses, and the jobs end as late. (Re-plans made during an up, for
    the load the heal left, used to put traffic back on it, to lose it at the next down:
    twice the bytes.)"""
    ring = {**RING, "gpus": 4, "placement": "explicit", "gpu_ids": [0, 2, 4, 6],
            "iterations": 2}
    a2a = {**A2A, "gpus": 4, "placement": "explicit", "gpu_ids": [1, 3, 5, 7],
           "iterations": 2}
    flap = {"kind": "flap", "link": "leaf0-spine0", "at_ns": 1_000_000, "down_ns": 500_000,
            "up_ns": 800_000, "count": 5}
    (tmp_path / "flap").mkdir()
    flapped = run_policy(_scenario(tmp_path / "flap", [ring, a2a], [flap]), "task-aware")
    down = run_policy(_scenario(tmp_path, [ring, a2a], [DOWN]), "task-aware")
    (f,), (d,) = flapped.faults, down.faults
    assert d["bytes_lost"] > 0
    assert f["bytes_lost"] == d["bytes_lost"] and f["bytes_retx"] == d["bytes_retx"]
    # (once the link has stayed up 1 ms a re-plan moves streams back onto it, each pausing
    # at most the control latency for its bytes in flight)
    assert max(c.end_ns for c in flapped.collectives) <= max(
        c.end_ns for c in down.collectives) + CONTROL_NS
    assert flapped.bytes_delivered == flapped.bytes_sent


def test_a_flowlet_longer_than_the_new_paths_continues(tmp_path: Path) -> None:
    """On a k=4 fat-tree under random faults, a flowlet continuing on its 6-link path (via a
    core) within a batch of 4-link paths raised a broadcasting ValueError; the run now
    delivers every byte."""
    data = {
        "name": "fz1082", "seed": 1082,
        "topology": {"kind": "fat_tree", "k": 4, "gpus_per_host": 1},
        "jobs": [{"name": "j1", "gpus": 2, "iterations": 1, "placement": "contiguous",
                  "collectives": [{"op": "broadcast", "size_bytes": 34772}]}],
        "mice": {"rate_per_s": 100000.0, "size_bytes": 262144, "duration_ns": 777000,
                 "start_ns": 845000},
        "faults": {"random": {"link_mtbf_ns": 1000000, "repair_ns": 1690000,
                              "horizon_ns": 7000000, "scope": "all"},
                   "convergence_delay_ns": 10000},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_policy(prepare(load_scenario(path), str(path)), "flowlet")
    assert not r.aborted and len(r.collectives) == 1
    assert r.bytes_sent == r.bytes_delivered > 0


def test_gray_faults_again_on_a_link_are_not_detected_before_they_start(tmp_path: Path) -> None:
    """Random gray faults hit gpu8<->edge2_0 three times: the controller's confirmation of
    the first was taken as the later ones' detection, before they started (-6150 us)."""
    data = {
        "name": "fz1063", "seed": 1063,
        "topology": {"kind": "fat_tree", "k": 4, "gpus_per_host": 2},
        "jobs": [{"name": "j1", "gpus": 3, "iterations": 1, "placement": "contiguous",
                  "collectives": [{"op": "allreduce", "size_bytes": 51789650}]}],
        "faults": {"random": {"link_mtbf_ns": 13000000, "repair_ns": 2313000,
                              "horizon_ns": 10000000, "scope": "all", "gray_fraction": 0.56,
                              "gray_ber": 0.0001}},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_policy(prepare(load_scenario(path), str(path)), "task-aware")
    gray = [f for f in r.faults if f["kind"] == "gray"]
    assert any(f["detection_us"] is not None for f in gray)
    for f in r.faults:
        for key in ("detection_us", "reroute_us", "recovery_us"):
            assert f[key] is None or f[key] >= 0, (f["label"], key, f[key])


def test_a_policy_with_no_controller_beside_it_leaves_the_fabric_to_converge(
        tmp_path: Path) -> None:
    """The task-aware data plane with no controller in the process (the service's twin: its
    controller learns of faults from telemetry) answers the engine's detection with
    ``None``: nothing pauses, routing converges on its own (rerouted at detection +
    convergence, as ECMP is), and the dead cable's ports report down from detection on."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.dataplane import Engine, make_rate_model
    from fabricpilot.runner import fault_setup, port_buffer_bytes

    prep = _scenario(tmp_path, [RING], [DOWN])
    faults, controller, fec = fault_setup(prep)
    assert faults is not None
    pol = TaskAware(PolicyContext(prep.topology, prep.seed, prep.fabric.switch_latency_ns,
                                  prep.ecmp, member_routes=True, adaptive=prep.adaptive,
                                  controller=controller, port_buffer_bytes=port_buffer_bytes(prep),
                                  faults=True, **fec))
    model = make_rate_model(prep.rate_model, prep.topology, prep.fabric, **prep.model_params)
    out = Engine(prep.topology, pol, prep.jobs, fabric=prep.fabric, mice=prep.mice,
                 rate_model=model, batch_rel_eps=prep.completion_tolerance,
                 mice_class=prep.mice_class, faults=faults).run()
    (f,) = out.faults
    assert f.detected_ns - f.start_ns == DETECT_NS
    assert f.rerouted_ns - f.start_ns == DETECT_NS + CONVERGE_NS
    assert pol.ports_down == set(faults.faults[0].links)


def test_a_repaired_gray_link_is_restored_after_its_counters_stay_clean(tmp_path: Path) -> None:
    """The same gray link, repaired at 5 ms, with ``gray_clear_ns`` 2 ms: confirmed gray on
    the third sample (3 ms), clean from the first sample after the repair (5 or 6 ms: one
    every 1 ms), restored by the first control period (every 200 us) at least 2 ms later,
    so between 7 and 8.2 ms; without ``gray_clear_ns`` it stays gray."""
    gray = [{"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "until_ns": "5ms",
             "ber": 1e-5}]
    ring = {**RING, "iterations": 4}
    from fabricpilot.runner import _simulate

    prep = _scenario(tmp_path, [ring], gray, {"gray_clear_ns": "2ms"})
    _, pol, _ = _simulate(prep, "task-aware")
    both = {lk for _, lk, _, _ in pol.gray_actions}
    assert len(both) == 2
    cleared = pol.gray_restored
    assert sorted(lk for _, lk in cleared) == sorted(both)
    assert all(7_000_000 <= t <= 8_200_000 for t, _ in cleared), cleared
    assert not pol.controller.degraded and pol.stats()["gray_links_restored"] == 2
    prep = _scenario(tmp_path, [ring], gray)
    _, pol, _ = _simulate(prep, "task-aware")
    assert pol.controller.degraded == both and pol.stats()["gray_links_restored"] == 0


def test_faults_injected_while_the_run_goes_play_as_the_scenarios_do(tmp_path: Path) -> None:
    """The ring's run with no scenario fault (an empty timeline): at its first adaptive
    round after 1 ms (the twin with no controller beside it), leaf0-spine0 fails for
    the rest of the run. It is the routing baseline of a scenario's failure, shifted to the
    injection time: detected 100 us later, rerouted at detection + convergence, its bytes
    lost counted; the timeline the engine was given is left as it was."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.dataplane import Engine, make_rate_model
    from fabricpilot.faults import resolve_faults
    from fabricpilot.faults.model import FaultTimeline
    from fabricpilot.scenario.models import FaultsSpec

    prep = _scenario(tmp_path, [RING], [{**DOWN, "at_ns": 900_000_000}])  # (after the run)
    assert prep.faults is not None
    empty = FaultTimeline([], [], prep.faults.params)
    pol = TaskAware(PolicyContext(prep.topology, prep.seed, prep.fabric.switch_latency_ns,
                                  prep.ecmp, member_routes=True, faults=True))
    model = make_rate_model(prep.rate_model, prep.topology, prep.fabric, **prep.model_params)
    eng = Engine(prep.topology, pol, prep.jobs, fabric=prep.fabric, rate_model=model,
                 batch_rel_eps=prep.completion_tolerance, faults=empty)
    drill = resolve_faults(FaultsSpec.model_validate(
        {"events": [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": 0}],
         "detection_delay_ns": DETECT_NS, "convergence_delay_ns": CONVERGE_NS}),
        prep.topology, prep.seed)
    at: list[int] = []
    rebalance = pol.rebalance

    def once(members):  # type: ignore[no-untyped-def]
        if not at and eng.now >= 1_000_000:
            assert eng.inject_faults(drill) == [0]
            at.append(int(eng.now))
        return rebalance(members)

    pol.rebalance = once  # type: ignore[method-assign]
    out = eng.run()
    (f,) = out.faults
    assert f.start_ns == at[0] and f.detected_ns == at[0] + DETECT_NS
    assert f.rerouted_ns == at[0] + DETECT_NS + CONVERGE_NS and f.bytes_lost > 0
    assert empty.faults == [] and empty.events == []


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "task-aware", "ideal"])
def test_a_link_down_in_one_direction_is_routed_around_that_way_only(
        tmp_path: Path, policy: str) -> None:
    """spine0 -> leaf1 fails, leaf1 -> spine0 stays up (as a bad transmitter does): traffic
    into leaf1 converges onto spine1, traffic out of leaf1 keeps both spines, and the
    AlltoAll over both leaves completes with every byte delivered, nothing cut off (the
    routing tables once measured the distances the wrong way round: a spine that could
    not reach leaf1 was kept as a next hop, and spraying or path walks failed)."""
    prep = _scenario(tmp_path, [A2A], [{"kind": "link_down", "link": "spine0->leaf1",
                                        "at_ns": 1_000_000}])
    r = run_policy(prep, policy)
    assert not r.aborted
    assert r.bytes_delivered == r.bytes_sent > 0
    assert len(r.collectives) == 1
    (f,) = r.faults
    assert f["partitioned"] == []


def test_a_flowlet_does_not_continue_on_a_path_routing_gave_up(tmp_path: Path) -> None:
    """Flowlet switching keeps a connection on its path while it sends again within the
    flowlet gap; once routing has converged around a dead cable, a connection whose path
    crosses it takes a new path however soon it sends again (its old path leads nowhere):
    on the link-failure example (seed 8, leaf3-spine0 down for good at 3 ms) both jobs
    complete every collective with every byte delivered. Before, such a flow stayed on the
    dead path and the run ended in a traceback."""
    data = yaml.safe_load(Path("examples/link_failure.yaml").read_text())
    data["seed"] = 8
    data["faults"]["events"] = [{"kind": "link_down", "link": "leaf3-spine0",
                                 "at_ns": 3_034_000}]
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data))
    prep = prepare(load_scenario(path), str(path))
    r = run_policy(prep, "flowlet")
    assert not r.aborted
    assert len(r.collectives) == sum(j.iterations * len(j.collectives) for j in prep.jobs)
    assert r.bytes_delivered == r.bytes_sent > 0


def test_a_stream_its_policy_leaves_on_a_dead_link_is_not_taken_for_cut_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy whose new paths still cross the dead link (here: always the first spine,
    the one leaf0 lost) does not cut its job off while the live fabric connects every pair:
    those streams take the path the switches' hash gives them over the live groups, and
    every byte arrives. (A twin that kept a repaired link excluded stopped a job this way.)"""
    from fabricpilot.balancing import base
    from fabricpilot.balancing.ecmp import Ecmp
    from fabricpilot.topology.paths import walk_paths

    class FirstSpine(Ecmp):
        def repath(self, job, src, dst, stream, qp=None):  # type: ignore[no-untyped-def]
            return walk_paths(self.intact, src, dst, lambda s, sw, r: np.zeros(len(r)))

    def make(ctx):  # type: ignore[no-untyped-def]
        pol = FirstSpine(ctx)
        pol.intact = ctx.topology
        return pol

    monkeypatch.setitem(base.POLICIES, "first-spine", make)
    r = run_policy(_scenario(tmp_path, [A2A], [DOWN]), "first-spine")
    assert not r.aborted and r.bytes_delivered == r.bytes_sent > 0
    (f,) = r.faults
    assert f["partitioned"] == [] and f["streams_moved"] > 0


def test_spraying_is_no_bound_under_a_failure(tmp_path: Path) -> None:
    """``ideal`` moves every stream to live paths at the fault instant (the bound); a fabric
    that sprays (``spray``, ``spray-ooo``) keeps spraying onto the dead link until it is
    detected and routing converges, as its switches would: its share on that link is lost
    and resent, and the AlltoAll takes longer than under ``ideal``."""
    prep = _scenario(tmp_path, [A2A], [DOWN])
    bound = run_policy(prep, "ideal")
    assert bound.faults[0]["bytes_lost"] == 0
    for policy in ("spray", "spray-ooo"):
        r = run_policy(prep, policy)
        (f,) = r.faults
        assert f["detection_us"] == pytest.approx(DETECT_NS / 1e3)
        assert f["bytes_lost"] > 0 and f["bytes_retx"] >= f["bytes_lost"]
        assert r.bytes_delivered == r.bytes_sent and not r.aborted
        assert r.collectives[0].end_ns > bound.collectives[0].end_ns


def test_mice_in_a_batch_that_meets_a_partition_are_routed_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mice that come together (one batch, at 100 us) after leaf3 died (at 0; ``ideal``
    knows at once): those to or from leaf3 find no path and are dropped; each of the others
    is routed exactly once (they were routed one by one to find which have a path, then
    all again: a policy may keep state per route) and delivered."""
    from dataclasses import replace

    from fabricpilot.balancing.ideal import Ideal

    data = _leaf3_gone_with_mice()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    prep = prepare(load_scenario(path), str(path))
    assert prep.mice is not None
    mice = replace(prep.mice, time_ns=np.full(len(prep.mice.time_ns), 100_000, np.int64))
    prep = replace(prep, mice=mice)
    routed: list[tuple[int, int]] = []  # (source, destination) of each mouse routed
    route = Ideal.route

    def counting(self: Ideal, batch: Any) -> Any:
        out = route(self, batch)  # (raises for a batch with a mouse cut off: not counted)
        m = batch.job < 0
        routed.extend(zip(batch.src[m].tolist(), batch.dst[m].tolist(), strict=True))
        return out

    monkeypatch.setattr(Ideal, "route", counting)
    r = run_policy(prep, "ideal")
    live = ~(np.isin(mice.src, [6, 7]) | np.isin(mice.dst, [6, 7]))
    assert 1 < live.sum() < len(live)
    pairs = Counter(zip(mice.src.tolist(), mice.dst.tolist(), strict=True))
    live_pairs = Counter(zip(mice.src[live].tolist(), mice.dst[live].tolist(), strict=True))
    got = Counter(routed)
    # (a mouse between two GPUs of leaf3 is routed on their own links, then found cut off)
    assert not got - pairs and not live_pairs - got
    assert r.mice_cut_off == int((~live).sum())
    done = r.flows["owner"] == -1
    assert int(done.sum()) >= int(live.sum())


def _sprayed_pair(tmp_path: Path, at_ns: int | None, policy: str = "ideal",
                  converge_ns: int = CONVERGE_NS) -> Any:
    """gpu0 (leaf0) and gpu2 (leaf1) in a 64 MiB ring AllReduce sprayed over 4 spines of
    100 Gb/s (400 Gb/s NICs: the fabric holds each stream to 4 x 100 Gb/s); the cable
    leaf1-spine0 dies at ``at_ns`` (``None``: never). Returns the prepared scenario and the
    run of ``policy``."""
    data = {
        "name": "spray", "seed": 5,
        "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                     "nics_per_leaf": 2, "oversubscription": 2.0, "rail_optimized": False,
                     "nic_rate_gbps": 400.0, "fabric_rate_gbps": 100.0},
        "jobs": [{"name": "pair", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
                  "iterations": 1, "compute_ns": 100_000,
                  "collectives": [{"op": "allreduce", "size_bytes": 64 << 20}]}],
        "faults": {"detection_delay_ns": DETECT_NS, "convergence_delay_ns": converge_ns,
                   "events": ([] if at_ns is None else
                              [{"kind": "link_down", "link": "leaf1-spine0",
                                "at_ns": at_ns}])},
    }
    path = tmp_path / f"spray{at_ns}.yaml"
    path.write_text(yaml.safe_dump(data))
    prep = prepare(load_scenario(path), str(path))
    return prep, run_policy(prep, policy)


def test_a_sprayed_stream_spreads_a_dead_paths_share_over_its_live_paths(
        tmp_path: Path) -> None:
    """Spraying over the 3 spines left, each stream moves at 300 Gb/s (it had a quarter of
    its bytes on each of 4 paths; the dead one's quarter re-hashed onto one live path put
    half its bytes there: 200 Gb/s). Against the same ring run on 3 spines from the start
    (the cable dead before the job), a failure ``t`` into the first step (both streams at
    400 Gb/s until then) saves exactly the bytes sent faster: ``t * (400 - 300) / 300``."""
    prep, clean = _sprayed_pair(tmp_path, None)
    (c0,) = clean.collectives
    full = c0.end_ns - c0.start_ns
    _, before = _sprayed_pair(tmp_path, 0)
    (c3,) = before.collectives
    three = c3.end_ns - c3.start_ns
    # (64 MiB in two steps of 32 MiB per stream, on the wire with its headers)
    wire = float(prep.fabric.wire_bytes(np.array([32 << 20]))[0])
    step_400, step_300 = wire * 8 / 400.0, wire * 8 / 300.0
    assert three - full == pytest.approx(2 * (step_300 - step_400), abs=2_000)
    t = 300_000
    _, mid = _sprayed_pair(tmp_path, c0.start_ns + t)
    (f,) = mid.faults
    assert f["bytes_lost"] == 0 and f["streams_moved"] == 2
    (c,) = mid.collectives
    assert c.end_ns - c.start_ns == pytest.approx(three - t * (400 - 300) / 300, abs=500)
    assert mid.bytes_delivered == mid.bytes_sent


def test_a_dead_path_costs_spraying_to_an_in_order_nic_a_go_back_n_per_loss(
        tmp_path: Path) -> None:
    """The same failure ``t`` into the ring, routing slow to converge (1 s, after the run):
    the switches spray a quarter of every stream's packets into the dead link. An
    out-of-order NIC (``spray-ooo``) keeps the other three quarters: 300 Gb/s of goodput,
    as ``ideal`` on the 3 spines left. An in-order RoCE NIC (``spray``) goes back N at
    every loss: a loss every 4 packets, each costing itself and the ``W`` packets of one
    round trip after it, so goodput is ``400 / (1 + (1 + W) / 4)`` Gb/s (``W`` = 400 Gb/s
    times twice the hop's one-way latency, in packets: a ring's hop is a QP of its own, its
    round trip one hop's, not the ring's); what it sends beyond that is resent."""
    t = 300_000
    prep, clean = _sprayed_pair(tmp_path, None, "spray-ooo")
    (c0,) = clean.collectives
    _, ideal = _sprayed_pair(tmp_path, c0.start_ns + t, "ideal", 1_000_000_000)
    (ci,) = ideal.collectives
    _, ooo = _sprayed_pair(tmp_path, c0.start_ns + t, "spray-ooo", 1_000_000_000)
    (co,) = ooo.collectives
    assert co.start_ns == c0.start_ns
    assert co.end_ns == pytest.approx(ci.end_ns, abs=500)
    (fo,) = ooo.faults
    assert fo["bytes_retx"] == pytest.approx(fo["bytes_lost"], rel=1e-9)
    _, gbn = _sprayed_pair(tmp_path, c0.start_ns + t, "spray", 1_000_000_000)
    (cg,) = gbn.collectives
    hop_ns = float(gbn.flows["latency_ns"].max()) / 2  # (2 ranks: 2 steps of one hop)
    w = 400e9 * 2 * hop_ns * 1e-9 / (8 * prep.fabric.mtu_bytes)
    good_gbps = 400.0 / (1.0 + (1.0 + w) / 4)
    assert good_gbps < 100.0  # (the pathology: far below the 300 Gb/s left)
    wire = float(prep.fabric.wire_bytes(np.array([32 << 20]))[0])
    left = 2 * wire - 400.0 / 8 * t  # bytes per stream after the failure (two steps)
    assert cg.end_ns - cg.start_ns == pytest.approx(t + left * 8 / good_gbps, rel=0.01)
    (fg,) = gbn.faults
    # a quarter of what is sent is lost; all but the goodput is sent again
    assert fg["bytes_lost"] > 0
    assert fg["bytes_retx"] == pytest.approx(fg["bytes_lost"] * (1 - good_gbps / 400) / 0.25,
                                             rel=1e-3)
    assert gbn.bytes_delivered == gbn.bytes_sent


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "spray"])
def test_local_repair_turns_streams_away_from_a_dead_switch_at_detection(
        tmp_path: Path, policy: str) -> None:
    """spine0 dies at 1 ms. With ``local_repair`` each leaf drops its uplink to spine0 from
    its groups at detection (the other spine is left), so every stream through spine0 moves
    then: each of them sends into the dead switch for the detection delay only (400 Gb/s x
    100 us; a sprayed stream half of that per stream on spine0), not detection + routing
    convergence, and its lost packets are resent when its timer fires at 5 ms (4 ms after
    the loss) instead of 9 ms: the ring ends 4 ms earlier."""
    spine = {"kind": "switch_down", "switch": "spine0", "at_ns": 1_000_000}
    base = run_policy(_scenario(tmp_path, [RING], [spine]), policy)
    fast = run_policy(_scenario(tmp_path, [RING], [spine], local_repair=True), policy)
    (fb,), (ff,) = base.faults, fast.faults
    assert fb["reroute_us"] == pytest.approx((DETECT_NS + CONVERGE_NS) / 1e3)
    assert ff["reroute_us"] == pytest.approx(DETECT_NS / 1e3)
    share = 0.5 if policy == "spray" else 1.0  # (spraying: half of each stream on spine0)
    assert ff["streams_moved"] == fb["streams_moved"] >= 1
    lost = ff["streams_moved"] * share * NIC_GBPS / 8 * DETECT_NS
    assert ff["bytes_lost"] == pytest.approx(lost, rel=1e-6)
    (cb,), (cf,) = base.collectives, fast.collectives
    if policy == "spray":  # (without it, the ring crawled on at its go-back-N goodput from
        # detection to convergence instead of waiting: a little less than the timer saved,
        # by at most that crawl: CONVERGE_NS at 1 / (1 + (1 + W) / 2) of the line, half of
        # every stream's packets lost and each costing a round trip W of its hop)
        hop_ns = float(base.flows["latency_ns"].max()) / (2 * (8 - 1))  # (8-rank ring)
        w = NIC_GBPS * 2 * hop_ns / (8 * 4096)
        crawl_ns = CONVERGE_NS / (1 + (1 + w) / 2)
        assert RTO_NS - crawl_ns <= cb.end_ns - cf.end_ns < RTO_NS
    else:
        assert cb.end_ns - cf.end_ns == RTO_NS
    assert fast.bytes_delivered == fast.bytes_sent and not fast.aborted


def test_local_repair_cannot_turn_away_what_a_spine_has_no_other_way_for(
        tmp_path: Path) -> None:
    """The cable leaf0-spine0 dies at 1 ms under ECMP, with ``local_repair``. Of the two
    ring streams on it, the one leaving leaf0 turns to the other spine at detection; the one
    coming down spine0 into leaf0 cannot (spine0 has no other way to leaf0): it goes on
    into the dead link until routing converges (6.1 ms), except while the ring (one row, as
    slow as its slowest stream) waits for the first stream's timer (1.1 to 5 ms). Lost:
    both streams for 100 us, then one for 1.1 ms, at 400 Gb/s."""
    base = run_policy(_scenario(tmp_path, [RING], [DOWN]), "ecmp")
    fast = run_policy(_scenario(tmp_path, [RING], [DOWN], local_repair=True), "ecmp")
    (fb,), (ff,) = base.faults, fast.faults
    assert fb["streams_moved"] == ff["streams_moved"] == 2
    assert ff["reroute_us"] == pytest.approx((DETECT_NS + CONVERGE_NS) / 1e3)
    at, rto_fires, converged = 1_000_000, 1_000_000 + RTO_NS, 1_000_000 + DETECT_NS + CONVERGE_NS
    lost_ns = 2 * DETECT_NS + (converged - rto_fires)
    assert ff["bytes_lost"] == pytest.approx(NIC_GBPS / 8 * lost_ns, rel=1e-6)
    assert ff["bytes_lost"] < fb["bytes_lost"]
    assert at < rto_fires < converged
    assert fast.bytes_delivered == fast.bytes_sent and not fast.aborted


def test_a_qp_out_of_retries_before_its_path_is_back_stops_its_job(tmp_path: Path) -> None:
    """ECMP, the cable under the ring dies at 1 ms, routing converges at 6.1 ms; the streams
    on it lost packets from 1 ms and resend every 4 ms (5, 9, 13 ms ...). With 2 retries the
    one at 9 ms gets through: the ring ends as with unlimited retries. With 1 retry (at 5 ms,
    before the path is back) the QP errors out at 9 ms and the job stops, named and
    reported; with none, at 5 ms."""
    unlimited = run_policy(_scenario(tmp_path, [RING], [DOWN]), "ecmp")
    two = run_policy(_scenario(tmp_path, [RING], [DOWN], rdma_retry_count=2), "ecmp")
    assert not two.aborted
    assert two.collectives[0].end_ns == unlimited.collectives[0].end_ns
    for retries, stop_ns in ((1, 1_000_000 + 2 * RTO_NS), (0, 1_000_000 + RTO_NS)):
        r = run_policy(_scenario(tmp_path, [RING], [DOWN], rdma_retry_count=retries), "ecmp")
        (why,) = r.aborted.values()
        assert "RDMA retries exhausted" in why and f"({retries} every 4 ms)" in why
        assert r.summary()["aborted_jobs"] == r.aborted and not r.collectives
        assert r.sim_time_ns == stop_ns
    # a timer far shorter than the steps between events: the QP gives up 1 us after the
    # loss, inside the step up to detection (the engine went back in time there)
    r = run_policy(_scenario(tmp_path, [RING], [DOWN], rdma_retry_count=0,
                             rdma_timeout_ns=1_000), "ecmp")
    (why,) = r.aborted.values()
    assert "(0 every 1 us)" in why and r.sim_time_ns == 1_000_000 + 1_000


def test_rdma_retry_count_is_checked(tmp_path: Path) -> None:
    from fabricpilot.errors import FabricpilotError

    with pytest.raises(FabricpilotError, match="rdma_retry_count"):
        _scenario(tmp_path, [RING], [DOWN], rdma_retry_count=8)


def test_each_stream_keeps_its_own_retransmission_timer(tmp_path: Path) -> None:
    """Two cables under the ring die, leaf0-spine0 at 1 ms and leaf2-spine1 at 3 ms (two
    streams each), routing converging 5.1 ms after each. The first cable's streams resend
    at 9 ms (1 + 2 x 4 ms), the second's at 11 ms (3 + 2 x 4 ms: their timers run from their
    own first loss, which the first cable's reroute must not reset): the ring, as slow as
    its slowest stream, stalls from 1 to 11 ms, 10 ms more than the clean run."""
    first = {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_000_000}
    second = {"kind": "link_down", "link": "leaf2-spine1", "at_ns": 3_000_000}
    clean = run_policy(_scenario(tmp_path, [RING], [{**first, "at_ns": 900_000_000}]), "ecmp")
    r = run_policy(_scenario(tmp_path, [RING], [first, second]), "ecmp")
    assert [f["streams_moved"] for f in r.faults] == [2, 2]
    assert r.collectives[0].end_ns - clean.collectives[0].end_ns == 10_000_000


def test_moves_off_a_gray_link_never_reorder_even_when_switch_moves_may(
        tmp_path: Path) -> None:
    """``adaptive.drain_safe: false`` lets switch-local moves switch at once (and reorder);
    the controller's moves off a gray link must not. Spine 0's links are made slow (20 us
    each), so the paths through spine 1 are faster: a stream moved off gray leaf0-spine0
    at once would have its new-path bytes overtake those still on the old path (one event
    per 4 KiB packet). Drain-safe, none does."""
    import dataclasses

    from fabricpilot.runner import _simulate

    gray = [{"kind": "gray", "link": "leaf0-spine0", "at_ns": 0, "ber": 1e-5}]
    prep = _scenario(tmp_path, [{**RING, "iterations": 3}], gray)
    prep = dataclasses.replace(prep, adaptive=dataclasses.replace(prep.adaptive,
                                                                  drain_safe=False))
    ct = prep.topology
    for lk in range(ct.n_links):
        if "spine0" in ct.link_name(lk):
            ct.delay_ns[lk] = 20_000
    out, pol, _ = _simulate(prep, "task-aware")
    assert len(pol.gray_actions) == 2 and all(confirmed for _, _, confirmed, _ in
                                              pol.gray_actions)
    assert out.path_moves > 0
    assert out.flows["reorder_events"].sum() == 0


WIRE_16MIB = (16 << 20) // 4096 * (4096 + 78)  # 4 096 packets of 4 096 B + 78 B of headers
HOP_NS = 4 * 100 + 3 * 600 + 1000  # leaf to leaf: 4 links, 3 switches, the NICs


def _two_broadcasts(tmp_path: Path, down: bool) -> Prepared:
    """Three leaves of four GPUs on two spines (2:1); j1 (gpu0 -> gpu4) hashes onto
    leaf0 -> spine1 -> leaf1, j2 (gpu8 -> gpu6) onto spine1 -> leaf1 too: the two share
    that link and no other. leaf0 -> spine1 is down from 0 (``down``) or never."""
    data = {
        "name": "dead-hop", "seed": 1,
        "topology": {"kind": "leaf_spine", "hosts": 12, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "oversubscription": 2.0, "rail_optimized": False,
                     "link_delay_ns": 100},
        "jobs": [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": g,
                  "iterations": 1, "collectives": [{"op": "broadcast", "size_bytes": 16 << 20}]}
                 for n, g in (("j1", [0, 4]), ("j2", [8, 6]))],
        "faults": {"detection_delay_ns": DETECT_NS, "convergence_delay_ns": CONVERGE_NS,
                   "events": [{"kind": "link_down", "link": "leaf0-spine1",
                               "at_ns": 0 if down else 900_000_000}]},
    }
    path = tmp_path / f"dead-hop-{down}.yaml"
    path.write_text(yaml.safe_dump(data))
    return prepare(load_scenario(path), str(path))


def test_bytes_lost_at_a_dead_link_load_no_link_beyond_it(tmp_path: Path) -> None:
    """j1's bytes die at leaf0 -> spine1: they must not reach spine1 -> leaf1 and slow j2
    there (j2 alone: its wire bytes at 400 Gb/s plus one leaf-to-leaf latency), nor be
    counted on the links after the dead one (once counted there, 5 GB crossed a link that
    carries only j2's 17 MB, and j2 took twice its time)."""
    r = run_policy(_two_broadcasts(tmp_path, down=True), "ecmp")
    (f,) = r.faults
    assert f["bytes_lost"] > 0, "j1 no longer hashes onto the dead link: pick another one"
    j2_ns = r.job_iterations("j2")[0].end_ns - r.job_iterations("j2")[0].start_ns
    assert j2_ns == pytest.approx(WIRE_16MIB * 8 / NIC_GBPS + HOP_NS, abs=2)
    # (without the fault the two share spine1 -> leaf1 all the way: j2 at half the rate)
    clean = run_policy(_two_broadcasts(tmp_path, down=False), "ecmp")
    it = clean.job_iterations("j2")[0]
    assert it.end_ns - it.start_ns == pytest.approx(2 * WIRE_16MIB * 8 / NIC_GBPS + HOP_NS,
                                                    abs=2)
    by_name = dict(zip(r.link_names, r.link_bytes.tolist(), strict=True))
    assert by_name["leaf0->spine1"] == 0
    assert by_name["spine1->leaf1"] == pytest.approx(WIRE_16MIB)  # j2's bytes alone
    assert by_name["leaf1->gpu4"] == pytest.approx(WIRE_16MIB)  # j1's, delivered once


def test_a_qp_whose_path_is_dead_pours_its_message_per_timeout_into_it(tmp_path: Path) -> None:
    """An RC QP sends what it has left and then waits for its retransmission timer: over
    the detection + convergence window it loses its remaining bytes once per timeout on
    average (17.1 MB x 5.1 ms / 4 ms = 21.8 MB), not 5.1 ms at 400 Gb/s (255 MB). The
    bytes it resent are counted for its flow and the run as well as for the fault."""
    r = run_policy(_two_broadcasts(tmp_path, down=True), "ecmp")
    (f,) = r.faults
    window_ns = DETECT_NS + CONVERGE_NS
    assert f["bytes_lost"] == pytest.approx(WIRE_16MIB * window_ns / RTO_NS, rel=1e-6)
    assert f["bytes_retx"] == f["bytes_lost"]
    assert float(r.flows["retx_bytes"].sum()) == pytest.approx(f["bytes_retx"], abs=1)
    assert r.summary()["retransmitted_bytes"] == round(float(r.flows["retx_bytes"].sum()))
    # and j1 finishes once its timer fires after routing moved it: 2 timeouts, then alone
    j1 = r.job_iterations("j1")[0]
    assert j1.end_ns - j1.start_ns == pytest.approx(
        2 * RTO_NS + WIRE_16MIB * 8 / NIC_GBPS + HOP_NS, abs=2)


def test_a_replan_after_a_repair_moves_the_streams_on_their_way_back(tmp_path: Path) -> None:
    """Two 2-GPU rings, each between leaf0 and leaf1 (2 spines), each pair on 2 QPs, one per
    spine. leaf0-spine0 is down from 1 to 3 ms: the heal puts both rings' QPs on spine1,
    half their rate each (the QP on spine0 sends into nothing until the heal, 110 us on).
    The repair is seen 100 us later and weighed after the 1 ms hold-down, at a control
    period (every 200 us), in effect 10 us on: from between 4.11 and 4.32 ms the QPs
    already sending must be back on spine0 (each QP on its own path of the new set), and
    both rings run at line rate again. Each ring so loses half of those 3.11-3.32 ms,
    1.555-1.66 ms, over its clean time, plus at most ~0.1 ms for what the dead QP sent into
    nothing (kept on spine1 until it ends, a ring loses ~4.6 ms); no byte arrives out of
    order."""
    jobs = [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": ids, "iterations": 1,
             "compute_ns": 0, "collectives": [{"op": "allreduce", "size_bytes": 256 << 20}]}
            for n, ids in (("a", [0, 2]), ("b", [1, 3]))]
    down = {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_000_000,
            "until_ns": 3_000_000}
    ctl = {"parts": 2}
    clean = run_policy(_scenario(tmp_path, jobs, [{**down, "at_ns": 900_000_000,
                                                   "until_ns": 901_000_000}], ctl),
                       "task-aware")
    r = run_policy(_scenario(tmp_path, jobs, [down], ctl), "task-aware")
    assert not r.aborted and r.bytes_delivered == r.bytes_sent
    assert r.summary()["reorder_events"] == 0
    for c, c0 in zip(r.collectives, clean.collectives, strict=True):
        lost_ns = (c.end_ns - c.start_ns) - (c0.end_ns - c0.start_ns)
        assert 1_555_000 <= lost_ns <= 1_760_000, lost_ns


def test_ideal_sprays_on_a_repaired_link_again(tmp_path: Path) -> None:
    """The same two rings under ``ideal``: each sprays over both spines, 800 Gb/s up
    leaf0's two uplinks. With leaf0-spine0 down from 1 to 3 ms both share spine0's
    400 Gb/s (ideal moves at the fault instant: no stall), then spray over both again: each
    ring loses exactly half of those 2 ms, 1 ms (kept off the repaired link, it lost half
    of everything after the fault). ``ideal`` stays the bound after a repair."""
    jobs = [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": ids, "iterations": 1,
             "compute_ns": 0, "collectives": [{"op": "allreduce", "size_bytes": 256 << 20}]}
            for n, ids in (("a", [0, 2]), ("b", [1, 3]))]
    down = {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_000_000,
            "until_ns": 3_000_000}
    clean = run_policy(_scenario(tmp_path, jobs, [{**down, "at_ns": 900_000_000,
                                                   "until_ns": 901_000_000}]), "ideal")
    r = run_policy(_scenario(tmp_path, jobs, [down]), "ideal")
    assert not r.aborted and r.bytes_delivered == r.bytes_sent
    for c, c0 in zip(r.collectives, clean.collectives, strict=True):
        lost_ns = (c.end_ns - c.start_ns) - (c0.end_ns - c0.start_ns)
        assert lost_ns == pytest.approx(1_000_000, abs=2_000)


@pytest.mark.parametrize("detect_ns", [1_000, 0])
def test_a_heal_spreads_each_planned_stream_over_its_whole_new_set(tmp_path: Path,
                                                                   detect_ns: int) -> None:
    """A 16-GPU ring whose every hop crosses leaves (4 leaves of 4, 4 spines), each pair
    planned on 4 QPs, one per spine. leaf0-spine0 goes down as the ring starts: leaf0's
    4 streams each way must share 3 uplinks, 300 Gb/s each, so the ring takes 4/3 of its
    clean time (``ideal`` does, spraying at once). The heal gives each pair 3 paths; each
    stream must spread over all of them (before, only its QP on the dead link moved, onto
    a path its pair used already: 2/4 of it there, the ring at 200 Gb/s, 2x its time).
    The set's shares are whole QPs' worth only as far as the planner can balance them, so
    the ring may be a few % slower than ``ideal``, never faster. Seen at once (no
    detection delay), the heal's set is sent as the ring starts: until it takes effect the
    switches still forward by the plan's (the streams did start on the dead link's QPs
    without one, each on one adaptive path, at 58 % of ``ideal`` in a 64-GPU ring)."""
    order = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]
    data = {
        "name": "heal", "seed": 3,
        "topology": {"kind": "leaf_spine", "hosts": 16, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "controller": {"parts": 4},
        "jobs": [{"name": "ring", "gpus": 16, "placement": "explicit", "gpu_ids": order,
                  "iterations": 1, "compute_ns": 0,
                  "collectives": [{"op": "allreduce", "size_bytes": 64 << 20}]}],
        "faults": {"detection_delay_ns": detect_ns, "convergence_delay_ns": detect_ns,
                   "events": [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": 0}]},
    }

    def coll_ns(at_ns: int, policy: str) -> int:
        data["faults"]["events"][0]["at_ns"] = at_ns  # type: ignore[index]
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        return _coll_ns(prepare(load_scenario(path), str(path)), policy)

    clean = coll_ns(900_000_000, "ideal")
    ideal = coll_ns(0, "ideal")
    assert ideal == pytest.approx(clean * 4 / 3, rel=0.01)
    assert ideal * (1 - 1e-3) <= coll_ns(0, "task-aware") <= ideal * 1.05


def test_a_link_back_before_routing_moved_anything_costs_the_outage(
        tmp_path: Path) -> None:
    """gpu0's NIC link is down from 1.0 to 1.3 ms, long before routing would converge
    (5.1 ms). The ring's packets into it are lost from 1.0 ms; once the link is back its
    packets arrive again, the receiver NAKs the gap and the sender goes back N at once:
    the ring stalls for the 0.3 ms outage (a round trip more at most), not a retransmission
    timeout (which only a QP with nothing left to send waits for), and is back at its rate
    then (its recovery, though nothing was rerouted)."""
    pair = {**RING, "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2]}
    blip = {"kind": "link_down", "link": "gpu0-leaf0", "at_ns": 1_000_000,
            "until_ns": 1_300_000}
    clean = _coll_ns(_scenario(tmp_path, [pair], [{**blip, "at_ns": 900_000_000,
                                                   "until_ns": 900_300_000}]), "ecmp")
    r = run_policy(_scenario(tmp_path, [pair], [blip]), "ecmp")
    (f,) = r.faults
    (c,) = r.collectives
    assert c.end_ns - c.start_ns == pytest.approx(clean + 300_000, abs=5_000)
    assert f["job_stall_us"] == {"ring": pytest.approx(300, abs=5)}
    assert f["reroute_us"] is None
    assert f["recovery_us"] == pytest.approx(300, abs=5)


def test_a_stopped_job_resends_nothing(tmp_path: Path) -> None:
    """gpu0's NIC link goes down for good at 1 ms: the ring sends into it until routing
    converges (5.1 ms), finds no path then and is stopped. What it lost is never resent
    (it was counted as resent, as for a job that goes on)."""
    pair = {**RING, "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2]}
    r = run_policy(_scenario(tmp_path, [pair], [{"kind": "link_down", "link": "gpu0-leaf0",
                                                 "at_ns": 1_000_000}]), "ecmp")
    (f,) = r.faults
    assert r.aborted and f["partitioned"] == ["ring"]
    # both directions of the pair: 400 Gb/s each into the dead link for 5.1 ms
    assert f["bytes_lost"] == pytest.approx(2 * NIC_GBPS / 8 * 1e9 * 5.1e-3, rel=1e-3)
    assert f["bytes_retx"] == 0 and r.summary()["retransmitted_bytes"] == 0


def test_a_job_out_of_retries_is_named_by_the_fault(tmp_path: Path) -> None:
    """With one retry every 1 ms, the ring's QP on leaf0-spine0 (down at 1 ms, routing
    converges at 5.1 ms) errors out at 3 ms: its job stops, and the fault names it among
    those it cut off."""
    events = [{**DOWN, "link": "gpu0-leaf0"}]
    pair = {**RING, "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2]}
    r = run_policy(_scenario(tmp_path, [pair], events, rdma_timeout_ns=1_000_000,
                             rdma_retry_count=1, **{}), "ecmp")
    (f,) = r.faults
    assert r.aborted and f["partitioned"] == ["ring"]
    assert f["bytes_retx"] == 0


def test_ideal_recovers_when_the_repaired_link_carries_again(tmp_path: Path) -> None:
    """The two rings under ``ideal`` with leaf0-spine0 down from 1 to 3 ms: no stream
    stalls (it moves at the fault instant), but both run at half rate until the repair;
    the fault's recovery (back to 95 % of the rate before it) is the repair, 2 ms on."""
    jobs = [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": ids, "iterations": 1,
             "compute_ns": 0, "collectives": [{"op": "allreduce", "size_bytes": 256 << 20}]}
            for n, ids in (("a", [0, 2]), ("b", [1, 3]))]
    down = {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 1_000_000,
            "until_ns": 3_000_000}
    (f,) = run_policy(_scenario(tmp_path, jobs, [down]), "ideal").faults
    assert f["job_stall_us"] == {} and f["recovery_us"] == pytest.approx(2_000, abs=1)


def test_a_stall_under_overlapping_faults_is_charged_once(tmp_path: Path) -> None:
    """Two 2-GPU rings between leaf0 and leaf1 (4 spines), hashed onto spine0 and spine1;
    leaf0-spine0 is down from 2 ms and leaf1-spine1 from 3 ms, both until 12 ms (routing
    converges 2.1 ms after each, retransmission timer 1 ms). Each ring is held up exactly
    by its stall, so the stall the faults charge a ring, added over them, is how much later
    it ends than without the faults, and the GPU time lost is 2 GPUs x that (the 0.9 ms both
    faults stalled one ring was charged to each)."""
    data: dict[str, Any] = {
        "name": "overlap", "seed": 3,
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "jobs": [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": ids,
                  "iterations": 1, "collectives": [{"op": "allreduce", "size_bytes": 1 << 30,
                                                    "algorithm": "ring"}]}
                 for n, ids in (("jobA", [0, 4]), ("jobB", [1, 5]))],
        "faults": {"detection_delay_ns": 100_000, "convergence_delay_ns": 2_000_000,
                   "rdma_timeout_ns": 1_000_000, "events": [
                       {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 2_000_000,
                        "until_ns": 12_000_000},
                       {"kind": "link_down", "link": "leaf1-spine1", "at_ns": 3_000_000,
                        "until_ns": 12_000_000}]},
    }

    def run(shift_ns: int) -> Any:
        for ev in data["faults"]["events"]:
            ev["at_ns"] += shift_ns
            ev["until_ns"] += shift_ns
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        return run_policy(prepare(load_scenario(path), str(path)), "ecmp")

    hit = run(0)
    clean = run(900_000_000)
    stall_us: Counter[str] = Counter()
    for f in hit.faults:
        stall_us.update(f["job_stall_us"])
    late_us = {c.job: (c.end_ns - c0.end_ns) / 1e3
               for c, c0 in zip(hit.collectives, clean.collectives, strict=True)}
    assert set(stall_us) == {"jobA", "jobB"}
    for job, us in stall_us.items():
        assert us == pytest.approx(late_us[job], abs=2)
    assert sum(f["gpu_seconds_lost"] for f in hit.faults) == pytest.approx(
        2 * sum(stall_us.values()) * 1e-6, rel=1e-6)


def test_ecmp_hashes_a_stream_back_onto_a_repaired_link(tmp_path: Path) -> None:
    """Two 2-GPU rings between the two leaves of a 2-spine leaf-spine, 1 GiB each (1 094 189
    056 wire bytes a direction), hashed onto spine0 (a) and spine1 (b). leaf0-spine0 is
    down from 2 to 10 ms (seen 100 us later, routing converges 2 ms after that, timer
    1 ms). a loses packets from 2 ms, is rehashed onto spine1 at 4.1 ms and resends at its
    next timer, 5 ms; a and b share spine1 at 25 GB/s each until routing converges on the
    repair, 12.1 ms, when the same hash over the whole group puts a back on spine0. So a
    has sent 100 MB + 7.1 ms x 25 GB/s by 12.1 ms and ends at 12.1 + 816.7 MB / 50 GB/s =
    28.434 ms, b (250 MB by 5 ms) at 25.434 ms, plus the last message's latency (kept on
    spine1, a ended at 41.8 ms)."""
    data: dict[str, Any] = {
        "name": "back", "seed": 3,
        "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                     "nics_per_leaf": 2, "rail_optimized": False},
        "jobs": [{"name": n, "gpus": 2, "placement": "explicit", "gpu_ids": ids,
                  "iterations": 1, "collectives": [{"op": "allreduce", "size_bytes": 1 << 30,
                                                    "algorithm": "ring"}]}
                 for n, ids in (("a", [0, 2]), ("b", [1, 3]))],
        "faults": {"detection_delay_ns": 100_000, "convergence_delay_ns": 2_000_000,
                   "rdma_timeout_ns": 1_000_000, "events": [
                       {"kind": "link_down", "link": "leaf0-spine0", "at_ns": 2_000_000,
                        "until_ns": 10_000_000}]},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_policy(prepare(load_scenario(path), str(path)), "ecmp")
    wire = 1_094_189_056
    rate = NIC_GBPS / 8  # bytes per ns
    shared_ns = 12_100_000 - 5_000_000
    end_a = 12_100_000 + (wire - 2_000_000 * rate - shared_ns * rate / 2) / rate
    end_b = 12_100_000 + (wire - 5_000_000 * rate - shared_ns * rate / 2) / rate
    ends = {c.job: c.end_ns for c in r.collectives}
    assert ends["a"] == pytest.approx(end_a, abs=20_000)
    assert ends["b"] == pytest.approx(end_b, abs=20_000)


def test_ideal_sprays_streams_that_started_during_a_fault_over_the_repaired_link(
        tmp_path: Path) -> None:
    """A 16-GPU AlltoAll on a 2:1 leaf-spine (4 GPUs a leaf, 2 spines) starts at 0.5 ms
    while leaf0-spine1 is down (0.1 to 1.0 ms): ideal sprays it over the one spine leaf0
    has left. Once routing has the link back (50 us on) its streams spray over both again:
    leaf0's traffic, the bottleneck, moves at half rate for ~0.55 ms, so the AlltoAll takes
    at most ~0.3 ms longer than with the fault over before it starts (it took twice as
    long, as if the link never came back)."""
    def run(until_ns: int) -> int:
        data = {
            "name": "t3", "seed": 1,
            "topology": {"kind": "leaf_spine", "hosts": 16, "gpus_per_host": 1,
                         "nics_per_leaf": 4, "oversubscription": 2.0,
                         "rail_optimized": False},
            "jobs": [{"name": "a2a", "gpus": 16, "start_ns": 500_000, "iterations": 1,
                      "collectives": [{"op": "alltoall", "size_bytes": 256 << 20}]}],
            "faults": {"detection_delay_ns": 10_000, "convergence_delay_ns": 50_000,
                       "events": [{"kind": "link_down", "link": "leaf0-spine1",
                                   "at_ns": 100_000, "until_ns": until_ns}]},
        }
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        return _coll_ns(prepare(load_scenario(path), str(path)), "ideal")

    before = run(400_000)  # (over before the AlltoAll starts)
    during = run(1_000_000)
    assert before < during <= before + 350_000, (before, during)



@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "sla-aware", "ideal"])
def test_a_job_no_route_reaches_is_named_by_the_faults_that_cut_it(tmp_path: Path,
                                                                     policy: str) -> None:
    """Both uplinks of leaf0 die for good (two faults) and leaf3 -> spine1 dies too, all
    before the job on gpu0 (leaf0) and gpu2 (leaf1) starts: routing finds it no path, and
    it is stopped. The two uplinks cut it (every fewest-hop path from leaf0 to leaf1
    takes one); leaf3's link lies on none of them and names no job (it named this one,
    as every fault down then). A job a fault cut off is among the jobs it hit."""
    job = {"name": "j0", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
           "start_ns": 1_000_000, "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}
    events = [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": 0},
              {"kind": "link_down", "link": "leaf0-spine1", "at_ns": 0},
              {"kind": "link_down", "link": "leaf3-spine1", "at_ns": 0}]
    r = run_policy(_scenario(tmp_path, [job], events, detection_delay_ns=0,
                             convergence_delay_ns=0), policy)
    assert r.aborted["j0"] in {"gpu0 -> gpu2 has no path left",  # (both ways are cut)
                               "gpu2 -> gpu0 has no path left"}
    assert [f["partitioned"] for f in r.faults] == [["j0"], ["j0"], []]
    assert [f["jobs_hit"] for f in r.faults] == [["j0"], ["j0"], []]


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "sla-aware", "ideal", "task-aware"])
def test_a_running_job_cut_off_is_named_by_every_fault_that_cut_it(tmp_path: Path,
                                                                   policy: str) -> None:
    """As above, but the three links die under the running job (gpu0 on leaf0 -> gpu2 on
    leaf1): its streams were on one of leaf0's uplinks, yet either uplink's repair would
    give it a path, so both faults name it (only the one under its streams did). Its
    pause for the controller's new paths is charged to the faults it waits for, not to
    leaf3's (a job on gpus 5 and 7, leaf2 and leaf3, may cross that one: it is never cut
    off)."""
    jobs = [{"name": "j0", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
             "collectives": [{"op": "allreduce", "size_bytes": "256MiB"}]},
            {"name": "j1", "gpus": 2, "placement": "explicit", "gpu_ids": [5, 7],
             "collectives": [{"op": "allreduce", "size_bytes": "64MiB"}]}]
    events = [{"kind": "link_down", "link": link, "at_ns": 200_000}
              for link in ("leaf0-spine0", "leaf0-spine1", "leaf3-spine1")]
    r = run_policy(_scenario(tmp_path, jobs, events, detection_delay_ns=0,
                             convergence_delay_ns=0), policy)
    assert set(r.aborted) == {"j0"}
    assert [f["partitioned"] for f in r.faults] == [["j0"], ["j0"], []]
    assert "j0" not in r.faults[2]["jobs_hit"]
    assert "j0" not in r.faults[2]["job_stall_us"]


@pytest.mark.parametrize("policy", ["ecmp", "adaptive", "sla-aware", "ideal", "task-aware"])
def test_a_job_waiting_for_a_repair_is_the_stall_of_the_faults_that_cut_it(
        tmp_path: Path, policy: str) -> None:
    """As above, with leaf0 -> spine0 back at 3 ms: the job (gpu0 -> gpu2, from 1 ms) has
    no path until then and waits for that repair (routing converges at once), then runs.
    Its 2 ms wait is a stall of the uplink faults, charged once, to the first of them
    (both began at 0: #0), on its 2 GPUs: 0.004 GPU-s; under the controller its new paths
    come a control-channel latency later. It was charged to no fault, and no fault named
    it, when routing found it no path (not so under the controller)."""
    job = {"name": "j0", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 2],
           "start_ns": 1_000_000, "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}
    events = [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": 0,
               "until_ns": 3_000_000},
              {"kind": "link_down", "link": "leaf0-spine1", "at_ns": 0},
              {"kind": "link_down", "link": "leaf3-spine1", "at_ns": 0}]
    r = run_policy(_scenario(tmp_path, [job], events, detection_delay_ns=0,
                             convergence_delay_ns=0), policy)
    assert not r.aborted
    wait_us = (3_000_000 - 1_000_000 + (CONTROL_NS if policy == "task-aware" else 0)) / 1e3
    # (then it runs as on the intact fabric)
    clean_ns = _coll_ns(_scenario(tmp_path, [job], []), policy)
    (c,) = r.collectives
    assert c.end_ns - c.start_ns == pytest.approx(wait_us * 1e3 + clean_ns, abs=2)
    assert [f["partitioned"] for f in r.faults] == [["j0"], ["j0"], []]
    assert [f["jobs_hit"] for f in r.faults] == [["j0"], ["j0"], []]
    assert r.faults[0]["job_stall_us"] == {"j0": pytest.approx(wait_us, abs=0.002)}
    assert r.faults[0]["gpu_seconds_lost"] == pytest.approx(2 * wait_us * 1e-6, abs=1e-8)
    assert r.faults[1]["job_stall_us"] == r.faults[2]["job_stall_us"] == {}


@pytest.mark.parametrize("policy", ["ideal", "task-aware"])
def test_a_fault_on_a_cut_pair_s_paths_whose_repair_would_not_help_is_not_named(
        tmp_path: Path, policy: str) -> None:
    """spine0 <-> leaf3 dies at 100 us, then leaf2 (gpus 4 and 5) from 200 us to 2 ms,
    under an 8-GPU ring. The ring waits for leaf2. The link lies on the paths of the ring's
    pair gpu5 (leaf2) -> gpu6 (leaf3), but its repair alone would give that pair no path:
    only leaf2's would (through spine1), so only leaf2 cut the ring off (both were named,
    and the ring's whole wait went to the link, the fault that began first). Under
    ``ideal`` (rerouted at once) the wait is exactly leaf2's outage: 1800 us."""
    ring = {**RING, "collectives": [{"op": "allreduce", "size_bytes": "16MiB"}]}
    events = [{"kind": "switch_down", "switch": "leaf2", "at_ns": 200_000,
               "until_ns": 2_000_000},
              {"kind": "link_down", "link": "leaf3-spine0", "at_ns": 100_000}]
    r = run_policy(_scenario(tmp_path, [ring], events), policy)
    leaf2, link = r.faults
    assert (leaf2["partitioned"], link["partitioned"]) == (["ring"], [])
    if policy == "ideal":
        assert leaf2["job_stall_us"] == {"ring": pytest.approx(1800.0)}
        assert link["job_stall_us"] == {}
