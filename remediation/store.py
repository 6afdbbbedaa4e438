"""Durable state: SQLite in WAL mode, one writer thread with group commit.

Every change goes through :meth:`Store.write`: a function that runs inside a transaction on the
writer thread. The writer takes whatever units are queued, runs each inside its own savepoint
(one failing unit does not undo the others), commits once and only then resolves the callers'
futures, so a caller that got a result knows its change is on disk. Batching many requests into
one fsync is what lets ``synchronous=FULL`` keep up with Alertmanager bursts.

Reads use one connection per thread; WAL lets them run while the writer commits.

Only SQLite is supported. A Postgres URL is refused at start-up rather than half-supported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    ends_at TEXT,
    generator_url TEXT NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    received_at REAL NOT NULL,
    notifications INTEGER NOT NULL DEFAULT 1,
    UNIQUE (fingerprint, starts_at)
);
CREATE INDEX IF NOT EXISTS alerts_status ON alerts (status);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    alert_id INTEGER NOT NULL REFERENCES alerts (id),
    step INTEGER NOT NULL,
    subject TEXT NOT NULL,
    action TEXT NOT NULL,
    executor TEXT NOT NULL,
    params TEXT NOT NULL,
    destructive INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    snapshot TEXT,
    output TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (alert_id, step)
);
CREATE INDEX IF NOT EXISTS actions_state ON actions (state, id);
CREATE INDEX IF NOT EXISTS actions_alert ON actions (alert_id);
CREATE INDEX IF NOT EXISTS actions_subject ON actions (subject, id);
CREATE TABLE IF NOT EXISTS transitions (
    id INTEGER PRIMARY KEY,
    action_id INTEGER NOT NULL REFERENCES actions (id),
    state TEXT NOT NULL,
    at REAL NOT NULL,
    note TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_action ON transitions (action_id, id);
CREATE TABLE IF NOT EXISTS directives (
    id INTEGER PRIMARY KEY,
    action_id INTEGER UNIQUE REFERENCES actions (id),
    job_id TEXT NOT NULL,
    rank INTEGER,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS directives_job ON directives (job_id, id);
CREATE TABLE IF NOT EXISTS directive_acks (
    directive_id INTEGER NOT NULL REFERENCES directives (id),
    rank INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (directive_id, rank)
);
CREATE TABLE IF NOT EXISTS deferred (
    alert_id INTEGER PRIMARY KEY REFERENCES alerts (id),
    due_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deferred_due ON deferred (due_at);
CREATE TABLE IF NOT EXISTS breakers (
    subject TEXT PRIMARY KEY,
    tripped_at REAL NOT NULL,
    reason TEXT NOT NULL
);
-- When an operator last reset a subject's breaker: its budget counts actions after this only.
CREATE TABLE IF NOT EXISTS budget_resets (
    subject TEXT PRIMARY KEY,
    reset_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    action_id INTEGER PRIMARY KEY REFERENCES actions (id),
    job_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    markdown TEXT,
    report TEXT,
    error TEXT
);
"""

_BATCH = 512


def _counted_index() -> str:
    # Imported late: the engine imports this module.
    from trainguard.remediation.engine import COUNTED_FILTER

    return (
        "CREATE INDEX IF NOT EXISTS actions_counted "
        f"ON actions (subject, action, created_at) WHERE {COUNTED_FILTER};"
    )


_STOP = object()


class StoreError(RuntimeError):
    """The store is closed or its database cannot be written."""


class Store:
    """The service's SQLite database."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        if str(path).startswith(("postgres:", "postgresql:")):
            raise StoreError("only SQLite is supported; a Postgres URL is not accepted")
        self.path = path
        self._synchronous = synchronous
        self._queue: queue.Queue[Any] = queue.Queue()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._writer_conn = self._connect()
        self._writer_conn.executescript(SCHEMA + _counted_index())
        self._writer = threading.Thread(
            target=self._write_loop, name="trainguard-remediation-writer", daemon=True
        )
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT below).
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    # --- writing ---------------------------------------------------------------------------
    def submit(self, unit: Callable[[sqlite3.Connection], T]) -> concurrent.futures.Future[T]:
        """Queue ``unit`` to run in a transaction; the future resolves after the commit."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(StoreError("the store is closed"))
            return future
        self._queue.put((unit, future))
        return future

    def write_sync(self, unit: Callable[[sqlite3.Connection], T]) -> T:
        return self.submit(unit).result()

    async def write(self, unit: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.wrap_future(self.submit(unit))

    def _write_loop(self) -> None:
        conn = self._writer_conn
        while True:
            first = self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            stop = False
            while len(batch) < _BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._run_batch(conn, batch)
            if stop:
                break
        # Anything queued behind the stop marker is refused, never left hanging.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item[1].set_running_or_notify_cancel():
                item[1].set_exception(StoreError("the store is closed"))
        conn.close()

    @staticmethod
    def _run_batch(
        conn: sqlite3.Connection,
        batch: list[tuple[Callable[[sqlite3.Connection], Any], concurrent.futures.Future[Any]]],
    ) -> None:
        # A caller that gave up (a cancelled future) gets nothing written; the others' futures
        # can no longer be cancelled, so resolving them below cannot fail.
        batch = [item for item in batch if item[1].set_running_or_notify_cancel()]
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for unit, _ in batch:
                conn.execute("SAVEPOINT unit")
                try:
                    result = unit(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO unit")
                    conn.execute("RELEASE unit")
                    outcomes.append((False, exc))
                else:
                    conn.execute("RELEASE unit")
                    outcomes.append((True, result))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            error = StoreError(f"commit failed: {exc}")
            for _, future in batch:
                future.set_exception(error)
            return
        for (ok, value), (_, future) in zip(outcomes, batch, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    # --- reading ---------------------------------------------------------------------------
    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query`` on this thread's read connection."""
        if self._closed:
            raise StoreError("the store is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return query(conn)

    def writer_alive(self) -> bool:
        return self._writer.is_alive() and not self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
