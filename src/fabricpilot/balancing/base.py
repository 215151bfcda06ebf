"""What a routing policy is: transfers in, rate-model rows ("flows") out.

The engine hands a policy a :class:`TransferBatch` (the transfers of one collective stage, or a
few mice) and gets back a :class:`RoutedBatch`: one row per *flow* of the rate model, with the
link weights of that row (see :mod:`fabricpilot.dataplane.maxmin`), how many member streams it
stands for, their payload size and their one-way path delay.

Rows are formed the same way for every policy (:func:`assemble`): the coupled transfers of a
ring (same ``group``) become one row whose weights add up its members' paths, so the ring moves
at the pace of its slowest hop; every independent transfer (or each of its QPs) is its own row.

Policies live in a string-keyed registry (:data:`POLICIES`); an unknown name is rejected at
once with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.controller.params import ControllerParams
from fabricpilot.errors import FabricpilotError
from fabricpilot.topology.compiled import CompiledTopology


@dataclass(frozen=True, slots=True)
class TransferBatch:
    """Transfers to route. ``group >= 0`` couples transfers (one ring); ``-1`` is independent.
    ``job`` identifies the connection owner (its QPs keep their source ports for the job's
    life); mice use ``-1``."""

    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    size_bytes: NDArray[np.int64]
    group: NDArray[np.int64]
    job: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True, slots=True)
class MemberRoutes:
    """The paths behind the rows of a :class:`RoutedBatch`, for path-following rate models.

    One entry per member: ``row`` (index into the batch's rows), ``stream`` (index of the
    stream within its row), ``share`` (fraction of that stream's bytes on this path) and
    ``path`` (link ids, -1 padded). ``sprayed``: each stream is one QP whose packets are
    sprayed over its members' paths, so its members share one congestion-control state
    (else each member is a QP of its own, as the QPs of a planned path set are).
    """

    row: NDArray[np.int64]
    stream: NDArray[np.int64]
    share: NDArray[np.float64]
    path: NDArray[np.int32]
    sprayed: bool = False


@dataclass(frozen=True, slots=True)
class RoutedBatch:
    """Rate-model rows for a batch. ``weights`` is ``[rows, links]``; per row: ``members``
    (streams it stands for), ``size_bytes`` (payload per member), ``path_delay_ns`` (one-way,
    the largest over its members), a representative ``src`` / ``dst``, and ``n_paths`` (distinct
    paths its members use)."""

    weights: sp.csr_matrix
    members: NDArray[np.int64]
    size_bytes: NDArray[np.int64]
    path_delay_ns: NDArray[np.int64]
    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    routes: MemberRoutes | None = None
    # receiver cost of a policy that reorders (per row): wire bytes sent per byte delivered
    # (>= 1: the rest is retransmission) and reorder events per packet delivered
    wire_factor: NDArray[np.float64] | None = None
    reorder_per_packet: NDArray[np.float64] | None = None
    reorder_events: NDArray[np.int64] | None = None  # counted when routed (a path change)
    # a rate limit at the senders (Gb/s per member, ``inf``: none), as a controller sets
    rate_cap_gbps: NDArray[np.float64] | None = None

    def __len__(self) -> int:
        return len(self.members)


def concat_routed(batches: list[RoutedBatch]) -> RoutedBatch:
    """The rows of ``batches`` (at least one, over the same links) as one batch, in order:
    member routes renumbered to their rows and padded to the longest path; an optional
    per-row array kept if every batch has it (else dropped: a policy sets it for all its
    batches or none).

    >>> w = sp.csr_matrix(np.array([[1.0, 0.0, 0.0]]))
    >>> one = lambda p: RoutedBatch(w, np.array([1]), np.array([10]), np.array([5]),
    ...                             np.array([0]), np.array([1]),
    ...                             MemberRoutes(np.array([0]), np.array([0]), np.array([1.0]),
    ...                                          np.array([p], np.int32)))
    >>> b = concat_routed([one([0, 1]), one([2, 0, 1])])
    >>> len(b), b.weights.shape, b.routes.row.tolist(), b.routes.path.tolist()
    (2, (2, 3), [0, 1], [[0, 1, -1], [2, 0, 1]])
    """
    if len(batches) == 1:
        return batches[0]
    cat = np.concatenate
    routes = [b.routes for b in batches]
    joined: MemberRoutes | None = None
    if all(r is not None for r in routes):
        rs = [r for r in routes if r is not None]
        if len({r.sprayed for r in rs}) > 1:
            raise ValueError("batches with sprayed and per-path QPs cannot be joined")
        width = max(r.path.shape[1] if r.path.ndim == 2 else 0 for r in rs)
        offsets = np.cumsum([0, *(len(b) for b in batches[:-1])])
        joined = MemberRoutes(
            cat([r.row + off for r, off in zip(rs, offsets.tolist(), strict=True)]),
            cat([r.stream for r in rs]), cat([r.share for r in rs]),
            cat([np.pad(r.path.reshape(len(r.row), -1),
                        ((0, 0), (0, width - r.path.reshape(len(r.row), -1).shape[1])),
                        constant_values=-1) for r in rs]).astype(np.int32), rs[0].sprayed)

    def opt(name: str) -> NDArray[np.generic] | None:
        got = [getattr(b, name) for b in batches]
        return cat(got) if all(g is not None for g in got) else None

    caps = None
    if any(b.rate_cap_gbps is not None for b in batches):  # (a batch without: no cap)
        caps = cat([np.full(len(b), np.inf) if b.rate_cap_gbps is None else b.rate_cap_gbps
                    for b in batches])
    return RoutedBatch(sp.vstack([b.weights for b in batches], format="csr"),
                       cat([b.members for b in batches]), cat([b.size_bytes for b in batches]),
                       cat([b.path_delay_ns for b in batches]), cat([b.src for b in batches]),
                       cat([b.dst for b in batches]), joined, opt("wire_factor"),
                       opt("reorder_per_packet"), opt("reorder_events"), caps)


@dataclass(frozen=True, slots=True)
class EcmpParams:
    """ECMP settings: QPs per connection, whether source ports carry entropy, and whether every
    switch hashes with its own seed (avoids polarisation across tiers)."""

    qps_per_connection: int = 1
    source_port_entropy: bool = True
    per_switch_seed: bool = False


DEFAULT_PORT_BUFFER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AdaptiveParams:
    """Settings of the adaptive family of policies (``adaptive``, ``flowlet``,
    ``adaptive-split``): how often streams are re-placed (``inf``: never), whether a moved
    stream waits for its old path to drain, how much lighter (in links) a new path must be,
    the idle gap that ends a flowlet, and the mice threshold and reserved top-tier switches of
    the mice/elephant split."""

    rebalance_interval_ns: float = 50_000
    drain_safe: bool = True
    hysteresis: float = 0.25
    flowlet_gap_ns: int = 100_000
    mice_bytes: int = 64 << 10
    reserved_spines: int = 1
    mice_by: str = "size"  # "size": declared size; "bytes_seen": mice until mice_bytes sent


@dataclass(frozen=True, slots=True)
class LinkTelemetry:
    """What the switches know of their own egress ports at one instant, per link id:
    ``load_gbps`` (the rate of the traffic currently on the link), ``queue_bytes`` (its
    egress queue) and ``demand_gbps`` (what the flows on it would send if nothing held them
    back: their NICs' rates, less where a coupled row's own members share its NIC, as a
    tree GPU's four transfers). The flow-level model has no queues; a demand above capacity is
    where a real switch would hold a standing queue."""

    load_gbps: NDArray[np.float64]
    queue_bytes: NDArray[np.float64]
    demand_gbps: NDArray[np.float64]
    now_ns: float = 0.0
    ber: NDArray[np.float64] | None = None  # pre-FEC bit error rate (gray links), if known
    # post-FEC packet loss (gray links: the frames FEC could not correct), if known
    drop_probability: NDArray[np.float64] | None = None
    packet_wire_bytes: int = 4174  # a full frame on the wire (what a port counts frames of)
    # bytes each link has carried since the start (its port's transmit counter), if the
    # model counts them: a report's bytes are then those sent in its interval, not the
    # rate of the instant it is taken times the interval
    tx_bytes_total: NDArray[np.float64] | None = None


@dataclass(frozen=True, slots=True)
class ActiveMembers:
    """The paths of the active flows, for a policy that may move them: one entry per member
    (one path of one stream of a row): its ``row``, ``path`` (link ids, -1 padded), ``share``
    of its stream's bytes, ``hold`` (True while it waits for its old path to drain) and
    ``sent_bytes`` (what it has sent so far)."""

    row: NDArray[np.int64]
    path: NDArray[np.int32]
    share: NDArray[np.float64]
    hold: NDArray[np.bool_]
    sent_bytes: NDArray[np.float64] | None = None
    owner: NDArray[np.int64] | None = None   # the job of each member's row (-1: mice)
    stream: NDArray[np.int64] | None = None  # its stream (QP) index within the transfer


@dataclass(frozen=True, slots=True)
class Moves:
    """Members to move (indices into :class:`ActiveMembers`) and their new paths. With
    ``drain_safe`` a moved stream waits until the bytes it has in flight on the old path are
    delivered before it sends on the new one (no reordering, an idle gap); without, it
    switches at once and bytes on a faster new path overtake those still on the old one.
    ``drain_safe`` is one flag for all the members or one per member."""

    member: NDArray[np.int64]
    path: NDArray[np.int32]
    drain_safe: bool | NDArray[np.bool_] = True
    # a controller's move: the member's whole stream takes its pair's planned set (one
    # member per QP, see ``stream_members``), not only this member the path given
    whole_set: bool | NDArray[np.bool_] = False

    def safe_mask(self) -> NDArray[np.bool_]:
        """Whether each member moves drain-safe.

        >>> Moves(np.array([4, 7]), np.zeros((2, 1), np.int32), False).safe_mask().tolist()
        [False, False]
        """
        return np.broadcast_to(np.asarray(self.drain_safe, bool), self.member.shape).copy()

    def whole_set_mask(self) -> NDArray[np.bool_]:
        """Whether each member's stream takes its pair's whole planned set.

        >>> Moves(np.array([4, 7]), np.zeros((2, 1), np.int32)).whole_set_mask().tolist()
        [False, False]
        """
        return np.broadcast_to(np.asarray(self.whole_set, bool), self.member.shape).copy()


TelemetryFn = Callable[[], LinkTelemetry]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Everything a policy may read when it is created."""

    topology: CompiledTopology
    seed: int
    switch_latency_ns: int
    ecmp: EcmpParams = EcmpParams()
    member_routes: bool = False  # the rate model follows paths: policies must give routes
    adaptive: AdaptiveParams = AdaptiveParams()
    controller: ControllerParams = field(default_factory=ControllerParams)
    port_buffer_bytes: float = DEFAULT_PORT_BUFFER_BYTES  # a switch egress port's buffer
    # error counters: how often ports report FEC counts, and their noise (each sample of
    # each port shows a spurious error rate ``fec_noise[1]`` with probability ``fec_noise[0]``)
    fec_sample_ns: int = 1_000_000
    faults: bool = False  # the run injects faults (links may go down)
    fec_noise: tuple[float, float] = (0.0, 0.0)


class RoutingPolicy(Protocol):
    """A load-balancing policy: decides which links each transfer's bytes cross.

    The columns of the weights a policy returns are links, unless it sets
    ``column_of_link`` (link id -> column id): then links of one column are interchangeable
    for it (they always carry the same share) and the engine gives the column the sum of
    their capacities.

    ``static = True`` declares that a policy routes the same transfers the same way whatever
    the state of the fabric (ECMP, ideal), so the engine may reuse a stage's routing in every
    iteration; state-dependent policies set it to ``False`` and may define
    ``bind(telemetry: TelemetryFn)``: the engine calls it before a run with a function that
    returns the current :class:`LinkTelemetry`. A policy that moves flows mid-life also sets
    ``rebalance_interval_ns`` and defines ``rebalance(members: ActiveMembers) -> Moves``,
    which the engine calls at that interval while flows are active (flow-level model). A
    policy that remembers connections may define ``flows_done(job, src, dst, end_ns)``: the
    engine tells it when single-stream flows send their last byte.
    """

    name: str
    column_of_link: NDArray[np.int32] | None
    static: bool

    def route(self, batch: TransferBatch) -> RoutedBatch: ...


class UnknownPolicyError(FabricpilotError):
    pass


POLICIES: dict[str, Callable[[PolicyContext], RoutingPolicy]] = {}


def register_policy(name: str) -> Callable[[Callable[[PolicyContext], RoutingPolicy]],
                                           Callable[[PolicyContext], RoutingPolicy]]:
    def deco(factory: Callable[[PolicyContext], RoutingPolicy]) -> Callable[..., RoutingPolicy]:
        POLICIES[name] = factory
        return factory
    return deco


def make_policy(name: str, ctx: PolicyContext) -> RoutingPolicy:
    """Instantiate a registered policy; unknown names raise with the list of known ones."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})"
        ) from None
    return factory(ctx)


def split_qps(batch: TransferBatch, qps: int) -> tuple[TransferBatch, NDArray[np.int64]]:
    """Split every transfer over ``qps`` queue pairs with sizes differing by at most one byte.

    Returns the per-QP batch and the QP index of each row.

    >>> b = TransferBatch(*(np.array([x]) for x in (0, 1, 10, -1, 0)))
    >>> sub, qp = split_qps(b, 3)
    >>> sub.size_bytes.tolist(), qp.tolist()
    ([4, 3, 3], [0, 1, 2])
    """
    if qps <= 1:
        return batch, np.zeros(len(batch), np.int64)
    n = len(batch)
    rep = np.repeat(np.arange(n), qps)
    qp = np.tile(np.arange(qps, dtype=np.int64), n)
    base, extra = np.divmod(batch.size_bytes, qps)
    size = base[rep] + (qp < extra[rep])
    return TransferBatch(batch.src[rep], batch.dst[rep], size.astype(np.int64),
                         batch.group[rep], batch.job[rep]), qp


def paths_to_weights(paths: NDArray[np.int32], n_links: int) -> sp.csr_matrix:
    """Unit weights for padded link-id paths (``-1`` = padding), one row per path."""
    valid = paths >= 0
    rows = np.broadcast_to(np.arange(len(paths))[:, None], paths.shape)[valid]
    return sp.csr_matrix((np.ones(int(valid.sum())), (rows, paths[valid])),
                         shape=(len(paths), n_links))


def entity_of(group: NDArray[np.int64]) -> tuple[NDArray[np.int64], int]:
    """Row of every transfer: coupled groups first (in group order), then each independent
    transfer in order.

    >>> entity_of(np.array([-1, 5, -1, 5, 2]))[0].tolist()
    [2, 1, 3, 1, 0]
    """
    coupled = group >= 0
    g_ids, g_inv = np.unique(group[coupled], return_inverse=True)
    entity = np.empty(len(group), np.int64)
    entity[coupled] = g_inv.reshape(-1)
    entity[~coupled] = len(g_ids) + np.arange(int((~coupled).sum()))
    return entity, len(g_ids) + int((~coupled).sum())


def stream_index(entity: NDArray[np.int64]) -> NDArray[np.int64]:
    """Position of each transfer among the transfers of its row (its stream index).

    >>> stream_index(np.array([0, 1, 0, 0, 1])).tolist()
    [0, 0, 1, 2, 1]
    """
    order = np.argsort(entity, kind="stable")
    counts = np.bincount(entity)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pos = np.empty(len(entity), np.int64)
    pos[order] = np.arange(len(entity)) - np.repeat(starts, counts)
    return pos


def member_qp_index(row: NDArray[np.int64], stream: NDArray[np.int64]) -> NDArray[np.int64]:
    """Position of each member among the members of its stream (``(row, stream)``), in
    member order: the QP it is of a stream sent on several QPs (a planned pair's path set
    gives its ``i``-th QP the ``i``-th member).

    >>> member_qp_index(np.array([0, 0, 0, 1, 0]), np.array([0, 0, 1, 0, 0])).tolist()
    [0, 1, 0, 0, 2]
    """
    if not len(row):
        return np.zeros(0, np.int64)
    _, inverse = np.unique(np.stack([np.asarray(row, np.int64), np.asarray(stream, np.int64)]),
                           axis=1, return_inverse=True)
    return stream_index(inverse.reshape(-1))


def assemble(
    batch: TransferBatch,
    weights: sp.csr_matrix,
    path_delay_ns: NDArray[np.int64],
    paths: NDArray[np.int32] | None = None,
) -> RoutedBatch:
    """Form rate-model rows: one per coupled group, one per independent transfer.

    ``weights`` has one row per transfer of ``batch``; ``paths`` (one per transfer), when
    given, become the rows' member routes (each transfer one stream on one path).
    """
    n = len(batch)
    coupled = batch.group >= 0
    entity, n_ent = entity_of(batch.group)
    routes = None
    if paths is not None:
        routes = MemberRoutes(entity, stream_index(entity), np.ones(n), paths)
    if not coupled.any():
        return RoutedBatch(sp.csr_matrix(weights), np.ones(n, np.int64),
                           batch.size_bytes.copy(), path_delay_ns.astype(np.int64),
                           batch.src.copy(), batch.dst.copy(), routes)
    member = sp.csr_matrix((np.ones(n), (entity, np.arange(n))), shape=(n_ent, n))
    w = (member @ weights).tocsr()
    members = np.bincount(entity, minlength=n_ent).astype(np.int64)
    size = np.zeros(n_ent, np.int64)
    np.maximum.at(size, entity, batch.size_bytes)
    delay = np.zeros(n_ent, np.int64)
    np.maximum.at(delay, entity, path_delay_ns)
    first = np.full(n_ent, n, np.int64)
    np.minimum.at(first, entity, np.arange(n))
    return RoutedBatch(w, members, size, delay, batch.src[first], batch.dst[first], routes)
