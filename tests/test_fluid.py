"""The fluid model against behaviour derived independently: line rate alone, DCQCN fair share
with a queue inside [Kmin, Kmax], incast under PFC (no drops, pauses upstream, a head-of-line
victim that another priority protects), incast without PFC (drops, go-back-N), a cyclic
buffer dependency detected as a deadlock, a misconfigured hop breaking lossless, and
agreement with the flow-level model where nothing queues."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest

from conftest import p2p_job
from fabricpilot.balancing import PolicyContext, make_policy
from fabricpilot.balancing.explicit import ExplicitPaths
from fabricpilot.dataplane import (
    DcqcnParams,
    Engine,
    EngineOutput,
    FabricParams,
    FluidParams,
    FluidRateModel,
    PfcParams,
    QosParams,
)
from fabricpilot.dataplane.params import EcnParams
from fabricpilot.errors import SimulationError
from fabricpilot.topology import compile_topology, leaf_spine
from fabricpilot.topology.model import LinkKind, NodeKind, Topology
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec

WIRE = (4096 + 78) / 4096  # wire bytes per payload byte (full packets)


def p2p(name: str, pairs: list[tuple[int, int]], size: int, **kw: object) -> JobSpec:
    """A job whose only 'collective' is a set of independent point-to-point transfers."""
    return p2p_job(name, pairs, size, **kw)


def run(ct, jobs, policy="ecmp", paths=None, **model_kw) -> EngineOutput:  # type: ignore[no-untyped-def]
    ctx = PolicyContext(ct, 1, 600, member_routes=True)
    pol = ExplicitPaths(ctx, paths) if paths is not None else make_policy(policy, ctx)
    model = FluidRateModel(ct, FabricParams(), **model_kw)
    return Engine(ct, pol, jobs, rate_model=model).run()


def throughput_gbps(out: EngineOutput, i: int) -> float:
    f = out.flows
    return float(f["wire_bytes"][i] * 8 / (f["end_send_ns"][i] - f["start_ns"][i]))


@pytest.fixture(scope="module")
def one_leaf():  # type: ignore[no-untyped-def]
    return compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=16))


def test_single_flow_reaches_line_rate(one_leaf) -> None:  # type: ignore[no-untyped-def]
    out = run(one_leaf, [p2p("one", [(0, 1)], 64 << 20)])
    assert throughput_gbps(out, 0) == pytest.approx(400, rel=0.01)
    assert out.model_report.ecn_marks == 0 and out.model_report.pause_frames == 0


def test_two_dcqcn_flows_share_fairly_with_queue_in_marking_band(one_leaf) -> None:  # type: ignore[no-untyped-def]
    ecn = EcnParams()
    out = run(one_leaf, [p2p("two", [(0, 2), (1, 2)], 320 << 20)],
              fluid=FluidParams(sample_interval_ns=20_000))
    t = [throughput_gbps(out, i) for i in range(2)]
    assert t[0] == pytest.approx(t[1], rel=0.10)
    # the bottleneck (leaf -> gpu2), sampled, over the second half of the run: once DCQCN
    # has converged it is busy and its queue sits in the marking band
    rep = out.model_report
    ct = one_leaf
    link = ct.gpu_down[2]
    cols = rep.timeseries.columns()
    times, links, queue = cols["time_ns"], cols["link"], cols["queue_bytes"]
    late = (links == link) & (times > times.max() / 2)
    assert late.sum() > 20
    util = cols["utilization"]
    assert util[late].mean() > 0.9
    assert ecn.kmin_bytes <= queue[late].mean() <= ecn.kmax_bytes
    assert np.percentile(queue[late], 95) <= ecn.kmax_bytes
    assert rep.drops_bytes == 0


@pytest.fixture(scope="module")
def two_tier():  # type: ignore[no-untyped-def]
    # 4 leaves x 8 hosts, 8 spines, one GPU per host
    return compile_topology(leaf_spine(hosts=32, gpus_per_host=1, nics_per_leaf=8,
                                       rail_optimized=False))


INCAST = [(s, 0) for s in range(8, 24)]  # 16 senders on leaves 1 and 2 -> gpu0 on leaf 0
VICTIM = (24, 1)                          # leaf 3 -> gpu1 on leaf 0: shares only spine links


def test_incast_with_pfc_pauses_upstream_without_drops_and_hurts_a_victim(two_tier) -> None:  # type: ignore[no-untyped-def]
    ct = two_tier
    size = 4 << 20
    alone = run(ct, [p2p("victim", [VICTIM], size)])
    both = run(ct, [p2p("incast", INCAST, size), p2p("victim", [VICTIM], size)])
    rep = both.model_report
    assert rep.drops_bytes == 0 and rep.retransmitted_bytes == 0
    assert rep.pause_frames > 0
    # pauses sit upstream of the bottleneck (leaf0 -> gpu0): on spine -> leaf0 links
    paused = rep.port_pause_ns.sum(axis=1) > 0
    names = [ct.link_name(i) for i in np.flatnonzero(paused)]
    assert any(n.startswith("spine") and n.endswith("->leaf0") for n in names)
    assert ct.link_name(int(ct.gpu_down[0])) not in names  # the host never pauses the leaf
    v_alone = throughput_gbps(alone, 0)
    victim_row = int(np.flatnonzero(both.flows["owner"] == 1)[0])
    v_both = throughput_gbps(both, victim_row)
    assert v_alone == pytest.approx(400, rel=0.02)
    assert v_both < 0.7 * v_alone  # head-of-line blocked behind paused spine egress queues

    # the same victim in another priority (control: not lossless, so never paused, and
    # above RDMA in the strict scheduler) keeps its speed through the paused spine ports
    other = run(ct, [p2p("incast", INCAST, size),
                     p2p("victim", [VICTIM], size, traffic_class="control")])
    v_other = throughput_gbps(other, int(np.flatnonzero(other.flows["owner"] == 1)[0]))
    assert v_other > 0.9 * v_alone


def test_incast_without_pfc_drops_and_retransmits(two_tier) -> None:  # type: ignore[no-untyped-def]
    out = run(two_tier, [p2p("incast", INCAST, 4 << 20)], pfc=PfcParams(enabled=False))
    rep = out.model_report
    assert rep.pause_frames == 0 and rep.pfc_pause_ns_total == 0
    assert rep.drops_bytes > 0
    assert rep.retransmitted_bytes >= rep.drops_bytes
    assert out.flows["retx_bytes"].sum() == pytest.approx(rep.retransmitted_bytes)
    # every byte still arrives
    assert len(out.collectives) == 1


def test_misconfigured_hop_loses_lossless(two_tier) -> None:  # type: ignore[no-untyped-def]
    # leaf0 maps the RDMA DSCP to a lossy priority: PFC no longer protects the incast there
    qos = QosParams(switch_overrides={"leaf0": {26: 0}})
    out = run(two_tier, [p2p("incast", INCAST, 4 << 20)], qos=qos,
              fluid=FluidParams(buffer_bytes_per_port=1 << 20))
    assert out.model_report.drops_bytes > 0


def ring_topology() -> Topology:
    """Three switches in a ring, two GPUs on each (gpu 2i and 2i+1 on switch i)."""
    g = nx.Graph()
    for i in range(3):
        g.add_node(f"sw{i}", kind=NodeKind.SWITCH, tier=1, role="leaf")
        for j in (2 * i, 2 * i + 1):
            g.add_node(f"gpu{j}", kind=NodeKind.GPU, gpu=j, host=j, local_rank=0, rail=0)
            g.add_edge(f"gpu{j}", f"sw{i}", kind=LinkKind.NIC, rate_gbps=400.0, delay_ns=100)
    for i in range(3):
        g.add_edge(f"sw{i}", f"sw{(i + 1) % 3}", kind=LinkKind.FABRIC, rate_gbps=400.0,
                   delay_ns=100)
    return Topology(g, "ring-3", 1)


def test_cyclic_buffer_dependency_is_a_deadlock() -> None:
    ct = compile_topology(ring_topology())
    nid = ct.node_index
    lid = ct.link_id

    def path(*nodes: str) -> list[int]:
        return [lid[(nid[a], nid[b])] for a, b in itertools.pairwise(nodes)]

    # both GPUs of every switch send two hops clockwise (a detour: the direct link exists).
    # Each ring link then carries transit traffic whose next hop is the next ring link, so
    # the three switches' buffers wait on each other in a cycle.
    loop = {}
    for i in range(3):
        a, b, c = f"sw{i}", f"sw{(i + 1) % 3}", f"sw{(i + 2) % 3}"
        for j in (2 * i, 2 * i + 1):
            dst = 2 * ((i + 2) % 3)
            loop[(j, dst)] = path(f"gpu{j}", a, b, c, f"gpu{dst}")
    jobs = [p2p("loop", list(loop), 32 << 20)]
    no_cc = DcqcnParams(enabled=False)
    out = run(ct, jobs, paths=loop, dcqcn=no_cc)
    rep = out.model_report
    assert rep.deadlocks >= 1
    dl = next(e for e in rep.events if e.kind == "deadlock")
    assert {p.split(" ")[0] for p in dl.ports} == {"sw0->sw1", "sw1->sw2", "sw2->sw0"}
    assert dl.cleared_by_watchdog and len(out.collectives) == 1
    assert rep.retransmitted_bytes > 0  # the watchdog dropped the stuck queues
    # what the watchdog dropped is lost like any loss: what was sent after it crosses to the
    # receivers and is discarded, so their links carry every byte not dropped
    down = sum(float(out.link_bytes[int(ct.gpu_down[d])]) for d in np.unique(out.flows["dst"]))
    wire = float(out.flows["wire_bytes"].sum())
    assert down == pytest.approx(wire + rep.retransmitted_bytes - rep.drops_bytes, rel=1e-9)

    # the same flows on their direct (shortest) paths: no cycle, no deadlock
    direct = {k: [v[0], lid[(nid[f"sw{k[0] // 2}"], nid[f"sw{k[1] // 2}"])], v[-1]]
              for k, v in loop.items()}
    out = run(ct, jobs, paths=direct, dcqcn=no_cc)
    assert out.model_report.deadlocks == 0
    assert out.model_report.pause_frames > 0  # congested and paused, but not stuck

    # without the PFC watchdog the deadlock never clears: reported, not a hang
    with pytest.raises(SimulationError, match="deadlock"):
        run(ct, jobs, paths=loop, dcqcn=no_cc, pfc=replace(PfcParams(), watchdog=False))


@pytest.mark.parametrize("op,size", [("allreduce", 256 << 20), ("alltoall", 64 << 20)])
def test_fluid_agrees_with_flow_level_when_nothing_queues(one_leaf, op: str, size: int) -> None:  # type: ignore[no-untyped-def]
    ranks = np.arange(8)
    plan = build_collective(op, ranks, size)
    job = JobSpec(op, tuple(range(8)), (plan,))
    ctx = PolicyContext(one_leaf, 1, 600, member_routes=True)
    flow = Engine(one_leaf, make_policy("ecmp", ctx), [job]).run()
    fluid = Engine(one_leaf, make_policy("ecmp", ctx), [job],
                   rate_model=FluidRateModel(one_leaf)).run()
    t_flow, t_fluid = flow.collectives[0].time_ns, fluid.collectives[0].time_ns
    assert t_fluid == pytest.approx(t_flow, rel=0.05)
    # and both approach the bound: the busiest NIC's wire bytes at line rate
    busiest = max(plan.stages[0].size_bytes) * WIRE
    if op == "alltoall":
        busiest = 7 * math.ceil(size / 8) * WIRE
    assert t_flow >= busiest * 8 / 400


def test_a_transfer_shorter_than_a_step_takes_its_own_time(one_leaf) -> None:  # type: ignore[no-untyped-def]
    """4 KiB alone on one leaf: 4174 wire bytes at 50 B/ns, 84 ns, then the message latency
    of one switch (2 x 100 ns links + 600 ns switch + 1000 ns NIC), 1884 ns in both models;
    the fluid model's first step used to be a whole ``step_ns`` (500 ns): 2300 ns. A ring
    AllReduce of 48 KiB in steps on 6 GPUs: 2 x 5 steps of 8 KiB (2 packets, 8348 wire
    bytes, 167 ns) and 1800 ns each, in both models (the fluid one took 17 % longer)."""
    small = Engine(one_leaf, make_policy("ecmp", PolicyContext(one_leaf, 1, 600,
                                                               member_routes=True)),
                   [p2p("small", [(0, 1)], 4096)], rate_model=FluidRateModel(one_leaf)).run()
    assert small.flows["deliver_ns"][0] - small.flows["start_ns"][0] == 84 + 1800
    plan = build_collective("allreduce", np.arange(6), 48 << 10, algorithm="ring",
                            mode="steps")
    job = JobSpec("ring", tuple(range(6)), (plan,))
    ctx = PolicyContext(one_leaf, 1, 600, member_routes=True)
    t = [Engine(one_leaf, make_policy("ecmp", ctx), [job], rate_model=model).run()
         .collectives[0].time_ns for model in (None, FluidRateModel(one_leaf))]
    assert t == [10 * (1800 + math.ceil((8192 + 2 * 78) / 50))] * 2


def test_longer_steps_do_not_change_a_congested_run(two_tier) -> None:  # type: ignore[no-untyped-def]
    # the adaptive step must give the result of the fixed small step (its reference): a PFC
    # incast with a victim, then AlltoAll and a ring on a 2:1 fabric (ECN, DCQCN, some PFC)
    over = compile_topology(leaf_spine(hosts=32, gpus_per_host=1, nics_per_leaf=8,
                                       rail_optimized=False, oversubscription=2))
    ring = build_collective("allreduce", np.random.default_rng(1).permutation(32), 32 << 20,
                            gpus_per_host=1, algorithm="ring")
    a2a = build_collective("alltoall", np.arange(32), 4 << 20, gpus_per_host=1)
    cases = [
        (two_tier, [p2p("incast", INCAST[:8], 2 << 20), p2p("victim", [VICTIM], 8 << 20)]),
        (over, [JobSpec("a2a", a2a.ranks, (a2a,))]),
        (over, [JobSpec("ring", ring.ranks, (ring,))]),
    ]
    for ct, jobs in cases:
        fixed = run(ct, jobs, fluid=FluidParams(max_quiet_step_ns=500, max_busy_step_ns=500))
        adaptive = run(ct, jobs)
        assert adaptive.model_report.pause_frames > 0
        for a, b in zip(fixed.collectives, adaptive.collectives, strict=True):
            assert b.time_ns == pytest.approx(a.time_ns, rel=0.02)


def test_a_nic_holds_one_step_over_all_its_members_however_they_are_sprayed() -> None:
    """The NIC's transmit pipeline holds about one base step at line rate (400 Gb/s x
    500 ns = 25 000 bytes) over all the members it sends, not one step per member: a flow
    sprayed over the 4 spines (``ideal``: 4 members) neither stands 4x the bytes at its NIC
    nor finishes later than the same flow on one path (ECMP), with no congestion anywhere."""
    from fabricpilot.runner import prepare, run_policy
    from fabricpilot.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "name": "nic-hold", "seed": 1,
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "fabric": {"model": "fluid", "dcqcn": {"enabled": False}},
        "jobs": [{"name": "pair", "gpus": 2, "placement": "explicit", "gpu_ids": [0, 4],
                  "collectives": [{"op": "alltoall", "size_bytes": "16MiB"}]}],
    }, "nic-hold.yaml")
    prep = prepare(sc, "nic-hold.yaml")
    runs = {p: run_policy(prep, p) for p in ("ecmp", "ideal")}
    for res in runs.values():
        assert res.model_report is not None
        cols = res.model_report.timeseries.columns()
        nic = np.array([res.link_names[int(lk)].startswith("gpu") for lk in cols["link"]])
        assert nic.any() and cols["queue_bytes"][nic].max() <= 25_000 * (1 + 1e-9)
    assert runs["ideal"].sim_time_ns == runs["ecmp"].sim_time_ns


def test_go_back_n_keeps_what_was_queued_ahead_of_the_loss() -> None:
    """One sender: 100 B in its NIC, 500 B queued at the leaf, and 50 B / 200 B arriving
    there in a step; the leaf's lossy port holds 600 B, so half of the 200 B is dropped.
    The 500 B queued at the leaf went ahead of the loss and are delivered. The other 100 B
    arriving at the drop hop were sent after the loss: they go on and are discarded by the
    receiver (junk). The NIC's 150 B were not on the wire yet: they go back to the sender
    (un-injected), to be sent, as junk, until the NACK is back (one RTT, 3000 ns, after the
    NACK delay: at 13 000 ns); then the sender goes back to the loss and sends the 100 B
    lost and the 100 B of junk again, 200 B, and what it sent while waiting. A second loss
    of 20 B while the junk is on its way is junk lost: nothing more is sent again. (The
    500 B were once thrown away with the rest: 8 senders into a port with PFC off resent
    8.4 MB of 32 MiB and finished in 1.19 ms; and the bytes sent after a loss once left
    the fabric at once, loading no link on their way: a lossy incast finished as if
    lossless.)"""
    from fabricpilot.dataplane import fluid_kernels as fk

    back = np.array([[100.0, 500.0]])
    arr = np.array([[50.0, 200.0]])
    injected = np.array([1000.0])
    junk, rewind, nack_at, drops = np.zeros(1), np.zeros(1), np.full(1, -np.inf), np.zeros(2)
    args = (np.array([[0, 1]]), np.array([2]), np.array([[False, True]]), np.array([[0, 0]]),
            np.array([False, True]), 600.0, 1e12, 1, injected, junk, rewind, nack_at,
            np.array([3000.0]), 10_000.0, drops)
    dropped = fk._drop(back, arr, *args)
    assert dropped == 100.0
    assert back.tolist() == [[0.0, 500.0]] and arr.tolist() == [[0.0, 100.0]]
    assert injected.tolist() == [850.0]
    assert junk.tolist() == [100.0] and rewind.tolist() == [200.0]
    assert nack_at.tolist() == [13_000.0] and drops.tolist() == [0.0, 100.0]
    # the next step: 560 B queued at the leaf, 60 B arriving: 20 over, a third of 60 B
    back, arr = np.array([[0.0, 560.0]]), np.array([[0.0, 60.0]])
    assert fk._drop(back, arr, *args) == pytest.approx(20.0)
    assert junk.tolist() == [pytest.approx(80.0)] and rewind.tolist() == [200.0]
    assert injected.tolist() == [850.0]


def test_a_lossy_incast_carries_what_it_sends_again_through_the_receivers_link(
        two_tier) -> None:  # type: ignore[no-untyped-def]
    """16 senders of 4 MiB into one 400 Gb/s port with PFC off: every byte a sender puts
    on the wire, once or again, either is dropped or crosses the receiver's link (the
    bytes sent after a loss arrive and are discarded: go-back-N). So that link carries the
    flows' wire bytes plus those resent less those dropped, and the incast takes at least
    that over 50 GB/s, longer than its lossless bound."""
    out = run(two_tier, [p2p("incast", INCAST, 4 << 20)], pfc=PfcParams(enabled=False))
    rep = out.model_report
    wire = float(out.flows["wire_bytes"].sum())
    down = float(out.link_bytes[int(two_tier.gpu_down[0])])
    assert rep.drops_bytes > 0 and rep.retransmitted_bytes > rep.drops_bytes
    assert down == pytest.approx(wire + rep.retransmitted_bytes - rep.drops_bytes, rel=1e-6)
    assert down > 1.05 * wire
    assert out.sim_time_ns >= down / 50.0


def test_a_lossy_incast_into_a_small_buffer_completes(one_leaf) -> None:  # type: ignore[no-untyped-def]
    """2 -> 1 of 1 MiB each into a 64 KiB lossy port: while a sender waits for its NACK the
    model keeps to its base step (a 20 us step sent 20 us of line rate into 64 KiB and
    dropped the rest, every step, and the incast never finished). Every byte not dropped
    crosses the receiver's link, and the incast takes at least that over 50 GB/s."""
    out = run(one_leaf, [p2p("i", [(1, 0), (2, 0)], 1 << 20)], pfc=PfcParams(enabled=False),
              fluid=FluidParams(buffer_bytes_per_port=64 << 10))
    rep = out.model_report
    wire = float(out.flows["wire_bytes"].sum())
    down = float(out.link_bytes[int(one_leaf.gpu_down[0])])
    assert len(out.collectives) == 1 and rep.drops_bytes > 0
    assert down == pytest.approx(wire + rep.retransmitted_bytes - rep.drops_bytes, rel=1e-6)
    assert out.sim_time_ns >= down / 50.0


