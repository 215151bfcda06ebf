"""Random intents on real fabrics: the controller's promises hold for any mix of calls.

Jobs of 2-8 random GPUs (half of the jobs on one leaf), each with 1-3 calls of random
patterns, SLAs (levels L1-L3), priorities and explicit pairs, planned together on a
leaf-spine (GPUs of a host on one leaf, NVLink between them), a fat-tree (k = 4) and a
rail-optimised 2:1 leaf-spine; then a fabric link goes down and one job is re-planned by
itself. After each step:

* every installed path of a GPU pair lies in the scope of the strictest call using it;
* a pair is held to ``l3_rate_cap`` of its NIC exactly when an L1/L2 call is declared, only
  L3 calls use it and a planned path of it leaves by the NIC;
* a job told its SLA cannot be met has nothing installed;
* a pair is planned at the highest priority of the calls using it.

Then random sequences of what happens to a running controller (links down and back up,
links gray and restored, a job withdrawn, a job declared, whole re-plans), checked after
each step for the same and: no installed path crosses a link that is down or gray where an
in-scope path avoids them all, none crosses a link that is down (unless its job is cut
off), each path set's weights add up to 1, a withdrawn job has nothing installed; the room
the plan keeps for jobs whose SLA is unmet is theirs only, never installed, each pair whole
on one path, and off links that are down wherever a path avoids them; each job's keys in
the plan are found from its demands as planned, as a scan of every key finds them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from fabricpilot.balancing import PolicyContext
from fabricpilot.balancing.task_aware import fabric_view
from fabricpilot.controller.core import Controller, pair_of_key, rule_key
from fabricpilot.controller.intents import LEVELS, CommCall, Intent
from fabricpilot.controller.params import ControllerParams
from fabricpilot.controller.patterns import pattern_pairs
from fabricpilot.controller.ranking import in_scope
from fabricpilot.controller.southbound import FabricView, PathSet, PortDelta
from fabricpilot.topology import compile_topology
from fabricpilot.topology.builders import build_topology

FABRICS = (
    ("leaf_spine", {"hosts": 8, "gpus_per_host": 2, "nics_per_leaf": 4,
                    "oversubscription": 1.0, "rail_optimized": False}),
    ("fat_tree", {"k": 4, "gpus_per_host": 1}),
    ("leaf_spine", {"hosts": 4, "gpus_per_host": 4, "nics_per_leaf": 8,
                    "oversubscription": 2.0, "rail_optimized": True}),
)
SLAS_US = (30.0, 80.0, 500.0, 5000.0)  # L1, L2, L3, L3


class RecordingDataPlane:
    """A fabric view and the path sets installed, by key (the latest of each)."""

    def __init__(self, view: FabricView) -> None:
        self.view = view
        self.installed: dict[str, PathSet] = {}

    def fabric(self) -> FabricView:
        return self.view

    def telemetry(self) -> list[PortDelta]:
        return []

    def install(self, rules: list[PathSet]) -> None:
        self.installed.update((r.key, r) for r in rules)

    def remove(self, keys: list[str]) -> None:
        for k in keys:
            self.installed.pop(k, None)

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        pass

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        pass


def random_intents(rng: np.random.Generator, view: FabricView) -> list[Intent]:
    """1-4 jobs, half of them on the GPUs of one leaf (where L1 / L2 can be met)."""
    gpu_of = {node: g for g, node in view.gpu_node.items()}
    leaf_of = {gpu_of[info.src]: info.dst for info in view.links.values()
               if info.kind == "nic" and info.src in gpu_of}
    n_gpus = len(view.gpu_node)
    out = []
    for j in range(int(rng.integers(1, 5))):
        pool = list(range(n_gpus))
        if rng.random() < 0.5:
            leaf = leaf_of[int(rng.integers(n_gpus))]
            pool = [g for g in pool if leaf_of[g] == leaf]
        size = int(rng.integers(2, min(8, len(pool)) + 1))
        gpus = tuple(int(g) for g in rng.choice(pool, size, replace=False))
        calls = []
        for _ in range(int(rng.integers(1, 4))):
            pairs: tuple[tuple[int, int], ...] = ()
            if rng.random() < 0.4:
                picks = (rng.choice(gpus, 2, replace=False) for _ in range(rng.integers(1, 5)))
                pairs = tuple(dict.fromkeys((int(a), int(b)) for a, b in picks))
            calls.append(CommCall(str(rng.choice(["allreduce", "alltoall", "allgather"])),
                                  int(rng.integers(1, 1 << 28)), float(rng.choice(SLAS_US)), 0,
                                  int(rng.integers(0, 3)), pairs))
        out.append(Intent(f"job{j}", "t", gpus, tuple(calls)))
    return out


def calls_of_pairs(intent: Intent, host_of: dict[int, int]) -> dict[str, list[CommCall]]:
    """Each GPU pair's key and the calls that use it (GPUs on hosts as ``host_of`` says)."""
    out: dict[str, list[CommCall]] = {}
    for call in intent.calls:
        pairs = call.pairs or [(a, b) for a, b, _ in pattern_pairs(call.pattern, intent.gpus,
                                                                   host_of)]
        for a, b in pairs:
            out.setdefault(rule_key(intent.task_id, a, b), []).append(call)
    return out


