"""What operators and ranks do to decided actions: approve or reject one that waits, reset a
tripped circuit breaker, acknowledge a directive. Each returns a unit for the store's writer
(see :mod:`.decisions`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection

from trainguard.remediation.decisions import (
    ConflictError,
    NotFoundError,
    record_transition,
    set_state,
)
from trainguard.remediation.models import ActionState, Decision, DirectiveAck
from trainguard.remediation.sql import Statement

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
        if not set_state(conn, action_id, target, note, expect=(ActionState.AWAITING_APPROVAL,)):
            waiting = ActionState.AWAITING_APPROVAL.value
            raise ConflictError(f"action {action_id} is {row[0]}, not {waiting}")
        return target

    return unit


def reset_breaker(subject: str, now: float | None = None) -> Callable[[Connection], None]:
    """Close the breaker and start the subject's budget afresh: the actions that tripped it
    no longer count, or the next action would trip it again at once."""

    def unit(conn: Connection) -> None:
        if _CLOSE_BREAKER.run(conn, {"subject": subject}) == 0:
            raise NotFoundError(f"no open circuit breaker for {subject!r}")
        reset_at = time.time() if now is None else now
        _RESET_BUDGET.run(conn, {"subject": subject, "reset_at": reset_at})

    return unit


def ack(directive_id: int, received: DirectiveAck) -> Callable[[Connection], int | None]:
    """Record a rank's acknowledgement; the unit returns the directive's action when the
    acknowledgement is new (the worker looks at whether that action is done)."""

    def unit(conn: Connection) -> int | None:
        row = _DIRECTIVE.first(conn, {"id": directive_id})
        if row is None:
            raise NotFoundError(f"no directive {directive_id}")
        action_id, rank = row
        if rank is not None and rank != received.rank:
            raise ConflictError(f"directive {directive_id} is for rank {rank}")
        inserted = _INSERT_ACK.run(
            conn,
            {
                "directive_id": directive_id,
                "rank": received.rank,
                "outcome": received.outcome.value,
                "detail": received.detail,
                "at": time.time(),
            },
        )
        if inserted and action_id is not None:
            note = f"rank {received.rank} acknowledged: {received.outcome.value}"
            if received.detail:
                note += f" ({received.detail})"
            record_transition(conn, action_id, "acknowledged", note)
            return int(action_id)
        return None

    return unit
