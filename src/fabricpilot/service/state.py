"""The controller as a long-lived service: one :class:`FabricService` holds the controller,
its data plane, the durable store and the control loop, behind one lock.

The API (:mod:`fabricpilot.service.app`) calls the methods here; they check tenancy, change
the controller's state, persist it and return plain dicts. Planning is batched: declaring or
updating a job marks the plan stale and wakes the control loop, which re-plans every stale
job together (so a burst of declarations costs one plan; a few changed jobs among many are
planned by themselves, around the installed plan); between plans it runs the
controller's control period (:meth:`~fabricpilot.controller.core.Controller.tick`) every
``tick_interval_s`` of wall time. A call announced at run time waits for the plan that
includes it and answers with its paths.

Two locks keep the API responsive while the controller computes: ``lock`` guards the
controller and the data plane (the control loop and the twin hold it while they work);
the job registry (intents, tenancy checks, changes waiting to be planned) has its own small
lock, so declaring, reading and announcing never wait for a plan to finish. The data plane
publishes its path table copy-on-write, so readers see a consistent table without a lock.
A fault report does not wait for a whole plan either: while it waits for ``lock`` it sets
the controller's :attr:`~fabricpilot.controller.core.Controller.interrupt`, the plan gives
way at its next check (installing nothing), the fault is healed, and the plan is computed
again afterwards (a control period's at the next period, declared changes at the next plan).
Changes declared while a control period weighs a whole plan interrupt it the same way:
they are planned first, and the period's plan is weighed again at the next period.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from prometheus_client import generate_latest

from fabricpilot.balancing.task_aware import job_intents
from fabricpilot.controller.core import (
    Controller,
    HealReport,
    PlanInterrupted,
    TickReport,
    rule_key,
    task_of_key,
)
from fabricpilot.controller.intents import CommCall, Intent, sla_level
from fabricpilot.controller.patterns import pattern_transfers
from fabricpilot.controller.southbound import DataPlane, ExternalDataPlane, PathSet, PortDelta
from fabricpilot.errors import shorten_quoted
from fabricpilot.runner import Prepared, fault_setup
from fabricpilot.service.auth import Principal
from fabricpilot.service.metrics import job_registry, service_registry
from fabricpilot.service.schemas import (
    MAX_CALLS_PER_JOB,
    AnnounceIn,
    FaultIn,
    IntentIn,
    PortDeltaIn,
    TwinFaultsIn,
)
from fabricpilot.service.southbound_http import (
    SouthboundError,
    pathset_from_dict,
    pathset_to_dict,
)
from fabricpilot.service.store import Store, StoreError
from fabricpilot.service.twin import (
    TWIN_STATUS_KEYS,
    PacedTwin,
    ServiceDataPlane,
    TwinRunner,
    twin_context,
)

log = logging.getLogger("fabricpilot.service")

TWIN_TENANT = "twin"
"""The tenant of the jobs the twin's scenario declares."""

DEFAULT_ANNOUNCE_SLA_US = 1_000.0

PERIOD_YIELDS_MAX = 3
"""Control periods in a row whose whole plan may give way to declared changes; the next
one weighs its plan to the end (see :meth:`FabricService.run_tick`)."""


MAX_QUEUE_BYTES = float(1 << 36)
"""The deepest egress queue a port may report (64 GiB: beyond the HBM of deep-buffer
switches)."""
_MIN_FRAME_BITS = 64 * 8
"""The smallest Ethernet frame, in bits."""
_MIN_WIRE_FRAME_BITS = (64 + 20) * 8
"""The smallest Ethernet frame on the wire (with its preamble and inter-frame gap), bits."""


