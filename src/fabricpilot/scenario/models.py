"""Pydantic models of a scenario file: the cluster, the fabric, the jobs and the mice.

Every quantity key carries its unit in its name (``*_gbps``, ``*_ns``, ``*_bytes``). A value is
either a plain number, already in that unit, or a string with a unit of the same dimension
(``"400Gbps"``, ``"2ms"``, ``"256MiB"``) converted once, here, by
:func:`fabricpilot.units.parse_quantity`. Sizes and times end as ``int`` (rounded), rates as
``float``.

Checks that involve several fields raise :class:`FieldProblem`, a ``ValueError`` that carries the
path of the offending field relative to the model that raised it, so the loader can name it
exactly (``jobs[1].gpu_ids[3]``) in a :class:`~fabricpilot.errors.ScenarioError`.

>>> s = Scenario.model_validate({
...     "topology": {"kind": "leaf_spine", "hosts": 2, "nics_per_leaf": 2},
...     "jobs": [{"name": "a", "gpus": 16,
...               "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}],
... })
>>> s.topology.n_gpus, s.jobs[0].collectives[0].size_bytes
(16, 1048576)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fabricpilot.units import UnitError, parse_quantity

__all__ = [
    "Algorithm",
    "CollectiveMode",
    "CollectiveOp",
    "CollectiveSpec",
    "EcmpSpec",
    "FabricSpec",
    "FieldProblem",
    "JobSpec",
    "MiceSpec",
    "Placement",
    "Scenario",
    "TopologyKind",
    "TopologySpec",
]

TopologyKind = Literal["leaf_spine", "fat_tree", "file"]
Placement = Literal["contiguous", "random", "explicit"]
CollectiveOp = Literal["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]
Algorithm = Literal["auto", "ring", "hierarchical", "flat"]
CollectiveMode = Literal["stream", "steps"]


class FieldProblem(ValueError):
    """A validation failure that names its field, relative to the model that raised it.

    ``field`` is a path such as ``"gpu_ids[3]"`` or ``"jobs[1].name"``; the loader prefixes
    the location of the model and turns it into a ``ScenarioError``.

    >>> str(FieldProblem("gpu_ids[3]", "GPU 5 listed twice"))
    'gpu_ids[3]: GPU 5 listed twice'
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


# --- quantity and integer coercion -----------------------------------------------------------

_DIMENSION_OF_SUFFIX = {"_gbps": "rate", "_ns": "time", "_bytes": "size"}


def _dimension(field_name: str) -> str:
    """The dimension a key's unit suffix names (``rate_gbps`` → ``"rate"``)."""
    for suffix, dimension in _DIMENSION_OF_SUFFIX.items():
        if field_name.endswith(suffix):
            return dimension
    raise AssertionError(f"{field_name} carries no unit suffix")  # a bug in this module


