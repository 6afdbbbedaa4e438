"""Durable state through SQLAlchemy Core: SQLite (WAL) by default, or Postgres from a URL.

Every change goes through :meth:`Store.write`: a function that runs inside a transaction on the
writer thread. The writer takes whatever units are queued, runs each inside its own savepoint
(one failing unit does not undo the others), commits once and only then resolves the callers'
futures, so a caller that got a result knows its change is on disk. Batching many requests into
one fsync is what lets ``synchronous=FULL`` (or Postgres's ``fsync``) keep up with Alertmanager
bursts.

Reads run on pooled connections; SQLite's WAL (or Postgres's MVCC) lets them run while the
writer commits.

SQLite is the embedded default (one process owns the file). A Postgres URL lets several service
replicas share one database: each replica's writer commits its own webhooks, taking a
transaction-level advisory lock first so that the replicas' decisions (which read and write the
guards' state) take turns; the state changes that claim and finish actions are compare-and-set
updates; and only the replica whose worker holds the session-level advisory lock
(:meth:`Store.hold_worker_lock`) executes actions. When that replica's session ends, the lock
is released and another replica's worker takes over (see the worker for when it resumes the
actions left ``running``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    make_url,
    text,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DataError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from trainguard.background import BackgroundThread
from trainguard.remediation.schema import metadata
from trainguard.remediation.sql import Statement

T = TypeVar("T")
log = logging.getLogger(__name__)

_BATCH = 512
_CHECKPOINT_SECONDS = 1.0
# Readers are the request threads (FastAPI's pool of 40) and the worker.
_POOL_SIZE = 8
_POOL_OVERFLOW = 40
# Which session-level advisory lock the replicas' workers contend for ("tg-remediation").
_WORKER_LOCK_KEY = 0x7467_2D72_656D
# The transaction-level lock every replica's writer takes first: decisions read the guards'
# state (cooldowns, budgets, breakers) and write to it, so replicas take turns ("tg-decide").
_WRITER_LOCK = Statement(f"SELECT pg_advisory_xact_lock({0x7467_2D64_6563})")
_WRITER_OPTION = "store_writer"  # an execution option of the writer's connection
_POSTGRES_CONNECT_ARGS = {
    # An unreachable host fails start-up and /readyz instead of hanging them.
    "connect_timeout": 5,
    # A dead or partitioned peer is noticed in about 30 s rather than the kernel's 2 hours:
    # the worker's lock and the writer's connection depend on it.
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    # Acknowledged means on disk, whatever the server's default; no statement hangs a thread.
    "options": "-c synchronous_commit=on -c statement_timeout=30000",
}
_STOP = object()
# A queued unit: the unit, its caller's future, and whether a request's answer waits for it.
_Queued = tuple[Callable[[Connection], Any], concurrent.futures.Future[Any], bool]
_SAVEPOINT = Statement("SAVEPOINT unit")
_RELEASE_SAVEPOINT = Statement("RELEASE SAVEPOINT unit")
_ROLLBACK_TO_SAVEPOINT = Statement("ROLLBACK TO SAVEPOINT unit")


class StoreError(RuntimeError):
    """The store is closed or its database cannot be reached or written."""


class CommitError(StoreError):
    """The batch a unit ran in was not committed (a lost connection, a failed commit): the unit
    itself may be fine, and running it again may succeed."""


class UnstorableError(ValueError):
    """The database refuses the data itself (a NUL character in a Postgres text, say): sending
    it again cannot succeed, so the webhook answers 422 rather than 503."""


def normalise_url(url: str) -> URL:
    """A Postgres URL on the psycopg 3 driver; raises StoreError for anything else."""
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - parsed lazily: a port that is no number raises here
    except (ArgumentError, ValueError) as exc:
        # Never the URL itself in the message: it holds the password.
        raise StoreError(f"the database URL cannot be parsed: {type(exc).__name__}") from None
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    raise StoreError(
        f"unsupported database URL scheme {parsed.drivername!r}: use postgresql:// "
        "(or leave the URL unset for SQLite)"
    )


def describe(url: URL) -> str:
    """Where the database is, for messages: never the password."""
    if url.get_backend_name() == "sqlite":
        return f"SQLite {url.database}"
    return f"Postgres at {url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"


def probe(url: str) -> None:
    """Connect to the Postgres database at ``url`` once; raises StoreError naming the host."""
    parsed = normalise_url(url)
    engine = create_engine(parsed, poolclass=NullPool, connect_args=_POSTGRES_CONNECT_ARGS)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot reach the database ({describe(parsed)}): {_reason(exc)}") from exc
    finally:
        engine.dispose()


def _as_store_error(exc: Exception) -> Exception:
    """A unit's database error as the error its caller handles: UnstorableError for data the
    database refuses (422), StoreError for the rest (503, Alertmanager retries); the unit's own
    errors (not found, conflict) as they are."""
    if not isinstance(exc, SQLAlchemyError):
        return exc
    error: Exception
    if isinstance(exc, DataError):
        error = UnstorableError(f"the database cannot store this: {_reason(exc)}")
    else:
        error = StoreError(f"the database refused the change: {_reason(exc)}")
    error.__cause__ = exc
    return error


def _reason(exc: SQLAlchemyError) -> str:
    """The driver's message, first line only (psycopg adds hints on the following ones)."""
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]


