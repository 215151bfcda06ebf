"""A training job as the engine runs it: GPUs, an iteration loop, and its collectives.

Every iteration is: a compute gap of ``compute_ns``, then the job's collectives one after the
other (each starts when the previous one has been delivered). The next iteration starts when
the last collective of this one ends, so iteration time = compute + exposed communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricpilot.workload.plan import CollectivePlan


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job: ``gpus`` are global GPU ids; ``collectives`` repeat every iteration."""

    name: str
    gpus: tuple[int, ...]
    collectives: tuple[CollectivePlan, ...]
    start_ns: int = 0
    iterations: int = 1
    compute_ns: int = 0
    traffic_class: str = "rdma"  # QoS class of the job's flows (rdma, tcp, control)
    declare_intent: bool = True  # the job declares its calls to the controller
    sla_us: float | None = None  # latency SLA of its calls (None: no SLA, level L3)
    priority: int = 0  # priority of its calls to the controller (0-7, higher first)

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"job {self.name}: iterations must be >= 1")
        if self.start_ns < 0 or self.compute_ns < 0:
            raise ValueError(f"job {self.name}: start_ns and compute_ns must be >= 0")
        if not self.collectives:
            raise ValueError(f"job {self.name}: needs at least one collective")

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)
