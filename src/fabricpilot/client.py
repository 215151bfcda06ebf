"""A small synchronous client for the fabricpilot controller service (``fabricpilot serve``).

One method per resource of the REST API (``/api/v1``); each returns the service's JSON as
plain dicts and lists (or ``None`` / an ``int`` where the response carries nothing else)::

    from fabricpilot.client import Client

    with Client("http://127.0.0.1:8765", token="...") as fp:
        fp.declare_job("llm-7b", gpus=[0, 1, 2, 3],
                       calls=[{"pattern": "allreduce", "size_bytes": 64 << 20, "sla_us": 500}])
        decision = fp.announce("llm-7b", "allreduce", 25 << 20, ranks=[0, 1, 2, 3], bucket=0)
        for pair in decision["pairs"]:
            print(pair["src"], "->", pair["dst"], [p["nodes"] for p in pair["paths"]])

Defaults come from the environment: the URL from ``FABRICPILOT_URL`` (else
``http://127.0.0.1:8765``), the bearer token from ``FABRICPILOT_TOKEN``.

Errors: a response with a 4xx / 5xx status raises :class:`FabricpilotAPIError` (``status``,
``detail`` and a one-line message; a 422 lists each offending field as
``field.path: message``); a controller that cannot be reached raises
:class:`FabricpilotConnectionError`. Only ``GET`` requests, which change nothing, are retried
(a bounded number of times, with exponential backoff) and only when the connection failed;
a ``POST`` / ``PUT`` / ``DELETE`` is sent once.

>>> err = FabricpilotAPIError(422, [{"loc": ["body", "calls", 0, "size_bytes"],
...                                  "msg": "Input should be greater than 0"}])
>>> str(err)
'422 Unprocessable Entity: calls.0.size_bytes: Input should be greater than 0'
>>> err.fields
[('calls.0.size_bytes', 'Input should be greater than 0')]
"""

from __future__ import annotations

import json as _json
import math
import os
import time
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal, TypedDict
from urllib.parse import quote, urlsplit

import httpx

from fabricpilot.errors import FabricpilotError

__all__ = [
    "API_PREFIX",
    "DEFAULT_URL",
    "CallSpec",
    "Client",
    "FabricpilotAPIError",
    "FabricpilotClientError",
    "FabricpilotConnectionError",
    "PortDeltaSpec",
]

DEFAULT_URL = "http://127.0.0.1:8765"
"""Where ``fabricpilot serve`` listens by default."""

API_PREFIX = "/api/v1"
URL_ENV = "FABRICPILOT_URL"
TOKEN_ENV = "FABRICPILOT_TOKEN"
TIMEOUT_ENV = "FABRICPILOT_TIMEOUT_S"

Pattern = Literal["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]
FaultKind = Literal["down", "up", "gray"]
JSONDict = dict[str, Any]

# Connection-level failures after which a GET is worth sending again (nothing reached the
# service, or the connection broke before an answer). Read timeouts are not retried: the
# service may still be working on the request.
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
              httpx.ReadError, httpx.WriteError, httpx.PoolTimeout)


class CallSpec(TypedDict, total=False):
    """One communication call of a job's intent (``calls`` of :meth:`Client.declare_job`).

    ``pattern``, ``size_bytes`` and ``sla_us`` are required; ``period_ns`` (0: one-off),
    ``priority`` (0-7), ``pairs`` (explicit ``(src_gpu, dst_gpu)`` pairs, a pair given k
    times carrying k transfers at once) and ``algorithm`` (``"tree"``: an AllReduce the
    library runs over double binary trees; ``""``: rings) are optional.
    """

    pattern: Pattern
    size_bytes: int
    sla_us: float
    period_ns: int
    priority: int
    pairs: list[tuple[int, int]]
    algorithm: str


class PortDeltaSpec(TypedDict, total=False):
    """Counter deltas of one egress port over ``interval_ns`` (``link_id`` and
    ``interval_ns`` required; every counter defaults to 0)."""

    link_id: int
    interval_ns: int
    tx_bytes: float
    queue_bytes: float
    drops: float
    ecn_marks: float
    pause_ns: float
    fec_corrected: float
    fec_uncorrected: float
    rx_bits: float


class FabricpilotClientError(FabricpilotError):
    """Base of the errors the client raises."""


