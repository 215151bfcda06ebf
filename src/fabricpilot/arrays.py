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
