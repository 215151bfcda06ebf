"""Data-plane parameters with their defaults and the wire-overhead (payload efficiency) model.

Header model (stated once, used everywhere): every packet carries up to ``mtu_bytes`` of
payload plus ``header_bytes`` of RoCEv2 headers (Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 +
ICRC 4 = 58 B; the FCS's 4 B are not counted: 62 counts them) plus ``wire_overhead_bytes``
of preamble, start delimiter and inter-frame gap (20 B). With a 4096 B MTU the best goodput
is 4096 / 4174 = 98.13% of line rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class FabricParams:
    """Per-packet overheads and fixed latencies.

    ``nic_latency_ns`` is the per-message cost at the endpoints (NIC processing and the
    collective library's step overhead); ``switch_latency_ns`` is added at every switch hop.
    """

    mtu_bytes: int = 4096
    header_bytes: int = 58
    wire_overhead_bytes: int = 20
    switch_latency_ns: int = 600
    nic_latency_ns: int = 1000

    @property
    def payload_efficiency(self) -> float:
        """Best goodput / line rate.

        >>> round(FabricParams().payload_efficiency, 4)
        0.9813
        """
        return self.mtu_bytes / (self.mtu_bytes + self.header_bytes + self.wire_overhead_bytes)

    @property
    def packet_wire_bytes(self) -> int:
        """Bytes a full packet takes on the wire (what ECN marks and CNPs count per packet
        of the wire bytes a queue serves).

        >>> FabricParams().packet_wire_bytes
        4174
        """
        return self.mtu_bytes + self.header_bytes + self.wire_overhead_bytes

    def wire_bytes(self, payload_bytes: NDArray[np.int64]) -> NDArray[np.int64]:
        """Bytes on the wire for a message of ``payload_bytes``: payload plus per-packet costs.

        >>> FabricParams().wire_bytes(np.array([0, 1, 4096, 4097])).tolist()
        [0, 79, 4174, 4253]
        """
        p = np.asarray(payload_bytes, np.int64)
        packets = -(-p // self.mtu_bytes)
        return p + packets * (self.header_bytes + self.wire_overhead_bytes)


@dataclass(frozen=True, slots=True)
class EcnParams:
    """RED-style ECN marking at switch egress queues (DCQCN paper defaults: Zhu et al.,
    "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, section 6).

    The thresholds are the same on every port unless ``reference_gbps`` gives the port rate
    they are for: each port's then scale with its rate, as deployments scale them (HPCC's
    DCQCN baseline, SIGCOMM 2019, raises them with the link rate). The paper's values are
    for 40 Gb/s: at 400 Gb/s a queue fills ten times faster, passes kmax before the first
    CNP is back and is marked whole, and DCQCN cuts two flows sharing a port far below
    their share (a 2-to-1 incast on one leaf, 64 MiB each, at 58 % of line rate; 93 % with
    ``reference_gbps=40``). kmin then stays below the PFC XOFF as the paper asks (ECN acts
    first); kmax, 2 MB at 400 Gb/s, is above it: an incast the marks have not slowed yet
    pauses.
    """

    kmin_bytes: int = 5 * 1024
    kmax_bytes: int = 200 * 1024
    pmax: float = 0.01
    reference_gbps: float | None = None

    def thresholds(self, rate_gbps: NDArray[np.float64]) -> tuple[NDArray[np.float64],
                                                                  NDArray[np.float64]]:
        """kmin and kmax (bytes) of ports of ``rate_gbps``.

        >>> EcnParams(reference_gbps=40.0).thresholds(np.array([40.0, 400.0]))[1].tolist()
        [204800.0, 2048000.0]
        >>> EcnParams().thresholds(np.array([400.0]))[0].tolist()
        [5120.0]
        """
        rate = np.asarray(rate_gbps, np.float64)
        scale = (np.ones_like(rate) if self.reference_gbps is None
                 else rate / self.reference_gbps)
        return self.kmin_bytes * scale, self.kmax_bytes * scale

    def mark_probability(self, queue_bytes: NDArray[np.float64]) -> NDArray[np.float64]:
        """0 below kmin, rising linearly to pmax at kmax, 1 above kmax (at a port of
        ``reference_gbps``).

        >>> EcnParams(kmin_bytes=10, kmax_bytes=110, pmax=0.1).mark_probability(
        ...     np.array([5.0, 60.0, 200.0])).tolist()
        [0.0, 0.05, 1.0]
        """
        q = np.asarray(queue_bytes, np.float64)
        span = max(self.kmax_bytes - self.kmin_bytes, 1)
        p = self.pmax * (q - self.kmin_bytes) / span
        return np.where(q <= self.kmin_bytes, 0.0, np.where(q >= self.kmax_bytes, 1.0, p))


@dataclass(frozen=True, slots=True)
class DcqcnParams:
    """DCQCN reaction point (sender NIC) and notification point (receiver NIC) parameters.

    Defaults are the SIGCOMM 2015 paper's: g = 1/256, rate-increase timer 55 us, byte counter
    10 MB, F = 5 fast-recovery steps, CNPs at most every 50 us per flow, alpha updated every
    55 us without a CNP. The paper's additive increase, 40 Mb/s on 40 Gb/s NICs, is kept as a
    fraction of the line rate (1e-3: 400 Mb/s at 400 Gb/s), hyper increase 10x that (the
    paper leaves it to the implementation). ``min_rate_gbps`` floors the rate.
    """

    g: float = 1 / 256
    timer_ns: int = 55_000
    byte_counter_bytes: int = 10 * 1024 * 1024
    fast_recovery_steps: int = 5
    rate_ai_fraction: float = 1e-3
    rate_hai_fraction: float = 1e-2
    cnp_interval_ns: int = 50_000
    alpha_update_ns: int = 55_000
    initial_alpha: float = 1.0
    min_rate_gbps: float = 0.1
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class PfcParams:
    """Priority flow control per ingress port and priority.

    A switch ingress whose buffered bytes (of one priority) reach ``xoff_bytes`` pauses the
    upstream egress of that priority; below ``xon_bytes`` it resumes it. The pause acts
    ``response_ns`` plus the link delay later. A pause that spreads ``storm_hops`` hops or
    lasts ``storm_duration_ns`` is a storm; a cycle of paused ports that lasts
    ``deadlock_detect_ns`` is a deadlock, which the PFC watchdog breaks by dropping the stuck
    queues and ignoring pauses on them for ``watchdog_recovery_ns`` (as switch PFC watchdogs
    do).
    """

    enabled: bool = True
    xoff_bytes: int = 512 * 1024
    xon_bytes: int = 256 * 1024
    response_ns: int = 500
    storm_hops: int = 3
    storm_duration_ns: int = 1_000_000
    deadlock_detect_ns: int = 200_000
    watchdog: bool = True
    watchdog_recovery_ns: int = 1_000_000


@dataclass(frozen=True, slots=True)
class FluidParams:
    """The fluid model's clock, buffers and loss recovery.

    ``buffer_bytes_per_port`` caps each lossy switch egress queue; ``buffer_bytes_per_switch``
    is a switch's shared buffer, which lossless queues may fill only if PFC headroom is
    exhausted (then they drop too).
    Lost bytes are recovered by go-back-N: the sender learns of a loss ``nack_ns`` and one
    round trip later; until then what it sent after the loss, and goes on sending, crosses
    the fabric and is discarded by the receiver; then it resends everything from the loss
    on. ``window_bytes`` bounds how far a
    ring stream may run ahead of the slowest stream of its ring (NCCL's buffers).

    The clock: ``step_ns`` while PFC is acting (a pause in force or on its way, an ingress
    above XON) or a loss is being recovered; up to ``max_busy_step_ns`` while queues or rate
    cuts are active without PFC; up to ``max_quiet_step_ns`` while nothing queues and every
    QP runs at line rate. A longer step never crosses the next DCQCN event or a queue
    threshold (extrapolated from the last step). Against the fixed 500 ns step the default
    2 us busy step changed collective times by at most 2.2% (AlltoAll on a 2:1 fabric; ring
    AllReduce and PFC incast by < 1.1%), 5 us by up to 5%.
    """

    step_ns: int = 500
    max_quiet_step_ns: int = 20_000
    max_busy_step_ns: int = 2_000
    buffer_bytes_per_port: int = 4 * 1024 * 1024
    buffer_bytes_per_switch: int = 64 * 1024 * 1024
    nack_ns: int = 5_000
    window_bytes: int = 4 * 1024 * 1024
    sample_interval_ns: int = 10_000
    max_timeseries_rows: int = 2_000_000
