"""The HTTP API of the controller service (FastAPI; OpenAPI at ``/openapi.json``, docs at
``/docs``).

Resources, under ``/api/v1``:

* ``jobs`` — declare (``POST``), replace (``PUT /jobs/{id}``), list, read, withdraw
  (``DELETE``); ``jobs/{id}/calls`` — announce a communication call and get its paths back
  (``POST``), list the announced calls (``GET``); ``jobs/{id}/paths`` — the installed paths;
* ``telemetry`` — batched port counter deltas from switches (``POST``);
* ``faults`` — report (operators) and list; ``fabric`` — the topology;
  ``congestion`` — the congestion map; ``control/tick`` — run a control period now
  (operators);
* ``/health``, ``/metrics`` (Prometheus) and ``/`` (the dashboard) need no token.

Every other request needs ``Authorization: Bearer <token>`` (401 without a known one). A
tenant token sees and changes its tenant's jobs only (403 otherwise); an operator token
may do everything. Bodies above ``max_body_bytes`` get 413; invalid bodies 422 with the
offending fields; every error's body is JSON with a ``detail``. Each request is logged as
one JSON line with the caller's name, never its token.
"""


import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fabricpilot import __version__
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.control import ControlProcess, LocalControl
from fabricpilot.service.metrics import api_histogram
from fabricpilot.service.schemas import AnnounceIn, FaultIn, IntentIn, TelemetryIn, TwinFaultsIn
from fabricpilot.service.state import ServiceError
from fabricpilot.textfiles import DuplicateKey, no_duplicate_keys

log = logging.getLogger("fabricpilot.service")
M = TypeVar("M", bound=BaseModel)
access_log = logging.getLogger("fabricpilot.access")
CLIENT_CLOSED = 499  # the status logged of a request whose client went before it was whole

DEFAULT_MAX_BODY_BYTES = 8 << 20


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message and the record's
    ``fields`` (``extra={"fields": {...}}``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname,
                               "logger": record.name, "event": record.getMessage()}
        out.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out, default=str)


class Observe:
    """ASGI middleware: per request, the latency histogram (by route template, so ids do
    not explode the label set) and one JSON access-log line with the caller's name."""

    def __init__(self, app: ASGIApp, latency: Histogram) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status: int | None = None

        async def sent(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sent)
        except BaseException:
            status = status or 500
            raise
        finally:
            # (nothing sent and nothing raised: the client went before its request was
            # whole; 499 as proxies log a request its client closed)
            status = status or CLIENT_CLOSED
            dt = time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", "<unmatched>")
            self.latency.labels(scope["method"], route, str(status)).observe(dt)
            if access_log.isEnabledFor(logging.INFO):
                state = scope.get("state") or {}
                client = scope.get("client")
                access_log.info("request", extra={"fields": {
                    "method": scope["method"], "route": route, "status": status,
                    "ms": round(dt * 1e3, 3), "principal": state.get("principal"),
                    "client": client[0] if client else None}})


