"""The bounded time-series store: merging is exact and a long run keeps an even series."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpilot.dataplane.timeseries import TimeSeries


def _feed(ts: TimeSeries, n: int, interval: float = 10.0) -> None:
    for i in range(1, n + 1):
        # link 0 always busy at 100%, link 1 busy every other sample at 50%; one mark each
        links = np.array([0, 1]) if i % 2 else np.array([0])
        util = np.array([1.0, 0.5]) if i % 2 else np.array([1.0])
        ts.append(int(i * interval), interval, links, np.full(len(links), float(i)), util,
                  np.ones(len(links)), np.zeros(len(links), bool), interval)


def test_within_budget_every_sample_is_kept() -> None:
    ts = TimeSeries(10.0, 1000)
    _feed(ts, 100)
    ts.finish()
    assert len(ts) == 100 and ts.interval_ns == 10.0
    assert ts.rows == 150


def test_over_budget_the_interval_doubles_and_totals_are_kept() -> None:
    ts = TimeSeries(10.0, 40)
    _feed(ts, 100)
    ts.finish()
    cols = ts.columns()
    # 100 samples with 1.5 rows each on average need <= 40 rows: 4 doublings -> 80 ns
    assert ts.rows <= 40
    assert ts.interval_ns == 80.0
    t = np.unique(cols["time_ns"])
    assert np.all(np.diff(t)[:-1] == 80)        # evenly spaced (the last may be shorter)
    assert t.max() == 1000                       # the series still reaches the end of the run
    # marks add up: 150 over the run, whatever the merging
    assert cols["ecn_marks"].sum() == pytest.approx(150.0)
    # link 1's utilisation over a merged interval is the average: 0.25
    link1 = cols["link"] == 1
    assert cols["utilization"][link1][:-1] == pytest.approx(0.25)
    assert cols["utilization"][cols["link"] == 0] == pytest.approx(1.0)
    # queue is the snapshot of the last instant merged in
    assert cols["queue_bytes"][(cols["link"] == 0)][0] == 8.0
