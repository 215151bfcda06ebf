"""Building and running the service: scenario + state directory + tokens -> a running app.

:func:`build_process` is what ``fabricpilot serve`` runs: the app in this process, the
service in a control process of its own, and the twin in a process that one starts
(:mod:`fabricpilot.service.twin_process`). :func:`build` keeps the service in the app's
process (``serve --single-process``, embedding, tests). :func:`build_twin` is ``fabricpilot
twin``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI

from fabricpilot.controller.southbound import ExternalDataPlane
from fabricpilot.errors import FabricpilotError
from fabricpilot.runner import prepare
from fabricpilot.scenario.models import Scenario
from fabricpilot.service.app import DEFAULT_MAX_BODY_BYTES, JsonFormatter, create_app
from fabricpilot.service.auth import Principal, TokenRegistry, new_token
from fabricpilot.service.control import ControlProcess, LocalControl, ServiceSpec
from fabricpilot.service.southbound_http import RemoteDataPlane, RuleTable, dataplane_app
from fabricpilot.service.state import FabricService
from fabricpilot.service.store import Store
from fabricpilot.service.twin import TwinRunner
from fabricpilot.service.twin_process import TwinProcess, host_twin
from fabricpilot.textfiles import UnreadableFile, read_text_file

DB_NAME = "fabricpilot.db"
OPERATOR_TOKEN_FILE = "operator.token"


class ServeError(FabricpilotError):
    """The service cannot start (one line: what, where)."""


def operator_token(state_dir: Path) -> tuple[str, Path]:
    """The operator token of a state directory without a token file: read from
    ``operator.token``, created (mode 0600) on first start."""
    path = state_dir / OPERATOR_TOKEN_FILE
    try:
        if path.exists():
            try:
                token = read_text_file(path, max_bytes=1 << 16).strip()
            except UnreadableFile as err:
                raise ServeError(f"{path}: cannot read the operator token: {err}") from None
            if len(token) < 16:
                raise ServeError(f"{path}: token too short (>= 16 characters)")
            return token, path
        token = new_token()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except OSError as err:
        raise ServeError(f"{path}: cannot {'read' if path.exists() else 'create'} the "
                         f"operator token: {err.strerror}") from None
    return token, path


LOCK_FILE = "service.lock"
"""The file in a state directory that the service holding it keeps locked."""


class StateDirLock:
    """An exclusive lock on a state directory, held while a service uses it: two services
    writing one database and one set of path sets would undo each other's work.

    ``flock`` on ``service.lock`` (released by the kernel when the process dies, so a
    ``kill -9`` leaves no stale lock); the holder's pid is written in the file for the
    error message of the next one.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> with StateDirLock(d):
    ...     try:
    ...         StateDirLock(d).acquire()
    ...     except ServeError as err:
    ...         print(str(err).split(": ", 1)[1].split(" (")[0])
    in use by another fabricpilot service
    >>> with StateDirLock(d):  # free again once released
    ...     pass
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        _make_state_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise ServeError(f"{self.path}: cannot create the lock file: "
                             f"{err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ServeError(f"{self.path.parent}: in use by another fabricpilot service "
                             f"(pid {holder}); give each service its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (closing releases the flock)
            self._fd = None

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _make_state_dir(state_dir: Path) -> None:
    if state_dir.exists() and not state_dir.is_dir():
        raise ServeError(f"{state_dir}: the state directory exists and is not a directory")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ServeError(f"{state_dir}: cannot create the state directory: "
                         f"{err.strerror}") from None


def build_service(spec: ServiceSpec) -> FabricService:
    """The service of ``spec``: its scenario prepared, its store opened (and restored) in
    the state directory and the declared jobs planned."""
    _make_state_dir(spec.state_dir)
    # the twin process starts first: it prepares its side while this one does
    twin_process = (TwinProcess(spec.scenario, spec.source, time_scale=spec.time_scale,
                                log_level=spec.log_level)
                    if spec.twin and spec.twin_process and spec.dataplane_url is None
                    else None)
    try:
        return _build_service(spec, twin_process)
    except BaseException:
        if twin_process is not None:
            twin_process.close()
        raise


def _build_service(spec: ServiceSpec, twin_process: TwinProcess | None) -> FabricService:
    prep = prepare(spec.scenario, spec.source)
    try:
        store = Store(spec.state_dir / DB_NAME)
    except Exception as err:  # sqlite3.Error: a corrupt or foreign file
        raise ServeError(f"{spec.state_dir / DB_NAME}: cannot open the database: "
                         f"{err}") from None
    remote: ExternalDataPlane | None = None
    if spec.dataplane_url is not None:
        remote = RemoteDataPlane(spec.dataplane_url, spec.dataplane_token)
    elif twin_process is not None:
        twin_process.wait_ready()
        remote = twin_process
    return FabricService(prep, store, twin=spec.twin, time_scale=spec.time_scale,
                         tick_interval_s=spec.tick_interval_s,
                         plan_interval_s=spec.plan_interval_s, remote=remote,
                         telemetry_interval_s=spec.telemetry_interval_s)


def _tokens(state_dir: Path, tokens: TokenRegistry | None
            ) -> tuple[TokenRegistry, Path | None]:
    """``tokens``, or the state directory's operator token (and its file) without them."""
    if tokens is not None:
        return tokens, None
    _make_state_dir(state_dir)
    token, token_file = operator_token(state_dir)
    tokens = TokenRegistry()
    tokens.add(token, Principal("operator", "operator"))
    return tokens, token_file


def build(scenario: Scenario, source: str, state_dir: Path, *, tokens: TokenRegistry | None,
          twin: bool = True, time_scale: float = 1e-3, tick_interval_s: float = 0.2,
          plan_interval_s: float = 0.25, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          dataplane_url: str | None = None, dataplane_token: str | None = None,
          telemetry_interval_s: float | None = None,
          ) -> tuple[FastAPI, FabricService, TokenRegistry, Path | None]:
    """The app over a fresh service *in this process* whose durable state lives in
    ``state_dir`` (restored if it holds a database). Without ``tokens`` the state
    directory's operator token is used; its file is returned."""
    tokens, token_file = _tokens(state_dir, tokens)
    service = build_service(ServiceSpec(
        scenario, source, state_dir, twin=twin, time_scale=time_scale,
        tick_interval_s=tick_interval_s, plan_interval_s=plan_interval_s,
        dataplane_url=dataplane_url, dataplane_token=dataplane_token,
        telemetry_interval_s=telemetry_interval_s))
    app = create_app(LocalControl(service), tokens, max_body_bytes=max_body_bytes)
    return app, service, tokens, token_file


def build_process(spec: ServiceSpec, *, tokens: TokenRegistry | None,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  on_lost: Callable[[str], None] | None = None,
                  ) -> tuple[FastAPI, ControlProcess, TokenRegistry, Path | None]:
    """The app in this process over the service of ``spec`` in a control process of its
    own (:class:`~fabricpilot.service.control.ControlProcess`; what ``fabricpilot serve``
    runs). Returns once the child has built and planned; a failure there raises
    :class:`~fabricpilot.service.control.ControlError` with its one-line reason."""
    tokens, token_file = _tokens(spec.state_dir, tokens)
    control = ControlProcess(spec, on_lost=on_lost)
    app = create_app(control, tokens, max_body_bytes=max_body_bytes)
    return app, control, tokens, token_file


def configure_logging(level: str = "INFO") -> None:
    """JSON lines on stderr for the service's loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("fabricpilot.service", "fabricpilot.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level)
        lg.propagate = False


def build_twin(scenario: Scenario, source: str, *, time_scale: float = 1e-3,
               token: str | None = None) -> tuple[FastAPI, TwinRunner, RuleTable]:
    """The twin as a data plane of its own (``fabricpilot twin``): the scenario's jobs
    training in scaled real time, its southbound served over HTTP. It runs with the rules it
    is given; with none (or without a controller) flows take switch-local adaptive routing."""
    host = host_twin(prepare(scenario, source), time_scale)
    app = dataplane_app(host.table, token=token, health=host.health,
                        jobs=lambda: host.intents)
    return app, host.runner, host.table
