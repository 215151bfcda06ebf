"""Array helpers (fabricpilot.arrays): the distinct ids and their places, as numpy's unique
gives them, however the ids are spread."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpilot.arrays import distinct, distinct_ids, ids_inverse


@pytest.mark.parametrize(("low", "high", "n"), [(0, 50, 1000), (0, 10**7, 300), (-20, 20, 500),
                                                (0, 1, 1), (5, 6, 40)])
def test_distinct_ids_and_their_places_are_numpys(low: int, high: int, n: int) -> None:
    # dense ids (a table of them), sparse and negative ones (a sort), one id, one value
    rng = np.random.default_rng(high)
    a = rng.integers(low, high, n)
    want, inv = np.unique(a, return_inverse=True)
    assert distinct_ids(a).tolist() == distinct(a).tolist() == want.tolist()
    got, got_inv = ids_inverse(a)
    assert got.tolist() == want.tolist() and got_inv.tolist() == inv.ravel().tolist()
    assert got_inv.dtype == np.int64 and distinct_ids(a).dtype == a.dtype


def test_no_ids() -> None:
    empty = np.zeros(0, np.int64)
    assert distinct_ids(empty).tolist() == [] and [x.tolist() for x in ids_inverse(empty)] == [
        [], []]
