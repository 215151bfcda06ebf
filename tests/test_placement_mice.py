"""Placement policies and Poisson mice."""

from __future__ import annotations

import doctest
import math
from collections import Counter
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fabricpilot.errors import FabricpilotError
from fabricpilot.workload import mice, placement
from fabricpilot.workload.mice import MiceArrivals, poisson_mice
from fabricpilot.workload.placement import PlacementError, place_gpus


@pytest.mark.parametrize("module", [placement, mice])
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0


# ------------------------------------------------------------------------ placement


def _free_with_holes() -> np.ndarray:
    free = np.ones(16, dtype=bool)
    free[[0, 3, 4, 9]] = False
    return free


def test_contiguous_first_fit() -> None:
    free = _free_with_holes()
    before = free.copy()
    got = place_gpus(5, free, policy="contiguous")
    assert got.tolist() == [1, 2, 5, 6, 7]
    assert got.dtype == np.int64
    assert np.array_equal(free, before)  # not mutated


def test_not_enough_free() -> None:
    free = np.zeros(256, dtype=bool)
    free[:128] = True
    with pytest.raises(PlacementError, match="job needs 200 GPUs but only 128 are free"):
        place_gpus(200, free, policy="contiguous")
    with pytest.raises(PlacementError, match="only 128 are free"):
        place_gpus(200, free, policy="random", rng=np.random.default_rng(0))


def test_placement_error_is_value_error() -> None:
    assert issubclass(PlacementError, ValueError)
    assert issubclass(PlacementError, FabricpilotError)


def test_random_policy() -> None:
    free = _free_with_holes()
    a = place_gpus(6, free, policy="random", rng=np.random.default_rng(7))
    b = place_gpus(6, free, policy="random", rng=np.random.default_rng(7))
    assert a.tolist() == b.tolist()  # reproducible
    assert a.tolist() == sorted(a.tolist())
    assert len(set(a.tolist())) == 6
    assert np.all(free[a])
    with pytest.raises(PlacementError, match="rng"):
        place_gpus(2, free, policy="random")


def test_shuffled_policy_draws_the_same_gpus_in_a_random_rank_order() -> None:
    """``shuffled``: the GPUs ``random`` would place, in the order drawn; every rank order
    about equally likely (4 ranks: 24 orders)."""
    free = _free_with_holes()
    a = place_gpus(6, free, policy="random", rng=np.random.default_rng(7))
    b = place_gpus(6, free, policy="shuffled", rng=np.random.default_rng(7))
    assert sorted(b.tolist()) == a.tolist() and b.tolist() != a.tolist()
    rng = np.random.default_rng(11)
    free4 = np.zeros(8, dtype=bool)
    free4[:4] = True
    trials = 2400
    orders = Counter(tuple(place_gpus(4, free4, policy="shuffled", rng=rng).tolist())
                     for _ in range(trials))
    assert len(orders) == 24
    sigma = math.sqrt(trials / 24 * (1 - 1 / 24))
    assert all(abs(n - trials / 24) < 5 * sigma for n in orders.values())
    with pytest.raises(PlacementError, match="'shuffled' needs rng"):
        place_gpus(2, free, policy="shuffled")


def test_random_policy_is_uniform() -> None:
    free = np.zeros(16, dtype=bool)
    free[8:] = True  # 8 free GPUs, pick 4: each is picked with probability 1/2
    rng = np.random.default_rng(123)
    trials = 2000
    counts = np.zeros(16, dtype=np.int64)
    for _ in range(trials):
        counts[place_gpus(4, free, policy="random", rng=rng)] += 1
    assert counts[:8].sum() == 0
    sigma = math.sqrt(trials * 0.5 * 0.5)
    assert np.all(np.abs(counts[8:] - trials / 2) < 5 * sigma)


