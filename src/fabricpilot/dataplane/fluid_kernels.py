"""Compiled inner loops of the fluid model (numba): one pass of egress service over the
members' hops, and the per-cell sums the model reads every step.

The fluid model's arrays are small (members x hops, a few thousand cells) but it steps hundreds
of thousands of times per run, so the cost is in launching many tiny numpy operations, not in
arithmetic. These kernels do one step's bookkeeping in a single loop over members and hops
with the same arithmetic as the array form they replace.

Conventions: ``cidx[i, k]`` is the cell (used link x used priority, row-major with ``width``
priorities per link) of member ``i``'s hop ``k``; hops ``0 .. plen[i]-1`` are valid.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

_JIT = {"cache": True, "nogil": True}


@numba.njit(**_JIT)
def _schedule_ports(
    demand: NDArray[np.float64],
    capacity: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    strict: bool,
    weights: NDArray[np.float64],
    width: int,
    ports: NDArray[np.int64],
    served: NDArray[np.float64],
) -> None:
    """Split ``capacity[port]`` among each listed port's ``width`` priority cells (see
    :func:`schedule_cells`)."""
    for port in ports:
        base = port * width
        left = capacity[port]
        if strict:
            for c in range(width - 1, -1, -1):
                want = demand[base + c] if eligible[base + c] else 0.0
                take = want if want < left else left
                served[base + c] = take
                left -= take
            continue
        for c in range(width):
            served[base + c] = 0.0
        for _ in range(width):
            wsum = 0.0
            for c in range(width):
                want = demand[base + c] if eligible[base + c] else 0.0
                if want - served[base + c] > 1e-12:
                    wsum += weights[c] if weights[c] > 1e-9 else 1e-9
            if wsum == 0.0 or left <= 1e-12:
                break
            scale = left / wsum
            used = 0.0
            for c in range(width):
                want = demand[base + c] if eligible[base + c] else 0.0
                gap = want - served[base + c]
                if gap > 1e-12:
                    w = weights[c] if weights[c] > 1e-9 else 1e-9
                    take = w * scale
                    if take > gap:
                        take = gap
                    served[base + c] += take
                    used += take
            left -= used


@numba.njit(**_JIT)
def schedule_cells(
    demand: NDArray[np.float64],
    capacity: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    strict: bool,
    weights: NDArray[np.float64],
    width: int,
    served: NDArray[np.float64],
) -> None:
    """Bytes each (port, priority) cell sends in one step; ``demand``, ``eligible`` (not
    paused) and ``served`` hold ``width`` cells per port, ``capacity`` bytes per port.
    Strict: the highest priority column first; weighted: shares by ``weights`` (one per
    column) among eligible cells with demand, leftovers redistributed. Writes ``served``.

    >>> out = np.zeros(2)
    >>> schedule_cells(np.array([50.0, 80.0]), np.array([100.0]), np.ones(2, np.bool_),
    ...                True, np.ones(2), 2, out)
    >>> out.tolist()
    [20.0, 80.0]
    """
    _schedule_ports(demand, capacity, eligible, strict, weights, width,
                    np.arange(capacity.shape[0]), served)


@numba.njit(**_JIT)
def _serve_pass(
    back: NDArray[np.float64],
    fresh: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    cell_col: NDArray[np.int64],
    klass: int,
    cap: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    strict: bool,
    weights: NDArray[np.float64],
    width: int,
    total: NDArray[np.float64],
    delivered: NDArray[np.float64],
    arr: NDArray[np.float64],
    demand: NDArray[np.float64],
    served: NDArray[np.float64],
    frac: NDArray[np.float64],
    cells: NDArray[np.int64],
    cell_seen: NDArray[np.bool_],
    ports: NDArray[np.int64],
    port_seen: NDArray[np.bool_],
) -> bool:
    """One service pass of priority column ``klass`` (``-1``: all): the queues serve the bytes
    in ``fresh`` (those that may still move this step) with the capacity ``cap`` left on each
    port, in proportion to demand. Served bytes leave ``back``; those of a last hop add to
    ``delivered``, the others are added to ``arr`` one hop on (not yet in ``back``).
    Updates ``cap`` and ``total``; returns False (and does nothing) if there was no demand.
    Only the cells and ports with demand are visited (``demand`` to ``port_seen``: zeroed
    work arrays, left zeroed).
    """
    n_cells = 0
    for i in range(back.shape[0]):
        for k in range(plen[i]):
            f = fresh[i, k]
            if f == 0.0:
                continue
            c = cidx[i, k]
            if klass >= 0 and cell_col[c] != klass:
                continue
            if not cell_seen[c]:
                cell_seen[c] = True
                cells[n_cells] = c
                n_cells += 1
            demand[c] += f
    any_demand = False
    for j in range(n_cells):
        if demand[cells[j]] > 1e-9:
            any_demand = True
            break
    if not any_demand:
        for j in range(n_cells):
            demand[cells[j]] = 0.0
            cell_seen[cells[j]] = False
        return False
    n_ports = 0
    for j in range(n_cells):
        port = cells[j] // width
        if not port_seen[port]:
            port_seen[port] = True
            ports[n_ports] = port
            n_ports += 1
    _schedule_ports(demand, cap, eligible, strict, weights, width, ports[:n_ports], served)
    for j in range(n_ports):
        port = ports[j]
        used = 0.0
        for col in range(width):
            c = port * width + col
            used += served[c]
            total[c] += served[c]
            if demand[c] > 0:
                frac[c] = served[c] / demand[c]
        cap[port] = cap[port] - used if cap[port] > used else 0.0
    for i in range(back.shape[0]):
        last = plen[i] - 1
        for k in range(plen[i]):
            f = fresh[i, k]
            if f == 0.0:
                continue
            c = cidx[i, k]
            if klass >= 0 and cell_col[c] != klass:
                continue
            s = f * frac[c]
            back[i, k] -= s
            if k == last:
                delivered[i] += s
            else:
                arr[i, k + 1] += s
    for j in range(n_ports):
        port = ports[j]
        port_seen[port] = False
        for col in range(width):
            c = port * width + col
            demand[c] = 0.0
            served[c] = 0.0
            frac[c] = 0.0
            cell_seen[c] = False
    return True


@numba.njit(**_JIT)
def _drop(
    back: NDArray[np.float64],
    arr: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    at_switch: NDArray[np.bool_],
    egress_switch: NDArray[np.int64],
    cell_lossy: NDArray[np.bool_],
    port_limit_bytes: float,
    switch_limit_bytes: float,
    n_switches: int,
    injected: NDArray[np.float64],
    junk: NDArray[np.float64],
    rewind: NDArray[np.float64],
    nack_at: NDArray[np.float64],
    rtt_ns: NDArray[np.float64],
    resume_ns: float,
    cell_drops: NDArray[np.float64],
) -> float:
    """Arrivals ``arr`` beyond the buffers are dropped: a lossy queue holds at most
    ``port_limit_bytes``, a switch at most ``switch_limit_bytes`` in all; each over-full
    queue or switch drops the same fraction of everything arriving at it. A member that
    lost bytes goes back N: what it sent after its first loss still crosses the fabric and
    is discarded by the receiver (``junk``, ahead of anything sent again: the rest of what
    arrived at the drop hop with the loss and its bytes upstream of that hop, and what it
    sends until the NACK is back, ``nack_at = resume_ns + rtt``); then it sends again from
    the loss on (``rewind``: the bytes lost and sent after). What was already queued at the
    drop hop went ahead of the loss and is delivered. Bytes still in the sender's NIC were
    not on the wire yet: they go back to the sender (un-injected), to be sent, as junk,
    while it waits. A loss while junk is in flight is taken from the junk first (it is
    ahead of the rest); one while a NACK is awaited adds to what will be sent again.
    Returns the bytes dropped; adds drops per cell."""
    m = back.shape[0]
    n_cells = cell_lossy.shape[0]
    queued = np.zeros(n_cells)
    incoming = np.zeros(n_cells)
    per_switch = np.zeros(n_switches)
    sw_in = np.zeros(n_switches)
    arriving = False
    for i in range(m):
        for k in range(plen[i]):
            if at_switch[i, k]:
                a = arr[i, k]
                if a != 0.0:
                    arriving = True
                v = back[i, k] + a
                queued[cidx[i, k]] += v
                incoming[cidx[i, k]] += a
                per_switch[egress_switch[i, k]] += v
                sw_in[egress_switch[i, k]] += a
    if not arriving:
        return 0.0
    port_frac = np.zeros(n_cells)
    sw_frac = np.zeros(n_switches)
    over_any = False
    for c in range(n_cells):
        over = queued[c] - port_limit_bytes
        if cell_lossy[c] and over > 0 and incoming[c] > 0:
            port_frac[c] = min(over / incoming[c], 1.0)
            over_any = True
    for s in range(n_switches):
        over = per_switch[s] - switch_limit_bytes
        if over > 0 and sw_in[s] > 0:
            sw_frac[s] = min(over / sw_in[s], 1.0)
            over_any = True
    if not over_any:
        return 0.0
    dropped_total = 0.0
    for i in range(m):
        first = -1
        lost = 0.0
        for k in range(plen[i]):
            if not at_switch[i, k]:
                continue
            f = max(port_frac[cidx[i, k]], sw_frac[egress_switch[i, k]])
            d = arr[i, k] * f
            if d > 0:
                arr[i, k] -= d
                cell_drops[cidx[i, k]] += d
                dropped_total += d
                lost += d
                if first < 0:
                    first = k
        if first >= 0:
            _lose(i, first, lost, back, arr, at_switch, injected, junk, rewind, nack_at,
                  rtt_ns, resume_ns)
    return dropped_total


@numba.njit(**_JIT)
def _lose(i: int, first: int, lost: float, back: NDArray[np.float64], arr: NDArray[np.float64],
          at_switch: NDArray[np.bool_], injected: NDArray[np.float64],
          junk: NDArray[np.float64], rewind: NDArray[np.float64], nack_at: NDArray[np.float64],
          rtt_ns: NDArray[np.float64], resume_ns: float) -> None:
    """Member ``i`` lost ``lost`` bytes, first at hop ``first`` (``back``: its queued bytes,
    ``arr``: those arriving this pass): go-back-N, as :func:`_drop` describes it. Junk lost
    is junk no more; a member awaiting a NACK will send the rest again too; the others now
    await one, what they sent after the loss crossing on as junk (the NIC's back to the
    sender)."""
    eaten = min(lost, junk[i])  # (junk lost: it would have been discarded anyway)
    junk[i] -= eaten
    lost -= eaten
    if lost <= 0.0:
        return
    if rewind[i] > 0.0:  # (a NACK is on its way: the sender goes back further)
        rewind[i] += lost
        return
    after = 0.0  # what was sent after the loss, still on its way
    for k in range(first + 1):
        if at_switch[i, k]:
            after += arr[i, k] + (back[i, k] if k < first else 0.0)
        elif k < first:  # (the NIC's, the one hop not at a switch: back to the sender)
            injected[i] -= back[i, k] + arr[i, k]
            back[i, k] = 0.0
            arr[i, k] = 0.0
    junk[i] += after
    rewind[i] = lost + after
    nack_at[i] = resume_ns + rtt_ns[i]


@numba.njit(**_JIT)
def lose(rows: NDArray[np.int64], first: NDArray[np.int64], lost: NDArray[np.float64],
         back: NDArray[np.float64], at_switch: NDArray[np.bool_],
         injected: NDArray[np.float64], junk: NDArray[np.float64],
         rewind: NDArray[np.float64], nack_at: NDArray[np.float64],
         rtt_ns: NDArray[np.float64], resume_ns: float) -> None:
    """Members ``rows`` lost ``lost`` bytes of what they had queued, first at hops
    ``first`` (a PFC watchdog emptying stuck queues): go-back-N as for any loss
    (:func:`_lose`)."""
    arr = np.zeros_like(back)
    for j in range(rows.shape[0]):
        _lose(rows[j], first[j], lost[j], back, arr, at_switch, injected, junk, rewind,
              nack_at, rtt_ns, resume_ns)


@numba.njit(**_JIT)
def _overflows(
    back: NDArray[np.float64],
    arr: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    cell_lossy: NDArray[np.bool_],
    cell_switch: NDArray[np.int64],
    port_limit_bytes: float,
    switch_limit_bytes: float,
    n_switches: int,
) -> bool:
    """Whether the arrivals ``arr`` put any lossy switch queue over its port buffer or any
    switch over its shared buffer (``cell_switch``: the switch of each cell, -1 for a host)."""
    queued = np.zeros(cell_lossy.shape[0])
    for i in range(back.shape[0]):
        for k in range(plen[i]):
            queued[cidx[i, k]] += back[i, k] + arr[i, k]
    per_switch = np.zeros(n_switches)
    for c in range(queued.shape[0]):
        sw = cell_switch[c]
        if sw < 0:
            continue
        if cell_lossy[c] and queued[c] > port_limit_bytes:
            return True
        per_switch[sw] += queued[c]
    return bool(np.any(per_switch > switch_limit_bytes))


@numba.njit(**_JIT)
def serve_step(
    back: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    cell_col: NDArray[np.int64],
    cap: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    strict: bool,
    weights: NDArray[np.float64],
    width: int,
    at_switch: NDArray[np.bool_],
    egress_switch: NDArray[np.int64],
    cell_lossy: NDArray[np.bool_],
    cell_switch: NDArray[np.int64],
    port_limit_bytes: float,
    switch_limit_bytes: float,
    n_switches: int,
    injected: NDArray[np.float64],
    junk: NDArray[np.float64],
    rewind: NDArray[np.float64],
    nack_at: NDArray[np.float64],
    rtt_ns: NDArray[np.float64],
    resume_ns: float,
    total: NDArray[np.float64],
    delivered: NDArray[np.float64],
    cell_drops: NDArray[np.float64],
) -> float:
    """Serve every egress queue for one step, in passes: bytes served at one hop arrive at
    the next and may go on in the same step with the capacity left there (cut-through when
    uncongested; newly arrived bytes queue behind those already waiting). Under strict
    priority each priority (highest first) moves through the fabric with what the ones above
    it left of each link; bytes that moved into another priority's queue wait for the next
    step. Arrivals beyond the buffers are dropped (:func:`_drop`).

    ``cap`` (bytes each used link may send) is consumed; ``total`` (bytes sent per cell),
    ``delivered`` (per member: every byte that reached its receiver, junk too) and
    ``cell_drops`` accumulate. Returns the bytes dropped.
    """
    m, h = back.shape
    start = back.copy()
    fresh = np.empty_like(back)
    arr = np.zeros_like(back)
    n_cells = cell_col.shape[0]
    demand = np.zeros(n_cells)
    served = np.zeros(n_cells)
    frac = np.zeros(n_cells)
    cells = np.zeros(n_cells, np.int64)
    cell_seen = np.zeros(n_cells, np.bool_)
    ports = np.zeros(cap.shape[0], np.int64)
    port_seen = np.zeros(cap.shape[0], np.bool_)
    dropped = 0.0
    # the buffers can only overflow if all bytes in the fabric exceed the smallest limit
    in_flight = 0.0
    for i in range(m):
        for k in range(plen[i]):
            in_flight += back[i, k]
    lossy_any = False
    for c in range(cell_lossy.shape[0]):
        if cell_lossy[c] and cell_switch[c] >= 0:
            lossy_any = True
    limit = min(port_limit_bytes, switch_limit_bytes) if lossy_any else switch_limit_bytes
    n_classes = width if strict and width > 1 else 1
    for ci in range(n_classes):
        klass = width - 1 - ci if n_classes > 1 else -1
        fresh[:, :] = start
        for _ in range(h):
            if not _serve_pass(back, fresh, cidx, plen, cell_col, klass, cap, eligible, strict,
                               weights, width, total, delivered, arr, demand, served, frac,
                               cells, cell_seen, ports, port_seen):
                break
            if in_flight > limit and _overflows(back, arr, cidx, plen, cell_lossy, cell_switch,
                                                port_limit_bytes, switch_limit_bytes,
                                                n_switches):
                dropped += _drop(back, arr, cidx, plen, at_switch, egress_switch, cell_lossy,
                                 port_limit_bytes, switch_limit_bytes, n_switches,
                                 injected, junk, rewind, nack_at, rtt_ns, resume_ns,
                                 cell_drops)
            for i in range(m):
                fresh[i, 0] = 0.0
                for k in range(1, plen[i]):
                    a = arr[i, k]
                    back[i, k] += a
                    fresh[i, k] = a
                    arr[i, k] = 0.0
    for i in range(m):
        for k in range(h):
            if back[i, k] < 0.0:
                back[i, k] = 0.0
    return dropped


@numba.njit(**_JIT)
def cell_sums(
    values: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    first_hop: int,
    n_cells: int,
) -> NDArray[np.float64]:
    """Sum of ``values[i, k]`` per cell ``cidx[i, k]`` over valid hops ``k >= first_hop``
    (``values`` and ``cidx`` may be offset views: hop ``k`` of the member is column
    ``k - first_hop``)."""
    out = np.zeros(n_cells)
    for i in range(values.shape[0]):
        for k in range(first_hop, plen[i]):
            out[cidx[i, k - first_hop]] += values[i, k - first_hop]
    return out


@numba.njit(**_JIT)
def path_probability(
    p_cell: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
) -> NDArray[np.float64]:
    """Probability that a packet of each member is marked somewhere on its path, given the
    marking probability of every cell: ``1 - prod(1 - p)`` over the member's hops.

    >>> path_probability(np.array([0.5, 0.5]), np.array([[0, 1]]), np.array([2])).tolist()
    [0.75]
    """
    m = cidx.shape[0]
    out = np.zeros(m)
    for i in range(m):
        keep = 1.0
        for k in range(plen[i]):
            p = p_cell[cidx[i, k]]
            keep *= 1.0 - (p if p < 1.0 else 1.0)
        out[i] = 1.0 - keep
    return out


@numba.njit(**_JIT)
def inject(
    back: NDArray[np.float64],
    injected: NDArray[np.float64],
    target: NDArray[np.float64],
    rate_gbps: NDArray[np.float64],
    line_rate_gbps: NDArray[np.float64],
    stall_until: NDArray[np.float64],
    now_ns: float,
    dt_ns: float,
    coupled: bool,
    stream: NDArray[np.int64],
    stream_row: NDArray[np.int64],
    share: NDArray[np.float64],
    row_progress: NDArray[np.float64],
    window_bytes: float,
) -> NDArray[np.float64]:
    """The NICs inject for one step: each member up to its congestion-control rate, what its
    NIC queue has room for (one step at line rate) and what it still has to send; members of
    coupled streams (a ring) stay within ``window_bytes`` of their row's progress at the end
    of the last step; a member waiting for a NACK sends nothing. Returns the bytes injected.

    >>> b = np.zeros((1, 2)); inj = np.zeros(1)
    >>> inject(b, inj, np.array([1e6]), np.array([8.0]), np.array([16.0]),
    ...        np.array([-np.inf]), 0.0, 100.0, False, np.zeros(1, np.int64),
    ...        np.zeros(1, np.int64), np.ones(1), np.zeros(1), 0.0).tolist()
    [100.0]
    """
    m = back.shape[0]
    ahead = np.zeros(0)
    if coupled:
        stream_inj = np.zeros(stream_row.shape[0])
        for i in range(m):
            stream_inj[stream[i]] += injected[i]
        ahead = np.empty(stream_row.shape[0])
        for s in range(stream_row.shape[0]):
            ahead[s] = row_progress[stream_row[s]] + window_bytes - stream_inj[s]
    sent = np.zeros(m)
    for i in range(m):
        if stall_until[i] > now_ns:
            continue
        allow = rate_gbps[i] * dt_ns / 8.0
        room = line_rate_gbps[i] * dt_ns / 8.0 - back[i, 0]
        if room < 0.0:
            room = 0.0
        left = target[i] - injected[i]
        if left < 0.0:
            left = 0.0
        allow = min(allow, room, left)
        if coupled:
            a = ahead[stream[i]] * share[i]
            allow = min(allow, a if a > 0.0 else 0.0)
        back[i, 0] += allow
        injected[i] += allow
        sent[i] = allow
    return sent


@numba.njit(**_JIT)
def nic_hold(
    back: NDArray[np.float64],
    injected: NDArray[np.float64],
    sent: NDArray[np.float64],
    port: NDArray[np.int64],
    hold_bytes: NDArray[np.float64],
) -> None:
    """A NIC port holds at most ``hold_bytes[port]`` over all the members it sends (about one
    base step at line rate: the NIC's transmit pipeline, not a queue per QP, which would
    stand many QPs' worth of bytes in front of every byte); what it could not send stays with
    the QPs (back-pressure, un-injected), however long the step, each member keeping a share
    of the hold in proportion to what it had there.

    Two members of one port with 300 and 100 bytes held, 200 allowed: 150 and 50 stay.

    >>> b = np.array([[300.0], [100.0]]); inj = np.array([300.0, 100.0]); s = inj.copy()
    >>> nic_hold(b, inj, s, np.zeros(2, np.int64), np.array([200.0]))
    >>> b[:, 0].tolist(), inj.tolist(), s.tolist()
    ([150.0, 50.0], [150.0, 50.0], [150.0, 50.0])
    """
    total = np.zeros(hold_bytes.shape[0])
    for i in range(back.shape[0]):
        total[port[i]] += back[i, 0]
    for i in range(back.shape[0]):
        t = total[port[i]]
        if t > hold_bytes[port[i]]:
            excess = back[i, 0] * (1.0 - hold_bytes[port[i]] / t)
            back[i, 0] -= excess
            injected[i] -= excess
            sent[i] -= excess


@numba.njit(**_JIT)
def red_marks(
    queue: NDArray[np.float64],
    served: NDArray[np.float64],
    marking: NDArray[np.bool_],
    kmin_bytes: NDArray[np.float64],
    kmax_bytes: NDArray[np.float64],
    pmax: float,
    packet_bytes: float,
    marks: NDArray[np.float64],
) -> tuple[NDArray[np.float64], float]:
    """RED marking (:meth:`EcnParams.mark_probability`) of each cell whose egress marks
    (``marking``: a switch port), with the cell's thresholds: returns the probability per
    cell and the expected marked packets of the step (``served`` bytes / ``packet_bytes``,
    the bytes a packet takes on the wire, x probability), also added to ``marks``.

    >>> k = np.full(3, 10.0), np.full(3, 110.0)
    >>> red_marks(np.array([5.0, 60.0, 200.0]), np.full(3, 100.0), np.ones(3, np.bool_),
    ...           *k, 0.1, 10.0, np.zeros(3))[0].tolist()
    [0.0, 0.05, 1.0]
    """
    n = queue.shape[0]
    p = np.zeros(n)
    total = 0.0
    for c in range(n):
        if not marking[c]:
            continue
        q = queue[c]
        lo, hi = kmin_bytes[c], kmax_bytes[c]
        if q <= lo:
            continue
        p[c] = 1.0 if q >= hi else pmax * (q - lo) / max(hi - lo, 1.0)
        mk = served[c] * p[c] / packet_bytes
        marks[c] += mk
        total += mk
    return p, total


@numba.njit(**_JIT)
def row_progress(
    stream: NDArray[np.int64],
    stream_row: NDArray[np.int64],
    delivered: NDArray[np.float64],
    target: NDArray[np.float64],
    n_rows: int,
) -> NDArray[np.float64]:
    """Bytes of each row delivered in order: the progress of its slowest stream (a stream is
    done when all its paths are; round-off below a byte counts as done).

    >>> row_progress(np.array([0, 1]), np.array([0, 0]), np.array([5.0, 3.0]),
    ...              np.array([10.0, 10.0]), 1).tolist()
    [3.0]
    """
    n_streams = stream_row.shape[0]
    got = np.zeros(n_streams)
    want = np.zeros(n_streams)
    for i in range(stream.shape[0]):
        got[stream[i]] += delivered[i]
        want[stream[i]] += target[i]
    out = np.full(n_rows, np.inf)
    for s in range(n_streams):
        v = want[s] if got[s] >= want[s] - 1e-6 else got[s]
        r = stream_row[s]
        if v < out[r]:
            out[r] = v
    for r in range(n_rows):
        if not np.isfinite(out[r]):
            out[r] = 0.0
    return out


@numba.njit(**_JIT)
def queue_marks(
    back: NDArray[np.float64],
    cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    served: NDArray[np.float64],
    cell_marks: NDArray[np.bool_],
    kmin_bytes: NDArray[np.float64],
    kmax_bytes: NDArray[np.float64],
    pmax: float,
    packet_bytes: float,
    marks: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64], float, float]:
    """Queue depth per cell, RED marking of the step (:func:`red_marks`) and the marking
    probability along each member's path (:func:`path_probability`). Returns (queue per
    cell, path probability per member, expected marked packets, bytes queued at switches)."""
    queue = cell_sums(back, cidx, plen, 0, served.shape[0])
    p_cell, marked = red_marks(queue, served, cell_marks, kmin_bytes, kmax_bytes, pmax,
                               packet_bytes, marks)
    at_switches = 0.0
    for c in range(queue.shape[0]):
        if cell_marks[c]:
            at_switches += queue[c]
    return queue, path_probability(p_cell, cidx, plen), marked, at_switches


@numba.njit(**_JIT)
def ingress_xoff(
    back: NDArray[np.float64],
    ingress_cidx: NDArray[np.int64],
    plen: NDArray[np.int64],
    watch: NDArray[np.bool_],
    xoff_bytes: float,
) -> tuple[NDArray[np.float64], bool]:
    """Bytes buffered in each switch per ingress cell (the link they arrived on, the priority
    they wait in) and whether any watched ingress reached ``xoff_bytes``."""
    ingress = cell_sums(back[:, 1:], ingress_cidx, plen, 1, watch.shape[0])
    for c in range(watch.shape[0]):
        if watch[c] and ingress[c] >= xoff_bytes:
            return ingress, True
    return ingress, False


@numba.njit(**_JIT)
def count_links(
    served: NDArray[np.float64],
    width: int,
    rate_gbps: NDArray[np.float64],
    dt_ns: float,
    link_bytes: NDArray[np.float64],
    link_peak: NDArray[np.float64],
) -> None:
    """Add each used link's bytes of the step (``served`` per cell, ``width`` per link) to
    ``link_bytes`` and keep the peak utilisation of any step in ``link_peak``."""
    for port in range(rate_gbps.shape[0]):
        b = 0.0
        for j in range(width):
            b += served[port * width + j]
        link_bytes[port] += b
        u = b * 8.0 / (rate_gbps[port] * dt_ns)
        if u > link_peak[port]:
            link_peak[port] = u


@numba.njit(**_JIT)
def crossing_ns(
    level: NDArray[np.float64],
    prev: NDArray[np.float64],
    dt_ns: float,
    thresholds: NDArray[np.float64],
) -> float:
    """Earliest time at which any ``level`` (moving at the slope from ``prev`` over ``dt_ns``)
    crosses a threshold or reaches zero; ``inf`` if none will.

    >>> crossing_ns(np.array([10.0, 5.0]), np.array([0.0, 6.0]), 1.0, np.array([25.0]))
    1.5
    """
    best = np.inf
    for i in range(level.shape[0]):
        x = level[i]
        slope = (x - prev[i]) / dt_ns
        if slope > 1e-9:
            for t in thresholds:
                if x < t:
                    best = min(best, (t - x) / slope)
        elif slope < -1e-9:
            for t in thresholds:
                if x > t:
                    best = min(best, (x - t) / -slope)
            if x > 0:
                best = min(best, x / -slope)
    return best


@numba.njit(**_JIT)
def qp_horizon(
    now_ns: float,
    rate_gbps: NDArray[np.float64],
    line_rate_gbps: NDArray[np.float64],
    stall_until: NDArray[np.float64],
    cnp_due_ns: NDArray[np.float64],
    timer_ns: NDArray[np.float64],
    bytes_since: NDArray[np.float64],
    since_cnp_ns: NDArray[np.float64],
    marks: NDArray[np.float64],
    mark_probability: NDArray[np.float64],
    delivered_bytes: NDArray[np.float64],
    dt_ns: float,
    packet_bytes: float,
    period_ns: float,
    byte_counter_bytes: float,
    cnp_interval_ns: float,
) -> tuple[float, bool, bool]:
    """Time to the next DCQCN event of any QP: a CNP arriving, a rate-increase timer or byte
    counter firing (QPs below line rate), a receiver's next CNP (marked packets arriving at
    the last step's rate, no sooner than its CNP interval allows). Returns (that time, any QP
    below line rate, any QP waiting for a NACK)."""
    h = np.inf
    below_any = False
    stalled_any = False
    for i in range(rate_gbps.shape[0]):
        if stall_until[i] > now_ns:
            stalled_any = True
        if cnp_due_ns[i] < np.inf:
            h = min(h, cnp_due_ns[i] - now_ns)
        if rate_gbps[i] < line_rate_gbps[i] * (1 - 1e-9):
            below_any = True
            h = min(h, period_ns - timer_ns[i])
            h = min(h, (byte_counter_bytes - bytes_since[i]) / max(rate_gbps[i] / 8.0, 1e-9))
        p = mark_probability[i]
        if p > 0:
            wait = max(cnp_interval_ns - since_cnp_ns[i], 0.0)
            rate = delivered_bytes[i] / dt_ns / packet_bytes * p
            fill = (1.0 - marks[i]) / rate if rate > 0 else np.inf
            h = min(h, max(wait, fill))
    return h, below_any, stalled_any
