"""Jobs, placement, collective generators and mice: what the GPUs ask the fabric to carry."""

from fabricpilot.workload.collectives import (
    ALGORITHMS,
    MODES,
    LinkCosts,
    allreduce_estimates_ns,
    alltoall,
    broadcast,
    build_collective,
    hierarchical_allreduce,
    hierarchical_alltoall,
    host_matrix,
    rail_rings,
    rails_collective,
    ring_allgather,
    ring_allreduce,
    ring_reducescatter,
)
from fabricpilot.workload.mice import MiceArrivals, poisson_mice
from fabricpilot.workload.placement import POLICIES, PlacementError, place_gpus
from fabricpilot.workload.plan import CollectivePlan, Op, Stage, busbw_factor

__all__ = [
    "ALGORITHMS",
    "MODES",
    "POLICIES",
    "CollectivePlan",
    "LinkCosts",
    "MiceArrivals",
    "Op",
    "PlacementError",
    "Stage",
    "allreduce_estimates_ns",
    "alltoall",
    "broadcast",
    "build_collective",
    "busbw_factor",
    "hierarchical_allreduce",
    "hierarchical_alltoall",
    "host_matrix",
    "place_gpus",
    "poisson_mice",
    "rail_rings",
    "rails_collective",
    "ring_allgather",
    "ring_allreduce",
    "ring_reducescatter",
]
