"""The service's API payloads: pydantic models, validated field by field.

Every request body is one of these models; a body that does not fit gets a 422 listing each
offending field (``body.calls.0.size_bytes: Input should be greater than 0``). Lists carry
upper bounds so that one request cannot ask the controller for unbounded work.

>>> CallIn(pattern="allreduce", size_bytes=1 << 20, sla_us=80).level
'L2'
>>> IntentIn(task_id="job-1", gpus=[0, 1], calls=[{"pattern": "alltoall", "size_bytes": 1,
...          "sla_us": 500}]).to_intent("acme").tenant
'acme'
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from fabricpilot.controller.intents import MAX_SLA_US, PATTERNS, CommCall, Intent, sla_level

MAX_GPUS_PER_JOB = 65_536
MAX_CALLS_PER_JOB = 256
MAX_PAIRS_PER_CALL = 1 << 20
MAX_DELTAS_PER_BATCH = 65_536
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

Pattern = Literal["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]
CallAlgorithm = Literal["", "ring", "tree", "flat"]
assert set(Pattern.__args__) == set(PATTERNS)  # type: ignore[attr-defined]


MAX_INTERVAL_NS = 10**15  # a delta's interval, a call's period: at most ~11.6 days
MAX_COUNTER = 1e21  # bytes, bits, events or ns in one delta (a 1.6 Pb/s port for a week)


def _a_number(value: Any) -> Any:
    """``value`` if JSON gave a number for it: a string or a boolean is refused, not read
    as one (``"1000"`` is not a size, ``true`` not a GPU id).

    >>> _a_number(2.0)
    2.0
    >>> _a_number(True)
    Traceback (most recent call last):
    ...
    ValueError: expected a number, got a boolean (true)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got a boolean ({str(value).lower()})")
    if isinstance(value, str | bytes):
        raise ValueError(f"expected a number, got a string ({value!r})")
    return value


def _an_integer(value: Any) -> Any:
    """:func:`_a_number`, an integral float (``1e9``) as the integer it is, so that a bound
    names itself for any magnitude (``1e20`` against ``le=2**50``: "less than or equal
    to ...", not a parse failure); other floats go on to be refused as fractional.

    >>> _an_integer(1e20)
    100000000000000000000
    >>> _an_integer(2.5)
    2.5
    """
    value = _a_number(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_an_integer)]  # (an integral float, as 1e9, is one)
Float = Annotated[float, BeforeValidator(_a_number)]


