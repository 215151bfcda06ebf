"""Assemble a run: scenario -> topology + workload -> engine under a policy -> results.

:func:`prepare` does everything that does not depend on the routing policy (build and compile
the topology, place the jobs, generate their collectives and the mice) once; :func:`run_policy`
runs the engine on it under one policy. Several policies on one scenario share the prepared
workload, so they see exactly the same GPUs, collectives and mice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from fabricpilot.balancing import EcmpParams, PolicyContext, make_policy
from fabricpilot.balancing.base import DEFAULT_PORT_BUFFER_BYTES, POLICIES, AdaptiveParams
from fabricpilot.controller.params import ControllerParams
from fabricpilot.dataplane import RATE_MODELS, Engine, FabricParams, make_rate_model
from fabricpilot.dataplane.engine import EngineOutput
from fabricpilot.dataplane.qos import mapping_mismatches
from fabricpilot.errors import ScenarioError, TopologyError
from fabricpilot.faults import FaultTimeline, resolve_faults
from fabricpilot.results import RunResult
from fabricpilot.scenario import Scenario, check_gpu_count
from fabricpilot.topology import CompiledTopology, Topology, build_topology, compile_topology
from fabricpilot.topology.compiled import LINK_KIND_CODES
from fabricpilot.topology.io import load_topology_json
from fabricpilot.topology.model import switch_examples
from fabricpilot.topology.paths import pair_delay_ns
from fabricpilot.workload.collectives import LinkCosts, build_collective
from fabricpilot.workload.jobs import JobSpec
from fabricpilot.workload.mice import MiceArrivals, poisson_mice
from fabricpilot.workload.placement import PlacementError, place_gpus
from fabricpilot.workload.plan import CollectivePlan


@dataclass(frozen=True)
class Prepared:
    """A scenario made concrete: compiled topology, placed jobs, mice and parameters."""

    name: str
    seed: int
    topology: CompiledTopology
    jobs: list[JobSpec]
    mice: MiceArrivals | None = None
    fabric: FabricParams = field(default_factory=FabricParams)
    ecmp: EcmpParams = field(default_factory=EcmpParams)
    adaptive: AdaptiveParams = field(default_factory=AdaptiveParams)
    rate_model: str = "flow"
    completion_tolerance: float = 1e-3
    model_params: dict[str, object] = field(default_factory=dict)
    mice_class: str = "rdma"
    controller: ControllerParams = field(default_factory=ControllerParams)
    qos_mismatches: list[str] = field(default_factory=list)
    faults: FaultTimeline | None = None


MAX_SIM_NS = 1e15
"""The simulated time a run may need at the least (11.6 days), as a scenario's own times."""


def least_run_ns(job: JobSpec, ct: CompiledTopology) -> float:
    """A lower bound on the simulated time ``job`` takes, alone on an idle fabric: its
    start, its compute gaps, and every stage of its collectives at least as long as its
    largest transfer at the fastest link its sender has (NIC or NVLink), each iteration.

    >>> from fabricpilot.topology import compile_topology, leaf_spine
    >>> from fabricpilot.workload import build_collective
    >>> ct = compile_topology(leaf_spine(hosts=2, gpus_per_host=1, nics_per_leaf=2))
    >>> plan = build_collective("alltoall", np.array([0, 1]), 1 << 20)
    >>> job = JobSpec("a", (0, 1), (plan,), iterations=2, compute_ns=1000)
    >>> least_run_ns(job, ct)  # 2 x (1 us + half the 1 MiB to the peer at 400 Gb/s)
    22971.52
    """
    return sum(least_run_parts_ns(job, ct))


def least_run_parts_ns(job: JobSpec, ct: CompiledTopology) -> tuple[float, float, float]:
    """:func:`least_run_ns` in its three parts: the start, the compute gaps of all
    iterations, and the transfers of all iterations.

    >>> from fabricpilot.topology import compile_topology, leaf_spine
    >>> from fabricpilot.workload import build_collective
    >>> ct = compile_topology(leaf_spine(hosts=2, gpus_per_host=1, nics_per_leaf=2))
    >>> plan = build_collective("alltoall", np.array([0, 1]), 1 << 20)
    >>> least_run_parts_ns(JobSpec("a", (0, 1), (plan,), start_ns=5, iterations=2,
    ...                            compute_ns=1000), ct)
    (5.0, 2000.0, 20971.52)
    """
    fastest = ct.rate_gbps[ct.gpu_up].astype(np.float64)
    nv = ct.gpu_nv_up >= 0
    fastest[nv] = np.maximum(fastest[nv], ct.rate_gbps[ct.gpu_nv_up[nv]])
    transfer = 0.0
    for plan in job.collectives:
        for st in plan.stages:
            if len(st.src):
                transfer += float((st.size_bytes * 8.0 / fastest[st.src]).max())
    return (float(job.start_ns), job.iterations * float(job.compute_ns),
            job.iterations * transfer)


