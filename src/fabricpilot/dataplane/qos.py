"""QoS: traffic classes -> DSCP -> priority (per switch) -> egress queue, and the scheduler.

Field practice (see the design notes): RDMA in its own lossless priority, ordinary traffic in
the default queue, control traffic in a third; the DSCP -> priority mapping must be identical
at every hop, or lossless is silently lost mid-path. :func:`mapping_mismatches` reports any
switch whose mapping differs from the fabric's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fabricpilot.dataplane.fluid_kernels import schedule_cells

N_PRIORITIES = 8
TRAFFIC_CLASSES: tuple[str, ...] = ("rdma", "tcp", "control")


def _default_dscp() -> dict[str, int]:
    return {"rdma": 26, "tcp": 0, "control": 48}


def _default_map() -> dict[int, int]:
    return {26: 3, 0: 0, 48: 6}


def _default_weights() -> dict[int, float]:
    return {6: 1.0, 3: 8.0, 0: 1.0}


@dataclass(frozen=True)
class QosParams:
    """Class -> DSCP marking at the NIC, DSCP -> priority at every switch (with per-switch
    overrides, e.g. a misconfigured hop), which priorities are lossless (PFC), and the egress
    scheduler: ``strict`` (higher priority first) or ``weighted`` (shares by weight among the
    priorities that have traffic, work-conserving)."""

    dscp: dict[str, int] = field(default_factory=_default_dscp)
    dscp_to_priority: dict[int, int] = field(default_factory=_default_map)
    lossless_priorities: frozenset[int] = frozenset({3})
    scheduler: str = "strict"
    weights: dict[int, float] = field(default_factory=_default_weights)
    switch_overrides: dict[str, dict[int, int]] = field(default_factory=dict)

    def class_code(self, name: str) -> int:
        return TRAFFIC_CLASSES.index(name)

    def priority_table(self, switch_names: list[str]) -> NDArray[np.int8]:
        """``table[node, class]``: the priority a class gets at each node's egress (hosts and
        switches without an override use the fabric-wide map; unmapped DSCP -> priority 0)."""
        table = np.zeros((len(switch_names), len(TRAFFIC_CLASSES)), np.int8)
        for i, name in enumerate(switch_names):
            mapping = {**self.dscp_to_priority, **self.switch_overrides.get(name, {})}
            for c, cls in enumerate(TRAFFIC_CLASSES):
                table[i, c] = mapping.get(self.dscp[cls], 0)
        return table

    def lossless_mask(self) -> NDArray[np.bool_]:
        mask = np.zeros(N_PRIORITIES, bool)
        mask[list(self.lossless_priorities)] = True
        return mask


def mapping_mismatches(qos: QosParams, switch_names: list[str]) -> list[str]:
    """One message per switch whose DSCP -> priority mapping differs from the majority.

    >>> q = QosParams(switch_overrides={"leaf3": {26: 0}})
    >>> mapping_mismatches(q, ["leaf1", "leaf2", "leaf3"])
    ['leaf3: DSCP 26 (rdma) -> priority 0 (lossy), other switches use priority 3 (lossless)']
    """
    table = qos.priority_table(switch_names)
    out = []
    lossless = qos.lossless_mask()
    for c, cls in enumerate(TRAFFIC_CLASSES):
        common, _ = Counter(table[:, c].tolist()).most_common(1)[0]
        for i, name in enumerate(switch_names):
            p = int(table[i, c])
            if p != common:
                out.append(
                    f"{name}: DSCP {qos.dscp[cls]} ({cls}) -> priority {p} "
                    f"({'lossless' if lossless[p] else 'lossy'}), other switches use priority "
                    f"{common} ({'lossless' if lossless[common] else 'lossy'})")
    return out


def schedule(
    demand: NDArray[np.float64],
    capacity: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    scheduler: str,
    weights: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Bytes each (port, priority) queue sends in one step.

    ``demand`` and ``eligible`` are ``[ports, priorities]`` (ineligible = paused);
    ``capacity`` is bytes per port. Strict: priority 7 first, then 6, ...; weighted: shares
    by ``weights`` among eligible queues with demand, leftovers redistributed.

    >>> d = np.array([[50.0, 0, 0, 80.0, 0, 0, 0, 0]])
    >>> schedule(d, np.array([100.0]), np.ones((1, 8), bool), "strict", np.ones(8)).tolist()
    [[20.0, 0.0, 0.0, 80.0, 0.0, 0.0, 0.0, 0.0]]
    >>> w = np.array([1.0, 0, 0, 3.0, 0, 0, 0, 0])
    >>> schedule(d, np.array([100.0]), np.ones((1, 8), bool), "weighted", w).tolist()
    [[25.0, 0.0, 0.0, 75.0, 0.0, 0.0, 0.0, 0.0]]
    """
    n_ports, width = demand.shape
    served = np.zeros(n_ports * width)
    schedule_cells(np.ascontiguousarray(demand, np.float64).reshape(-1),
                   np.asarray(capacity, np.float64), np.ascontiguousarray(eligible).reshape(-1),
                   scheduler == "strict", np.asarray(weights, np.float64), width, served)
    return served.reshape(n_ports, width)
