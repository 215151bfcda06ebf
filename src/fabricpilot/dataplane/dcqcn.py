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
    mtu_bytes: int,
    return_delay_ns: NDArray[np.float64],
    now_ns: float,
    dt_ns: float,
    p: DcqcnParams,
) -> None:
    """Receiver side: count expected marked packets and schedule CNPs (in place)."""
    s.marks += delivered_bytes / mtu_bytes * mark_probability
    s.since_cnp_ns += dt_ns
    send = (s.marks >= 1.0) & (s.since_cnp_ns >= p.cnp_interval_ns)
    if send.any():
        s.since_cnp_ns[send] = 0.0
        s.marks[send] = 0.0
        due = now_ns + return_delay_ns[send]
        s.cnp_due_ns[send] = np.minimum(s.cnp_due_ns[send], due)


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
    cut = s.cnp_due_ns <= now_ns
    if cut.any():
        s.cnps[cut] += 1
        s.cnp_due_ns[cut] = np.inf
        s.rt[cut] = s.rc[cut]
        s.rc[cut] = np.maximum(s.rc[cut] * (1.0 - s.alpha[cut] / 2.0), p.min_rate_gbps)
        s.alpha[cut] = (1.0 - p.g) * s.alpha[cut] + p.g
        s.timer_ns[cut] = 0.0
        s.alpha_timer_ns[cut] = 0.0
        s.bytes_since[cut] = 0.0
        s.i_timer[cut] = 0
        s.i_bytes[cut] = 0
    idle = ~cut
    s.alpha_timer_ns[idle] += dt_ns
    decay = idle & (s.alpha_timer_ns >= p.alpha_update_ns)
    s.alpha[decay] *= 1.0 - p.g
    s.alpha_timer_ns[decay] -= p.alpha_update_ns

    below = idle & (s.rc < line_rate_gbps)
    s.timer_ns[below] += dt_ns
    s.bytes_since[below] += sent_bytes[below]
    by_timer = below & (s.timer_ns >= p.timer_ns)
    by_bytes = below & (s.bytes_since >= p.byte_counter_bytes)
    s.timer_ns[by_timer] -= p.timer_ns
    s.bytes_since[by_bytes] -= p.byte_counter_bytes
    s.i_timer[by_timer] += 1
    s.i_bytes[by_bytes] += 1
    event = by_timer | by_bytes
    if event.any():
        f = p.fast_recovery_steps
        hyper = event & (s.i_timer > f) & (s.i_bytes > f)
        additive = event & ~hyper & ((s.i_timer > f) | (s.i_bytes > f))
        s.rt[additive] += p.rate_ai_fraction * line_rate_gbps[additive]
        s.rt[hyper] += p.rate_hai_fraction * line_rate_gbps[hyper]
        s.rt[event] = np.minimum(s.rt[event], line_rate_gbps[event])
        s.rc[event] = (s.rt[event] + s.rc[event]) / 2.0
    at_line = s.rc >= line_rate_gbps * (1 - 1e-9)
    s.rc[at_line] = line_rate_gbps[at_line]
