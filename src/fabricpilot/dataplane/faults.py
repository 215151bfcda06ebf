"""Failures in the data plane: links and switches going down, flapping and gray links.

What the fabric does on its own (the baseline every policy gets):

* A link goes down at the fault instant. Until routing knows, the switches keep forwarding
  onto it: bytes sent into the dead link are lost there (they load no link after it, and
  are resent once the flow has a live path, as RoCE's go-back-N does after its timeout),
  and the flow makes no progress with them. A stream whose bytes all go into dead links
  sends, as an RC QP does, what it has left and then waits for its timer: on average at
  most its remaining bytes per ``rdma_timeout_ns``.
* Its neighbours see the loss of signal ``detection_delay_ns`` later; the routing protocol
  has converged ``convergence_delay_ns`` after that: every switch's ECMP groups are rebuilt
  without the dead links (:func:`~fabricpilot.topology.compiled.with_links_down`) and the
  flows that crossed them are re-hashed (the policy's ``repath``, or a hash of the stream).
* A gray link stays up but drops packets (``drop_probability`` per packet after FEC): the
  flows crossing it resend with go-back-N, so each loss costs the packet and everything sent
  in one round trip after it. Nothing reroutes: it is only visible in FEC counters.
* A policy that reroutes instantly by construction (``instant_reroute``, the ``ideal`` bound)
  sees every change at once: its streams move to live paths at the fault instant.

A controller-driven policy (one with ``on_links_changed``) is told at detection time; it
answers with the instant its new paths take effect. Until then the affected streams pause
(the job holds the collective at its step boundary: no byte goes into the dead path after
detection), then they move to the paths the policy gives (``repath``). A policy that answers
``None`` has no controller beside it to tell (one elsewhere learns of the change from the
ports' state in telemetry): the fabric converges on its own, as without a controller.

Every fault gets a :class:`FaultRecord`: detection, reroute and recovery times (recovery:
every affected job back to >= 95 % of its throughput before the fault),
bytes lost and resent, each job's stall and the GPU time it cost, jobs cut off (a partition
is reported, and the job stopped, not left hanging).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fabricpilot.arrays import distinct
from fabricpilot.balancing.base import TransferBatch, member_qp_index
from fabricpilot.errors import SimulationError, TopologyError
from fabricpilot.net.hashing import splitmix64
from fabricpilot.topology.compiled import with_links_down, with_local_repair
from fabricpilot.topology.paths import intra_host, pad_paths, switch_links_between, walk_paths

if TYPE_CHECKING:
    from fabricpilot.faults.model import FaultEvent, FaultTimeline

RECOVERED_SHARE = 0.95  # of the pre-fault throughput


def go_back_n_useful(loss: NDArray[np.float64], window_pkts: NDArray[np.float64]
                     ) -> NDArray[np.float64]:
    """The share of the bytes a go-back-N sender (an RDMA NIC) sends that arrive useful when
    each packet is lost with probability ``loss`` and ``window_pkts`` packets are in flight
    behind it: ``(1 - p) / (1 + p W)``. Each packet is sent ``1 / (1 - p)`` times on
    average, and each of its ``p / (1 - p)`` losses also wastes the ``W`` packets sent after
    it (the receiver drops them as out of order), so a packet delivered costs
    ``(1 + p W) / (1 - p)`` sent. Nothing arrives at ``p = 1``.

    >>> go_back_n_useful(np.array([0.0, 0.01, 0.5, 1.0]), np.array([9.0, 9.0, 1.0, 9.0]))
    array([1.        , 0.90825688, 0.33333333, 0.        ])
    """
    p = np.clip(loss, 0.0, 1.0)
    return (1.0 - p) / (1.0 + p * window_pkts)


@dataclass
class FaultRecord:
    """What one fault did. Times are absolute (ns); ``None`` when it never happened."""

    fault_id: int
    kind: str
    label: str
    start_ns: int
    end_ns: int | None = None
    detected_ns: int | None = None
    rerouted_ns: int | None = None
    recovered_ns: int | None = None
    bytes_lost: float = 0.0
    bytes_retx: float = 0.0
    streams_moved: int = 0
    job_stall_ns: dict[str, float] = field(default_factory=dict)
    gpu_seconds_lost: float = 0.0
    partitioned: list[str] = field(default_factory=list)
    pre_fault_gbps: dict[int, float] = field(default_factory=dict)  # job index -> Gb/s
    affected: set[int] = field(default_factory=set)  # job indices
    jobs_hit: list[str] = field(default_factory=list)  # their names (those cut off too)

    def summary(self) -> dict[str, Any]:
        """The JSON form: times relative to the fault instant, in microseconds."""

        def rel(t: int | None) -> float | None:
            return None if t is None else round((t - self.start_ns) / 1e3, 3)

        return {
            "fault_id": self.fault_id, "kind": self.kind, "label": self.label,
            "at_ms": round(self.start_ns / 1e6, 6),
            "detection_us": rel(self.detected_ns),
            "reroute_us": rel(self.rerouted_ns),
            "recovery_us": rel(self.recovered_ns),
            "bytes_lost": round(self.bytes_lost), "bytes_retx": round(self.bytes_retx),
            "streams_moved": self.streams_moved,
            "job_stall_us": {j: round(v / 1e3, 3) for j, v in sorted(self.job_stall_ns.items())},
            "gpu_seconds_lost": round(self.gpu_seconds_lost, 9),
            "partitioned": list(self.partitioned),
            "jobs_hit": sorted(self.jobs_hit),
        }


def _hash_walk(ct: Any, src: NDArray[np.int64], dst: NDArray[np.int64],
               key: NDArray[np.int64]) -> NDArray[np.int32]:
    """Paths for streams (``key``: each one's member key) by a hash of the stream at every
    switch of ``ct``, as its ECMP groups would forward it."""
    h = splitmix64(key.astype(np.uint64))

    def choose(step: int, switch: NDArray[np.int32], rows: NDArray[np.int64]) -> NDArray:
        return splitmix64(h[rows] ^ switch.astype(np.uint64))

    return walk_paths(ct, src, dst, choose)


class FaultsMixin:
    """The engine's fault handling (see the module docstring). Mixed into
    :class:`~fabricpilot.dataplane.engine.Engine`, whose row and member arrays it reads."""

    # provided by the engine
    ct: Any
    policy: Any
    jobs: list[Any]
    now: int
    _m_path: NDArray[np.int32]
    _m_share: NDArray[np.float64]
    _m_flow: NDArray[np.int64]
    _m_key: NDArray[np.int64]
    _m_stream: NDArray[np.int64]
    _row_flow: NDArray[np.int64]
    _row_owner: NDArray[np.int64]
    _row_src: NDArray[np.int64]
    _row_dst: NDArray[np.int64]
    _row_hold: NDArray[np.float64]
    _row_latency: NDArray[np.int64]
    _row_hop_ns: NDArray[np.int64]
    _dirty: bool
    _col: NDArray[np.int32]
    links: Any
    model: Any
    fabric: Any
    _rates: NDArray[np.float64]
    _remaining: NDArray[np.float64]
    _route_cache: dict[Any, Any]
    _at: Callable[..., None]
    _aborted: dict[int, str]
    _weights_from_members: Callable[[NDArray[np.int64]], None]
    _member_weights: Callable[[NDArray[np.int64], NDArray[np.int64]], Any]
    _keep_members: Callable[[NDArray[np.bool_]], None]
    _abort_job: Callable[[int, str], None]
    _drop_rows: Callable[[NDArray[np.bool_], NDArray[np.int64]], None]
    _mark_dirty: Callable[[], None]
    _mice_cut: int
    _mice_waiting: int

    def _faults_setup(self, timeline: FaultTimeline | None) -> None:
        # (a copy of its own: :meth:`inject_faults` adds to it)
        self._ft = (None if timeline is None else
                    replace(timeline, events=list(timeline.events), faults=list(timeline.faults)))
        n = self.ct.n_links
        self._phys_down = np.zeros(n, bool)     # the links that are down
        self._down_count = np.zeros(n, np.int64)  # faults holding each link down
        self._route_down = np.zeros(n, bool)    # the links routing has converged around
        self._drop_p = np.zeros(n)              # gray: per-packet loss after FEC
        self._ber = np.zeros(n)                 # gray: pre-FEC bit error rate
        # which fault holds a link down (of several, the first to begin) or else gray
        self._owner_fault = np.full(n, -1, np.int64)
        self._holders: dict[int, list[int]] = {}  # link -> the faults holding it down
        self._seen_dead: set[int] = set()  # members (keys) found on a dead link once
        self._gray_fault = np.full(n, -1, np.int64)  # link -> the fault making it gray
        self._records: dict[int, FaultRecord] = {}
        self._known_down = np.zeros(n, bool)    # the links the neighbours have seen down
        # flows (rows) paused for the controller's new paths -> the faults they wait for
        self._held_flows: dict[int, set[int]] = {}
        # jobs waiting for a repair (their next stage had no path) -> the faults that cut them
        self._waiting_jobs: dict[int, set[int]] = {}
        self._reroute_at = -math.inf            # when the controller's new paths take effect
        self._told = False                      # a controller beside the policy was told
        # flow id -> stream (QP) of it -> when it first lost a packet
        self._loss_since: dict[int, dict[int, int]] = {}
        # (flow id, stream) -> the loss (its start) after which its path came back too late:
        # its QP had made its last retransmission (rdma_retry_count), errors out at the next
        self._too_late: dict[tuple[int, int], int] = {}
        self._cut_flows: dict[int, set[int]] = {}  # flows waiting for a path to come back
        self._rto_wait: dict[int, tuple[int, set[int]]] = {}  # flow -> (timer fires, faults)
        self._fault_retx: dict[int, float] = {}  # flow id -> bytes it resent for faults
        self._retx_of: dict[int, dict[int, float]] = {}  # flow id -> fault -> those bytes
        self._row_dead = np.zeros(0)            # share of a row's bytes going into dead links
        self._row_loss = np.zeros(0)            # share of a row's bytes resent (gray)
        self._m_fault = np.zeros(0, np.int64)   # the fault a member's path hits, -1 none
        self._m_loss = np.zeros(0)              # share of a member's packets gray links lose
        # per member: its stream (QP) loses every packet (a gray link of drop 1 on each of
        # its paths): it delivers nothing, and its row (a ring moves at its slowest) neither
        self._m_black = np.zeros(0, bool)
        self._row_black = np.zeros(0, bool)
        # member key -> its path before a fault's reroute moved it, for policies that hash
        # (routing back over a repaired link, the switches' hash gives it that path again)
        self._hashed_from: dict[int, NDArray[np.int32]] = {}
        self._m_dead_hop = np.zeros((0, 0), bool)  # per member and hop: a dead link there
        self._goodput = np.zeros(0)
        self._ups_to_come = 0  # repairs scheduled and not played yet
        if timeline is None:
            return
        for info in timeline.faults:
            self._records[info.fault_id] = FaultRecord(info.fault_id, info.kind, info.label,
                                                       info.start_ns, info.end_ns)
        for ev in timeline.events:
            self._at(ev.time_ns, lambda ev=ev: self._fault_event(ev))
        self._ups_to_come = sum(1 for ev in timeline.events if ev.kind == "up")

    def inject_faults(self, timeline: FaultTimeline) -> list[int]:
        """Play ``timeline``'s faults from now on, its times counted from now: faults added
        while the run goes (a drill). They are numbered after the run's own and get their
        records as those do. Needs a run that plays faults (``faults`` given, possibly
        without any). Returns their fault ids.

        ``SimulationError`` if the run plays no faults."""
        if self._ft is None:
            raise SimulationError("this run plays no faults (give the engine a fault timeline)")
        base, now = len(self._ft.faults), int(self.now)
        ids = []
        for info in timeline.faults:
            new = replace(info, fault_id=base + info.fault_id, start_ns=info.start_ns + now,
                          end_ns=None if info.end_ns is None else info.end_ns + now)
            self._ft.faults.append(new)
            self._records[new.fault_id] = FaultRecord(new.fault_id, new.kind, new.label,
                                                      new.start_ns, new.end_ns)
            ids.append(new.fault_id)
        for ev in timeline.events:
            moved = replace(ev, time_ns=ev.time_ns + now, fault_id=base + ev.fault_id)
            self._ft.events.append(moved)
            self._at(moved.time_ns, lambda ev=moved: self._fault_event(ev))
            self._ups_to_come += ev.kind == "up"
        return ids

    @property
    def _instant(self) -> bool:
        return bool(getattr(self.policy, "instant_reroute", False))

    def _touch(self, rec: FaultRecord, jobs: Iterable[int]) -> None:
        """Jobs (indices) whose traffic ``rec``'s fault reached: it crossed its links (lost
        or resent bytes there, or was on them when it struck), or it stalled for it."""
        for j in jobs:
            if j not in rec.affected:
                rec.affected.add(int(j))
                rec.jobs_hit.append(self.jobs[j].name)

    @property
    def fault_records(self) -> list[FaultRecord]:
        return [self._records[k] for k in sorted(self._records)]

    # ----------------------------------------------------------------- events
    def _job_goodput(self) -> NDArray[np.float64]:
        n = len(self.jobs)
        if not len(self._goodput) or len(self._goodput) != len(self._row_owner):
            return np.zeros(n)
        own = self._row_owner >= 0
        return np.bincount(self._row_owner[own], weights=self._goodput[own], minlength=n)

    def _fault_event(self, ev: FaultEvent) -> None:
        """A fault changes the physical fabric (see the module docstring)."""
        rec = self._records[ev.fault_id]
        links = np.asarray(ev.links, np.int64)
        self._ups_to_come -= ev.kind == "up"
        if ev.kind in ("down", "gray") and not rec.pre_fault_gbps:
            rec.pre_fault_gbps = dict(enumerate(self._job_goodput().tolist()))
        if ev.kind in ("down", "gray") and len(self._m_path):
            # the jobs sending over it now: recovered once back to their pre-fault rate
            # (a policy that moves them at once stalls none of them, and may slow them all)
            on = self._members_on(links)
            if on.any():
                own = self._row_owner[self._member_rows()[on]]
                self._touch(rec, distinct(own[own >= 0]).tolist())
        if ev.kind in ("down", "up"):
            # overlapping faults (a link down, then its switch): up when the last one ends
            np.add.at(self._down_count, links, 1 if ev.kind == "down" else -1)
            np.maximum(self._down_count, 0, out=self._down_count)
            self._phys_down = self._down_count > 0
            self._set_holders(links.tolist(), ev.fault_id, ev.kind == "down")
            if (ev.kind == "down" and not self._instant and self._ft is not None
                    and self._ft.params.rdma_retry_count is not None and len(self._m_path)):
                # streams on the links now dead lose packets from now on: their QPs' retry
                # budgets start (one more timer after the last retry, they give up)
                on = self._members_on(links)
                if on.any():
                    for fid, st in zip(self._m_flow[on].tolist(), self._m_stream[on].tolist(),
                                       strict=True):
                        if st not in self._loss_since.get(fid, {}):
                            self._start_loss(fid, st, self.now)
            if ev.kind == "up" and not self._instant and self._loss_since:
                self._back_before_moved(links)
            if self._instant:  # the bound: everything moves to live paths at once
                if ev.kind == "down":
                    rec.detected_ns = rec.detected_ns if rec.detected_ns is not None \
                        else self.now
                self._converge(links)
            else:
                self._at(self.now + self._ft.params.detection_delay_ns,
                         lambda: self._fault_detected(ev))
        elif ev.kind == "gray":
            self._drop_p[links] = ev.drop_probability
            self._ber[links] = ev.ber
            self._gray_fault[links] = ev.fault_id
            self._set_holders(links.tolist(), ev.fault_id, None)
        else:  # clear
            self._drop_p[links] = 0.0
            self._ber[links] = 0.0
            self._gray_fault[links] = -1
            self._set_holders(links.tolist(), ev.fault_id, None)
            if self._loss_since:  # (packets get through again: their QPs' retries succeed)
                self._end_losses_off_dead_links()
        self._dirty = True

    def _name_cut_off(self, mem: NDArray[np.int64]) -> None:
        """The jobs of members ``mem`` (sending into a dead link) that have no path left in
        the fabric as it is now are cut off, by the faults that cut them
        (:meth:`_pair_faults`), whatever the policy: one that learns of it only when routing
        converges (or not before the repair) had the job cut off all the same. Each member
        is looked at once (the first time it is found on a dead link)."""
        keys = self._m_key[mem]
        fresh = np.array([k not in self._seen_dead for k in keys.tolist()], bool)
        mem = mem[fresh]
        self._seen_dead.update(keys[fresh].tolist())
        if not len(mem):
            return
        src, dst = self._member_endpoints(mem)
        known = (src >= 0) & (dst >= 0)
        mem, src, dst = mem[known], src[known], dst[known]
        if not len(mem):
            return
        cut, cutters = self._cut_now(src, dst)
        owners = self._row_owner[self._member_rows()[mem[cut]]].tolist()
        for j, fs in zip(owners, cutters, strict=True):
            if j >= 0:
                for f in sorted(fs):
                    self._cut_off_by(f, j)

    def _set_holders(self, links: list[int], fault: int, down: bool | None) -> None:
        """Fault ``fault`` takes ``links`` down (``down``), lets them up (``not down``: its own
        hold ends, or, for a ``link_up`` of its own, the latest other), or changes their gray
        state (``None``); each link's owner is then the first of the faults holding it down
        to have begun (a stall under overlapping faults is charged to it, then to the next
        once it is over), else its gray fault, else none."""
        for lk in links:
            held = self._holders.setdefault(lk, [])
            if down:
                held.append(fault)
            elif down is not None and held:
                held.remove(fault if fault in held else held[-1])
            first = min(held, key=lambda f: (self._records[f].start_ns, f), default=-1)
            self._owner_fault[lk] = first if first >= 0 else self._gray_fault[lk]

    def _back_before_moved(self, links: NDArray[np.int64]) -> None:
        """Links back up under streams still routed over them (the fault was over before
        routing or the controller moved them): a stream still sending gets its packets
        through again, the receiver sees the gap and NAKs, and the sender goes back N at
        once (a round trip: the loss costs the outage, not a retransmission timeout, which
        only a QP with nothing left to send waits for); its loss episode ends."""
        if self._members_on(links[~self._phys_down[links]]).any():
            self._end_losses_off_dead_links()

    def _end_losses_off_dead_links(self) -> None:
        """The loss episodes end for the streams on no dead link now (nor on a gray one that
        loses every packet); those still on one go on losing since they began."""
        still = self._members_on(np.flatnonzero(self._phys_down | (self._drop_p >= 1.0)))
        on_dead = set(zip(self._m_flow[still].tolist(), self._m_stream[still].tolist(),
                          strict=True))
        kept = {f: {st: t for st, t in by.items() if (f, st) in on_dead}
                for f, by in self._loss_since.items()}
        self._loss_since = {f: by for f, by in kept.items() if by}

    def _fault_detected(self, ev: FaultEvent) -> None:
        """The neighbours see the link change. A controller-driven policy is told and its
        affected streams pause until its new paths take effect; otherwise the routing
        protocol converges ``convergence_delay_ns`` later."""
        rec = self._records[ev.fault_id]
        if ev.kind == "down" and rec.detected_ns is None:
            rec.detected_ns = self.now
        told = getattr(self.policy, "on_links_changed", None)
        links = np.asarray(ev.links, np.int64)
        # what the neighbours see now (another fault may still hold a link down)
        state = self._phys_down[links]
        self._known_down[links] = state
        down = links[state].tolist() if ev.kind == "down" else []
        up = links[~state].tolist() if ev.kind == "up" else []
        when = told(self.now, down, up) if told is not None else None
        if when is not None:
            self._told = True
            effective = max(math.ceil(when), self.now)
            self._reroute_at = max(self._reroute_at, effective)
            if down:
                self._hold(distinct(self._member_rows()[self._members_on(
                    np.asarray(down, np.int64))]), effective, (ev.fault_id,))
            self._at(effective, lambda: self._reroute(ev.fault_id))
            return
        if down and self._ft.params.local_repair:
            self._local_repair(np.asarray(down, np.int64), ev.fault_id)
        self._at(self.now + self._ft.params.convergence_delay_ns,
                 lambda: self._converge(links))

    def _routing_views(self) -> tuple[Any, Any]:
        """The ECMP groups as routing has converged (around the links it knows are down),
        and those the switches use now: with ``local_repair``, also without each switch's
        own ports on links seen down since, where another next hop is left."""
        base = with_links_down(self.ct, self._route_down)
        if self._ft is not None and self._ft.params.local_repair:
            seen = self._seen_down()
            if seen.any():
                return base, with_local_repair(base, seen)
        return base, base

    def _seen_down(self) -> NDArray[np.bool_]:
        """Links down that the neighbours have seen and routing has not converged on."""
        return self._known_down & self._phys_down & ~self._route_down

    def _use_view(self, view: Any) -> None:
        """The policy routes on ``view`` from now on."""
        set_topology = getattr(self.policy, "set_topology", None)
        if set_topology is not None:
            set_topology(view)
        elif getattr(self.policy, "ctx", None) is not None:
            self.policy.ctx = replace(self.policy.ctx, topology=view)
        self._route_cache.clear()

    def _local_repair(self, links: NDArray[np.int64], fault_id: int) -> None:
        """Fast failover at detection (``local_repair``): the switches drop their ports on
        ``links`` from the groups that keep another next hop, and the streams whose first
        dead link is so dropped turn away there (hashed again, or the policy's own
        ``repath``, on those groups; a sprayed stream's share goes to its live paths); the
        others keep sending into the dead links until routing converges."""
        base, view = self._routing_views()
        self._use_view(view)
        hit = self._members_on(links)
        if not hit.any():
            return
        ct = self.ct
        mem = np.flatnonzero(hit)
        path = self._m_path[mem]
        valid = path >= 0
        safe = np.where(valid, path, 0)
        seen = self._seen_down()
        is_dead = valid & seen[safe]
        # a dead link is avoided where its upstream switch had it in the group toward the
        # stream's leaf and has it no more
        src, dst = self._member_endpoints(mem)
        slot = np.broadcast_to(ct.leaf_slot[ct.gpu_leaf[dst]][:, None], safe.shape)
        sw = ct.switch_of_node[ct.link_src[safe]]
        k = np.arange(ct.nh_link.shape[2])

        def in_group(t: Any) -> NDArray[np.bool_]:
            s0 = np.maximum(sw, 0)
            grp = t.nh_link[s0, slot]
            return ((grp == safe[..., None]) & (k < t.nh_count[s0, slot][..., None])).any(-1)

        avoided = ((sw >= 0) & (slot >= 0) & (dst >= 0)[:, None] & in_group(base)
                   & ~in_group(view))
        # the stream turns away at its first dead link if that switch drops it (the links
        # after it are not reached any more)
        first = np.argmax(is_dead, axis=1)
        movable = is_dead.any(axis=1) & avoided[np.arange(len(mem)), first]
        if not movable.any():
            return
        faults = {fault_id}
        if getattr(self.policy, "sprays", False):
            keep = np.zeros(len(hit), bool)
            keep[mem[movable]] = True
            self._spread_off(keep, view, faults)  # (a stream with no live path stays)
        else:
            mem, src, dst = mem[movable], src[movable], dst[movable]
            rows = self._member_rows()
            new, failed = self._repath_each(self._row_owner[rows[mem]], src, dst, mem, view)
            ok = ~failed & ~self._crosses(new, self._route_down | seen)
            if ok.any():
                mem, new = mem[ok], new[ok]
                self._m_path[mem] = new
                self._weights_from_members(rows)
                self._records[fault_id].streams_moved += len(mem)
                self._wait_for_timeout(distinct(rows[mem]), faults)
        rec = self._records[fault_id]
        if rec.rerouted_ns is None and not self._members_on(links).any():
            rec.rerouted_ns = self.now  # (every stream off the fault's dead links)

    def _converge(self, links: NDArray[np.int64] | None = None) -> None:
        """The routing protocol has converged on the state of ``links`` (every link if
        ``None``) as it is now, and every fault newly routed around is rerouted."""
        if links is None:
            links = np.arange(self.ct.n_links)
        before = self._route_down.copy()
        self._route_down[links] = self._phys_down[links]
        if self._instant:
            self._known_down[links] = self._phys_down[links]
        newly = self._route_down & ~before
        _, ct2 = self._routing_views()
        self._use_view(ct2)
        hit = set(np.flatnonzero(newly).tolist())
        faults = {info.fault_id for info in self._ft.faults
                  if info.start_ns <= self.now and hit.intersection(info.links)}
        self._reroute(None, ct2, faults)
        # links back up: new flows use them; sprayed streams spray on them again, and
        # streams a switch's hash moved off a dead link go back to the path it gave them
        # (the same hash over the same group again)
        if (before & ~self._route_down).any():
            self._respray()
            self._hash_back()

    def _hold(self, rows: NDArray[np.int64], until: int, faults: Iterable[int]) -> None:
        """Pause rows until ``until`` (the collective waits for its new paths around
        ``faults``, which their stall is charged to)."""
        if not len(rows):
            return
        self._row_hold[rows] = np.maximum(self._row_hold[rows], float(until))
        held = self._held_flows
        for fid in self._row_flow[rows].tolist():
            held.setdefault(fid, set()).update(faults)
        self._dirty = True

    def _fault_new_rows(self, first_row: int) -> None:
        """Streams that start on a link the controller already knows is down wait for its
        new paths (or take them at once if they are in place). A stream that starts on a
        link its policy already routes around (``ideal`` at once, others once routing has
        converged) has no path that avoids it (a GPU's own link): it is rerouted at once,
        which finds it cut off (and names the faults that cut it)."""
        if self._ft is None:
            return
        told = self._told and not self._instant
        avoided = (self._known_down if told or self._instant
                   else self._route_down & self._phys_down)
        if not avoided.any():
            return
        rows = self._member_rows()
        hit = self._members_on(np.flatnonzero(avoided)) & (rows >= first_row)
        if not hit.any():
            return
        crossed = self._m_path[hit]
        crossed = distinct(crossed[(crossed >= 0) & avoided[np.maximum(crossed, 0)]])
        faults = set(self._owner_fault[crossed].tolist()) - {-1}
        if told and self._reroute_at > self.now:
            self._hold(distinct(rows[hit]), int(self._reroute_at), faults)
        elif told or self._instant:
            self._reroute(None, faults=faults)
        else:
            self._reroute(None, with_links_down(self.ct, self._route_down), faults)

    # ---------------------------------------------------------------- rerouting
    def _member_rows(self) -> NDArray[np.int64]:
        return np.searchsorted(self._row_flow, self._m_flow)

    def _members_on(self, links: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Members whose path crosses any of ``links``."""
        if not len(links) or not len(self._m_path):
            return np.zeros(len(self._m_path), bool)
        mask = np.zeros(self.ct.n_links + 1, bool)
        mask[links] = True
        return mask[np.where(self._m_path >= 0, self._m_path, self.ct.n_links)].any(axis=1)

    def _reroute(self, fault_id: int | None, ct2: Any | None = None,
                 faults: set[int] | None = None) -> None:
        """Move the members on links routing now avoids (the converged view ``ct2``, or
        what the controller knows) to new paths, and resume the paused streams. A fault is
        rerouted once none of its traffic is left on its dead links while they are down
        (traffic with no path left, cut off, waits for the repair: the fault then has no
        reroute time, whatever the policy)."""
        if faults is None:
            faults = {fault_id} if fault_id is not None else set()
        self._move_off(ct2, faults)
        links_of = self._fault_links(faults)
        for f in faults:
            rec = self._records[f]
            dead = links_of.get(f, np.zeros(0, np.int64))
            dead = dead[self._phys_down[dead]]  # (none: over before its traffic moved)
            if rec.rerouted_ns is None and len(dead) and not self._members_on(dead).any():
                rec.rerouted_ns = self.now

    def _move_off(self, ct2: Any | None, faults: set[int]) -> None:
        """:meth:`_reroute`'s moves."""
        known = self._known_down.copy() if ct2 is None else self._route_down
        self._rejoin(known)
        hit = self._members_on(np.flatnonzero(known))
        if hit.any() and getattr(self.policy, "sprays", False):
            hit = self._spread_off(hit, ct2, faults)
            self._rejoin(known)  # (a stream cut off may be left with live paths only)
        rows = self._member_rows()
        if hit.any():
            mem = np.flatnonzero(hit)
            r = rows[mem]
            src, dst = self._member_endpoints(mem)
            job = self._row_owner[r]
            new, failed = self._repath_each(job, src, dst, mem, ct2)
            bad = failed | self._crosses(new, known)
            if bad.any():  # (a stream is cut off only if the live fabric has no path)
                self._live_hash_paths(new, bad, src, dst, mem, known)
            if bad.any():
                cut_rows = distinct(r[bad])
                keep = ~np.isin(r, cut_rows)  # a stream with no path holds its whole row
                keys, new = self._m_key[mem[keep]], new[keep]
                named = {int(x): (int(a), int(b)) for x, a, b in zip(
                    r[bad].tolist(), src[bad].tolist(), dst[bad].tolist(), strict=True)}
                self._partition(cut_rows, faults, named,
                                self._faults_crossed(mem[bad], r[bad], known))
                # members may have gone (stopped jobs): find the kept ones again by key
                pos = np.searchsorted(self._m_key, keys)
                alive = (pos < len(self._m_key)) & (self._m_key[np.minimum(
                    pos, max(len(self._m_key) - 1, 0))] == keys) if len(self._m_key) \
                    else np.zeros(len(keys), bool)
                mem, new = pos[alive], new[alive]
                rows = self._member_rows()
                if not len(mem):
                    self._release_held()
                    return
            width = self._m_path.shape[1]
            out = np.full((len(new), width), -1, np.int32)
            out[:, : min(width, new.shape[1])] = new[:, :width]
            if self._hashed():  # (the path each hashed member had before any fault)
                for k, p in zip(self._m_key[mem].tolist(), self._m_path[mem], strict=True):
                    self._hashed_from.setdefault(k, p.copy())
            self._m_path[mem] = out
            self._weights_from_members(rows)
            for f in faults:
                self._records[f].streams_moved += len(mem)
            if ct2 is not None and not self._instant:
                self._wait_for_timeout(distinct(rows[mem]), faults)
            self._rejoin(known)  # (cut-off streams that have a whole path now go on)
            # (a planned stream takes its pair's whole new set, not one path per member)
            self._restream(mem)
            self._weights_from_members(self._member_rows())
        self._cut_for_good(faults)
        # the loss episodes end for the streams off dead links now; those still on one (a
        # fault routing has not converged on yet) go on losing since they began
        if self._loss_since:
            self._end_losses_off_dead_links()
        self._release_held()

    def _spread_off(self, hit: NDArray[np.bool_], ct2: Any | None, faults: set[int]
                    ) -> NDArray[np.bool_]:
        """A sprayed stream's paths that cross a dead link (members ``hit``) leave it: once
        its switches know, they spray over the live next hops only, so its other paths take
        the share of the dead ones, in proportion (each path's share grows by the same
        factor: an even spray stays even). Returns which members of those left still have
        to move: the streams with no live path (hashed onto the converged groups as any,
        or found cut off).

        A stream on 8 paths that loses one sends 1/7 of its bytes on each of the other 7
        (not 2/8 on one of them, as moving the dead path's member to one new path would)."""
        rows = self._member_rows()
        _, inv = np.unique(np.stack([rows, self._m_stream]), axis=1, return_inverse=True)
        inv = inv.reshape(-1)
        n_s = int(inv.max()) + 1
        live = ~hit
        has_live = np.bincount(inv, weights=live.astype(np.float64), minlength=n_s) > 0
        drop = hit & has_live[inv]
        if not drop.any():
            return hit
        total = np.bincount(inv, weights=self._m_share, minlength=n_s)
        kept = np.bincount(inv, weights=self._m_share * live, minlength=n_s)
        scale = np.divide(total, kept, out=np.ones(n_s), where=kept > 0)
        spread_rows = distinct(rows[drop])
        n_streams = len(distinct(inv[drop]))
        keep = ~drop
        self._m_share = self._m_share * scale[inv]
        self._keep_members(keep)
        if len(self._m_fault) == len(keep):
            self._m_fault = self._m_fault[keep]
            self._m_loss = self._m_loss[keep]
            self._m_black = self._m_black[keep]
        self._weights_from_members(self._member_rows())
        for f in faults:
            self._records[f].streams_moved += n_streams
        if ct2 is not None and not self._instant:
            self._wait_for_timeout(spread_rows, faults)
        return hit[keep]

    def _never_resent(self, flows: NDArray[np.int64]) -> None:
        """Flows dropped with their job (stopped: its QPs errored out) resend nothing: what
        they lost is no longer counted as resent, by them or by the faults."""
        for fid in flows.tolist():
            self._fault_retx.pop(fid, None)
            for f, b in self._retx_of.pop(fid, {}).items():
                rec = self._records[f]
                rec.bytes_retx = max(rec.bytes_retx - b, 0.0)

    def _members_changed(self) -> None:
        """The member arrays were rebuilt: what is kept per member here is found again at
        the next rate update (``_fault_rows``)."""
        self._m_fault = np.full(len(self._m_path), -1, np.int64)
        self._m_loss = np.zeros(len(self._m_path))
        self._m_black = np.zeros(len(self._m_path), bool)
        self._m_dead_hop = np.zeros((0, 0), bool)
        self._dirty = True

    def _hashed(self) -> bool:
        """The policy leaves moved streams to the switches' hash over the groups routing
        gives them (no paths of its own, no spraying)."""
        return (getattr(self.policy, "repath", None) is None
                and not getattr(self.policy, "sprays", False))

    def _hash_back(self) -> None:
        """Routing has links back: a hashed member a fault moved whose path before it is
        whole again takes it again, as the switches' hash of it over the whole groups
        gives (a switch re-adds the repaired next hop; the hash does not change)."""
        if not self._hashed_from or not len(self._m_key):
            return
        down = np.append(self._route_down | self._phys_down, False)
        width = self._m_path.shape[1]
        moved = []
        for i, k in enumerate(self._m_key.tolist()):
            p = self._hashed_from.get(k)
            if p is None:
                continue
            if not down[np.where(p >= 0, p, len(down) - 1)].any():
                self._m_path[i] = pad_paths(p[None, :], width)[0, :width]
                moved.append(k)
        for k in moved:
            del self._hashed_from[k]
        present = set(self._m_key.tolist())  # (and forget the members gone since)
        self._hashed_from = {k: p for k, p in self._hashed_from.items() if k in present}
        if moved:
            self._weights_from_members(self._member_rows())

    def _respray(self) -> None:
        """Routing has links back: every sprayed stream sprays over all the paths it has
        now (those it left at a failure, and those a stream that started meanwhile never
        had), evenly, as a new one would (a stream back on 8 paths of 8 sends 1/8 on each
        again)."""
        spray = getattr(self.policy, "spray_routes", None)
        if spray is None or not len(self._m_flow):
            return
        rows = self._member_rows()
        code = rows * (int(self._m_stream.max()) + 1) + self._m_stream
        uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        n = len(uniq)
        src, dst = self._member_endpoints(first)
        ok = (src >= 0) & (dst >= 0)
        if not ok.any():
            return
        idx = np.flatnonzero(ok)
        got = spray(TransferBatch(src[idx], dst[idx], np.ones(len(idx), np.int64),
                                  np.full(len(idx), -1, np.int64), np.zeros(len(idx), np.int64)),
                    np.arange(len(idx), dtype=np.int64))
        n_new = np.bincount(got.row, minlength=len(idx))
        n_now = np.bincount(inv, minlength=n)[idx]
        # (a stream with more paths now than members, each path whole)
        down = np.append(self._route_down | self._phys_down, False)
        whole = ~down[np.where(got.path >= 0, got.path, len(down) - 1)].any(axis=1)
        whole_all = np.bincount(got.row, weights=(~whole).astype(np.float64),
                                minlength=len(idx)) == 0
        grow = (n_new > n_now) & whole_all
        if not grow.any():
            return
        take = np.isin(got.row, np.flatnonzero(grow))
        s_of = idx[got.row[take]]  # each new member's stream (index into uniq)
        total = np.bincount(inv, weights=self._m_share, minlength=n)
        drop = np.isin(inv, idx[grow])
        m_of = first[s_of]  # a member of its stream, for its flow and stream index
        k = int(take.sum())
        keys = np.arange(self._n_members, self._n_members + k, dtype=np.int64)
        self._n_members += k
        _, first_new = np.unique(s_of, return_index=True)
        qp = keys[first_new][np.searchsorted(np.unique(s_of), s_of)]
        flow, stream = self._m_flow[m_of], self._m_stream[m_of]
        self._keep_members(~drop)
        width = max(self._m_path.shape[1], got.path.shape[1])
        self._m_flow = np.concatenate([self._m_flow, flow])
        self._m_stream = np.concatenate([self._m_stream, stream])
        self._m_share = np.concatenate([self._m_share, got.share[take] * total[s_of]])
        self._m_path = np.concatenate([pad_paths(self._m_path, width),
                                       pad_paths(got.path[take], width)], axis=0)
        self._m_key = np.concatenate([self._m_key, keys])
        self._m_qp = np.concatenate([self._m_qp, qp])
        self._members_changed()
        self._weights_from_members(self._member_rows())

    def _no_mouse_route(self, retry: Callable[[], None]) -> None:
        """A mouse has no path now: it tries again once routing may give it one (as
        :meth:`_no_route`), or is dropped and counted if no link will come back."""
        if not self._may_come_back():
            self._mice_cut += 1
            return
        self._mice_waiting += 1  # (the run goes on for it)
        self._retry_after_repair(retry)

    def _retry_after_repair(self, retry: Callable[[], None]) -> None:
        """Call ``retry`` once routing may have converged on the next repair (or, if the
        repairs were all played, on the links still avoided though up): at the repair
        itself for a policy that reroutes at once."""
        assert self._ft is not None
        ups = [ev.time_ns for ev in self._ft.events if ev.kind == "up" and ev.time_ns > self.now]
        p = self._ft.params
        lag = 0 if self._instant else p.convergence_delay_ns
        self._at(min(ups) + lag if ups else
                 self.now + max(p.convergence_delay_ns, p.detection_delay_ns, 1), retry)

    def _may_come_back(self) -> bool:
        """A link routing avoids now may come back later in the run: a repair is to come,
        or a link already back is still avoided (routing has not converged on it yet, or
        the controller not told)."""
        assert self._ft is not None
        back = ~self._phys_down
        return (self._ups_to_come > 0
                or bool((self._route_down & back).any())
                or bool((self._known_down & back).any()))

    def _cut_for_good(self, faults: set[int]) -> None:
        """Streams still cut off when no link is to come back later in the run will never
        move again: their jobs are stopped and reported (else the run would wait forever)."""
        if not self._cut_flows or self._ft is None or self._may_come_back():
            return
        rows = np.flatnonzero(np.isin(self._row_flow, list(self._cut_flows)))
        if len(rows):  # (each flow keeps the faults that cut it off)
            self._partition(rows, faults)
        self._cut_flows.clear()

    def _start_black_losses(self) -> bool:
        """The loss episodes (retry budgets) of the streams a gray link loses every packet
        of that have none yet start now; True if any did."""
        if (self._ft is None or self._ft.params.rdma_retry_count is None
                or len(self._m_black) != len(self._m_path)):
            return False
        started = False
        for fid, st in zip(self._m_flow[self._m_black].tolist(),
                           self._m_stream[self._m_black].tolist(), strict=True):
            if st not in self._loss_since.get(fid, {}):
                self._start_loss(fid, st, self.now)
                started = True
        return started

    def _stop_lost_for_good(self, hung_ns: int) -> bool:
        """Nothing has moved for ``hung_ns`` and only a policy's rounds are to come: the
        streams a gray link loses every packet of (drop 1: a black hole the link state does
        not show) are hung. Their jobs are stopped and reported, cut off by those faults;
        mice on them are dropped and counted. False if there were none (the caller's error
        stands)."""
        if self._ft is None or len(self._m_black) != len(self._m_path):
            return False
        black = np.flatnonzero(self._m_black)
        if not len(black):
            return False
        rows = self._member_rows()[black]
        path = self._m_path[black]
        hole = np.where(path >= 0, self._drop_p[np.where(path >= 0, path, 0)] >= 1.0, False)
        link = path[np.arange(len(path)), np.argmax(hole, axis=1)]
        src, dst = self._member_endpoints(black)
        stop: dict[int, str] = {}
        for r, lk, a, b in zip(rows.tolist(), link.tolist(), src.tolist(), dst.tolist(),
                               strict=True):
            j = int(self._row_owner[r])
            if j >= 0 and j not in stop:
                self._cut_off_by(int(self._owner_fault[lk]), j)
                stop[j] = (f"gpu{a} -> gpu{b}: every packet lost on gray link "
                           f"{self.ct.link_name(lk)} (drop 1) for {hung_ns / 1e6:g} ms, and "
                           "nothing to clear it or move the stream")
        mice = distinct(self._row_flow[rows[self._row_owner[rows] < 0]])
        for j, why in stop.items():
            self._abort_job(j, why)
        if len(mice):
            self._drop_rows(~np.isin(self._row_flow, mice), mice)
            self._mice_cut += len(mice)
        self._dirty = True
        return True

    def _release_held(self) -> None:
        """The streams paused for the controller's new paths resume (not those cut off)."""
        if self._held_flows and self.now >= self._reroute_at:
            ids = [f for f in self._held_flows if f not in self._cut_flows]
            held = np.flatnonzero(np.isin(self._row_flow, ids))
            self._row_hold[held] = -np.inf
            self._held_flows.clear()
        self._dirty = True

    def _repath_each(self, job: NDArray[np.int64], src: NDArray[np.int64],
                     dst: NDArray[np.int64], mem: NDArray[np.int64], ct2: Any | None
                     ) -> tuple[NDArray[np.int32], NDArray[np.bool_]]:
        """New paths for members, and which have none (one pair without a path must not
        take the others down with it)."""
        width = self._m_path.shape[1]
        qp = member_qp_index(self._member_rows(), self._m_stream)[mem]
        try:
            new = self._repath(job, src, dst, self._m_stream[mem], self._m_key[mem], ct2, qp)
            out = np.full((len(mem), width), -1, np.int32)
            out[:, : min(width, new.shape[1])] = new[:, :width]
            return out, np.zeros(len(mem), bool)
        except TopologyError:
            pass
        out = np.full((len(mem), width), -1, np.int32)
        failed = np.zeros(len(mem), bool)
        for i in range(len(mem)):
            sl = slice(i, i + 1)
            try:
                p = self._repath(job[sl], src[sl], dst[sl], self._m_stream[mem[sl]],
                                 self._m_key[mem[sl]], ct2, qp[sl])
                out[i, : min(width, p.shape[1])] = p[0, :width]
            except TopologyError:
                failed[i] = True
        return out, failed

    def _wait_for_timeout(self, rows: NDArray[np.int64], faults: set[int]) -> None:
        """Without a controller nobody tells a sender its path is back: a stream that lost
        packets resends them when its retransmission timer next fires (``rdma_timeout_ns``
        after the first loss, and every timeout after that)."""
        rto = self._ft.params.rdma_timeout_ns
        retries = self._ft.params.rdma_retry_count
        for r in rows.tolist():
            fid = int(self._row_flow[r])
            by_stream = self._loss_since.get(fid)
            if not by_stream:
                continue
            # (a ring's row goes on once each of its streams that lost packets resent them)
            fires = -1
            for st, since in by_stream.items():
                f = since + math.ceil((self.now - since) / rto) * rto
                if retries is not None and f > since + retries * rto:
                    self._too_late[(fid, st)] = since  # (its QP errors out: _retries_out)
                fires = max(fires, f)
            if fires > self.now:
                self._row_hold[r] = max(self._row_hold[r], float(fires))
                # (the faults it waits for: those its loss began under stay among them)
                prev = self._rto_wait.get(fid)
                was = prev[1] if prev is not None and prev[0] > self.now else set()
                self._rto_wait[fid] = (fires, set(faults) | was)
                self._at(int(fires), self._mark_dirty)

    def _start_loss(self, fid: int, stream: int, not_before: int) -> None:
        """Stream ``stream`` of flow ``fid`` loses packets from now on (a loss episode
        starts); with ``rdma_retry_count``, its QP gives up one timer after its last retry,
        checked then (or at ``not_before``, the end of the step being accounted: the clock
        is at its start)."""
        self._loss_since.setdefault(fid, {})[stream] = self.now
        retries = self._ft.params.rdma_retry_count if self._ft is not None else None
        if retries is not None:
            rto = self._ft.params.rdma_timeout_ns
            self._at(max(self.now + (retries + 1) * rto, not_before),
                     functools.partial(self._retries_out, fid, stream, self.now), True)

    def _retries_out(self, fid: int, stream: int, since: int) -> None:
        """Stream ``stream`` of flow ``fid`` lost packets from ``since`` on and its QP's
        retransmissions (``rdma_retry_count``, one per ``rdma_timeout_ns``) are spent now:
        if none reached the peer (its path came back after the last, or not yet), the QP
        errors out and its job stops (NCCL aborts the communicator), reported as such."""
        key = (fid, stream)
        if (self._loss_since.get(fid, {}).get(stream) != since
                and self._too_late.get(key) != since):
            return  # (its path came back in time, or a new loss started since)
        self._too_late.pop(key, None)
        r = int(np.searchsorted(self._row_flow, fid))
        if r >= len(self._row_flow) or self._row_flow[r] != fid:
            return  # (done, or dropped)
        j = int(self._row_owner[r])
        if j < 0 or j in self._aborted:
            return
        p = self._ft.params
        rto = (f"{p.rdma_timeout_ns / 1e6:g} ms" if p.rdma_timeout_ns >= 1_000_000 else
               f"{p.rdma_timeout_ns / 1e3:g} us")
        # the faults on its stream's path stopped the job: named with those they cut off
        on = (self._m_flow == fid) & (self._m_stream == stream)
        paths = self._m_path[on]
        links = distinct(paths[paths >= 0]) if len(paths) else np.zeros(0, np.int64)
        for f in distinct(self._owner_fault[links]).tolist() if len(links) else []:
            if f >= 0:
                self._cut_off_by(f, j)
        down = bool(len(links)) and bool(self._phys_down[links].any())
        self._abort_job(j, f"gpu{int(self._row_src[r])} -> gpu{int(self._row_dst[r])}: RDMA "
                           f"retries exhausted ({p.rdma_retry_count} every {rto}) while its "
                           + ("path was down" if down else "path lost every packet"))

    def _member_endpoints(self, mem: NDArray[np.int64]) -> tuple[NDArray, NDArray]:
        """Source and destination GPU of members (a ring row's streams differ from its
        representative pair): the ends of their paths."""
        ct = self.ct
        gpu_of = np.full(ct.n_links, -1, np.int64)
        gpu_of[ct.gpu_up] = np.arange(ct.n_gpus)
        gpu_to = np.full(ct.n_links, -1, np.int64)
        gpu_to[ct.gpu_down] = np.arange(ct.n_gpus)
        path = self._m_path[mem]
        last = np.maximum((path >= 0).sum(axis=1) - 1, 0)
        return gpu_of[path[:, 0]], gpu_to[path[np.arange(len(path)), last]]

    def _live_hash_paths(self, new: NDArray[np.int32], bad: NDArray[np.bool_],
                         src: NDArray[np.int64], dst: NDArray[np.int64],
                         mem: NDArray[np.int64], known: NDArray[np.bool_]) -> None:
        """Members the policy left on a link known down (or with no path) that the live
        fabric still connects: a hash of the stream over the groups without the links known
        down, as the switches would forward it (``new`` and ``bad`` updated in place)."""
        ct = with_links_down(self.ct, known)
        width = new.shape[1]
        for k in np.flatnonzero(bad).tolist():
            try:
                p = _hash_walk(ct, src[k:k + 1], dst[k:k + 1], self._m_key[mem[k:k + 1]])
            except TopologyError:
                continue
            if not self._crosses(p, known)[0]:
                new[k] = -1
                new[k, :min(width, p.shape[1])] = p[0, :width]
                bad[k] = False

    def _crosses(self, paths: NDArray[np.int32], down: NDArray[np.bool_]) -> NDArray[np.bool_]:
        safe = np.where(paths >= 0, paths, 0)
        return (down[safe] & (paths >= 0)).any(axis=1)

    def _repath(self, job: NDArray[np.int64], src: NDArray[np.int64], dst: NDArray[np.int64],
                stream: NDArray[np.int64], key: NDArray[np.int64], ct2: Any | None,
                qp: NDArray[np.int64] | None = None) -> NDArray[np.int32]:
        """New paths for members: the policy's own (``repath``; ``qp``: each member's place
        among its stream's members), or a hash of each over the converged ECMP groups."""
        repath = getattr(self.policy, "repath", None)
        if repath is not None:
            return np.asarray(repath(job, src, dst, stream, qp=qp), np.int32)
        ct = ct2 if ct2 is not None else with_links_down(self.ct, self._phys_down)
        return _hash_walk(ct, src, dst, key)

    def _no_route(self, j: int, retry: Callable[[], None], why: str,
                  src: NDArray[np.int64], dst: NDArray[np.int64]) -> None:
        """Job ``j``'s next stage (GPU pairs ``src -> dst``) has a pair routing finds no path
        for (``why``): links are down. If one comes back later in the run, the stage starts
        again once routing has converged on it (the collective waits, as NCCL does);
        otherwise the job is stopped and reported. Either way the faults that cut it
        (:meth:`_cutting_faults`) name it among those they cut off, and its wait is their
        stall. Without faults the fabric itself is cut: an error."""
        if self._ft is None:
            raise SimulationError(f"{why}: the fabric is not connected")
        # (every pair has a path again, routing has not converged on it yet: the faults
        # it waited for still)
        cutting = self._cutting_faults(src, dst) or sorted(self._waiting_jobs.get(j, ()))
        for f in cutting:
            self._cut_off_by(f, j)
        if self._may_come_back():
            waiting = self._waiting_jobs[j] = set(cutting)

            def again() -> None:
                retry()  # (no path yet: it waits again, for the faults found then)
                if self._waiting_jobs.get(j) is waiting:
                    del self._waiting_jobs[j]

            self._retry_after_repair(again)
            return
        self._abort_job(j, f"{why.replace('no path from ', '').replace(' to ', ' -> ')} "
                           "has no path left")

    def _cutting_faults(self, src: NDArray[np.int64], dst: NDArray[np.int64]) -> list[int]:
        """The faults (ids) down now that cut a pair of ``src -> dst`` off: those holding down
        a link of one of the fewest-hop paths of a pair with no live path
        (:meth:`_pair_faults`). A fault elsewhere is not named; if none is found so (a route
        no fewest-hop path explains), every fault down now is; none if every pair has a
        live path (routing has not converged on a repair yet)."""
        assert self._ft is not None
        down_now = [info.fault_id for info in self._ft.faults
                    if info.start_ns <= self.now and self._phys_down[list(info.links)].any()]
        cut, per_pair = self._cut_now(np.asarray(src, np.int64), np.asarray(dst, np.int64))
        if not cut.any():
            return []
        cutters = set().union(*per_pair)
        return [f for f in down_now if f in cutters] or down_now

    def _cut_now(self, src: NDArray[np.int64], dst: NDArray[np.int64]
                 ) -> tuple[NDArray[np.bool_], list[set[int]]]:
        """Which pairs ``src -> dst`` have no route in the fabric as it is now (links down
        physically, whatever routing knows yet), and for each of those the faults that cut
        it (:meth:`_pair_faults`)."""
        down = self._phys_down
        cut = ~self._routed(src, dst, down, with_links_down(self.ct, down))
        return cut, (self._pair_faults(src[cut], dst[cut], down) if cut.any() else [])

    def _fault_links(self, faults: Iterable[int]) -> dict[int, NDArray[np.int64]]:
        """The directed links of each fault of ``faults``."""
        want = set(faults)
        return {info.fault_id: np.asarray(info.links, np.int64)
                for info in (self._ft.faults if self._ft is not None else [])
                if info.fault_id in want}

    def _pair_faults(self, src: NDArray[np.int64], dst: NDArray[np.int64],
                     down: NDArray[np.bool_], more: list[set[int]] | None = None
                     ) -> list[set[int]]:
        """Per GPU pair ``src[i] -> dst[i]`` with no live path, the faults that cut it off.
        The suspects are those holding down (``down``: a mask over links) a link of one of
        its fewest-hop paths in the intact fabric (its NIC links, and the switch links of
        :func:`~fabricpilot.topology.paths.switch_links_between`), and ``more[i]``. Named
        are the suspects whose repair alone gives it a path (routing over the links down
        but theirs); all of them if none does (only repairs together would). Pairs within a
        host's NVLink domain (or with an end unknown, -1) have none.

        Leaf2 down for good and spine0 -> leaf3 down: gpu5 (leaf2) -> gpu6 (leaf3) has both
        on its paths, but only leaf2's repair would give it one, through spine1."""
        ct = self.ct
        own = np.where(down, self._owner_fault, -1)
        nv = (src < 0) | (dst < 0)
        src, dst = np.maximum(src, 0), np.maximum(dst, 0)
        nv |= intra_host(ct, src, dst)
        up_f = np.where(nv, -1, own[ct.gpu_up[src]]).tolist()
        down_f = np.where(nv, -1, own[ct.gpu_down[dst]]).tolist()
        between: dict[tuple[int, int], set[int]] = {}
        mended: dict[int, tuple[NDArray[np.bool_], Any]] = {}  # fault -> (mask, routing)

        def reconnects(f: int, s: int, d: int) -> bool:
            if f not in mended:
                m = down.copy()
                m[self._fault_links([f]).get(f, np.zeros(0, np.int64))] = False
                mended[f] = m, with_links_down(ct, m)
            return bool(self._routed(np.array([s]), np.array([d]), *mended[f])[0])

        memo: dict[tuple[Any, ...], set[int]] = {}
        out: list[set[int]] = []
        for i, (a, b, fu, fd, same_host, s, d) in enumerate(zip(
                ct.gpu_leaf[src].tolist(), ct.gpu_leaf[dst].tolist(), up_f, down_f,
                nv.tolist(), src.tolist(), dst.tolist(), strict=True)):
            if same_host:
                out.append(set())
                continue
            fs = between.get((a, b))
            if fs is None:
                fs = between[(a, b)] = set(own[switch_links_between(ct, a, b)].tolist()) - {-1}
            suspects = fs | ({fu, fd} - {-1}) | (more[i] if more is not None else set())
            key = (a, b, fu, fd, frozenset(suspects))
            named = memo.get(key)
            if named is None:
                named = suspects if len(suspects) < 2 else (
                    {f for f in suspects if reconnects(f, s, d)} or suspects)
                memo[key] = named
            out.append(named)
        return out

    def _routed(self, src: NDArray[np.int64], dst: NDArray[np.int64], down: NDArray[np.bool_],
                view: Any) -> NDArray[np.bool_]:
        """Which GPU pairs have a route with the links ``down`` down (``view``: routing
        converged around them, :func:`~fabricpilot.topology.compiled.with_links_down`):
        both NIC links up, and the leaves one or joined by an ECMP group."""
        ct = self.ct
        a, b = ct.gpu_leaf[src], ct.gpu_leaf[dst]
        return (~down[ct.gpu_up[src]] & ~down[ct.gpu_down[dst]]
                & ((a == b) | (view.nh_count[a, ct.leaf_slot[b]] > 0)))

    def _cut_off_by(self, fault: int, j: int) -> None:
        """Job ``j`` was cut off by ``fault``: named among the jobs it partitioned (and so
        among those it hit), and the fault not recovered until the job is."""
        rec = self._records[fault]
        if self.jobs[j].name not in rec.partitioned:
            rec.partitioned.append(self.jobs[j].name)
        self._touch(rec, [j])
        # (a recovery found before: none yet, as the fault had reached no job then)
        rec.recovered_ns = None

    def _faults_crossed(self, mem: NDArray[np.int64], rows: NDArray[np.int64],
                        down: NDArray[np.bool_]) -> dict[int, set[int]]:
        """Per row, the faults that cut its members ``mem`` (on those ``rows``, with no
        live path) off (:meth:`_pair_faults`, the faults holding down (``down``) a link
        their paths cross among the suspects): whichever fault's rerouting found them."""
        path = self._m_path[mem]
        link = np.where(path >= 0, path, 0)
        f = np.where((path >= 0) & down[link], self._owner_fault[link], -1)
        src, dst = self._member_endpoints(mem)
        on_path = [{x for x in fs if x >= 0} for fs in f.tolist()]
        out: dict[int, set[int]] = {}
        for r, fs in zip(rows.tolist(), self._pair_faults(src, dst, down, on_path),
                         strict=True):
            out.setdefault(int(r), set()).update(fs)
        return out

    def _partition(self, rows: NDArray[np.int64], faults: set[int],
                   named: dict[int, tuple[int, int]] | None = None,
                   cause: dict[int, set[int]] | None = None) -> None:
        """Flows with no live path left. If a link comes back later in the run (a repair,
        a flap), their jobs wait for it (the collective hangs on its peers, as NCCL does);
        otherwise the jobs are stopped and reported (``named``: per row, a GPU pair of it
        found with no path, to name; else a stream of the job's on a dead link). Each flow
        is charged to the faults that cut it: those it was cut by already, else ``cause``
        (per row, the faults on its dead path), else ``faults``."""
        cut_by = [self._cut_flows.get(int(fid)) or (cause or {}).get(int(r)) or set(faults)
                  for r, fid in zip(rows.tolist(), self._row_flow[rows].tolist(),
                                    strict=True)]
        for j, fs in sorted(zip(self._row_owner[rows].tolist(), cut_by, strict=True),
                            key=lambda x: x[0]):
            if j < 0:  # (mice: no job to name)
                continue
            for f in sorted(fs):
                self._cut_off_by(f, j)
        if self._may_come_back():
            self._row_hold[rows] = math.inf
            for fid, fs in zip(self._row_flow[rows].tolist(), cut_by, strict=True):
                self._cut_flows[int(fid)] = set(fs)
            self._dirty = True
            return
        cut = []
        # (name a stream that is cut: a ring's row stands for all its pairs)
        m_rows = self._member_rows()
        on_dead = (self._members_on(np.flatnonzero(self._phys_down | self._route_down
                                                   | self._known_down))
                   & np.isin(m_rows, rows))
        for j in sorted(set(self._row_owner[rows].tolist())):
            if j < 0:
                continue
            mine = rows[self._row_owner[rows] == j]
            a, b = int(self._row_src[mine[0]]), int(self._row_dst[mine[0]])
            pick = np.flatnonzero(on_dead & np.isin(m_rows, mine))[:1]
            known = [named[x] for x in mine.tolist() if named and x in named]
            if known:
                a, b = known[0]
            elif len(pick):
                ma, mb = self._member_endpoints(pick)
                if ma[0] >= 0 and mb[0] >= 0:
                    a, b = int(ma[0]), int(mb[0])
            cut.append((j, f"gpu{a} -> gpu{b} has no path left"))
        mice = self._row_flow[rows[self._row_owner[rows] < 0]]  # (no job: they are dropped)
        for j, why in cut:  # rows shift as jobs are stopped: decide first, then stop
            self._abort_job(j, why)
        if len(mice):
            gone = np.isin(self._row_flow, mice)
            self._drop_rows(~gone, mice)
            self._mice_cut += len(mice)
            self._dirty = True

    def _rejoin(self, down: NDArray[np.bool_]) -> None:
        """Cut-off streams whose paths are whole again (a link came back) resume."""
        if not self._cut_flows:
            return
        rows = self._member_rows()
        bad = self._members_on(np.flatnonzero(down))
        for fid in list(self._cut_flows):
            r = int(np.searchsorted(self._row_flow, fid))
            if r >= len(self._row_flow) or self._row_flow[r] != fid:
                del self._cut_flows[fid]
                continue
            if not bad[rows == r].any():
                self._row_hold[r] = -np.inf
                del self._cut_flows[fid]
                self._dirty = True

    # ---------------------------------------------------------------- accounting
    def _fault_rows(self) -> None:
        """Per row: the share of its bytes going into dead links and the share resent for
        gray losses; per member: the fault its path hits."""
        self._gray_progress()
        n_rows = len(self._row_flow)
        self._row_dead = np.zeros(n_rows)
        self._row_loss = np.zeros(n_rows)
        self._m_fault = np.full(len(self._m_path), -1, np.int64)
        self._m_loss = np.zeros(len(self._m_path))
        self._m_black = np.zeros(len(self._m_path), bool)
        self._row_black = np.zeros(n_rows, bool)
        self._m_dead_hop = np.zeros((0, 0), bool)
        if not n_rows or self._instant or not len(self._m_path):
            return
        if not (self._phys_down.any() or self._drop_p.any()):
            return
        rows = self._member_rows()
        valid = self._m_path >= 0
        safe = np.where(valid, self._m_path, 0)
        dead_hop = self._m_dead_hop = self._phys_down[safe] & valid
        dead = dead_hop.any(axis=1)
        keep = np.where(valid, 1.0 - self._drop_p[safe], 1.0).prod(axis=1)
        loss = self._m_loss = np.where(dead, 0.0, 1.0 - keep)
        first = np.argmax(dead_hop, axis=1)
        gray_hop = (self._drop_p[safe] > 0) & valid
        first_gray = np.argmax(gray_hop, axis=1)
        hit_link = np.where(dead, safe[np.arange(len(safe)), first],
                            safe[np.arange(len(safe)), first_gray])
        self._m_fault = np.where(dead | (loss > 0), self._owner_fault[hit_link], -1)
        # per stream, then the worst stream of each row (a ring moves at its slowest)
        streams, inv = np.unique(np.stack([rows, self._m_stream]), axis=1, return_inverse=True)
        inv = inv.reshape(-1)
        self._row_dead = np.zeros(n_rows)
        self._row_loss = np.zeros(n_rows)
        np.maximum.at(self._row_dead, streams[0], np.bincount(
            inv, weights=self._m_share * dead, minlength=streams.shape[1]))
        np.maximum.at(self._row_loss, streams[0], np.bincount(
            inv, weights=self._m_share * loss, minlength=streams.shape[1]))
        if (loss >= 1.0).any():
            # a QP whose every path loses every packet (one path per QP of a planned set;
            # a sprayed QP still gets packets through its other paths) delivers nothing
            _, qp = np.unique(self._m_qp, return_inverse=True)
            qp = qp.reshape(-1)
            n_qp = int(qp.max()) + 1
            whole = np.bincount(qp, weights=self._m_share, minlength=n_qp)
            lost = np.bincount(qp, weights=self._m_share * loss, minlength=n_qp)
            self._m_black = (lost >= whole * (1.0 - 1e-12))[qp] & (loss > 0)
            self._row_black[rows[self._m_black]] = True

    def _into_dead_links(self, w: Any, caps: NDArray[np.float64]) -> tuple[Any, NDArray]:
        """The rows' link weights and rate caps as the fabric sees them while links are
        down and routing has not moved the streams off them yet (``w``, ``caps``: as
        routed; call after :meth:`_fault_rows`):

        * a stream's bytes load the links of its path up to the first dead one, none
          after it: they are dropped there and never reach the links beyond (nor compete
          there with the streams that do);
        * a row all of whose bytes go into dead links (``_row_dead`` 1) sends, as an RC QP
          does, what it has left and then waits for its retransmission timer: on average
          at most ``remaining * 8 / rdma_timeout_ns`` Gb/s, not its link's rate for the
          whole time routing takes to converge.

        ``(w, caps)`` unchanged when no stream crosses a dead link."""
        dead_hop = self._m_dead_hop  # (per member and hop, as _fault_rows found them)
        if not dead_hop.any():
            return w, caps
        before = (self._m_path >= 0) & (np.cumsum(dead_hop, axis=1) == 0)  # (ahead of it)
        live_w = self._member_weights(np.where(before, self._m_path, -1), self._member_rows())
        caps = caps.copy()
        all_dead = self._row_dead >= 1.0
        if all_dead.any() and self._ft is not None:
            rto_ns = float(self._ft.params.rdma_timeout_ns)
            caps[all_dead] = np.minimum(caps[all_dead],
                                        self._remaining[all_dead] * 8.0 / rto_ns)
        return live_w, caps

    def _gray_progress(self) -> None:
        """A gray fault is detected when the controller confirms one of its links (from
        the error counters, debounced) and rerouted once no stream crosses it any more."""
        confirmed = getattr(self.policy, "confirmed_gray", None)
        if not confirmed or self._ft is None:
            return
        for info in self._ft.faults:
            rec = self._records[info.fault_id]
            if info.kind != "gray" or rec.rerouted_ns is not None:
                continue
            if rec.detected_ns is None:
                # (a confirmation of an earlier gray fault on the same link is not this one's)
                seen = [confirmed[lk] for lk in info.links
                        if lk in confirmed and confirmed[lk] >= info.start_ns]
                if not seen:
                    continue
                rec.detected_ns = int(min(seen))
            if not self._members_on(np.asarray(info.links, np.int64)).any():
                rec.rerouted_ns = self.now

    def _goodput_of(self, rates: NDArray[np.float64]) -> NDArray[np.float64]:
        """Useful rate of every row: the dead share sends into nothing; a gray loss costs the
        packet and one round trip of packets after it (go-back-N). A stream sprayed to an
        in-order NIC (``receiver_in_order``) with part of its paths dead loses that share
        of its packets as a gray link would (each loss costs a round trip of packets after
        it), at most what it sends onto live paths."""
        if not len(rates):
            return rates
        if not (self._row_dead.any() or self._row_loss.any()):
            return rates
        window_pkts, gray = self._go_back_n(rates)
        useful = rates * self._dead_useful(window_pkts) * gray
        if len(self._row_black) == len(useful):
            useful[self._row_black] = 0.0
        return useful

    def _go_back_n(self, rates: NDArray[np.float64],
                   rows: NDArray[np.int64] | slice = slice(None),
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """For rows ``rows`` sending at ``rates`` (theirs): the packets of one round trip
        ``W`` of the hop (a ring's row: one hop, not the ring: each hop is a QP of its own),
        and the share of their bytes a gray loss of ``p`` per packet leaves useful,
        :func:`go_back_n_useful`."""
        window = (rates * np.maximum(2 * self._row_hop_ns[rows], 1)
                  / (8.0 * self.fabric.mtu_bytes))
        return window, go_back_n_useful(self._row_loss[rows], window)

    def _dead_useful(self, window_pkts: NDArray[np.float64],
                     rows: NDArray[np.int64] | slice = slice(None)) -> NDArray[np.float64]:
        """Of the bytes rows send (``window_pkts``: packets in one round trip of each),
        the share not lost to dead links: all but the dead share; for a stream sprayed to an
        in-order NIC with only part of its paths dead, ``1 / (1 + d (1 + W))`` (a loss
        every ``1 / d`` packets, each costing itself and the ``W`` packets after it) if that
        is less.

        >>> m = type("M", (), {"_row_dead": np.array([0.0, 0.25, 1.0]),
        ...                    "policy": type("P", (), {"receiver_in_order": True})})()
        >>> FaultsMixin._dead_useful(m, np.array([9.0, 9.0, 9.0])).tolist()
        [1.0, 0.2857142857142857, 0.0]
        """
        dead = np.clip(self._row_dead[rows], 0.0, 1.0)
        useful = 1.0 - dead
        if getattr(self.policy, "receiver_in_order", False):
            part = (dead > 0) & (dead < 1)
            useful = np.where(part, np.minimum(useful, 1.0 / (1.0 + dead * (1.0 + window_pkts))),
                              useful)
        return useful

    def _fault_account(self, dt: int) -> None:
        """Charge ``dt`` ns of the current rates to the faults: bytes lost and resent, and
        the stall of every job with a stream paused or sending into a dead link, or
        waiting for a repair to start its next stage."""
        if not self._records or dt <= 0 or not (len(self._rates) or self._waiting_jobs):
            return
        if len(self._m_fault) == len(self._m_path) and (self._m_fault >= 0).any():
            rows = self._member_rows()
            mem = np.flatnonzero(self._m_fault >= 0)
            r = rows[mem]
            sent = self._rates[r] * self._m_share[mem] * dt / 8.0
            valid = self._m_path[mem] >= 0
            safe = np.where(valid, self._m_path[mem], 0)
            dead = (self._phys_down[safe] & valid).any(axis=1)
            fresh = len(self._m_loss) == len(self._m_path)
            gray_loss = self._m_loss[mem] if fresh else np.zeros(len(mem))
            black = self._m_black[mem] if fresh else np.zeros(len(mem), bool)
            # a dead member's bytes are lost and sent again; a gray member's useless share
            # (the lost packets and the go-back-N window after each) is sent again
            window, gray_useful = self._go_back_n(self._rates[r], r)
            # (a dead member of a stream sprayed to an in-order NIC also carries what its
            # live paths resend, going back N after each of its losses: see _dead_useful)
            d_row = np.clip(self._row_dead[r], 0.0, 1.0)
            waste = np.divide(1.0 - self._dead_useful(window, r), d_row,
                              out=np.ones(len(r)), where=(d_row > 0) & (d_row < 1))
            resent = np.where(dead, sent * np.maximum(waste, 1.0),
                              np.where(black, sent, sent * (1.0 - gray_useful)))
            if dead.any():
                self._name_cut_off(mem[dead])
            # (a stream a gray link loses every packet of retries as one on a dead link)
            lost_all = dead | black
            for fid, st in zip(self._row_flow[r[lost_all]].tolist(),
                               self._m_stream[mem[lost_all]].tolist(), strict=True):
                if st not in self._loss_since.get(fid, {}):
                    self._start_loss(fid, st, self.now + dt)
            fids, at = np.unique(self._row_flow[r], return_inverse=True)
            for fid, b in zip(fids.tolist(), np.bincount(at.reshape(-1), weights=resent,
                                                         minlength=len(fids)).tolist(),
                              strict=True):
                self._fault_retx[fid] = self._fault_retx.get(fid, 0.0) + b
            f_of = self._m_fault[mem]
            for f in distinct(f_of).tolist():
                sel = f_of == f
                rec = self._records[f]
                # (into dead links, and the packets gray links drop)
                rec.bytes_lost += float(np.where(dead, sent, sent * gray_loss)[sel].sum())
                rec.bytes_retx += float(resent[sel].sum())
                self._touch(rec, [j for j in self._row_owner[r[sel]].tolist() if j >= 0])
                # (per flow: taken back if its job is stopped before it resends them)
                fl, at_f = np.unique(self._row_flow[r[sel]], return_inverse=True)
                for fid, b in zip(fl.tolist(), np.bincount(
                        at_f.reshape(-1), weights=resent[sel], minlength=len(fl)).tolist(),
                        strict=True):
                    by = self._retx_of.setdefault(fid, {})
                    by[f] = by.get(f, 0.0) + b
        # fault -> job -> the share of its time lost (1: stalled; a stream sprayed with part
        # of its paths dead goes on at the share of its bytes that still arrive)
        stalled: dict[int, dict[int, float]] = {}

        def stall(f: int, j: int, share: float = 1.0) -> None:
            by = stalled.setdefault(f, {})
            by[j] = max(by.get(j, 0.0), share)

        if len(self._m_fault) == len(self._m_path):
            rows = self._member_rows()
            # (a member a gray link loses every packet of stalls its job as a dead one does)
            black = (self._m_black if len(self._m_black) == len(rows)
                     else np.zeros(len(rows), bool))
            dead_m = ((self._m_fault >= 0) & ((self._row_dead[rows] > 0) | black)
                      if len(rows) else np.zeros(0, bool))
            if dead_m.any():
                lost = 1.0 - self._dead_useful(self._go_back_n(self._rates)[0])
                if len(self._row_black) == len(lost):
                    lost[self._row_black] = 1.0
                for f, j, share in zip(self._m_fault[dead_m].tolist(),
                                       self._row_owner[rows][dead_m].tolist(),
                                       lost[rows[dead_m]].tolist(), strict=True):
                    if j >= 0:
                        stall(f, j, share)
        held = (np.flatnonzero(np.isin(self._row_flow, list(self._held_flows)))
                if self._held_flows else np.zeros(0, np.int64))
        if len(held):
            # (charged to the faults it waits for that are not routed around yet, or, if
            # those are, to every such fault: its wait was drawn out by another's)
            active = {f for f, rec in self._records.items()
                      if rec.detected_ns is not None and rec.rerouted_ns is None}
            for fid, j in zip(self._row_flow[held].tolist(), self._row_owner[held].tolist(),
                              strict=True):
                if j >= 0:
                    for f in (self._held_flows[fid] & active) or active:
                        stall(f, j)
        if self._cut_flows:
            for fid, j in zip(self._row_flow.tolist(), self._row_owner.tolist(), strict=True):
                if fid in self._cut_flows and j >= 0:
                    for f in self._cut_flows[fid]:
                        stall(f, j)
        if self._rto_wait:
            for fid, j in zip(self._row_flow.tolist(), self._row_owner.tolist(), strict=True):
                wait = self._rto_wait.get(fid)
                if wait is not None and wait[0] > self.now and j >= 0:
                    for f in wait[1]:
                        stall(f, j)
            self._rto_wait = {k: v for k, v in self._rto_wait.items() if v[0] > self.now}
        for j, fs in self._waiting_jobs.items():
            for f in fs:
                stall(f, j)
        # a job stalled by several faults at once is charged to the one that began first
        # (its stall and GPU time are counted once over the faults, at its largest share)
        charged: dict[int, int] = {}
        share_of: dict[int, float] = {}
        for f, jobs in stalled.items():
            self._touch(self._records[f], list(jobs))
            for j, share in jobs.items():
                share_of[j] = max(share_of.get(j, 0.0), share)
                g = charged.get(j)
                if g is None or (self._records[f].start_ns, f) < (self._records[g].start_ns, g):
                    charged[j] = f
        for j, f in charged.items():
            rec = self._records[f]
            name = self.jobs[j].name
            lost_ns = dt * share_of[j]
            rec.job_stall_ns[name] = rec.job_stall_ns.get(name, 0.0) + lost_ns
            rec.gpu_seconds_lost += lost_ns * 1e-9 * len(self.jobs[j].gpus)

    def _fault_recovery(self) -> None:
        """Mark faults whose affected jobs are back to 95 % of their pre-fault throughput
        (or idle on the network: computing, or done) once rerouted or over."""
        if not self._records:
            return
        now_gbps = self._job_goodput()
        busy = np.zeros(len(self.jobs), bool)
        own = self._row_owner[self._row_owner >= 0]
        busy[own] = True
        # the jobs cut off now: stopped, waiting for a repair to start a stage, or with a
        # stream held until a path comes back
        cut_off = set(self._aborted) | set(self._waiting_jobs)
        if self._cut_flows:
            held = np.isin(self._row_flow, list(self._cut_flows))
            cut_off.update(self._row_owner[held & (self._row_owner >= 0)].tolist())
        for rec in self._records.values():
            # (once its traffic is rerouted, or the fault is over: a link back before
            # routing moved anything off it)
            over = rec.end_ns is not None and self.now >= rec.end_ns
            if rec.recovered_ns is not None or (rec.rerouted_ns is None and not over):
                continue
            if rec.kind == "gray" and rec.end_ns is None and not rec.affected:
                continue
            # (a job with flows open and nothing getting through is not recovered, whatever
            # it sent before: it may have been stalled then by an earlier fault; nor is one
            # the fault cut off while it waits for a repair, or once it is stopped: its
            # idle network is no sign of health)
            cut = set(rec.partitioned)
            ok = all(not (j in cut_off and self.jobs[j].name in cut)
                     and (not busy[j] or (now_gbps[j] > 0 and now_gbps[j] >= RECOVERED_SHARE
                                          * rec.pre_fault_gbps.get(j, 0)))
                     for j in rec.affected)
            if ok:
                rec.recovered_ns = self.now
