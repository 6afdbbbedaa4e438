"""Incidents as the API shows them: each failure, what was tried and what the verifier concluded.

``GET /v1/incidents`` and the page the service posts read these views; diagnose reads the same
documents (its Validate step). A storm's held-back actions are one entry per rung, action and
state, with their count and the latest time.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, RowMapping, text

from trainguard.contract import Failure, IncidentOutcome, JobOutcome
from trainguard.remediation.incidents import (
    HELD_SQL,
    HELD_STATES,
    INCIDENT_BY_ID,
    INCIDENT_SQL,
    UNFINISHED_STATES,
)
from trainguard.remediation.models import (
    ActionState,
    IncidentAlert,
    IncidentState,
    IncidentView,
    TriedAction,
)

# What an incident tried: each action not held back, and the held-back ones of a rung, action
# and state as one entry (the first of them, how many, the latest): a storm holds back one
# action per alert, and the view, the page's description and diagnose list these entries.
_TRIED = text(f"""
    SELECT * FROM (
        SELECT ia.rung, ia.verdict, a.id, a.action, a.state, a.reason, a.created_at,
            1 AS alike, a.created_at AS last_at
        FROM incident_actions ia JOIN actions a ON a.id = ia.action_id
        WHERE ia.incident_id = :id AND a.state NOT IN ({HELD_SQL})
        UNION ALL
        SELECT held.rung, ia.verdict, a.id, a.action, a.state, a.reason, a.created_at,
            held.alike, held.last_at
        FROM (
            SELECT ia.rung, MIN(a.id) AS first, COUNT(*) AS alike, MAX(a.created_at) AS last_at
            FROM incident_actions ia JOIN actions a ON a.id = ia.action_id
            WHERE ia.incident_id = :id AND a.state IN ({HELD_SQL})
            GROUP BY ia.rung, a.action, a.state
        ) held
        JOIN actions a ON a.id = held.first JOIN incident_actions ia ON ia.action_id = a.id
    ) tried ORDER BY tried.id
    """)
_INCIDENT_OF_ACTION = text("SELECT incident_id FROM incident_actions WHERE action_id = :id")


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc)


def _default_verdict(state: ActionState, reason: str, incident_open: bool) -> str:
    if state in UNFINISHED_STATES:
        return f"not done yet ({state.value})"
    if state in HELD_STATES:
        return f"held back: {reason}"
    if state is ActionState.CANCELLED:
        return f"cancelled: {reason}"
    return "being verified" if incident_open else ""


def _view(conn: Connection, row: RowMapping) -> IncidentView:
    state = IncidentState(row["state"])
    tried = [
        TriedAction(
            rung=int(t["rung"]),
            action=t["action"],
            action_id=int(t["id"]),
            state=t["state"],
            at=datetime.fromtimestamp(t["created_at"], tz=timezone.utc),
            verdict=t["verdict"]
            or _default_verdict(
                ActionState(t["state"]), t["reason"], state is not IncidentState.CLOSED
            ),
            count=int(t["alike"]),
            last_at=datetime.fromtimestamp(t["last_at"], tz=timezone.utc),
        )
        for t in conn.execute(_TRIED, {"id": row["id"]}).mappings()
    ]
    return IncidentView(
        id=row["id"],
        subject=row["subject"],
        job_id=row["job_id"],
        failure=None if row["failure"] is None else Failure(row["failure"]),
        alert=IncidentAlert(
            name=row["alert_name"],
            fingerprint=row["fingerprint"],
            labels=json.loads(row["labels"]),
        ),
        state=state,
        outcome=None if row["outcome"] is None else IncidentOutcome(row["outcome"]),
        job_outcome=None if row["job_outcome"] is None else JobOutcome(row["job_outcome"]),
        rung=row["rung"],
        rung_action=row["rung_action"],
        paged=bool(row["paged"]),
        first_evidence_at=_time(row["first_evidence_at"]),
        detected_at=_time(row["detected_at"]),
        received_at=_time(row["received_at"]),
        acted_at=_time(row["acted_at"]),
        recovered_at=_time(row["recovered_at"]),
        closed_at=_time(row["closed_at"]),
        deadline_at=_time(row["deadline_at"]),
        baseline_step=row["baseline_step"],
        baseline_ranks_up=row["baseline_ranks_up"],
        tried=tried,
        note=row["note"],
    )


def list_incidents(
    conn: Connection,
    *,
    state: IncidentState | None = None,
    outcome: IncidentOutcome | None = None,
    job_id: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[IncidentView]:
    where: list[str] = []
    args: dict[str, Any] = {"limit": limit}
    for column, value in (
        ("state", None if state is None else state.value),
        ("outcome", None if outcome is None else outcome.value),
        ("job_id", job_id),
    ):
        if value is not None:
            where.append(f"incidents.{column} = :{column}")
            args[column] = value
    if before_id is not None:
        where.append("incidents.id < :before_id")
        args["before_id"] = before_id
    sql = INCIDENT_SQL + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY incidents.id DESC LIMIT :limit"
    return [_view(conn, row) for row in conn.execute(text(sql), args).mappings().all()]


def get_incident(conn: Connection, incident_id: int) -> IncidentView | None:
    row = conn.execute(INCIDENT_BY_ID, {"id": incident_id}).mappings().first()
    return None if row is None else _view(conn, row)


def incident_of_action(conn: Connection, action_id: int) -> IncidentView | None:
    """The incident an action was planned for, if any."""
    incident_id = conn.execute(_INCIDENT_OF_ACTION, {"id": action_id}).scalar()
    return None if incident_id is None else get_incident(conn, int(incident_id))
