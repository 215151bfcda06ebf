"""Rate models: how the active flows share the links between two engine events.

The engine owns the flows (rows of a sparse ``[flows, links]`` weight matrix and the bytes each
still has to send) and asks a rate model for the rate of every row. A model sees the network
through :class:`LinkState` and the flows through :class:`ActiveFlows`; it never touches the
engine's event list.

* :class:`MaxMinRateModel` (``flow``): max-min fair sharing, recomputed only when the set of
  flows changes; rates are constant in between (``max_step_ns`` is infinite).
* A time-stepped model (queues, ECN, DCQCN, PFC) implements the same protocol, returns a
  finite ``max_step_ns`` and evolves its own state in ``advance``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.dataplane.maxmin import max_min_rates


@dataclass(frozen=True, slots=True)
class LinkState:
    """Static link properties, indexed by link id."""

    capacity_gbps: NDArray[np.float64]
    delay_ns: NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class MemberPaths:
    """Paths of the members of the active rows, for models that follow bytes hop by hop.

    A member is one path of one stream of a row: ``row`` (index into the active rows),
    ``stream`` (index within the row: the row progresses at the pace of its slowest stream),
    ``share`` (fraction of the stream's bytes on this path), ``path`` (link ids, -1 padded),
    ``flow_id`` (the row's global flow id), ``key`` (a stable, increasing member id) and
    ``qp`` (a stable id of the QP the member's bytes belong to: members of one QP share its
    congestion control; ``None``: every member is a QP of its own).
    """

    row: NDArray[np.int64]
    stream: NDArray[np.int64]
    share: NDArray[np.float64]
    path: NDArray[np.int32]
    flow_id: NDArray[np.int64]
    key: NDArray[np.int64]
    qp: NDArray[np.int64] | None = None


@dataclass(frozen=True, slots=True)
class ActiveFlows:
    """The rows currently sending: their weights, bytes still to send (per member) and the
    rate cap of each (``inf`` = none); for path-following models also each row's bytes per
    stream, traffic class (index into ``qos.TRAFFIC_CLASSES``) and member paths."""

    weights: sp.csr_matrix
    remaining_bytes: NDArray[np.float64]
    rate_cap_gbps: NDArray[np.float64]
    member_bytes: NDArray[np.float64] | None = None
    row_class: NDArray[np.int64] | None = None
    members: MemberPaths | None = None


class RateModel(Protocol):
    """Computes per-row rates (Gb/s per member stream) for the active flows.

    ``needs_paths``: the model follows bytes hop by hop and needs ``ActiveFlows.members``.
    """

    name: str
    needs_paths: bool

    def reset(self, links: LinkState) -> None: ...

    def on_change(self, flows: ActiveFlows) -> None:
        """The set of active flows (or their paths) changed."""

    def rates_gbps(self) -> NDArray[np.float64]: ...

    def advance(self, dt_ns: int) -> NDArray[np.float64] | None:
        """Time moves on by ``dt_ns``. A path-following model returns the bytes each row
        delivered; a piecewise-constant one returns ``None`` (the engine integrates its
        rates exactly)."""

    def max_step_ns(self) -> float:
        """How long the current rates stay valid without a change of flows."""

    def link_usage(self) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """For a model that moves bytes itself: the bytes each link carried so far and its
        peak utilisation over any step; ``None`` if the engine integrates the rates."""

    def link_state_now(self) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """For a model that moves bytes itself: each link's rate over the last step (Gb/s)
        and its egress queue (bytes) now; ``None`` if the engine derives loads from rates."""

    def link_bytes_now(self) -> NDArray[np.float64] | None:
        """For a model that moves bytes itself: the bytes each link has carried so far (its
        transmit counter, read without changing what :meth:`link_usage` will count);
        ``None`` if the engine integrates the rates."""


class MaxMinRateModel:
    """Flow-level model: max-min fair rates, piecewise constant between flow events."""

    name = "flow"
    needs_paths = False

    def __init__(self) -> None:
        self._links: LinkState | None = None
        self._rates = np.zeros(0)

    def reset(self, links: LinkState) -> None:
        self._links = links
        self._rates = np.zeros(0)

    def link_usage(self) -> None:
        return None

    def link_state_now(self) -> None:
        return None

    def link_bytes_now(self) -> None:
        return None

    def on_change(self, flows: ActiveFlows) -> None:
        assert self._links is not None, "reset() first"
        cap = flows.rate_cap_gbps if np.isfinite(flows.rate_cap_gbps).any() else None
        self._rates = max_min_rates(flows.weights, self._links.capacity_gbps, cap)

    def rates_gbps(self) -> NDArray[np.float64]:
        return self._rates

    def advance(self, dt_ns: int) -> None:
        return None

    def max_step_ns(self) -> float:
        return float("inf")

