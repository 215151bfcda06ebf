"""The controller's only view of a data plane: a small southbound interface.

The controller never imports the simulator. It reads the fabric as a :class:`FabricView` (a
directed graph of nodes and links with their capacities and delays), receives per-port counter
deltas (:class:`PortDelta`), and acts through a :class:`DataPlane`: install a weighted path set
for a job / flow / traffic class (and withdraw it), push a congestion table for switch-local
adaptive routing, set the QoS mapping. The digital twin implements :class:`DataPlane`; a real
southbound (gNMI / P4Runtime / OpenFlow) can implement it later. Rule updates take effect
after the data plane's control-channel latency, never instantly.

A whole plan sets a path set for every GPU pair, a million at thousands of GPUs. Those go
as one :class:`PathSetBatch`: the sets' fields in columns (the paths a :class:`PathColumn`
of link ids), each set made only when read. :class:`BatchMap` holds such a batch as a
``key -> value`` table, with what changed since beside it, as the controller and the twin
keep the sets installed.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, overload

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from fabricpilot.controller.keys import get_many, key_rows


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One directed link: ``link_id`` (the data plane's id), endpoints, capacity, delay and
    kind (``"nic"``: a GPU's link to its leaf, ``"fabric"``: between switches, or
    ``"nvlink"``)."""

    link_id: int
    src: str
    dst: str
    capacity_gbps: float
    delay_ns: int
    kind: str = "fabric"


@dataclass(frozen=True)
class EcmpSpec:
    """How the switches resolve their ECMP groups, as read from them: the hash seed
    (``base_seed``, or a seed per switch derived from it and ``switch_index``), whether NICs
    vary the UDP source port per QP, each group's members in bucket order (``groups[(switch,
    destination leaf)]``: link ids, member ``hash % len`` is taken) and each GPU's leaf. With
    this a controller evaluates exactly the next hop a switch picks for a 5-tuple
    (:mod:`fabricpilot.net.hashing`)."""

    base_seed: int
    per_switch_seed: bool
    source_port_entropy: bool
    switch_index: dict[str, int]
    groups: dict[tuple[str, str], tuple[int, ...]]
    gpu_leaf: dict[int, str]


@dataclass(frozen=True)
class FabricView:
    """The fabric as the controller sees it.

    ``graph`` is a :class:`networkx.DiGraph` whose edges carry ``link_id``, ``capacity_gbps``,
    ``delay_ns`` and ``kind``, and whose nodes carry ``kind`` (``"gpu"``, ``"switch"``,
    ``"nvswitch"``) and, for switches, ``tier`` (1 = leaf / ToR, 2 = spine or aggregation, ...).
    ``gpu_node`` maps a GPU index to its node name. ``ecmp`` describes the switches' hash
    (``None`` if the data plane does not expose it), ``rule_capacity`` how many explicit
    forwarding rules one switch holds and ``switch_latency_ns`` what a switch (NVSwitch
    too) adds to a packet's delay as it forwards it.

    >>> v = FabricView.from_links(
    ...     [LinkInfo(0, "gpu0", "leaf0", 400, 100, "nic"),
    ...      LinkInfo(1, "leaf0", "gpu0", 400, 100, "nic")],
    ...     node_kind={"gpu0": "gpu", "leaf0": "switch"}, tier={"leaf0": 1},
    ...     gpu_node={0: "gpu0"})
    >>> v.link(0).dst, v.graph["gpu0"]["leaf0"]["capacity_gbps"]
    ('leaf0', 400)
    """

    graph: nx.DiGraph
    gpu_node: dict[int, str]
    links: dict[int, LinkInfo] = field(default_factory=dict)
    ecmp: EcmpSpec | None = None
    rule_capacity: int = 4096
    switch_latency_ns: float = 600.0

    @classmethod
    def from_links(cls, links: list[LinkInfo], node_kind: dict[str, str],
                   tier: dict[str, int], gpu_node: dict[int, str], *,
                   ecmp: EcmpSpec | None = None, rule_capacity: int = 4096,
                   switch_latency_ns: float = 600.0) -> FabricView:
        g = nx.DiGraph()
        for name, kind in node_kind.items():
            g.add_node(name, kind=kind, tier=tier.get(name, 0))
        for li in links:
            g.add_edge(li.src, li.dst, link_id=li.link_id, capacity_gbps=li.capacity_gbps,
                       delay_ns=li.delay_ns, kind=li.kind)
        return cls(g, dict(gpu_node), {li.link_id: li for li in links}, ecmp, rule_capacity,
                   switch_latency_ns)

    @functools.cached_property
    def top_tier(self) -> int:
        """The highest switch tier (1 = leaf / ToR; 0 without switches)."""
        return max((int(t or 0) for _, t in self.graph.nodes(data="tier")), default=0)

    def link(self, link_id: int) -> LinkInfo:
        return self.links[link_id]

    def link_between(self, a: str, b: str) -> int:
        return int(self.graph[a][b]["link_id"])

    def path_links(self, nodes: list[str]) -> list[int]:
        """Link ids along a node path."""
        return [self.link_between(a, b) for a, b in itertools.pairwise(nodes)]


