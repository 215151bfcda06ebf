"""The southbound interface over HTTP: a data plane in its own process.

:func:`dataplane_app` serves any :class:`~fabricpilot.controller.southbound.DataPlane` (here:
the twin, ``fabricpilot twin``) under ``/southbound/v1``; :class:`RemoteDataPlane` is the
controller's side, a ``DataPlane`` that calls it. With the two in separate processes the
data plane outlives its controller: when the controller dies the switches keep forwarding on
the rules they hold (fail-static) and route flows without a rule by their local adaptive
routing; a restarted controller reads the rules back (:meth:`RemoteDataPlane.rules`) and
sends only what differs.

The wire format is JSON of the southbound dataclasses (:func:`view_to_dict`,
:func:`pathset_to_dict`, ...), so a switch agent in any language can speak it.

>>> from fabricpilot.controller.southbound import LinkInfo
>>> v = FabricView.from_links([LinkInfo(0, "gpu0", "leaf0", 400, 100, "nic")],
...                           {"gpu0": "gpu", "leaf0": "switch"}, {"leaf0": 1}, {0: "gpu0"})
>>> w = view_from_dict(view_to_dict(v))
>>> w.links == v.links and w.gpu_node == v.gpu_node and w.graph.nodes["leaf0"]["tier"]
1
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from dataclasses import asdict
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request

from fabricpilot.controller.southbound import (
    DataPlane,
    EcmpSpec,
    FabricView,
    LinkInfo,
    PathSet,
    PortDelta,
)
from fabricpilot.errors import FabricpilotError

PREFIX = "/southbound/v1"

log = logging.getLogger("fabricpilot.service")


class SouthboundError(FabricpilotError):
    """The data plane cannot be reached or refused a request."""


# ---------------------------------------------------------------- wire format
def view_to_dict(v: FabricView) -> dict[str, Any]:
    nodes = {n: {"kind": d.get("kind", "switch"), "tier": d.get("tier", 0)}
             for n, d in v.graph.nodes(data=True)}
    e = v.ecmp
    return {"nodes": nodes, "links": [asdict(li) for li in v.links.values()],
            "gpu_node": {str(g): n for g, n in v.gpu_node.items()},
            "rule_capacity": v.rule_capacity, "switch_latency_ns": v.switch_latency_ns,
            "ecmp": None if e is None else {
                "base_seed": e.base_seed, "per_switch_seed": e.per_switch_seed,
                "source_port_entropy": e.source_port_entropy, "switch_index": e.switch_index,
                "groups": [[sw, leaf, list(m)] for (sw, leaf), m in e.groups.items()],
                "gpu_leaf": {str(g): leaf for g, leaf in e.gpu_leaf.items()}}}


def view_from_dict(d: dict[str, Any]) -> FabricView:
    e = d.get("ecmp")
    ecmp = None if e is None else EcmpSpec(
        int(e["base_seed"]), bool(e["per_switch_seed"]), bool(e["source_port_entropy"]),
        {k: int(x) for k, x in e["switch_index"].items()},
        {(sw, leaf): tuple(int(x) for x in m) for sw, leaf, m in e["groups"]},
        {int(g): leaf for g, leaf in e["gpu_leaf"].items()})
    nodes = d["nodes"]
    return FabricView.from_links(
        [LinkInfo(**li) for li in d["links"]], {n: x["kind"] for n, x in nodes.items()},
        {n: int(x["tier"]) for n, x in nodes.items()},
        {int(g): n for g, n in d["gpu_node"].items()}, ecmp=ecmp,
        rule_capacity=int(d["rule_capacity"]),
        switch_latency_ns=float(d.get("switch_latency_ns", 600.0)))


def pathset_to_dict(ps: PathSet) -> dict[str, Any]:
    """A path set as JSON (no rate cap: ``rate_cap_gbps`` null)."""
    return {"key": ps.key, "paths": [list(p) for p in ps.paths], "weights": list(ps.weights),
            "ports": list(ps.ports), "rules": [[list(r) for r in rs] for rs in ps.rules],
            "rate_cap_gbps": ps.rate_cap_gbps if math.isfinite(ps.rate_cap_gbps) else None}


def pathset_from_dict(d: dict[str, Any]) -> PathSet:
    """:func:`pathset_to_dict` read back (``rate_cap_gbps`` may be absent: no cap)."""
    cap = d.get("rate_cap_gbps")
    return PathSet(d["key"], tuple(tuple(int(x) for x in p) for p in d["paths"]),
                   tuple(float(w) for w in d["weights"]), tuple(int(p) for p in d["ports"]),
                   tuple(tuple((str(sw), int(lk)) for sw, lk in rs) for rs in d["rules"]),
                   math.inf if cap is None else float(cap))


_WIRE_FIELDS = frozenset(("key", "paths", "weights", "ports", "rules", "rate_cap_gbps"))


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def pathset_from_wire(d: object, view: FabricView) -> PathSet:
    """A path set sent over the wire, checked against the fabric ``view``: a
    :class:`ValueError` names the first field that is wrong. Every path is a chain of
    existing links (each starts where the one before ends, none twice), with one weight
    each (finite, >= 0, not all 0), a UDP source port each (0-65535) or none, explicit
    ``(switch, link)`` rules per path or none (the switch one of the view's, the link one
    of the path's, leaving that switch), and a rate cap that is absent, null or > 0.

    >>> from fabricpilot.controller.southbound import LinkInfo
    >>> v = FabricView.from_links([LinkInfo(0, "gpu0", "leaf0", 400, 100, "nic"),
    ...                            LinkInfo(1, "leaf0", "gpu1", 400, 100, "nic")],
    ...                           {"gpu0": "gpu", "gpu1": "gpu", "leaf0": "switch"},
    ...                           {"leaf0": 1}, {0: "gpu0", 1: "gpu1"})
    >>> pathset_from_wire({"key": "j:0->1", "paths": [[0, 1]], "weights": [1]}, v).paths
    ((0, 1),)
    >>> pathset_from_wire({"key": "j:0->1", "paths": [[1, 0]], "weights": [1]}, v)
    Traceback (most recent call last):
    ValueError: paths[0][1]: link 0 starts at gpu0, not at gpu1 where link 1 ends
    """
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {type(d).__name__}")
    extra = sorted(set(d) - _WIRE_FIELDS)
    if extra:
        raise ValueError(f"{extra[0]}: unknown field (fields: {', '.join(sorted(_WIRE_FIELDS))})")
    for name in ("key", "paths", "weights"):
        if name not in d:
            raise ValueError(f"{name}: missing")
    key = d["key"]
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: expected a non-empty string, got {key!r:.40}")
    paths, links = d["paths"], view.links
    if not isinstance(paths, list) or not paths:
        raise ValueError("paths: expected a non-empty list of paths (lists of link ids)")
    for i, p in enumerate(paths):
        if not isinstance(p, list) or not p:
            raise ValueError(f"paths[{i}]: expected a non-empty list of link ids")
        for j, lk in enumerate(p):
            if not _is_int(lk):
                raise ValueError(f"paths[{i}][{j}]: {lk!r:.40} is not a link id")
            if lk not in links:
                raise ValueError(f"paths[{i}][{j}]: link {lk} does not exist")
            if j and links[lk].src != links[p[j - 1]].dst:
                raise ValueError(f"paths[{i}][{j}]: link {lk} starts at {links[lk].src}, "
                                 f"not at {links[p[j - 1]].dst} where link {p[j - 1]} ends")
        if len(set(p)) < len(p):
            raise ValueError(f"paths[{i}]: a link appears twice")
    n = len(paths)
    weights = d["weights"]
    if not isinstance(weights, list) or len(weights) != n:
        raise ValueError(f"weights: expected a list of {n} numbers (one per path)")
    for i, w in enumerate(weights):
        if not _is_number(w) or not 0 <= w < math.inf:
            raise ValueError(f"weights[{i}]: a weight is a finite number >= 0, got {w!r:.40}")
    if not sum(weights) > 0:
        raise ValueError("weights: all 0 (no path would carry the traffic)")
    ports = d.get("ports", [])
    if not isinstance(ports, list) or len(ports) not in (0, n):
        raise ValueError(f"ports: expected a list of {n} UDP source ports (one per path) "
                         "or an empty one")
    for i, port in enumerate(ports):
        if not _is_int(port) or not 0 <= port <= 65535:
            raise ValueError(f"ports[{i}]: {port!r:.40} is not a UDP port (0-65535)")
    rules = d.get("rules", [])
    if not isinstance(rules, list) or len(rules) not in (0, n):
        raise ValueError(f"rules: expected a list of {n} lists of [switch, link] rules "
                         "(one per path) or an empty one")
    nodes = view.graph.nodes
    for i, rs in enumerate(rules):
        if not isinstance(rs, list):
            raise ValueError(f"rules[{i}]: expected a list of [switch, link] rules")
        for j, r in enumerate(rs):
            where = f"rules[{i}][{j}]"
            if not (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)
                    and _is_int(r[1])):
                raise ValueError(f"{where}: expected [switch, link id], got {r!r:.60}")
            sw, lk = r
            if sw not in nodes or nodes[sw].get("kind", "switch") != "switch":
                raise ValueError(f"{where}: {sw!r:.40} is not a switch")
            if lk not in paths[i]:
                raise ValueError(f"{where}: link {lk} is not on paths[{i}]")
            if links[lk].src != sw:
                raise ValueError(f"{where}: link {lk} leaves {links[lk].src}, not {sw}")
    cap = d.get("rate_cap_gbps")
    if cap is not None and (not _is_number(cap) or not cap > 0):
        raise ValueError(f"rate_cap_gbps: expected null or a rate > 0 (Gb/s), got {cap!r:.40}")
    return pathset_from_dict({**d, "ports": ports, "rules": rules})


# ---------------------------------------------------------------- the data plane's side
class RuleTable:
    """A data plane plus the table of path sets it holds (what the switches would report)."""

    def __init__(self, dp: DataPlane, lock: threading.RLock) -> None:
        self.dp = dp
        self.lock = lock
        self.rules: dict[str, PathSet] = {}
        self.installs = 0

    def install(self, sets: list[PathSet]) -> None:
        with self.lock:
            self.dp.install(sets)
            for ps in sets:
                self.rules[ps.key] = ps
            self.installs += 1

    def remove(self, keys: list[str]) -> None:
        with self.lock:
            self.dp.remove(keys)
            for k in keys:
                self.rules.pop(k, None)


def dataplane_app(table: RuleTable, *, token: str | None = None,
                  health: Any = None, jobs: Any = None) -> FastAPI:
    """The HTTP southbound of a data plane. ``token``: the bearer token a controller must
    send; ``health()`` and ``jobs()`` (optional) answer ``GET /health`` and ``GET
    .../jobs`` (the intents of the jobs running on it, for the controller to declare)."""
    app = FastAPI(title="fabricpilot data plane (southbound)")
    dp, lock = table.dp, table.lock
    view = dp.fabric()
    view_json = view_to_dict(view)

    def check(request: Request) -> None:
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            raise HTTPException(401, "missing or unknown token")

    @app.get("/health")
    def _health() -> dict[str, Any]:
        out = {"status": "ok", "rules": len(table.rules), "installs": table.installs}
        if health is not None:
            out.update(health())
        return out

    @app.get(f"{PREFIX}/fabric")
    def fabric(request: Request) -> dict[str, Any]:
        check(request)
        return view_json

    @app.get(f"{PREFIX}/jobs")
    def running_jobs(request: Request) -> list[dict[str, Any]]:
        check(request)
        return [] if jobs is None else jobs()

    @app.get(f"{PREFIX}/telemetry")
    def telemetry(request: Request) -> list[dict[str, Any]]:
        """Counter deltas since the last read; with ``?sync=true`` (a controller that has
        just connected) every port's state too, not only the changes."""
        check(request)
        sync = request.query_params.get("sync", "false")
        if sync not in ("true", "false"):
            raise HTTPException(422, f"sync: expected true or false, got {sync!r}")
        with lock:
            if sync == "true" and hasattr(dp, "sync_ports"):
                dp.sync_ports()
            return [asdict(d) for d in dp.telemetry()]

    @app.get(f"{PREFIX}/rules")
    def rules(request: Request) -> list[dict[str, Any]]:
        check(request)
        with lock:
            return [pathset_to_dict(ps) for ps in table.rules.values()]

    async def body(request: Request, kind: type, what: str) -> Any:
        """The request's JSON body, of ``kind`` (list or dict), or a 422 saying it is not
        ``what``."""
        try:
            data = json.loads(await request.body())
        except ValueError:
            raise HTTPException(422, "body: not JSON") from None
        if not isinstance(data, kind):
            raise HTTPException(422, f"body: expected {what}")
        return data

    def link_of(text: str, where: str) -> int:
        try:
            lk = int(text)
        except ValueError:
            raise HTTPException(422, f"{where}: {text!r} is not a link id") from None
        if lk not in view.links:
            raise HTTPException(422, f"{where}: link {lk} does not exist")
        return lk

    @app.post(f"{PREFIX}/rules")
    async def install(request: Request) -> dict[str, Any]:
        check(request)
        sets = []
        for i, d in enumerate(await body(request, list, "a list of path sets")):
            try:
                sets.append(pathset_from_wire(d, view))
            except ValueError as err:
                raise HTTPException(422, f"body[{i}].{err}" if isinstance(d, dict)
                                    else f"body[{i}]: {err}") from None
        try:
            table.install(sets)
        except ValueError as err:  # e.g. a switch's rule table would overflow
            raise HTTPException(409, str(err)) from None
        return {"installed": len(sets)}

    @app.post(f"{PREFIX}/rules/remove")
    async def remove(request: Request) -> dict[str, Any]:
        check(request)
        keys = await body(request, list, "a list of path-set keys (strings)")
        if not all(isinstance(k, str) for k in keys):
            raise HTTPException(422, "body: expected a list of path-set keys (strings)")
        with lock:
            held = [k for k in dict.fromkeys(keys) if k in table.rules]
        table.remove(held)
        return {"removed": len(held)}

    @app.post(f"{PREFIX}/congestion-table")
    async def congestion(request: Request) -> dict[str, Any]:
        check(request)
        weights = {}
        for k, v in (await body(request, dict, "an object link id -> weight")).items():
            lk = link_of(k, "body")
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise HTTPException(422, f"body[{k!r}]: a weight is a number >= 0, got {v!r}")
            weights[lk] = float(v)
        with lock:
            dp.push_congestion_table(weights)
        return {"links": len(weights)}

    @app.post(f"{PREFIX}/qos")
    async def qos(request: Request) -> dict[str, Any]:
        check(request)
        mapping = {}
        for k, v in (await body(request, dict, "an object DSCP -> priority")).items():
            if not (k.isascii() and k.isdigit()) or not 0 <= int(k) <= 63:
                raise HTTPException(422, f"body: {k!r} is not a DSCP value (0-63)")
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 7:
                raise HTTPException(422, f"body[{k!r}]: {v!r} is not a priority (0-7)")
            mapping[int(k)] = v
        with lock:
            dp.set_qos(mapping)
        return {"entries": len(mapping)}

    return app


# ---------------------------------------------------------------- the controller's side
def _first_line(err: Exception) -> str:
    """An error's message without what follows its first line (httpx appends a link to
    the status code's documentation).

    >>> _first_line(ValueError("Client error '404 Not Found'\\nFor more information ..."))
    "Client error '404 Not Found'"
    """
    lines = str(err).splitlines()
    return lines[0] if lines else type(err).__name__


class RemoteDataPlane:
    """A :class:`DataPlane` in another process, reached over HTTP at ``url`` (its base
    address, with or without the ``/southbound/v1`` the twin prints).

    Telemetry that cannot be fetched counts as none (the controller keeps its map); an
    install that fails raises :class:`SouthboundError`, so the controller knows its rules
    did not land."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/").removesuffix(PREFIX)  # (the address the twin prints)
        self.http = httpx.Client(base_url=self.url + PREFIX, headers=headers,
                                 timeout=timeout_s)
        self.telemetry_failures = 0
        self._synced = False  # (the first read asks for every port's state)
        try:
            r = self.http.get("/fabric")
            r.raise_for_status()
        except httpx.HTTPError as err:
            raise SouthboundError(f"{url}: data plane unreachable: {_first_line(err)}"
                                  ) from None
        self.view = view_from_dict(r.json())

    def fabric(self) -> FabricView:
        return self.view

    def telemetry(self) -> list[PortDelta]:
        """Counter deltas since the last read; the first read (the switches may have held
        their state since before this controller started) gives every port's state."""
        try:
            r = self.http.get("/telemetry", params={"sync": "false" if self._synced
                                                    else "true"})
            r.raise_for_status()
        except httpx.HTTPError:
            self.telemetry_failures += 1
            return []
        deltas = [PortDelta(**d) for d in r.json()]
        self._synced = self._synced or bool(deltas)
        return deltas

    def install(self, rules: list[PathSet]) -> None:
        if not rules:
            return
        try:
            r = self.http.post("/rules", json=[pathset_to_dict(ps) for ps in rules])
        except httpx.HTTPError as err:
            raise SouthboundError(f"{self.url}: install failed: {_first_line(err)}") from None
        if r.status_code == 409:
            raise ValueError(r.json().get("detail", "rejected"))
        if r.status_code >= 400:
            raise SouthboundError(f"{self.url}: install refused: {r.status_code} {r.text}")

    def remove(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            r = self.http.post("/rules/remove", json=list(keys))
        except httpx.HTTPError as err:
            raise SouthboundError(f"{self.url}: remove failed: {_first_line(err)}") from None
        if r.status_code >= 400:
            raise SouthboundError(f"{self.url}: remove refused: {r.status_code} {r.text}")

    def rules(self) -> list[PathSet]:
        """The path sets the data plane holds now. One that is not a valid path set on
        this fabric (held from another agent) is left out with a warning: the next plan
        installs its own over it."""
        r = self.http.get("/rules")
        r.raise_for_status()
        held = r.json()
        if not isinstance(held, list):
            raise SouthboundError(f"{self.url}: rules: expected a list of path sets")
        out = []
        for i, d in enumerate(held):
            try:
                out.append(pathset_from_wire(d, self.view))
            except ValueError as err:
                key = d.get("key") if isinstance(d, dict) else None
                log.warning("held path set ignored", extra={"fields": {
                    "index": i, "key": repr(key)[:80], "error": str(err)}})
        return out

    def status(self) -> dict[str, Any]:
        """The data plane's own health report (``{}`` if it cannot be read)."""
        try:
            r = httpx.get(f"{self.url}/health", timeout=2.0)
            return dict(r.json()) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def jobs(self) -> list[dict[str, Any]]:
        """The intents of the jobs running on the data plane (the twin's scenario)."""
        r = self.http.get("/jobs")
        r.raise_for_status()
        return list(r.json())

    def push_congestion_table(self, weights: dict[int, float]) -> None:
        # unreachable: the switches keep their last table; the next period sends it again
        with contextlib.suppress(httpx.HTTPError):
            self.http.post("/congestion-table", json={str(k): v for k, v in weights.items()})

    def set_qos(self, dscp_to_priority: dict[int, int]) -> None:
        self.http.post("/qos", json={str(k): v for k, v in dscp_to_priority.items()})