def test_explicit_policy() -> None:
    free = _free_with_holes()
    got = place_gpus(3, free, policy="explicit", explicit=[8, 2, 15])
    assert got.tolist() == [8, 2, 15]  # order kept: it is the ring order
    assert got.dtype == np.int64


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([1, 2, 16], "out of range"),
        ([1, -1, 2], "out of range"),
        ([1, 2, 2], "more than once"),
        ([1, 3, 5], r"\[3\] are not free"),
        ([1, 2], "3 GPUs but 2 explicit ids"),
    ],
)
def test_explicit_errors(ids: list[int], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        place_gpus(3, _free_with_holes(), policy="explicit", explicit=ids)


def test_policy_errors() -> None:
    free = _free_with_holes()
    with pytest.raises(PlacementError, match="contiguous, random, shuffled, explicit"):
        place_gpus(2, free, policy="packed")
    with pytest.raises(PlacementError, match="explicit="):
        place_gpus(2, free, policy="explicit")
    with pytest.raises(PlacementError, match="at least 1 GPU"):
        place_gpus(0, free, policy="contiguous")
    with pytest.raises(PlacementError, match="boolean"):
        place_gpus(2, np.ones(4, dtype=int), policy="contiguous")


# ------------------------------------------------------------------------ mice


def _mice(seed: int = 42, **kw: Any) -> MiceArrivals:
    args: dict[str, Any] = {
        "rate_per_s": 1e6,
        "size_bytes": 4096,
        "start_ns": 5_000,
        "duration_ns": 100_000_000,  # 0.1 s -> 1e5 expected arrivals
        "rng": np.random.default_rng(seed),
    }
    args.update(kw)
    return poisson_mice(np.arange(8, 16), **args)


def test_poisson_count_within_4_sigma() -> None:
    m = _mice()
    expected = 1e6 * 0.1
    assert abs(len(m) - expected) < 4 * math.sqrt(expected)


def test_mice_invariants() -> None:
    m = _mice()
    for arr in (m.time_ns, m.src, m.dst, m.size_bytes):
        assert arr.dtype == np.int64
        assert len(arr) == len(m)
    assert np.all(np.diff(m.time_ns) >= 0)
    assert m.time_ns.min() >= 5_000
    assert m.time_ns.max() < 5_000 + 100_000_000
    assert np.all(m.src != m.dst)
    assert set(np.unique(m.src).tolist()) == set(range(8, 16))
    assert set(np.unique(m.dst).tolist()) == set(range(8, 16))
    assert set(m.size_bytes.tolist()) == {4096}
    assert m.total_bytes == 4096 * len(m)


def test_mice_statistics() -> None:
    m = _mice(seed=3)
    n = len(m)
    gaps = np.diff(m.time_ns)
    # exponential with mean 1000 ns: P(gap > mean) = 1/e
    frac = float(np.mean(gaps > 1000))
    assert abs(frac - math.exp(-1)) < 0.01
    # 56 ordered pairs, each equally likely
    pair = (m.src - 8) * 8 + (m.dst - 8)
    counts = np.bincount(pair, minlength=64).reshape(8, 8)
    assert np.all(np.diag(counts) == 0)
    off = counts[~np.eye(8, dtype=bool)]
    p = 1 / 56
    sigma = math.sqrt(n * p * (1 - p))
    assert np.all(np.abs(off - n * p) < 5 * sigma)


def test_mice_reproducible() -> None:
    a, b = _mice(seed=9), _mice(seed=9)
    assert np.array_equal(a.time_ns, b.time_ns)
    assert np.array_equal(a.src, b.src)
    assert np.array_equal(a.dst, b.dst)
    c = _mice(seed=10)
    assert not np.array_equal(a.time_ns[:10], c.time_ns[:10])


def test_mice_edge_cases() -> None:
    assert len(_mice(rate_per_s=0.0)) == 0
    assert len(_mice(duration_ns=0)) == 0
    # a very low rate in a short window usually yields nothing, never something out of range
    tiny = _mice(rate_per_s=1.0, duration_ns=1000)
    assert np.all((tiny.time_ns >= 5_000) & (tiny.time_ns < 6_000))
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        poisson_mice([3], rate_per_s=1e6, size_bytes=64, start_ns=0, duration_ns=10**6,
                     rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="rate_per_s"):
        _mice(rate_per_s=-1.0)
    with pytest.raises(ValueError, match="duration_ns"):
        _mice(duration_ns=-5)