@dataclass(frozen=True, slots=True)
class PortDelta:
    """Counter deltas of one egress port (link) over ``interval_ns``, as a switch reports
    them: bytes sent, queue depth now, drops, ECN marks, PFC pause time and FEC-corrected /
    uncorrectable errors, bits received (for error rates), and the port's operational
    state if the switch reports it (``oper_up``: ``False`` down, ``True`` up, ``None``
    not said)."""

    link_id: int
    interval_ns: int
    tx_bytes: float = 0.0
    queue_bytes: float = 0.0
    drops: float = 0.0
    ecn_marks: float = 0.0
    pause_ns: float = 0.0
    fec_corrected: float = 0.0
    fec_uncorrected: float = 0.0
    rx_bits: float = 0.0
    oper_up: bool | None = None


class PathSet(NamedTuple):
    """Paths (link ids) and their traffic shares for one match key (a job, a flow, a class).

    Steered path sets also say how: ``ports[i]`` is the UDP source port of the QP that carries
    path ``i`` (the switches' ECMP hash of it lands on the path) and ``rules[i]`` the explicit
    ``(switch, link)`` rules still needed where the hash does not (empty tuples when the data
    plane forwards the paths by rules alone). ``rate_cap_gbps`` limits the sending NIC: the
    capped sets it sends on at once share it equally (a NIC rate limiter on the job's
    traffic; a set's QPs split its part by their shares; ``inf``: none), as for an L3 job
    while an L1 / L2 job is planned."""

    key: str
    paths: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    ports: tuple[int, ...] = ()
    rules: tuple[tuple[tuple[str, int], ...], ...] = ()
    rate_cap_gbps: float = math.inf


# a path set from its fields as one tuple, in C (``PathSet(...)`` is a Python call; a plan
# makes one set per pair)
_path_set_of = functools.partial(tuple.__new__, PathSet)
_chain = itertools.chain.from_iterable


def as_list(column: Sequence[Any]) -> Sequence[Any]:
    """A batch's column as Python values: an array's as a list (of ints, floats), any
    other as it is.

    >>> as_list(np.array([7, 8])), as_list((1.0,))
    ([7, 8], (1.0,))
    """
    return column.tolist() if isinstance(column, np.ndarray) else column


