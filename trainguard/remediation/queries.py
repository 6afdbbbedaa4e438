"""Reads of the store: the audit trail, directives waiting for a rank, breakers, counts."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, RowMapping, text

from trainguard.contract import Action
from trainguard.remediation import reports
from trainguard.remediation.actions import failure_of
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
_ACTION_BY_ID = text(_ACTION_SQL + " WHERE actions.id = :id")
_TRANSITIONS = text("SELECT state, at, note FROM transitions WHERE action_id = :id ORDER BY id")
_IDS_IN_STATE = text("SELECT id FROM actions WHERE state = :state ORDER BY id LIMIT :limit")
_NEXT_RUNNABLE = text("""
    SELECT id FROM actions AS later
    WHERE state = :queued AND NOT EXISTS (
        SELECT 1 FROM actions AS earlier
        WHERE earlier.alert_id = later.alert_id AND earlier.step < later.step
          AND earlier.state IN (:queued, :running))
    ORDER BY id LIMIT 1
    """)
_AWAITED_OUTPUT = text("SELECT output FROM actions WHERE id = :id AND state = :running")
_PENDING_DIRECTIVES = text("""
    SELECT * FROM directives d
    WHERE d.job_id = :job_id AND (d.rank IS NULL OR d.rank = :rank) AND d.created_at >= :since
      AND NOT EXISTS (
          SELECT 1 FROM directive_acks a WHERE a.directive_id = d.id AND a.rank = :rank)
    ORDER BY d.id LIMIT :limit
    """)
_BREAKERS = text("SELECT * FROM breakers ORDER BY subject")
_STATE_COUNTS = text("SELECT state, COUNT(*) AS n FROM actions GROUP BY state")


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _view(conn: Connection, row: RowMapping) -> ActionView:
    transitions = [
        Transition(state=t["state"], at=_time(t["at"]), note=t["note"])
        for t in conn.execute(_TRANSITIONS, {"id": row["id"]}).mappings()
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
        action=Action(row["action"]),
        failure=failure_of(row["alert_name"]),
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
    conn: Connection,
    *,
    state: ActionState | None = None,
    subject: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[ActionView]:
    where: list[str] = []
    args: dict[str, Any] = {"limit": limit}
    if state is not None:
        where.append("actions.state = :state")
        args["state"] = state.value
    if subject is not None:
        where.append("actions.subject = :subject")
        args["subject"] = subject
    if before_id is not None:
        where.append("actions.id < :before_id")
        args["before_id"] = before_id
    sql = _ACTION_SQL + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY actions.id DESC LIMIT :limit"
    rows = conn.execute(text(sql), args).mappings().all()
    return [_view(conn, row) for row in rows]


def get_action(conn: Connection, action_id: int) -> ActionView | None:
    row = conn.execute(_ACTION_BY_ID, {"id": action_id}).mappings().first()
    return None if row is None else _view(conn, row)


def action_record(conn: Connection, action_id: int) -> tuple[ActionRecord, dict[str, Any] | None]:
    row = conn.execute(_ACTION_BY_ID, {"id": action_id}).mappings().one()
    record = ActionRecord(
        id=row["id"],
        action=Action(row["action"]),
        executor=row["executor"],
        subject=row["subject"],
        params=json.loads(row["params"]),
        alertname=row["alert_name"],
        labels=json.loads(row["labels"]),
    )
    snapshot = None if row["snapshot"] is None else json.loads(row["snapshot"])
    return record, snapshot


def ids_in_state(conn: Connection, state: ActionState, limit: int = 1) -> list[int]:
    ids = conn.execute(_IDS_IN_STATE, {"state": state.value, "limit": limit}).scalars()
    return [int(action_id) for action_id in ids]


def next_runnable(conn: Connection) -> int | None:
    """The oldest queued action no earlier step of its plan is still ahead of (queued, or
    running: a directive waiting for the ranks' acknowledgements holds back what follows it)."""
    action_id = conn.execute(
        _NEXT_RUNNABLE,
        {"queued": ActionState.QUEUED.value, "running": ActionState.RUNNING.value},
    ).scalar()
    return None if action_id is None else int(action_id)


def awaited_output(conn: Connection, action_id: int) -> dict[str, Any] | None:
    """What a running action's execution returned, stored while it waits for others (the
    ranks' acknowledgements); None when it is not running or not carried out yet."""
    stored = conn.execute(
        _AWAITED_OUTPUT, {"id": action_id, "running": ActionState.RUNNING.value}
    ).scalar()
    if stored is None:
        return None
    output: dict[str, Any] = json.loads(stored)
    return output


def pending_directives(
    conn: Connection, job_id: str, rank: int, since: float, limit: int = 100
) -> list[Directive]:
    rows = conn.execute(
        _PENDING_DIRECTIVES, {"job_id": job_id, "rank": rank, "since": since, "limit": limit}
    ).mappings()
    return [
        Directive(
            id=row["id"],
            job_id=row["job_id"],
            rank=row["rank"],
            kind=Action(row["kind"]),
            params=json.loads(row["params"]),
            created_at=_time(row["created_at"]),
        )
        for row in rows
    ]


def breakers(conn: Connection) -> list[Breaker]:
    return [
        Breaker(subject=row["subject"], tripped_at=_time(row["tripped_at"]), reason=row["reason"])
        for row in conn.execute(_BREAKERS).mappings()
    ]


def state_counts(conn: Connection) -> dict[str, int]:
    return {row["state"]: int(row["n"]) for row in conn.execute(_STATE_COUNTS).mappings()}
