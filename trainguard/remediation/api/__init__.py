"""The remediation service's HTTP API: thin routes, one module per resource under ``routes``.

Each route validates its input, calls the engine, an operator's function or a query through the
store, and maps errors to status codes. :data:`webhook` (Alertmanager's) is included first, so
that the route an alert storm hits is the first one matched; :data:`router` holds the rest.
"""

from __future__ import annotations

from fastapi import APIRouter

from trainguard.remediation.api.routes import (
    actions,
    alerts,
    breakers,
    directives,
    discovery,
    incidents,
    notifications,
    operations,
)

webhook = alerts.router
router = APIRouter()
for part in (
    operations.router,
    directives.router,
    notifications.router,
    actions.audit,
    actions.operator,
    incidents.router,
    breakers.audit,
    breakers.operator,
    discovery.router,
):
    router.include_router(part)
