"""Import / export a topology as JSON (format ``fabricpilot-topology/1``).

::

    {"format": "fabricpilot-topology/1", "name": "...", "gpus_per_host": 8,
     "nodes": [{"id": "gpu0", "kind": "gpu", "gpu": 0, "host": 0, ...},
               {"id": "leaf0", "kind": "switch", "tier": 1, "role": "leaf"}, ...],
     "links": [{"a": "gpu0", "b": "leaf0", "kind": "nic", "rate_gbps": 400.0,
                "delay_ns": 100}, ...]}

Every field is validated on import; errors name the file, the field and the problem.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fabricpilot.errors import ScenarioError, TopologyError
from fabricpilot.textfiles import (
    DuplicateKey,
    UnreadableFile,
    no_duplicate_keys,
    read_text_file,
    written_whole,
)
from fabricpilot.topology.builders import MAX_GPUS
from fabricpilot.topology.model import LinkKind, NodeKind, Topology, validate_topology
from fabricpilot.units import MAX_RATE_GBPS, MIN_RATE_GBPS

FORMAT = "fabricpilot-topology/1"


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=256)
    kind: NodeKind
    # (whole numbers only: 0.5 or "0" is not a GPU id)
    gpu: int | None = Field(default=None, ge=0, lt=MAX_GPUS, strict=True)
    host: int | None = Field(default=None, ge=0, lt=MAX_GPUS, strict=True)
    local_rank: int | None = Field(default=None, ge=0, lt=MAX_GPUS, strict=True)
    rail: int | None = Field(default=None, ge=0, lt=MAX_GPUS, strict=True)
    tier: int | None = Field(default=None, ge=1, le=8, strict=True)
    role: str | None = Field(default=None, min_length=1, max_length=64)
    pod: int | None = Field(default=None, ge=0, lt=MAX_GPUS, strict=True)  # (fat-trees)

    @model_validator(mode="after")
    def _needs(self) -> _Node:
        if self.kind == NodeKind.GPU and (self.gpu is None or self.host is None):
            raise ValueError("a GPU node needs its 'gpu' id and its 'host'")
        if self.kind == NodeKind.SWITCH and self.tier is None:
            raise ValueError("a switch node needs its 'tier' (1: leaf)")
        # (each key on the kinds of node it describes: a switch with a GPU id is a mistake)
        for key, kinds in _KEYS_OF.items():
            if getattr(self, key) is not None and self.kind not in kinds:
                raise ValueError(f"'{key}' is not a key of a {self.kind} node (only of "
                                 f"{' and '.join(str(k) for k in kinds)} nodes)")
        return self


_KEYS_OF: dict[str, tuple[NodeKind, ...]] = {
    "gpu": (NodeKind.GPU,), "local_rank": (NodeKind.GPU,), "rail": (NodeKind.GPU,),
    "host": (NodeKind.GPU, NodeKind.NVSWITCH), "tier": (NodeKind.SWITCH,),
    "role": (NodeKind.SWITCH,), "pod": (NodeKind.SWITCH, NodeKind.GPU),
}


# the node kinds (sorted) each kind of link may join: a NIC joins its GPU to a switch, the
# fabric joins switches, NVLink joins a host's GPUs (directly or through its NVSwitch)
_LINK_ENDS = {
    LinkKind.NIC: {("gpu", "switch")},
    LinkKind.FABRIC: {("switch", "switch")},
    LinkKind.NVLINK: {("gpu", "gpu"), ("gpu", "nvswitch")},
}
_LINK_JOINS = {LinkKind.NIC: "a GPU to a switch", LinkKind.FABRIC: "two switches",
               LinkKind.NVLINK: "a GPU to a GPU or an NVSwitch of its host"}


class _Link(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: str
    b: str
    kind: LinkKind
    # (numbers only, as in a scenario: true is not 1 Gb/s, "100" not 100 ns)
    rate_gbps: float = Field(le=MAX_RATE_GBPS, allow_inf_nan=False, strict=True)
    delay_ns: int = Field(ge=0, le=10**15, strict=True)

    @field_validator("rate_gbps")
    @classmethod
    def _rate_a_scenario_takes(cls, rate: float) -> float:
        if not rate >= MIN_RATE_GBPS:
            raise ValueError(f"{rate:g} Gbps is below the smallest rate a scenario takes "
                             f"(1 Mbps)")
        return rate


class _TopologyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["fabricpilot-topology/1"]
    name: str = "topology"
    gpus_per_host: int = Field(ge=1, le=MAX_GPUS)
    params: dict[str, Any] = Field(default_factory=dict)
    nodes: list[_Node]
    links: list[_Link]


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """Plain-data form of ``topo``, stable in order (nodes and links sorted)."""
    g = topo.graph
    nodes = []
    for n in sorted(g.nodes):
        attrs = {k: (str(v) if k == "kind" else v) for k, v in sorted(g.nodes[n].items())}
        nodes.append({"id": n, **attrs})
    links = []
    for u, v in sorted(tuple(sorted(e)) for e in g.edges):
        d = g.edges[u, v]
        links.append({"a": u, "b": v, "kind": str(d["kind"]), "rate_gbps": float(d["rate_gbps"]),
                      "delay_ns": int(d["delay_ns"])})
    return {"format": FORMAT, "name": topo.name, "gpus_per_host": topo.gpus_per_host,
            "params": dict(topo.params), "nodes": nodes, "links": links}


_TYPE_WANTED = {"float": "a number", "int": "a whole number", "string": "a string",
                "bool": "true or false", "list": "a list", "dict": "an object"}


def _problem(error: Any) -> str:
    """A validation error of a topology file in words: a value of the wrong type says what
    it should be and what it is (rates in Gb/s and delays in ns are plain numbers).

    >>> _problem({"type": "float_type", "msg": "Input should be a valid number",
    ...           "input": "400Gbps"})
    "must be a number (got '400Gbps'; a topology file gives rates in Gb/s, delays in ns)"
    >>> _problem({"type": "literal_error", "input": "v2",
    ...           "ctx": {"expected": "'fabricpilot-topology/1'"}})
    "must be 'fabricpilot-topology/1' (got 'v2')"
    """
    if error["type"] in ("literal_error", "enum"):
        return f"must be {error['ctx']['expected']} (got {error['input']!r:.60})"
    kind = str(error["type"]).removesuffix("_type").removesuffix("_parsing")
    if kind in _TYPE_WANTED and str(error["type"]).endswith(("_type", "_parsing")):
        hint = ("; a topology file gives rates in Gb/s, delays in ns"
                if kind in ("float", "int") else "")
        return f"must be {_TYPE_WANTED[kind]} (got {error['input']!r:.60}{hint})"
    return str(error["msg"]).removeprefix("Value error, ")


def topology_from_dict(data: Any, source: str = "<topology>") -> Topology:
    """Build a :class:`Topology` from :func:`topology_to_dict` output; errors name the field."""
    if not isinstance(data, dict):
        raise ScenarioError(source, "", "a topology file holds one JSON object (format, "
                                        "gpus_per_host, nodes, links), not a "
                                        f"{type(data).__name__}")
    try:
        parsed = _TopologyFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise ScenarioError(source, loc.lstrip("."), _problem(first)) from None
    g = nx.Graph()
    for i, node in enumerate(parsed.nodes):
        if node.id in g:
            raise ScenarioError(source, f"nodes[{i}].id", f"duplicate node {node.id!r}")
        attrs = node.model_dump(exclude={"id", "kind"}, exclude_none=True)
        g.add_node(node.id, kind=node.kind, **attrs)
    for i, link in enumerate(parsed.links):
        for end in ("a", "b"):
            if getattr(link, end) not in g:
                raise ScenarioError(source, f"links[{i}].{end}",
                                    f"unknown node {getattr(link, end)!r}")
        if link.a == link.b:
            raise ScenarioError(source, f"links[{i}]", f"a link from {link.a} to itself")
        if g.has_edge(link.a, link.b):
            raise ScenarioError(source, f"links[{i}]", f"duplicate link {link.a}-{link.b}")
        ends = sorted(str(g.nodes[end]["kind"]) for end in (link.a, link.b))
        if tuple(ends) not in _LINK_ENDS[link.kind]:
            raise ScenarioError(source, f"links[{i}].kind",
                                f"{link.kind} links join {_LINK_JOINS[link.kind]}; this one "
                                f"joins a {ends[0]} and a {ends[1]} ({link.a}-{link.b})")
        hosts = [g.nodes[end].get("host") for end in (link.a, link.b)]
        if link.kind == LinkKind.NVLINK and None not in hosts and hosts[0] != hosts[1]:
            raise ScenarioError(source, f"links[{i}]", f"an NVLink between hosts {hosts[0]} "
                                                       f"and {hosts[1]} (NVLink stays in a "
                                                       f"host)")
        if link.kind == LinkKind.NIC:  # (a GPU's NIC is cabled to a leaf)
            switch = link.b if g.nodes[link.a]["kind"] == NodeKind.GPU else link.a
            tier = g.nodes[switch].get("tier")
            if tier != 1:
                raise ScenarioError(source, f"links[{i}]",
                                    f"a NIC link to {switch}, a tier-{tier} switch: GPUs are "
                                    f"cabled to tier-1 switches (leaves)")
        if link.kind == LinkKind.FABRIC:  # (a Clos: each cable joins adjacent tiers)
            ta, tb = (g.nodes[end].get("tier") for end in (link.a, link.b))
            if ta is not None and tb is not None and abs(ta - tb) != 1:
                raise ScenarioError(source, f"links[{i}]",
                                    f"{link.a} (tier {ta}) and {link.b} (tier {tb}): a fabric "
                                    f"link joins a switch to one a tier above it (a Clos)")
        g.add_edge(link.a, link.b, kind=link.kind, rate_gbps=link.rate_gbps,
                   delay_ns=link.delay_ns)
    for i, node in enumerate(parsed.nodes):
        if node.kind == NodeKind.SWITCH and not g.degree(node.id):
            raise ScenarioError(source, f"nodes[{i}]", f"switch {node.id!r} has no links")
        tier = g.nodes[node.id].get("tier")
        if node.kind == NodeKind.SWITCH and tier is not None and tier > 1 and not any(
                g.nodes[n].get("tier") == tier - 1 for n in g[node.id]):
            raise ScenarioError(source, f"nodes[{i}].tier",
                                f"{tier}, but switch {node.id!r} has no link to a tier-"
                                f"{tier - 1} switch below it")
    # GPU ids 0..n-1, each once, and one NIC link per GPU (named by node, not found later)
    gpus = [(i, node) for i, node in enumerate(parsed.nodes) if node.kind == NodeKind.GPU]
    holder: dict[int, int] = {}
    for i, node in gpus:
        assert node.gpu is not None  # (a GPU node has its id: _Node)
        if node.gpu in holder:
            raise ScenarioError(source, f"nodes[{i}].gpu", f"GPU id {node.gpu} again (nodes"
                                                           f"[{holder[node.gpu]}] has it)")
        if node.gpu >= len(gpus):
            raise ScenarioError(source, f"nodes[{i}].gpu",
                                f"{node.gpu}, but the {len(gpus)} GPUs are numbered "
                                f"0..{len(gpus) - 1} without gaps")
        holder[node.gpu] = i
    for i, node in gpus:
        nics = sum(1 for v in g[node.id] if g.edges[node.id, v]["kind"] == LinkKind.NIC)
        if nics != 1:
            raise ScenarioError(source, f"nodes[{i}]", f"GPU {node.id!r} has {nics} NIC "
                                                       f"links; a GPU has one, to its leaf")
    per_host = Counter(node.host for node in parsed.nodes if node.kind == NodeKind.GPU)
    most = max(per_host.values(), default=parsed.gpus_per_host)
    if most != parsed.gpus_per_host:
        host = next(h for h, n in per_host.items() if n == most)
        raise ScenarioError(source, "gpus_per_host", f"{parsed.gpus_per_host}, but host {host} "
                                                     f"has {most} GPU{'s' * (most != 1)}")
    topo = Topology(g, parsed.name, parsed.gpus_per_host, dict(parsed.params))
    try:
        validate_topology(topo)
    except TopologyError as err:
        raise ScenarioError(source, "", str(err)) from None
    return topo


def save_topology_json(topo: Topology, path: str | Path) -> None:
    with written_whole(path) as fh:
        fh.write(json.dumps(topology_to_dict(topo), indent=1) + "\n")


def load_topology_json(path: str | Path) -> Topology:
    """Read a topology JSON file; every problem becomes a one-line :class:`ScenarioError`."""
    p = Path(path)
    try:
        text = read_text_file(p)
    except UnreadableFile as err:
        raise ScenarioError(str(p), "", str(err)) from None
    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as dup:
        raise ScenarioError(str(p), "", f"invalid JSON: an object gives key {str(dup)!r} "
                                        f"twice") from None
    except json.JSONDecodeError as err:
        raise ScenarioError(str(p), f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
    except RecursionError:
        raise ScenarioError(str(p), "", "invalid JSON: nested too deeply to read") from None
    except ValueError as err:  # (e.g. an integer of more digits than Python converts)
        digits = re.search(r"value has (\d+) digits", str(err))
        what = (f"an integer of {digits.group(1)} digits (at most 4300)" if digits
                else str(err))
        raise ScenarioError(str(p), "", f"invalid JSON: {what}") from None
    return topology_from_dict(data, str(p))
