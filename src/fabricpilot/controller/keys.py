"""Demand keys made when first read whole: a call's ``task:source->destination`` keys of a
million GPU pairs cost a tenth of a second of string making, which a plan does while its
placement runs on another core (see :func:`~fabricpilot.controller.planner.plan_greedy`'s
``meanwhile``) rather than before it.

- :class:`PairKeys`: the keys of a call's GPU pairs, from the GPUs' names;
- :class:`ChainedKeys`: sequences of keys one after the other;
- :func:`key_index`: each key's row, which for a call's pairs (:class:`PairRows`) is read
  from a table of the pairs' GPUs rather than a dict of a million key strings;
  :func:`get_many` looks many keys up at once (through the dict of a job's keys, made
  then: a job planned by itself reads its 65 280 keys several times over).

Both read as the list of their keys would (a key by its place, a slice, iteration,
equality with a list); the list is made the first time they are read whole or iterated,
and a key read by itself before that is made by itself.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

T = TypeVar("T")

# keys looked up at once from which an index reads them through the dict of a job's keys
# (:meth:`PairRows.as_dict`, made then and kept); fewer (a heal's) are parsed one by one
BULK_KEYS = 4096


def part_offsets(parts: Sequence[Sized]) -> list[int]:
    """Where each of ``parts`` starts when they are read one after the other, and the
    total at the end.

    >>> part_offsets([[1, 2], [], [3]])
    [0, 2, 2, 3]
    """
    return [0, *itertools.accumulate(map(len, parts))]


def part_item(parts: Sequence[Sequence[T]], off: list[int], i: int) -> T:
    """Item ``i`` (0 <= i < off[-1]) of ``parts`` read one after the other (``off``:
    their :func:`part_offsets`).

    >>> part_item([[1, 2], [], [3]], [0, 2, 2, 3], 2)
    3
    """
    p = bisect.bisect_right(off, i) - 1
    return parts[p][i - off[p]]


class Keys(Sequence[str]):
    """Keys made as a list when first read whole (:meth:`list`), one by one before."""

    __slots__ = ("_list",)

    def __init__(self) -> None:
        self._list: list[str] | None = None

    def _make(self) -> list[str]:
        raise NotImplementedError

    def _one(self, i: int) -> str:
        raise NotImplementedError

    def list(self) -> list[str]:
        """Every key, in order (made the first time)."""
        if self._list is None:
            self._list = self._make()
        return self._list

    @property
    def made(self) -> bool:
        """Whether the list of keys is made."""
        return self._list is not None

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return self.list()[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"key {i} of {n}")
        return self._one(i % n)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return other is self or self.list() == other.list()
        if isinstance(other, list):
            return self.list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (equal to a list: unhashable as one)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} keys{'' if self.made else ', not made'})"


class PairKeys(Keys):
    """The keys ``f"{prefix}{names[src[i]]}->{names[dst[i]]}"`` of GPU pairs ``src[i]``,
    ``dst[i]`` (a call's pairs: ``prefix`` is its task and a colon).

    >>> k = PairKeys("j:", ["0", "1", "10"], np.array([0, 2]), np.array([2, 1]))
    >>> k[1], len(k), k.made, k == ["j:0->10", "j:10->1"], k.made, k[-1]
    ('j:10->1', 2, False, True, True, 'j:10->1')
    """

    __slots__ = ("_dst", "_names", "_prefix", "_src")

    def __init__(self, prefix: str, names: Sequence[str], src: NDArray[np.int64],
                 dst: NDArray[np.int64]) -> None:
        super().__init__()
        if len(src) != len(dst):
            raise ValueError("a key's source and destination GPU for each pair")
        self._prefix, self._names, self._src, self._dst = prefix, names, src, dst

    def __len__(self) -> int:
        return len(self._src)

    def _one(self, i: int) -> str:
        name = self._names
        return f"{self._prefix}{name[int(self._src[i])]}->{name[int(self._dst[i])]}"

    def _make(self) -> list[str]:
        # (as rule_key writes them: each source's "task:source->" made once, then joined to
        # the destinations' names element-wise, in C: half the time of a format per key)
        name, pre, src = self._names, self._prefix, self._src
        if not len(src):
            return []
        seen = np.zeros(len(name), np.bool_)
        seen[src] = True
        used = np.flatnonzero(seen)
        heads = np.empty(len(name), object)
        heads[used] = [f"{pre}{name[x]}->" for x in used.tolist()]
        tails = np.empty(len(name), object)
        tails[:] = name
        out: list[str] = (heads[src] + tails[self._dst]).tolist()
        return out

    def __eq__(self, other: object) -> bool:
        """As the lists of keys compare; two of one prefix and names compare their pairs'
        GPUs (no key made).

        >>> names = ["0", "1", "2"]
        >>> a = PairKeys("j:", names, np.array([0, 1]), np.array([1, 2]))
        >>> b = PairKeys("j:", names, np.array([0, 1]), np.array([1, 2]))
        >>> a == b, a.made, a == PairKeys("j:", names, np.array([0, 2]), np.array([1, 1]))
        (True, False, False)
        """
        if (isinstance(other, PairKeys) and self._prefix == other._prefix
                and (self._names is other._names or self._names == other._names)):
            return bool(np.array_equal(self._src, other._src)
                        and np.array_equal(self._dst, other._dst))
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


class ChainedKeys(Keys):
    """The keys of ``parts`` (lists or :class:`Keys`) one after the other.

    >>> a = PairKeys("j:", ["0", "1"], np.array([0]), np.array([1]))
    >>> c = ChainedKeys([a, ["k:1->0"], []])
    >>> len(c), c[1], c[0], a.made, list(c), a.made
    (2, 'k:1->0', 'j:0->1', False, ['j:0->1', 'k:1->0'], True)
    """

    __slots__ = ("_off", "_parts")

    def __init__(self, parts: Sequence[Sequence[str]]) -> None:
        super().__init__()
        self._parts = list(parts)
        self._off = part_offsets(self._parts)

    def __len__(self) -> int:
        return self._off[-1]

    def _one(self, i: int) -> str:
        return part_item(self._parts, self._off, i)

    def _make(self) -> list[str]:
        return list(itertools.chain.from_iterable(
            p.list() if isinstance(p, Keys) else p for p in self._parts))


def made(keys: Sequence[str]) -> Sequence[str]:
    """``keys``, as the list of them if they are :class:`Keys` (made now if not yet).

    >>> made(PairKeys("j:", ["0", "1"], np.array([1]), np.array([0])))
    ['j:1->0']
    """
    return keys.list() if isinstance(keys, Keys) else keys


def key_rows(keys: Sequence[T]) -> dict[T, int]:
    """Each key's row (its place in ``keys``; a repeated key: its last).

    >>> key_rows(["a", "b"])
    {'a': 0, 'b': 1}
    """
    return dict(zip(keys, range(len(keys)), strict=True))


def key_steps(keys: Sequence[str]) -> Iterator[None]:
    """Make ``keys``'s list (if they are :class:`Keys` not made yet) in steps: one per
    part of :class:`ChainedKeys` (a call's keys), then the whole.

    >>> parts = [PairKeys("j:", ["0", "1"], np.array([0]), np.array([1])), ["k:1->0"]]
    >>> c = ChainedKeys(parts)
    >>> steps = key_steps(c)
    >>> next(steps), parts[0].made, c.made, list(steps), c.made
    (None, True, False, [None], True)
    """
    if not unmade(keys):
        return
    if isinstance(keys, ChainedKeys):
        for part in keys._parts:
            if unmade(part):
                made(part)
                yield
    made(keys)
    yield


def unmade(keys: Any) -> bool:
    """Whether ``keys`` are :class:`Keys` whose list is not made yet.

    >>> unmade(["a"]), unmade(ChainedKeys([["a"]]))
    (False, True)
    """
    return isinstance(keys, Keys) and not keys.made


class RowIndex(Mapping[str, int]):
    """Rows of keys read through :meth:`get` (``None``: no such key), which a subclass
    defines; the rest of a mapping's reads follow from it."""

    __slots__ = ()

    def get(self, key: object, default: Any = None) -> Any:
        raise NotImplementedError

    def __getitem__(self, key: str) -> int:
        r = self.get(key)
        if r is None:
            raise KeyError(key)
        return r  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None


class PairRows(RowIndex):
    """Each key's row in :class:`PairKeys` whose GPU names are their ids as text (as a
    call's keys are), read as the dict of them would be: a key's two GPU ids are parsed
    and its row read from a table of the call's pairs (its GPUs numbered ``0..m-1``; row
    ``-1`` where no pair is), so no key string is hashed or kept in a dict. A job of 256
    GPUs has 65 280 AlltoAll pairs and a table of 256 x 256 rows; the dict of its keys
    took 6 ms to make, the table takes a fraction of one. A row found is checked against
    its key, so a text that only parses to a pair's ids (``"j:07->1"``) is not its key.
    Made by :func:`key_index`, which falls back to the dict where the table does not
    serve (see :meth:`of`). A key is parsed in a few hundred ns, a dict finds it in a
    hundred or so: many keys at once are looked up in the dict (:meth:`as_dict`).

    >>> k = PairKeys("j:", ["0", "1", "2", "3"], np.array([0, 3, 1]), np.array([3, 1, 0]))
    >>> r = PairRows.of(k)
    >>> type(r).__name__, r["j:3->1"], r.get("j:1->3"), "j:1->0" in r, r.get("j:01->0")
    ('PairRows', 1, None, True, None)
    >>> r.get("k:0->3"), r.get("j:0-3"), r.get("j:-1->0"), len(r), list(r) == list(k)
    (None, None, None, 3, True)
    """

    __slots__ = ("_at", "_keys", "_local", "_m", "_n_pre", "_pre")

    def __init__(self, keys: PairKeys, local: dict[int, int], at: NDArray[np.int32]) -> None:
        self._keys, self._local, self._at = keys, local, at
        self._m = len(local)
        self._pre = keys._prefix
        self._n_pre = len(self._pre)

    @classmethod
    def of(cls, keys: PairKeys) -> Mapping[str, int]:
        """The rows of ``keys``: a :class:`PairRows` if its GPUs' names are their ids as
        text, its pairs are distinct and its table has no more than 4 rows per key (plus
        65 536: an AlltoAll's has about one; a ring's of many GPUs would be mostly empty);
        else the dict of its keys (a repeated key: its last row, as the dict keeps it).

        >>> PairRows.of(PairKeys("j:", ["a", "b"], np.array([0]), np.array([1])))
        {'j:a->b': 0}
        >>> PairRows.of(PairKeys("j:", ["0", "1"], np.array([0, 0]), np.array([1, 1])))
        {'j:0->1': 1}
        """
        src, dst, names = keys._src, keys._dst, keys._names
        n = len(src)
        seen = np.zeros(len(names), np.bool_)  # (the call's GPUs)
        seen[src] = True
        seen[dst] = True
        used = np.flatnonzero(seen)
        m = len(used)
        if (m * m <= 4 * n + 65_536 and n < 2**31
                and all(names[g] == str(g) for g in used.tolist())):
            local = np.zeros(len(names), np.int64)
            local[used] = np.arange(m)
            code = local[src] * m + local[dst]
            at = np.full(m * m, -1, np.int32)
            rows = np.arange(n, dtype=np.int32)
            at[code] = rows
            if np.array_equal(at[code], rows):  # (every pair once: each its own row)
                return cls(keys, key_rows(used.tolist()), at)
        return key_rows(keys)

    def get(self, key: object, default: Any = None) -> Any:
        if not isinstance(key, str) or not key.startswith(self._pre):
            return default
        a, _, b = key[self._n_pre:].partition("->")
        try:
            la, lb = self._local.get(int(a)), self._local.get(int(b))
        except ValueError:
            return default
        if la is None or lb is None:
            return default
        r = self._at.item(la * self._m + lb)
        if r < 0:
            return default
        made = self._keys._list
        return r if (made[r] if made is not None else self._keys._one(r)) == key else default

    def as_dict(self) -> dict[str, int]:
        """The dict of the keys' rows (made now: for many keys looked up at once).

        >>> PairRows.of(PairKeys("j:", ["0", "1"], np.array([1]), np.array([0]))).as_dict()
        {'j:1->0': 0}
        """
        return key_rows(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def key_index(keys: Sequence[str]) -> Mapping[str, int]:
    """Each of ``keys``'s row (its place in them; a repeated key: its last): for
    :class:`PairKeys`, their :class:`PairRows` where it serves, else the dict.

    >>> key_index(["a", "b"])
    {'a': 0, 'b': 1}
    >>> key_index(PairKeys("j:", ["0", "1"], np.array([1]), np.array([0])))["j:1->0"]
    0
    """
    if isinstance(keys, PairKeys):
        return PairRows.of(keys)
    return key_rows(keys)


def get_many(index: Mapping[str, int], keys: Iterable[str]) -> list[int | None]:
    """Each of ``keys``'s row in ``index`` (``None``: not there), as ``map(index.get,
    keys)``; through the index's own ``get_many`` if it has one (the jobs' rows: many keys
    at once are read through the dicts of their jobs' keys).

    >>> get_many({"a": 0, "b": 1}, ["b", "c"])
    [1, None]
    """
    many = getattr(index, "get_many", None)
    if many is not None:
        return many(keys if isinstance(keys, Sequence) else list(keys))  # type: ignore[no-any-return]
    return list(map(index.get, keys))
