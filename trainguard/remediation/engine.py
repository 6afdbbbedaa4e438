"""Decisions: what an alert calls for, held against the guards, recorded in the store.

Every method that changes state returns a *unit*, a function the store's writer runs inside a
transaction (:mod:`.decisions`), so a decision and the guard state it read (cooldowns, budget,
circuit breaker) are consistent even with many notifications in flight. What operators and ranks
do to decided actions afterwards is :mod:`.operators`.

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

import json
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from trainguard import contract
from trainguard.remediation import incidents
from trainguard.remediation.actions import CATALOG, ActionKind, failure_of
from trainguard.remediation.decisions import (
    ALERT_COLUMNS,
    COUNTED_STATES,
    DUE,
    GUARD_SQL,
    HOUR,
    PENDING_OF_ALERT,
    PLANNED_STEPS,
    TRIP_BREAKER,
    UNDEFER,
    UPSERT_CHUNK,
    Decided,
    Planned,
    Subject,
    Unit,
    iso,
    set_state,
    upsert_alerts_sql,
)
from trainguard.remediation.executors import RecommendExecutor
from trainguard.remediation.executors.page import PageExecutor
from trainguard.remediation.models import (
    PENDING_STATES,
    ActionState,
    AlertStatus,
    WebhookPayload,
    WebhookResult,
)
from trainguard.remediation.policy import Policy, Rung, Step


@dataclass(frozen=True)
class Guards:
    dry_run: bool = True
    require_approval: bool = True
    cooldown_seconds: float = 900.0
    budget_per_hour: int = 6
    default_scheduler: str = "local"


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
            batch = Unit(conn, time.time() if now is None else now)
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
                iso(alert.ends_at_or_none),
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
        chunk = UPSERT_CHUNK if len(set(keys)) == len(keys) else 1
        stored: list[tuple[int, int, AlertStatus]] = []
        for start in range(0, len(keyed), chunk):
            rows = keyed[start : start + chunk]
            params = {
                f"{name}_{i}": value
                for i, row in enumerate(rows)
                for name, value in zip(ALERT_COLUMNS, row, strict=True)
            }
            found = {
                (fingerprint, starts_at): (int(alert_id), int(notifications), AlertStatus(status))
                for fingerprint, starts_at, alert_id, notifications, status in upsert_alerts_sql(
                    len(rows)
                ).rows(conn, params)
            }
            stored += (found[key] for key in keys[start : start + chunk])
        return stored

    @staticmethod
    def _cancel_pending(batch: Unit, fingerprint: str) -> int:
        batch.flush()  # the actions just planned are pending too
        rows = PENDING_OF_ALERT.rows(batch.conn, {"fingerprint": fingerprint})
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
            batch = Unit(conn, time.time() if now is None else now)
            at = batch.at
            planned = Planned()
            # Only alerts with a step coming due are looked at, not every firing alert.
            for alert_id, name, labels, starts_at, ends_at, status in DUE.rows(conn, {"at": at}):
                UNDEFER.run(conn, {"alert_id": alert_id})
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
        batch: Unit,
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
            done = {step for (step,) in PLANNED_STEPS.rows(conn, {"alert_id": alert_id})}
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
        batch: Unit,
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
            batch = Unit(conn, at)
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
        batch: Unit,
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
        batch: Unit,
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

    def _guard(self, batch: Unit, subject: str, step: Step) -> tuple[ActionState, str]:
        at, action = batch.at, step.action.value
        known = batch.subjects.get(subject)
        if known is None or action not in known.last:
            # One statement for all three guards, once per subject and action in a unit: the
            # webhook's cost is mostly statements.
            batch.flush()  # what it counts: the unit's actions so far
            row = GUARD_SQL[batch.conn.dialect.name].first(
                batch.conn, {"subject": subject, "action": action, "since": at - HOUR}
            )
            assert row is not None  # a SELECT of scalar subqueries has one row
            breaker, last, used, reset = row
            if known is None:
                known = batch.subjects[subject] = Subject(breaker, used, reset or 0.0, {})
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
            TRIP_BREAKER.run(batch.conn, {"subject": subject, "at": at, "reason": why})
            known.breaker = why
            return ActionState.SUPPRESSED, f"{why}; circuit breaker tripped for {subject}"
        return ActionState.QUEUED, "policy"
