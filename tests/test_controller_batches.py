"""A whole plan's path sets in columns: the batch, the table held over it, and the twin
holding it as it came."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from fabricpilot.balancing import PolicyContext
from fabricpilot.balancing.task_aware import TaskAware, _due_keys
from fabricpilot.controller.core import (
    _NO_SETS,
    Controller,
    _changed_rows,
    _changed_sets,
    _column_take,
    _kept_columns,
    _kept_rows,
    _kept_sets,
    _merged_batch,
    _qp_columns,
)
from fabricpilot.controller.intents import CommCall, Intent
from fabricpilot.controller.planner import Demand
from fabricpilot.controller.southbound import (
    BatchMap,
    PathColumn,
    PathSet,
    PathSetBatch,
    get_all,
)


def _columns(seed: int, n: int) -> tuple[list[str], np.ndarray, list, list, list, list, list]:
    """Random columns of ``n`` sets: most of one path, some of two to four, a few with
    explicit rules, a few rate-capped."""
    rng = random.Random(seed)
    keys = [f"j{seed}:{i}->{i + 1}" for i in range(n)]
    count = [1 if rng.random() < 0.7 else rng.randint(2, 4) for _ in range(n)]
    first = np.concatenate(([0], np.cumsum(count))).astype(np.int64)
    total = int(first[-1])
    paths = [tuple(rng.randint(0, 50) for _ in range(rng.randint(1, 4))) for _ in range(total)]
    weights = [rng.choice([1.0, 0.5, 0.25]) for _ in range(total)]
    ports = [rng.randint(49152, 65535) for _ in range(total)]
    rules = [((f"s{rng.randint(0, 3)}", rng.randint(0, 50)),) if rng.random() < 0.1 else ()
             for _ in range(total)]
    caps = [rng.choice([math.inf, 100.0, 320.0]) for _ in range(n)]
    return keys, first, paths, weights, ports, rules, caps


def _by_hand(cols: tuple) -> list[PathSet]:
    """The sets the columns describe, made one by one with the constructor."""
    keys, first, paths, weights, ports, rules, caps = cols
    out = []
    for i, k in enumerate(keys):
        lo, hi = int(first[i]), int(first[i + 1])
        out.append(PathSet(k, tuple(paths[lo:hi]), tuple(weights[lo:hi]), tuple(ports[lo:hi]),
                           tuple(rules[lo:hi]), caps[i]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_reads_as_the_sets_its_columns_describe(seed: int) -> None:
    """Set by set, sliced, iterated (some read before, which stay the objects they were) and
    compared: the sets the constructor makes from the same fields; each key's row; every
    explicit rule's switch once."""
    cols = _columns(seed, 60)
    want = _by_hand(cols)
    batch = PathSetBatch(*cols)
    assert len(batch) == 60 and all(s is None for s in batch.made)
    early = {i: batch[i] for i in (0, 7, -1)}
    assert early[-1] == want[-1] and batch[-1] is early[-1] and batch[59] is early[-1]
    assert batch[3:9] == want[3:9]
    assert list(batch) == want and batch == want and want == batch
    assert all(batch[i] is s for i, s in early.items())
    assert batch.row_of == {k: i for i, k in enumerate(cols[0])}
    assert sorted(batch.rule_switches()) == sorted(sw for s in want for rl in s.rules
                                                   for sw, _ in rl)
    with pytest.raises(ValueError, match="disagree"):
        PathSetBatch(cols[0][:-1], *cols[1:])


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_of_array_columns_reads_as_the_one_of_lists(seed: int) -> None:
    """Shares and ports as arrays (as a whole plan's steering leaves them): set by set,
    iterated, pickled and merged, the sets of the same columns as lists, their shares and
    ports Python floats and ints (a set goes to the data plane, and to JSON, as it is)."""
    import pickle

    cols = _columns(seed, 40)
    keys, first, paths, weights, ports, rules, caps = cols
    want = _by_hand(cols)
    arrays = (keys, first, paths, np.array(weights), np.array(ports, np.int64), rules, caps)
    for got in (PathSetBatch(*arrays)[i] for i in range(40)):
        assert got == want[keys.index(got.key)]
        assert all(type(w) is float for w in got.weights)
        assert all(type(p) is int for p in got.ports)
    whole = list(PathSetBatch(*arrays))
    assert whole == want
    assert {type(x) for s in whole for x in (*s.weights, *s.ports)} == {float, int}
    assert list(pickle.loads(pickle.dumps(PathSetBatch(*arrays)))) == want
    # merged: kept rows and new sets, both batches of arrays, give an array batch that
    # reads as the merge of the batches of lists
    other = _columns(seed + 10, 10)
    rows = np.array([3, -1, 0, -1, 39, 12, -1, -1], np.int64)
    m_keys = [f"m{i}" for i in range(len(rows))]
    m_caps = [1.0] * len(rows)
    n_new = int((rows < 0).sum())
    cut = int(other[1][n_new])
    fresh_l = (other[0][:n_new], other[1][:n_new + 1], other[2][:cut], other[3][:cut],
               other[4][:cut], other[5][:cut], other[6][:n_new])
    fresh_a = (*fresh_l[:3], np.array(fresh_l[3]), np.array(fresh_l[4], np.int64),
               *fresh_l[5:])
    as_lists = _merged_batch(PathSetBatch(*cols), rows, PathSetBatch(*fresh_l), m_keys,
                             m_caps)
    as_arrays = _merged_batch(PathSetBatch(*arrays), rows, PathSetBatch(*fresh_a), m_keys,
                              m_caps)
    assert isinstance(as_arrays.ports, np.ndarray) and isinstance(as_arrays.weights,
                                                                  np.ndarray)
    assert list(as_arrays) == list(as_lists)
    # one batch of arrays, one of lists: lists
    mixed = _merged_batch(PathSetBatch(*arrays), rows, PathSetBatch(*fresh_l), m_keys,
                          m_caps)
    assert list(mixed) == list(as_lists) and isinstance(mixed.ports, list)
    # kept rows only (the new sets an empty batch of lists, as an install's changed rows
    # take them): the rows of the arrays, still arrays
    kept = np.array([5, 0, 39, 12], np.int64)
    only = _merged_batch(PathSetBatch(*arrays), kept, _NO_SETS, [keys[r] for r in kept],
                         [caps[r] for r in kept])
    assert isinstance(only.ports, np.ndarray) and isinstance(only.weights, np.ndarray)
    assert only.ports.dtype == np.int64
    assert list(only) == [want[r] for r in kept.tolist()]


