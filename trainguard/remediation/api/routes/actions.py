"""``/v1/actions``: the audit trail of decided actions, the diagnose report attached to each,
and the operators' approval or rejection of an action that waits for one."""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool

from trainguard.remediation import operators, queries
from trainguard.remediation.api.common import (
    ActionId,
    audit_router,
    commit_decision,
    operator_router,
)
from trainguard.remediation.deps import StoreDep, WorkerDep
from trainguard.remediation.models import ActionList, ActionState, ActionView, Decision
from trainguard.remediation.reports import ActionReport, get_report

audit = audit_router(tags=["audit"])
operator = operator_router(tags=["audit"])


@audit.get("/actions", response_model=ActionList)
def list_actions(
    store: StoreDep,
    state: ActionState | None = None,
    subject: Annotated[str | None, Query(max_length=256)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ActionList:
    """The audit trail, newest first; page with ``before_id``."""
    actions = store.read(
        lambda conn: queries.list_actions(
            conn, state=state, subject=subject, before_id=before_id, limit=limit
        )
    )
    return ActionList(actions=actions)


@audit.get("/actions/{action_id}", response_model=ActionView)
def get_action(action_id: ActionId, store: StoreDep) -> ActionView:
    view = store.read(lambda conn: queries.get_action(conn, action_id))
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no action {action_id}")
    return view


async def _decide(
    action_id: int, approve: bool, decision: Decision | None, store: StoreDep, worker: WorkerDep
) -> ActionView:
    await commit_decision(store, operators.decide(action_id, approve, decision or Decision()))
    if approve:
        worker.wake()
    view = await run_in_threadpool(store.read, lambda conn: queries.get_action(conn, action_id))
    assert view is not None  # it was just updated and actions are never deleted
    return view


@operator.post("/actions/{action_id}/approve", response_model=ActionView)
async def approve(
    action_id: ActionId, store: StoreDep, worker: WorkerDep, decision: Decision | None = None
) -> ActionView:
    """Let an action that waits for approval run (409 if it is not waiting)."""
    return await _decide(action_id, True, decision, store, worker)


@operator.post("/actions/{action_id}/reject", response_model=ActionView)
async def reject(
    action_id: ActionId, store: StoreDep, worker: WorkerDep, decision: Decision | None = None
) -> ActionView:
    """Refuse an action that waits for approval (409 if it is not waiting)."""
    return await _decide(action_id, False, decision, store, worker)


@audit.get("/actions/{action_id}/report", response_model=ActionReport)
def action_report(action_id: ActionId, store: StoreDep) -> ActionReport:
    """The diagnose report attached to an action (404 until one is written)."""
    found = store.read(lambda conn: get_report(conn, action_id))
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no report for action {action_id}")
    return found
