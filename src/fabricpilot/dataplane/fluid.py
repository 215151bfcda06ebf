"""The fluid rate model: egress queues, ECN, DCQCN, PFC (pause, HoL, storms, deadlock),
lossy drops with go-back-N, and QoS priorities, advanced in small time steps.

State is per *member*: one path of one stream of a rate-model row (an independent transfer has
one member; the streams of a ring one member each; a sprayed flow one member per path). Each
member holds its bytes queued at the egress of every hop of its path (``backlog[M, H]``; hop 0
is the sending NIC). Congestion control is per QP: a member is a QP of its own, but the paths
of a sprayed QP share one DCQCN state, which every CNP cuts, and split its rate by their
shares. One step of ``dt``:

1. the NIC injects up to the DCQCN rate (and one step's worth of line rate per QP);
2. every egress (port, priority) serves its queue: the scheduler splits the port's capacity
   among priorities that are not paused (strict or weighted) and each queue serves its members
   in proportion to their backlog (FIFO as a fluid); served bytes move one hop on, or are
   delivered at the last hop;
3. arrivals beyond a queue's buffer are dropped, and the member goes back N: it resends its
   dropped bytes and everything it had sent after them;
4. PFC: a switch ingress whose buffered bytes (per priority) cross XOFF pauses the upstream
   egress of that priority after the link delay, XON resumes it; a paused egress sends nothing
   of that priority, whichever port its bytes are bound for (head-of-line blocking);
5. ECN marks by RED on each egress queue; receivers turn marks into CNPs and senders run
   DCQCN (:mod:`fabricpilot.dataplane.dcqcn`);
6. the pause graph (which paused egress waits on which) gives the depth of every pause
   (storms) and its cycles (deadlocks, broken by the PFC watchdog if enabled).

The step is ``step_ns`` while PFC acts (a pause in force or on its way, an ingress above
XON) or a loss is being recovered. Otherwise it grows, never past the next DCQCN event or
queue threshold crossing (extrapolated from the last step): up to ``max_busy_step_ns`` while
switches queue or QPs run below line rate, up to ``max_quiet_step_ns`` while the fabric is
quiet (see :class:`~fabricpilot.dataplane.params.FluidParams` for what each costs in accuracy).
A QP keeps at most one base step of bytes in its NIC whatever the step (back-pressure), so a
long step cannot let NIC-side queues absorb DCQCN's rate cuts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from fabricpilot.arrays import distinct
from fabricpilot.dataplane import fluid_kernels as fk
from fabricpilot.dataplane.dcqcn import DcqcnState, notification_point, reaction_point
from fabricpilot.dataplane.params import (
    DcqcnParams,
    EcnParams,
    FabricParams,
    FluidParams,
    PfcParams,
)
from fabricpilot.dataplane.qos import N_PRIORITIES, QosParams
from fabricpilot.dataplane.rates import ActiveFlows, LinkState
from fabricpilot.dataplane.timeseries import TimeSeries
from fabricpilot.errors import SimulationError
from fabricpilot.topology.compiled import CompiledTopology

P = N_PRIORITIES


@dataclass
class PfcEvent:
    """A pause storm or a deadlock, for the report."""

    kind: str  # "storm" or "deadlock"
    time_ns: int
    ports: list[str]
    hops: int = 0
    cleared_by_watchdog: bool = False


@dataclass
class FluidReport:
    """What the fluid model measured over a run."""

    ecn_marks: float = 0.0
    drops_bytes: float = 0.0
    retransmitted_bytes: float = 0.0
    pause_frames: int = 0
    pfc_pause_ns_total: float = 0.0
    events: list[PfcEvent] = field(default_factory=list)
    flow_retx_bytes: dict[int, float] = field(default_factory=dict)
    port_pause_ns: NDArray[np.float64] | None = None      # [links, priorities]
    port_pause_frames: NDArray[np.int64] | None = None
    port_ecn_marks: NDArray[np.float64] | None = None
    port_drops_bytes: NDArray[np.float64] | None = None
    timeseries: TimeSeries = field(default_factory=lambda: TimeSeries(10_000.0, 2_000_000))

    @property
    def pfc_storms(self) -> int:
        return sum(1 for e in self.events if e.kind == "storm")

    @property
    def deadlocks(self) -> int:
        return sum(1 for e in self.events if e.kind == "deadlock")


class FluidRateModel:
    """Time-stepped fluid model of queues, ECN, DCQCN and PFC (see the module docstring)."""

    name = "fluid"
    needs_paths = True

    def __init__(
        self,
        topology: CompiledTopology,
        fabric: FabricParams | None = None,
        *,
        ecn: EcnParams | None = None,
        dcqcn: DcqcnParams | None = None,
        pfc: PfcParams | None = None,
        fluid: FluidParams | None = None,
        qos: QosParams | None = None,
    ) -> None:
        self.ct = topology
        self.fabric = fabric or FabricParams()
        self.ecn = ecn or EcnParams()
        self.cc = dcqcn or DcqcnParams()
        self.pfc = pfc or PfcParams()
        self.fp = fluid or FluidParams()
        self.qos = qos or QosParams()
        ct = topology
        n_links = ct.n_links
        self.n_links = n_links
        # node -> priority of each class at that node's egress (hosts: the fabric-wide map)
        node_names = list(ct.node_names)
        self._prio_of_node = self.qos.priority_table(node_names)
        self._is_switch_node = ct.switch_of_node >= 0
        self._src_is_switch = self._is_switch_node[ct.link_src]
        self._dst_is_switch = self._is_switch_node[ct.link_dst]
        self._lossless = self.qos.lossless_mask() & self.pfc.enabled
        self._weights = np.array([self.qos.weights.get(p, 1.0) for p in range(P)])
        self._pause_delay = ct.delay_ns.astype(np.float64) + self.pfc.response_ns
        # each port's ECN thresholds (at its rate) and those the step size watches for
        self._kmin_link, self._kmax_link = self.ecn.thresholds(ct.rate_gbps)
        self._queue_thresholds = np.unique(np.concatenate((
            self._kmin_link, self._kmax_link, [float(self.fp.buffer_bytes_per_port)])))
        self._ingress_thresholds = np.array([self.pfc.xon_bytes, self.pfc.xoff_bytes],
                                            np.float64)
        self.reset(LinkState(ct.rate_gbps.copy(), ct.delay_ns.copy()))

    # ------------------------------------------------------------------ protocol
    def reset(self, links: LinkState) -> None:
        n = self.n_links
        self.now = 0.0
        self._keys = np.zeros(0, np.int64)
        self._m = _Members.empty()
        self._progress_row = np.zeros(0)
        self._rates_row = np.zeros(0)
        self._rx_xoff = np.zeros((n, P), bool)      # ingress (at dst(l)) has sent XOFF
        self._tx_paused = np.zeros((n, P), bool)    # egress (at src(l)) is paused
        self._pending_at = np.full((n, P), np.inf)
        self._pending_val = np.zeros((n, P), bool)
        self._paused_since = np.full((n, P), np.inf)
        self._wd_until = np.full((n, P), -np.inf)  # PFC watchdog: pauses ignored until then
        self._in_storm = np.zeros((n, P), bool)
        self._deadlock_since: dict[frozenset[int], float] = {}
        self._link_bytes_total = np.zeros(n)
        self._link_peak = np.zeros(n)
        self._grid_peak = np.zeros(0)
        self._queue_cells = np.zeros((0, 0))
        self._switch_queue_bytes = 0.0
        self._step_bytes = np.zeros(0)
        self._last_dt = 0.0
        self._n_xoff = 0            # ingresses with XOFF asserted
        self._n_paused = 0          # egresses paused
        self._next_pending = np.inf  # earliest pause / resume still on its way
        self._wd_active_until = -np.inf
        # per-step accumulators on the grid of the current members, folded into the per-link
        # arrays when the grid changes, at each sample and at the end
        self._grid_bytes = np.zeros(0)
        self._grid_marks = np.zeros((0, 0))
        self.report = FluidReport(
            port_pause_ns=np.zeros((n, P)), port_pause_frames=np.zeros((n, P), np.int64),
            port_ecn_marks=np.zeros((n, P)), port_drops_bytes=np.zeros((n, P)),
            timeseries=TimeSeries(float(self.fp.sample_interval_ns), self.fp.max_timeseries_rows))
        self._next_sample = 0.0
        self._sample_acc = np.zeros(n)
        self._sample_in_links = False  # the per-link sample arrays hold something
        self._sample_marks = np.zeros(n)
        self._sample_t0 = 0.0
        self._horizon = float(self.fp.step_ns)
        self._prev_cells: NDArray[np.float64] | None = None
        self._prev_ingress: NDArray[np.float64] | None = None

    def on_change(self, flows: ActiveFlows) -> None:
        mem = flows.members
        if mem is None:
            raise SimulationError("the fluid model needs per-member paths from the policy")
        old, old_keys = self._m, self._keys
        self._fold_grid(old)
        new = _Members.build(self, flows)
        if len(old_keys):
            pos = np.searchsorted(old_keys, new.key)
            pos = np.minimum(pos, len(old_keys) - 1)
            found = old_keys[pos] == new.key
            src = pos[found]
            dst = np.flatnonzero(found)
            new.backlog[dst] = old.backlog[src]
            new.injected[dst] = old.injected[src]
            new.delivered[dst] = old.delivered[src]
            new.retx[dst] = old.retx[src]
            new.stall_until[dst] = old.stall_until[src]
            new.junk[dst] = old.junk[src]
            new.rewind[dst] = old.rewind[src]
            new.nack_at[dst] = old.nack_at[src]
            # congestion control is per QP (the members of a sprayed QP share one)
            qpos = np.minimum(np.searchsorted(old.qp_key, new.qp_key), len(old.qp_key) - 1)
            qfound = old.qp_key[qpos] == new.qp_key
            new.cc.put(np.flatnonzero(qfound), old.cc.take(qpos[qfound]))
            # members that left carry their retransmission count into the report
            gone = np.ones(len(old_keys), bool)
            gone[src] = False
            self._archive_retx(old, np.flatnonzero(gone))
        # a row capped at zero (its stream is waiting for an old path to drain) injects nothing
        held = flows.rate_cap_gbps[new.row] <= 0 if len(new.row) else np.zeros(0, bool)
        new.stall_until[held] = np.inf
        new.stall_until[~held & np.isposinf(new.stall_until)] = -np.inf
        self._m, self._keys = new, new.key
        self._progress_row = new.row_progress()
        self._rates_row = np.zeros(new.n_rows)
        self._horizon = self._first_horizon(new)
        self._prev_cells = None
        self._prev_ingress = None
        self._grid_bytes = np.zeros(len(new.ulinks))
        self._grid_peak = np.zeros(len(new.ulinks))
        self._grid_marks = np.zeros((len(new.ulinks), len(new.uprios)))
        self._queue_cells = np.zeros((len(new.ulinks), len(new.uprios)))

    def _first_horizon(self, m: _Members) -> float:
        """The first step after the flows changed: ``step_ns``, or less if a row that has
        just started could be done sooner, all its members sending at their NIC's line rate
        (else a transfer shorter than a step took a whole step: 4 KiB at 400 Gb/s, 84 ns,
        took 500). Rows already sending are left to the steps (the engine's estimate of
        their end from their rates): cut short at each of their ends, a congested run's
        completions came one per step, not together, and took three times as long."""
        step = float(self.fp.step_ns)
        if not m.n:
            return step
        new = np.bincount(m.row, weights=m.injected > 0, minlength=m.n_rows) == 0
        row_ns = np.zeros(m.n_rows)
        np.maximum.at(row_ns, m.row, m.target * 8.0 / np.maximum(m.line_rate, 1e-9))
        short = new & (row_ns > 0) & (row_ns < step)
        if not short.any():
            return step
        return float(max(math.ceil(float(row_ns[short].min())), 1))

    def _fold_grid(self, m: _Members, into_sample: bool = True) -> None:
        """Add the grid accumulators of members ``m`` into the per-link arrays (also into
        the current sample's unless ``into_sample`` is False: it was just taken)."""
        if len(self._grid_bytes) == len(m.ulinks) and len(m.ulinks):
            if into_sample:
                self._sample_acc[m.ulinks] += self._grid_bytes
                self._sample_marks[m.ulinks] += self._grid_marks.sum(axis=1)
                self._sample_in_links = True
            self._link_bytes_total[m.ulinks] += self._grid_bytes
            np.maximum(self._link_peak[m.ulinks], self._grid_peak,
                       out=self._grid_peak)
            self._link_peak[m.ulinks] = self._grid_peak
            assert self.report.port_ecn_marks is not None
            self.report.port_ecn_marks[self._grid(m)] += self._grid_marks
        self._grid_bytes = np.zeros(len(m.ulinks))
        self._grid_peak = np.zeros(len(m.ulinks))
        self._grid_marks = np.zeros((len(m.ulinks), len(m.uprios)))

    def rates_gbps(self) -> NDArray[np.float64]:
        return self._rates_row

    def max_step_ns(self) -> float:
        return self._horizon

    def link_usage(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        self._fold_grid(self._m)
        return self._link_bytes_total.copy(), self._link_peak.copy()

    def in_flight_bytes(self, keys: NDArray[np.int64]) -> NDArray[np.float64]:
        """Bytes of each member (by key) still inside the fabric, past its NIC (0 if the
        member is gone)."""
        out = np.zeros(len(keys))
        if not len(self._keys):
            return out
        pos = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        found = self._keys[pos] == keys
        out[found] = self._m.backlog[pos[found], 1:].sum(axis=1)
        return out

    def link_bytes_now(self) -> NDArray[np.float64]:
        """The bytes each link has carried so far: those folded in, and the current
        members' grid accumulators (not folded: the samples stay as they are)."""
        out = self._link_bytes_total.copy()
        m = self._m
        if len(self._grid_bytes) == len(m.ulinks) and len(m.ulinks):
            out[m.ulinks] += self._grid_bytes
        return out

    def link_state_now(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        load = np.zeros(self.n_links)
        queue = np.zeros(self.n_links)
        m = self._m
        if len(m.ulinks) and self._last_dt > 0 and len(self._step_bytes) == len(m.ulinks):
            load[m.ulinks] = self._step_bytes * 8.0 / self._last_dt
        if len(m.ulinks) and self._queue_cells.shape[0] == len(m.ulinks):
            queue[m.ulinks] = self._queue_cells.sum(axis=1)
        return load, queue

    def advance(self, dt_ns: int) -> NDArray[np.float64]:
        """Move ``dt_ns`` on; returns the bytes each row delivered (progress of its slowest
        stream)."""
        m = self._m
        if m.n == 0:
            self.now += dt_ns
            return np.zeros(0)
        dt = float(dt_ns)
        self._apply_pending_pauses()
        self._go_back(m)
        waiting = m.rewind > 0.0  # (what these send until their NACK is back is junk)
        before = m.injected[waiting] if waiting.any() else None
        sent = self._inject(m, dt)
        if before is not None:  # (junk before it is served: a loss of it eats junk)
            before = self._junk_sent(m, waiting, before)
        served_lp, delivered = self._serve(m, dt)
        # a NIC port holds about one base step of bytes over all its QPs; what it could not
        # send in this step stays with the QPs (back-pressure), however long the step
        fk.nic_hold(m.backlog, m.injected, sent, m.first_port, m.hold_bytes)
        if before is not None:  # (what the NIC held back of it is junk no more)
            self._junk_sent(m, waiting, before)
        self._pfc(m, dt)
        self._mark(m, served_lp, delivered, dt)
        if self.cc.enabled:
            reaction_point(m.cc, m.per_qp(sent), m.qp_line, self.now + dt, dt, self.cc)
        self._count(m, served_lp, dt)
        self.now += dt
        self._sample()
        old = self._progress_row
        self._progress_row = m.row_progress()
        done_bytes = self._progress_row - old
        self._rates_row = done_bytes * 8.0 / dt
        self._horizon = self._next_horizon(m, dt)
        return done_bytes

    # ------------------------------------------------------------------ steps
    def _go_back(self, m: _Members) -> None:
        """Members whose NACK is back go back N: they send again from their first loss on
        (what they lost and all they sent after it, counted as retransmitted)."""
        due = np.flatnonzero((m.rewind > 0.0) & (m.nack_at <= self.now))
        if len(due):
            back = m.rewind[due]
            m.injected[due] -= back
            m.retx[due] += back
            self.report.retransmitted_bytes += float(back.sum())
            m.rewind[due] = 0.0
            m.nack_at[due] = -np.inf

    @staticmethod
    def _junk_sent(m: _Members, waiting: NDArray[np.bool_], before: NDArray[np.float64]
                   ) -> NDArray[np.float64]:
        """What members ``waiting`` for a NACK injected since ``before`` (their injected
        bytes then; less than none if the NIC held some back) is junk, to be sent again
        after the NACK. Returns their injected bytes now. (Junk never goes below zero: a
        shortfall is sent again too, so that every byte counted as junk is also counted
        as to be sent again, and a member never waits for bytes nobody sends.)"""
        now = m.injected[waiting]
        junk = m.junk[waiting] + (now - before)
        short = np.maximum(-junk, 0.0)
        m.junk[waiting] = junk + short
        m.rewind[waiting] += now - before + short
        return now

    def _inject(self, m: _Members, dt: float) -> NDArray[np.float64]:
        # coupled streams: the row's progress as of the end of the last step; a capped
        # member's NIC sends at most its cap, whatever its congestion control allows
        rate = m.qp_rate()
        if m.rate_cap is not None:
            rate = np.minimum(rate, m.rate_cap)
        return fk.inject(m.backlog, m.injected, m.target, rate, m.line_rate, m.stall_until,
                         self.now, dt, m.coupled_any, m.stream, m.stream_row, m.share,
                         self._progress_row, float(self.fp.window_bytes))

    def _grid(self, m: _Members) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Index of the used (link, priority) grid into the [links, priorities] state."""
        return np.ix_(m.ulinks, m.uprios)  # type: ignore[return-value]

    def _serve(self, m: _Members, dt: float) -> tuple[NDArray[np.float64], NDArray]:
        """Serve the egress queues for one step, in passes: bytes served at one hop arrive
        at the next and may go on in the same step with the capacity left there (cut-through
        when uncongested; newly arrived bytes queue behind those already waiting).

        Returns the bytes each used (link, priority) sent, ``[used links, used priorities]``.
        """
        width = len(m.uprios)
        cap = m.ulink_rate * dt / 8.0
        if self._n_paused:
            eligible = ~self._tx_paused[self._grid(m)].reshape(-1)
        else:
            eligible = np.ones(len(m.ulinks) * width, bool)
        total = np.zeros(len(m.ulinks) * width)
        delivered = np.zeros(m.n)
        cell_drops = np.zeros(len(m.ulinks) * width)
        dropped = fk.serve_step(
            m.backlog, m.cidx, m.plen, m.cell_col, cap, eligible,
            self.qos.scheduler == "strict", self._weights[m.uprios], width, m.at_switch,
            m.egress_switch, m.cell_lossy, m.cell_switch, float(self.fp.buffer_bytes_per_port),
            float(self.fp.buffer_bytes_per_switch), self.ct.n_switches, m.injected, m.junk,
            m.rewind, m.nack_at, m.rtt, self.now + self.fp.nack_ns, total, delivered,
            cell_drops)
        if dropped > 0:
            assert self.report.port_drops_bytes is not None
            self.report.port_drops_bytes[self._grid(m)] += cell_drops.reshape(-1, width)
            self.report.drops_bytes += dropped
        # junk arrives first (it is ahead of anything sent again) and is discarded
        useful = delivered
        if m.junk.any():
            eaten = np.minimum(delivered, m.junk)
            m.junk -= eaten
            useful = delivered - eaten
        m.delivered += useful
        self._delivered_step = useful
        return total.reshape(len(m.ulinks), width), delivered

    def _apply_pending_pauses(self) -> None:
        if self._next_pending > self.now:
            return
        due = self._pending_at <= self.now
        if due.any():
            self._tx_paused[due] = self._pending_val[due]
            self._pending_at[due] = np.inf
            newly = due & self._tx_paused & ~np.isfinite(self._paused_since)
            self._paused_since[newly] = self.now
            self._paused_since[due & ~self._tx_paused] = np.inf
        self._pause_state_changed()

    def _pause_state_changed(self) -> None:
        """Refresh the counters that let quiet steps skip the per-port PFC arrays."""
        self._n_paused = int(self._tx_paused.sum())
        self._n_xoff = int(self._rx_xoff.sum())
        self._next_pending = float(self._pending_at.min()) if self._pending_at.size else np.inf
        self._wd_active_until = float(self._wd_until.max()) if self._wd_until.size else -np.inf

    def _pfc(self, m: _Members, dt: float) -> None:
        if not self._lossless.any():
            return
        # bytes buffered in each switch, by the ingress link they arrived on (on the grid of
        # used links and priorities: a link nobody uses has an empty ingress)
        shape = (len(m.ulinks), len(m.uprios))
        watch = m.pfc_watch
        if self._wd_active_until > self.now:
            watch = watch & (self._wd_until[self._grid(m)] <= self.now)
        ingress_flat, any_xoff = fk.ingress_xoff(m.backlog, m.ingress_cidx, m.plen,
                                                 watch.reshape(-1), float(self.pfc.xoff_bytes))
        ingress = ingress_flat.reshape(shape)
        self._ingress_cells = ingress
        if self._n_xoff == 0 and not any_xoff:
            if self._n_paused:
                self._pause_graph(m)
            return
        grid = self._grid(m)
        rx = self._rx_xoff[grid]
        xoff = watch & ~rx & (ingress >= self.pfc.xoff_bytes)
        xon = rx & (ingress <= self.pfc.xon_bytes)
        change = xoff | xon
        # ingresses of links no member uses any more have drained: resume them
        stale = self._rx_xoff.copy()
        stale[grid] = False
        if change.any() or stale.any():
            full_change = stale
            full_change[grid] |= change
            full_xoff = np.zeros_like(stale)
            full_xoff[grid] = xoff
            self._rx_xoff ^= full_change
            when = self.now + dt + self._pause_delay[:, None]
            self._pending_at = np.where(full_change, when, self._pending_at)
            self._pending_val = np.where(full_change, self._rx_xoff, self._pending_val)
            self.report.port_pause_frames += full_xoff
            self.report.pause_frames += int(full_xoff.sum())
            self._pause_state_changed()
        if self._n_paused:
            self._pause_graph(m)

    def _pause_graph(self, m: _Members) -> None:
        """Pause depth (storms) and cycles (deadlocks) among paused egress ports."""
        paused = self._tx_paused
        # edge (l, p) -> (l', p'): bytes that entered the switch over paused egress l wait at
        # egress l' of that switch, which is itself paused
        e_from = m.ingress_pidx[m.ingress_valid]
        e_to = m.pidx[:, 1:][m.ingress_valid]
        has = m.backlog[:, 1:][m.ingress_valid] > 0
        flat = paused.reshape(-1)
        keep = has & flat[e_from] & flat[e_to]
        e_from, e_to = e_from[keep], e_to[keep]
        depth = np.where(flat, 1, 0).astype(np.int64)
        for _ in range(min(self.pfc.storm_hops + 1, 16)):
            if not len(e_from):
                break
            np.maximum.at(depth, e_from, depth[e_to] + 1)
        depth = depth.reshape(self.n_links, P)
        long = paused & (self.now - self._paused_since >= self.pfc.storm_duration_ns)
        storm = paused & ((depth >= self.pfc.storm_hops) | long)
        rising = storm & ~self._in_storm
        if rising.any():
            for link, prio in zip(*np.nonzero(rising), strict=True):
                self.report.events.append(PfcEvent(
                    "storm", int(self.now), [f"{self.ct.link_name(int(link))} prio {prio}"],
                    hops=int(depth[link, prio])))
        self._in_storm = storm
        if len(e_from):
            self._deadlocks(e_from, e_to)

    def _deadlocks(self, e_from: NDArray[np.int64], e_to: NDArray[np.int64]) -> None:
        nodes, inv = np.unique(np.concatenate([e_from, e_to]), return_inverse=True)
        k = len(nodes)
        a, b = inv[: len(e_from)], inv[len(e_from):]
        graph = csr_matrix((np.ones(len(a)), (a, b)), shape=(k, k))
        n_comp, label = connected_components(graph, directed=True, connection="strong")
        sizes = np.bincount(label, minlength=n_comp)
        self_loop = np.zeros(n_comp, bool)
        self_loop[label[a[a == b]]] = True
        cycles = []
        for c in np.flatnonzero((sizes >= 2) | self_loop):
            cycles.append(frozenset(nodes[label == c].tolist()))
        alive = {}
        for cyc in cycles:
            since = self._deadlock_since.get(cyc, self.now)
            alive[cyc] = since
            if self.now - since >= self.pfc.deadlock_detect_ns:
                self._break_deadlock(cyc)
                alive.pop(cyc)
        self._deadlock_since = alive

    def _break_deadlock(self, ports: frozenset[int]) -> None:
        names = sorted(f"{self.ct.link_name(p // P)} prio {p % P}" for p in ports)
        if not self.pfc.watchdog:
            raise SimulationError(
                "PFC deadlock that does not clear (PFC watchdog disabled): "
                + ", ".join(names))
        self.report.events.append(PfcEvent("deadlock", int(self.now), names,
                                           cleared_by_watchdog=True))
        # the watchdog drops what the stuck queues hold and ignores pauses for a while
        m = self._m
        flat = np.zeros(self.n_links * P, bool)
        flat[list(ports)] = True
        stuck = m.valid & flat[np.where(m.valid, m.pidx, 0)] & (m.backlog > 0)
        rows = np.flatnonzero(stuck.any(axis=1))
        lost = np.where(stuck[rows], m.backlog[rows], 0.0).sum(axis=1)
        self.report.drops_bytes += float(lost.sum())
        first = np.argmax(stuck[rows], axis=1)
        m.backlog[rows] = np.where(stuck[rows], 0.0, m.backlog[rows])
        fk.lose(rows, first.astype(np.int64), lost, m.backlog, m.at_switch, m.injected,
                m.junk, m.rewind, m.nack_at, m.rtt, self.now + self.fp.nack_ns)
        idx = np.array(sorted(ports))
        links, prios = idx // P, idx % P
        self._rx_xoff[links, prios] = False
        self._tx_paused[links, prios] = False
        self._pending_at[links, prios] = np.inf
        self._paused_since[links, prios] = np.inf
        self._wd_until[links, prios] = self.now + self.pfc.watchdog_recovery_ns
        self._pause_state_changed()

    def _mark(self, m: _Members, served_lp: NDArray, delivered: NDArray, dt: float) -> NDArray:
        queue, p_path, marked, self._switch_queue_bytes = fk.queue_marks(
            m.backlog, m.cidx, m.plen, served_lp.reshape(-1), m.cell_marks, m.cell_kmin,
            m.cell_kmax, float(self.ecn.pmax), float(self.fabric.packet_wire_bytes),
            self._grid_marks.reshape(-1))
        self._queue_cells = queue.reshape(len(m.ulinks), len(m.uprios))
        self.report.ecn_marks += marked
        self._p_path = p_path
        if self.cc.enabled:
            d_qp, p_qp = m.qp_marking(delivered, p_path)
            notification_point(m.cc, d_qp, p_qp, self.fabric.packet_wire_bytes, m.qp_half_rtt,
                               self.now + dt, dt, self.cc)
        return p_path

    def _count(self, m: _Members, served_lp: NDArray[np.float64], dt: float) -> None:
        fk.count_links(served_lp.reshape(-1), len(m.uprios), m.ulink_rate, dt,
                       self._grid_bytes, self._grid_peak)
        self._step_bytes = served_lp.sum(axis=1)
        self._last_dt = dt
        if self._n_paused:
            self.report.port_pause_ns += self._tx_paused * dt
            self.report.pfc_pause_ns_total += float(self._n_paused * dt)

    def _sample(self, force: bool = False) -> None:
        if self.now < self._next_sample and not force:
            return
        span = max(self.now - self._sample_t0, 1.0)
        m = self._m
        on_grid = (len(self._grid_bytes) == len(m.ulinks) == self._queue_cells.shape[0])
        if on_grid and not self._sample_in_links and not self._n_paused:
            # the common case: all the sample saw is on the grid of the current members
            acc, queue = self._grid_bytes, self._queue_cells.sum(axis=1)
            keep = (acc > 0) | (queue > 0)
            if keep.any():
                self.report.timeseries.append(
                    int(self.now), span, m.ulinks[keep], queue[keep],
                    acc[keep] * 8.0 / (m.ulink_rate[keep] * span),
                    self._grid_marks.sum(axis=1)[keep], np.zeros(int(keep.sum()), bool),
                    float(self.fp.sample_interval_ns))
            self._fold_grid(m, into_sample=False)
            self._sample_t0 = self.now
            self._next_sample = self.now + self.fp.sample_interval_ns
            return
        self._fold_grid(m)
        queue = np.zeros(self.n_links)
        if self._queue_cells.shape[0] == len(self._m.ulinks):
            queue[self._m.ulinks] = self._queue_cells.sum(axis=1)
        active = (self._sample_acc > 0) | (queue > 0) | self._tx_paused.any(axis=1)
        links = np.flatnonzero(active)
        if len(links):
            self.report.timeseries.append(
                int(self.now), span, links.astype(np.int64), queue[links],
                self._sample_acc[links] * 8.0 / (self.ct.rate_gbps[links] * span),
                self._sample_marks[links], self._tx_paused[links].any(axis=1),
                float(self.fp.sample_interval_ns))
        self._sample_acc[:] = 0.0
        self._sample_marks[:] = 0.0
        self._sample_in_links = False
        self._sample_t0 = self.now
        self._next_sample = self.now + self.fp.sample_interval_ns

    def _next_horizon(self, m: _Members, dt: float) -> float:
        """How far the next step may reach before something changes abruptly (see the
        module docstring); never below ``step_ns``."""
        base = float(self.fp.step_ns)
        limit = float(self.fp.max_quiet_step_ns)
        # the levels of this step and the last give each queue's slope
        q, prev_q = self._queue_cells, self._prev_cells
        ing, prev_ing = getattr(self, "_ingress_cells", None), self._prev_ingress
        self._prev_cells, self._prev_ingress = q, ing
        if limit <= base or m.n == 0:
            return base
        if self._n_paused or self._n_xoff or np.isfinite(self._next_pending):
            return base
        if m.rewind.any():  # (a loss being recovered: the NACK comes back on time)
            return base
        cc = m.cc
        p_path = self._p_path if self._p_path is not None else np.zeros(m.n)
        d_qp, p_qp = m.qp_marking(self._delivered_step, p_path)
        h_qp, below, stalled = fk.qp_horizon(
            self.now, cc.rc, m.qp_line, m.qp_stall_until(), cc.cnp_due_ns, cc.timer_ns,
            cc.bytes_since, cc.since_cnp_ns, cc.marks, p_qp, d_qp, dt,
            float(self.fabric.packet_wire_bytes), float(self.cc.timer_ns),
            float(self.cc.byte_counter_bytes), float(self.cc.cnp_interval_ns))
        if stalled:
            return base
        if self._switch_queue_bytes >= 1.0 or below:
            limit = float(self.fp.max_busy_step_ns)
            if limit <= base:
                return base
            if ing is not None and self._lossless.any() and ing.size and \
                    float(ing.max()) >= self.pfc.xon_bytes:
                return base
        h = min(limit, h_qp) if self.cc.enabled else limit
        if h <= base:
            return base
        h = min(h, _crossing(q, prev_q, dt, self._queue_thresholds))
        if ing is not None and ing.shape == q.shape and self._lossless.any():
            h = min(h, _crossing(ing, prev_ing, dt, self._ingress_thresholds))
        return float(max(base, min(h, limit)))

    def _archive_retx(self, m: _Members, idx: NDArray[np.int64]) -> None:
        for fid, r in zip(m.flow_id[idx].tolist(), m.retx[idx].tolist(), strict=True):
            if r > 0:
                self.report.flow_retx_bytes[fid] = self.report.flow_retx_bytes.get(fid, 0.0) + r

    def finish(self) -> FluidReport:
        """Close the run: fold the retransmissions of members still known into the report."""
        if self.now > self._sample_t0:  # what the last, partial interval saw
            self._sample(force=True)
        self.report.timeseries.finish()
        self._archive_retx(self._m, np.arange(self._m.n))
        self._m = _Members.empty()
        self._keys = np.zeros(0, np.int64)
        return self.report


def _crossing(
    level: NDArray[np.float64],
    prev: NDArray[np.float64] | None,
    dt: float,
    thresholds: NDArray[np.float64],
) -> float:
    """Earliest time at which any ``level`` (moving at its last slope) crosses a threshold or
    reaches zero; ``inf`` if none will. Unknown slope (no previous level) gives 0.

    >>> _crossing(np.array([10.0]), np.array([0.0]), 1.0, np.array([25.0]))
    1.5
    """
    if prev is None or prev.shape != level.shape:
        return 0.0
    return float(fk.crossing_ns(level.reshape(-1), prev.reshape(-1), dt, thresholds))


def _member_caps(row_cap_gbps: NDArray[np.float64], share: NDArray[np.float64],
                 ) -> NDArray[np.float64] | None:
    """Each member's sending-rate cap: its row's (Gb/s per stream) times its share of the
    stream; ``None`` if no row has a positive finite cap (a cap of 0 holds a row: the
    members stall instead).

    >>> _member_caps(np.array([100.0, np.inf]), np.array([0.25, 1.0])).tolist()
    [25.0, inf]
    >>> _member_caps(np.array([0.0, np.inf]), np.ones(2)) is None
    True
    """
    on = np.isfinite(row_cap_gbps) & (row_cap_gbps > 0)
    if not on.any():
        return None
    return np.where(on, row_cap_gbps * share, np.inf)


@dataclass
class _Members:
    """Per-member arrays of the fluid model (see the module docstring)."""

    key: NDArray[np.int64]
    flow_id: NDArray[np.int64]
    row: NDArray[np.int64]
    stream: NDArray[np.int64]          # global stream index
    stream_row: NDArray[np.int64]      # stream -> row
    share: NDArray[np.float64]
    target: NDArray[np.float64]
    path: NDArray[np.int32]
    plen: NDArray[np.int64]
    valid: NDArray[np.bool_]
    pidx: NDArray[np.int64]            # link * P + priority, per hop
    at_switch: NDArray[np.bool_]       # hop's egress is on a switch
    egress_switch: NDArray[np.int64]   # switch index owning the hop's egress (0 if a host)
    ingress_pidx: NDArray[np.int64]    # [M, H-1]: ingress (link of hop k, priority at k+1)
    ingress_valid: NDArray[np.bool_]
    # the (used links x used priorities) grid the per-step arithmetic runs on
    ulinks: NDArray[np.int64]
    uprios: NDArray[np.int64]
    cidx: NDArray[np.int64]            # [M, H] cell of (link, priority) in the grid
    ingress_cidx: NDArray[np.int64]    # [M, H-1]
    line_rate: NDArray[np.float64]
    rtt: NDArray[np.float64]
    backlog: NDArray[np.float64]
    injected: NDArray[np.float64]
    delivered: NDArray[np.float64]
    retx: NDArray[np.float64]
    stall_until: NDArray[np.float64]
    # go-back-N: bytes on their way that the receiver will discard (sent after a loss), the
    # bytes to send again once the NACK is back, and when it is (-inf: none awaited)
    junk: NDArray[np.float64]
    rewind: NDArray[np.float64]
    nack_at: NDArray[np.float64]
    cc: DcqcnState
    n_rows: int
    n_streams: int
    coupled_any: bool
    cell_col: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    cell_lossy: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    pfc_watch: NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), bool))
    cell_marks: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    # each cell's ECN thresholds (its port's, at its rate)
    cell_kmin: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    cell_kmax: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    first_port: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    hold_bytes: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))  # per ulink
    cell_switch: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    ulink_rate: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    half_rtt: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    # a rate limit at the sending NIC (its row's cap times its share; inf: none), if any
    rate_cap: NDArray[np.float64] | None = None
    # QPs: congestion control (``cc``) is per QP; the members of a sprayed QP share one
    qp: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    qp_key: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    qp_share: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))  # of its QP
    qp_line: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    qp_half_rtt: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    one_per_qp: bool = True  # every member a QP of its own, in member order

    @property
    def n(self) -> int:
        return len(self.key)

    def per_qp(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per-member values summed per QP."""
        if self.one_per_qp:
            return x
        return np.bincount(self.qp, x, minlength=len(self.qp_key))

    def qp_rate(self) -> NDArray[np.float64]:
        """Each member's congestion-control rate: its share of its QP's."""
        if self.one_per_qp:
            return self.cc.rc
        return self.cc.rc[self.qp] * self.qp_share

    def qp_marking(self, delivered: NDArray[np.float64], p_path: NDArray[np.float64]
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Bytes each QP delivered and the marking probability they met (the members'
        probabilities weighted by their bytes)."""
        if self.one_per_qp:
            return delivered, p_path
        d = self.per_qp(delivered)
        marked = self.per_qp(delivered * p_path)
        return d, np.divide(marked, d, out=np.zeros_like(d), where=d > 0)

    def qp_stall_until(self) -> NDArray[np.float64]:
        """Per QP: until when one of its members waits for a NACK (the latest)."""
        if self.one_per_qp:
            return self.stall_until
        out = np.full(len(self.qp_key), -np.inf)
        np.maximum.at(out, self.qp, self.stall_until)
        return out

    @classmethod
    def empty(cls) -> _Members:
        z = np.zeros(0, np.int64)
        f = np.zeros(0)
        return cls(z, z, z, z, z, f, f, np.zeros((0, 1), np.int32), z, np.zeros((0, 1), bool),
                   np.zeros((0, 1), np.int64), np.zeros((0, 1), bool), np.zeros((0, 1), np.int64),
                   np.zeros((0, 0), np.int64),
                   np.zeros((0, 0), bool), z, z, np.zeros((0, 1), np.int64),
                   np.zeros((0, 0), np.int64), f, f, np.zeros((0, 1)), f, f, f, f, f, f, f,
                   DcqcnState.new(f, DcqcnParams()), 0, 0, False)

    @classmethod
    def build(cls, model: FluidRateModel, flows: ActiveFlows) -> _Members:
        mem = flows.members
        assert mem is not None
        ct = model.ct
        path = mem.path
        n, h = path.shape
        valid = path >= 0
        plen = valid.sum(axis=1).astype(np.int64)
        safe = np.where(valid, path, 0)
        cls_code = flows.row_class[mem.row]
        # priority at each hop = the classification of the node that owns the egress
        egress_node = ct.link_src[safe]
        prio = model._prio_of_node[egress_node, cls_code[:, None]].astype(np.int64)
        pidx = np.where(valid, safe.astype(np.int64) * P + prio, 0)
        at_switch = valid & model._src_is_switch[safe]
        egress_switch = np.maximum(ct.switch_of_node[ct.link_src[safe]], 0).astype(np.int64)
        ingress_valid = valid[:, 1:] & valid[:, :-1]
        ingress_pidx = np.where(ingress_valid, safe[:, :-1].astype(np.int64) * P + prio[:, 1:],
                                0)
        ulinks = distinct(safe[valid]).astype(np.int64)
        uprios = distinct(np.concatenate([prio[valid], np.zeros(0, np.int64)])).astype(np.int64)
        link_pos = np.zeros(ct.n_links, np.int64)
        link_pos[ulinks] = np.arange(len(ulinks))
        prio_pos = np.zeros(P, np.int64)
        prio_pos[uprios] = np.arange(len(uprios))
        width = max(len(uprios), 1)
        cidx = np.where(valid, link_pos[safe] * width + prio_pos[prio], 0)
        ingress_cidx = np.where(ingress_valid,
                                link_pos[safe[:, :-1]] * width + prio_pos[prio[:, 1:]], 0)
        stream_key = mem.row * (int(mem.stream.max(initial=0)) + 1) + mem.stream
        uniq, stream = np.unique(stream_key, return_inverse=True)
        stream = stream.reshape(-1)
        stream_row = np.zeros(len(uniq), np.int64)
        stream_row[stream] = mem.row
        streams_per_row = np.bincount(stream_row, minlength=len(flows.remaining_bytes))
        target = mem.share * flows.member_bytes[mem.row]
        line = ct.rate_gbps[safe[:, 0]]
        delay = np.where(valid, ct.delay_ns[safe], 0).sum(axis=1) + \
            np.maximum(plen - 1, 0) * model.fabric.switch_latency_ns
        qp_key, qp = (mem.key, np.arange(n)) if mem.qp is None else \
            np.unique(mem.qp, return_inverse=True)
        qp = qp.reshape(-1).astype(np.int64)
        one_per_qp = len(qp_key) == n and bool(np.array_equal(qp, np.arange(n)))
        if one_per_qp:
            qp_share, qp_line, qp_half_rtt = np.ones(n), line, delay.astype(np.float64)
        else:
            qp_share = mem.share / np.bincount(qp, mem.share, minlength=len(qp_key))[qp]
            qp_line = np.zeros(len(qp_key))
            qp_line[qp] = line  # (a QP leaves through one NIC)
            qp_half_rtt = np.zeros(len(qp_key))
            np.maximum.at(qp_half_rtt, qp, delay.astype(np.float64))
        return cls(
            key=mem.key, flow_id=mem.flow_id, row=mem.row, stream=stream, stream_row=stream_row,
            share=mem.share, target=target, path=path, plen=plen, valid=valid, pidx=pidx,
            at_switch=at_switch, egress_switch=egress_switch, ingress_pidx=ingress_pidx,
            ingress_valid=ingress_valid, ulinks=ulinks, uprios=uprios, cidx=cidx,
            ingress_cidx=ingress_cidx,
            line_rate=line, rtt=2.0 * delay, backlog=np.zeros((n, h)), injected=np.zeros(n),
            delivered=np.zeros(n), retx=np.zeros(n), stall_until=np.full(n, -np.inf),
            junk=np.zeros(n), rewind=np.zeros(n), nack_at=np.full(n, -np.inf),
            cc=DcqcnState.new(qp_line, model.cc), n_rows=len(flows.remaining_bytes),
            n_streams=len(uniq), coupled_any=bool((streams_per_row > 1).any()),
            cell_col=np.tile(np.arange(width, dtype=np.int64), len(ulinks)),
            cell_lossy=np.tile(~model._lossless[uprios], len(ulinks)),
            ulink_rate=ct.rate_gbps[ulinks].astype(np.float64),
            half_rtt=delay.astype(np.float64),
            cell_marks=np.repeat(model._src_is_switch[ulinks], width),
            cell_kmin=np.repeat(model._kmin_link[ulinks], width),
            cell_kmax=np.repeat(model._kmax_link[ulinks], width),
            cell_switch=np.repeat(ct.switch_of_node[ct.link_src[ulinks]], width).astype(np.int64),
            # a NIC port holds about one base step of bytes (over all its QPs)
            first_port=link_pos[safe[:, 0]],
            hold_bytes=ct.rate_gbps[ulinks].astype(np.float64) * model.fp.step_ns / 8.0,
            # ingresses that may send PFC: a switch receiving a lossless priority
            pfc_watch=model._dst_is_switch[ulinks][:, None] & model._lossless[uprios][None, :],
            rate_cap=_member_caps(flows.rate_cap_gbps[mem.row], mem.share),
            qp=qp, qp_key=np.asarray(qp_key, np.int64), qp_share=qp_share, qp_line=qp_line,
            qp_half_rtt=qp_half_rtt, one_per_qp=one_per_qp,
        )

    def row_progress(self) -> NDArray[np.float64]:
        """Bytes per member stream delivered in order: the slowest stream of each row."""
        return fk.row_progress(self.stream, self.stream_row, self.delivered, self.target,
                               self.n_rows)
