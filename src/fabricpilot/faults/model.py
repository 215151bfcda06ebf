"""The fault model: what fails, when, and how the fabric notices.

A scenario's ``faults`` section names links and switches; :func:`resolve_faults` turns it into
a :class:`FaultTimeline` over *directed* link ids of a :class:`CompiledTopology`:

* ``link_down`` / ``link_up``: a cable (``"leaf0-spine1"``: both directions) or one direction
  (``"leaf0->spine1"``) goes down / comes back; ``link_down`` with ``until_ns`` comes back by
  itself.
* ``switch_down``: every link into and out of the switch goes down (one fault), optionally up
  again at ``until_ns``.
* ``flap``: ``count`` cycles of down for ``down_ns`` then up for ``up_ns``.
* ``gray``: the link stays up but corrupts bits at a pre-FEC bit error rate ``ber``; what FEC
  cannot correct is lost (:func:`gray_drop_probability`), until ``until_ns`` (a ``clear``).
* ``random``: link failures drawn from a mean time between failures with the scenario seed
  (:func:`random_faults`).

Events are raw state changes: two faults may hold the same link down over overlapping
intervals (a ``switch_down`` and a ``link_down`` of one of its links), and an ``up`` of one
fault does not undo the other's ``down``. The engine keeps one count of holders per link (a
link is up when no fault holds it down), or per fault id.

Every fault has a ``fault_id``: its index in ``faults.events``; random faults follow, numbered
in order of their start time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from fabricpilot.errors import ScenarioError
from fabricpilot.topology.compiled import LINK_KIND_CODES, CompiledTopology
from fabricpilot.topology.model import LinkKind, switch_examples

if TYPE_CHECKING:
    from fabricpilot.scenario.models import FaultEventSpec, FaultsSpec

__all__ = [
    "FEC_CODEWORD_SYMBOLS",
    "FEC_CORRECTABLE_SYMBOLS",
    "FEC_PAYLOAD_BITS",
    "FEC_SYMBOL_BITS",
    "FaultError",
    "FaultEvent",
    "FaultInfo",
    "FaultParams",
    "FaultTimeline",
    "gray_drop_probability",
    "random_faults",
    "remaining_events",
    "resolve_faults",
]

EventKind = Literal["down", "up", "gray", "clear"]
FaultKind = Literal["link_down", "link_up", "switch_down", "flap", "gray"]
RandomScope = Literal["fabric", "all"]

# RS(544,514) "KP4" FEC of 400G/800G Ethernet (IEEE 802.3 clause 119): 10-bit symbols
FEC_SYMBOL_BITS = 10
FEC_CODEWORD_SYMBOLS = 544
FEC_CORRECTABLE_SYMBOLS = 15  # t = (544 - 514) / 2
FEC_PAYLOAD_BITS = 514 * FEC_SYMBOL_BITS  # 5140 bits of data per 5440-bit codeword

_RANDOM_SEED_STREAM = 3  # runner: placement [seed, 1], mice [seed, 2]; random faults [seed, 3]
MAX_RANDOM_FAULTS = 100_000


class FaultError(ScenarioError):
    """A fault names a link or switch the topology does not have (or cannot be drawn).

    A :class:`~fabricpilot.errors.ScenarioError` (so a
    :class:`~fabricpilot.errors.FabricpilotError`): one line ``FILE: FIELD: PROBLEM``.

    >>> str(FaultError("s.yaml", "faults.events[2].link", "no link 'leaf9-spine1'"))
    "s.yaml: faults.events[2].link: no link 'leaf9-spine1'"
    """


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One state change of a set of directed links at ``time_ns``.

    ``kind``: ``down`` (links stop carrying traffic), ``up`` (they carry it again), ``gray``
    (they carry it but corrupt bits at ``ber`` pre-FEC and lose ``drop_probability`` of the
    packets after FEC), ``clear`` (the gray failure ends). ``links`` are directed link ids (a
    cable is both directions); ``fault_id`` is the :class:`FaultInfo` it belongs to (all the
    down/up events of a flapping link share one id).

    >>> FaultEvent(2_000_000, "down", (32, 33), fault_id=0)
    FaultEvent(time_ns=2000000, kind='down', links=(32, 33), fault_id=0, ber=0.0, \
drop_probability=0.0)
    """

    time_ns: int
    kind: EventKind
    links: tuple[int, ...]
    fault_id: int
    ber: float = 0.0
    drop_probability: float = 0.0