def test_ecn_thresholds_scaled_to_the_port_rate_keep_a_400g_incast_near_line_rate(
        one_leaf) -> None:  # type: ignore[no-untyped-def]
    """Two 64 MiB flows into one 400 Gb/s port: at line rate the port takes 2 x 64 MiB of
    wire bytes / 50 GB/s. With the paper's 40 Gb/s thresholds (kmax 200 KiB), the queue
    passes kmax in 4 us, before the first CNP is back, every packet is marked and DCQCN cuts
    the flows several times over; with the thresholds scaled to the port (x10: kmin 50 KiB,
    kmax 2000 KiB) the first CNPs come back at a marking probability of about 0.1 % and the
    port stays above 90 % busy, its queue below its kmax."""
    size = 64 << 20
    bound_ns = 2 * size * WIRE / 50.0
    scaled = EcnParams(reference_gbps=40.0)
    kmin, kmax = (float(x[0]) for x in scaled.thresholds(np.array([400.0])))
    assert (kmin, kmax) == (51200.0, 2048000.0)
    out = run(one_leaf, [p2p("two", [(0, 2), (1, 2)], size)], ecn=scaled,
              fluid=FluidParams(sample_interval_ns=20_000))
    assert bound_ns / out.sim_time_ns > 0.9
    assert throughput_gbps(out, 0) == pytest.approx(throughput_gbps(out, 1), rel=0.05)
    cols = out.model_report.timeseries.columns()
    on = cols["link"] == one_leaf.gpu_down[2]
    assert cols["queue_bytes"][on].max() < kmax and out.model_report.drops_bytes == 0
    same = run(one_leaf, [p2p("two", [(0, 2), (1, 2)], size)])  # (the paper's values)
    assert same.sim_time_ns > out.sim_time_ns