def link_costs(ct: CompiledTopology, fabric: FabricParams) -> LinkCosts:
    """The fabric's costs as ``algorithm: auto`` weighs an AllReduce's algorithms by: the
    GPUs' slowest NIC and NVLink rates and a message's latency as the engine counts it (the
    slowest pair's path delay plus ``nic_latency_ns``)."""
    nic = float(ct.rate_gbps[ct.gpu_up].min(initial=np.inf))
    nv = ct.gpu_nv_up[ct.gpu_nv_up >= 0]
    nvlink = float(ct.rate_gbps[nv].min()) if len(nv) else nic

    def latency_ns(src: np.ndarray, dst: np.ndarray) -> float:
        delay = pair_delay_ns(ct, src, dst, fabric.switch_latency_ns)
        return float(delay.max(initial=0)) + fabric.nic_latency_ns

    return LinkCosts(nic, nvlink, latency_ns)


def build_scenario_topology(scenario: Scenario, source: str) -> Topology:
    """Build (or import) the scenario's topology."""
    spec = scenario.topology
    common = dict(
        gpus_per_host=spec.gpus_per_host, rail_optimized=spec.rail_optimized,
        nic_rate_gbps=spec.nic_rate_gbps, fabric_rate_gbps=spec.fabric_rate_gbps,
        nvlink_rate_gbps=spec.nvlink_rate_gbps, link_delay_ns=spec.link_delay_ns,
        nvlink_delay_ns=spec.nvlink_delay_ns,
    )
    try:
        if spec.kind == "file":
            assert spec.path is not None
            return load_topology_json(spec.path)
        if spec.kind == "leaf_spine":
            return build_topology("leaf_spine", hosts=spec.hosts, nics_per_leaf=spec.nics_per_leaf,
                                  oversubscription=spec.oversubscription, **common)
        return build_topology("fat_tree", k=spec.k, **common)
    except TopologyError as err:
        raise ScenarioError(source, "topology", str(err)) from None


def _check_kept_spines(scenario: Scenario, ct: CompiledTopology, source: str,
                       policies: Sequence[str]) -> None:
    """A :class:`ScenarioError` if the top-tier switches kept for mice (by the controller,
    by ``adaptive-split`` if among ``policies``, those to run) would leave the other
    traffic none: found before any policy runs, not when the one that keeps them starts."""
    top = int(ct.switch_tier.max()) if len(ct.switch_tier) else 0
    n_top = int((ct.switch_tier == top).sum())
    noun = "switch" if n_top == 1 else "switches"
    mice = scenario.controller.mice_spines
    if mice > 0 and mice >= n_top:
        raise ScenarioError(source, "controller.mice_spines",
                            f"{mice} of the fabric's {n_top} top-tier {noun} would leave none "
                            f"for planned traffic (at most {n_top - 1})")
    reserved = scenario.adaptive.reserved_spines
    if n_top > 1 and reserved >= n_top and "adaptive-split" in policies:
        raise ScenarioError(source, "adaptive.reserved_spines",
                            f"{reserved} of the fabric's {n_top} top-tier switches would leave "
                            f"none for the elephants (at most {n_top - 1})")


def _check_dcqcn_floor(scenario: Scenario, ct: CompiledTopology, source: str) -> None:
    """A :class:`ScenarioError` if DCQCN's rate floor is at or above a NIC's rate: no cut
    could then slow a QP, and the run would be one without congestion control while it
    says DCQCN is on."""
    fabric = scenario.fabric
    if fabric.model != "fluid" or not fabric.dcqcn.enabled:
        return
    nic = ct.rate_gbps[ct.link_kind == LINK_KIND_CODES["nic"]]
    slowest = float(nic.min()) if len(nic) else math.inf
    floor = fabric.dcqcn.min_rate_gbps
    if floor >= slowest:
        raise ScenarioError(source, "fabric.dcqcn.min_rate_gbps",
                            f"{floor:g} Gbps is not below the NIC rate ({slowest:g} Gbps): "
                            f"no rate cut could slow a QP (for a run without congestion "
                            f"control, set fabric.dcqcn.enabled: false)")


