"""Where the controller runs: in the API's process, or in a process of its own.

The API (:mod:`fabricpilot.service.app`) parses, authenticates and validates each request,
then hands the operation to a *control*: ``await control.call("declare", principal, body,
replace_ok=True)``. Two controls implement that one call:

* :class:`LocalControl` calls a :class:`~fabricpilot.service.state.FabricService` in the same
  process (embedding, tests). The controller's computing then shares one interpreter lock
  with the API.
* :class:`ControlProcess` runs the ``FabricService`` (controller, data plane, store, control
  loop) in a child process and calls it over a socket pair. Each request is a length-prefixed
  pickle ``(id, method, args, kwargs)``, and each answer ``(id, ok, value)`` comes back in any
  order. The child answers quick operations (declare, read, telemetry) in the order they come,
  and runs those that may wait (an announced call waits for its plan; faults, control periods
  and the congestion map wait for the controller's lock) on a thread pool.

  This is what ``fabricpilot serve`` uses. Planning and control periods no longer take the
  API's interpreter lock, so the API and the controller run on two cores. The twin, its
  data plane, runs in a third process (:mod:`fabricpilot.service.twin_process`).

A :class:`~fabricpilot.service.state.ServiceError` raised in the child comes back as the same
error (status and one-line detail). Any other failure comes back as a 500 naming the
exception; the child logs the traceback. If the child dies, every call gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from fabricpilot.controller.southbound import PortDelta
from fabricpilot.errors import FabricpilotError
from fabricpilot.scenario.models import Scenario
from fabricpilot.service.framing import HEADER, messages, recv, send
from fabricpilot.service.schemas import PortDeltaIn
from fabricpilot.service.state import FabricService, ServiceError

log = logging.getLogger("fabricpilot.service")

OPERATIONS = frozenset({
    "declare", "put", "withdraw", "jobs", "job", "announce", "announce_json", "calls",
    "paths", "paths_json",
    "ingest",
    "ingest_rows", "tick_now", "report_fault", "faults", "topology", "congestion",
    "link_usage", "health", "events_list", "metrics_text", "inject_twin_faults"})
"""The :class:`FabricService` methods a control may call."""

WAITING = frozenset({"announce", "report_fault", "tick_now", "congestion", "link_usage",
                     "metrics_text", "inject_twin_faults", "paths_json", "announce_json"})
"""Operations that may wait for a plan or the controller's lock, or take long (a job's
paths: seconds for hundreds of thousands of GPU pairs), run on a thread pool: the quick
ones (telemetry, declarations, reads) go on meanwhile."""

_DELTA_FIELDS = tuple(f.name for f in fields(PortDelta))
assert tuple(PortDeltaIn.model_fields) == _DELTA_FIELDS  # rows are in this field order


def delta_rows(deltas: list[PortDeltaIn]) -> list[tuple[Any, ...]]:
    """Validated port deltas as rows of their values in :class:`PortDelta` field order (a
    tenth of the cost of pickling the models)."""
    return [tuple(d.__dict__.values()) for d in deltas]


class ControlError(FabricpilotError):
    """The control process could not start (one line: what and why)."""


class LocalControl:
    """The operations of a :class:`FabricService` in this process (module docstring)."""

    def __init__(self, service: FabricService) -> None:
        self.service = service
        self.restored = service.restored
        self.n_gpus = service.n_gpus

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in OPERATIONS:
            raise ValueError(f"unknown operation {method!r}")
        fn: Callable[..., Any] = getattr(self.service, method)
        if method in WAITING:
            return await run_in_threadpool(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def start(self) -> None:
        self.service.start()

    async def stop(self) -> None:
        self.service.stop()


@dataclass(frozen=True)
class ServiceSpec:
    """What a control process needs to build its :class:`FabricService` (picklable)."""

    scenario: Scenario
    source: str
    state_dir: Path
    twin: bool = True
    time_scale: float = 1e-3
    tick_interval_s: float = 0.2
    telemetry_interval_s: float | None = None  # how often posted telemetry comes (None: per tick)
    plan_interval_s: float = 0.25
    dataplane_url: str | None = None
    dataplane_token: str | None = None
    log_level: str = "WARNING"
    twin_process: bool = False  # the twin in a process of its own (what serve does)


class ControlProcess:
    """A :class:`FabricService` in a child process (module docstring).

    The constructor starts the child and waits until its service is built (scenario,
    store, restore, first plan); a failure there raises :class:`ControlError` with the
    child's one-line reason. :meth:`start` (on the API's event loop) connects and starts
    the control loop; :meth:`stop` stops it and waits for the child to exit. If the child
    dies otherwise, every call gets 503 and ``on_lost`` is called with the reason (``serve``
    then exits, for its supervisor to restart it: the restart restores the state)."""

    def __init__(self, spec: ServiceSpec, *, start_timeout_s: float = 600.0,
                 on_lost: Callable[[str], None] | None = None) -> None:
        self.on_lost = on_lost  # called (event loop) with why, if the child dies under us
        self._stopping = False
        ours, theirs = socket.socketpair()
        ctx = mp.get_context("spawn")  # no fork of a process that may run threads
        self.process = ctx.Process(target=_child_main, args=(theirs, spec),
                                   name="fabricpilot-control", daemon=True)
        self.process.start()
        theirs.close()
        self._sock = ours
        ours.settimeout(start_timeout_s)
        with ours.makefile("rb") as stream:
            try:
                first = recv(stream)
            except TimeoutError:
                first = ("error", f"the control process did not start within "
                                  f"{start_timeout_s:g} s")
        ours.settimeout(None)
        if not (isinstance(first, tuple) and first and first[0] == "ready"):
            self.process.join(5.0)
            if self.process.is_alive():
                self.process.kill()
            why = first[1] if isinstance(first, tuple) and len(first) > 1 else (
                f"the control process exited with code {self.process.exitcode}")
            raise ControlError(str(why))
        self.restored: dict[str, int] = first[1]
        self.n_gpus: int = first[2]  # the fabric's
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._gone: str | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_connection(lambda: _Answers(self),
                                                          sock=self._sock)
        await self.call("start")

    def _answer(self, rid: int, ok: bool, value: Any) -> None:
        fut = self._waiting.pop(rid, None)
        if fut is None or fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            _, status, detail = value
            fut.set_exception(ServiceError(status, detail))

    def _lost(self) -> None:
        self._gone = "the control process is not running"
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ServiceError(503, self._gone))
        self._waiting.clear()
        if not self._stopping and self.on_lost is not None:
            self.process.join(2.0)  # (its exit code, if it is exiting)
            code = self.process.exitcode
            self.on_lost("the control process exited unexpectedly"
                         + (f" (exit code {code})" if code is not None else ""))

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._gone is not None or self._transport is None:
            raise ServiceError(503, self._gone or "the control process is not started")
        if method == "ingest":  # rows pickle ten times faster than models
            method, args = "ingest_rows", (delta_rows(args[0]),)
        rid = self._next_id = self._next_id + 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        data = pickle.dumps((rid, method, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        self._transport.write(HEADER.pack(len(data)) + data)
        return await fut

    async def stop(self) -> None:
        self._stopping = True
        if self._gone is None and self._transport is not None:
            with contextlib.suppress(ServiceError, TimeoutError):
                await asyncio.wait_for(self.call("stop"), 10.0)
        if self._transport is not None:
            self._transport.close()
        await asyncio.to_thread(self.process.join, 10.0)
        if self.process.is_alive():
            self.process.kill()


class _Answers(asyncio.Protocol):
    """The API's end of the socket: each complete answer settles its call's future right
    in the event loop's read callback (no task in between)."""

    def __init__(self, control: ControlProcess) -> None:
        self.control = control
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for rid, ok, value in messages(self.buf):
            self.control._answer(rid, ok, value)

    def connection_lost(self, exc: Exception | None) -> None:
        self.control._lost()