class BodyLimit:
    """ASGI middleware: a request body above ``max_bytes`` gets 413 with a JSON ``detail``
    naming the limit, as every other error: at once when its ``Content-Length`` says so
    (nothing is read), or as soon as the bytes read pass the limit (a chunked body)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _detail(self, size: str) -> str:
        return (f"request body of {size} is larger than this service accepts "
                f"({self.max_bytes} bytes; serve --max-body)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                break
        if declared is not None and declared > self.max_bytes:
            await JSONResponse({"detail": self._detail(f"{declared} bytes")},
                               status_code=413)(scope, receive, send)
            return
        total = 0

        async def limited() -> Message:
            nonlocal total
            msg = await receive()
            if msg["type"] == "http.request":
                total += len(msg.get("body", b""))
                if total > self.max_bytes:  # (the route's exception handler answers)
                    raise HTTPException(413, self._detail(f"more than {self.max_bytes} bytes"))
            return msg

        await self.app(scope, limited, send)


class NoDuplicateKeys:
    """ASGI middleware: a JSON request body that gives a key twice in one object gets 422
    naming the key (JSON parsers keep the last one silently: ``{"gpus": [0], "gpus": [1]}``
    would be read as ``[1]``). Other bodies, well-formed or not, go on to their route. With
    ``known`` (a bearer token -> whether it is one, and whether an operator's), only the
    bodies of requests that carry a known token are parsed here, and of the paths
    ``operators_only`` those of operators: the others go on unread to their route's 401 or
    403 (a tenant is told the route is not theirs, not what is wrong with its body)."""

    def __init__(self, app: ASGIApp,
                 known: Callable[[str], tuple[bool, bool]] | None = None,
                 operators_only: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.known = known
        self.operators_only = operators_only

    def _authorized(self, scope: Scope) -> bool:
        if self.known is None:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer" or not token:
                    return False
                known, operator = self.known(token)
                return known and (operator or scope.get("path") not in self.operators_only)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH") \
                or not self._authorized(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            try:
                msg = await receive()
            except HTTPException as exc:  # (too large: BodyLimit, outside the routes)
                await JSONResponse({"detail": exc.detail},
                                   status_code=exc.status_code)(scope, receive, send)
                return
            if msg["type"] == "http.disconnect":  # (the client is gone: no one to answer)
                return
            if msg["type"] != "http.request":
                await self.app(scope, _replay([msg], receive), send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.lstrip()[:1] in (b"{", b"["):
            try:
                json.loads(body, object_pairs_hook=no_duplicate_keys)
            except DuplicateKey as dup:
                await JSONResponse({"detail": [{
                    "type": "json_invalid", "loc": ["body"],
                    "msg": f"JSON object gives key {str(dup)!r} twice"}]},
                    status_code=422)(scope, receive, send)
                return
            except RecursionError:  # (arrays or objects nested past the parser's stack)
                await JSONResponse({"detail": [{
                    "type": "json_invalid", "loc": ["body"],
                    "msg": "JSON nests arrays or objects too deeply"}]},
                    status_code=422)(scope, receive, send)
                return
            except ValueError:  # (not JSON: the route says so)
                pass
        await self.app(scope, _replay([{"type": "http.request", "body": body,
                                        "more_body": False}], receive), send)


class _FastRoute(Route):
    """A plain Starlette route that, as FastAPI's do, puts itself in the request's scope
    (``scope["route"]``): the latency histogram and the access log read its path template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


def _allowed(routes: list[BaseRoute], path: str) -> list[str]:
    """The methods some route of ``routes`` answers on ``path`` (sorted): the ``Allow``
    header of a 405 (Starlette gives the methods of one route only, the first whose path
    matches, where several routes share a path)."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return sorted(methods)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then what ``receive`` gives."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _body(model: type[BaseModel], path_params: tuple[str, ...] | list[str] = ()
          ) -> dict[str, Any]:
    """``openapi_extra`` of the routes that read their body themselves (:func:`_parsed`): a
    JSON request body of ``model``, the string path parameters the busiest routes read from
    the request, and the bearer token (those check it themselves, not through FastAPI's
    dependencies: see :func:`create_app`)."""
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}},
        "security": [{"HTTPBearer": []}],
        "responses": {"422": {"description": "Validation Error", "content": {
            "application/json": {"schema": {
                "$ref": "#/components/schemas/HTTPValidationError"}}}}}}
    if path_params:
        extra["parameters"] = [{"name": n, "in": "path", "required": True,
                                "schema": {"type": "string", "title": n.replace("_", " ")
                                           .title()}} for n in path_params]
    return extra


async def _parsed(request: Request, model: type[M]) -> M:
    """The request body as ``model``, parsed and validated by pydantic-core in one pass;
    a body that does not fit gets FastAPI's 422 (``loc`` starting with ``"body"``)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        errors = []
        for e in err.errors(include_url=False):
            e = dict(e)
            e["loc"] = ("body", *e["loc"]) if e["type"] != "json_invalid" else ("body",)
            e.pop("ctx", None)
            if e["type"] == "json_invalid":  # (the body itself: not echoed back)
                e.pop("input", None)
            errors.append(e)
        raise RequestValidationError(errors) from None


_ECHO_MAX_CHARS = 1000  # the largest offending input a 422 repeats


def _json_safe(value: Any) -> Any:
    """``value`` as JSON can carry it: non-finite numbers as strings (``"inf"``), bytes
    decoded (undecodable ones replaced), anything else not JSON as its ``str``.

    >>> _json_safe({"a": [float("nan"), (1, 2)]})
    {'a': ['nan', [1, 2]]}
    >>> _json_safe(b"\\xff1") == "\\ufffd1"
    True
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _body_error(error: Any) -> Any:
    """A validation error of the request body as every route gives it: a body that is not
    JSON at ``loc ["body"]`` (FastAPI's own parser adds the offset), and the body itself,
    JSON or not, never repeated back.

    >>> _body_error({"type": "json_invalid", "loc": ("body", 1), "msg": "m", "input": {}})
    {'type': 'json_invalid', 'loc': ('body',), 'msg': 'm'}
    >>> "input" in _body_error({"type": "model_attributes_type", "loc": ("body",),
    ...                         "msg": "m", "input": "kind=up"})
    False
    """
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid" and loc[:1] == ("body",):
        error = {**error, "loc": ("body",)}
    elif loc != ("body",):
        return error
    return {k: v for k, v in error.items() if k != "input"}


def _echo_safe(error: Any) -> dict[str, Any]:
    """One validation error as a 422 lists it: its ``input`` made JSON-safe, left out if
    long (a 422 names the field and the problem; it need not repeat a large body), its
    ``ctx`` as strings.

    >>> _echo_safe({"type": "finite_number", "loc": ("body", "x"), "msg": "m",
    ...             "input": float("inf")})["input"]
    'inf'
    >>> "input" in _echo_safe({"type": "t", "loc": (), "msg": "m", "input": "x" * 5000})
    False
    """
    e = {k: v for k, v in dict(error).items() if k != "url"}
    if "input" in e:
        safe = _json_safe(e["input"])
        if len(json.dumps(safe, default=str)) > _ECHO_MAX_CHARS:
            del e["input"]
        else:
            e["input"] = safe
    if "ctx" in e:
        e["ctx"] = {str(k): _json_safe(v) if isinstance(v, int | float | str) else str(v)
                    for k, v in dict(e["ctx"]).items()}
    e["loc"] = list(e.get("loc", ()))
    return e


_ERROR_SCHEMA = {"title": "Error", "type": "object", "required": ["detail"],
                 "properties": {"detail": {"type": "string", "title": "Detail"}}}

_ERRORS = {"401": "No known bearer token", "403": "Not this caller's (a tenant's GPUs or jobs, "
           "an operator's route)", "404": "No such job or link", "409": "In conflict with "
           "what exists (a task id declared, a GPU another tenant uses, a job's most calls)",
           "413": "Request body above the limit (--max-body)", "501": "Not offered by this "
           "data plane (fault drills without the twin)"}


def _error_responses(spec: dict[str, Any]) -> None:
    """Document the errors the routes answer, each ``{"detail": "one line"}`` (an ``Error``):
    401 on every authenticated route, 403 on those, 404 where a path names a job or link, 409
    where a job is declared or a call announced, 413 where a body is read, 501 for drills;
    422 as FastAPI's field list or as one line (a GPU, link or rank that does not exist)."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = _ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            codes = []
            if path.startswith("/api/"):
                codes += ["401", "403"]
            if "{" in path:
                codes.append("404")
            if method in ("post", "put") and path.startswith("/api/v1/jobs"):
                codes.append("409")
            if "requestBody" in op:
                codes.append("413")
                one_line = {"$ref": "#/components/schemas/Error"}
                listed = (responses.get("422", {}).get("content", {})
                          .get("application/json", {}).get("schema"))
                responses["422"] = {"description": "Validation Error", "content": {
                    "application/json": {"schema": {"anyOf": [s for s in (listed, one_line)
                                                              if s is not None]}}}}
            if path.endswith("/twin/faults"):
                codes.append("501")
            for code in codes:
                responses.setdefault(code, {"description": _ERRORS[code], **ref})


def _with_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add ``models`` (and the models they use) to the app's OpenAPI components."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = base()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for m in models:
                js = m.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(js.pop("$defs", {}))
                schemas[m.__name__] = js
            _error_responses(spec)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(control: LocalControl | ControlProcess, tokens: TokenRegistry, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, manage: bool = True) -> FastAPI:
    """The API over a control (:mod:`fabricpilot.service.control`: the service in this
    process or in a process of its own). ``manage``: start the control loop (and twin) with
    the app and stop them when it stops."""
    registry = CollectorRegistry()
    api_latency = api_histogram(registry)
    call = control.call
    bearer = HTTPBearer(auto_error=False)

    # the busiest routes (intents, telemetry) call these directly: FastAPI's dependency
    # resolution costs more than the check itself; the others use them as dependencies
    def caller(request: Request) -> Principal:
        """The principal of the request's bearer token (401 without a known one)."""
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise HTTPException(401, "missing bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        p = tokens.resolve(token)
        if p is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        request.state.principal = p.name
        return p

    def operator_of(request: Request) -> Principal:
        p = caller(request)
        if not p.is_operator:
            raise HTTPException(403, "operators only")
        return p

    async def principal(_: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                        request: Request) -> Principal:
        return caller(request)

    async def operator(_: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                       request: Request) -> Principal:
        return operator_of(request)

    Caller = Annotated[Principal, Depends(principal)]
    Operator = Annotated[Principal, Depends(operator)]

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        if manage:
            await control.start()
        try:
            yield
        finally:
            if manage:
                await control.stop()

    app = FastAPI(title="fabricpilot controller", version=__version__, lifespan=lifespan,
                  # metrics are Prometheus (/metrics); no OpenTelemetry checks per request
                  telemetry={"tracing": False, "metrics": False, "logs": False},
                  description="Task-aware control plane for AI-training fabrics: declare "
                              "jobs and their communication, read their paths, feed it "
                              "telemetry and faults.")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": [_echo_safe(_body_error(e)) for e in exc.errors()]},
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:  # (every method of the path, not one route's)
            allow = ", ".join(_allowed(app.router.routes, request.url.path))
            exc = StarletteHTTPException(405, exc.detail, headers={"Allow": allow})
        return await http_exception_handler(request, exc)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    # ------------------------------------------------------------ open
    @app.get("/health", tags=["service"])
    async def health() -> dict[str, Any]:
        return await call("health")  # type: ignore[no-any-return]

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics. The per-job series (jobs' names and tenants) only with an
        operator's token, as the rest of the API shows a job to its tenant and the
        operators alone; the fabric's and the service's without one (a scrape or a probe
        need none)."""
        jobs = "authorization" in request.headers and caller(request).is_operator
        text = await call("metrics_text", jobs) + generate_latest(registry).decode()
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    # (probes that send HEAD: the GET's status and headers, no body)
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/metrics", metrics, methods=["HEAD"], include_in_schema=False,
                      response_class=Response)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        page = resources.files("fabricpilot.service").joinpath("dashboard.html")
        return HTMLResponse(page.read_text(encoding="utf-8"))

    # ------------------------------------------------------------ jobs
    # every handler runs on the event loop; the control runs the operations that may wait
    # for the controller (an announced call for its plan; faults, control periods and the
    # congestion map for its lock) where they do not hold the loop up
    v1 = "/api/v1"

    # every body is parsed and validated in one pass by pydantic-core (:func:`_parsed`), the
    # same way whatever its Content-Type; the schemas are still in the OpenAPI spec
    @app.post(f"{v1}/jobs", status_code=201, tags=["jobs"], openapi_extra=_body(IntentIn))
    async def declare(request: Request) -> JSONResponse:
        """Declare a job's intent (409 if the task id exists; PUT replaces)."""
        p = caller(request)
        body = await _parsed(request, IntentIn)
        return JSONResponse(await call("declare", p, body, replace_ok=False), status_code=201)

    @app.put(f"{v1}/jobs/{{task_id}}", tags=["jobs"],
             responses={201: {"description": "The job was new: declared"}},
             openapi_extra=_body(IntentIn, path_params=["task_id"]))
    async def update(request: Request) -> JSONResponse:
        """Declare (201) or replace (200) a job's intent."""
        p = caller(request)
        body = await _parsed(request, IntentIn)
        task_id = request.path_params["task_id"]
        if body.task_id != task_id:
            raise ServiceError(422, f"task_id: body says {body.task_id!r}, path says "
                               f"{task_id!r}")
        job, created = await call("put", p, body)
        return JSONResponse(job, status_code=201 if created else 200)

    @app.get(f"{v1}/jobs", tags=["jobs"])
    async def list_jobs(p: Caller) -> list[dict[str, Any]]:
        """The caller's jobs (every job for operators)."""
        return await call("jobs", p)  # type: ignore[no-any-return]

    @app.get(f"{v1}/jobs/{{task_id}}", tags=["jobs"])
    async def get_job(task_id: str, p: Caller) -> dict[str, Any]:
        return await call("job", p, task_id)  # type: ignore[no-any-return]

    @app.delete(f"{v1}/jobs/{{task_id}}", status_code=204, tags=["jobs"])
    async def withdraw(task_id: str, p: Caller) -> Response:
        await call("withdraw", p, task_id)
        return Response(status_code=204)

    @app.post(f"{v1}/jobs/{{task_id}}/calls", tags=["jobs"], openapi_extra=_body(AnnounceIn),
              response_class=Response, responses={200: {"content": {"application/json": {}}}})
    async def announce(task_id: str, request: Request, p: Caller) -> Response:
        """Announce a communication call; answered with the paths planned for it (encoded
        by the controller's side, as a job's paths)."""
        body = await _parsed(request, AnnounceIn)
        answer = await call("announce_json", p, task_id, body)
        return Response(answer, media_type="application/json")

    @app.get(f"{v1}/jobs/{{task_id}}/calls", tags=["jobs"])
    async def list_calls(task_id: str, p: Caller,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[dict[str, Any]]:
        return await call("calls", p, task_id, limit)  # type: ignore[no-any-return]

    @app.get(f"{v1}/jobs/{{task_id}}/paths", tags=["paths"], response_class=Response,
             responses={200: {"content": {"application/json": {}}}})
    async def job_paths(task_id: str, p: Caller,
                  src: Annotated[int | None, Query(ge=0)] = None,
                  dst: Annotated[int | None, Query(ge=0)] = None) -> Response:
        """The path sets installed for a job, one per GPU pair in (source, destination)
        order (``src`` / ``dst`` filter); encoded by the controller's side, off the API's
        event loop."""
        body = await call("paths_json", p, task_id, src, dst)
        return Response(body, media_type="application/json")

    # ------------------------------------------------------------ fabric
    @app.post(f"{v1}/telemetry", status_code=202, tags=["telemetry"],
              openapi_extra=_body(TelemetryIn))
    async def telemetry(request: Request) -> JSONResponse:
        """Port counter deltas from switches (folded in at the next control period)."""
        operator_of(request)
        body = await _parsed(request, TelemetryIn)
        return JSONResponse({"accepted": await call("ingest", body.deltas, switch=body.switch)},
                            status_code=202)

    @app.post(f"{v1}/control/tick", tags=["telemetry"])
    async def tick(_: Operator) -> dict[str, Any]:
        """Run one control period now."""
        return await call("tick_now")  # type: ignore[no-any-return]

    @app.post(f"{v1}/faults", status_code=201, tags=["faults"], openapi_extra=_body(FaultIn))
    async def report_fault(request: Request, p: Operator) -> dict[str, Any]:
        """A link went down, came back up, or is gray: the controller re-places the path
        sets that cross it."""
        body = await _parsed(request, FaultIn)
        return await call("report_fault", p, body)  # type: ignore[no-any-return]

    @app.post(f"{v1}/twin/faults", status_code=201, tags=["faults"],
              openapi_extra=_body(TwinFaultsIn))
    async def twin_faults(request: Request, p: Operator) -> dict[str, Any]:
        """A fault drill: the twin plays these faults from now (as a scenario's
        ``faults.events``; what is left of them at the end of its run goes on in the next);
        the controller learns of them from the twin's telemetry, as it would from
        switches. 501 if the data plane is not the twin."""
        body = await _parsed(request, TwinFaultsIn)
        return await call("inject_twin_faults", p, body)  # type: ignore[no-any-return]

    @app.get(f"{v1}/faults", tags=["faults"])
    async def list_faults(p: Caller, limit: Annotated[int, Query(ge=1, le=10_000)] = 200
                    ) -> list[dict[str, Any]]:
        """The fault log (a tenant's without the operators' notes, ``detail``)."""
        return await call("faults", p, limit)  # type: ignore[no-any-return]

    @app.get(f"{v1}/fabric", tags=["fabric"])
    async def fabric(_: Caller) -> dict[str, Any]:
        return await call("topology")  # type: ignore[no-any-return]

    @app.get(f"{v1}/congestion", tags=["fabric"])
    async def congestion(_: Caller, kind: Annotated[list[Literal["fabric", "nic", "nvlink"]] | None,
                                              Query()] = None) -> list[dict[str, Any]]:
        """The congestion map per link (``?kind=fabric&kind=nic`` to leave NVLink out)."""
        return await call("congestion", set(kind) if kind else None)  # type: ignore[no-any-return]

    @app.get(f"{v1}/fabric/links/{{link_id}}", tags=["fabric"])
    async def link(link_id: int, _: Operator) -> dict[str, Any]:
        """One link: its state and the jobs the installed plan puts on it (pairs, planned
        Gb/s), heaviest first: who a drain or a repair would move."""
        return await call("link_usage", link_id)  # type: ignore[no-any-return]

    @app.get(f"{v1}/events", tags=["fabric"])
    async def events(p: Caller) -> list[dict[str, Any]]:
        """Recent reroutes, heals and faults, newest last (a tenant sees the GPU pairs a
        reroute moved of its own jobs only)."""
        return await call("events_list", p)  # type: ignore[no-any-return]

    # the busiest routes are served by plain Starlette routes placed first: the same
    # handlers (they take the request alone and answer a response), without FastAPI's
    # per-request parameter resolution; the FastAPI routes above describe them in the
    # OpenAPI spec. Other methods on these paths fall through to the FastAPI routes.
    app.router.routes[:0] = [_FastRoute(f"{v1}/telemetry", telemetry, methods=["POST"]),
                             _FastRoute(f"{v1}/jobs/{{task_id}}", update, methods=["PUT"]),
                             _FastRoute(f"{v1}/jobs", declare, methods=["POST"])]
    _with_schemas(app, [IntentIn, TelemetryIn, AnnounceIn, FaultIn, TwinFaultsIn])
    def known(token: str) -> tuple[bool, bool]:
        p = tokens.resolve(token)
        return p is not None, p is not None and p.is_operator

    # (inside BodyLimit: reads what it lets through; of callers with a known token only)
    app.add_middleware(NoDuplicateKeys, known=known, operators_only=frozenset(
        f"{v1}/{path}" for path in ("telemetry", "faults", "twin/faults", "control/tick")))
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # (inside Observe: logged)
    app.add_middleware(Observe, latency=api_latency)
    return app
