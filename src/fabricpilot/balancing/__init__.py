"""Load balancing: switch-side path choice. A policy maps transfers to the links they load
(ECMP hashing, ideal fluid spraying; adaptive, flowlet and spraying variants build on the same
interface)."""

from fabricpilot.balancing import adaptive, ecmp, ideal, sla_aware, spray, task_aware  # noqa: F401
from fabricpilot.balancing.base import (
    POLICIES,
    EcmpParams,
    PolicyContext,
    RoutedBatch,
    RoutingPolicy,
    TransferBatch,
    UnknownPolicyError,
    make_policy,
)

__all__ = [
    "POLICIES",
    "EcmpParams",
    "PolicyContext",
    "RoutedBatch",
    "RoutingPolicy",
    "TransferBatch",
    "UnknownPolicyError",
    "make_policy",
]
