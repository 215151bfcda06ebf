"""The twin in a process of its own, driven by the controller over a socket pair.

``fabricpilot serve`` runs its default data plane, the twin, apart from the controller:
:class:`TwinProcess` (the controller's side, an
:class:`~fabricpilot.controller.southbound.ExternalDataPlane`) starts ``python -m
fabricpilot.service.twin_process`` and calls it with length-prefixed pickles
(:mod:`fabricpilot.service.framing`): ``(operation, args)`` in, ``(ok, value)`` out, one at
a time. The child (:func:`host_twin`) is what ``fabricpilot twin`` serves over HTTP: the
scenario's jobs training in scaled real time on the rules they are given.

Why a process: the twin stands in for switches, which do not share the controller's cores.
In the controller's process its engine would hold the interpreter lock for most of a core
and make every API call wait its turn. Apart, it runs at a lower CPU priority (``nice``
10): on a machine short of CPU it falls behind its time scale (``behind_ms`` in its status)
instead of slowing the API.

The twin process lives as long as its controller: it exits when the socket closes (the
control process stopped, or died), so it is never orphaned. If it dies first,
:meth:`TwinProcess.restart` starts it again (the service's control loop does, then sends it
the controller's rules).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from fabricpilot.balancing.task_aware import job_intents
from fabricpilot.controller.southbound import FabricView, PathSet, PortDelta
from fabricpilot.errors import FabricpilotError
from fabricpilot.runner import Prepared
from fabricpilot.scenario.models import Scenario
from fabricpilot.service.framing import recv, send
from fabricpilot.service.southbound_http import (
    RuleTable,
    SouthboundError,
    view_from_dict,
    view_to_dict,
)
from fabricpilot.service.state import TWIN_TENANT, intent_to_dict
from fabricpilot.service.twin import PacedTwin, TwinRunner, twin_context

__all__ = ["TwinHost", "TwinProcess", "host_twin"]

log = logging.getLogger("fabricpilot.service")

_DELTA_ROW = operator.attrgetter(*(f.name for f in fields(PortDelta)))


@dataclass
class TwinHost:
    """The twin as a data plane of its own: the runner training the scenario's jobs, the
    table of rules it holds, and the intents of its jobs (tenant ``twin``)."""

    runner: TwinRunner
    table: RuleTable
    intents: list[dict[str, Any]]
    busbw_GBps: dict[str, float] = field(default_factory=dict)
    collective_us: dict[str, float] = field(default_factory=dict)  # (each job's last one)

    @property
    def twin(self) -> PacedTwin:
        return self.runner.twin

    def health(self) -> dict[str, Any]:
        return {**self.runner.status(), "collectives": self.runner.collectives,
                "busbw_GBps": dict(self.busbw_GBps),
                "collective_us": dict(self.collective_us)}


def host_twin(prep: Prepared, time_scale: float) -> TwinHost:
    """The twin of ``prep`` as a data plane of its own (not started: ``runner.start()``).
    With no rules (or no controller) its flows take switch-local adaptive routing."""
    twin = PacedTwin(twin_context(prep))
    twin.job_names = [j.name for j in prep.jobs]
    lock = threading.RLock()
    intents = [intent_to_dict(i) for i in job_intents(prep.jobs, TWIN_TENANT)]
    busbw: dict[str, float] = {}
    collective_us: dict[str, float] = {}

    def on_collective(job: str, busbw_GBps: float, time_us: float) -> None:
        busbw[job] = busbw_GBps
        collective_us[job] = time_us

    runner = TwinRunner(prep, twin, lock, time_scale=time_scale, on_collective=on_collective)
    return TwinHost(runner, RuleTable(twin, lock), intents, busbw, collective_us)


# ---------------------------------------------------------------- the controller's side
class TwinProcess:
    """The twin in a child process (module docstring).

    The constructor starts the child and returns at once (the controller prepares its own
    side meanwhile); :meth:`wait_ready` waits until the twin runs. Telemetry that cannot be
    read counts as none; an install that fails raises :class:`SouthboundError` (a rule table
    that would overflow: ``ValueError``, as from the in-process twin); once the child is
    gone, :meth:`status` says so."""

    def __init__(self, scenario: Scenario, source: str, *, time_scale: float = 1e-3,
                 nice: int = 10, log_level: str = "WARNING") -> None:
        self._lock = threading.Lock()
        self.view: FabricView | None = None
        self._jobs: list[dict[str, Any]] = []
        self.telemetry_failures = 0
        self.restarts = 0
        self._setup = (scenario, source, time_scale, nice, log_level)
        self._spawn()

    def _spawn(self) -> None:
        """Start the child and tell it what to run (it answers :meth:`wait_ready`)."""
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fabricpilot.service.twin_process",
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)
        self._sock = ours
        self._stream = ours.makefile("rb")
        self._gone: str | None = None
        send(ours, self._setup)

    @property
    def gone(self) -> str | None:
        """Why the child is not running (``None`` while it is)."""
        if self._gone is None and self.process.poll() is not None:
            return f"the twin process is not running (exit code {self.process.returncode})"
        return self._gone

    def restart(self, timeout_s: float = 600.0) -> None:
        """Start the twin again once its process has died: a new run of the scenario on the
        same fabric, holding no rules (the caller installs them again). Calls made
        meanwhile wait for it; :class:`SouthboundError` if it does not start."""
        with self._lock:
            with contextlib.suppress(OSError):
                self._stream.close()
                self._sock.close()
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(5.0)
            self._spawn()
            self.wait_ready(timeout_s)
            self.restarts += 1

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Wait until the child has built the twin; raise :class:`SouthboundError` with its
        one-line reason if it could not."""
        self._sock.settimeout(timeout_s)
        try:
            first = recv(self._stream)
        except TimeoutError:
            first = ("error", f"it did not start within {timeout_s:g} s")
        except OSError:  # (reset: the child died before it said why)
            first = None
        self._sock.settimeout(None)
        if isinstance(first, tuple) and len(first) == 3 and first[0] == "ready":
            view = view_from_dict(first[1])
            if self.view is not None and view.links != self.view.links:  # (a restart)
                first = ("error", "it came back with another fabric")
            else:
                self.view = view
                self._jobs = list(first[2])
                return
        why = first[1] if isinstance(first, tuple) and len(first) > 1 else (
            f"it exited with code {self._exit_code(5.0)}")
        self._stop_child()
        raise SouthboundError(f"the twin process failed to start: {why}")

    def _exit_code(self, wait_s: float) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(wait_s)
        return None

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self._gone is not None:
                raise SouthboundError(self._gone)
            try:
                send(self._sock, (op, args))
                reply = recv(self._stream)
            except OSError:
                reply = None
            if reply is None:
                self._gone = (f"the twin process is not running (exit code "
                              f"{self._exit_code(1.0)})")
                raise SouthboundError(self._gone)
        ok, value = reply
        if ok:
            return value
        kind, detail = value
        if kind == "value":
            raise ValueError(detail)
        raise SouthboundError(f"twin process: {detail}")

    # DataPlane
    def fabric(self) -> FabricView:
        if self.view is None:
            raise SouthboundError("the twin process is not ready")
        return self.view

    def telemetry(self) -> list[PortDelta]:
        try:
            rows = self._call("telemetry")
        except SouthboundError:
            self.telemetry_failures += 1
            return []
        return [PortDelta(*row) for row in rows]

    def install(self, rules: list[PathSet]) -> None:
        if rules:
            self._call("install", rules)

    def remove(self, keys: list[str]) -> None:
        if keys:
            self._call("remove", list(keys))

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        # gone: the switches keep their last table (fail-static)
        with contextlib.suppress(SouthboundError):
            self._call("congestion", weights)

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        self._call("qos", dscp_to_priority)

    # ExternalDataPlane
    def rules(self) -> list[PathSet]:
        return list(self._call("rules"))

    def status(self) -> dict[str, Any]:
        try:
            return dict(self._call("status"))
        except SouthboundError as err:
            return {"running": False, "error": str(err)}

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._jobs)

    def inject_faults(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Play fault ``events`` in the twin from now (see :meth:`TwinRunner.inject`);
        ``ValueError`` for a bad event."""
        return list(self._call("inject", events))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the twin: closing the socket tells it to exit."""
        with self._lock:
            self._stop_child(timeout_s)

    def _stop_child(self, timeout_s: float = 10.0) -> None:
        """:meth:`close` (the lock held, or not needed)."""
        self._gone = self._gone or "the twin process was stopped"
        self._stream.close()
        self._sock.close()
        if self._exit_code(timeout_s) is None:
            self.process.kill()
            self.process.wait(5.0)


# ---------------------------------------------------------------- the twin's side
def _serve(host: TwinHost, op: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
    """One operation of the controller on the twin."""
    lock = host.table.lock
    try:
        if op == "telemetry":
            with lock:
                deltas = host.twin.telemetry()
            return True, [_DELTA_ROW(d) for d in deltas]
        if op == "install":
            host.table.install(args[0])
            return True, len(args[0])
        if op == "remove":
            host.table.remove(args[0])
            return True, len(args[0])
        if op == "rules":
            with lock:
                return True, list(host.table.rules.values())
        if op == "congestion":
            with lock:
                host.twin.push_congestion_table(args[0])
            return True, None
        if op == "qos":
            with lock:
                host.twin.set_qos(args[0])
            return True, None
        if op == "status":
            return True, host.health()
        if op == "inject":
            return True, host.runner.inject(args[0])
        return False, ("error", f"unknown operation {op!r}")
    except ValueError as err:  # e.g. a switch's rule table would overflow
        return False, ("value", str(err))
    except Exception as err:
        log.exception("twin operation failed", extra={"fields": {"operation": op}})
        return False, ("error", f"{op}: {type(err).__name__}: {err}")


def _main(fd: int) -> None:
    """The twin process: read what to run, build and start it, then answer the controller
    until the socket closes."""
    from fabricpilot.collector import freeze_startup_objects
    from fabricpilot.runner import prepare
    from fabricpilot.service.server import configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the controller stops us
    sock = socket.socket(fileno=fd)
    stream = sock.makefile("rb")
    first = recv(stream)
    if first is None:
        return
    scenario, source, time_scale, nice, log_level = first
    configure_logging(log_level)
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    try:
        host = host_twin(prepare(scenario, source), time_scale)
    except FabricpilotError as err:
        send(sock, ("error", str(err)))
        return
    except Exception as err:  # a bug: say what, keep the traceback in the logs
        log.exception("twin process failed to start")
        send(sock, ("error", f"{type(err).__name__}: {err}"))
        return
    freeze_startup_objects()
    send(sock, ("ready", view_to_dict(host.twin.fabric()), host.intents))
    host.runner.start()
    with contextlib.suppress(OSError):  # (the controller went away mid-answer)
        while (msg := recv(stream)) is not None:
            op, args = msg
            send(sock, _serve(host, op, args))
    host.runner.stop()
    os._exit(0)  # the engine's thread needs no joining


if __name__ == "__main__":
    _main(int(sys.argv[1]))