@dataclass(frozen=True)
class FaultInfo:
    """One fault of the scenario, for reports: what it is, where and when.

    ``kind`` is the scenario kind (``link_down``, ``link_up``, ``switch_down``, ``flap``,
    ``gray``; random faults are ``link_down`` or ``gray``); ``links`` every directed link it
    touches; ``end_ns`` when it is over (the last ``up`` / ``clear``; ``None``: it lasts to the
    end of the run; a ``link_up`` is instantaneous: ``end_ns == start_ns``).

    >>> FaultInfo(0, "link_down", "link leaf0<->spine1 down at 2 ms", (32, 33), 2_000_000, None)
    ... # doctest: +ELLIPSIS
    FaultInfo(fault_id=0, kind='link_down', label='link leaf0<->spine1 down at 2 ms', ...)
    """

    fault_id: int
    kind: FaultKind
    label: str
    links: tuple[int, ...]
    start_ns: int
    end_ns: int | None


@dataclass(frozen=True)
class FaultParams:
    """How the fabric notices and reacts to faults (defaults: typical RoCE fabric values).

    * ``detection_delay_ns``: a down link's neighbours see loss of signal after this (100 us).
    * ``convergence_delay_ns``: the routing protocol has converged around a down link this long
      after detection (200 ms); until then traffic hashed onto it is black-holed.
    * ``rdma_timeout_ns``: RoCE retransmission timeout: a lost packet is resent after this.
    * ``rdma_retry_count``: retransmissions a RoCE QP makes (one per ``rdma_timeout_ns``)
      before it gives up: a stream still without a path after that errors out, and its job
      with it (``None``: it retries until its path is back). NICs allow at most 7.
    * ``local_repair``: at detection, a switch drops its own port on a dead link from its
      ECMP / adaptive-routing groups that keep another next hop (hardware fast failover),
      and the streams it was sending there move; traffic a switch has no other way for
      (its only link toward a leaf died) still waits for routing to converge (off: the
      routing-protocol baseline, every switch keeps its groups until convergence).
    * ``fec_threshold``: a link whose FEC-corrected bit error rate exceeds this is flagged as
      gray (detection of gray failures from error counters).
    * ``debounce_count`` / ``debounce_window_ns``: act on a link only after this many
      detections within the window (count 1: act on the first).
    * ``telemetry_interval_ns``: period at which error counters are sampled.
    * ``noise_spike_probability`` / ``noise_spike_ber``: noisy counters: each sample of each
      link independently shows a spurious error rate ``noise_spike_ber`` with this probability
      (use :meth:`FaultTimeline.noise_rng` for the draws).

    >>> FaultParams().convergence_delay_ns
    200000000
    >>> FaultParams(debounce_count=0)
    Traceback (most recent call last):
    ...
    ValueError: debounce_count must be >= 1 (got 0)
    """

    detection_delay_ns: int = 100_000
    convergence_delay_ns: int = 200_000_000
    rdma_timeout_ns: int = 4_000_000
    fec_threshold: float = 1e-6
    debounce_count: int = 3
    debounce_window_ns: int = 500_000_000
    telemetry_interval_ns: int = 1_000_000
    noise_spike_probability: float = 0.0
    noise_spike_ber: float = 0.0
    local_repair: bool = False
    rdma_retry_count: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("detection_delay_ns", self.detection_delay_ns >= 0, ">= 0"),
            ("convergence_delay_ns", self.convergence_delay_ns >= 0, ">= 0"),
            ("rdma_timeout_ns", self.rdma_timeout_ns > 0, "> 0"),
            ("fec_threshold", 0 < self.fec_threshold <= 0.5, "in (0, 0.5]"),
            ("debounce_count", self.debounce_count >= 1, ">= 1"),
            ("debounce_window_ns", self.debounce_window_ns > 0, "> 0"),
            ("telemetry_interval_ns", self.telemetry_interval_ns > 0, "> 0"),
            ("noise_spike_probability", 0 <= self.noise_spike_probability <= 1, "in [0, 1]"),
            ("noise_spike_ber", 0 <= self.noise_spike_ber <= 0.5, "in [0, 0.5]"),
            ("rdma_retry_count", self.rdma_retry_count is None or 0 <= self.rdma_retry_count <= 7,
             "in [0, 7]"),
        ]
        for name, ok, bound in checks:
            if not ok:
                raise ValueError(f"{name} must be {bound} (got {getattr(self, name)!r})")


