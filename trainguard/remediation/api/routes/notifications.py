"""``GET /v1/notifications/{id}``: one notification of the webhook's inbox and its decision."""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated

from fastapi import HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool

from trainguard.remediation import inbox
from trainguard.remediation.api.common import ActionId, audit_router
from trainguard.remediation.deps import RuntimeDep
from trainguard.remediation.models import NotificationView

router = audit_router(tags=["audit"])


@router.get("/notifications/{notification_id}", response_model=NotificationView)
async def get_notification(
    notification_id: ActionId,
    runtime: RuntimeDep,
    wait: Annotated[
        float, Query(ge=0, le=3600, description="Long-poll seconds for its decision.")
    ] = 0.0,
) -> NotificationView:
    """One notification of the inbox: accepted, decided (or failed) and what it came to."""
    store, decider = runtime.store, runtime.decider
    deadline = time.monotonic() + min(wait, runtime.settings.long_poll_max_seconds)
    while True:
        found = await run_in_threadpool(store.read, partial(inbox.view, entry_id=notification_id))
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no notification {notification_id}")
        remaining = deadline - time.monotonic()
        if found.decided_at is not None or remaining <= 0:
            return found
        await run_in_threadpool(decider.wait, notification_id, remaining)