class FabricpilotConnectionError(FabricpilotClientError):
    """The controller could not be reached (after the retries a ``GET`` gets)."""


class FabricpilotAPIError(FabricpilotClientError):
    """The service answered with an error status.

    ``status`` is the HTTP status, ``detail`` the response's ``detail`` (a string, or for a
    422 from body validation the list of field errors), ``fields`` the ``(field.path,
    message)`` pairs of a validation error (empty otherwise), ``method`` / ``url`` the
    request. ``str(err)`` is one line: ``"<status> <reason>: <detail>"``.

    >>> e = FabricpilotAPIError(404, "job 'x' not found", method="GET", url="/api/v1/jobs/x")
    >>> str(e), e.status
    ("404 Not Found: job 'x' not found (GET /api/v1/jobs/x)", 404)
    """

    def __init__(self, status: int, detail: Any, *, method: str | None = None,
                 url: str | None = None) -> None:
        self.status = status
        self.detail = detail
        self.method = method
        self.url = url
        self.fields = _field_errors(detail)
        super().__init__(self._message())

    def _message(self) -> str:
        try:
            reason = HTTPStatus(self.status).phrase
        except ValueError:
            reason = "Error"
        if self.fields:
            text = "; ".join(f"{path}: {msg}" if path else msg for path, msg in self.fields)
        elif isinstance(self.detail, str):
            text = self.detail
        else:
            text = str(self.detail)
        text = " ".join(text.split())  # one line
        where = f" ({self.method} {self.url})" if self.method and self.url else ""
        return f"{self.status} {reason}: {text}{where}"


def _field_errors(detail: Any) -> list[tuple[str, str]]:
    """``(field.path, message)`` of FastAPI's validation errors; the leading ``body``
    location is dropped (``body.calls.0.size_bytes`` -> ``calls.0.size_bytes``) so that the
    paths read like the service's own messages (``gpus: GPU 200 does not exist``).

    >>> _field_errors([{"loc": ["query", "src"], "msg": "Input should be >= 0"}])
    [('query.src', 'Input should be >= 0')]
    >>> _field_errors("operators only")
    []
    """
    if not isinstance(detail, list):
        return []
    out: list[tuple[str, str]] = []
    for item in detail:
        if not isinstance(item, Mapping):
            out.append(("", str(item)))
            continue
        loc = [str(x) for x in item.get("loc", [])]
        if loc and loc[0] == "body":
            loc = loc[1:]
        out.append((".".join(loc), str(item.get("msg", ""))))
    return out


def shown_url(url: str) -> str:
    """``url`` as messages and logs show it: without a password it may carry.

    >>> shown_url("http://ops:hunter2@10.0.0.1:8765/x"), shown_url("http://127.0.0.1:8765")
    ('http://ops:***@10.0.0.1:8765/x', 'http://127.0.0.1:8765')
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    user = parts.username or ""
    return url.replace(f"{user}:{password}@", f"{user}:***@", 1)


def _check_token(token: str) -> None:
    """Refuse a token an HTTP header cannot carry (a space, a control or non-ASCII
    character), saying where but never what it is: it would otherwise fail at the first
    request with the header, token and all, in the message.

    >>> _check_token("s3cret acme")
    Traceback (most recent call last):
    ...
    fabricpilot.client.FabricpilotClientError: the fabricpilot token (FABRICPILOT_TOKEN) \
