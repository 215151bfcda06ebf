"""PyTorch integration: declare a DDP job to the fabricpilot controller and announce its
gradient AllReduces from a DDP communication hook.

Usage, in every rank after ``torch.distributed.init_process_group``::

    from fabricpilot.integrations.torch import declare, fabricpilot_allreduce_hook

    state = declare()                  # rank 0 declares the job; every rank gets the state
    model = DDP(model)
    model.register_comm_hook(state, fabricpilot_allreduce_hook)

Where the values come from (an argument of :func:`declare` wins over the environment):

* the controller: ``FABRICPILOT_URL`` and ``FABRICPILOT_TOKEN`` (see :class:`~fabricpilot.
  client.Client`);
* the task id: ``AI_TASK_ID``, else ``TORCHELASTIC_RUN_ID`` (unless torchrun's ``none``),
  else ``ddp-<MASTER_ADDR>-<MASTER_PORT>`` (one per rendezvous: two jobs running at once do
  not share it), else ``ddp-job`` (characters the service does not accept in a task id
  become ``-``; a value with none it accepts falls back, with a warning);
* the SLA of the gradient AllReduce: ``AI_SLA_LATENCY``, in microseconds or with a unit
  (``400us``, ``1.5ms``; else 1000 us, the service's default for announced calls);
* the GPU id (the fabric's GPU index) of each global rank: ``FABRICPILOT_GPUS`` (ranges such
  as ``"0-7"`` or ``"0-3,64-67"``, listed in global-rank order, one per rank), else global
  rank + ``FABRICPILOT_GPU_OFFSET`` (default 0);
* how NCCL runs the AllReduce: ``NCCL_ALGO`` naming one algorithm, ``Tree`` or ``Ring``
  (NCCL's own setting; anything else, or unset, leaves the choice to NCCL's tuner and the
  controller plans rings).

What goes over the wire:

* :func:`declare`: rank 0 declares (``PUT``: declares, or replaces the intent of a job of the
  same task id, e.g. after an elastic restart) the job's GPUs and one AllReduce among them,
  without pairs: the controller expands it into the GPU pairs NCCL's rings use on the
  fabric's hosts (one ring per rail where the job holds the same number of GPUs on each of
  several hosts, else one ring in rank order, :func:`ring_pairs`; with ``NCCL_ALGO=Tree``
  its double binary trees along the rails); the other ranks wait
  for it (a broadcast from rank 0 on the default process group)
  and learn whether it worked.
* :func:`fabricpilot_allreduce_hook` (alias :func:`comm_hook`): only rank 0 **of the hook's
  process group** announces, since every rank of a DDP group has the same buckets -- one
  announcement per bucket per group instead of one per rank. It announces a bucket the first
  time this ``(bucket index, size in bytes)`` is seen (DDP re-buckets once after the first
  iteration, so expect announcements in the first two iterations and none after). The HTTP
  requests are made on background threads (up to :data:`ANNOUNCE_THREADS` at once, a
  bucket's announcements in order): the hook never waits for the controller. Then it
  runs the same AllReduce as torch's default ``allreduce_hook`` (divide by the group size,
  ``all_reduce`` asynchronously), so gradients are exactly those of plain DDP.
* When training is over (:meth:`CommIntent.close`, or the interpreter's exit), rank 0
  withdraws the job (``DELETE``): its GPUs and paths are free for other jobs, as a job
  left declared would keep them (another tenant's job on those GPUs was refused).
* An unreachable or refusing controller never breaks training: the first failure is logged
  once as a warning and the job trains on without announcements (:attr:`CommIntent.enabled`
  is then False). Only a local misconfiguration (e.g. ``FABRICPILOT_GPUS`` not listing one
  GPU per rank) raises, at :func:`declare` time.

>>> gpus_from_env(4, {"FABRICPILOT_GPU_OFFSET": "8"})
[8, 9, 10, 11]
>>> gpus_from_env(4, {"FABRICPILOT_GPUS": "0-1,64-65"})
[0, 1, 64, 65]
>>> task_id_from_env({"TORCHELASTIC_RUN_ID": "run/42"}), sla_from_env({"AI_SLA_LATENCY": "400"})
('run-42', 400.0)
>>> ring_pairs([3, 5, 9])
[(3, 5), (5, 9), (9, 3)]
>>> algorithm_from_env({"NCCL_ALGO": "Tree"}), algorithm_from_env({"NCCL_ALGO": "Tree,Ring"})
('tree', '')
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fabricpilot.client import Client, FabricpilotAPIError, FabricpilotClientError
from fabricpilot.controller.intents import MAX_SLA_US
from fabricpilot.units import UnitError, parse_id_ranges, parse_quantity

if TYPE_CHECKING:  # torch is optional: imported where a process group or a tensor is used
    import torch
    import torch.distributed as dist

__all__ = [
    "DEFAULT_DECLARED_SIZE_BYTES",
    "DEFAULT_SLA_US",
    "DEFAULT_TASK_ID",
    "CommIntent",
    "algorithm_from_env",
    "comm_hook",
    "declare",
    "fabricpilot_allreduce_hook",
    "gpus_from_env",
    "ring_pairs",
    "sla_from_env",
    "task_id_from_env",
]

log = logging.getLogger("fabricpilot.integrations.torch")

SLA_ENV = "AI_SLA_LATENCY"
TASK_ENV = "AI_TASK_ID"
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
GPUS_ENV = "FABRICPILOT_GPUS"
GPU_OFFSET_ENV = "FABRICPILOT_GPU_OFFSET"
ALGO_ENV = "NCCL_ALGO"

DEFAULT_TASK_ID = "ddp-job"
ANNOUNCE_THREADS = 8
"""Announcements sent at once (each waits for the controller's next plan, which takes
whatever has come meanwhile)."""
DEFAULT_SLA_US = 1_000.0
"""The SLA used when none is given (the service's default for announced calls)."""
DEFAULT_DECLARED_SIZE_BYTES = 25 << 20
"""Size of the AllReduce declared before the first bucket is seen (DDP's default bucket
cap, 25 MiB, over all the job's GPUs); the hook's first announcement replaces it, over
the whole job or over the hook's process group (the other groups' buckets add calls of
their own), and the rest add the real bucket sizes."""

_TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# ---------------------------------------------------------------- configuration
def algorithm_from_env(env: Mapping[str, str] | None = None) -> str:
    """``"tree"`` or ``"ring"`` if ``NCCL_ALGO`` names that one algorithm (any case), else
    ``""``: NCCL's tuner chooses (a list, an exclusion such as ``^Tree``, per-collective
    settings, or nothing set)."""
    env = os.environ if env is None else env
    value = env.get(ALGO_ENV, "").strip().lower()
    return value if value in ("tree", "ring") else ""


def sla_from_env(env: Mapping[str, str] | None = None) -> float | None:
    """The SLA in microseconds from ``AI_SLA_LATENCY``: a number of microseconds, or a time
    with its unit (``None`` when unset; ``ValueError`` when it is neither, or not > 0).

    >>> sla_from_env({"AI_SLA_LATENCY": "400"}), sla_from_env({"AI_SLA_LATENCY": "1.5ms"})
    (400.0, 1500.0)
    """
    raw = (os.environ if env is None else env).get(SLA_ENV, "").strip()
    if not raw:
        return None
    try:
        sla_us = float(raw)
    except ValueError:
        try:  # ("400us", "1.5ms": the units the scenario files take)
            sla_us = parse_quantity(raw, "time") / 1e3
        except (ValueError, UnitError):
            raise ValueError(f"{SLA_ENV}={raw!r}: not a number of microseconds nor a time "
                             f"such as '400us'") from None
    if not 0 < sla_us <= MAX_SLA_US:
        raise ValueError(f"{SLA_ENV}={raw!r}: must be > 0 and at most {MAX_SLA_US:g} "
                         "(microseconds)")
    return sla_us


def task_id_from_env(env: Mapping[str, str] | None = None) -> str:
    """The task id (module docstring), made acceptable to the service
    (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``).

    >>> task_id_from_env({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.7",
    ...                   "MASTER_PORT": "29500"})
    'ddp-10.0.0.7-29500'
    >>> task_id_from_env({})
    'ddp-job'
    """
    env = os.environ if env is None else env
    run_id = env.get(RUN_ID_ENV, "").strip()
    raw = (env.get(TASK_ENV, "").strip()
           or (run_id if run_id.lower() != "none" else "")  # (torchrun's without an id)
           or (f"ddp-{env['MASTER_ADDR']}-{env['MASTER_PORT']}"
               if env.get("MASTER_ADDR") and env.get("MASTER_PORT") else ""))
    if not raw:
        return DEFAULT_TASK_ID
    task = _sanitize_task_id(raw)
    if task == DEFAULT_TASK_ID and raw != DEFAULT_TASK_ID:
        log.warning("fabricpilot: task id %r has no character a task id may hold; using "
                    "%r (set %s)", raw, DEFAULT_TASK_ID, TASK_ENV)
    elif task != raw and raw == env.get(TASK_ENV, "").strip():
        # (the user's own id: two that read the same once cleaned would be one job, the
        # second declared replacing the first's intent)
        log.warning("fabricpilot: %s=%r is declared as task %r (a task id holds letters, "
                    "digits, '.', '_' and '-', at most 128): a job whose id reads the same "
                    "would replace this one's intent", TASK_ENV, raw, task)
    return task


def _sanitize_task_id(raw: str) -> str:
    """``raw`` with the characters a task id may not hold replaced by ``-``."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", raw)
    cleaned = re.sub(r"^[^A-Za-z0-9]+", "", cleaned)[:128]
    return cleaned if _TASK_ID_RE.match(cleaned) else DEFAULT_TASK_ID


def _parse_gpu_ranges(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (order kept: the list is in global-rank order)."""
    try:
        return parse_id_ranges(text)
    except ValueError as err:
        raise ValueError(f"{GPUS_ENV}: {err}") from None


def gpus_from_env(world_size: int, env: Mapping[str, str] | None = None) -> list[int]:
    """The GPU id of each global rank (module docstring): ``FABRICPILOT_GPUS`` (exactly one
    per rank) or rank + ``FABRICPILOT_GPU_OFFSET``."""
    env = os.environ if env is None else env
    listed = env.get(GPUS_ENV, "").strip()
    if listed:
        gpus = _parse_gpu_ranges(listed)
        if len(gpus) != world_size:
            raise ValueError(f"{GPUS_ENV}={listed!r}: lists {len(gpus)} GPUs for "
                             f"{world_size} ranks (one GPU id per global rank)")
        seen: set[int] = set()
        for rank, g in enumerate(gpus):
            if g in seen:
                raise ValueError(f"{GPUS_ENV}={listed!r}: GPU {g} is listed twice (again "
                                 f"for rank {rank}; one GPU per rank)")
            seen.add(g)
        return gpus
    raw = env.get(GPU_OFFSET_ENV, "").strip() or "0"
    try:
        offset = int(raw)
    except ValueError:
        raise ValueError(f"{GPU_OFFSET_ENV}={raw!r}: not an integer") from None
    if offset < 0:
        raise ValueError(f"{GPU_OFFSET_ENV}={raw!r}: must be >= 0")
    return [offset + r for r in range(world_size)]


def ring_pairs(gpus: Sequence[int]) -> list[tuple[int, int]]:
    """The GPU pairs of one ring over ``gpus`` (each to the next): those the service derives
    from an announced call's ranks unless they sit evenly on several multi-GPU hosts (then
    one ring per rail)."""
    n = len(gpus)
    return [] if n < 2 else [(gpus[i], gpus[(i + 1) % n]) for i in range(n)]


def _rank_and_world(env: Mapping[str, str]) -> tuple[int, int]:
    """This process's global rank and the world size: from torch.distributed when it is
    initialized, else ``RANK`` / ``WORLD_SIZE`` (torchrun's), else a single process."""
    dist = _dist_or_none()
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))