def _picker(at: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function that picks the items ``at`` of a sequence, as a tuple (in one C call).

    >>> _picker([2, 0])("abc"), _picker([1])("abc")
    (('c', 'a'), ('b',))
    """
    if len(at) == 1:
        i = at[0]
        return lambda seq: (seq[i],)
    return operator.itemgetter(*at)  # type: ignore[return-value]


def _singles(items: Sequence[Any]) -> Iterable[tuple[Any]]:
    """Each item as a 1-tuple; where all items are one value (as the weight of every
    one-path set, or its rules, none), one 1-tuple for all (tuples are immutable).

    >>> list(_singles([1.0, 1.0])), list(_singles([(), (("s", 1),)]))
    ([(1.0,), (1.0,)], [((),), ((('s', 1),),)])
    """
    if items and items.count(items[0]) == len(items):
        return itertools.repeat((items[0],), len(items))
    return zip(items)


class PathColumn(Sequence[tuple[int, ...]]):
    """Paths as link ids in one flat array: path ``i`` is ``flat[off[i]:off[i + 1]]``, made a
    tuple when read (a path set keeps the tuples it is made with). A path set since
    (``col[i] = p``) reads as set.

    >>> col = PathColumn(np.array([0, 1, 3, 5, 0, 2, 4, 5]), np.array([0, 4, 8]))
    >>> col[1], len(col), col[0:2] == ((0, 1, 3, 5), (0, 2, 4, 5))
    ((0, 2, 4, 5), 2, True)
    >>> col[0] = (7,); list(col)
    [(7,), (0, 2, 4, 5)]
    """

    __slots__ = ("_set", "flat", "off")

    def __init__(self, flat: NDArray[np.int64], off: NDArray[np.int64]) -> None:
        self.flat = flat
        self.off = off
        self._set: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.off) - 1

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[tuple[int, ...], ...]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, ...] | tuple[tuple[int, ...], ...]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step == 1 and not self._set:
                return self._tuples(lo, hi)
            return tuple(self[j] for j in range(lo, hi, step))
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("path column index out of range")
        if self._set:
            p = self._set.get(i)
            if p is not None:
                return p
        return tuple(self.flat[int(self.off[i]):int(self.off[i + 1])].tolist())

    def _tuples(self, lo: int, hi: int) -> tuple[tuple[int, ...], ...]:
        """Paths ``lo:hi`` (none set since; ``0 <= lo <= hi <= len``) as tuples."""
        if hi <= lo:
            return ()
        bounds = self.off[lo:hi + 1].tolist()
        links = self.flat[bounds[0]:bounds[-1]].tolist()
        b0 = bounds[0]
        return tuple(tuple(links[a - b0:b - b0]) for a, b in itertools.pairwise(bounds))

    def __setitem__(self, i: int, path: tuple[int, ...]) -> None:
        self._set[i if i >= 0 else i + len(self)] = path

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        out = self._tuples(0, len(self))
        if self._set:
            return (self._set.get(i, p) for i, p in enumerate(out))
        return iter(out)

    def lengths(self) -> NDArray[np.int64]:
        """Each path's number of links (of the column's own paths: none set since)."""
        return np.diff(self.off)

    @property
    def overlaid(self) -> bool:
        """Whether any path was set since."""
        return bool(self._set)


class PathSetBatch(Sequence[PathSet]):
    """Path sets in columns, each made a :class:`PathSet` only when read (once: every read
    gives the same object). Set ``i`` is key ``keys[i]`` with the paths
    ``first[i]:first[i + 1]`` of ``paths``, their ``weights``, ``ports`` and ``rules``, and
    rate cap ``caps[i]``. ``weights`` and ``ports`` may be arrays (a whole plan's, as its
    steering made them); a set read has them as Python numbers all the same.

    A whole plan's sets go to the data plane so: one set per GPU pair is a million at
    thousands of GPUs, and a data plane that takes the batch as it is (the twin) reads the
    columns (which keys, which explicit rules) and makes a pair's set when its traffic
    asks. Any other reads it as the sequence of sets it is.

    >>> b = PathSetBatch(["a", "b"], np.array([0, 1, 3]), [(1,), (2,), (3,)],
    ...                  [1.0, 0.5, 0.5], [7, 8, 9], [(), (), ()], [math.inf, 5.0])
    >>> b[1]
    PathSet(key='b', paths=((2,), (3,)), weights=(0.5, 0.5), ports=(8, 9), rules=((), ()), \
rate_cap_gbps=5.0)
    >>> b[1] is b[1], b.row_of["b"], len(b), [s.key for s in b], b == list(b)
    (True, 1, 2, ['a', 'b'], True)
    """

    __slots__ = (
        "_all_made",
        "_made",
        "_row_of",
        "caps",
        "first",
        "keys",
        "paths",
        "ports",
        "rules",
        "weights",
    )

    def __init__(self, keys: list[str], first: NDArray[np.int64], paths: Sequence[tuple[int, ...]],
                 weights: Sequence[float], ports: Sequence[int],
                 rules: Sequence[tuple[tuple[str, int], ...]], caps: Sequence[float],
                 made: list[PathSet | None] | None = None) -> None:
        if len(first) != len(keys) + 1 or len(caps) != len(keys) or not (
                len(paths) == len(weights) == len(ports) == len(rules) == int(first[-1])):
            raise ValueError("a path set batch's columns disagree in length")
        self.keys = keys
        self.first = first
        self.paths = paths
        self.weights = weights
        self.ports = ports
        self.rules = rules
        self.caps = caps
        # the sets made so far (``made``: some made already, as a batch's own were)
        self._made: list[PathSet | None] = [None] * len(keys) if made is None else made
        self._all_made = False
        self._row_of: Mapping[str, int] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> PathSet: ...

    @overload
    def __getitem__(self, i: slice) -> list[PathSet]: ...

    def __getitem__(self, i: int | slice) -> PathSet | list[PathSet]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.keys)))]
        made = self._made[i]
        if made is None:
            if i < 0:
                i += len(self.keys)
            lo, hi = int(self.first[i]), int(self.first[i + 1])
            made = self._made[i] = _path_set_of((
                self.keys[i], tuple(self.paths[lo:hi]), tuple(as_list(self.weights[lo:hi])),
                tuple(as_list(self.ports[lo:hi])), tuple(self.rules[lo:hi]), self.caps[i]))
        return made

    def __iter__(self) -> Iterator[PathSet]:
        if not self._all_made:  # (every set at once: most have one path, made in one pass)
            fresh = self._columns_made()
            self._made = [m if m is not None else s
                          for m, s in zip(self._made, fresh, strict=True)]
            self._all_made = True
        return iter(self._made)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PathSetBatch({len(self.keys)} sets)"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its columns (the sets made and the rows found are not sent: the
        other side makes its own as it reads).

        >>> import pickle
        >>> b = PathSetBatch(["a"], np.array([0, 1]), [(1,)], [1.0], [7], [()], [math.inf])
        >>> _ = b[0], b.row_of
        >>> c = pickle.loads(pickle.dumps(b)); made = list(c.made)
        >>> made, c == b
        ([None], True)
        """
        return (PathSetBatch, (self.keys, self.first, self.paths, self.weights, self.ports,
                               self.rules, self.caps))

    @property
    def made(self) -> list[PathSet | None]:
        """The sets made so far, by row (``None``: not yet)."""
        return self._made

    @property
    def row_of(self) -> Mapping[str, int]:
        """Each key's place in the batch (made when first asked, unless given: see
        :meth:`use_rows`)."""
        if self._row_of is None:
            self._row_of = key_rows(self.keys)
        return self._row_of

    def use_rows(self, rows: Mapping[str, int]) -> None:
        """Take ``rows`` as each key's place in the batch (a caller that has them: the
        batch makes no index of its own). ``ValueError`` if their count is not the
        batch's."""
        if len(rows) != len(self.keys):
            raise ValueError(f"{len(rows)} rows for a batch of {len(self.keys)} keys")
        self._row_of = rows

    def rule_switches(self) -> Iterator[str]:
        """The switch of every explicit rule of the batch's sets (one per rule)."""
        return (sw for sw, _ in _chain(filter(None, self.rules)))

    def _columns_made(self) -> list[PathSet]:
        """Every set, made from the columns in bulk (the keys of one path, most, in one
        pass: their fields 1-tuples)."""
        keys, first, caps = self.keys, self.first, self.caps
        paths, rules = self.paths, self.rules
        weights, ports = as_list(self.weights), as_list(self.ports)
        if isinstance(paths, PathColumn):  # (its tuples made in one pass)
            paths = tuple(paths)
        n = len(keys)
        count = np.diff(first)
        if (count == 1).all():
            return list(map(_path_set_of, zip(keys, zip(paths), _singles(weights), zip(ports),
                                              _singles(rules), caps, strict=True)))
        out: list[Any] = [None] * n
        one = np.flatnonzero(count == 1)
        if len(one):
            rows, one_l = first[one].tolist(), one.tolist()
            at_rows = _picker(rows)
            made = map(_path_set_of, zip(_picker(one_l)(keys), zip(at_rows(paths)),
                                         _singles(at_rows(weights)), zip(at_rows(ports)),
                                         _singles(at_rows(rules)), _picker(one_l)(caps),
                                         strict=True))
            for i, s in zip(one_l, made, strict=True):
                out[i] = s
        t_paths, t_weights = tuple(paths), tuple(weights)
        t_ports, t_rules = tuple(ports), tuple(rules)
        bounds = first.tolist()
        for i in np.flatnonzero(count != 1).tolist():
            lo, hi = bounds[i], bounds[i + 1]
            out[i] = _path_set_of((keys[i], t_paths[lo:hi], t_weights[lo:hi], t_ports[lo:hi],
                                   t_rules[lo:hi], caps[i]))
        return out


