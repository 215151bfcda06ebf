"""``sla-aware``: paths by SLA level and ranking (the twin's side of the ranking service).

A job that declares a latency SLA (``sla_us``) has each of its flows placed on the best path
:func:`~fabricpilot.controller.ranking.rank_paths` ranks for it: the k = 5 shortest paths in
the SLA level's scope (L1: at most one switch; L2: no spine; L3: any), penalised for
per-link delay above 0.8 x SLA and for little free buffer (from the current queues). When no
path can meet the SLA the job is told so (:attr:`SlaAware.unmet`, the run's ``sla_unmet``
list) and the flow still runs, on the path switch-local adaptive routing gives it. Jobs
without an SLA are routed by switch-local adaptive routing. Links seen down are out of the
ranking from then on (their pairs are ranked again, and a stream whose path died is moved,
once routing has converged, to the best ranked path left); links back up are in it again for
new flows. While a job of level L1 or L2 that a path within its SLA serves (one of its GPU
pairs at least) is in the run, the transfers of an L3 job (an SLA above 100 us, or none) are
held to ``controller.l3_rate_cap`` (80 %) of their sender's NIC, shared equally by the
transfers it sends at once through it (to other hosts; NVLink transfers within a host are
not held); an L1 / L2 job no path serves holds no one.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from fabricpilot.balancing.adaptive import Adaptive
from fabricpilot.balancing.base import (
    PolicyContext,
    RoutedBatch,
    TransferBatch,
    entity_of,
    register_policy,
)
from fabricpilot.balancing.task_aware import fabric_view
from fabricpilot.controller.intents import sla_level
from fabricpilot.controller.ranking import SlaUnmet, rank_paths
from fabricpilot.controller.southbound import FabricView
from fabricpilot.net.hashing import qp_source_port
from fabricpilot.topology.paths import max_path_links, pad_paths
from fabricpilot.workload.jobs import JobSpec


class SlaAware(Adaptive):
    """SLA-level scoped, ranked paths for jobs with an SLA (see the module docstring)."""

    name = "sla-aware"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.view: FabricView = fabric_view(ctx)
        self.sla_us: list[float | None] = []
        self.job_names: list[str] = []
        self.unmet: dict[tuple[str, int, int], str] = {}
        self.chosen: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (job, src, dst)
        self.capped = np.zeros(0, bool)  # per job: held to l3_rate_cap of its NICs
        self.down: set[int] = set()  # links seen down
        self._live: FabricView = self.view  # the fabric without them, as the ranking sees it

    def attach_jobs(self, jobs: list[JobSpec]) -> None:
        self.job_names = [j.name for j in jobs]
        self.sla_us = [j.sla_us for j in jobs]
        level = ["L3" if s is None else sla_level(s) for s in self.sla_us]
        served = any(lv != "L3" and self._served(job) for job, lv in zip(jobs, level,
                                                                          strict=True))
        self.capped = np.array([served and lv == "L3" for lv in level], bool)

    def _served(self, job: JobSpec) -> bool:
        """Whether a path within ``job``'s SLA serves one of its GPU pairs at least."""
        assert job.sla_us is not None
        gpu_node = self.view.gpu_node
        pairs = {(int(s), int(d)) for plan in job.collectives for st in plan.stages
                 for s, d in zip(st.src.tolist(), st.dst.tolist(), strict=True)}
        return any(not isinstance(rank_paths(self.view, s, d, job.sla_us), SlaUnmet)
                   for s, d in sorted(pairs) if gpu_node[s] != gpu_node[d])

    def on_links_changed(self, now: float, down: list[int], up: list[int]) -> None:
        """Links seen down (or back up) by their neighbours: the ranking leaves them out
        from now on (``None``: no controller of its own; the fabric converges, then
        :meth:`repath` moves the streams whose path died)."""
        self.down.update(down)
        self.down.difference_update(up)
        g: nx.DiGraph = self.view.graph.copy()
        links = self.view.links
        g.remove_edges_from((links[lk].src, links[lk].dst) for lk in self.down)
        self._live = replace(self.view, graph=g)
        self.chosen.clear()  # (ranked again on what is left, or back)

    def _ranked(self, j: int, s: int, d: int, free: dict[int, float] | None
                ) -> tuple[int, ...] | None:
        """The best ranked path of job ``j``'s pair ``s -> d`` on the live fabric (cached
        until links change), or ``None`` (its SLA unmet: noted)."""
        key = (j, s, d)
        hit = self.chosen.get(key)
        if hit is None:
            ranked = rank_paths(self._live, s, d, float(self.sla_us[j]),  # type: ignore[arg-type]
                                free_buffer_bytes=free)
            if isinstance(ranked, SlaUnmet):
                self.unmet[(self.job_names[j], s, d)] = ranked.reason
                return None
            hit = self.chosen[key] = ranked[0].links
        return hit

    def repath(self, job: NDArray[np.int64], src: NDArray[np.int64], dst: NDArray[np.int64],
               stream: NDArray[np.int64], qp: NDArray[np.int64] | None = None
               ) -> NDArray[np.int32]:
        """Paths for streams whose path died: a pair of a job with an SLA takes its best
        ranked path on what is left, any other (or one no path in scope serves now) the
        least-loaded walk of switch-local adaptive routing."""
        out = pad_paths(super().repath(job, src, dst, stream, qp=qp),
                        max_path_links(self.ctx.topology))
        for i, (j, s, d) in enumerate(zip(np.asarray(job).tolist(), np.asarray(src).tolist(),
                                          np.asarray(dst).tolist(), strict=True)):
            if not (0 <= j < len(self.sla_us)) or self.sla_us[j] is None:
                continue
            if self.view.gpu_node[s] == self.view.gpu_node[d]:
                continue
            hit = self._ranked(j, s, d, None)
            if hit is not None:
                out[i] = -1
                out[i, : len(hit)] = hit
        return out

    def route(self, batch: TransferBatch) -> RoutedBatch:
        ct = self.ctx.topology
        n = len(batch)
        sport = qp_source_port(batch.job, batch.src, batch.dst, np.zeros(n, np.int64),
                               entropy=self.ctx.ecmp.source_port_entropy)
        paths = self._walk(batch.src, batch.dst, sport, self._load_now())
        tel = self._telemetry() if self._telemetry is not None else None
        free = None
        if tel is not None:
            buf = self.ctx.port_buffer_bytes
            free = {int(i): buf - float(q) for i, q in enumerate(tel.queue_bytes) if q > 0}
        width = max_path_links(ct)
        for i, (j, s, d) in enumerate(zip(batch.job.tolist(), batch.src.tolist(),
                                          batch.dst.tolist(), strict=True)):
            if not (0 <= j < len(self.sla_us)) or self.sla_us[j] is None:
                continue
            if self.view.gpu_node[s] == self.view.gpu_node[d]:
                continue
            hit = self._ranked(j, s, d, free)
            if hit is None:
                continue
            row = np.full(width, -1, np.int32)
            row[: len(hit)] = hit
            paths[i] = row
        routed = self._routed(batch, paths)
        job = batch.job
        held = (job >= 0) & (job < len(self.capped))
        held[held] = self.capped[job[held]]
        # (only what leaves by the NIC: a transfer to a GPU of the same host goes over
        # NVLink, which the NIC's rate limiter does not hold)
        held &= ct.gpu_host[batch.src] != ct.gpu_host[batch.dst]
        if not held.any():
            return routed
        # an L3 sender at l3_rate_cap of its NIC over the transfers it sends at once by it
        # (an all-to-all's peers on other hosts share it); a ring row moves at its slowest
        # member's cap
        entity, n_rows = entity_of(batch.group)
        caps = np.full(n_rows, np.inf)
        src = batch.src[held]
        fan = np.bincount(src)[src]
        nic = ct.rate_gbps[ct.gpu_up[src]].astype(np.float64)
        np.minimum.at(caps, entity[held], self.ctx.controller.l3_rate_cap * nic / fan)
        return replace(routed, rate_cap_gbps=caps)

    def report(self) -> list[str]:
        """One line per job and GPU pair whose SLA no path could meet."""
        return [f"{job}: gpu{s} -> gpu{d}: {why}"
                for (job, s, d), why in sorted(self.unmet.items())]


register_policy("sla-aware")(SlaAware)
