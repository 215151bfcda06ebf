"""Demand keys made when first read whole (fabricpilot.controller.keys): read as the list of
the same keys would be, and made by a whole plan while its placement runs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fabricpilot.controller.core import rule_key
from fabricpilot.controller.keys import ChainedKeys, Keys, PairKeys, made, unmade


def _pairs(seed: int, n: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    names = [str(g) for g in range(40)]  # (ids of one and two digits)
    return names, rng.integers(0, 40, n), rng.integers(0, 40, n)


@pytest.mark.parametrize("seed", range(4))
def test_pair_keys_read_as_the_list_of_rule_keys(seed: int) -> None:
    names, src, dst = _pairs(seed, 30)
    want = [rule_key("job-1", int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    rng = random.Random(seed)
    keys = PairKeys("job-1:", names, src, dst)
    # one by one (from either end), before the list is made: each key made by itself
    for i in rng.sample(range(-30, 30), 12):
        assert keys[i] == want[i]
    assert not keys.made and len(keys) == 30
    with pytest.raises(IndexError):
        keys[30]
    # a slice, iteration, equality (either side) make the list, once
    assert keys[3:9] == want[3:9] and keys.made
    first = keys.list()
    assert list(keys) == want and keys == want and want == keys and keys.list() is first
    assert keys != want[:-1] and keys != ["x"] * 30 and sorted(keys) == sorted(want)
    assert "job-1:" + names[int(src[4])] + "->" + names[int(dst[4])] in keys
    assert keys.index(want[7]) == want.index(want[7])


def test_chained_keys_read_as_their_parts_one_after_the_other() -> None:
    names, src, dst = _pairs(7, 12)
    a = PairKeys("a:", names, src[:5], dst[:5])
    b = PairKeys("b:", names, src[5:], dst[5:])
    plain = ["c:1->2", "c:2->1"]
    chained = ChainedKeys([a, [], plain, b])
    want = [*[rule_key("a", int(x), int(y)) for x, y in zip(src[:5], dst[:5], strict=True)],
            *plain, *[rule_key("b", int(x), int(y)) for x, y in zip(src[5:], dst[5:], strict=True)]]
    assert len(chained) == 14
    assert [chained[i] for i in range(-14, 14)] == want + want
    assert unmade(chained) and unmade(a) and not unmade(plain)
    assert made(chained) == want and not unmade(a) and not unmade(b)
    assert chained == ChainedKeys([want]) and repr(chained) == "ChainedKeys(14 keys)"
    with pytest.raises(ValueError, match="source and destination"):
        PairKeys("a:", names, src, dst[:3])
    assert isinstance(chained, Keys) and ChainedKeys([]) == []


def test_a_whole_plan_makes_its_keys_while_its_placement_runs() -> None:
    """A plan's demands come with their keys not made; the plan makes them (while its
    placement runs) and its paths, installed sets and demands are keyed by the same keys
    one by one."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.intents import CommCall, Intent
    from fabricpilot.topology import compile_topology, fat_tree

    twin = TaskAware(PolicyContext(compile_topology(fat_tree(k=4, gpus_per_host=1)), 1, 600))
    ctl = Controller(twin)
    gpus = list(range(16))
    random.Random(5).shuffle(gpus)
    for task, ranks in (("a", gpus[:9]), ("b", gpus[9:])):
        ctl.declare(Intent(task, "t", tuple(ranks), (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
    ctl.demands()
    cols = ctl._demand_cols
    assert cols is not None and unmade(cols[1].keys)
    ctl.plan()
    want = sorted(rule_key(t, x, y) for t, rs in (("a", gpus[:9]), ("b", gpus[9:]))
                  for x in rs for y in rs if x != y)
    assert ctl.current is not None and sorted(ctl.current.paths) == want
    assert sorted(ctl._installed) == want and sorted(ctl._demand) == want
    assert all(ctl._demand[k].key == k for k in want)