V = TypeVar("V")
_ABSENT: Any = object()


class KeyRows(Protocol):
    """Keys in rows, as a :class:`BatchMap` reads its bulk: the keys in order, each one's
    row, and how many."""

    keys: list[str]

    @property
    def row_of(self) -> Mapping[str, int]: ...

    def __len__(self) -> int: ...


class OverlayMap(MutableMapping[str, V]):
    """A ``key -> value`` table of a bulk of keys held elsewhere (a subclass says which keys
    it has, :meth:`_in_base`, and in which order, :meth:`_base_keys`) and of what changed
    since, kept beside it: the keys set since (``over``) and the bulk's keys deleted
    (``gone``). Set, deleted, counted and iterated as a dict would be: the bulk's keys in
    order (a key set again keeps its place), then the keys added since, in the order they
    came. A subclass reads values (``__getitem__``) from the bulk where ``over`` has none.
    """

    __slots__ = ("_gone", "_len", "_over")

    def __init__(self, n_base: int) -> None:
        self._over: dict[str, V] = {}
        self._gone: set[str] = set()
        self._len = n_base

    def _in_base(self, key: str) -> bool:
        """Whether the bulk has ``key`` (deleted since or not)."""
        raise NotImplementedError

    def _base_keys(self) -> Iterable[str]:
        """The bulk's keys, in order."""
        raise NotImplementedError

    @property
    def changed(self) -> bool:
        """Whether any key was set or deleted since the bulk."""
        return bool(self._over or self._gone)

    @property
    def overlaid(self) -> bool:
        """Whether any key was set since the bulk (its value not the bulk's)."""
        return bool(self._over)

    def changed_keys(self) -> Iterator[str]:
        """The keys set or deleted since the bulk (a key set and deleted: once or
        twice)."""
        return itertools.chain(self._over, self._gone)

    def __setitem__(self, key: str, value: V) -> None:
        over = self._over
        if key not in over and (not self._in_base(key) or key in self._gone):
            self._len += 1
        over[key] = value

    def __delitem__(self, key: str) -> None:
        live = self._in_base(key) and key not in self._gone
        if key in self._over:
            del self._over[key]
            if live:  # (the bulk's key, set since: gone too)
                self._gone.add(key)
        elif live:
            self._gone.add(key)
        else:
            raise KeyError(key)
        self._len -= 1

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        gone, over = self._gone, self._over
        keys = self._base_keys()
        yield from (filter(lambda k: k not in gone, keys) if gone else keys)
        for k in list(over):
            if not self._in_base(k) or k in gone:  # (added since, not set in place)
                yield k


