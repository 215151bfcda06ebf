"""SLA-aware path ranking between two GPUs.

For a call with latency SLA ``sla_us`` (level L1 / L2 / L3, see
:func:`fabricpilot.controller.intents.sla_level`) the ranker

1. enumerates the shortest simple paths by delay (link delays plus a per-switch latency) with
   :func:`networkx.shortest_simple_paths`, restricted to the SLA level's scope (L1: at most one
   switch; L2: no spine, the top tier; L3: anything), and keeps the first ``k`` in scope,
   examining at most ``8 * k`` paths;
2. computes each path's delay ``delay_us = sum(link delay_ns) / 1000 + switches *
   switch_latency_us``; paths with ``delay_us > sla_us`` are not eligible;
3. scores eligible paths: ``score = delay_us + sum over links of (penalty_delay +
   penalty_buffer)`` with ``penalty_delay = max(0, link_delay_us - 0.8 * sla_us) * 10`` and
   ``penalty_buffer = exp((floor - free) / floor * 5) - 1`` when the link's free buffer
   ``free`` is below ``floor`` (1.5 MB by default), else 0;
4. returns the eligible paths best (lowest score) first, or a :class:`SlaUnmet` saying why
   no path meets the SLA: a job whose SLA cannot be met is told so, never silently given a
   worse path.

L3 paths carry ``rate_cap_fraction = 0.8`` (L3 traffic is capped at 80 % of the bandwidth).
Only :mod:`fabricpilot.controller.southbound` is used to read the fabric; nothing from the
simulator is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import count, pairwise
from typing import Any

import networkx as nx

from fabricpilot.controller.intents import (
    LEVELS,
    SWITCH_KINDS,
    count_switches,
    gpu_node_name,
    sla_level,
    transit_graph,
)
from fabricpilot.controller.southbound import FabricView

L3_RATE_CAP = 0.8
"""Fraction of the bandwidth L3 traffic may use."""

DELAY_MARGIN = 0.8
"""A link whose own delay exceeds ``DELAY_MARGIN * sla_us`` is penalised."""

DELAY_PENALTY_PER_US = 10.0
"""Score added per microsecond of link delay above ``DELAY_MARGIN * sla_us``."""

BUFFER_PENALTY_STEEPNESS = 5.0
"""Exponent scale of the free-buffer penalty."""

CANDIDATE_FACTOR = 8
"""At most ``CANDIDATE_FACTOR * k`` simple paths are examined."""



@dataclass(frozen=True)
class RankedPath:
    """One eligible path: its nodes and link ids, its delay in microseconds (link delays plus
    per-switch latency), its score (lower is better), whether it is within the SLA level's
    scope and the fraction of the bandwidth it may use (0.8 for L3, else 1.0)."""

    nodes: tuple[str, ...]
    links: tuple[int, ...]
    delay_us: float
    score: float
    level_ok: bool
    rate_cap_fraction: float


@dataclass(frozen=True)
class SlaUnmet:
    """Returned instead of paths when no candidate meets the SLA; ``reason`` is one line."""

    reason: str


def _tier(view: FabricView, node: str) -> int:
    return int(view.graph.nodes[node].get("tier", 0) or 0)


def spine_tier(view: FabricView) -> int:
    """The tier L2 may not reach: the top one of a fabric of two tiers or more (a
    leaf-spine's spines, 2; a fat-tree's core, 3), 2 in a fabric of one.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> v = FabricView.from_links([LinkInfo(0, "g0", "leaf", 400, 100)],
    ...                           {"g0": "gpu", "leaf": "switch"}, {"leaf": 1}, {0: "g0"})
    >>> spine_tier(v)
    2
    """
    return max(2, view.top_tier)


def in_scope(view: FabricView, nodes: Sequence[str], level: str) -> bool:
    """Whether a node path is allowed for an SLA level.

    L1: at most one switch (``kind`` switch / nvswitch, endpoints excluded), i.e. NVLink
    ``gpu -> nvswitch -> gpu`` or one RoCE hop ``gpu -> leaf -> gpu``. L2: it may cross ToRs
    but no spine, the fabric's top tier when it has two or more (a leaf-spine's spines,
    tier 2; a fat-tree's core, tier 3: its aggregation switches join the ToRs of a pod).
    L3: any path.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "g0", "leaf", 400, 100), LinkInfo(1, "leaf", "spine", 400, 1000),
    ...          LinkInfo(2, "spine", "leaf1", 400, 1000), LinkInfo(3, "leaf1", "g1", 400, 100)]
    >>> kinds = {"g0": "gpu", "g1": "gpu", "leaf": "switch", "leaf1": "switch",
    ...          "spine": "switch"}
    >>> v = FabricView.from_links(links, kinds, {"leaf": 1, "leaf1": 1, "spine": 2},
    ...                           {0: "g0", 1: "g1"})
    >>> path = ["g0", "leaf", "spine", "leaf1", "g1"]
    >>> [in_scope(v, path, lvl) for lvl in ("L1", "L2", "L3")]
    [False, False, True]

    Under a core above it (tier 3), the tier-2 switch is a pod's aggregation, which L2 may
    cross:

    >>> w = FabricView.from_links(links, {**kinds, "core": "switch"},
    ...                           {"leaf": 1, "leaf1": 1, "spine": 2, "core": 3},
    ...                           {0: "g0", 1: "g1"})
    >>> in_scope(w, path, "L2")
    True
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if level == "L1":
        return count_switches(view, nodes) <= 1
    if level == "L2":
        spine = spine_tier(view)
        return all(_tier(view, n) < spine for n in nodes)
    return True


