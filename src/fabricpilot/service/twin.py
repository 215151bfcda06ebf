"""The service's data plane: the digital twin running a scenario in scaled real time.

:class:`ServiceDataPlane` is what the service's controller drives (it implements
:class:`~fabricpilot.controller.southbound.DataPlane`). It wraps any inner data plane and adds
what a long-lived service needs: the table of path sets the switches hold (queried by the
API, persisted by the service), telemetry batches posted by switches through the API merged
with the inner data plane's own, and the last congestion table pushed.

The default inner data plane is :class:`PacedTwin`, the twin's ``task-aware`` policy, run by
:class:`TwinRunner` in a background thread: the scenario's jobs train in a loop, the engine
paced so that fabric time advances ``time_scale`` times as fast as wall time (``1e-3``: one
millisecond of fabric time per second). Between pacing points the runner holds the service
lock; it sleeps with the lock released, so API calls interleave with the simulation. The
scenario's faults play in every run: the fabric reacts on its own (detection, routing
convergence, losses), and the ports report their state and error counters in telemetry,
from which the service's controller learns of them, as it would from switches. More can be
played at any time (:meth:`TwinRunner.inject`: a drill), from the current run on.

``fabricpilot serve`` runs it in a process of its own
(:mod:`fabricpilot.service.twin_process`); ``serve --single-process`` and embedders run it
here, beside the controller.

Like switches, the twin keeps forwarding on the rules it was given when the controller goes
quiet (fail-static); flows without a rule take switch-local adaptive routing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fabricpilot.balancing.base import ActiveMembers, LinkTelemetry, Moves, PolicyContext
from fabricpilot.balancing.task_aware import TaskAware
from fabricpilot.controller.core import task_of_key
from fabricpilot.controller.southbound import DataPlane, FabricView, PathSet, PortDelta
from fabricpilot.dataplane import make_rate_model
from fabricpilot.dataplane.engine import Engine
from fabricpilot.errors import ScenarioError
from fabricpilot.faults import remaining_events, resolve_faults
from fabricpilot.faults.model import FaultParams, FaultTimeline
from fabricpilot.runner import Prepared, fault_setup, port_buffer_bytes
from fabricpilot.scenario.loader import fault_events
from fabricpilot.scenario.models import FaultEventSpec, FaultsSpec

__all__ = ["PacedTwin", "ServiceDataPlane", "TwinRunner", "twin_context"]


class ServiceDataPlane:
    """A :class:`DataPlane` that remembers what it was told (see the module docstring).

    ``on_install`` is called with every batch of path sets installed and ``on_remove`` with
    every batch of keys withdrawn (the service persists both, so that a restart restores
    what the switches hold, not what they once held)."""

    def __init__(self, inner: DataPlane,
                 on_install: Callable[[list[PathSet]], None] | None = None,
                 on_remove: Callable[[list[str]], None] | None = None) -> None:
        self.inner = inner
        self.view = inner.fabric()
        # published copy-on-write (replaced, never changed in place): readers need no lock
        self.installed: dict[str, PathSet] = {}
        self.by_task: dict[str, dict[str, PathSet]] = {}
        self.congestion: dict[int, float] = {}
        self.qos: dict[int, int] = {}
        self._on_install = on_install
        self._on_remove = on_remove
        self._posted: list[PortDelta] = []
        self._posted_lock = threading.Lock()
        self.posted_total = 0

    def fabric(self) -> FabricView:
        return self.view

    def post(self, deltas: list[PortDelta]) -> None:
        """Telemetry posted by switches: handed to the controller with the next
        :meth:`telemetry` call."""
        with self._posted_lock:
            self._posted.extend(deltas)
            self.posted_total += len(deltas)

    def telemetry(self) -> list[PortDelta]:
        own = self.inner.telemetry()
        with self._posted_lock:
            posted, self._posted = self._posted, []
        return own + posted

    def install(self, rules: list[PathSet]) -> None:
        self.inner.install(rules)
        self._publish(rules)
        if self._on_install is not None and rules:
            self._on_install(rules)

    def _publish(self, rules: list[PathSet]) -> None:
        if not rules:
            return
        installed = dict(self.installed)
        by_task = dict(self.by_task)
        touched: dict[str, dict[str, PathSet]] = {}
        for r in rules:
            installed[r.key] = r
            task = task_of_key(r.key)
            if task not in touched:
                touched[task] = by_task[task] = dict(by_task.get(task, {}))
            touched[task][r.key] = r
        self.installed, self.by_task = installed, by_task

    def remove(self, keys: list[str]) -> None:
        self.inner.remove(keys)
        if self._on_remove is not None and keys:
            self._on_remove(list(keys))
        gone = set(keys) & self.installed.keys()
        if not gone:
            return
        tasks = {task_of_key(k) for k in gone}
        self.installed = {k: v for k, v in self.installed.items() if k not in gone}
        self.by_task = {t: ({k: v for k, v in sets.items() if k not in gone}
                            if t in tasks else sets) for t, sets in self.by_task.items()}

    def adopt(self, rules: list[PathSet]) -> None:
        """Take these path sets as installed without sending them (the data plane reported
        holding them)."""
        self._publish(rules)

    def restore(self, rules: list[PathSet]) -> None:
        """Put back the path sets the switches held before a restart (re-sync)."""
        self.inner.install(rules)
        self._publish(rules)

    def forget_task(self, task_id: str) -> None:
        """Stop reporting a withdrawn job's path sets."""
        gone = self.by_task.get(task_id, {})
        if gone:
            self.installed = {k: v for k, v in self.installed.items() if k not in gone}
            self.by_task = {t: v for t, v in self.by_task.items() if t != task_id}

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        self.inner.push_congestion_table(weights)
        self.congestion.update(weights)

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        self.inner.set_qos(dscp_to_priority)
        self.qos = dict(dscp_to_priority)


