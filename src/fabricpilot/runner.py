"""Assemble a run: scenario -> topology + workload -> engine under a policy -> results.

:func:`prepare` does everything that does not depend on the routing policy (build and compile
the topology, place the jobs, generate their collectives and the mice) once; :func:`run_policy`
runs the engine on it under one policy. Several policies on one scenario share the prepared
workload, so they see exactly the same GPUs, collectives and mice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fabricpilot.balancing import EcmpParams, PolicyContext, make_policy
from fabricpilot.balancing.base import POLICIES, AdaptiveParams
from fabricpilot.dataplane import RATE_MODELS, Engine, FabricParams, make_rate_model
from fabricpilot.dataplane.qos import mapping_mismatches
from fabricpilot.errors import ScenarioError, TopologyError
from fabricpilot.results import RunResult
from fabricpilot.scenario import Scenario, check_gpu_count
from fabricpilot.topology import CompiledTopology, Topology, build_topology, compile_topology
from fabricpilot.topology.io import load_topology_json
from fabricpilot.workload.collectives import build_collective
from fabricpilot.workload.jobs import JobSpec
from fabricpilot.workload.mice import MiceArrivals, poisson_mice
from fabricpilot.workload.placement import PlacementError, place_gpus


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
    qos_mismatches: list[str] = field(default_factory=list)


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


def prepare(scenario: Scenario, source: str = "<scenario>") -> Prepared:
    """Build the topology and the workload of ``scenario`` (independent of the policy)."""
    topo = build_scenario_topology(scenario, source)
    try:
        ct = compile_topology(topo)
    except TopologyError as err:
        raise ScenarioError(source, "topology", str(err)) from None
    check_gpu_count(scenario, ct.n_gpus, source)
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
                                f"unknown switch ({_switch_examples(switches)})")
    qos_params = qos.to_params()

    rng = np.random.default_rng([scenario.seed, 1])
    free = np.ones(ct.n_gpus, bool)
    placed: dict[int, np.ndarray] = {}
    # explicit placements reserve their GPUs first, then contiguous blocks, then random picks
    rank = {"explicit": 0, "contiguous": 1, "random": 2}
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

    jobs: list[JobSpec] = []
    g = topo.gpus_per_host
    for i, job in enumerate(scenario.jobs):
        plans = []
        for c, coll in enumerate(job.collectives):
            try:
                plans.append(build_collective(coll.op, placed[i], coll.size_bytes,
                                              gpus_per_host=g, algorithm=coll.algorithm,
                                              mode=coll.mode, root=coll.root))
            except ValueError as err:
                raise ScenarioError(source, f"jobs[{i}].collectives[{c}]", str(err)) from None
        jobs.append(JobSpec(job.name, tuple(int(x) for x in placed[i]), tuple(plans),
                            start_ns=job.start_ns, iterations=job.iterations,
                            compute_ns=job.compute_ns, traffic_class=job.traffic_class,
                            declare_intent=job.declare_intent, sla_us=job.sla_us))

    mice = None
    if scenario.mice is not None:
        m = scenario.mice
        gpus = np.arange(ct.n_gpus) if m.gpus == "all" else np.asarray(m.gpus, np.int64)
        mice = poisson_mice(gpus, rate_per_s=m.rate_per_s, size_bytes=m.size_bytes,
                            start_ns=m.start_ns, duration_ns=m.duration_ns,
                            rng=np.random.default_rng([scenario.seed, 2]))
    f = scenario.fabric
    fabric = FabricParams(mtu_bytes=f.mtu_bytes, header_bytes=f.header_bytes,
                          wire_overhead_bytes=f.wire_overhead_bytes,
                          switch_latency_ns=f.switch_latency_ns, nic_latency_ns=f.nic_latency_ns)
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
                    qos_mismatches=mapping_mismatches(qos_params, switches) if switches else [])


def _switch_examples(switches: list[str]) -> str:
    """``switches are e.g. leaf0, spine0``: the first switch of every kind (name prefix)."""
    if not switches:
        return "the topology has no switches"
    first: dict[str, str] = {}
    for name in switches:
        first.setdefault(name.rstrip("0123456789_"), name)
    return f"switches are e.g. {', '.join(list(first.values())[:4])}"


FLUID_ONLY_SETTINGS = ("ecn", "dcqcn", "pfc", "fluid", "qos")


def config_warnings(scenario: Scenario, prep: Prepared) -> list[str]:
    """Problems that do not stop a run, as ``FIELD: MESSAGE`` lines: QoS mapping mismatches
    between switches, and fluid-model settings given to the flow model (which ignores them)."""
    lines = [f"fabric.qos: {m}" for m in qos_warnings(prep)]
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


def run_policy(
    prep: Prepared,
    policy: str,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run the prepared scenario under ``policy``; wall time is measured here."""
    model = make_rate_model(prep.rate_model, prep.topology, prep.fabric, **prep.model_params)
    ctx = PolicyContext(prep.topology, prep.seed, prep.fabric.switch_latency_ns, prep.ecmp,
                        member_routes=model.needs_paths, adaptive=prep.adaptive)
    pol = make_policy(policy, ctx)
    attach = getattr(pol, "attach_jobs", None)
    if attach is not None:  # a controller-driven policy: the jobs declare themselves
        attach(prep.jobs)
    engine = Engine(prep.topology, pol, prep.jobs, fabric=prep.fabric,
                    mice=prep.mice, rate_model=model, batch_rel_eps=prep.completion_tolerance,
                    progress=progress, mice_class=prep.mice_class)
    t0 = time.perf_counter()
    out = engine.run()
    wall = time.perf_counter() - t0
    result = RunResult.from_engine(out, policy=policy, seed=prep.seed,
                                   scenario=prep.name, topology=prep.topology,
                                   jobs=prep.jobs, wall_time_s=wall, model=prep.rate_model,
                                   qos_mismatches=prep.qos_mismatches)
    report = getattr(pol, "report", None)
    if report is not None:  # e.g. SLAs no path could meet
        result.sla_unmet = list(report())
    return result
