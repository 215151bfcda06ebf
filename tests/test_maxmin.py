"""Max-min fairness: textbook cases computed by hand, and the defining property on random
instances (every flow has a saturated bottleneck link on which no flow gets more)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fabricpilot.dataplane.maxmin import alone_rate_gbps, max_min_rates


def test_two_flows_share_one_link_equally() -> None:
    w = sp.csr_matrix(np.ones((2, 1)))
    assert max_min_rates(w, np.array([100.0])).tolist() == [50.0, 50.0]


def test_textbook_three_flows_two_links() -> None:
    # Bertsekas & Gallager: link A = 10, link B = 4; f0 on A, f1 on A+B, f2 on B.
    # B is the first bottleneck: f1 = f2 = 4/2 = 2; then f0 = 10 - 2 = 8.
    w = sp.csr_matrix(np.array([[1, 0], [1, 1], [0, 1]], float))
    np.testing.assert_allclose(max_min_rates(w, np.array([10.0, 4.0])), [8.0, 2.0, 2.0])


def test_classic_linear_network() -> None:
    # Chain of 3 links of capacity 1; one long flow over all, one short flow per link:
    # every link has 2 flows -> everybody gets 1/2.
    w = sp.csr_matrix(np.array([[1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], float))
    np.testing.assert_allclose(max_min_rates(w, np.ones(3)), [0.5] * 4)


def test_unequal_capacities_cascade() -> None:
    # Links: L0 = 3 (flows a, b, c), L1 = 10 (flows c, d). Level 1: L0 share 1 -> a, b, c = 1;
    # then d alone on L1 gets 10 - 1 = 9.
    w = sp.csr_matrix(np.array([[1, 0], [1, 0], [1, 1], [0, 1]], float))
    np.testing.assert_allclose(max_min_rates(w, np.array([3.0, 10.0])), [1, 1, 1, 9])


def test_weighted_rows_and_rate_caps() -> None:
    # A ring of 2 coupled streams both on one link (weight 2) vs a plain flow: per-member
    # rates equalise at 100 / 3.
    w = sp.csr_matrix(np.array([[2.0], [1.0]]))
    np.testing.assert_allclose(max_min_rates(w, np.array([100.0])), [100 / 3, 100 / 3])
    # A capped flow leaves its share to the other one.
    r = max_min_rates(sp.csr_matrix(np.ones((2, 1))), np.array([100.0]), np.array([10, np.inf]))
    np.testing.assert_allclose(r, [10.0, 90.0])


def test_alone_rate_is_the_tightest_link() -> None:
    w = sp.csr_matrix(np.array([[1.0, 0.25, 0.0], [0.0, 0.0, 0.0]]))
    np.testing.assert_allclose(alone_rate_gbps(w, np.array([100.0, 10.0, 5.0])), [40.0, np.inf])


@pytest.mark.parametrize("seed", range(5))
def test_random_instances_satisfy_the_max_min_property(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_flows, n_links = 300, 40
    dense = (rng.random((n_flows, n_links)) < 0.08) * rng.choice([0.5, 1.0, 2.0],
                                                                 (n_flows, n_links))
    dense[dense.sum(1) == 0, 0] = 1.0
    cap = rng.uniform(10, 100, n_links)
    rates = max_min_rates(sp.csr_matrix(dense), cap)
    load = dense.T @ rates
    assert np.all(load <= cap * (1 + 1e-9))  # feasible
    saturated = load >= cap * (1 - 1e-9)
    for f in range(n_flows):
        links = np.flatnonzero(dense[f])
        # a bottleneck: saturated, and no flow on it gets a higher rate
        ok = [saturated[link] and rates[dense[:, link] > 0].max() <= rates[f] * (1 + 1e-9)
              for link in links]
        assert any(ok), f"flow {f} has no bottleneck link"
