"""Array helpers shared by the packages that work on numpy arrays of ids.

numpy 2.3+ answers a plain ``np.unique(a)`` (no ``return_*`` flag) with a hash table, which
on arrays of ids is many times slower than sorting (about 60x on a million link ids with
numpy 2.4): :func:`distinct` sorts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


def distinct(values: ArrayLike) -> NDArray[Any]:
    """The distinct values of ``values`` (flattened), ascending: ``np.unique(values)`` for
    arrays without NaN, by a sort.

    >>> distinct([3, 1, 3, 2, 1]).tolist()
    [1, 2, 3]
    >>> distinct(np.zeros((0,), np.int64)).dtype
    dtype('int64')
    """
    a = np.sort(np.asarray(values).ravel())
    if len(a) < 2:
        return a
    keep = np.empty(len(a), np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _dense(a: NDArray[Any]) -> bool:
    """Whether ``a`` holds non-negative integers none far above its length (a table of
    them costs less than a sort)."""
    return (len(a) > 0 and a.dtype.kind in "iu" and int(a.min()) >= 0
            and int(a.max()) < 4 * len(a) + 1024)


def distinct_ids(values: ArrayLike) -> NDArray[Any]:
    """:func:`distinct` of ids: by a table of the ids present where they are dense
    (non-negative, none far above their count), else by a sort.

    >>> distinct_ids(np.array([7, 3, 7, 0])).tolist(), distinct_ids([-2, 5, -2]).tolist()
    ([0, 3, 7], [-2, 5])
    """
    a = np.asarray(values).ravel()
    if not _dense(a):
        return distinct(a)
    seen = np.zeros(int(a.max()) + 1, np.bool_)
    seen[a] = True
    return np.flatnonzero(seen).astype(a.dtype)


def ids_inverse(values: ArrayLike) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """``np.unique(values, return_inverse=True)`` of ids (flattened): the distinct ids,
    ascending, and each value's place among them; by a table where the ids are dense.

    >>> u, inv = ids_inverse(np.array([7, 3, 7, 0]))
    >>> u.tolist(), inv.tolist()
    ([0, 3, 7], [2, 1, 2, 0])
    """
    a = np.asarray(values).ravel()
    if not _dense(a):
        u, inv = np.unique(a, return_inverse=True)
        return u, inv.reshape(-1).astype(np.int64)
    u = distinct_ids(a)
    lut = np.empty(int(u[-1]) + 1, np.int64)
    lut[u] = np.arange(len(u), dtype=np.int64)
    return u, lut[a]
