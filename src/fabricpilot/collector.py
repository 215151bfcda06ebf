"""Control of Python's cyclic garbage collector around allocation-heavy work.

The planner makes hundreds of thousands of small objects that cannot form reference cycles
(tuples of link ids, path sets); a long-lived service holds millions more (modules, the
fabric, the scenario). Left alone, the collector would traverse them over and over. Two
tools keep it out of the way:

- :func:`paused`: no collection while a block runs (and, optionally, the objects it made
  promoted to the oldest generation at the end, without a traversal);
- :func:`freeze_startup_objects`: what is alive after a server's start-up moves to the
  permanent generation, out of every later pass.

Whether anything was frozen is remembered here: ``gc.get_freeze_count()`` walks the whole
permanent generation (tens of milliseconds with the GIL held in a service), so it is not
asked on a hot path.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_startup_objects", "frozen", "paused"]

_frozen = False


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