def twin_context(prep: Prepared) -> PolicyContext:
    """The policy context of the service's twin. Its control periods are the service's
    (the service ticks the controller on the wall clock), so the policy never ticks. The
    twin plays faults (the scenario's, in every run, and drills) and its ports report their
    state and error counters as the scenario's faults section says (its defaults if it has
    none)."""
    _, controller, fec = fault_setup(prep)
    return PolicyContext(prep.topology, prep.seed, prep.fabric.switch_latency_ns, prep.ecmp,
                         adaptive=prep.adaptive,
                         controller=replace(controller, replan_interval_ns=math.inf),
                         port_buffer_bytes=port_buffer_bytes(prep),
                         member_routes=True, faults=True, **fec)


# what TwinRunner.status reports
TWIN_STATUS_KEYS = ("running", "runs", "error", "fabric_time_ms", "time_scale", "behind_ms",
                    "ports_down")
# a twin behind its schedule lets go of the service's lock this often, this long
YIELD_EVERY_S = 0.02
YIELD_FOR_S = 0.001
# a fault drill asked for between two runs of the scenario waits this long (wall time) for
# the next run to start (building a run takes milliseconds; a scenario without jobs waits a
# second between runs)
DRILL_WAIT_S = 2.0


class PacedTwin(TaskAware):
    """The twin's ``task-aware`` data plane with a clock that runs on across runs of the
    scenario (``offset_ns``) and a pacing hook called at every adaptive round."""

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.offset_ns = 0.0
        self.pace: Callable[[float], None] | None = None
        self.last_tel: LinkTelemetry | None = None
        self._went_down: set[int] = set()  # ports gone down since the last report
        # the next report gives every port's state, as a telemetry subscription's first
        # report does: a controller that restarted knowing links down that are up again
        # (this twin started afresh) learns so, as no port would say it changed
        self._sync_ports = True
        # the transmit counters at the end of the runs before: a port's counter runs on
        # across runs of the scenario, as a switch's does while the jobs start again
        self._tx_base: NDArray[np.float64] | None = None

    def sync_ports(self) -> None:
        """Give every port's state (up or down) in the next report, not only changes (a
        controller connecting asks so)."""
        self._sync_ports = True

    def bind(self, telemetry: Callable[[], LinkTelemetry]) -> None:
        """Read a new run's fabric, on the clock of the runs before (``offset_ns``) and
        with its transmit counters added to theirs (:meth:`end_run`), so that the next
        report carries the bytes the last run sent after its last report."""
        offset, base, counted = self.offset_ns, self._tx_base, self._tx_counted

        def shifted() -> LinkTelemetry:
            tel = telemetry()
            total = tel.tx_bytes_total
            if base is not None and total is not None:
                total = total + base
            tel = replace(tel, now_ns=tel.now_ns + offset, tx_bytes_total=total)
            self.last_tel = tel
            return tel

        super().bind(shifted)
        if base is not None:  # (the counters go on: so does their count)
            self._tx_counted = counted

    def end_run(self) -> None:
        """A run has ended: its counters as they stand are where the next run's start."""
        if self._telemetry is not None:
            self._tx_base = self._telemetry().tx_bytes_total

    def rebalance(self, members: ActiveMembers) -> Moves:
        moves = super().rebalance(members)
        if self.pace is not None and self._telemetry is not None:
            self.pace(self._telemetry().now_ns)
        return moves

    def now_ns(self) -> float:
        return self.last_tel.now_ns if self.last_tel is not None else self.offset_ns

    def on_links_changed(self, now: float, down: list[int], up: list[int]) -> float | None:
        """Links seen going down or back by their neighbours: the ports say so in the next
        telemetry, as switches do, and the service's controller learns it there (at its
        next control period); meanwhile the fabric converges on its own (``None``)."""
        self.note_links(down, up)
        self._went_down.update(down)
        return None

    def telemetry(self) -> list[PortDelta]:
        """:meth:`TaskAware.telemetry`, where a port that went down since the last report
        says so even if it is back already, and that it is back in the next report, as a
        switch reports a link-down event however short: the service's controller learns of
        links from telemetry alone, and a flap or a short drill (or a twin catching up on
        its schedule) must not slip between two reads. The first report (and the first
        after :meth:`sync_ports`) gives every port's state."""
        went, self._went_down = self._went_down, set()
        flapped = went - self.ports_down
        if flapped:
            self.ports_down |= flapped
            self._ports_back -= flapped
        try:
            out = super().telemetry()
        finally:
            if flapped:
                self.ports_down -= flapped
                self._ports_back |= flapped
        if not out:  # (nothing reported: no time went by, or no fabric yet)
            self._went_down |= went
            return out
        if self._sync_ports:
            self._sync_ports = False
            said = {d.link_id for d in out if d.oper_up is not None}
            interval = out[0].interval_ns
            by_link = {d.link_id: d for d in out}
            for i in range(self.ctx.topology.n_links):
                if i not in said:
                    d = by_link.get(i)
                    by_link[i] = (PortDelta(i, interval, oper_up=True) if d is None
                                  else replace(d, oper_up=True))
            out = [by_link[i] for i in sorted(by_link)]
        return out

    def new_run(self) -> None:
        """A run of the scenario starts on a fresh fabric: every link is up again (the
        ports down say so in the next telemetry)."""
        self.note_links([], sorted(self.ports_down))


