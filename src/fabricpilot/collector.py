"""Control of a process's memory housekeeping around allocation-heavy work: Python's cyclic
garbage collector, and the C allocator's return of freed memory to the system.

The planner makes hundreds of thousands of small objects that cannot form reference cycles
(tuples of link ids, path sets); a long-lived service holds millions more (modules, the
fabric, the scenario). Left alone, the collector would traverse them over and over. Two
tools keep it out of the way:

- :func:`paused`: no collection while a block runs (and, optionally, the objects it made
  promoted to the oldest generation at the end, without a traversal);
- :func:`freeze_startup_objects`: what is alive after a server's start-up moves to the
  permanent generation, out of every later pass.

A plan also allocates and frees large arrays (a million demands' columns). glibc returns a
freed block that large to the system at once, and the next plan faults every page of it in
again: on a virtual machine that is up to a third of a re-plan's wall time.
:func:`keep_freed_memory` keeps that memory in the process for the next plan, and has new
memory faulted in small pages (:func:`small_pages`).

Whether anything was frozen is remembered here: ``gc.get_freeze_count()`` walks the whole
permanent generation (tens of milliseconds with the GIL held in a service), so it is not
asked on a hot path.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_startup_objects", "frozen", "keep_freed_memory", "paused", "small_pages"]

_frozen = False
_kept = False
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def frozen() -> bool:
    """Whether :func:`freeze_startup_objects` ran in this process."""
    return _frozen


def freeze_startup_objects() -> None:
    """Keep what is alive after start-up (modules, the scenario, the app, the fabric) out
    of the garbage collector's full passes: a long-lived server would otherwise stall for
    tens of milliseconds at each one. Call it once, in a process that runs the service
    until it exits."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True


def keep_freed_memory() -> bool:
    """Keep the memory a plan frees for the next one, instead of handing it back to the
    system and faulting it in again page by page: every block from the heap (glibc's
    ``M_MMAP_MAX`` = 0, no block in a mapping of its own, unmapped when freed) and the
    heap's free top kept up to 2 GiB (``M_TRIM_THRESHOLD``), and one heap for every thread
    (``M_ARENA_MAX`` = 1: a worker thread's arrays would come from a heap of its own,
    unmapped when freed whole, so the planner's worker faulted its link index, some 33 MB
    at 8192 GPUs, in again at every plan). The process's resident size then stays near
    its peak, as a long-lived controller's does anyway between plans. New memory is
    faulted in small pages (:func:`small_pages`).

    For a process that plans until it exits (the service's control process); call it once,
    at start-up. Whether it took effect: ``False`` where the C library is not glibc (as on
    macOS), which is then left as it is.
    """
    global _kept
    if _kept:
        return True
    small_pages()
    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's C library)
    except (OSError, AttributeError, TypeError):  # (TypeError: no such handle on Windows)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # (musl has a mallopt that does nothing and returns 0)
    _kept = (mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
             and mallopt(_M_ARENA_MAX, 1) == 1)
    return _kept


def small_pages() -> bool:
    """Have numpy's large arrays faulted in the kernel's small pages: numpy asks for
    transparent huge pages on every array of 4 MiB or more (``madvise``), and where the
    kernel serves those asks (its ``transparent_hugepage`` in ``madvise`` mode, as many
    distributions ship) each first touch of 2 MiB zeroes it, after compacting memory to
    find it if it must. On a virtual machine that cost a first plan of a million demands a
    second of system time, five times what small pages cost (a latency-sensitive process
    is better without huge-page stalls, as databases advise). Returns whether numpy took
    the setting (``False`` on a numpy without it)."""
    import numpy as np

    mod = getattr(np, "_core", None) or getattr(np, "core", None)
    setter = getattr(getattr(mod, "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None:
        return False
    setter(False)
    return True


@contextmanager
def paused(promote: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector (while many objects are made that cannot form
    cycles: each collection would traverse every one of them); then restore it.

    With ``promote``, the objects made meanwhile, long-lived (a plan and its path sets), are
    moved to the oldest generation when the collector resumes, instead of being traversed by
    the next young collection (skipped after :func:`freeze_startup_objects`: the frozen
    objects would be thawed with them).

    >>> import gc
    >>> with paused():
    ...     gc.isenabled()
    False
    >>> with paused(promote=True):
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if promote and not _frozen:
                gc.freeze()    # every tracked object to the permanent generation...
                gc.unfreeze()  # ...and back into the oldest one, without a traversal
            gc.enable()