def path_delay_us(view: FabricView, links: Sequence[int],
                  switch_latency_us: float | None = None) -> float:
    """A path's delay as :func:`rank_paths` counts it: its links' ``delay_ns`` and
    ``switch_latency_us`` per switch it crosses (NVSwitches included; not its ends; by
    default the view's ``switch_latency_ns``).

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "g0", "leaf", 400, 100), LinkInfo(1, "leaf", "g1", 400, 100)]
    >>> v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu", "leaf": "switch"},
    ...                           {"leaf": 1}, {0: "g0", 1: "g1"})
    >>> round(path_delay_us(v, [0, 1]), 6)  # 0.2 us of links, one switch
    0.8
    """
    if switch_latency_us is None:
        switch_latency_us = view.switch_latency_ns / 1000.0
    info = [view.links[lk] for lk in links]
    kind = view.graph.nodes
    switches = sum(1 for li in info[1:] if kind[li.src].get("kind") in SWITCH_KINDS)
    return (sum(float(li.delay_ns) for li in info) + switches * switch_latency_us * 1000.0
            ) / 1000.0


def delay_penalty(link_delay_us: float, sla_us: float) -> float:
    """``max(0, link_delay_us - 0.8 * sla_us) * 10``: a link that alone eats more than 80 % of
    the SLA is penalised 10 per microsecond above that.

    >>> delay_penalty(1.0, 500.0)       # 1 <= 400: no penalty
    0.0
    >>> delay_penalty(100.0, 120.0)     # (100 - 96) * 10
    40.0
    """
    return max(0.0, link_delay_us - DELAY_MARGIN * sla_us) * DELAY_PENALTY_PER_US


def buffer_penalty(free_bytes: float, floor_bytes: float = 1.5e6) -> float:
    """``exp((floor - free) / floor * 5) - 1`` when ``free < floor``, else 0. A negative
    ``free`` counts as 0, so the penalty is at most ``exp(5) - 1``.

    >>> buffer_penalty(3e6)                       # above the floor
    0.0
    >>> round(buffer_penalty(0.75e6), 4)          # exp(0.75e6 / 1.5e6 * 5) - 1 = exp(2.5) - 1
    11.1825
    >>> round(buffer_penalty(0.0), 3)             # exp(5) - 1
    147.413
    """
    if floor_bytes <= 0:
        raise ValueError(f"buffer_floor_bytes must be > 0, got {floor_bytes}")
    if free_bytes >= floor_bytes:
        return 0.0
    free = max(0.0, free_bytes)
    return math.expm1((floor_bytes - free) / floor_bytes * BUFFER_PENALTY_STEEPNESS)


