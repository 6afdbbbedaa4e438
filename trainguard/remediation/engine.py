"""Decisions: what an alert calls for, held against the guards, recorded in the store.

Every function that changes state returns a *unit*, a function the store's writer runs inside a
transaction, so a decision and the guard state it read (cooldowns, budget, circuit breaker) are
consistent even with many notifications in flight.

Guards, in the order they apply to each planned action:

1. circuit breaker: a subject (the job, or ``node:<name>`` for node alerts) whose breaker is
   open gets nothing until an operator resets it;
2. cooldown: the same action for the same subject is held back for ``cooldown_seconds``;
3. budget: more than ``budget_per_hour`` actions for a subject in a rolling hour trips its
   breaker (and holds the action back);
4. dry-run: the decision is recorded and nothing is done (the default);
5. approval: destructive actions wait for an operator's approval.

Dry-run decisions count towards cooldown and budget so that a dry run shows what a live run would
have done, breaker trips included.

A new alert whose rule repairs something opens an incident (or joins its subject's open one) in
the same transaction (:mod:`trainguard.remediation.incidents`); the verifier climbs the rule's
ladder through :meth:`Engine.escalate`, which decides each rung like any planned step, guards
included. Alerts of ranks whose node was removed from their job on purpose are not acted on, and
the service's own page (``contract.REMEDIATION_FAILED_ALERT``) never is.
"""

from __future__ import annotations

