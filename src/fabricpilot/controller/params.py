"""The controller's settings (a plain dataclass, so a data plane can carry them cheaply)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerParams:
    """How the controller runs: control-channel latency of rule updates, the QPs (plan
    parts) a GPU spreads its traffic in a call over, at least (``parts``, a pair's share of
    them as :func:`~fabricpilot.controller.patterns.pair_qps` gives: all of them for a ring's
    one peer, one per peer for a GPU with at least ``parts`` peers, as in an AlltoAll), the
    rules one switch holds, how often it re-plans from telemetry
    and by how much a re-plan must lower a job's bottleneck to be installed (hysteresis), the
    buffer occupancy that trips the pressure fuse, the rate cap of L3 traffic while L1/L2
    jobs share the fabric, how many source ports it tries per QP when steering (and, for a
    QP it can neither steer nor pin, ``spill_port_tries`` ports, of which it takes the one
    whose hash path avoids dead and gray links and loads the fabric least), and how it
    detects gray links: FEC-corrected error rate above ``fec_threshold`` in ``debounce_count``
    samples within ``debounce_window_ns``, or in as many samples in a row. A QP moved off a
    failed link goes whole to its least loaded live path unless that would load a link more
    than ``heal_spread_over`` (utilisation) above the plan's lambda (at least 100 %); then
    it is spread over ``parts`` QPs. After links go down or gray, the next control period
    weighs a whole plan; a link back up is weighed so only once it has stayed up
    ``link_up_holddown_ns`` (counted from
    when the data plane saw it back, else from the first control period that sees it up: a
    flapping link does not pull traffic back between its flaps). A whole plan weighed and
    not installed is not weighed again while the plan, the jobs and the links stay as they
    were and the background load of no link moves by more than
    ``replan_background_tolerance`` of its capacity (it would lose again). A link its error
    counters made gray is restored once they have stayed below the threshold for
    ``gray_clear_ns`` (infinite, the default: only an operator's report restores it). The
    first ``mice_spines`` top-tier switches are kept for mice: the plan keeps every planned
    path off them, and the switches route the transfers too small to be planned there
    (0, the default: none). ``telemetry_interval_ns`` is how often the data plane's ports
    report: the congestion map steps the links a report leaves out once per such interval
    (``None``, the default: once per control period, the twin's cadence)."""

    control_latency_ns: int = 10_000
    parts: int = 16
    switch_rule_capacity: int = 4096
    replan_interval_ns: float = 200_000
    replan_gain: float = 0.1
    pressure_fuse: float = 0.9
    l3_rate_cap: float = 0.8
    steer_tries: int = 1024
    spill_port_tries: int = 8
    fec_threshold: float = 1e-6
    debounce_count: int = 3
    debounce_window_ns: float = 500e6
    heal_spread_over: float = 0.02
    link_up_holddown_ns: float = 1_000_000
    replan_background_tolerance: float = 0.05
    gray_clear_ns: float = float("inf")
    mice_spines: int = 0
    telemetry_interval_ns: float | None = None