def test_ecn_marks_count_packets_not_mtus_of_wire_bytes(one_leaf) -> None:  # type: ignore[no-untyped-def]
    """A 4 -> 1 incast of 16 MiB each, DCQCN off: the port into gpu0 queues past kmax for
    most of the run and marks nearly every packet, so its marks approach the 4 x 16 MiB /
    4096 B = 16 384 packets it serves, and never exceed them (counted per 4096 B of wire
    bytes, 4174 B a packet, they came to 16 626: more marks than packets)."""
    jobs = [p2p("incast", [(i, 0) for i in range(1, 5)], 16 << 20)]
    out = run(one_leaf, jobs, dcqcn=DcqcnParams(enabled=False))
    packets = 4 * (16 << 20) // 4096
    assert 0.9 * packets < out.model_report.ecn_marks <= packets


def test_a_sprayed_qp_reacts_to_congestion_as_one_qp() -> None:
    """A QP sprayed over every spine (``ideal``) is one QP: one DCQCN state, cut as a whole
    by each CNP, whichever path's packets were marked. In a 2:1 incast across leaves with
    DCQCN on, only the last hop (leaf0 -> gpu0) ever queues, so spraying each sender's QP
    over the 8 spines must give what each on one spine of its own gives: the same rates,
    the same marks, no pause. (With a DCQCN state per path, a CNP slowed one eighth of the
    QP: the senders answered the marks 8x too weakly; here 9.2x the marks, 50 pause frames
    and 2.5 % longer.)"""
    ct = compile_topology(leaf_spine(hosts=16, gpus_per_host=1, nics_per_leaf=8,
                                     rail_optimized=False))
    lid, nid = ct.link_id, ct.node_index

    def via(src: int, spine: int) -> list[int]:
        nodes = [f"gpu{src}", "leaf1", f"spine{spine}", "leaf0", "gpu0"]
        return [lid[(nid[a], nid[b])] for a, b in itertools.pairwise(nodes)]

    pairs = [(8, 0), (9, 0)]
    jobs = [p2p("incast", pairs, 64 << 20)]
    one = run(ct, jobs, paths={(8, 0): via(8, 0), (9, 0): via(9, 1)})
    sprayed = run(ct, jobs, policy="ideal")
    for out in (one, sprayed):
        assert out.model_report.pause_frames == 0 and out.model_report.drops_bytes == 0
        assert out.model_report.ecn_marks > 100  # (the last hop does queue and mark)
    assert sprayed.model_report.ecn_marks == pytest.approx(one.model_report.ecn_marks,
                                                           rel=1e-3)
    for i in range(2):
        assert throughput_gbps(sprayed, i) == pytest.approx(throughput_gbps(one, i), rel=1e-4)
