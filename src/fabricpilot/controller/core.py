"""The controller: declared intents in, planned path sets out, through a data plane.

:class:`Controller` keeps the jobs' intents, turns each call into demands between GPU pairs
(the pairs the job declared, or the pattern's pairs over its GPUs in rank order), gives every
demand its equal-cost shortest paths as candidates, plans all opted-in jobs together
(:func:`~fabricpilot.controller.planner.plan_greedy`, each demand in ``parts`` equal parts:
one per QP of the connection) and installs the result as :class:`PathSet` rules keyed
``"<task>:<src>-><dst>"``. Heavier (hotter) jobs are placed first. It reads and acts only
through a :class:`~fabricpilot.controller.southbound.DataPlane`.
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from dataclasses import dataclass, field

import networkx as nx

from fabricpilot.controller.entropy import Steering, SteerRequest, hash_path, steer
from fabricpilot.controller.intents import Intent
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.planner import Demand, Plan, plan_greedy
from fabricpilot.controller.southbound import DataPlane, FabricView, PathSet


def pattern_pairs(pattern: str, gpus: tuple[int, ...]) -> list[tuple[int, int, float]]:
    """GPU pairs a collective exchanges data between, with the share of the sender's NIC
    each pair uses while the call runs: a ring (each GPU to the next, all of its NIC) for
    allreduce, allgather, reducescatter and broadcast; every ordered pair (the NIC shared by
    ``n - 1`` peers) for alltoall.

    >>> pattern_pairs("allreduce", (4, 7, 9))
    [(4, 7, 1.0), (7, 9, 1.0), (9, 4, 1.0)]
    >>> pattern_pairs("alltoall", (0, 1, 2))[:2]
    [(0, 1, 0.5), (0, 2, 0.5)]
    """
    n = len(gpus)
    if n < 2:
        return []
    if pattern == "alltoall":
        return [(a, b, 1.0 / (n - 1)) for a, b in itertools.permutations(gpus, 2)]
    return [(gpus[i], gpus[(i + 1) % n], 1.0) for i in range(n)]


def rule_key(task_id: str, src: int, dst: int) -> str:
    """The match key of a planned pair: ``"<task>:<src>-><dst>"``."""
    return f"{task_id}:{src}->{dst}"


@dataclass
class PlanReport:
    """What the last planning round did: the plan, how many path sets and demands, and how
    the paths are held: by source-port entropy alone (``steered``), with explicit rules
    (``pinned``; ``switch_rules`` counts them per switch) or, where a switch's rule table
    was full, left to the hash of their port (``unpinned``)."""

    plan: Plan
    path_sets: int
    demands: int
    steered: int = 0
    pinned: int = 0
    unpinned: int = 0
    switch_rules: dict[str, int] = field(default_factory=dict)

    @property
    def max_switch_rules(self) -> int:
        return max(self.switch_rules.values(), default=0)


class Controller:
    """Plans paths for declared jobs and installs them through a data plane."""

    def __init__(self, dataplane: DataPlane, params: ControllerParams | None = None, *,
                 nic_gbps: float | None = None) -> None:
        self.dp = dataplane
        self.view: FabricView = dataplane.fabric()
        self.params = params or ControllerParams()
        self.parts = self.params.parts
        self._endpoints: dict[str, tuple[int, int]] = {}
        self.intents: dict[str, Intent] = {}
        self._paths: dict[tuple[str, str], list[tuple[int, ...]]] = {}
        self._sw_paths: dict[tuple[str, str], list[tuple[int, ...]]] = {}
        g = self.view.graph
        self._switch_graph = g.subgraph(
            [n for n, k in g.nodes(data="kind") if k != "gpu"]).copy()
        self._nic_gbps = nic_gbps

    # --------------------------------------------------------------- intents
    def declare(self, intent: Intent) -> None:
        """Add or replace a job's intent (it is planned at the next :meth:`plan`)."""
        self.intents[intent.task_id] = intent

    def withdraw(self, task_id: str) -> None:
        self.intents.pop(task_id, None)

    # --------------------------------------------------------------- planning
    def candidates(self, src_gpu: int, dst_gpu: int) -> list[tuple[int, ...]]:
        """Every fewest-hop path between two GPUs, as link ids. GPUs do not forward traffic,
        so a path leaves its GPU into a switch and stays on switches: the switch-level
        shortest paths are computed once per pair of first and last switches."""
        a, b = self.view.gpu_node[src_gpu], self.view.gpu_node[dst_gpu]
        hit = self._paths.get((a, b))
        if hit is not None:
            return hit
        g = self.view.graph
        best: list[tuple[int, ...]] = []
        for first in g.successors(a):
            for last in g.predecessors(b):
                if g.nodes[first].get("kind") == "gpu" or g.nodes[last].get("kind") == "gpu":
                    continue
                up, down = self.view.link_between(a, first), self.view.link_between(last, b)
                for mid in self._switch_paths(first, last):
                    p = (up, *mid, down)
                    if not best or len(p) < len(best[0]):
                        best = [p]
                    elif len(p) == len(best[0]):
                        best.append(p)
        hit = sorted(best)
        self._paths[(a, b)] = hit
        return hit

    def _switch_paths(self, first: str, last: str) -> list[tuple[int, ...]]:
        """Fewest-hop switch paths between two switches, as link ids (cached)."""
        key = (first, last)
        hit = self._sw_paths.get(key)
        if hit is None:
            if first == last:
                hit = [()]
            else:
                try:
                    hit = [tuple(self.view.path_links(list(p))) for p in
                           nx.all_shortest_paths(self._switch_graph, first, last)]
                except nx.NetworkXNoPath:
                    hit = []
            self._sw_paths[key] = hit
        return hit

    def _nic(self, gpu: int) -> float:
        if self._nic_gbps is not None:
            return self._nic_gbps
        node = self.view.gpu_node[gpu]
        return max(d["capacity_gbps"] for _, _, d in self.view.graph.out_edges(node, data=True))

    def demands(self) -> list[Demand]:
        """One demand per (job, GPU pair) of the opted-in jobs, weighted by the job's heat."""
        out: dict[str, Demand] = {}
        for intent in self.intents.values():
            if not intent.opt_in:
                continue
            for call in intent.calls:
                if call.pairs:
                    fan = Counter(a for a, _ in call.pairs)
                    pairs = [(a, b, 1.0 / fan[a]) for a, b in call.pairs]
                else:
                    pairs = pattern_pairs(call.pattern, intent.gpus)
                for a, b, share in pairs:
                    if a == b or self.view.gpu_node[a] == self.view.gpu_node[b]:
                        continue
                    key = rule_key(intent.task_id, a, b)
                    rate = self._nic(a) * share
                    prev = out.get(key)
                    if prev is not None and prev.rate_gbps >= rate:
                        continue  # the same pair in several calls: its largest demand
                    out[key] = Demand(key, rate, tuple(self.candidates(a, b)),
                                      weight=intent.heat)
                    self._endpoints[key] = (a, b)
        return list(out.values())

    def plan(self) -> PlanReport:
        """Plan every opted-in job together, steer the planned paths and install them."""
        demands = self.demands()
        capacity = {lid: li.capacity_gbps for lid, li in self.view.links.items()}
        plan = plan_greedy(demands, capacity, split=self.parts)
        weight = {d.key: d.weight for d in demands}
        rules, report = self.steer_plan(plan, weight)
        self.dp.install(rules)
        report.demands = len(demands)
        return report

    def steer_plan(self, plan: Plan, weight: dict[str, float]
                   ) -> tuple[list[PathSet], PlanReport]:
        """Path sets for a plan, each path steered by a QP source port
        (:mod:`~fabricpilot.controller.entropy`) and pinned by explicit rules where the hash
        cannot reach it. Rules go to the heaviest demands first while every switch on the
        way has room (``switch_rule_capacity``); a path that does not fit follows the hash
        of its port, and the path set says so (it carries the path actually taken)."""
        if self.view.ecmp is None:  # a data plane that forwards path sets by rules alone
            sets = [PathSet(key, tuple(p for p, _ in shares), tuple(w for _, w in shares))
                    for key, shares in plan.paths.items()]
            return sets, PlanReport(plan, len(sets), 0)
        reqs: list[SteerRequest] = []
        for key, shares in plan.paths.items():
            a, b = self._endpoints[key]
            reqs += [SteerRequest(a, b, p, zlib.crc32(f"{key}#{i}".encode()))
                     for i, (p, _) in enumerate(shares)]
        got = steer(self.view, reqs, max_tries=self.params.steer_tries)
        keys = [key for key, shares in plan.paths.items() for _ in shares]
        used: Counter[str] = Counter()
        paths = [q.path for q in reqs]
        unpinned = 0
        cap = self.view.rule_capacity
        for r in sorted(range(len(reqs)), key=lambda r: (-weight.get(keys[r], 0.0), r)):
            need = Counter(sw for sw, _ in got[r].rules)
            if not need:
                continue
            if all(used[sw] + n <= cap for sw, n in need.items()):
                used.update(need)
            else:
                unpinned += 1
                got[r] = Steering(got[r].port, ())
                paths[r] = hash_path(self.view, reqs[r].src, reqs[r].dst, got[r].port)
        sets, r = [], 0
        for key, shares in plan.paths.items():
            n = len(shares)
            sets.append(PathSet(key, tuple(paths[r:r + n]), tuple(w for _, w in shares),
                                tuple(s.port for s in got[r:r + n]),
                                tuple(s.rules for s in got[r:r + n])))
            r += n
        pinned = sum(1 for s in got if s.rules)
        return sets, PlanReport(plan, len(sets), 0, len(reqs) - pinned - unpinned, pinned,
                                unpinned, dict(used))
