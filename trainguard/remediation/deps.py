"""Dependencies of the routes, as typed ``Annotated`` aliases; tests override these.

They are coroutines although they do not await: FastAPI runs a plain function dependency on
its thread pool, a hop that cost more than the whole webhook's database work.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from trainguard.remediation.engine import Engine
from trainguard.remediation.hub import DirectiveHub
from trainguard.remediation.inbox import Decider
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.policy import Policy
from trainguard.remediation.settings import ENV_PREFIX, Settings
from trainguard.remediation.store import Store
from trainguard.remediation.verify import Verifier
from trainguard.remediation.worker import Worker


@dataclass
class Runtime:
    """What the routes work with; built once per app by the lifespan."""

    settings: Settings
    token: str | None
    # None: approve, reject and breaker reset are closed (open only with insecure_no_auth).
    operator_token: str | None
    policy: Policy
    store: Store
    engine: Engine
    metrics: Metrics
    hub: DirectiveHub
    worker: Worker
    verifier: Verifier
    decider: Decider


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


async def get_store(runtime: RuntimeDep) -> Store:
    return runtime.store


async def get_engine(runtime: RuntimeDep) -> Engine:
    return runtime.engine


async def get_metrics(runtime: RuntimeDep) -> Metrics:
    return runtime.metrics


async def get_hub(runtime: RuntimeDep) -> DirectiveHub:
    return runtime.hub


async def get_worker(runtime: RuntimeDep) -> Worker:
    return runtime.worker


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
EngineDep = Annotated[Engine, Depends(get_engine)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
HubDep = Annotated[DirectiveHub, Depends(get_hub)]
WorkerDep = Annotated[Worker, Depends(get_worker)]

_bearer = HTTPBearer(
    auto_error=False,
    description=f"The token of {ENV_PREFIX}TOKEN (Alertmanager, the ranks); the operator token "
    "also reads the audit trail.",
)
_operator_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="OperatorBearer",
    description=f"The token of {ENV_PREFIX}OPERATOR_TOKEN: approve, reject, reset breakers.",
)
Credentials = HTTPAuthorizationCredentials | None


def _presents(credentials: Credentials, token: str | None) -> bool:
    """Whether the request carries ``token`` (constant-time compare; never a None token)."""
    if token is None:
        return False
    presented = "" if credentials is None else credentials.credentials
    return secrets.compare_digest(presented.encode(), token.encode())


def _unauthorized(runtime: Runtime, detail: str) -> HTTPException:
    runtime.metrics.webhook_rejected.labels("unauthorized").inc()
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=detail,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _forbidden(runtime: Runtime, detail: str) -> HTTPException:
    runtime.metrics.webhook_rejected.labels("unauthorized").inc()
    return HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=detail)


async def require_token(
    runtime: RuntimeDep, credentials: Annotated[Credentials, Depends(_bearer)]
) -> None:
    """401 unless the request carries the configured (webhook) bearer token."""
    if runtime.token is None:
        return
    if not _presents(credentials, runtime.token):
        raise _unauthorized(runtime, "missing or wrong bearer token")


async def require_webhook_token(request: Request) -> Runtime:
    """The webhook's one dependency: the runtime, once the request carries the webhook token.

    :func:`require_token`'s verdict, reached without its chain (the runtime, the bearer
    scheme's parser, the check: three dependencies to resolve per request, on the hot path of
    an alert storm). The header is read as :class:`HTTPBearer` reads it."""
    runtime: Runtime = request.app.state.runtime
    if runtime.token is None:
        return runtime
    scheme, presented = get_authorization_scheme_param(request.headers.get("authorization"))
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        presented.encode(), runtime.token.encode()
    ):
        raise _unauthorized(runtime, "missing or wrong bearer token")
    return runtime


WebhookRuntime = Annotated[Runtime, Depends(require_webhook_token)]


async def require_reader_token(
    runtime: RuntimeDep, credentials: Annotated[Credentials, Depends(_bearer)]
) -> None:
    """The audit trail: 401 unless the request carries the webhook or the operator token."""
    if runtime.token is None:
        return
    # Both compared, whatever the first gives: the time taken says nothing about which matched.
    webhook = _presents(credentials, runtime.token)
    operator = _presents(credentials, runtime.operator_token)
    if not (webhook or operator):
        raise _unauthorized(runtime, "missing or wrong bearer token")


async def require_operator_token(
    runtime: RuntimeDep, credentials: Annotated[Credentials, Depends(_operator_bearer)]
) -> None:
    """Approve, reject, breaker reset: only the operator token, never the webhook token."""
    if runtime.operator_token is None:
        if runtime.settings.insecure_no_auth:
            return
        raise _forbidden(
            runtime,
            "operator endpoints are disabled: no operator token is configured; set "
            f"{ENV_PREFIX}OPERATOR_TOKEN or {ENV_PREFIX}OPERATOR_TOKEN_FILE to approve, "
            "reject actions and reset circuit breakers",
        )
    operator = _presents(credentials, runtime.operator_token)
    webhook = _presents(credentials, runtime.token)
    if operator:
        return
    if webhook:
        raise _forbidden(
            runtime,
            "the webhook token cannot approve, reject or reset circuit breakers; "
            "present the operator token",
        )
    raise _unauthorized(runtime, "missing or wrong operator token")


Authenticated = Depends(require_token)
ReaderAuthenticated = Depends(require_reader_token)
OperatorAuthenticated = Depends(require_operator_token)