import functools
import json
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from trainguard import contract
from trainguard.contract import Action, Failure
from trainguard.remediation import incidents
from trainguard.remediation.actions import CATALOG, ActionKind, failure_of
from trainguard.remediation.executors import RecommendExecutor
from trainguard.remediation.executors.page import PageExecutor
from trainguard.remediation.models import (
    PENDING_STATES,
    ActionState,
    AlertStatus,
    Decision,
    DirectiveAck,
    WebhookPayload,
    WebhookResult,
)
from trainguard.remediation.policy import Policy, Rung, Step
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
_GUARD_SQL = {"sqlite": _guard_sql("INDEXED BY actions_counted"), "postgresql": _guard_sql("")}
_INSERT_TRANSITION = Statement(
    "INSERT INTO transitions (action_id, state, at, note) VALUES (:action_id, :state, :at, :note)"
)
_ALERT_COLUMNS = (
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
_UPSERT_CHUNK = 50


@functools.lru_cache(maxsize=_UPSERT_CHUNK)
def _upsert_alerts_sql(count: int) -> Statement:
    """Store ``count`` alerts in one statement (parameters suffixed ``_0``, ``_1``, ...).

    A notification repeated by Alertmanager (retry, repeat_interval, HA peers) lands on the same
    (fingerprint, startsAt) row; only a resolution changes it. One statement per notification
    rather than per alert: statements are most of the webhook's cost. Its rows carry their key,
    as neither database promises RETURNING's order.
    """
    rows = ", ".join(
        "(" + ", ".join(f":{name}_{i}" for name in _ALERT_COLUMNS) + ")" for i in range(count)
    )
    return Statement(f"""
    INSERT INTO alerts ({", ".join(_ALERT_COLUMNS)}) VALUES {rows}
    ON CONFLICT (fingerprint, starts_at) DO UPDATE SET
        notifications = alerts.notifications + 1,
        status = CASE WHEN excluded.status = 'resolved' THEN 'resolved' ELSE alerts.status END,
        ends_at = CASE WHEN excluded.status = 'resolved' THEN excluded.ends_at
                       ELSE alerts.ends_at END
    RETURNING fingerprint, starts_at, id, notifications, status
    """)


_PENDING_OF_ALERT = Statement(f"""
    SELECT actions.id FROM actions JOIN alerts ON alerts.id = actions.alert_id
    WHERE alerts.fingerprint = :fingerprint AND actions.state IN ({_PENDING_SQL})
    """)
_DUE = Statement("""
    SELECT alerts.id, name, labels, starts_at, ends_at, status
    FROM deferred JOIN alerts ON alerts.id = deferred.alert_id
    WHERE deferred.due_at <= :at
    """)
_UNDEFER = Statement("DELETE FROM deferred WHERE alert_id = :alert_id")
_PLANNED_STEPS = Statement("SELECT step FROM actions WHERE alert_id = :alert_id")
_DEFER = Statement(
    "INSERT INTO deferred (alert_id, due_at) VALUES (:alert_id, :due_at) "
    "ON CONFLICT (alert_id) DO UPDATE SET due_at = excluded.due_at"
)
# Actions are numbered by the unit that decides them (see _Unit.action_id) and written in bulk.
_LAST_ACTION = Statement("SELECT COALESCE(MAX(id), 0) FROM actions")
_INSERT_ACTION = Statement("""
    INSERT INTO actions (id, alert_id, step, subject, action, executor, params, destructive,
                         state, reason, created_at, updated_at)
    VALUES (:id, :alert_id, :step, :subject, :action, :executor, :params, :destructive,
            :state, :reason, :created_at, :updated_at)
    """)
_TRIP_BREAKER = Statement(
    "INSERT INTO breakers (subject, tripped_at, reason) VALUES (:subject, :at, :reason) "
    "ON CONFLICT (subject) DO NOTHING"
)
_ACTION_STATE = Statement("SELECT state FROM actions WHERE id = :id")
_CLOSE_BREAKER = Statement("DELETE FROM breakers WHERE subject = :subject")
_RESET_BUDGET = Statement(
    "INSERT INTO budget_resets (subject, reset_at) VALUES (:subject, :reset_at) "
    "ON CONFLICT (subject) DO UPDATE SET reset_at = excluded.reset_at"
)
_DIRECTIVE = Statement("SELECT action_id, rank FROM directives WHERE id = :id")
_INSERT_ACK = Statement("""
    INSERT INTO directive_acks (directive_id, rank, outcome, detail, at)
    VALUES (:directive_id, :rank, :outcome, :detail, :at)
    ON CONFLICT (directive_id, rank) DO NOTHING
    """)


class NotFoundError(LookupError):
    pass


class ConflictError(RuntimeError):
    pass


@dataclass(frozen=True)
class Guards:
    dry_run: bool = True
    require_approval: bool = True
    cooldown_seconds: float = 900.0
    budget_per_hour: int = 6
    default_scheduler: str = "local"


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
class _Subject:
    """A subject's guard state as a unit last saw it: breaker, budget used, when each action
    last counted."""

    breaker: str | None
    used: int
    reset: float
    last: dict[str, float | None]


class _Unit:
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
        self.subjects: dict[str, _Subject] = {}
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


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


class Engine:
    """Turns alerts into recorded, guarded actions."""

    def __init__(self, policy: Policy, guards: Guards) -> None:
        self.policy = policy
        self.guards = guards

    # --- the webhook -----------------------------------------------------------------------
    def ingest(
        self, payload: WebhookPayload, now: float | None = None
    ) -> Callable[[Connection], tuple[WebhookResult, Planned]]:
        def unit(conn: Connection) -> tuple[WebhookResult, Planned]:
            batch = _Unit(conn, time.time() if now is None else now)
            planned = Planned()
            stored = duplicates = resolved = cancelled = 0
            for alert, (alert_id, notifications, status) in zip(
                payload.alerts, self._store_alerts(conn, payload, batch.at), strict=True
            ):
                if notifications == 1:
                    stored += 1
                else:
                    duplicates += 1
                if alert.status is AlertStatus.RESOLVED:
                    resolved += 1
                    cancelled += self._cancel_pending(batch, alert.fingerprint)
                # A firing notification that arrives after the resolution (HA peers, retries
                # out of order) finds the row resolved: it is counted, and plans nothing.
                elif status is AlertStatus.FIRING:
                    new = notifications == 1  # a new alert has no planned steps to look up
                    self._plan(
                        batch, alert_id, alert.name, alert.labels, alert.starts_at, planned, new=new
                    )
            batch.flush()
            result = WebhookResult(
                stored=stored,
                duplicates=duplicates,
                resolved=resolved,
                cancelled_actions=cancelled,
                planned_actions=planned.actions,
            )
            return result, planned

        return unit

    @staticmethod
    def _store_alerts(
        conn: Connection, payload: WebhookPayload, at: float
    ) -> list[tuple[int, int, AlertStatus]]:
        """Each alert's row id, how many notifications it has had, and its stored status."""
        group_key, receiver = payload.group_key, payload.receiver
        keyed = [
            (
                alert.fingerprint,
                alert.starts_at.isoformat(),
                alert.name,
                alert.status.value,
                json.dumps(alert.labels, sort_keys=True),
                json.dumps(alert.annotations, sort_keys=True),
                _iso(alert.ends_at_or_none),
                alert.generator_url,
                group_key,
                receiver,
                at,
            )
            for alert in payload.alerts
        ]
        keys = [row[:2] for row in keyed]
        # An alert twice in one notification would be one row changed twice by one statement
        # (Postgres refuses that): such a notification is stored an alert at a time.
        chunk = _UPSERT_CHUNK if len(set(keys)) == len(keys) else 1
        stored: list[tuple[int, int, AlertStatus]] = []
        for start in range(0, len(keyed), chunk):
            rows = keyed[start : start + chunk]
            params = {
                f"{name}_{i}": value
                for i, row in enumerate(rows)
                for name, value in zip(_ALERT_COLUMNS, row, strict=True)
            }
            found = {
                (fingerprint, starts_at): (int(alert_id), int(notifications), AlertStatus(status))
                for fingerprint, starts_at, alert_id, notifications, status in _upsert_alerts_sql(
                    len(rows)
                ).rows(conn, params)
            }
            stored += (found[key] for key in keys[start : start + chunk])
        return stored

    @staticmethod
    def _cancel_pending(batch: _Unit, fingerprint: str) -> int:
        batch.flush()  # the actions just planned are pending too
        rows = _PENDING_OF_ALERT.rows(batch.conn, {"fingerprint": fingerprint})
        if rows:
            batch.subjects.clear()  # the cancelled actions no longer count towards the guards
        for (action_id,) in rows:
            set_state(
                batch.conn,
                action_id,
                ActionState.CANCELLED,
                "the alert resolved before the action ran",
                expect=PENDING_STATES,
            )
        return len(rows)

    # --- deferred steps --------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> Callable[[Connection], Planned]:
        """Plan the steps of firing alerts whose ``after_seconds`` has now passed."""

        def unit(conn: Connection) -> Planned:
            batch = _Unit(conn, time.time() if now is None else now)
            at = batch.at
            planned = Planned()
            # Only alerts with a step coming due are looked at, not every firing alert.
            for alert_id, name, labels, starts_at, ends_at, status in _DUE.rows(conn, {"at": at}):
                _UNDEFER.run(conn, {"alert_id": alert_id})
                if status != AlertStatus.FIRING.value or (
                    ends_at is not None and datetime.fromisoformat(ends_at).timestamp() < at
                ):
                    continue  # Alertmanager would have resolved it by now
                self._plan(
                    batch,
                    alert_id,
                    name,
                    json.loads(labels),
                    datetime.fromisoformat(starts_at),
                    planned,
                )
            batch.flush()
            return planned

        return unit

    # --- planning and guards ---------------------------------------------------------------
    def _plan(
        self,
        batch: _Unit,
        alert_id: int,
        alertname: str,
        labels: Mapping[str, str],
        starts_at: datetime,
        planned: Planned,
        *,
        new: bool = False,
    ) -> None:
        conn, at = batch.conn, batch.at
        if alertname == contract.REMEDIATION_FAILED_ALERT:
            return  # the service's own page: for humans, never acted on (the policy refuses it)
        rule = self.policy.plan(alertname, labels)
        if rule is None:
            return
        done: set[int] = set()
        if not new:
            batch.flush()  # an alert twice in one notification: its first planning's actions
            done = {step for (step,) in _PLANNED_STEPS.rows(conn, {"alert_id": alert_id})}
        removal = batch.known.removal(conn, labels)
        if removal is not None:
            self._skip_removed(
                batch, alert_id, alertname, rule.actions, done, labels, removal, planned
            )
            return
        incident = None
        if new and rule.opens_incidents:
            incident = batch.known.open_or_join(
                conn, rule, alert_id, alertname, labels, starts_at, at
            )
        planned_before = len(planned.actions)
        firing_for = at - starts_at.timestamp()
        next_due: float | None = None
        for index, step in enumerate(rule.actions):
            if index in done:
                continue
            if firing_for < step.after_seconds:
                due = starts_at.timestamp() + step.after_seconds
                next_due = due if next_due is None else min(next_due, due)
                continue
            action_id, state = self._decide(batch, alert_id, index, step, labels, firing_for)
            planned.actions.append(action_id)
            planned.decided.append(Decided(step.action, state, failure_of(alertname)))
            if state is ActionState.QUEUED:
                planned.queued.append(action_id)
        if next_due is not None:
            batch.deferrals.append({"alert_id": alert_id, "due_at": next_due})
        if rule.opens_incidents and len(planned.actions) > planned_before:
            if incident is not None:
                batch.known.link_new(planned.actions[planned_before:], *incident)
            else:
                batch.flush()  # what it reads: the alert's joins and its actions' links
                incidents.link(conn, alert_id)  # a step come due later: find its incident

    def _skip_removed(
        self,
        batch: _Unit,
        alert_id: int,
        alertname: str,
        steps: tuple[Step, ...],
        done: set[int],
        labels: Mapping[str, str],
        removal: int,
        planned: Planned,
    ) -> None:
        """Record why an alert about a rank removed from its job on purpose gets nothing: one
        ``skipped`` action (on its first step not decided yet), no incident."""
        index = next((i for i in range(len(steps)) if i not in done), None)
        if index is None:
            return
        step = steps[index]
        node = labels.get(contract.LABEL_NODE, "")
        job_id = labels.get(contract.LABEL_JOB_ID, "")
        reason = (
            f"rank {labels.get(contract.LABEL_RANK, '')} on node {node} was removed from job "
            f"{job_id} on purpose by action #{removal}"
        )
        executor, params = self._route(step, labels)
        action_id = self._insert_action(
            batch, alert_id, index, step, labels, executor, params, ActionState.SKIPPED, reason
        )
        planned.actions.append(action_id)
        planned.decided.append(Decided(step.action, ActionState.SKIPPED, failure_of(alertname)))

    # --- the ladder ------------------------------------------------------------------------
    def escalate(
        self,
        incident_id: int,
        rung: int,
        step: Rung,
        index: int,
        alert: incidents.AlertFacts,
        verdicts: Mapping[int, str],
        note: str,
        now: float | None = None,
    ) -> Callable[[Connection], Planned | None]:
        """Move an incident from ``rung`` to the next and decide that rung's step as step
        ``index`` of ``alert``'s plan, through the guards like any step; None when the incident
        moved on or closed meanwhile (another replica's verifier, an old view)."""

        def unit(conn: Connection) -> Planned | None:
            at = time.time() if now is None else now
            if not incidents.advance(conn, incident_id, rung, step.action, at, note):
                return None
            incidents.set_verdicts(conn, verdicts)
            planned = Planned()
            batch = _Unit(conn, at)
            action_id, state = self._decide(
                batch, alert.id, index, step, alert.labels, at - alert.starts_at
            )
            batch.flush()
            incidents.link_action(conn, action_id, incident_id, rung + 1)
            planned.actions.append(action_id)
            planned.decided.append(Decided(step.action, state, failure_of(alert.name)))
            if state is ActionState.QUEUED:
                planned.queued.append(action_id)
            return planned

        return unit

    def _decide(
        self,
        batch: _Unit,
        alert_id: int,
        index: int,
        step: Step,
        labels: Mapping[str, str],
        firing_for: float,
    ) -> tuple[int, ActionState]:
        spec = CATALOG[step.action]
        subject = incidents.subject_of(labels)
        executor, params = self._route(step, labels)
        missing = [name for name in spec.needs if not labels.get(name)]
        state, reason = ActionState.QUEUED, "policy"
        if missing:
            state, reason = ActionState.SKIPPED, f"the alert has no {', '.join(missing)} label"
        elif executor is None:
            scheduler = labels.get(contract.LABEL_SCHEDULER, "")
            state, reason = ActionState.SKIPPED, f"unknown scheduler {scheduler!r}"
        else:
            state, reason = self._guard(batch, subject, step)
        if state is ActionState.QUEUED:
            if self.guards.dry_run:
                state = ActionState.DRY_RUN
                reason = "dry-run: recorded, not executed"
                if spec.destructive and self.guards.require_approval:
                    reason += " (would wait for approval)"
            elif spec.destructive and self.guards.require_approval:
                state, reason = ActionState.AWAITING_APPROVAL, "destructive: waits for approval"
        reason = f"{reason}; alert firing for {firing_for:.0f}s"
        action_id = self._insert_action(
            batch, alert_id, index, step, labels, executor, params, state, reason
        )
        known = batch.subjects.get(subject)
        if known is not None and state in COUNTED_STATES and batch.at > known.reset:
            known.used += 1
            last = known.last.get(step.action.value)
            known.last[step.action.value] = batch.at if last is None else max(last, batch.at)
        return action_id, state

    @staticmethod
    def _insert_action(
        batch: _Unit,
        alert_id: int,
        index: int,
        step: Step,
        labels: Mapping[str, str],
        executor: str | None,
        params: Mapping[str, Any],
        state: ActionState,
        reason: str,
    ) -> int:
        at = batch.at
        action_id = batch.action_id()
        batch.actions.append(
            {
                "id": action_id,
                "alert_id": alert_id,
                "step": index,
                "subject": incidents.subject_of(labels),
                "action": step.action.value,
                "executor": executor or "",
                "params": json.dumps(params, sort_keys=True),
                "destructive": int(CATALOG[step.action].destructive),
                "state": state.value,
                "reason": reason,
                "created_at": at,
                "updated_at": at,
            }
        )
        batch.transitions.append(
            {"action_id": action_id, "state": state.value, "at": at, "note": reason}
        )
        return action_id

    def _route(self, step: Step, labels: Mapping[str, str]) -> tuple[str | None, dict[str, Any]]:
        spec = CATALOG[step.action]
        params = dict(step.params)
        if spec.kind is ActionKind.DIRECTIVE:
            return "directive", params
        if spec.kind is ActionKind.RECOMMEND:
            params["text"] = string.Template(str(params.get("text", ""))).safe_substitute(labels)
            return RecommendExecutor.name, params
        if spec.kind is ActionKind.PAGE:
            return PageExecutor.name, params
        scheduler = labels.get(contract.LABEL_SCHEDULER) or self.guards.default_scheduler
        return (scheduler if scheduler in contract.SCHEDULERS else None), params

    def _guard(self, batch: _Unit, subject: str, step: Step) -> tuple[ActionState, str]:
        at, action = batch.at, step.action.value
        known = batch.subjects.get(subject)
        if known is None or action not in known.last:
            # One statement for all three guards, once per subject and action in a unit: the
            # webhook's cost is mostly statements.
            batch.flush()  # what it counts: the unit's actions so far
            row = _GUARD_SQL[batch.conn.dialect.name].first(
                batch.conn, {"subject": subject, "action": action, "since": at - HOUR}
            )
            assert row is not None  # a SELECT of scalar subqueries has one row
            breaker, last, used, reset = row
            if known is None:
                known = batch.subjects[subject] = _Subject(breaker, used, reset or 0.0, {})
            known.last[action] = last
        breaker, last, used = known.breaker, known.last[action], known.used
        if breaker is not None:
            return ActionState.SUPPRESSED, f"circuit breaker open for {subject}: {breaker}"
        cooldown = (
            self.guards.cooldown_seconds if step.cooldown_seconds is None else step.cooldown_seconds
        )
        if last is not None and at - last < cooldown:
            ago = f"{at - last:.0f}s ago (< {cooldown:.0f}s)"
            return ActionState.SUPPRESSED, f"cooldown: {step.action.value} for {subject} {ago}"
        if used >= self.guards.budget_per_hour:
            why = f"budget of {self.guards.budget_per_hour} actions per hour exhausted"
            _TRIP_BREAKER.run(batch.conn, {"subject": subject, "at": at, "reason": why})
            known.breaker = why
            return ActionState.SUPPRESSED, f"{why}; circuit breaker tripped for {subject}"
        return ActionState.QUEUED, "policy"

    # --- operators -------------------------------------------------------------------------
    @staticmethod
    def decide(
        action_id: int, approve: bool, decision: Decision
    ) -> Callable[[Connection], ActionState]:
        def unit(conn: Connection) -> ActionState:
            row = _ACTION_STATE.first(conn, {"id": action_id})
            if row is None:
                raise NotFoundError(f"no action {action_id}")
            target = ActionState.QUEUED if approve else ActionState.REJECTED
            verb = "approved" if approve else "rejected"
            note = f"{verb} by {decision.by or 'an operator'}"
            if decision.comment:
                note += f": {decision.comment}"
            if not set_state(
                conn, action_id, target, note, expect=(ActionState.AWAITING_APPROVAL,)
            ):
                waiting = ActionState.AWAITING_APPROVAL.value
                raise ConflictError(f"action {action_id} is {row[0]}, not {waiting}")
            return target

        return unit

    @staticmethod
    def reset_breaker(subject: str, now: float | None = None) -> Callable[[Connection], None]:
        """Close the breaker and start the subject's budget afresh: the actions that tripped it
        no longer count, or the next action would trip it again at once."""

        def unit(conn: Connection) -> None:
            if _CLOSE_BREAKER.run(conn, {"subject": subject}) == 0:
                raise NotFoundError(f"no open circuit breaker for {subject!r}")
            reset_at = time.time() if now is None else now
            _RESET_BUDGET.run(conn, {"subject": subject, "reset_at": reset_at})

        return unit

    @staticmethod
    def ack(directive_id: int, ack: DirectiveAck) -> Callable[[Connection], int | None]:
        """Record a rank's acknowledgement; the unit returns the directive's action when the
        acknowledgement is new (the worker looks at whether that action is done)."""

        def unit(conn: Connection) -> int | None:
            row = _DIRECTIVE.first(conn, {"id": directive_id})
            if row is None:
                raise NotFoundError(f"no directive {directive_id}")
            action_id, rank = row
            if rank is not None and rank != ack.rank:
                raise ConflictError(f"directive {directive_id} is for rank {rank}")
            inserted = _INSERT_ACK.run(
                conn,
                {
                    "directive_id": directive_id,
                    "rank": ack.rank,
                    "outcome": ack.outcome.value,
                    "detail": ack.detail,
                    "at": time.time(),
                },
            )
            if inserted and action_id is not None:
                note = f"rank {ack.rank} acknowledged: {ack.outcome.value}"
                if ack.detail:
                    note += f" ({ack.detail})"
                record_transition(conn, action_id, "acknowledged", note)
                return int(action_id)
            return None

        return unit
