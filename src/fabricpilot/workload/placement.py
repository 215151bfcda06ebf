"""Job placement: which GPUs of the cluster a job gets.

The cluster's GPUs are global ids ``0 .. len(free)-1``; ``free`` marks the ones no job holds.
Placement never mutates ``free``: the caller marks the returned GPUs busy once it commits.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fabricpilot.errors import FabricpilotError

__all__ = ["POLICIES", "PlacementError", "place_gpus"]

POLICIES: tuple[str, ...] = ("contiguous", "random", "shuffled", "explicit")


class PlacementError(FabricpilotError, ValueError):
    """A job cannot be placed: too few free GPUs, bad explicit ids, or an unknown policy."""


def place_gpus(
    n_gpus: int,
    free: NDArray[np.bool_] | ArrayLike,
    *,
    policy: str,
    rng: np.random.Generator | None = None,
    explicit: Sequence[int] | NDArray[np.integer] | None = None,
) -> NDArray[np.int64]:
    """Choose ``n_gpus`` GPUs among the free ones (``free[i]`` is True when GPU ``i`` is free).

    Policies:

    * ``"contiguous"``: first fit, the ``n_gpus`` lowest-indexed free GPUs in increasing order
      (a contiguous block when the free GPUs are, which packs jobs onto few hosts);
    * ``"random"``: a uniform sample without replacement among the free GPUs, sorted (ranks
      in host order, as a launcher hands them out from a sorted host list); needs ``rng`` (a
      seeded ``numpy.random.Generator``) so runs are reproducible;
    * ``"shuffled"``: the same sample in the order it was drawn (ranks in no order of the
      topology, as a launcher unaware of it gives them: ring neighbours on other leaves);
    * ``"explicit"``: exactly the ids in ``explicit``, in the given order (it is the ring order);
      each must be in range, listed once and free, and there must be ``n_gpus`` of them.

    Returns an int64 array of GPU ids. Raises ``PlacementError`` (a ``ValueError``).

    >>> free = np.array([False, True, True, False, True, True])
    >>> place_gpus(3, free, policy="contiguous").tolist()
    [1, 2, 4]
    >>> place_gpus(2, free, policy="explicit", explicit=[5, 1]).tolist()
    [5, 1]
    >>> a = place_gpus(3, free, policy="random", rng=np.random.default_rng(3))
    >>> b = place_gpus(3, free, policy="shuffled", rng=np.random.default_rng(3))
    >>> sorted(b.tolist()) == a.tolist()  # (the same GPUs, in the order drawn)
    True
    >>> place_gpus(5, free, policy="contiguous")
    Traceback (most recent call last):
    ...
    fabricpilot.workload.placement.PlacementError: job needs 5 GPUs but only 4 are free
    """
    try:
        n = operator.index(n_gpus)
    except TypeError:
        raise PlacementError(f"n_gpus must be an integer, got {n_gpus!r}") from None
    if n < 1:
        raise PlacementError(f"a job needs at least 1 GPU, got n_gpus={n}")
    mask = np.asarray(free)
    if mask.ndim != 1 or mask.dtype != np.bool_:
        raise PlacementError(
            f"free must be a 1-D boolean array, got dtype {mask.dtype} and shape {mask.shape}"
        )
    if policy not in POLICIES:
        raise PlacementError(
            f"unknown placement policy {policy!r}; expected one of {', '.join(POLICIES)}"
        )
    if explicit is not None and policy != "explicit":
        raise PlacementError(f"explicit GPU ids were given but policy is {policy!r}")

    if policy == "explicit":
        return _explicit(n, mask, explicit)

    candidates = np.flatnonzero(mask).astype(np.int64)
    if n > len(candidates):
        raise PlacementError(f"job needs {n} GPUs but only {len(candidates)} are free")
    if policy == "contiguous":
        return candidates[:n].copy()
    if rng is None:
        raise PlacementError(f"policy {policy!r} needs rng (a seeded numpy.random.Generator)")
    drawn = rng.choice(candidates, size=n, replace=False).astype(np.int64)
    return drawn if policy == "shuffled" else np.sort(drawn)


def _explicit(
    n: int, mask: NDArray[np.bool_], explicit: Sequence[int] | NDArray[np.integer] | None
) -> NDArray[np.int64]:
    if explicit is None:
        raise PlacementError("policy 'explicit' needs the list of GPU ids (explicit=[...])")
    ids = np.asarray(explicit)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise PlacementError(f"explicit GPU ids must be a flat list of integers, got {explicit!r}")
    ids = ids.astype(np.int64)
    if len(ids) != n:
        raise PlacementError(f"job needs {n} GPUs but {len(ids)} explicit ids were given")
    total = len(mask)
    bad = ids[(ids < 0) | (ids >= total)]
    if bad.size:
        raise PlacementError(
            f"GPU ids {_show(bad)} are out of range (cluster has {total} GPUs: 0..{total - 1})"
        )
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != len(ids):
        raise PlacementError(f"GPU ids {_show(uniq[counts > 1])} are listed more than once")
    busy = ids[~mask[ids]]
    if busy.size:
        raise PlacementError(f"GPU ids {_show(busy)} are not free")
    return ids


def _show(ids: NDArray[np.int64], limit: int = 8) -> str:
    """``[1, 2, 3]``, or the first ``limit`` ids and a count of the rest."""
    head = ids[:limit].tolist()
    rest = len(ids) - len(head)
    return f"{head}" if rest == 0 else f"{head} (+{rest} more)"
