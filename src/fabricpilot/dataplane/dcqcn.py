"""DCQCN congestion control, vectorised over flows (queue pairs), as an explicit state machine.

Reaction point (sender NIC), per QP (Zhu et al., SIGCOMM 2015, Algorithm 1):

* on a CNP: ``RT = RC``, ``RC = RC (1 - alpha/2)``, ``alpha = (1 - g) alpha + g``; the timer,
  the byte counter and both increase counters restart;
* every ``alpha_update_ns`` without a CNP: ``alpha = (1 - g) alpha``;
* every time the timer expires (``timer_ns``) or ``byte_counter_bytes`` have been sent, an
  increase event: fast recovery while both counters are below F (``RC = (RT + RC) / 2``),
  additive increase once one passes F (``RT += R_AI``), hyper increase once both do
  (``RT += R_HAI``), each followed by ``RC = (RT + RC) / 2``.

Notification point (receiver NIC): one CNP per QP at most every ``cnp_interval_ns`` while
marked packets arrive; the model counts the expected number of marked packets (bytes / MTU x
path marking probability) and sends a CNP when at least one has arrived, deterministically.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numpy.typing import NDArray

from fabricpilot.dataplane.params import DcqcnParams


@dataclass
class DcqcnState:
    """Per-QP state arrays (all of one length)."""

    rc: NDArray[np.float64]          # current rate, Gb/s
    rt: NDArray[np.float64]          # target rate, Gb/s
    alpha: NDArray[np.float64]
    timer_ns: NDArray[np.float64]    # since the last increase event / cut
    alpha_timer_ns: NDArray[np.float64]
    bytes_since: NDArray[np.float64]  # byte counter
    i_timer: NDArray[np.int64]       # increase events by timer since the last cut
    i_bytes: NDArray[np.int64]       # increase events by byte counter since the last cut
    marks: NDArray[np.float64]       # expected marked packets not yet answered (receiver)
    since_cnp_ns: NDArray[np.float64]  # receiver: time since it last sent a CNP
    cnp_due_ns: NDArray[np.float64]  # when the next CNP reaches the sender (inf: none)
    cnps: NDArray[np.int64]          # CNPs received so far

    @classmethod
    def new(cls, line_rate_gbps: NDArray[np.float64], p: DcqcnParams) -> DcqcnState:
        n = len(line_rate_gbps)
        rate = np.asarray(line_rate_gbps, np.float64).copy()
        return cls(
            rc=rate, rt=rate.copy(), alpha=np.full(n, p.initial_alpha), timer_ns=np.zeros(n),
            alpha_timer_ns=np.zeros(n), bytes_since=np.zeros(n),
            i_timer=np.zeros(n, np.int64), i_bytes=np.zeros(n, np.int64), marks=np.zeros(n),
            since_cnp_ns=np.full(n, np.inf), cnp_due_ns=np.full(n, np.inf),
            cnps=np.zeros(n, np.int64))

    def take(self, idx: NDArray[np.int64]) -> DcqcnState:
        return DcqcnState(**{k: getattr(self, k)[idx] for k in self.__dataclass_fields__})

    def put(self, idx: NDArray[np.int64], other: DcqcnState) -> None:
        for k in self.__dataclass_fields__:
            getattr(self, k)[idx] = getattr(other, k)


def notification_point(
    s: DcqcnState,
    delivered_bytes: NDArray[np.float64],
    mark_probability: NDArray[np.float64],
    packet_bytes: int,
    return_delay_ns: NDArray[np.float64],
    now_ns: float,
    dt_ns: float,
    p: DcqcnParams,
) -> None:
    """Receiver side: count expected marked packets (``delivered_bytes`` on the wire, of
    ``packet_bytes`` each) and schedule CNPs (in place).

    >>> st = DcqcnState.new(np.array([100.0]), DcqcnParams())
    >>> notification_point(st, np.array([8192.0]), np.array([0.5]), 4096, np.array([2e3]),
    ...                    1e3, 1e3, DcqcnParams())
    >>> float(st.cnp_due_ns[0])  # one marked packet: a CNP, back at the sender 2 us later
    3000.0
    """
    _np_kernel(s.marks, s.since_cnp_ns, s.cnp_due_ns, delivered_bytes, mark_probability,
               float(packet_bytes), return_delay_ns, float(now_ns), float(dt_ns),
               float(p.cnp_interval_ns))


@numba.njit(cache=True, nogil=True)
def _np_kernel(marks: NDArray[np.float64], since_cnp: NDArray[np.float64],
               cnp_due: NDArray[np.float64], delivered: NDArray[np.float64],
               prob: NDArray[np.float64], packet_bytes: float, ret_delay: NDArray[np.float64],
               now: float, dt: float, cnp_interval: float) -> None:
    for i in range(marks.shape[0]):
        marks[i] += delivered[i] / packet_bytes * prob[i]
        since_cnp[i] += dt
        if marks[i] >= 1.0 and since_cnp[i] >= cnp_interval:
            since_cnp[i] = 0.0
            marks[i] = 0.0
            due = now + ret_delay[i]
            if due < cnp_due[i]:
                cnp_due[i] = due


def reaction_point(
    s: DcqcnState,
    sent_bytes: NDArray[np.float64],
    line_rate_gbps: NDArray[np.float64],
    now_ns: float,
    dt_ns: float,
    p: DcqcnParams,
) -> None:
    """Sender side: rate cuts on CNPs, alpha decay and rate increases (in place).

    >>> st = DcqcnState.new(np.array([100.0]), DcqcnParams())
    >>> st.cnp_due_ns[:] = 0.0
    >>> reaction_point(st, np.zeros(1), np.array([100.0]), 1.0, 1.0, DcqcnParams())
    >>> float(st.rc[0]), float(st.rt[0])  # alpha = 1: the first cut halves the rate
    (50.0, 100.0)
    """
    _rp_kernel(s.rc, s.rt, s.alpha, s.timer_ns, s.alpha_timer_ns, s.bytes_since, s.i_timer,
               s.i_bytes, s.cnp_due_ns, s.cnps, sent_bytes, line_rate_gbps, float(now_ns),
               float(dt_ns), float(p.g), float(p.alpha_update_ns), float(p.timer_ns),
               float(p.byte_counter_bytes), int(p.fast_recovery_steps),
               float(p.rate_ai_fraction), float(p.rate_hai_fraction), float(p.min_rate_gbps))


@numba.njit(cache=True, nogil=True)
def _rp_kernel(rc: NDArray[np.float64], rt: NDArray[np.float64], alpha: NDArray[np.float64],
               timer: NDArray[np.float64], alpha_timer: NDArray[np.float64],
               bytes_since: NDArray[np.float64], i_timer: NDArray[np.int64],
               i_bytes: NDArray[np.int64], cnp_due: NDArray[np.float64],
               cnps: NDArray[np.int64], sent: NDArray[np.float64], line: NDArray[np.float64],
               now: float, dt: float, g: float, alpha_update_ns: float, timer_ns: float,
               byte_counter: float, f: int, ai_fraction: float, hai_fraction: float,
               min_rate: float) -> None:
    for i in range(rc.shape[0]):
        if cnp_due[i] <= now:
            cnps[i] += 1
            cnp_due[i] = np.inf
            rt[i] = rc[i]
            rc[i] = max(rc[i] * (1.0 - alpha[i] / 2.0), min_rate)
            alpha[i] = (1.0 - g) * alpha[i] + g
            timer[i] = 0.0
            alpha_timer[i] = 0.0
            bytes_since[i] = 0.0
            i_timer[i] = 0
            i_bytes[i] = 0
        else:
            alpha_timer[i] += dt
            if alpha_timer[i] >= alpha_update_ns:
                alpha[i] *= 1.0 - g
                alpha_timer[i] -= alpha_update_ns
            if rc[i] < line[i]:
                timer[i] += dt
                bytes_since[i] += sent[i]
                by_timer = timer[i] >= timer_ns
                by_bytes = bytes_since[i] >= byte_counter
                if by_timer:
                    timer[i] -= timer_ns
                    i_timer[i] += 1
                if by_bytes:
                    bytes_since[i] -= byte_counter
                    i_bytes[i] += 1
                if by_timer or by_bytes:
                    if i_timer[i] > f and i_bytes[i] > f:
                        rt[i] += hai_fraction * line[i]       # hyper increase
                    elif i_timer[i] > f or i_bytes[i] > f:
                        rt[i] += ai_fraction * line[i]        # additive increase
                    rt[i] = min(rt[i], line[i])
                    rc[i] = (rt[i] + rc[i]) / 2.0             # (and fast recovery)
        if rc[i] >= line[i] * (1 - 1e-9):
            rc[i] = line[i]
