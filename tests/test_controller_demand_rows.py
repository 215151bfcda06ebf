"""A plan's demands held in columns (fabricpilot.controller.demand_rows): made when read, and
read, changed and iterated as the list and the dict of them would be."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fabricpilot.controller.demand_rows import ChainedDemands, DemandRows, DemandTable, JobDemands
from fabricpilot.controller.planner import Demand, DemandColumns


def _demands(task: str, n: int, seed: int) -> list[Demand]:
    """``n`` demands of job ``task`` as a call's pairs are made: one shared candidate tuple
    per leaf pair, one head and one tail link each, rates and parts that vary."""
    rng = random.Random(seed)
    tuples = [((10 + t, 20 + t), (11 + t, 21 + t)) for t in range(3)]
    return [Demand(f"{task}:{i}->{i + 1}", rng.choice([12.5, 50.0, 100.0]),
                   tuples[rng.randrange(3)], 1.5, (rng.randrange(5),), (5 + rng.randrange(5),),
                   rng.random() < 0.3, rng.randrange(2), rng.choice([1, 2, 4]))
            for i in range(n)]


def _rows(ds: list[Demand]) -> DemandRows:
    cols = DemandColumns.of(ds)
    assert cols is not None
    return DemandRows(cols, [d.head for d in ds], [d.tail for d in ds])


@pytest.mark.parametrize("seed", range(3))
def test_rows_make_the_demands_their_columns_describe(seed: int) -> None:
    """Read one by one (from either end, some twice: the same object), sliced and iterated:
    the demands the columns were made of, field by field."""
    ds = _demands("j", 40, seed)
    rows = _rows(ds)
    early = {i: rows[i] for i in (0, 7, -1)}
    assert rows[-1] is rows[39] is early[-1] and early[7] == ds[7]
    assert rows[3:9] == ds[3:9] and len(rows) == 40
    assert list(rows) == ds and all(rows[i] is d for i, d in early.items())
    assert [type(x) for x in rows[5]] == [type(x) for x in ds[5]]
    with pytest.raises(IndexError):
        rows[40]
    with pytest.raises(ValueError, match="head and tail"):
        DemandRows(DemandColumns.of(ds), [d.head for d in ds[1:]], [d.tail for d in ds])


def test_a_table_reads_as_the_dict_of_its_rows() -> None:
    ds = _demands("j", 25, 4)
    table = DemandTable(_rows(ds))
    want = {d.key: d for d in ds}
    assert dict(table) == want and list(table) == list(want) and len(table) == 25
    assert table.get("j:3->4") == want["j:3->4"] and table.get("j:99->0", 7) == 7
    assert "j:0->1" in table and "k:0->1" not in table
    assert list(table.values()) == ds and set(table.items()) == set(want.items())


def test_a_tables_key_index_is_made_when_first_read_or_asked_for() -> None:
    """A job's table makes its index of keys the first time a key is looked up, or when
    the jobs' demands are asked to make theirs (as a plan does while its placement runs):
    only the tables without one, each once."""
    a, b = (DemandTable(_rows(_demands(t, 6, 1))) for t in ("a", "b"))
    jobs = JobDemands()
    jobs.add_job("a", a)
    jobs.add_job("b", b)
    assert jobs.unindexed() == [a, b]
    assert jobs["b:2->3"] is b.rows[2]  # (a lookup makes b's index)
    assert jobs.unindexed() == [a]
    kept = b.row_of
    jobs.index()
    assert jobs.unindexed() == [] and b.row_of is kept
    assert a.row_of == {f"a:{i}->{i + 1}": i for i in range(6)}


def _ops(seed: int, base: dict[str, Demand], n: int) -> list[tuple[str, str, Demand | None]]:
    rng = random.Random(seed)
    keys = list(base) + [f"x:{i}->0" for i in range(8)]
    vals = list(base.values())
    out: list[tuple[str, str, Demand | None]] = []
    for _ in range(n):
        op = rng.choice(["set", "del", "pop", "get", "in", "update"])
        out.append((op, rng.choice(keys), rng.choice(vals)._replace(weight=rng.random())))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_job_demands_read_and_change_as_a_dict_would(seed: int) -> None:
    """Every job's demands as tables (one a plain dict), through random sets, deletions,
    pops, reads and updates, against a dict of them put through the same: the same
    contents, order, length and answers after every step."""
    jobs = {"a": DemandTable(_rows(_demands("a", 12, seed))),
            "b": {d.key: d for d in _demands("b", 5, seed + 1)},
            "c": DemandTable(_rows(_demands("c", 9, seed + 2)))}
    m = JobDemands()
    d: dict[str, Demand] = {}
    for task, table in jobs.items():
        m.add_job(task, table)
        d.update(table)
    assert list(m.values()) == list(d.values())
    for op, key, val in _ops(seed, d, 150):
        assert val is not None
        if op == "set":
            m[key] = d[key] = val
        elif op == "del":
            if key in d:
                del m[key], d[key]
            else:
                with pytest.raises(KeyError):
                    del m[key]
        elif op == "pop":
            assert m.pop(key, None) == d.pop(key, None)
        elif op == "get":
            assert m.get(key) == d.get(key)
        elif op == "in":
            assert (key in m) == (key in d)
        else:
            m.update({key: val})
            d.update({key: val})
        assert len(m) == len(d) and list(m) == list(d)
    assert list(m.values()) == list(d.values()) and dict(m.items()) == d
    with pytest.raises(ValueError, match="once"):
        m.add_job("z", {})


def test_chained_demands_read_as_one_list() -> None:
    parts = [_demands("a", 4, 1), [], list(_demands("b", 3, 2))]
    chained = ChainedDemands([parts[0], iter(parts[1]), _rows(parts[2])])
    flat = [d for p in parts for d in p]
    assert len(chained) == 7 and list(chained) == flat
    assert [chained[i] for i in range(-7, 7)] == flat + flat
    assert chained[2:6] == flat[2:6]
    with pytest.raises(IndexError):
        chained[7]
    rng = np.random.default_rng(0)
    for i in rng.integers(0, 7, 10).tolist():
        assert chained[i] == flat[i]


def test_a_whole_plans_demands_know_their_key_order_as_sorted_gives_it() -> None:
    """Jobs whose task ids sort apart from their keys' text ("job-1" before "job:" ...),
    whose GPU ids have different numbers of digits (gpu 9 after 10 as text), on a fat tree:
    the key order the demands are made with is the order ``sorted`` gives their keys, and
    the demands made when read are those the one-by-one way makes."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.intents import CommCall, Intent
    from fabricpilot.topology import compile_topology, fat_tree

    twin = TaskAware(PolicyContext(compile_topology(fat_tree(k=4, gpus_per_host=1)), 1, 600))
    ctl = Controller(twin)
    gpus = list(range(16))
    random.Random(2).shuffle(gpus)
    for task, ranks in (("job", gpus[:7]), ("job-1", gpus[7:12]), ("a", gpus[12:])):
        ctl.declare(Intent(task, "t", tuple(ranks), (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
    made = ctl.demands()
    cols_made = ctl._demand_cols
    assert cols_made is not None and cols_made[0] is made
    cols = cols_made[1]
    assert cols.by_key is not None
    assert cols.by_key.tolist() == sorted(range(len(cols.keys)), key=cols.keys.__getitem__)
    assert [d.key for d in made] == cols.keys and len(made) == 7 * 6 + 5 * 4 + 4 * 3
    assert isinstance(ctl._demand, JobDemands)
    assert all(ctl._demand[d.key] is d for d in made)
    # a plan makes the key indexes of the jobs while its placement runs
    ctl.plan()
    assert isinstance(ctl._demand, JobDemands) and len(ctl._demand.tables) == 3
    assert ctl._demand.unindexed() == []


def test_a_plans_batch_rows_are_found_job_by_job_as_key_by_key() -> None:
    """After a whole plan (its batch's rows found through the jobs' tables), one job left,
    another changed and some keys deleted and set since: each planned key's row in the
    installed batch, found a job's block at a time, is the one the installed map gives key
    by key (-1 for a key deleted or set since, or new)."""
    from fabricpilot.balancing import PolicyContext
    from fabricpilot.balancing.task_aware import TaskAware
    from fabricpilot.controller.core import Controller
    from fabricpilot.controller.demand_rows import JobRows
    from fabricpilot.controller.intents import CommCall, Intent
    from fabricpilot.controller.southbound import BatchMap
    from fabricpilot.topology import compile_topology, fat_tree

    twin = TaskAware(PolicyContext(compile_topology(fat_tree(k=4, gpus_per_host=1)), 1, 600))
    ctl = Controller(twin)
    call = (CommCall("alltoall", 64 << 20, 1000.0, 0),)
    for task, ranks in (("a", range(0, 5)), ("b", range(5, 10)), ("c", range(10, 16))):
        ctl.declare(Intent(task, "t", tuple(ranks), call))
    ctl.plan()
    held = ctl._installed
    assert isinstance(held, BatchMap) and isinstance(held.batch.row_of, JobRows)
    ctl.withdraw("b")
    ctl.declare(Intent("c", "t", tuple(range(9, 16)), call))
    keys = [d.key for d in ctl.demands()]
    gone = [k for k in held if k.startswith("a:")][:2]
    for k in gone:
        del held[k]
    again = [k for k in held if k.startswith("c:")][:2]
    for k in again:
        held[k] = held[k]
    at = ctl._batch_rows(keys, held)
    want = [-1 if r is None else r for r in map(held.row, keys)]
    assert at.tolist() == want
    assert 0 < sum(r >= 0 for r in want) < len(keys) and any(r < 0 for r in want)
