"""How decisions are stored: the statements, and the unit of work every decision runs in.

Every method of :class:`.engine.Engine` and every function of :mod:`.operators` that changes
state returns a *unit*, a function the store's writer runs inside a transaction. :class:`Unit`
is what one unit has learned and owes: the guard state of its subjects (asked once, then kept
true as it decides), and the actions, transitions and deferrals it writes in bulk.
:func:`set_state` moves an action on, compare-and-set, with its transition.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from trainguard.contract import Action, Failure
from trainguard.remediation import incidents
from trainguard.remediation.models import PENDING_STATES, ActionState
from trainguard.remediation.sql import Statement

HOUR = 3600.0
# States of actions that count towards cooldown and budget: everything that was or would
# have been carried out.
COUNTED_STATES = (
    ActionState.DRY_RUN,
    ActionState.AWAITING_APPROVAL,
    ActionState.QUEUED,
    ActionState.RUNNING,
    ActionState.SUCCEEDED,
    ActionState.FAILED,
)
_COUNTED_SQL = ",".join(f"'{s.value}'" for s in COUNTED_STATES)
_PENDING_SQL = ",".join(f"'{s.value}'" for s in PENDING_STATES)
# The state filter is spelled exactly as in the partial index ``actions_counted`` so that SQLite
# uses it: suppressed and skipped actions (an alert storm's bulk) never slow the guards down.
COUNTED_FILTER = f"state IN ({_COUNTED_SQL})"


def _guard_sql(hint: str) -> Statement:
    # The budget counts actions after both the hour's start and the last breaker reset (two
    # comparisons: SQLite's two-argument MAX() is not Postgres's GREATEST()).
    return Statement(f"""
    SELECT
        (SELECT reason FROM breakers WHERE subject = :subject) AS breaker,
        (SELECT MAX(created_at) FROM actions
         WHERE subject = :subject AND action = :action AND {COUNTED_FILTER}) AS last,
        (SELECT COUNT(*) FROM actions {hint}
         WHERE subject = :subject AND {COUNTED_FILTER} AND created_at > :since
           AND created_at > COALESCE(
               (SELECT reset_at FROM budget_resets WHERE subject = :subject), 0)) AS used,
        (SELECT reset_at FROM budget_resets WHERE subject = :subject) AS reset
    """)


# SQLite's planner would otherwise walk ``actions_subject`` through every suppressed action;
# Postgres has no index hints and picks the partial index from statistics.
GUARD_SQL = {"sqlite": _guard_sql("INDEXED BY actions_counted"), "postgresql": _guard_sql("")}
_INSERT_TRANSITION = Statement(
    "INSERT INTO transitions (action_id, state, at, note) VALUES (:action_id, :state, :at, :note)"
)
ALERT_COLUMNS = (
    "fingerprint",
    "starts_at",
    "name",
    "status",
    "labels",
    "annotations",
    "ends_at",
    "generator_url",
    "group_key",
    "receiver",
    "received_at",
)
# Alerts stored by one statement: 11 parameters each stays under SQLite's oldest limit (999).
UPSERT_CHUNK = 50


@functools.lru_cache(maxsize=UPSERT_CHUNK)
def upsert_alerts_sql(count: int) -> Statement:
    """Store ``count`` alerts in one statement (parameters suffixed ``_0``, ``_1``, ...).

    A notification repeated by Alertmanager (retry, repeat_interval, HA peers) lands on the same
    (fingerprint, startsAt) row; only a resolution changes it. One statement per notification
    rather than per alert: statements are most of the webhook's cost. Its rows carry their key,
    as neither database promises RETURNING's order.
    """
    rows = ", ".join(
        "(" + ", ".join(f":{name}_{i}" for name in ALERT_COLUMNS) + ")" for i in range(count)
    )
    return Statement(f"""
    INSERT INTO alerts ({", ".join(ALERT_COLUMNS)}) VALUES {rows}
    ON CONFLICT (fingerprint, starts_at) DO UPDATE SET
        notifications = alerts.notifications + 1,
        status = CASE WHEN excluded.status = 'resolved' THEN 'resolved' ELSE alerts.status END,
        ends_at = CASE WHEN excluded.status = 'resolved' THEN excluded.ends_at
                       ELSE alerts.ends_at END
    RETURNING fingerprint, starts_at, id, notifications, status
    """)


PENDING_OF_ALERT = Statement(f"""
    SELECT actions.id FROM actions JOIN alerts ON alerts.id = actions.alert_id
    WHERE alerts.fingerprint = :fingerprint AND actions.state IN ({_PENDING_SQL})
    """)
PENDING_OF_INCIDENT = Statement(f"""
    SELECT actions.id FROM actions JOIN incident_actions ia ON ia.action_id = actions.id
    WHERE ia.incident_id = :incident_id AND actions.state IN ({_PENDING_SQL})
    """)
DUE = Statement("""
    SELECT alerts.id, name, labels, starts_at, ends_at, status
    FROM deferred JOIN alerts ON alerts.id = deferred.alert_id
    WHERE deferred.due_at <= :at
    """)
UNDEFER = Statement("DELETE FROM deferred WHERE alert_id = :alert_id")
PLANNED_STEPS = Statement("SELECT step FROM actions WHERE alert_id = :alert_id")
_DEFER = Statement(
    "INSERT INTO deferred (alert_id, due_at) VALUES (:alert_id, :due_at) "
    "ON CONFLICT (alert_id) DO UPDATE SET due_at = excluded.due_at"
)
# Actions are numbered by the unit that decides them (see Unit.action_id) and written in bulk.
_LAST_ACTION = Statement("SELECT COALESCE(MAX(id), 0) FROM actions")
_INSERT_ACTION = Statement("""
    INSERT INTO actions (id, alert_id, step, subject, action, executor, params, destructive,
                         state, reason, created_at, updated_at)
    VALUES (:id, :alert_id, :step, :subject, :action, :executor, :params, :destructive,
            :state, :reason, :created_at, :updated_at)
    """)
TRIP_BREAKER = Statement(
    "INSERT INTO breakers (subject, tripped_at, reason) VALUES (:subject, :at, :reason) "
    "ON CONFLICT (subject) DO NOTHING"
)


class NotFoundError(LookupError):
    pass


class ConflictError(RuntimeError):
    pass


@dataclass(frozen=True)
class Decided:
    """One planned action's decision, and the failure of the alert it answers."""

    action: Action
    state: ActionState
    failure: Failure | None