class BatchMap(OverlayMap[V]):
    """A ``key -> value`` table whose bulk is one batch of keys in rows, as a
    :class:`PathSetBatch` (:class:`KeyRows`; the value of row ``r`` is ``value(r)``, made
    when read), with what changed since kept beside it: the
    keys set since (``over``) and the batch's keys deleted (``gone``). A whole plan's
    million pairs are so held without a million entries, and read, changed and iterated as
    a dict would be: the batch's keys in its order (a key set again keeps its place), then
    the keys added since, in the order they came.

    >>> b = PathSetBatch(["a", "b"], np.array([0, 1, 2]), [(1,), (2,)], [1.0, 1.0], [7, 8],
    ...                  [(), ()], [math.inf, math.inf])
    >>> m = BatchMap(b, b.__getitem__)
    >>> m["b"].ports, len(m), "a" in m
    ((8,), 2, True)
    >>> del m["a"]; m["c"] = b[0]; m["b"] = b[0]
    >>> list(m), m["b"].key, len(m)
    (['b', 'c'], 'a', 2)
    """

    __slots__ = ("_rows", "_value", "batch")

    def __init__(self, batch: KeyRows, value: Callable[[int], V]) -> None:
        super().__init__(len(batch))
        self.batch = batch
        self._value = value
        self._rows: Mapping[str, int] | None = None  # (the batch's rows, once read)

    def _row_of(self) -> Mapping[str, int]:
        rows = self._rows
        if rows is None:
            rows = self._rows = self.batch.row_of
        return rows

    def _in_base(self, key: str) -> bool:
        return key in (self._rows or self._row_of())

    def _base_keys(self) -> Iterable[str]:
        return self.batch.keys

    def row(self, key: str) -> int | None:
        """The batch row that gives ``key``'s value (``None``: another, or none)."""
        if key in self._over:
            return None
        r = (self._rows or self._row_of()).get(key)
        if r is None or (self._gone and key in self._gone):
            return None
        return r

    def __getitem__(self, key: str) -> V:
        v = self._over.get(key, _ABSENT)
        if v is not _ABSENT:
            return v  # type: ignore[no-any-return]
        r = (self._rows or self._row_of()).get(key)
        if r is None or (self._gone and key in self._gone):
            raise KeyError(key)
        return self._value(r)

    def get_all(self, keys: Iterable[str]) -> list[V | None]:
        """Each key's value (``None`` where it has none), as ``map(self.get, keys)`` in one
        pass."""
        over, gone, value = self._over, self._gone, self._value
        keys = keys if isinstance(keys, list) else list(keys)
        found = get_many(self._rows or self._row_of(), keys)
        if over:
            return [over[k] if k in over else None if r is None or k in gone else value(r)
                    for k, r in zip(keys, found, strict=True)]
        if gone:
            return [None if r is None or k in gone else value(r)
                    for k, r in zip(keys, found, strict=True)]
        return [None if r is None else value(r) for r in found]

    def pop_all(self, keys: list[str]) -> list[V]:
        """Delete ``keys`` (each held, each once) and give their values, in one pass."""
        out = self.get_all(keys)
        over, gone = self._over, self._gone
        rows = self._rows or self._row_of()
        for k in keys:
            if k in over:
                del over[k]
                if k in rows and k not in gone:  # (the batch's key, set since: gone too)
                    gone.add(k)
            else:
                gone.add(k)
        self._len -= len(keys)
        return out  # type: ignore[return-value]

    def get(self, key: str, default: Any = None) -> Any:
        v = self._over.get(key, _ABSENT)
        if v is not _ABSENT:
            return v
        r = (self._rows or self._row_of()).get(key)
        if r is None or (self._gone and key in self._gone):
            return default
        return self._value(r)

    def __contains__(self, key: object) -> bool:
        if key in self._over:
            return True
        if key not in (self._rows or self._row_of()):
            return False
        return not (self._gone and key in self._gone)

    def update(self, other: Any = (), /, **kw: V) -> None:
        """As a dict's (a batch of keys at once: each looked up in one pass)."""
        items = list(other.items() if hasattr(other, "items") else other)
        items.extend(kw.items())
        over, gone = self._over, self._gone
        # (the keys new to the table: neither set since nor a live key of the batch)
        found = get_many(self._rows or self._row_of(), [k for k, _ in items])
        new = [k for (k, _), r in zip(items, found, strict=True)
               if k not in over and (r is None or k in gone)]
        if len(new) > 1:
            new = list(dict.fromkeys(new))  # (a key given twice counts once)
        over.update(items)
        self._len += len(new)

    def __repr__(self) -> str:
        return f"BatchMap({dict(self.items())!r})"


