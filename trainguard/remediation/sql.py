"""How the remediation service's write path runs its SQL (see :class:`Statement`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.exc import DBAPIError


class Statement:
    """A statement of the write path: compiled once per dialect by SQLAlchemy, run on the DBAPI
    cursor of the unit's connection (inside its transaction), rows returned as tuples.

    The webhook runs two or three statements per alert and a few per notification. Executed
    through ``Connection.execute``, SQLAlchemy's per-execution work (cache lookup, parameter
    and result set-up) cost over twice SQLite's own and halved the webhook's throughput
    (``benchmarks/remediation_load.py``: 1610 against 3700 alerts/s), so this path keeps
    SQLAlchemy's dialects, compiler and pool and leaves out the rest. Parameters are named
    (``:name``) and may repeat; the driver's errors are raised as SQLAlchemy's.
    """

    def __init__(self, sql: str) -> None:
        self._clause = text(sql)
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None]] = {}

    def _compile(self, conn: Connection) -> tuple[str, tuple[str, ...] | None]:
        dialect = conn.dialect
        compiled = self._compiled.get(dialect.name)
        if compiled is None:
            done = self._clause.compile(dialect=dialect)
            order = tuple(done.positiontup or ()) if done.positional else None
            compiled = self._compiled[dialect.name] = (done.string, order)
        return compiled

    def _cursor(
        self,
        conn: Connection,
        params: Mapping[str, Any],
        many: Sequence[Mapping[str, Any]] | None = None,
    ) -> DBAPICursor:
        dialect = conn.dialect
        sql, order = self._compile(conn)
        values: Any
        if many is None:
            values = dict(params) if order is None else tuple(params[name] for name in order)
        elif order is None:
            values = many
        else:
            values = [tuple(row[name] for name in order) for row in many]
        dbapi_error = dialect.loaded_dbapi.Error
        cursor: DBAPICursor | None = None
        try:
            cursor = conn.connection.cursor()
            if many is None:
                cursor.execute(sql, values)
            else:
                cursor.executemany(sql, values)
        except dbapi_error as exc:
            # As SQLAlchemy does on its own path: a lost connection is invalidated, so that the
            # pool replaces it, and the driver's error is raised as SQLAlchemy's
            # (IntegrityError, OperationalError, ...).
            lost = dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor)
            if cursor is not None:
                with contextlib.suppress(dbapi_error):  # a cursor of a dead connection
                    cursor.close()
            if lost:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                sql, values, exc, dbapi_error, connection_invalidated=lost, dialect=dialect
            ) from exc
        return cursor

    def run(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Execute; the number of rows changed."""
        cursor = self._cursor(conn, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per parameter set, in one driver call (a unit's rows written in bulk:
        SQLite runs the prepared statement in a C loop, psycopg pipelines it)."""
        if rows:
            self._cursor(conn, {}, rows).close()

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Execute; every row."""
        cursor = self._cursor(conn, params)
        try:
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def first(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Execute; the first row, if any."""
        found = self.rows(conn, params)
        return found[0] if found else None