def _scope_nodes(view: FabricView, src: str, dst: str, level: str) -> list[str]:
    """Nodes that can appear on an in-scope path (a superset filter; :func:`in_scope` still
    decides). Other GPUs never forward traffic."""
    g = view.graph
    if level == "L1":
        common = set(g.successors(src)) & set(g.predecessors(dst))
        mids = [n for n in common if g.nodes[n].get("kind") in SWITCH_KINDS]
        return [src, dst, *sorted(mids)]
    keep = list(transit_graph(view, src, dst).nodes)
    if level == "L2":
        spine = spine_tier(view)
        keep = [n for n in keep if _tier(view, n) < spine]
    return keep


def _scope_set(view: FabricView, src: str, dst: str, level: str) -> set[str]:
    """The nodes of :func:`_scope_nodes`, as a set, read straight from the graph's node
    attributes (the same rules: L1 the two endpoints and their common switches; L2 / L3
    every node that is not another GPU, L2 without the spines: the top tier)."""
    if level == "L1":
        return set(_scope_nodes(view, src, dst, level))
    attrs = view.graph._node  # the node attribute dicts (what networkx reads)
    if level == "L2":
        spine = spine_tier(view)
        return {n for n, d in attrs.items() if (d.get("kind") != "gpu" or n in (src, dst))
                and int(d.get("tier", 0) or 0) < spine}
    return {n for n, d in attrs.items() if d.get("kind") != "gpu" or n in (src, dst)}


def _least_delay_paths(view: FabricView, scope: set[str], src: str, dst: str,
                       switch_latency_ns: float) -> Iterator[list[str]]:
    """All paths of least delay from ``src`` to ``dst`` through ``scope`` (edge weight: the
    link's ``delay_ns`` plus ``switch_latency_ns`` when it enters a switch other than
    ``dst``), as :func:`networkx.all_shortest_paths` gives them on ``graph.subgraph(scope)``
    with that weight: the same Dijkstra (same neighbour order, tie-breaking and sums), run
    on the graph's adjacency with the weight inlined. ``NetworkXNoPath`` if ``dst`` cannot
    be reached.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "g0", "a", 400, 100), LinkInfo(1, "a", "g1", 400, 100),
    ...          LinkInfo(2, "g0", "b", 400, 100), LinkInfo(3, "b", "g1", 400, 100),
    ...          LinkInfo(4, "g0", "c", 400, 900), LinkInfo(5, "c", "g1", 400, 100)]
    >>> kinds = {"g0": "gpu", "g1": "gpu", "a": "switch", "b": "switch", "c": "switch"}
    >>> v = FabricView.from_links(links, kinds, {}, {0: "g0", 1: "g1"})
    >>> sorted(_least_delay_paths(v, {"g0", "g1", "a", "b", "c"}, "g0", "g1", 600.0))
    [['g0', 'a', 'g1'], ['g0', 'b', 'g1']]
    """
    g = view.graph
    adj = g._adj  # successors -> edge attribute dicts (what networkx's Dijkstra reads)
    attrs = g._node
    enters_switch = {n: n != dst and attrs[n].get("kind") in SWITCH_KINDS for n in scope}
    dist: dict[str, float] = {}
    seen: dict[str, float] = {src: 0}
    pred: dict[str, list[str]] = {src: []}
    tie = count()
    fringe: list[tuple[float, int, str]] = [(0, next(tie), src)]
    while fringe:
        dist_v, _, v = heappop(fringe)
        if v in dist:
            continue  # already searched this node
        dist[v] = dist_v
        for u, e in adj[v].items():
            if u not in scope:
                continue
            vu_dist = dist_v + (float(e["delay_ns"])
                                + (switch_latency_ns if enters_switch[u] else 0.0))
            if u in dist:
                if vu_dist < dist[u]:
                    raise ValueError("Contradictory paths found:", "negative weights?")
                if vu_dist == dist[u]:
                    pred[u].append(v)
            elif u not in seen or vu_dist < seen[u]:
                seen[u] = vu_dist
                heappush(fringe, (vu_dist, next(tie), u))
                pred[u] = [v]
            elif vu_dist == seen[u]:
                pred[u].append(v)
    return paths_from_predecessors(src, dst, pred)