class Store:
    """The service's database: a SQLite file (a :class:`Path`) or a Postgres URL (a str)."""

    def __init__(self, location: Path | str, *, synchronous: str = "FULL") -> None:
        if isinstance(location, Path):
            self.url = URL.create("sqlite+pysqlite", database=str(location))
            self.engine = _sqlite_engine(self.url, synchronous)
        else:
            self.url = normalise_url(location)
            self.engine = create_engine(
                self.url,
                pool_size=_POOL_SIZE,
                max_overflow=_POOL_OVERFLOW,
                # A replica outlives database restarts: stale pooled connections are replaced.
                pool_pre_ping=True,
                connect_args=_POSTGRES_CONNECT_ARGS,
            )
        # Replicas share a Postgres database; a SQLite file has one service process.
        self.shared = self.engine.dialect.name == "postgresql"
        # Postgres keeps no NUL character in text (a JSON "\\u0000" decoded); SQLite does.
        self.refuses_nul = self.shared
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._lock_conn: Connection | None = None
        self._lock_mutex = threading.Lock()
        try:
            # An execution option, not ``info``: it outlives a reconnection of the writer.
            self._writer_conn = self.engine.connect().execution_options(**{_WRITER_OPTION: True})
            with self._writer_conn.begin():
                metadata.create_all(self._writer_conn)
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise StoreError(
                f"cannot open the database ({describe(self.url)}): {_reason(exc)}"
            ) from exc
        # A plain thread, not a BackgroundThread: the writer stops at a marker in its queue, so
        # that everything queued before close() is committed first, never at a flag.
        self._writer = threading.Thread(
            target=self._write_loop, name="trainguard-remediation-writer", daemon=True
        )
        self._writer.start()
        self._checkpointer: BackgroundThread | None = None
        if not self.shared:
            self._checkpointer = BackgroundThread(
                "trainguard-remediation-checkpoint", target=self._checkpoint_loop
            )
            self._checkpointer.start()

    # --- writing ---------------------------------------------------------------------------
    def submit(
        self, unit: Callable[[Connection], T], *, answering: bool = False
    ) -> concurrent.futures.Future[T]:
        """Queue ``unit`` to run in a transaction; the future resolves after the commit.
        ``answering``: a request's answer waits for it (see :meth:`write`)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(StoreError("the store is closed"))
            return future
        self._queue.put((unit, future, answering))
        return future

    def write_sync(self, unit: Callable[[Connection], T]) -> T:
        return self.submit(unit).result()

    async def write(self, unit: Callable[[Connection], T]) -> T:
        """``unit`` from a request that answers once it is committed: queued beside the
        background threads' units (a decision, a sweep), it commits first, on its own."""
        return await asyncio.wrap_future(self.submit(unit, answering=True))

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
            # The requests' units commit before the background threads' units queued with
            # them: a decision's unit runs for milliseconds, and the webhook's answers (what
            # Alertmanager waits for) would wait for it and for its share of the commit.
            answering = [item for item in batch if item[2]]
            if answering and len(answering) < len(batch):
                self._run_batch(conn, answering)
                self._run_batch(conn, [item for item in batch if not item[2]])
            else:
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

    def _run_batch(self, conn: Connection, queued: list[_Queued]) -> None:
        # A caller that gave up (a cancelled future) gets nothing written; the others' futures
        # can no longer be cancelled, so resolving them below cannot fail.
        batch = [item[:2] for item in queued if item[1].set_running_or_notify_cancel()]
        outcomes: list[tuple[bool, Any]] = []
        try:
            with conn.begin() as transaction:
                if self.shared:
                    _WRITER_LOCK.rows(conn, {})
                if len(batch) == 1:
                    # A unit alone needs no savepoint (two statements fewer on the path of a
                    # webhook's answer): when it raises, the whole transaction is its own.
                    try:
                        outcomes.append((True, batch[0][0](conn)))
                    except Exception as exc:
                        transaction.rollback()
                        outcomes.append((False, _as_store_error(exc)))
                else:
                    for unit, _ in batch:
                        _SAVEPOINT.run(conn, {})
                        try:
                            result = unit(conn)
                        except Exception as exc:
                            _ROLLBACK_TO_SAVEPOINT.run(conn, {})
                            _RELEASE_SAVEPOINT.run(conn, {})
                            outcomes.append((False, _as_store_error(exc)))
                        else:
                            _RELEASE_SAVEPOINT.run(conn, {})
                            outcomes.append((True, result))
        except Exception as exc:
            # Nothing of the batch is committed and nobody is told it is. A connection lost on
            # the way was invalidated where that was noticed (SQLAlchemy, or Statement); the
            # writer carries on with a new one at the next batch.
            error = CommitError(f"commit failed: {exc}")
            error.__cause__ = exc
            for _, future in batch:
                future.set_exception(error)
            return
        for (ok, value), (_, future) in zip(outcomes, batch, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _checkpoint_loop(self, thread: BackgroundThread) -> None:
        """Copy SQLite's WAL into the database file off the writer's path.

        SQLite's default checkpoint runs inside the commit that fills the WAL past 1000 pages:
        that commit, and every webhook waiting on it, then also writes those pages to the
        database file and fsyncs it. Connections here do not checkpoint on commit
        (``wal_autocheckpoint=0``); this thread does, PASSIVE (it never blocks the writer or
        readers), every second. The WAL restarts from its beginning once a checkpoint has
        caught up with it.
        """
        while not thread.sleep(_CHECKPOINT_SECONDS):
            try:
                with self.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
            except SQLAlchemyError:
                # The next turn tries again; meanwhile the WAL only grows.
                log.warning("SQLite checkpoint failed", exc_info=True)

    # --- reading ---------------------------------------------------------------------------
    def read(self, query: Callable[[Connection], T]) -> T:
        """Run ``query`` on a pooled connection, in one read transaction."""
        if self._closed:
            raise StoreError("the store is closed")
        try:
            with self.engine.connect() as conn:
                return query(conn)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot read the database: {_reason(exc)}") from exc

    # --- the worker's lock -----------------------------------------------------------------
    def hold_worker_lock(self) -> bool:
        """True while this process may execute actions (keeps or takes the lock).

        On Postgres the replicas' workers contend for one session-level advisory lock held by a
        dedicated connection: when the holder dies, its session ends and another replica takes
        over. A SQLite file has one service process, which always holds it.
        """
        if not self.shared:
            return True
        with self._lock_mutex:
            if self._lock_conn is not None:
                try:
                    self._lock_conn.execute(text("SELECT 1"))
                    return True
                except SQLAlchemyError:
                    # The session is gone and its lock with it: contend again below.
                    self._release_lock_conn()
            try:
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError:
                return False
            try:
                held = conn.execute(
                    text("SELECT pg_try_advisory_lock(:key)"), {"key": _WORKER_LOCK_KEY}
                ).scalar()
            except SQLAlchemyError:
                held = False
            if held:
                self._lock_conn = conn
                return True
            conn.close()
            return False

    def _release_lock_conn(self) -> None:
        if self._lock_conn is not None:
            # Closing without unlocking is enough (and all a broken session allows): the lock
            # belongs to the session, and a pooled connection's session could keep it.
            self._lock_conn.invalidate()
            self._lock_conn.close()
            self._lock_conn = None

    def writer_alive(self) -> bool:
        return self._writer.is_alive() and not self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        if self._checkpointer is not None:
            self._checkpointer.stop()
        with self._lock_mutex:
            self._release_lock_conn()
        self.engine.dispose()


def _sqlite_engine(url: URL, synchronous: str) -> Engine:
    engine = create_engine(
        url,
        pool_size=_POOL_SIZE,
        max_overflow=_POOL_OVERFLOW,
        connect_args={"check_same_thread": False, "timeout": 30.0},
    )

    # SQLAlchemy's documented pysqlite recipe: the driver's own transaction handling is turned
    # off and SQLAlchemy emits BEGIN itself, so that savepoints work and the writer's BEGIN is
    # IMMEDIATE (it takes the write lock up front instead of failing to upgrade mid-batch).
    @event.listens_for(engine, "connect")
    def connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        # Checkpoints run on their own thread (Store._checkpoint_loop), not inside commits.
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        writer = conn.get_execution_options().get(_WRITER_OPTION)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine
