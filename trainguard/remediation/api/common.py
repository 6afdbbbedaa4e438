"""What the service's routes share: the routers by who may call them, ids, and errors.

Alertmanager and the ranks present the webhook token (:data:`v1_router`); the audit trail takes
either token (:data:`audit_router`); operators' decisions take the operator token only
(:func:`operator_router`: a leaked webhook secret must not let a destructive action through).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from trainguard.remediation.deps import Authenticated, OperatorAuthenticated, ReaderAuthenticated

# Ids of actions, directives, incidents and notifications.
ActionId = Annotated[int, Path(ge=1, le=2**62)]
UNAVAILABLE = "the store could not commit; retry"


def v1_router(**options: Any) -> APIRouter:
    """Routes for Alertmanager and the ranks (the webhook token)."""
    return APIRouter(prefix="/v1", dependencies=[Authenticated], **options)


def audit_router(**options: Any) -> APIRouter:
    """The audit trail (either token)."""
    return APIRouter(prefix="/v1", dependencies=[ReaderAuthenticated], **options)


def operator_router(**options: Any) -> APIRouter:
    """Operators' decisions (the operator token only)."""
    return APIRouter(prefix="/v1", dependencies=[OperatorAuthenticated], **options)
