"""Demand keys made when first read whole (fabricpilot.controller.keys): read as the list of
the same keys would be, and made by a whole plan while its placement runs."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from fabricpilot.controller.core import rule_key
from fabricpilot.controller.keys import (
    ChainedKeys,
    Keys,
    PairKeys,
    PairRows,
    key_index,
    made,
    unmade,
)


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


@pytest.mark.parametrize(("seed", "made_first"), [(0, False), (1, True), (2, False)])
def test_a_pair_keys_index_finds_each_row_as_the_dict_of_its_keys(seed: int,
                                                                  made_first: bool) -> None:
    """A job's key index (a table of its pairs' rows, no dict of key strings) finds every
    key's row and no other text's, as the dict of the keys does: texts that parse to a
    pair's GPU ids but are not its key (leading zeros, a sign, an underscore, spaces), a
    pair the job lacks, another job's prefix, a GPU the job lacks or the fabric lacks."""
    rng = np.random.default_rng(seed)
    names = [str(g) for g in range(300)]
    gpus = rng.choice(300, 24, replace=False)  # (an AlltoAll of 24 of them, most pairs)
    a, b = np.meshgrid(gpus, gpus, indexing="ij")
    keep = (a != b).ravel() & (rng.random(24 * 24) < 0.8)
    src, dst = a.ravel()[keep], b.ravel()[keep]
    keys = PairKeys("job7:", names, src, dst)
    if made_first:
        keys.list()
    rows = key_index(keys)
    assert isinstance(rows, PairRows) and len(rows) == len(src)
    want = {rule_key("job7", int(x), int(y)): i for i, (x, y) in enumerate(zip(src, dst,
                                                                               strict=True))}
    assert all(rows[k] == i for k, i in want.items()) and list(rows) == list(want)
    x, y = (int(g) for g in gpus[:2])
    outside = int(np.setdiff1d(np.arange(300), gpus)[0])
    texts = [f"job7:0{x}->{y}", f"job7:+{x}->{y}", f"job7: {x}->{y}", f"job7:{x}->{y} ",
             f"job7:{x}_0->{y}", f"job7:{x}->{x}", f"job7:{x}->{outside}", f"job7:{x}->300",
             f"job7:{x}-{y}", f"job7:{x}->", f"job:{x}->{y}", f"job70:{x}->{y}", "job7:",
             *(rule_key("job7", int(p), int(q)) for p, q in zip(gpus, gpus[::-1],
                                                                  strict=True))]
    for text in texts:
        assert rows.get(text) == want.get(text), text
        assert (text in rows) == (text in want), text
    with pytest.raises(KeyError):
        rows[f"job7:0{x}->{y}"]
    assert rows.get(7) is None and 7 not in rows


def test_a_pair_keys_index_is_the_dict_where_a_table_does_not_serve() -> None:
    """Names that are not the GPUs' ids, a repeated pair (the dict keeps its last row) and
    a ring over many GPUs (a table mostly empty) are indexed by the dict of their keys."""
    ring = np.arange(2000)
    cases = [PairKeys("j:", ["a", "b", "c"], np.array([0, 1]), np.array([1, 2])),
             PairKeys("j:", ["0", "1", "2"], np.array([0, 1, 0]), np.array([1, 2, 1])),
             PairKeys("j:", [str(g) for g in range(2000)], ring, np.roll(ring, -1))]
    for keys in cases:
        got = key_index(keys)
        assert type(got) is dict and got == {k: i for i, k in enumerate(keys)}
    assert key_index(cases[1])["j:0->1"] == 2


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
    # every job's keys indexed once the plan is made (in time or after its placement)
    assert not ctl._demand.unindexed()
    assert all(ctl._demand.tables[t].row_of.get(k) == i for t in ("a", "b")
               for i, k in enumerate(ctl._demand.tables[t]))


@pytest.mark.parametrize("bulk", [3, 10_000])
def test_many_keys_at_once_are_found_as_one_by_one(monkeypatch, bulk: int) -> None:
    """The jobs' rows looked up many at once (past ``BULK_KEYS``: through the dicts of the
    jobs looked up, made then) are those found one by one, misses included; and a job's
    demands' membership the same. Only the jobs whose keys were looked up at once have
    their table of pairs replaced by the dict."""
    from fabricpilot.controller import demand_rows
    from fabricpilot.controller.demand_rows import (
        DemandRows,
        DemandTable,
        JobDemands,
        JobRows,
    )
    from fabricpilot.controller.planner import Demand, DemandColumns
    from fabricpilot.controller.southbound import BatchMap

    monkeypatch.setattr(demand_rows, "BULK_KEYS", bulk)
    names = [str(g) for g in range(20)]
    tables, jobs = {}, JobDemands()
    for j, gpus in enumerate(([1, 4, 7, 9], [2, 3, 5], [0, 11, 13, 17, 19])):
        src, dst = (np.array(x) for x in zip(*[(a, b) for a in gpus for b in gpus if a != b],
                                              strict=True))
        keys = PairKeys(f"j{j}:", names, src, dst)
        cols = dataclasses.replace(DemandColumns.of([Demand(k, 1.0, ((5,),)) for k in keys]),
                                   keys=keys)
        n = len(src)
        tables[f"j{j}"] = DemandTable(DemandRows(cols, [()] * n, [()] * n))
        jobs.add_job(f"j{j}", tables[f"j{j}"])
    rows = JobRows(tables)
    every = [k for t in tables.values() for k in t]
    asked = [*(k for k in every if k.startswith(("j0:", "j2:"))), "j0:1->2", "j5:1->4",
             "j2:0->11", "x", "j2:11->11"]
    want = [rows.get(k) for k in asked]
    assert want == [every.index(k) if k in every else None for k in asked]
    assert want[-5:] == [None, None, every.index("j2:0->11"), None, None]
    assert all(type(t.row_of) is PairRows for t in tables.values())
    assert rows.get_many(asked) == want
    assert jobs._in_base_many(asked) == [k in every for k in asked]
    made_dict = {t: type(tables[t].row_of) is dict for t in tables}
    assert made_dict == {"j0": bulk == 3, "j1": False, "j2": bulk == 3}
    # a batch whose rows are the jobs' reads them so, values and all, and a batch of keys
    # added since (one set again: counted once) counts the new ones
    class Bulk:
        keys, row_of = every, rows

        def __len__(self) -> int:
            return len(every)

    batch = BatchMap(Bulk(), lambda r: f"value {r}")
    assert batch.get_all(asked) == [None if r is None else f"value {r}" for r in want]
    batch.update((k, "new") for k in asked)
    assert len(batch) == len(every) + len({k for k in asked if k not in every}) == 42
    assert batch.get_all(asked) == ["new"] * len(asked)
