"""``/v1/incidents``: each failure, what was tried and what the verifier concluded."""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Query, status

from trainguard.contract import IncidentOutcome
from trainguard.remediation import incident_views
from trainguard.remediation.api.common import ActionId, audit_router
from trainguard.remediation.deps import StoreDep
from trainguard.remediation.models import IncidentList, IncidentState, IncidentView

router = audit_router(tags=["audit"])


@router.get("/incidents", response_model=IncidentList)
def list_incidents(
    store: StoreDep,
    state: IncidentState | None = None,
    outcome: IncidentOutcome | None = None,
    job_id: Annotated[str | None, Query(max_length=256)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> IncidentList:
    """Incidents, newest first: each failure, what was tried and what the verifier concluded."""
    found = store.read(
        lambda conn: incident_views.list_incidents(
            conn, state=state, outcome=outcome, job_id=job_id, before_id=before_id, limit=limit
        )
    )
    return IncidentList(incidents=found)


@router.get("/incidents/{incident_id}", response_model=IncidentView)
def get_incident(incident_id: ActionId, store: StoreDep) -> IncidentView:
    view = store.read(lambda conn: incident_views.get_incident(conn, incident_id))
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no incident {incident_id}")
    return view
