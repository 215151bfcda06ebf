"""The data plane of the twin: network state as arrays, rate models (max-min flow level now;
fluid queues / ECN / DCQCN / PFC later) and the event-driven engine that runs jobs over it."""

from fabricpilot.dataplane.engine import (
    CollectiveRecord,
    Engine,
    EngineOutput,
    IterationRecord,
)
from fabricpilot.dataplane.fluid import FluidRateModel, FluidReport
from fabricpilot.dataplane.maxmin import alone_rate_gbps, max_min_rates
from fabricpilot.dataplane.params import (
    DcqcnParams,
    EcnParams,
    FabricParams,
    FluidParams,
    PfcParams,
)
from fabricpilot.dataplane.qos import QosParams
from fabricpilot.dataplane.rates import MaxMinRateModel, RateModel
from fabricpilot.topology.compiled import CompiledTopology

RATE_MODELS = ("flow", "fluid")


def make_rate_model(
    name: str,
    topology: CompiledTopology,
    fabric: FabricParams,
    *,
    ecn: EcnParams | None = None,
    dcqcn: DcqcnParams | None = None,
    pfc: PfcParams | None = None,
    fluid: FluidParams | None = None,
    qos: QosParams | None = None,
) -> RateModel:
    """The rate model called ``name`` (``flow`` or ``fluid``) for ``topology``."""
    if name == "flow":
        return MaxMinRateModel()
    if name == "fluid":
        return FluidRateModel(topology, fabric, ecn=ecn, dcqcn=dcqcn, pfc=pfc, fluid=fluid,
                              qos=qos)
    raise ValueError(f"unknown rate model {name!r} (known: {', '.join(RATE_MODELS)})")


__all__ = [
    "RATE_MODELS",
    "CollectiveRecord",
    "DcqcnParams",
    "EcnParams",
    "Engine",
    "EngineOutput",
    "FabricParams",
    "FluidParams",
    "FluidRateModel",
    "FluidReport",
    "IterationRecord",
    "MaxMinRateModel",
    "PfcParams",
    "QosParams",
    "RateModel",
    "alone_rate_gbps",
    "make_rate_model",
    "max_min_rates",
]