class TwinRunner:
    """Runs the scenario's jobs on :class:`PacedTwin` in a loop, in scaled real time.

    ``lock`` is the service's lock: the runner holds it while the engine computes and
    releases it while it waits for the wall clock. ``on_collective`` is called (lock held)
    with each collective the twin completes."""

    def __init__(self, prep: Prepared, twin: PacedTwin, lock: threading.RLock, *,
                 time_scale: float,
                 on_collective: Callable[[str, float, float], None] | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.prep = prep
        self.twin = twin
        self.lock = lock
        self.time_scale = time_scale
        self.on_collective = on_collective
        self.runs = 0
        self.collectives = 0  # completed since the start
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._engine: Engine | None = None
        self._running = False  # an engine run is going (faults may be injected into it)
        self._seen = 0
        self._t0_wall = 0.0
        self._t0_sim = 0.0
        self._yielded = 0.0  # when the lock was last let go of (time.monotonic)
        # the drills played, each with when (twin time, ns) its times count from
        self._drills: list[tuple[float, list[FaultEventSpec]]] = []
        twin.pace = self._pace

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fabricpilot-twin", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        """The runner's state for ``/health``: running, runs done, the error that stopped
        it, the twin's time (ms), ``time_scale``, how far behind schedule it is (fabric
        ms) and how many ports its switches see down."""
        values = (self.alive, self.runs, self.error, round(self.twin.now_ns() * 1e-6, 3),
                  self.time_scale, round(self.behind_ms, 3), len(self.twin.ports_down))
        return dict(zip(TWIN_STATUS_KEYS, values, strict=True))

    @property
    def run_start_ns(self) -> float:
        """The twin's time (ns, running on across runs) at which the current run started."""
        return self._t0_sim

    @property
    def plays_faults(self) -> bool:
        """Whether the twin's runs play faults (the scenario's and drills): the flow-level
        model's do, the fluid model's do not."""
        return self.prep.rate_model == "flow"

    @property
    def behind_ms(self) -> float:
        """How far (fabric milliseconds) the twin is behind its schedule in the current run:
        0 while it keeps pace with ``time_scale``, growing when the machine cannot give it
        the CPU it needs."""
        if not self.alive or self._engine is None:
            return 0.0
        due_ns = self._t0_sim + (time.monotonic() - self._t0_wall) * self.time_scale * 1e9
        return max(0.0, (due_ns - self.twin.now_ns()) * 1e-6)

    def inject(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Play fault ``events`` (a scenario's ``faults.events``, their times counted from
        now) in the twin, as the scenario's own faults play: a drill. It goes on in the next
        runs of the scenario (which start with every link up) for what is left of it
        (:func:`~fabricpilot.faults.remaining_events`): an event with an end lasts until
        then, one not started yet starts when due, and an open-ended one lasts to the end
        of the run it started in. Returns each fault's id (in the run) and label. Between
        two runs it waits up to :data:`DRILL_WAIT_S` for the next one to start.
        ``ValueError``, one line naming the event's field, for a bad event, when no run
        is going by then, and in a twin of the fluid model (which plays no faults)."""
        if not self.plays_faults:
            raise ValueError("fault drill: the twin runs the fluid model, which plays no "
                             "faults (they are modelled by the flow-level model: "
                             "fabric.model: flow)")
        try:
            spec = fault_events(events, "fault drill")
            drill = resolve_faults(spec, self.prep.topology, self.prep.seed,
                                   source="fault drill")
        except ScenarioError as err:
            raise ValueError(str(err)) from None
        deadline = time.monotonic() + DRILL_WAIT_S
        while True:
            with self.lock:
                eng = self._engine
                if eng is not None and self._running:
                    ids = eng.inject_faults(drill)
                    self._drills.append((self.twin.offset_ns + eng.now, list(spec.events)))
                    return [{"id": i, "label": info.label, "at_ms": round(eng.now * 1e-6, 6)}
                            for i, info in zip(ids, drill.faults, strict=True)]
                if (self._stop.is_set() or not self.alive
                        or time.monotonic() >= deadline):
                    raise ValueError("the twin is between two runs of its scenario: try again")
            time.sleep(0.002)  # (the lock let go of: the next run may start)

    def _carried(self) -> FaultsSpec | None:
        """What is left of the drills at the start of a run (the twin's clock at
        ``offset_ns``), their times counted from then; the drills with nothing left are
        forgotten."""
        now = self.twin.offset_ns
        left: list[FaultEventSpec] = []
        kept = []
        for since, evs in self._drills:
            rest = remaining_events(evs, round(now - since))
            if rest:
                kept.append((since, evs))
                left.extend(rest)
        self._drills = kept
        return FaultsSpec(events=left) if left else None

    def _pace(self, now_ns: float) -> None:
        """Called with the lock held: report finished collectives, then wait (lock
        released) until the wall clock catches up with fabric time."""
        self._report()
        if self._stop.is_set():
            raise _Stopped
        due = self._t0_wall + (now_ns - self._t0_sim) * 1e-9 / self.time_scale
        now = time.monotonic()
        wait = due - now
        # behind schedule, the lock is still let go of now and then: the API's calls wait
        # for it at most about YIELD_EVERY_S
        if wait <= 0 and now - self._yielded >= YIELD_EVERY_S:
            wait = YIELD_FOR_S
        if wait > 0:
            self.lock.release()
            try:
                self._stop.wait(wait)
            finally:
                self.lock.acquire()
            self._yielded = time.monotonic()
        if self._stop.is_set():
            raise _Stopped

    def _report(self) -> None:
        eng = self._engine
        if eng is None:
            return
        done = getattr(eng, "_collectives", [])
        for rec in done[self._seen:]:
            if self.on_collective is not None:
                self.on_collective(rec.job, rec.busbw_GBps, rec.time_ns * 1e-3)
            self.collectives += 1
        self._seen = len(done)

    def _loop(self) -> None:
        prep = self.prep
        # (a run of the flow-level model plays faults even if the scenario has none: a
        # drill may add some; the fluid model plays none)
        faults = (fault_setup(prep)[0] or FaultTimeline([], [], prep.faults.params
                                                        if prep.faults else FaultParams())
                  ) if self.plays_faults else None
        try:
            while not self._stop.is_set():
                with self.lock:
                    model = make_rate_model(prep.rate_model, prep.topology, prep.fabric,
                                            **prep.model_params)
                    self.twin.new_run()
                    # (what is left of the drills plays too, numbered after the scenario's)
                    carried = self._carried()
                    run_faults = faults if carried is None or faults is None else \
                        faults.merged(resolve_faults(carried, prep.topology, prep.seed,
                                                     source="fault drill"))
                    self._engine = Engine(prep.topology, self.twin, prep.jobs,
                                          fabric=prep.fabric, mice=prep.mice, rate_model=model,
                                          batch_rel_eps=prep.completion_tolerance,
                                          mice_class=prep.mice_class, faults=run_faults)
                    self._seen = 0
                    self._t0_wall = time.monotonic()
                    self._t0_sim = self.twin.offset_ns
                    self._running = True
                    try:
                        out = self._engine.run()
                    finally:
                        self._running = False
                    self._report()
                    self.twin.end_run()
                    self.twin.offset_ns += float(out.sim_time_ns)
                    self.runs += 1
                if not prep.jobs or all(j.iterations == 0 for j in prep.jobs):
                    self._stop.wait(1.0)
        except _Stopped:
            pass
        except Exception as err:  # the twin died: the controller keeps serving
            self.error = f"{type(err).__name__}: {err}"


class _Stopped(Exception):
    """Raised inside the engine to end a run when the service stops."""