@dataclass
class FaultTimeline:
    """The resolved faults of a scenario: events sorted by ``(time_ns, fault_id)``, one
    :class:`FaultInfo` per fault (index = ``fault_id``) and the reaction parameters.

    ``seed`` is the scenario seed the faults were drawn with.
    """

    events: list[FaultEvent]
    faults: list[FaultInfo]
    params: FaultParams
    seed: int = 0

    def merged(self, other: FaultTimeline) -> FaultTimeline:
        """These faults and ``other``'s (numbered after these, on the same clock), with
        these parameters and seed.

        >>> a = FaultTimeline([FaultEvent(5, "down", (1,), 0)],
        ...                   [FaultInfo(0, "link_down", "a", (1,), 5, None)], FaultParams())
        >>> b = FaultTimeline([FaultEvent(2, "down", (2,), 0)],
        ...                   [FaultInfo(0, "link_down", "b", (2,), 2, None)], FaultParams())
        >>> m = a.merged(b)
        >>> [(e.time_ns, e.fault_id) for e in m.events], [f.label for f in m.faults]
        ([(2, 1), (5, 0)], ['a', 'b'])
        """
        n = len(self.faults)
        faults = [*self.faults, *(replace(f, fault_id=n + f.fault_id) for f in other.faults)]
        events = sorted([*self.events,
                         *(replace(e, fault_id=n + e.fault_id) for e in other.events)],
                        key=lambda e: (e.time_ns, e.fault_id))
        return replace(self, events=events, faults=faults)

    def links_at(self, time_ns: int) -> tuple[frozenset[int], dict[int, float]]:
        """Replay the events up to and including ``time_ns``: the links down at that time and
        the drop probability of every gray link (a link held by several faults of one kind
        is down / gray while any of them holds it; the largest drop probability wins).

        For tests and reports; the engine applies the events as they come.
        """
        gray: dict[int, dict[int, float]] = {}
        down = self._down_counts(time_ns)
        for event in self.events:
            if event.time_ns > time_ns:
                break
            for link in event.links:
                if event.kind == "gray":
                    gray.setdefault(link, {})[event.fault_id] = event.drop_probability
                elif event.kind == "clear":
                    gray.get(link, {}).pop(event.fault_id, None)
        return (frozenset(k for k, v in down.items() if v),
                {k: max(v.values()) for k, v in gray.items() if v})

    def _down_counts(self, time_ns: int, on_up: Callable[[FaultEvent, bool], None] | None
                     = None) -> dict[int, int]:
        """Per link, the faults holding it down after the events up to ``time_ns``, as the
        twin counts them: a ``down`` adds one, an ``up`` (a fault ending, or a ``link_up``)
        takes one off while any is left. ``on_up(event, changed)`` is told of every ``up``
        and whether it found any of its links down."""
        down: dict[int, int] = {}
        for event in self.events:
            if event.time_ns > time_ns:
                break
            if event.kind == "down":
                for link in event.links:
                    down[link] = down.get(link, 0) + 1
            elif event.kind == "up":
                held = [link for link in event.links if down.get(link, 0) > 0]
                for link in held:
                    down[link] -= 1
                if on_up is not None:
                    on_up(event, bool(held))
        return down

    def idle_link_ups(self) -> list[FaultInfo]:
        """The ``link_up`` faults that find their link up (nothing holds it down then): they
        change nothing, which a scenario likely did not mean."""
        idle: list[FaultInfo] = []
        by_id = {f.fault_id: f for f in self.faults}

        def seen(event: FaultEvent, changed: bool) -> None:
            info = by_id.get(event.fault_id)
            if not changed and info is not None and info.kind == "link_up":
                idle.append(info)

        self._down_counts(max((e.time_ns for e in self.events), default=0), seen)
        return idle

    def stacked_link_downs(self) -> list[tuple[FaultInfo, FaultInfo]]:
        """The ``link_down`` faults that find a link of theirs already down, each with the
        fault holding it (the latest one): the link then comes up only once both have ended
        (a ``link_up`` takes off one hold), which a scenario likely did not mean when it
        gives the same ``link_down`` twice."""
        by_id = {f.fault_id: f for f in self.faults}
        holders: dict[int, list[int]] = {}  # link -> the faults holding it down, in order
        out: list[tuple[FaultInfo, FaultInfo]] = []
        for event in self.events:
            if event.kind == "down":
                info = by_id.get(event.fault_id)
                held = next((holders[lk][-1] for lk in event.links if holders.get(lk)), None)
                if (info is not None and info.kind == "link_down" and held is not None
                        and held != event.fault_id and held in by_id):
                    out.append((info, by_id[held]))
                for lk in event.links:
                    holders.setdefault(lk, []).append(event.fault_id)
            elif event.kind == "up":
                for lk in event.links:
                    h = holders.get(lk)
                    if h and event.fault_id in h:  # (a fault's end: its own hold)
                        h.remove(event.fault_id)
                    elif h:  # (a link_up: the latest)
                        h.pop()
        return out


