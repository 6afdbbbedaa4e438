"""``POST /v1/alertmanager``: Alertmanager's webhook. The route an alert storm hits: the app
includes it first, so it is the first one matched, and it resolves one dependency (the runtime,
once the token is checked)."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request, status

from trainguard.remediation import inbox
from trainguard.remediation.api.common import UNAVAILABLE
from trainguard.remediation.deps import WebhookRuntime
from trainguard.remediation.models import AlertStatus, WebhookAccepted, WebhookPayload
from trainguard.remediation.store import StoreError, UnstorableError

router = APIRouter(prefix="/v1")


@router.post(
    "/alertmanager",
    response_model=WebhookAccepted,
    tags=["alertmanager"],
    # The webhook token, as the routes of ``v1`` declare it through their dependency.
    openapi_extra={"security": [{"HTTPBearer": []}]},
)
async def alertmanager(
    payload: WebhookPayload, request: Request, runtime: WebhookRuntime
) -> WebhookAccepted:
    """Alertmanager's webhook (payload version 4). 200 only once the notification is committed
    to the inbox; it is decided after, in the order notifications were accepted."""
    store, metrics = runtime.store, runtime.metrics
    started = time.perf_counter()
    # FastAPI read the body to validate it; this is that read, kept.
    body = await request.body()
    # JSON carries a NUL only escaped; the model walk runs only when the escape is there.
    if store.refuses_nul and b"\\u0000" in body and inbox.has_nul(payload):
        metrics.webhook_rejected.labels("invalid").inc()
        # Retrying could never succeed (and would hold back the rest of its group).
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            "the database cannot store this: a text holds a NUL character (\\u0000)",
        )
    try:
        entry_id = await store.write(inbox.accept(body, payload, time.time()))
    except StoreError as exc:
        metrics.webhook_rejected.labels("unavailable").inc()
        # Alertmanager retries on 5xx: nothing was acknowledged, nothing is lost.
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, UNAVAILABLE) from exc
    except UnstorableError as exc:
        metrics.webhook_rejected.labels("invalid").inc()
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    runtime.decider.accepted(entry_id)
    resolved = sum(1 for alert in payload.alerts if alert.status is AlertStatus.RESOLVED)
    firing = len(payload.alerts) - resolved
    if firing:
        metrics.alerts_received.labels(AlertStatus.FIRING.value).inc(firing)
    if resolved:
        metrics.alerts_received.labels(AlertStatus.RESOLVED.value).inc(resolved)
    metrics.webhook_duration.observe(time.perf_counter() - started)
    return WebhookAccepted(notification=entry_id, alerts=len(payload.alerts))