def check(ctl: Controller, dp: RecordingDataPlane, intents: list[Intent]) -> None:
    view = dp.view
    # the data plane holds exactly the sets the controller thinks it does (none of a pair
    # the plan dropped is left behind)
    assert dp.installed == ctl._installed
    # L3 pairs are capped while a job with an L1/L2 call is planned (one no path serves
    # holds no one)
    strict = any(any(c.level != "L3" for c in i.calls) and i.task_id not in ctl.sla_unmet
                 and i.task_id not in ctl.partitioned for i in intents)
    for intent in intents:
        task = intent.task_id
        if task in ctl.sla_unmet:
            assert not any(k.startswith(f"{task}:") for k in ctl._installed)
            continue
        for key, calls in calls_of_pairs(intent, ctl.host_of).items():
            held = ctl._installed.get(key)
            if held is None:
                continue
            levels = [c.level for c in calls]
            strictest = min(levels, key=LEVELS.index)
            assert ctl._demand[key].priority == max(c.priority for c in calls)
            a, b = pair_of_key(key)  # (each path runs from the key's source to its destination)
            assert all(view.link(p[0]).src == view.gpu_node[a]
                       and view.link(p[-1]).dst == view.gpu_node[b] for p in held.paths), key
            if task not in ctl.partitioned:
                for path in held.paths:
                    nodes = [view.link(path[0]).src] + [view.link(lk).dst for lk in path]
                    assert in_scope(view, nodes, strictest), (key, levels, nodes)
                # off links down or gray wherever an in-scope path avoids them all
                avoid = ctl.down | ctl.degraded
                if avoid and not all(avoid.isdisjoint(p) for p in held.paths):
                    clean = [p for p in ctl.candidates(a, b) if avoid.isdisjoint(p) and in_scope(
                        view, [view.link(p[0]).src] + [view.link(lk).dst for lk in p], strictest)]
                    assert not clean, (key, held.paths, clean, avoid)
            by_nic = any(view.link(p[0]).kind == "nic" for p in held.paths)
            capped = strict and strictest == "L3" and by_nic
            assert (held.rate_cap_gbps < math.inf) == capped, (key, levels, held)
            if capped:
                assert held.rate_cap_gbps == pytest.approx(0.8 * 400.0)


