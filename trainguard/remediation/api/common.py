"""What the service's routes share: the routers by who may call them, ids, and how an
operator's write answers a store's error.

Alertmanager and the ranks present the webhook token (:data:`v1_router`); the audit trail takes
either token (:data:`audit_router`); operators' decisions take the operator token only
(:func:`operator_router`: a leaked webhook secret must not let a destructive action through).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Path, status
from sqlalchemy import Connection

from trainguard.remediation.decisions import ConflictError, NotFoundError
from trainguard.remediation.deps import Authenticated, OperatorAuthenticated, ReaderAuthenticated
from trainguard.remediation.store import Store, StoreError

T = TypeVar("T")

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


async def commit_decision(store: Store, unit: Callable[[Connection], T]) -> T:
    """Commit an operator's or a rank's decision on a stored row: 404 when the row does not
    exist, 409 when it is no longer in a state that takes the decision, 503 when the store
    could not commit (nothing was written; the caller may retry)."""
    try:
        return await store.write(unit)
    except NotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except ConflictError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, UNAVAILABLE) from exc
