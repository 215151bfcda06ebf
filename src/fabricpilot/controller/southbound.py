"""The controller's only view of a data plane: a small southbound interface.

The controller never imports the simulator. It reads the fabric as a :class:`FabricView` (a
directed graph of nodes and links with their capacities and delays), receives per-port counter
deltas (:class:`PortDelta`), and acts through a :class:`DataPlane`: install a weighted path set
for a job / flow / traffic class (and withdraw it), push a congestion table for switch-local
adaptive routing, set the QoS mapping. The digital twin implements :class:`DataPlane`; a real
southbound (gNMI / P4Runtime / OpenFlow) can implement it later. Rule updates take effect
after the data plane's control-channel latency, never instantly.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import networkx as nx


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One directed link: ``link_id`` (the data plane's id), endpoints, capacity, delay and
    kind (``"nic"``: a GPU's link to its leaf, ``"fabric"``: between switches, or
    ``"nvlink"``)."""

    link_id: int
    src: str
    dst: str
    capacity_gbps: float
    delay_ns: int
    kind: str = "fabric"


@dataclass(frozen=True)
class EcmpSpec:
    """How the switches resolve their ECMP groups, as read from them: the hash seed
    (``base_seed``, or a seed per switch derived from it and ``switch_index``), whether NICs
    vary the UDP source port per QP, each group's members in bucket order (``groups[(switch,
    destination leaf)]``: link ids, member ``hash % len`` is taken) and each GPU's leaf. With
    this a controller evaluates exactly the next hop a switch picks for a 5-tuple
    (:mod:`fabricpilot.net.hashing`)."""

    base_seed: int
    per_switch_seed: bool
    source_port_entropy: bool
    switch_index: dict[str, int]
    groups: dict[tuple[str, str], tuple[int, ...]]
    gpu_leaf: dict[int, str]


@dataclass(frozen=True)
class FabricView:
    """The fabric as the controller sees it.

    ``graph`` is a :class:`networkx.DiGraph` whose edges carry ``link_id``, ``capacity_gbps``,
    ``delay_ns`` and ``kind``, and whose nodes carry ``kind`` (``"gpu"``, ``"switch"``,
    ``"nvswitch"``) and, for switches, ``tier`` (1 = leaf / ToR, 2 = spine or aggregation, ...).
    ``gpu_node`` maps a GPU index to its node name. ``ecmp`` describes the switches' hash
    (``None`` if the data plane does not expose it), ``rule_capacity`` how many explicit
    forwarding rules one switch holds and ``switch_latency_ns`` what a switch (NVSwitch
    too) adds to a packet's delay as it forwards it.

    >>> v = FabricView.from_links(
    ...     [LinkInfo(0, "gpu0", "leaf0", 400, 100, "nic"),
    ...      LinkInfo(1, "leaf0", "gpu0", 400, 100, "nic")],
    ...     node_kind={"gpu0": "gpu", "leaf0": "switch"}, tier={"leaf0": 1},
    ...     gpu_node={0: "gpu0"})
    >>> v.link(0).dst, v.graph["gpu0"]["leaf0"]["capacity_gbps"]
    ('leaf0', 400)
    """

    graph: nx.DiGraph
    gpu_node: dict[int, str]
    links: dict[int, LinkInfo] = field(default_factory=dict)
    ecmp: EcmpSpec | None = None
    rule_capacity: int = 4096
    switch_latency_ns: float = 600.0

    @classmethod
    def from_links(cls, links: list[LinkInfo], node_kind: dict[str, str],
                   tier: dict[str, int], gpu_node: dict[int, str], *,
                   ecmp: EcmpSpec | None = None, rule_capacity: int = 4096,
                   switch_latency_ns: float = 600.0) -> FabricView:
        g = nx.DiGraph()
        for name, kind in node_kind.items():
            g.add_node(name, kind=kind, tier=tier.get(name, 0))
        for li in links:
            g.add_edge(li.src, li.dst, link_id=li.link_id, capacity_gbps=li.capacity_gbps,
                       delay_ns=li.delay_ns, kind=li.kind)
        return cls(g, dict(gpu_node), {li.link_id: li for li in links}, ecmp, rule_capacity,
                   switch_latency_ns)

    @functools.cached_property
    def top_tier(self) -> int:
        """The highest switch tier (1 = leaf / ToR; 0 without switches)."""
        return max((int(t or 0) for _, t in self.graph.nodes(data="tier")), default=0)

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
    uncorrectable errors, bits received (for error rates), and the port's operational
    state if the switch reports it (``oper_up``: ``False`` down, ``True`` up, ``None``
    not said)."""

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
    oper_up: bool | None = None


class PathSet(NamedTuple):
    """Paths (link ids) and their traffic shares for one match key (a job, a flow, a class).

    Steered path sets also say how: ``ports[i]`` is the UDP source port of the QP that carries
    path ``i`` (the switches' ECMP hash of it lands on the path) and ``rules[i]`` the explicit
    ``(switch, link)`` rules still needed where the hash does not (empty tuples when the data
    plane forwards the paths by rules alone). ``rate_cap_gbps`` limits the sending NIC: the
    capped sets it sends on at once share it equally (a NIC rate limiter on the job's
    traffic; a set's QPs split its part by their shares; ``inf``: none), as for an L3 job
    while an L1 / L2 job is planned."""

    key: str
    paths: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    ports: tuple[int, ...] = ()
    rules: tuple[tuple[tuple[str, int], ...], ...] = ()
    rate_cap_gbps: float = math.inf


class DataPlane(Protocol):
    """What the controller needs from a data plane (the twin, or real switches)."""

    def fabric(self) -> FabricView:
        """The current topology."""

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last call. Only changes need be sent: a port left out of
        a report is taken as unchanged since its last delta (a port that went idle reports
        its zeros once). A port that is down says so in every report
        and, once up again, says that in the next; the first report after the controller
        connects gives every port's state, as a telemetry subscription's first report does
        (a controller that restarted knowing links down learns which are up again)."""

    def install(self, rules: list[PathSet]) -> None:
        """Install weighted path sets (and the senders' rate caps they carry); they take
        effect after the control-channel latency."""

    def remove(self, keys: list[str]) -> None:
        """Withdraw the path sets of ``keys`` (a pair the plan no longer has: its job gone,
        its SLA now unmet, every path of it down): their explicit rules are freed at once
        and, after the control-channel latency, their flows go back to the switches' own
        forwarding. Keys not held are ignored."""

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        """Per-link weights for switch-local adaptive routing (1 neutral, 0 excluded)."""

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        """The DSCP -> priority mapping every switch should use."""


class ExternalDataPlane(DataPlane, Protocol):
    """A data plane in a process of its own (switches, or the twin run apart): besides the
    :class:`DataPlane` calls it says what it holds and runs, so that a restarted controller
    can adopt it."""

    def rules(self) -> list[PathSet]:
        """The path sets the data plane holds now."""

    def status(self) -> dict[str, Any]:
        """Its own health report (``{}`` or ``running: False`` if it cannot be read)."""

    def jobs(self) -> list[dict[str, Any]]:
        """The intents (as dicts) of the jobs running on it, for the controller to declare."""