def _convert_quantity(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """Parse ``value`` in the unit its key names; sizes and times become rounded ``int``."""
    if value is None:
        return value
    assert info.field_name is not None
    dimension = _dimension(info.field_name)
    number = parse_quantity(value, dimension)
    if not math.isfinite(number):
        raise UnitError(f"expected a finite {dimension}, got {value!r}")
    return number if dimension == "rate" else round(number)


def _reject_bool(value: Any) -> Any:
    """Refuse ``true``/``false`` where a number is expected (pydantic would read them as 1/0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got a boolean ({str(value).lower()})")
    return value


Int = Annotated[int, BeforeValidator(_reject_bool)]
"""An ``int`` that does not silently accept booleans."""


class _Model(BaseModel):
    """Base of every scenario model: unknown keys rejected, instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- topology -------------------------------------------------------------------------------

_LEAF_SPINE_ONLY = ("hosts", "nics_per_leaf", "oversubscription")
_FAT_TREE_ONLY = ("k",)
_FILE_ONLY = ("path",)


class TopologySpec(_Model):
    """The physical cluster: a built-in CLOS shape, or a topology JSON file."""

    kind: TopologyKind = Field(description="leaf_spine, fat_tree, or file (a topology JSON)")
    hosts: Int | None = Field(default=None, gt=0, description="leaf_spine: number of hosts")
    gpus_per_host: Int = Field(default=8, ge=1, description="GPUs (and NICs) per host")
    nics_per_leaf: Int = Field(default=16, gt=0, description="leaf_spine: downlinks per leaf")
    oversubscription: float = Field(
        default=1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="leaf_spine: leaf downlink:uplink ratio; spines = nics_per_leaf / this",
    )
    k: Int | None = Field(default=None, description="fat_tree: switch radix (even, >= 2)")
    rail_optimized: bool = Field(
        default=True, description="GPU i of every host attaches to the rail-i leaves"
    )
    nic_rate_gbps: float = Field(default=400.0, gt=0, description="host NIC rate")
    fabric_rate_gbps: float = Field(default=400.0, gt=0, description="switch-to-switch rate")
    nvlink_rate_gbps: float = Field(default=3600.0, gt=0, description="intra-host GPU-GPU rate")
    link_delay_ns: int = Field(default=100, ge=0, description="propagation per fabric link")
    nvlink_delay_ns: int = Field(default=50, ge=0, description="intra-host hop latency")
    path: str | None = Field(
        default=None,
        min_length=1,
        description="file: topology JSON, relative to the scenario file's directory",
    )

    _quantities = field_validator(
        "nic_rate_gbps",
        "fabric_rate_gbps",
        "nvlink_rate_gbps",
        "link_delay_ns",
        "nvlink_delay_ns",
        mode="before",
    )(_convert_quantity)

    @field_validator("k")
    @classmethod
    def _k_even(cls, k: int | None) -> int | None:
        if k is not None and (k < 2 or k % 2):
            raise ValueError(f"must be an even number >= 2 (got {k})")
        return k

    @model_validator(mode="after")
    def _check_shape(self) -> TopologySpec:
        """Each kind has its own required keys, and the keys of other kinds are refused."""
        own = {"leaf_spine": _LEAF_SPINE_ONLY, "fat_tree": _FAT_TREE_ONLY, "file": _FILE_ONLY}
        for kind, keys in own.items():
            if kind == self.kind:
                continue
            for key in keys:
                if key in self.model_fields_set and getattr(self, key) is not None:
                    raise FieldProblem(key, f"only valid for kind {kind}")
        if self.kind == "leaf_spine":
            self._check_leaf_spine()
        elif self.kind == "fat_tree":
            self._check_fat_tree()
        elif self.path is None:
            raise FieldProblem("path", "required for kind file")
        return self

    def _check_leaf_spine(self) -> None:
        if self.hosts is None:
            raise FieldProblem("hosts", "required for kind leaf_spine")
        hosts, per_host, per_leaf = self.hosts, self.gpus_per_host, self.nics_per_leaf
        if self.rail_optimized:
            if hosts % per_leaf:
                raise FieldProblem(
                    "hosts",
                    f"a rail-optimised leaf-spine needs hosts to be a multiple of "
                    f"nics_per_leaf ({hosts} hosts, {per_leaf} NICs per leaf)",
                )
        else:
            if per_leaf % per_host:
                raise FieldProblem(
                    "nics_per_leaf",
                    f"must be a multiple of gpus_per_host so whole hosts fit under a leaf "
                    f"({per_leaf} NICs per leaf, {per_host} GPUs per host)",
                )
            if (hosts * per_host) % per_leaf:
                raise FieldProblem(
                    "hosts",
                    f"{hosts} hosts x {per_host} GPUs = {hosts * per_host} NICs do not fill "
                    f"whole leaves of {per_leaf}",
                )
        spines = per_leaf / self.oversubscription
        if abs(spines - round(spines)) > 1e-9 or round(spines) < 1:
            raise FieldProblem(
                "oversubscription",
                f"nics_per_leaf / oversubscription = {per_leaf} / {self.oversubscription:g} "
                f"must be a whole number (>= 1) of spine uplinks",
            )

    def _check_fat_tree(self) -> None:
        if self.k is None:
            raise FieldProblem("k", "required for kind fat_tree")
        n_nics = self.k**3 // 4
        if n_nics % self.gpus_per_host:
            raise FieldProblem(
                "gpus_per_host",
                f"a k={self.k} fat tree has {n_nics} NICs, not divisible into hosts of "
                f"{self.gpus_per_host}",
            )
        if self.rail_optimized and (self.k // 2) % self.gpus_per_host:
            raise FieldProblem(
                "gpus_per_host",
                f"a rail-optimised k={self.k} fat tree needs k/2 = {self.k // 2} (edge switches "
                f"per pod) to be a multiple of gpus_per_host ({self.gpus_per_host}); "
                f"set rail_optimized: false or change k",
            )

    @property
    def n_gpus(self) -> int | None:
        """GPUs in the cluster (one NIC each); ``None`` for a file topology."""
        if self.kind == "leaf_spine":
            assert self.hosts is not None
            return self.hosts * self.gpus_per_host
        if self.kind == "fat_tree":
            assert self.k is not None
            return self.k**3 // 4
        return None

    @property
    def n_hosts(self) -> int | None:
        """Hosts in the cluster; ``None`` for a file topology."""
        n_gpus = self.n_gpus
        return None if n_gpus is None else n_gpus // self.gpus_per_host

    @property
    def n_leaves(self) -> int | None:
        """Leaf switches of a leaf-spine (``None`` for other kinds)."""
        if self.kind != "leaf_spine":
            return None
        assert self.hosts is not None
        return self.hosts * self.gpus_per_host // self.nics_per_leaf

    @property
    def n_spines(self) -> int | None:
        """Spine switches of a leaf-spine = uplinks per leaf (``None`` for other kinds)."""
        if self.kind != "leaf_spine":
            return None
        return round(self.nics_per_leaf / self.oversubscription)


# --- fabric and load balancing --------------------------------------------------------------


class FabricSpec(_Model):
    """How the data plane is modelled, and the per-packet costs it accounts for."""

    model: Literal["flow"] = Field(default="flow", description="rate model (max-min flow level)")
    mtu_bytes: int = Field(default=4096, gt=0, description="RDMA payload per packet")
    header_bytes: int = Field(default=58, ge=0, description="RoCEv2 headers incl. FCS")
    wire_overhead_bytes: int = Field(default=20, ge=0, description="preamble + inter-frame gap")
    switch_latency_ns: int = Field(default=600, ge=0, description="per switch traversal")
    nic_latency_ns: int = Field(
        default=1000, ge=0, description="per message: NIC and collective-library step cost"
    )
    completion_tolerance: float = Field(
        default=1e-3,
        ge=0,
        le=0.05,
        allow_inf_nan=False,
        description="flows this close (fraction of their running time) to finishing complete "
        "together with the earliest one: fewer rate updates, FCT error at most this fraction",
    )

    _quantities = field_validator(
        "mtu_bytes",
        "header_bytes",
        "wire_overhead_bytes",
        "switch_latency_ns",
        "nic_latency_ns",
        mode="before",
    )(_convert_quantity)

    @property
    def payload_efficiency(self) -> float:
        """Payload share of the wire: ``mtu / (mtu + headers + preamble/IFG)``.

        >>> round(FabricSpec().payload_efficiency, 4)
        0.9813
        """
        return self.mtu_bytes / (self.mtu_bytes + self.header_bytes + self.wire_overhead_bytes)


class EcmpSpec(_Model):
    """Static ECMP hashing parameters."""

    qps_per_connection: Int = Field(
        default=1, ge=1, description="queue pairs (distinct 5-tuples) per GPU-pair connection"
    )
    source_port_entropy: bool = Field(
        default=True, description="each QP uses its own UDP source port (hash entropy)"
    )
    per_switch_seed: bool = Field(
        default=False, description="each switch hashes with its own seed (no polarisation)"
    )


# --- jobs -----------------------------------------------------------------------------------


class CollectiveSpec(_Model):
    """One collective a job runs every iteration.

    ``size_bytes`` counts as nccl-tests does: bytes per rank for allreduce and alltoall, total
    bytes for allgather and reducescatter, the message for broadcast.
    """

    op: CollectiveOp = Field(description="NCCL operation")
    size_bytes: int = Field(gt=0, description="message size (nccl-tests convention)")
    algorithm: Algorithm = Field(default="auto", description="auto, ring, hierarchical, flat")
    mode: CollectiveMode = Field(
        default="stream", description="stream: pipelined streams; steps: synchronised steps"
    )
    root: Int = Field(default=0, ge=0, description="root rank (broadcast), 0..gpus-1")

    _quantities = field_validator("size_bytes", mode="before")(_convert_quantity)


class JobSpec(_Model):
    """A training job: where its GPUs are and the collectives of each iteration."""

    name: str = Field(min_length=1, description="unique job name")
    gpus: Int = Field(gt=0, description="number of GPUs (ranks)")
    placement: Placement = Field(
        default="contiguous", description="contiguous, random, or explicit (gpu_ids)"
    )
    gpu_ids: list[Annotated[Int, Field(ge=0)]] | None = Field(
        default=None, description="placement explicit: the global GPU ids, rank order"
    )
    start_ns: int = Field(default=0, ge=0, description="when the first iteration starts")
    iterations: Int = Field(default=1, ge=1, description="training iterations to simulate")
    compute_ns: int = Field(
        default=0, ge=0, description="compute gap before the collectives of each iteration"
    )
    declare_intent: bool = Field(
        default=True, description="the job declares its collectives to the controller"
    )
    collectives: list[CollectiveSpec] = Field(
        min_length=1, description="run in order, every iteration"
    )

    _quantities = field_validator("start_ns", "compute_ns", mode="before")(_convert_quantity)

    @model_validator(mode="after")
    def _check_job(self) -> JobSpec:
        """Explicit placement needs exactly ``gpus`` distinct ids; roots must be ranks."""
        if self.placement == "explicit":
            if self.gpu_ids is None:
                raise FieldProblem("gpu_ids", "required when placement is explicit")
            if len(self.gpu_ids) != self.gpus:
                raise FieldProblem(
                    "gpu_ids", f"lists {len(self.gpu_ids)} GPUs but gpus is {self.gpus}"
                )
            first_at: dict[int, int] = {}
            for i, gpu in enumerate(self.gpu_ids):
                if gpu in first_at:
                    raise FieldProblem(
                        f"gpu_ids[{i}]", f"GPU {gpu} listed twice (first at index {first_at[gpu]})"
                    )
                first_at[gpu] = i
        elif self.gpu_ids is not None:
            raise FieldProblem(
                "gpu_ids",
                f"only valid when placement is explicit (placement is {self.placement})",
            )
        for i, collective in enumerate(self.collectives):
            if collective.root >= self.gpus:
                raise FieldProblem(
                    f"collectives[{i}].root",
                    f"root rank {collective.root} is not a rank of this job "
                    f"(ranks 0..{self.gpus - 1})",
                )
        return self


class MiceSpec(_Model):
    """Background small flows (control, metadata): Poisson arrivals between random GPU pairs."""

    rate_per_s: float = Field(gt=0, allow_inf_nan=False, description="new flows per second")
    size_bytes: int = Field(default=16384, gt=0, description="bytes per flow")
    start_ns: int = Field(default=0, ge=0, description="first arrival not before")
    duration_ns: int = Field(gt=0, description="arrivals during [start, start + duration)")
    gpus: Literal["all"] | list[int] = Field(
        default="all", description="'all' or the GPU ids mice run between"
    )

    _quantities = field_validator("size_bytes", "start_ns", "duration_ns", mode="before")(
        _convert_quantity
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _check_gpus(cls, value: Any) -> Any:
        """``"all"`` or at least two distinct GPU ids >= 0 (validated here to name the index)."""
        if value == "all":
            return value
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be 'all' or a list of GPU ids (got {value!r})")
        first_at: dict[int, int] = {}
        for i, gpu in enumerate(value):
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                raise FieldProblem(f"[{i}]", f"must be an integer GPU id (got {gpu!r})")
            if gpu < 0:
                raise FieldProblem(f"[{i}]", f"must be >= 0 (got {gpu})")
            if gpu in first_at:
                raise FieldProblem(
                    f"[{i}]", f"GPU {gpu} listed twice (first at index {first_at[gpu]})"
                )
            first_at[gpu] = i
        if len(value) < 2:
            raise ValueError("mice need at least 2 GPUs to send between")
        return list(value)


# --- the scenario ---------------------------------------------------------------------------


class Scenario(_Model):
    """A whole scenario file: one cluster, its jobs, and the policies to compare on it."""

    name: str = Field(default="scenario", min_length=1, description="shown in reports")
    description: str = Field(default="", description="free text")
    seed: Int = Field(default=1, ge=0, description="seed of every random choice")
    policies: list[str] = Field(
        default_factory=lambda: ["ecmp", "ideal"],
        min_length=1,
        description="routing policies to compare (names from the balancing registry)",
    )
    topology: TopologySpec
    fabric: FabricSpec = Field(default_factory=FabricSpec)
    ecmp: EcmpSpec = Field(default_factory=EcmpSpec)
    jobs: list[JobSpec] = Field(min_length=1, description="training jobs sharing the fabric")
    mice: MiceSpec | None = Field(default=None, description="optional background small flows")

    @field_validator("policies")
    @classmethod
    def _check_policies(cls, policies: list[str]) -> list[str]:
        seen: set[str] = set()
        for i, policy in enumerate(policies):
            if not policy.strip():
                raise FieldProblem(f"[{i}]", "must be a non-empty policy name")
            if policy in seen:
                raise FieldProblem(f"[{i}]", f"policy {policy!r} listed twice")
            seen.add(policy)
        return policies

    @model_validator(mode="after")
    def _check_cross(self) -> Scenario:
        """Job names unique; jobs and mice fit the cluster; explicit GPUs not shared."""
        names: dict[str, int] = {}
        for i, job in enumerate(self.jobs):
            if job.name in names:
                raise FieldProblem(
                    f"jobs[{i}].name",
                    f"duplicate job name {job.name!r} (also jobs[{names[job.name]}].name)",
                )
            names[job.name] = i
        n_gpus = self.topology.n_gpus
        if n_gpus is not None:
            check_fits(self, n_gpus)
        else:
            _check_overlap(self)
        return self


def _explicit_ids(scenario: Scenario) -> Iterator[tuple[int, int, int]]:
    """``(job index, position, gpu)`` of every explicitly placed GPU."""
    for j, job in enumerate(scenario.jobs):
        for i, gpu in enumerate(job.gpu_ids or ()):
            yield j, i, gpu


def _check_overlap(scenario: Scenario) -> None:
    owner: dict[int, int] = {}
    for j, i, gpu in _explicit_ids(scenario):
        if gpu in owner and owner[gpu] != j:
            other = owner[gpu]
            raise FieldProblem(
                f"jobs[{j}].gpu_ids[{i}]",
                f"GPU {gpu} is already used by job {scenario.jobs[other].name!r} (jobs[{other}])",
            )
        owner[gpu] = j


def check_fits(scenario: Scenario, n_gpus: int) -> None:
    """Raise :class:`FieldProblem` unless the jobs and mice fit a cluster of ``n_gpus`` GPUs.

    Run by :class:`Scenario` for built-in topologies; call it for a file topology once the
    file is built and its GPU count known. Field paths are relative to the scenario root.
    """
    last = n_gpus - 1
    for j, job in enumerate(scenario.jobs):
        if job.gpus > n_gpus:
            raise FieldProblem(
                f"jobs[{j}].gpus", f"job needs {job.gpus} GPUs but the cluster has {n_gpus}"
            )
    for j, i, gpu in _explicit_ids(scenario):
        if gpu > last:
            raise FieldProblem(
                f"jobs[{j}].gpu_ids[{i}]",
                f"GPU {gpu} is outside the cluster (GPU ids 0..{last})",
            )
    _check_overlap(scenario)
    total = sum(job.gpus for job in scenario.jobs)
    if total > n_gpus:
        raise FieldProblem("jobs", f"jobs need {total} GPUs but the cluster has {n_gpus}")
    mice = scenario.mice
    if mice is not None and mice.gpus != "all":
        for i, gpu in enumerate(mice.gpus):
            if gpu > last:
                raise FieldProblem(
                    f"mice.gpus[{i}]", f"GPU {gpu} is outside the cluster (GPU ids 0..{last})"
                )
