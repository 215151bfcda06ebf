"""The dashboard in a real browser: the service runs in-process (twin on, uvicorn on a free
loopback port), headless Chromium loads ``/#token=...`` and we check the rendered DOM (one
SVG element per drawn link, the switches, one table row per job, the fault timeline), a bad
token (401 banner, nothing rendered) and a screenshot (a real, varied PNG).

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``; ``FABRICPILOT_CHROMIUM``
points elsewhere); without it the browser tests fail unless ``FABRICPILOT_SKIP_BROWSER=1``.
``FABRICPILOT_SCREENSHOT=<path>`` keeps a copy of the screenshot.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from conftest import free_port, wait_until
from fabricpilot.scenario import default_scenario
from fabricpilot.service.auth import Principal, TokenRegistry
from fabricpilot.service.server import build

OPS = "dashboard-operator-token-0123456789"
PROBE = "dash-probe"
WINDOW = (1400, 1000)
BACKGROUND = (10, 14, 22)  # the page's --bg
PANEL = (17, 24, 39)       # its cards' --panel
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--virtual-time-budget=6000"]


# ------------------------------------------------------------------ the live service
@dataclass
class Live:
    base: str
    fabric: dict[str, Any]
    jobs: list[str]          # every job id the API lists (the scenario's and the probe)
    twin_jobs: list[str]     # the scenario's jobs
    down_link: int
    gray_link: int



@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tokens = TokenRegistry()
    tokens.add(OPS, Principal("ops", "operator"))
    app, _, _, _ = build(default_scenario(), "default", tmp_path_factory.mktemp("state"),
                         tokens=tokens, twin=True, time_scale=1e-3)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # (bound here: no other test
    sock.bind(("127.0.0.1", 0))                                  # can take the port first)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="dashboard-uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=20,
                          headers={"Authorization": f"Bearer {OPS}"}) as c:
            fabric = c.get("/api/v1/fabric").json()
            twin = c.get("/api/v1/jobs").json()
            used = {g for j in twin for g in j["gpus"]}
            free_all = [g for g in range(fabric["gpus"]) if g not in used]
            free = free_all[:3]
            r = c.post("/api/v1/jobs", json={
                "task_id": PROBE, "tenant": "acme", "gpus": free[:2],
                "calls": [{"pattern": "allreduce", "size_bytes": 1 << 20, "sla_us": 40.0}]})
            assert r.status_code == 201, r.text
            # a second job of the tenant sharing one of the probe's GPUs
            r = c.post("/api/v1/jobs", json={
                "task_id": PROBE + "-b", "tenant": "acme", "gpus": [free[0], free[2]],
                "calls": [{"pattern": "alltoall", "size_bytes": 1 << 20, "sla_us": 500.0}]})
            assert r.status_code == 201, r.text
            # an L1 job on two hosts of two leaves: no path meets its SLA (one switch), the
            # plan keeps room for it
            def ends(kind: str) -> dict[int, str]:
                return {int(lk["src"][3:]): lk["dst"] for lk in fabric["links"]
                        if lk["kind"] == kind and lk["src"].startswith("gpu")}

            leaf, host = ends("nic"), ends("nvlink")
            a = free_all[3]
            far = [a, next(g for g in free_all[4:] if leaf[g] != leaf[a]
                           and host.get(g, g) != host.get(a, a))]
            r = c.post("/api/v1/jobs", json={
                "task_id": PROBE + "-far", "tenant": "acme", "gpus": far,
                "calls": [{"pattern": "allreduce", "size_bytes": 1 << 20, "sla_us": 40.0}]})
            assert r.status_code == 201, r.text
            # a down and a gray leaf-spine link, so the timeline and the markers have content
            uplinks = [lk for lk in fabric["links"] if lk["kind"] == "fabric"]
            down = uplinks[0]
            gray = next(lk for lk in uplinks if not {lk["src"], lk["dst"]} & {down["src"],
                                                                            down["dst"]})
            for kind, lk in (("down", down), ("gray", gray)):
                r = c.post("/api/v1/faults", json={"kind": kind, "link_id": lk["id"],
                                                   "detail": f"dashboard test {kind}"})
                assert r.status_code == 201, r.text
            jobs = [j["task_id"] for j in c.get("/api/v1/jobs").json()]
        yield Live(base, fabric, jobs, [j["task_id"] for j in twin], down["id"], gray["id"])
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"


# ------------------------------------------------------------------ the browser
def _chromium() -> str:
    path = os.environ.get("FABRICPILOT_CHROMIUM", "/usr/bin/chromium")
    if Path(path).exists() or shutil.which(path):
        return path
    if os.environ.get("FABRICPILOT_SKIP_BROWSER") == "1":
        pytest.skip(f"{path} not found and FABRICPILOT_SKIP_BROWSER=1")
    pytest.fail(f"{path} not found: install it (apt-get install -y chromium), point "
                f"FABRICPILOT_CHROMIUM at a Chromium, or set FABRICPILOT_SKIP_BROWSER=1",
                pytrace=False)


@dataclass
class Pages:
    dom: str            # --dump-dom of /#token=<operator>
    bad_dom: str        # --dump-dom of /#token=<unknown>
    inspect_dom: str    # --dump-dom of /#token=<operator>&link=<the down link>
    png: bytes          # --screenshot of /#token=<operator>
    seconds: float


@pytest.fixture(scope="module")
def pages(live: Live, tmp_path_factory: pytest.TempPathFactory) -> Pages:
    """The three Chromium runs, concurrently (each with its own profile)."""
    exe = _chromium()
    tmp = tmp_path_factory.mktemp("chromium")
    shot = tmp / "dashboard.png"
    runs = {
        "dom": ["--dump-dom", f"{live.base}/#token={OPS}"],
        "bad": ["--dump-dom", f"{live.base}/#token=not-a-known-token-000000"],
        "inspect": ["--dump-dom", f"{live.base}/#token={OPS}&link={live.down_link}"],
        "shot": [f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 f"{live.base}/#token={OPS}"],
    }
    t0 = time.monotonic()
    procs = {name: subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / ('profile-' + name)}", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
        for name, args in runs.items()}
    out: dict[str, str] = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"chromium ({name}) did not finish within 90 s")
        assert p.returncode == 0, f"chromium ({name}) exited {p.returncode}: {stderr[-2000:]}"
        out[name] = stdout
    assert shot.exists(), "chromium wrote no screenshot"
    png = shot.read_bytes()
    keep = os.environ.get("FABRICPILOT_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(png)
    return Pages(out["dom"], out["bad"], out["inspect"], png, time.monotonic() - t0)


class _Elements(HTMLParser):
    """Every start tag's attributes, and the text under a few ids of interest."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        if tag not in ("br", "input", "img", "meta", "link", "hr", "col", "wbr"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in self._open:
            if ident:
                self.text.setdefault(ident, []).append(data)

    def with_attr(self, name: str) -> list[tuple[str, dict[str, str]]]:
        return [(t, a) for t, a in self.elements if name in a]

    def by_id(self, ident: str) -> tuple[str, dict[str, str]] | None:
        return next(((t, a) for t, a in self.elements if a.get("id") == ident), None)