def remaining_events(events: Sequence[FaultEventSpec], elapsed_ns: int
                     ) -> list[FaultEventSpec]:
    """What is left of fault ``events`` (their times counted from some instant) once
    ``elapsed_ns`` have passed, with times counted from then: an event not started yet is
    shifted; one under way with an end (``until_ns``, a flap's last cycle) keeps the rest
    of it (a flap in the middle of a down time is down for the rest of it, then its
    remaining cycles); one over, or under way without an end, is gone (an open-ended fault
    lasts to the end of the run it started in).

    >>> from fabricpilot.scenario.models import FaultEventSpec as E
    >>> evs = [E(kind="link_down", link="a-b", at_ns=1_000, until_ns=5_000),
    ...        E(kind="gray", link="c-d", at_ns=0, ber=1e-5),
    ...        E(kind="switch_down", switch="s", at_ns=3_000, until_ns=4_000),
    ...        E(kind="link_up", link="e-f", at_ns=9_000)]
    >>> [(e.kind, e.at_ns, e.until_ns) for e in remaining_events(evs, 2_000)]
    [('link_down', 0, 3000), ('switch_down', 1000, 2000), ('link_up', 7000, None)]

    A flap of 3 cycles (down 100 ns, up 300 ns) from 0, 450 ns on: the second cycle's
    down time has 50 ns left, then one cycle from 350 ns:

    >>> f = E(kind="flap", link="a-b", at_ns=0, down_ns=100, up_ns=300, count=3)
    >>> [(e.kind, e.at_ns, e.until_ns, e.count) for e in remaining_events([f], 450)]
    [('link_down', 0, 50, None), ('flap', 350, None, 1)]
    >>> remaining_events([f], 1_200)
    []
    """
    from fabricpilot.scenario.models import FaultEventSpec

    out: list[FaultEventSpec] = []
    for e in events:
        if e.at_ns >= elapsed_ns:  # (not started yet)
            out.append(e.model_copy(update={
                "at_ns": e.at_ns - elapsed_ns,
                "until_ns": None if e.until_ns is None else e.until_ns - elapsed_ns}))
        elif e.kind == "flap":
            assert e.down_ns is not None and e.up_ns is not None and e.count is not None
            cycle = e.down_ns + e.up_ns
            done, phase = divmod(elapsed_ns - e.at_ns, cycle)
            if done >= e.count:
                continue
            if phase < e.down_ns:  # (down now: the rest of this down time)
                out.append(FaultEventSpec(kind="link_down", link=e.link, at_ns=0,
                                          until_ns=e.down_ns - phase))
            if e.count - done - 1 > 0:
                out.append(e.model_copy(update={"at_ns": cycle - phase,
                                                "count": e.count - done - 1}))
        elif e.until_ns is not None and e.until_ns > elapsed_ns:
            out.append(e.model_copy(update={"at_ns": 0, "until_ns": e.until_ns - elapsed_ns}))
    return out


