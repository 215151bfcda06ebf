"""The event-driven engine: jobs' iteration loops, collective stages, mice and link sharing.

Time is integer nanoseconds. Events sit in a heap ordered by ``(time_ns, seq)``; the sequence
number makes ties deterministic (first scheduled, first served). Between events the active
flows keep the rates the rate model gave them; the engine jumps to the earliest of (next event,
earliest flow completion, the rate model's ``max_step_ns``).

A flow is a row of the rate model (see :mod:`fabricpilot.balancing.base`): an independent
transfer, or the coupled streams of a ring. When its last byte is sent, it is delivered
``latency_ns`` later: ``hops * (one-way path delay + nic_latency_ns)``, the α term of the
α-β model. A stage ends when every flow of it is delivered; then the next stage, collective
or iteration starts.

When the earliest flow finishes, every flow that would finish within ``batch_rel_eps`` of its
own running time after it finishes in the same event (a flow's completion moves earlier by at
most that fraction of its FCT). An AlltoAll of equal flows then costs one rate recomputation,
not one per flow, and ECMP's spread of completion times a few hundred instead of one per flow.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.balancing.base import (
    ActiveMembers,
    LinkTelemetry,
    MemberRoutes,
    Moves,
    RoutedBatch,
    RoutingPolicy,
    TransferBatch,
    concat_routed,
    paths_to_weights,
)
from fabricpilot.dataplane.faults import FaultRecord, FaultsMixin
from fabricpilot.dataplane.maxmin import alone_rate_gbps
from fabricpilot.dataplane.params import FabricParams
from fabricpilot.dataplane.qos import TRAFFIC_CLASSES
from fabricpilot.dataplane.rates import (
    ActiveFlows,
    LinkState,
    MaxMinRateModel,
    MemberPaths,
    RateModel,
)
from fabricpilot.errors import SimulationError, TopologyError
from fabricpilot.faults.model import FaultTimeline
from fabricpilot.topology.compiled import LINK_KIND_CODES, CompiledTopology
from fabricpilot.topology.model import LinkKind
from fabricpilot.topology.paths import max_path_links, pad_paths, path_delay_ns
from fabricpilot.workload.jobs import JobSpec
from fabricpilot.workload.mice import MiceArrivals
from fabricpilot.workload.plan import CollectivePlan, busbw_factor

MICE_OWNER = -1

ProgressFn = Callable[[int, int], None]


def _qp_keys(routes: MemberRoutes, keys: NDArray[np.int64]) -> NDArray[np.int64]:
    """The QP of each new member (``keys``, in order of ``routes``): its own key, or, for
    sprayed streams, the key of its stream's first member.

    >>> import numpy as np
    >>> r = MemberRoutes(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1]), np.full(4, 0.5),
    ...                  np.zeros((4, 1), np.int32), sprayed=True)
    >>> _qp_keys(r, np.array([10, 11, 12, 13])).tolist()
    [10, 10, 12, 13]
    """
    if not routes.sprayed or not len(keys):
        return keys.copy()
    stream_id = routes.row * (int(routes.stream.max()) + 1) + routes.stream
    _, first, inverse = np.unique(stream_id, return_index=True, return_inverse=True)
    return keys[first][inverse.reshape(-1)]


@dataclass
class FlowTable:
    """Every flow the run created (struct of arrays, grown in batches)."""

    chunks: list[dict[str, NDArray]] = field(default_factory=list)

    def add(self, **cols: NDArray) -> None:
        self.chunks.append(cols)

    def columns(self) -> dict[str, NDArray]:
        if not self.chunks:
            return {}
        return {k: np.concatenate([c[k] for c in self.chunks]) for k in self.chunks[0]}


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    job: str
    iteration: int
    index: int
    op: str
    algorithm: str
    n_ranks: int
    size_bytes: int
    start_ns: int
    end_ns: int

    @property
    def time_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def algbw_GBps(self) -> float:
        """``S / t``; bytes per nanosecond is exactly GB/s (10^9 bytes/s)."""
        return self.size_bytes / self.time_ns if self.time_ns > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        from fabricpilot.workload.plan import Op

        return self.algbw_GBps * busbw_factor(Op(self.op), self.n_ranks)


@dataclass(frozen=True, slots=True)
class IterationRecord:
    job: str
    iteration: int
    start_ns: int
    end_ns: int


# a stepping run that delivers no byte for this long while flows are open (not held) is
# stopped (a livelock of the model, such as losses every step that send every sender back
# together, each then stalled for its resend); a flow-level run whose only open flows lose
# every packet (a gray link of drop 1) for this long with nothing to come but a policy's
# rounds stops their jobs as hung
NO_PROGRESS_NS = 100_000_000


@dataclass
class EngineOutput:
    """Raw results of one run; :mod:`fabricpilot.results` turns them into tables."""

    sim_time_ns: int
    flows: dict[str, NDArray]
    collectives: list[CollectiveRecord]
    iterations: list[IterationRecord]
    link_bytes: NDArray[np.float64]
    link_peak_util: NDArray[np.float64]
    n_rate_updates: int
    n_events: int
    model_report: object | None = None
    path_moves: int = 0  # streams moved to another path mid-flow (rebalancing policies)
    faults: list[FaultRecord] = field(default_factory=list)
    aborted: dict[str, str] = field(default_factory=dict)  # job -> why it was stopped
    mice_cut_off: int = 0  # mice dropped for want of a path (links down)


@dataclass
class _Stage:
    job: int
    iteration: int
    coll: int
    stage: int
    outstanding: int = 0
    deliver_ns: int = 0


class Engine(FaultsMixin):
    """Runs jobs and mice over a compiled topology under one routing policy and rate model,
    with the faults of ``faults`` (see :mod:`fabricpilot.dataplane.faults`)."""

    def __init__(
        self,
        topology: CompiledTopology,
        policy: RoutingPolicy,
        jobs: list[JobSpec],
        *,
        fabric: FabricParams | None = None,
        mice: MiceArrivals | None = None,
        rate_model: RateModel | None = None,
        batch_rel_eps: float = 1e-3,
        progress: ProgressFn | None = None,
        mice_class: str = "rdma",
        faults: FaultTimeline | None = None,
    ) -> None:
        self.ct = topology
        self.policy = policy
        self.jobs = jobs
        self.fabric = fabric or FabricParams()
        self.mice = mice
        self.model: RateModel = rate_model or MaxMinRateModel()
        self.eps = batch_rel_eps
        self.progress = progress
        self._stepping = bool(getattr(self.model, "needs_paths", False))
        self._mice_class = TRAFFIC_CLASSES.index(mice_class)
        # rate-model columns: links, or groups of interchangeable links chosen by the policy
        col = getattr(policy, "column_of_link", None)
        self._col = (np.arange(topology.n_links, dtype=np.int32) if col is None
                     else np.asarray(col, np.int32))
        n_cols = int(self._col.max()) + 1 if len(self._col) else 0
        cap = np.bincount(self._col, weights=topology.rate_gbps, minlength=n_cols)
        delay = np.zeros(n_cols, np.int64)
        np.maximum.at(delay, self._col, topology.delay_ns)
        self.links = LinkState(cap, delay)
        self._link_share = topology.rate_gbps / cap[self._col]
        # the columns of a GPU's own links (NIC, NVLink): what bounds a flow alone
        self._host_col = np.zeros(n_cols, np.bool_)
        self._host_col[self._col[topology.link_kind != LINK_KIND_CODES[LinkKind.FABRIC]]] = True
        # the columns of Ethernet links (NIC, fabric): a transfer over none of them (NVLink
        # inside a host) carries no Ethernet, IP, UDP or RoCE framing
        self._ethernet_col = np.zeros(n_cols, np.bool_)
        self._ethernet_col[self._col[topology.link_kind != LINK_KIND_CODES[LinkKind.NVLINK]]] \
            = True
        self._route_cache: dict[tuple[int, int, int], RoutedBatch] = {}
        # policies that move flows mid-life (flow-level model): the engine keeps member paths
        # (a path-following model must be able to say when a stream's old path has drained)
        self._rebalancing = (
            hasattr(policy, "rebalance")
            and math.isfinite(getattr(policy, "rebalance_interval_ns", math.inf))
            and (not self._stepping or hasattr(self.model, "in_flight_bytes")))
        self._track = self._stepping or self._rebalancing
        # (a timeline without events still plays: faults may be injected into the run)
        self._timeline = faults
        if self._timeline is not None:
            if self._stepping:
                raise SimulationError("faults are modelled by the flow-level model: set "
                                      "fabric.model: flow")
            self._track = True  # a fault needs every stream's path
        self._flows_done_hook = getattr(policy, "flows_done", None)
        # (last: an engine refused above leaves no policy reading its telemetry)
        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(self._telemetry)

    # ----------------------------------------------------------------- public
    def run(self) -> EngineOutput:
        self.model.reset(self.links)
        self.now = 0
        self._seq = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._idle_seqs: set[int] = set()  # the events in the heap that are idle (``_at``)
        self._stages: dict[int, _Stage] = {}
        self._next_stage_id = 0
        self._flows = FlowTable()
        self._n_flows = 0
        self._collectives: list[CollectiveRecord] = []
        self._iterations: list[IterationRecord] = []
        self._coll_start: dict[tuple[int, int, int], int] = {}
        self._iter_start: dict[tuple[int, int], int] = {}
        # active rows
        n_links = len(self.links.capacity_gbps)
        self._w = sp.csr_matrix((0, n_links))
        self._remaining = np.zeros(0)
        self._row_flow = np.zeros(0, np.int64)
        self._row_stage = np.zeros(0, np.int64)
        self._row_latency = np.zeros(0, np.int64)
        # one hop's latency of each row (a ring's row: of its slowest hop), the round trip of
        # a go-back-N resend (a ring's whole latency is 2(n-1) of them)
        self._row_hop_ns = np.zeros(0, np.int64)
        self._row_start = np.zeros(0, np.int64)
        self._row_class = np.zeros(0, np.int64)
        self._row_bytes = np.zeros(0)
        # members (path-following models only): one row per path of a stream
        width = max_path_links(self.ct)
        self._m_flow = np.zeros(0, np.int64)
        self._m_stream = np.zeros(0, np.int64)
        self._m_share = np.zeros(0)
        self._m_path = np.zeros((0, width), np.int32)
        self._m_key = np.zeros(0, np.int64)
        self._m_qp = np.zeros(0, np.int64)  # the member key of its QP's first member
        self._n_members = 0
        self._row_hold = np.zeros(0)        # a row sends nothing until then (draining)
        self._row_cap = np.zeros(0)         # a row's rate limit at its senders (per member)
        self._row_demand = np.zeros(0)      # what a member stream of the row would send, Gb/s
        self._row_src = np.zeros(0, np.int64)
        self._row_dst = np.zeros(0, np.int64)
        self._row_owner = np.zeros(0, np.int64)
        self._row_single = np.zeros(0, bool)  # one stream (not a ring row)
        # per flow id, in chunks of added rows: reorder events and resent bytes that a
        # policy's receiver model charges up front; moves add to _reorder_moves
        self._reorder_chunks: list[NDArray[np.int64]] = []
        self._resend_chunks: list[NDArray[np.float64]] = []
        self._reorder_moves: dict[int, int] = {}
        self._moves = 0
        self._rebalance_pending = False
        self._quiet_key: tuple[int, int] | None = None
        self._pending_moves: dict[int, NDArray[np.int32]] = {}  # member key -> new path
        self._rates = np.zeros(0)
        self._load = np.zeros(n_links)
        self._link_bytes = np.zeros(n_links)
        self._peak = np.zeros(n_links)
        self._end_send: list[tuple[NDArray, NDArray]] = []
        self._dirty = False
        self._n_rate_updates = 0
        self._n_events = 0
        self._done_units = 0
        self._total_units = sum(j.iterations * len(j.collectives) for j in self.jobs)
        self._aborted: dict[int, str] = {}
        self._mice_cut = 0  # mice dropped: no path left when they came or while they went
        self._mice_waiting = 0  # mice that came with no path, to try again after a repair
        self._jobs_done: set[int] = {j for j, job in enumerate(self.jobs)
                                     if job.iterations == 0 or not job.collectives}
        self._goodput = np.zeros(0)
        self._faults_setup(self._timeline)

        for j, job in enumerate(self.jobs):
            self._at(job.start_ns, lambda j=j: self._start_iteration(j, 0))
        mice_i = 0
        mice_t = self.mice.time_ns if self.mice is not None and len(self.mice) else None

        best_left, progress_ns, rows_seen = math.inf, 0, (-1, -1)
        stuck_since: int | None = None  # (no flow can finish since)
        while True:
            t_event = self._heap[0][0] if self._heap else math.inf
            t_mice = float(mice_t[mice_i]) if mice_t is not None and mice_i < len(mice_t) \
                else math.inf
            t_next = min(t_event, t_mice)
            if self._dirty:
                self._recompute()
            if not self._remaining.size and (
                    t_next == math.inf
                    # only idle rounds are left (the last flow ended before them)
                    or (t_mice == math.inf and len(self._heap) == len(self._idle_seqs)
                        and not self._mice_waiting)
                    # only faults are left to happen, after every job and mouse is done
                    or (self._timeline is not None and t_mice == math.inf
                        and len(self._jobs_done) == len(self.jobs)
                        and not self._mice_waiting)):
                break
            if self._stepping:
                if self._remaining.size:
                    step_end = min(self.now + math.ceil(self.model.max_step_ns()), t_next)
                    rates = self.model.rates_gbps()
                    moving = rates > 0
                    if len(rates) == len(self._remaining) and moving.any():
                        # do not step far past the earliest completion the last rates predict
                        eta = float((self._remaining[moving] * 8.0 / rates[moving]).min())
                        step_end = min(step_end, self.now + max(math.ceil(eta), 1))
                    self._advance(int(step_end))
                    # (a livelock of the model: senders sending, nothing delivered)
                    left, rows_now = float(self._remaining.sum()), (len(self._remaining),
                                                                     self._n_flows)
                    if rows_now != rows_seen or left < best_left - 1.0:
                        best_left, progress_ns, rows_seen = left, self.now, rows_now
                    elif (self.now - progress_ns > NO_PROGRESS_NS
                          and (self._row_hold <= self.now).any()):
                        raise SimulationError(self._livelock_message())
                    self._complete(self._remaining <= 1e-6 * self._row_bytes + 1e-3)
                    if self._pending_moves:
                        self._settle_moves()
                    if self.now < t_next:
                        continue
                else:
                    self._advance(int(t_next))
            else:
                t_finish, batch = self._earliest_finish()
                only_idle = t_next == math.inf or (
                    t_mice == math.inf and not self._mice_waiting
                    and len(self._heap) == len(self._idle_seqs))
                if t_finish < math.inf or not only_idle:
                    stuck_since = None
                else:
                    # nothing moves and only a policy's rounds are to come: a stream a gray
                    # link loses every packet of is hung; its job is stopped once nothing
                    # has moved for NO_PROGRESS_NS (unless a round moves it before)
                    stuck_since = self.now if stuck_since is None else stuck_since
                    if self._start_black_losses():
                        continue  # (their QPs' retries may run out first)
                    if t_next > stuck_since + NO_PROGRESS_NS:
                        self._advance(max(stuck_since + NO_PROGRESS_NS, self.now))
                        if self._stop_lost_for_good(NO_PROGRESS_NS):
                            stuck_since = None
                            continue
                        raise SimulationError("flows are active but none can make progress")
                if t_finish <= t_next:
                    self._advance(int(t_finish))
                    self._complete(batch)
                    continue
                if t_next == math.inf:
                    raise SimulationError("flows are active but none can make progress")
                self._advance(int(t_next))
            if t_mice <= t_event and mice_t is not None and t_mice == self.now:
                j = int(np.searchsorted(mice_t, mice_t[mice_i], side="right"))
                self._add_mice(mice_i, j)
                mice_i = j
            while self._heap and self._heap[0][0] == self.now:
                _, seq, fn = heapq.heappop(self._heap)
                self._idle_seqs.discard(seq)
                self._n_events += 1
                fn()

        unfinished = [s for s in self._stages.values() if s.outstanding > 0]
        if unfinished:
            raise SimulationError(f"{len(unfinished)} stages never completed")
        flows = self._flows.columns()
        if flows:
            end = np.full(self._n_flows, -1, np.int64)  # -1: never finished (job stopped)
            for ids, t in self._end_send:
                end[ids] = t
            flows["end_send_ns"] = end
            flows["deliver_ns"] = np.where(end >= 0, end + flows["latency_ns"], -1)
            flows["retx_bytes"] = np.concatenate(self._resend_chunks)
            flows["reorder_events"] = np.concatenate(self._reorder_chunks)
            for fid, ev in self._reorder_moves.items():
                flows["reorder_events"][fid] += ev
            for fid, resent in self._fault_retx.items():  # (lost to dead and gray links)
                flows["retx_bytes"][fid] += resent
            # the last bytes (e.g. of a mouse) may still be in flight when the last send ends
            self.now = max(self.now, int(flows["deliver_ns"].max()))
        link_bytes = self._link_bytes[self._col] * self._link_share
        link_peak = self._peak[self._col]
        usage = self.model.link_usage()
        if usage is not None:
            link_bytes = link_bytes + usage[0]
            link_peak = np.maximum(link_peak, usage[1])
        report = None
        finish = getattr(self.model, "finish", None)
        if finish is not None:
            report = finish()
            retx = getattr(report, "flow_retx_bytes", {})
            if flows and retx:
                ids = np.fromiter(retx.keys(), np.int64, len(retx))
                flows["retx_bytes"][ids] += np.fromiter(retx.values(), np.float64, len(retx))
        return EngineOutput(
            sim_time_ns=self.now,
            flows=flows,
            collectives=self._collectives,
            iterations=self._iterations,
            link_bytes=link_bytes,
            link_peak_util=link_peak,
            n_rate_updates=self._n_rate_updates,
            path_moves=self._moves,
            n_events=self._n_events,
            model_report=report,
            faults=self.fault_records,
            aborted={self.jobs[j].name: why for j, why in self._aborted.items()},
            mice_cut_off=self._mice_cut,
        )

    def _telemetry(self) -> LinkTelemetry:
        """The load and queue of every link now, for state-dependent policies."""
        if self._dirty:
            self._recompute()
        state = self.model.link_state_now()
        if state is not None:
            load, queue = state
        else:
            load, queue = self._load[self._col] * self._link_share, np.zeros(self.ct.n_links)
        demand = np.zeros(self.ct.n_links)
        if len(self._row_demand):
            # a row would send its demand (its NIC's rate, or what its own members there
            # leave it), shared with the other rows of that NIC
            per_nic = np.bincount(self._row_src, minlength=self.ct.n_gpus)
            row = self._row_demand / np.maximum(per_nic[self._row_src], 1)
            demand = (self._w.T @ row)[self._col] * self._link_share
        # the transmit counters: the bytes the engine integrated, and those a model that
        # moves bytes itself counted
        sent = self._link_bytes[self._col] * self._link_share
        moved = self.model.link_bytes_now()
        if moved is not None:
            sent = sent + moved
        if self._timeline is None:
            return LinkTelemetry(load, queue, demand, float(self.now), tx_bytes_total=sent)
        return LinkTelemetry(load, queue, demand, float(self.now), self._ber, self._drop_p,
                             self.fabric.packet_wire_bytes, tx_bytes_total=sent)

    def _rebalance(self) -> None:
        """Let the policy move active streams to other paths (see :class:`Moves`)."""
        self._rebalance_pending = False
        if not self._remaining.size:
            return
        if self._dirty:
            self._recompute()
        # nothing changed since a round that moved nothing (same flows and rates, same
        # congestion table): the answer would be the same
        key = (self._n_rate_updates, int(getattr(self.policy, "table_version", 0)))
        if (key != self._quiet_key or getattr(self.policy, "watches_bytes_sent", False)
                or getattr(self.policy, "periodic", False)):
            row = np.searchsorted(self._row_flow, self._m_flow)
            sent = (self._row_bytes - np.minimum(self._remaining, self._row_bytes))[row] \
                * self._m_share
            moves: Moves = self.policy.rebalance(  # type: ignore[attr-defined]
                ActiveMembers(row, self._m_path, self._m_share, self._row_hold[row] > self.now,
                              sent, self._row_owner[row], self._m_stream))
            if len(moves.member):
                self._apply_moves(row, moves)
            else:
                self._quiet_key = key
        self._rebalance_pending = True
        self._at(self.now + int(self.policy.rebalance_interval_ns),  # type: ignore[attr-defined]
                 self._rebalance, idle=True)

    def _apply_moves(self, row: NDArray[np.int64], moves: Moves) -> None:
        if self._stepping:
            # the model follows the bytes: hold the streams until the model reports their old
            # paths empty (queues included), then switch (always drain-safe here)
            new = pad_paths(moves.path.astype(np.int32), self._m_path.shape[1])
            for k, p in zip(self._m_key[moves.member].tolist(), new, strict=True):
                self._pending_moves[k] = p
            self._row_hold[row[moves.member]] = math.inf
            self._moves += len(moves.member)
            self._dirty = True
            return
        lat = self.fabric.switch_latency_ns
        mem = moves.member
        old = self._m_path[mem]
        new = pad_paths(moves.path.astype(np.int32), self._m_path.shape[1])
        d_old = path_delay_ns(self.ct, old, lat)
        d_new = path_delay_ns(self.ct, new, lat)
        rows = row[mem]
        safe = moves.safe_mask()
        if safe.any():
            # the stream (and so its row) sends nothing until its last byte on the old path
            # has arrived: no reordering, an idle gap of one old-path delay (the streams moved
            # in one round resume together, after the longest of their delays: one rate
            # update instead of one per distinct delay)
            held = rows[safe]
            until = self.now + float(d_old[safe].max())
            self._row_hold[held] = np.maximum(self._row_hold[held], until)
            self._at(math.ceil(until), self._mark_dirty)
        if not safe.all():
            # bytes sent on a faster new path while older ones are still on the old path
            # arrive first: one reorder event per packet sent in that window
            now_rows = rows[~safe]
            rate = (self._rates[now_rows] if len(self._rates) == len(self._remaining)
                    else 0.0)
            ahead = np.maximum(d_old[~safe] - d_new[~safe], 0) * rate / 8.0
            events = np.ceil(ahead / self.fabric.mtu_bytes).astype(np.int64)
            for fid, ev in zip(self._row_flow[now_rows].tolist(), events.tolist(),
                               strict=True):
                self._reorder_moves[fid] = self._reorder_moves.get(fid, 0) + ev
        self._m_path[mem] = new
        self._moves += len(mem)
        self._restream(mem[moves.whole_set_mask()])
        self._weights_from_members(self._member_rows())

    def _livelock_message(self) -> str:
        """Why a stepping run stopped: it delivered nothing for :data:`NO_PROGRESS_NS` while
        flows were open and not held."""
        report = getattr(self.model, "report", None)
        dropped = float(getattr(report, "drops_bytes", 0.0) or 0.0)
        why = (f"{dropped / 2**30:.3g} GiB dropped and sent again so far: every step's "
               f"arrivals overflow a switch buffer and the senders go back N together; give "
               f"the switches more buffer (fabric.fluid.buffer_bytes_per_switch), or lower "
               f"fabric.pfc.xoff_bytes so PFC pauses the senders before it is full"
               if dropped > 0 else
               "the senders' bytes never arrive")
        return (f"no byte was delivered for {NO_PROGRESS_NS / 1e6:g} ms of simulated time "
                f"while flows were open (at {self.now / 1e6:.6g} ms): {why}")

    def _restream(self, mem: NDArray[np.int64]) -> None:
        """The streams of members ``mem`` (just moved) take their pair's whole planned set,
        if their policy has one for it (``stream_members``): one member per QP of the set,
        at its share, in place of the members they had (a stream's bytes keep their total).
        Only where the model follows rates, not bytes queued per member (``_stepping``)."""
        get = getattr(self.policy, "stream_members", None)
        if get is None or self._stepping or not len(mem):
            return
        rows = self._member_rows()
        code = rows * (int(self._m_stream.max()) + 1) + self._m_stream
        uniq, first = np.unique(code[mem], return_index=True)
        rep = mem[first]  # a member of each stream moved
        src, dst = self._member_endpoints(rep)
        sets = get(self._row_owner[rows[rep]], src, dst, now=self.now)
        drop = np.zeros(len(code), bool)
        add_flow, add_stream, add_share, add_path = [], [], [], []
        for c, m, got in zip(uniq.tolist(), rep.tolist(), sets, strict=True):
            if got is None:
                continue
            paths, shares = got
            on = code == c
            total = float(self._m_share[on].sum())
            drop |= on
            k = len(shares)
            add_flow.append(np.full(k, self._m_flow[m], np.int64))
            add_stream.append(np.full(k, self._m_stream[m], np.int64))
            add_share.append(shares * total)
            add_path.append(paths)
        if not add_flow:
            return
        self._keep_members(~drop)
        new_path = np.concatenate(add_path)
        width = max(self._m_path.shape[1], new_path.shape[1])
        k = len(new_path)
        keys = np.arange(self._n_members, self._n_members + k, dtype=np.int64)
        self._n_members += k
        self._m_flow = np.concatenate([self._m_flow, *add_flow])
        self._m_stream = np.concatenate([self._m_stream, *add_stream])
        self._m_share = np.concatenate([self._m_share, *add_share])
        self._m_path = np.concatenate([pad_paths(self._m_path, width),
                                       pad_paths(new_path, width)], axis=0)
        self._m_key = np.concatenate([self._m_key, keys])
        self._m_qp = np.concatenate([self._m_qp, keys])
        self._members_changed()

    def _keep_members(self, keep: NDArray[np.bool_]) -> None:
        """Only the members ``keep`` (a mask) are left, in order."""
        self._m_flow = self._m_flow[keep]
        self._m_stream = self._m_stream[keep]
        self._m_share = self._m_share[keep]
        self._m_path = self._m_path[keep]
        self._m_key = self._m_key[keep]
        self._m_qp = self._m_qp[keep]

    def _weights_from_members(self, row: NDArray[np.int64]) -> None:
        """Rows' weights again from their members' paths (after a path change): the sum of
        each member's path, scaled by its share (``row``: each member's row)."""
        self._w = self._member_weights(self._m_path, row)
        self._dirty = True

    def _member_weights(self, paths: NDArray, row: NDArray[np.int64]) -> sp.csr_matrix:
        """Rows x links: the sum of each member's path in ``paths`` (one per member, -1
        padded), scaled by its share (``row``: each member's row)."""
        unit = paths_to_weights(paths, self.ct.n_links)
        member_of = sp.csr_matrix((self._m_share, (row, np.arange(len(row)))),
                                  shape=(len(self._remaining), len(row)))
        return (member_of @ unit).tocsr()

    def _mark_dirty(self) -> None:
        self._dirty = True

    def _settle_moves(self) -> None:
        """Switch the held streams whose old path has drained (path-following models)."""
        keys = np.fromiter(self._pending_moves, np.int64, len(self._pending_moves))
        pos = np.minimum(np.searchsorted(self._m_key, keys), max(len(self._m_key) - 1, 0))
        alive = (len(self._m_key) > 0) & (self._m_key[pos] == keys) if len(self._m_key) \
            else np.zeros(len(keys), bool)
        in_flight = self.model.in_flight_bytes(keys)  # type: ignore[attr-defined]
        ready = ~alive | (in_flight <= 1e-3)
        if not ready.any():
            return
        row = np.searchsorted(self._row_flow, self._m_flow)
        for k, a, r in zip(keys.tolist(), alive.tolist(), ready.tolist(), strict=True):
            if not r:
                continue
            p = self._pending_moves.pop(k)
            if a:
                i = int(np.searchsorted(self._m_key, k))
                self._m_path[i] = p
        waiting = {int(np.searchsorted(self._m_key, k)) for k in self._pending_moves}
        held_rows = {int(row[i]) for i in waiting if i < len(row)}
        release = [r for r in np.flatnonzero(np.isinf(self._row_hold)).tolist()
                   if r not in held_rows]
        self._row_hold[release] = -np.inf
        self._weights_from_members(row)

    # ------------------------------------------------------------- scheduling
    def _at(self, time_ns: int, fn: Callable[[], None], idle: bool = False) -> None:
        """Call ``fn`` at ``time_ns``. An ``idle`` event (a policy's periodic round) does
        nothing once no flow is left: the run does not wait for it to end."""
        if time_ns < self.now:
            raise SimulationError(f"event scheduled in the past ({time_ns} < {self.now})")
        heapq.heappush(self._heap, (int(time_ns), self._seq, fn))
        if idle:
            self._idle_seqs.add(self._seq)
        self._seq += 1

    def _start_iteration(self, j: int, it: int) -> None:
        if j in self._aborted:
            return
        self._iter_start[(j, it)] = self.now
        self._at(self.now + self.jobs[j].compute_ns, lambda: self._start_collective(j, it, 0))

    def _start_collective(self, j: int, it: int, c: int) -> None:
        if j in self._aborted:
            return
        self._coll_start[(j, it, c)] = self.now
        self._start_stage(j, it, c, 0)

    def _start_stage(self, j: int, it: int, c: int, s: int) -> None:
        if j in self._aborted:
            return
        plan = self.jobs[j].collectives[c]
        if s >= len(plan.stages):
            self._finish_collective(j, it, c)
            return
        stage = plan.stages[s]
        sid = self._next_stage_id
        self._next_stage_id += 1
        st = _Stage(j, it, c, s, deliver_ns=self.now)
        self._stages[sid] = st
        if stage.n_transfers == 0:
            self._at(self.now, lambda: self._stage_done(sid))
            return
        key = (j, c, s)
        routed = self._route_cache.get(key)
        if routed is None:
            batch = TransferBatch(stage.src, stage.dst, stage.size_bytes, stage.group,
                                  np.full(stage.n_transfers, j, np.int64))
            try:
                routed = self.policy.route(batch)
            except TopologyError as err:  # (links down left a pair of it without a path)
                self._no_route(j, lambda: self._start_stage(j, it, c, s), str(err),
                               stage.src, stage.dst)
                return
            if self.policy.static:
                self._route_cache[key] = routed
        st.outstanding = len(routed)
        self._add_rows(routed, sid, stage.hops, owner=j,
                       tclass=TRAFFIC_CLASSES.index(self.jobs[j].traffic_class))

    def _stage_done(self, sid: int) -> None:
        st = self._stages.pop(sid, None)
        if st is None:  # its job was stopped
            return
        self._start_stage(st.job, st.iteration, st.coll, st.stage + 1)

    def _finish_collective(self, j: int, it: int, c: int) -> None:
        job = self.jobs[j]
        plan: CollectivePlan = job.collectives[c]
        self._collectives.append(CollectiveRecord(
            job=job.name, iteration=it, index=c, op=str(plan.op), algorithm=plan.algorithm,
            n_ranks=plan.n_ranks, size_bytes=plan.size_bytes,
            start_ns=self._coll_start.pop((j, it, c)), end_ns=self.now))
        self._done_units += 1
        if self.progress is not None:
            self.progress(self._done_units, self._total_units)
        if c + 1 < len(job.collectives):
            self._start_collective(j, it, c + 1)
            return
        self._iterations.append(IterationRecord(job.name, it, self._iter_start.pop((j, it)),
                                                self.now))
        if it + 1 < job.iterations:
            self._start_iteration(j, it + 1)
        else:
            self._jobs_done.add(j)

    # ------------------------------------------------------------------ flows
    def _add_mice(self, i: int, j: int) -> None:
        self._route_mice(np.arange(i, j, dtype=np.int64))

    def _route_mice(self, idx: NDArray[np.int64], arrived_ns: int | None = None) -> None:
        """Start the mice ``idx`` (of :attr:`mice`) now. Links down may leave one no path:
        it waits for a repair that may give it one (``arrived_ns``: when it came, its start
        for its FCT), or is dropped and counted if none will."""
        m = self.mice
        assert m is not None
        n = len(idx)
        batch = TransferBatch(m.src[idx], m.dst[idx], m.size_bytes[idx],
                              np.full(n, -1, np.int64), np.full(n, -1, np.int64))
        try:
            routed = self.policy.route(batch)
        except TopologyError as err:  # links down: a mouse with no path waits or is dropped
            if self._timeline is None:
                raise SimulationError(f"{err}: the fabric is not connected") from None
            ok = np.zeros(n, np.bool_)
            got = []  # (each mouse routed once: a policy may keep state per route)
            for k in range(n):
                one = TransferBatch(*(a[k:k + 1] for a in (batch.src, batch.dst,
                                                           batch.size_bytes, batch.group,
                                                           batch.job)))
                try:
                    got.append(self.policy.route(one))
                    ok[k] = True
                except TopologyError:
                    pass
            for k in idx[~ok].tolist():
                self._no_mouse_route(lambda k=k: self._retry_mouse(k))
            if not got:
                return
            routed = concat_routed(got)
        self._add_rows(routed, -1, 1, owner=MICE_OWNER, tclass=self._mice_class,
                       start_ns=arrived_ns)

    def _retry_mouse(self, k: int) -> None:
        """Mouse ``k``, which found no path when it came, tries again."""
        assert self.mice is not None
        self._mice_waiting -= 1
        self._route_mice(np.array([k], np.int64), int(self.mice.time_ns[k]))

    def _alone_rate_gbps(self, weights: sp.csr_matrix) -> NDArray[np.float64]:
        """Each row's rate alone on the empty fabric, the bottleneck rate of its FCT slowdown:
        that of its members' own links (NIC, NVLink; :func:`alone_rate_gbps` over those
        columns). Not over the policy's fabric paths: two members of a flow that a policy
        hashes onto one link are slowed by the policy, not by the flow alone (for a row
        with no such link, all of its links)."""
        cap = self.links.capacity_gbps
        w = sp.csr_matrix(weights.multiply(self._host_col[None, :].astype(np.float64)))
        w.eliminate_zeros()
        alone = alone_rate_gbps(w, cap)
        none = ~np.isfinite(alone)
        if none.any():
            alone[none] = alone_rate_gbps(sp.csr_matrix(weights)[none], cap)
        return alone

    def _add_rows(self, routed: RoutedBatch, sid: int, hops: int, owner: int,
                  tclass: int = 0, start_ns: int | None = None) -> None:
        """Start the rows of ``routed`` now (``start_ns``: when their transfer came, if it
        waited for a path: the flows' start, for their FCT)."""
        n = len(routed)
        first_row = len(self._remaining)
        ids = np.arange(self._n_flows, self._n_flows + n, dtype=np.int64)
        self._n_flows += n
        wire = self.fabric.wire_bytes(routed.size_bytes)
        if n and not self._ethernet_col.all():
            on_ethernet = np.asarray(sp.csr_matrix(routed.weights)
                                     @ self._ethernet_col.astype(np.float64)).ravel() > 0
            wire = np.where(on_ethernet, wire, np.asarray(routed.size_bytes, np.int64))
        latency = hops * (routed.path_delay_ns + self.fabric.nic_latency_ns)
        alone = self._alone_rate_gbps(routed.weights)
        alone_fct = latency + np.ceil(wire * 8.0 / alone).astype(np.int64)
        meta = self._stages.get(sid)
        self._flows.add(
            owner=np.full(n, owner, np.int64),
            iteration=np.full(n, meta.iteration if meta else -1, np.int64),
            collective=np.full(n, meta.coll if meta else -1, np.int64),
            stage=np.full(n, meta.stage if meta else -1, np.int64),
            src=routed.src, dst=routed.dst, members=routed.members,
            size_bytes=routed.size_bytes, wire_bytes=wire,
            start_ns=np.full(n, self.now if start_ns is None else start_ns, np.int64),
            latency_ns=latency.astype(np.int64),
            alone_fct_ns=alone_fct,
        )
        # a receiver that cannot take reordered packets makes the sender resend some
        resend = np.zeros(n)
        if routed.wire_factor is not None:
            resend = wire * (routed.wire_factor - 1.0)
        events = np.zeros(n, np.int64)
        if routed.reorder_per_packet is not None:
            packets = -(-routed.size_bytes // self.fabric.mtu_bytes) * routed.members
            events = np.round(packets * routed.reorder_per_packet).astype(np.int64)
        if routed.reorder_events is not None:
            events = events + routed.reorder_events
        self._resend_chunks.append(resend * routed.members)
        self._reorder_chunks.append(events)
        self._w = sp.vstack([self._w, routed.weights], format="csr")
        self._remaining = np.concatenate([self._remaining, (wire + resend).astype(np.float64)])
        self._row_flow = np.concatenate([self._row_flow, ids])
        self._row_stage = np.concatenate([self._row_stage, np.full(n, sid, np.int64)])
        self._row_latency = np.concatenate([self._row_latency, latency.astype(np.int64)])
        self._row_hop_ns = np.concatenate([self._row_hop_ns, (
            routed.path_delay_ns + self.fabric.nic_latency_ns).astype(np.int64)])
        self._row_start = np.concatenate([self._row_start, np.full(n, self.now, np.int64)])
        self._row_class = np.concatenate([self._row_class, np.full(n, tclass, np.int64)])
        self._row_bytes = np.concatenate([self._row_bytes, wire.astype(np.float64)])
        self._row_hold = np.concatenate([self._row_hold, np.full(n, -np.inf)])
        self._row_cap = np.concatenate([self._row_cap, np.full(n, np.inf)
                                        if routed.rate_cap_gbps is None else routed.rate_cap_gbps])
        # (a member would send its NIC's rate, or less where the row's own members share a
        # link of its hosts: the four transfers of a tree GPU's NIC, at a quarter each)
        nic = self.ct.rate_gbps[self.ct.gpu_up[routed.src]].astype(np.float64)
        self._row_demand = np.concatenate([self._row_demand, np.minimum(nic, alone)])
        self._row_src = np.concatenate([self._row_src, routed.src.astype(np.int64)])
        self._row_dst = np.concatenate([self._row_dst, routed.dst.astype(np.int64)])
        self._row_owner = np.concatenate([self._row_owner, np.full(n, owner, np.int64)])
        self._row_single = np.concatenate([self._row_single, routed.members == 1])
        if self._track:
            r = routed.routes
            if r is None:
                raise SimulationError(
                    f"policy {self.policy.name!r} gives no paths for the {self.model.name} model")
            k = len(r.row)
            self._m_flow = np.concatenate([self._m_flow, ids[r.row]])
            self._m_stream = np.concatenate([self._m_stream, r.stream])
            self._m_share = np.concatenate([self._m_share, r.share])
            width = max(self._m_path.shape[1], r.path.shape[1])
            self._m_path = np.concatenate(
                [pad_paths(self._m_path, width), pad_paths(r.path, width)], axis=0)
            keys = np.arange(self._n_members, self._n_members + k, dtype=np.int64)
            self._m_key = np.concatenate([self._m_key, keys])
            self._m_qp = np.concatenate([self._m_qp, _qp_keys(r, keys)])
            self._n_members += k
        self._dirty = True
        if self._timeline is not None:
            self._fault_new_rows(first_row)
        if self._rebalancing and not self._rebalance_pending:
            self._rebalance_pending = True
            self._at(self.now + int(self.policy.rebalance_interval_ns),  # type: ignore[attr-defined]
                     self._rebalance, idle=True)

    def _recompute(self) -> None:
        caps = np.where(self._row_hold > self.now, 0.0, self._row_cap)
        w = self._w
        if self._timeline is not None:  # (bytes into dead links load nothing beyond them)
            self._fault_rows()
            w, caps = self._into_dead_links(w, caps)
        members = None
        if self._stepping:
            members = MemberPaths(
                row=np.searchsorted(self._row_flow, self._m_flow), stream=self._m_stream,
                share=self._m_share, path=self._m_path, flow_id=self._m_flow, key=self._m_key,
                qp=self._m_qp)
        self.model.on_change(ActiveFlows(w, self._remaining, caps, self._row_bytes,
                                         self._row_class, members))
        self._rates = self.model.rates_gbps()
        self._load = (w.T @ self._rates if len(self._rates)
                      else np.zeros(len(self.links.capacity_gbps)))
        self._n_rate_updates += 1
        self._dirty = False
        if self._timeline is not None:
            self._goodput = self._goodput_of(self._rates)
            self._fault_recovery()
        else:
            self._goodput = self._rates

    def _earliest_finish(self) -> tuple[float, NDArray[np.bool_]]:
        if not self._remaining.size:
            return math.inf, np.zeros(0, bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            ttf = np.where(self._remaining <= 0, 0.0, self._remaining * 8.0 / self._goodput)
        t_min = float(ttf.min())
        if not np.isfinite(t_min):
            return math.inf, np.zeros(len(ttf), bool)
        running = (self.now + t_min) - self._row_start
        batch = ttf <= t_min + self.eps * running + 1.0
        return self.now + math.ceil(t_min), batch

    def _advance(self, t_ns: int) -> None:
        dt = t_ns - self.now
        if dt < 0:
            raise SimulationError("time went backwards")
        if dt > 0:
            delivered = self.model.advance(dt)
            if delivered is not None:  # a path-following model moved the bytes itself
                if self._remaining.size:
                    self._remaining -= delivered
            elif self._remaining.size:
                if self._timeline is not None:
                    self._fault_account(dt)
                self._remaining -= self._goodput * dt / 8.0
                self._link_bytes += self._load * dt / 8.0
                np.maximum(self._peak, self._load / self.links.capacity_gbps, out=self._peak)
            elif self._timeline is not None and self._waiting_jobs:
                self._fault_account(dt)  # (no flow open: jobs waiting for a repair stall)
            self.now = t_ns

    def _complete(self, batch: NDArray[np.bool_]) -> None:
        if not batch.any():
            return
        done = np.flatnonzero(batch)
        ids = self._row_flow[done]
        self._end_send.append((ids, np.full(len(ids), self.now, np.int64)))
        flows_done = self._flows_done_hook
        if flows_done is not None:
            one = done[self._row_single[done]]
            flows_done(self._row_owner[one], self._row_src[one], self._row_dst[one], self.now)
        deliver = self.now + self._row_latency[done]
        stages = self._row_stage[done]
        owned = stages >= 0  # mice belong to no stage
        if owned.any():
            order = np.argsort(stages[owned], kind="stable")
            sids, first, counts = np.unique(stages[owned][order], return_index=True,
                                            return_counts=True)
            last = np.maximum.reduceat(deliver[owned][order], first)
            for sid, n_done, t in zip(sids.tolist(), counts.tolist(), last.tolist(),
                                      strict=True):
                st = self._stages[sid]
                st.outstanding -= n_done
                st.deliver_ns = max(st.deliver_ns, t)
                if st.outstanding == 0:
                    self._at(st.deliver_ns, lambda sid=sid: self._stage_done(sid))
        # integer-ns steps overshoot (remaining < 0) and batching finishes early (remaining > 0)
        # by a few bytes: settle them on the links so link bytes equal wire bytes exactly
        left = self._remaining[done]
        if not self._stepping:
            self._link_bytes += self._w[done].T @ left
        self._drop_rows(~batch, ids)

    def _drop_rows(self, keep: NDArray[np.bool_], ids: NDArray[np.int64]) -> None:
        """Forget the rows not in ``keep`` (flow ids ``ids``) and their members."""
        self._w = self._w[keep]
        self._remaining = np.maximum(self._remaining[keep], 0.0)
        self._row_flow = self._row_flow[keep]
        self._row_stage = self._row_stage[keep]
        self._row_latency = self._row_latency[keep]
        self._row_hop_ns = self._row_hop_ns[keep]
        self._row_start = self._row_start[keep]
        self._row_class = self._row_class[keep]
        self._row_bytes = self._row_bytes[keep]
        self._row_hold = self._row_hold[keep]
        self._row_cap = self._row_cap[keep]
        self._row_demand = self._row_demand[keep]
        self._row_src = self._row_src[keep]
        self._row_dst = self._row_dst[keep]
        self._row_owner = self._row_owner[keep]
        self._row_single = self._row_single[keep]
        if self._track:
            self._keep_members(~np.isin(self._m_flow, ids))
        # (rows just added have no rate yet: the rates cover a prefix of the rows)
        self._rates = self._rates[keep[:len(self._rates)]]
        if len(self._goodput) == len(keep):
            self._goodput = self._goodput[keep]
        self._dirty = True

    def _abort_job(self, j: int, why: str) -> None:
        """Stop job ``j`` (no path left for some of its flows): its flows are dropped, its
        stages forgotten, and nothing more of it is scheduled."""
        self._aborted[j] = why
        self._jobs_done.add(j)
        self._waiting_jobs.pop(j, None)  # (a stopped job stalls no more)
        mine = self._row_owner == j
        self._never_resent(self._row_flow[mine])
        self._drop_rows(~mine, self._row_flow[mine])
        for sid in [sid for sid, st in self._stages.items() if st.job == j]:
            del self._stages[sid]
