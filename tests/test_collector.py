"""The garbage-collector controls: pausing, promotion, and frozen start-up objects kept
frozen."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def test_promotion_keeps_frozen_startup_objects_frozen() -> None:
    # in a fresh interpreter: freezing is for the whole process
    code = textwrap.dedent("""
        import gc
        from fabricpilot.collector import freeze_startup_objects, frozen, paused
        assert not frozen()
        keep = [[i] for i in range(1000)]
        freeze_startup_objects()
        n = gc.get_freeze_count()
        assert frozen() and n >= 1000
        with paused(promote=True):
            made = [[i] for i in range(1000)]
        # a promotion by freeze + unfreeze would have thawed every frozen object
        assert gc.get_freeze_count() == n, (gc.get_freeze_count(), n)
        assert gc.isenabled()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_promotion_without_frozen_objects_moves_new_objects_to_the_oldest_generation(
) -> None:
    code = textwrap.dedent("""
        import gc
        from fabricpilot.collector import paused
        gc.collect()
        with paused(promote=True):
            made = [[i] for i in range(5000)]
        # nothing left in the young generations: all 5,000 lists went to the oldest
        young = len(gc.get_objects(0)) + len(gc.get_objects(1))
        assert young < 100, young
        assert gc.get_freeze_count() == 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# (a child process's view of glibc's heap: mallinfo2, malloc and free; no glibc: says so)
_MALLINFO = textwrap.dedent("""
        import ctypes, sys
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "mallinfo2"):
            print("no glibc"); sys.exit()
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]
        libc.mallinfo2.restype = Info
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
""")


def test_kept_memory_stays_in_the_heap_after_a_large_block_is_freed() -> None:
    # glibc's own account (mallinfo2): a 64 MiB block is a mapping of its own, gone from the
    # process when freed; once memory is kept, it comes from the heap and stays there, free
    code = _MALLINFO + textwrap.dedent("""
        from fabricpilot.collector import keep_freed_memory
        size = 64 << 20
        def block():
            before = libc.mallinfo2()
            p = libc.malloc(size)
            ctypes.memset(p, 1, size)
            mapped = libc.mallinfo2().hblkhd - before.hblkhd
            libc.free(p)
            return mapped, libc.mallinfo2().fordblks - before.fordblks
        mapped, kept = block()
        assert mapped >= size and kept < size, (mapped, kept)
        assert keep_freed_memory() and keep_freed_memory()
        mapped, kept = block()
        # (the heap's free top before the block counts: within a MiB of it)
        assert mapped == 0 and kept >= size - (1 << 20), (mapped, kept)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no glibc":
        pytest.skip("the C library is not glibc")
    assert out.stdout.strip() == "ok"


def test_kept_memory_holds_what_another_thread_frees() -> None:
    # blocks a worker thread allocates and frees (the planner's link index and columns)
    # stay in the process, free, once memory is kept: the worker allocates from the one
    # heap, whose free top is kept, rather than from heaps of its own of at most 64 MiB
    # each, the later ones unmapped when they are empty
    code = _MALLINFO + textwrap.dedent("""
        import threading
        from fabricpilot.collector import keep_freed_memory
        assert keep_freed_memory()
        size, n = 40 << 20, 3  # (each in a thread heap of its own, were there any)
        before = libc.mallinfo2()
        def blocks():
            got = [libc.malloc(size) for _ in range(n)]
            for p in got:
                ctypes.memset(p, 1, size)
            for p in got:
                libc.free(p)
        t = threading.Thread(target=blocks)
        t.start(); t.join()
        kept = libc.mallinfo2().fordblks - before.fordblks
        assert kept >= n * size - (1 << 20), kept
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no glibc":
        pytest.skip("the C library is not glibc")
    assert out.stdout.strip() == "ok"


def test_a_planning_process_has_numpy_fault_its_arrays_in_small_pages() -> None:
    # numpy asks the kernel for huge pages on large arrays unless told not to; a process
    # set up to plan (keep_freed_memory) tells it not to, in a process of its own here
    code = textwrap.dedent("""
        import numpy as np
        from numpy._core import multiarray
        assert multiarray._get_madvise_hugepage()
        from fabricpilot.collector import keep_freed_memory
        keep_freed_memory()
        assert not multiarray._get_madvise_hugepage()
        a = np.ones(1 << 20)
        assert a.sum() == 1 << 20
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NUMPY_MADVISE_HUGEPAGE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