# --- gray failures: bit errors through the FEC ----------------------------------------------


def gray_drop_probability(ber: float, packet_bytes: int = 4096) -> float:
    r"""Post-FEC packet loss of a link with pre-FEC bit error rate ``ber``.

    The RS(544,514) "KP4" FEC of 400G/800G Ethernet corrects up to :math:`t = 15` 10-bit
    symbol errors per 544-symbol (5440-bit) codeword carrying 5140 bits of data. With
    independent bit errors (no bursts):

    .. math::

        p_s = 1 - (1 - \mathrm{ber})^{10}, \qquad
        P_{cw} = P[X > 15],\ X \sim \mathrm{Binomial}(544, p_s), \qquad
        P_{drop} = 1 - (1 - P_{cw})^{\lceil 8 b / 5140 \rceil}

    a packet of ``b`` bytes spanning :math:`\lceil 8b/5140 \rceil` codewords, lost if any of
    them is uncorrectable. Real links have correlated errors (bursts, DFE error propagation),
    so this is the optimistic, textbook figure.

    >>> gray_drop_probability(1e-8) < 1e-20          # a healthy link: nothing lost
    True
    >>> f"{gray_drop_probability(2.4e-4):.2e}"       # the usual pre-FEC BER limit: ~6e-12
    '5.71e-12'
    >>> f"{gray_drop_probability(1e-3):.2e}"         # 1 packet in ~930 lost
    '1.07e-03'
    >>> round(gray_drop_probability(2e-3), 2)        # past the FEC cliff
    0.44
    >>> gray_drop_probability(0.0)
    0.0
    """
    if not 0 <= ber <= 1:
        raise ValueError(f"ber must be in [0, 1] (got {ber!r})")
    if packet_bytes <= 0:
        raise ValueError(f"packet_bytes must be > 0 (got {packet_bytes!r})")
    if ber == 0:
        return 0.0
    if ber == 1:
        return 1.0
    from scipy.stats import binom  # slow to import: only when a gray link is resolved

    p_symbol = -math.expm1(FEC_SYMBOL_BITS * math.log1p(-ber))
    p_codeword = float(binom.sf(FEC_CORRECTABLE_SYMBOLS, FEC_CODEWORD_SYMBOLS, p_symbol))
    if p_codeword >= 1.0:
        return 1.0
    n_codewords = math.ceil(8 * packet_bytes / FEC_PAYLOAD_BITS)
    return -math.expm1(n_codewords * math.log1p(-p_codeword))


# --- names -> link ids ----------------------------------------------------------------------


def _fmt_ns(ns: int) -> str:
    """A time for a label: ``2000000`` → ``"2 ms"``, ``200000`` → ``"200 us"``."""
    if ns == 0:
        return "0"
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if abs(ns) >= scale:
            return f"{ns / scale:g} {unit}"
    return f"{ns} ns"


def _link_examples(ct: CompiledTopology) -> str:
    """``links look like 'leaf0-spine0', 'leaf0->spine0'`` from the first switch link."""
    fabric = np.flatnonzero(ct.link_kind == LINK_KIND_CODES[LinkKind.FABRIC])
    if len(fabric) == 0 and ct.n_links == 0:
        return "the topology has no links"
    link = int(fabric[0]) if len(fabric) else 0
    a, b = ct.node_names[ct.link_src[link]], ct.node_names[ct.link_dst[link]]
    return f"links look like '{a}-{b}', '{a}->{b}'"


