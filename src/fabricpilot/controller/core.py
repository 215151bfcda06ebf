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
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import networkx as nx

from fabricpilot.controller.congestion import CongestionMap
from fabricpilot.controller.entropy import Steering, SteerRequest, hash_path, steer
from fabricpilot.controller.health import Debouncer, GrayDetector
from fabricpilot.controller.intents import Intent
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.planner import Demand, Plan, plan_greedy
from fabricpilot.controller.ranking import in_scope, paths_from_predecessors
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


def _set_load(sets: list[PathSet], rate_gbps: dict[str, float]) -> dict[int, float]:
    """Load per link (Gb/s) of path sets whose keys carry ``rate_gbps``.

    >>> _set_load([PathSet("a", ((0, 1), (0, 2)), (0.5, 0.5))], {"a": 100.0})
    {0: 100.0, 1: 50.0, 2: 50.0}
    """
    load: dict[int, float] = {}
    for s in sets:
        total = sum(s.weights)
        for path, w in zip(s.paths, s.weights, strict=True):
            for lk in path:
                load[lk] = load.get(lk, 0.0) + rate_gbps[s.key] * w / total
    return load


_SCOPE = {"L1": "one switch", "L2": "its leaves (no spine)"}


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

    installed: int = 0  # path sets sent (the ones that changed)
    spilled: set[str] = field(default_factory=set, repr=False)  # keys with unpinned paths

    @property
    def max_switch_rules(self) -> int:
        return max(self.switch_rules.values(), default=0)


@dataclass
class HealReport:
    """One reaction to failed or degraded links: its cause, the path sets re-placed and
    sent, and the controller's wall time for it (seconds)."""

    cause: str
    affected: int
    installed: int
    wall_s: float
    plan: PlanReport | None = None


@dataclass
class TickReport:
    """What one control period saw and did: whether it installed a new plan, the hot links,
    the background load it planned around and the largest link utilisation before and
    after (the new plan's, installed or not)."""

    replanned: bool
    hot_links: list[int]
    background_gbps: dict[int, float]
    lambda_before: float = 0.0
    lambda_after: float = 0.0
    plan: PlanReport | None = None