def paths_from_predecessors(src: str, dst: str,
                             pred: dict[str, list[str]]) -> Iterator[list[str]]:
    """Every simple path from ``src`` to ``dst`` along ``pred`` (node -> its predecessors on
    a least-delay path), in the order networkx builds them; ``NetworkXNoPath`` if ``dst``
    has no entry.

    >>> list(paths_from_predecessors("s", "t", {"s": [], "a": ["s"], "b": ["s"],
    ...                                          "t": ["a", "b"]}))
    [['s', 'a', 't'], ['s', 'b', 't']]
    """
    if dst not in pred:
        raise nx.NetworkXNoPath(f"Target {dst} cannot be reached from given sources")

    def walk() -> Iterator[list[str]]:
        seen = {dst}
        stack: list[list[Any]] = [[dst, 0]]
        top = 0
        while top >= 0:
            node, i = stack[top]
            if node == src:
                yield [p for p, _ in reversed(stack[: top + 1])]
            if len(pred[node]) > i:
                stack[top][1] = i + 1
                nxt = pred[node][i]
                if nxt in seen:
                    continue
                seen.add(nxt)
                top += 1
                if top == len(stack):
                    stack.append([nxt, 0])
                else:
                    stack[top][:] = [nxt, 0]
            else:
                seen.discard(node)
                top -= 1

    return walk()


def _weight_fn(view: FabricView, dst: str,
               switch_latency_ns: float) -> Callable[[str, str, dict[str, Any]], float]:
    """Edge weight in ns: the link's delay plus the switch latency of the node it enters."""
    nodes = view.graph.nodes

    def weight(_u: str, v: str, d: dict[str, Any]) -> float:
        enter = switch_latency_ns if v != dst and nodes[v].get("kind") in SWITCH_KINDS else 0.0
        return float(d["delay_ns"]) + enter

    return weight


def _fmt(x: float) -> str:
    return str(round(float(x), 3))