def _resolve_link(ct: CompiledTopology, name: str) -> tuple[tuple[int, ...], str] | str:
    """Directed link ids and display name of ``name`` (``a-b`` or ``a->b``), or a problem."""
    text = name.strip()
    index = ct.node_index
    if "->" in text:
        a, _, b = (part.strip() for part in text.partition("->"))
        pairs = [(a, b)]
        directed = True
    else:
        # a node name may contain '-': try every split whose both sides are nodes
        splits = [(text[:i].strip(), text[i + 1:].strip()) for i, c in enumerate(text) if c == "-"]
        pairs = [(a, b) for a, b in splits if a in index and b in index] or splits
        directed = False
    if not pairs:
        return (f"no link {name!r}: write a cable as 'a-b' or one direction as 'a->b' "
                f"({_link_examples(ct)})")
    a, b = pairs[0]
    for node in (a, b):
        if node not in index:
            return f"no link {name!r}: no node {node!r} ({_link_examples(ct)})"
    forward = ct.link_id.get((index[a], index[b]))
    if forward is None:
        return f"no link {name!r}: {a} and {b} are not connected ({_link_examples(ct)})"
    if directed:
        return (forward,), f"{a}->{b}"
    return (forward, ct.link_id[(index[b], index[a])]), f"{a}<->{b}"


def _switch_links(ct: CompiledTopology, name: str) -> tuple[int, ...] | None:
    """Every directed link into or out of switch ``name`` (``None``: not a switch)."""
    node = ct.node_index.get(name)
    if node is None or ct.switch_of_node[node] < 0:
        return None
    touching = (ct.link_src == node) | (ct.link_dst == node)
    return tuple(int(i) for i in np.flatnonzero(touching))


# --- resolution -----------------------------------------------------------------------------


def _event_faults(
    spec: FaultEventSpec, fault_id: int, links: tuple[int, ...], what: str, packet_bytes: int
) -> tuple[list[FaultEvent], FaultInfo]:
    """The events and the info of one scenario fault whose links are resolved."""
    at = spec.at_ns
    until = spec.until_ns
    tail = f" until {_fmt_ns(until)}" if until is not None else ""
    events: list[FaultEvent] = []
    end: int | None = until
    if spec.kind in ("link_down", "switch_down"):
        events.append(FaultEvent(at, "down", links, fault_id))
        if until is not None:
            events.append(FaultEvent(until, "up", links, fault_id))
        label = f"{what} down at {_fmt_ns(at)}{tail}"
    elif spec.kind == "link_up":
        events.append(FaultEvent(at, "up", links, fault_id))
        label, end = f"{what} up at {_fmt_ns(at)}", at
    elif spec.kind == "flap":
        assert spec.down_ns is not None and spec.up_ns is not None and spec.count is not None
        period = spec.down_ns + spec.up_ns
        for i in range(spec.count):
            events.append(FaultEvent(at + i * period, "down", links, fault_id))
            events.append(FaultEvent(at + i * period + spec.down_ns, "up", links, fault_id))
        end = events[-1].time_ns
        label = (f"{what} flaps {spec.count}x ({_fmt_ns(spec.down_ns)} down, "
                 f"{_fmt_ns(spec.up_ns)} up) from {_fmt_ns(at)} to {_fmt_ns(end)}")
    else:  # gray
        ber = spec.ber or 0.0
        drop = (spec.drop_probability if spec.drop_probability is not None
                else gray_drop_probability(ber, packet_bytes))
        events.append(FaultEvent(at, "gray", links, fault_id, ber=ber, drop_probability=drop))
        if until is not None:
            events.append(FaultEvent(until, "clear", links, fault_id))
        label = f"{what} gray (BER {ber:.3g}, drop {drop:.3g}) at {_fmt_ns(at)}{tail}"
    return events, FaultInfo(fault_id, spec.kind, label, links, at, end)


