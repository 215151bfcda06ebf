"""``task-aware``: the twin's side of the controller (plan + local adaptation).

The policy is the data plane the :class:`~fabricpilot.controller.core.Controller` drives: it
implements :class:`~fabricpilot.controller.southbound.DataPlane` (the fabric as a
:class:`FabricView`, path-set rules, a congestion table) and forwards as the switches would
with those rules installed. A transfer whose (job, source, destination) has a planned path set
is split over the set's paths in proportion to their weights (one QP per path); everything
else, and everything before the rules take effect (``control_latency_ns`` after they were
sent), is routed by switch-local adaptive routing, which also keeps adapting between plans.

In the twin, jobs declare themselves from the scenario (:meth:`TaskAware.attach_jobs`): each
collective is a call whose pairs are the GPU pairs its stages exchange data between.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import MutableMapping, Sequence
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from fabricpilot.balancing.adaptive import Adaptive, on_links, split_tables, walk_split
from fabricpilot.balancing.base import (
    ActiveMembers,
    MemberRoutes,
    Moves,
    PolicyContext,
    RoutedBatch,
    TelemetryFn,
    TransferBatch,
    assemble,
    entity_of,
    member_qp_index,
    paths_to_weights,
    register_policy,
    stream_index,
)
from fabricpilot.controller.core import (
    Controller,
    PlanReport,
    TickReport,
    mice_links,
    rule_key,
)
from fabricpilot.controller.intents import CommCall, Intent
from fabricpilot.controller.southbound import (
    BatchMap,
    EcmpSpec,
    FabricView,
    LinkInfo,
    PathSet,
    PathSetBatch,
    PortDelta,
    get_all,
)
from fabricpilot.errors import FabricpilotError
from fabricpilot.net.hashing import gpu_ip, qp_source_port, switch_hash
from fabricpilot.topology.compiled import LINK_KIND_CODES
from fabricpilot.topology.paths import max_path_links, pad_paths, path_delay_ns, walk_paths
from fabricpilot.workload.jobs import JobSpec

_KIND_NAME = {code: str(kind) for kind, code in LINK_KIND_CODES.items()}
_chain = itertools.chain.from_iterable
_KEY = operator.attrgetter("key")
_RULES = operator.attrgetter("rules")
DEFAULT_SLA_US = 1_000.0  # jobs that declare no SLA: L3


def fabric_view(ctx: PolicyContext) -> FabricView:
    """The compiled topology as the controller reads it."""
    ct = ctx.topology
    names = list(ct.node_names)
    kind = {n: str(ct.topo.graph.nodes[n].get("kind", "switch")) for n in names}
    tier = {names[int(ct.switch_node[s])]: int(ct.switch_tier[s])
            for s in range(len(ct.switch_node))}
    links = [LinkInfo(i, names[int(ct.link_src[i])], names[int(ct.link_dst[i])],
                      float(ct.rate_gbps[i]), int(ct.delay_ns[i]),
                      _KIND_NAME[int(ct.link_kind[i])]) for i in range(ct.n_links)]
    gpu_node = {g: names[int(ct.link_src[ct.gpu_up[g]])] for g in range(len(ct.gpu_up))}
    return FabricView.from_links(links, kind, tier, gpu_node, ecmp=ecmp_spec(ctx),
                                 rule_capacity=ctx.controller.switch_rule_capacity,
                                 switch_latency_ns=float(ctx.switch_latency_ns))


def ecmp_spec(ctx: PolicyContext) -> EcmpSpec:
    """The twin's switches' hash as a controller reads it: seeds, NIC entropy, and every
    ECMP group's members in bucket order (the order :func:`walk_paths` indexes)."""
    ct = ctx.topology
    names = list(ct.node_names)
    sw_name = [names[int(n)] for n in ct.switch_node]
    leaf_of_slot = {int(ct.leaf_slot[s]): sw_name[s] for s in np.flatnonzero(ct.leaf_slot >= 0)}
    # (each group's members: its row of next-hop links, as long as its count; read at once)
    at_s, at_t = np.nonzero(ct.nh_count > 0)
    rows = ct.nh_link[at_s, at_t].tolist()
    groups = {(sw_name[s], leaf_of_slot[t]): tuple(row[:count]) for s, t, row, count in zip(
        at_s.tolist(), at_t.tolist(), rows, ct.nh_count[at_s, at_t].tolist(), strict=True)}
    return EcmpSpec(ctx.seed, ctx.ecmp.per_switch_seed, ctx.ecmp.source_port_entropy,
                    {n: i for i, n in enumerate(sw_name)}, groups,
                    {g: sw_name[int(ct.gpu_leaf[g])] for g in range(len(ct.gpu_leaf))})


def job_intents(jobs: list[JobSpec], tenant: str) -> list[Intent]:
    """The intents the twin's jobs declare: each collective a call whose pairs are the GPU
    pairs its stages exchange data between, each as many times as one stage has transfers
    on it at once (the two trees of a tree AllReduce may share a pair; jobs without an
    SLA: L3)."""
    out = []
    for job in jobs:
        calls = []
        for plan in job.collectives:
            times: Counter[tuple[int, int]] = Counter()
            seen: set[tuple[int, int]] = set()
            for st in plan.stages:
                if (id(st.src), id(st.dst)) in seen:  # (a ring's steps share their arrays)
                    continue
                seen.add((id(st.src), id(st.dst)))
                once = Counter((a, b) for a, b in zip(st.src.tolist(), st.dst.tolist(),
                                                      strict=True) if a != b)
                times |= once  # (stages run one after the other: the most of any)
            pairs = sorted(times.elements())
            calls.append(CommCall(str(plan.op), max(int(plan.size_bytes), 1),
                                  job.sla_us or DEFAULT_SLA_US, job.compute_ns,
                                  job.priority, pairs=tuple(pairs)))
        out.append(Intent(job.name, tenant, tuple(job.gpus), tuple(calls),
                          opt_in=job.declare_intent))
    return out


