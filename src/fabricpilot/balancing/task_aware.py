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

from dataclasses import replace

import numpy as np
import scipy.sparse as sp

from fabricpilot.balancing.adaptive import Adaptive
from fabricpilot.balancing.base import (
    MemberRoutes,
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    assemble,
    entity_of,
    paths_to_weights,
    register_policy,
    stream_index,
)
from fabricpilot.controller.core import Controller, PlanReport, rule_key
from fabricpilot.controller.intents import CommCall, Intent
from fabricpilot.controller.southbound import FabricView, LinkInfo, PathSet, PortDelta
from fabricpilot.net.hashing import qp_source_port
from fabricpilot.topology.compiled import LINK_KIND_CODES
from fabricpilot.topology.paths import max_path_links, path_delay_ns
from fabricpilot.workload.jobs import JobSpec

_KIND_NAME = {code: str(kind) for kind, code in LINK_KIND_CODES.items()}
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
    return FabricView.from_links(links, kind, tier, gpu_node)


class TaskAware(Adaptive):
    """Controller-planned path sets with switch-local adaptation (see the module docstring)."""

    name = "task-aware"
    control_latency_ns = 10_000

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._rules: dict[str, tuple[PathSet, float]] = {}  # key -> (rule, effective at)
        self.job_names: list[str] = []
        self.controller: Controller | None = None
        self.last_plan: PlanReport | None = None
        self.qos: dict[int, int] = {}  # recorded; the twin's QoS comes from the scenario
        self._last_telemetry_ns = 0.0

    # ------------------------------------------------------------ DataPlane
    def fabric(self) -> FabricView:
        return fabric_view(self.ctx)

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last call, as the switches would report them: each
        link's bytes at its current rate over the interval, and its queue now (links with
        neither are left out: only deltas are sent)."""
        if self._telemetry is None:
            return []
        tel = self._telemetry()
        interval = int(tel.now_ns - self._last_telemetry_ns)
        self._last_telemetry_ns = tel.now_ns
        if interval <= 0:
            return []
        busy = (tel.load_gbps > 0) | (tel.queue_bytes > 0)
        return [PortDelta(int(i), interval, tx_bytes=float(tel.load_gbps[i]) * interval / 8.0,
                          queue_bytes=float(tel.queue_bytes[i]))
                for i in np.flatnonzero(busy).tolist()]

    def install(self, rules: list[PathSet]) -> None:
        now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        for r in rules:
            self._rules[r.key] = (r, now + self.control_latency_ns)

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        table = self.congestion_table.copy()
        for link, w in weights.items():
            table[link] = w
        self.set_congestion_table(table)

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        self.qos = dict(dscp_to_priority)

    # ------------------------------------------------------------ the twin's jobs
    def attach_jobs(self, jobs: list[JobSpec]) -> PlanReport:
        """Declare every job from the scenario and plan them all (at time 0)."""
        self.job_names = [j.name for j in jobs]
        self.controller = Controller(self)
        for job in jobs:
            calls = []
            for plan in job.collectives:
                pairs = sorted({(int(a), int(b)) for st in plan.stages
                                for a, b in zip(st.src.tolist(), st.dst.tolist(),
                                                strict=True) if a != b})
                calls.append(CommCall(str(plan.op), max(int(plan.size_bytes), 1),
                                      job.sla_us or DEFAULT_SLA_US, job.compute_ns,
                                      pairs=tuple(pairs)))
            self.controller.declare(Intent(job.name, "default", tuple(job.gpus),
                                           tuple(calls), opt_in=job.declare_intent))
        self.last_plan = self.controller.plan()
        return self.last_plan

    # ------------------------------------------------------------ forwarding
    def route(self, batch: TransferBatch) -> RoutedBatch:
        now = self._telemetry().now_ns if self._telemetry is not None else 0.0
        ct = self.ctx.topology
        planned: list[tuple[int, PathSet]] = []
        for i, (j, s, d) in enumerate(zip(batch.job.tolist(), batch.src.tolist(),
                                          batch.dst.tolist(), strict=True)):
            if 0 <= j < len(self.job_names):
                hit = self._rules.get(rule_key(self.job_names[j], s, d))
                if hit is not None and hit[1] <= now:
                    planned.append((i, hit[0]))
        if not planned:
            return super().route(batch)
        # planned transfers: each one stream spread over its set's paths by their weights;
        # the others on the path switch-local adaptive routing gives them
        width = max_path_links(ct)
        n = len(batch)
        sport = qp_source_port(batch.job, batch.src, batch.dst, np.zeros(n, np.int64),
                               entropy=self.ctx.ecmp.source_port_entropy)
        adaptive_paths = self._walk(batch.src, batch.dst, sport, self._load_now())
        rule_of = dict(planned)
        t_idx, m_share, m_path = [], [], []
        for i in range(n):
            rule = rule_of.get(i)
            if rule is None:
                t_idx.append(i)
                m_share.append(1.0)
                m_path.append(adaptive_paths[i])
                continue
            w = np.array(rule.weights, np.float64)
            for p, share in zip(rule.paths, (w / w.sum()).tolist(), strict=True):
                row = np.full(width, -1, np.int32)
                row[: len(p)] = p
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
        entity, _ = entity_of(batch.group)
        routes = MemberRoutes(entity[t], stream_index(entity)[t], share, path)
        return replace(routed, routes=routes)


register_policy("task-aware")(TaskAware)