def _parse(dom: str) -> _Elements:
    p = _Elements()
    p.feed(dom)
    return p


# ------------------------------------------------------------------ the page itself
def test_page_is_self_contained(live: Live) -> None:
    r = httpx.get(live.base + "/", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    page = r.text
    for needle in ("<link ", "<script src", "@import", "url(http", "//cdn", "https://"):
        assert needle not in page, f"external reference {needle!r} in the dashboard"
    external = {u for u in page.split('"') if u.startswith("http://")}
    assert external <= {"http://www.w3.org/2000/svg"}, external


# ------------------------------------------------------------------ the rendered DOM
def test_dashboard_renders_fabric_jobs_and_events(live: Live, pages: Pages) -> None:
    doc = _parse(pages.dom)
    body = next(a for t, a in doc.elements if t == "body")
    assert body.get("data-ready") == "1", f"first render never completed: {body}"
    assert OPS not in pages.dom, "the token leaked into the page"

    # the fabric: one element per non-NVLink link, the switches of every tier
    svg = doc.by_id("fabric")
    assert svg is not None and svg[0] == "svg"
    drawn = [lk for lk in live.fabric["links"] if lk["kind"] != "nvlink"]
    link_els = doc.with_attr("data-link-id")
    ids = [int(a["data-link-id"]) for _, a in link_els]
    assert len(ids) >= len(drawn)
    assert {lk["id"] for lk in drawn} <= set(ids)
    assert all(a.get("stroke", "").startswith("rgb(") for _, a in link_els), "links not coloured"
    nodes = {a["data-node"] for _, a in doc.with_attr("data-node")}
    switches = [n for n in live.fabric["nodes"] if n["kind"] == "switch"]
    top = max(n["tier"] for n in switches)
    spine = next(n["id"] for n in switches if n["tier"] == top)
    assert spine in nodes
    assert {n["id"] for n in switches} <= nodes

    # the faults: the down link drawn down and crossed, the gray one marked
    state = {int(a["data-link-id"]): a for _, a in link_els}
    assert state[live.down_link].get("data-state") == "down"
    assert "down" in state[live.down_link].get("class", "").split()
    assert "gray" in state[live.gray_link].get("class", "").split()
    marks = {(a["data-mark"], int(a["data-for"])) for _, a in doc.with_attr("data-mark")}
    assert ("down", live.down_link) in marks and ("gray", live.gray_link) in marks

    # the jobs table: a row per job, the probe included
    table = doc.by_id("jobs")
    assert table is not None and table[0] == "table"
    rows = [a["data-job"] for t, a in doc.with_attr("data-job") if t == "tr"]
    assert PROBE in rows
    assert set(live.twin_jobs) <= set(rows) and live.twin_jobs
    assert set(rows) == set(live.jobs)
    jobs_text = " ".join(doc.text.get("jobs", []))
    assert "acme" in jobs_text and "L1" in jobs_text
    assert "room kept for 2 pairs" in jobs_text  # (the far probe's ring: both ways)
    # the GPUs in use: each once, however many jobs share it (the probes share one)
    listed = httpx.get(live.base + "/api/v1/jobs", headers={"Authorization": f"Bearer {OPS}"},
                       timeout=10).json()
    in_use = len({g for j in listed for g in j["gpus"]})
    assert " ".join(doc.text.get("jobs-sub", [])).strip() == (
        f"{len(listed)} jobs · {in_use} GPUs in use")

    # the timeline: both faults, newest first
    events = doc.by_id("events")
    assert events is not None
    kinds = [a["data-kind"] for t, a in doc.with_attr("data-kind") if t == "li"]
    assert "down" in kinds and "gray" in kinds
    ats = [float(a["data-at"]) for t, a in doc.with_attr("data-at") if t == "li"]
    assert ats == sorted(ats, reverse=True)
    assert "dashboard test down" in " ".join(doc.text.get("events", []))

    # the header
    assert " ".join(doc.text.get("status", [])).strip() == "ok"
    assert " ".join(doc.text.get("h-epoch", [])).strip().isdigit()
    assert "updated" in " ".join(doc.text.get("updated-text", []))


def test_the_link_inspector_shows_who_is_on_a_link(live: Live, pages: Pages) -> None:
    """Opened as ``/#link=ID`` (what a click on a link does), the page shows both directions
    of that cable as the operators' link resource reports them: the direction reported
    down carries no planned traffic (its pairs were moved), and every job listed is one the
    service runs."""
    doc = _parse(pages.inspect_dom)
    assert OPS not in pages.inspect_dom, "the token leaked into the page"
    card = doc.by_id("inspector")
    assert card is not None and "hidden" not in card[1], "the inspector is not shown"
    down = next(lk for lk in live.fabric["links"] if lk["id"] == live.down_link)
    back = next(lk["id"] for lk in live.fabric["links"]
                if (lk["src"], lk["dst"]) == (down["dst"], down["src"]))
    dirs = {int(a["data-insp-link"]) for _, a in doc.with_attr("data-insp-link")}
    assert dirs == {live.down_link, back}
    title = " ".join(doc.text.get("insp-title", []))
    assert down["src"] in title and down["dst"] in title
    body = " ".join(doc.text.get("insp-body", []))
    assert "DOWN" in body and "No planned traffic" in body
    listed = {a["data-insp-job"] for _, a in doc.with_attr("data-insp-job")}
    assert listed <= set(live.jobs)
    sel = {int(a["data-link-id"]) for _, a in doc.with_attr("data-link-id")
           if "sel" in a.get("class", "").split()}
    assert sel == {live.down_link, back}  # (drawn selected)
    drill = doc.by_id("insp-drill")  # (a drill of the cable in the twin, for operators)
    assert drill is not None and drill[0] == "button"


def test_dashboard_asks_for_a_token_on_401(pages: Pages) -> None:
    doc = _parse(pages.bad_dom)
    body = next(a for t, a in doc.elements if t == "body")
    assert body.get("data-ready") == "0"
    assert "401" in " ".join(doc.text.get("banner", []))
    form = doc.by_id("token-form")
    assert form is not None and "show" in form[1].get("class", "").split()
    assert not [a for t, a in doc.with_attr("data-job") if t == "tr"]
    assert not doc.with_attr("data-link-id")


# ------------------------------------------------------------------ the screenshot
def _png_rgb(data: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG into an (h, w, 3) array (numpy only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, bytearray(), None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, chunk = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
    assert head is not None
    w, h, depth, color, _, _, interlace = head
    assert depth == 8 and color in (2, 6) and interlace == 0, head
    bpp = 3 if color == 2 else 4
    rows = np.frombuffer(zlib.decompress(bytes(idat)), np.uint8).reshape(h, 1 + w * bpp)
    ftype = rows[:, 0]
    raw = rows[:, 1:].reshape(h, w, bpp).astype(np.int16)
    # Undo the filters one anti-diagonal at a time (pixel (r, x) needs (r, x-1), (r-1, x) and
    # (r-1, x-1)), on a skewed copy where diagonal d = r + x is column d + 2: every step is
    # then slices. Row 0 and columns 0-1 are zero padding.
    rr, xx = np.mgrid[0:h, 0:w]
    skew = np.zeros((h + 1, h + w + 2, bpp), np.int16)
    skew[rr + 1, rr + xx + 2] = raw
    fts = np.zeros(h + 1, np.uint8)
    fts[1:] = ftype
    out = np.zeros_like(skew)
    for d in range(h + w - 1):
        lo, hi = max(0, d - w + 1) + 1, min(h - 1, d) + 2  # padded rows of this diagonal
        a, b, c = out[lo:hi, d + 1], out[lo - 1:hi - 1, d + 1], out[lo - 1:hi - 1, d]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        f = fts[lo:hi, None]
        pred = np.where(f == 1, a, np.where(f == 2, b, np.where(f == 3, (a + b) >> 1,
                                                                 np.where(f == 4, paeth, 0))))
        out[lo:hi, d + 2] = (skew[lo:hi, d + 2] + pred) & 0xFF
    return out[rr + 1, rr + xx + 2][:, :, :3].astype(np.uint8)


def test_dashboard_screenshot(pages: Pages) -> None:
    png = pages.png
    assert len(png) > 50_000, f"screenshot only {len(png)} bytes"
    img = _png_rgb(png)
    assert img.shape == (WINDOW[1], WINDOW[0], 3)
    packed = (img[..., 0].astype(np.uint32) << 16) | (img[..., 1].astype(np.uint32) << 8) \
        | img[..., 2]
    codes, counts = np.unique(packed, return_counts=True)
    colors = np.stack([codes >> 16, (codes >> 8) & 0xFF, codes & 0xFF], axis=1)
    assert len(colors) > 500, f"only {len(colors)} colours"
    assert counts.max() / counts.sum() < 0.8, "mostly one colour"
    # the decode is right if the corner is the page's background and the commonest colour
    # is the background or the cards' colour
    def near(px: np.ndarray, rgb: tuple[int, int, int]) -> bool:
        return bool(np.abs(px.astype(int) - rgb).max() <= 3)

    assert near(img[0, 0], BACKGROUND), img[0, 0]
    common = colors[counts.argmax()]
    assert near(common, BACKGROUND) or near(common, PANEL), common
    # links and GPUs are drawn in saturated colours (utilisation scale, job colours)
    chroma = img.max(axis=2).astype(int) - img.min(axis=2)
    assert (chroma > 90).sum() > 5_000, "no coloured links or GPUs drawn"
    assert pages.seconds < 60


# ------------------------------------------------------------------ an interaction
def _click_and_read(exe: str, url: str, click: str, read: str, tmp: Path) -> tuple[str, str]:
    """Open ``url`` in headless Chromium driven over its DevTools protocol, let the page
    render, click the element of id ``click`` and return the text of ``read`` before and
    after (a second later)."""
    import asyncio
    import json

    import websockets

    port = free_port()
    proc = subprocess.Popen([exe, *CHROMIUM_FLAGS[:-1], f"--remote-debugging-port={port}",
                             f"--user-data-dir={tmp / 'profile-cdp'}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                tabs = httpx.get(f"http://127.0.0.1:{port}/json", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "Chromium's DevTools did not come up"
                time.sleep(0.1)
        page = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")

        async def drive() -> tuple[str, str]:
            async with websockets.connect(page, max_size=None) as ws:
                seq = 0

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    nonlocal seq
                    seq += 1
                    await ws.send(json.dumps({"id": seq, "method": method, "params": params}))
                    while True:
                        msg = json.loads(await ws.recv())
                        if msg.get("id") == seq:
                            return msg  # type: ignore[no-any-return]

                async def text(ident: str) -> str:
                    r = await call("Runtime.evaluate", expression=(
                        f"(document.getElementById({ident!r}) || {{}}).textContent || ''"))
                    return str(r["result"]["result"].get("value", ""))

                await call("Page.navigate", url=url)
                for _ in range(400):  # (until the first render and the inspector's data)
                    await asyncio.sleep(0.1)
                    r = await call("Runtime.evaluate", expression="document.body.dataset.ready")
                    if r["result"]["result"].get("value") == "1" and await text("insp-body"):
                        break
                before = await text(read)
                await call("Runtime.evaluate",
                           expression=f"document.getElementById({click!r}).click()")
                for _ in range(200):
                    await asyncio.sleep(0.1)
                    after = await text(read)
                    if after and after != before and after != "sending…":
                        break
                return before, after

        return asyncio.run(drive())
    finally:
        proc.kill()
        proc.wait(10)


def test_the_drill_button_fails_the_cable_in_the_twin(live: Live, pages: Pages,
                                                      tmp_path: Path) -> None:
    """In the link inspector of a cable (neither the down nor the gray one), the drill
    button has the twin fail the cable for 2 ms: the page says what the twin plays, and
    the controller then finds both directions down in the twin's telemetry (the fault log,
    source telemetry)."""
    exe = _chromium()
    links = {lk["id"]: lk for lk in live.fabric["links"]}
    taken = {links[live.down_link]["src"], links[live.down_link]["dst"],
             links[live.gray_link]["src"], links[live.gray_link]["dst"]}
    lk = next(x for x in live.fabric["links"] if x["kind"] == "fabric"
              and not {x["src"], x["dst"]} & taken)
    _, said = _click_and_read(exe, f"{live.base}/#token={OPS}&link={lk['id']}", "insp-drill",
                              "insp-drill-msg", tmp_path)
    assert said.startswith("twin: link ") and lk["src"] in said and lk["dst"] in said, said
    ops = {"Authorization": f"Bearer {OPS}"}

    def seen_down() -> bool:
        faults = httpx.get(f"{live.base}/api/v1/faults", headers=ops, timeout=10).json()
        return lk["id"] in {f["link_id"] for f in faults
                            if f["source"] == "telemetry" and f["kind"] == "down"}

    wait_until(seen_down, timeout_s=60)
