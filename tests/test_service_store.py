"""The service's store: commits append to the write-ahead log and never copy it into the
database themselves (no request waits for a disk flush); the checkpointer thread does, on
its own schedule; everything written is read back, also by a fresh connection."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fabricpilot.service.store import Store


def _write_2mb(store: Store) -> None:
    for i in range(200):  # 200 intents of ~10 kB each: ~2 MB of log
        store.put_job(f"j{i}", "acme", {"task_id": f"j{i}", "pad": "x" * 10_000})


def test_commits_leave_the_log_to_the_checkpointer(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", checkpoint_interval_s=3600.0)  # no checkpoint yet
    _write_2mb(store)
    db, wal = tmp_path / "db", tmp_path / "db-wal"
    assert wal.stat().st_size > 2_000_000  # every page went to the log...
    assert db.stat().st_size < 100_000  # ...and none into the database (SQLite would
    # have checkpointed at 1000 pages, ~4 MB, by itself; well below that here anyway)
    busy, frames, copied = store.checkpoint()
    assert busy == 0 and frames == copied > 400  # 2 MB in 4 kB pages
    assert db.stat().st_size > 2_000_000
    fresh = Store(db)
    assert len(fresh.jobs()) == 200  # a fresh connection reads it all
    fresh.close()
    store.close()


def _checkpointers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "fabricpilot-checkpoint"}


def test_the_checkpointer_copies_the_log_in_the_background(tmp_path: Path) -> None:
    before = _checkpointers()
    store = Store(tmp_path / "db", checkpoint_interval_s=0.05)
    _write_2mb(store)
    deadline = time.monotonic() + 10.0
    while (tmp_path / "db").stat().st_size < 2_000_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "db").stat().st_size > 2_000_000
    assert len(_checkpointers() - before) == 1
    store.close()
    assert _checkpointers() - before == set()  # close() stops it


def test_the_fault_log_is_bounded_but_keeps_every_links_last_state(tmp_path: Path) -> None:
    """A link reported down once, then 1 000 reports flapping two other links (a twin
    replaying its scenario's faults): the log keeps at most ``faults_kept`` + 10 % of the
    newest reports, and after a reopen the first link is still down."""
    s = Store(tmp_path / "s.db", faults_kept=100)
    s.add_fault(0.0, "down", 5, "cable pulled", "operator")
    for i in range(1000):
        s.add_fault(1.0 + i, "down" if i % 2 == 0 else "up", 7 + i % 4 // 2, "", "telemetry")
    s.close()
    s = Store(tmp_path / "s.db", faults_kept=100)
    try:
        assert s.link_states() == {5: ("down", "operator"), 7: ("up", "telemetry"),
                                   8: ("up", "telemetry")}
        kept = s.faults(limit=10_000)
        assert kept[0]["link_id"] == 5 and 100 <= len(kept) <= 1 + 110
        assert [f["at_s"] for f in kept[1:]] == sorted(f["at_s"] for f in kept[1:])
        assert kept[-1]["at_s"] == 1000.0
    finally:
        s.close()
