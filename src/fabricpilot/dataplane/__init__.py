"""The data plane of the twin: network state as arrays, rate models (max-min flow level now;
fluid queues / ECN / DCQCN / PFC later) and the event-driven engine that runs jobs over it."""

from fabricpilot.dataplane.engine import (
    CollectiveRecord,
    Engine,
    EngineOutput,
    IterationRecord,
)
from fabricpilot.dataplane.maxmin import alone_rate_gbps, max_min_rates
from fabricpilot.dataplane.params import FabricParams
from fabricpilot.dataplane.rates import RATE_MODELS, MaxMinRateModel, RateModel

__all__ = [
    "RATE_MODELS",
    "CollectiveRecord",
    "Engine",
    "EngineOutput",
    "FabricParams",
    "IterationRecord",
    "MaxMinRateModel",
    "RateModel",
    "alone_rate_gbps",
    "max_min_rates",
]
