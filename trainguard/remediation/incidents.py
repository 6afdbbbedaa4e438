"""Incidents in the store: opened and joined by the webhook, followed by the verifier, read by the
API; and the nodes removed from jobs on purpose.

An incident is one failure of one subject (a job, or ``node:<name>``). It opens in the webhook's
transaction when a new firing alert matches a rule that repairs something (an action other than
``recommend`` in its plan or ladder); a second alert of the same failure on the same subject
joins the open incident instead. Every action planned for an incident's alerts is linked to it
with the rung it belongs to, so the verifier (:mod:`trainguard.remediation.verify`) sees what
each rung did. The webhook's share is a few statements; everything that needs Prometheus or
Alertmanager happens on the verifier's thread.

Membership: when an ``exclude_node`` or ``drain_node`` action succeeds for job J on node N, the
worker records the removal in the same transaction as the outcome. A later rank-scoped alert of
J on N is stored but not acted on (one ``skipped`` action says why) and opens no incident. The
removal lasts until the node is back in the job: the verifier marks it vacated once no rank of J
is up on N, and ends it when one is up there again (:func:`vacate`, :func:`rejoin`); the
vacated step keeps the removed ranks' last scrapes from ending it at once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, text

from trainguard import contract
from trainguard.contract import Action, Failure
from trainguard.remediation.actions import failure_of
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.models import (
    PENDING_STATES,
    ActionState,
    AlertStatus,
    IncidentState,
)
from trainguard.remediation.policy import Rule
from trainguard.remediation.sql import Statement

# States of an action whose part in its rung is not over yet.
UNFINISHED_STATES = (*PENDING_STATES, ActionState.RUNNING)
# A guard or an operator held the action back: nothing was done, and the ladder moves on. Not
# ``cancelled``: the alert resolved first, and the job gets its deadline to show progress.
HELD_STATES = (ActionState.SUPPRESSED, ActionState.SKIPPED, ActionState.REJECTED)
# Actions that take a node out of a job.
REMOVING = (Action.EXCLUDE_NODE, Action.DRAIN_NODE)
_CLOSED = IncidentState.CLOSED.value

# The two questions the webhook asks of a new alert, each asked once per notification (see
# :class:`Known`): which nodes were removed from its job on purpose, and has its subject an open
# incident of its failure?
_REMOVED = Statement("""
    SELECT r.node, MIN(r.action_id) FROM removals r
    LEFT JOIN removal_states s ON s.action_id = r.action_id
    WHERE r.job_id = :job_id AND s.rejoined_at IS NULL
    GROUP BY r.node
    """)
_OPEN = Statement(f"""
    SELECT id, rung, ladder_length FROM incidents
    WHERE subject = :subject AND failure_key = :failure_key AND state != '{_CLOSED}'
    """)
_INSERT_INCIDENT = Statement("""
    INSERT INTO incidents (subject, job_id, failure, failure_key, alert_id, ladder_alert_id,
                           ladder_length, state, rung, rung_action, rung_started_at, paged,
                           first_evidence_at, detected_at, received_at, note)
    VALUES (:subject, :job_id, :failure, :failure_key, :alert_id, :alert_id, :ladder_length,
            :state, 0, :rung_action, :at, 0, :detected_at, :detected_at, :at, :note)
    RETURNING id
    """)
_JOIN = Statement(
    "INSERT INTO incident_alerts (alert_id, incident_id) VALUES (:alert_id, :incident_id) "
    "ON CONFLICT (alert_id) DO NOTHING"
)
_SET_LADDER = Statement(
    "UPDATE incidents SET ladder_alert_id = :alert_id, ladder_length = :ladder_length "
    "WHERE id = :id"
)
_LINK = Statement(f"""
    INSERT INTO incident_actions (action_id, incident_id, rung)
    SELECT a.id, i.id, i.rung FROM actions a
    JOIN incident_alerts ia ON ia.alert_id = a.alert_id
    JOIN incidents i ON i.id = ia.incident_id
    WHERE a.alert_id = :alert_id AND i.state != '{_CLOSED}'
      AND NOT EXISTS (SELECT 1 FROM incident_actions x WHERE x.action_id = a.id)
    """)
_LINK_ACTION = Statement(
    "INSERT INTO incident_actions (action_id, incident_id, rung) "
    "VALUES (:action_id, :incident_id, :rung)"
)
_RECORD_REMOVAL = Statement(
    "INSERT INTO removals (action_id, job_id, node, at) VALUES (:action_id, :job_id, :node, :at) "
    "ON CONFLICT (action_id) DO NOTHING"
)
_MARK_PAGED = Statement(
    "UPDATE incidents SET paged = 1 WHERE id = "
    "(SELECT incident_id FROM incident_actions WHERE action_id = :action_id)"
)
_SET_VERDICT = Statement(
    "UPDATE incident_actions SET verdict = :verdict WHERE action_id = :action_id"
)
_ADVANCE = Statement(f"""
    UPDATE incidents SET rung = :next, rung_action = :rung_action, rung_started_at = :at,
        state = :state, deadline_at = NULL, note = :note
    WHERE id = :id AND rung = :rung AND state != '{_CLOSED}'
    """)

INCIDENT_SQL = """
SELECT incidents.*, alerts.name AS alert_name, alerts.fingerprint, alerts.labels
FROM incidents JOIN alerts ON alerts.id = incidents.alert_id
"""
INCIDENT_BY_ID = text(INCIDENT_SQL + " WHERE incidents.id = :id")
_OPEN_IDS = text(f"SELECT id FROM incidents WHERE state != '{_CLOSED}' ORDER BY id")
# The alerts the verifier needs of an incident, however many joined it (an alert storm joins
# thousands): the first, the one whose rule sets the ladder, and one firing alert per name
# (the alerts of an incident share its subject, so a name is all Prometheus is asked about).
_ALERTS_OF = text(f"""
    SELECT a.id, a.name, a.labels, a.status, a.starts_at FROM alerts a WHERE a.id IN (
        SELECT MIN(ia.alert_id) FROM incident_alerts ia WHERE ia.incident_id = :id
        UNION SELECT :ladder_alert_id
        UNION SELECT MIN(f.id) FROM incident_alerts ia JOIN alerts f ON f.id = ia.alert_id
              WHERE ia.incident_id = :id AND f.status = '{AlertStatus.FIRING.value}'
              GROUP BY f.name)
    ORDER BY a.id
    """)
HELD_SQL = ", ".join(f"'{state.value}'" for state in HELD_STATES)
# The actions the verifier needs one by one: those not held back. A storm's alerts each plan an
# action that the guards hold back (a cooldown, the budget), all of them in the incident; read
# one by one, every open incident cost the verifier (and the GIL every request needs) time in
# proportion to the storm, every turn. Held-back actions need no verdict of the verifier's
# (the view's default says "held back" and why), so their rung's count and latest time suffice.
_ACTIONS_OF = text(f"""
    SELECT a.id, ia.rung, a.action, a.state, a.reason, a.created_at, a.updated_at
    FROM incident_actions ia JOIN actions a ON a.id = ia.action_id
    WHERE ia.incident_id = :id AND a.state NOT IN ({HELD_SQL}) ORDER BY a.id
    """)
_HELD_ON_RUNG = text(f"""
    SELECT COALESCE(SUM(CASE WHEN a.action != '{Action.RECOMMEND.value}' THEN 1 ELSE 0 END), 0),
        MAX(a.updated_at)
    FROM incident_actions ia JOIN actions a ON a.id = ia.action_id
    WHERE ia.incident_id = :id AND ia.rung = :rung AND a.state IN ({HELD_SQL})
    """)
_DEFERRED_OF = text("""
    SELECT 1 FROM deferred d JOIN incident_alerts ia ON ia.alert_id = d.alert_id
    WHERE ia.incident_id = :id
    """)
_REMOVALS_SINCE = text(
    "SELECT action_id, node FROM removals WHERE job_id = :job_id AND at >= :since ORDER BY at"
)
_OPEN_COUNTS = text(
    f"SELECT failure, COUNT(*) AS n FROM incidents WHERE state != '{_CLOSED}' GROUP BY failure"
)


def subject_of(labels: Mapping[str, str]) -> str:
    """Who an action or incident is about: the job, else ``node:<name>`` ('' for neither)."""
    job_id = labels.get(contract.LABEL_JOB_ID, "")
    node = labels.get(contract.LABEL_NODE, "")
    return job_id or (f"node:{node}" if node else "")


# --- the webhook -----------------------------------------------------------------------------
@dataclass
class Open:
    """An open incident as the webhook sees it."""

    id: int
    rung: int
    ladder_length: int


def _failure_key(alertname: str) -> str:
    failure = failure_of(alertname)
    return failure.value if failure is not None else f"alert:{alertname}"


class Known:
    """What one webhook (or sweep) unit has learned of incidents and removals, and the links it
    owes.

    An Alertmanager notification groups alerts of one job: the first of its alerts asks the
    store, the others find the answer here (statements are most of the webhook's cost). The
    unit keeps the answers true itself: it runs on the store's only writer (on Postgres, under
    the writers' lock), and only its own incidents change meanwhile; removals are recorded by
    the worker's units, never by this one. Rows linking alerts and actions to incidents are
    written in bulk by :meth:`flush`, which the engine calls before anything reads them.
    """

    def __init__(self) -> None:
        self._removed: dict[str, dict[str, int]] = {}
        self._open: dict[tuple[str, str], Open | None] = {}
        self._joins: list[dict[str, Any]] = []
        self._links: list[dict[str, Any]] = []

    def removal(self, conn: Connection, labels: Mapping[str, str]) -> int | None:
        """The action that removed a rank-scoped alert's node from its job on purpose, if one
        did; None for alerts not about a rank."""
        job_id = labels.get(contract.LABEL_JOB_ID)
        node = labels.get(contract.LABEL_NODE)
        if not (job_id and node and labels.get(contract.LABEL_RANK)):
            return None
        removed = self._removed.get(job_id)
        if removed is None:
            rows = _REMOVED.rows(conn, {"job_id": job_id})
            removed = self._removed[job_id] = {name: int(first) for name, first in rows}
        return removed.get(node)

    def open_or_join(
        self,
        conn: Connection,
        rule: Rule,
        alert_id: int,
        alertname: str,
        labels: Mapping[str, str],
        starts_at: datetime,
        at: float,
    ) -> tuple[int, int] | None:
        """Open an incident for a new alert, or join its subject's open one of the same
        failure; (its id, its rung), or None when the alert names no subject. The incident
        climbs the longest of its alerts' ladders."""
        subject = subject_of(labels)
        if not subject:
            return None
        key = (subject, _failure_key(alertname))
        if key in self._open:
            found = self._open[key]
        else:
            row = _OPEN.first(conn, {"subject": subject, "failure_key": key[1]})
            found = None if row is None else Open(int(row[0]), int(row[1]), int(row[2]))
            self._open[key] = found
        if found is not None:
            self._joins.append({"alert_id": alert_id, "incident_id": found.id})
            if len(rule.escalate) > found.ladder_length:
                found.ladder_length = len(rule.escalate)
                _SET_LADDER.run(
                    conn,
                    {"alert_id": alert_id, "ladder_length": found.ladder_length, "id": found.id},
                )
            return found.id, found.rung
        failure = failure_of(alertname)
        row = _INSERT_INCIDENT.first(
            conn,
            {
                "subject": subject,
                "job_id": labels.get(contract.LABEL_JOB_ID) or None,
                "failure": None if failure is None else failure.value,
                "failure_key": key[1],
                "alert_id": alert_id,
                "ladder_length": len(rule.escalate),
                "state": IncidentState.ACTING.value,
                "rung_action": rule.rung_action(0).value,
                "at": at,
                "detected_at": starts_at.timestamp(),
                "note": f"opened by {alertname}",
            },
        )
        assert row is not None  # INSERT ... RETURNING id
        opened = self._open[key] = Open(int(row[0]), 0, len(rule.escalate))
        self._joins.append({"alert_id": alert_id, "incident_id": opened.id})
        return opened.id, 0

    def link_new(self, action_ids: list[int], incident_id: int, rung: int) -> None:
        """Link a new alert's actions (all planned just now) to the incident it opened or joined:
        the plan's steps of the alert that opened it are planned while the incident is on rung
        0 (a rung is not done while steps of it are still to come), a joining alert's steps on
        whatever rung it is on."""
        self._links += (
            {"action_id": action_id, "incident_id": incident_id, "rung": rung}
            for action_id in action_ids
        )

    def flush(self, conn: Connection) -> None:
        """Write the joins and links owed."""
        _JOIN.many(conn, self._joins)
        _LINK_ACTION.many(conn, self._links)
        self._joins.clear()
        self._links.clear()


def link(conn: Connection, alert_id: int) -> None:
    """Link the alert's actions planned since the last call to its open incident, if any."""
    _LINK.run(conn, {"alert_id": alert_id})


def link_action(conn: Connection, action_id: int, incident_id: int, rung: int) -> None:
    _LINK_ACTION.run(conn, {"action_id": action_id, "incident_id": incident_id, "rung": rung})


# --- the worker ------------------------------------------------------------------------------
def action_finished(conn: Connection, record: ActionRecord, state: ActionState, at: float) -> None:
    """What an action's outcome means for incidents, in the outcome's transaction: a node
    removed from its job, an incident paged."""
    if state is not ActionState.SUCCEEDED:
        return
    if record.action in REMOVING:
        job_id = record.labels.get(contract.LABEL_JOB_ID)
        node = record.labels.get(contract.LABEL_NODE)
        if job_id and node:
            _RECORD_REMOVAL.run(
                conn, {"action_id": record.id, "job_id": job_id, "node": node, "at": at}
            )
    elif record.action is Action.PAGE:
        _MARK_PAGED.run(conn, {"action_id": record.id})


# --- the verifier ----------------------------------------------------------------------------
@dataclass(frozen=True)
class AlertFacts:
    id: int
    name: str
    labels: dict[str, str]
    status: AlertStatus
    starts_at: float


@dataclass(frozen=True)
class ActionFacts:
    id: int
    rung: int
    action: Action
    state: ActionState
    reason: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class OpenIncident:
    """What the verifier needs to judge an open incident."""

    id: int
    subject: str
    job_id: str | None
    failure: Failure | None
    state: IncidentState
    rung: int
    rung_action: str
    rung_started_at: float
    ladder: AlertFacts
    alerts: tuple[AlertFacts, ...]  # the first, the ladder's, one firing alert per name
    actions: tuple[ActionFacts, ...]  # every rung's, less those held back
    # The current rung's actions held back: how many were repairs (not advice), and when the
    # latest of them was decided (None when none was held back).
    held_repairs: int
    held_last_at: float | None
    deferred: bool
    first_evidence_at: float | None
    detected_at: float
    received_at: float
    acted_at: float | None
    deadline_at: float | None
    baseline_step: int | None
    baseline_ranks_up: int | None
    baseline_at: float | None
    note: str

    @property
    def node(self) -> str | None:
        for alert in self.alerts:
            if alert.labels.get(contract.LABEL_NODE):
                return alert.labels[contract.LABEL_NODE]
        return None


def _alert_facts(row: RowMapping) -> AlertFacts:
    return AlertFacts(
        id=int(row["id"]),
        name=row["name"],
        labels=json.loads(row["labels"]),
        status=AlertStatus(row["status"]),
        starts_at=datetime.fromisoformat(row["starts_at"]).timestamp(),
    )


def open_incidents(conn: Connection) -> list[OpenIncident]:
    found = []
    for incident_id in conn.execute(_OPEN_IDS).scalars().all():
        incident = _open_incident(conn, int(incident_id))
        if incident is not None:
            found.append(incident)
    return found


def _open_incident(conn: Connection, incident_id: int) -> OpenIncident | None:
    row = conn.execute(INCIDENT_BY_ID, {"id": incident_id}).mappings().first()
    if row is None:
        return None
    found = conn.execute(_ALERTS_OF, {"id": incident_id, "ladder_alert_id": row["ladder_alert_id"]})
    alerts = tuple(_alert_facts(a) for a in found.mappings())
    ladder = next(a for a in alerts if a.id == row["ladder_alert_id"])
    actions = tuple(
        ActionFacts(
            id=int(a["id"]),
            rung=int(a["rung"]),
            action=Action(a["action"]),
            state=ActionState(a["state"]),
            reason=a["reason"],
            created_at=float(a["created_at"]),
            updated_at=float(a["updated_at"]),
        )
        for a in conn.execute(_ACTIONS_OF, {"id": incident_id}).mappings()
    )
    held_repairs, held_last_at = conn.execute(
        _HELD_ON_RUNG, {"id": incident_id, "rung": row["rung"]}
    ).one()
    failure = row["failure"]
    return OpenIncident(
        id=incident_id,
        subject=row["subject"],
        job_id=row["job_id"],
        failure=None if failure is None else Failure(failure),
        state=IncidentState(row["state"]),
        rung=int(row["rung"]),
        rung_action=row["rung_action"],
        rung_started_at=float(row["rung_started_at"]),
        ladder=ladder,
        alerts=alerts,
        actions=actions,
        held_repairs=int(held_repairs),
        held_last_at=None if held_last_at is None else float(held_last_at),
        deferred=conn.execute(_DEFERRED_OF, {"id": incident_id}).first() is not None,
        first_evidence_at=row["first_evidence_at"],
        detected_at=float(row["detected_at"]),
        received_at=float(row["received_at"]),
        acted_at=row["acted_at"],
        deadline_at=row["deadline_at"],
        baseline_step=None if row["baseline_step"] is None else int(row["baseline_step"]),
        baseline_ranks_up=row["baseline_ranks_up"],
        baseline_at=row["baseline_at"],
        note=row["note"],
    )


@dataclass(frozen=True)
class Removal:
    """A node taken out of a job on purpose that has not rejoined it."""

    action_id: int
    job_id: str
    node: str
    at: float
    vacated_at: float | None


_ACTIVE_REMOVALS = text("""
    SELECT r.action_id, r.job_id, r.node, r.at, s.vacated_at FROM removals r
    LEFT JOIN removal_states s ON s.action_id = r.action_id
    WHERE s.rejoined_at IS NULL
    ORDER BY r.action_id
    """)
_VACATE = text(
    "INSERT INTO removal_states (action_id, vacated_at) VALUES (:action_id, :at) "
    "ON CONFLICT (action_id) DO NOTHING"
)
_REJOIN = text(
    "UPDATE removal_states SET rejoined_at = :at "
    "WHERE action_id = :action_id AND vacated_at IS NOT NULL AND rejoined_at IS NULL"
)


def active_removals(conn: Connection) -> list[Removal]:
    """Every removal whose node has not rejoined its job, oldest first."""
    return [
        Removal(int(action_id), job_id, node, float(at), vacated_at)
        for action_id, job_id, node, at, vacated_at in conn.execute(_ACTIVE_REMOVALS)
    ]


def vacate(conn: Connection, action_id: int, at: float) -> bool:
    """Mark a removal's node as left by the job's ranks; False if it already was."""
    return conn.execute(_VACATE, {"action_id": action_id, "at": at}).rowcount == 1


def rejoin(conn: Connection, action_id: int, at: float) -> bool:
    """End a vacated removal: the node serves the job again. False if it was not vacated or
    already ended."""
    return conn.execute(_REJOIN, {"action_id": action_id, "at": at}).rowcount == 1


def removals_since(conn: Connection, job_id: str, since: float) -> list[tuple[int, str]]:
    """The (action, node) removals from ``job_id`` at or after ``since``."""
    rows = conn.execute(_REMOVALS_SINCE, {"job_id": job_id, "since": since})
    return [(int(action_id), node) for action_id, node in rows]


@functools.lru_cache(maxsize=32)
def _update_sql(columns: tuple[str, ...]) -> Statement:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    return Statement(
        f"UPDATE incidents SET {assignments} WHERE id = :id AND rung = :rung "
        f"AND state != '{_CLOSED}'"
    )


def update(conn: Connection, incident_id: int, rung: int, **columns: Any) -> bool:
    """Change an open incident still on ``rung``; False when it moved on or closed meanwhile."""
    sql = _update_sql(tuple(sorted(columns)))
    return sql.run(conn, {"id": incident_id, "rung": rung, **columns}) > 0


def set_verdicts(conn: Connection, verdicts: Mapping[int, str]) -> None:
    for action_id, verdict in verdicts.items():
        _SET_VERDICT.run(conn, {"action_id": action_id, "verdict": verdict})


def advance(
    conn: Connection, incident_id: int, rung: int, rung_action: Action, at: float, note: str
) -> bool:
    """Move an open incident from ``rung`` to the next (compare-and-set)."""
    values = {
        "id": incident_id,
        "rung": rung,
        "next": rung + 1,
        "rung_action": rung_action.value,
        "at": at,
        "state": IncidentState.ACTING.value,
        "note": note,
    }
    return _ADVANCE.run(conn, values) > 0


def open_counts(conn: Connection) -> dict[str | None, int]:
    return {row["failure"]: int(row["n"]) for row in conn.execute(_OPEN_COUNTS).mappings()}
