"""The garbage-collector controls: pausing, promotion, and frozen start-up objects kept
frozen."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
