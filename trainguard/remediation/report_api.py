"""``GET /v1/actions/{id}/report``: the diagnose report attached to an action."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from trainguard.remediation.deps import ReaderAuthenticated, StoreDep
from trainguard.remediation.reports import ActionReport, get_report

router = APIRouter(prefix="/v1", dependencies=[ReaderAuthenticated])


@router.get("/actions/{action_id}/report", response_model=ActionReport, tags=["audit"])
def action_report(action_id: Annotated[int, Path(ge=1, le=2**62)], store: StoreDep) -> ActionReport:
    """The diagnose report attached to an action (404 until one is written)."""
    found = store.read(lambda conn: get_report(conn, action_id))
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no report for action {action_id}")
    return found
