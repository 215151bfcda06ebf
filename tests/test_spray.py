"""Packet spraying against derived outcomes: with equal path delays it is the spraying bound
and reorders nothing; with unequal delays an out-of-order NIC still runs at the bound (but sees
reordering) while a standard go-back-N NIC resends most of what it sends and falls far below
ECMP, by exactly the efficiency of the packet-level calculation."""

from __future__ import annotations

import pytest

from conftest import p2p_job
from fabricpilot.balancing import PolicyContext, make_policy
from fabricpilot.balancing.spray import MTU_WIRE_BYTES, go_back_n
from fabricpilot.dataplane import Engine
from fabricpilot.topology import compile_topology, leaf_spine
from fabricpilot.workload.jobs import JobSpec

SIZE = 16 << 20
PAIRS = [(0, 2), (1, 3)]  # leaf0 -> leaf1, two flows, two spines


def p2p(pairs: list[tuple[int, int]], size: int) -> JobSpec:
    return p2p_job("p2p", pairs, size)


def fabric(spine1_link_ns: int):  # type: ignore[no-untyped-def]
    ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    for i in range(ct.n_links):
        if "spine1" in ct.link_name(i):
            ct.delay_ns[i] = spine1_link_ns
    return ct


def run(ct, policy: str):  # type: ignore[no-untyped-def]
    return Engine(ct, make_policy(policy, PolicyContext(ct, 1, 600)), [p2p(PAIRS, SIZE)]).run()


def test_equal_delays_spray_is_the_bound_and_in_order() -> None:
    ct = fabric(100)
    ideal = run(ct, "ideal").collectives[0].time_ns
    for pol in ("spray", "spray-ooo"):
        out = run(ct, pol)
        assert out.collectives[0].time_ns == ideal
        assert out.flows["reorder_events"].sum() == 0 and out.flows["retx_bytes"].sum() == 0


def test_unequal_delays_standard_nic_collapses_below_ecmp() -> None:
    ct = fabric(1000)  # spine1's two links are 900 ns slower each: 1.8 us of spread
    ecmp, ideal = run(ct, "ecmp"), run(ct, "ideal")
    ooo, gbn = run(ct, "spray-ooo"), run(ct, "spray")
    # out-of-order NIC: the bound, but the reordering is there
    assert ooo.collectives[0].time_ns == ideal.collectives[0].time_ns
    assert ooo.flows["reorder_events"].sum() > 0 and ooo.flows["retx_bytes"].sum() == 0
    # standard NIC: reorder events, retransmissions, and goodput far below ECMP's
    assert gbn.flows["reorder_events"].sum() > 0 and gbn.flows["retx_bytes"].sum() > 0
    assert gbn.collectives[0].time_ns > 5 * ecmp.collectives[0].time_ns
    # the resent share is the packet-level calculation's, on the leaf-to-leaf part of the two
    # paths (the host links are common): 2 links and 2 switch latencies each, the NAK back
    # over the fast one, a packet every MTU time at 400 Gb/s
    fast = 2 * 100 + 2 * 600
    slow = 2 * 1000 + 2 * 600
    eff, per_packet = go_back_n([float(fast), float(slow)], MTU_WIRE_BYTES * 8 / 400, fast)
    wire = gbn.flows["wire_bytes"]
    assert gbn.flows["retx_bytes"] == pytest.approx(wire * (1 / eff - 1), rel=1e-9)
    packets = -(-SIZE // 4096)
    assert gbn.flows["reorder_events"].tolist() == [round(packets * per_packet)] * 2
    # every byte, resent or not, crossed the links at line rate: time ~ wire / eff / rate
    t = gbn.flows["end_send_ns"] - gbn.flows["start_ns"]
    assert t == pytest.approx(wire / eff * 8 / 400, rel=1e-3)


def test_go_back_n_in_order_cases() -> None:
    # equal delays, and a spread of less than one packet time, keep packets in order
    assert go_back_n([500.0] * 4, 80.0, 500.0) == (1.0, 0.0)
    assert go_back_n([500.0, 560.0, 520.0], 80.0, 500.0) == (1.0, 0.0)
    # the larger the spread, the worse
    e1, _ = go_back_n([500.0, 1000.0], 80.0, 500.0)
    e2, _ = go_back_n([500.0, 3000.0], 80.0, 500.0)
    assert 0 < e2 < e1 < 1
