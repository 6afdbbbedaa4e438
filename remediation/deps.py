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

from trainguard.remediation.engine import Engine
from trainguard.remediation.hub import DirectiveHub
from trainguard.remediation.metrics import Metrics
from trainguard.remediation.policy import Policy
from trainguard.remediation.settings import Settings
from trainguard.remediation.store import Store
from trainguard.remediation.worker import Worker


@dataclass
class Runtime:
    """What the routes work with; built once per app by the lifespan."""

    settings: Settings
    token: str | None
    policy: Policy
    store: Store
    engine: Engine
    metrics: Metrics
    hub: DirectiveHub
    worker: Worker


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

_bearer = HTTPBearer(auto_error=False, description="The token of TRAINGUARD_REMEDIATION_TOKEN.")


async def require_token(
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the configured bearer token (constant-time compare)."""
    if runtime.token is None:
        return
    presented = "" if credentials is None else credentials.credentials
    if not secrets.compare_digest(presented.encode(), runtime.token.encode()):
        runtime.metrics.webhook_rejected.labels("unauthorized").inc()
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


Authenticated = Depends(require_token)