cannot be sent: character 7 of 11 is a space (a bearer token is printable ASCII)
    """
    for i, ch in enumerate(token):
        if not 33 <= ord(ch) <= 126:
            what = ("a space" if ch.isspace() else "not ASCII" if ord(ch) > 127
                    else "a control character")
            raise FabricpilotClientError(
                f"the fabricpilot token ({TOKEN_ENV}) cannot be sent: character {i + 1} of "
                f"{len(token)} is {what} (a bearer token is printable ASCII)")


class Client:
    """A client of one controller service.

    ``base_url``: the service's address (default: ``$FABRICPILOT_URL``, else
    ``http://127.0.0.1:8765``); ``token``: the bearer token (default:
    ``$FABRICPILOT_TOKEN``; ``/health`` and ``/metrics`` need none); ``timeout_s``: per
    request (default: ``$FABRICPILOT_TIMEOUT_S``, else 30; an announced call waits for the
    plan that includes it, so keep it above a plan's time); ``get_retries``: how often a
    ``GET`` that failed to connect is sent again, waiting ``backoff_s``, then twice that,
    ... (capped at ``max_backoff_s``);
    ``transport``: an ``httpx`` transport (tests).

    Use it as a context manager, or call :meth:`close`:

    >>> with Client("http://127.0.0.1:8765", token="t0k3n") as fp:  # doctest: +SKIP
    ...     fp.health()["status"]
    'ok'
    """

    def __init__(self, base_url: str | None = None, token: str | None = None, *,
                 timeout_s: float | None = None, get_retries: int = 3, backoff_s: float = 0.2,
                 max_backoff_s: float = 2.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        if get_retries < 0:
            raise ValueError(f"get_retries must be >= 0, got {get_retries}")
        if timeout_s is None:
            raw = os.environ.get(TIMEOUT_ENV, "").strip()
            try:
                timeout_s = float(raw) if raw else 30.0
            except ValueError:
                raise FabricpilotClientError(f"{TIMEOUT_ENV}={raw!r}: not a number of "
                                             f"seconds") from None
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be > 0 and finite, got {timeout_s}")
        self.base_url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        shown = shown_url(self.base_url)
        try:  # (a malformed URL is one clear error, not httpx's own)
            scheme = httpx.URL(self.base_url).scheme
        except (httpx.InvalidURL, ValueError, TypeError) as err:
            raise FabricpilotClientError(
                f"the fabricpilot controller URL {shown!r} is not valid "
                f"({str(err).replace(self.base_url, shown)}; set {URL_ENV}, e.g. "
                f"{DEFAULT_URL})") from None
        if scheme not in ("http", "https"):
            raise FabricpilotClientError(
                f"the fabricpilot controller URL {shown!r} is not an http(s) URL "
                f"(set {URL_ENV}, e.g. {DEFAULT_URL})")
        # (read from a secret file, a token often ends in a newline: never part of it)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.token = token.strip() or None if token is not None else None
        if self.token is not None:
            _check_token(self.token)
        self.timeout_s = timeout_s
        self.get_retries = get_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        headers = {"Accept": "application/json", "User-Agent": "fabricpilot-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s,
                                  transport=transport)

    # ------------------------------------------------------------ plumbing
    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __repr__(self) -> str:
        return f"Client({shown_url(self.base_url)!r}, token={'set' if self.token else None})"

    def _request(self, method: str, path: str, *, json: Any = None,
                 params: Mapping[str, Any] | None = None) -> _Answer:
        """Send one request; retry a GET whose connection failed; raise on errors (an error
        status, a redirect, an answer that is not JSON where JSON is read, a body that
        cannot be JSON: NaN)."""
        query = {k: v for k, v in (params or {}).items() if v is not None} or None
        content, headers = None, None
        if json is not None:  # (encoded here: NaN and infinities are not JSON)
            try:
                content = _json.dumps(json, allow_nan=False).encode()
            except (ValueError, TypeError) as err:
                raise FabricpilotClientError(f"{method} {path}: the request body cannot be "
                                             f"sent as JSON ({err})") from None
            headers = {"Content-Type": "application/json"}
        attempts = 1 + (self.get_retries if method == "GET" else 0)
        delay_s = self.backoff_s
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, content=content, headers=headers,
                                              params=query)
                break
            except _RETRYABLE as err:
                if attempt + 1 >= attempts:
                    raise self._unreachable(method, path, err, attempts) from err
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, self.max_backoff_s)
            except httpx.TransportError as err:
                raise self._unreachable(method, path, err, attempt + 1) from err
        if response.status_code >= 400:
            raise FabricpilotAPIError(response.status_code, _detail(response), method=method,
                                      url=path)
        if response.status_code >= 300:  # (the API does not redirect: a wrong path or proxy)
            raise FabricpilotAPIError(
                response.status_code, f"unexpected redirect to "
                f"{response.headers.get('location', '?')}", method=method, url=path)
        return _Answer(response, method, path)

    def _unreachable(self, method: str, path: str, err: Exception,
                     attempts: int) -> FabricpilotConnectionError:
        what = type(err).__name__
        text = " ".join(str(err).replace(self.base_url, shown_url(self.base_url)).split()) \
            or what
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        if isinstance(err, httpx.ReadTimeout | httpx.WriteTimeout):
            # connected, but the answer did not come in time: the controller is busy or hung
            return FabricpilotConnectionError(
                f"the fabricpilot controller at {shown_url(self.base_url)} did not answer within "
                f"{self.timeout_s:g} s ({method} {path}): {what}")
        return FabricpilotConnectionError(
            f"cannot reach the fabricpilot controller at {shown_url(self.base_url)}{tries} "
            f"({method} {path}): {what}: {text}")

    def _get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params).json()

    @staticmethod
    def _job_path(task_id: str) -> str:
        if task_id in ("", ".", ".."):  # (the path would name another resource)
            raise FabricpilotClientError(f"task id {task_id!r}: not a job's id")
        return f"{API_PREFIX}/jobs/{quote(task_id, safe='')}"

    # ------------------------------------------------------------ service
    def health(self) -> JSONDict:
        """``GET /health``: ``status`` (``ok`` / ``degraded``), ``uptime_s``, ``jobs``,
        ``plan_epoch``, ``twin``, ``restored``, ``store`` (no token needed).

        >>> Client().health()["status"]  # doctest: +SKIP
        'ok'
        """
        result: JSONDict = self._get("/health")
        return result

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition (no token needed)."""
        return self._request("GET", "/metrics").text

    # ------------------------------------------------------------ jobs
    @staticmethod
    def _intent(task_id: str, gpus: Sequence[int], calls: Sequence[CallSpec | Mapping[str, Any]],
                tenant: str | None, opt_in: bool) -> JSONDict:
        body: JSONDict = {"task_id": task_id, "gpus": [int(g) for g in gpus],
                          "calls": [_call_body(c) for c in calls], "opt_in": opt_in}
        if tenant is not None:
            body["tenant"] = tenant
        return body

    def declare_job(self, task_id: str, gpus: Sequence[int],
                    calls: Sequence[CallSpec | Mapping[str, Any]], *, tenant: str | None = None,
                    opt_in: bool = True) -> JSONDict:
        """``POST /api/v1/jobs``: declare a job's intent (its GPU ids and the communication
        calls it makes); 409 if ``task_id`` exists (:meth:`update_job` replaces). ``tenant``:
        operators only (a tenant token declares for its own tenant). Returns the job:
        ``task_id``, ``tenant``, ``gpus``, ``calls``, ``sla_level``, ``sla_met`` (``None``
        until a plan has checked the intent, and for a job that did not opt in),
        ``path_sets`` (installed), ``planned`` (a plan has run since the job last changed,
        whether or not it gave the job paths), ...

        >>> fp.declare_job("llm", [0, 1, 8, 9], [{"pattern": "allreduce",  # doctest: +SKIP
        ...                "size_bytes": 64 << 20, "sla_us": 500}])["planned"]
        False
        """
        result: JSONDict = self._request(
            "POST", f"{API_PREFIX}/jobs",
            json=self._intent(task_id, gpus, calls, tenant, opt_in)).json()
        return result

    def update_job(self, task_id: str, gpus: Sequence[int],
                   calls: Sequence[CallSpec | Mapping[str, Any]], *, tenant: str | None = None,
                   opt_in: bool = True) -> JSONDict:
        """``PUT /api/v1/jobs/{task_id}``: declare the job, or replace its intent if it
        exists (same arguments and result as :meth:`declare_job`)."""
        result: JSONDict = self._request(
            "PUT", self._job_path(task_id),
            json=self._intent(task_id, gpus, calls, tenant, opt_in)).json()
        return result

    def list_jobs(self) -> list[JSONDict]:
        """``GET /api/v1/jobs``: the caller's jobs (every job for an operator), by task id."""
        result: list[JSONDict] = self._get(f"{API_PREFIX}/jobs")
        return result

    def get_job(self, task_id: str) -> JSONDict:
        """``GET /api/v1/jobs/{task_id}`` (404 if unknown, 403 if another tenant's).

        >>> fp.get_job("llm")["gpus"]  # doctest: +SKIP
        [0, 1, 8, 9]
        """
        result: JSONDict = self._get(self._job_path(task_id))
        return result

    def withdraw_job(self, task_id: str) -> None:
        """``DELETE /api/v1/jobs/{task_id}``: withdraw the job and its paths."""
        self._request("DELETE", self._job_path(task_id))

    def announce(self, task_id: str, pattern: Pattern, size_bytes: int, ranks: Sequence[int],
                 *, sla_us: float | None = None, period_ns: int = 0,
                 bucket: int | None = None, algorithm: str = "") -> JSONDict:
        """``POST /api/v1/jobs/{task_id}/calls``: announce a call at run time ("an
        AllReduce of ``size_bytes`` among these GPU ids, SLA ``sla_us``"; ``bucket``: e.g.
        a DDP gradient bucket index). The service adds it to the job's intent (replacing an
        announced call of the same pattern over the same ranks), waits for the plan and
        answers with the decision: ``sla_us``, ``sla_level``, ``sla_met``, ``sla_problem``,
        ``planned`` (``False``: the plan did not come in time, ``sla_met`` is ``None``),
        ``changed_intent`` and ``pairs`` -- one per GPU pair the pattern uses (for a ring
        collective ``ranks[i] -> ranks[i + 1]``, or, over GPUs spread evenly on multi-GPU
        hosts, a ring on each host and one along each rail, as NCCL runs it; with
        ``algorithm="tree"``, an AllReduce's double binary trees along the rails), each with
        ``src``, ``dst``, ``planned`` and ``paths`` (``links``, ``nodes``, ``share``,
        ``source_port``, ``pinned_rules``).

        >>> d = fp.announce("llm", "allreduce", 25 << 20, [0, 1, 8, 9])  # doctest: +SKIP
        >>> [(p["src"], p["dst"]) for p in d["pairs"]]  # (8 GPUs per host)  # doctest: +SKIP
        [(0, 1), (1, 0), (8, 9), (9, 8), (0, 8), (1, 9), (8, 0), (9, 1)]
        """
        body: JSONDict = {"pattern": pattern, "size_bytes": int(size_bytes),
                          "ranks": [int(r) for r in ranks], "period_ns": int(period_ns)}
        if sla_us is not None:
            body["sla_us"] = float(sla_us)
        if bucket is not None:
            body["bucket"] = int(bucket)
        if algorithm:
            body["algorithm"] = algorithm
        result: JSONDict = self._request("POST", f"{self._job_path(task_id)}/calls",
                                         json=body).json()
        return result

    def calls(self, task_id: str, *, limit: int | None = None) -> list[JSONDict]:
        """``GET /api/v1/jobs/{task_id}/calls``: the calls announced for the job (``pattern``,
        ``size_bytes``, ``ranks``, ``sla_us``, ``bucket``, ``at_s``), at most ``limit``."""
        result: list[JSONDict] = self._get(f"{self._job_path(task_id)}/calls", limit=limit)
        return result

    def paths(self, task_id: str, *, src: int | None = None,
              dst: int | None = None) -> JSONDict:
        """``GET /api/v1/jobs/{task_id}/paths``: the job's installed path sets
        (``plan_epoch`` and ``pairs``, shaped like :meth:`announce`'s), optionally only those
        from GPU ``src`` and / or to GPU ``dst``."""
        result: JSONDict = self._get(f"{self._job_path(task_id)}/paths", src=src, dst=dst)
        return result

    # ------------------------------------------------------------ fabric
    def post_telemetry(self, deltas: Sequence[PortDeltaSpec | Mapping[str, Any]], *,
                       switch: str | None = None) -> int:
        """``POST /api/v1/telemetry`` (operators): port counter deltas, folded into the
        congestion map at the next control period. Returns how many were accepted.

        >>> fp.post_telemetry([{"link_id": 0, "interval_ns": 1_000_000,  # doctest: +SKIP
        ...                     "tx_bytes": 45_000_000}])
        1
        """
        body: JSONDict = {"deltas": [dict(d) for d in deltas]}
        if switch is not None:
            body["switch"] = switch
        return int(self._request("POST", f"{API_PREFIX}/telemetry", json=body).json()["accepted"])

    def tick(self) -> JSONDict:
        """``POST /api/v1/control/tick`` (operators): run one control period now; returns
        ``replanned``, ``plan_epoch`` and the links its telemetry showed ``links_down``,
        ``links_up``, ``links_gray`` and ``links_clear`` (gray ones restored)."""
        result: JSONDict = self._request("POST", f"{API_PREFIX}/control/tick").json()
        return result

    def twin_fault_drill(self, events: list[JSONDict]) -> list[JSONDict]:
        """``POST /api/v1/twin/faults`` (operators): the twin plays these fault ``events``
        (as a scenario's ``faults.events``, times counted from now; what is left of them at
        the end of its run goes on in the next); the controller learns of them from
        telemetry. Returns each fault's ``id`` (in the current run), ``label`` and ``at_ms``
        (fabric time).

        >>> # Client(url, token).twin_fault_drill(
        >>> #     [{"kind": "link_down", "link": "leaf0-spine1", "at_ns": 0, "until_ns": "2ms"}])
        """
        result: list[JSONDict] = self._request(
            "POST", f"{API_PREFIX}/twin/faults", json={"events": events}).json()["faults"]
        return result

    def report_fault(self, kind: FaultKind, *, link_id: int | None = None,
                     endpoints: tuple[str, str] | None = None, detail: str = "") -> JSONDict:
        """``POST /api/v1/faults`` (operators): link ``link_id`` (or the link between the two
        ``endpoints`` node names) went ``down``, came back ``up`` or is ``gray``. Returns
        ``id``, ``link_id``, ``affected_path_sets``, ``installed_path_sets``, ``replan_ms``
        (the controller's whole reaction), ``sent_ms`` (until the new paths were sent: the
        records follow), ``partitioned``."""
        body: JSONDict = {"kind": kind, "detail": detail}
        if link_id is not None:
            body["link_id"] = int(link_id)
        if endpoints is not None:
            body["endpoints"] = list(endpoints)
        result: JSONDict = self._request("POST", f"{API_PREFIX}/faults", json=body).json()
        return result

    def faults(self, *, limit: int | None = None) -> list[JSONDict]:
        """``GET /api/v1/faults``: the reported faults, at most ``limit``."""
        result: list[JSONDict] = self._get(f"{API_PREFIX}/faults", limit=limit)
        return result

    def fabric(self) -> JSONDict:
        """``GET /api/v1/fabric``: the topology (``nodes``, ``links``, ``gpus``)."""
        result: JSONDict = self._get(f"{API_PREFIX}/fabric")
        return result

    def congestion(self) -> list[JSONDict]:
        """``GET /api/v1/congestion``: every link's smoothed state (``utilization``,
        ``queue_bytes``, ``drop_rate``, ..., ``weight``, ``down``, ``gray``, ``hot``)."""
        result: list[JSONDict] = self._get(f"{API_PREFIX}/congestion")
        return result

    def link(self, link_id: int) -> JSONDict:
        """``GET /api/v1/fabric/links/{link_id}`` (operators): one link's state and the jobs
        the installed plan puts on it (``jobs``: ``task_id``, ``tenant``, ``pairs``,
        ``planned_gbps``, heaviest first)."""
        result: JSONDict = self._get(f"{API_PREFIX}/fabric/links/{int(link_id)}")
        return result

    def events(self) -> list[JSONDict]:
        """``GET /api/v1/events``: recent reroutes, heals and faults, newest last."""
        result: list[JSONDict] = self._get(f"{API_PREFIX}/events")
        return result


class _Answer:
    """A successful response: its ``text``, and its ``json()`` as a
    :class:`FabricpilotAPIError` when it is not JSON (a proxy's page, say)."""

    __slots__ = ("_method", "_path", "_response")

    def __init__(self, response: httpx.Response, method: str, path: str) -> None:
        self._response, self._method, self._path = response, method, path

    @property
    def text(self) -> str:
        return self._response.text

    def json(self) -> Any:
        try:
            return self._response.json()
        except ValueError:
            head = " ".join(self._response.text.split())[:80]
            raise FabricpilotAPIError(self._response.status_code,
                                      f"the answer is not JSON: {head!r}",
                                      method=self._method, url=self._path) from None


def _call_body(call: CallSpec | Mapping[str, Any]) -> JSONDict:
    body = dict(call)
    if "pairs" in body:
        body["pairs"] = [[int(a), int(b)] for a, b in body["pairs"]]
    return body


def _detail(response: httpx.Response) -> Any:
    """The ``detail`` of an error response (its text when it is not FastAPI's JSON)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, Mapping) and "detail" in body:
        return body["detail"]
    return body
