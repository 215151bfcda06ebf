"""Durable controller state: jobs (intents), installed path sets, announced calls, the
fault log and the recent events (reroutes, heals, faults), in one SQLite database in WAL
mode.

Every write is its own transaction, committed before the API answers, so a ``kill -9`` loses
nothing that a client was told had happened. On start the service reads it all back
(:meth:`Store.load`) and re-syncs the data plane.

>>> s = Store(":memory:")
>>> s.put_job("j1", "acme", {"task_id": "j1"})
>>> s.jobs()
[('j1', 'acme', {'task_id': 'j1'})]
>>> s.add_fault(1.5, "down", 7, "cable pulled", "operator")
1
>>> s.faults()[0]["link_id"]
7
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricpilot.errors import FabricpilotError

log = logging.getLogger("fabricpilot.service")


class StoreError(FabricpilotError):
    """The database holds a row that cannot be read back (named: file, table, row)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    task_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    intent TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS paths (
    key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    pathset TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS paths_task ON paths(task_id);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_s REAL NOT NULL,
    kind TEXT NOT NULL,
    link_id INTEGER NOT NULL,
    detail TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_s REAL NOT NULL,
    task_id TEXT NOT NULL,
    call TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_task ON calls(task_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS withdrawn (
    task_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

EVENTS_KEPT = 10_000
"""Events kept in the store (older ones are dropped as new ones come)."""

CALLS_KEPT = 10_000
"""Announced calls kept per job (its newest: the most ``GET .../calls`` returns)."""

FAULTS_KEPT = 100_000
"""Fault reports kept in the store, besides the last of each link (older ones are dropped
as new ones come: a twin replaying its scenario's faults in a loop adds some every run)."""


class Store:
    """The service's SQLite database (``path``; ``":memory:"`` for a throw-away one).

    One connection, shared by the API's threads under a lock: SQLite serialises writers
    anyway, and the service's writes are small. A commit appends to the write-ahead log
    without waiting for the disk (durable against ``kill -9``, not against a power cut);
    the log is copied into the database, with its disk flushes, by a thread of its own every
    ``checkpoint_interval_s`` (on its own connection, never holding the writers' lock), so
    that no request waits for a flush."""

    def __init__(self, path: str | Path, *, checkpoint_interval_s: float = 1.0,
                 events_kept: int = EVENTS_KEPT, faults_kept: int = FAULTS_KEPT,
                 calls_kept: int = CALLS_KEPT) -> None:
        self.path = str(path)
        self.events_kept = events_kept
        self.faults_kept = faults_kept
        self.calls_kept = calls_kept
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable against kill -9
            self._db.execute("PRAGMA wal_autocheckpoint=0")  # (the checkpointer's job)
            self._checkpointer = threading.Thread(
                target=self._checkpoints, args=(checkpoint_interval_s,), daemon=True,
                name="fabricpilot-checkpoint")
        self._db.executescript(SCHEMA)
        if self._checkpointer is not None:
            self._checkpointer.start()

    def _checkpoints(self, interval_s: float) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            while not self._stop.wait(interval_s):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as err:  # busy or closing: the next round retries
                    log.debug("checkpoint", extra={"fields": {"error": str(err)}})
        finally:
            db.close()

    def checkpoint(self) -> tuple[int, int, int]:
        """Copy the write-ahead log into the database now (``(busy, log frames, frames
        copied)``, as SQLite's ``wal_checkpoint`` reports them)."""
        with self._lock:
            row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return (int(row[0]), int(row[1]), int(row[2]))

    def close(self) -> None:
        self._stop.set()
        if self._checkpointer is not None and self._checkpointer.is_alive():
            self._checkpointer.join(5.0)
        with self._lock:
            self._db.close()

    def _write(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    def damaged(self, table: str, row: str, why: object) -> StoreError:
        """The error for a row of ``table`` (``row`` names it) that cannot be read back."""
        return StoreError(f"{self.path}: table {table}, {row}: damaged row ({why})")

    def _loads(self, text: Any, table: str, row: str) -> Any:
        try:
            return json.loads(text)
        except (TypeError, ValueError) as err:
            raise self.damaged(table, row, err) from None

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------ jobs
    def put_job(self, task_id: str, tenant: str, intent: dict[str, Any]) -> None:
        encoded = json.dumps(intent)
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?)",
                             (task_id, tenant, encoded))
            self._db.execute("DELETE FROM withdrawn WHERE task_id = ?", (task_id,))
            self._db.execute("COMMIT")

    def delete_job(self, task_id: str, *, withdrawn: bool = False) -> None:
        """Forget a job: its intent, path sets and announced calls; with ``withdrawn``,
        remember that it was withdrawn (a job the data plane declares by itself, as the
        twin's scenario jobs, is then not declared again at a restart: :meth:`withdrawn`)."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM jobs WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM paths WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM calls WHERE task_id = ?", (task_id,))
            if withdrawn:
                self._db.execute("INSERT OR IGNORE INTO withdrawn VALUES (?)", (task_id,))
            self._db.execute("COMMIT")

    def counter(self, name: str) -> int:
        """The stored value of counter ``name`` (0 if never set)."""
        rows = self._read("SELECT value FROM counters WHERE name = ?", (name,))
        if not rows:
            return 0
        value = rows[0][0]
        if not isinstance(value, int) or value < 0:
            raise self.damaged("counters", f"name {name!r}", f"value {value!r}")
        return value

    def set_counter(self, name: str, value: int) -> None:
        self._write("INSERT OR REPLACE INTO counters VALUES (?, ?)", (name, value))

    def withdrawn(self) -> set[str]:
        """The task ids withdrawn with ``delete_job(withdrawn=True)`` and not declared
        since."""
        return {t for t, in self._read("SELECT task_id FROM withdrawn")}

    def jobs(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(t, ten, self._loads(i, "jobs", f"task_id {t!r}")) for t, ten, i in
                self._read("SELECT task_id, tenant, intent FROM jobs ORDER BY task_id")]

    # ------------------------------------------------------------------ paths
    def put_paths(self, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Replace the stored path sets of these keys: ``(key, task_id, pathset)``."""
        if not rows:
            return
        encoded = [(k, t, json.dumps(p)) for k, t, p in rows]  # outside the lock
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO paths VALUES (?, ?, ?)", encoded)
            self._db.execute("COMMIT")

    def delete_paths(self, keys: list[str]) -> None:
        """Forget the stored path sets of these keys (withdrawn from the switches)."""
        if not keys:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM paths WHERE key = ?", [(k,) for k in keys])
            self._db.execute("COMMIT")

    def paths(self) -> dict[str, dict[str, Any]]:
        return {k: self._loads(p, "paths", f"key {k!r}")
                for k, p in self._read("SELECT key, pathset FROM paths")}

    # ------------------------------------------------------------------ faults
    def add_fault(self, at_s: float, kind: str, link_id: int, detail: str, source: str) -> int:
        """Log a fault report; returns its id. The oldest reports go once there are
        ``faults_kept`` (checked every tenth of that many), except the last of each link:
        :meth:`link_states` stays whole.

        >>> s = Store(":memory:", faults_kept=2)
        >>> for i, (kind, link) in enumerate([("down", 1), ("gray", 2), ("up", 2), ("down", 3),
        ...                                   ("up", 3)]):
        ...     _ = s.add_fault(float(i), kind, link, "", "telemetry")
        >>> [(f["kind"], f["link_id"]) for f in s.faults()]  # (the gray report of 2 went)
        [('down', 1), ('up', 2), ('down', 3), ('up', 3)]
        >>> s.link_states()
        {1: ('down', 'telemetry'), 2: ('up', 'telemetry'), 3: ('up', 'telemetry')}
        """
        return self._append("INSERT INTO faults (at_s, kind, link_id, detail, source) "
                            "VALUES (?, ?, ?, ?, ?)", (at_s, kind, link_id, detail, source),
                            "DELETE FROM faults WHERE id <= ? AND id NOT IN "
                            "(SELECT MAX(id) FROM faults GROUP BY link_id)", self.faults_kept)

    def _append(self, insert: str, args: tuple[Any, ...], prune: str, kept: int) -> int:
        """Run ``insert`` (a row of a table with an increasing ``id``) and return the row's
        id; every tenth of ``kept`` rows, run ``prune`` with the highest id to drop (the
        rows before the last ``kept``; up to 10 % more are kept meanwhile)."""
        with self._lock:
            last = int(self._db.execute(insert, args).lastrowid or 0)
            if last % max(kept // 10, 1) == 0:  # (not a delete per row)
                self._db.execute(prune, (last - kept,))
        return last

    def link_states(self) -> dict[int, tuple[str, str]]:
        """The kind (``down``, ``up``, ``gray``) and source of the last fault report of each
        link reported, by link id."""
        return {int(lk): (str(kind), str(src)) for lk, kind, src in self._read(
            "SELECT link_id, kind, source FROM faults WHERE id IN "
            "(SELECT MAX(id) FROM faults GROUP BY link_id) ORDER BY link_id")}

    def faults(self, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._read("SELECT id, at_s, kind, link_id, detail, source FROM faults "
                          "ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(zip(("id", "at_s", "kind", "link_id", "detail", "source"), r, strict=True))
                for r in reversed(rows)]

    # ------------------------------------------------------------------ events
    def add_event(self, event: dict[str, Any]) -> None:
        """Keep one event (a JSON-able dict); the oldest go once there are ``events_kept``
        (checked every tenth of that many events: up to 10 % more are kept meanwhile).

        >>> s = Store(":memory:", events_kept=4)
        >>> for i in range(9): s.add_event({"kind": "heal", "n": i})
        >>> [e["n"] for e in s.events()], s.events(limit=2)[-1]
        ([5, 6, 7, 8], {'kind': 'heal', 'n': 8})
        """
        self._append("INSERT INTO events (event) VALUES (?)", (json.dumps(event),),
                     "DELETE FROM events WHERE id <= ?", self.events_kept)

    def events(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` events (default: ``events_kept``), oldest first."""
        if limit is None:
            limit = self.events_kept
        rows = self._read("SELECT id, event FROM events ORDER BY id DESC LIMIT ?", (limit,))
        return [self._loads(e, "events", f"id {i}") for i, e in reversed(rows)]

    # ------------------------------------------------------------------ calls
    def add_call(self, at_s: float, task_id: str, call: dict[str, Any]) -> None:
        """Log an announced call of ``task_id``; a job keeps its newest ``calls_kept``
        (a tenant announcing without end fills no disk).

        >>> s = Store(":memory:", calls_kept=2)
        >>> for n in range(5): s.add_call(float(n), "a" if n < 4 else "b", {"n": n})
        >>> [c["n"] for c in s.calls("a")], [c["n"] for c in s.calls("b")]
        ([2, 3], [4])
        """
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO calls (at_s, task_id, call) VALUES (?, ?, ?)",
                             (at_s, task_id, json.dumps(call)))
            self._db.execute("DELETE FROM calls WHERE task_id = ? AND id <= (SELECT id FROM "
                             "calls WHERE task_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                             (task_id, task_id, self.calls_kept))
            self._db.execute("COMMIT")

    def keep_calls(self, task_id: str, keep: Callable[[Any], bool]) -> int:
        """Delete the announced calls of a job that ``keep`` (given each stored call)
        refuses; returns how many went."""
        rows = self._read("SELECT id, call FROM calls WHERE task_id = ?", (task_id,))
        gone = [(i,) for i, c in rows if not keep(self._loads(c, "calls", f"id {i}"))]
        if gone:
            with self._lock:
                self._db.execute("BEGIN")
                self._db.executemany("DELETE FROM calls WHERE id = ?", gone)
                self._db.execute("COMMIT")
        return len(gone)

    def calls(self, task_id: str, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._read("SELECT id, at_s, call FROM calls WHERE task_id = ? ORDER BY id "
                          "DESC LIMIT ?", (task_id, limit))
        out = []
        for i, at, c in reversed(rows):
            call = self._loads(c, "calls", f"id {i}")
            if not isinstance(call, dict):
                raise self.damaged("calls", f"id {i}", "not a JSON object")
            out.append({"at_s": at, **call})
        return out