class _Strict(BaseModel):
    """Unknown keys are refused, numbers must be finite and be numbers (:data:`Int`,
    :data:`Float`, in lists too) and booleans booleans (``StrictBool``: ``"no"`` is not a
    port state)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CallIn(_Strict):
    """One communication call a job declares: a collective of ``size_bytes`` whose GPU
    pairs need paths of a one-way delay within its latency SLA ``sla_us`` (links and
    switches; it also sets the level: L1 < 50 us one switch, L2 <= 100 us no spine, L3 any
    path), repeating every ``period_ns`` (0: one-off), at ``priority`` (0-7: the controller
    plans higher priorities first and keeps lower ones from overloading their links where
    it can). The SLA bounds the paths' delay, not the collective's time, which its size and
    the links' rates set."""

    pattern: Pattern
    size_bytes: Int = Field(gt=0, le=1 << 50)
    sla_us: Float = Field(gt=0, le=MAX_SLA_US)
    period_ns: Int = Field(default=0, ge=0, le=MAX_INTERVAL_NS)
    priority: Int = Field(default=0, ge=0, le=7)
    pairs: list[tuple[Int, Int]] = Field(
        default_factory=list, max_length=MAX_PAIRS_PER_CALL,
        description="the (source, destination) GPU pairs the call's library exchanges data "
                    "between; a pair given k times carries k of its sender's transfers at "
                    "once (as the two trees of a tree AllReduce may); empty: from the pattern")
    algorithm: CallAlgorithm = Field(
        default="", description="how the library runs the call, for one declared without "
                                "pairs: '' or 'ring' (rings; an AlltoAll's PXN where the "
                                "job holds as many GPUs on each of its hosts), 'tree' (an "
                                "AllReduce's double binary trees, as NCCL_ALGO=Tree), "
                                "'flat' (an AlltoAll without PXN, as NCCL_P2P_PXN_LEVEL=0)")

    @field_validator("pairs")
    @classmethod
    def _two_ends(cls, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        same = next((p for p in pairs if p[0] == p[1]), None)
        if same is not None:
            raise ValueError(f"a pair's two GPUs must differ, got {list(same)}")
        return pairs

    @property
    def level(self) -> str:
        return sla_level(self.sla_us)

    @model_validator(mode="after")
    def _algorithm_fits_pattern(self) -> CallIn:
        if self.algorithm == "tree" and self.pattern != "allreduce":
            raise ValueError(f"algorithm: 'tree' runs an allreduce, not a {self.pattern}")
        if self.algorithm == "flat" and self.pattern != "alltoall":
            raise ValueError(f"algorithm: 'flat' runs an alltoall, not a {self.pattern}")
        return self

    def to_call(self) -> CommCall:
        return CommCall(self.pattern, self.size_bytes, self.sla_us, self.period_ns,
                        self.priority, tuple(self.pairs), self.algorithm)


JOB_READ_ONLY = frozenset(("sla_level", "sla_met", "sla_problem", "rate_capped", "path_sets",
                           "room_kept", "planned", "busbw_GBps", "last_collective_us"))
"""What a job read back (``GET``) has beside its intent: ignored in a body sent back."""


class IntentIn(_Strict):
    """A job's intent as declared (or replaced) through the API. The fields a ``GET`` adds
    (:data:`JOB_READ_ONLY`) are ignored, so a job read back can be sent back as it is."""

    @model_validator(mode="before")
    @classmethod
    def _read_back(cls, data: Any) -> Any:
        if isinstance(data, dict) and not JOB_READ_ONLY.isdisjoint(data):
            return {k: v for k, v in data.items() if k not in JOB_READ_ONLY}
        return data

    task_id: str = Field(pattern=TASK_ID_PATTERN)
    gpus: list[Int] = Field(min_length=1, max_length=MAX_GPUS_PER_JOB)
    calls: list[CallIn] = Field(min_length=1, max_length=MAX_CALLS_PER_JOB)
    tenant: str | None = Field(default=None, pattern=TASK_ID_PATTERN,
                               description="operators only: the tenant the job belongs to")
    opt_in: StrictBool = True

    @field_validator("gpus")
    @classmethod
    def _unique(cls, gpus: list[int]) -> list[int]:
        if min(gpus) < 0:
            raise ValueError("GPU ids must be >= 0")
        if len(set(gpus)) != len(gpus):
            dups = sorted({g for g in gpus if gpus.count(g) > 1})[:5]
            raise ValueError(f"duplicate GPU ids: {dups}")
        return gpus

    @model_validator(mode="after")
    def _pairs_in_job(self) -> IntentIn:
        mine = set(self.gpus)
        for i, c in enumerate(self.calls):
            bad = [p for p in c.pairs if p[0] not in mine or p[1] not in mine]
            if bad:
                raise ValueError(f"calls[{i}].pairs: {bad[0]} uses a GPU outside the job")
        return self

    def to_intent(self, tenant: str) -> Intent:
        return Intent(self.task_id, tenant, tuple(self.gpus),
                      tuple(c.to_call() for c in self.calls), self.opt_in)


class AnnounceIn(_Strict):
    """A communication call announced at run time: "an AllReduce of ``size_bytes`` among
    these ranks (GPU ids), SLA ``sla_us``". The controller adds it to the job's intent
    (replacing an announced call of the same pattern and ranks) and answers with the paths it
    planned for it."""

    pattern: Pattern
    size_bytes: Int = Field(gt=0, le=1 << 50)
    ranks: list[Int] = Field(min_length=2, max_length=MAX_GPUS_PER_JOB)
    sla_us: Float | None = Field(default=None, gt=0, le=MAX_SLA_US)
    period_ns: Int = Field(default=0, ge=0, le=MAX_INTERVAL_NS)
    bucket: Int | None = Field(default=None, ge=0, le=1 << 31,
                               description="e.g. a DDP gradient bucket")
    algorithm: CallAlgorithm = Field(default="", description="as a declared call's")

    @model_validator(mode="after")
    def _algorithm_fits_pattern(self) -> AnnounceIn:
        if self.algorithm == "tree" and self.pattern != "allreduce":
            raise ValueError(f"algorithm: 'tree' runs an allreduce, not a {self.pattern}")
        if self.algorithm == "flat" and self.pattern != "alltoall":
            raise ValueError(f"algorithm: 'flat' runs an alltoall, not a {self.pattern}")
        return self

    @field_validator("ranks")
    @classmethod
    def _unique(cls, ranks: list[int]) -> list[int]:
        if len(set(ranks)) != len(ranks):
            raise ValueError("ranks must not repeat")
        if min(ranks) < 0:
            raise ValueError("GPU ids must be >= 0")
        return ranks


class PortDeltaIn(_Strict):
    """Counter deltas of one egress port over ``interval_ns``, as a switch reports them."""

    link_id: Int = Field(ge=0)
    interval_ns: Int = Field(gt=0, le=MAX_INTERVAL_NS)
    tx_bytes: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    queue_bytes: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    drops: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    ecn_marks: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    pause_ns: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    fec_corrected: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    fec_uncorrected: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    rx_bits: Float = Field(default=0.0, ge=0, le=MAX_COUNTER)
    # the port's operational state, if the switch reports it: a change is a link going
    # down or coming back
    oper_up: StrictBool | None = None


class TelemetryIn(_Strict):
    """A batch of port deltas (one switch's, or a collector's)."""

    switch: str | None = Field(default=None, max_length=128)
    deltas: list[PortDeltaIn] = Field(min_length=1, max_length=MAX_DELTAS_PER_BATCH)


class TwinFaultsIn(_Strict):
    """A fault drill: events for the twin to play from now on, each as in a scenario's
    ``faults.events`` (``kind``, ``link`` or ``switch`` by name, ``at_ns`` and ``until_ns``
    counted from now, ``ber``...; checked against the fabric by the twin)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False,
                              json_schema_extra={"examples": [{"events": [
        {"kind": "link_down", "link": "leaf0-spine1", "at_ns": 0, "until_ns": "2ms"},
        {"kind": "gray", "link": "leaf1->spine0", "at_ns": "500us", "ber": 2e-5}]}]})

    events: list[dict[str, Any]] = Field(min_length=1, max_length=64)


class FaultIn(_Strict):
    """A fault report: a link (by id, or by its two end nodes: the link from the first to
    the second; a link is one direction, so a cable is two reports) went ``down``, came back
    ``up`` or is ``gray`` (it corrupts packets but stays up)."""

    kind: Literal["down", "up", "gray"]
    link_id: Int | None = Field(default=None, ge=0)
    endpoints: tuple[str, str] | None = None
    detail: str = Field(default="", max_length=1000)

    @model_validator(mode="after")
    def _one_link(self) -> FaultIn:
        if (self.link_id is None) == (self.endpoints is None):
            raise ValueError("give exactly one of link_id or endpoints")
        return self