def _dist_or_none() -> Any:
    """``torch.distributed`` if it was imported (it cannot be initialized otherwise), else
    ``None``: no torch import for a process that does not use it."""
    return sys.modules.get("torch.distributed")


# ---------------------------------------------------------------- state
@dataclass(eq=False)
class CommIntent:
    """What a rank knows about its job: the DDP hook's ``state``.

    ``gpus`` is the GPU id of each global rank; ``job`` the job as the controller declared
    it (rank 0, else ``None``); ``enabled`` whether announcements are made (False once the
    controller was unreachable or refused the job); ``decisions`` the controller's answer to
    each announced ``(bucket index, size_bytes)`` (the paths of the bucket's AllReduce);
    ``process_group`` the group the hook reduces over (``None``: the default group).
    """

    task_id: str
    gpus: list[int]
    sla_us: float
    rank: int
    world_size: int
    client: Client | None
    process_group: Any = None
    algorithm: str = ""  # (how NCCL runs the AllReduce, if pinned: NCCL_ALGO)
    enabled: bool = True
    job: dict[str, Any] | None = None
    decisions: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    announced: list[tuple[int, int]] = field(default_factory=list)
    owns_client: bool = False
    _seen: set[tuple[int, int]] = field(default_factory=set, repr=False)
    _group_gpus: list[int] | None = field(default=None, repr=False)
    _announcer: bool | None = field(default=None, repr=False)
    _queue: deque[tuple[tuple[int, int], list[int]]] = field(default_factory=deque, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _in_flight: int = field(default=0, repr=False)  # announcements being sent
    _sending: set[int] = field(default_factory=set, repr=False)  # their bucket indices
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _warned: set[str] = field(default_factory=set, repr=False)

    # ------------------------------------------------------------ the hook's side
    def group_gpus(self) -> list[int]:
        """The GPU ids of the hook's process group, in group-rank order (cached)."""
        if self._group_gpus is None:
            import torch.distributed as dist

            group = self.process_group or dist.group.WORLD
            self._group_gpus = [self.gpus[r] for r in dist.get_process_group_ranks(group)]
            self._announcer = dist.get_rank(group) == 0
        return self._group_gpus

    def note_bucket(self, index: int, size_bytes: int) -> bool:
        """Queue the announcement of bucket ``index`` of ``size_bytes`` unless this rank
        does not announce, announcing is off, or this ``(index, size_bytes)`` was seen.
        Returns whether it was queued. Never raises, never blocks on the network."""
        key = (int(index), int(size_bytes))
        try:
            if not self.enabled or self.client is None or key in self._seen:
                return False
            ranks = self.group_gpus()
            with self._cond:
                if key in self._seen or self._closed:
                    return False
                self._seen.add(key)
                if not self._announcer or len(ranks) < 2:
                    return False
                self._queue.append((key, ranks))
                self._cond.notify_all()
                # (each announcement waits for a plan: sent one after another, a model's
                # hundreds of buckets took minutes to reach the controller)
                if len(self._threads) < min(ANNOUNCE_THREADS,
                                            len(self._queue) + self._in_flight):
                    t = threading.Thread(target=self._run, daemon=True,
                                         name=f"fabricpilot-announce-{len(self._threads)}")
                    self._threads.append(t)
                    t.start()
            return True
        except Exception as err:  # anything at all: training goes on
            self._warn_once("hook", f"fabricpilot: cannot announce bucket {key[0]}: "
                                    f"{type(err).__name__}: {err}; training continues")
            return False

    def _next(self) -> tuple[tuple[int, int], list[int]] | None:
        """The first queued announcement whose bucket has none being sent (a bucket's
        announcements reach the controller in order: a re-bucketed size replaces the
        first), taken off the queue; None if there is none."""
        for i, (key, ranks) in enumerate(self._queue):
            if key[0] not in self._sending:
                del self._queue[i]
                return key, ranks
        return None

    def _run(self) -> None:
        """An announcing thread (up to :data:`ANNOUNCE_THREADS` send at once, in the order
        queued, one at a time per bucket): send queued announcements until closed."""
        while True:
            with self._cond:
                item = None
                while not self._closed or self._queue:
                    item = self._next()
                    if item is not None or (self._closed and not self._in_flight):
                        break
                    self._cond.wait()
                if item is None:
                    return
                key, ranks = item
                self._in_flight += 1
                self._sending.add(key[0])
            try:
                self._announce(key, ranks)
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._sending.discard(key[0])
                    self._cond.notify_all()

    def _announce(self, key: tuple[int, int], ranks: list[int]) -> None:
        if not self.enabled or self.client is None:
            return
        index, size_bytes = key
        try:
            decision = self.client.announce(self.task_id, "allreduce", size_bytes, ranks,
                                            sla_us=self.sla_us, bucket=index,
                                            algorithm=self.algorithm)
        except FabricpilotAPIError as err:
            self._warn_once(f"api-{err.status}", f"fabricpilot: the controller refused "
                            f"bucket {index}'s announcement: {err}; training continues")
            return
        except FabricpilotClientError as err:
            self.enabled = False
            self._warn_once("unreachable", f"fabricpilot: {err}; training continues "
                                           "without announcements")
            return
        except Exception as err:
            self._warn_once("announce", f"fabricpilot: announcing bucket {index} failed: "
                                        f"{type(err).__name__}: {err}; training continues")
            return
        with self._cond:
            self.decisions[key] = decision
            self.announced.append(key)
        if decision.get("sla_met") is False:  # (the controller says why; once per run)
            self._warn_once("sla", f"fabricpilot: no path meets bucket {index}'s SLA of "
                                   f"{self.sla_us:g} us: {decision.get('sla_problem')}")

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    # ------------------------------------------------------------ lifecycle
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued announcement was sent (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._in_flight,
                                       timeout_s)

    def close(self, timeout_s: float = 30.0, *, withdraw: bool = True) -> None:
        """Send what is queued (waiting up to ``timeout_s``), stop the announcing thread,
        withdraw the job if this rank declared it (``withdraw``: its GPUs and paths are
        free for other jobs once training is over; an elastic restart declares it again)
        and close the client if :func:`declare` made it. :func:`declare` also runs it at
        the interpreter's exit; a second call does nothing."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout_s
        if not self.flush(timeout_s):
            with self._cond:
                pending = len(self._queue) + self._in_flight
            log.warning("fabricpilot: %d announcement(s) not sent within %g s; "
                        "dropping them", pending, timeout_s)
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for t in self._threads:
            # a request in flight ends with the client's own timeout; the threads are daemons
            t.join(max(deadline - time.monotonic(), 0.0))
        if withdraw and self.job is not None and self.client is not None:
            try:
                self.client.withdraw_job(self.task_id)
            except Exception as err:  # (the job stays declared: an operator withdraws it)
                # (a controller already said to be unreachable: one warning line in all)
                (log.info if "unreachable" in self._warned else log.warning)(
                    "fabricpilot: cannot withdraw job %r: %s", self.task_id, err)
            else:
                log.info("fabricpilot: withdrew job %s", self.task_id)
        if self.owns_client and self.client is not None:
            self.client.close()

    def __enter__(self) -> CommIntent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def declare(client: Client | None = None, *, task_id: str | None = None,
            gpus: Sequence[int] | None = None, sla_us: float | None = None,
            size_bytes: int = DEFAULT_DECLARED_SIZE_BYTES, tenant: str | None = None,
            process_group: Any = None, sync: bool = True,
            env: Mapping[str, str] | None = None) -> CommIntent:
    """Declare this DDP job to the controller; call it in every rank (after
    ``init_process_group``, before training) and pass the result to
    ``model.register_comm_hook(state, fabricpilot_allreduce_hook)``.

    ``client``: default ``Client()`` (``FABRICPILOT_URL`` / ``FABRICPILOT_TOKEN``);
    ``task_id``, ``gpus`` (GPU id of each global rank), ``sla_us``: default from the
    environment (module docstring); ``size_bytes``: the AllReduce declared until the first
    bucket is announced; ``tenant``: operators only; ``process_group``: the group DDP reduces
    over (default: the world); ``sync``: the other ranks wait for rank 0's declaration
    (a ``broadcast_object_list`` on the default group, so every rank must call
    :func:`declare`); ``env``: instead of ``os.environ``.

    Rank 0 sends ``PUT /api/v1/jobs/{task_id}`` with the job's GPUs and one AllReduce of
    ``size_bytes`` (SLA ``sla_us``; rings, or trees if ``NCCL_ALGO`` says so). A failure
    there is logged once and disables announcements in every rank; it does not raise.
    Raises ``ValueError`` only for a local misconfiguration (GPU ids that do not fit the
    world size, a bad ``AI_SLA_LATENCY``).

    >>> state = declare()  # doctest: +SKIP
    >>> state.task_id, state.gpus, state.sla_us  # doctest: +SKIP
    ('ddp-test', [8, 9], 400.0)
    """
    env = os.environ if env is None else env
    rank, world_size = _rank_and_world(env)
    task = task_id if task_id is not None else task_id_from_env(env)
    sla = sla_us if sla_us is not None else sla_from_env(env)
    if sla is not None and not 0 < sla < math.inf:
        raise ValueError(f"sla_us must be a finite number > 0, got {sla}")
    gpu_ids = [int(g) for g in gpus] if gpus is not None else gpus_from_env(world_size, env)
    if len(gpu_ids) != world_size:
        raise ValueError(f"gpus: {len(gpu_ids)} GPU ids for {world_size} ranks "
                         "(one GPU id per global rank)")
    if len(set(gpu_ids)) != len(gpu_ids) or min(gpu_ids) < 0:
        raise ValueError(f"gpus: GPU ids must be distinct and >= 0, got {gpu_ids}")
    owns_client = client is None
    problem = None
    if client is None:
        try:  # (a malformed FABRICPILOT_URL: training goes on, as when it is unreachable)
            client = Client()
        except Exception as err:
            problem = err
    state = CommIntent(task, gpu_ids, sla if sla is not None else DEFAULT_SLA_US, rank,
                       world_size, client, process_group=process_group,
                       algorithm=algorithm_from_env(env), owns_client=owns_client)
    atexit.register(state.close)  # (withdraws the job when training is over)
    if problem is not None:
        state.enabled = False
        state._warn_once("declare", f"fabricpilot: {problem}; training continues without "
                                    "announcements")
    elif rank == 0:
        call: dict[str, Any] = {"pattern": "allreduce", "size_bytes": int(size_bytes),
                                "sla_us": state.sla_us}
        if state.algorithm:
            call["algorithm"] = state.algorithm
        try:
            assert state.client is not None
            state.job = state.client.update_job(task, gpu_ids, [call], tenant=tenant)
        except Exception as err:  # an unreachable or refusing controller: train anyway
            state.enabled = False
            state._warn_once("declare", f"fabricpilot: cannot declare job {task!r}: {err}; "
                                        "training continues without announcements")
    dist = _dist_or_none()
    if sync and world_size > 1 and dist is not None and dist.is_initialized():
        flag = [state.enabled]
        dist.broadcast_object_list(flag, src=0)
        state.enabled = bool(flag[0])
    if state.job is not None:
        log.info("fabricpilot: declared job %s on GPUs %s (SLA %g us)", task, gpu_ids,
                 state.sla_us)
    return state


# ---------------------------------------------------------------- the hook
def fabricpilot_allreduce_hook(state: CommIntent,
                               bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: announce the bucket's AllReduce (once per ``(index, size)``,
    rank 0 of the group only, off the training thread), then average the bucket over the
    process group exactly like torch's default ``allreduce_hook``.

    >>> model.register_comm_hook(declare(), fabricpilot_allreduce_hook)  # doctest: +SKIP
    """
    import torch.distributed as dist

    tensor = bucket.buffer()
    state.note_bucket(bucket.index(), tensor.numel() * tensor.element_size())
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    tensor.div_(group.size())
    return (dist.all_reduce(tensor, group=group, async_op=True)
            .get_future()
            .then(lambda fut: fut.value()[0]))


# DDP's ``register_comm_hook`` compares the hook's annotations with ``dist.GradBucket`` and
# ``torch.futures.Future[torch.Tensor]``; under ``from __future__ import annotations`` they are
# strings and DDP refuses the hook. Unannotated parameters are accepted, so the runtime
# annotations are dropped (type checkers still read the ones in the source).
fabricpilot_allreduce_hook.__annotations__ = {}

comm_hook = fabricpilot_allreduce_hook
"""Alias of :func:`fabricpilot_allreduce_hook`."""
