"""Prometheus metrics of the service, read from its state at scrape time.

Per link: utilisation, queue depth, PFC pause fraction, drop rate and congestion-table weight
(``fabricpilot_link_*{link, src, dst, kind}``; GPU-NVLink links are left out, they are not
fabric ports); per job: the last collective's bus bandwidth and whether its SLA is met; the
controller's plans, re-plans, reroutes, heals and their latency; the API's request latency
per route and status.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # (the service builds its registry from here)
    from fabricpilot.service.state import FabricService

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0)


class ServiceCollector(Collector):
    """Collects a :class:`FabricService`'s state when Prometheus scrapes."""

    def __init__(self, service: FabricService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        labels = ["link", "src", "dst", "kind"]
        util = GaugeMetricFamily("fabricpilot_link_utilization",
                                 "Smoothed utilisation of a link (0..1)", labels=labels)
        queue = GaugeMetricFamily("fabricpilot_link_queue_bytes",
                                  "Smoothed egress queue depth of a link", labels=labels)
        pause = GaugeMetricFamily("fabricpilot_link_pause_fraction",
                                  "Share of time a link was PFC-paused", labels=labels)
        drops = GaugeMetricFamily("fabricpilot_link_drops_per_second",
                                  "Smoothed drop rate of a link", labels=labels)
        weight = GaugeMetricFamily("fabricpilot_link_weight",
                                   "Congestion-table weight pushed to the switches "
                                   "(1 neutral, 0 excluded)", labels=labels)
        down = GaugeMetricFamily("fabricpilot_link_down",
                                 "1 if the link is reported down, 2 if gray", labels=labels)
        for st in svc.congestion():
            if st["kind"] == "nvlink":
                continue
            lv = [str(st["link_id"]), st["src"], st["dst"], st["kind"]]
            util.add_metric(lv, st["utilization"])
            queue.add_metric(lv, st["queue_bytes"])
            pause.add_metric(lv, st["pause_fraction"])
            drops.add_metric(lv, st["drop_rate"])
            weight.add_metric(lv, st["weight"])
            down.add_metric(lv, 1.0 if st["down"] else 2.0 if st["gray"] else 0.0)
        yield from (util, queue, pause, drops, weight, down)

        with svc.lock:
            ctl = svc.controller
            violations = len(set(ctl.sla_unmet) | set(ctl.partitioned))
            n_jobs = len(ctl.intents)
            n_sets = len(svc.dp.installed)
        yield GaugeMetricFamily("fabricpilot_sla_violations",
                                "Jobs whose SLA no path can meet (or that a failure "
                                "partitioned)", value=violations)
        yield GaugeMetricFamily("fabricpilot_jobs", "Declared jobs", value=n_jobs)
        yield GaugeMetricFamily("fabricpilot_path_sets", "Path sets installed", value=n_sets)
        c = svc.counters
        for name, doc, v in (
                ("plans", "Full plans of every declared job", c.plans),
                ("job_plans", "Plans of changed jobs only, around the installed plan",
                 c.job_plans),
                ("replans", "Re-plans installed by the control loop (telemetry)", c.replans),
                ("reroutes", "Path sets whose paths changed", c.reroutes),
                ("heals", "Reactions to faults (reported, or seen in telemetry)", c.heals),
                ("faults", "Faults reported or seen in telemetry", c.faults),
                ("telemetry_deltas", "Port deltas ingested through the API",
                 svc.dp.posted_total),
                ("announces", "Communication calls announced", c.announces),
                ("sla_refused", "Announced calls whose SLA no path can meet", c.sla_refused),
                ("plans_yielded", "Whole plans that gave way to a fault report or to jobs "
                 "declared meanwhile (computed again after them)", c.plans_yielded),
                ("twin_restarts", "Times the twin's process died and was started again",
                 c.twin_restarts)):
            yield CounterMetricFamily(f"fabricpilot_{name}", doc, value=v)


class JobCollector(Collector):
    """Collects a :class:`FabricService`'s per-job series: they name jobs and tenants (for
    operators only, apart from the rest: :func:`job_registry`)."""

    def __init__(self, service: FabricService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        busbw = GaugeMetricFamily("fabricpilot_job_busbw_gbytes_per_second",
                                  "Bus bandwidth of a job's last collective (GB/s)",
                                  labels=["job"])
        sla = GaugeMetricFamily("fabricpilot_job_sla_met",
                                "1 if every path the job needs can meet its SLA",
                                labels=["job", "tenant", "level"])
        with svc.lock:
            ctl = svc.controller
            for name, v in sorted(svc.busbw_GBps.items()):
                busbw.add_metric([name], v)
            for tid, intent in sorted(ctl.intents.items()):
                if not intent.opt_in:  # (not planned by the controller: never checked)
                    continue
                met = tid not in ctl.sla_unmet and tid not in ctl.partitioned
                sla.add_metric([tid, intent.tenant, intent.strictest_level], 1.0 if met else 0.0)
        yield busbw
        yield sla


def job_registry(service: FabricService) -> CollectorRegistry:
    """A registry of one service's per-job series (:class:`JobCollector`)."""
    reg = CollectorRegistry()
    reg.register(JobCollector(service))
    return reg


def service_registry(service: FabricService) -> CollectorRegistry:
    """A registry for one service: its state collector and the planner-latency histogram
    (the service observes it after each plan, control period and heal; ``kind`` plan, tick,
    heal, heal_sent)."""
    reg = CollectorRegistry()
    planner = Histogram("fabricpilot_planner_seconds",
                        "Wall time of the controller's plans, control periods and heals "
                        "(heal_sent: until a heal's new paths were sent)",
                        ["kind"], registry=reg, buckets=LATENCY_BUCKETS_S)
    service.observe_planner = lambda kind, s: planner.labels(kind).observe(s)
    reg.register(ServiceCollector(service))
    return reg


def api_histogram(registry: CollectorRegistry) -> Histogram:
    """The API-latency histogram (per method, route template and status), in ``registry``
    (the API's process observes it per request)."""
    return Histogram("fabricpilot_api_request_seconds", "API request latency",
                     ["method", "route", "status"], registry=registry,
                     buckets=LATENCY_BUCKETS_S)