def prepare(scenario: Scenario, source: str = "<scenario>",
            policies: Sequence[str] | None = None) -> Prepared:
    """Build the topology and the workload of ``scenario`` (independent of the policy), and
    check the settings of the policies to run (``policies``; default the scenario's)."""
    topo = build_scenario_topology(scenario, source)
    try:
        ct = compile_topology(topo)
    except TopologyError as err:
        raise ScenarioError(source, "topology", str(err)) from None
    check_gpu_count(scenario, ct.n_gpus, source)
    _check_kept_spines(scenario, ct, source,
                       scenario.policies if policies is None else policies)
    _check_dcqcn_floor(scenario, ct, source)
    for i, name in enumerate(scenario.policies):
        if name not in POLICIES:
            raise ScenarioError(source, f"policies[{i}]",
                                f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    if scenario.fabric.model not in RATE_MODELS:
        raise ScenarioError(source, "fabric.model", f"unknown rate model {scenario.fabric.model!r}")
    qos = scenario.fabric.qos
    switches = list(ct.topo.switches)
    for name in qos.switch_overrides:
        if name not in switches:
            raise ScenarioError(source, f"fabric.qos.switch_overrides.{name}",
                                f"unknown switch ({switch_examples(switches)})")
    qos_params = qos.to_params()
    if scenario.faults is not None and scenario.fabric.model != "flow":
        raise ScenarioError(source, "faults", "faults are modelled by the flow-level model: "
                            f"set fabric.model: flow (got {scenario.fabric.model})")
    faults = (None if scenario.faults is None else
              resolve_faults(scenario.faults, ct, scenario.seed, source=source,
                             packet_bytes=scenario.fabric.mtu_bytes
                             + scenario.fabric.header_bytes))

    rng = np.random.default_rng([scenario.seed, 1])
    free = np.ones(ct.n_gpus, bool)
    placed: dict[int, np.ndarray] = {}
    # explicit placements reserve their GPUs first, then contiguous blocks, then random picks
    # (shuffled ones among them, in the scenario's order)
    rank = {"explicit": 0, "contiguous": 1, "random": 2, "shuffled": 2}
    order = sorted(range(len(scenario.jobs)), key=lambda i: rank[scenario.jobs[i].placement])
    for i in order:
        job = scenario.jobs[i]
        try:
            gpus = place_gpus(job.gpus, free, policy=job.placement, rng=rng,
                              explicit=job.gpu_ids)
        except PlacementError as err:
            raise ScenarioError(source, f"jobs[{i}]", str(err)) from None
        free[gpus] = False
        placed[i] = gpus

    f = scenario.fabric
    fabric = FabricParams(mtu_bytes=f.mtu_bytes, header_bytes=f.header_bytes,
                          wire_overhead_bytes=f.wire_overhead_bytes,
                          switch_latency_ns=f.switch_latency_ns, nic_latency_ns=f.nic_latency_ns)
    costs = link_costs(ct, fabric)  # (what auto weighs an AllReduce's algorithms by)
    jobs: list[JobSpec] = []
    g = topo.gpus_per_host
    for i, job in enumerate(scenario.jobs):
        plans = []
        for c, coll in enumerate(job.collectives):
            try:
                plans.append(build_collective(coll.op, placed[i], coll.size_bytes,
                                              gpus_per_host=g, algorithm=coll.algorithm,
                                              mode=coll.mode, root=coll.root, costs=costs))
            except ValueError as err:
                raise ScenarioError(source, f"jobs[{i}].collectives[{c}]", str(err)) from None
        jobs.append(JobSpec(job.name, tuple(int(x) for x in placed[i]), tuple(plans),
                            start_ns=job.start_ns, iterations=job.iterations,
                            compute_ns=job.compute_ns, traffic_class=job.traffic_class,
                            declare_intent=job.declare_intent, sla_us=job.sla_us,
                            priority=job.priority))
        start, compute, transfer = least_run_parts_ns(jobs[-1], ct)
        least = start + compute + transfer
        if least > MAX_SIM_NS:
            # (the field named is the largest part: the start, the compute gaps, or the
            # transfers, whose cause is the rates or the bytes)
            field, cause = max((start, "start_ns", "its start"),
                               (compute, "compute_ns", "its compute gaps"),
                               (transfer, "", "its transfers"))[1:]
            raise ScenarioError(source, f"jobs[{i}]{'.' + field if field else ''}", (
                f"needs at least {least / 1e9 / 86400:.3g} days of simulated time (start "
                f"{start:.3g} ns + compute gaps {compute:.3g} ns + its bytes at its GPUs' "
                f"fastest link rates, alone on the fabric, {transfer:.3g} ns), beyond the "
                f"twin's 1e15 ns (11.6 days): most of it {cause}"
                + ("; rates too low for the bytes they carry" if not field else "")))

    mice = None
    if scenario.mice is not None:
        m = scenario.mice
        gpus = np.arange(ct.n_gpus) if m.gpus == "all" else np.asarray(m.gpus, np.int64)
        mice = poisson_mice(gpus, rate_per_s=m.rate_per_s, size_bytes=m.size_bytes,
                            start_ns=m.start_ns, duration_ns=m.duration_ns,
                            rng=np.random.default_rng([scenario.seed, 2]))
    e = scenario.ecmp
    ecmp = EcmpParams(qps_per_connection=e.qps_per_connection,
                      source_port_entropy=e.source_port_entropy, per_switch_seed=e.per_switch_seed)
    # the fluid model's parameters (make_rate_model ignores them for the flow model)
    model_params: dict[str, object] = {
        "ecn": f.ecn.to_params(), "dcqcn": f.dcqcn.to_params(), "pfc": f.pfc.to_params(),
        "fluid": f.fluid.to_params(), "qos": qos_params,
    }
    a = scenario.adaptive
    adaptive = AdaptiveParams(
        rebalance_interval_ns=(float(a.rebalance_interval_ns) if a.rebalance_interval_ns
                               is not None else float("inf")),
        drain_safe=a.drain_safe, hysteresis=a.hysteresis, flowlet_gap_ns=a.flowlet_gap_ns,
        mice_bytes=a.mice_bytes, reserved_spines=a.reserved_spines, mice_by=a.mice_by)
    return Prepared(scenario.name, scenario.seed, ct, jobs, mice, fabric, ecmp, adaptive,
                    scenario.fabric.model, scenario.fabric.completion_tolerance,
                    model_params=model_params,
                    mice_class=scenario.mice.traffic_class if scenario.mice else "rdma",
                    qos_mismatches=mapping_mismatches(qos_params, switches) if switches else [],
                    controller=scenario.controller.to_params(), faults=faults)


FLUID_ONLY_SETTINGS = ("ecn", "dcqcn", "pfc", "fluid", "qos")


def config_warnings(scenario: Scenario, prep: Prepared) -> list[str]:
    """Problems that do not stop a run, as ``FIELD: MESSAGE`` lines: QoS mapping mismatches
    between switches, fluid-model settings given to the flow model (which ignores them),
    a ``link_up`` fault that finds its link up and a ``link_down`` that finds it down, a job
    of one GPU (its collectives move no data: nccl-tests' busbw of one rank is 0), an
    ``adaptive.reserved_spines`` that ``adaptive-split`` would refuse (where it is not run:
    where it is, :func:`prepare` refuses it)."""
    lines = [f"fabric.qos: {m}" for m in qos_warnings(prep)]
    ct = prep.topology
    n_top = int((ct.switch_tier == ct.switch_tier.max()).sum()) if len(ct.switch_tier) else 0
    reserved = scenario.adaptive.reserved_spines
    if n_top > 1 and reserved >= n_top:
        lines.append(f"adaptive.reserved_spines: {reserved} of the fabric's {n_top} top-tier "
                     f"switches would leave none for the elephants: adaptive-split refuses "
                     f"it (at most {n_top - 1})")
    lines += [f"jobs[{i}]: {j.name}: one GPU: its collectives move no data over the fabric "
              f"(time 0, busbw 0)" for i, j in enumerate(prep.jobs) if j.n_gpus == 1]
    if prep.faults is not None:
        lines += [f"faults.events: {f.label}: nothing holds the link down then, so it changes "
                  f"nothing" for f in prep.faults.idle_link_ups()]
        lines += [f"faults.events: {f.label}: the link is already down then ({g.label}): it "
                  f"comes up once both have ended (a link_up ends one)"
                  for f, g in prep.faults.stacked_link_downs()]
    if scenario.fabric.model == "flow":
        given = [k for k in FLUID_ONLY_SETTINGS if k in scenario.fabric.model_fields_set]
        if given:
            lines.append(f"fabric: {', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                         f"ignored by the flow model (set fabric.model: fluid to use "
                         f"{'it' if len(given) == 1 else 'them'})")
    return lines


def qos_warnings(prep: Prepared) -> list[str]:
    """The QoS problems of a prepared scenario: one message per switch whose DSCP -> priority
    mapping differs from the other switches' (lossless silently lost mid-path)."""
    return list(prep.qos_mismatches)


def fault_setup(prep: Prepared) -> tuple[FaultTimeline | None, ControllerParams,
                                         dict[str, Any]]:
    """The scenario's faults if any play (events, or noisy error counters; else ``None``),
    the controller's parameters with the gray-link detection the faults section sets, and
    the twin's error-counter sampling (:class:`PolicyContext` keywords)."""
    faults = prep.faults if prep.faults is not None and (
        prep.faults.events or prep.faults.params.noise_spike_probability > 0) else None
    controller, fec = prep.controller, {}
    if faults is not None:  # the controller detects gray links as the scenario says
        fp = faults.params
        controller = replace(controller, fec_threshold=fp.fec_threshold,
                             debounce_count=fp.debounce_count,
                             debounce_window_ns=float(fp.debounce_window_ns))
        fec = {"fec_sample_ns": fp.telemetry_interval_ns,
               "fec_noise": (fp.noise_spike_probability, fp.noise_spike_ber)}
    return faults, controller, fec


def _simulate(
    prep: Prepared,
    policy: str,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[EngineOutput, object, float]:
    """Run the engine on ``prep.jobs`` under ``policy``: its output, the policy object and
    the wall time of the run in seconds."""
    model = make_rate_model(prep.rate_model, prep.topology, prep.fabric, **prep.model_params)
    faults, controller, fec = fault_setup(prep)
    ctx = PolicyContext(prep.topology, prep.seed, prep.fabric.switch_latency_ns, prep.ecmp,
                        member_routes=model.needs_paths or faults is not None,
                        adaptive=prep.adaptive, controller=controller,
                        port_buffer_bytes=port_buffer_bytes(prep),
                        faults=faults is not None, **fec)
    pol = make_policy(policy, ctx)
    attach = getattr(pol, "attach_jobs", None)
    if attach is not None:  # a controller-driven policy: the jobs declare themselves
        attach(prep.jobs)
    engine = Engine(prep.topology, pol, prep.jobs, fabric=prep.fabric,
                    mice=prep.mice, rate_model=model, batch_rel_eps=prep.completion_tolerance,
                    progress=progress, mice_class=prep.mice_class, faults=faults)
    t0 = time.perf_counter()
    out = engine.run()
    return out, pol, time.perf_counter() - t0


def _result(prep: Prepared, policy: str, out: EngineOutput, pol: object, wall: float,
            jobs: list[JobSpec]) -> RunResult:
    """The :class:`RunResult` of an engine run whose reported jobs are ``jobs``."""
    result = RunResult.from_engine(out, policy=policy, seed=prep.seed,
                                   scenario=prep.name, topology=prep.topology,
                                   jobs=jobs, wall_time_s=wall, model=prep.rate_model,
                                   qos_mismatches=prep.qos_mismatches)
    report = getattr(pol, "report", None)
    if report is not None:  # e.g. SLAs no path could meet
        result.sla_unmet = list(report())
    stats = getattr(pol, "stats", None)
    if stats is not None:  # a controller-driven policy: what the controller did
        result.controller = stats()
    return result


def port_buffer_bytes(prep: Prepared) -> float:
    """A switch egress port's buffer: the fluid model's, else the default."""
    fluid = prep.model_params.get("fluid")
    per_port = getattr(fluid, "buffer_bytes_per_port", None)
    return float(per_port) if per_port else DEFAULT_PORT_BUFFER_BYTES


def run_policy(
    prep: Prepared,
    policy: str,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run the prepared scenario under ``policy``; wall time is measured here."""
    out, pol, wall = _simulate(prep, policy, progress)
    return _result(prep, policy, out, pol, wall, prep.jobs)


# ----------------------------------------------------------------------------- interference
def _idle(job: JobSpec) -> JobSpec:
    """A stand-in for ``job`` that sends nothing: one iteration at time 0 of collectives
    without stages (they complete the instant they start) and no intent to the controller.

    It keeps the job's name and GPUs, so the job list keeps its length and every other job
    its position, which is its identity in the engine (ECMP hashes the connection's owner
    index into the source port) and in the controller-driven policies (rules by position).
    """
    empty = tuple(CollectivePlan(p.op, p.ranks, p.size_bytes, p.algorithm) for p in
                  job.collectives)
    return replace(job, collectives=empty, start_ns=0, iterations=1, compute_ns=0,
                   declare_intent=False, sla_us=None)


def _discount(progress: Callable[[int, int], None], n: int) -> Callable[[int, int], None]:
    """``progress`` without the first ``n`` units (the idle stand-ins' collectives)."""
    def report(done: int, total: int) -> None:
        progress(max(done - n, 0), total - n)
    return report


def alone_prepared(prep: Prepared, job_name: str) -> Prepared:
    """``prep`` with every job but ``job_name`` replaced by an idle stand-in (see
    :func:`run_alone`). Raises ``KeyError`` for an unknown job."""
    names = [j.name for j in prep.jobs]
    if job_name not in names:
        raise KeyError(f"unknown job {job_name!r} (jobs: {', '.join(names)})")
    return replace(prep, jobs=[j if j.name == job_name else _idle(j) for j in prep.jobs])


def run_alone(
    prep: Prepared,
    policy: str,
    job_name: str,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run ``job_name`` alone under ``policy``: same scenario, seed, topology, placement,
    parameters and **mice**, without the other jobs.

    Mice are kept on purpose: they are the fabric's background (traffic no job owns), not a
    co-tenant, so "alone" means "without the other jobs" and an interference ratio measures
    what the other jobs cost a job, not what the background costs it.

    The other jobs are replaced by idle stand-ins (they send nothing and finish at time 0)
    rather than dropped, so that the job keeps its position in the job list: the engine
    identifies a job by position and ECMP hashes it into the source port, so dropping the
    others would move the job's connections to other paths and mix hash luck into the
    comparison. The result reports only ``job_name`` (its flows' ``owner`` is 0, its index in
    ``result.jobs``); ``progress`` counts only its collectives. With a single job this is
    exactly :func:`run_policy`.
    """
    solo = alone_prepared(prep, job_name)
    k = next(i for i, j in enumerate(prep.jobs) if j.name == job_name)
    n_idle = sum(len(j.collectives) for i, j in enumerate(solo.jobs) if i != k)
    report = None if progress is None else _discount(progress, n_idle)
    out, pol, wall = _simulate(solo, policy, report)
    flows = dict(out.flows)
    if flows:  # owner ids become indices into result.jobs (the job alone is 0; mice stay)
        owner = flows["owner"]
        flows["owner"] = np.where(owner == k, 0, owner)
    out = replace(out, flows=flows,
                  collectives=[c for c in out.collectives if c.job == job_name],
                  iterations=[i for i in out.iterations if i.job == job_name])
    return _result(solo, policy, out, pol, wall, [prep.jobs[k]])


def interference_ratio(busbw_alone: float, busbw_shared: float) -> float:
    """How much sharing the fabric slows a job: busbw alone / busbw shared, which is also
    communication time shared / time alone (the bus bytes are the same). 1.0 = unaffected,
    2.0 = its collectives take twice as long. A job with no busbw in either run (a
    one-GPU job, a job a fault stopped both times) has none: ``nan``, not 1.0 ("not
    slowed"); one that moves data alone but not shared gets ``inf``.

    >>> interference_ratio(200.0, 100.0)
    2.0
    >>> interference_ratio(50.0, 50.0)
    1.0
    >>> interference_ratio(0.0, 0.0), interference_ratio(10.0, 0.0)
    (nan, inf)
    """
    if busbw_shared > 0:
        return busbw_alone / busbw_shared
    return math.nan if busbw_alone <= 0 else math.inf


def interference(
    prep: Prepared,
    policy: str,
    shared: RunResult,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, float]:
    """Per job of ``prep``, its :func:`interference_ratio` under ``policy``: its busbw in
    :func:`run_alone` over its busbw in ``shared`` (the run of all jobs under ``policy``).

    Costs one extra run per job (a single job's alone run is its shared run, so its ratio is
    1.0). ``progress(job, done, total)`` reports each alone run. Deterministic for a given
    seed, like the runs themselves.
    """
    if shared.policy != policy:
        raise ValueError(f"shared run is of policy {shared.policy!r}, not {policy!r}")
    out: dict[str, float] = {}
    for job in prep.jobs:
        cb = None if progress is None else partial(progress, job.name)
        alone = run_alone(prep, policy, job.name, cb)
        out[job.name] = interference_ratio(alone.mean_busbw_GBps(job.name),
                                           shared.mean_busbw_GBps(job.name))
    return out