def get_all(table: Mapping[str, V], keys: Iterable[str]) -> list[V | None]:
    """``list(map(table.get, keys))``, in one pass where ``table`` is a :class:`BatchMap`."""
    if isinstance(table, BatchMap):
        return table.get_all(keys)
    return list(map(table.get, keys))


class DataPlane(Protocol):
    """What the controller needs from a data plane (the twin, or real switches)."""

    def fabric(self) -> FabricView:
        """The current topology."""

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last call. Only changes need be sent: a port left out of
        a report is taken as unchanged since its last delta (a port that went idle reports
        its zeros once). A port that is down says so in every report
        and, once up again, says that in the next; the first report after the controller
        connects gives every port's state, as a telemetry subscription's first report does
        (a controller that restarted knowing links down learns which are up again)."""

    def install(self, rules: Sequence[PathSet]) -> None:
        """Install weighted path sets (and the senders' rate caps they carry); they take
        effect after the control-channel latency. A whole plan's come as a
        :class:`PathSetBatch` (a sequence of them, made as read)."""

    def remove(self, keys: list[str]) -> None:
        """Withdraw the path sets of ``keys`` (a pair the plan no longer has: its job gone,
        its SLA now unmet, every path of it down): their explicit rules are freed at once
        and, after the control-channel latency, their flows go back to the switches' own
        forwarding. Keys not held are ignored."""

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        """Per-link weights for switch-local adaptive routing (1 neutral, 0 excluded)."""

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        """The DSCP -> priority mapping every switch should use."""


class ExternalDataPlane(DataPlane, Protocol):
    """A data plane in a process of its own (switches, or the twin run apart): besides the
    :class:`DataPlane` calls it says what it holds and runs, so that a restarted controller
    can adopt it."""

    def rules(self) -> list[PathSet]:
        """The path sets the data plane holds now."""

    def status(self) -> dict[str, Any]:
        """Its own health report (``{}`` or ``running: False`` if it cannot be read)."""

    def jobs(self) -> list[dict[str, Any]]:
        """The intents (as dicts) of the jobs running on it, for the controller to declare."""
