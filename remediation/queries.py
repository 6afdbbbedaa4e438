"""Reads of the store: the audit trail, directives waiting for a rank, breakers, counts."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import Any

from trainguard.remediation import reports
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.models import (
    ActionState,
    ActionView,
    AlertStatus,
    AlertSummary,
    Breaker,
    Directive,
    Transition,
)

_ACTION_SQL = """
SELECT actions.*, alerts.name AS alert_name, alerts.fingerprint, alerts.status AS alert_status,
       alerts.starts_at, alerts.received_at, alerts.labels, alerts.annotations
FROM actions JOIN alerts ON alerts.id = actions.alert_id
"""


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _view(conn: sqlite3.Connection, row: sqlite3.Row) -> ActionView:
    transitions = [
        Transition(state=t["state"], at=_time(t["at"]), note=t["note"])
        for t in conn.execute(
            "SELECT state, at, note FROM transitions WHERE action_id = ? ORDER BY id", (row["id"],)
        )
    ]
    return ActionView(
        id=row["id"],
        alert=AlertSummary(
            id=row["alert_id"],
            name=row["alert_name"],
            fingerprint=row["fingerprint"],
            status=AlertStatus(row["alert_status"]),
            starts_at=datetime.fromisoformat(row["starts_at"]),
            received_at=_time(row["received_at"]),
            labels=json.loads(row["labels"]),
            annotations=json.loads(row["annotations"]),
        ),
        step=row["step"],
        subject=row["subject"],
        action=row["action"],
        executor=row["executor"],
        params=json.loads(row["params"]),
        destructive=bool(row["destructive"]),
        state=ActionState(row["state"]),
        reason=row["reason"],
        output=None if row["output"] is None else json.loads(row["output"]),
        created_at=_time(row["created_at"]),
        updated_at=_time(row["updated_at"]),
        transitions=transitions,
        report=reports.report_path(row["id"]) if reports.has_report(conn, row["id"]) else None,
    )


def list_actions(
    conn: sqlite3.Connection,
    *,
    state: ActionState | None = None,
    subject: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[ActionView]:
    where: list[str] = []
    args: list[Any] = []
    if state is not None:
        where.append("actions.state = ?")
        args.append(state.value)
    if subject is not None:
        where.append("actions.subject = ?")
        args.append(subject)
    if before_id is not None:
        where.append("actions.id < ?")
        args.append(before_id)
    sql = _ACTION_SQL + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY actions.id DESC LIMIT ?"
    rows = conn.execute(sql, [*args, limit]).fetchall()
    return [_view(conn, row) for row in rows]


def get_action(conn: sqlite3.Connection, action_id: int) -> ActionView | None:
    row = conn.execute(_ACTION_SQL + " WHERE actions.id = ?", (action_id,)).fetchone()
    return None if row is None else _view(conn, row)


def action_record(
    conn: sqlite3.Connection, action_id: int
) -> tuple[ActionRecord, dict[str, Any] | None]:
    row = conn.execute(_ACTION_SQL + " WHERE actions.id = ?", (action_id,)).fetchone()
    record = ActionRecord(
        id=row["id"],
        action=row["action"],
        executor=row["executor"],
        subject=row["subject"],
        params=json.loads(row["params"]),
        alertname=row["alert_name"],
        labels=json.loads(row["labels"]),
    )
    snapshot = None if row["snapshot"] is None else json.loads(row["snapshot"])
    return record, snapshot


def ids_in_state(conn: sqlite3.Connection, state: ActionState, limit: int = 1) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM actions WHERE state = ? ORDER BY id LIMIT ?", (state.value, limit)
    ).fetchall()
    return [int(row["id"]) for row in rows]


def next_runnable(conn: sqlite3.Connection) -> int | None:
    """The oldest queued action no earlier step of its plan is still ahead of (queued, or
    running: a directive waiting for the ranks' acknowledgements holds back what follows it)."""
    row = conn.execute(
        """
        SELECT id FROM actions AS later
        WHERE state = ? AND NOT EXISTS (
            SELECT 1 FROM actions AS earlier
            WHERE earlier.alert_id = later.alert_id AND earlier.step < later.step
              AND earlier.state IN (?, ?))
        ORDER BY id LIMIT 1
        """,
        (ActionState.QUEUED.value, ActionState.QUEUED.value, ActionState.RUNNING.value),
    ).fetchone()
    return None if row is None else int(row["id"])


def awaited_output(conn: sqlite3.Connection, action_id: int) -> dict[str, Any] | None:
    """What a running action's execution returned, stored while it waits for others (the
    ranks' acknowledgements); None when it is not running or not carried out yet."""
    row = conn.execute(
        "SELECT output FROM actions WHERE id = ? AND state = ?",
        (action_id, ActionState.RUNNING.value),
    ).fetchone()
    if row is None or row["output"] is None:
        return None
    output: dict[str, Any] = json.loads(row["output"])
    return output


def pending_directives(
    conn: sqlite3.Connection, job_id: str, rank: int, since: float, limit: int = 100
) -> list[Directive]:
    rows = conn.execute(
        """
        SELECT * FROM directives d
        WHERE d.job_id = ? AND (d.rank IS NULL OR d.rank = ?) AND d.created_at >= ?
          AND NOT EXISTS (
              SELECT 1 FROM directive_acks a WHERE a.directive_id = d.id AND a.rank = ?)
        ORDER BY d.id LIMIT ?
        """,
        (job_id, rank, since, rank, limit),
    ).fetchall()
    return [
        Directive(
            id=row["id"],
            job_id=row["job_id"],
            rank=row["rank"],
            kind=row["kind"],
            params=json.loads(row["params"]),
            created_at=_time(row["created_at"]),
        )
        for row in rows
    ]


def breakers(conn: sqlite3.Connection) -> list[Breaker]:
    return [
        Breaker(subject=row["subject"], tripped_at=_time(row["tripped_at"]), reason=row["reason"])
        for row in conn.execute("SELECT * FROM breakers ORDER BY subject")
    ]


def state_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {
        row["state"]: int(row["n"])
        for row in conn.execute("SELECT state, COUNT(*) AS n FROM actions GROUP BY state")
    }
