"""The controller's only view of a data plane: a small southbound interface.

The controller never imports the simulator. It reads the fabric as a :class:`FabricView` (a
directed graph of nodes and links with their capacities and delays), receives per-port counter
deltas (:class:`PortDelta`), and acts through a :class:`DataPlane`: install a weighted path set
for a job / flow / traffic class, push a congestion table for switch-local adaptive routing,
set the QoS mapping. The digital twin implements :class:`DataPlane`; a real southbound (gNMI /
P4Runtime / OpenFlow) can implement it later. Rule updates take effect after the data plane's
control-channel latency, never instantly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

import networkx as nx


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One directed link: ``link_id`` (the data plane's id), endpoints, capacity, delay and
    kind (``"host"``, ``"fabric"`` or ``"nvlink"``)."""

    link_id: int
    src: str
    dst: str
    capacity_gbps: float
    delay_ns: int
    kind: str = "fabric"


@dataclass(frozen=True)
class FabricView:
    """The fabric as the controller sees it.

    ``graph`` is a :class:`networkx.DiGraph` whose edges carry ``link_id``, ``capacity_gbps``,
    ``delay_ns`` and ``kind``, and whose nodes carry ``kind`` (``"gpu"``, ``"switch"``,
    ``"nvswitch"``) and, for switches, ``tier`` (1 = leaf / ToR, 2 = spine or aggregation, ...).
    ``gpu_node`` maps a GPU index to its node name.

    >>> v = FabricView.from_links(
    ...     [LinkInfo(0, "gpu0", "leaf0", 400, 100, "host"),
    ...      LinkInfo(1, "leaf0", "gpu0", 400, 100, "host")],
    ...     node_kind={"gpu0": "gpu", "leaf0": "switch"}, tier={"leaf0": 1},
    ...     gpu_node={0: "gpu0"})
    >>> v.link(0).dst, v.graph["gpu0"]["leaf0"]["capacity_gbps"]
    ('leaf0', 400)
    """

    graph: nx.DiGraph
    gpu_node: dict[int, str]
    links: dict[int, LinkInfo] = field(default_factory=dict)

    @classmethod
    def from_links(cls, links: list[LinkInfo], node_kind: dict[str, str],
                   tier: dict[str, int], gpu_node: dict[int, str]) -> FabricView:
        g = nx.DiGraph()
        for name, kind in node_kind.items():
            g.add_node(name, kind=kind, tier=tier.get(name, 0))
        for li in links:
            g.add_edge(li.src, li.dst, link_id=li.link_id, capacity_gbps=li.capacity_gbps,
                       delay_ns=li.delay_ns, kind=li.kind)
        return cls(g, dict(gpu_node), {li.link_id: li for li in links})

    def link(self, link_id: int) -> LinkInfo:
        return self.links[link_id]

    def link_between(self, a: str, b: str) -> int:
        return int(self.graph[a][b]["link_id"])

    def path_links(self, nodes: list[str]) -> list[int]:
        """Link ids along a node path."""
        return [self.link_between(a, b) for a, b in itertools.pairwise(nodes)]


@dataclass(frozen=True, slots=True)
class PortDelta:
    """Counter deltas of one egress port (link) over ``interval_ns``, as a switch reports
    them: bytes sent, queue depth now, drops, ECN marks, PFC pause time and FEC-corrected /
    uncorrectable errors, and bits received (for error rates)."""

    link_id: int
    interval_ns: int
    tx_bytes: float = 0.0
    queue_bytes: float = 0.0
    drops: float = 0.0
    ecn_marks: float = 0.0
    pause_ns: float = 0.0
    fec_corrected: float = 0.0
    fec_uncorrected: float = 0.0
    rx_bits: float = 0.0


@dataclass(frozen=True, slots=True)
class PathSet:
    """Paths (link ids) and their traffic shares for one match key (a job, a flow, a class)."""

    key: str
    paths: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]


class DataPlane(Protocol):
    """What the controller needs from a data plane (the twin, or real switches)."""

    def fabric(self) -> FabricView:
        """The current topology."""

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last call."""

    def install(self, rules: list[PathSet]) -> None:
        """Install weighted path sets; they take effect after the control-channel latency."""

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        """Per-link weights for switch-local adaptive routing (1 neutral, 0 excluded)."""

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        """The DSCP -> priority mapping every switch should use."""