def _child_main(sock: socket.socket, spec: ServiceSpec) -> None:
    """The control process: build the service, then answer requests until told to stop or
    until the API's process has gone (end of the socket)."""
    from fabricpilot.collector import freeze_startup_objects, keep_freed_memory
    from fabricpilot.service.server import build_service, configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the API's process stops us
    configure_logging(spec.log_level)
    keep_freed_memory()  # (it plans until it exits: its memory kept between plans)
    try:
        service = build_service(spec)
    except FabricpilotError as err:
        send(sock, ("error", str(err)))
        return
    except Exception as err:  # a bug: say what, keep the traceback in the logs
        log.exception("control process failed to start")
        send(sock, ("error", f"the control process failed to start: "
                              f"{type(err).__name__}: {err}"))
        return
    freeze_startup_objects()
    send(sock, ("ready", service.restored, service.n_gpus))
    send_lock = threading.Lock()
    pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="fabricpilot-op")

    def run(rid: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> tuple[Any, ...]:
        try:
            return (rid, True, getattr(service, method)(*args, **kwargs))
        except ServiceError as err:
            return (rid, False, ("service", err.status, err.detail))
        except Exception as err:
            log.exception("operation failed", extra={"fields": {"operation": method}})
            return (rid, False, ("internal", 500, f"{method}: {type(err).__name__}: {err}"))

    def run_and_send(rid: int, method: str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> None:
        msg = run(rid, method, args, kwargs)
        with send_lock:
            send(sock, msg)

    # Requests are read in whole chunks and answered in one write per chunk: under load a
    # chunk holds many requests, and the twin's and the control loop's threads then cost
    # this thread two interpreter-lock hand-overs per chunk, not several per request.
    started = False
    buf = bytearray()
    running = True
    while running:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            break
        buf += data
        out: list[bytes] = []
        for rid, method, args, kwargs in messages(buf):
            if method == "start":
                if not started:
                    service.start()
                    started = True
                reply: tuple[Any, ...] = (rid, True, None)
            elif method == "stop":
                service.stop()
                started = False
                running = False
                reply = (rid, True, None)
            elif method not in OPERATIONS:
                reply = (rid, False, ("internal", 500, f"unknown operation {method!r}"))
            elif method in WAITING:
                pool.submit(run_and_send, rid, method, args, kwargs)
                continue
            else:
                reply = run(rid, method, args, kwargs)
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            out.append(HEADER.pack(len(data)))
            out.append(data)
            if not running:
                break
        if out:
            with send_lock:
                sock.sendall(b"".join(out))
    if started:
        service.stop()
    pool.shutdown(wait=False, cancel_futures=True)
    service.store.close()
    os._exit(0)  # threads of the twin and the pool need no joining