def resolve_faults(
    spec: FaultsSpec,
    ct: CompiledTopology,
    seed: int,
    *,
    source: str = "<scenario>",
    packet_bytes: int = 4096,
) -> FaultTimeline:
    """Resolve the scenario's ``faults`` section against ``ct`` into a :class:`FaultTimeline`.

    Link and switch names are checked here (they need the topology): an unknown one raises
    :class:`FaultError` naming ``source`` and the field (``faults.events[2].link``).
    ``packet_bytes`` (the frame a gray link's loss applies to) sets the drop probability
    derived from a gray fault's ``ber``. Random faults (``faults.random``) are drawn with
    ``seed`` and numbered after the listed events.

    >>> from fabricpilot.topology import compile_topology, leaf_spine
    >>> from fabricpilot.scenario.models import FaultsSpec
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> spec = FaultsSpec.model_validate({"events": [
    ...     {"kind": "flap", "link": "leaf1->spine0", "at_ns": "1ms", "down_ns": "200us",
    ...      "up_ns": "300us", "count": 2}]})
    >>> [(e.time_ns, e.kind) for e in resolve_faults(spec, ct, seed=1).events]
    [(1000000, 'down'), (1200000, 'up'), (1500000, 'down'), (1700000, 'up')]
    >>> bad = FaultsSpec.model_validate(
    ...     {"events": [{"kind": "switch_down", "switch": "spine7", "at_ns": 0}]})
    >>> resolve_faults(bad, ct, seed=1, source="s.yaml")
    Traceback (most recent call last):
    ...
    fabricpilot.faults.model.FaultError: s.yaml: faults.events[0].switch: no switch 'spine7' \
(switches are e.g. leaf0, spine0)
    """
    events: list[FaultEvent] = []
    faults: list[FaultInfo] = []
    for i, event in enumerate(spec.events):
        where = f"faults.events[{i}]"
        if event.kind == "switch_down":
            assert event.switch is not None
            links = _switch_links(ct, event.switch)
            if links is None:
                name = event.switch
                problem = (f"{name!r} is not a switch" if name in ct.node_index
                           else f"no switch {name!r}")
                raise FaultError(source, f"{where}.switch",
                                 f"{problem} ({switch_examples(list(ct.topo.switches))})")
            what = f"switch {event.switch}"
        else:
            assert event.link is not None
            resolved = _resolve_link(ct, event.link)
            if isinstance(resolved, str):
                raise FaultError(source, f"{where}.link", resolved)
            links, display = resolved
            what = f"link {display}"
        new, info = _event_faults(event, i, links, what, packet_bytes)
        events += new
        faults.append(info)
    r = spec.random
    if r is not None:
        new_events, new_faults = random_faults(
            ct, seed, link_mtbf_ns=r.link_mtbf_ns, repair_ns=r.repair_ns,
            horizon_ns=r.horizon_ns, gray_fraction=r.gray_fraction, gray_ber=r.gray_ber,
            scope=r.scope, packet_bytes=packet_bytes, first_id=len(faults), source=source)
        events += new_events
        faults += new_faults
    events.sort(key=lambda e: (e.time_ns, e.fault_id))  # stable: a fault's own order kept
    return FaultTimeline(events, faults, spec.to_params(), seed=seed)


def _cables(ct: CompiledTopology, scope: RandomScope) -> list[tuple[int, int]]:
    """The cables (both directed link ids) random failures may hit: switch-to-switch links
    (``fabric``), or those and the NIC links (``all``; NVLink never fails here)."""
    kinds = [LINK_KIND_CODES[LinkKind.FABRIC]]
    if scope == "all":
        kinds.append(LINK_KIND_CODES[LinkKind.NIC])
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for link in np.flatnonzero(np.isin(ct.link_kind, kinds)):
        a = int(link)
        if a in seen:
            continue
        b = ct.link_id[(int(ct.link_dst[a]), int(ct.link_src[a]))]
        seen.update((a, b))
        out.append((a, b))
    return out