def _tier_lambdas(controller: Controller | None) -> dict[int, float]:
    """The current plan's lambda per priority tier, highest first (empty unless the plan
    has several priorities)."""
    plan = controller.current if controller is not None else None
    if plan is None:
        return {}
    prefix = "lambda_priority_"
    return {int(k[len(prefix):]): round(v, 4) for k, v in plan.extra.items()
            if k.startswith(prefix)}


def _pair_code(key: str, job_index: dict[str, int], n_gpus: int) -> int | None:
    """The code ``(job * n_gpus + src) * n_gpus + dst`` of a rule key ``task:src->dst``
    (``None`` for a key of no job here or of no GPU pair).

    >>> _pair_code("b:3->1", {"a": 0, "b": 1}, 4), _pair_code("c:3->1", {"a": 0}, 4)
    (29, None)
    """
    task, _, pair = key.rpartition(":")
    j = job_index.get(task)
    a, _, b = pair.partition("->")
    if j is None or not (a.isdigit() and b.isdigit()):
        return None
    return (j * n_gpus + int(a)) * n_gpus + int(b)


def _due_keys(new: dict[str, float], batches: list[tuple[list[str], float]], now: float
              ) -> tuple[list[str], list[tuple[list[str], float]]]:
    """The keys whose new path set takes effect by ``now``: those of ``new`` (key -> when),
    which are taken out of it, and those of the ``batches`` due (keys given at once, with
    when), but for the keys ``new`` has (given again since: they go by that time); and the
    batches not yet due.

    >>> new = {"b": 9.0, "c": 4.0}
    >>> _due_keys(new, [(["a", "b"], 5.0), (["d"], 7.0)], 5.0), new
    ((['c', 'a'], [(['d'], 7.0)]), {'b': 9.0})
    """
    due = [k for k, at in new.items() if at <= now]
    later = []
    for keys, at in batches:
        if at > now:
            later.append((keys, at))
        elif new:
            due.extend(k for k in keys if k not in new)
        else:
            due.extend(keys)
    for k in due:
        new.pop(k, None)
    return due, later