def rank_paths(
    view: FabricView,
    src_gpu: int,
    dst_gpu: int,
    sla_us: float,
    *,
    k: int = 5,
    switch_latency_us: float | None = None,
    free_buffer_bytes: dict[int, float] | None = None,
    buffer_floor_bytes: float = 1.5e6,
) -> list[RankedPath] | SlaUnmet:
    """Rank up to ``k`` paths from ``src_gpu`` to ``dst_gpu`` for a call with SLA ``sla_us``.

    ``delay_us = sum(link delay_ns) / 1000 + switches * switch_latency_us`` (by default
    the view's ``switch_latency_ns`` / 1000);
    ``score = delay_us + sum over links of (delay_penalty + buffer_penalty)`` (see
    :func:`delay_penalty`, :func:`buffer_penalty`; ``free_buffer_bytes`` maps link id to free
    buffer, missing links have plenty). Candidates are the shortest simple paths by delay
    within the level's scope (:func:`in_scope`), the first ``k`` of at most ``8 * k``
    examined; those with ``delay_us > sla_us`` are not eligible. Eligible paths are returned
    sorted by score, then fewer links, then node names; if none is eligible a
    :class:`SlaUnmet` says why.

    Two GPUs under one leaf, reachable through leaf ``a`` or ``b`` (100 ns per link, 0.6 us
    per switch: ``0.2 + 0.6 = 0.8`` us); a buffer deficit on ``a``'s uplink pushes it down
    by ``exp(2.5) - 1 ~ 11.18``:

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> links = [LinkInfo(0, "g0", "a", 400, 100), LinkInfo(1, "a", "g1", 400, 100),
    ...          LinkInfo(2, "g0", "b", 400, 100), LinkInfo(3, "b", "g1", 400, 100)]
    >>> v = FabricView.from_links(links, {"g0": "gpu", "g1": "gpu", "a": "switch",
    ...                                   "b": "switch"}, {"a": 1, "b": 1}, {0: "g0", 1: "g1"})
    >>> [(p.nodes[1], p.delay_us) for p in rank_paths(v, 0, 1, 20.0)]
    [('a', 0.8), ('b', 0.8)]
    >>> [(p.nodes[1], round(p.score, 2)) for p in rank_paths(v, 0, 1, 20.0,
    ...                                                    free_buffer_bytes={0: 0.75e6})]
    [('b', 0.8), ('a', 11.98)]
    >>> rank_paths(v, 0, 1, 0.5)
    SlaUnmet(reason='L1: no path within 0.5 us: best is 0.8 us')
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if switch_latency_us is None:
        switch_latency_us = view.switch_latency_ns / 1000.0
    if switch_latency_us < 0:
        raise ValueError(f"switch_latency_us must be >= 0, got {switch_latency_us}")
    if buffer_floor_bytes <= 0:
        raise ValueError(f"buffer_floor_bytes must be > 0, got {buffer_floor_bytes}")
    level = sla_level(sla_us)
    src = gpu_node_name(view, src_gpu)
    dst = gpu_node_name(view, dst_gpu)
    if src == dst:
        raise ValueError(f"GPU {src_gpu} and GPU {dst_gpu} share node {src!r}: no network path")
    free = free_buffer_bytes or {}
    sw_ns = switch_latency_us * 1000.0
    weight = _weight_fn(view, dst, sw_ns)
    cap = L3_RATE_CAP if level == "L3" else 1.0
    g = view.graph
    adj = g._adj

    def build(path: list[str]) -> RankedPath:
        edges = [adj[a][b] for a, b in pairwise(path)]
        links = tuple(int(e["link_id"]) for e in edges)
        link_ns = [float(e["delay_ns"]) for e in edges]
        delay_us = path_delay_us(view, links, switch_latency_us)
        penalty = sum(
            delay_penalty(ns / 1000.0, sla_us)
            + buffer_penalty(free.get(lid, math.inf), buffer_floor_bytes)
            for lid, ns in zip(links, link_ns, strict=True)
        )
        return RankedPath(tuple(path), links, delay_us, delay_us + penalty, True, cap)

    eligible: list[RankedPath] = []
    best_over: float | None = None
    scope = _scope_set(view, src, dst, level)
    try:
        # the paths of least delay first (one Dijkstra): on a Clos there are usually k of them
        # and the slower general enumeration (Yen) is not needed
        least = sorted(_least_delay_paths(view, scope, src, dst, sw_ns))
        enough = sum(1 for p in least if in_scope(view, p, level)) >= k
        paths: Any = least if enough else nx.shortest_simple_paths(g.subgraph(scope), src, dst,
                                                                     weight=weight)
        for examined, path in enumerate(paths, start=1):
            if in_scope(view, path, level):
                rp = build(path)
                if rp.delay_us > sla_us:
                    # Paths come in order of delay: every later one is at least as slow.
                    best_over = rp.delay_us
                    break
                eligible.append(rp)
                if len(eligible) == k:
                    break
            if examined >= CANDIDATE_FACTOR * k:
                break
    except nx.NetworkXNoPath:
        pass

    if eligible:
        return sorted(eligible, key=lambda p: (p.score, len(p.links), p.nodes))
    if best_over is not None:
        return SlaUnmet(f"{level}: no path within {_fmt(sla_us)} us: best is "
                        f"{_fmt(best_over)} us")
    return SlaUnmet(_scope_reason(view, src, dst, level, sla_us, weight))


def _scope_reason(view: FabricView, src: str, dst: str, level: str, sla_us: float,
                  weight: Callable[[str, str, dict[str, Any]], float]) -> str:
    """Why no in-scope candidate was found, naming the level and the best path out of scope."""
    try:
        path = nx.shortest_path(transit_graph(view, src, dst), src, dst, weight=weight)
    except nx.NetworkXNoPath:
        return f"{level}: no path from {src} to {dst}"
    g = view.graph
    delay_us = sum(weight(a, b, g[a][b]) for a, b in pairwise(path))
    delay_us /= 1000.0
    head = f"{level} (SLA {_fmt(sla_us)} us)"
    if level == "L1":
        return (f"{head} needs a path crossing at most one switch; none in scope: "
                f"the shortest path crosses {count_switches(view, path)} switches "
                f"({_fmt(delay_us)} us)")
    if level == "L2":
        spine = spine_tier(view)
        high = [n for n in path if _tier(view, n) >= spine]
        where = f"crosses {high[0]} (tier {_tier(view, high[0])})" if high else "is out of scope"
        return (f"{head} must not cross a spine (tier >= {spine}); no path in scope: the "
                f"shortest path {where} ({_fmt(delay_us)} us)")
    return f"{head}: no in-scope candidate; the shortest path takes {_fmt(delay_us)} us"