class Controller:
    """Plans paths for declared jobs and installs them through a data plane."""

    def __init__(self, dataplane: DataPlane, params: ControllerParams | None = None, *,
                 nic_gbps: float | None = None) -> None:
        self.dp = dataplane
        self.view: FabricView = dataplane.fabric()
        self.params = params or ControllerParams()
        self.parts = self.params.parts
        self._endpoints: dict[str, tuple[int, int]] = {}
        self.sla_unmet: dict[str, str] = {}  # task -> why its SLA cannot be met
        self.map = CongestionMap(self.view)
        self.down: set[int] = set()       # links reported down
        self.degraded: set[int] = set()   # links confirmed gray: planned traffic avoids them
        self.partitioned: dict[str, str] = {}  # task -> the pair left without a path
        self.gray = GrayDetector(self.params.fec_threshold,
                                 Debouncer(self.params.debounce_count,
                                           self.params.debounce_window_ns))
        self.heals: list[HealReport] = []
        self._demand: dict[str, Demand] = {}
        self.current: Plan | None = None
        self._installed: dict[str, PathSet] = {}
        self._on_link: dict[int, set[str]] = {}   # link -> keys of installed sets using it
        self._rules_held: Counter[str] = Counter()  # explicit rules per switch, installed
        self._constraints: dict[tuple[int, ...], list] = {}  # path -> its hash decisions
        self._live_cache: dict[tuple, tuple[tuple, tuple]] = {}
        self._links_cache: dict[int, tuple[tuple, set[int]]] = {}
        self._links_of: dict[str, set[int]] = {}  # installed key -> links its paths use
        self._weight: dict[str, float] = {}
        self.replans = 0
        self.intents: dict[str, Intent] = {}
        self._paths: dict[tuple[str, str], list[tuple[int, ...]]] = {}
        self._sw_paths: dict[tuple[str, str], tuple[tuple[int, ...], ...]] = {}
        self._bfs: dict[str, dict[str, list[str]]] = {}
        self._ends_cache: dict[tuple[str, bool], list[tuple[str, int]]] = {}
        self._nic_cache: dict[int, float] = {}
        self._scoped_cache: dict[tuple[int, str], tuple[tuple, tuple]] = {}
        g = self.view.graph
        self._switch_graph = g.subgraph(
            [n for n, k in g.nodes(data="kind") if k != "gpu"]).copy()
        self._nic_gbps = nic_gbps
        self._component = {n: i for i, c in enumerate(
            nx.weakly_connected_components(self._switch_graph)) for n in c}

    # --------------------------------------------------------------- intents
    def declare(self, intent: Intent) -> None:
        """Add or replace a job's intent (it is planned at the next :meth:`plan`)."""
        self.intents[intent.task_id] = intent

    def withdraw(self, task_id: str) -> None:
        self.intents.pop(task_id, None)

    # --------------------------------------------------------------- planning
    def candidates(self, src_gpu: int, dst_gpu: int) -> list[tuple[int, ...]]:
        """Every fewest-hop path between two GPUs, as link ids, sorted. GPUs do not forward
        traffic, so a path leaves its GPU into a switch and stays on switches: the
        switch-level shortest paths are computed once per pair of first and last switches."""
        a, b = self.view.gpu_node[src_gpu], self.view.gpu_node[dst_gpu]
        hit = self._paths.get((a, b))
        if hit is None:
            combos = self._combos(a, b)
            hit = [(up, *m, down) for up, mids, down in combos for m in mids]
            if len(combos) > 1:
                hit.sort()
            self._paths[(a, b)] = hit
        return hit

    def _ends(self, node: str, out: bool) -> list[tuple[str, int]]:
        """``(switch, link id)`` a GPU node leaves by (``out``) or is entered from."""
        hit = self._ends_cache.get((node, out))
        if hit is None:
            g, v = self.view.graph, self.view
            nbrs = g.successors(node) if out else g.predecessors(node)
            hit = [(s, v.link_between(node, s) if out else v.link_between(s, node))
                   for s in nbrs if g.nodes[s].get("kind") != "gpu"]
            self._ends_cache[(node, out)] = hit
        return hit

    def _combos(self, a: str, b: str) -> list[tuple[int, tuple[tuple[int, ...], ...], int]]:
        """``(uplink, sorted switch paths, downlink)`` of the (first, last) switch pairs
        at the fewest hops between GPU nodes ``a`` and ``b``."""
        combos: list[tuple[int, tuple[tuple[int, ...], ...], int]] = []
        best = -1
        for first, up in self._ends(a, True):
            for last, down in self._ends(b, False):
                mids = self._switch_paths(first, last)
                if not mids:
                    continue
                n = len(mids[0])
                if best < 0 or n < best:
                    best, combos = n, [(up, mids, down)]
                elif n == best:
                    combos.append((up, mids, down))
        return combos

    def _switch_paths(self, first: str, last: str) -> tuple[tuple[int, ...], ...]:
        """Fewest-hop switch paths between two switches, as link ids, sorted (cached; one
        breadth-first search per first switch, none between switches that cannot reach
        each other, such as two NVSwitches)."""
        key = (first, last)
        hit = self._sw_paths.get(key)
        if hit is None:
            if first == last:
                hit = ((),)
            elif self._component[first] != self._component[last]:
                hit = ()
            else:
                pred = self._bfs.get(first)
                if pred is None:
                    pred = self._bfs[first] = nx.predecessor(self._switch_graph, first)
                hit = (tuple(sorted(tuple(self.view.path_links(p)) for p in
                                    paths_from_predecessors(first, last, pred)))
                       if last in pred else ())
            self._sw_paths[key] = hit
        return hit

    def _nic(self, gpu: int) -> float:
        """The rate of a GPU's NIC: its link into the fabric (not NVLink)."""
        if self._nic_gbps is not None:
            return self._nic_gbps
        hit = self._nic_cache.get(gpu)
        if hit is None:
            g = self.view.graph
            edges = list(g.out_edges(self.view.gpu_node[gpu], data=True))
            nic = [d["capacity_gbps"] for _, v, d in edges if g.nodes[v].get("kind") == "switch"]
            hit = self._nic_cache[gpu] = max(nic or [d["capacity_gbps"] for *_, d in edges])
        return hit

    def _scoped(self, mids: tuple[tuple[int, ...], ...], up: int, down: int,
                level: str) -> tuple[tuple[int, ...], ...]:
        """The switch paths whose full path is in the level's scope (cached: the scope of a
        path depends on its switches only)."""
        if level == "L3":
            return mids
        key = (id(mids), level)
        hit = self._scoped_cache.get(key)
        if hit is None or hit[0] is not mids:
            hit = self._scoped_cache[key] = (mids, tuple(
                m for m in mids if in_scope(self.view, self._path_nodes((up, *m, down)),
                                            level)))
        return hit[1]

    def _path_nodes(self, path: tuple[int, ...]) -> list[str]:
        return [self.view.links[path[0]].src] + [self.view.links[lk].dst for lk in path]

    def demands(self) -> list[Demand]:
        """One demand per (job, GPU pair) of the opted-in jobs, weighted by the job's heat.

        A pair's candidates are its fewest-hop paths within the scope of its call's SLA level
        (L1: one switch, L2: no spine; see :func:`~fabricpilot.controller.ranking.in_scope`);
        a job with a pair that has none is not planned and is told why
        (:attr:`sla_unmet`). While any L1/L2 job is declared, L3 demands are planned at
        ``l3_rate_cap`` of their rate, leaving the rest of every link to the stricter jobs.
        """
        out: dict[str, Demand] = {}
        self.sla_unmet = {}
        gpu_node = self.view.gpu_node
        opted = [i for i in self.intents.values() if i.opt_in]
        strict = any(c.level != "L3" for i in opted for c in i.calls)
        for intent in opted:
            pending: dict[str, Demand] = {}
            for call in intent.calls:
                if call.pairs:
                    fan = Counter(a for a, _ in call.pairs)
                    pairs = [(a, b, 1.0 / fan[a]) for a, b in call.pairs]
                else:
                    pairs = pattern_pairs(call.pattern, intent.gpus)
                cap = self.params.l3_rate_cap if strict and call.level == "L3" else 1.0
                avoid = self.down | self.degraded
                for a, b, share in pairs:
                    na, nb = gpu_node[a], gpu_node[b]
                    if a == b or na == nb:
                        continue
                    key = rule_key(intent.task_id, a, b)
                    rate = self._nic(a) * share * cap
                    prev = pending.get(key)
                    if prev is not None and prev.rate_gbps >= rate:
                        continue  # the same pair in several calls: its largest demand
                    combos = self._combos(na, nb)
                    if not avoid and len(combos) == 1:
                        # the common case: one (first, last) switch pair; the NIC links
                        # as head and tail and one shared tuple of switch paths
                        up, mids, down = combos[0]
                        mids = self._scoped(mids, up, down, call.level)
                        if mids:
                            pending[key] = Demand(key, rate, mids, weight=intent.heat,
                                                  head=(up,), tail=(down,))
                            self._endpoints[key] = (a, b)
                            continue
                    cands = self.candidates(a, b)
                    if avoid:
                        live = [p for p in cands if avoid.isdisjoint(p)]
                        if cands and all(not self.down.isdisjoint(p) for p in cands):
                            self.partitioned[intent.task_id] = (
                                f"gpu{a} -> gpu{b}: every path crosses a link that is down")
                        cands = live or [p for p in cands if self.down.isdisjoint(p)]
                    if call.level != "L3":
                        cands = [p for p in cands
                                 if in_scope(self.view, self._path_nodes(p), call.level)]
                    if not cands and intent.task_id in self.partitioned:
                        break
                    if not cands:
                        self.sla_unmet[intent.task_id] = (
                            f"{call.pattern} at {call.sla_us:g} us ({call.level}): no path "
                            f"from gpu{a} to gpu{b} within {_SCOPE[call.level]}")
                        break
                    pending[key] = Demand(key, rate, tuple(cands), weight=intent.heat)
                    self._endpoints[key] = (a, b)
            if intent.task_id not in self.sla_unmet and intent.task_id not in self.partitioned:
                out.update(pending)
        self._demand = dict(out)
        return list(out.values())

    def _capacity(self) -> dict[int, float]:
        return {lid: li.capacity_gbps for lid, li in self.view.links.items()}

    def plan(self, background: dict[int, float] | None = None) -> PlanReport:
        """Plan every opted-in job together, steer the planned paths and install them.
        ``background`` is load (Gb/s per link) the plan must route around."""
        demands = self.demands()
        self._weight = {d.key: d.weight for d in demands}
        return self._install(*self._solve(demands, background), len(demands))

    def _solve(self, demands: list[Demand], background: dict[int, float] | None
               ) -> tuple[Plan, list[PathSet], PlanReport]:
        """Plan and steer. If some planned paths could be neither reached by entropy nor
        pinned (full rule tables), plan again with those demands restricted to the paths
        entropy reaches, which frees rules for the others, and keep whichever of the two
        loads the fabric less once every path is the one its QP really takes."""
        cap = self._capacity()
        plan = plan_greedy(demands, cap, background=background, split=self.parts)
        sets, report = self.steer_plan(plan, self._weight)
        if not report.spilled:
            return plan, sets, report
        narrowed = [self._entropy_only(d) if d.key in report.spilled else d for d in demands]
        plan2 = plan_greedy(narrowed, cap, background=background, split=self.parts)
        sets2, report2 = self.steer_plan(plan2, self._weight)
        rate = {d.key: d.rate_gbps for d in demands}
        bg = background or {}
        if (self._fabric_lambda(_set_load(sets2, rate), bg)
                <= self._fabric_lambda(_set_load(sets, rate), bg)):
            return plan2, sets2, report2
        return plan, sets, report

    def _entropy_only(self, d: Demand) -> Demand:
        """``d`` with only the candidates some source port reaches without a rule (all of
        them if none is)."""
        a, b = self._endpoints[d.key]
        full = d.full_candidates
        got = steer(self.view, [SteerRequest(a, b, p, i) for i, p in enumerate(full)],
                    max_tries=self.params.steer_tries, cache=self._constraints)
        free = tuple(p for p, s in zip(full, got, strict=True) if not s.rules)
        return replace(d, candidates=free, head=(), tail=()) if free else d

    def _install(self, plan: Plan, sets: list[PathSet], report: PlanReport, n_demands: int
                 ) -> PlanReport:
        changed = [r for r in sets if self._installed.get(r.key) != r]
        self.dp.install(changed)
        self._installed = {}
        self._on_link = {}
        self._links_of = {}
        self._rules_held = Counter()
        self._record(sets)
        self.current = plan
        report.demands = n_demands
        report.installed = len(changed)
        return report

    def _live(self, d: Demand, avoid: frozenset[int]) -> Demand | None:
        """``d`` on its candidates that avoid ``avoid`` (gray links too, unless only paths
        through them remain), or ``None`` if every candidate crosses a dead link. Demands
        sharing a candidate tuple share the filtering (cached per tuple and link set)."""
        if not avoid.isdisjoint(d.head) or not avoid.isdisjoint(d.tail):
            full = d.full_candidates
            live = tuple(p for p in full if avoid.isdisjoint(p)) or tuple(
                p for p in full if self.down.isdisjoint(p))
            return Demand(d.key, d.rate_gbps, live, d.weight) if live else None
        key = (id(d.candidates), avoid)
        hit = self._live_cache.get(key)
        if hit is None or hit[0] is not d.candidates:
            live = tuple(p for p in d.candidates if avoid.isdisjoint(p)) or tuple(
                p for p in d.candidates if self.down.isdisjoint(p))
            hit = self._live_cache[key] = (d.candidates, live)
        if not hit[1]:
            return None
        return Demand(d.key, d.rate_gbps, hit[1], d.weight, d.head, d.tail)

    def _links_in(self, paths: tuple[tuple[int, ...], ...]) -> set[int]:
        """The links of a tuple of paths (cached per tuple)."""
        hit = self._links_cache.get(id(paths))
        if hit is None or hit[0] is not paths:
            hit = self._links_cache[id(paths)] = (paths, {lk for p in paths for lk in p})
        return hit[1]

    def _record(self, sets: list[PathSet]) -> None:
        """Remember installed path sets, indexed by link, with their explicit rules."""
        for r in sets:
            old = self._installed.get(r.key)
            new_links = {lk for p in r.paths for lk in p}
            old_links = self._links_of.get(r.key, set())
            for lk in old_links - new_links:
                self._on_link[lk].discard(r.key)
            for lk in new_links - old_links:
                self._on_link.setdefault(lk, set()).add(r.key)
            self._links_of[r.key] = new_links
            if old is not None and old.rules:
                self._rules_held.subtract(sw for pinned in old.rules for sw, _ in pinned)
            if r.rules:
                self._rules_held.update(sw for pinned in r.rules for sw, _ in pinned)
            self._installed[r.key] = r

    def background_gbps(self, floor: float = 0.05) -> dict[int, float]:
        """Measured load the current plan does not account for, on the fabric links (the
        switch-to-switch links a plan can route around): the smoothed utilisation of the
        congestion map times capacity, less the planned load, where that exceeds ``floor``
        of the link (traffic of jobs that did not declare, mice, or declared jobs sending
        more than they said). A saturated link shows at most its capacity, so this is a
        lower bound there; the re-plan is still triggered, by the link it saturates.

        >>> from fabricpilot.controller.southbound import LinkInfo, PortDelta
        >>> class DP:
        ...     def fabric(self): return FabricView.from_links(
        ...         [LinkInfo(0, "a", "b", 400, 1)], {"a": "switch", "b": "switch"}, {}, {})
        >>> ctl = Controller(DP())
        >>> ctl.map.update([PortDelta(0, 1000, tx_bytes=25_000)])  # 200 Gb/s
        >>> ctl.background_gbps()
        {0: 200.0}
        """
        planned = self.current.link_load_gbps if self.current else {}
        out = {}
        for lid, u in self.map.utilization().items():
            li = self.view.links[lid]
            if li.kind != "fabric":
                continue
            extra = u * li.capacity_gbps - planned.get(lid, 0.0)
            if extra > floor * li.capacity_gbps:
                out[lid] = extra
        return out

    def _fabric_lambda(self, load: dict[int, float], bg: dict[int, float]) -> float:
        """Largest utilisation of a fabric link under ``load`` plus ``bg`` (Gb/s)."""
        links = self.view.links
        return max(((bg.get(lk, 0.0) + load.get(lk, 0.0)) / links[lk].capacity_gbps
                    for lk in set(bg) | set(load) if links[lk].kind == "fabric"), default=0.0)

    # --------------------------------------------------------------- failures
    def on_links_changed(self, down: list[int], up: list[int]) -> HealReport:
        """Links went down (or came back): the switches get the congestion table with the
        dead links excluded at once, and every planned path set crossing one is re-placed.
        Only those demands are re-planned, on their precomputed candidates minus the dead
        links, against the load of everything else (the rest of the plan stays): the cost
        grows with the traffic on the failed link, not with the fabric."""
        self.down |= set(down)
        self.down -= set(up)
        return self._heal("down" if down else "up")

    def on_links_degraded(self, links: list[int]) -> HealReport:
        """Gray links confirmed: planned traffic moves off them before they fail (they stay
        usable for everything else, at a low congestion-table weight)."""
        self.degraded |= set(links)
        return self._heal("gray")

    def _table(self, links: set[int] | None = None) -> dict[int, float]:
        """The congestion table (of ``links`` only, if given): the map's weights, gray
        links at most 0.05, dead links 0."""
        table = (self.map.congestion_table() if links is None
                 else {lk: self.map.weight(lk) for lk in links})
        for lk in self.degraded:
            table[lk] = min(table[lk], 0.05)
        for lk in self.down:
            table[lk] = 0.0
        return table

    def _heal(self, cause: str) -> HealReport:
        t0 = time.perf_counter()
        # the switches exclude dead links (and shun gray ones) at once: only those entries
        self.dp.push_congestion_table({lk: w for lk, w in self._table(
            self.down | self.degraded).items()})
        avoid = self.down | self.degraded
        if self.current is None:
            return HealReport(cause, 0, 0, time.perf_counter() - t0)
        plan = self.current
        affected = sorted(set().union(*(self._on_link.get(lk, set()) for lk in avoid)))
        if not affected:
            rep = HealReport(cause, 0, 0, time.perf_counter() - t0)
            self.heals.append(rep)
            return rep
        load = plan.link_load_gbps  # updated in place: out with the old paths, in with new
        avoid_key = frozenset(avoid)
        demands, used = [], set()
        for k in affected:
            d = self._demand[k]
            for p, w in plan.paths[k]:
                for lk in p:
                    load[lk] -= d.rate_gbps * w
            live = self._live(d, avoid_key)
            if live is None:
                task = k.split(":", 1)[0]
                a, b = self._endpoints[k]
                self.partitioned[task] = f"gpu{a} -> gpu{b}: every path crosses a link that is down"
                continue
            demands.append(live)
            used.update(d.head, d.tail)
            used.update(self._links_in(live.candidates))
        # only the links the re-placed demands can use; one greedy pass and one sweep (an
        # emergency answer: the next control period may improve it)
        links = self.view.links
        sub = plan_greedy(demands, {lk: links[lk].capacity_gbps for lk in used},
                          background={lk: load[lk] for lk in used if lk in load},
                          split=self.parts, sweeps=1, max_moves=0)
        held = self._rules_held - Counter(
            sw for k in sub.paths for pinned in self._installed[k].rules for sw, _ in pinned)
        sets, report = self.steer_plan(sub, self._weight, held, reuse=True)
        plan.paths.update(sub.paths)
        for lk, v in sub.link_load_gbps.items():
            load[lk] = load.get(lk, 0.0) + v
        self.dp.install(sets)
        self._record(sets)
        rep = HealReport(cause, len(affected), len(sets), time.perf_counter() - t0, report)
        self.heals.append(rep)
        return rep

    def tick(self, now_ns: float | None = None) -> TickReport:
        """One control period, "global view + local response": fold the telemetry deltas
        into the congestion map, push the map as the switches' congestion table (they adapt
        locally until the next plan), and re-plan around the load the plan does not account
        for. The new plan is installed only if it lowers the largest fabric-link utilisation
        (background included) by at least ``replan_gain`` of the current one, and only the
        path sets that changed are sent: small fluctuations never move traffic, and a plan
        never flaps back, since it is compared against itself at the next tick."""
        deltas = self.dp.telemetry()
        self.map.update(deltas)
        if now_ns is not None:  # error counters: gray links, debounced
            gray = [lk for lk in self.gray.update(deltas, now_ns) if lk not in self.degraded]
            if gray:
                self.on_links_degraded(gray)
        self.dp.push_congestion_table(self._table())
        hot = self.map.hot_links()
        bg = self.background_gbps()
        if self.current is None or not bg:
            return TickReport(False, hot, bg)
        before = self._fabric_lambda(self.current.link_load_gbps, bg)
        demands = self.demands()
        self._weight = {d.key: d.weight for d in demands}
        plan, sets, report = self._solve(demands, bg)
        after = self._fabric_lambda(plan.link_load_gbps, bg)
        if after > (1.0 - self.params.replan_gain) * before:
            return TickReport(False, hot, bg, before, after)
        report = self._install(plan, sets, report, len(demands))
        self.replans += 1
        return TickReport(True, hot, bg, before, after, report)

    def steer_plan(self, plan: Plan, weight: dict[str, float],
                   installed_rules: Counter[str] | None = None, reuse: bool = False,
                   ) -> tuple[list[PathSet], PlanReport]:
        """Path sets for a plan, each path steered by a QP source port
        (:mod:`~fabricpilot.controller.entropy`) and pinned by explicit rules where the hash
        cannot reach it. Rules go to the heaviest demands first while every switch on the
        way has room (``switch_rule_capacity``); a path that does not fit follows the hash
        of its port, and the path set says so (it carries the path actually taken). With
        ``reuse``, a path a key already has keeps its port (only new paths are steered)."""
        if self.view.ecmp is None:  # a data plane that forwards path sets by rules alone
            sets = [PathSet(key, tuple(p for p, _ in shares), tuple(w for _, w in shares))
                    for key, shares in plan.paths.items()]
            return sets, PlanReport(plan, len(sets), 0)
        reqs: list[SteerRequest] = []
        known: dict[int, Steering] = {}  # request -> the steering its path already has
        for key, shares in plan.paths.items():
            a, b = self._endpoints[key]
            # where each QP's port search starts: spread, and the same in every run
            base = (a * 1_000_003 + b) * 64
            old = self._installed.get(key) if reuse else None
            for i, (p, _) in enumerate(shares):
                if old is not None and old.ports and p in old.paths:
                    j = old.paths.index(p)
                    known[len(reqs)] = Steering(old.ports[j], old.rules[j])
                reqs.append(SteerRequest(a, b, p, base + i))
        if known:
            fresh = [r for r in range(len(reqs)) if r not in known]
            found = steer(self.view, [reqs[r] for r in fresh],
                          max_tries=self.params.steer_tries, cache=self._constraints)
            new = iter(found)
            got = [known[r] if r in known else next(new) for r in range(len(reqs))]
        else:
            got = steer(self.view, reqs, max_tries=self.params.steer_tries,
                        cache=self._constraints)
        keys = [key for key, shares in plan.paths.items() for _ in shares]
        used: Counter[str] = Counter(installed_rules or {})  # rules other sets hold
        paths = [q.path for q in reqs]
        unpinned = 0
        spilled: set[str] = set()
        cap = self.view.rule_capacity
        needy = [r for r in range(len(reqs)) if got[r].rules]
        for r in sorted(needy, key=lambda r: (-weight.get(keys[r], 0.0), r)):
            need = Counter(sw for sw, _ in got[r].rules)
            if all(used[sw] + n <= cap for sw, n in need.items()):
                used.update(need)
            else:
                unpinned += 1
                spilled.add(keys[r])
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
                                unpinned, dict(used), spilled=spilled)
