"""Tests of the controller's congestion map (expected values computed by hand)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabricpilot.controller.congestion import CongestionMap, LinkState
from fabricpilot.controller.southbound import FabricView, LinkInfo, PortDelta

INTERVAL_NS = 1_000_000  # 1 ms
# 400 Gb/s over 1 ms: 400e9 / 8 * 1e-3 = 50_000_000 bytes at full load.
FULL_BYTES = 50_000_000
HOT_QUEUE = 1.5 * 2**20  # 1_572_864 bytes


def make_view() -> FabricView:
    """Two 400 Gb/s links between a leaf and a spine (ids 0 and 1)."""
    return FabricView.from_links(
        [LinkInfo(0, "leaf0", "spine0", 400, 100), LinkInfo(1, "spine0", "leaf0", 400, 100)],
        node_kind={"leaf0": "switch", "spine0": "switch"},
        tier={"leaf0": 1, "spine0": 2},
        gpu_node={},
    )


def test_first_sample_taken_as_is() -> None:
    cm = CongestionMap(make_view())
    # 25_000_000 bytes * 8 = 2e8 bits; capacity * interval = 400 * 1e6 = 4e8 bits -> 0.5.
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=25_000_000, queue_bytes=1000)])
    st = cm.state(0)
    assert st.utilization == 0.5  # not 0.3 * 0.5 = 0.15 (no smoothing against zero)
    assert st.queue_bytes == 1000.0


def test_ewma_second_sample() -> None:
    cm = CongestionMap(make_view(), alpha=0.3)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=25_000_000, queue_bytes=1000)])  # 0.5
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES, queue_bytes=3000)])  # 1.0
    st = cm.state(0)
    # 0.3 * 1.0 + 0.7 * 0.5 = 0.3 + 0.35 = 0.65
    assert st.utilization == pytest.approx(0.65)
    # 0.3 * 3000 + 0.7 * 1000 = 900 + 700 = 1600
    assert st.queue_bytes == pytest.approx(1600.0)
    assert cm.utilization() == pytest.approx({0: 0.65, 1: 0.0})


def test_deltas_of_one_link_in_one_batch_fold_in_order() -> None:
    # link 0: 50 %, then 100 %, then 0 % in one batch; link 1 once, at 100 %
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES // 2),
               PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES),
               PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES),
               PortDelta(0, INTERVAL_NS, tx_bytes=0)])
    # 0.5, then 0.3 * 1.0 + 0.7 * 0.5 = 0.65, then 0.7 * 0.65 = 0.455
    assert cm.state(0).utilization == pytest.approx(0.455, abs=1e-12)
    assert cm.state(1).utilization == 1.0
    one_by_one = CongestionMap(make_view())
    for tx in (FULL_BYTES // 2, FULL_BYTES, 0):
        one_by_one.update([PortDelta(0, INTERVAL_NS, tx_bytes=tx)])
    assert one_by_one.state(0) == cm.state(0)


def test_link_without_delta_keeps_state() -> None:
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=25_000_000),
               PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES)])  # link 1 at 1.0
    before = cm.state(1)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=0)])
    assert cm.state(1) == before
    assert cm.state(1).utilization == 1.0
    # link 0: 0.3 * 0 + 0.7 * 0.5 = 0.35
    assert cm.state(0).utilization == pytest.approx(0.35)


def test_a_link_left_out_fades_towards_its_last_sample() -> None:
    # switches send only changes: link 1 at 50 % (queue 1000) goes idle, reports its zeros
    # once and then nothing, while link 0 keeps reporting 100 %; each batch is an interval
    cm = CongestionMap(make_view(), alpha=0.3)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES),
               PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES // 2, queue_bytes=1000)])
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES), PortDelta(1, INTERVAL_NS)])
    for _ in range(3):
        cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES)])
    # four steps towards 0 from 0.5 and 1000: 0.5 * 0.7 ** 4 = 0.12005, 1000 * 0.7 ** 4
    assert cm.state(1).utilization == pytest.approx(0.12005, abs=1e-12)
    assert cm.state(1).queue_bytes == pytest.approx(240.1, abs=1e-9)
    assert cm.state(0).utilization == 1.0
    # a link left out at a steady load stays there (its last sample is its state)
    cm.update([PortDelta(1, INTERVAL_NS)])
    assert cm.state(0).utilization == 1.0


def test_an_empty_batch_moves_the_links_only_when_an_interval_went_by() -> None:
    cm = CongestionMap(make_view(), alpha=0.5)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES)])
    cm.update([PortDelta(0, INTERVAL_NS)])  # 0.5 * 0 + 0.5 * 1.0
    cm.update([])  # (no interval: nothing moves)
    assert cm.state(0).utilization == 0.5
    cm.update([], elapsed=True)  # nothing changed in an interval that went by: 0.25
    cm.update([], elapsed=True)
    assert cm.state(0).utilization == 0.125
    # deltas said to be of no new interval fold in, but leave the others where they are
    cm.update([PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES)], elapsed=False)
    assert cm.state(0).utilization == 0.125 and cm.state(1).utilization == 1.0
    # within 1e-12 of its last sample a link takes it: 0.125 * 0.5 ** 37 = 9.1e-13
    for _ in range(36):
        cm.update([], elapsed=True)
    assert cm.state(0).utilization == pytest.approx(0.125 * 0.5 ** 36, rel=1e-9)
    cm.update([], elapsed=True)
    assert cm.state(0).utilization == 0.0 and cm.state(1).utilization == 1.0


def test_several_intervals_at_once_step_every_link_then_fold_the_batch() -> None:
    cm = CongestionMap(make_view(), alpha=0.5)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES),
               PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES // 2)])
    cm.update([PortDelta(0, INTERVAL_NS), PortDelta(1, INTERVAL_NS)])  # 0.5 and 0.25
    # three intervals, the last one's report from link 0 alone: link 0 first steps twice
    # towards its last sample 0 (0.125), then folds 1.0 in (0.5 + 0.0625); link 1 steps
    # three times (0.25 / 8)
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES)], elapsed=3)
    assert cm.state(0).utilization == 0.5625 and cm.state(1).utilization == 0.03125
    # a bad batch changes nothing, the steps of its intervals included
    with pytest.raises(KeyError, match="unknown link id 9"):
        cm.update([PortDelta(9, INTERVAL_NS)], elapsed=4)
    assert cm.state(0).utilization == 0.5625 and cm.state(1).utilization == 0.03125
    with pytest.raises(ValueError, match="at least 0 intervals, got -1"):
        cm.update([], elapsed=-1)


def test_state_is_a_copy_and_default_zero() -> None:
    cm = CongestionMap(make_view())
    assert cm.state(1) == LinkState()
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=25_000_000)])
    st = cm.state(0)
    st.utilization = 42.0
    assert cm.state(0).utilization == 0.5


def test_rates_and_pause_fraction() -> None:
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, drops=5, ecn_marks=200, pause_ns=250_000)])
    st = cm.state(0)
    # interval = 1e6 ns = 1e-3 s: 5 drops / 1e-3 s = 5000 /s; 200 marks / 1e-3 s = 200_000 /s
    assert st.drop_rate == pytest.approx(5000.0)
    assert st.ecn_rate == pytest.approx(200_000.0)
    # 250_000 / 1_000_000 = 0.25
    assert st.pause_fraction == pytest.approx(0.25)


def test_pause_fraction_clipped() -> None:
    cm = CongestionMap(make_view())
    # 2_000_000 / 1_000_000 = 2 -> clipped to 1
    cm.update([PortDelta(0, INTERVAL_NS, pause_ns=2_000_000)])
    assert cm.state(0).pause_fraction == 1.0


def test_fec_error_rates() -> None:
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, fec_corrected=2, fec_uncorrected=1, rx_bits=1e9),
               PortDelta(1, INTERVAL_NS, fec_corrected=7, rx_bits=0)])
    st = cm.state(0)
    assert st.fec_error_rate == pytest.approx(2e-9)  # 2 / 1e9
    assert st.uncorrectable_rate == pytest.approx(1e-9)  # 1 / 1e9
    assert cm.state(1).fec_error_rate == 0.0  # rx_bits == 0 -> 0
    assert cm.state(1).uncorrectable_rate == 0.0


def test_free_buffer_bytes() -> None:
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, queue_bytes=3000)])
    assert cm.free_buffer_bytes(0, 10_000) == 7000.0  # 10_000 - 3000
    assert cm.free_buffer_bytes(0, 1000) == 0.0  # 1000 - 3000 < 0 -> 0
    assert cm.free_buffer_bytes(1, 10_000) == 10_000.0  # empty queue


def test_hot_by_utilization_boundary() -> None:
    cm = CongestionMap(make_view())
    # 40_000_000 * 8 / 4e8 = 0.8 exactly (== hot_utilization) -> hot
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=40_000_000),
               PortDelta(1, INTERVAL_NS, tx_bytes=39_000_000)])  # 0.78 -> not hot
    assert cm.hot_links() == [0]


def test_hot_by_queue_boundary() -> None:
    cm = CongestionMap(make_view())
    # queue exactly 1.5 MiB = 1_572_864 bytes -> hot; one byte less -> not hot
    cm.update([PortDelta(0, INTERVAL_NS, queue_bytes=1_572_864),
               PortDelta(1, INTERVAL_NS, queue_bytes=1_572_863)])
    assert cm.hot_links() == [0]


def test_hot_by_pause_boundary() -> None:
    cm = CongestionMap(make_view())
    # 10_000 / 1_000_000 = 0.01 exactly -> hot; 9_999 / 1e6 = 0.009999 -> not hot
    cm.update([PortDelta(0, INTERVAL_NS, pause_ns=9_999),
               PortDelta(1, INTERVAL_NS, pause_ns=10_000)])
    assert cm.hot_links() == [1]


def test_hot_links_sorted_and_empty_when_idle() -> None:
    cm = CongestionMap(make_view())
    assert cm.hot_links() == []
    cm.update([PortDelta(1, INTERVAL_NS, tx_bytes=FULL_BYTES),
               PortDelta(0, INTERVAL_NS, queue_bytes=2 * 2**20)])
    assert cm.hot_links() == [0, 1]


def test_congestion_table() -> None:
    cm = CongestionMap(make_view())
    # link 0: utilization 1.0, queue 786_432 = 0.5 * 1.5 MiB, pause 5_000 / 1e6 = 0.005
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES, queue_bytes=786_432,
                         pause_ns=5_000)])
    table = cm.congestion_table()
    assert set(table) == {0, 1}
    assert table[1] == 1.0  # idle: 1 / (1 + 0 + 0 + 0)
    # 1 / (1 + 4 * (1.0 - 0.5) + 786_432 / 1_572_864 + 10 * 0.005)
    # = 1 / (1 + 2 + 0.5 + 0.05) = 1 / 3.55
    assert table[0] == pytest.approx(1 / 3.55)
    assert 0 in cm.hot_links()


def test_congestion_table_half_load_is_neutral() -> None:
    cm = CongestionMap(make_view())
    cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=25_000_000)])  # 0.5 -> max(0.5-0.5, 0) = 0
    assert cm.congestion_table()[0] == 1.0


def test_unknown_link_raises_key_error() -> None:
    cm = CongestionMap(make_view())
    with pytest.raises(KeyError, match="77"):
        cm.update([PortDelta(77, INTERVAL_NS, tx_bytes=1)])
    with pytest.raises(KeyError, match="78"):
        cm.state(78)


def test_zero_interval_raises_value_error() -> None:
    cm = CongestionMap(make_view())
    with pytest.raises(ValueError, match="link 1"):
        cm.update([PortDelta(1, 0, tx_bytes=1)])
    with pytest.raises(ValueError, match="link 0"):
        cm.update([PortDelta(0, -5)])


def test_invalid_batch_changes_nothing() -> None:
    cm = CongestionMap(make_view())
    with pytest.raises(KeyError):
        cm.update([PortDelta(0, INTERVAL_NS, tx_bytes=FULL_BYTES), PortDelta(9, INTERVAL_NS)])
    assert cm.state(0) == LinkState()


def test_does_not_import_simulator() -> None:
    code = ("import sys, fabricpilot.controller.congestion; "
            "print(any(m.startswith(('fabricpilot.dataplane','fabricpilot.balancing',"
            "'fabricpilot.runner')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
