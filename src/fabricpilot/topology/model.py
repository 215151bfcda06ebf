"""The topology as plain data: a networkx graph with typed node and link attributes.

Nodes
    ``gpu{i}``      kind ``gpu``: GPU ``i`` with its NIC (``host``, ``local_rank``, ``rail``)
    ``nvs{h}``      kind ``nvswitch``: the NVLink domain of host ``h`` (intra-host traffic only)
    switches        kind ``switch`` with ``tier`` (1 = leaf / edge, 2 = spine / aggregation,
                    3 = core) and ``role`` (``leaf``, ``spine``, ``edge``, ``agg``, ``core``)

Links (undirected, full duplex: each direction has the full ``rate_gbps``)
    ``kind``        ``nic`` (GPU NIC to its leaf), ``fabric`` (switch to switch) or ``nvlink``
    ``rate_gbps``   line rate per direction
    ``delay_ns``    propagation delay
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import networkx as nx

from fabricpilot.errors import TopologyError


class NodeKind(StrEnum):
    GPU = "gpu"
    NVSWITCH = "nvswitch"
    SWITCH = "switch"


class LinkKind(StrEnum):
    NIC = "nic"
    FABRIC = "fabric"
    NVLINK = "nvlink"


def gpu_name(gpu: int) -> str:
    """Node name of GPU ``gpu``.

    >>> gpu_name(3)
    'gpu3'
    """
    return f"gpu{gpu}"


def nvswitch_name(host: int) -> str:
    return f"nvs{host}"


@dataclass
class Topology:
    """A cluster: GPUs (each with one NIC), hosts with an NVLink domain, and switches.

    ``graph`` is a plain :class:`networkx.Graph`; everything else is derived from it.
    """

    graph: nx.Graph
    name: str = "topology"
    gpus_per_host: int = 1
    params: dict[str, object] = field(default_factory=dict)

    @cached_property
    def n_gpus(self) -> int:
        return sum(1 for _, k in self.graph.nodes(data="kind") if k == NodeKind.GPU)

    @property
    def n_hosts(self) -> int:
        return -(-self.n_gpus // self.gpus_per_host)

    @cached_property
    def switches(self) -> list[str]:
        """Switch names, sorted by (tier, name) so indices are stable."""
        nodes = [n for n, k in self.graph.nodes(data="kind") if k == NodeKind.SWITCH]
        return sorted(nodes, key=lambda n: (self.graph.nodes[n]["tier"], _natural(n)))

    @cached_property
    def gpu_leaf(self) -> list[str]:
        """``gpu_leaf[i]``: the switch GPU ``i``'s NIC is cabled to."""
        leaves = []
        for i in range(self.n_gpus):
            nic = [
                v for v in self.graph.neighbors(gpu_name(i))
                if self.graph.edges[gpu_name(i), v]["kind"] == LinkKind.NIC
            ]
            if len(nic) != 1:
                raise TopologyError(f"{gpu_name(i)} must have exactly one NIC link, has {len(nic)}")
            leaves.append(nic[0])
        return leaves

    def host_of(self, gpu: int) -> int:
        return int(self.graph.nodes[gpu_name(gpu)]["host"])

    def summary(self) -> str:
        tiers: dict[int, int] = {}
        for s in self.switches:
            t = int(self.graph.nodes[s]["tier"])
            tiers[t] = tiers.get(t, 0) + 1
        sw = ", ".join(f"{n} tier-{t}" for t, n in sorted(tiers.items()))
        hosts = f"{self.n_hosts} host{'s' * (self.n_hosts != 1)}"
        return f"{self.name}: {self.n_gpus} GPUs on {hosts}, switches: {sw}"


def _natural(name: str) -> tuple[str, tuple[int, ...]]:
    """Sort key that orders ``leaf2`` before ``leaf10`` and ``edge1_10`` before ``edge11_0``.

    >>> sorted(["edge11_0", "edge1_10", "leaf10", "leaf2"], key=_natural)
    ['edge1_10', 'edge11_0', 'leaf2', 'leaf10']
    """
    head = name.rstrip("0123456789_")
    groups = tuple(int(g) for g in re.findall(r"\d+", name[len(head):]))
    return (head, groups)


def validate_topology(topo: Topology) -> None:
    """Check the invariants the engine relies on; raise :class:`TopologyError` otherwise.

    GPUs are numbered ``0..n-1`` without gaps, every GPU has exactly one NIC link to a switch,
    every link has a positive rate and a non-negative delay.
    """
    g = topo.graph
    gpus = sorted(int(d["gpu"]) for _, d in g.nodes(data=True) if d.get("kind") == NodeKind.GPU)
    if gpus != list(range(len(gpus))):
        raise TopologyError("GPU ids must be 0..n-1 without gaps")
    for n, d in g.nodes(data=True):
        if d.get("kind") not in set(NodeKind):
            raise TopologyError(f"node {n}: unknown kind {d.get('kind')!r}")
        if d["kind"] == NodeKind.SWITCH and int(d.get("tier", 0)) < 1:
            raise TopologyError(f"node {n}: a switch needs tier >= 1")
    for u, v, d in g.edges(data=True):
        if d.get("kind") not in set(LinkKind):
            raise TopologyError(f"link {u}-{v}: unknown kind {d.get('kind')!r}")
        if not float(d.get("rate_gbps", 0)) > 0:
            raise TopologyError(f"link {u}-{v}: rate_gbps must be > 0")
        if float(d.get("delay_ns", -1)) < 0:
            raise TopologyError(f"link {u}-{v}: delay_ns must be >= 0")
    topo.gpu_leaf  # noqa: B018  (raises if a GPU lacks its NIC link)


def switch_examples(switches: list[str]) -> str:
    """A few switch names for an error message: the first switch of every kind (name
    prefix).

    >>> switch_examples(["leaf0", "leaf1", "spine0", "spine1"])
    'switches are e.g. leaf0, spine0'
    >>> switch_examples([])
    'the topology has no switches'
    """
    if not switches:
        return "the topology has no switches"
    first: dict[str, str] = {}
    for name in switches:
        first.setdefault(name.rstrip("0123456789_"), name)
    return f"switches are e.g. {', '.join(list(first.values())[:4])}"