def _ops(seed: int, keys: list[str], values: list[PathSet], n: int
         ) -> list[tuple[str, object]]:
    """A random sequence of dict operations over the batch's keys and some new ones."""
    rng = random.Random(seed)
    extra = [f"new:{i}" for i in range(10)]
    out: list[tuple[str, object]] = []
    for _ in range(n):
        k = rng.choice(keys + extra)
        v = rng.choice(values)
        out.append(rng.choice([("set", (k, v)), ("del", k), ("pop", k), ("get", k),
                               ("update", [(rng.choice(keys + extra), rng.choice(values))
                                           for _ in range(rng.randint(1, 4))]),
                               ("pop_all", list(dict.fromkeys(rng.sample(keys + extra, 3))))]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_map_reads_and_changes_as_a_dict_would(seed: int) -> None:
    """The same random sets, deletes (a batch's key, one set since, one added), pops,
    updates (a key twice in one) and reads on a dict made of the batch and on the map
    over it: the same items in the same order, length, membership and values, after
    every step."""
    cols = _columns(100 + seed, 25)
    batch = PathSetBatch(*cols)
    d: dict[str, PathSet] = dict(zip(cols[0], _by_hand(cols), strict=True))
    m = BatchMap(batch, batch.__getitem__)
    values = _by_hand(_columns(200 + seed, 5))
    for op, arg in _ops(seed, cols[0], values, 300):
        if op == "set":
            k, v = arg  # type: ignore[misc]
            d[k] = m[k] = v  # type: ignore[assignment]
        elif op in ("del", "pop"):
            if arg in d:
                if op == "del":
                    del d[arg], m[arg]  # type: ignore[arg-type]
                else:
                    assert m.pop(arg) == d.pop(arg)  # type: ignore[arg-type]
            else:
                with pytest.raises(KeyError):
                    del m[arg]  # type: ignore[arg-type]
        elif op == "get":
            assert m.get(arg) == d.get(arg) and (arg in m) == (arg in d)  # type: ignore[arg-type]
        elif op == "update":
            d.update(arg)  # type: ignore[arg-type]
            m.update(arg)
        else:
            held = [k for k in arg if k in d]  # type: ignore[union-attr]
            assert m.pop_all(held) == [d.pop(k) for k in held]
        assert list(m) == list(d) and len(m) == len(d) and m == d
        probe = [*cols[0][::3], "new:1", "nobody"]
        assert get_all(m, probe) == get_all(d, probe) == [d.get(k) for k in probe]
    assert m.changed


def test_kept_rows_are_the_rows_of_the_sets_kept_sets_would_keep() -> None:
    """Over random installed sets (some deleted since) and planned shares (some as held,
    some moved, some with another cap, some with rules held, some skipped): the row
    :func:`_kept_rows` finds holds exactly the set :func:`_kept_sets` keeps."""
    rng = random.Random(5)
    cols = _columns(7, 80)
    batch = PathSetBatch(*cols)
    held = BatchMap(batch, batch.__getitem__)
    for k in rng.sample(cols[0], 6):
        del held[k]
    keys = list(cols[0])
    rng.shuffle(keys)
    keys += ["other:1->2"]
    shares, caps = [], []
    for k in keys:
        r = batch.row_of.get(k)
        s = batch[r] if r is not None else PathSet(k, ((1,),), (1.0,))
        planned = list(zip(s.paths, s.weights, strict=True))
        cap = s.rate_cap_gbps
        roll = rng.random()
        if roll < 0.15:
            planned = [((99, *planned[0][0]), planned[0][1]), *planned[1:]]
        elif roll < 0.25:
            cap = 7.0
        shares.append(planned)
        caps.append(cap)
    skip = set(rng.sample(keys, 5))
    rows = _kept_rows(keys, shares, caps, held, skip)
    sets = _kept_sets(keys, shares, caps, dict(held.items()), skip)
    assert [None if r < 0 else batch[r] for r in rows.tolist()] == sets
    assert 0 < sum(s is not None for s in sets) < len(keys)
    # the same keys in the batch's order, none deleted: row i for every key kept
    fresh = BatchMap(batch, batch.__getitem__)
    same = [list(zip(s.paths, s.weights, strict=True)) for s in batch]
    got = _kept_rows(batch.keys, same, list(batch.caps), fresh)
    assert got.tolist() == [-1 if any(s.rules) else i for i, s in enumerate(batch)]


def test_a_merged_batch_takes_the_kept_rows_and_the_new_sets_in_the_plans_order() -> None:
    """Kept rows (read before: the same objects) and fresh sets interleaved in a new key
    order read as the sets themselves, fields and caps; all rows kept in order gives the
    batch back."""
    old_cols = _columns(11, 30)
    old = PathSetBatch(*old_cols)
    new_cols = _columns(12, 10)
    new = PathSetBatch(*new_cols)
    early = old[4]
    rng = random.Random(3)
    kept = rng.sample(range(30), 20)
    plan: list[tuple[str, int, PathSet]] = [(old.keys[r], r, old[r]) for r in kept]
    plan += [(new.keys[j], -1, s) for j, s in enumerate(_by_hand(new_cols))]
    order = list(range(len(plan)))
    fresh_order = [i for i in order if plan[i][1] < 0]
    rng.shuffle(order)
    # (the fresh sets keep their order among themselves: the batch of them is in it)
    it = iter(fresh_order)
    order = [next(it) if plan[i][1] < 0 else i for i in order]
    keys = [plan[i][0] for i in order]
    rows = np.array([plan[i][1] for i in order], np.int64)
    caps = [plan[i][2].rate_cap_gbps for i in order]
    m = _merged_batch(old, rows, new, keys, caps)
    assert list(m) == [plan[i][2] for i in order]
    if 4 in kept:
        assert m[keys.index(old.keys[4])] is early
    none = PathSetBatch([], np.zeros(1, np.int64), [], [], [], [], [])
    assert _merged_batch(old, np.arange(30), none, list(old.keys), list(old.caps)) is old


def test_due_keys_go_by_the_last_time_each_key_was_given() -> None:
    """A batch due gives its keys but those given again since (they wait for their own
    time); keys given one by one are due at theirs, once; a batch not due waits."""
    new = {"b": 10.0, "x": 3.0}
    batches = [(["a", "b", "c"], 4.0), (["d"], 12.0)]
    due, later = _due_keys(new, batches, 2.0)
    assert due == [] and later == batches and new == {"b": 10.0, "x": 3.0}
    due, later = _due_keys(new, later, 4.0)
    assert due == ["x", "a", "c"] and later == [(["d"], 12.0)] and new == {"b": 10.0}
    due, later = _due_keys(new, later, 12.0)
    assert due == ["b", "d"] and later == [] and new == {}


def _twin_controller() -> tuple[TaskAware, Controller]:
    """A controller on the twin of a 64-GPU leaf-spine with two AlltoAll jobs declared."""
    from fabricpilot.nccltests import default_cluster

    ct = default_cluster(64)
    twin = TaskAware(PolicyContext(ct, 1, 600))
    ctl = Controller(twin)
    for j, ranks in enumerate((range(0, 32, 2), range(1, 32, 2))):
        ctl.declare(Intent(f"job{j}", "t", tuple(ranks),
                           (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
    return twin, ctl


def test_a_whole_plan_is_held_as_one_batch_by_the_controller_and_the_twin() -> None:
    """The first whole plan sends its sets as one batch, no set made: the controller and
    the twin hold it as it came (and the twin gives each key the time it takes effect).
    Read, they hold what the same sets given one by one to a fresh twin would, key for key
    and in order; a job planned again by itself then changes only its own keys."""
    twin, ctl = _twin_controller()
    rep = ctl.plan()
    held = ctl._installed
    assert isinstance(held, BatchMap) and isinstance(twin._rules, BatchMap)
    assert held.batch is twin._rules.batch and len(held) == rep.demands > 0
    assert all(s is None for s in held.batch.made)  # (none made to install them)
    other = TaskAware(PolicyContext(twin.ctx.topology, 1, 600))
    other.install(list(held.values()))
    assert list(twin._rules.items()) == list(other._rules.items())
    assert twin._new_batches and not twin._new_rules  # (all due at one time)
    before = dict(held)
    ctl.declare(Intent("job0", "t", tuple(range(32, 64, 2)),
                       (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
    assert ctl.plan_jobs({"job0"}) is not None
    job1 = [k for k in before if k.startswith("job1:")]
    job0 = [k for k in held if k.startswith("job0:")]
    assert ctl._installed is held and list(held) == job1 + job0  # (the new keys after)
    assert all(held[k] is before[k] for k in job1)
    assert job0 and not set(job0) & set(before)
    assert {k: s for k, (s, _) in twin._rules.items() if k not in twin._removing} == dict(held)
    assert set(twin._removing) == {k for k in before if k.startswith("job0:")}


def test_a_path_column_reads_as_the_tuples_it_holds() -> None:
    """Read one by one (from either end), in slices, whole, after some paths are set, and
    taken apart: the tuples the column's links make, path by path."""
    rng = random.Random(9)
    paths = [tuple(rng.randint(0, 99) for _ in range(rng.randint(1, 5))) for _ in range(40)]
    off = np.concatenate(([0], np.cumsum([len(p) for p in paths]))).astype(np.int64)
    col = PathColumn(np.fromiter((lk for p in paths for lk in p), np.int64), off)
    assert list(col) == paths and len(col) == 40
    assert [col[i] for i in range(-40, 40)] == paths + paths
    assert col[5:9] == tuple(paths[5:9]) and col[7:3] == () and col[::7] == tuple(paths[::7])
    with pytest.raises(IndexError):
        col[40]
    at = np.array([3, 0, 39, 3])
    assert list(_column_take(col, at)) == [paths[i] for i in at.tolist()]
    assert col.lengths().tolist() == [len(p) for p in paths] and not col.overlaid
    col[2] = (5,)
    col[-1] = (6, 7)
    assert col.overlaid and list(col) == [*paths[:2], (5,), *paths[3:39], (6, 7)]
    assert col[1:4] == (paths[1], (5,), paths[3])


def _mixed_demands(seed: int) -> tuple[list[Demand], dict[int, float]]:
    """Demands on a 4-leaf, 4-spine fabric, each with its own NIC links (head and tail) or
    none, of one part or several, some with shorter paths: every way the planner lists
    paths."""
    rng = random.Random(seed)
    up = {(lf, s): lf * 4 + s for lf in range(4) for s in range(4)}
    down = {(s, lf): 16 + s * 4 + lf for s in range(4) for lf in range(4)}
    cap = {lk: 400.0 for lk in range(32)}
    demands = []
    for i in range(60):
        a, b = rng.sample(range(4), 2)
        cands = tuple((up[(a, s)], down[(s, b)]) for s in range(4))
        if rng.random() < 0.2:  # (paths of another length: through one switch)
            cands = tuple((up[(a, s)],) for s in range(4))
        nic = rng.random() < 0.8
        head, tail = ((100 + i,), (200 + i,)) if nic else ((), ())
        if nic:
            cap[100 + i] = cap[200 + i] = 400.0
        parts = rng.choice([1, 1, 1, 2, 4])
        demands.append(Demand(f"d{i:02d}", float(rng.choice([25, 50, 100])), cands,
                              float(rng.randint(1, 3)), head, tail, parts == 1, 0, parts))
    return demands, cap


@pytest.mark.parametrize("seed", range(3))
def test_a_plans_paths_kept_in_columns_read_as_the_paths_the_planner_lists(seed: int) -> None:
    """The same demands planned with the paths listed per demand and kept in columns: the
    same keys in the same order, each with the same paths and shares; the columns' QPs are
    the listed paths one after the other, with their shares."""
    from fabricpilot.controller.planner import PathRows, plan_greedy

    demands, cap = _mixed_demands(seed)
    listed = plan_greedy(demands, cap, split=4)
    kept = plan_greedy(demands, cap, split=4, columnar=True)
    assert isinstance(kept.paths, BatchMap) and isinstance(kept.paths.batch, PathRows)
    assert list(kept.paths.items()) == list(listed.paths.items())
    assert kept.link_load_gbps == listed.link_load_gbps
    n, col, w = _qp_columns(kept.paths.batch)
    assert n.tolist() == [len(v) for v in listed.paths.values()]
    assert list(col) == [p for v in listed.paths.values() for p, _ in v]
    assert w.tolist() == [s for v in listed.paths.values() for _, s in v]
    assert 0 < len(kept.paths.batch.rest) < len(demands)  # (both kinds of demand)
    assert len({len(v[0][0]) for k, v in listed.paths.items()}) > 1  # (paths of two lengths)
    one = [d for d in demands if len(d.candidates[0]) == 2]  # (and of one length)
    assert list(plan_greedy(one, cap, split=4, columnar=True).paths.items()) == list(
        plan_greedy(one, cap, split=4).paths.items())


def _installed_in_columns(seed: int) -> tuple[PathSetBatch, list]:
    """A batch whose paths are a column, and its sets' shares as a plan lists them."""
    keys, first, paths, weights, ports, rules, caps = _columns(seed, 50)
    off = np.concatenate(([0], np.cumsum([len(p) for p in paths]))).astype(np.int64)
    col = PathColumn(np.fromiter((lk for p in paths for lk in p), np.int64), off)
    batch = PathSetBatch(keys, first, col, weights, ports, rules, caps)
    shares = [list(zip(s.paths, s.weights, strict=True)) for s in _by_hand(
        (keys, first, paths, weights, ports, rules, caps))]
    return batch, shares


@pytest.mark.parametrize("seed", range(4))
def test_kept_columns_are_the_rows_kept_rows_finds(seed: int) -> None:
    """A plan in columns against installed sets in columns, the same keys in order, some
    pairs changed (a link of a path, a share, a path more, the rate cap), some with rules,
    some skipped: :func:`_kept_columns` keeps exactly the rows :func:`_kept_rows` keeps
    reading the sets; keys in another order are not compared in columns."""
    rng = random.Random(seed)
    batch, shares = _installed_in_columns(20 + seed)
    planned = [list(s) for s in shares]
    caps = list(batch.caps)
    for i in range(len(planned)):
        roll = rng.random()
        if roll < 0.1:
            p, w = planned[i][0]
            planned[i][0] = ((*p[:-1], p[-1] + 1), w)
        elif roll < 0.2:
            planned[i][-1] = (planned[i][-1][0], planned[i][-1][1] / 2)
        elif roll < 0.3:
            planned[i].append(((3, 4), 0.5))
        elif roll < 0.35:
            caps[i] = 1.0
    n = np.array([len(s) for s in planned], np.int64)
    flat = [p for s in planned for p, _ in s]
    off = np.concatenate(([0], np.cumsum([len(p) for p in flat]))).astype(np.int64)
    col = PathColumn(np.fromiter((lk for p in flat for lk in p), np.int64), off)
    w = np.array([x for s in planned for _, x in s])
    held = BatchMap(batch, batch.__getitem__)
    skip = set(rng.sample(batch.keys, 4))
    got = _kept_columns(batch.keys, n, col, w, caps, held, skip)
    want = _kept_rows(batch.keys, planned, caps, held, skip)
    assert got is not None and got.tolist() == want.tolist()
    assert 0 < int((got >= 0).sum()) < len(planned)
    assert _kept_columns(batch.keys[::-1], n, col, w, caps, held, skip) is None
    # the plan's keys in another order, with a key the batch lacks; some of the batch's
    # deleted or set since: compared in columns through each key's batch row (``at``, as
    # the installed map finds it: -1 for a key deleted, set since or absent)
    order = list(range(len(planned)))
    rng.shuffle(order)
    keys = [batch.keys[i] for i in order] + ["new:0->1"]
    p2 = [planned[i] for i in order] + [[((9,), 1.0)]]
    c2 = [caps[i] for i in order] + [math.inf]
    for k in rng.sample(batch.keys, 3):
        del held[k]
    for k in rng.sample([k for k in batch.keys if k in held], 3):
        held[k] = held[k]
    n2 = np.array([len(x) for x in p2], np.int64)
    flat2 = [q for x in p2 for q, _ in x]
    off2 = np.concatenate(([0], np.cumsum([len(q) for q in flat2]))).astype(np.int64)
    col2 = PathColumn(np.fromiter((lk for q in flat2 for lk in q), np.int64), off2)
    w2 = np.array([x for y in p2 for _, x in y])
    at = np.array([-1 if r is None else r for r in map(held.row, keys)], np.int64)
    assert (at < 0).sum() == 7
    got2 = _kept_columns(keys, n2, col2, w2, c2, held, skip, at)
    want2 = _kept_rows(keys, p2, c2, held, skip)
    assert got2 is not None and got2.tolist() == want2.tolist() and (got2 >= 0).any()


@pytest.mark.parametrize("seed", range(4))
def test_changed_rows_are_the_sets_changed_sets_finds(seed: int) -> None:
    """New sets in columns against installed sets held as a batch in columns, some changed
    (a link, a share, a port, a rule, a path more, the rate cap), some set or deleted since
    in the installed map, some new: :func:`_changed_rows` finds exactly the sets
    :func:`_changed_sets` finds reading them one by one, and counts the keys held."""
    rng = random.Random(seed)
    old, _ = _installed_in_columns(40 + seed)
    keys, first, paths, weights, ports, rules, caps = (
        list(old.keys), old.first, list(old.paths), list(old.weights), list(old.ports),
        list(old.rules), list(old.caps))
    for i in range(len(keys)):
        q = int(first[i])
        roll = rng.random()
        if roll < 0.08:
            paths[q] = (*paths[q][:-1], paths[q][-1] + 1)
        elif roll < 0.16:
            weights[q] /= 2
        elif roll < 0.24:
            ports[q] += 1
        elif roll < 0.32:
            rules[q] = () if rules[q] else (("s9", 1),)
        elif roll < 0.36:
            caps[i] = 7.0
        elif roll < 0.42:
            paths.insert(q, (3, 4))
            weights.insert(q, 0.5)
            ports.insert(q, 50000)
            rules.insert(q, ())
            first = np.concatenate((first[:i + 1], first[i + 1:] + 1))
    keys.append("new:0->1")
    first = np.concatenate((first, [first[-1] + 1]))
    paths, weights, ports, rules = [*paths, (9,)], [*weights, 1.0], [*ports, 50001], [*rules, ()]
    caps.append(math.inf)
    off = np.concatenate(([0], np.cumsum([len(p) for p in paths]))).astype(np.int64)
    col = PathColumn(np.fromiter((lk for p in paths for lk in p), np.int64), off)
    new = PathSetBatch(keys, first, col, weights, ports, rules, caps)
    held = BatchMap(old, old.__getitem__)
    for k in rng.sample(old.keys, 3):
        del held[k]
    for k in rng.sample([k for k in old.keys if k in held], 3):
        held[k] = held[k]  # (set since: the same set, so not changed)
    for k in rng.sample([k for k in old.keys if k in held], 2):
        held[k] = held[k]._replace(ports=tuple(p + 2 for p in held[k].ports))
    at = np.array([-1 if r is None else r for r in map(held.row, keys)], np.int64)
    for idx in (np.arange(len(keys)), np.array(sorted(rng.sample(range(len(keys)), 20)))):
        got = _changed_rows(new, idx, at[idx], held)
        assert got is not None
        rows, n_held = got
        want = _changed_sets([new[i] for i in idx.tolist()], held)
        assert [new.keys[i] for i in idx[rows].tolist()] == [s.key for s in want]
        assert n_held == sum(new.keys[i] in held for i in idx.tolist())
        assert 0 < len(rows) < len(idx)


def test_a_merged_batch_of_columns_reads_as_one_of_tuples() -> None:
    """Kept rows of a batch in columns and new sets in columns, merged: the same sets as
    when the paths are tuples, their paths still a column."""
    old, _ = _installed_in_columns(31)
    new, _ = _installed_in_columns(32)
    rows = np.array([4, -1, 0, -1, 49, 10, -1], np.int64)
    keys = [f"k{i}" for i in range(len(rows))]
    fresh = PathSetBatch(new.keys[:3], new.first[:4], new.paths[:int(new.first[3])],
                         new.weights[:int(new.first[3])], new.ports[:int(new.first[3])],
                         new.rules[:int(new.first[3])], new.caps[:3])
    sub = PathColumn(new.paths.flat[:int(new.paths.off[int(new.first[3])])],
                     new.paths.off[:int(new.first[3]) + 1])
    in_cols = PathSetBatch(fresh.keys, fresh.first, sub, fresh.weights, fresh.ports,
                           fresh.rules, fresh.caps)
    caps = [1.0] * len(rows)
    as_tuples = _merged_batch(PathSetBatch(old.keys, old.first, list(old.paths), old.weights,
                                           old.ports, old.rules, old.caps),
                              rows, fresh, keys, caps)
    merged = _merged_batch(old, rows, in_cols, keys, caps)
    assert isinstance(merged.paths, PathColumn) and list(merged) == list(as_tuples)
    assert [s.key for s in merged] == keys


@pytest.mark.parametrize(("per_switch", "entropy", "rules"),
                         [(True, True, 4096), (False, True, 32), (True, False, 20)])
def test_a_whole_plan_in_columns_installs_what_one_listed_pair_by_pair_does(
        monkeypatch: pytest.MonkeyPatch, per_switch: bool, entropy: bool, rules: int) -> None:
    """On a fat tree, with the rule tables ample, tight, and with NIC entropy off (rules
    and QPs left to their hash): a plan, a re-plan under a hot link and a job planned by
    itself give the same plan paths, path sets (ports, rules, caps), rules per switch and
    link loads whether the whole plans keep their paths in columns or list them per pair,
    as a controller that never keeps columns does."""
    from fabricpilot.balancing import EcmpParams
    from fabricpilot.controller import core
    from fabricpilot.controller.params import ControllerParams
    from fabricpilot.topology import compile_topology
    from fabricpilot.topology.builders import fat_tree

    def run(columns: bool) -> list[object]:
        ctx = PolicyContext(compile_topology(fat_tree(k=8)), 7, 600,
                            EcmpParams(1, entropy, per_switch),
                            controller=ControllerParams(parts=4, switch_rule_capacity=rules))
        twin = TaskAware(ctx)
        ctl = Controller(twin, ctx.controller)
        ctl.declare(Intent("a2a", "t", tuple(range(0, 128, 2)),
                           (CommCall("alltoall", 64 << 20, 1000.0, 0),)))
        ctl.declare(Intent("ring", "t", tuple(range(1, 128, 4)),
                           (CommCall("allreduce", 64 << 20, 1000.0, 0),)))
        in_columns: list[bool] = []
        with monkeypatch.context() as m:
            if not columns:  # (the plans listed pair by pair, as the planner lists a job's)
                m.setattr(core.Controller, "_plan_columns", lambda self, plan, reuse: None)
                real = core.plan_greedy
                m.setattr(core, "plan_greedy",
                          lambda *a, **k: real(*a, **{**k, "columnar": False}))
            else:
                seen = core.Controller._plan_columns

                def spy(self, plan, reuse):  # type: ignore[no-untyped-def]
                    got = seen(self, plan, reuse)
                    in_columns.append(got is not None)
                    return got

                m.setattr(core.Controller, "_plan_columns", spy)
            out: list[object] = []
            for step in range(3):
                if step == 0:
                    rep = ctl.plan(background={})
                elif step == 1:
                    on = Counter(lk for s in ctl._installed.values() for p in s.paths
                                 for lk in p[1:-1])
                    hot = on.most_common(1)[0][0]
                    rep = ctl.plan(background={hot: 0.9 * ctl.view.links[hot].capacity_gbps})
                else:
                    ctl.declare(Intent("ring", "t", tuple(range(3, 128, 4)),
                                       (CommCall("allreduce", 64 << 20, 1000.0, 0),)))
                    rep = ctl.plan_jobs({"ring"})
                assert rep is not None
                out.append((list(ctl.current.paths.items()),
                            sorted((k, tuple(s)) for k, s in ctl._installed.items()),
                            sorted(ctl.current.link_load_gbps.items()),
                            dict(twin.switch_rules()), rep.installed, rep.pinned,
                            rep.unpinned))
            assert not columns or sum(in_columns) >= 2  # (both whole plans, at least)
            return out

    assert run(True) == run(False)