class TaskAware(Adaptive):
    """Controller-planned path sets with switch-local adaptation (see the module docstring)."""

    name = "task-aware"
    periodic = True  # its control loop runs every round, even when no flow changed

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        # key -> (rule, effective at); a whole plan's batch held as it came (BatchMap)
        self._rules: MutableMapping[str, tuple[PathSet, float]] = {}
        # the (job, source, destination) codes of the keys with a path set, sorted (made
        # again when the rules or the job names change): which streams the plan placed
        self._planned_codes: NDArray[np.int64] | None = None
        self._codes_of_jobs: tuple[str, ...] = ()
        self._full_of: object = None  # the plan _full_links was made of
        self._full_links: NDArray[np.bool_] | None = None
        self._removing: dict[str, float] = {}  # key -> when its withdrawal takes effect
        # keys given a path set during the run -> when it takes effect: their streams
        # already sending move onto it then (see _onto_new_rules)
        self._new_rules: dict[str, float] = {}
        # (and the keys of whole batches given so, each list with its time: a key of one
        # that ``_new_rules`` has too was given again since, and goes by that)
        self._new_batches: list[tuple[list[str], float]] = []
        # key -> the path set in effect while a newer one is on its way (control latency)
        self._before: dict[str, PathSet] = {}
        self._table: Counter[str] = Counter()  # explicit rules each switch holds
        self.job_names: list[str] = []
        self.controller: Controller | None = None
        self.last_plan: PlanReport | None = None
        self.qos: dict[int, int] = {}  # recorded; the twin's QoS comes from the scenario
        self._ahead = False  # installing the plan made before the run: in effect at once
        # the links of the top-tier switches kept for mice (controller.mice_spines), if any:
        # those the controller keeps its plans off (one choice of spines for both)
        self.mice_link: NDArray[np.bool_] | None = None
        if ctx.controller.mice_spines:
            try:
                kept = mice_links(fabric_view(ctx), ctx.controller.mice_spines)
            except ValueError as err:
                raise FabricpilotError(f"controller.{err}") from None
            self.mice_link = np.zeros(ctx.topology.n_links, bool)
            self.mice_link[sorted(kept)] = True
        self._last_telemetry_ns = 0.0
        self._was_busy = np.zeros(ctx.topology.n_links, bool)
        self._tx_counted: NDArray[np.float64] | None = None  # the counters at the last report
        self._last_tick_ns = -float("inf")
        self.ticks: list[TickReport] = []
        self.fuse_trips = 0
        self._last_fec_ns = 0.0
        self._fec_rng = np.random.default_rng([ctx.seed, 0xFEC])
        # links the controller found gray: (time, link, really gray, detections of it)
        self.gray_actions: list[tuple[float, int, bool, int]] = []
        self.confirmed_gray: dict[int, float] = {}  # link -> when the controller acted
        self.gray_restored: list[tuple[float, int]] = []  # (time, link) clean counters again
        # rule key -> (the path set, the link-id rows its QPs are forwarded on)
        self._forwarded: dict[str, tuple[PathSet, list[NDArray[np.int32]]]] = {}
        # ports whose loss of signal the switches have seen (reported down in every
        # telemetry), and those back up since the last report (reported up once)
        self.ports_down: set[int] = set()
        self._ports_back: set[int] = set()

    # ------------------------------------------------------------ DataPlane
    def fabric(self) -> FabricView:
        return fabric_view(self.ctx)

    def bind(self, telemetry: TelemetryFn) -> None:
        """Read the fabric of a (new) run: its transmit counters start from zero."""
        super().bind(telemetry)
        self._tx_counted = None

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last call, as the switches would report them: each
        link's bytes sent in the interval (its transmit counter's delta; in a model that
        does not count them, its current rate times the interval), and its queue now. Links
        idle in the interval and at the previous report are left out (only changes are
        sent); a link that went idle reports its zeros once. The port of a link its
        neighbours have seen go down says so (``oper_up=False``) in every report, and once
        up again, says that in the next."""
        if self._telemetry is None:
            return []
        tel = self._telemetry()
        interval = int(tel.now_ns - self._last_telemetry_ns)
        if interval <= 0:
            return []
        self._last_telemetry_ns = tel.now_ns
        if tel.tx_bytes_total is not None:  # the counters' deltas
            counted = self._tx_counted if self._tx_counted is not None else \
                np.zeros_like(tel.tx_bytes_total)
            sent = np.maximum(tel.tx_bytes_total - counted, 0.0)
            self._tx_counted = tel.tx_bytes_total.copy()
        else:  # (a model without counters: the rate of this instant over the interval)
            sent = tel.load_gbps * interval / 8.0
        busy = (sent > 0) | (tel.queue_bytes > 0)
        report = busy | self._was_busy
        self._was_busy = busy
        deltas = {i: PortDelta(i, interval, tx_bytes=float(sent[i]),
                               queue_bytes=float(tel.queue_bytes[i]))
                  for i in np.flatnonzero(report).tolist()}
        fec_dt = tel.now_ns - self._last_fec_ns
        if tel.ber is not None and fec_dt >= self.ctx.fec_sample_ns:
            # error counters, every fec_sample_ns: FEC decodes idle symbols too, so every
            # port counts bits at line rate; noisy counters add spurious spikes; the frames
            # FEC could not correct are those of the traffic the link lost (a loss given
            # without a bit error rate shows there alone)
            self._last_fec_ns = tel.now_ns
            ct = self.ctx.topology
            bits = ct.rate_gbps * fec_dt
            p, spike_ber = self.ctx.fec_noise
            ber = tel.ber + np.where(self._fec_rng.random(ct.n_links) < p, spike_ber, 0.0)
            drop = tel.drop_probability if tel.drop_probability is not None else \
                np.zeros(ct.n_links)
            frames = tel.load_gbps * fec_dt / (8.0 * tel.packet_wire_bytes)
            for i in range(ct.n_links):
                d = deltas.get(i, PortDelta(i, interval))
                deltas[i] = replace(d, rx_bits=float(bits[i]),
                                    fec_corrected=float(bits[i] * ber[i]),
                                    fec_uncorrected=float(frames[i] * drop[i]))
        back, self._ports_back = self._ports_back, set()
        for i, state in [*((i, True) for i in back), *((i, False) for i in self.ports_down)]:
            deltas[i] = replace(deltas.get(i, PortDelta(i, interval)), oper_up=state)
        return [deltas[i] for i in sorted(deltas)]

    def note_links(self, down: list[int], up: list[int]) -> None:
        """The neighbours of links ``down`` have seen them go down, those of ``up`` come
        back: what the ports say in telemetry from now on."""
        self.ports_down.update(down)
        self.ports_down.difference_update(up)
        self._ports_back.difference_update(down)
        self._ports_back.update(up)

    def install(self, rules: Sequence[PathSet]) -> None:
        """Take path sets (effective after the control-channel latency). A switch whose
        rule table would overflow rejects the update, as an ASIC does. A whole plan's batch
        (:class:`~fabricpilot.controller.southbound.PathSetBatch`) given to empty tables is
        held as it came: a pair's set is made when its traffic first asks."""
        now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        held = self._rules
        removing = self._removing  # (their rules are freed already)
        batch = rules if isinstance(rules, PathSetBatch) else None
        keys = batch.keys if batch is not None else list(map(_KEY, rules))
        freed = Counter(sw for sw, _ in _chain(_chain(
            held[k][0].rules for k in keys if k in held and k not in removing))
        ) if self._table else Counter()
        added = Counter(batch.rule_switches() if batch is not None else
                        (sw for sw, _ in _chain(_chain(map(_RULES, rules)))))
        if freed or added:  # (no rule in or out: the tables stay as they are)
            table = self._table - freed
            table.update(added)
            cap = self.ctx.controller.switch_rule_capacity
            full = [(sw, n) for sw, n in table.items() if n > cap]
            if full:
                sw, n = max(full, key=lambda x: x[1])
                raise ValueError(f"switch {sw}: rule table full ({n} rules > capacity {cap})")
            self._table = table
        at = now + (0 if self._ahead else self.ctx.controller.control_latency_ns)
        if not all(map(held.__contains__, keys)):
            self._planned_codes = None
        if not self._ahead:  # (before the run no stream is on the way yet)
            changed = keys
            if held:
                changed = []
                for r, was in zip(rules, get_all(held, keys), strict=True):
                    if was is None:
                        changed.append(r.key)
                        continue
                    if was[0] != r:
                        changed.append(r.key)
                    # until a new set takes effect the switches forward by the one they have
                    if was[1] <= now < at:
                        self._before[r.key] = was[0]
            if batch is not None and not (held or self._new_rules or self._new_batches):
                self._new_batches.append((keys, at))
            else:
                self._new_rules.update(zip(changed, itertools.repeat(at)))
        if batch is not None and not held:
            self._rules = BatchMap(batch, lambda r, b=batch, t=at: (b[r], t))
        else:
            held.update(zip(keys, zip(rules, itertools.repeat(at), strict=False), strict=True))
        for pending in (self._forwarded, self._removing):  # (superseded by the new sets)
            if pending:
                for k in keys:
                    pending.pop(k, None)

    def _in_effect(self, key: str, now: float) -> PathSet | None:
        """The path set the switches forward ``key`` by at ``now``: the newest one once it
        has taken effect, the one before it until then (``None``: no set, the switches'
        own adaptive routing)."""
        hit = self._rules.get(key)
        if hit is None:
            return None
        if hit[1] <= now:
            if self._before:
                self._before.pop(key, None)
            return hit[0]
        return self._before.get(key)

    def remove(self, keys: list[str]) -> None:
        """Withdraw path sets: their rules are freed now, their flows go back to
        switch-local adaptive routing after the control-channel latency."""
        held = self._rules
        gone = [k for k in keys if k in held and k not in self._removing]
        if not gone:
            return
        freed = Counter(sw for sw, _ in _chain(_chain(held[k][0].rules for k in gone)))
        if freed:
            self._table = self._table - freed
        now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        at = now + (0 if self._ahead else self.ctx.controller.control_latency_ns)
        self._removing.update((k, at) for k in gone)

    def _expire(self, now: float) -> None:
        """Drop the path sets whose withdrawal has taken effect by ``now``."""
        due = [k for k, at in self._removing.items() if at <= now]
        for k in due:
            del self._removing[k]
            self._rules.pop(k, None)
            self._before.pop(k, None)
            self._planned_codes = None
            self._forwarded.pop(k, None)

    def switch_rules(self) -> Counter[str]:
        """Explicit forwarding rules each switch holds now."""
        return +self._table

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        table = self.congestion_table.copy()
        for link, w in weights.items():
            table[link] = w
        self.set_congestion_table(table)

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        self.qos = dict(dscp_to_priority)

    # ------------------------------------------------------------ the twin's jobs
    def attach_jobs(self, jobs: list[JobSpec]) -> PlanReport:
        """Declare every job from the scenario and plan them all before the run starts: the
        jobs declared when they were launched, so their paths are in place by time 0 (their
        first collective may start then), not a control-channel latency later."""
        self.job_names = [j.name for j in jobs]
        self.controller = Controller(self, self.ctx.controller)
        for intent in job_intents(jobs, "default"):
            self.controller.declare(intent)
        self._ahead = True
        try:
            self.last_plan = self.controller.plan()
        finally:
            self._ahead = False
        return self.last_plan

    def stats(self) -> dict[str, object]:
        """What the controller did in this run: the path sets the switches hold at its end
        and their QPs steered by their source port alone, pinned by explicit rules or left
        to their hash (a full rule table; as the controller knows them: after heals and
        re-plans, not only the first plan's), the explicit rules per switch against the
        capacity, control periods, re-plans and fuse trips, the GPU pairs held to a rate and
        those of jobs whose SLA is unmet the plan keeps room for."""
        sets = [r for r, _ in self._rules.values() if r.key not in self._removing]
        qps = sum(len(r.paths) for r in sets if r.ports)
        pinned = sum(1 for r in sets for rl in r.rules if rl)
        unpinned = (sum(n for k, n in self.controller.left_to_hash.items() if k in self._rules)
                    if self.controller is not None else 0)
        rules = self.switch_rules()
        return {
            "path_sets": len(sets),
            "qps_steered": max(qps - pinned - unpinned, 0),
            "qps_pinned": pinned,
            "qps_unpinned": unpinned,
            "switch_rules_max": max(rules.values(), default=0),
            "switch_rule_capacity": self.ctx.controller.switch_rule_capacity,
            "switch_rules": dict(sorted(rules.items())),
            "control_periods": len(self.ticks),
            "replans": sum(t.replanned for t in self.ticks),
            "fuse_trips": self.fuse_trips,
            "pairs_rate_capped": sum(1 for r, _ in self._rules.values()
                                     if math.isfinite(r.rate_cap_gbps)),
            # (GPU pairs of jobs whose SLA is unmet: no path, room kept in the plan)
            "pairs_room_kept": (len(self.controller.reserved_keys)
                                if self.controller is not None else 0),
            "lambda_by_priority": _tier_lambdas(self.controller),
            "heals": len(self.controller.heals) if self.controller else 0,
            "heal_max_ms": round(max((h.wall_s for h in self.controller.heals), default=0.0)
                                 * 1e3, 3) if self.controller else 0.0,
            "heal_sent_max_ms": round(max((h.sent_s for h in self.controller.heals),
                                          default=0.0) * 1e3, 3) if self.controller else 0.0,
            "gray_links_confirmed": sum(1 for a in self.gray_actions if a[2]),
            "gray_false_alarms": sum(1 for a in self.gray_actions if not a[2]),
            "gray_links_restored": len(self.gray_restored),
        }

    def report(self) -> list[str]:
        """One line per declared job whose SLA no path can meet (it was given no path)."""
        if self.controller is None:
            return []
        return [f"{job}: {why}" for job, why in sorted(self.controller.sla_unmet.items())]

    # ------------------------------------------------------------ forwarding
    def _forward(self, batch: TransferBatch, rule_of: dict[int, PathSet]) -> None:
        """Resolve, once per installed path set, the paths its QPs take: each QP's source
        port through every switch's ECMP hash, except where a pinned rule sets the next
        hop (a set without ports is forwarded on its paths by rules)."""
        ct = self.ctx.topology
        todo = {}
        for i, rule in rule_of.items():
            if rule.key not in self._forwarded or self._forwarded[rule.key][0] is not rule:
                todo[rule.key] = (i, rule)
        if not todo:
            return
        width = max_path_links(ct)
        src, dst, port, owner = [], [], [], []
        override: dict[tuple[int, int], int] = {}
        sw_index = {str(ct.node_names[int(n)]): k for k, n in enumerate(ct.switch_node)}
        for key, (i, rule) in todo.items():
            if not rule.ports:
                rows = [np.pad(np.array(p, np.int32), (0, width - len(p)), constant_values=-1)
                        for p in rule.paths]
                self._forwarded[key] = (rule, rows)
                continue
            for q, p in enumerate(rule.ports):
                for sw, link in (rule.rules[q] if rule.rules else ()):
                    override[(len(src), sw_index[sw])] = link
                src.append(int(batch.src[i]))
                dst.append(int(batch.dst[i]))
                port.append(p)
                owner.append(key)
        if not src:
            return
        s_arr, d_arr = np.array(src, np.int64), np.array(dst, np.int64)
        src_ip, dst_ip = gpu_ip(s_arr), gpu_ip(d_arr)
        sport = np.array(port, np.int64)
        tgt = ct.leaf_slot[ct.gpu_leaf[d_arr]]

        pinned_rows = np.array(sorted({row for row, _ in override}), np.int64)

        def choose(step: int, switch: NDArray[np.int32], rows: NDArray[np.int64]) -> NDArray:
            h = switch_hash(src_ip[rows], dst_ip[rows], sport[rows], switch, self.ctx.seed,
                            self.ctx.ecmp.per_switch_seed).astype(np.int64)
            for k in np.flatnonzero(np.isin(rows, pinned_rows)).tolist():
                row, sw = int(rows[k]), int(switch[k])
                link = override.get((row, sw))
                if link is not None:
                    group = ct.nh_link[sw, tgt[row], : ct.nh_count[sw, tgt[row]]].tolist()
                    h[k] = group.index(link)
            return h

        paths = walk_paths(ct, s_arr, d_arr, choose)
        rows_of: dict[str, list[NDArray[np.int32]]] = {}
        for r, key in enumerate(owner):
            rows_of.setdefault(key, []).append(paths[r])
        for key, rows in rows_of.items():
            self._forwarded[key] = (todo[key][1], rows)

    def _fused(self, weights: NDArray[np.float64], rows: list[NDArray[np.int32]],
               queue: NDArray[np.float64] | None) -> NDArray[np.float64]:
        """The pressure fuse: a new transfer gives no share to a path of its set whose
        fullest egress buffer is at ``pressure_fuse`` or more; that share goes to the set's
        least-occupied path (its second best), unless every path is that full."""
        if queue is None or len(rows) < 2 or not queue.any():
            return weights
        occ = (np.array([queue[r[r >= 0]].max(initial=0.0) for r in rows])
               / self.ctx.port_buffer_bytes)
        tripped = occ >= self.ctx.controller.pressure_fuse
        if not tripped.any() or tripped.all():
            return weights
        self.fuse_trips += 1
        out = np.where(tripped, 0.0, weights)
        out[int(np.argmin(np.where(tripped, np.inf, occ)))] += weights[tripped].sum()
        return out

    def rebalance(self, members: ActiveMembers) -> Moves:
        """Switch-local re-placement (as ``adaptive``), and every ``replan_interval_ns`` a
        controller period (:meth:`Controller.tick`): telemetry in, congestion table and,
        when worth it, a new plan out. With spines kept for mice, streams there stay (mice
        are short) and the others move only among the rest."""
        local = replace(members, hold=members.hold | self._planned(members))
        if self.mice_link is None:
            moves = super().rebalance(local)
        else:
            pushed = self.congestion_table
            try:
                self.congestion_table = split_tables(pushed, self.mice_link)[1]
                kept = on_links(local.path, self.mice_link)
                moves = super().rebalance(replace(local, hold=local.hold | kept))
            finally:
                self.congestion_table = pushed
        if self.controller is None or self._telemetry is None:
            return moves
        now = self._telemetry().now_ns
        period = self.ctx.controller.replan_interval_ns  # (infinite: the periods are not ours)
        if period < math.inf and now - self._last_tick_ns >= period:
            self._last_tick_ns = now
            before = set(self.controller.degraded)
            tick = self.controller.tick(now)
            self.ticks.append(tick)
            self.gray_restored.extend((now, lk) for lk in tick.links_clear)
            tel = self._telemetry()  # (really gray: bit errors, or frames lost)
            for lk in sorted(self.controller.degraded - before):
                real = any(x is not None and x[lk] > 0 for x in (tel.ber, tel.drop_probability))
                self.gray_actions.append((now, lk, real,
                                          self.controller.gray.per_link.get(lk, 0)))
                self.confirmed_gray[lk] = now
        moves = self._off_degraded(members, moves, now)
        return self._onto_new_rules(members, moves, now)

    def _planned(self, members: ActiveMembers) -> NDArray[np.bool_]:
        """Which members are streams of a pair with a path set on a link the controller's
        plan loads to its capacity or beyond: the plan over-commits it knowingly (no path
        relieves it: a link lost, an incast), so a switch-local move only trades it for
        another such link, back and forth. Those stay where the controller put them (it
        moves them: heals, re-plans, off gray links); the rest adapt locally."""
        n = len(members.path)
        full = self._plan_full_links()
        if members.owner is None or not self._rules or not n or full is None:
            return np.zeros(n, bool)
        on_full = full[np.where(members.path >= 0, members.path, len(full) - 1)].any(axis=1)
        if not on_full.any():
            return on_full
        codes = self._planned_array()
        src, dst = self._endpoints_of(members.path)
        own = np.asarray(members.owner, np.int64)
        g = np.int64(self.ctx.topology.n_gpus)
        ok = (own >= 0) & (src >= 0) & (dst >= 0)
        code = (own * g + src) * g + dst
        pos = np.minimum(np.searchsorted(codes, code), max(len(codes) - 1, 0))
        return on_full & ok & (codes[pos] == code) if len(codes) else np.zeros(n, bool)

    def _plan_full_links(self) -> NDArray[np.bool_] | None:
        """The fabric links the controller's current plan loads to 100 % or more (a mask
        over link ids, one spare entry at the end for padding); ``None`` if none is or there
        is no plan here."""
        plan = self.controller.current if self.controller is not None else None
        if plan is None:
            return None
        if self._full_of is not plan:
            ct = self.ctx.topology
            full = np.zeros(ct.n_links + 1, bool)
            fabric = LINK_KIND_CODES["fabric"]  # (a NIC link is full by design and no move
            for lk, gbps in plan.link_load_gbps.items():  # changes it)
                if (0 <= lk < ct.n_links and ct.link_kind[lk] == fabric
                        and gbps >= ct.rate_gbps[lk] * (1 - 1e-9)):
                    full[lk] = True
            self._full_of, self._full_links = plan, full if full.any() else None
        return self._full_links

    def _planned_array(self) -> NDArray[np.int64]:
        """The sorted codes ``(job * n_gpus + src) * n_gpus + dst`` of the keys with a path
        set (of this run's jobs; made again after the rules or the job names changed)."""
        names = tuple(self.job_names)
        if self._planned_codes is None or names != self._codes_of_jobs:
            index = {name: i for i, name in enumerate(names)}
            g = self.ctx.topology.n_gpus
            codes = [c for c in (_pair_code(k, index, g) for k in self._rules) if c is not None]
            self._planned_codes = np.unique(np.array(codes, np.int64))
            self._codes_of_jobs = names
        return self._planned_codes

    def _off_degraded(self, members: ActiveMembers, moves: Moves, now: float) -> Moves:
        """Planned streams still on a link the controller found gray move to the paths of
        their new rules once those are in effect (drain-safe: nothing reorders)."""
        bad = sorted(self.controller.degraded) if self.controller is not None else []
        if not bad or members.owner is None or members.stream is None:
            return moves
        path = members.path
        mask = np.zeros(self.ctx.topology.n_links + 1, bool)
        mask[bad] = True
        on = mask[np.where(path >= 0, path, len(mask) - 1)].any(axis=1) & ~members.hold
        on[moves.member] = False
        cand = np.flatnonzero(on & (members.owner >= 0))
        if not len(cand):
            return moves
        src, dst = self._endpoints_of(path[cand])
        qp = member_qp_index(members.row, members.stream)[cand]
        new = self.repath(members.owner[cand], src, dst, members.stream[cand], now=now, qp=qp)
        ok = ~mask[np.where(new >= 0, new, len(mask) - 1)].any(axis=1)
        if not ok.any():
            return moves
        width = max(path.shape[1], new.shape[1], moves.path.shape[1] if len(moves.path) else 0)
        # moves off a gray link are always drain-safe (whatever ``adaptive.drain_safe`` says
        # of switch-local moves): the controller's rule change must never reorder
        safe = np.concatenate([moves.safe_mask(), np.ones(int(ok.sum()), bool)])
        whole = np.concatenate([moves.whole_set_mask(), np.ones(int(ok.sum()), bool)])
        return Moves(np.concatenate([moves.member, cand[ok]]),
                     np.concatenate([pad_paths(moves.path.astype(np.int32), width),
                                     pad_paths(new[ok].astype(np.int32), width)]),
                     True if safe.all() else safe, whole)

    def _onto_new_rules(self, members: ActiveMembers, moves: Moves, now: float) -> Moves:
        """Streams already sending for a pair whose path set a re-plan changed (or gave it
        one) move onto the new paths once those take effect: each stream to its QP's path
        of the new set, as a new stream of the pair would take. The moves are drain-safe
        (the controller changes a stream's path only once its bytes in flight on the old
        one are delivered: nothing reorders). A heal's streams have moved already (the
        fault's reroute); a stream later moved by the switches stays where they put it
        until its pair's set changes again."""
        due, self._new_batches = _due_keys(self._new_rules, self._new_batches, now)
        if not due:
            return moves
        if members.owner is None or members.stream is None or not len(members.path):
            return moves
        index = {name: i for i, name in enumerate(self.job_names)}
        g = self.ctx.topology.n_gpus
        codes = [c for c in (_pair_code(k, index, g) for k in due if k in self._rules)
                 if c is not None]
        if not codes:
            return moves
        own = np.asarray(members.owner, np.int64)
        src, dst = self._endpoints_of(members.path)
        code = (own * g + src) * g + dst
        on = (np.isin(code, np.array(codes, np.int64)) & (own >= 0) & (src >= 0) & (dst >= 0)
              & ~members.hold)
        on[moves.member] = False
        cand = np.flatnonzero(on)
        if not len(cand):
            return moves
        qp = member_qp_index(members.row, members.stream)[cand]
        new = self.repath(own[cand], src[cand], dst[cand], members.stream[cand], now=now,
                          qp=qp)
        width = max(members.path.shape[1], new.shape[1])
        old = pad_paths(members.path[cand].astype(np.int32), width)
        new = pad_paths(new.astype(np.int32), width)
        diff = (old != new).any(axis=1) & (new[:, 0] >= 0)
        if not diff.any():
            return moves
        width = max(width, moves.path.shape[1] if len(moves.path) else 0)
        safe = np.concatenate([moves.safe_mask(), np.ones(int(diff.sum()), bool)])
        whole = np.concatenate([moves.whole_set_mask(), np.ones(int(diff.sum()), bool)])
        return Moves(np.concatenate([moves.member, cand[diff]]),
                     np.concatenate([pad_paths(moves.path.astype(np.int32), width),
                                     pad_paths(new[diff], width)]),
                     True if safe.all() else safe, whole)

    def _endpoints_of(self, path: NDArray[np.int32]) -> tuple[NDArray, NDArray]:
        valid = path >= 0
        last = np.maximum(valid.sum(axis=1) - 1, 0)
        src = self._gpu_of_up[path[:, 0]]
        dst = self._gpu_of_down[path[np.arange(len(path)), last]]
        return src.astype(np.int64), dst.astype(np.int64)

    # ------------------------------------------------------------ failures
    def on_links_changed(self, now: float, down: list[int], up: list[int]) -> float | None:
        """Links went down or up (seen by their neighbours): the controller re-places the
        affected path sets; they take effect after the control-channel latency, which is
        returned (the engine pauses the affected streams until then). Without a controller,
        ``None``: the fabric converges on its own."""
        self.note_links(down, up)
        if self.controller is None:
            return None
        self.controller.on_links_changed(down, up, now)
        return now + self.ctx.controller.control_latency_ns

    def repath(self, job: NDArray[np.int64], src: NDArray[np.int64], dst: NDArray[np.int64],
               stream: NDArray[np.int64], now: float | None = None,
               qp: NDArray[np.int64] | None = None) -> NDArray[np.int32]:
        """Paths for members of streams that must leave theirs: a member of a planned
        stream takes the path of its QP (``qp``: its place among its stream's members,
        :func:`~fabricpilot.balancing.base.member_qp_index`; ``stream`` if not given) in
        its key's current rule (the ``i``-th QP the ``i``-th path, cycling), any other the
        path switch-local adaptive routing gives it with the current congestion table
        (which excludes links known down)."""
        if now is None:
            now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        n = len(src)
        batch = TransferBatch(np.asarray(src, np.int64), np.asarray(dst, np.int64),
                              np.ones(n, np.int64), np.arange(n, dtype=np.int64),
                              np.asarray(job, np.int64))
        sport = qp_source_port(batch.job, batch.src, batch.dst, np.asarray(stream, np.int64),
                               entropy=self.ctx.ecmp.source_port_entropy)
        out = pad_paths(self._walk(batch.src, batch.dst, sport, self._load_now()),
                        max_path_links(self.ctx.topology))
        if self._removing:
            self._expire(now)
        rule_of = {}
        for i, (j, s, d) in enumerate(zip(batch.job.tolist(), batch.src.tolist(),
                                          batch.dst.tolist(), strict=True)):
            if 0 <= j < len(self.job_names):
                rule = self._in_effect(rule_key(self.job_names[j], s, d), now)
                if rule is not None:
                    rule_of[i] = rule
        if rule_of:
            self._forward(batch, rule_of)
            for i, rule in rule_of.items():
                rows = self._forwarded[rule.key][1]
                q = int(stream[i] if qp is None else qp[i])
                out[i] = pad_paths(rows[q % len(rows)][None, :], out.shape[1])[0]
        return out

    def stream_members(self, job: NDArray[np.int64], src: NDArray[np.int64],
                       dst: NDArray[np.int64], now: float | None = None,
                       ) -> list[tuple[NDArray[np.int32], NDArray[np.float64]] | None]:
        """For streams (a job's transfer from ``src`` to ``dst`` each) whose pair has a path
        set in effect: its QPs' paths and shares, as a new transfer of the pair would be
        sent (one member per QP); ``None`` for a stream without one (it keeps its members).
        The engine gives a planned stream that had to move the whole set: a heal's set of 7
        paths for a pair that had 8 spreads it over the 7, not 2/8 on one of them."""
        if now is None:
            now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        n = len(src)
        out: list[tuple[NDArray[np.int32], NDArray[np.float64]] | None] = [None] * n
        rule_of = {}
        for i, (j, s, d) in enumerate(zip(np.asarray(job).tolist(), np.asarray(src).tolist(),
                                          np.asarray(dst).tolist(), strict=True)):
            if 0 <= j < len(self.job_names):
                rule = self._in_effect(rule_key(self.job_names[j], s, d), now)
                if rule is not None:
                    rule_of[i] = rule
        if not rule_of:
            return out
        batch = TransferBatch(np.asarray(src, np.int64), np.asarray(dst, np.int64),
                              np.ones(n, np.int64), np.arange(n, dtype=np.int64),
                              np.asarray(job, np.int64))
        self._forward(batch, rule_of)
        width = max_path_links(self.ctx.topology)
        for i, rule in rule_of.items():
            rows = self._forwarded[rule.key][1]
            w = np.asarray(rule.weights, np.float64)
            if len(w) != len(rows) or not w.sum() > 0:
                w = np.ones(len(rows))
            out[i] = (pad_paths(np.stack(rows).astype(np.int32), width), w / w.sum())
        return out

    def _walk_classes(self, batch: TransferBatch, sport: NDArray[np.int64],
                      ) -> NDArray[np.int32]:
        """Switch-local adaptive paths for ``batch`` (QP source ports ``sport``): with spines
        kept for mice, a transfer below ``adaptive.mice_bytes`` among the mice's links only,
        any other among the rest."""
        if self.mice_link is None:
            return self._walk(batch.src, batch.dst, sport, self._load_now())
        mouse = batch.size_bytes < self.ctx.adaptive.mice_bytes
        return walk_split(self, batch, sport, mouse, self.mice_link)

    def route(self, batch: TransferBatch) -> RoutedBatch:
        now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        ct = self.ctx.topology
        if self._removing:
            self._expire(now)
        planned: list[tuple[int, PathSet]] = []
        for i, (j, s, d) in enumerate(zip(batch.job.tolist(), batch.src.tolist(),
                                          batch.dst.tolist(), strict=True)):
            if 0 <= j < len(self.job_names):
                rule = self._in_effect(rule_key(self.job_names[j], s, d), now)
                if rule is not None:
                    planned.append((i, rule))
        if not planned:
            sub, sport_q = self._qps(batch)
            return self._routed(sub, self._walk_classes(sub, sport_q))
        # planned transfers: one QP per path of the set, carrying the path's share and
        # forwarded by the switches' hash of its source port (and any pinned rules); the
        # others on the path switch-local adaptive routing gives them
        width = max_path_links(ct)
        n = len(batch)
        sport = qp_source_port(batch.job, batch.src, batch.dst, np.zeros(n, np.int64),
                               entropy=self.ctx.ecmp.source_port_entropy)
        adaptive_paths = self._walk_classes(batch, sport)
        rule_of = dict(planned)
        self._forward(batch, rule_of)
        queue = self._telemetry().queue_bytes if self._telemetry is not None else None
        t_idx, m_share, m_path = [], [], []
        for i in range(n):
            rule = rule_of.get(i)
            if rule is None:
                t_idx.append(i)
                m_share.append(1.0)
                m_path.append(adaptive_paths[i])
                continue
            rows = self._forwarded[rule.key][1]
            w = self._fused(np.array(rule.weights, np.float64), rows, queue)
            for row, share in zip(rows, (w / w.sum()).tolist(), strict=True):
                t_idx.append(i)
                m_share.append(share)
                m_path.append(row)
        t = np.array(t_idx, np.int64)
        share = np.array(m_share)
        path = np.array(m_path, np.int32).reshape(len(m_path), width)
        unit = paths_to_weights(path, ct.n_links)
        per_transfer = sp.csr_matrix((share, (t, np.arange(len(t)))), shape=(n, len(t)))
        weights = (per_transfer @ unit).tocsr()
        delay = np.zeros(n, np.int64)
        np.maximum.at(delay, t, path_delay_ns(ct, path, self.ctx.switch_latency_ns))
        routed = assemble(batch, weights, delay)
        entity, n_rows = entity_of(batch.group)
        routes = MemberRoutes(entity[t], stream_index(entity)[t], share, path)
        # the sending NICs' rate caps the sets carry, shared by the capped transfers a NIC
        # sends at once; a ring row moves at its slowest member's
        caps = None
        capped = [(i, r.rate_cap_gbps) for i, r in planned if math.isfinite(r.rate_cap_gbps)]
        if capped:
            caps = np.full(n_rows, np.inf)
            i_c = np.array([i for i, _ in capped], np.int64)
            src = batch.src[i_c]
            fan = np.bincount(src)[src]
            np.minimum.at(caps, entity[i_c], np.array([c for _, c in capped]) / fan)
        return replace(routed, routes=routes, rate_cap_gbps=caps)


register_policy("task-aware")(TaskAware)