@dataclass
class Planned:
    """What a unit decided: new action ids, and those the worker should pick up."""

    actions: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    decided: list[Decided] = field(default_factory=list)

    @property
    def decisions(self) -> list[tuple[str, ActionState]]:
        """(action name, state) of each decision: what the decision metrics count."""
        return [(d.action.value, d.state) for d in self.decided]


@dataclass
class Subject:
    """A subject's guard state as a unit last saw it: breaker, budget used, when each action
    last counted."""

    breaker: str | None
    used: int
    reset: float
    last: dict[str, float | None]


class Unit:
    """One ingest, sweep or escalation unit: its moment, what it has learned, what it owes.

    The guards of a notification's alerts (one job's, mostly) ask the store once per subject and
    action; the unit then keeps the answer true itself as it decides, which is exact because it
    runs on the store's only writer (on Postgres, under the writers' lock) with ``at`` fixed:
    counted actions it records raise ``used`` and ``last``, a budget it exhausts opens the
    breaker, and anything else that changes counted actions (a resolution cancelling pending
    ones) forgets what it knew.

    The unit's actions, their first transitions and its deferrals, like the incidents' links,
    are written in bulk by :meth:`flush` (one driver call per table rather than a statement per
    row), before any statement reads them and at the end of the unit. So that an action's id is
    known before its row is written, the unit numbers its actions itself, after the highest id
    in the table: no other writer can insert meanwhile (SQLite's one writer in its IMMEDIATE
    transaction; on Postgres the writers' lock, held to the commit), and every action is
    inserted here.
    """

    def __init__(self, conn: Connection, at: float) -> None:
        self.conn = conn
        self.at = at
        self.known = incidents.Known()
        self.subjects: dict[str, Subject] = {}
        self.actions: list[dict[str, Any]] = []
        self.transitions: list[dict[str, Any]] = []
        self.deferrals: list[dict[str, Any]] = []
        self._next_action: int | None = None

    def action_id(self) -> int:
        """The id of the unit's next action."""
        if self._next_action is None:
            row = _LAST_ACTION.first(self.conn, {})
            assert row is not None  # an aggregate has one row
            self._next_action = int(row[0]) + 1
        self._next_action += 1
        return self._next_action - 1

    def flush(self) -> None:
        _INSERT_ACTION.many(self.conn, self.actions)
        _INSERT_TRANSITION.many(self.conn, self.transitions)
        _DEFER.many(self.conn, self.deferrals)
        self.known.flush(self.conn)
        self.actions.clear()
        self.transitions.clear()
        self.deferrals.clear()


def record_transition(conn: Connection, action_id: int, state: str, note: str) -> None:
    _INSERT_TRANSITION.run(
        conn, {"action_id": action_id, "state": state, "at": time.time(), "note": note}
    )


@functools.lru_cache(maxsize=64)
def _set_state_sql(columns: tuple[str, ...], expect: int | None) -> Statement:
    """The compare-and-set update: built (and compiled) once per shape."""
    assignments = ", ".join(["state = :state", "updated_at = :updated_at"])
    assignments += "".join(f", {name} = :{name}" for name in columns)
    sql = f"UPDATE actions SET {assignments} WHERE id = :id"
    if expect is not None:
        sql += f" AND state IN ({', '.join(f':expect_{i}' for i in range(expect))})"
    return Statement(sql)


def set_state(
    conn: Connection,
    action_id: int,
    state: ActionState,
    note: str,
    *,
    expect: tuple[ActionState, ...] | None = None,
    **columns: Any,
) -> bool:
    """Move an action to ``state`` (only from one of ``expect`` when given); False if it wasn't."""
    values: dict[str, Any] = {
        "state": state.value,
        "updated_at": time.time(),
        "id": action_id,
        **columns,
    }
    if expect is not None:
        values.update({f"expect_{i}": s.value for i, s in enumerate(expect)})
    sql = _set_state_sql(tuple(columns), None if expect is None else len(expect))
    # The row count is the claim: of two writers (threads or replicas) only one moves it.
    if sql.run(conn, values) == 0:
        return False
    record_transition(conn, action_id, state.value, note)
    return True


def cancel_pending_of_incident(conn: Connection, incident_id: int, note: str) -> int:
    """Cancel the incident's actions still waiting to run (queued, awaiting approval); how
    many. One already running finishes: its executor cannot be called back."""
    cancelled = 0
    for (action_id,) in PENDING_OF_INCIDENT.rows(conn, {"incident_id": incident_id}):
        cancelled += set_state(conn, action_id, ActionState.CANCELLED, note, expect=PENDING_STATES)
    return cancelled


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
