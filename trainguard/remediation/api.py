"""The HTTP routes. They validate, call the engine or a query, and map errors to status codes."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainguard.contract import IncidentOutcome
from trainguard.remediation import inbox, incidents, queries
from trainguard.remediation.deps import (
    Authenticated,
    HubDep,
    MetricsDep,
    OperatorAuthenticated,
    ReaderAuthenticated,
    RuntimeDep,
    SettingsDep,
    StoreDep,
    WebhookRuntime,
    WorkerDep,
)
from trainguard.remediation.engine import ConflictError, Engine, NotFoundError
from trainguard.remediation.models import (
    ActionList,
    ActionState,
    ActionView,
    AlertStatus,
    BreakerList,
    Decision,
    DirectiveAck,
    DirectiveList,
    IncidentList,
    IncidentState,
    IncidentView,
    NotificationView,
    WebhookAccepted,
    WebhookPayload,
)
from trainguard.remediation.store import StoreError, UnstorableError

log = logging.getLogger(__name__)

router = APIRouter()
# The webhook alone, included first (see create_app): the route an alert storm hits is the
# first one matched, and resolves one dependency (the runtime, once the token is checked).
webhook = APIRouter(prefix="/v1")
# Alertmanager and the ranks (webhook token); the audit trail (either token); operators' decisions
# (operator token only: a leaked webhook secret must not let a destructive action through).
v1 = APIRouter(prefix="/v1", dependencies=[Authenticated])
audit = APIRouter(prefix="/v1", dependencies=[ReaderAuthenticated])
operator = APIRouter(prefix="/v1", dependencies=[OperatorAuthenticated])

# Ids of actions, directives and incidents.
ActionId = Annotated[int, Path(ge=1, le=2**62)]
_UNAVAILABLE = "the store could not commit; retry"


@webhook.post(
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
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, _UNAVAILABLE) from exc
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


@audit.get("/notifications/{notification_id}", response_model=NotificationView, tags=["audit"])
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


@audit.get("/actions", response_model=ActionList, tags=["audit"])
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


@audit.get("/actions/{action_id}", response_model=ActionView, tags=["audit"])
def get_action(action_id: ActionId, store: StoreDep) -> ActionView:
    view = store.read(lambda conn: queries.get_action(conn, action_id))
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no action {action_id}")
    return view


@audit.get("/incidents", response_model=IncidentList, tags=["audit"])
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
        lambda conn: incidents.list_incidents(
            conn, state=state, outcome=outcome, job_id=job_id, before_id=before_id, limit=limit
        )
    )
    return IncidentList(incidents=found)


@audit.get("/incidents/{incident_id}", response_model=IncidentView, tags=["audit"])
def get_incident(incident_id: ActionId, store: StoreDep) -> IncidentView:
    view = store.read(lambda conn: incidents.get_incident(conn, incident_id))
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no incident {incident_id}")
    return view


async def _decide(
    action_id: int, approve: bool, decision: Decision | None, store: StoreDep, worker: WorkerDep
) -> ActionView:
    try:
        await store.write(Engine.decide(action_id, approve, decision or Decision()))
    except NotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except ConflictError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, _UNAVAILABLE) from exc
    if approve:
        worker.wake()
    view = await run_in_threadpool(store.read, lambda conn: queries.get_action(conn, action_id))
    assert view is not None  # it was just updated and actions are never deleted
    return view


@operator.post("/actions/{action_id}/approve", response_model=ActionView, tags=["audit"])
async def approve(
    action_id: ActionId, store: StoreDep, worker: WorkerDep, decision: Decision | None = None
) -> ActionView:
    """Let an action that waits for approval run (409 if it is not waiting)."""
    return await _decide(action_id, True, decision, store, worker)


@operator.post("/actions/{action_id}/reject", response_model=ActionView, tags=["audit"])
async def reject(
    action_id: ActionId, store: StoreDep, worker: WorkerDep, decision: Decision | None = None
) -> ActionView:
    """Refuse an action that waits for approval (409 if it is not waiting)."""
    return await _decide(action_id, False, decision, store, worker)


@audit.get("/breakers", response_model=BreakerList, tags=["guards"])
def list_breakers(store: StoreDep) -> BreakerList:
    """Jobs (or ``node:<name>``) whose action budget tripped their circuit breaker."""
    return BreakerList(breakers=store.read(queries.breakers))


@operator.post("/breakers/{subject}/reset", status_code=status.HTTP_204_NO_CONTENT, tags=["guards"])
async def reset_breaker(subject: Annotated[str, Path(max_length=256)], store: StoreDep) -> None:
    """Close a tripped circuit breaker (the manual reset it waits for)."""
    try:
        await store.write(Engine.reset_breaker(subject))
    except NotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, _UNAVAILABLE) from exc
    log.warning("circuit breaker for %s reset", subject)


@v1.get("/directives", response_model=DirectiveList, tags=["directives"])
async def directives(
    job_id: Annotated[str, Query(min_length=1, max_length=256)],
    rank: Annotated[int, Query(ge=0, le=2**31)],
    store: StoreDep,
    hub: HubDep,
    settings: SettingsDep,
    wait: Annotated[float, Query(ge=0, le=3600, description="Long-poll seconds.")] = 25.0,
) -> DirectiveList:
    """Directives for this rank not yet acknowledged; waits up to ``wait`` s for one."""
    deadline = time.monotonic() + min(wait, settings.long_poll_max_seconds)
    # Seen as the poll starts and as it ends: a rank that keeps polling is never unseen for
    # longer than one long-poll, so directives for every rank wait for its acknowledgement.
    hub.seen(job_id, rank)
    try:
        while True:
            version = hub.version(job_id)
            found = await run_in_threadpool(
                store.read,
                partial(
                    queries.pending_directives,
                    job_id=job_id,
                    rank=rank,
                    since=time.time() - settings.directive_ttl_seconds,
                ),
            )
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return DirectiveList(directives=found)
            await hub.wait(job_id, version, remaining)
    finally:
        hub.seen(job_id, rank)


@v1.post(
    "/directives/{directive_id}/ack",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["directives"],
)
async def ack_directive(
    directive_id: ActionId,
    ack: DirectiveAck,
    store: StoreDep,
    metrics: MetricsDep,
    worker: WorkerDep,
) -> None:
    """A rank has carried out (or failed to carry out) a directive."""
    try:
        action_id = await store.write(Engine.ack(directive_id, ack))
    except NotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except ConflictError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except StoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, _UNAVAILABLE) from exc
    metrics.directive_acks.labels(ack.outcome.value).inc()
    if action_id is not None:
        # The action waits for acknowledgements: it may be done now, and the next step free.
        worker.acknowledged(action_id)


@router.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", tags=["operations"])
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["operations"])
async def readyz(
    store: StoreDep, worker: WorkerDep, runtime: RuntimeDep, response: Response
) -> dict[str, str]:
    """The store commits (its savepoint reaches the database server), the worker, the verifier
    and the inbox's decider run."""
    problems = []
    if not worker.alive():
        problems.append("worker not running")
    if not runtime.decider.alive():
        problems.append("decider not running")
    if not runtime.verifier.alive():
        problems.append("verifier not running")
    try:
        await asyncio.wait_for(store.write(lambda conn: None), timeout=2.0)
    except (StoreError, TimeoutError) as exc:
        problems.append(f"store: {exc!r}")
    if problems:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "; ".join(problems)}
    return {"status": "ready"}


router.include_router(v1)
router.include_router(audit)
router.include_router(operator)
