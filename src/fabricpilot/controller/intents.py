"""Job intents: what a training job tells the controller about its communication.

A job declares, per communication call, the collective pattern, the data size, a latency SLA,
the period at which the call repeats (one training iteration) and a priority. From that the
controller derives

* the **heat index** of a call, ``data_size * 1000 / (sla_us * 10)`` (bytes, microseconds):
  larger, tighter calls weigh more;
* the **SLA level** of a call: ``"L1"`` (``sla_us < 50``: NVLink or a single RoCE hop, at most
  one switch), ``"L2"`` (``50 <= sla_us <= 100``: may cross ToRs / leaves, never a spine) or
  ``"L3"`` (``sla_us > 100``: any path, rate-capped at 80 % of the bandwidth).

This module only reads the fabric through :mod:`fabricpilot.controller.southbound`; it imports
nothing from the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from fabricpilot.controller.southbound import FabricView

PATTERNS: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
# how the library runs a call declared without pairs: "" (its rings; an AlltoAll's PXN on
# hosts holding the same number of the job's GPUs each), "tree" (AllReduce over double
# binary trees, as NCCL_ALGO=Tree asks of NCCL) or "flat" (AlltoAll without PXN, as
# NCCL_P2P_PXN_LEVEL=0: every ordered pair through the NICs)
CALL_ALGORITHMS: tuple[str, ...] = ("", "ring", "tree", "flat")
"""The communication patterns a :class:`CommCall` may declare."""

LEVELS: tuple[str, ...] = ("L1", "L2", "L3")
"""SLA levels, strictest first."""

L1_MAX_SLA_US = 50.0
"""SLAs strictly below this are L1."""

L2_MAX_SLA_US = 100.0
"""SLAs from :data:`L1_MAX_SLA_US` up to and including this are L2; above are L3."""

MAX_SLA_US = 1e9
"""The largest SLA a call may declare (1000 s)."""

SWITCH_KINDS: frozenset[str] = frozenset({"switch", "nvswitch"})
"""Node kinds that count as a switch on a path."""


def heat_index(size_bytes: float, sla_us: float) -> float:
    """Heat of one call, as the source defines it: ``data_size * 1000 / (sla_us * 10)`` with
    the size in bytes and the SLA in microseconds. Larger and tighter calls weigh more; only
    ratios between calls matter to the planner.

    1 MB under a 50 us SLA: ``1e6 * 1000 / 500 = 2e6``; under a looser 100 us SLA half that.

    >>> heat_index(1_000_000, 50)
    2000000.0
    >>> heat_index(1_000_000, 100)
    1000000.0
    >>> heat_index(1_000_000, 0)
    Traceback (most recent call last):
    ...
    ValueError: sla_us must be > 0, got 0
    """
    if sla_us <= 0:
        raise ValueError(f"sla_us must be > 0, got {sla_us}")
    return size_bytes * 1000.0 / (sla_us * 10.0)


def sla_level(sla_us: float) -> str:
    """SLA level: ``"L1"`` if ``sla_us < 50``, ``"L2"`` if ``50 <= sla_us <= 100``, else
    ``"L3"``.

    >>> [sla_level(s) for s in (10, 49.9, 50, 100, 100.5)]
    ['L1', 'L1', 'L2', 'L2', 'L3']
    """
    if sla_us <= 0:
        raise ValueError(f"sla_us must be > 0, got {sla_us}")
    if sla_us < L1_MAX_SLA_US:
        return "L1"
    if sla_us <= L2_MAX_SLA_US:
        return "L2"
    return "L3"


@dataclass(frozen=True)
class CommCall:
    """One communication call of a job.

    ``pattern`` is one of :data:`PATTERNS`, ``size_bytes`` the data size (> 0), ``sla_us`` the
    latency SLA in microseconds (> 0), ``period_ns`` how often the call repeats (one training
    iteration; ``0`` = one-off) and ``priority`` its priority (higher = more important).
    ``algorithm`` says how the library runs a call declared without ``pairs`` (one of
    :data:`CALL_ALGORITHMS`: ``""`` or ``"ring"``, rings, and an AlltoAll's PXN where the
    job holds the same number of GPUs on each of its hosts; ``"tree"``, an AllReduce's
    double binary trees; ``"flat"``, an AlltoAll without PXN), so that the controller plans
    the pairs it will use (:func:`~fabricpilot.controller.patterns.pattern_pairs`).

    >>> c = CommCall("allreduce", 1_000_000, 50.0, 2_000_000)
    >>> c.heat, c.level
    (2000000.0, 'L2')
    >>> CommCall("gather", 1, 1.0, 0)
    Traceback (most recent call last):
    ...
    ValueError: pattern: unknown pattern 'gather'; known: allreduce, allgather, \