def planned(seed: int, rng: np.random.Generator,
            ) -> tuple[Controller, RecordingDataPlane, list[Intent], list[int]]:
    """A controller on fabric ``seed`` (of :data:`FABRICS`) with random intents planned,
    its data plane, the intents and the fabric's switch-to-switch links."""
    kind, params = FABRICS[seed % len(FABRICS)]
    ct = compile_topology(build_topology(kind, **params))
    dp = RecordingDataPlane(fabric_view(PolicyContext(ct, seed, 600)))
    ctl = Controller(dp, ControllerParams(parts=int(rng.choice([1, 2, 3, 4, 6, 16]))))
    intents = random_intents(rng, dp.view)
    for intent in intents:
        ctl.declare(intent)
    ctl.plan()
    return ctl, dp, intents, [lk for lk, info in dp.view.links.items() if info.kind == "fabric"]


@pytest.mark.parametrize("seed", range(18))
def test_random_intents_keep_scope_caps_and_unmet_promises(seed: int) -> None:
    ctl, dp, intents, fabric = planned(seed, rng := np.random.default_rng(seed))
    check(ctl, dp, intents)
    ctl.on_links_changed([int(rng.choice(fabric))], [])
    check(ctl, dp, intents)
    ctl.plan_jobs({str(rng.choice([i.task_id for i in intents]))})
    check(ctl, dp, intents)


def check_held(ctl: Controller, intents: list[Intent]) -> None:
    declared = {i.task_id for i in intents}
    for key, held in ctl._installed.items():
        task = key.rsplit(":", 1)[0]
        assert task in declared, key
        assert sum(held.weights) == pytest.approx(1.0)
        if task not in ctl.partitioned:
            assert all(ctl.down.isdisjoint(p) for p in held.paths), (key, ctl.down)
    assert ctl.current is not None
    # each job's keys in the plan as plan_jobs finds them (from its demands as planned, not
    # by reading every key of the plan): those a scan of the plan finds
    in_plan: dict[str, set[str]] = {}
    for key in ctl.current.paths:
        in_plan.setdefault(key.rsplit(":", 1)[0], set()).add(key)
    for task in declared | set(in_plan) | set(ctl._planned):
        found = ctl._planned_keys({task})
        assert len(found) == len(set(found)) and set(found) == in_plan.get(task, set()), task
    # the room kept for jobs whose SLA is unmet: theirs only, never installed, each pair
    # whole on one path, off links down wherever a path avoids them
    for key in ctl.reserved_keys:
        assert key.rsplit(":", 1)[0] in ctl.sla_unmet and key not in ctl._installed, key
        shares = ctl.current.paths.get(key)
        if shares is None:  # (no live path: no room)
            continue
        ((path, w),) = shares
        assert w == pytest.approx(1.0)
        a, b = pair_of_key(key)
        if not ctl.down.isdisjoint(path):
            assert all(not ctl.down.isdisjoint(p) for p in ctl.candidates(a, b)), (key, path)


@pytest.mark.parametrize("seed", range(12))
def test_random_events_keep_the_promises(seed: int) -> None:
    ctl, dp, intents, fabric = planned(seed, rng := np.random.default_rng(1000 + seed))
    for step in range(12):
        event = int(rng.integers(0, 7))
        if event == 0:
            ctl.on_links_changed([int(rng.choice(fabric))], [])
        elif event == 1 and ctl.down:
            ctl.on_links_changed([], [int(rng.choice(sorted(ctl.down)))])
        elif event == 2:
            ctl.on_links_degraded([int(rng.choice(fabric))])
        elif event == 3 and ctl.degraded:
            ctl.on_links_restored([int(rng.choice(sorted(ctl.degraded)))])
        elif event in (4, 5):
            if event == 4 and intents:
                task = intents.pop(int(rng.integers(len(intents)))).task_id
                ctl.withdraw(task)
            else:
                new = replace(random_intents(rng, dp.view)[0], task_id=f"new{step}")
                intents.append(new)
                ctl.declare(new)
                task = new.task_id
            if ctl.plan_jobs({task}) is None:
                ctl.plan()
        else:
            ctl.plan()
        check(ctl, dp, intents)
        check_held(ctl, intents)
