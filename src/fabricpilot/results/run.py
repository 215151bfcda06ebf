"""Results of one run: per flow, per collective, per job, per link, and the JSON summary.

Definitions (as docs/model.md's "Metrics" states them): FCT = last byte delivered - first byte
sent; slowdown = FCT / FCT alone on the empty fabric (latency + wire bytes / the flow's
alone rate), clamped at >= 1; algbw = S / t in GB/s (10^9 bytes/s); busbw = algbw * the
nccl-tests factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fabricpilot.dataplane.engine import (
    MICE_OWNER,
    CollectiveRecord,
    EngineOutput,
    IterationRecord,
)
from fabricpilot.dataplane.fluid import FluidReport
from fabricpilot.topology.compiled import LINK_KIND_CODES, CompiledTopology
from fabricpilot.workload.jobs import JobSpec

_KIND_NAMES = {v: str(k) for k, v in LINK_KIND_CODES.items()}

MAX_PFC_EVENTS = 100
"""PFC events listed in the summary; the rest are counted in ``pfc_events_truncated``."""


def _stats(values: NDArray[np.float64]) -> dict[str, float | int]:
    if len(values) == 0:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "count": len(values),
        "mean": _r(float(values.mean())),
        "p50": _r(float(np.percentile(values, 50))),
        "p99": _r(float(np.percentile(values, 99))),
        "max": _r(float(values.max())),
    }


def _r(x: float, digits: int = 6) -> float:
    """Round for stable, readable JSON."""
    return float(f"{x:.{digits}g}")


def _ratio(x: float) -> float | None:
    """An interference ratio for JSON: rounded, ``None`` when not finite (JSON has no inf).

    >>> _ratio(1.23456789), _ratio(float("inf"))
    (1.23457, None)
    """
    return _r(x) if np.isfinite(x) else None



# controller figures measured in wall-clock time (the heals' compute time): written as 0
# with the wall time when a summary must be byte-identical across equal seeds
WALL_CLOCK_STATS = frozenset({"heal_max_ms", "heal_sent_max_ms"})

@dataclass
class RunResult:
    """Everything one (scenario, policy) run produced."""

    scenario: str
    policy: str
    seed: int
    sim_time_ns: int
    wall_time_s: float
    flows: dict[str, NDArray]
    collectives: list[CollectiveRecord]
    iterations: list[IterationRecord]
    jobs: list[JobSpec]
    link_names: list[str]
    link_kind: list[str]
    link_capacity_gbps: NDArray[np.float64]
    link_bytes: NDArray[np.float64]
    link_peak_util: NDArray[np.float64]
    n_rate_updates: int
    model: str = "flow"
    model_report: FluidReport | None = None
    path_moves: int = 0
    sla_unmet: list[str] = field(default_factory=list)  # "<job>: gpuA -> gpuB: <why>"
    qos_mismatches: list[str] = field(default_factory=list)
    # job -> busbw alone / busbw here (fabricpilot.runner.interference); empty: not measured
    interference: dict[str, float] = field(default_factory=dict)
    # what a controller-driven policy did (fabricpilot.balancing.task_aware.TaskAware.stats)
    controller: dict[str, object] = field(default_factory=dict)
    # one summary per injected fault (fabricpilot.dataplane.faults.FaultRecord.summary)
    faults: list[dict[str, object]] = field(default_factory=list)
    aborted: dict[str, str] = field(default_factory=dict)  # job -> why it was stopped
    mice_cut_off: int = 0  # mice dropped for want of a path (links down), never delivered

    @classmethod
    def from_engine(
        cls,
        out: EngineOutput,
        *,
        policy: str,
        seed: int,
        scenario: str,
        topology: CompiledTopology,
        jobs: list[JobSpec],
        wall_time_s: float,
        model: str = "flow",
        qos_mismatches: list[str] | None = None,
    ) -> RunResult:
        flows = dict(out.flows)
        report = out.model_report
        if report is not None and not isinstance(report, FluidReport):
            raise TypeError(f"unexpected model report {type(report).__name__}")
        if flows:
            delivered = flows["deliver_ns"] >= 0  # not: flows of a job stopped by a fault
            fct = np.where(delivered, flows["deliver_ns"] - flows["start_ns"], -1)
            flows["fct_ns"] = fct
            flows["slowdown"] = np.where(
                delivered, np.maximum(fct / np.maximum(flows["alone_fct_ns"], 1), 1.0), np.nan)
        return cls(
            scenario=scenario, policy=policy, seed=seed, sim_time_ns=out.sim_time_ns,
            wall_time_s=wall_time_s, flows=flows, collectives=out.collectives,
            iterations=out.iterations, jobs=jobs,
            link_names=[topology.link_name(i) for i in range(topology.n_links)],
            link_kind=[_KIND_NAMES[int(k)] for k in topology.link_kind],
            link_capacity_gbps=topology.rate_gbps.copy(), link_bytes=out.link_bytes,
            link_peak_util=out.link_peak_util, n_rate_updates=out.n_rate_updates,
            path_moves=out.path_moves,
            model=model, model_report=report, qos_mismatches=list(qos_mismatches or []),
            faults=[f.summary() for f in out.faults], aborted=dict(out.aborted),
            mice_cut_off=out.mice_cut_off,
        )

    # ----------------------------------------------------------------- derived
    @property
    def bytes_sent(self) -> int:
        """Payload bytes handed to the fabric (all flows, jobs and mice)."""
        if not self.flows:
            return 0
        return int((self.flows["members"] * self.flows["size_bytes"]).sum())

    @property
    def bytes_delivered(self) -> int:
        """Payload bytes of flows delivered by the end of the run."""
        if not self.flows:
            return 0
        done = (self.flows["deliver_ns"] >= 0) & (self.flows["deliver_ns"] <= self.sim_time_ns)
        return int((self.flows["members"] * self.flows["size_bytes"])[done].sum())

    def job_collectives(self, job: str) -> list[CollectiveRecord]:
        return [c for c in self.collectives if c.job == job]

    def job_iterations(self, job: str) -> list[IterationRecord]:
        return sorted((i for i in self.iterations if i.job == job), key=lambda i: i.iteration)

    def mean_iteration_ns(self, job: str) -> float:
        its = self.job_iterations(job)
        return float(np.mean([i.end_ns - i.start_ns for i in its])) if its else 0.0

    def mean_busbw_GBps(self, job: str) -> float:
        """A job's busbw over all its collectives: total bus bytes / total collective time.

        With one collective per iteration this is the mean busbw; with several, a slow one
        weighs by the time it takes (as it does on the iteration time)."""
        cs = self.job_collectives(job)
        t = sum(c.time_ns for c in cs)
        return sum(c.busbw_GBps * c.time_ns for c in cs) / t if t > 0 else 0.0

    def slowdowns(self, which: str = "all") -> NDArray[np.float64]:
        if not self.flows:
            return np.zeros(0)
        mice = self.flows["owner"] == MICE_OWNER
        sel = {"all": np.ones_like(mice), "mice": mice, "jobs": ~mice}[which]
        s = self.flows["slowdown"][sel]
        return s[~np.isnan(s)]  # flows of a job stopped by a fault have none

    def link_utilization(self) -> NDArray[np.float64]:
        """Mean utilisation of each link over the run."""
        if self.sim_time_ns <= 0:
            return np.zeros(len(self.link_bytes))
        return self.link_bytes * 8.0 / (self.link_capacity_gbps * self.sim_time_ns)

    def fabric_events(self) -> dict[str, Any]:
        """ECN, loss and PFC counters of the run, and the PFC storm / deadlock events (the
        first :data:`MAX_PFC_EVENTS`; the rest counted). The flow model has no queues: its
        counters are zero but for the bytes resent (its flows' ``retx_bytes``: losses to
        dead and gray links, spraying to an in-order NIC)."""
        rep = self.model_report
        if rep is None:
            retx = self.flows.get("retx_bytes")
            rep = FluidReport(retransmitted_bytes=float(retx.sum()) if retx is not None
                              and len(retx) else 0.0)
        events = [
            {"kind": e.kind, "time_ns": int(e.time_ns), "ports": list(e.ports),
             "hops": int(e.hops), "cleared_by_watchdog": bool(e.cleared_by_watchdog)}
            for e in rep.events
        ]
        out: dict[str, Any] = {
            "ecn_marks": round(float(rep.ecn_marks)),
            "drops_bytes": round(float(rep.drops_bytes)),
            "retransmitted_bytes": round(float(rep.retransmitted_bytes)),
            "pfc_pause_ns_total": round(float(rep.pfc_pause_ns_total)),
            "pause_frames": int(rep.pause_frames),
            "pfc_storms": int(rep.pfc_storms),
            "deadlocks": int(rep.deadlocks),
            "pfc_events": events[:MAX_PFC_EVENTS],
        }
        if self.model_report is not None:
            # the period of timeseries.csv (doubled from the configured one if the run was
            # too long for the row budget)
            out["timeseries_interval_ns"] = round(self.model_report.timeseries.interval_ns)
        if len(events) > MAX_PFC_EVENTS:
            out["pfc_events_truncated"] = len(events) - MAX_PFC_EVENTS
        return out

    # ----------------------------------------------------------------- summary
    def summary(self, *, include_wall_time: bool = True) -> dict[str, Any]:
        """The JSON summary. ``include_wall_time=False`` writes 0.0 for the wall-clock
        figures (the run's wall time, the controller's heal times) so that two runs with the
        same seed produce byte-identical files."""
        jobs = []
        for job in self.jobs:
            its = self.job_iterations(job.name)
            jobs.append({
                "name": job.name,
                "n_gpus": job.n_gpus,
                "iterations": len(its),
                # (to 0.1 ns: six significant digits would drop the ns of a 4.5 ms mean)
                "mean_iteration_ns": round(self.mean_iteration_ns(job.name), 1),
                "iteration_ns": [i.end_ns - i.start_ns for i in its],
                "mean_busbw_GBps": _r(self.mean_busbw_GBps(job.name)),
                **({"interference": _ratio(self.interference[job.name])}
                   if job.name in self.interference else {}),
                # (a job a fault stopped: why; its figures are those of what it finished)
                **({"stopped": self.aborted[job.name]} if job.name in self.aborted else {}),
                "collectives": [
                    {
                        "op": c.op, "algorithm": c.algorithm, "iteration": c.iteration,
                        "index": c.index, "n_ranks": c.n_ranks, "size_bytes": c.size_bytes,
                        "start_ns": c.start_ns, "end_ns": c.end_ns, "time_ns": c.time_ns,
                        "algbw_GBps": _r(c.algbw_GBps), "busbw_GBps": _r(c.busbw_GBps),
                    }
                    for c in self.job_collectives(job.name)
                ],
            })
        fabric = np.array([k == "fabric" for k in self.link_kind])
        util = self.link_utilization()
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "model": self.model,
            "seed": self.seed,
            "sim_time_ns": int(self.sim_time_ns),
            "wall_time_s": round(self.wall_time_s, 3) if include_wall_time else 0.0,
            "bytes_sent": self.bytes_sent,
            "bytes_delivered": self.bytes_delivered,
            "n_flows": len(self.flows.get("members", [])),
            "rate_updates": self.n_rate_updates,
            "jobs": jobs,
            "fct_slowdown": {
                "jobs": _stats(self.slowdowns("jobs")),
                "mice": _stats(self.slowdowns("mice")),
            },
            # (None: a fabric with no switch-to-switch link, e.g. one leaf, has none to use)
            "links": {
                "fabric_peak_utilization": _r(float(self.link_peak_util[fabric].max()))
                if fabric.any() else None,
                "fabric_mean_utilization": _r(float(util[fabric].mean()))
                if fabric.any() else None,
            },
            **self.fabric_events(),
            # packets that arrived before earlier packets of their flow (path changes, spraying)
            "reorder_events": int(np.asarray(self.flows.get("reorder_events", [0])).sum()),
            "path_moves": int(self.path_moves),
            "sla_unmet": list(self.sla_unmet),
            "qos_mismatches": list(self.qos_mismatches),
            **({"controller": {k: (0.0 if k in WALL_CLOCK_STATS and not include_wall_time
                                   else v) for k, v in self.controller.items()}}
               if self.controller else {}),
            **({"faults": [dict(f) for f in self.faults]} if self.faults else {}),
            **({"aborted_jobs": dict(self.aborted)} if self.aborted else {}),
            **({"mice_cut_off": self.mice_cut_off} if self.mice_cut_off else {}),
        }