def random_faults(
    ct: CompiledTopology,
    seed: int,
    *,
    link_mtbf_ns: float,
    repair_ns: int,
    horizon_ns: int,
    gray_fraction: float = 0.0,
    gray_ber: float = 1e-5,
    scope: RandomScope = "fabric",
    packet_bytes: int = 4096,
    first_id: int = 0,
    source: str = "<scenario>",
) -> tuple[list[FaultEvent], list[FaultInfo]]:
    """Failures drawn per cable from a mean time between failures, deterministic in ``seed``.

    Every cable in ``scope`` (``fabric``: switch-to-switch; ``all``: also the NIC links) fails
    after an exponential up time of mean ``link_mtbf_ns``, stays failed ``repair_ns``, then
    runs again; failures start in ``[0, horizon_ns)`` (a repair may end after the horizon).
    While ``repair_ns`` is small against the MTBF, a cable fails about
    ``horizon_ns / link_mtbf_ns`` times. Each failure is gray (``gray_ber``, drop probability
    from :func:`gray_drop_probability`) with probability ``gray_fraction``, else a ``down``.

    Returns the events (by start time) and one ``FaultInfo`` per failure, numbered from
    ``first_id`` in order of start time. Uses ``numpy.random.default_rng([seed, 3])``.

    >>> from fabricpilot.topology import compile_topology, leaf_spine
    >>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
    >>> events, faults = random_faults(ct, 1, link_mtbf_ns=10e6, repair_ns=100_000,
    ...                                horizon_ns=10_000_000)
    >>> len(events) == 2 * len(faults) and all(f.kind == "link_down" for f in faults)
    True
    >>> random_faults(ct, 1, link_mtbf_ns=10e6, repair_ns=100_000,
    ...               horizon_ns=10_000_000)[1] == faults
    True
    """
    if not link_mtbf_ns > 0 or repair_ns <= 0 or horizon_ns <= 0:
        raise ValueError("link_mtbf_ns, repair_ns and horizon_ns must be > 0")
    if not 0 <= gray_fraction <= 1:
        raise ValueError(f"gray_fraction must be in [0, 1] (got {gray_fraction!r})")
    cables = _cables(ct, scope)
    expected = len(cables) * horizon_ns / link_mtbf_ns
    if expected > MAX_RANDOM_FAULTS:
        raise FaultError(
            source, "faults.random.link_mtbf_ns",
            f"{len(cables)} cables failing every {_fmt_ns(round(link_mtbf_ns))} over "
            f"{_fmt_ns(horizon_ns)} make ~{expected:.3g} faults (at most {MAX_RANDOM_FAULTS}); "
            f"raise link_mtbf_ns or shorten horizon_ns")
    rng = np.random.default_rng([seed, _RANDOM_SEED_STREAM])
    gray_drop = gray_drop_probability(gray_ber, packet_bytes) if gray_fraction > 0 else 0.0
    drawn: list[tuple[int, int, bool]] = []  # (start, cable index, gray)
    for c in range(len(cables)):
        t = 0.0
        while True:
            t += float(rng.exponential(link_mtbf_ns))
            gray = bool(rng.random() < gray_fraction)  # drawn always: times do not depend on it
            start = round(t)
            if start >= horizon_ns:
                break
            drawn.append((start, c, gray))
            t = start + repair_ns
    drawn.sort()
    events: list[FaultEvent] = []
    faults: list[FaultInfo] = []
    for k, (start, c, gray) in enumerate(drawn):
        fid = first_id + k
        links = cables[c]
        end = start + repair_ns
        a = ct.node_names[ct.link_src[links[0]]]
        b = ct.node_names[ct.link_dst[links[0]]]
        when = f"at {_fmt_ns(start)} until {_fmt_ns(end)}"
        if gray:
            events.append(FaultEvent(start, "gray", links, fid, ber=gray_ber,
                                     drop_probability=gray_drop))
            events.append(FaultEvent(end, "clear", links, fid))
            label = f"random: link {a}<->{b} gray (BER {gray_ber:.3g}, drop {gray_drop:.3g}) {when}"
            faults.append(FaultInfo(fid, "gray", label, links, start, end))
        else:
            events.append(FaultEvent(start, "down", links, fid))
            events.append(FaultEvent(end, "up", links, fid))
            faults.append(FaultInfo(fid, "link_down", f"random: link {a}<->{b} down {when}",
                                    links, start, end))
    return events, faults