reducescatter, alltoall, broadcast
    """

    pattern: str
    size_bytes: int
    sla_us: float
    period_ns: int
    priority: int = 0
    # the (source, destination) GPU pairs that exchange data, as the communication library
    # arranges them (its ring / tree / PXN choices); empty: derived from the pattern
    pairs: tuple[tuple[int, int], ...] = ()
    algorithm: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", tuple((int(a), int(b)) for a, b in self.pairs))
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern: unknown pattern {self.pattern!r}; "
                             f"known: {', '.join(PATTERNS)}")
        if self.algorithm not in CALL_ALGORITHMS:
            raise ValueError(f"algorithm: unknown algorithm {self.algorithm!r}; known: "
                             f"{', '.join(a or '(empty)' for a in CALL_ALGORITHMS)}")
        if self.algorithm == "tree" and self.pattern != "allreduce":
            raise ValueError(f"algorithm: 'tree' runs an allreduce, not a {self.pattern}")
        if self.algorithm == "flat" and self.pattern != "alltoall":
            raise ValueError(f"algorithm: 'flat' runs an alltoall, not a {self.pattern}")
        if self.size_bytes <= 0:
            raise ValueError(f"size_bytes must be > 0, got {self.size_bytes}")
        if self.sla_us <= 0:
            raise ValueError(f"sla_us must be > 0, got {self.sla_us}")
        if self.period_ns < 0:
            raise ValueError(f"period_ns must be >= 0 (0 = one-off), got {self.period_ns}")

    @property
    def heat(self) -> float:
        """:func:`heat_index` of this call."""
        return heat_index(self.size_bytes, self.sla_us)

    @property
    def level(self) -> str:
        """:func:`sla_level` of this call."""
        return sla_level(self.sla_us)


@dataclass(frozen=True)
class Intent:
    """A job's intent: its ``task_id``, ``tenant``, the GPUs it runs on (non-empty, no
    duplicates), its communication calls (non-empty) and whether it opted in to
    controller-planned paths. Lists are accepted and stored as tuples.

    ``heat`` is the sum of its calls' heat; ``strictest_level`` the lowest level among its
    calls (L1 < L2 < L3).

    >>> i = Intent("job1", "acme", (0, 1), (CommCall("allreduce", 1_000_000, 50, 0),
    ...                                     CommCall("alltoall", 500_000, 20, 0)))
    >>> i.heat, i.strictest_level
    (4500000.0, 'L1')
    """

    task_id: str
    tenant: str
    gpus: tuple[int, ...]
    calls: tuple[CommCall, ...]
    opt_in: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "calls", tuple(self.calls))
        if not self.task_id:
            raise ValueError("task_id must be a non-empty string")
        if ":" in self.task_id:  # (a planned pair's key is "<task>:<src>-><dst>")
            raise ValueError(f"task_id must not contain ':' (task {self.task_id!r})")
        if not self.gpus:
            raise ValueError(f"gpus must be non-empty (task {self.task_id!r})")
        if len(set(self.gpus)) != len(self.gpus):
            dups = sorted({g for g in self.gpus if self.gpus.count(g) > 1})
            raise ValueError(f"gpus must not contain duplicates (task {self.task_id!r}): "
                             f"{dups}")
        if not self.calls:
            raise ValueError(f"calls must be non-empty (task {self.task_id!r})")
        for c in self.calls:
            if not isinstance(c, CommCall):
                raise ValueError(f"calls must be CommCall instances (task {self.task_id!r}), "
                                 f"got {type(c).__name__}")

    @property
    def heat(self) -> float:
        """Sum of the heat of the intent's calls."""
        return sum(c.heat for c in self.calls)

    @property
    def strictest_level(self) -> str:
        """The strictest (lowest) SLA level among the calls."""
        return min((c.level for c in self.calls), key=LEVELS.index)


def transit_graph(view: FabricView, src: str, dst: str) -> nx.DiGraph:
    """The fabric graph as routes may use it: every switch plus the two endpoints; other GPUs
    do not forward traffic, so they are left out (a read-only subgraph view)."""
    g = view.graph
    keep = [n for n, kind in g.nodes(data="kind") if kind != "gpu" or n in (src, dst)]
    return g.subgraph(keep)


def count_switches(view: FabricView, nodes: list[str] | tuple[str, ...]) -> int:
    """Switches (``kind`` in ``{"switch", "nvswitch"}``) on a path, endpoints excluded."""
    kinds = view.graph.nodes
    return sum(1 for n in nodes[1:-1] if kinds[n].get("kind") in SWITCH_KINDS)


def gpu_node_name(view: FabricView, gpu: int) -> str:
    """The node name of GPU ``gpu``; ``ValueError`` if the view does not know it."""
    try:
        return view.gpu_node[gpu]
    except KeyError:
        raise ValueError(f"unknown GPU {gpu}") from None


def topo_distance(view: FabricView, gpu_a: int, gpu_b: int) -> int:
    """Switches on the fewest-hop path between two GPUs' nodes (0 if they share a node).

    Other GPUs never forward traffic, so they are not used as transit. ``ValueError`` if a
    GPU is unknown or no path exists.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "g0", "sw", 400, 100, "nic"),
    ...          LinkInfo(1, "sw", "g1", 400, 100, "nic")]
    >>> v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu", "sw": "switch"},
    ...                           {"sw": 1}, {0: "g0", 1: "g1"})
    >>> topo_distance(v, 0, 1), topo_distance(v, 0, 0)
    (1, 0)
    """
    a = gpu_node_name(view, gpu_a)
    b = gpu_node_name(view, gpu_b)
    if a == b:
        return 0
    try:
        path = nx.shortest_path(transit_graph(view, a, b), a, b)
    except nx.NetworkXNoPath:
        raise ValueError(f"no path from GPU {gpu_a} ({a}) to GPU {gpu_b} ({b})") from None
    return count_switches(view, path)
