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
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fabricpilot.controller.params import ControllerParams
from fabricpilot.dataplane.params import DcqcnParams, EcnParams, FluidParams, PfcParams
from fabricpilot.dataplane.qos import N_PRIORITIES, TRAFFIC_CLASSES, QosParams
from fabricpilot.faults.model import FaultParams
from fabricpilot.topology.builders import MAX_GPUS, MAX_SPINES, decimal_fraction
from fabricpilot.units import MAX_RATE_GBPS, MIN_RATE_GBPS, UnitError, parse_quantity

__all__ = [
    "Algorithm",
    "CollectiveMode",
    "CollectiveOp",
    "CollectiveSpec",
    "DcqcnSpec",
    "DebounceSpec",
    "EcmpSpec",
    "EcnSpec",
    "FabricSpec",
    "FaultEventSpec",
    "FaultsSpec",
    "FieldProblem",
    "FluidSpec",
    "JobSpec",
    "MiceSpec",
    "NoiseSpec",
    "PfcSpec",
    "Placement",
    "QosSpec",
    "RandomFaultsSpec",
    "Scenario",
    "TopologyKind",
    "TopologySpec",
    "TrafficClass",
]

TopologyKind = Literal["leaf_spine", "fat_tree", "file"]
Placement = Literal["contiguous", "random", "shuffled", "explicit"]
CollectiveOp = Literal["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]
Algorithm = Literal["auto", "ring", "rails", "hierarchical", "tree", "flat"]
CollectiveMode = Literal["stream", "steps"]
TrafficClass = Literal["rdma", "tcp", "control"]
RateModelName = Literal["flow", "fluid"]
FaultKind = Literal["link_down", "link_up", "switch_down", "flap", "gray"]


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
_DIMENSION_OF_INFIX = {"_bytes_per_": "size"}  # buffer_bytes_per_port: a size, per port


def _dimension(field_name: str) -> str:
    """The dimension a key's unit names (``rate_gbps`` → ``"rate"``; ``buffer_bytes_per_port``
    → ``"size"``)."""
    for infix, dimension in _DIMENSION_OF_INFIX.items():
        if infix in field_name:
            return dimension
    for suffix, dimension in _DIMENSION_OF_SUFFIX.items():
        if field_name.endswith(suffix):
            return dimension
    raise AssertionError(f"{field_name} carries no unit suffix")  # a bug in this module


def _convert_quantity(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """Parse ``value`` in the unit its key names; sizes must be whole bytes and times whole
    nanoseconds (``int``; within 1e-6 ns of one: ``0.1us`` is 100 ns)."""
    if value is None:
        return value
    assert info.field_name is not None
    dimension = _dimension(info.field_name)
    number = parse_quantity(value, dimension)
    if not math.isfinite(number):
        raise UnitError(f"expected a finite {dimension}, got {value!r}")
    top, name = _LARGEST[dimension]
    if abs(number) > top:
        raise UnitError(f"{value!r} is beyond the largest {dimension} a scenario takes ({name})")
    if dimension == "rate" and 0 < abs(number) < _SMALLEST_RATE_GBPS:
        raise UnitError(f"{value!r} is below the smallest rate a scenario takes (1 Mbps)")
    if dimension == "size" and number != round(number):  # (a time rounds to the ns)
        shown = "" if isinstance(value, int | float) else f" ({number:g} bytes)"
        raise UnitError(f"expected a whole number of bytes, got {value!r}{shown}")
    if dimension == "time" and abs(number - round(number)) > 1e-6:
        shown = "" if isinstance(value, int | float) else f" ({number:g} ns)"
        raise UnitError(f"expected a whole number of nanoseconds, got {value!r}{shown}")
    return number if dimension == "rate" else round(number)


def _convert_us(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A time in microseconds (``sla_us``): a number, or a number as text, is microseconds;
    text with a time unit is read in that unit (``"50us"``, ``"0.1ms"``: 50 and 100).

    >>> _convert_us(None, "0.1ms", None), _convert_us(None, "50", None), _convert_us(None, 7, None)
    (100.0, 50.0, 7)
    """
    if not isinstance(value, str):
        return value  # (a number, or what the field's own checks refuse)
    try:
        return float(value)
    except ValueError:
        return parse_quantity(value.strip(), "time") / 1000.0


# the largest quantities a scenario takes (fabric times, sizes and rates far beyond any
# cluster's, and within the engine's 64-bit integers and float precision)
_SMALLEST_RATE_GBPS = MIN_RATE_GBPS  # (1 PiB at 1 Mb/s still ends within the ns clock)

_LARGEST: dict[str, tuple[float, str]] = {
    "time": (1e15, "1e15 ns, 11.6 days"),
    "size": (float(1 << 50), "1 PiB"),
    "rate": (MAX_RATE_GBPS, "1e6 Gbps"),
}


def _n(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one.

    >>> _n(1, "host"), _n(16, "NIC")
    ('1 host', '16 NICs')
    """
    return f"{count} {noun}{'s' * (count != 1)}"


def _reject_bool(value: Any) -> Any:
    """Refuse ``true``/``false`` where a number is expected (pydantic would read them as 1/0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got a boolean ({str(value).lower()})")
    return value


def _reject_bool_or_text(value: Any) -> Any:
    """:func:`_reject_bool`, and refuse text where a plain count is expected (pydantic would
    read ``"4"`` as 4); a key with a unit takes text (``"1.5us"``), converted before this."""
    if isinstance(value, str):
        raise ValueError(f"must be an integer (got {value!r})")
    return _reject_bool(value)


def _reject_bool_or_text_number(value: Any) -> Any:
    """:func:`_reject_bool`, and refuse text where a plain number is expected (pydantic
    would read ``"2"`` as 2.0, as an integer key would not); a key with a unit takes text
    (``"1.5us"``), converted before this."""
    if isinstance(value, str):
        raise ValueError(f"must be a number (got {value!r})")
    return _reject_bool(value)


Int = Annotated[int, BeforeValidator(_reject_bool_or_text)]
"""An ``int`` that does not silently accept booleans or text."""
Float = Annotated[float, BeforeValidator(_reject_bool_or_text_number)]
"""A ``float`` that does not silently accept booleans or text."""


class _Model(BaseModel):
    """Base of every scenario model: unknown keys rejected, instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- topology -------------------------------------------------------------------------------

_LEAF_SPINE_ONLY = ("hosts", "nics_per_leaf", "oversubscription")
_FAT_TREE_ONLY = ("k",)
_FILE_ONLY = ("path",)
# what a built-in shape is built with (a topology file carries its own)
_BUILT_ONLY = ("gpus_per_host", "rail_optimized", "nic_rate_gbps", "fabric_rate_gbps",
               "nvlink_rate_gbps", "link_delay_ns", "nvlink_delay_ns")


class TopologySpec(_Model):
    """The physical cluster: a built-in CLOS shape, or a topology JSON file."""

    kind: TopologyKind = Field(description="leaf_spine, fat_tree, or file (a topology JSON)")
    hosts: Int | None = Field(default=None, gt=0, description="leaf_spine: number of hosts")
    gpus_per_host: Int = Field(default=8, ge=1, description="GPUs (and NICs) per host")
    nics_per_leaf: Int = Field(default=16, gt=0, description="leaf_spine: downlinks per leaf")
    oversubscription: Float = Field(
        default=1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="leaf_spine: leaf downlink:uplink capacity ratio; spines = "
        "nics_per_leaf x nic_rate / (this x fabric_rate)",
    )
    k: Int | None = Field(default=None, description="fat_tree: switch radix (even, >= 2)")
    rail_optimized: StrictBool = Field(
        default=True, description="GPU i of every host attaches to the rail-i leaves"
    )
    nic_rate_gbps: Float = Field(default=400.0, gt=0, description="host NIC rate")
    fabric_rate_gbps: Float = Field(default=400.0, gt=0, description="switch-to-switch rate")
    nvlink_rate_gbps: Float = Field(default=3600.0, gt=0, description="intra-host GPU-GPU rate")
    link_delay_ns: int = Field(default=100, ge=0, description="propagation per NIC and fabric link")
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
        if self.kind == "file":
            for key in _BUILT_ONLY:
                if key in self.model_fields_set:
                    raise FieldProblem(key, "not for kind file: the topology file gives "
                                       "its GPUs, rates and delays")
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
                    f"nics_per_leaf ({_n(hosts, 'host')}, {_n(per_leaf, 'NIC')} per leaf)",
                )
        else:
            if per_leaf % per_host:
                raise FieldProblem(
                    "nics_per_leaf",
                    f"must be a multiple of gpus_per_host so whole hosts fit under a leaf "
                    f"({_n(per_leaf, 'NIC')} per leaf, {_n(per_host, 'GPU')} per host)",
                )
            if (hosts * per_host) % per_leaf:
                raise FieldProblem(
                    "hosts",
                    f"{_n(hosts, 'host')} x {_n(per_host, 'GPU')} = {hosts * per_host} NICs "
                    f"do not fill whole leaves of {per_leaf}",
                )
        # (as written: 16 ports at 1.6 : 1 make 10 uplinks, though 16 / 1.6 is not 10.0)
        over = decimal_fraction(self.oversubscription)
        n_spines_q = (per_leaf * decimal_fraction(self.nic_rate_gbps)
                      / (over * decimal_fraction(self.fabric_rate_gbps)))
        if self.nic_rate_gbps == self.fabric_rate_gbps and (
                n_spines_q.denominator != 1 or n_spines_q < 1):
            raise FieldProblem(
                "oversubscription",
                f"nics_per_leaf / oversubscription = {per_leaf} / {self.oversubscription:g} "
                f"must be a whole number (>= 1) of spine uplinks",
            )
        if hosts * per_host > MAX_GPUS:
            raise FieldProblem("hosts", f"{_n(hosts, 'host')} x {_n(per_host, 'GPU')} = "
                                        f"{hosts * per_host} GPUs; at most {MAX_GPUS}")
        n_spines = float(n_spines_q)
        if n_spines_q.denominator != 1 or n_spines_q < 1:
            raise FieldProblem(
                "fabric_rate_gbps",
                f"nics_per_leaf x nic_rate / (oversubscription x fabric_rate) = "
                f"{per_leaf} x {self.nic_rate_gbps:g} / ({self.oversubscription:g} x "
                f"{self.fabric_rate_gbps:g}) = {n_spines:.6g} must be a whole number (>= 1) "
                f"of spines")
        if n_spines > MAX_SPINES:
            raise FieldProblem(
                "fabric_rate_gbps",
                f"nics_per_leaf x nic_rate / (oversubscription x fabric_rate) = {n_spines:.3g} "
                f"spines; at most {MAX_SPINES}")

    def _check_fat_tree(self) -> None:
        if self.k is None:
            raise FieldProblem("k", "required for kind fat_tree")
        n_nics = self.k**3 // 4
        if n_nics > MAX_GPUS:
            raise FieldProblem("k", f"a fat-tree of k = {self.k} has k^3/4 = {n_nics} NICs; "
                                    f"at most {MAX_GPUS}")
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
        """Spine switches of a leaf-spine = uplinks per leaf, the leaf's downlink capacity
        over the oversubscription and the uplink rate (``None`` for other kinds)."""
        if self.kind != "leaf_spine":
            return None
        return round(self.nics_per_leaf * self.nic_rate_gbps
                     / (self.oversubscription * self.fabric_rate_gbps))


# --- fabric: the fluid model's ECN, DCQCN, PFC, clock and QoS ------------------------------
#
# Each spec mirrors a dataplane dataclass field by field and takes its defaults from it (one
# source of truth); ``to_params()`` builds the dataclass.

_ECN = EcnParams()
_DCQCN = DcqcnParams()
_PFC = PfcParams()
_FLUID = FluidParams()
_QOS = QosParams()

_CLASSES = ", ".join(TRAFFIC_CLASSES)
_MAX_DSCP = 63
_MAX_PRIORITY = N_PRIORITIES - 1


def _kib(n: int) -> str:
    return f"{n} B ({n / 1024:g} KiB)"


class EcnSpec(_Model):
    """RED-style ECN marking at switch egress queues (fluid model)."""

    kmin_bytes: int = Field(
        default=_ECN.kmin_bytes, ge=0, description="queue below which nothing is marked"
    )
    kmax_bytes: int = Field(
        default=_ECN.kmax_bytes, ge=0, description="queue at which marking reaches pmax; "
        "every packet is marked above it"
    )
    pmax: Float = Field(
        default=_ECN.pmax, gt=0, le=1, allow_inf_nan=False,
        description="marking probability at kmax (0 < pmax <= 1)",
    )
    reference_gbps: Float | None = Field(
        default=_ECN.reference_gbps, gt=0, allow_inf_nan=False,
        description="the port rate kmin / kmax are given for: each port's then scale with "
        "its rate (40: the paper's values, x10 at 400 Gbps); null (default): the same on "
        "every port",
    )

    _quantities = field_validator("kmin_bytes", "kmax_bytes", "reference_gbps",
                                  mode="before")(_convert_quantity)

    @model_validator(mode="after")
    def _check_thresholds(self) -> EcnSpec:
        if self.kmin_bytes > self.kmax_bytes:
            raise FieldProblem(
                "kmin_bytes",
                f"must be <= kmax_bytes (kmin {_kib(self.kmin_bytes)} > kmax "
                f"{_kib(self.kmax_bytes)})",
            )
        return self

    def to_params(self) -> EcnParams:
        return EcnParams(kmin_bytes=self.kmin_bytes, kmax_bytes=self.kmax_bytes, pmax=self.pmax,
                         reference_gbps=self.reference_gbps)


class DcqcnSpec(_Model):
    """DCQCN congestion control at the NICs (fluid model); SIGCOMM 2015 defaults."""

    enabled: StrictBool = Field(
        default=_DCQCN.enabled, description="false: senders ignore ECN (PFC alone)"
    )
    g: Float = Field(
        default=_DCQCN.g, gt=0, le=1, allow_inf_nan=False, description="alpha gain (0 < g <= 1)"
    )
    timer_ns: int = Field(
        default=_DCQCN.timer_ns, gt=0, description="rate-increase timer period"
    )
    byte_counter_bytes: int = Field(
        default=_DCQCN.byte_counter_bytes, gt=0, description="rate-increase byte counter"
    )
    fast_recovery_steps: Int = Field(
        default=_DCQCN.fast_recovery_steps, ge=0,
        description="F: increase events of fast recovery before additive increase",
    )
    rate_ai_fraction: Float = Field(
        default=_DCQCN.rate_ai_fraction, gt=0, le=1, allow_inf_nan=False,
        description="additive increase, as a fraction of the NIC line rate",
    )
    rate_hai_fraction: Float = Field(
        default=_DCQCN.rate_hai_fraction, gt=0, le=1, allow_inf_nan=False,
        description="hyper increase, as a fraction of the NIC line rate",
    )
    cnp_interval_ns: int = Field(
        default=_DCQCN.cnp_interval_ns, ge=0, description="at most one CNP per QP per interval"
    )
    alpha_update_ns: int = Field(
        default=_DCQCN.alpha_update_ns, gt=0, description="alpha decays every period without CNP"
    )
    initial_alpha: Float = Field(
        default=_DCQCN.initial_alpha, ge=0, le=1, allow_inf_nan=False,
        description="alpha of a new QP (0..1)",
    )
    min_rate_gbps: Float = Field(
        default=_DCQCN.min_rate_gbps, gt=0, description="floor of a QP's rate"
    )

    _quantities = field_validator(
        "timer_ns", "byte_counter_bytes", "cnp_interval_ns", "alpha_update_ns", "min_rate_gbps",
        mode="before",
    )(_convert_quantity)

    def to_params(self) -> DcqcnParams:
        return DcqcnParams(**{name: getattr(self, name) for name in DcqcnSpec.model_fields})


class PfcSpec(_Model):
    """Priority flow control on the lossless priorities (fluid model)."""

    enabled: StrictBool = Field(default=_PFC.enabled, description="false: lossless priorities drop")
    xoff_bytes: int = Field(
        default=_PFC.xoff_bytes, gt=0,
        description="ingress bytes (per port and priority) that send a pause upstream",
    )
    xon_bytes: int = Field(
        default=_PFC.xon_bytes, ge=0, description="ingress bytes below which it resumes"
    )
    response_ns: int = Field(
        default=_PFC.response_ns, ge=0, description="pause reaction time (plus the link delay)"
    )
    storm_hops: Int = Field(
        default=_PFC.storm_hops, ge=1, description="a pause that spreads this many hops is a storm"
    )
    storm_duration_ns: int = Field(
        default=_PFC.storm_duration_ns, gt=0, description="a pause that lasts this long is a storm"
    )
    deadlock_detect_ns: int = Field(
        default=_PFC.deadlock_detect_ns, ge=0,
        description="a cycle of pauses lasting this long is a deadlock",
    )
    watchdog: StrictBool = Field(
        default=_PFC.watchdog,
        description="the PFC watchdog breaks deadlocks by dropping the stuck queues "
        "(false: a deadlock stops the run with an error)",
    )
    watchdog_recovery_ns: int = Field(
        default=_PFC.watchdog_recovery_ns, ge=0,
        description="after clearing a deadlock the watchdog ignores pauses on those queues "
        "for this long",
    )

    _quantities = field_validator(
        "xoff_bytes", "xon_bytes", "response_ns", "storm_duration_ns", "deadlock_detect_ns",
        "watchdog_recovery_ns", mode="before",
    )(_convert_quantity)

    @model_validator(mode="after")
    def _check_thresholds(self) -> PfcSpec:
        if self.xon_bytes > self.xoff_bytes:
            raise FieldProblem(
                "xon_bytes",
                f"must be <= xoff_bytes (xon {_kib(self.xon_bytes)} > xoff "
                f"{_kib(self.xoff_bytes)})",
            )
        return self

    def to_params(self) -> PfcParams:
        return PfcParams(**{name: getattr(self, name) for name in PfcSpec.model_fields})


class FluidSpec(_Model):
    """The fluid model's clock, buffers and loss recovery."""

    step_ns: int = Field(default=_FLUID.step_ns, gt=0, description="time step while busy")
    max_quiet_step_ns: int = Field(
        default=_FLUID.max_quiet_step_ns, gt=0,
        description="longest step while nothing is queued, paused or recovering",
    )
    max_busy_step_ns: int = Field(
        default=_FLUID.max_busy_step_ns, gt=0,
        description="longest step while queues or rate cuts are active but PFC is not "
        "(= step_ns: the fixed-step reference)",
    )
    buffer_bytes_per_port: int = Field(
        default=_FLUID.buffer_bytes_per_port, gt=0, description="cap of a lossy egress queue"
    )
    buffer_bytes_per_switch: int = Field(
        default=_FLUID.buffer_bytes_per_switch, gt=0, description="a switch's shared buffer"
    )
    nack_ns: int = Field(
        default=_FLUID.nack_ns, ge=0, description="go-back-N: extra delay before a resend"
    )
    window_bytes: int = Field(
        default=_FLUID.window_bytes, gt=0,
        description="how far a ring stream may run ahead of its ring's slowest",
    )
    sample_interval_ns: int = Field(
        default=_FLUID.sample_interval_ns, gt=0, description="period of timeseries.csv samples"
    )
    max_timeseries_rows: Int = Field(
        default=_FLUID.max_timeseries_rows, gt=0,
        description="memory bound of timeseries.csv: beyond it the period doubles",
    )

    _quantities = field_validator(
        "step_ns", "max_quiet_step_ns", "max_busy_step_ns", "buffer_bytes_per_port",
        "buffer_bytes_per_switch", "nack_ns", "window_bytes", "sample_interval_ns",
        mode="before",
    )(_convert_quantity)

    @model_validator(mode="after")
    def _check_steps(self) -> FluidSpec:
        if self.max_quiet_step_ns < self.step_ns:
            raise FieldProblem(
                "max_quiet_step_ns",
                f"must be >= step_ns ({self.max_quiet_step_ns} < {self.step_ns})",
            )
        if not self.step_ns <= self.max_busy_step_ns <= self.max_quiet_step_ns:
            raise FieldProblem(
                "max_busy_step_ns",
                f"must be between step_ns and max_quiet_step_ns ({self.step_ns} <= "
                f"{self.max_busy_step_ns} <= {self.max_quiet_step_ns} does not hold)",
            )
        return self

    def to_params(self) -> FluidParams:
        return FluidParams(**{name: getattr(self, name) for name in FluidSpec.model_fields})


def _as_int(value: Any, where: str, what: str, low: int, high: int) -> int:
    """``value`` as an int in ``low..high`` (YAML may quote a key: ``"26"`` is accepted)."""
    number: Any = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if isinstance(number, bool) or not isinstance(number, int):
        raise FieldProblem(where, f"must be {what} {low}..{high} (got {value!r})")
    if not low <= number <= high:
        raise FieldProblem(where, f"must be {what} {low}..{high} (got {number})")
    return number


def _mapping(value: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise FieldProblem(where, f"must be a mapping (got {value!r})")
    return value


def _dscp_map(value: Any, where: str) -> dict[int, int]:
    """A DSCP -> priority mapping; problems name ``where[dscp]``."""
    out: dict[int, int] = {}
    for key, prio in _mapping(value, where).items():
        dscp = _as_int(key, f"{where}[{key}]", "a DSCP key", 0, _MAX_DSCP)
        if dscp in out:
            raise FieldProblem(f"{where}[{key}]", f"DSCP {dscp} listed twice")
        out[dscp] = _as_int(prio, f"{where}[{key}]", "a priority", 0, _MAX_PRIORITY)
    return out


class QosSpec(_Model):
    """Traffic classes -> DSCP -> priority, lossless priorities and the egress scheduler.

    DSCP and priority keys are integers (``26: 3``); ``switch_overrides`` gives a switch its
    own DSCP -> priority entries (e.g. a misconfigured hop), reported as a warning.
    """

    dscp: dict[str, int] = Field(
        default_factory=lambda: dict(_QOS.dscp),
        description=f"DSCP (0..63) each traffic class is marked with; keys: {_CLASSES}",
    )
    dscp_to_priority: dict[int, int] = Field(
        default_factory=lambda: dict(_QOS.dscp_to_priority),
        description="switch map DSCP (0..63) -> priority (0..7), replacing the default map; "
        "unmapped DSCPs get priority 0",
    )
    lossless_priorities: list[int] = Field(
        default_factory=lambda: sorted(_QOS.lossless_priorities),
        description="priorities (0..7) protected by PFC",
    )
    scheduler: Literal["strict", "weighted"] = Field(
        default="strict", description="egress scheduler: strict priority or weighted shares"
    )
    weights: dict[int, float] = Field(
        default_factory=lambda: dict(_QOS.weights),
        description="weighted scheduler: priority (0..7) -> weight > 0 (unlisted: 1)",
    )
    switch_overrides: dict[str, dict[int, int]] = Field(
        default_factory=dict,
        description="switch name -> DSCP -> priority entries that replace the fabric-wide ones",
    )

    @field_validator("dscp", mode="before")
    @classmethod
    def _check_dscp(cls, value: Any) -> dict[str, int]:
        value = _mapping(value, "")
        out: dict[str, int] = {}
        for key, dscp in value.items():
            if key not in TRAFFIC_CLASSES:
                raise FieldProblem(str(key), f"unknown traffic class (classes: {_CLASSES})")
            out[key] = _as_int(dscp, key, "a DSCP", 0, _MAX_DSCP)
        missing = [c for c in TRAFFIC_CLASSES if c not in out]
        if missing:
            raise FieldProblem(
                "", f"missing class {missing[0]!r} (every class needs a DSCP: {_CLASSES})"
            )
        return {c: out[c] for c in TRAFFIC_CLASSES}

    @field_validator("dscp_to_priority", mode="before")
    @classmethod
    def _check_map(cls, value: Any) -> dict[int, int]:
        return _dscp_map(value, "")

    @field_validator("lossless_priorities", mode="before")
    @classmethod
    def _check_lossless(cls, value: Any) -> list[int]:
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be a list of priorities 0..7 (got {value!r})")
        out: list[int] = []
        for i, prio in enumerate(value):
            p = _as_int(prio, f"[{i}]", "a priority", 0, _MAX_PRIORITY)
            if p in out:
                raise FieldProblem(f"[{i}]", f"priority {p} listed twice")
            out.append(p)
        return out

    @field_validator("weights", mode="before")
    @classmethod
    def _check_weights(cls, value: Any) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, weight in _mapping(value, "").items():
            prio = _as_int(key, f"[{key}]", "a priority key", 0, _MAX_PRIORITY)
            ok = isinstance(weight, int | float) and not isinstance(weight, bool)
            if not ok or not math.isfinite(weight) or weight <= 0:
                raise FieldProblem(f"[{key}]", f"must be a weight > 0 (got {weight!r})")
            out[prio] = float(weight)
        return out

    @field_validator("switch_overrides", mode="before")
    @classmethod
    def _check_overrides(cls, value: Any) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for name, mapping in _mapping(value, "").items():
            if not isinstance(name, str) or not name:
                raise FieldProblem(str(name), "must be a switch name (e.g. leaf0, spine0)")
            out[name] = _dscp_map(mapping, name)
        return out

    def to_params(self) -> QosParams:
        return QosParams(
            dscp=dict(self.dscp),
            dscp_to_priority=dict(self.dscp_to_priority),
            lossless_priorities=frozenset(self.lossless_priorities),
            scheduler=self.scheduler,
            weights=dict(self.weights),
            switch_overrides={k: dict(v) for k, v in self.switch_overrides.items()},
        )


# --- fabric and load balancing --------------------------------------------------------------


class FabricSpec(_Model):
    """How the data plane is modelled, and the per-packet costs it accounts for."""

    model: RateModelName = Field(
        default="flow",
        description="rate model: flow (max-min fair rates, fast) or fluid (time-stepped queues, "
        "ECN, DCQCN, PFC and QoS; needed for pauses, drops and storms)",
    )
    mtu_bytes: int = Field(default=4096, gt=0, description="RDMA payload per packet")
    header_bytes: int = Field(
        default=58, ge=0, description="RoCEv2 headers: Ethernet 14, IPv4 20, UDP 8, BTH 12, "
        "ICRC 4 (62 also counts the FCS)")
    wire_overhead_bytes: int = Field(default=20, ge=0, description="preamble + inter-frame gap")
    switch_latency_ns: int = Field(default=600, ge=0, description="per switch traversal")
    nic_latency_ns: int = Field(
        default=1000, ge=0, description="per message: NIC and collective-library step cost"
    )
    completion_tolerance: Float = Field(
        default=1e-3,
        ge=0,
        le=0.05,
        allow_inf_nan=False,
        description="flows this close (fraction of their running time) to finishing complete "
        "together with the earliest one: fewer rate updates, FCT error at most this fraction",
    )
    ecn: EcnSpec = Field(default_factory=EcnSpec, description="fluid: ECN marking")
    dcqcn: DcqcnSpec = Field(default_factory=DcqcnSpec, description="fluid: DCQCN at the NICs")
    pfc: PfcSpec = Field(default_factory=PfcSpec, description="fluid: priority flow control")
    fluid: FluidSpec = Field(
        default_factory=FluidSpec, description="fluid: time step, buffers and loss recovery"
    )
    qos: QosSpec = Field(
        default_factory=QosSpec, description="fluid: classes, DSCP, priorities and scheduler"
    )

    _quantities = field_validator(
        "mtu_bytes",
        "header_bytes",
        "wire_overhead_bytes",
        "switch_latency_ns",
        "nic_latency_ns",
        mode="before",
    )(_convert_quantity)

    @model_validator(mode="after")
    def _a_packet_fits(self) -> FabricSpec:
        """A packet must fit the fluid model's buffers and window: below one MTU no packet
        could ever be queued or sent (the run would make no progress)."""
        if self.header_bytes > self.mtu_bytes:
            raise FieldProblem("header_bytes", f"{self.header_bytes} B of headers on a "
                                               f"{self.mtu_bytes} B MTU: at most the MTU")
        for key in ("buffer_bytes_per_port", "buffer_bytes_per_switch", "window_bytes"):
            if getattr(self.fluid, key) < self.mtu_bytes:
                # (blamed on what was written: the MTU, if the buffer is its default)
                if key not in self.fluid.model_fields_set:
                    raise FieldProblem("mtu_bytes", f"{self.mtu_bytes} B is more than "
                                                    f"fabric.fluid.{key} "
                                                    f"({getattr(self.fluid, key)} B): no "
                                                    f"packet would fit")
                raise FieldProblem(f"fluid.{key}", f"{getattr(self.fluid, key)} B is less "
                                                   f"than one packet (mtu_bytes "
                                                   f"{self.mtu_bytes})")
        return self

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
        default=1, ge=1, le=1024,
        description="queue pairs (distinct 5-tuples) per GPU-pair connection",
    )
    source_port_entropy: StrictBool = Field(
        default=True, description="each QP uses its own UDP source port (hash entropy)"
    )
    per_switch_seed: StrictBool = Field(
        default=False, description="each switch hashes with its own seed (no polarisation)"
    )


class AdaptiveSpec(_Model):
    """Settings of the adaptive policies (adaptive, flowlet, adaptive-split)."""

    rebalance_interval_ns: int | None = Field(
        default=50_000, gt=0,
        description="adaptive: how often streams on over-committed links are re-placed "
        "(null: never)",
    )
    drain_safe: StrictBool = Field(
        default=True,
        description="a moved stream waits for its old path to drain (no reordering)",
    )
    hysteresis: Float = Field(
        default=0.25, ge=0, allow_inf_nan=False,
        description="a stream moves only to a path lighter by this many links",
    )
    flowlet_gap_ns: int = Field(
        default=100_000, gt=0, description="flowlet: idle time after which a path may change"
    )
    mice_bytes: int = Field(
        default=64 << 10, gt=0, description="adaptive-split: transfers below this are mice"
    )
    reserved_spines: Int = Field(
        default=1, ge=1, description="adaptive-split: top-tier switches kept for mice"
    )
    mice_by: Literal["size", "bytes_seen"] = Field(
        default="size",
        description="adaptive-split: a mouse by declared size, or until it has sent mice_bytes",
    )

    _quantities = field_validator(
        "rebalance_interval_ns", "flowlet_gap_ns", "mice_bytes", mode="before",
    )(_convert_quantity)


class ControllerSpec(_Model):
    """Settings of the task-aware controller and the switches it programs."""

    control_latency_ns: Int = Field(
        default=10_000, ge=0, description="rule updates take effect this long after sending"
    )
    parts: Int = Field(
        default=16, ge=1, le=64,
        description="QPs (plan parts) a GPU spreads a planned call over, at least: a ring's "
        "one peer gets them all, each of n peers the smallest divisor of this at least "
        "this / n (one each for a GPU with at least min(this, 4) peers, as in an AlltoAll)",
    )
    switch_rule_capacity: Int = Field(
        default=4096, ge=0, description="explicit forwarding rules one switch holds"
    )
    replan_interval_ns: int | None = Field(
        default=200_000, gt=0,
        description="how often the controller reads telemetry and re-plans (null: never)",
    )
    replan_gain: Float = Field(
        default=0.1, ge=0, le=1, allow_inf_nan=False,
        description="a re-plan is installed for a job only if it lowers the job's bottleneck "
        "utilisation by this fraction (hysteresis)",
    )
    pressure_fuse: Float = Field(
        default=0.9, gt=0, le=1, allow_inf_nan=False,
        description="buffer occupancy at which new flows avoid a planned path",
    )
    l3_rate_cap: Float = Field(
        # (at least 1 %: a cap near 0 stretches L3 transfers, and the run, without bound)
        default=0.8, ge=0.01, le=1, allow_inf_nan=False,
        description="share of a link L3 jobs may be planned on while an L1/L2 job is planned",
    )
    steer_tries: Int = Field(
        default=1024, ge=1, le=16384,
        description="source ports tried per QP when steering it onto its planned path",
    )
    spill_port_tries: Int = Field(
        default=8, ge=1, le=1024,
        description="source ports tried for a QP that can be neither steered nor pinned "
        "(a full rule table): it gets the one whose hash path avoids dead and gray links "
        "and loads the fabric least",
    )
    heal_spread_over: Float = Field(
        default=0.02, ge=0, le=10, allow_inf_nan=False,
        description="a QP moved off a failed link is spread over `parts` QPs only if moving "
        "it whole would load a link this much (utilisation) above the plan's lambda "
        "(at least 1)",
    )
    link_up_holddown_ns: Int = Field(
        default=1_000_000, ge=0,
        description="a link back up gets planned traffic again (a whole plan weighed) only "
        "once it has stayed up this long: a flapping link does not pull traffic back",
    )

    replan_background_tolerance: Float = Field(
        default=0.05, ge=0, le=1, allow_inf_nan=False,
        description="a whole plan weighed and not installed is weighed again only once the "
        "background load of some link moved by more than this share of its capacity (or "
        "the jobs, the links or the plan changed)",
    )
    gray_clear_ns: int | None = Field(
        default=None, ge=0,
        description="a link its error counters made gray is restored once they have stayed "
        "below the threshold this long (null: never by itself, only an operator's report)",
    )
    mice_spines: Int = Field(
        default=0, ge=0,
        description="top-tier switches kept for mice: planned paths avoid them and the "
        "switches route transfers below adaptive.mice_bytes on them (0: none)",
    )

    _quantities = field_validator(
        "control_latency_ns", "replan_interval_ns", "link_up_holddown_ns", "gray_clear_ns",
        mode="before",
    )(_convert_quantity)

    def to_params(self) -> ControllerParams:
        return ControllerParams(
            self.control_latency_ns, self.parts, self.switch_rule_capacity,
            float(self.replan_interval_ns) if self.replan_interval_ns else float("inf"),
            self.replan_gain, self.pressure_fuse, self.l3_rate_cap, self.steer_tries,
            spill_port_tries=self.spill_port_tries, heal_spread_over=self.heal_spread_over,
            link_up_holddown_ns=float(self.link_up_holddown_ns),
            replan_background_tolerance=self.replan_background_tolerance,
            gray_clear_ns=(float(self.gray_clear_ns) if self.gray_clear_ns is not None
                           else float("inf")),
            mice_spines=self.mice_spines)


# --- jobs -----------------------------------------------------------------------------------


class CollectiveSpec(_Model):
    """One collective a job runs every iteration.

    ``size_bytes`` counts as nccl-tests does: bytes per rank for allreduce and alltoall, total
    bytes for allgather and reducescatter, the message for broadcast.
    """

    op: CollectiveOp = Field(description="NCCL operation: allreduce, allgather, "
                             "reducescatter, alltoall or broadcast")
    size_bytes: int = Field(gt=0, description="message size (nccl-tests convention)")
    algorithm: Algorithm = Field(default="auto",
                                 description="auto, ring, rails, hierarchical, tree, flat")
    mode: CollectiveMode = Field(
        default="stream", description="stream: pipelined streams; steps: synchronised steps"
    )
    root: Int = Field(default=0, ge=0, description="root rank (broadcast), 0..gpus-1")

    _quantities = field_validator("size_bytes", mode="before")(_convert_quantity)

    @model_validator(mode="after")
    def _root_of_a_broadcast(self) -> CollectiveSpec:
        if "root" in self.model_fields_set and self.op != "broadcast":
            raise FieldProblem("root", f"only a broadcast has a root (this is an {self.op})")
        return self


MAX_ITERATIONS = 1_000_000
"""The most iterations a job simulates (each is events and flows of the engine)."""


class JobSpec(_Model):
    """A training job: where its GPUs are and the collectives of each iteration."""

    name: str = Field(min_length=1, max_length=128, description="unique job name")

    @field_validator("name")
    @classmethod
    def _printable_name(cls, name: str) -> str:
        # (a planned pair's key is "<job>:<src>-><dst>": a ':' would split it elsewhere)
        if not name.strip():
            raise ValueError("must not be blank")
        bad = next((c for c in name if c == ":" or not c.isprintable()), None)
        if bad is not None:
            raise ValueError(f"must not contain {bad!r} (got {name!r})")
        if name == "mice":  # (flows.csv and the reports name the mice so)
            raise ValueError("'mice' names the Poisson mice in the results: give the job "
                             "another name")
        return name

    gpus: Int = Field(gt=0, description="number of GPUs (ranks)")
    placement: Placement = Field(
        default="contiguous",
        description="contiguous, random (ranks in GPU order), shuffled (the same GPUs in a "
                    "random rank order), or explicit (gpu_ids)"
    )
    gpu_ids: list[Annotated[Int, Field(ge=0)]] | None = Field(
        default=None, description="placement explicit: the global GPU ids, rank order"
    )
    start_ns: int = Field(default=0, ge=0, description="when the first iteration starts")
    iterations: Int = Field(default=1, ge=1, le=MAX_ITERATIONS,
                            description="training iterations to simulate")
    compute_ns: int = Field(
        default=0, ge=0, description="compute gap before the collectives of each iteration"
    )
    declare_intent: StrictBool = Field(
        default=True, description="the job declares its collectives to the controller"
    )
    sla_us: Float | None = Field(
        default=None, gt=0, le=1e12, allow_inf_nan=False,  # (the longest time a scenario takes)
        description="latency SLA of its calls in microseconds, or text with its own time unit "
        "(50us, 0.1ms) (L1 < 50, L2 <= 100, L3 above; none: L3)",
    )
    priority: Int = Field(
        default=0, ge=0, le=7,
        description="priority of its calls, 0 (default) to 7: the controller plans higher "
        "ones first and keeps lower ones from overloading their links where it can",
    )
    traffic_class: TrafficClass = Field(
        default="rdma", description="QoS class of the job's flows: rdma, tcp or control"
    )
    collectives: list[CollectiveSpec] = Field(
        min_length=1, description="run in order, every iteration"
    )

    _quantities = field_validator("start_ns", "compute_ns", mode="before")(_convert_quantity)
    _sla = field_validator("sla_us", mode="before")(_convert_us)

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
        compute_total_ns = self.start_ns + self.iterations * self.compute_ns
        if compute_total_ns > _LARGEST["time"][0]:
            raise FieldProblem("compute_ns", f"start_ns + iterations x compute_ns = "
                               f"{compute_total_ns:.3g} ns, beyond the longest run a scenario "
                               f"takes ({_LARGEST['time'][1]})")
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

    rate_per_s: Float = Field(gt=0, allow_inf_nan=False, description="new flows per second")
    size_bytes: int = Field(default=16384, gt=0, description="bytes per flow")
    start_ns: int = Field(default=0, ge=0, description="first arrival not before")
    duration_ns: int = Field(gt=0, description="arrivals during [start, start + duration)")
    gpus: Literal["all"] | list[int] = Field(
        default="all", description="'all' or the GPU ids mice run between"
    )
    traffic_class: TrafficClass = Field(
        default="rdma", description="QoS class of the mice: rdma, tcp or control"
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

    @model_validator(mode="after")
    def _not_too_many(self) -> MiceSpec:
        expected = self.rate_per_s * self.duration_ns / 1e9
        if expected > MAX_MICE:
            raise FieldProblem("rate_per_s", f"{self.rate_per_s:g} per s for "
                                             f"{self.duration_ns:g} ns make ~{expected:.3g} "
                                             f"flows; at most {MAX_MICE}")
        return self


MAX_MICE = 2_000_000  # mice flows in one run (each is a flow of the engine)


# --- faults ---------------------------------------------------------------------------------
#
# Link and switch names are checked against the topology by fabricpilot.faults.resolve_faults
# (they are not known before it is built); everything else is checked here.

_FAULTS = FaultParams()

# the optional keys each kind of fault event takes (kind and at_ns: every kind)
_FAULT_KEYS: dict[str, tuple[str, ...]] = {
    "link_down": ("link", "until_ns"),
    "link_up": ("link",),
    "switch_down": ("switch", "until_ns"),
    "flap": ("link", "down_ns", "up_ns", "count"),
    "gray": ("link", "ber", "drop_probability", "until_ns"),
}
_FAULT_REQUIRED: dict[str, tuple[str, ...]] = {
    "link_down": ("link",),
    "link_up": ("link",),
    "switch_down": ("switch",),
    "flap": ("link", "down_ns", "up_ns", "count"),
    "gray": ("link",),
}


def _check_ber(cls: type[BaseModel], value: float | None) -> float | None:
    """A pre-FEC bit error rate: ``0 < ber <= 0.5`` (0.5: a link of pure noise)."""
    if value is not None and not 0 < value <= 0.5:
        raise ValueError(f"must be a bit error rate in (0, 0.5] (got {value!r})")
    return value


class DebounceSpec(_Model):
    """Act on a link only after ``count`` detections of it within ``window_ns``, or
    ``count`` in a row (its error counters reported less often than the window allows)."""

    count: Int = Field(
        default=_FAULTS.debounce_count, ge=1,
        description="detections of the same link needed to act (1: no debounce)",
    )
    window_ns: int = Field(
        default=_FAULTS.debounce_window_ns, gt=0,
        description="the detections must fall within this window (or come in a row)",
    )

    _quantities = field_validator("window_ns", mode="before")(_convert_quantity)


class NoiseSpec(_Model):
    """Noisy error counters: spurious FEC error-rate spikes on healthy links."""

    spike_probability: Float = Field(
        default=_FAULTS.noise_spike_probability, ge=0, le=1, allow_inf_nan=False,
        description="chance that one sample of one link shows a spurious spike (seeded)",
    )
    spike_ber: Float = Field(
        default=_FAULTS.noise_spike_ber, ge=0, le=0.5, allow_inf_nan=False,
        description="the FEC-corrected bit error rate a spike shows",
    )

    @model_validator(mode="after")
    def _check_spike(self) -> NoiseSpec:
        if self.spike_probability > 0 and self.spike_ber == 0:
            raise FieldProblem(
                "spike_ber",
                f"must be > 0 when spike_probability is > 0 "
                f"(spike_probability {self.spike_probability:g})",
            )
        return self


class FaultEventSpec(_Model):
    """One scheduled fault: a link or switch going down, a flapping link or a gray link.

    ``link`` is a cable ``"leaf0-spine1"`` (both directions) or one direction
    ``"leaf0->spine1"``.
    """

    kind: FaultKind = Field(
        description="link_down, link_up, switch_down, flap (down/up cycles) or gray "
        "(bit errors: the link stays up but loses packets)"
    )
    at_ns: int = Field(ge=0, description="when the fault starts")
    link: str | None = Field(
        default=None, min_length=1,
        description="link kinds: 'a-b' (a cable, both directions) or 'a->b' (one direction)",
    )
    switch: str | None = Field(
        default=None, min_length=1, description="switch_down: every link of this switch"
    )
    until_ns: int | None = Field(
        default=None, ge=0,
        description="link_down, switch_down: up again then; gray: cleared then "
        "(default: lasts to the end)",
    )
    down_ns: int | None = Field(default=None, gt=0, description="flap: down time of a cycle")
    up_ns: int | None = Field(default=None, gt=0, description="flap: up time of a cycle")
    count: Int | None = Field(default=None, ge=1, le=10_000,
                              description="flap: number of down/up cycles (at most 10000)")
    ber: Float | None = Field(
        default=None, allow_inf_nan=False,
        description="gray: pre-FEC bit error rate, 0 < ber <= 0.5 (what FEC counters see)",
    )
    drop_probability: Float | None = Field(
        default=None, ge=0, le=1, allow_inf_nan=False,
        description="gray: per-packet loss after FEC (default: derived from ber with the "
        "RS(544,514) FEC; without ber the corrected-error counters show nothing, only the "
        "frames lost on the traffic that crosses it)",
    )

    _quantities = field_validator(
        "at_ns", "until_ns", "down_ns", "up_ns", mode="before",
    )(_convert_quantity)
    _ber = field_validator("ber")(_check_ber)

    @model_validator(mode="after")
    def _check_kind(self) -> FaultEventSpec:
        """Each kind takes its own keys; the keys of other kinds are refused."""
        own = _FAULT_KEYS[self.kind]
        for key in ("link", "switch", "until_ns", "down_ns", "up_ns", "count", "ber",
                    "drop_probability"):
            if key in own or getattr(self, key) is None:
                continue
            kinds = [k for k, keys in _FAULT_KEYS.items() if key in keys]
            raise FieldProblem(
                key, f"not valid for kind {self.kind} (only for {', '.join(kinds)})"
            )
        for key in _FAULT_REQUIRED[self.kind]:
            if getattr(self, key) is None:
                raise FieldProblem(key, f"required for kind {self.kind}")
        if self.kind == "gray" and self.ber is None and self.drop_probability is None:
            raise FieldProblem("ber", "required for kind gray (or give drop_probability)")
        if self.until_ns is not None and self.until_ns <= self.at_ns:
            raise FieldProblem(
                "until_ns", f"must be after at_ns ({self.until_ns} ns <= {self.at_ns} ns)"
            )
        return self


class RandomFaultsSpec(_Model):
    """Link failures drawn from a mean time between failures, with the scenario seed."""

    link_mtbf_ns: int = Field(
        gt=0, description="mean up time of a cable between failures (exponential)"
    )
    repair_ns: int = Field(gt=0, description="how long each drawn failure lasts")
    horizon_ns: int = Field(gt=0, description="failures start in [0, horizon)")
    gray_fraction: Float = Field(
        default=0.0, ge=0, le=1, allow_inf_nan=False,
        description="share of the drawn failures that are gray instead of down",
    )
    gray_ber: Float = Field(
        default=1e-5, allow_inf_nan=False,
        description="pre-FEC bit error rate of a drawn gray failure (0 < ber <= 0.5)",
    )
    scope: Literal["fabric", "all"] = Field(
        default="fabric",
        description="cables that may fail: fabric (switch to switch) or all (also NIC links)",
    )

    _quantities = field_validator(
        "link_mtbf_ns", "repair_ns", "horizon_ns", mode="before",
    )(_convert_quantity)
    _ber = field_validator("gray_ber")(_check_ber)


class FaultsSpec(_Model):
    """Faults injected into the fabric, and how the fabric detects and reacts to them.

    >>> f = FaultsSpec.model_validate({"convergence_delay_ns": "50ms", "events": [
    ...     {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "2ms", "until_ns": "5ms"}]})
    >>> f.events[0].until_ns, f.to_params().convergence_delay_ns
    (5000000, 50000000)
    """

    detection_delay_ns: int = Field(
        default=_FAULTS.detection_delay_ns, ge=0,
        description="a down link's neighbours see loss of signal this long after it fails",
    )
    convergence_delay_ns: int = Field(
        default=_FAULTS.convergence_delay_ns, ge=0,
        description="routing has moved traffic off a down link this long after detection",
    )
    rdma_timeout_ns: int = Field(
        default=_FAULTS.rdma_timeout_ns, gt=0,
        description="RoCE retransmission timeout: a lost packet is resent after this",
    )
    rdma_retry_count: Int | None = Field(
        default=_FAULTS.rdma_retry_count, ge=0, le=7,
        description="retransmissions a RoCE QP makes before it gives up (its job errors out); "
        "unset: it retries until its path is back",
    )
    local_repair: StrictBool = Field(
        default=_FAULTS.local_repair,
        description="at detection, switches drop their own dead ports from groups that keep "
        "another next hop (fast failover); the rest waits for routing to converge",
    )
    fec_threshold: Float = Field(
        default=_FAULTS.fec_threshold, gt=0, le=0.5, allow_inf_nan=False,
        description="a link whose FEC-corrected bit error rate exceeds this is flagged gray",
    )
    debounce: DebounceSpec = Field(
        default_factory=DebounceSpec, description="detections needed before acting on a link"
    )
    telemetry_interval_ns: int = Field(
        default=_FAULTS.telemetry_interval_ns, gt=0,
        description="how often the error counters are sampled",
    )
    noise: NoiseSpec = Field(
        default_factory=NoiseSpec, description="spurious spikes in the error counters"
    )
    events: list[FaultEventSpec] = Field(
        default_factory=list, description="scheduled faults (link_down, link_up, switch_down, "
        "flap, gray)",
    )
    random: RandomFaultsSpec | None = Field(
        default=None, description="optional: link failures drawn from rates with the seed"
    )

    _quantities = field_validator(
        "detection_delay_ns", "convergence_delay_ns", "rdma_timeout_ns",
        "telemetry_interval_ns", mode="before",
    )(_convert_quantity)

    def to_params(self) -> FaultParams:
        return FaultParams(
            detection_delay_ns=self.detection_delay_ns,
            convergence_delay_ns=self.convergence_delay_ns,
            rdma_timeout_ns=self.rdma_timeout_ns,
            local_repair=self.local_repair,
            rdma_retry_count=self.rdma_retry_count,
            fec_threshold=self.fec_threshold,
            debounce_count=self.debounce.count,
            debounce_window_ns=self.debounce.window_ns,
            telemetry_interval_ns=self.telemetry_interval_ns,
            noise_spike_probability=self.noise.spike_probability,
            noise_spike_ber=self.noise.spike_ber,
        )


# --- the scenario ---------------------------------------------------------------------------


class Scenario(_Model):
    """A whole scenario file: one cluster, its jobs, and the policies to compare on it."""

    name: str = Field(default="scenario", min_length=1, max_length=128,
                      description="shown in reports")
    description: str = Field(default="", description="free text")

    @field_validator("name")
    @classmethod
    def _printable_name(cls, name: str) -> str:
        # (a title line of the CLI and the report: a newline would break it in two)
        if not name.strip():
            raise ValueError("must not be blank")
        bad = next((c for c in name if not c.isprintable()), None)
        if bad is not None:
            raise ValueError(f"must not contain {bad!r} (got {name!r})")
        return name
    seed: Int = Field(default=1, ge=0, description="seed of every random choice")
    policies: list[str] = Field(
        default_factory=lambda: ["ecmp", "ideal"],
        min_length=1,
        description="routing policies to compare (names from the balancing registry)",
    )
    topology: TopologySpec
    fabric: FabricSpec = Field(default_factory=FabricSpec)
    ecmp: EcmpSpec = Field(default_factory=EcmpSpec)
    adaptive: AdaptiveSpec = Field(default_factory=AdaptiveSpec)
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    jobs: list[JobSpec] = Field(min_length=1, description="training jobs sharing the fabric")
    mice: MiceSpec | None = Field(default=None, description="optional background small flows")
    faults: FaultsSpec | None = Field(
        default=None, description="optional: link and switch failures, flaps and gray links"
    )

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