class ServiceError(Exception):
    """An API-level refusal: HTTP ``status`` and a one-line ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        detail = shorten_quoted(detail)  # (a value refused is not echoed whole)
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class Counters:
    """What the service did since it started (exported as Prometheus counters)."""

    plans: int = 0
    job_plans: int = 0         # plans of the changed jobs only (Controller.plan_jobs)
    replans: int = 0
    reroutes: int = 0          # path sets whose paths changed after the first plan
    heals: int = 0
    faults: int = 0
    announces: int = 0
    sla_refused: int = 0       # announced calls no path can serve within their SLA
    plans_yielded: int = 0     # whole plans that gave way (to a fault, or declared jobs)
    twin_restarts: int = 0     # the twin's process died and was started again


def intent_to_dict(intent: Intent) -> dict[str, Any]:
    """A JSON-able form of an intent (the store's and the API's)."""
    return {"task_id": intent.task_id, "tenant": intent.tenant, "gpus": list(intent.gpus),
            "opt_in": intent.opt_in,
            "calls": [{"pattern": c.pattern, "size_bytes": c.size_bytes, "sla_us": c.sla_us,
                       "period_ns": c.period_ns, "priority": c.priority,
                       "pairs": [list(p) for p in c.pairs],
                       **({"algorithm": c.algorithm} if c.algorithm else {})}
                      for c in intent.calls]}


def intent_from_dict(d: dict[str, Any]) -> Intent:
    calls = tuple(CommCall(c["pattern"], int(c["size_bytes"]), float(c["sla_us"]),
                           int(c["period_ns"]), int(c.get("priority", 0)),
                           tuple((int(a), int(b)) for a, b in c.get("pairs", [])),
                           str(c.get("algorithm", "")))
                  for c in d["calls"])
    return Intent(d["task_id"], d["tenant"], tuple(int(g) for g in d["gpus"]), calls,
                  bool(d.get("opt_in", True)))


_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def pairs_json(head: dict[str, Any], pairs: Iterable[dict[str, Any]]) -> bytes:
    """``head`` with its ``pairs`` last, as a JSON body, encoded pair by pair (a body of a
    million pairs in one ``json.dumps`` call would hold the interpreter for seconds; a
    web framework's generic encoder takes ten times longer).

    >>> pairs_json({"task_id": "a"}, iter([{"src": 0}, {"src": 1}]))
    b'{"task_id":"a","pairs":[{"src":0},{"src":1}]}'
    >>> pairs_json({"task_id": "a"}, [])
    b'{"task_id":"a","pairs":[]}'
    """
    start = _dumps({**head, "pairs": []})[:-2]  # (up to the pairs' "[")
    return (start + ",".join(map(_dumps, pairs)) + "]}").encode()


def moved_sets(before: Mapping[str, PathSet], after: Mapping[str, PathSet]
               ) -> list[tuple[PathSet, PathSet]]:
    """The path sets whose paths changed between two installed tables (kept in both), as
    (old, new).

    >>> a, b = PathSet("k", ((1, 2),), (1.0,)), PathSet("k", ((1, 3),), (1.0,))
    >>> moved_sets({"k": a, "j": a}, {"k": b, "j": a}) == [(a, b)]
    True
    """
    return [(old, new) for k, new in after.items()
            if (old := before.get(k)) is not None and old.paths != new.paths]


_EVENT_KEYS_PER_JOB = 20  # moved pairs an event names per job (its count says how many moved)


def event_moves(keys: Iterable[str]) -> dict[str, Any]:
    """The fields of an event that moved the path sets ``keys``: how many (``path_sets``),
    how many of each job (``by_task``), and the keys, the first
    :data:`_EVENT_KEYS_PER_JOB` of each job (a tenant reads those of its own jobs).

    >>> event_moves(["a:0->1", "b:2->3", "a:1->0"])
    {'path_sets': 3, 'by_task': {'a': 2, 'b': 1}, 'keys': ['a:0->1', 'b:2->3', 'a:1->0']}
    """
    by_task: Counter[str] = Counter()
    named = []
    for k in keys:
        task = task_of_key(k)
        by_task[task] += 1
        if by_task[task] <= _EVENT_KEYS_PER_JOB:
            named.append(k)
    return {"path_sets": sum(by_task.values()), "by_task": dict(by_task), "keys": named}


class FabricService:
    """The controller, its data plane, the store and the control loop (module docstring).

    ``twin=True`` runs the scenario's jobs on the twin in scaled real time (``time_scale``
    fabric seconds per wall second); ``twin=False`` keeps the twin's fabric but no traffic
    (the controller then sees only the telemetry posted to it). ``remote`` replaces the
    in-process twin by a data plane in another process (the twin's process of ``serve``,
    ``fabricpilot twin``, or switches): its fabric, its running jobs and the rules it holds
    are read from it, and its status is the health's ``twin`` when it reports a fabric
    time. ``telemetry_interval_s`` is how often the switches report (posted telemetry, or a
    remote data plane's): the congestion map steps the ports a report leaves out once per
    such interval of the control plane's clock (``None``: once per control period, as the
    twin reports)."""

    def __init__(self, prep: Prepared, store: Store, *, twin: bool = True,
                 time_scale: float = 1e-3, tick_interval_s: float = 0.2,
                 plan_interval_s: float = 0.25, remote: ExternalDataPlane | None = None,
                 telemetry_interval_s: float | None = None) -> None:
        self.prep = prep
        self.store = store
        self.lock = threading.RLock()
        # fault reports waiting for ``lock`` (while any does, a whole plan gives way)
        self._urgent = 0
        self._urgent_lock = threading.Lock()
        self.started_s = time.time()
        self.tick_interval_s = tick_interval_s
        self.plan_interval_s = plan_interval_s  # at most one plan of changes per interval
        self.counters = Counters()
        # called with ("plan" | "tick" | "heal", wall seconds) after each (metrics)
        self.observe_planner: Callable[[str, float], None] = lambda kind, s: None
        self.busbw_GBps: dict[str, float] = {}
        self.collective_us: dict[str, float] = {}
        self.remote = remote
        self.remote_status: dict[str, Any] = {} if remote is None else remote.status()
        # the in-process twin is the data plane unless a remote one is given
        policy = None if remote is not None else PacedTwin(twin_context(prep))
        inner: DataPlane = remote if remote is not None else cast("PacedTwin", policy)
        self.dp = ServiceDataPlane(inner, on_install=self._persist_paths,
                                   on_remove=self.store.delete_paths)
        # (gray-link detection as the scenario's faults section says, if it has one; the
        # congestion map stepped per reporting interval of the switches, if given)
        params = fault_setup(prep)[1]
        if telemetry_interval_s is not None:
            params = replace(params, telemetry_interval_ns=telemetry_interval_s * 1e9)
        self.controller = Controller(self.dp, params)
        if policy is not None:
            policy.controller = self.controller
            policy.job_names = [j.name for j in prep.jobs]
        self.view = self.dp.view
        self.n_gpus = len(self.view.gpu_node)
        self._inbound: dict[str, float] = {}  # node -> Gb/s of its inbound links
        # installed plans so far, counted on across restarts (a client comparing epochs
        # never sees one go back)
        self._plan_epoch = store.counter("plan_epoch")
        # the job registry: its own lock (see the module docstring)
        self._jobs_lock = threading.Lock()
        self._changed = threading.Condition(self._jobs_lock)
        self.intents: dict[str, Intent] = {}
        self._pending: dict[str, Intent | None] = {}  # task -> new intent (None: withdrawn)
        self._epoch = 0           # changes declared so far
        self._planned_upto = 0    # changes the installed plan includes
        self._changed_at: dict[str, int] = {}  # task -> the change that last touched it
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        # a twin process that died is started again, at most once per this many seconds
        # (doubling while it fails to start, up to a minute)
        self._revive_wait_s = 1.0
        self._revive_at = 0.0
        # a control period of the loop runs (a change declared meanwhile interrupts the
        # whole plan it may weigh; jobs lock)
        self._weighing = False
        self._periods_yielded = 0  # control periods in a row whose plan gave way
        # posted telemetry says a port changed state: a control period runs at once (jobs
        # lock)
        self._tick_soon = False
        # reroutes, heals, faults (the recent ones; kept in the store too: see _event)
        self.events: deque[dict[str, Any]] = deque(store.events(limit=200), maxlen=200)
        self.runner: TwinRunner | None = None
        # task -> (pattern, pairs, bucket) -> the call announced for it last
        self._announced: dict[str, dict[tuple[Any, ...], CommCall]] = {}
        # the jobs the data plane runs (the twin's): their stored path sets are restored too
        running = ([str(d["task_id"]) for d in remote.jobs()] if remote is not None
                   else [j.name for j in prep.jobs] if twin else [])
        self.restored = self._restore(running)
        self._dataplane_jobs = frozenset(running)  # (they declare themselves at a start)
        withdrawn = store.withdrawn()  # (jobs of the data plane's an operator withdrew)
        if remote is not None:
            for d in remote.jobs():
                if d["task_id"] not in self.controller.intents and d["task_id"] not in withdrawn:
                    self.controller.declare(intent_from_dict(d))
        elif twin and prep.jobs and policy is not None:
            self._declare_twin_jobs(withdrawn)
            self.runner = TwinRunner(prep, policy, self.lock, time_scale=time_scale,
                                     on_collective=self._on_collective)
        self.registry = service_registry(self)
        self.job_registry = job_registry(self)  # (operators only: see metrics_text)
        self.intents = dict(self.controller.intents)
        self._gpu_tenants: dict[int, Counter[str]] = {}  # GPU -> jobs using it per tenant
        for intent in self.intents.values():
            self._use_gpus(intent, +1)
        with self.lock:
            # after a restart the switches' path sets are the plan: a restart moves nothing
            resumed = self.restored["path_sets"] or self.restored["held_by_dataplane"]
            self._plan("start", resume=bool(resumed))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        # the control loop computes in pure Python for tens of ms at a time: hand the GIL
        # back to the API's event loop every 0.5 ms instead of every 5 ms
        sys.setswitchinterval(5e-4)
        self._loop_thread = threading.Thread(target=self._loop, name="fabricpilot-control",
                                             daemon=True)
        self._loop_thread.start()
        if self.runner is not None:
            self.runner.start()

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self.runner is not None:
            self.runner.stop()
        if self._loop_thread is not None:
            self._loop_thread.join(5.0)
        close = getattr(self.remote, "close", None)
        if close is not None:
            close()

    def _loop(self) -> None:
        """Plan declared changes at most every ``plan_interval_s`` (changes arriving in
        between join the next plan) and run a control period every ``tick_interval_s``, or
        at once when posted telemetry says a port went down or came back; a stream of
        declarations never starves the control periods."""
        next_tick = time.monotonic() + self.tick_interval_s
        next_plan = 0.0
        while not self._stop.is_set():
            with self._changed:
                due = min(next_tick, next_plan) if self._pending else next_tick
                wait = due - time.monotonic()
                if wait > 0 and not self._tick_soon:
                    self._changed.wait(wait)
                soon, self._tick_soon = self._tick_soon, False
            if self._stop.is_set():
                return
            now = time.monotonic()
            try:
                self.revive_twin()
                if now >= next_tick or soon:
                    next_tick = now + self.tick_interval_s
                    self.run_tick()
                if self._pending and time.monotonic() >= next_plan:
                    next_plan = time.monotonic() + self.plan_interval_s
                    self.plan_pending("intents")
            except Exception:  # keep serving; the failure is in the logs
                log.exception("control period failed")

    def run_tick(self) -> None:
        """One control period of the loop. A whole plan it weighs gives way to a fault report
        (as any) and to changes declared meanwhile: they are planned next, and the plan is
        weighed again at the next period. After ``PERIOD_YIELDS_MAX`` periods in a row gave
        way, the next one weighs its plan to the end whatever is declared meanwhile (those
        changes wait for it; fault reports still come first): a steady stream of
        declarations cannot keep the loop from ever re-planning congestion."""
        with self.lock:
            self._weighing = self._periods_yielded < PERIOD_YIELDS_MAX
            try:
                self._tick()
            finally:
                with self._changed:
                    self._weighing = False
                self._calm()

    def _calm(self) -> None:
        """Clear the controller's interrupt unless a fault report is waiting (lock held)."""
        with self._urgent_lock:
            if not self._urgent:
                self.controller.interrupt.clear()

    def plan_pending(self, why: str) -> None:
        """Hand the declared changes to the controller and plan them (one plan for all)."""
        with self._changed:
            pending, self._pending = self._pending, {}
            upto = self._epoch
        with self.lock:
            self._calm()  # (a change declared during a control period asked it to give way)
            for task, intent in pending.items():
                if intent is None:
                    self.controller.withdraw(task)
                    self.dp.forget_task(task)
                else:
                    self.controller.declare(intent)
            try:
                self._plan(why, only=set(pending), may_yield=True)
            except PlanInterrupted:  # a fault came first: these changes wait for the next
                self.counters.plans_yielded += 1
                log.info("plan gave way to a fault", extra={"fields": {"why": why}})
                with self._changed:
                    for task, intent in pending.items():  # (newer changes stay)
                        self._pending.setdefault(task, intent)
                    self._changed.notify_all()
                return
        with self._changed:
            self._planned_upto = max(self._planned_upto, upto)
            self._changed.notify_all()

    def revive_twin(self) -> bool:
        """If the twin's process died, start it again (without the controller's lock: it
        takes a while) and send it what the controller had installed: every path set, the
        congestion table and the QoS map. At most once per ``_revive_wait_s`` (doubling
        while it fails to start). Returns whether it was started again."""
        remote = self.remote
        restart = getattr(remote, "restart", None)
        why = getattr(remote, "gone", None)
        if restart is None or why is None or time.monotonic() < self._revive_at:
            return False
        try:
            restart()
        except SouthboundError as err:
            self._revive_at = time.monotonic() + self._revive_wait_s
            self._revive_wait_s = min(2 * self._revive_wait_s, 60.0)
            log.warning("twin restart failed", extra={"fields": {"why": str(err)}})
            return False
        assert remote is not None
        self._revive_wait_s = 1.0
        with self.lock:
            sets = list(self.dp.installed.values())
            self.dp.restore(sets)
            if self.dp.congestion:
                self.dp.push_congestion_table(dict(self.dp.congestion))
            if self.dp.qos:
                self.dp.set_qos(dict(self.dp.qos))
            self.remote_status = remote.status()
            self.counters.twin_restarts += 1
            self._event({"at_s": time.time(), "kind": "twin-restart", "why": why,
                         **event_moves(ps.key for ps in sets), "keys": []})
        log.warning("twin restarted", extra={"fields": {"why": why, "path_sets": len(sets)}})
        return True

    # ------------------------------------------------------------ control
    def now_ns(self) -> float:
        """The control plane's clock: the twin's fabric time, else wall time since start."""
        if self.runner is not None:
            return self.runner.twin.now_ns()
        return (time.time() - self.started_s) * 1e9

    def _timed(self, kind: str, t0: float) -> None:
        self.observe_planner(kind, time.perf_counter() - t0)

    def _plan(self, why: str, only: set[str] | None = None, resume: bool = False,
              may_yield: bool = False) -> None:
        """Plan the declared jobs (lock held): the jobs ``only`` by themselves, around the
        installed plan, when they are at most half of the jobs (withdrawn ones included)
        and the controller can
        (:meth:`~fabricpilot.controller.core.Controller.plan_jobs`); with ``resume``, the
        path sets restored as the plan (:meth:`~fabricpilot.controller.core.Controller.
        resume`); every job otherwise (giving way to a fault report if ``may_yield``:
        :class:`~fabricpilot.controller.core.PlanInterrupted`)."""
        before = self.dp.installed  # published copy-on-write: a snapshot
        t0 = time.perf_counter()
        rep = None
        if resume:
            rep = self.controller.resume()
        elif only is not None and 2 * len(only) <= len(only | set(self.controller.intents)):
            rep = self.controller.plan_jobs(only)
        scope = "all" if rep is None else "resumed" if resume else "jobs"
        if rep is None:
            rep = self.controller.plan(may_yield=may_yield)
            self.counters.plans += 1
        elif not resume:
            self.counters.job_plans += 1
        self._timed("plan", t0)
        self._new_epoch()
        self._note_reroutes(before, "plan", why)
        log.info("plan", extra={"fields": {"why": why, "scope": scope, "demands": rep.demands,
                                           "installed": rep.installed,
                                           "lambda": round(rep.plan.max_utilization, 4)}})

    def _new_epoch(self) -> None:
        """A plan was installed: the plan epoch goes on by one, stored."""
        self._plan_epoch += 1
        self.store.set_counter("plan_epoch", self._plan_epoch)

    def _tick(self) -> TickReport:
        """One control period (lock held): the controller's, then its record (counters,
        metrics, fault log, events); returns the controller's report."""
        before = self.dp.installed  # published copy-on-write: a snapshot
        t0 = time.perf_counter()
        rep = self.controller.tick(self.now_ns())
        self._timed("tick", t0)
        self._periods_yielded = self._periods_yielded + 1 if rep.interrupted else 0
        if rep.interrupted:  # (weighed again at the next period)
            self.counters.plans_yielded += 1
            log.info("control period's plan gave way (to a fault or declared changes)")
        if self.remote is not None:  # the remote twin's jobs' bus bandwidth, if it tells
            self.remote_status = self.remote.status()
            self.busbw_GBps.update(self.remote_status.get("busbw_GBps") or {})
            self.collective_us.update(self.remote_status.get("collective_us") or {})
        # links the telemetry showed down, back up or gray: in the fault log as reports are
        heals = [h for h in (rep.port_heal, rep.gray_heal) if h is not None]
        self._observe_heals(heals)
        # (the sets the period moved: read once, by the fault events and the reroute note)
        seen_any = bool(rep.links_down or rep.links_up or rep.links_gray or rep.links_clear)
        moved = moved_sets(before, self.dp.installed) if seen_any or rep.replanned else None
        seen = self._log_seen_links(rep, moved or [])
        if rep.replanned:
            self.counters.replans += 1
            self._new_epoch()
        sent = max((h.sent_s for h in heals), default=0.0) * 1e3
        why = "; ".join(
            ([f"from telemetry: {seen}" + (f" (new paths sent after {sent:.2f} ms)"
                                           if any(h.installed for h in heals) else "")]
             if seen else [])
            + ([f"hot links {rep.hot_links[:8]}: max fabric utilisation "
                f"{rep.lambda_before:.2f} -> {rep.lambda_after:.2f}"] if rep.replanned else []))
        if why:
            self._note_reroutes(before, "heal" if seen else "replan", why, moved)
        return rep

    def _observe_heals(self, heals: list[HealReport]) -> None:
        """The planner-latency metrics of heals: the whole reaction, and until the new paths
        were sent."""
        for h in heals:
            self.observe_planner("heal", h.wall_s)
            self.observe_planner("heal_sent", h.sent_s)

    def _log_seen_links(self, rep: TickReport, moved: list[tuple[PathSet, PathSet]]) -> str:
        """Record the links a control period learned of from telemetry (ports down or back
        up, links gray by their error counters, gray links clean again) as faults reported
        by ``telemetry``: in the store (a restart knows them), the counters and the events,
        each link's with the path sets the period moved off it (down, gray) or onto it (up;
        a gray link restored moves nothing by itself); ``moved``: the sets the period moved
        (:func:`moved_sets`). Returns a summary."""
        seen = [("down", "down", rep.links_down, "port down", True),
                ("up", "up", rep.links_up, "port up", True),
                ("gray", "gray", rep.links_gray, "FEC errors above threshold", True),
                ("clear", "up", rep.links_clear, "FEC errors below threshold: gray link "
                 "restored", False)]
        said = []
        for name, kind, links, detail, heals in seen:
            for lk in links:
                self.store.add_fault(time.time(), kind, lk, detail, "telemetry")
                self.counters.faults += 1
                li = self.view.links[lk]
                onto = kind == "up"
                off = [new.key for old, new in moved
                       if any(lk in p for p in (new if onto else old).paths)] if heals else []
                self._event({"at_s": time.time(), "kind": f"fault-{kind}",
                             "why": f"{li.src} -> {li.dst} ({detail}, from telemetry)",
                             **event_moves(off), "keys": []})
            if links:
                self.counters.heals += heals
                said.append(f"{name} {links[:8]}")
        return ", ".join(said)

    def _note_reroutes(self, before: Mapping[str, PathSet], kind: str, why: str,
                       moved_now: list[tuple[PathSet, PathSet]] | None = None) -> None:
        moved = [new.key for _, new in (moved_sets(before, self.dp.installed)
                                        if moved_now is None else moved_now)]
        if moved:
            self.counters.reroutes += len(moved)
            self._event({"at_s": time.time(), "kind": kind, "why": why, **event_moves(moved)})
            log.info("reroute", extra={"fields": {"kind": kind, "why": why,
                                                  "path_sets": len(moved)}})

    def _event(self, event: dict[str, Any]) -> None:
        """Record an event: in the recent ones (``events``) and in the store, so that the
        timeline survives a restart."""
        self.events.append(event)
        self.store.add_event(event)

    def _persist_paths(self, sets: list[PathSet]) -> None:
        self.store.put_paths([(ps.key, task_of_key(ps.key), pathset_to_dict(ps))
                              for ps in sets])

    def _on_collective(self, job: str, busbw_GBps: float, time_us: float) -> None:
        self.busbw_GBps[job] = busbw_GBps
        self.collective_us[job] = time_us

    def _declare_twin_jobs(self, withdrawn: set[str]) -> None:
        """The scenario's jobs declare themselves (tenant ``twin``), as in a twin run,
        except those withdrawn (through the API, in this run or an earlier one)."""
        for intent in job_intents(self.prep.jobs, TWIN_TENANT):
            if intent.task_id not in self.controller.intents and intent.task_id not in withdrawn:
                self.controller.declare(intent)

    def _announced_call(self, rec: dict[str, Any]
                        ) -> tuple[tuple[str, tuple[tuple[int, int], ...], int], CommCall]:
        """A stored announcement (:meth:`announce`) as the call it added to its job's
        intent, and its slot (pattern, transfers, bucket); ``KeyError`` / ``TypeError`` /
        ``ValueError`` / ``AttributeError`` if the record is not one."""
        pairs = tuple(pattern_transfers(rec["pattern"], tuple(rec["ranks"]),
                                        self.controller.host_of, rec.get("algorithm", "")))
        call = CommCall(rec["pattern"], rec["size_bytes"], rec["sla_us"],
                        rec.get("period_ns", 0), rec.get("priority", 0), pairs,
                        rec.get("algorithm", ""))
        return (rec["pattern"], pairs, rec["bucket"]), call

    def _restore(self, running: list[str]) -> dict[str, int]:
        """Read the store back: jobs, the fault state of each link and the path sets the
        switches held for them and for the jobs the data plane runs (``running``), installed
        again: the data plane is re-synced before the first plan, which then sends only what
        changed."""
        jobs = self.store.jobs()
        for task, _, d in jobs:
            try:
                intent = intent_from_dict(d)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise self.store.damaged("jobs", f"task_id {task!r}",
                                         f"{type(err).__name__}: {err}") from None
            outside = [g for g in intent.gpus if g not in self.view.gpu_node]
            if outside:  # (e.g. a state directory of another fabric)
                raise self._unfit("jobs", f"task_id {task!r}",
                                  f"GPU {outside[0]} is not in it (GPUs 0.."
                                  f"{len(self.view.gpu_node) - 1})")
            try:
                self.controller.declare(intent)
            except ValueError as err:
                raise self._unfit("jobs", f"task_id {task!r}", err) from None
            for rec in self.store.calls(task, limit=100_000):  # which call is which bucket
                try:
                    slot, call = self._announced_call(rec)
                except (KeyError, TypeError, ValueError, AttributeError) as err:
                    raise self.store.damaged("calls", f"task_id {task!r}",
                                             f"{type(err).__name__}: {err}") from None
                if call in intent.calls:
                    self._announced.setdefault(task, {})[slot] = call
        last = self.store.link_states()
        outside = [lk for lk in last if lk not in self.view.links]
        if outside:
            raise self._unfit("faults", f"link_id {outside[0]}",
                              f"link {outside[0]} is not in it")

        def links(kind: str, telemetry: bool = False) -> set[int]:
            return {lk for lk, (k, src) in last.items()
                    if k == kind and (not telemetry or src == "telemetry")}

        self.controller.restore_links(links("down"), links("gray"),
                                      ports_down=links("down", True),
                                      gray_by_counters=links("gray", True))
        known = {t for t, _, _ in jobs} | set(running)
        stored = []
        for key, d in self.store.paths().items():
            try:
                ps = pathset_from_dict(d)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise self.store.damaged("paths", f"key {key!r}",
                                         f"{type(err).__name__}: {err}") from None
            stored.append(ps)
        # (sets this service wrote: read once, and only their links checked against the
        # fabric, in one pass: a state directory of another fabric names links it lacks)
        links = self.view.links
        if not all(lk in links for ps in stored for p in ps.paths for lk in p):
            ps, i, j, lk = next((ps, i, j, lk) for ps in stored for i, p in enumerate(ps.paths)
                                for j, lk in enumerate(p) if lk not in links)
            raise self._unfit("paths", f"key {ps.key!r}",
                              f"paths[{i}][{j}]: link {lk} does not exist")
        kept = [ps for ps in stored if task_of_key(ps.key) in known]
        held: list[PathSet] = []
        if self.remote is not None:
            # the switches outlived us: what they hold is the truth; adopt it, and put back
            # (below) only what they lost
            held = self.remote.rules()
            self.dp.adopt(held)
            self.controller.adopt(held)
            have = {ps.key: ps for ps in held}
            kept = [ps for ps in kept if have.get(ps.key) != ps]
        if kept:
            try:
                self.dp.restore(kept)
                self.controller.adopt(kept)
            except ValueError as err:  # e.g. the rule capacity shrank: plan from scratch
                log.warning("restore", extra={"fields": {"error": str(err)}})
        # ("faults": the links whose fault state was read back)
        return {"jobs": len(jobs), "faults": len(last), "path_sets": len(kept),
                "held_by_dataplane": len(held)}

    def _unfit(self, table: str, row: str, why: object) -> StoreError:
        """The error for a stored row (of ``table``, ``row`` names it) that this fabric
        cannot take: a state directory of another fabric, or a damaged row."""
        return StoreError(f"{self.store.path}: table {table}, {row}: not of this fabric "
                          f"({why}): a state directory of another fabric?")

    # ------------------------------------------------------------ jobs
    def _owned(self, p: Principal, task_id: str) -> Intent:
        with self._jobs_lock:
            return self._owned_locked(p, task_id)

    def _owned_locked(self, p: Principal, task_id: str) -> Intent:
        """:meth:`_owned`, the jobs lock held: a change that acts on the job checks it
        under the lock it changes the job under (a job withdrawn or declared again by
        another tenant meanwhile is not acted on)."""
        intent = self.intents.get(task_id)
        if intent is None:  # (a task id in a path is not checked: not echoed whole)
            shown = repr(task_id) if len(task_id) <= 128 else repr(task_id[:128]) + "..."
            raise ServiceError(404, f"job {shown} not found")
        if not p.owns(intent.tenant):
            raise ServiceError(403, f"job {task_id!r} belongs to another tenant")
        return intent

    def _tenant_for(self, p: Principal, body: IntentIn) -> str:
        if p.is_operator:
            return body.tenant or "default"
        if body.tenant is not None and body.tenant != p.tenant:
            raise ServiceError(403, "tenant: a tenant token declares jobs for its own tenant")
        assert p.tenant is not None
        return p.tenant

    def _check_gpus(self, p: Principal, tenant: str, gpus: list[int],
                    old: Intent | None) -> None:
        """422 / 403 / 409 unless ``gpus`` exist, ``p`` may use them and no other tenant's
        job uses one (the job's intent before, ``old``, counts as not there: a job may move
        to another tenant)."""
        bad = [g for g in gpus if g >= self.n_gpus]
        if bad:
            raise ServiceError(422, f"gpus: GPU {bad[0]} does not exist (the fabric has "
                               f"{self.n_gpus} GPUs: 0-{self.n_gpus - 1})")
        if not p.may_use_gpus(gpus):
            outside = sorted(set(gpus) - (p.gpus or frozenset()))
            raise ServiceError(403, f"gpus: GPU {outside[0]} is not one of {p.name}'s GPUs")
        was = set(old.gpus) if old is not None else set()
        for g in sorted(gpus):
            users = self._gpu_tenants.get(g)
            if not users:
                continue
            if g in was:
                assert old is not None
                users = users - Counter({old.tenant: 1})
            if any(t != tenant for t in users):
                raise ServiceError(409, f"gpus: GPU {g} is in use by another tenant's job")

    def declare(self, p: Principal, body: IntentIn, *, replace_ok: bool) -> dict[str, Any]:
        """Declare a job (409 if its task id exists, unless ``replace_ok``): its record."""
        return self._declare(p, body, replace_ok)[0]

    def put(self, p: Principal, body: IntentIn) -> tuple[dict[str, Any], bool]:
        """Declare or replace a job: its record, and whether it is new."""
        return self._declare(p, body, True)

    def _declare(self, p: Principal, body: IntentIn, replace_ok: bool
                 ) -> tuple[dict[str, Any], bool]:
        tenant = self._tenant_for(p, body)
        with self._changed:
            old = self.intents.get(body.task_id)
            if old is not None:
                if not p.owns(old.tenant):
                    raise ServiceError(403, f"job {body.task_id!r} belongs to another tenant")
                if not replace_ok:
                    raise ServiceError(409, f"job {body.task_id!r} exists (PUT replaces it)")
                tenant = old.tenant if p.is_operator and body.tenant is None else tenant
            self._check_gpus(p, tenant, body.gpus, old)
            intent = body.to_intent(tenant)
            self.store.put_job(intent.task_id, tenant, intent_to_dict(intent))
            if old is not None:  # (its calls are those it gives now)
                self._forget_announced(intent)
            self._queue(intent.task_id, intent)
        return self._job_dict(intent), old is None

    def _forget_announced(self, intent: Intent) -> None:
        """A job declared again keeps the announced calls it still gives (a ``GET`` of the
        job ``PUT`` back keeps them, buckets and all) and forgets the others, which are no
        longer planned: they go from ``GET .../calls`` too."""
        task = intent.task_id
        slots = {s: c for s, c in self._announced.get(task, {}).items() if c in intent.calls}
        if slots:
            self._announced[task] = slots
        else:
            self._announced.pop(task, None)

        def kept(rec: Any) -> bool:
            try:
                return self._announced_call(rec)[1] in intent.calls
            except (KeyError, TypeError, ValueError, AttributeError):
                return False

        self.store.keep_calls(task, kept)

    def withdraw(self, p: Principal, task_id: str) -> None:
        """Withdraw a job: its intent, its announced calls (a job declared later under the
        same task id, perhaps by another tenant, starts without them) and, for a job the
        data plane runs by itself (the twin's scenario jobs), its declaring itself again at a
        restart."""
        with self._changed:
            self._owned_locked(p, task_id)
            self.store.delete_job(task_id, withdrawn=task_id in self._dataplane_jobs)
            self._announced.pop(task_id, None)
            self._queue(task_id, None)

    def _queue(self, task_id: str, intent: Intent | None) -> None:
        """Record a change for the next plan (jobs lock held)."""
        old = self.intents.pop(task_id, None)
        same_gpus = (old is not None and intent is not None and old.gpus == intent.gpus
                     and old.tenant == intent.tenant)
        if old is not None and not same_gpus:
            self._use_gpus(old, -1)
        if intent is not None:
            self.intents[task_id] = intent
            if not same_gpus:
                self._use_gpus(intent, +1)
        self._pending[task_id] = intent
        self._epoch += 1
        self._changed_at[task_id] = self._epoch
        if self._weighing:  # (a control period's whole plan gives way: this comes first)
            self.controller.interrupt.set()
        self._changed.notify_all()

    def _use_gpus(self, intent: Intent, n: int) -> None:
        """Count ``intent``'s GPUs as used (``n = 1``) or freed (``-1``) by its tenant."""
        for g in intent.gpus:
            users = self._gpu_tenants.setdefault(g, Counter())
            users[intent.tenant] += n
            if users[intent.tenant] <= 0:
                del users[intent.tenant]

    def jobs(self, p: Principal) -> list[dict[str, Any]]:
        with self._jobs_lock:
            mine = sorted((i for i in self.intents.values() if p.owns(i.tenant)),
                          key=lambda i: i.task_id)
        return [self._job_dict(i) for i in mine]

    def job(self, p: Principal, task_id: str) -> dict[str, Any]:
        return self._job_dict(self._owned(p, task_id))

    def _job_dict(self, intent: Intent) -> dict[str, Any]:
        d = intent_to_dict(intent)
        tid = intent.task_id
        sets = self.dp.by_task.get(tid, {})  # (installed: what its senders are held to)
        planned = self._changed_at.get(tid, 0) <= self._planned_upto
        # its verdict once a plan has checked this intent (not before it, nor ever for a
        # job that did not opt in: ``null``); each published whole by the controller:
        # read once, one plan's
        checked = planned and intent.opt_in
        problem = (self.controller.sla_unmet.get(tid) or self.controller.partitioned.get(tid)
                   if checked else None)
        d.update(
            sla_level=intent.strictest_level,
            sla_met=problem is None if checked else None,
            sla_problem=problem,
            rate_capped=any(math.isfinite(ps.rate_cap_gbps) for ps in sets.values()),
            path_sets=len(sets),
            room_kept=self.controller.room_kept(tid) if checked else 0,
            planned=planned,
            busbw_GBps=self.busbw_GBps.get(tid),
            last_collective_us=self.collective_us.get(tid),
        )
        return d

    def wait_planned(self, epoch: int | None = None, timeout_s: float = 10.0) -> bool:
        """Block until the installed plan includes change ``epoch`` (default: every change
        declared so far); plans here if no control loop runs."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            target = self._epoch if epoch is None else epoch
        if self._loop_thread is None or not self._loop_thread.is_alive():
            if self._planned_upto < target:
                self.plan_pending("request")
            return True
        with self._changed:
            while self._planned_upto < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._changed.wait(left)
        return True

    # ------------------------------------------------------------ calls
    def announce(self, p: Principal, task_id: str, body: AnnounceIn) -> dict[str, Any]:
        """A run-time call: added to the job's intent (replacing a call of the same pattern
        over the same ranks), planned, and answered with its paths."""
        with self._changed:
            intent = self._owned_locked(p, task_id)
            outside = sorted(set(body.ranks) - set(intent.gpus))
            if outside:
                raise ServiceError(422, f"ranks: GPU {outside[0]} is not one of the GPUs "
                                   f"of job {task_id!r}")
            pairs = tuple(pattern_transfers(body.pattern, tuple(body.ranks),
                                            self.controller.host_of, body.algorithm))
            # one call per (pattern, ranks, bucket): a bucket announced again replaces its
            # previous size; other buckets over the same ranks are calls of their own
            slot = (body.pattern, pairs, body.bucket)
            announced = self._announced.setdefault(task_id, {})
            previous = announced.get(slot)
            replaced = previous if previous is not None and previous in intent.calls else None
            if replaced is None:
                # a call declared without pairs over the whole job, of this pattern, not
                # announced: what the job said before its library told its calls (a
                # framework's placeholder), replaced by the first announced, over the whole
                # job or a group of its GPUs (DDP over a process group announces its
                # groups' calls, never one over the whole job)
                taken = set(announced.values())
                replaced = next((c for c in intent.calls if c.pattern == body.pattern
                                 and not c.pairs and c.algorithm == body.algorithm
                                 and c not in taken), None)
            # an announce that gives no SLA keeps the job's word for the call: the SLA and
            # priority of the call it replaces, else of the job's calls of its pattern (the
            # buckets announced before it, which kept them), else the default, priority 0
            like = replaced or next((c for c in intent.calls if c.pattern == body.pattern),
                                    None)
            sla = body.sla_us or (like.sla_us if like is not None else DEFAULT_ANNOUNCE_SLA_US)
            call = CommCall(body.pattern, body.size_bytes, sla, body.period_ns,
                            like.priority if like is not None else 0, pairs, body.algorithm)
            same = previous == call and call in intent.calls
            if (not same and replaced is None
                    and len(intent.calls) >= MAX_CALLS_PER_JOB):
                raise ServiceError(409, f"job {task_id!r} has {len(intent.calls)} calls, the "
                                   f"most a job may have: announce to one of its buckets, or "
                                   f"PUT the job with fewer")
            if not same:
                calls = list(intent.calls)
                if replaced is not None:
                    calls.remove(replaced)
                announced[slot] = call
                new = Intent(intent.task_id, intent.tenant, intent.gpus,
                             (*calls, call), intent.opt_in)
                self.store.put_job(task_id, intent.tenant, intent_to_dict(new))
                self._queue(task_id, new)
            epoch = self._changed_at.get(task_id, 0)
            self.counters.announces += 1
            self.store.add_call(time.time(), task_id,
                                {"pattern": body.pattern, "size_bytes": body.size_bytes,
                                 "ranks": body.ranks, "sla_us": sla, "bucket": body.bucket,
                                 "period_ns": body.period_ns, "priority": call.priority,
                                 **({"algorithm": body.algorithm} if body.algorithm else {})})
        planned = self.wait_planned(epoch)
        keys = list(dict.fromkeys(rule_key(task_id, a, b) for a, b in pairs))
        table = self.dp.installed
        got = {k: table[k] for k in keys if k in table}
        # (no verdict yet if the plan did not come in time, none ever for an opted-out job)
        checked = planned and intent.opt_in
        problem = self.controller.sla_unmet.get(task_id) if checked else None
        if problem:
            self.counters.sla_refused += 1
        return {"task_id": task_id, "pattern": body.pattern, "size_bytes": body.size_bytes,
                "sla_us": sla, "sla_level": sla_level(sla),
                "sla_met": problem is None if checked else None, "planned": planned,
                "sla_problem": problem, "changed_intent": not same,
                "pairs": [self._pair_dict(k, got.get(k)) for k in keys]}

    def announce_json(self, p: Principal, task_id: str, body: AnnounceIn) -> bytes:
        """:meth:`announce`'s answer as the API's JSON body (see :meth:`paths_json`)."""
        out = self.announce(p, task_id, body)
        return pairs_json(out, out.pop("pairs"))

    def calls(self, p: Principal, task_id: str, limit: int) -> list[dict[str, Any]]:
        self._owned(p, task_id)
        return self.store.calls(task_id, limit)

    # ------------------------------------------------------------ paths
    def _pair_dict(self, key: str, ps: PathSet | None) -> dict[str, Any]:
        _, pair = key.split(":", 1)
        src, dst = (int(x) for x in pair.split("->"))
        if ps is None:
            return {"key": key, "src": src, "dst": dst, "planned": False, "paths": []}
        links = self.view.links
        total = sum(ps.weights) or 1.0
        out = []
        for i, (path, w) in enumerate(zip(ps.paths, ps.weights, strict=True)):
            nodes = [links[path[0]].src, *(links[lk].dst for lk in path)] if path else []
            out.append({"links": list(path), "nodes": nodes, "share": w / total,
                        "source_port": ps.ports[i] if i < len(ps.ports) else None,
                        "pinned_rules": [list(r) for r in ps.rules[i]]
                        if i < len(ps.rules) else []})
        cap = ps.rate_cap_gbps  # (the senders' limit: none unless an L3 job is held to it)
        return {"key": key, "src": src, "dst": dst, "planned": True, "paths": out,
                "rate_cap_gbps": cap if math.isfinite(cap) else None}

    def paths(self, p: Principal, task_id: str, src: int | None = None,
              dst: int | None = None) -> dict[str, Any]:
        """A job's installed path sets, one per GPU pair in (source, destination) order
        (``src`` / ``dst``: those pairs only)."""
        epoch, pairs = self._job_pairs(p, task_id, src, dst)
        return {"task_id": task_id, "plan_epoch": epoch, "pairs": list(pairs)}

    def paths_json(self, p: Principal, task_id: str, src: int | None = None,
                   dst: int | None = None) -> bytes:
        """:meth:`paths` as the API's JSON body, encoded here, pair by pair: a job of a
        million pairs answers in tens of MB, which the API's generic encoder took tens of
        seconds over while every other request waited (and one ``json.dumps`` of it all
        would hold the interpreter for seconds)."""
        epoch, pairs = self._job_pairs(p, task_id, src, dst)
        return pairs_json({"task_id": task_id, "plan_epoch": epoch}, pairs)

    def _job_pairs(self, p: Principal, task_id: str, src: int | None, dst: int | None
                   ) -> tuple[int, Iterator[dict[str, Any]]]:
        """The plan epoch and (lazily) the pair records of :meth:`paths`; a ``src`` or
        ``dst`` not one of the job's GPUs is a 422 naming it."""
        intent = self._owned(p, task_id)
        for name, g in (("src", src), ("dst", dst)):
            if g is not None and g not in intent.gpus:
                raise ServiceError(422, f"{name}: GPU {g} is not one of {task_id}'s GPUs")
        mine = dict(self.dp.by_task.get(task_id, {}))  # (a copy: read off the lock)
        pairs = sorted((self._ends(k), k) for k in mine)
        if src is not None or dst is not None:
            pairs = [(e, k) for e, k in pairs
                     if (src is None or e[0] == src) and (dst is None or e[1] == dst)]
        return self._plan_epoch, (self._pair_dict(k, mine[k]) for _, k in pairs)

    @staticmethod
    def _ends(key: str) -> tuple[int, int]:
        a, b = key.split(":", 1)[1].split("->")
        return int(a), int(b)


    # ------------------------------------------------------------ telemetry
    def ingest(self, deltas: list[PortDeltaIn], switch: str | None = None) -> int:
        """Fold port deltas into the next control period (422 naming the first delta that
        names no link, a link that does not leave ``switch`` (the node the batch says it
        is from, if it says), or counts more than its port can: pause longer than the
        interval, more bytes or bits than twice the line rate carries in it, more
        ECN-marked packets than twice as many minimum-size frames, more drops than twice
        the minimum-size frames all the node's inbound links carry in it, a queue above
        :data:`MAX_QUEUE_BYTES`, more corrected bit errors than bits received or more
        uncorrectable frames than 64-byte frames in them)."""
        links = self.view.links
        n = len(links)
        if switch is not None and switch not in self.view.graph:
            raise ServiceError(422, f"switch: no node {switch!r} in the fabric")
        for i, d in enumerate(deltas):
            if d.link_id >= n:
                raise ServiceError(422, f"deltas.{i}.link_id: link {d.link_id} does not exist "
                                   f"(the fabric has links 0-{n - 1})")
            if switch is not None and links[d.link_id].src != switch:
                raise ServiceError(422, f"deltas.{i}.link_id: link {d.link_id} leaves "
                                   f"{links[d.link_id].src}, not {switch!r} (the batch's switch)")
            if d.queue_bytes > MAX_QUEUE_BYTES:
                raise ServiceError(422, f"deltas.{i}.queue_bytes: {d.queue_bytes:g} bytes is "
                                   f"more than any switch buffers (at most {MAX_QUEUE_BYTES:g})")
            inbound = self._inbound_gbps(links[d.link_id].src)
            if d.drops * _MIN_FRAME_BITS > 2 * inbound * d.interval_ns:
                raise ServiceError(
                    422, f"deltas.{i}.drops: {d.drops:g} packets dropped in {d.interval_ns} ns "
                    f"is more than twice the smallest frames the {inbound:g} Gb/s into "
                    f"{links[d.link_id].src} bring")
            if d.pause_ns > d.interval_ns:
                raise ServiceError(422, f"deltas.{i}.pause_ns: {d.pause_ns:g} ns paused in an "
                                   f"interval of {d.interval_ns} ns")
            # (twice the line rate: room for counters read a little off their interval)
            most_bits = 2 * links[d.link_id].capacity_gbps * d.interval_ns
            if 8 * d.tx_bytes > most_bits or d.rx_bits > most_bits:
                field, bits = (("tx_bytes", 8 * d.tx_bytes) if 8 * d.tx_bytes > most_bits
                               else ("rx_bits", d.rx_bits))
                raise ServiceError(
                    422, f"deltas.{i}.{field}: {bits:g} bits in {d.interval_ns} ns is more "
                    f"than twice link {d.link_id}'s {links[d.link_id].capacity_gbps:g} Gb/s")
            if d.ecn_marks * _MIN_WIRE_FRAME_BITS > most_bits:
                raise ServiceError(
                    422, f"deltas.{i}.ecn_marks: {d.ecn_marks:g} marked packets in "
                    f"{d.interval_ns} ns is more than twice link {d.link_id}'s "
                    f"{links[d.link_id].capacity_gbps:g} Gb/s sends of its smallest frames")
            if d.fec_corrected > d.rx_bits:
                raise ServiceError(
                    422, f"deltas.{i}.fec_corrected: {d.fec_corrected:g} bit errors corrected "
                    f"in {d.rx_bits:g} bits received")
            if d.fec_uncorrected * _MIN_FRAME_BITS > d.rx_bits:
                raise ServiceError(
                    422, f"deltas.{i}.fec_uncorrected: {d.fec_uncorrected:g} frames lost in "
                    f"{d.rx_bits:g} bits received (a frame is at least 64 bytes)")
        # a PortDeltaIn has every field of a PortDelta under the same name, and the
        # controller only reads those: handed over as they are (no copy per delta)
        self.dp.post(cast("list[PortDelta]", deltas))
        # (read without the controller's lock: a hint, the control period decides)
        if self.controller.reports_port_change(cast("list[PortDelta]", deltas)):
            # a port went down or came back: its control period (the heal) runs now, not at
            # the next interval, and a whole plan being weighed gives way to it
            with self._changed:
                self._tick_soon = True
                if self._weighing:
                    self.controller.interrupt.set()
                self._changed.notify_all()
        return len(deltas)

    def ingest_rows(self, rows: list[tuple[Any, ...]], switch: str | None = None) -> int:
        """:meth:`ingest` of deltas given as rows of values in :class:`PortDelta` field
        order (as the API's process sends them to a control process)."""
        return self.ingest(cast("list[PortDeltaIn]", [PortDelta(*r) for r in rows]), switch)

    def _inbound_gbps(self, node: str) -> float:
        """The capacity of every link into ``node`` (what its ports can drop at most)."""
        got = self._inbound.get(node)
        if got is None:
            got = self._inbound[node] = float(sum(
                c for _, _, c in self.view.graph.in_edges(node, data="capacity_gbps")))
        return got

    def tick_now(self) -> dict[str, Any]:
        """Run one control period now (operators; tests): whether it installed a new plan,
        the plan epoch, and the links its telemetry showed down, back up, gray, or clean
        again (restored)."""
        with self.lock:
            rep = self._tick()
            return {"replanned": rep.replanned, "plan_epoch": self._plan_epoch,
                    "links_down": rep.links_down, "links_up": rep.links_up,
                    "links_gray": rep.links_gray, "links_clear": rep.links_clear}

    # ------------------------------------------------------------ faults
    def _link_of(self, f: FaultIn) -> int:
        if f.link_id is not None:
            if f.link_id >= len(self.view.links):
                raise ServiceError(422, f"link_id: link {f.link_id} does not exist")
            return f.link_id
        assert f.endpoints is not None
        a, b = f.endpoints
        try:
            return self.view.link_between(a, b)
        except (KeyError, ValueError):
            raise ServiceError(422, f"endpoints: no link from {a!r} to {b!r}") from None

    @contextlib.contextmanager
    def _urgently(self) -> Iterator[None]:
        """Hold ``lock``, taken ahead of a whole plan: while this waits for it, the
        controller's :attr:`~fabricpilot.controller.core.Controller.interrupt` is set, so a
        plan being computed gives way at its next check."""
        ctl = self.controller
        with self._urgent_lock:
            self._urgent += 1
            ctl.interrupt.set()
        try:
            self.lock.acquire()
        finally:
            with self._urgent_lock:
                self._urgent -= 1
                if not self._urgent:
                    ctl.interrupt.clear()
        try:
            yield
        finally:
            self.lock.release()

    def inject_twin_faults(self, p: Principal, body: TwinFaultsIn) -> dict[str, Any]:
        """A fault drill (operators): the twin plays ``body.events`` from now (into its next
        runs for what is left of them). The controller is not told: it learns of them from
        the twin's telemetry at its next control periods, as it would from switches. 501
        without a twin (real switches take no drills), 422 for a bad event (one line naming
        its field)."""
        inject = (self.runner.inject if self.runner is not None
                  else getattr(self.remote, "inject_faults", None))
        if inject is None:
            raise ServiceError(501, "the data plane takes no fault drills: only the twin does "
                               "(serve with the twin)")
        try:
            faults = inject(body.events)
        except ValueError as err:
            raise ServiceError(422, str(err)) from None
        except SouthboundError as err:
            raise ServiceError(503, f"the twin: {err}") from None
        log.info("fault drill", extra={"fields": {"by": p.name, "faults": len(faults)}})
        self._event({"at_s": time.time(), "kind": "drill",
                     "why": "fault drill in the twin: " + "; ".join(f["label"] for f in faults),
                     "path_sets": 0, "keys": []})
        return {"faults": faults}

    def report_fault(self, p: Principal, f: FaultIn) -> dict[str, Any]:
        lk = self._link_of(f)
        with self._urgently():
            fid = self.store.add_fault(time.time(), f.kind, lk, f.detail, p.name)
            self.counters.faults += 1
            before = self.dp.installed  # published copy-on-write: a snapshot
            if f.kind == "gray":
                rep = self.controller.on_links_degraded([lk])
            elif f.kind == "down":
                rep = self.controller.on_links_changed([lk], [], self.now_ns())
            else:
                self.controller.degraded.discard(lk)
                rep = self.controller.on_links_changed([], [lk], self.now_ns())
            self._observe_heals([rep])
            self.counters.heals += 1
            li = self.view.links[lk]
            # (the operator's note apart, in "detail": a tenant reads events without it)
            moved = moved_sets(before, self.dp.installed)
            self._event({"at_s": time.time(), "kind": f"fault-{f.kind}",
                         "why": f"{li.src} -> {li.dst} (reported by an operator)",
                         "by": p.name, "detail": f.detail,
                         **event_moves(new.key for _, new in moved), "keys": []})
            self._note_reroutes(before, "heal", f"link {lk} {f.kind} (new paths sent after "
                                                f"{rep.sent_s * 1e3:.2f} ms)", moved)
            return {"id": fid, "kind": f.kind, "link_id": lk, "affected_path_sets": rep.affected,
                    "installed_path_sets": rep.installed, "replan_ms": rep.wall_s * 1e3,
                    "sent_ms": rep.sent_s * 1e3,
                    "partitioned": dict(self.controller.partitioned)}

    def faults(self, p: Principal, limit: int) -> list[dict[str, Any]]:
        """The fault log, oldest first: what went down, up or gray, when, and who reported
        it; a tenant reads it without the operators' notes (``detail``: ``None``) and
        names (an operator's report says ``operator``, the switches' ``telemetry``)."""
        rows = self.store.faults(limit)
        if p.is_operator:
            return rows
        return [{**r, "detail": None,
                 "source": r["source"] if r["source"] == "telemetry" else "operator"}
                for r in rows]

    def events_list(self, p: Principal) -> list[dict[str, Any]]:
        """Recent reroutes, heals and faults, oldest first (a copy). A tenant sees the
        fabric's events but, of the path sets an event moved, those of its own jobs only
        (``keys``, ``by_task`` and the count ``path_sets``), and no operator's note on a
        fault or name (``detail``, ``by``: ``None``)."""
        events = list(self.events)
        if p.is_operator:
            return events
        with self._jobs_lock:
            mine = {t for t, i in self.intents.items() if p.owns(i.tenant)}
        out = []
        for e in events:
            if "keys" in e:
                e = {**e, "keys": [k for k in e["keys"] if task_of_key(k) in mine]}
            if "by_task" in e:
                own = {t: n for t, n in e["by_task"].items() if t in mine}
                e = {**e, "by_task": own, "path_sets": sum(own.values())}
            if e.get("detail") is not None or e.get("by") is not None:
                e = {**e, "detail": None, **({"by": None} if "by" in e else {})}
            out.append(e)
        return out

    def metrics_text(self, jobs: bool = True) -> str:
        """The service's Prometheus metrics, in the text exposition format (with the
        per-job series, :class:`~fabricpilot.service.metrics.JobCollector`, if ``jobs``)."""
        text = generate_latest(self.registry).decode()
        return text + generate_latest(self.job_registry).decode() if jobs else text

    # ------------------------------------------------------------ fabric
    def topology(self) -> dict[str, Any]:
        v = self.view
        nodes = [{"id": n, "kind": d.get("kind", "switch"), "tier": d.get("tier", 0)}
                 for n, d in v.graph.nodes(data=True)]
        links = [{"id": li.link_id, "src": li.src, "dst": li.dst, "kind": li.kind,
                  "capacity_gbps": li.capacity_gbps} for li in v.links.values()]
        return {"nodes": nodes, "links": links, "gpus": len(v.gpu_node),
                "gpu_node": {str(g): n for g, n in sorted(v.gpu_node.items())}}

    def congestion(self, kinds: set[str] | None = None) -> list[dict[str, Any]]:
        """The congestion map, one entry per link (of ``kinds`` only, if given)."""
        with self.lock:
            ctl = self.controller
            out = []
            for li in self.view.links.values():
                if kinds is not None and li.kind not in kinds:
                    continue
                st = asdict(ctl.map.state(li.link_id))
                st.update(link_id=li.link_id, src=li.src, dst=li.dst, kind=li.kind,
                          weight=self.dp.congestion.get(li.link_id, 1.0),
                          down=li.link_id in ctl.down, gray=li.link_id in ctl.degraded,
                          hot=ctl.map.is_hot(li.link_id))
                out.append(st)
            return out

    def link_usage(self, link_id: int) -> dict[str, Any]:
        """One link: what it is, its state in the congestion map, and who the installed plan
        puts on it (per job: tenant, GPU pairs, planned Gb/s), heaviest first."""
        li = self.view.links.get(link_id)
        if li is None:
            raise ServiceError(404, f"link {link_id} not found")
        with self.lock:
            ctl = self.controller
            users = ctl.link_users(link_id)
            st = asdict(ctl.map.state(link_id))
            jobs = [{"task_id": t, "tenant": ctl.intents[t].tenant if t in ctl.intents else None,
                     "pairs": n, "planned_gbps": round(gbps, 6)}
                    for t, (n, gbps) in users.items()]
            return {"link_id": link_id, "src": li.src, "dst": li.dst, "kind": li.kind,
                    "capacity_gbps": li.capacity_gbps, **st,
                    "weight": self.dp.congestion.get(link_id, 1.0),
                    "down": link_id in ctl.down, "gray": link_id in ctl.degraded,
                    "hot": ctl.map.is_hot(link_id),
                    "planned_gbps": round(sum(j["planned_gbps"] for j in jobs), 6),
                    "jobs": jobs}

    def _twin_status(self) -> dict[str, Any] | None:
        """The twin's state: the in-process runner's, or a remote twin's last report."""
        if self.runner is not None:
            return self.runner.status()
        st = self.remote_status
        if "fabric_time_ms" in st or st.get("running") is False:
            return {k: st.get(k) for k in TWIN_STATUS_KEYS}
        return None

    def health(self) -> dict[str, Any]:
        twin = self._twin_status()
        return {"status": "ok" if twin is None or twin["error"] is None else "degraded",
                "uptime_s": round(time.time() - self.started_s, 3),
                "jobs": len(self.intents),
                "plan_epoch": self._plan_epoch,
                "twin": twin,
                "restored": self.restored,
                "store": str(Path(self.store.path).name)}

